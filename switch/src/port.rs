//! The port a shard moves its datagrams through: a kernel UDP socket, or (feature `dpdk`) UDP
//! over a DPDK device. Both are `ina_io` ports; this only adds the two socket settings a shard
//! asks for, which a DPDK port does not need.

use ina_io::{Counters, IoError, Port, RecvBatch, SendBatch, UdpPort};
use std::net::SocketAddr;
use std::time::Duration;

/// A shard's port.
#[derive(Debug)]
// (One per shard, made once: the size of the UDP variant costs nothing.)
#[allow(clippy::large_enum_variant)]
pub enum ShardPort {
    Udp(UdpPort),
    #[cfg(feature = "dpdk")]
    Dpdk(Box<ina_io::dpdk::DpdkUdpPort>),
}

impl ShardPort {
    /// Asks the kernel for a receive buffer of `bytes` (a DPDK port's ring is fixed: it
    /// answers with what was asked).
    pub(crate) fn grow_recv_buffer(&self, bytes: usize) -> std::io::Result<usize> {
        match self {
            ShardPort::Udp(p) => p.grow_recv_buffer(bytes),
            #[cfg(feature = "dpdk")]
            ShardPort::Dpdk(_) => Ok(bytes),
        }
    }

    /// Sends multicast out of the listening interface (a DPDK port sends a group's datagrams
    /// to its multicast MAC out of its device as it is).
    pub(crate) fn set_multicast_interface(&self) -> Result<(), IoError> {
        match self {
            ShardPort::Udp(p) => p.set_multicast_interface(),
            #[cfg(feature = "dpdk")]
            ShardPort::Dpdk(_) => Ok(()),
        }
    }
}

impl Port for ShardPort {
    type Addr = SocketAddr;

    fn local_addr(&self) -> SocketAddr {
        match self {
            ShardPort::Udp(p) => p.local_addr(),
            #[cfg(feature = "dpdk")]
            ShardPort::Dpdk(p) => p.local_addr(),
        }
    }

    fn recv_batch(
        &mut self,
        batch: &mut RecvBatch<SocketAddr>,
        timeout: Option<Duration>,
    ) -> Result<usize, IoError> {
        match self {
            ShardPort::Udp(p) => p.recv_batch(batch, timeout),
            #[cfg(feature = "dpdk")]
            ShardPort::Dpdk(p) => p.recv_batch(batch, timeout),
        }
    }

    fn send_batch(&mut self, batch: &SendBatch<SocketAddr>) -> Result<usize, IoError> {
        match self {
            ShardPort::Udp(p) => p.send_batch(batch),
            #[cfg(feature = "dpdk")]
            ShardPort::Dpdk(p) => p.send_batch(batch),
        }
    }

    fn counters(&self) -> Counters {
        match self {
            ShardPort::Udp(p) => p.counters(),
            #[cfg(feature = "dpdk")]
            ShardPort::Dpdk(p) => p.counters(),
        }
    }

    fn reserve_recv(&mut self, bytes: usize) {
        match self {
            ShardPort::Udp(p) => p.reserve_recv(bytes),
            #[cfg(feature = "dpdk")]
            ShardPort::Dpdk(p) => p.reserve_recv(bytes),
        }
    }
}
