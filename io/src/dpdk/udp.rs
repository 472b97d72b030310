//! [`DpdkUdpPort`]: UDP datagrams over a DPDK device, as a batched [`Port`].
//!
//! The port owns one IPv4 address and UDP port on the device. It answers ARP requests for its
//! address, learns neighbours from ARP and from the datagrams it receives, asks (ARP) for a
//! destination it does not know, and takes static neighbours from its configuration. A
//! datagram to a destination not yet resolved is not sent (counted in `tx_errors`): the
//! protocol above resends, and [`DpdkUdpPort::resolve`] resolves a peer before traffic starts.
//! Frames that are not ARP nor UDP to this port are dropped and counted.

use super::{Device, DpdkError, BURST};
use crate::{Counters, IoError, Port, RecvBatch, SendBatch};
use ina_wire::ether::{
    arp_reply_in_place, emit_arp_request, ArpPacket, EthernetFrame, ARP_FRAME_LEN, ARP_REPLY,
    ETHERTYPE_ARP, ETHERTYPE_IPV4,
};
use ina_wire::frame::{self, FrameAddrs, FRAME_HEADER_LEN};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

/// How a [`DpdkUdpPort`] is addressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpdkUdpConfig {
    /// The port's IPv4 address and UDP port.
    pub local: SocketAddrV4,
    /// Neighbours known in advance (IPv4 → MAC).
    pub neighbours: Vec<(Ipv4Addr, [u8; 6])>,
    /// Multicast groups whose datagrams the port also receives (a job's results group).
    pub groups: Vec<SocketAddrV4>,
}

/// Frames of other kinds the port dropped, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DpdkUdpStats {
    /// Frames neither ARP nor IPv4/UDP to this port (other hosts' traffic, other protocols).
    pub foreign: u64,
    /// Malformed frames.
    pub malformed: u64,
    /// ARP requests sent (resolving destinations).
    pub arp_requests_sent: u64,
    /// ARP requests for this port's address answered.
    pub arp_replies_sent: u64,
    /// Datagrams not sent because their destination's MAC is not known yet.
    pub unresolved: u64,
}

/// UDP over a DPDK device.
#[derive(Debug)]
pub struct DpdkUdpPort {
    dev: Device,
    local: SocketAddrV4,
    neighbours: HashMap<Ipv4Addr, [u8; 6]>,
    groups: Vec<SocketAddrV4>,
    /// When each unresolved destination was last asked for.
    asked: HashMap<Ipv4Addr, Instant>,
    counters: Counters,
    stats: DpdkUdpStats,
    tx_buf: Vec<u8>,
    tx_frames: Vec<(u32, u16)>,
}

/// How often an unresolved destination is asked for again.
const ARP_RETRY: Duration = Duration::from_millis(100);

impl DpdkUdpPort {
    /// The port on `dev`, addressed as `cfg` says.
    pub fn new(dev: Device, cfg: &DpdkUdpConfig) -> DpdkUdpPort {
        DpdkUdpPort {
            dev,
            local: cfg.local,
            neighbours: cfg.neighbours.iter().copied().collect(),
            groups: cfg.groups.clone(),
            asked: HashMap::new(),
            counters: Counters::default(),
            stats: DpdkUdpStats::default(),
            tx_buf: Vec::with_capacity(BURST * 2048),
            tx_frames: Vec::with_capacity(BURST),
        }
    }

    /// The device underneath.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// What the port dropped, and its ARP exchanges.
    pub fn stats(&self) -> DpdkUdpStats {
        self.stats
    }

    /// The MAC of `ip`: known, or asked for (ARP) until it answers or `timeout` passes.
    /// Datagrams that arrive meanwhile are dropped (counted as foreign).
    pub fn resolve(&mut self, ip: Ipv4Addr, timeout: Duration) -> Result<[u8; 6], DpdkError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(mac) = self.neighbours.get(&ip) {
                return Ok(*mac);
            }
            if Instant::now() >= deadline {
                return Err(DpdkError::Device {
                    name: self.dev.name().to_string(),
                    what: "ARP",
                    reason: format!("no answer from {ip} within {timeout:?}"),
                });
            }
            self.ask(ip);
            self.poll(None);
        }
    }

    /// Sends an ARP request for `ip`, at most once per [`ARP_RETRY`].
    fn ask(&mut self, ip: Ipv4Addr) {
        let now = Instant::now();
        if self
            .asked
            .get(&ip)
            .is_some_and(|t| now.duration_since(*t) < ARP_RETRY)
        {
            return;
        }
        self.asked.insert(ip, now);
        let mut f = [0u8; ARP_FRAME_LEN];
        if emit_arp_request(
            &mut f,
            self.dev.mac(),
            self.local.ip().octets(),
            ip.octets(),
        )
        .is_ok()
        {
            self.dev.send(&f, &[(0, ARP_FRAME_LEN as u16)]);
            self.stats.arp_requests_sent += 1;
        }
    }

    /// One burst: ARP handled, datagrams to this port pushed into `batch` (if any).
    fn poll(&mut self, mut batch: Option<&mut RecvBatch<SocketAddr>>) -> usize {
        let max = batch.as_ref().map_or(BURST, |b| b.remaining().min(BURST));
        if max == 0 {
            return 0;
        }
        let (mac, ip, port) = (self.dev.mac(), self.local.ip().octets(), self.local.port());
        let groups = &self.groups;
        let mut replies: Vec<u8> = Vec::new();
        let mut learned: Vec<(Ipv4Addr, [u8; 6])> = Vec::new();
        let mut delivered = 0;
        let stats = &mut self.stats;
        let counters = &mut self.counters;
        self.dev.recv(max, |f| {
            let Ok(eth) = EthernetFrame::new_checked(f) else {
                stats.malformed += 1;
                return;
            };
            match eth.ethertype() {
                ETHERTYPE_ARP => {
                    let Ok(arp) = ArpPacket::new_checked(eth.payload()) else {
                        stats.malformed += 1;
                        return;
                    };
                    if arp.hlen() == 6 && arp.plen() == 4 {
                        learned.push((Ipv4Addr::from(arp.spa()), arp.sha()));
                    }
                    if arp.is_ipv4_request() && arp.tpa() == ip {
                        let at = replies.len();
                        replies.extend_from_slice(&f[..ARP_FRAME_LEN.min(f.len())]);
                        if arp_reply_in_place(&mut replies[at..], mac, ip).is_err() {
                            replies.truncate(at);
                        }
                    } else if arp.oper() != ARP_REPLY && !arp.is_ipv4_request() {
                        stats.foreign += 1;
                    }
                }
                ETHERTYPE_IPV4 => match frame::parse(f) {
                    Ok(u)
                        if (u.addrs.dst_ip == ip && u.addrs.dst_port == port)
                            || groups.iter().any(|g| {
                                g.ip().octets() == u.addrs.dst_ip && g.port() == u.addrs.dst_port
                            }) =>
                    {
                        let src = SocketAddr::from((u.addrs.src_ip, u.addrs.src_port));
                        learned.push((Ipv4Addr::from(u.addrs.src_ip), u.addrs.src_mac));
                        let pushed = batch.as_deref_mut().is_some_and(|b| b.push(src, u.payload));
                        if pushed {
                            delivered += 1;
                            counters.rx_datagrams += 1;
                            counters.rx_bytes += u.payload.len() as u64;
                        } else {
                            stats.foreign += 1;
                        }
                    }
                    Ok(_) => stats.foreign += 1,
                    Err(_) => stats.malformed += 1,
                },
                _ => stats.foreign += 1,
            }
        });
        for (ip, mac) in learned {
            if mac != [0; 6] && mac != [0xff; 6] {
                self.neighbours.insert(ip, mac);
            }
        }
        if !replies.is_empty() {
            let frames: Vec<(u32, u16)> = (0..replies.len() / ARP_FRAME_LEN)
                .map(|i| ((i * ARP_FRAME_LEN) as u32, ARP_FRAME_LEN as u16))
                .collect();
            self.stats.arp_replies_sent += self.dev.send(&replies, &frames) as u64;
        }
        delivered
    }
}

impl Port for DpdkUdpPort {
    type Addr = SocketAddr;

    fn local_addr(&self) -> SocketAddr {
        SocketAddr::V4(self.local)
    }

    fn recv_batch(
        &mut self,
        batch: &mut RecvBatch<SocketAddr>,
        timeout: Option<Duration>,
    ) -> Result<usize, IoError> {
        batch.clear();
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut idle = 0u32;
        loop {
            // Take every burst already waiting, up to the batch.
            while !batch.is_full() && self.poll(Some(batch)) > 0 {}
            if !batch.is_empty() {
                return Ok(batch.len());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(0);
            }
            // Poll mode: spin, but leave the core to others when nothing comes for a while.
            idle += 1;
            if idle > 256 {
                std::thread::yield_now();
            }
        }
    }

    fn send_batch(&mut self, batch: &SendBatch<SocketAddr>) -> Result<usize, IoError> {
        self.tx_buf.clear();
        self.tx_frames.clear();
        let mac = self.dev.mac();
        let max = self.dev.max_frame();
        let mut sent = 0;
        let mut refused = 0u64;
        for (addr, data) in batch.iter() {
            let SocketAddr::V4(dst) = addr else {
                refused += 1;
                continue;
            };
            let known = if dst.ip().is_multicast() {
                let o = dst.ip().octets();
                Some([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]])
            } else {
                self.neighbours.get(dst.ip()).copied()
            };
            let Some(dst_mac) = known else {
                self.stats.unresolved += 1;
                refused += 1;
                self.ask(*dst.ip());
                continue;
            };
            let len = FRAME_HEADER_LEN + data.len();
            if len > max {
                refused += 1;
                continue;
            }
            let at = self.tx_buf.len();
            self.tx_buf.resize(at + len, 0);
            let addrs = FrameAddrs {
                src_mac: mac,
                dst_mac,
                src_ip: self.local.ip().octets(),
                dst_ip: dst.ip().octets(),
                src_port: self.local.port(),
                dst_port: dst.port(),
            };
            if frame::emit_headers(&mut self.tx_buf[at..], &addrs, data.len()).is_err() {
                self.tx_buf.truncate(at);
                refused += 1;
                continue;
            }
            self.tx_buf[at + FRAME_HEADER_LEN..at + len].copy_from_slice(data);
            self.tx_frames.push((at as u32, len as u16));
            self.counters.tx_bytes += data.len() as u64;
            if self.tx_frames.len() == BURST {
                sent += self.flush();
            }
        }
        sent += self.flush();
        self.counters.tx_datagrams += sent as u64;
        self.counters.tx_errors += refused;
        if sent == 0 && !batch.is_empty() {
            return Err(IoError::Send {
                sent: 0,
                source: std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    "no datagram sent (destination not resolved, frame too long, or the device's queue full)",
                ),
            });
        }
        Ok(sent)
    }

    fn counters(&self) -> Counters {
        self.counters
    }
}

impl DpdkUdpPort {
    /// Sends the frames staged in `tx_buf`, waiting (briefly) for room in the queue.
    fn flush(&mut self) -> usize {
        let mut done = 0;
        let mut stalls = 0;
        while done < self.tx_frames.len() && stalls < 10_000 {
            let n = self.dev.send(&self.tx_buf, &self.tx_frames[done..]);
            done += n;
            if n == 0 {
                stalls += 1;
                std::thread::yield_now();
            }
        }
        self.counters.tx_errors += (self.tx_frames.len() - done) as u64;
        self.tx_buf.clear();
        self.tx_frames.clear();
        done
    }
}
