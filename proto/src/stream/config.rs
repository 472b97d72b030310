//! What a stream is told (its lane and configuration), how it fails, and what it counts.

use super::recovery::Rules;
use crate::quant::{self};
use core::time::Duration;
use ina_wire::agg::MAX_RANK;
use ina_wire::RejectReason;

/// A fixed set of `window` slots starting at `slot_base`, and the position its next stream
/// starts at: consecutive streams on one lane continue its positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane {
    pub slot_base: u16,
    pub window: u16,
    /// Position of the next stream's first packet.
    pub next_position: u64,
}

impl Lane {
    /// A fresh lane. Positions start at `window`: every slot's first sequence number is
    /// non-zero, newer than the cleared register.
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
    /// Number of workers whose data every result sums: `workers` on one switch, the whole
    /// tree's below a rack switch (PROTOCOL.md §9). Sets the quantizer's headroom; every worker
    /// of the job must agree on it.
    pub total_workers: u16,
    /// Elements per data packet (the job's, as installed on the switch).
    pub elems_per_packet: u16,
    pub lane: Lane,
    /// Retransmissions of one packet before the stream gives up.
    pub max_retries: u32,
    /// How long one packet may go unanswered, retransmissions included, before giving up.
    pub give_up: Duration,
    /// The switch answers skipped positions with Missing reports (its ProbeReply says so); a
    /// lane of whole blocks of [`GAP_BLOCK`](ina_wire::agg::GAP_BLOCK) slots then asks for them
    /// (PROTOCOL.md §5, "Missing reports").
    pub gap_reports: bool,
    /// The loss-recovery rules the stream follows (all by default).
    pub rules: Rules,
}

impl StreamConfig {
    /// Checks the configuration; [`Stream::new`](crate::stream::Stream::new) fails exactly when this does.
    pub fn validate(&self) -> Result<(), StreamError> {
        if self.workers == 0 || self.workers > MAX_RANK + 1 {
            return Err(StreamError::Config("a job has 1 to 32 workers"));
        }
        if self.total_workers < u16::from(self.workers) {
            return Err(StreamError::Config(
                "the total worker count is below the job's ranks on this switch",
            ));
        }
        if self.rank >= self.workers {
            return Err(StreamError::Config("rank must be below the worker count"));
        }
        if self.lane.window == 0 {
            return Err(StreamError::Config("the window needs at least one slot"));
        }
        if u32::from(self.lane.slot_base) + u32::from(self.lane.window) > 0x1_0000 {
            return Err(StreamError::Config("the lane runs past slot 65535"));
        }
        if self.elems_per_packet == 0 {
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
        /// The ranks whose data the switch lacked, by the latest Pending answer for this packet
        /// or else for the oldest unanswered packet that got one; `None` without one.
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
    /// Packets sent again to repair a loss (found by later answers, a timer, a Pending answer
    /// or a report); not stall probes nor rechecks.
    pub retransmissions: u64,
    /// Retransmissions found by later answers, before the timer (within `retransmissions`).
    pub fast_retransmissions: u64,
    /// Packets sent again as stall probes (E9), on no evidence of loss.
    pub stall_probes: u64,
    /// Queries asking again about a use that holds this worker's data (R7).
    pub rechecks: u64,
    /// Packets sent again as a Query instead of the data (of all the above).
    pub queries: u64,
    /// Pending answers received: the use of a slot was still collecting.
    pub pending_answers: u64,
    /// Data sent again because a Pending answer showed the switch lacked this worker's data.
    pub resent_missing: u64,
    /// Packets still unanswered named by Missing reports received (each copy counts).
    pub missing_reports: u64,
    /// Data sent again because a Missing report named it (included in `retransmissions`).
    pub resent_reported: u64,
    /// Results found lost by their gap counters and reported to the switch (E3).
    pub results_reported: u64,
    /// Second copies of data sent again in the last window (R9; within `retransmissions`).
    pub tail_copies: u64,
    /// Second copies of the lookahead's header-only packets (R8).
    pub lookahead_copies: u64,
    /// Header-only answers to status Queries: the use was complete, its result lost.
    pub completions_seen: u64,
    /// Results of the stream's data and lookahead packets (the descriptor's not counted).
    pub results: u64,
    /// Results and Pending answers that matched no outstanding packet.
    pub duplicate_results: u64,
    /// Datagrams that were not results of this stream (other jobs, malformed).
    pub foreign: u64,
    pub bytes_sent: u64,
    pub srtt: Option<Duration>,
    pub min_rtt: Option<Duration>,
    /// Packets in flight integrated over time, in slot-nanoseconds; divided by
    /// `window * active_ns` it is the window's mean occupancy.
    pub slot_ns: u64,
    /// Nanoseconds from the stream's first transmission to its last result.
    pub active_ns: u64,
}

impl StreamStats {
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

    /// Every packet sent again: retransmissions, stall probes and rechecks.
    pub fn resent(&self) -> u64 {
        self.retransmissions + self.stall_probes + self.rechecks
    }
}
