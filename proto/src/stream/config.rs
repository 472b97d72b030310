//! What a stream is told (its lane and configuration), how it fails, and what it counts.

use super::recovery::Rules;
use crate::quant::{self};
use crate::rtt::RtoConfig;
use core::time::Duration;
use ina_wire::agg::MAX_RANK;
use ina_wire::RejectReason;

/// A fixed set of `window` slots starting at `slot_base`, and the position its next stream
/// starts at. Consecutive streams on one lane continue its positions, which keeps every slot's
/// sequence numbers increasing and its shadow sets alternating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane {
    pub slot_base: u16,
    pub window: u16,
    /// Position of the next stream's first packet.
    pub next_position: u64,
}

impl Lane {
    /// A fresh lane. Positions start at `window`, so that every slot's first sequence number is
    /// non-zero and thus newer than the cleared register.
    pub fn new(slot_base: u16, window: u16) -> Lane {
        Lane {
            slot_base,
            window,
            next_position: u64::from(window),
        }
    }
}

/// Everything a stream needs to know.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    pub job: u16,
    pub epoch: u16,
    pub rank: u8,
    /// Number of workers in the job on this stream's switch (1..=32): the ranks.
    pub workers: u8,
    /// Number of workers whose data every result sums: `workers` when the switch finishes
    /// the sums itself, the whole tree's when it is the lower level of hierarchical
    /// aggregation (PROTOCOL.md §9). The quantizer leaves `ceil(log2 total_workers)` bits of
    /// headroom for it, and every worker of the job must agree on it.
    pub total_workers: u16,
    /// Elements per data packet (the job's, as installed on the switch).
    pub elems_per_packet: u16,
    pub lane: Lane,
    /// Retransmissions of one packet before the stream gives up.
    pub max_retries: u32,
    /// How long one packet may go unanswered, retransmissions included, before giving up.
    pub give_up: Duration,
    /// The switch answers skipped positions with Missing reports (its ProbeReply says so). A
    /// stream whose lane covers whole blocks of [`GAP_BLOCK`](ina_wire::agg::GAP_BLOCK) slots then asks for them, and
    /// repairs a loss it was not told of with a Query first (PROTOCOL.md §5, "Missing reports"; docs/design/RECOVERY.md R6).
    pub gap_reports: bool,
    /// The loss-recovery rules the stream follows (all by default; see [`crate::stream::recovery`]).
    pub rules: Rules,
}

impl StreamConfig {
    /// Checks the configuration; [`Stream::new`](crate::stream::Stream::new) fails exactly when this does.
    pub fn validate(&self) -> Result<(), StreamError> {
        let cfg = self;
        if cfg.workers == 0 || cfg.workers > MAX_RANK + 1 {
            return Err(StreamError::Config("a job has 1 to 32 workers"));
        }
        if cfg.total_workers < u16::from(cfg.workers) {
            return Err(StreamError::Config(
                "the total worker count is below the job's ranks on this switch",
            ));
        }
        if cfg.rank >= cfg.workers {
            return Err(StreamError::Config("rank must be below the worker count"));
        }
        if cfg.lane.window == 0 {
            return Err(StreamError::Config("the window needs at least one slot"));
        }
        if u32::from(cfg.lane.slot_base) + u32::from(cfg.lane.window) > 0x1_0000 {
            return Err(StreamError::Config("the lane runs past slot 65535"));
        }
        if cfg.elems_per_packet == 0 {
            return Err(StreamError::Config(
                "elements per packet must be at least 1",
            ));
        }
        Ok(())
    }
}

/// Why a stream failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("invalid stream configuration: {0}")]
    Config(&'static str),
    #[error("no result for packet seq {seq} after {retries} retransmissions and {waited:?}: {}", missing_ranks(.missing))]
    GaveUp {
        seq: u32,
        retries: u32,
        waited: Duration,
        /// The ranks whose data the switch lacked, from the contributor bitmap of the latest
        /// Pending answer for this packet's use of its slot, or else for the oldest unanswered
        /// packet that got one; `None` when no Pending answer came.
        missing: Option<Vec<u8>>,
    },
    #[error("the switch runs epoch {switch} of the job, this stream was started for epoch {ours}: the switch restarted or the job was reinstalled")]
    SwitchRestarted { ours: u16, switch: u16 },
    #[error("the switch rejected a packet: {reason:?} ({why})", reason = .0, why = why_rejected(*.0))]
    Rejected(RejectReason),
    #[error(transparent)]
    NonFinite(#[from] quant::QuantError),
    #[error("the ranks do not all-reduce the same thing: {0}")]
    Mismatch(crate::descriptor::Mismatch),
    #[error("transmit buffer of {have} bytes is smaller than a packet ({need} bytes)")]
    BufferTooSmall { need: usize, have: usize },
}

/// What a Reject says about the job, in words.
fn why_rejected(reason: RejectReason) -> &'static str {
    match reason {
        RejectReason::BadCount => "the packet's element count differs from the job's, or from the other ranks' packets of the same use: the ranks all-reduce tensors of different element types or lengths, or the job's elements per packet differ from the worker's",
        _ => "the job's configuration differs from the worker's",
    }
}

/// The reason a stream gave up, in words: which workers are gone, when known.
fn missing_ranks(missing: &Option<Vec<u8>>) -> String {
    match missing.as_deref() {
        None => "missing ranks unknown (the switch never answered with what it held): a worker or the switch is gone".into(),
        Some([]) => "the switch held every rank's data but its result never arrived: the switch or the way back is gone, or, behind a rack switch, its upper switch refuses or lost the partial sums (the rack switch's log says which)".into(),
        Some(ranks) => {
            let list: Vec<String> = ranks.iter().map(u8::to_string).collect();
            format!(
                "missing ranks {} (the switch never got their data for this use): those workers or their links are gone",
                list.join(", ")
            )
        }
    }
}

/// What happened during a stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamStats {
    pub packets: u64,
    pub packets_sent: u64,
    /// Packets sent again to repair a loss: found lost by later answers, by their timer, or
    /// by a Pending answer. Stall probes are not among them (see `stall_probes`): on a
    /// lossless network this stays 0 unless a timer expired.
    pub retransmissions: u64,
    /// Retransmissions sent before the packet's timer expired, because results of packets
    /// sent well after it had come back (included in `retransmissions`).
    pub fast_retransmissions: u64,
    /// Packets sent again as stall probes: nothing had come back and nothing new had been
    /// sent for two round trips. Not counted in `retransmissions`: a probe is sent on no
    /// evidence of loss, and on a lossless network it is what a slow worker costs the others.
    pub stall_probes: u64,
    /// Queries that ask again about a use holding this worker's data, which waits for another
    /// worker's repair: sent on no evidence of loss, at the pace of the time waited. Not
    /// counted in `retransmissions` nor in `stall_probes`.
    pub rechecks: u64,
    /// Packets sent again as a header-only Query instead of the data (retransmissions, stall
    /// probes or rechecks): the switch holds the data, or may.
    pub queries: u64,
    /// Pending answers received: the use of a slot was still collecting.
    pub pending_answers: u64,
    /// Data sent again because a Pending answer showed the switch lacked this worker's data.
    pub resent_missing: u64,
    /// Missing reports received that named a packet still unanswered (each copy: the switch
    /// sends every report twice).
    pub missing_reports: u64,
    /// Data sent again because a Missing report named it (included in `retransmissions`).
    pub resent_reported: u64,
    /// Results found lost by their gap counters (a later result to the same block came
    /// first) and reported to the switch, which answers with the stored result.
    pub results_reported: u64,
    /// Second copies of data sent again in the stream's last window (included in
    /// `retransmissions`).
    pub tail_copies: u64,
    /// Second copies of the lookahead's header-only packets (see `Retransmit::LookaheadCopy`).
    pub lookahead_copies: u64,
    /// Header-only answers to status Queries: the use was complete, its result lost.
    pub completions_seen: u64,
    /// Results of the stream's data and lookahead packets (the descriptor's not counted).
    pub results: u64,
    /// Results that matched no outstanding packet (copies, or answers to retransmissions that
    /// crossed the original result).
    pub duplicate_results: u64,
    /// Datagrams that were not results of this stream (other jobs, malformed).
    pub foreign: u64,
    pub bytes_sent: u64,
    pub srtt: Option<Duration>,
    pub min_rtt: Option<Duration>,
    /// Slot-nanoseconds the stream held: the number of its packets in flight (sent and not
    /// yet answered), integrated over time from its first transmission to its last result.
    /// Divided by `window * active_ns` it is the window's mean occupancy.
    pub slot_ns: u64,
    /// Nanoseconds from the stream's first transmission to its last result.
    pub active_ns: u64,
}

impl StreamStats {
    /// Every packet sent again, for whatever reason: retransmissions and stall probes.
    /// Adds another stream's counts to these (for a worker's running totals); the round-trip
    /// figures become the other's where it has them.
    pub fn accumulate(&mut self, o: &StreamStats) {
        self.packets += o.packets;
        self.packets_sent += o.packets_sent;
        self.retransmissions += o.retransmissions;
        self.fast_retransmissions += o.fast_retransmissions;
        self.stall_probes += o.stall_probes;
        self.rechecks += o.rechecks;
        self.queries += o.queries;
        self.pending_answers += o.pending_answers;
        self.resent_missing += o.resent_missing;
        self.missing_reports += o.missing_reports;
        self.resent_reported += o.resent_reported;
        self.results_reported += o.results_reported;
        self.tail_copies += o.tail_copies;
        self.lookahead_copies += o.lookahead_copies;
        self.completions_seen += o.completions_seen;
        self.results += o.results;
        self.duplicate_results += o.duplicate_results;
        self.foreign += o.foreign;
        self.bytes_sent += o.bytes_sent;
        self.srtt = o.srtt.or(self.srtt);
        self.min_rtt = o.min_rtt.or(self.min_rtt);
        self.slot_ns += o.slot_ns;
        self.active_ns += o.active_ns;
    }

    pub fn resent(&self) -> u64 {
        self.retransmissions + self.stall_probes + self.rechecks
    }
}

/// Default RTO settings for streams.
pub fn default_rto() -> RtoConfig {
    RtoConfig::default()
}
