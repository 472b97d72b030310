//! [`DpdkUdpPort`]: UDP datagrams over one or more DPDK devices, as a batched [`Port`].
//!
//! Several devices make one host with one address on several links (a switch with a memif
//! link per worker): the port receives from all of them and sends each datagram out of the
//! device its destination was learned on; ARP requests and multicast go out of every device.
//!
//! The port owns one IPv4 address and UDP port on the device. It answers ARP requests for its
//! address, asks (ARP) for a destination it does not know and learns it from the answer (only
//! answers to its own requests, at most [`MAX_NEIGHBOURS`]), and takes static neighbours from
//! its configuration, which nothing on the wire replaces. A
//! datagram to a destination not yet resolved is not sent (counted in `tx_errors`): the
//! protocol above resends, and [`DpdkUdpPort::resolve`] resolves a peer before traffic starts.
//! Frames that are not ARP nor UDP to this port are dropped and counted.

use super::{Device, DpdkError, BURST};
use crate::{Counters, IoError, Port, RecvBatch, SendBatch};
use ina_wire::ether::{
    arp_reply_in_place, emit_arp_request, ArpPacket, EthernetFrame, ARP_FRAME_LEN, ARP_REPLY,
    ETHERTYPE_ARP, ETHERTYPE_IPV4,
};
use ina_wire::frame::{self, FrameAddrs, FrameTemplate, FRAME_HEADER_LEN};
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

impl DpdkUdpConfig {
    /// A port at `local`, with no neighbour known in advance and no group.
    pub fn new(local: SocketAddrV4) -> DpdkUdpConfig {
        DpdkUdpConfig {
            local,
            neighbours: Vec::new(),
            groups: Vec::new(),
        }
    }
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
    /// ARP answers not learned because the neighbour table was full.
    pub neighbours_refused: u64,
}

/// UDP over DPDK devices.
#[derive(Debug)]
pub struct DpdkUdpPort {
    devs: Vec<Device>,
    local: SocketAddrV4,
    /// Destination → (device, MAC): the configured peers, and the answers to this port's own
    /// ARP requests (at most [`MAX_NEIGHBOURS`] of those).
    neighbours: HashMap<Ipv4Addr, (usize, [u8; 6])>,
    /// The configured peers among `neighbours` (never replaced by what the wire says).
    configured: std::collections::HashSet<Ipv4Addr>,
    groups: Vec<SocketAddrV4>,
    /// When each unresolved destination was last asked for.
    asked: HashMap<Ipv4Addr, Instant>,
    /// The device polled first next time, so that none starves the others.
    next_dev: usize,
    counters: Counters,
    stats: DpdkUdpStats,
    /// The datagrams of the batch being sent, by device: (index in the batch, the headers of
    /// its frame).
    tx_plan: Vec<Vec<(usize, FrameTemplate)>>,
    /// The headers of frames already sent, by (device, destination, its MAC).
    templates: HashMap<(usize, SocketAddrV4, [u8; 6]), FrameTemplate>,
}

/// Most neighbours learned from ARP answers (beyond, answers are not learned and counted).
pub const MAX_NEIGHBOURS: usize = 4096;

/// Whether an ARP packet is an answer to a request this port sent (to `local`, from an address
/// asked for): the only ARP a port learns from, so that neither gratuitous nor spoofed ARP nor
/// a datagram's source can add or replace a neighbour.
fn answers_our_request(
    arp: &ArpPacket<'_>,
    local: [u8; 4],
    asked: &HashMap<Ipv4Addr, Instant>,
) -> bool {
    arp.hlen() == 6
        && arp.plen() == 4
        && arp.oper() == ARP_REPLY
        && arp.tpa() == local
        && asked.contains_key(&Ipv4Addr::from(arp.spa()))
        && arp.sha() != [0; 6]
        && arp.sha() != [0xff; 6]
}

/// Most remembered frame headers (the cache starts afresh beyond).
const MAX_TEMPLATES: usize = 4096;

/// How often an unresolved destination is asked for again.
const ARP_RETRY: Duration = Duration::from_millis(100);

impl DpdkUdpPort {
    /// The port on `dev`, addressed as `cfg` says.
    pub fn new(dev: Device, cfg: &DpdkUdpConfig) -> DpdkUdpPort {
        DpdkUdpPort::on_devices(vec![dev], cfg)
    }

    /// The port on several devices (static neighbours are on the first). With no device it
    /// receives and sends nothing.
    pub fn on_devices(devs: Vec<Device>, cfg: &DpdkUdpConfig) -> DpdkUdpPort {
        let n = devs.len();
        let neighbours: HashMap<_, _> = cfg
            .neighbours
            .iter()
            .map(|(ip, mac)| (*ip, (0, *mac)))
            .collect();
        DpdkUdpPort {
            devs,
            local: cfg.local,
            configured: neighbours.keys().copied().collect(),
            neighbours,
            groups: cfg.groups.clone(),
            asked: HashMap::new(),
            next_dev: 0,
            counters: Counters::default(),
            stats: DpdkUdpStats::default(),
            tx_plan: vec![Vec::with_capacity(BURST); n],
            templates: HashMap::new(),
        }
    }

    /// The headers of frames out of device `d` to `dst` at `mac` (made once).
    fn template(&mut self, d: usize, dst: SocketAddrV4, mac: [u8; 6]) -> Option<FrameTemplate> {
        if let Some(t) = self.templates.get(&(d, dst, mac)) {
            return Some(*t);
        }
        let addrs = FrameAddrs {
            src_mac: ina_wire::MacAddr(self.devs.get(d)?.mac()),
            dst_mac: ina_wire::MacAddr(mac),
            src_ip: self.local.ip().octets(),
            dst_ip: dst.ip().octets(),
            src_port: self.local.port(),
            dst_port: dst.port(),
        };
        let t = FrameTemplate::new(&addrs).ok()?;
        if self.templates.len() >= MAX_TEMPLATES {
            self.templates.clear();
        }
        self.templates.insert((d, dst, mac), t);
        Some(t)
    }

    /// The devices underneath.
    pub fn devices(&self) -> &[Device] {
        &self.devs
    }

    /// How many neighbours the port knows (configured and learned).
    pub fn neighbour_count(&self) -> usize {
        self.neighbours.len()
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
            if let Some((_, mac)) = self.neighbours.get(&ip) {
                return Ok(*mac);
            }
            if Instant::now() >= deadline {
                return Err(DpdkError::Device {
                    name: self.devs.first().map_or("", |d| d.name()).to_string(),
                    what: "ARP",
                    reason: format!("no answer from {ip} within {timeout:?}"),
                });
            }
            self.ask(ip);
            self.poll(None);
        }
    }

    /// Sends an ARP request for `ip` out of every device, at most once per [`ARP_RETRY`].
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
        let local = self.local.ip().octets();
        for dev in &mut self.devs {
            let mut f = [0u8; ARP_FRAME_LEN];
            if emit_arp_request(&mut f, dev.mac(), local, ip.octets()).is_ok() {
                self.stats.arp_requests_sent += dev.send_with(1, |_, buf| put(&f, buf)) as u64;
            }
        }
    }

    /// One burst from each device: ARP handled, datagrams to this port pushed into `batch`
    /// (if any). Returns how many datagrams were delivered.
    fn poll(&mut self, mut batch: Option<&mut RecvBatch<SocketAddr>>) -> usize {
        let n = self.devs.len();
        if n == 0 {
            return 0;
        }
        let first = self.next_dev % n;
        self.next_dev = (first + 1) % n;
        let mut delivered = 0;
        for k in 0..n {
            delivered += self.poll_device((first + k) % n, batch.as_deref_mut());
        }
        delivered
    }

    fn poll_device(&mut self, d: usize, mut batch: Option<&mut RecvBatch<SocketAddr>>) -> usize {
        let max = batch.as_ref().map_or(BURST, |b| b.remaining().min(BURST));
        let Some(dev) = self.devs.get_mut(d) else {
            return 0;
        };
        if max == 0 {
            return 0;
        }
        let (mac, ip, port) = (dev.mac(), self.local.ip().octets(), self.local.port());
        let groups = &self.groups;
        // An answer to this port's own request is remembered on the device it came from;
        // a configured peer is never replaced, and the learned ones are bounded.
        let neighbours = &mut self.neighbours;
        let asked = &mut self.asked;
        let configured = &self.configured;
        let mut refused = 0u64;
        let mut learn = |arp: &ArpPacket<'_>| {
            if !answers_our_request(arp, ip, asked) {
                return;
            }
            let peer = Ipv4Addr::from(arp.spa());
            asked.remove(&peer);
            if configured.contains(&peer) {
                return;
            }
            let learned = neighbours.len() - configured.len();
            if !neighbours.contains_key(&peer) && learned >= MAX_NEIGHBOURS {
                refused += 1;
                return;
            }
            neighbours.insert(peer, (d, arp.sha()));
        };
        let mut replies: Vec<[u8; ARP_FRAME_LEN]> = Vec::new();
        let mut delivered = 0;
        let stats = &mut self.stats;
        let counters = &mut self.counters;
        dev.recv(max, |f| {
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
                    learn(&arp);
                    if arp.is_ipv4_request() && arp.tpa() == ip {
                        let mut reply = [0u8; ARP_FRAME_LEN];
                        if let Some(request) = f.get(..ARP_FRAME_LEN) {
                            reply.copy_from_slice(request);
                            if arp_reply_in_place(&mut reply, mac, ip).is_ok() {
                                replies.push(reply);
                            }
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
        self.stats.neighbours_refused += refused;
        if !replies.is_empty() {
            let sent = dev.send_with(replies.len(), |i, buf| {
                replies.get(i).map_or(0, |r| put(r, buf))
            });
            self.stats.arp_replies_sent += sent as u64;
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
            // Poll mode: spin (reading the clock every 16 empty polls), and leave the core to
            // others when nothing comes for a while.
            idle += 1;
            if (idle.is_multiple_of(16) || timeout == Some(Duration::ZERO))
                && deadline.is_some_and(|d| Instant::now() >= d)
            {
                return Ok(0);
            }
            if idle > 1024 {
                std::thread::yield_now();
            }
        }
    }

    fn send_batch(&mut self, batch: &SendBatch<SocketAddr>) -> Result<usize, IoError> {
        for plan in &mut self.tx_plan {
            plan.clear();
        }
        let max = self.devs.iter().map(Device::max_frame).min().unwrap_or(0);
        let mut refused = 0u64;
        for (i, (addr, data)) in batch.iter().enumerate() {
            let SocketAddr::V4(dst) = addr else {
                refused += 1;
                continue;
            };
            if FRAME_HEADER_LEN + data.len() > max {
                refused += 1;
                continue;
            }
            // A group goes out of every device, to its multicast MAC.
            if dst.ip().is_multicast() {
                let o = dst.ip().octets();
                let mac = [0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]];
                for d in 0..self.devs.len() {
                    match self.template(d, dst, mac) {
                        Some(t) => self.tx_plan[d].push((i, t)),
                        None => refused += 1,
                    }
                }
                continue;
            }
            match self.neighbours.get(dst.ip()).copied() {
                Some((d, mac)) => match self.template(d, dst, mac) {
                    Some(t) => self.tx_plan[d].push((i, t)),
                    None => refused += 1,
                },
                None => {
                    self.stats.unresolved += 1;
                    refused += 1;
                    self.ask(*dst.ip());
                }
            }
        }
        // Each frame is written straight into its mbuf: headers, then the payload.
        let mut sent = 0;
        let mut bytes = 0u64;
        for (dev, plan) in self.devs.iter_mut().zip(&self.tx_plan) {
            for chunk in plan.chunks(BURST) {
                let mut chunk_bytes = 0u64;
                let went = dev.send_with(chunk.len(), |k, buf| {
                    let Some((i, t)) = chunk.get(k) else {
                        return 0;
                    };
                    let Some((_, data)) = batch.get(*i) else {
                        return 0;
                    };
                    let Ok(len) = t.write(buf, data.len()) else {
                        return 0;
                    };
                    let Some(payload) = buf.get_mut(FRAME_HEADER_LEN..len) else {
                        return 0;
                    };
                    payload.copy_from_slice(data);
                    chunk_bytes += data.len() as u64;
                    len
                });
                sent += went;
                if went == chunk.len() {
                    bytes += chunk_bytes;
                } else {
                    refused += (chunk.len() - went) as u64;
                }
            }
        }
        self.counters.tx_datagrams += sent as u64;
        self.counters.tx_bytes += bytes;
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

/// Copies `frame` into `buf` if it fits; returns its length, or 0 (no frame).
fn put(frame: &[u8], buf: &mut [u8]) -> usize {
    match buf.get_mut(..frame.len()) {
        Some(dst) => {
            dst.copy_from_slice(frame);
            frame.len()
        }
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: [u8; 4] = [198, 18, 0, 100];
    const LOCAL_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x64];
    const PEER: [u8; 4] = [198, 18, 1, 1];
    const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 1, 0];

    /// `from` (at `from_mac`) asking `to` for its MAC.
    fn request(from_mac: [u8; 6], from: [u8; 4], to: [u8; 4]) -> [u8; ARP_FRAME_LEN] {
        let mut f = [0u8; ARP_FRAME_LEN];
        emit_arp_request(&mut f, from_mac, from, to).unwrap();
        f
    }

    /// `from`'s answer (at `mac`) to a request of `to`.
    fn reply(mac: [u8; 6], from: [u8; 4], to: [u8; 4]) -> [u8; ARP_FRAME_LEN] {
        let mut f = request(LOCAL_MAC, to, from);
        arp_reply_in_place(&mut f, mac, from).unwrap();
        f
    }

    fn learns(frame: &[u8], asked: &HashMap<Ipv4Addr, Instant>) -> bool {
        let eth = EthernetFrame::new_checked(frame).unwrap();
        let arp = ArpPacket::new_checked(eth.payload()).unwrap();
        answers_our_request(&arp, LOCAL, asked)
    }

    #[test]
    fn only_answers_to_our_own_requests_are_learned() {
        let mut asked = HashMap::new();
        let answer = reply(PEER_MAC, PEER, LOCAL);
        // Not asked for: a reply out of the blue (spoofed or gratuitous) is not learned.
        assert!(!learns(&answer, &asked));
        asked.insert(Ipv4Addr::from(PEER), Instant::now());
        assert!(learns(&answer, &asked));
        // A request, even one to this port, teaches nothing.
        assert!(!learns(&request(PEER_MAC, PEER, LOCAL), &asked));
        // An answer meant for another host, or with no usable MAC, neither.
        assert!(!learns(&reply(PEER_MAC, PEER, [198, 18, 1, 9]), &asked));
        assert!(!learns(&reply([0xff; 6], PEER, LOCAL), &asked));
        assert!(!learns(&reply([0; 6], PEER, LOCAL), &asked));
        // Another host's answer while only PEER was asked for.
        assert!(!learns(&reply(PEER_MAC, [198, 18, 1, 2], LOCAL), &asked));
    }
}
