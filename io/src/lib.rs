//! Port I/O for the ina daemons.
//!
//! This crate moves datagrams between the ina daemons (the software switch
//! and the worker library) and the network, **in batches**: one call
//! receives or sends many datagrams, on buffers the caller owns and reuses,
//! so that a daemon's hot loop makes no allocation per packet and as few
//! system calls as the platform allows (`recvmmsg`/`sendmmsg`, UDP GSO and
//! GRO on Linux).
//!
//! What it must **not** do: protocol logic. It never parses, validates or
//! rewrites the bytes it carries: a datagram is an opaque byte string plus a
//! peer address. Parsing belongs to `ina-wire`, aggregation to `ina-proto`.
//! (The only "parsing" here is of kernel metadata, such as the GRO segment
//! size the kernel reports next to a coalesced buffer.)
//!
//! # Overview
//!
//! * [`Port`] is the trait the daemons are written against: batched
//!   [`recv_batch`](Port::recv_batch) into a [`RecvBatch`] and batched
//!   [`send_batch`](Port::send_batch) from a [`SendBatch`].
//! * [`UdpPort`] implements it over a UDP socket (Linux: `recvmmsg`,
//!   `sendmmsg`, UDP GSO/GRO when the kernel supports them, probed at open
//!   time; other platforms: one datagram per system call).
//! * [`MemNetwork`] / [`MemPort`] implement it in memory, for testing the
//!   daemons without sockets.
//! * [`reflector::Reflector`] echoes every datagram back to its sender with
//!   the same batched I/O: the I/O-bound upper limit for the switch's packet
//!   rate.
//! * [`paced::PacedPort`] puts a port behind a link of a given rate inside the process.
//! * [`segment`] holds the pure GSO run planning / GRO splitting logic.
//!
//! # Example
//!
//! ```
//! use ina_io::{MemNetwork, Port, RecvBatch, SendBatch};
//! use std::time::Duration;
//!
//! let net = MemNetwork::new();
//! let mut a = net.port("127.0.0.1:1000".parse().unwrap()).unwrap();
//! let mut b = net.port("127.0.0.1:2000".parse().unwrap()).unwrap();
//!
//! let mut out = SendBatch::new();
//! out.push(b.local_addr(), b"hello");
//! out.push(b.local_addr(), b"world");
//! assert_eq!(a.send_batch(&out).unwrap(), 2);
//!
//! let mut batch = RecvBatch::new(32, 2048);
//! let n = b.recv_batch(&mut batch, Some(Duration::from_secs(1))).unwrap();
//! assert_eq!(n, 2);
//! let first = batch.get(0).unwrap();
//! assert_eq!((first.addr, first.data), (a.local_addr(), &b"hello"[..]));
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod batch;
mod counters;
#[cfg(feature = "dpdk")]
pub mod dpdk;
mod error;
mod mem;
pub mod metrics;
#[cfg(target_os = "linux")]
pub mod mtu;
#[cfg(target_os = "linux")]
pub mod netns;
pub mod paced;
#[cfg(target_os = "linux")]
pub mod packet;
pub mod reflector;
pub mod segment;
#[cfg(target_os = "linux")]
mod sys;
mod udp;

use std::fmt;
use std::hash::Hash;
use std::net::SocketAddr;
use std::time::Duration;

pub use batch::{
    Datagram, Extent, RecvBatch, RecvIter, SendBatch, SendIter, MAX_SLOTS, MAX_SLOT_SIZE,
};
pub use counters::Counters;
pub use error::IoError;
pub use mem::{MemConfig, MemNetStats, MemNetwork, MemPort};
pub use udp::{UdpConfig, UdpFeatures, UdpPort};

/// An address that identifies a peer of a [`Port`].
///
/// Implemented for [`SocketAddr`], the address type of [`UdpPort`] and
/// [`MemPort`]. A raw Ethernet port (`AF_PACKET`, `AF_XDP`) would implement
/// it for a MAC address type; a DPDK port that runs its own UDP/IP stack
/// can keep using `SocketAddr`.
pub trait PortAddr: Copy + Eq + Hash + fmt::Debug + fmt::Display + Send + Sync + 'static {}

impl PortAddr for SocketAddr {}

/// A network port moving datagrams in batches.
///
/// # Design
///
/// * **Batches on caller-owned buffers.** [`recv_batch`](Port::recv_batch)
///   fills a [`RecvBatch`] (preallocated fixed-size slots) and
///   [`send_batch`](Port::send_batch) drains a [`SendBatch`] (one
///   contiguous byte buffer plus an index). Both are reused across calls,
///   so a loop around a port allocates nothing per packet once warm.
/// * **`&mut self`.** Implementations keep per-call scratch state (message
///   header arrays, GRO staging buffers, descriptor rings for future
///   AF_XDP/DPDK ports) that must not be shared; a second handle for
///   another thread is obtained explicitly (e.g. [`UdpPort::try_clone`]).
/// * **Associated address type** rather than a closed address enum: the
///   UDP path pays nothing for address kinds it never sees, a daemon
///   generic over `P: Port` stores `P::Addr` in its peer tables with full
///   type checking, and a later raw-Ethernet port can use MAC addresses
///   without touching this crate's existing users. Code that wants dynamic
///   dispatch can still use `dyn Port<Addr = SocketAddr>` (the trait is
///   object safe).
/// * **No protocol logic.** A port never looks inside the datagrams.
pub trait Port: Send {
    /// The address of a peer (source of received datagrams, destination of
    /// sent ones).
    type Addr: PortAddr;

    /// The address this port is bound to.
    fn local_addr(&self) -> Self::Addr;

    /// Receives up to `batch.capacity()` datagrams into `batch`, replacing
    /// its previous contents, and returns how many arrived
    /// (`batch.len()`).
    ///
    /// `timeout` bounds the wait for the **first** datagram:
    ///
    /// * `None` waits until at least one datagram arrives;
    /// * `Some(Duration::ZERO)` never waits (non-blocking);
    /// * `Some(d)` waits at most about `d`, then returns `Ok(0)`.
    ///
    /// Once a datagram is available the call returns what is immediately
    /// available, without waiting for the batch to fill. A datagram larger
    /// than a slot is stored cut to the slot size and flagged
    /// [`Datagram::truncated`]; it is never silently shortened.
    fn recv_batch(
        &mut self,
        batch: &mut RecvBatch<Self::Addr>,
        timeout: Option<Duration>,
    ) -> Result<usize, IoError>;

    /// Sends every datagram of `batch`, in order, and returns how many were
    /// accepted by the port.
    ///
    /// The call waits for buffer space if needed. A datagram refused on its
    /// own (too large, unreachable destination, ...) is skipped and counted
    /// in [`Counters::tx_errors`]; the rest of the batch is still sent, so
    /// the result can be less than `batch.len()`. If **no** datagram of a
    /// non-empty batch is accepted, the first error is returned as
    /// [`IoError::Send`]. A failure of the port itself is returned as
    /// [`IoError::Send`] with the number of datagrams sent before it.
    fn send_batch(&mut self, batch: &SendBatch<Self::Addr>) -> Result<usize, IoError>;

    /// A snapshot of this port handle's counters.
    fn counters(&self) -> Counters;

    /// Asks the port to hold at least `bytes` of received datagrams that are waiting to be
    /// read (the peer may send that much at once). Best effort: a port whose buffering is
    /// fixed, or that the system caps, keeps what it has.
    fn reserve_recv(&mut self, bytes: usize) {
        let _ = bytes;
    }
}

impl<P: Port + ?Sized> Port for Box<P> {
    type Addr = P::Addr;

    fn local_addr(&self) -> Self::Addr {
        (**self).local_addr()
    }

    fn recv_batch(
        &mut self,
        batch: &mut RecvBatch<Self::Addr>,
        timeout: Option<Duration>,
    ) -> Result<usize, IoError> {
        (**self).recv_batch(batch, timeout)
    }

    fn send_batch(&mut self, batch: &SendBatch<Self::Addr>) -> Result<usize, IoError> {
        (**self).send_batch(batch)
    }

    fn counters(&self) -> Counters {
        (**self).counters()
    }

    fn reserve_recv(&mut self, bytes: usize) {
        (**self).reserve_recv(bytes);
    }
}

impl<P: Port + ?Sized> Port for &mut P {
    type Addr = P::Addr;

    fn local_addr(&self) -> Self::Addr {
        (**self).local_addr()
    }

    fn recv_batch(
        &mut self,
        batch: &mut RecvBatch<Self::Addr>,
        timeout: Option<Duration>,
    ) -> Result<usize, IoError> {
        (**self).recv_batch(batch, timeout)
    }

    fn send_batch(&mut self, batch: &SendBatch<Self::Addr>) -> Result<usize, IoError> {
        (**self).send_batch(batch)
    }

    fn counters(&self) -> Counters {
        (**self).counters()
    }

    fn reserve_recv(&mut self, bytes: usize) {
        (**self).reserve_recv(bytes);
    }
}
