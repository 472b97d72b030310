//! The switch's data plane as a pure component: the model the P4 programs mirror.
//!
//! [`Pipeline::process`] takes one `ina` packet (a UDP payload) with its ingress port and the
//! current time, updates the registers exactly as PROTOCOL.md §6 prescribes, and says what
//! to send: nothing (a counted drop), one packet back to one port, or one packet to every port of
//! the job (multicast). [`Pipeline::process_frame`] does the same for whole Ethernet/IPv4/UDP
//! frames, as the P4 switch sees them. It never touches a socket or a clock: the caller passes
//! `now` and sends what the verdict says.
//!
//! One file per part of PROTOCOL.md §6 and §9:
//!
//! | file | what it holds |
//! |------|---------------|
//! | `config` | what the control plane installs: [`PipelineConfig`], [`JobConfig`], [`Uplink`] |
//! | `jobs` | the job table: installing, removing, finding a job |
//! | `registers` | the register file, and what a slot's cells say about a use (`UseState`) |
//! | `checks` | §6 "Checks, in order": parse, type, authentication, refusals (Reject) |
//! | `fast_path` | the data path compiled per CPU, and the fast check of a full Data packet |
//! | `data` | §6 "Decision table for an accepted Data packet": the slot update |
//! | `answers` | §6 "Decision table for an accepted Query", Probe replies, Pending and Result writing |
//! | `uplink` | §9: partial sums up, totals down, the upper switch's answers |
//! | `reports` | gap counters and Missing reports (§5 "Missing reports", "Lost results"; §9) |
//! | `counters` | [`Counters`] and [`DropReason`] |

mod answers;
mod checks;
mod config;
mod counters;
mod data;
mod fast_path;
mod jobs;
mod registers;
mod reports;
mod uplink;

pub use crate::gap::MAX_REPORTED_GAP;
pub use config::{fresh_epoch, JobConfig, JobError, PipelineConfig, PortId, Uplink};
pub use counters::{Counters, DropReason};
pub use fast_path::Burst;
pub use registers::{Registers, SlotRegisters, AWAITING_TOTAL, AWAITING_TOTAL_HEADER, HEADER_USE};
pub use reports::{Report, DATA_REPORT_COPIES};
pub use uplink::UPLINK_TIMER_RANK;

use crate::kernels::Isa;
use crate::Instant;
use counters::drop_counted;
use ina_wire::{frame, PROTOCOL_VERSION};
use jobs::Job;

/// Where the packet in the caller's buffer goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Nothing to send; the reason was counted. A dropped packet changed no register.
    Drop(DropReason),
    /// The packet was taken in: a contribution aggregated (nothing to send until the other
    /// workers' arrive), or an upper switch's Pending or Reject counted.
    Absorbed,
    /// Send `len` bytes to one port.
    Unicast { port: PortId, len: usize },
    /// Send `len` bytes to each of these ports.
    Multicast { ports: &'a [PortId], len: usize },
}

/// The switch data plane.
#[derive(Debug, Clone)]
pub struct Pipeline {
    cfg: PipelineConfig,
    regs: Registers,
    jobs: Vec<Job>,
    counters: Counters,
    /// Whether Data with a gap counter updates `reg_gap` and is answered with Missing reports
    /// (see [`Self::set_gap_reports`]).
    gap_reports: bool,
    /// The Missing report the latest packet caused, for [`Self::poll_report`].
    report: Option<Report>,
    /// The widest vectors the CPU has (see `process_dispatch`), asked once, when the pipeline
    /// was made: a test of this field per packet takes fewer instructions than std's feature
    /// cache.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    isa: Isa,
}

impl Pipeline {
    /// A switch with an empty job table and cleared registers.
    pub fn new(cfg: PipelineConfig) -> Pipeline {
        Pipeline {
            cfg,
            regs: Registers::new(cfg),
            jobs: Vec::new(),
            counters: Counters::default(),
            gap_reports: false,
            report: None,
            isa: Isa::detect(),
        }
    }

    /// Turns the gap register and its Missing reports on or off (off when made). Both P4
    /// programs keep the same registers (their `switch_addr` entry turns them on). A caller
    /// that turns them on must send what [`Self::poll_report`] returns.
    pub fn set_gap_reports(&mut self, on: bool) {
        self.gap_reports = on;
    }

    /// The Missing report caused by the packet just processed, if any: a second packet to
    /// send, besides the verdict's, to one port. A caller that never asks sends none, and the
    /// workers recover the loss without it (more slowly). The next packet processed replaces it.
    pub fn poll_report(&mut self) -> Option<Report> {
        self.report.take()
    }

    /// The configuration.
    pub fn config(&self) -> PipelineConfig {
        self.cfg
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The register file, for inspection.
    pub fn registers(&self) -> &Registers {
        &self.regs
    }

    /// The installed jobs.
    pub fn jobs(&self) -> impl Iterator<Item = &JobConfig> {
        self.jobs.iter().map(|j| &j.cfg)
    }

    /// When a packet of `job` last passed the checks.
    pub fn last_activity(&self, job: u16) -> Option<Instant> {
        self.jobs
            .iter()
            .find(|j| j.cfg.job == job)
            .and_then(|j| j.last_activity)
    }

    /// Slots of the pool in which a use is collecting (some but not all arrivals in).
    pub fn busy_slots(&self) -> usize {
        self.regs.slots.iter().filter(|r| r.count != [0, 0]).count()
    }

    /// Counts a packet or frame of `len` bytes in.
    #[inline(always)]
    pub(super) fn count_arrival(&mut self, len: usize) {
        self.report = None;
        self.counters.packets_in += 1;
        self.counters.bytes_in += len as u64;
    }

    pub(super) fn drop(&mut self, reason: DropReason) -> Verdict<'static> {
        drop_counted(&mut self.counters, reason)
    }

    /// Processes a whole Ethernet/IPv4/UDP frame. Replies are written into `out` as frames;
    /// the unicast reply goes back with addresses swapped, and a multicast result carries
    /// the switch's addresses as source and the sender's as destination, which the egress of
    /// each port rewrites (on the software switch: `frame_addrs_for` of the port).
    pub fn process_frame(
        &mut self,
        ingress: PortId,
        frame_bytes: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        self.count_arrival(frame_bytes.len());
        let Ok(parsed) = frame::parse(frame_bytes) else {
            return self.drop(DropReason::NotIna);
        };
        if parsed.addrs.dst_port != ina_wire::UDP_PORT {
            return self.drop(DropReason::NotIna);
        }
        if out.len() < frame::FRAME_HEADER_LEN {
            return self.drop(DropReason::OutputTooSmall);
        }
        let addrs = parsed.addrs.reversed();
        let (head, body) = out.split_at_mut(frame::FRAME_HEADER_LEN);
        let verdict = self.process_dispatch(ingress, parsed.payload, now, body);
        let len = match verdict {
            Verdict::Drop(_) | Verdict::Absorbed => return verdict,
            Verdict::Unicast { len, .. } | Verdict::Multicast { len, .. } => len,
        };
        if frame::emit_headers(head, &addrs, len).is_err() {
            // Unreachable: `head` is exactly FRAME_HEADER_LEN long and len fits in a UDP datagram.
            return Verdict::Drop(DropReason::Malformed);
        }
        match verdict {
            Verdict::Unicast { port, len } => Verdict::Unicast {
                port,
                len: len + frame::FRAME_HEADER_LEN,
            },
            Verdict::Multicast { ports, len } => Verdict::Multicast {
                ports,
                len: len + frame::FRAME_HEADER_LEN,
            },
            other => other,
        }
    }

    /// Processes one `ina` packet (a UDP payload) that arrived on `ingress`. Any reply is
    /// written at the start of `out`, which should hold `16 + 4 * max_elems` bytes.
    #[inline]
    pub fn process(
        &mut self,
        ingress: PortId,
        packet: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        self.count_arrival(packet.len());
        self.process_dispatch(ingress, packet, now, out)
    }
}

/// Checks that `PROTOCOL_VERSION` is what the pipeline was written for.
const _: () = assert!(PROTOCOL_VERSION == 1);
