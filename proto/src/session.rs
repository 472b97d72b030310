//! The worker's side of one all-reduce: a stream of packets through a window of slots.
//!
//! A [`Stream`] borrows the tensor, sends its blocks through the switch and writes each finished
//! sum back in place. It is a sans-IO machine: the caller moves bytes and time in and out.
//!
//! ```text
//! loop {
//!     while let Some(len) = stream.poll_transmit(now, &mut buf)? { send(&buf[..len]) }
//!     if let Some(outcome) = stream.poll_outcome() { break outcome }
//!     wait for a datagram or stream.poll_timeout()
//!     stream.handle_datagram(now, &datagram) / stream.handle_timeout(now)
//! }
//! ```
//!
//! # Schedule (PROTOCOL.md §Worker)
//! The stream's packets occupy consecutive positions `g` of a [`Lane`], a fixed set of `W`
//! slots that the worker owns within its job's range: packet at position `g` goes to slot
//! `slot_base + g mod W`, shadow set `(g / W) mod 2`, with sequence number `g mod 2^32`. Packet
//! `i` is sent when the result of the packet before it on the same slot has come back
//! (self-clocking), so at most `W` packets are in flight; of the packets free to go, the
//! smallest goes first, so a slot waiting for a repair holds back only its own next packet.
//!
//! A float32 tensor of `B` blocks uses the exponent lookahead with distance `L = min(W, B)`:
//! packet `i` carries the exponent byte of block `i` (for `i < B`) and the data of block `i - L`
//! (for `i >= L`), quantized with the agreed exponent that the result of packet `i - L` brought
//! back. The first `L` packets are header-only; `B + L` packets in all. An int32 tensor needs no
//! exponents: packet `i` carries block `i`, `B` packets in all. A short last block is padded with
//! zeros on the wire and only its real elements are written back.

use crate::descriptor::Descriptor;
use crate::quant::{self, NON_FINITE};
use crate::rtt::{RtoConfig, RttEstimator};
use crate::rules::{Rule, Rules};
use crate::window::WindowControl;
use crate::Instant;
use core::cmp::Reverse;
use core::time::Duration;
use ina_wire::agg::{PendingInfo, GAP_BLOCK, GAP_COUNTER, MAX_RANK};
use ina_wire::{AggRepr, MessageType, QueryAsk, RejectReason, HEADER_LEN};
use std::collections::{BinaryHeap, VecDeque};

/// Packets of the descriptor at the start of every stream (PROTOCOL.md §5, "The descriptor").
pub const DESCRIPTOR_PACKETS: u64 = 1;

/// The tensor being all-reduced: borrowed for the stream's lifetime, or owned (and handed back
/// by [`Stream::into_tensor`]), or never held whole ([`Source`]). The result replaces it.
#[derive(Debug)]
pub enum Tensor<'a> {
    F32(&'a mut [f32]),
    I32(&'a mut [i32]),
    F32Owned(Vec<f32>),
    I32Owned(Vec<i32>),
    /// Float32 elements made on demand, block by block, and the result handed back the same
    /// way: a simulation of many workers holds no tensor of any.
    Generated(&'a mut (dyn Source + Send)),
}

/// A float32 tensor that is never held whole (see [`Tensor::Generated`]).
pub trait Source: core::fmt::Debug {
    /// Number of elements.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Writes input elements `start..start + out.len()` into `out`. Called as often as a block
    /// is needed (for its exponent, then for its data): the same elements every time.
    fn input(&mut self, start: usize, out: &mut [f32]);
    /// Takes result elements `start..start + values.len()`, once per block, in any order.
    fn result(&mut self, start: usize, values: &[f32]);
}

/// A read view of a tensor's elements.
#[derive(Debug, Clone, Copy)]
pub enum Elements<'t> {
    F32(&'t [f32]),
    I32(&'t [i32]),
}

/// A write view of a tensor's elements.
#[derive(Debug)]
pub enum ElementsMut<'t> {
    F32(&'t mut [f32]),
    I32(&'t mut [i32]),
}

impl Tensor<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self.elements() {
            Some(Elements::F32(t)) => t.len(),
            Some(Elements::I32(t)) => t.len(),
            None => match self {
                Tensor::Generated(g) => g.len(),
                _ => 0,
            },
        }
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the elements are float32 (and so use the exponent lookahead).
    pub fn is_float(&self) -> bool {
        !matches!(self, Tensor::I32(_) | Tensor::I32Owned(_))
    }

    /// The elements; `None` for a generated tensor, which has none in memory.
    pub fn elements(&self) -> Option<Elements<'_>> {
        Some(match self {
            Tensor::F32(t) => Elements::F32(t),
            Tensor::I32(t) => Elements::I32(t),
            Tensor::F32Owned(t) => Elements::F32(t),
            Tensor::I32Owned(t) => Elements::I32(t),
            Tensor::Generated(_) => return None,
        })
    }

    /// The elements, writable; `None` for a generated tensor.
    pub fn elements_mut(&mut self) -> Option<ElementsMut<'_>> {
        Some(match self {
            Tensor::F32(t) => ElementsMut::F32(t),
            Tensor::I32(t) => ElementsMut::I32(t),
            Tensor::F32Owned(t) => ElementsMut::F32(t),
            Tensor::I32Owned(t) => ElementsMut::I32(t),
            Tensor::Generated(_) => return None,
        })
    }
}

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
    /// stream whose lane covers whole blocks of [`GAP_BLOCK`] slots then asks for them, and
    /// repairs a loss it was not told of with a Query first (PROTOCOL.md §5, loss recovery).
    pub gap_reports: bool,
    /// The loss-recovery rules the stream follows (all by default; see [`crate::rules`]).
    pub rules: Rules,
}

impl StreamConfig {
    /// Checks the configuration; [`Stream::new`] fails exactly when this does.
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
    /// Missing reports that, read through the packet that showed the gap, named unanswered
    /// packets other than the latest first transmissions with their counters: the report
    /// came back late, or the network delayed that packet. Those packets were asked about
    /// with a Query (see `Stream::handle_missing`).
    pub late_reports: u64,
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
        self.late_reports += o.late_reports;
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

/// Why a packet is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retransmit {
    /// Answers to later transmissions showed it lost.
    Detected,
    /// Its timer expired.
    Timer,
    /// The stall probe (see [`Stream::stall_probe_at`]).
    StallProbe,
    /// A Pending answer showed that the switch lacks this worker's data.
    Missing,
    /// A Missing report named it: its data never reached the switch.
    Reported,
    /// Its data is held by the switch, and its use has waited long enough to ask again (no
    /// evidence of loss: counted with the stall probes).
    Recheck,
    /// A second copy of data sent again in the stream's last window (see
    /// [`Stream::resend_data`]).
    TailCopy,
    /// A second copy of a header-only packet of the exponent lookahead, sent once every one
    /// of them has gone.
    LookaheadCopy,
    /// At the stream's end, a later first transmission to its block, which would have
    /// revealed its loss, was taken for lost (see [`Stream::ask_about_unrevealed_before`]):
    /// asked about with a status Query.
    Unrevealed,
}

/// What the switch is known to hold of an outstanding packet's data (from Pending answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Nothing known: the data may have been lost, or may wait for the other workers'.
    Unknown,
    /// The switch holds it: only the result can be missing, so a Query repairs any loss.
    Yes,
    /// The switch lacks it: the data must go again.
    No,
}

/// How many unanswered packets one stall probe round sends at most.
const STALL_PROBE_PACKETS: usize = 4;

/// The deadline of a packet whose retransmission is queued: its timer is off until it goes.
const QUEUED: Instant = Instant::from_nanos(u64::MAX);

#[derive(Debug, Clone, Copy)]
struct Outstanding {
    index: u64,
    first_sent: Instant,
    deadline: Instant,
    retries: u32,
    /// Transmission number of its latest transmission (see `Stream::transmissions`).
    last_tx: u64,
    /// Transmission number of its first transmission.
    first_tx: u64,
    /// Its first transmission's number among the first transmissions to its block (see
    /// [`BlockTx`]).
    block_ordinal: u64,
    /// When its latest transmission was sent.
    last_sent: Instant,
    /// Whether its latest transmission was a Query.
    last_was_query: bool,
    /// What the switch holds of its data.
    held: Held,
    /// The contributor bitmap of the latest Pending answer for this use, if any.
    contributors: Option<u32>,
    /// The switch said the use is complete (a header-only answer to a status Query) and its
    /// result has not come: the next Query asks for the result itself.
    complete_seen: bool,
    /// Found unanswered by order, and waiting a repair's time before it is asked about
    /// (see [`Stream::judge`]): its timer is that wait, not a retransmission timeout.
    awaiting_repair: bool,
}

impl Outstanding {
    /// Whether its retransmission is queued (see [`QUEUED`]).
    fn is_queued(&self) -> bool {
        self.deadline == QUEUED
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct SlotState {
    outstanding: Option<Outstanding>,
    /// Index of the last packet on this slot whose result arrived.
    done_upto: Option<u64>,
}

/// The first transmissions to one block of [`GAP_BLOCK`] slots of a stream's lane, for the
/// switch's Missing reports: each carries its number modulo [`GAP_COUNTER`], counted over the
/// lane's life (a new stream continues where the one before it stopped, as the switch's
/// register does).
#[derive(Debug, Clone)]
struct BlockTx {
    /// First transmissions to the block so far, on the lane.
    sent: u64,
    /// The packet index of each of the block's latest [`REPORT_HISTORY`] first transmissions,
    /// at its number modulo [`REPORT_HISTORY`].
    recent: Box<[u64]>,
}

impl BlockTx {
    /// Notes packet `index` as the block's first transmission number `ordinal`.
    fn record(&mut self, ordinal: u64, index: u64) {
        if let Some(at) = self.recent.get_mut(ordinal as usize % REPORT_HISTORY) {
            *at = index;
        }
    }

    /// The packet of the block's first transmission number `ordinal`, if it is still among
    /// the latest [`REPORT_HISTORY`] (`u64::MAX` otherwise, or if none was recorded there).
    fn index_at(&self, ordinal: u64) -> u64 {
        if ordinal >= self.sent || self.sent - ordinal > REPORT_HISTORY as u64 {
            return u64::MAX;
        }
        self.recent
            .get(ordinal as usize % REPORT_HISTORY)
            .copied()
            .unwrap_or(u64::MAX)
    }
}

/// How many of a block's latest first transmissions a Missing report can still name
/// through the packet that showed the gap (see [`Stream::handle_missing`]): four times the
/// counter's range, so that a report can come back a few counters' worth late.
const REPORT_HISTORY: usize = 4 * GAP_COUNTER as usize;

/// One all-reduce of one tensor.
#[derive(Debug)]
pub struct Stream<'a> {
    cfg: StreamConfig,
    tensor: Tensor<'a>,
    blocks: u64,
    lookahead: u64,
    packets: u64,
    /// Packets sent for the first time so far.
    sent_new: u64,
    /// Packets not yet sent whose slot is free, smallest index first.
    ready: BinaryHeap<Reverse<u64>>,
    /// Packets whose slot is free but whose exponent has not come back yet (only when the
    /// lookahead is shorter than the window).
    parked: std::collections::BTreeSet<u64>,
    slots: Vec<SlotState>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Packets to send again, and what asked for it.
    retransmit: VecDeque<(u64, Retransmit)>,
    /// Transmissions so far (first ones and retransmissions): numbers them in sending order.
    transmissions: u64,
    /// `(transmission number, packet index)` of every transmission not yet examined by loss
    /// detection, oldest first.
    in_flight: VecDeque<(u64, u64)>,
    /// Retransmissions past the threshold but sent too recently to be judged lost yet.
    deferred: VecDeque<(u64, u64)>,
    /// The latest transmission known to have been answered.
    highest_answered: Option<u64>,
    /// The round trip of that answer's packet (answers to packets sent once only).
    latest_answer_rtt: Option<Duration>,
    /// The smallest round trip of an answer to a packet's only retransmission (unambiguous).
    path_min: Option<Duration>,
    /// The smallest round trip of a full-size result to a packet sent once.
    min_full_rtt: Option<Duration>,
    /// The largest number of transmissions by which an answer came back behind a later
    /// transmission's.
    reordering: u64,
    /// The largest distance, in transmissions, behind the newest answer at which a packet
    /// was asked about and found held: its use waited for another worker's repair.
    held_reordering: u64,
    /// First transmissions past the reordering tolerance but within the held one, whose loss
    /// the switch would report: judged once the held tolerance passes them too.
    tolerated: VecDeque<(u64, u64)>,
    /// When the stream last made progress: its latest accepted result or first transmission.
    progress_at: Option<Instant>,
    /// Stall probe rounds since then (see [`Stream::stall_probe_at`]).
    stall_rounds: u32,
    /// When the latest of those rounds was sent.
    stall_probe_last: Option<Instant>,
    /// Reused by `handle_timeout`.
    expired_scratch: Vec<u64>,
    /// Reused by the stall probe: `(latest transmission, index)` of the packets it may send.
    stall_scratch: Vec<(u64, u64)>,
    exps: Vec<u8>,
    /// One block of a generated tensor's elements (empty for the others).
    scratch: Vec<f32>,
    /// When the count of packets in flight last changed (for `StreamStats::slot_ns`); `None`
    /// before the first transmission.
    occupancy_at: Option<Instant>,
    /// Whether this stream's data asks for Missing reports (see [`StreamConfig::gap_reports`]).
    reports: bool,
    /// Per gap-tracking block of the lane, its first transmissions (empty without reports).
    gap_blocks: Vec<BlockTx>,
    /// Per gap-tracking block of the lane, the latest gap counter of a multicast result
    /// plus [`GAP_COUNTER`] (0: none yet), as the switch's gap cell keeps a rank's.
    results_seen: Vec<u32>,
    /// Results found lost by their counters, to report: `(a slot of the block, counter)`.
    result_reports: VecDeque<(u16, u8)>,
    received: u64,
    poisoned: Option<u64>,
    failed: Option<StreamError>,
    rtt: RttEstimator,
    /// Round trips of the switch's immediate answers (Pending, and the header-only answer
    /// of a status Query) to Queries and repeated data: the path alone. Results of data come
    /// back only when every worker's data is in, and at high loss that often means after
    /// another worker's repair: their round trips say how long a use takes, not how soon a
    /// Query is answered.
    path_rtt: RttEstimator,
    /// Limits the packets in flight below the lane's slots when set (see [`crate::window`]).
    window: Option<WindowControl>,
    stats: StreamStats,
}

impl<'a> Stream<'a> {
    /// Starts a stream. `rtt` carries the estimate over from earlier streams.
    pub fn new(
        cfg: StreamConfig,
        tensor: Tensor<'a>,
        rtt: RttEstimator,
    ) -> Result<Stream<'a>, StreamError> {
        cfg.validate()?;
        let e = u64::from(cfg.elems_per_packet);
        let blocks = (tensor.len() as u64).div_ceil(e);
        let window = u64::from(cfg.lane.window);
        let (lookahead, body) = if tensor.is_float() {
            // The descriptor and the lookahead's headers fill the first window together.
            let l = window.saturating_sub(DESCRIPTOR_PACKETS).max(1).min(blocks);
            (l, blocks + l)
        } else {
            (0, blocks)
        };
        // The descriptor goes first (PROTOCOL.md §5, "The descriptor").
        let packets = DESCRIPTOR_PACKETS + body;
        let first = packets.min(window);
        let block = u64::from(GAP_BLOCK);
        let reports =
            cfg.gap_reports && u64::from(cfg.lane.slot_base) % block == 0 && window % block == 0;
        let gap_blocks = if reports {
            // The counters continue the lane's earlier streams: every position of the lane
            // so far was sent once for the first time, in its block.
            let used = cfg.lane.next_position.saturating_sub(window);
            let (cycles, rest) = (used / window, used % window);
            (0..window / block)
                .map(|b| BlockTx {
                    sent: cycles * block + rest.saturating_sub(b * block).min(block),
                    recent: vec![u64::MAX; REPORT_HISTORY].into_boxed_slice(),
                })
                .collect()
        } else {
            Vec::new()
        };
        let scratch = match tensor {
            Tensor::Generated(_) => vec![0.0; usize::from(cfg.elems_per_packet)],
            _ => Vec::new(),
        };
        Ok(Stream {
            scratch,
            occupancy_at: None,
            reports,
            results_seen: if cfg.rules.has(Rule::ResultCounters) {
                vec![0; gap_blocks.len()]
            } else {
                Vec::new()
            },
            result_reports: VecDeque::new(),
            gap_blocks,
            ready: (0..first).map(Reverse).collect(),
            parked: std::collections::BTreeSet::new(),
            slots: vec![SlotState::default(); usize::from(cfg.lane.window)],
            exps: vec![0; lookahead as usize],
            cfg,
            tensor,
            blocks,
            lookahead,
            packets,
            sent_new: 0,
            timers: BinaryHeap::new(),
            retransmit: VecDeque::new(),
            transmissions: 0,
            in_flight: VecDeque::new(),
            deferred: VecDeque::new(),
            highest_answered: None,
            latest_answer_rtt: None,
            path_min: None,
            min_full_rtt: None,
            reordering: 0,
            held_reordering: 0,
            tolerated: VecDeque::new(),
            progress_at: None,
            stall_rounds: 0,
            stall_probe_last: None,
            expired_scratch: Vec::new(),
            stall_scratch: Vec::new(),
            received: 0,
            poisoned: None,
            failed: None,
            path_rtt: RttEstimator::new(*rtt.config()),
            rtt,
            window: None,
            stats: StreamStats {
                packets,
                ..StreamStats::default()
            },
        })
    }

    /// Keeps at most `control`'s window of packets in flight (a delay-based AIMD rule, see
    /// [`crate::window`]), for jobs that share links; carry it from stream to stream with
    /// [`Self::window_control`]. `None`, the default, keeps every slot of the lane busy.
    pub fn set_window_control(&mut self, control: Option<WindowControl>) {
        self.window = control;
    }

    /// The window control, as the stream left it.
    pub fn window_control(&self) -> Option<&WindowControl> {
        self.window.as_ref()
    }

    /// Ends the stream and hands back the tensor (holding the result if the stream finished).
    pub fn into_tensor(self) -> Tensor<'a> {
        self.tensor
    }

    /// The lane as the next stream must start on it.
    pub fn lane_after(&self) -> Lane {
        Lane {
            next_position: self.cfg.lane.next_position + self.packets,
            ..self.cfg.lane
        }
    }

    /// The round-trip estimator, to hand to the next stream.
    pub fn rtt(&self) -> &RttEstimator {
        &self.rtt
    }

    /// Statistics so far.
    pub fn stats(&self) -> StreamStats {
        StreamStats {
            srtt: self.rtt.srtt(),
            min_rtt: self.rtt.min_rtt(),
            ..self.stats
        }
    }

    /// Number of packets the stream sends (not counting retransmissions).
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// The largest packet this stream sends.
    pub fn max_packet_len(&self) -> usize {
        HEADER_LEN + 4 * usize::from(self.cfg.elems_per_packet)
    }

    /// `Some` once the stream has finished or failed.
    pub fn poll_outcome(&self) -> Option<Result<StreamStats, StreamError>> {
        if let Some(e) = &self.failed {
            return Some(Err(e.clone()));
        }
        if self.received == self.packets {
            if let Some(block) = self.poisoned {
                return Some(Err(quant::QuantError::NonFinite { block }.into()));
            }
            return Some(Ok(self.stats()));
        }
        None
    }

    fn is_over(&self) -> bool {
        self.failed.is_some() || self.received == self.packets
    }

    /// The index of packet `index` among the stream's packets after the descriptor.
    fn body(&self, index: u64) -> Option<u64> {
        index.checked_sub(DESCRIPTOR_PACKETS)
    }

    /// This rank's descriptor.
    fn descriptor(&self) -> Descriptor {
        Descriptor {
            elements: self.tensor.len() as u64,
            float: self.tensor.is_float(),
            total_workers: self.cfg.total_workers,
        }
    }

    fn slot_of(&self, index: u64) -> usize {
        ((self.cfg.lane.next_position + index) % u64::from(self.cfg.lane.window)) as usize
    }

    /// The block whose data packet `index` carries.
    fn data_block(&self, index: u64) -> Option<u64> {
        let body = self.body(index)?;
        if self.tensor.is_float() {
            body.checked_sub(self.lookahead)
        } else {
            Some(body)
        }
    }

    fn result_received(&self, index: u64) -> bool {
        self.slots[self.slot_of(index)]
            .done_upto
            .is_some_and(|d| d >= index)
    }

    fn block_range(&self, block: u64) -> core::ops::Range<usize> {
        let e = usize::from(self.cfg.elems_per_packet);
        let start = block as usize * e;
        start..(start + e).min(self.tensor.len())
    }

    /// Writes the next packet due (a retransmission first, else a new packet when its slot is
    /// free and its exponent known) into `buf`; returns its length, or `None` if nothing is due.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<usize>, StreamError> {
        if self.is_over() {
            return Ok(None);
        }
        if buf.len() < self.max_packet_len() {
            return Err(StreamError::BufferTooSmall {
                need: self.max_packet_len(),
                have: buf.len(),
            });
        }
        if let Some((slot, counter)) = self.result_reports.pop_front() {
            return Ok(Some(self.write_result_report(slot, counter, buf)));
        }
        while let Some((index, why)) = self.retransmit.pop_front() {
            let Some((slot, out)) = self.outstanding_at(index) else {
                continue;
            };
            if why == Retransmit::TailCopy {
                if out.held == Held::Yes || out.last_was_query {
                    continue;
                }
                self.stats.retransmissions += 1;
                self.stats.tail_copies += 1;
                return Ok(Some(self.write_packet(index, None, buf)));
            }
            if why == Retransmit::LookaheadCopy {
                if out.held == Held::Yes || out.retries > 0 {
                    continue;
                }
                self.stats.lookahead_copies += 1;
                return Ok(Some(self.write_packet(index, None, buf)));
            }
            let query = self.retransmits_as_query(&out);
            // (Without reports, Queries are rare and mostly repair a lost result: they fetch.)
            // Once every packet has been sent, Queries fetch at once: the downlink has room,
            // and a lost result at the stream's end costs one round trip less (at 4 MiB
            // and 1% loss, 0.933 of lossless goodput at n = 8 against 0.910 asking first;
            // fetching from the last window on, while results still stream, 0.909).
            // (A packet whose loss only a later packet, taken for lost, would have revealed is
            // asked whether its data arrived.)
            let fetch = (out.complete_seen
                || !self.reports
                || (self.all_sent() && self.has(Rule::FetchAtEnd))
                || !self.has(Rule::StatusQueries))
                && why != Retransmit::Unrevealed;
            let ask = if !fetch {
                QueryAsk::Status
            } else if !out.complete_seen
                && self.asks_for_partial()
                && self.has(Rule::Rank0AsksPartial)
            {
                QueryAsk::StatusPushingPartial
            } else {
                QueryAsk::Fetch
            };
            // A Query is answered at once, with the result or Pending: its answer is due a
            // round trip later, and a fetching Query's later by a full result's time on the
            // links. Data waits for the other workers' data.
            let deadline = if query && self.reports {
                let carried = if fetch {
                    self.full_result_time()
                } else {
                    Duration::ZERO
                };
                now + self.query_timeout() + carried
            } else if self.reports {
                // Its loss shows in a Query's Pending answer: asked about at round-trip pace.
                now + self.spacing(now, &out)
            } else {
                now + self.rtt.backed_off(out.retries)
            };
            let last_tx = self.next_transmission(index);
            self.slots[slot].outstanding = Some(Outstanding {
                deadline,
                last_tx,
                last_sent: now,
                last_was_query: query,
                // Data sent again may be lost again.
                held: if query { out.held } else { Held::Unknown },
                // (Cleared here only: a packet queued for retransmission has no timer.)
                awaiting_repair: false,
                ..out
            });
            self.timers.push(Reverse((deadline, index)));
            match why {
                Retransmit::Detected => {
                    self.stats.retransmissions += 1;
                    self.stats.fast_retransmissions += 1;
                }
                Retransmit::StallProbe => self.stats.stall_probes += 1,
                Retransmit::Recheck => self.stats.rechecks += 1,
                Retransmit::Missing => {
                    self.stats.retransmissions += 1;
                    self.stats.resent_missing += 1;
                }
                Retransmit::Reported => {
                    self.stats.retransmissions += 1;
                    self.stats.resent_reported += 1;
                }
                Retransmit::Timer | Retransmit::Unrevealed => self.stats.retransmissions += 1,
                Retransmit::TailCopy | Retransmit::LookaheadCopy => {}
            }
            if query {
                self.stats.queries += 1;
                return Ok(Some(self.write_query(index, ask, buf)));
            }
            return Ok(Some(self.write_packet(index, None, buf)));
        }
        if let Some(w) = &self.window {
            if self.sent_new - self.received >= w.allowed(self.cfg.lane.window) {
                return Ok(None);
            }
        }
        // The smallest packet whose slot is free: a slot waiting for a lost packet's repair
        // holds back only its own next packet, not the packets of the other slots.
        let index = loop {
            let Some(Reverse(index)) = self.ready.pop() else {
                return Ok(None);
            };
            if let (true, Some(b)) = (self.tensor.is_float(), self.data_block(index)) {
                if !self.result_received(b + DESCRIPTOR_PACKETS) {
                    self.parked.insert(index);
                    continue;
                }
            }
            break index;
        };
        let slot = self.slot_of(index);
        let deadline = now + self.rtt.rto();
        let last_tx = self.next_transmission(index);
        // Its number among the block's first transmissions, for the switch's gap counter.
        let (block_ordinal, gap) = match self.gap_blocks.get_mut(slot / usize::from(GAP_BLOCK)) {
            Some(b) => {
                let ordinal = b.sent;
                let counter = (ordinal % u64::from(GAP_COUNTER)) as u8;
                b.sent += 1;
                b.record(ordinal, index);
                (ordinal, Some(counter))
            }
            None => (0, None),
        };
        self.slots[slot].outstanding = Some(Outstanding {
            index,
            first_sent: now,
            deadline,
            retries: 0,
            last_tx,
            first_tx: last_tx,
            block_ordinal,
            last_sent: now,
            last_was_query: false,
            held: Held::Unknown,
            contributors: None,
            complete_seen: false,
            awaiting_repair: false,
        });
        self.timers.push(Reverse((deadline, index)));
        self.note_occupancy(now);
        self.sent_new += 1;
        self.progress_at = Some(now);
        if self.reports && self.sent_new == self.packets {
            self.arm_tail_timers(now);
        }
        if self.tensor.is_float() && self.has(Rule::LookaheadCopies) {
            // The headers of the first window are copied once the last of them has gone; a
            // header that waited for a slot (behind the descriptor) is copied as it goes.
            let headers_end = DESCRIPTOR_PACKETS + self.lookahead;
            let first_window = u64::from(self.cfg.lane.window).min(self.packets);
            if index + 1 == headers_end.min(first_window) {
                self.queue_lookahead_copies(index + 1);
            } else if (first_window..headers_end).contains(&index) {
                self.retransmit
                    .push_back((index, Retransmit::LookaheadCopy));
            }
        }
        Ok(Some(self.write_packet(index, gap, buf)))
    }

    /// Adds the packets in flight since the last change to the occupancy integral; call just
    /// before the count changes.
    fn note_occupancy(&mut self, now: Instant) {
        if let Some(at) = self.occupancy_at {
            let dt = now.saturating_duration_since(at).as_nanos() as u64;
            let in_flight = self.sent_new - self.received;
            self.stats.slot_ns = self.stats.slot_ns.saturating_add(in_flight * dt);
            self.stats.active_ns = self.stats.active_ns.saturating_add(dt);
        }
        self.occupancy_at = Some(now);
    }

    /// Numbers a transmission of packet `index` and records it for loss detection.
    fn next_transmission(&mut self, index: u64) -> u64 {
        let tx = self.transmissions;
        self.transmissions += 1;
        self.in_flight.push_back((tx, index));
        tx
    }

    /// Whether the retransmission of `out` asks with a Query instead of sending the data
    /// again. With other workers in the job, an unanswered packet is far more often waiting
    /// for another worker's lost data, or lost its result, than lost its own data: the Query
    /// (16 bytes) is answered with the stored result, or with Pending, whose bitmap says
    /// whether this worker's data must go again. Alone in its job, a worker's data completes
    /// the use by itself, so it is sent again at once.
    ///
    /// With Missing reports, the switch tells the worker whose data was lost, about a round
    /// trip after the loss: every other worker's repair of an unanswered packet starts with a
    /// Query. Only a loss the switch cannot report goes again as data at once: the first
    /// transmission of a packet whose next position was not sent after it in the same block
    /// (the last slot of a block, or the stream's end), and only once every packet has been
    /// sent: until then the link has no room to spare, and such a packet (its block's newest)
    /// is asked about first, its data going again when the Pending answer lacks this worker's
    /// bit. (Sending its data at once let a worker whose results came slowly, 8 KiB packets at
    /// 500 Mbit/s, send each new packet twice on its stall probe: it fell behind, the others
    /// waited for it, and the all-reduce took 1.26-1.80 s instead of 1.09 in three seeds of
    /// eight.) A lost report, or a lost data retransmission, is found by the Query's Pending
    /// answer.
    fn retransmits_as_query(&self, out: &Outstanding) -> bool {
        match out.held {
            Held::Yes => true,
            Held::No => false,
            Held::Unknown => {
                self.reports
                    && self.has(Rule::QueryFirst)
                    && (out.retries > 1 || self.loss_reportable(out) || !self.all_sent())
            }
        }
    }

    /// Queues a second copy of each of the stream's first `headers` packets, the exponent
    /// lookahead's headers, once the last of them has gone.
    ///
    /// A block's data waits for its lookahead use, and that use completes only when every
    /// worker's header is in: in a job of 1024 workers at 1% loss each use loses about ten
    /// headers, so without copies every block waited for a repair, and the stream's data
    /// started 13 µs late (30 µs against 17 µs lossless, 32 racks of 32, traced). A use then
    /// lacks a header only where both copies were lost. The copies go while the uplink would
    /// wait for the lookahead's results anyway, 16 bytes each, without a gap counter (the
    /// first copy carried it); the switch answers a copy of a header it holds as it answers
    /// data sent again (PROTOCOL.md §5, "Exponent lookahead").
    fn queue_lookahead_copies(&mut self, end: u64) {
        self.retransmit
            .extend((DESCRIPTOR_PACKETS..end).map(|index| (index, Retransmit::LookaheadCopy)));
    }

    /// Once every packet has gone out, no later first transmission will make the switch report
    /// the loss of a block's last one: those packets get the query timeout as their timer
    /// (a round trip or two, not a retransmission timeout), and go again when it expires. The
    /// link has room at the end of the stream, so a copy sent while the use merely waits for
    /// another worker costs nothing but its bytes, and its Pending answer turns the next
    /// attempts into Queries. Rank 0 of a rack also has the uses it was told wait asked about
    /// at the end's pace ([`ask_held_at_the_ends_pace`](Self::ask_held_at_the_ends_pace)).
    fn arm_tail_timers(&mut self, now: Instant) {
        let timeout = self.query_timeout();
        // A packet whose data loss would be reported may still lose its result, which only
        // results of later packets or its timer reveal, and at the end there are few later
        // packets: its timer is a result's timeout, without the retransmission timeout's floor.
        let result_timeout = self.timeout_of(&self.rtt);
        let racks_timer = self.asks_for_partial() && self.has(Rule::Rank0HeldAtEndPace);
        for slot in 0..self.slots.len() {
            let Some(out) = self.slots[slot].outstanding else {
                continue;
            };
            let queued = out.is_queued();
            if out.held == Held::Yes && racks_timer {
                if !queued {
                    self.ask_held_at_the_ends_pace(now, slot, out);
                }
                continue;
            }
            if queued || out.retries > 0 || !self.has(Rule::TailTimers) {
                continue;
            }
            let timeout = if self.loss_reportable(&out) {
                match result_timeout {
                    Some(t) => t,
                    None => continue,
                }
            } else {
                timeout
            };
            let deadline = out.deadline.min(out.last_sent + timeout);
            if deadline != out.deadline {
                self.slots[slot].outstanding = Some(Outstanding { deadline, ..out });
                self.timers.push(Reverse((deadline, out.index)));
            }
        }
    }

    /// Rank 0 of a rack, once every packet has gone: a use found held before (a Pending with
    /// this worker's bit) is asked about again a spacing of the stream's end after the Query
    /// that found it held, as a use found held from now on is
    /// ([`next_ask_after_held`](Self::next_ask_after_held)), not after the spacing set while
    /// packets were still going. Rank 0's Queries are its rack's only timer for a total lost
    /// on its way down (PROTOCOL.md §9), and the spacing set mid-stream, the path's timeout
    /// through the tree (at least twice its smoothed round trip), ran 47 µs after the
    /// Pending: traced at 32 racks of 32 and 1% loss (seed 1), two racks lost the total of a
    /// block's last slot at 1383.0 and 1387.7 µs, their ranks 0 had been told at 1396.8 µs
    /// that the use waited for its total, and asked again only at 1443.6 and 1444.1 µs, while
    /// every worker of those racks waited for that result (PROTOCOL.md §5, "The tail"). A
    /// fetch that a "complete" answer deferred is held too, and goes at the same pace.
    fn ask_held_at_the_ends_pace(&mut self, now: Instant, slot: usize, out: Outstanding) {
        let deadline = out.deadline.min(self.next_ask_after_held(now, &out));
        if deadline != out.deadline {
            self.slots[slot].outstanding = Some(Outstanding { deadline, ..out });
            self.timers.push(Reverse((deadline, out.index)));
        }
    }

    /// Whether fewer than a window of packets are left to send for the first time: the
    /// stream's last window, whose losses the stream's end waits for.
    fn in_last_window(&self) -> bool {
        self.sent_new + u64::from(self.cfg.lane.window) >= self.packets
    }

    /// Whether the stream follows `rule` (see [`crate::rules`]).
    fn has(&self, rule: Rule) -> bool {
        self.cfg.rules.has(rule)
    }

    /// Whether every packet of the stream has had its first transmission: the stream's end,
    /// where no later first transmission reveals a loss and the link has room to spare.
    fn all_sent(&self) -> bool {
        self.sent_new >= self.packets
    }

    /// The gap-tracking block (of [`GAP_BLOCK`] slots of the lane) of packet `index`.
    fn gap_block_of(&self, index: u64) -> usize {
        self.slot_of(index) / usize::from(GAP_BLOCK)
    }

    /// Whether the switch would have reported the loss of `out`'s first transmission: a later
    /// first transmission to the same block has been sent.
    fn loss_reportable(&self, out: &Outstanding) -> bool {
        self.gap_blocks
            .get(self.gap_block_of(out.index))
            .is_some_and(|b| b.sent > out.block_ordinal + 1)
    }

    /// The header of packet `index` (its slot, set, sequence number), as `kind`.
    fn header_of(&self, index: u64, kind: MessageType) -> AggRepr {
        let position = self.cfg.lane.next_position + index;
        let window = u64::from(self.cfg.lane.window);
        AggRepr {
            kind,
            set: ((position / window) & 1) as u8,
            gap: None,
            job: self.cfg.job,
            epoch: self.cfg.epoch,
            rank: self.cfg.rank,
            exponent: 0,
            slot: self.cfg.lane.slot_base + (position % window) as u16,
            count: 0,
            seq: position as u32,
        }
    }

    /// The payload elements of packet `index`'s data and result: E, or 0 for a header-only
    /// packet of the exponent lookahead.
    fn count_of(&self, index: u64) -> u16 {
        if index < DESCRIPTOR_PACKETS || self.data_block(index).is_some_and(|b| b < self.blocks) {
            self.cfg.elems_per_packet
        } else {
            0
        }
    }

    /// Writes a Query of packet `index`'s use of its slot that asks for `ask`: the use's
    /// state (a complete use is answered with the result's header alone), or its result.
    ///
    /// The status Query keeps copies of results off the way back: most Queries are sent
    /// while another worker's repair completes the use, and cross its result. Its answer
    /// travels behind the result on the same path, so an answer "complete" without the
    /// result means the result was lost: the fetching Query follows at once.
    fn write_query(&mut self, index: u64, ask: QueryAsk, buf: &mut [u8]) -> usize {
        // A use whose data carried no payload has a header-only result: its state is all
        // there is to ask for.
        let ask = if self.count_of(index) == 0 {
            QueryAsk::Status
        } else {
            ask
        };
        let repr = AggRepr {
            exponent: ask.byte(),
            ..self.header_of(index, MessageType::Query)
        };
        if repr.emit_into(buf).is_err() {
            // Unreachable: poll_transmit checked the buffer against max_packet_len.
            return 0;
        }
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += HEADER_LEN as u64;
        HEADER_LEN
    }

    /// Writes a Missing report of the multicast result that carried gap `counter` in the
    /// block of `slot`: the switch answers it with that use's stored result.
    fn write_result_report(&mut self, slot: u16, counter: u8, buf: &mut [u8]) -> usize {
        let repr = AggRepr {
            kind: MessageType::Missing,
            set: 0,
            gap: Some(counter),
            job: self.cfg.job,
            epoch: self.cfg.epoch,
            rank: self.cfg.rank,
            exponent: 1,
            slot,
            count: 0,
            seq: 0,
        };
        if repr.emit_into(buf).is_err() {
            // Unreachable: poll_transmit checked the buffer against max_packet_len.
            return 0;
        }
        self.stats.results_reported += 1;
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += HEADER_LEN as u64;
        HEADER_LEN
    }

    /// Writes the Data packet `index`; `gap` is the gap counter of a first transmission.
    fn write_packet(&mut self, index: u64, gap: Option<u8>, buf: &mut [u8]) -> usize {
        let data_block = self.data_block(index).filter(|b| *b < self.blocks);
        let e = usize::from(self.cfg.elems_per_packet);
        let lookahead_of = self
            .body(index)
            .filter(|b| self.tensor.is_float() && *b < self.blocks);
        let exponent = if let Some(b) = lookahead_of {
            let r = self.block_range(b);
            match &mut self.tensor {
                Tensor::Generated(g) => {
                    let x = &mut self.scratch[..r.len()];
                    g.input(r.start, x);
                    quant::block_exponent(x)
                }
                t => match t.elements() {
                    Some(Elements::F32(t)) => quant::block_exponent(&t[r]),
                    _ => 0,
                },
            }
        } else {
            0
        };
        let repr = AggRepr {
            exponent,
            count: self.count_of(index),
            gap,
            ..self.header_of(index, MessageType::Data)
        };
        let len = repr.buffer_len();
        let Ok(mut pkt) = repr.emit_into(buf) else {
            // Unreachable: poll_transmit checked the buffer against max_packet_len.
            return 0;
        };
        if index < DESCRIPTOR_PACKETS {
            let values = self.descriptor().encode(e);
            ina_wire::payload::encode_from(&values, pkt.payload_mut());
        }
        if let Some(b) = data_block {
            let r = self.block_range(b);
            let n = r.len();
            let payload = pkt.payload_mut();
            let agreed = self.exps.get((b % self.lookahead.max(1)) as usize).copied();
            match &mut self.tensor {
                Tensor::Generated(g) => {
                    let x = &mut self.scratch[..n];
                    g.input(r.start, x);
                    quant::quantize_be(x, agreed.unwrap_or(0), self.cfg.total_workers, payload);
                }
                t => match t.elements() {
                    Some(Elements::F32(t)) => {
                        quant::quantize_be(
                            &t[r],
                            agreed.unwrap_or(0),
                            self.cfg.total_workers,
                            payload,
                        );
                    }
                    Some(Elements::I32(t)) => {
                        ina_wire::payload::encode_from(&t[r], payload);
                    }
                    None => {}
                },
            }
            payload[n * 4..e * 4].fill(0);
        }
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += len as u64;
        len
    }

    /// Takes in one datagram from the switch.
    pub fn handle_datagram(&mut self, now: Instant, bytes: &[u8]) {
        let Ok((hdr, payload)) = AggRepr::parse_bytes(bytes) else {
            self.stats.foreign += 1;
            return;
        };
        if hdr.job != self.cfg.job || hdr.rank != self.cfg.rank && hdr.kind != MessageType::Result {
            self.stats.foreign += 1;
            return;
        }
        match hdr.kind {
            MessageType::Result => self.handle_result(now, &hdr, payload),
            MessageType::Pending => self.handle_pending(now, &hdr, payload),
            MessageType::Missing => self.handle_missing(now, &hdr),
            MessageType::Reject => {
                // Only a refusal of a packet this stream has outstanding counts: a copy of an
                // old refusal, or one provoked by someone else's packet, changes nothing.
                if self.failed.is_some() || !self.is_outstanding(hdr.slot, hdr.seq) {
                    self.stats.foreign += 1;
                    return;
                }
                self.failed = Some(match hdr.reject_reason() {
                    Some(RejectReason::StaleEpoch) => StreamError::SwitchRestarted {
                        ours: self.cfg.epoch,
                        switch: hdr.epoch,
                    },
                    Some(r) => StreamError::Rejected(r),
                    None => return,
                });
            }
            _ => self.stats.foreign += 1,
        }
    }

    fn is_outstanding(&self, slot: u16, seq: u32) -> bool {
        let Some(idx) = slot.checked_sub(self.cfg.lane.slot_base) else {
            return false;
        };
        self.slots
            .get(usize::from(idx))
            .and_then(|s| s.outstanding)
            .is_some_and(|o| (self.cfg.lane.next_position + o.index) as u32 == seq)
    }

    /// The outstanding packet that `hdr` (a Result or Pending) answers: its slot's index in
    /// the lane, if the header names the packet's slot, set, sequence number and epoch.
    fn answered_slot(&self, hdr: &AggRepr) -> Option<usize> {
        let slot = usize::from(hdr.slot.checked_sub(self.cfg.lane.slot_base)?);
        let out = self.slots.get(slot)?.outstanding?;
        let position = self.cfg.lane.next_position + out.index;
        let window = u64::from(self.cfg.lane.window);
        let matches = hdr.epoch == self.cfg.epoch
            && hdr.seq == position as u32
            && hdr.set == ((position / window) & 1) as u8;
        matches.then_some(slot)
    }

    /// A Pending answer: the switch's use of the slot is still collecting, and its bitmap says
    /// whether it holds this worker's data. If it does, further retransmissions are Queries;
    /// if not, the data goes again now (unless data was sent after the Query this answers).
    fn handle_pending(&mut self, now: Instant, hdr: &AggRepr, payload: &[u8]) {
        let (Some(slot), Ok(info)) = (self.answered_slot(hdr), PendingInfo::parse(payload)) else {
            self.stats.duplicate_results += 1;
            return;
        };
        let Some(out) = self.slots[slot].outstanding else {
            return;
        };
        self.stats.pending_answers += 1;
        if out.retries > 0 {
            self.on_path_sample(now, &out);
        }
        // (A Pending with every rank's bit, from a switch whose use waits for an upper
        // switch's total, PROTOCOL.md §9, is no different: this worker's data is held, and
        // it asks again at the path's pace; rank 0's asking reaches the upper switch.)
        let out = Outstanding {
            contributors: Some(info.bitmap),
            ..out
        };
        self.slots[slot].outstanding = Some(out);
        if info.has(self.cfg.rank) {
            // The first Query about it found it held: its answer was late because its use
            // waited for another worker's repair, not because anything of its own was lost.
            let first_query = out.retries == 1 && out.last_was_query;
            if let (true, Some(h)) = (first_query, self.highest_answered) {
                self.held_reordering = self.held_reordering.max(h.saturating_sub(out.first_tx));
            }
            // The use waits for other workers' data: ask again later, in case its result to
            // this worker is lost.
            let queued = out.is_queued() || !self.reports;
            // (Once every packet has gone, the wait runs from the Query this answers, not
            // from the answer: see `Stream::next_ask_after_held`.)
            let deadline = if queued {
                out.deadline
            } else {
                self.next_ask_after_held(now, &out)
            };
            self.slots[slot].outstanding = Some(Outstanding {
                held: Held::Yes,
                deadline,
                ..out
            });
            if !queued {
                self.timers.push(Reverse((deadline, out.index)));
            }
            return;
        }
        if !out.last_was_query {
            // The data went again after the Query that this answers: it is on its way.
            return;
        }
        self.resend_data(now, slot, out, Retransmit::Missing);
    }

    /// Queues the data of `out` (on `slot`), which the switch lacks, to go again now: unless a
    /// retransmission is already queued, which then carries the data. Returns false if the
    /// stream gave up instead.
    fn resend_data(
        &mut self,
        now: Instant,
        slot: usize,
        out: Outstanding,
        why: Retransmit,
    ) -> bool {
        let queued = out.is_queued();
        if queued {
            self.slots[slot].outstanding = Some(Outstanding {
                held: Held::No,
                ..out
            });
            return true;
        }
        if self.give_up_if_spent(now, &out) {
            return false;
        }
        self.slots[slot].outstanding = Some(Outstanding {
            held: Held::No,
            retries: out.retries + 1,
            deadline: QUEUED,
            ..out
        });
        self.retransmit.push_back((out.index, why));
        if self.in_last_window() && self.has(Rule::TailCopies) {
            self.retransmit.push_back((out.index, Retransmit::TailCopy));
        }
        true
    }

    /// A Missing report: the switch never got `hdr.exponent` first transmissions to the block
    /// of `hdr.slot`, numbered from the report's gap counter on: the latest first
    /// transmissions with those counters. Each of them still unanswered, whose data is not
    /// known held and has not gone again since its first transmission, goes again now.
    ///
    /// A counter repeats every [`GAP_COUNTER`] first transmissions to a block, and a report
    /// can come back later than that: a window of one block that fills deep queues (on the
    /// emulated rack at 1 Gbit/s, 8 KiB packets and 64 slots, the block's next 64 packets
    /// went in 4.2 ms, and reports came back after 4.3 ms). The latest packet with the
    /// counter is then a newer one than the packet lost, which waited for the Queries,
    /// 12-16 ms later. So the report is also read through the packet that showed the gap,
    /// which its header names (see [`Self::shown_ordinal`]): the ones just before it are
    /// the packets the switch missed. Where they are other packets, still unanswered and
    /// never sent again, each is asked about at once with a Query (its Pending answer sends
    /// the data if the switch lacks it), and the report is counted in `late_reports`.
    ///
    /// Not their data at once: the same reading fits a packet that the network delayed
    /// past newer ones to its block, whose counter the switch took for a jump ahead. Nothing
    /// before it was lost then, and the newer packets, which the switch now takes for
    /// packets behind its cell and will not report, are the ones the counters name. At 20%
    /// loss with 5% duplication and 5% reordering, where delayed packets are common, eight
    /// workers met about 20 such reports per all-reduce, and the goodput stayed within the
    /// seeds' spread (60.50 Gbit/s before, 59.93 after, 80 seeds).
    fn handle_missing(&mut self, now: Instant, hdr: &AggRepr) {
        let block = hdr
            .slot
            .checked_sub(self.cfg.lane.slot_base)
            .map(|s| usize::from(s / GAP_BLOCK));
        let (Some(first), Some(b)) = (hdr.gap, block.and_then(|b| self.gap_blocks.get(b))) else {
            self.stats.foreign += 1;
            return;
        };
        if hdr.epoch != self.cfg.epoch || hdr.count != 0 {
            self.stats.foreign += 1;
            return;
        }
        let skipped = usize::from(hdr.exponent.min(GAP_COUNTER - 1));
        let counters = u64::from(GAP_COUNTER);
        // By the counters: the latest first transmission with each.
        let latest = b.sent.saturating_sub(1);
        let mut by_counter = [u64::MAX; GAP_COUNTER as usize];
        for (k, at) in by_counter.iter_mut().take(skipped).enumerate() {
            let counter = (u64::from(first) + k as u64) % counters;
            *at = latest
                .checked_sub((latest + counters - counter) % counters)
                .map_or(u64::MAX, |o| b.index_at(o));
        }
        // Through the packet that showed the gap: the ones just before it.
        let mut before = [u64::MAX; GAP_COUNTER as usize];
        let from = self
            .shown_ordinal(b, hdr)
            .and_then(|shown| shown.checked_sub(skipped as u64))
            .filter(|&o| o % counters == u64::from(first))
            .filter(|&o| b.sent - o <= REPORT_HISTORY as u64);
        if let Some(from) = from {
            for (k, at) in before.iter_mut().take(skipped).enumerate() {
                *at = b.index_at(from + k as u64);
            }
        }
        for &index in by_counter.iter().take(skipped) {
            let Some((slot, out)) = self.outstanding_at(index) else {
                continue;
            };
            self.stats.missing_reports += 1;
            if out.held == Held::Yes || (out.retries > 0 && !out.last_was_query) {
                continue;
            }
            if !self.resend_data(now, slot, out, Retransmit::Reported) {
                return;
            }
        }
        let mut late = false;
        let late_reports = if self.has(Rule::LateReports) {
            skipped
        } else {
            0
        };
        for &index in before.iter().take(late_reports) {
            if by_counter.contains(&index) {
                continue;
            }
            let Some((slot, out)) = self.outstanding_at(index) else {
                continue;
            };
            if out.retries > 0 || out.held != Held::Unknown || out.is_queued() {
                continue;
            }
            late = true;
            if self.give_up_if_spent(now, &out) {
                return;
            }
            self.queue_retransmission(slot, out, Retransmit::Detected);
        }
        self.stats.late_reports += u64::from(late);
    }

    /// The number among the first transmissions to block `b` of the packet whose header a
    /// Missing report carries, if it is one of the block's latest [`REPORT_HISTORY`]. The
    /// packet may have been answered since, and its slot used again: the switch sends a
    /// report after the result that the same packet completed, and a report can come back
    /// later than a round trip.
    fn shown_ordinal(&self, b: &BlockTx, hdr: &AggRepr) -> Option<u64> {
        let index = u64::from(hdr.seq.wrapping_sub(self.cfg.lane.next_position as u32));
        if index >= self.packets {
            return None;
        }
        let its = self.header_of(index, hdr.kind);
        if (its.slot, its.set) != (hdr.slot, hdr.set) {
            return None;
        }
        let oldest = b.sent.saturating_sub(REPORT_HISTORY as u64);
        (oldest..b.sent).rev().find(|&o| b.index_at(o) == index)
    }

    /// The lane's slot of packet `index` and its outstanding transmission, if it is still
    /// unanswered (a packet of the stream, whose slot has not moved on).
    fn outstanding_at(&self, index: u64) -> Option<(usize, Outstanding)> {
        if index >= self.packets {
            return None;
        }
        let slot = self.slot_of(index);
        let out = self.slots[slot].outstanding.filter(|o| o.index == index)?;
        Some((slot, out))
    }

    fn handle_result(&mut self, now: Instant, hdr: &AggRepr, payload: &[u8]) {
        let base = self.cfg.lane.slot_base;
        let in_lane =
            hdr.slot >= base && u32::from(hdr.slot - base) < u32::from(self.cfg.lane.window);
        if !in_lane || hdr.epoch != self.cfg.epoch {
            self.stats.foreign += 1;
            return;
        }
        let slot = usize::from(hdr.slot - base);
        if let Some(counter) = hdr.gap {
            self.note_result_counter(hdr.slot, slot, counter);
        }
        let Some(out) = self.slots[slot].outstanding else {
            self.stats.duplicate_results += 1;
            return;
        };
        let position = self.cfg.lane.next_position + out.index;
        let window = u64::from(self.cfg.lane.window);
        let data_block = self.data_block(out.index).filter(|b| *b < self.blocks);
        let want_count = if data_block.is_some() || out.index < DESCRIPTOR_PACKETS {
            self.cfg.elems_per_packet
        } else {
            0
        };
        if hdr.seq != position as u32 || hdr.set != ((position / window) & 1) as u8 {
            self.stats.duplicate_results += 1;
            return;
        }
        if hdr.count != want_count {
            if hdr.count == 0 {
                self.handle_complete(now, slot, out);
            } else {
                self.stats.duplicate_results += 1;
            }
            return;
        }
        // Accepted: the packet's use of the slot is complete.
        if out.retries == 0 && (hdr.gap.is_some() || !self.counts_results()) {
            // Unambiguous (Karn): the answer is to the only transmission. (With the results'
            // gap counters, a result without one is a copy sent for a report of a lost one,
            // and its round trip includes the wait for a later result.)
            let sample = now - out.first_sent;
            self.rtt.on_sample(sample);
            if hdr.count != 0 {
                self.min_full_rtt = Some(self.min_full_rtt.map_or(sample, |m| m.min(sample)));
            }
            if let Some(w) = self.window.as_mut() {
                let srtt = self.rtt.srtt().unwrap_or(sample);
                w.on_rtt(now, sample, srtt, self.cfg.lane.window);
            }
            if let Some(h) = self.highest_answered {
                self.reordering = self.reordering.max(h.saturating_sub(out.last_tx));
            }
            if self.highest_answered.is_none_or(|h| out.last_tx > h) {
                self.latest_answer_rtt = Some(sample);
            }
            self.highest_answered = Some(
                self.highest_answered
                    .map_or(out.last_tx, |h| h.max(out.last_tx)),
            );
        }
        self.slots[slot].outstanding = None;
        self.slots[slot].done_upto = Some(out.index);
        self.note_occupancy(now);
        self.received += 1;
        self.progress_at = Some(now);
        self.stall_rounds = 0;
        self.stall_probe_last = None;
        // The slot is free for its next packet.
        let next = out.index + window;
        if next < self.packets {
            self.ready.push(Reverse(next));
        }
        // A packet parked for this packet's exponent can go.
        if self.lookahead > 0 && self.parked.remove(&(out.index + self.lookahead)) {
            self.ready.push(Reverse(out.index + self.lookahead));
        }
        self.detect_losses(now);
        if out.index >= DESCRIPTOR_PACKETS {
            self.stats.results += 1;
        }
        if let Some(b) = data_block {
            let r = self.block_range(b);
            let workers = self.cfg.total_workers;
            let agreed = self.exps.get((b % self.lookahead.max(1)) as usize).copied();
            match &mut self.tensor {
                Tensor::Generated(g) => {
                    if let Some(agreed) = agreed.filter(|a| *a != NON_FINITE) {
                        let x = &mut self.scratch[..r.len()];
                        quant::dequantize_be(payload, agreed, workers, x);
                        g.result(r.start, x);
                    }
                }
                t => match t.elements_mut() {
                    Some(ElementsMut::F32(t)) => {
                        if let Some(agreed) = agreed.filter(|a| *a != NON_FINITE) {
                            quant::dequantize_be(payload, agreed, workers, &mut t[r]);
                        }
                    }
                    Some(ElementsMut::I32(t)) => {
                        ina_wire::payload::decode_into(payload, &mut t[r]);
                    }
                    None => {}
                },
            }
        }
        if let Some(b) = self
            .body(out.index)
            .filter(|b| self.tensor.is_float() && *b < self.blocks)
        {
            self.exps[(b % self.lookahead) as usize] = hdr.exponent;
            if hdr.exponent == NON_FINITE && self.poisoned.is_none() {
                self.poisoned = Some(b);
            }
        }
        if out.index < DESCRIPTOR_PACKETS {
            let mut sums = vec![0i32; usize::from(self.cfg.elems_per_packet)];
            ina_wire::payload::decode_into(payload, &mut sums);
            if let Err(m) = self.descriptor().check(&sums) {
                self.failed = Some(StreamError::Mismatch(m));
            }
        }
    }

    /// A multicast result's gap counter (PROTOCOL.md §5, "Lost results"): the switch numbers
    /// the results it multicasts per block, and every worker of the job receives them in that
    /// order. Counters skipped (1 to [`crate::gap::MAX_REPORTED_GAP`], by the rule of
    /// the switch's gap register) are results lost on the way here: each is reported at
    /// once, in a Missing of its own, and the switch answers with its stored copy. `slot` is
    /// the lane's index of the result's slot, `switch_slot` the switch's.
    fn note_result_counter(&mut self, switch_slot: u16, slot: usize, counter: u8) {
        let Some(latest) = self.results_seen.get_mut(slot / usize::from(GAP_BLOCK)) else {
            return;
        };
        if let Some((first, skipped)) = crate::gap::take_counter(latest, counter) {
            // (At most a burst's worth per block waits: results sent without ever calling
            // `poll_transmit` cannot grow the queue without bound.)
            let room = self.results_seen.len() * crate::gap::MAX_REPORTED_GAP as usize;
            for k in 0..skipped {
                if self.result_reports.len() >= room {
                    break;
                }
                let named = (first + k) % GAP_COUNTER;
                self.result_reports.push_back((switch_slot, named));
            }
        }
    }

    /// An immediate answer of the switch (Pending, or the header-only answer to a status
    /// Query) to `out`'s latest retransmission: a sample of the path's round trip. Only the
    /// answer to a packet's only retransmission is sure to answer that transmission and not
    /// an earlier one, so only it may lower `path_min`.
    fn on_path_sample(&mut self, now: Instant, out: &Outstanding) {
        let sample = now - out.last_sent;
        self.path_rtt.on_sample(sample);
        if out.retries == 1 {
            self.path_min = Some(self.path_min.map_or(sample, |m| m.min(sample)));
        }
    }

    /// The header-only answer to a status Query: the use of `out` is complete, and its result,
    /// which travelled ahead of this answer, was lost. The result is fetched now.
    fn handle_complete(&mut self, now: Instant, slot: usize, out: Outstanding) {
        self.stats.completions_seen += 1;
        if out.last_was_query {
            self.on_path_sample(now, &out);
        }
        let queued = out.is_queued();
        if out.complete_seen || queued {
            self.slots[slot].outstanding = Some(Outstanding {
                complete_seen: true,
                ..out
            });
            return;
        }
        if self.give_up_if_spent(now, &out) {
            return;
        }
        if self.defers_fetch() {
            // Most likely the result's gap counter has been reported already, and its copy
            // is on its way: fetch only if it has not come a query timeout from now.
            let deadline = now + self.query_timeout();
            self.slots[slot].outstanding = Some(Outstanding {
                held: Held::Yes,
                complete_seen: true,
                deadline,
                ..out
            });
            self.timers.push(Reverse((deadline, out.index)));
            return;
        }
        self.slots[slot].outstanding = Some(Outstanding {
            held: Held::Yes,
            complete_seen: true,
            retries: out.retries + 1,
            deadline: QUEUED,
            ..out
        });
        self.retransmit.push_back((out.index, Retransmit::Detected));
    }

    /// The earliest instant at which [`Self::handle_timeout`] has work.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        if self.is_over() {
            return None;
        }
        let mut timer = None;
        while let Some(Reverse((deadline, index))) = self.timers.peek().copied() {
            let slot = self.slot_of(index);
            match self.slots[slot].outstanding {
                Some(o) if o.index == index && o.deadline == deadline => {
                    timer = Some(deadline);
                    break;
                }
                _ => {
                    self.timers.pop();
                }
            }
        }
        [timer, self.stall_probe_at(), self.redetect_at()]
            .into_iter()
            .flatten()
            .min()
    }

    /// When the earliest retransmission waiting in `deferred` may be judged lost again
    /// (without waiting for another answer to come).
    fn redetect_at(&self) -> Option<Instant> {
        if !self.reports {
            return None;
        }
        self.deferred
            .iter()
            .filter_map(|&(tx, index)| {
                let out = self.slots[self.slot_of(index)].outstanding?;
                (out.index == index && out.last_tx == tx)
                    .then(|| out.last_sent + self.redetect_after(out.retries))
            })
            .min()
    }

    /// The probe timeout: the retransmission timeout without its floor,
    /// `SRTT + max(G, 4 RTTVAR)`, and at least two smoothed round trips; `None` before the
    /// first round-trip sample. On a steady network it is about two round trips; where round
    /// trips vary (a busy host that does not run every worker at once), it grows with them,
    /// so that a worker's short absence does not make the others probe.
    fn probe_timeout(&self) -> Option<Duration> {
        self.timeout_of(&self.rtt)
    }

    /// `SRTT + max(G, 4 RTTVAR)` of `estimate`, and at least two of its smoothed round trips;
    /// `None` before its first sample.
    fn timeout_of(&self, estimate: &RttEstimator) -> Option<Duration> {
        let srtt = estimate.srtt()?;
        Some((srtt + self.spread_of(estimate)).max(srtt.saturating_mul(2)))
    }

    /// `max(G, 4 RTTVAR)` of `estimate`: the margin a timeout adds to the smoothed round trip.
    fn spread_of(&self, estimate: &RttEstimator) -> Duration {
        self.rtt.config().granularity.max(estimate.rttvar() * 4)
    }

    /// The probe timeout of the path's round trips (see `path_rtt`), once the switch has
    /// answered a Query or repeated data.
    ///
    /// Once every packet has been sent, the results of the last window drain and the path
    /// empties: an answer then takes the path's smallest round trip, and one that takes longer
    /// was lost or waits for another worker, which a second 16-byte Query costs nothing to
    /// find out, while the job's end waits for every loss left. The timeout is then that
    /// round trip: `path_min`, from answers to a packet's only retransmission, which cannot
    /// be mistaken for the answer to an earlier one (before any, the smallest round trip of a
    /// result, which is the path's or longer); at least half the smallest round trip of a
    /// result, so that a duplicated packet's early answer cannot make it a few hundred
    /// nanoseconds; and at least the clock granularity `G`, below which a host cannot time
    /// anything (with 30 µs on loopback, a worker whose switch paused for 4 ms used up its 30
    /// retries). n = 32 on one switch at 1% loss, 12 seeds: 0.967 of lossless against 0.959
    /// with `SRTT + max(G, 4 RTTVAR, SRTT / 4)` of the path (which mid-stream queueing
    /// inflates to 1.5 times the empty path's), and 0.966 with a quarter of the round trip
    /// added (BENCHMARKS.md, "Loss in the simulator").
    fn path_timeout(&self) -> Option<Duration> {
        if self.all_sent() && self.has(Rule::EmptyPathTimeout) {
            if let Some(result_min) = self.rtt.min_rtt() {
                let path = self.path_min.unwrap_or(result_min);
                let granularity = self.rtt.config().granularity;
                return Some(path.max(result_min / 2).max(granularity));
            }
            let srtt = self.path_rtt.srtt()?;
            return Some(srtt + self.spread_of(&self.path_rtt).max(srtt / 4));
        }
        self.timeout_of(&self.path_rtt)
    }

    /// How much longer a full-size result's round trip is than a header-only one's: the
    /// data's and the result's time on the links (from the smallest round trips of each,
    /// zero until both are known). A fetching Query's answer is a full result, and at the
    /// stream's end, where Queries are timed by the empty path's round trip (measured with
    /// header-only answers), a fetch repeated before its answer could come brings a second
    /// copy: at n = 8, 500 Mbit/s and 8 KiB packets, a worker whose last results were lost
    /// fetched 18 of them every 40 µs, each answer 131 µs on its downlink, and the job took
    /// 1.154 s against 1.090 (seed 1 of 8 at 1% loss; with this wait, 1.090–1.093 in every
    /// seed). At 100 Gbit/s it adds a fraction of a microsecond, and 24 seeds at 1% loss
    /// gave the same goodput within 0.04 Gbit/s at n = 32, 4 racks of 4 and 4 racks of 8.
    fn full_result_time(&self) -> Duration {
        if !self.has(Rule::FetchWaitsFullResult) {
            return Duration::ZERO;
        }
        self.min_full_rtt
            .zip(self.rtt.min_rtt())
            .map_or(Duration::ZERO, |(full, any)| full.saturating_sub(any))
    }

    /// The stall probe's timeout: the probe timeout, or with Missing reports the path's
    /// (the probe then mostly asks with Queries, which the switch answers at once).
    fn stall_timeout(&self) -> Option<Duration> {
        let path = self.path_timeout().filter(|_| self.reports);
        path.or_else(|| self.probe_timeout())
    }

    /// When the stall probe is due: once no result came and no packet was sent for the first
    /// time for [`stall_timeout`](Self::stall_timeout); then, without reports, doubled for every
    /// probe round since, and with reports spaced by an eighth of the time without progress
    /// (as Queries are, see [`spacing`](Self::spacing)).
    ///
    /// Loss detection by transmission order needs answers to later transmissions. It has
    /// nothing to go on when nothing more is answered: after a loss among the last packets of
    /// the stream, or when the only packets left wait for a slot whose repair was lost again
    /// (its next uses cannot go before it completes), and answers to retransmissions prove
    /// nothing. Without the probe such a loss would wait for its timer, whose floor is set for
    /// a host that may not schedule a worker for milliseconds.
    fn stall_probe_at(&self) -> Option<Instant> {
        if self.is_over() {
            return None;
        }
        let pto = self.stall_timeout()?;
        let since = self.progress_at?;
        if self.reports {
            // Spaced by the time without progress, as Queries are (see `spacing`).
            let Some(last) = self.stall_probe_last else {
                return Some(since + pto);
            };
            return Some(last + pto.max(last.saturating_duration_since(since) / 8));
        }
        Some(since + pto.saturating_mul(1 << self.stall_rounds.min(16)))
    }

    /// Sends the stall probe: the [`STALL_PROBE_PACKETS`] oldest unanswered transmissions go
    /// again, if their latest transmission is at least a probe timeout old (and, for a packet
    /// sent more than once, as old as loss detection would wait, see
    /// [`redetect_after`](Self::redetect_after)). When nothing has come back for two round
    /// trips, each unanswered packet either was lost (its data or its result, which this copy
    /// repairs) or waits for another worker's data or repair (this copy is absorbed). Sending
    /// only the oldest few bounds what a stalled worker elsewhere costs the others.
    fn probe_stall(&mut self, now: Instant) {
        let Some(pto) = self.stall_timeout() else {
            return;
        };
        let mut eligible = std::mem::take(&mut self.stall_scratch);
        eligible.clear();
        for slot in &self.slots {
            let Some(out) = slot.outstanding else {
                continue;
            };
            // (A packet already queued for retransmission has no deadline.)
            let queued = out.is_queued();
            let quiet = now - out.last_sent >= pto.max(self.redetect_after(out.retries));
            if !queued && quiet {
                eligible.push((out.last_tx, out.index));
            }
        }
        eligible.sort_unstable();
        for &(_, index) in eligible.iter().take(STALL_PROBE_PACKETS) {
            let slot = self.slot_of(index);
            let Some(out) = self.slots[slot].outstanding else {
                continue;
            };
            if self.give_up_if_spent(now, &out) {
                break;
            }
            self.queue_retransmission(slot, out, Retransmit::StallProbe);
        }
        self.stall_scratch = eligible;
        self.stall_rounds += 1;
        self.stall_probe_last = Some(now);
    }

    /// The tolerance for a first transmission whose loss the switch would report (see
    /// [`Self::tolerates`]), given the reordering `tolerance`: the held reordering plus 3 if
    /// that is larger, up to an eighth of the window; in the stream's last window,
    /// `tolerance`.
    ///
    /// The answers that come back out of order are mostly those of uses that waited for
    /// another worker's repair, and the more workers, the more of them: in a tree of 4 racks
    /// of 32 at 1% loss, a worker asked about 14 000 of its 16 384 packets, 6% of its uplink's
    /// bytes with Ethernet framing. Their first Queries find the data held, and the distance
    /// behind the newest answer at which they were asked (`held_reordering`) is how far such
    /// a use lags. Packets whose loss the switch would report, and whose result's loss the
    /// results' gap counters reveal, can wait that long: a Query about them is almost always
    /// answered "held". The cap keeps a loss that neither reveals (a report lost, a block's
    /// last result in a pass) from waiting much longer than before: at half the window, 2
    /// racks of 8 with 4 MiB tensors lost 0.5 Gbit/s; at an eighth, nothing measurable. And
    /// waiting holds a slot longer: with more than half the window in flight, where slots are
    /// short (a window of about one round trip: 2 racks of 8 with 64-element packets and 1024
    /// slots lost 2.6 Gbit/s of 61), the stream keeps the reordering tolerance.
    fn held_tolerance(&self, tolerance: u64) -> u64 {
        let window = u64::from(self.cfg.lane.window);
        if !self.has(Rule::HeldReordering)
            || self.in_last_window()
            || self.sent_new - self.received > window / 2
        {
            return tolerance;
        }
        let cap = (window / 8).max(3);
        tolerance.max((self.held_reordering + 3).min(cap))
    }

    /// Whether transmission `tx` of `index` waits for the held tolerance (see
    /// [`Self::held_tolerance`]): an unanswered first transmission whose loss the switch
    /// would report.
    fn tolerates(&self, tx: u64, index: u64) -> bool {
        self.slots[self.slot_of(index)]
            .outstanding
            .is_some_and(|o| {
                o.index == index && o.last_tx == tx && o.retries == 0 && self.loss_reportable(&o)
            })
    }

    /// How many transmissions made after an unanswered one must have been answered before
    /// that one counts as lost. Results come back in about the order packets were sent, since
    /// every worker sends in the same order; shards of a software switch, the network and the
    /// repair of another worker's loss may reorder them. The tolerance is three more than the
    /// largest reordering seen on this stream (an answer to a transmission older than one
    /// already answered), and at most half a window. In the stream's last window (fewer than
    /// a window of packets left to send) it is three: few later results are left to wait for,
    /// and a packet held up there holds up the packets of its slot still to come, which
    /// the stream's end waits for. A result that was only late (its use waited for another
    /// worker's repair) costs a 16-byte Query. (Waiting for the last packet to be sent kept
    /// a slot's lost partial sum in a tree for a retransmission timeout: 0.88 of lossless
    /// goodput at 1% loss for 4 racks of 4, against 0.90 with this rule.)
    fn reorder_tolerance(&self) -> u64 {
        let half = (u64::from(self.cfg.lane.window) / 2).max(3);
        let tolerance = (self.reordering + 3).min(half);
        if self.in_last_window() && self.has(Rule::LastWindowTolerance) {
            tolerance.min(3)
        } else {
            tolerance
        }
    }

    /// How long after its `retries`-th retransmission a packet may be found lost again by
    /// answers to later transmissions: the smoothed round trip (at least the clock
    /// granularity), doubled for every retransmission before. An answer to a transmission made
    /// after the retransmission cannot come back sooner than a round trip after it anyway; the
    /// doubling spaces out the copies of a packet whose slot waits for another worker's repair,
    /// so that a slow repair elsewhere does not use up this worker's retries at the pace of
    /// answers.
    fn redetect_after(&self, retries: u32) -> Duration {
        let rtt = self
            .rtt
            .srtt()
            .unwrap_or(Duration::ZERO)
            .max(self.rtt.config().granularity);
        let cap = if self.reports { 2 } else { 16 };
        rtt.saturating_mul(1 << retries.saturating_sub(1).min(cap))
    }

    /// How long an answer to a Query may take: the probe timeout (about two round trips, see
    /// [`probe_timeout`](Self::probe_timeout)), or the retransmission timeout before the
    /// first round-trip sample. The switch answers a Query at once, so no floor for a slow
    /// peer is needed.
    fn query_timeout(&self) -> Duration {
        self.path_timeout()
            .or_else(|| self.probe_timeout())
            .unwrap_or_else(|| self.rtt.rto())
    }

    /// When a packet whose use holds this worker's data (a Pending answer with its bit, at
    /// `now`) is asked about again, in case its result to this worker is lost: a spacing
    /// after the answer. Once every packet has gone, a spacing after the Query it answers
    /// (at once if the answer took longer): the job's end waits for every use, and a result
    /// lost on its way down is found by the next Query only. Measured from the answer, each
    /// round of asking took a round trip more than the spacing. Traced at 4 racks of 32 and
    /// 1% loss (seed 11), a worker's Query found the job's slowest use still waiting for a
    /// lost partial at 1440.2 µs; the total reached the rack at 1436.3 µs and its copy to
    /// this worker was lost. The next Query went at 1450.2 µs, a query timeout after the
    /// answer, and the result came at 1460.3 µs: the job's end. From the Query, it goes at
    /// once (PROTOCOL.md §5, "The tail").
    fn next_ask_after_held(&self, now: Instant, out: &Outstanding) -> Instant {
        let spacing = self.spacing(now, out);
        if self.all_sent() && out.last_was_query && self.has(Rule::AskAgainFromQuery) {
            now.max(out.last_sent + spacing)
        } else {
            now + spacing
        }
    }

    /// How long to wait before asking about `out` again, with Missing reports: the query
    /// timeout, or an eighth of the time the packet has waited since it was first sent if
    /// that is longer. The spacing grows with the time waited, not with the number of
    /// attempts: a repair lost again and again (at 10% loss a use often needs several) is
    /// still retried at round-trip pace, never after a backed-off timer, while a worker that
    /// is gone is asked about ever less often: about `8 ln(give_up / PTO)` times in all
    /// (some 90 Queries for a give-up time of 2 s and a 20 µs round trip).
    fn spacing(&self, now: Instant, out: &Outstanding) -> Duration {
        let waited = now.saturating_duration_since(out.first_sent);
        if !self.has(Rule::SpacingByWait) {
            return self.query_timeout();
        }
        self.query_timeout().max(waited / 8)
    }

    /// Every transmission made more than [`reorder_tolerance`](Self::reorder_tolerance)
    /// transmissions before the latest answered one, and still the latest transmission of an
    /// unanswered packet, was lost: its packet is retransmitted now rather than when its timer
    /// expires. A lost retransmission is detected the same way, by answers to transmissions
    /// made after it, once [`redetect_after`](Self::redetect_after) has passed since it was
    /// sent (until then it waits in `deferred`). The data, another worker's data for the slot,
    /// or the result was lost; a retransmission repairs the first and the last, and the other
    /// worker repairs its own. A packet found lost that has used up its retransmissions or its
    /// give-up time fails the stream, as its timer would.
    fn detect_losses(&mut self, now: Instant) {
        let Some(answered) = self.highest_answered else {
            return;
        };
        // Retransmissions judged too early before, first: they are older.
        let mut deferred = std::mem::take(&mut self.deferred);
        for _ in 0..deferred.len() {
            if let Some((tx, index)) = deferred.pop_front() {
                if self.judge(now, tx, index) {
                    deferred.push_back((tx, index));
                }
            }
        }
        let tolerance = self.reorder_tolerance();
        let upto = answered.saturating_sub(tolerance);
        let upto_held = answered.saturating_sub(self.held_tolerance(tolerance));
        while let Some(&(tx, index)) = self.tolerated.front() {
            if tx >= upto_held {
                break;
            }
            self.tolerated.pop_front();
            if self.judge(now, tx, index) {
                deferred.push_back((tx, index));
            }
        }
        while let Some(&(tx, index)) = self.in_flight.front() {
            if tx >= upto {
                break;
            }
            self.in_flight.pop_front();
            if tx >= upto_held && self.tolerates(tx, index) {
                self.tolerated.push_back((tx, index));
                continue;
            }
            if self.judge(now, tx, index) {
                deferred.push_back((tx, index));
            }
        }
        self.deferred = deferred;
        if self.reports && self.in_last_window() && self.has(Rule::LastWindowTimers) {
            self.arm_reorder_timers(answered);
        }
    }

    /// In the stream's last window, a first transmission older than an answered one but
    /// within the reordering tolerance is judged lost by time (RACK, RFC 8985): when it has
    /// waited the round trip of that answer plus a quarter of the smallest round trip. Few
    /// later answers are left there to count (the last packets have none): without this, a
    /// result lost among the last few waited for a result's timeout, at least twice the
    /// smoothed round trip, which mid-stream queueing inflates. Retransmissions keep their own
    /// pacing (see [`spacing`](Self::spacing)): answers to them are ambiguous, and a repair
    /// that waits for another worker must not be asked about at the pace of other results.
    fn arm_reorder_timers(&mut self, answered: u64) {
        let (Some(rtt), Some(min)) = (self.latest_answer_rtt, self.rtt.min_rtt()) else {
            return;
        };
        let wait = rtt + min / 4;
        for i in 0..self.in_flight.len() {
            let Some(&(tx, index)) = self.in_flight.get(i) else {
                break;
            };
            if tx >= answered {
                break;
            }
            let slot = self.slot_of(index);
            let Some(out) = self.slots[slot].outstanding else {
                continue;
            };
            let queued = out.is_queued();
            if out.index != index || out.last_tx != tx || queued || out.retries > 0 {
                continue;
            }
            let deadline = out.deadline.min(out.last_sent + wait);
            if deadline != out.deadline {
                self.slots[slot].outstanding = Some(Outstanding { deadline, ..out });
                self.timers.push(Reverse((deadline, index)));
            }
        }
    }

    /// Transmission `tx` of packet `index` is older than the loss-detection threshold: queues
    /// the packet's retransmission if `tx` is still its latest transmission and unanswered.
    /// Returns whether it must be judged again later (a retransmission sent too recently).
    fn judge(&mut self, now: Instant, tx: u64, index: u64) -> bool {
        if self.failed.is_some() {
            return false;
        }
        let slot = self.slot_of(index);
        let Some(out) = self.slots[slot].outstanding else {
            return false;
        };
        if out.index != index || out.last_tx != tx {
            // Answered, or sent again since.
            return false;
        }
        if out.retries > 0 && now - out.last_sent < self.redetect_after(out.retries) {
            return true;
        }
        if self.give_up_if_spent(now, &out) {
            return false;
        }
        if self.holds_off(&out) || self.waits_for_counters(&out) {
            let deadline = now + self.query_timeout();
            self.slots[slot].outstanding = Some(Outstanding {
                deadline,
                awaiting_repair: true,
                ..out
            });
            self.timers.push(Reverse((deadline, index)));
            return false;
        }
        self.queue_retransmission(slot, out, Retransmit::Detected);
        false
    }

    /// Queues the next transmission of `out` (in `slot`), one more retry, for the next
    /// `poll_transmit`; `why` says what asked for it.
    fn queue_retransmission(&mut self, slot: usize, out: Outstanding, why: Retransmit) {
        self.slots[slot].outstanding = Some(Outstanding {
            retries: out.retries + 1,
            deadline: QUEUED,
            ..out
        });
        self.retransmit.push_back((out.index, why));
    }

    /// At the stream's end, the first transmission `last` of its block, whose loss no Missing
    /// report could reveal, is taken for lost: so are the reports it would have made. The
    /// packets sent to the block just before it, still unanswered and never sent again, are
    /// asked about at once, up to the reports' longest gap
    /// ([`crate::gap::MAX_REPORTED_GAP`]). The walk stops at one that was answered or sent
    /// again, whose own arrival would have revealed the losses before it. `expired` are
    /// packets whose timers this round handles already.
    ///
    /// The ask is a status Query, even once every packet has gone: it asks whether the data
    /// arrived (a Pending answer without this worker's bit sends it again), and most of these
    /// packets' results are only queued behind others on the downlink, where a fetch's copy
    /// would queue behind them.
    ///
    /// Their timers were a result's timeout, waiting for a report that cannot come: traced at
    /// 32 racks of 32 and 1% loss (seed 6), a worker lost its stream's last two first
    /// transmissions, the last went again 12 µs later, and the one before it only after 79
    /// µs, when the whole job waited for it (86.72 Gbit/s; 968 stall probes).
    fn ask_about_unrevealed_before(&mut self, last: &Outstanding, expired: &[u64]) {
        let block = self.gap_block_of(last.index);
        let earliest = last
            .block_ordinal
            .saturating_sub(u64::from(crate::gap::MAX_REPORTED_GAP));
        for ordinal in (earliest..last.block_ordinal).rev() {
            let Some(index) = self.gap_blocks.get(block).map(|b| b.index_at(ordinal)) else {
                return;
            };
            let Some((slot, out)) = self.outstanding_at(index) else {
                break;
            };
            if out.retries > 0 || out.is_queued() || expired.contains(&index) {
                break;
            }
            self.queue_retransmission(slot, out, Retransmit::Unrevealed);
        }
    }

    /// Whether `out`, found unanswered by order, waits a query timeout before it is asked
    /// about. With Missing reports and other workers in the job, an unanswered first
    /// transmission mid-stream is far more often waiting for another worker's repair (which
    /// the switch has asked for, and which completes the use about a round trip later) than
    /// missing its result; the loss of its own data the switch would have reported. At
    /// n = 32 and 1% loss a quarter of the uses lose some worker's packet, and asking at once
    /// cost each worker a Query for every fifth packet (167 000 Queries in all; 39 000 with
    /// the wait, and the last packet sent 0.3% sooner). A lost result waits a round trip
    /// or two longer, which the window covers. Not held back: a packet of the stream's last
    /// window (the stream's end waits for every one of them), and any packet in a tree (§9
    /// of PROTOCOL.md), where a late result more often waits for the upper switch, whose
    /// losses rank 0's asking repairs, and where a slot held longer holds up every rack:
    /// held back there, 4 racks of 32 reached 0.908 of lossless goodput at 1% loss against
    /// 0.937 (seeds 1-3), and 4 racks of 8 0.944 against 0.951 (seeds 1-6). (Once a tree's
    /// stream has sent every packet, [`waits_for_counters`](Self::waits_for_counters) holds
    /// some packets back there.)
    fn holds_off(&self, out: &Outstanding) -> bool {
        self.has(Rule::HoldOffMidStream)
            && self.reports
            && self.cfg.workers > 1
            && !self.in_tree()
            && out.retries == 0
            && !out.awaiting_repair
            && out.held == Held::Unknown
            && self.loss_reportable(out)
            && !self.in_last_window()
    }

    /// Whether `out`, found unanswered by order in a tree once every packet has gone, waits a
    /// query timeout before it is asked about (as [`holds_off`](Self::holds_off) waits on one
    /// switch mid-stream). A tree's last window of results reaches the workers long after the
    /// sending ends (a use crosses two levels of switches and waits for their repairs), and
    /// the workers' downlinks still carry them: a fetching Query about a packet whose result
    /// is merely queued brings a copy that queues behind it, and every answer and report
    /// queues behind the copies. Here the switch would have reported the loss of the packet's
    /// data, and an older packet of its block is unanswered, so its block has a result due
    /// that would show a lost result of this one by its gap counter; if that result comes
    /// first, the Query goes a query timeout later. Rank 0 of a rack still asks at once: its
    /// Queries are the rack's only timer for a partial or total lost between the switches
    /// (PROTOCOL.md §9). At 4 racks of 32 and 1% loss, 16 MiB, 0.958 of lossless goodput
    /// against 0.952 (seeds 1-3); 4 racks of 8 and of 4 unchanged (seeds 1-12).
    fn waits_for_counters(&self, out: &Outstanding) -> bool {
        // (Following the results' counters implies Missing reports: both need whole blocks.)
        self.has(Rule::TreeWaitsForCounters)
            && self.counts_results()
            && self.in_tree()
            && self.cfg.rank != 0
            && self.all_sent()
            && out.held != Held::No
            && self.loss_reportable(out)
            && self.older_unanswered_in_block(out)
    }

    /// Whether a packet sent before `out` to a slot of the same block is still unanswered.
    fn older_unanswered_in_block(&self, out: &Outstanding) -> bool {
        let block = usize::from(GAP_BLOCK);
        let first = self.gap_block_of(out.index) * block;
        self.slots.get(first..first + block).is_some_and(|slots| {
            slots
                .iter()
                .any(|s| s.outstanding.is_some_and(|o| o.index < out.index))
        })
    }

    /// Whether the job spans more than this worker's switch: a rack of a two-level tree
    /// (PROTOCOL.md §9).
    fn in_tree(&self) -> bool {
        u16::from(self.cfg.workers) < self.cfg.total_workers
    }

    /// Whether the fetch that a status Query's header-only answer asks for (the use is
    /// complete, its result was lost) waits a query timeout. With the results' gap counters
    /// the loss has most likely been reported already, by a later result to the same block,
    /// and the switch's copy is on its way. In a tree, where a packet found unanswered by
    /// order is asked about at once ([`Self::holds_off`]), such Queries race the report, and
    /// fetching at once brought a second copy of most lost results: at 4 racks of 32 and 1%
    /// loss, the workers' downlinks, busy with the multicast results, held 4.8 µs of queue
    /// at the end of sending against 0.9 without the counters, and the stream's end took
    /// 120 µs against 66 (seed 3; 1.3 µs and 87 µs with the wait). On one switch the Query
    /// itself waited a query timeout, and a result still missing then is fetched at once.
    ///
    /// Once every packet has gone, the fetch goes at once. The header-only answers then come
    /// to rank 0's Queries ([`Self::asks_for_partial`]) and to status Queries sent before,
    /// and the job's end waits for every result still missing. At 4 racks of 32 and 1% loss,
    /// this and rank 0's asking give 0.963 of lossless goodput against 0.957 (seeds 1-12);
    /// rank 0's asking with the wait kept gave 92.04 Gbit/s where this gives 92.34 (seeds
    /// 7-12).
    fn defers_fetch(&self) -> bool {
        self.has(Rule::TreeDefersFetch)
            && self.in_tree()
            && self.counts_results()
            && !self.all_sent()
    }

    /// Whether a Query that would fetch the result of a use not yet answered "complete" asks
    /// for the use's state instead, and for its partial sum to be sent up again
    /// ([`QueryAsk::StatusPushingPartial`]): rank 0 of a rack in a tree, once every packet
    /// has gone (PROTOCOL.md §9).
    ///
    /// Rank 0 asks at once about a packet found unanswered by order
    /// ([`Self::waits_for_counters`] holds the other ranks back), and most of the results it
    /// asks about are only queued behind the rack's last results on its downlink: fetching,
    /// each such Query brought a full copy that queued behind them in turn. At 4 racks of 32
    /// and 1% loss (seed 1), rank 0's downlink carried 414 copies from 1380 µs to the
    /// stream's end (rank 1's: 64), and the last total to reach rank 0 waited 22.7 µs in its
    /// queue. Asking for the state, a use waiting for its total still has its partial sent up
    /// at once, and a complete one is answered with its header alone (5 copies), which says
    /// "lost" when its result did not come first.
    fn asks_for_partial(&self) -> bool {
        self.cfg.rank == 0 && self.in_tree() && self.counts_results()
    }

    /// Whether the stream follows the results' gap counters: with Missing reports, on a
    /// lane of whole blocks.
    fn counts_results(&self) -> bool {
        !self.results_seen.is_empty()
    }

    /// Fails the stream if `out` has used up its retransmissions or its give-up time.
    ///
    /// A packet whose data the switch is known to hold is waiting for other workers, and its
    /// Queries are cheap: only the give-up time counts for it. So does, with Missing reports,
    /// a packet last asked about with a Query: Queries are spaced by the time waited, not
    /// backed off per attempt, so a count of them says nothing of how long the switch has
    /// been silent (at the stream's end, where they are spaced by the empty path's round
    /// trip, 30 of them took 4-7 ms, less than a busy host may not run the switch or a rack
    /// switch's upper switch; rank 0 of a rack waiting for a total gets no answer of its
    /// own).
    fn give_up_if_spent(&mut self, now: Instant, out: &Outstanding) -> bool {
        let waited = now - out.first_sent;
        let cheap = self.reports && (out.held == Held::Yes || out.last_was_query);
        let retries_left = out.retries < self.cfg.max_retries || cheap;
        if retries_left && waited < self.cfg.give_up {
            return false;
        }
        let workers = self.cfg.workers;
        let contributors = out.contributors.or_else(|| {
            self.slots
                .iter()
                .filter_map(|s| s.outstanding)
                .filter_map(|o| Some((o.index, o.contributors?)))
                .min_by_key(|(index, _)| *index)
                .map(|(_, bits)| bits)
        });
        self.failed = Some(StreamError::GaveUp {
            seq: (self.cfg.lane.next_position + out.index) as u32,
            retries: out.retries,
            waited,
            missing: contributors.map(|bits| (0..workers).filter(|r| bits >> r & 1 == 0).collect()),
        });
        true
    }

    /// Handles expired timers: queues retransmissions, or fails the stream when a packet has
    /// exhausted its retries or its give-up time.
    ///
    /// Not every expired packet is retransmitted. One whose later packets got their results
    /// was most likely lost, and goes again; so does the oldest expired packet, as a probe.
    /// The others, newer than every result, are most likely waiting for a slower worker's
    /// data rather than lost: their timers are backed off instead, so that one stalled worker
    /// does not make every other worker resend its whole window.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut probe: Option<u64> = None;
        let mut expired = std::mem::take(&mut self.expired_scratch);
        expired.clear();
        while let Some(Reverse((deadline, index))) = self.timers.peek().copied() {
            if deadline > now || self.failed.is_some() {
                break;
            }
            self.timers.pop();
            let slot = self.slot_of(index);
            let Some(out) = self.slots[slot].outstanding else {
                continue;
            };
            if out.index != index || out.deadline != deadline {
                continue;
            }
            if self.give_up_if_spent(now, &out) {
                break;
            }
            probe = Some(probe.map_or(index, |p| p.min(index)));
            expired.push(index);
        }
        if self.failed.is_none() && !expired.is_empty() {
            // The path may be slower than the estimate: back the estimate off (RFC 6298) until
            // an answer to a packet sent once brings a sample. Only data's timers say so: a
            // Query's, or a recheck of data the switch holds, expire by design.
            let data_expired = expired.iter().any(|&index| {
                self.slots[self.slot_of(index)]
                    .outstanding
                    .is_some_and(|o| {
                        !o.awaiting_repair
                            && (!self.reports || (!o.last_was_query && o.held != Held::Yes))
                    })
            });
            if data_expired {
                self.rtt.on_timeout();
            }
            for &index in &expired {
                let slot = self.slot_of(index);
                let Some(out) = self.slots[slot].outstanding else {
                    continue;
                };
                // A Query's answer was due; a recheck of held data is due.
                let unreportable_tail =
                    self.all_sent() && !self.loss_reportable(&out) && self.has(Rule::TailTimers);
                let lost = Some(index) == probe
                    || out.awaiting_repair
                    || (self.reports
                        && (out.last_was_query || out.held == Held::Yes || unreportable_tail))
                    || self.highest_answered.is_some_and(|h| h > out.last_tx);
                if lost {
                    let why = if out.awaiting_repair {
                        Retransmit::Detected
                    } else if self.reports && out.held == Held::Yes {
                        Retransmit::Recheck
                    } else {
                        Retransmit::Timer
                    };
                    self.queue_retransmission(slot, out, why);
                    if unreportable_tail && out.retries == 0 && self.has(Rule::UnrevealedBefore) {
                        self.ask_about_unrevealed_before(&out, &expired);
                    }
                } else {
                    let deadline = now + self.rtt.backed_off(out.retries + 1);
                    self.slots[slot].outstanding = Some(Outstanding { deadline, ..out });
                    self.timers.push(Reverse((deadline, index)));
                }
            }
        }
        self.expired_scratch = expired;
        if self.failed.is_none() && self.redetect_at().is_some_and(|t| t <= now) {
            self.detect_losses(now);
        }
        if self.failed.is_none() && self.stall_probe_at().is_some_and(|t| t <= now) {
            self.probe_stall(now);
        }
    }
}

/// Default RTO settings for streams.
pub fn default_rto() -> RtoConfig {
    RtoConfig::default()
}
