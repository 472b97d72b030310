//! The switch on the wire (PROTOCOL.md §7): a sans-IO model of a switch that sees whole
//! Ethernet frames, answers ARP for its own address, runs the `ina` datagrams addressed to it
//! through a [`Pipeline`], and forwards every other frame by a static L2 table.
//!
//! [`FrameSwitch::process`] takes one frame, the port it came in on and the time, and writes
//! the frames to send, each with its egress port, into a reusable [`Outputs`]; it returns the
//! one [`Event`] the frame counted. It is the reference the P4 programs are compared with, and
//! what a software switch on raw Ethernet ports runs.
//!
//! # Authentication
//! The pipeline checks a packet's rank against a [`PortId`]. Here a rank's identity is its
//! endpoint, (switch port, IPv4 address, UDP port): the frame's identity is turned into the
//! `PortId` of the rank the header names when the identities are equal, and into
//! [`UNMATCHED`] (a port of no rank) when they are not, so that the pipeline's own checks
//! (unknown job, unknown rank, wrong port, in that order) decide.
//!
//! # Allocation
//! After the first frames have grown the buffers of [`Outputs`] to their working size, the
//! per-frame path allocates nothing: replies are written into a scratch buffer sized once for
//! the largest reply.

use crate::event::Event;
use crate::pipeline::{
    Counters, JobConfig, JobError, Pipeline, PipelineConfig, PortId, Uplink, Verdict,
};
use crate::Instant;
use ina_wire::agg::MAX_RANK;
use ina_wire::ether::{
    self, ArpPacket, EthernetFrame, Ipv4Header, UdpHeader, BROADCAST, ETHERNET_LEN, ETHERTYPE_ARP,
    ETHERTYPE_IPV4, IPV4_LEN, IP_PROTO_UDP, UDP_LEN,
};
use ina_wire::frame::{emit_headers, FrameAddrs, FRAME_HEADER_LEN};
use ina_wire::{MacAddr, HEADER_LEN, UDP_PORT};

/// The pipeline port given to a frame whose identity is not the endpoint of the rank its
/// header names: no rank of any job has it, so the pipeline counts `wrong_port` for it.
pub const UNMATCHED: PortId = PortId(u16::MAX);

/// Where a rank of a job lives: the switch port it is behind and its addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The switch port.
    pub port: u16,
    /// The worker's MAC address.
    pub mac: MacAddr,
    /// The worker's IPv4 address.
    pub ip: [u8; 4],
    /// The worker's UDP port.
    pub udp_port: u16,
}

/// One job of a frame switch: the pipeline's job with the endpoint of every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameJob {
    pub job: u16,
    pub epoch: u16,
    pub slot_base: u16,
    pub slot_count: u16,
    pub elems_per_packet: u16,
    /// The endpoint of each rank; `ranks.len()` is the number of workers.
    pub ranks: Vec<Endpoint>,
    /// The upper switch, if this switch is the lower level of a tree for the job
    /// (PROTOCOL.md §9).
    pub uplink: Option<FrameUplink>,
}

/// The upper switch of a job and the job there (PROTOCOL.md §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameUplink {
    /// Where the upper switch is: the port it is behind, its MAC and IPv4 address, its UDP
    /// port.
    pub switch: Endpoint,
    /// The job's id, epoch and first slot on the upper switch, and this switch's rank there.
    pub job: u16,
    pub epoch: u16,
    pub slot_base: u16,
    pub rank: u8,
}

/// The pipeline port of every job's upper switch: the frame switch turns the upper switch's
/// identity into it, and sends what the pipeline sends to it to that switch.
pub const UPLINK: PortId = PortId(u16::MAX - 1);

impl FrameJob {
    /// The pipeline's configuration of this job: rank `r` is [`PortId`]`(r)`, the upper
    /// switch [`UPLINK`].
    pub fn pipeline_job(&self) -> JobConfig {
        JobConfig {
            job: self.job,
            epoch: self.epoch,
            slot_base: self.slot_base,
            slot_count: self.slot_count,
            elems_per_packet: self.elems_per_packet,
            ranks: (0..self.ranks.len()).map(|r| PortId(r as u16)).collect(),
            uplink: self.uplink.map(|u| Uplink {
                port: UPLINK,
                job: u.job,
                epoch: u.epoch,
                rank: u.rank,
                slot_base: u.slot_base,
            }),
        }
    }

    /// The endpoint of pipeline port `port` of this job: a rank's, or the upper switch's.
    fn endpoint_of(&self, port: PortId) -> Option<&Endpoint> {
        if port == UPLINK {
            return self.uplink.as_ref().map(|u| &u.switch);
        }
        self.ranks.get(usize::from(port.0))
    }
}

/// A frame switch's own configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameSwitchConfig {
    /// The switch's MAC address (`SM`).
    pub mac: MacAddr,
    /// The switch's IPv4 address (`SIP`).
    pub ip: [u8; 4],
    /// Every port of the switch: a broadcast frame is flooded to all of them but its ingress.
    pub ports: Vec<u16>,
    /// The static L2 table: destination MAC → port.
    pub l2: Vec<(MacAddr, u16)>,
    /// The pipeline's register file.
    pub pipeline: PipelineConfig,
    /// Whether the switch offers Missing reports (PROTOCOL.md §5): its ProbeReply says so,
    /// Data with gap counters updates the gap register, a skip is reported to the sender, and
    /// multicast results carry their block's counter.
    pub gap_reports: bool,
}

/// Why a configuration or a job is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum L2Error {
    /// The pipeline refused the job.
    #[error(transparent)]
    Job(#[from] JobError),
    /// Two ranks of a job have the same endpoint.
    #[error("ranks {first} and {second} of job {job} have the same endpoint")]
    DuplicateEndpoint {
        job: u16,
        first: usize,
        second: usize,
    },
    /// A job has more ranks than the bitmap holds.
    #[error("job {job} has {ranks} ranks; at most 32")]
    TooManyRanks { job: u16, ranks: usize },
    /// A job's upper switch has the endpoint of one of its ranks.
    #[error("the upper switch of job {job} has the endpoint of its rank {rank}")]
    UplinkIsRank { job: u16, rank: usize },
    /// Two jobs name the same job of their upper switches.
    #[error("job {job}'s upper job {upper} is another job's upper job here already")]
    DuplicateUplink { job: u16, upper: u16 },
    /// The L2 table names a MAC address twice.
    #[error("the L2 table holds {0} twice")]
    DuplicateMac(MacAddr),
    /// The L2 table holds the broadcast address, which is always flooded.
    #[error("the broadcast address is flooded, not an L2 table entry")]
    BroadcastEntry,
}

/// One frame to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OutFrame {
    port: u16,
    start: usize,
    len: usize,
}

/// The frames one call of [`FrameSwitch::process`] sends, in a buffer reused from call to
/// call. Copies of one frame to several ports (flooding) share their bytes.
#[derive(Debug, Default, Clone)]
pub struct Outputs {
    buf: Vec<u8>,
    frames: Vec<OutFrame>,
}

impl Outputs {
    /// Empty outputs.
    pub fn new() -> Outputs {
        Outputs::default()
    }

    /// Appends a frame to `port`: the Ethernet, IPv4 and UDP headers of `addrs`, then
    /// `datagram`. (A datagram too long for UDP is not sent: no reply of the pipeline is.)
    fn push_datagram(&mut self, port: u16, addrs: &FrameAddrs, datagram: &[u8]) {
        let start = self.buf.len();
        self.buf.resize(start + FRAME_HEADER_LEN, 0);
        match emit_headers(&mut self.buf[start..], addrs, datagram.len()) {
            Ok(len) => {
                self.buf.extend_from_slice(datagram);
                self.frames.push(OutFrame { port, start, len });
            }
            Err(_) => self.buf.truncate(start),
        }
    }

    /// Forgets the frames (keeps the buffers).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.frames.clear();
    }

    /// The number of frames.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether there are no frames.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Every frame with its egress port, in the order they were produced.
    pub fn iter(&self) -> impl Iterator<Item = (u16, &[u8])> + '_ {
        self.frames
            .iter()
            .map(|f| (f.port, &self.buf[f.start..f.start + f.len]))
    }

    fn push(&mut self, port: u16, bytes: &[u8]) {
        let start = self.buf.len();
        self.buf.extend_from_slice(bytes);
        self.frames.push(OutFrame {
            port,
            start,
            len: bytes.len(),
        });
    }

    /// Another copy of the last frame pushed, to `port`.
    fn push_copy(&mut self, port: u16) {
        if let Some(&last) = self.frames.last() {
            self.frames.push(OutFrame { port, ..last });
        }
    }
}

/// What a frame is, by PROTOCOL.md §7 (before the `ina` packet goes through §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameClass<'a> {
    /// Too short for an Ethernet header.
    Runt,
    /// An ARP request for the switch's address.
    ArpForSwitch,
    /// An `ina` datagram to the switch: its UDP payload (cut to the UDP length) and the
    /// sender's addresses.
    Ina {
        packet: &'a [u8],
        src_mac: MacAddr,
        src_ip: [u8; 4],
        src_port: u16,
    },
    /// To the switch's IPv4 address, but headers too short or a UDP length out of bounds.
    Malformed,
    /// To the switch's IPv4 address, but not an `ina` datagram.
    NotIna,
    /// Every other frame: forwarded by the L2 table on this destination MAC.
    Ordinary { dst: MacAddr },
}

/// Classifies `frame` for a switch with IPv4 address `switch_ip`, reading every field through
/// checked views (PROTOCOL.md §7, rules 1-3).
pub fn classify(frame: &[u8], switch_ip: [u8; 4]) -> FrameClass<'_> {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return FrameClass::Runt;
    };
    let ordinary = FrameClass::Ordinary {
        dst: MacAddr(eth.dst()),
    };
    match eth.ethertype() {
        ETHERTYPE_ARP => match ArpPacket::new_checked(eth.payload()) {
            Ok(arp) if arp.is_ipv4_request() && arp.tpa() == switch_ip => FrameClass::ArpForSwitch,
            _ => ordinary,
        },
        ETHERTYPE_IPV4 => {
            let Ok(ip) = Ipv4Header::new_checked(eth.payload()) else {
                return ordinary;
            };
            if ip.dst() != switch_ip {
                return ordinary;
            }
            if ip.ihl() != 5 || ip.is_fragment() || ip.protocol() != IP_PROTO_UDP {
                return FrameClass::NotIna;
            }
            let Some(Ok(udp)) = eth.payload().get(IPV4_LEN..).map(UdpHeader::new_checked) else {
                return FrameClass::Malformed;
            };
            if udp.dst_port() != UDP_PORT {
                return FrameClass::NotIna;
            }
            let udp_len = usize::from(udp.length());
            let start = ETHERNET_LEN + IPV4_LEN + UDP_LEN;
            let end = ETHERNET_LEN + IPV4_LEN + udp_len;
            if udp_len < UDP_LEN + HEADER_LEN {
                return FrameClass::Malformed;
            }
            match frame.get(start..end) {
                Some(packet) => FrameClass::Ina {
                    packet,
                    src_mac: MacAddr(eth.src()),
                    src_ip: ip.src(),
                    src_port: udp.src_port(),
                },
                None => FrameClass::Malformed,
            }
        }
        _ => ordinary,
    }
}

/// The frame switch of PROTOCOL.md §7.
#[derive(Debug, Clone)]
pub struct FrameSwitch {
    mac: MacAddr,
    ip: [u8; 4],
    ports: Vec<u16>,
    l2: Vec<(MacAddr, u16)>,
    pipeline: Pipeline,
    jobs: Vec<FrameJob>,
    events: [u64; Event::COUNT],
    results_multicast: u64,
    /// Where the pipeline writes a reply.
    scratch: Vec<u8>,
}

impl FrameSwitch {
    /// A switch without jobs.
    pub fn new(cfg: FrameSwitchConfig) -> Result<FrameSwitch, L2Error> {
        for (i, (mac, _)) in cfg.l2.iter().enumerate() {
            if mac.octets() == BROADCAST {
                return Err(L2Error::BroadcastEntry);
            }
            if cfg.l2[..i].iter().any(|(m, _)| m == mac) {
                return Err(L2Error::DuplicateMac(*mac));
            }
        }
        let max_reply = HEADER_LEN + 4 * usize::from(cfg.pipeline.max_elems.max(4));
        let mut pipeline = Pipeline::new(cfg.pipeline);
        pipeline.set_gap_reports(cfg.gap_reports);
        Ok(FrameSwitch {
            mac: cfg.mac,
            ip: cfg.ip,
            ports: cfg.ports,
            l2: cfg.l2,
            pipeline,
            jobs: Vec::new(),
            events: [0; Event::COUNT],
            results_multicast: 0,
            scratch: vec![0; max_reply],
        })
    }

    /// Installs a job (and clears its slots).
    pub fn add_job(&mut self, job: FrameJob) -> Result<(), L2Error> {
        if job.ranks.len() > usize::from(MAX_RANK) + 1 {
            return Err(L2Error::TooManyRanks {
                job: job.job,
                ranks: job.ranks.len(),
            });
        }
        for (second, ep) in job.ranks.iter().enumerate() {
            let same = |o: &Endpoint| (o.port, o.ip, o.udp_port) == (ep.port, ep.ip, ep.udp_port);
            if let Some(first) = job.ranks[..second].iter().position(same) {
                return Err(L2Error::DuplicateEndpoint {
                    job: job.job,
                    first,
                    second,
                });
            }
        }
        if let Some(u) = job.uplink {
            let same = |o: &Endpoint| {
                (o.port, o.ip, o.udp_port) == (u.switch.port, u.switch.ip, u.switch.udp_port)
            };
            if let Some(rank) = job.ranks.iter().position(same) {
                return Err(L2Error::UplinkIsRank { job: job.job, rank });
            }
            if self
                .jobs
                .iter()
                .any(|j| j.uplink.is_some_and(|o| o.job == u.job))
            {
                return Err(L2Error::DuplicateUplink {
                    job: job.job,
                    upper: u.job,
                });
            }
        }
        self.pipeline.add_job(job.pipeline_job())?;
        self.jobs.push(job);
        Ok(())
    }

    /// Removes a job (and clears its slots).
    pub fn remove_job(&mut self, job: u16) -> Result<FrameJob, L2Error> {
        self.pipeline.remove_job(job)?;
        match self.jobs.iter().position(|j| j.job == job) {
            Some(i) => Ok(self.jobs.swap_remove(i)),
            None => Err(L2Error::Job(JobError::Unknown(job))),
        }
    }

    /// The installed jobs.
    pub fn jobs(&self) -> &[FrameJob] {
        &self.jobs
    }

    /// The pipeline (registers and its own counters).
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The count of every event, by [`Event::index`].
    pub fn events(&self) -> &[u64; Event::COUNT] {
        &self.events
    }

    /// The count of one event.
    pub fn event_count(&self, event: Event) -> u64 {
        self.events[event.index()]
    }

    /// Results multicast (`ina_multicast` of the P4 programs).
    pub fn results_multicast(&self) -> u64 {
        self.results_multicast
    }

    /// Processes one frame that came in on `ingress`: writes the frames to send into `out`
    /// (cleared first) and returns the event the frame counted.
    pub fn process(
        &mut self,
        ingress: u16,
        frame: &[u8],
        now: Instant,
        out: &mut Outputs,
    ) -> Event {
        out.clear();
        let event = match classify(frame, self.ip) {
            FrameClass::Runt | FrameClass::Malformed => Event::Malformed,
            FrameClass::NotIna => Event::NotIna,
            FrameClass::ArpForSwitch => self.reply_arp(ingress, frame, out),
            FrameClass::Ordinary { dst } => self.forward(ingress, dst, frame, out),
            FrameClass::Ina {
                packet,
                src_mac,
                src_ip,
                src_port,
            } => {
                let sender = Endpoint {
                    port: ingress,
                    mac: src_mac,
                    ip: src_ip,
                    udp_port: src_port,
                };
                self.process_ina(sender, packet, now, out)
            }
        };
        self.events[event.index()] += 1;
        event
    }

    fn reply_arp(&mut self, ingress: u16, frame: &[u8], out: &mut Outputs) -> Event {
        out.push(ingress, frame);
        let start = out.frames.last().map_or(0, |f| f.start);
        if let Some(copy) = out.buf.get_mut(start..) {
            if ether::arp_reply_in_place(copy, self.mac.octets(), self.ip).is_err() {
                // Unreachable: the frame was classified as a whole ARP request.
                out.clear();
                return Event::Malformed;
            }
        }
        Event::ArpReplied
    }

    fn forward(&mut self, ingress: u16, dst: MacAddr, frame: &[u8], out: &mut Outputs) -> Event {
        if dst == MacAddr::BROADCAST {
            let mut first = true;
            for &port in self.ports.iter().filter(|&&p| p != ingress) {
                if first {
                    out.push(port, frame);
                    first = false;
                } else {
                    out.push_copy(port);
                }
            }
            return Event::L2Forwarded;
        }
        match self.l2.iter().find(|(mac, _)| *mac == dst) {
            Some(&(_, port)) if port != ingress => {
                out.push(port, frame);
                Event::L2Forwarded
            }
            _ => Event::L2Unknown,
        }
    }

    /// The pipeline port of a packet from `sender` that names `job` and `rank`: the upper
    /// switch of a job whose upper job is `job`, or a rank of job `job`.
    fn port_of(&self, sender: &Endpoint, job: u16, rank: u8) -> PortId {
        let same = |ep: &Endpoint| {
            (ep.port, ep.ip, ep.udp_port) == (sender.port, sender.ip, sender.udp_port)
        };
        if self
            .jobs
            .iter()
            .any(|j| j.uplink.is_some_and(|u| u.job == job && same(&u.switch)))
        {
            return UPLINK;
        }
        let Some(j) = self.jobs.iter().find(|j| j.job == job) else {
            return UNMATCHED;
        };
        match j.ranks.get(usize::from(rank)) {
            Some(ep)
                if (ep.port, ep.ip, ep.udp_port) == (sender.port, sender.ip, sender.udp_port) =>
            {
                PortId(u16::from(rank))
            }
            _ => UNMATCHED,
        }
    }

    fn process_ina(
        &mut self,
        sender: Endpoint,
        packet: &[u8],
        now: Instant,
        out: &mut Outputs,
    ) -> Event {
        let (job, port) = match packet.first_chunk::<HEADER_LEN>() {
            Some(h) => {
                let job = u16::from_be_bytes([h[2], h[3]]);
                (job, self.port_of(&sender, job, h[6]))
            }
            None => (0, UNMATCHED),
        };
        let before = *self.pipeline.counters();
        let FrameSwitch {
            mac,
            ip,
            pipeline,
            jobs,
            scratch,
            results_multicast,
            ..
        } = self;
        let verdict = pipeline.process(port, packet, now, scratch);
        let reply = match verdict {
            Verdict::Drop(_) | Verdict::Absorbed => None,
            Verdict::Unicast { port, len } => Some((len, Some(port))),
            Verdict::Multicast { len, .. } => Some((len, None)),
        };
        // The job here: the packet's, or the one whose upper job it names.
        let local = jobs.iter().find(|j| {
            if port == UPLINK {
                j.uplink.is_some_and(|u| u.job == job)
            } else {
                j.job == job
            }
        });
        let after = pipeline.counters();
        let event = if port == UPLINK {
            // The upper switch's packet: a total, a copy of one, or an answer handled; or no
            // packet of the protocol at all.
            match event_of(&before, after) {
                e @ (Event::TotalReceived | Event::Duplicate | Event::StaleSeq) => e,
                _ if after.malformed != before.malformed => Event::Malformed,
                _ => Event::UpperAnswer,
            }
        } else {
            event_of(&before, after)
        };
        let mut addrs = FrameAddrs {
            src_mac: *mac,
            dst_mac: sender.mac,
            src_ip: *ip,
            dst_ip: sender.ip,
            src_port: UDP_PORT,
            dst_port: sender.udp_port,
        };
        if let Some(report) = pipeline.poll_report() {
            // A report of lost data goes to the sender of the Data that showed the gap (a
            // rank, or a lower switch); a report of lost totals to the upper switch.
            let to = if report.port == port {
                Some(&sender)
            } else {
                local.and_then(|j| j.endpoint_of(report.port))
            };
            if let Some(to) = to {
                addrs.dst_mac = to.mac;
                addrs.dst_ip = to.ip;
                addrs.dst_port = to.udp_port;
                for _ in 0..report.copies {
                    out.push_datagram(to.port, &addrs, &report.header);
                }
            }
        }
        let Some((len, unicast)) = reply else {
            return event;
        };
        let Some(job) = local else {
            // Unreachable: a reply is only sent to an authenticated rank of an installed job
            // or to its upper switch.
            return event;
        };
        let targets: &[Endpoint] = match unicast {
            None => {
                *results_multicast += 1;
                &job.ranks
            }
            // An answer to the sender goes to the frame's own addresses.
            Some(to) if to == port => core::slice::from_ref(&sender),
            Some(to) => match job.endpoint_of(to) {
                Some(ep) => core::slice::from_ref(ep),
                None => return event,
            },
        };
        for ep in targets {
            addrs.dst_mac = ep.mac;
            addrs.dst_ip = ep.ip;
            addrs.dst_port = ep.udp_port;
            out.push_datagram(ep.port, &addrs, &scratch[..len]);
        }
        event
    }
}

/// One of the pipeline's counters.
type CounterOf = fn(&Counters) -> u64;

/// The event a packet counted, from the pipeline's counters before and after it.
fn event_of(before: &Counters, after: &Counters) -> Event {
    let changed = |f: CounterOf| f(after) != f(before);
    let table: [(CounterOf, Event); 21] = [
        (|c| c.malformed, Event::Malformed),
        (|c| c.unexpected_type, Event::UnexpectedType),
        (|c| c.unknown_job, Event::UnknownJob),
        (|c| c.unknown_rank, Event::UnknownRank),
        (|c| c.wrong_port, Event::WrongPort),
        (|c| c.stale_epoch, Event::StaleEpoch),
        (|c| c.slot_out_of_range, Event::SlotOutOfRange),
        (|c| c.bad_count, Event::BadCount),
        (|c| c.stale_seq, Event::StaleSeq),
        (|c| c.duplicate, Event::Duplicate),
        (|c| c.data_first, Event::DataFirst),
        (|c| c.data_added, Event::DataAdded),
        (|c| c.results_unicast, Event::ResultUnicast),
        (|c| c.pending_sent, Event::PendingSent),
        (|c| c.probes_answered, Event::ProbeAnswered),
        (|c| c.missing_unmatched, Event::MissingUnmatched),
        (|c| c.totals_received, Event::TotalReceived),
        (|c| c.queries_up, Event::SentUp),
        (|c| c.partials_for_fetch, Event::SentUp),
        (|c| c.not_ina, Event::NotIna),
        // The frame switch sizes the pipeline's output for the largest reply.
        (|c| c.output_too_small, Event::Malformed),
    ];
    table
        .iter()
        .find(|(f, _)| changed(*f))
        .map_or(Event::Malformed, |&(_, e)| e)
}

#[cfg(test)]
mod tests;
