//! Linux system call wrappers: `recvmmsg`, `sendmmsg`, `ppoll`, socket
//! options, socket address and control message (de)serialisation.
//!
//! This is the only module of the crate with `unsafe` code. Every wrapper
//! is safe to call: pointers handed to the kernel are built inside the
//! wrapper from borrows that outlive the call, and lengths are checked
//! against the buffers they describe.
#![allow(unsafe_code)]

use std::io;
use std::marker::PhantomData;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;
use std::time::Duration;

/// Bytes of control-message space per message. Receiving needs one
/// `UDP_GRO` message (an `int`), sending one `UDP_SEGMENT` message (a
/// `u16`); both take 24 bytes on 64-bit Linux.
const CMSG_BUF_LEN: usize = 64;

/// A control-message buffer aligned for `cmsghdr` (whose first field is a
/// `size_t` on glibc).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct CmsgBuf([u8; CMSG_BUF_LEN]);

/// `CMSG_ALIGN`: control messages are aligned to `size_t`.
const fn cmsg_align(len: usize) -> usize {
    (len + mem::size_of::<usize>() - 1) & !(mem::size_of::<usize>() - 1)
}

const CMSG_HDR_LEN: usize = cmsg_align(mem::size_of::<libc::cmsghdr>());

/// Message header arrays for `recvmmsg`/`sendmmsg`, allocated once.
pub(crate) struct MsgScratch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    ctrl: Vec<CmsgBuf>,
}

// SAFETY: the raw pointers stored in `hdrs` and `iovs` are only written
// right before a system call made by a method that borrows everything they
// point to, and are never dereferenced by Rust code afterwards (results are
// read from `names`/`ctrl`/`hdrs` by value through `&self`). Moving the
// scratch to another thread therefore cannot create shared access to
// anything.
unsafe impl Send for MsgScratch {}

impl MsgScratch {
    /// Scratch for up to `capacity` (at least 1) messages per call.
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        // SAFETY: these are plain C structs for which all-zero bytes are a
        // valid value (null pointers, zero lengths, AF_UNSPEC).
        let (hdr, iov, name) = unsafe {
            (
                mem::zeroed::<libc::mmsghdr>(),
                mem::zeroed::<libc::iovec>(),
                mem::zeroed::<libc::sockaddr_storage>(),
            )
        };
        Self {
            hdrs: vec![hdr; capacity],
            iovs: vec![iov; capacity],
            names: vec![name; capacity],
            ctrl: vec![CmsgBuf([0; CMSG_BUF_LEN]); capacity],
        }
    }

    /// Messages per call.
    pub(crate) fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Non-blocking `recvmmsg` of up to `count` datagrams into consecutive
    /// `stride`-byte slots of `buf` (message `i` into
    /// `buf[i * stride..(i + 1) * stride]`), with `MSG_TRUNC` so that
    /// [`msg_len`](Self::msg_len) reports a datagram's real length. With
    /// `want_cmsg`, control messages are received too (for
    /// [`msg_gro_size`](Self::msg_gro_size)).
    ///
    /// Returns the number of messages received.
    pub(crate) fn recv(
        &mut self,
        fd: BorrowedFd<'_>,
        buf: &mut [u8],
        stride: usize,
        count: usize,
        want_cmsg: bool,
    ) -> io::Result<usize> {
        let mut count = count.min(self.hdrs.len());
        if let Some(fit) = buf.len().checked_div(stride) {
            count = count.min(fit);
        }
        if count == 0 {
            return Ok(0);
        }
        // Pass 1: iovecs (by index, before any pointer to them is taken).
        let base = buf.as_mut_ptr();
        for (i, iov) in self.iovs.iter_mut().take(count).enumerate() {
            // In bounds: (i + 1) * stride <= count * stride <= buf.len().
            iov.iov_base = base.wrapping_add(i * stride).cast();
            iov.iov_len = stride;
        }
        // Pass 2: headers pointing at the iovecs, names and control buffers.
        let iovs = self.iovs.as_mut_ptr();
        let names = self.names.as_mut_ptr();
        let ctrl = self.ctrl.as_mut_ptr();
        for (i, h) in self.hdrs.iter_mut().take(count).enumerate() {
            h.msg_len = 0;
            h.msg_hdr.msg_name = names.wrapping_add(i).cast();
            h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_iov = iovs.wrapping_add(i);
            h.msg_hdr.msg_iovlen = 1;
            if want_cmsg {
                h.msg_hdr.msg_control = ctrl.wrapping_add(i).cast();
                h.msg_hdr.msg_controllen = CMSG_BUF_LEN as _;
            } else {
                h.msg_hdr.msg_control = ptr::null_mut();
                h.msg_hdr.msg_controllen = 0;
            }
            h.msg_hdr.msg_flags = 0;
        }
        // SAFETY: `hdrs[..count]` are initialised above and point to
        // `iovs`, `names` and `ctrl` entries owned by `self` (not moved or
        // accessed until the call returns) whose sizes are the lengths
        // given; each iovec points to a distinct `stride`-byte range inside
        // `buf`, which is mutably borrowed for the whole call. The kernel
        // writes nothing beyond those lengths.
        let n = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                count as libc::c_uint,
                (libc::MSG_DONTWAIT | libc::MSG_TRUNC) as _,
                ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((n as usize).min(count))
    }

    /// Real length of received message `i` (may exceed the slot: see
    /// [`msg_truncated`](Self::msg_truncated)).
    pub(crate) fn msg_len(&self, i: usize) -> usize {
        self.hdrs.get(i).map_or(0, |h| h.msg_len as usize)
    }

    /// Received message `i` did not fit its slot.
    pub(crate) fn msg_truncated(&self, i: usize) -> bool {
        self.hdrs
            .get(i)
            .is_some_and(|h| h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0)
    }

    /// Source address of received message `i`.
    pub(crate) fn msg_peer(&self, i: usize) -> Option<SocketAddr> {
        let h = self.hdrs.get(i)?;
        storage_to_addr(self.names.get(i)?, h.msg_hdr.msg_namelen)
    }

    /// The GRO segment size the kernel attached to received message `i`,
    /// if it is a coalesced buffer.
    // `msg_controllen` and `cmsg_len` are `size_t` on glibc but `socklen_t`
    // on musl: the casts are needed there.
    #[allow(clippy::unnecessary_cast)]
    pub(crate) fn msg_gro_size(&self, i: usize) -> Option<usize> {
        let h = self.hdrs.get(i)?;
        let len = (h.msg_hdr.msg_controllen as usize).min(CMSG_BUF_LEN);
        let bytes = &self.ctrl.get(i)?.0[..len];
        let mut off = 0;
        while off + mem::size_of::<libc::cmsghdr>() <= bytes.len() {
            // SAFETY: the range `off..off + size_of::<cmsghdr>()` is inside
            // `bytes` (checked by the loop condition); `read_unaligned` has
            // no alignment requirement and every bit pattern is a valid
            // `cmsghdr` (integers only).
            let c: libc::cmsghdr = unsafe { ptr::read_unaligned(bytes.as_ptr().add(off).cast()) };
            let clen = c.cmsg_len as usize;
            if clen < CMSG_HDR_LEN || off + clen > bytes.len() {
                break;
            }
            let data = &bytes[off + CMSG_HDR_LEN..off + clen];
            if c.cmsg_level == libc::SOL_UDP && c.cmsg_type == libc::UDP_GRO {
                let size = match data {
                    [a, b, c, d, ..] => i32::from_ne_bytes([*a, *b, *c, *d]).max(0) as usize,
                    [a, b] => usize::from(u16::from_ne_bytes([*a, *b])),
                    _ => 0,
                };
                return (size > 0).then_some(size);
            }
            off += cmsg_align(clen);
        }
        None
    }

    /// Starts building a `sendmmsg` call whose datagrams borrow `'d` data.
    pub(crate) fn send_msgs<'d>(&mut self) -> SendMsgs<'_, 'd> {
        SendMsgs {
            s: self,
            n: 0,
            _data: PhantomData,
        }
    }
}

/// A `sendmmsg` call being built; see [`MsgScratch::send_msgs`].
pub(crate) struct SendMsgs<'s, 'd> {
    s: &'s mut MsgScratch,
    n: usize,
    _data: PhantomData<&'d [u8]>,
}

impl<'d> SendMsgs<'_, 'd> {
    /// No room for another message.
    pub(crate) fn is_full(&self) -> bool {
        self.n >= self.s.hdrs.len()
    }

    /// Adds a message carrying `data` to `dest`; with `gso_size`, the
    /// kernel splits it into datagrams of that size (`UDP_SEGMENT`).
    /// `v6_socket` maps IPv4 destinations to IPv4-mapped IPv6 addresses.
    /// Returns `false` if full.
    pub(crate) fn push(
        &mut self,
        data: &'d [u8],
        dest: &SocketAddr,
        v6_socket: bool,
        gso_size: Option<u16>,
    ) -> bool {
        if self.is_full() {
            return false;
        }
        let i = self.n;
        let namelen = addr_to_storage(dest, v6_socket, &mut self.s.names[i]);
        self.s.iovs[i] = libc::iovec {
            iov_base: data.as_ptr().cast_mut().cast(),
            iov_len: data.len(),
        };
        let controllen = match gso_size {
            Some(size) => {
                let buf = &mut self.s.ctrl[i].0;
                // SAFETY: all-zero is a valid `cmsghdr` (integers only).
                let mut c: libc::cmsghdr = unsafe { mem::zeroed() };
                c.cmsg_len = (CMSG_HDR_LEN + mem::size_of::<u16>()) as _;
                c.cmsg_level = libc::SOL_UDP;
                c.cmsg_type = libc::UDP_SEGMENT;
                // SAFETY: `buf` is CMSG_BUF_LEN >= size_of::<cmsghdr>() bytes
                // long; `write_unaligned` has no alignment requirement.
                unsafe { ptr::write_unaligned(buf.as_mut_ptr().cast::<libc::cmsghdr>(), c) };
                buf[CMSG_HDR_LEN..CMSG_HDR_LEN + 2].copy_from_slice(&size.to_ne_bytes());
                cmsg_align(CMSG_HDR_LEN + mem::size_of::<u16>())
            }
            None => 0,
        };
        let h = &mut self.s.hdrs[i];
        h.msg_len = 0;
        h.msg_hdr.msg_namelen = namelen;
        h.msg_hdr.msg_iovlen = 1;
        h.msg_hdr.msg_controllen = controllen as _;
        h.msg_hdr.msg_flags = 0;
        self.n += 1;
        true
    }

    /// Non-blocking `sendmmsg` of the messages added; returns how many the
    /// kernel accepted (from the first). An error means the first message
    /// was refused.
    pub(crate) fn send(&mut self, fd: BorrowedFd<'_>) -> io::Result<usize> {
        let n = self.n;
        if n == 0 {
            return Ok(0);
        }
        let iovs = self.s.iovs.as_mut_ptr();
        let names = self.s.names.as_mut_ptr();
        let ctrl = self.s.ctrl.as_mut_ptr();
        for (i, h) in self.s.hdrs.iter_mut().take(n).enumerate() {
            h.msg_hdr.msg_name = names.wrapping_add(i).cast();
            h.msg_hdr.msg_iov = iovs.wrapping_add(i);
            h.msg_hdr.msg_control = if h.msg_hdr.msg_controllen == 0 {
                ptr::null_mut()
            } else {
                ctrl.wrapping_add(i).cast()
            };
        }
        // SAFETY: `hdrs[..n]` were filled by `push` and above: names,
        // iovecs and control buffers are owned by the scratch (mutably
        // borrowed by `self`), with the lengths given; each iovec points
        // to a `&'d [u8]` that outlives `self`. The kernel only reads them.
        let r = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                self.s.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT as _,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((r as usize).min(n))
    }
}

/// Writes `addr` as a C socket address into `out`, returns its length.
fn addr_to_storage(
    addr: &SocketAddr,
    v6_socket: bool,
    out: &mut libc::sockaddr_storage,
) -> libc::socklen_t {
    let addr = match (addr, v6_socket) {
        (SocketAddr::V4(a), true) => {
            SocketAddr::V6(SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0))
        }
        _ => *addr,
    };
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: all-zero is a valid `sockaddr_in`.
            let mut sin: libc::sockaddr_in = unsafe { mem::zeroed() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr {
                s_addr: u32::from(*a.ip()).to_be(),
            };
            // SAFETY: `sockaddr_storage` is larger than and aligned at least
            // as strictly as `sockaddr_in`; `out` is a unique borrow.
            unsafe {
                ptr::write(
                    (out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>(),
                    sin,
                )
            };
            mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            // SAFETY: all-zero is a valid `sockaddr_in6`.
            let mut sin6: libc::sockaddr_in6 = unsafe { mem::zeroed() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr = libc::in6_addr {
                s6_addr: a.ip().octets(),
            };
            sin6.sin6_scope_id = a.scope_id();
            // SAFETY: as above, for `sockaddr_in6`.
            unsafe {
                ptr::write(
                    (out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>(),
                    sin6,
                )
            };
            mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Reads a C socket address; IPv4-mapped IPv6 addresses come back as IPv4.
fn storage_to_addr(s: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(s.ss_family) {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a `sockaddr_in`,
            // which it is large and aligned enough for.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for `sockaddr_in6`.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            let port = u16::from_be(a.sin6_port);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                None => SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    port,
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )),
            })
        }
        _ => None,
    }
}

/// Waits until `fd` is ready for `events` (`POLLIN`/`POLLOUT`) or
/// `timeout` passes (`None`: no limit). Returns whether it is ready.
pub(crate) fn wait(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    timeout: Option<Duration>,
) -> io::Result<bool> {
    wait_any(&[fd], events, timeout)
}

/// Waits until any of `fds` has one of `events` or `timeout` passes; `Ok(false)` on timeout.
pub(crate) fn wait_any(
    fds: &[BorrowedFd<'_>],
    events: libc::c_short,
    timeout: Option<Duration>,
) -> io::Result<bool> {
    let mut pfds: [libc::pollfd; 2] = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 2];
    let n = fds.len().min(pfds.len());
    for (p, fd) in pfds.iter_mut().zip(fds) {
        p.fd = fd.as_raw_fd();
        p.events = events;
    }
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: d.subsec_nanos() as _,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds` and `ts` live on the stack for the whole call and `n` is at most the
    // length of `pfds`; a null signal mask means "do not change it".
    let r = unsafe { libc::ppoll(pfds.as_mut_ptr(), n as libc::nfds_t, ts_ptr, ptr::null()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r > 0)
}

/// `setsockopt` with an `int` value.
pub(crate) fn set_int_opt(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option value is a live `c_int` whose size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `SO_MAX_PACING_RATE`: the most bytes per second the socket sends (TCP paces itself to it;
/// other sockets need the `fq` queueing discipline).
pub(crate) fn set_max_pacing_rate(fd: BorrowedFd<'_>, bytes_per_s: u64) -> io::Result<()> {
    // SAFETY: the option value is a live `u64` whose size is passed (the kernel takes an
    // unsigned long here).
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&bytes_per_s as *const u64).cast(),
            mem::size_of::<u64>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_roundtrip() {
        // SAFETY (test): all-zero is a valid sockaddr_storage.
        let mut s: libc::sockaddr_storage = unsafe { mem::zeroed() };
        for (addr, v6) in [
            ("127.0.0.1:9".parse::<SocketAddr>().unwrap(), false),
            ("127.0.0.1:65535".parse().unwrap(), true),
            ("[::1]:4242".parse().unwrap(), true),
        ] {
            let len = addr_to_storage(&addr, v6, &mut s);
            assert_eq!(storage_to_addr(&s, len), Some(addr));
        }
        assert_eq!(storage_to_addr(&s, 3), None);
    }
}
