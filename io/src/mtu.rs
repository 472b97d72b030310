//! The path MTU towards an address, as the kernel knows it (the worker checks the way to
//! the switch with it, the switch the way to every worker).
#![allow(unsafe_code)]

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

/// The IP MTU of the path from `from` (a local address; unspecified lets the kernel choose) to
/// `to`: `IP_MTU` (`IPV6_MTU`) of a UDP socket connected there, which is the route's MTU, or
/// a smaller one the kernel learned from the path.
pub fn path_mtu(from: IpAddr, to: SocketAddr) -> std::io::Result<usize> {
    let socket = UdpSocket::bind(SocketAddr::new(from, 0))?;
    socket.connect(to)?;
    let (level, name) = if to.is_ipv6() {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    } else {
        (libc::IPPROTO_IP, libc::IP_MTU)
    };
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the descriptor is open for the call (owned by `socket`), and `value` and `len`
    // are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    usize::try_from(value).map_err(|_| std::io::Error::other(format!("path MTU {value}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_path_mtu_is_the_loopback_interface_mtu() {
        let Ok(lo) = std::fs::read_to_string("/sys/class/net/lo/mtu") else {
            eprintln!("skipped: no /sys/class/net/lo/mtu");
            return;
        };
        let lo: usize = lo.trim().parse().unwrap_or(0);
        let to: SocketAddr = "127.0.0.1:9".parse().unwrap_or_else(|_| unreachable!());
        let mtu = path_mtu("127.0.0.1".parse().unwrap_or_else(|_| unreachable!()), to);
        // (An IPv4 packet is at most 65535 bytes, whatever the interface's MTU.)
        assert_eq!(mtu.ok(), Some(lo.min(65535)));
    }
}
