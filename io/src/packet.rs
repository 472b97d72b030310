//! Raw Ethernet ports: an `AF_PACKET` socket bound to one interface, with memory-mapped
//! receive and transmit rings (`TPACKET_V2`).
//!
//! The kernel writes every frame the interface receives into a slot of the receive ring and
//! flips the slot's status word; [`RawPort::recv`] reads frames in place and hands the slots
//! back, with no system call while frames are waiting. [`RawPort::send`] copies a frame into
//! the next free slot of the transmit ring, and [`RawPort::flush`] asks the kernel to send every
//! slot filled since, with one system call. Frames this socket sends are not looped back to its
//! own receive ring (`PACKET_IGNORE_OUTGOING`).
//!
//! This module holds the crate's only `unsafe` code outside `sys`: the ring is memory shared
//! with the kernel, and each slot's status word is the hand-over between the two.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Sizes of the rings of a [`RawPort`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawConfig {
    /// Bytes per ring slot: the largest frame plus the slot's header (rounded up to 16).
    pub frame_size: usize,
    /// Slots in the receive ring.
    pub rx_frames: usize,
    /// Slots in the transmit ring.
    pub tx_frames: usize,
}

impl Default for RawConfig {
    fn default() -> Self {
        // 2 KiB slots take standard 1500-byte frames; 4096 of them are 8 MiB per ring.
        RawConfig {
            frame_size: 2048,
            rx_frames: 4096,
            tx_frames: 1024,
        }
    }
}

impl RawConfig {
    /// Slots large enough for frames of `mtu` bytes of IP (jumbo frames included).
    pub fn for_mtu(mtu: usize) -> RawConfig {
        let need = mtu + 14 + TX_DATA_OFFSET + 64;
        RawConfig {
            frame_size: need.next_power_of_two().max(2048),
            ..RawConfig::default()
        }
    }

    /// The largest frame a slot holds.
    pub fn max_frame(&self) -> usize {
        self.frame_size.saturating_sub(TX_DATA_OFFSET + 16)
    }
}

/// Why a raw port cannot be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum RawError {
    /// No such interface.
    #[error("no network interface named {0:?}")]
    NoInterface(String),
    /// The socket could not be created (needs CAP_NET_RAW, that is root).
    #[error("cannot open a raw socket on {ifname} (needs CAP_NET_RAW): {source}")]
    Socket {
        /// The interface.
        ifname: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Setting up the rings or binding failed.
    #[error("cannot set up {what} on {ifname}: {source}")]
    Setup {
        /// The interface.
        ifname: String,
        /// What was being set up.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The ring configuration is unusable.
    #[error("invalid ring configuration: {0}")]
    Config(&'static str),
    /// Kicking the transmit ring failed.
    #[error("sending on {ifname} failed: {source}")]
    Send {
        /// The interface.
        ifname: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Waiting for frames failed.
    #[error("waiting for frames failed: {0}")]
    Poll(#[source] io::Error),
}

/// What the kernel says about a received frame besides its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RxMeta {
    /// The frame's TCP or UDP checksum was left for a NIC to fill in (it came from a host on
    /// this machine through a virtual link with checksum offload): whoever sends it on must
    /// complete it (`ina_wire::checksum::complete_l4_checksum`).
    pub checksum_partial: bool,
}

/// Counters of a raw port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawCounters {
    /// Frames received.
    pub rx_frames: u64,
    /// Bytes of frames received.
    pub rx_bytes: u64,
    /// Frames received cut short by the slot size (dropped).
    pub rx_truncated: u64,
    /// Frames queued for sending.
    pub tx_frames: u64,
    /// Bytes of frames queued for sending.
    pub tx_bytes: u64,
    /// Frames not sent: the transmit ring was full, or the frame larger than a slot.
    pub tx_dropped: u64,
    /// Flushes (system calls) of the transmit ring.
    pub tx_flushes: u64,
}

// TPACKET_V2 slot header (`struct tpacket2_hdr`), as the kernel lays it out.
const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
const TP_STATUS_COPY: u32 = 1 << 1;
const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;
const TP_STATUS_AVAILABLE: u32 = 0;
const TP_STATUS_SEND_REQUEST: u32 = 1;
const TP_STATUS_WRONG_FORMAT: u32 = 1 << 2;
const TPACKET_V2: libc::c_int = 1;
const PACKET_RX_RING: libc::c_int = 5;
const PACKET_VERSION: libc::c_int = 10;
const PACKET_TX_RING: libc::c_int = 13;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
/// `sizeof(struct tpacket2_hdr)` aligned to 16 (`TPACKET_ALIGN`).
const TX_DATA_OFFSET: usize = 32;
// Field offsets in `struct tpacket2_hdr`.
const OFF_STATUS: usize = 0;
const OFF_LEN: usize = 4;
const OFF_SNAPLEN: usize = 8;
const OFF_MAC: usize = 12;

#[repr(C)]
struct TpacketReq {
    block_size: libc::c_uint,
    block_nr: libc::c_uint,
    frame_size: libc::c_uint,
    frame_nr: libc::c_uint,
}

/// A memory mapping of both rings, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access goes through `&mut RawPort`.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` came from a successful mmap and are unmapped once.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// One raw Ethernet port. See the module documentation.
#[derive(Debug)]
pub struct RawPort {
    // Field order: the mapping is unmapped before the socket closes.
    map: Mapping,
    fd: OwnedFd,
    ifname: String,
    ifindex: i32,
    cfg: RawConfig,
    rx_next: usize,
    tx_next: usize,
    tx_pending: usize,
    counters: RawCounters,
}

fn os_err<T>(ret: libc::c_int, ok: T) -> io::Result<T> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ok)
    }
}

/// The status word of `slot`, a slot of `_map`.
fn status(_map: &Mapping, slot: *mut u8) -> &AtomicU32 {
    // SAFETY: every slot starts with the 4-byte aligned status word, shared with the kernel
    // while the mapping lives, which the returned reference cannot outlive.
    unsafe { AtomicU32::from_ptr(slot.add(OFF_STATUS).cast()) }
}

impl RawPort {
    /// Opens interface `ifname` with rings of `cfg`'s sizes.
    pub fn open(ifname: &str, cfg: RawConfig) -> Result<RawPort, RawError> {
        if cfg.frame_size < 256 || !cfg.frame_size.is_multiple_of(16) || cfg.rx_frames == 0 {
            return Err(RawError::Config(
                "slots must be a multiple of 16 bytes, at least 256",
            ));
        }
        if cfg.tx_frames == 0 || cfg.rx_frames > 1 << 20 || cfg.tx_frames > 1 << 20 {
            return Err(RawError::Config("each ring needs 1 to 2^20 slots"));
        }
        let page = 4096usize;
        if cfg.frame_size > page && !cfg.frame_size.is_multiple_of(page) {
            return Err(RawError::Config("slots above 4 KiB must be whole pages"));
        }
        let cname = CString::new(ifname).map_err(|_| RawError::NoInterface(ifname.into()))?;
        // SAFETY: `cname` is a valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(RawError::NoInterface(ifname.into()));
        }
        let setup = |what: &'static str| {
            move |source| RawError::Setup {
                ifname: ifname.into(),
                what,
                source,
            }
        };
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2) call.
        let raw =
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, libc::c_int::from(proto)) };
        let raw = os_err(raw, raw).map_err(|source| RawError::Socket {
            ifname: ifname.into(),
            source,
        })?;
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let set = |opt: libc::c_int, val: *const libc::c_void, len: usize| {
            // SAFETY: `val` points to `len` readable bytes for the duration of the call.
            let r = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_PACKET,
                    opt,
                    val,
                    len as libc::socklen_t,
                )
            };
            os_err(r, ())
        };
        let version = TPACKET_V2;
        set(PACKET_VERSION, (&raw const version).cast(), 4).map_err(setup("TPACKET_V2"))?;
        let one: libc::c_int = 1;
        // Not fatal on kernels before 4.20: frames this socket sends would then come back to
        // it, and the switch would see its own answers as foreign traffic (counted, dropped).
        let _ = set(PACKET_IGNORE_OUTGOING, (&raw const one).cast(), 4);
        let block = cfg.frame_size.max(page);
        let per_block = block / cfg.frame_size;
        let req = |frames: usize| {
            let blocks = frames.div_ceil(per_block);
            TpacketReq {
                block_size: block as libc::c_uint,
                block_nr: blocks as libc::c_uint,
                frame_size: cfg.frame_size as libc::c_uint,
                frame_nr: (blocks * per_block) as libc::c_uint,
            }
        };
        let (rx_req, tx_req) = (req(cfg.rx_frames), req(cfg.tx_frames));
        set(
            PACKET_RX_RING,
            (&raw const rx_req).cast(),
            size_of::<TpacketReq>(),
        )
        .map_err(setup("the receive ring"))?;
        set(
            PACKET_TX_RING,
            (&raw const tx_req).cast(),
            size_of::<TpacketReq>(),
        )
        .map_err(setup("the transmit ring"))?;
        let cfg = RawConfig {
            frame_size: cfg.frame_size,
            rx_frames: rx_req.frame_nr as usize,
            tx_frames: tx_req.frame_nr as usize,
        };
        let len = (cfg.rx_frames + cfg.tx_frames) * cfg.frame_size;
        // SAFETY: mapping the rings just configured on our socket, as packet(7) describes.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(setup("the ring mapping")(io::Error::last_os_error()));
        }
        let map = Mapping {
            base: base.cast(),
            len,
        };
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const sll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        os_err(r, ()).map_err(setup("binding"))?;
        Ok(RawPort {
            map,
            fd,
            ifname: ifname.into(),
            ifindex: ifindex as i32,
            cfg,
            rx_next: 0,
            tx_next: 0,
            tx_pending: 0,
            counters: RawCounters::default(),
        })
    }

    /// The interface's name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The interface's index.
    pub fn ifindex(&self) -> i32 {
        self.ifindex
    }

    /// The ring sizes in use (the kernel's, rounded to whole blocks).
    pub fn config(&self) -> RawConfig {
        self.cfg
    }

    /// Counters so far.
    pub fn counters(&self) -> RawCounters {
        self.counters
    }

    fn slot(&self, rx: bool, i: usize) -> *mut u8 {
        let first = if rx { 0 } else { self.cfg.rx_frames };
        // SAFETY (of the arithmetic): `first + i` is below the ring's slot count, so the
        // offset lies inside the mapping.
        unsafe { self.map.base.add((first + i) * self.cfg.frame_size) }
    }

    fn read_u32(slot: *mut u8, off: usize) -> u32 {
        // SAFETY: inside the slot's header, aligned.
        unsafe { slot.add(off).cast::<u32>().read_volatile() }
    }

    fn read_u16(slot: *mut u8, off: usize) -> u16 {
        // SAFETY: inside the slot's header, aligned.
        unsafe { slot.add(off).cast::<u16>().read_volatile() }
    }

    /// Hands each frame waiting in the receive ring (at most `max`) to `f`, in arrival order,
    /// and gives its slot back to the kernel. Returns the number of frames handed over. Never
    /// blocks: see [`Self::wait`].
    pub fn recv(&mut self, max: usize, mut f: impl FnMut(&[u8], RxMeta)) -> usize {
        let mut n = 0;
        while n < max {
            let slot = self.slot(true, self.rx_next);
            let status = status(&self.map, slot);
            let s = status.load(Ordering::Acquire);
            if s & TP_STATUS_USER == 0 {
                break;
            }
            let len = Self::read_u32(slot, OFF_LEN) as usize;
            let snap = Self::read_u32(slot, OFF_SNAPLEN) as usize;
            let mac = usize::from(Self::read_u16(slot, OFF_MAC));
            if snap < len || s & TP_STATUS_COPY != 0 || mac + snap > self.cfg.frame_size {
                self.counters.rx_truncated += 1;
            } else {
                // SAFETY: the kernel wrote `snap` bytes at `mac` inside this slot, which is
                // ours until the status is handed back below.
                let frame = unsafe { std::slice::from_raw_parts(slot.add(mac), snap) };
                self.counters.rx_frames += 1;
                self.counters.rx_bytes += snap as u64;
                f(
                    frame,
                    RxMeta {
                        checksum_partial: s & TP_STATUS_CSUMNOTREADY != 0,
                    },
                );
            }
            status.store(TP_STATUS_KERNEL, Ordering::Release);
            self.rx_next = (self.rx_next + 1) % self.cfg.rx_frames;
            n += 1;
        }
        n
    }

    /// Whether a received frame waits in the ring.
    pub fn has_frames(&self) -> bool {
        status(&self.map, self.slot(true, self.rx_next)).load(Ordering::Acquire) & TP_STATUS_USER
            != 0
    }

    /// Queues one frame in the transmit ring. Returns `false` (and counts a drop) when the
    /// ring is full or the frame is larger than a slot; the frame leaves at the next
    /// [`Self::flush`].
    pub fn send(&mut self, frame: &[u8]) -> bool {
        if frame.len() > self.cfg.frame_size - TX_DATA_OFFSET {
            self.counters.tx_dropped += 1;
            return false;
        }
        let slot = self.slot(false, self.tx_next);
        let s = status(&self.map, slot).load(Ordering::Acquire);
        if s != TP_STATUS_AVAILABLE && s & TP_STATUS_WRONG_FORMAT == 0 {
            // Still owned by the kernel: the ring is full. Kick it and try once more.
            if self.tx_pending > 0 {
                let _ = self.flush();
            }
            if status(&self.map, slot).load(Ordering::Acquire) != TP_STATUS_AVAILABLE {
                self.counters.tx_dropped += 1;
                return false;
            }
        }
        // SAFETY: the slot is ours (status AVAILABLE) and the frame fits after the header.
        unsafe {
            std::ptr::copy_nonoverlapping(frame.as_ptr(), slot.add(TX_DATA_OFFSET), frame.len());
            slot.add(OFF_LEN)
                .cast::<u32>()
                .write_volatile(frame.len() as u32);
            slot.add(OFF_SNAPLEN)
                .cast::<u32>()
                .write_volatile(frame.len() as u32);
        }
        status(&self.map, slot).store(TP_STATUS_SEND_REQUEST, Ordering::Release);
        self.tx_next = (self.tx_next + 1) % self.cfg.tx_frames;
        self.tx_pending += 1;
        self.counters.tx_frames += 1;
        self.counters.tx_bytes += frame.len() as u64;
        true
    }

    /// Sends every frame queued since the last flush, with one system call.
    pub fn flush(&mut self) -> Result<(), RawError> {
        if self.tx_pending == 0 {
            return Ok(());
        }
        loop {
            // SAFETY: send(2) with no buffer kicks the transmit ring (packet(7)).
            let r =
                unsafe { libc::send(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT) };
            if r >= 0 {
                break;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                // The kernel is still busy with the ring: it sends what it has.
                io::ErrorKind::WouldBlock => break,
                _ => {
                    return Err(RawError::Send {
                        ifname: self.ifname.clone(),
                        source: e,
                    })
                }
            }
        }
        self.tx_pending = 0;
        self.counters.tx_flushes += 1;
        Ok(())
    }

    /// Waits until one of `ports` has a frame, or `timeout` passes. Returns whether any has.
    /// (No allocation for up to 64 ports.)
    pub fn wait(ports: &[RawPort], timeout: Option<Duration>) -> Result<bool, RawError> {
        if ports.iter().any(|p| p.has_frames()) {
            return Ok(true);
        }
        const ON_STACK: usize = 64;
        let idle = libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        };
        let mut stack = [idle; ON_STACK];
        let mut heap = Vec::new();
        let fds: &mut [libc::pollfd] = if ports.len() <= ON_STACK {
            &mut stack[..ports.len()]
        } else {
            heap.resize(ports.len(), idle);
            &mut heap
        };
        for (slot, p) in fds.iter_mut().zip(ports) {
            *slot = libc::pollfd {
                fd: p.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
        }
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as libc::c_int);
        // SAFETY: `fds` is a valid array of pollfd of the length passed.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(RawError::Poll(e));
        }
        Ok(ports.iter().any(|p| p.has_frames()))
    }
}

impl AsRawFd for RawPort {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
