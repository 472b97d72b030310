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
//! # Schedule (PROTOCOL.md §5)
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

mod config;
mod gaps;
mod packets;
pub mod recovery;
mod results;
mod slots;
mod tensor;

pub use config::{default_rto, Lane, StreamConfig, StreamError, StreamStats};
pub use recovery::{Rule, Rules};
pub use tensor::{Elements, ElementsMut, Source, Tensor};

use gaps::{BlockTx, REPORT_HISTORY};
use recovery::Retransmit;
use slots::{Held, Outstanding, SlotState};

use crate::descriptor::Descriptor;
use crate::quant::{self};
use crate::rtt::RttEstimator;
use crate::window::WindowControl;
use crate::Instant;
use core::cmp::Reverse;
use core::time::Duration;
use ina_wire::agg::{GAP_BLOCK, GAP_COUNTER};
use ina_wire::{AggRepr, MessageType, RejectReason, HEADER_LEN};
use std::collections::{BinaryHeap, VecDeque};

/// Packets of the descriptor at the start of every stream (PROTOCOL.md §5, "The descriptor").
pub const DESCRIPTOR_PACKETS: u64 = 1;

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
    /// The smallest round trip of an answer to a packet's only retransmission (unambiguous).
    path_min: Option<Duration>,
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
            path_min: None,
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
        if let Some(len) = self.poll_retransmit(now, buf) {
            return Ok(Some(len));
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
            self.arm_tail_timers();
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
}
