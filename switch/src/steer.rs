//! Kernel steering of datagrams to shards by slot: a classic BPF program on the `SO_REUSEPORT`
//! group returns `(slot / GAP_BLOCK) mod shards` as the index of the socket that receives the
//! datagram. Whole blocks of slots go to one shard, which keeps their gap register cells.
#![allow(unsafe_code)]

use ina_io::UdpPort;
use std::os::fd::{AsFd, AsRawFd};

/// Offset of the slot field in the `ina` header (the program sees the UDP payload).
const SLOT_OFFSET: u32 = 8;

/// Attaches the steering program to the reuseport group of `port`.
pub(crate) fn attach_slot_steering(port: &UdpPort, shards: usize) -> std::io::Result<()> {
    let shards = u32::try_from(shards).map_err(|_| std::io::Error::other("too many shards"))?;
    // ldh [8]; rsh #log2(GAP_BLOCK); mod #shards; ret a. A datagram too short to hold the field aborts the program
    // with 0, which sends it to shard 0, where it is counted as malformed.
    let mut program = [
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: SLOT_OFFSET,
        },
        libc::sock_filter {
            code: (libc::BPF_ALU | libc::BPF_RSH | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: ina_wire::agg::GAP_BLOCK.trailing_zeros(),
        },
        libc::sock_filter {
            code: (libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: shards,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_A) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
    ];
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    let fd = port.as_fd().as_raw_fd();
    // SAFETY: `fd` is an open socket owned by `port` for the duration of the call; `fprog`
    // points to `program`, which outlives the call; the kernel copies the program.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
