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
//! The stream's packets occupy consecutive positions `g` of a [`Lane`] of `W` slots: packet at
//! position `g` goes to slot `slot_base + g mod W`, shadow set `(g / W) mod 2`, with sequence
//! number `g mod 2^32`. Packet `i` is sent once the result of the packet before it on the same
//! slot has come back, so at most `W` packets are in flight; the smallest free packet goes first.
//!
//! A float32 tensor of `B` blocks uses the exponent lookahead with distance
//! `L = min(max(W - 1, 1), B)`: packet `i` carries the exponent byte of block `i` (for `i < B`)
//! and the data of block `i - L` (for `i >= L`), quantized with the exponent that the result of
//! packet `i - L` agreed; the first `L` packets are header-only. An int32 tensor's packet `i`
//! carries block `i`. (`i` counts the packets after the descriptor, which goes first.) A short
//! last block is padded with zeros.

mod config;
mod gaps;
mod packets;
pub mod recovery;
mod results;
mod slots;
mod tensor;

pub use config::{Lane, StreamConfig, StreamError, StreamStats};
pub use recovery::{Rule, Rules};
pub use tensor::{Elements, ElementsMut, Source, Tensor};

use gaps::{BlockTx, GapCounters};
use recovery::{LossDetection, Retransmit, Stall};
use slots::{Held, Outstanding, SlotState};

use crate::descriptor::Descriptor;
use crate::quant::{self};
use crate::rtt::RttEstimator;
use crate::window::WindowControl;
use crate::Instant;
use core::cmp::Reverse;
use ina_wire::agg::{GAP_BLOCK, GAP_COUNTER};
use ina_wire::{AggRepr, MessageType, RejectReason, HEADER_LEN};
use std::collections::{BTreeSet, BinaryHeap, VecDeque};

/// Packets of the descriptor at the start of every stream (PROTOCOL.md §5, "The descriptor").
pub const DESCRIPTOR_PACKETS: u64 = 1;

/// One all-reduce of one tensor.
#[derive(Debug)]
pub struct Stream<'a> {
    cfg: StreamConfig,
    tensor: Tensor<'a>,
    /// The tensor's blocks the stream carries, in order (a [`Tensor::Blocks`]); empty: all.
    block_map: Vec<usize>,
    /// Elements the stream carries.
    elements: usize,
    blocks: u64,
    lookahead: u64,
    packets: u64,
    /// Packets sent for the first time so far.
    sent_new: u64,
    /// Packets not yet sent whose slot is free, smallest index first.
    ready: BinaryHeap<Reverse<u64>>,
    /// Packets whose slot is free but whose exponent has not come back yet.
    parked: BTreeSet<u64>,
    slots: Vec<SlotState>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Packets to send again, and what asked for it.
    retransmit: VecDeque<(u64, Retransmit)>,
    /// The order of transmissions and answers that finds losses (R1, R2).
    loss: LossDetection,
    /// Progress, and the stall probe rounds since (E9).
    stall: Stall,
    /// The agreed exponents of the lookahead's blocks, by block modulo `lookahead`.
    exps: Vec<u8>,
    /// One block of a generated tensor's elements (empty for the others).
    scratch: Vec<f32>,
    /// When the count of packets in flight last changed; `None` before the first transmission.
    occupancy_at: Option<Instant>,
    /// The gap counters of Missing reports and of the results (empty without reports).
    gaps: GapCounters,
    received: u64,
    poisoned: Option<u64>,
    failed: Option<StreamError>,
    rtt: RttEstimator,
    /// Round trips of the switch's immediate answers (Pending, and the header-only answer of a
    /// status Query): the path alone.
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
        let elements = tensor.len();
        let (tensor, block_map) = match tensor {
            Tensor::Blocks {
                of,
                blocks,
                elems_per_block,
            } => {
                let last = of.len().div_ceil(elems_per_block.max(1));
                if elems_per_block != usize::from(cfg.elems_per_packet) {
                    return Err(StreamError::Config(
                        "a block map's blocks must be the stream's packets",
                    ));
                }
                if blocks.windows(2).any(|w| w[0] >= w[1])
                    || blocks.last().is_some_and(|b| *b >= last)
                {
                    return Err(StreamError::Config(
                        "a block map must name blocks of the tensor in increasing order",
                    ));
                }
                (*of, blocks)
            }
            t => (t, Vec::new()),
        };
        let blocks = (elements as u64).div_ceil(e);
        let window = u64::from(cfg.lane.window);
        // The descriptor and the lookahead's headers fill the first window together.
        let lookahead = if tensor.is_float() {
            window.saturating_sub(DESCRIPTOR_PACKETS).max(1).min(blocks)
        } else {
            0
        };
        let packets = DESCRIPTOR_PACKETS + blocks + lookahead;
        let block = u64::from(GAP_BLOCK);
        let reports =
            cfg.gap_reports && u64::from(cfg.lane.slot_base) % block == 0 && window % block == 0;
        // The counters continue the lane's earlier streams: every position of the lane so far
        // was sent once for the first time, in its block.
        let used = cfg.lane.next_position.saturating_sub(window);
        let (cycles, rest) = (used / window, used % window);
        let blocks_tx: Vec<BlockTx> = (0..window / block)
            .filter(|_| reports)
            .map(|b| BlockTx::new(cycles * block + rest.saturating_sub(b * block).min(block)))
            .collect();
        let counts_results = cfg.rules.has(Rule::ResultCounters);
        Ok(Stream {
            scratch: match tensor {
                Tensor::Generated(_) => vec![0.0; usize::from(cfg.elems_per_packet)],
                _ => Vec::new(),
            },
            occupancy_at: None,
            gaps: GapCounters {
                results_seen: vec![0; if counts_results { blocks_tx.len() } else { 0 }],
                reports: VecDeque::new(),
                blocks: blocks_tx,
            },
            ready: (0..packets.min(window)).map(Reverse).collect(),
            parked: BTreeSet::new(),
            slots: vec![SlotState::default(); usize::from(cfg.lane.window)],
            exps: vec![0; lookahead as usize],
            cfg,
            tensor,
            block_map,
            elements,
            blocks,
            lookahead,
            packets,
            sent_new: 0,
            timers: BinaryHeap::new(),
            retransmit: VecDeque::new(),
            loss: LossDetection::default(),
            stall: Stall::default(),
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

    /// Keeps at most `control`'s window of packets in flight (see [`crate::window`]); carry it
    /// from stream to stream with [`Self::window_control`]. `None` keeps every slot busy.
    pub fn set_window_control(&mut self, control: Option<WindowControl>) {
        self.window = control;
    }

    /// The window control, as the stream left it.
    pub fn window_control(&self) -> Option<&WindowControl> {
        self.window.as_ref()
    }

    /// Ends the stream and hands back the tensor (holding the result if the stream finished;
    /// the whole tensor of a [`Tensor::Blocks`]).
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
        let (float, support) = match self.tensor {
            Tensor::Support(_, of_float) => (of_float, true),
            ref t => (t.is_float(), false),
        };
        Descriptor {
            elements: self.elements as u64,
            float,
            support,
            total_workers: self.cfg.total_workers,
        }
    }

    fn slot_of(&self, index: u64) -> usize {
        ((self.cfg.lane.next_position + index) % u64::from(self.cfg.lane.window)) as usize
    }

    /// The block whose data packet `index` carries.
    fn data_block(&self, index: u64) -> Option<u64> {
        self.body(index)?.checked_sub(self.lookahead)
    }

    /// The block whose exponent byte packet `index` carries.
    fn exponent_block(&self, index: u64) -> Option<u64> {
        self.body(index)
            .filter(|b| self.tensor.is_float() && *b < self.blocks)
    }

    fn result_received(&self, index: u64) -> bool {
        self.slots[self.slot_of(index)]
            .done_upto
            .is_some_and(|d| d >= index)
    }

    fn block_range(&self, block: u64) -> core::ops::Range<usize> {
        let e = usize::from(self.cfg.elems_per_packet);
        let block = self
            .block_map
            .get(block as usize)
            .map_or(block as usize, |b| *b);
        let start = block * e;
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
        let block_ordinal = self
            .gaps
            .blocks
            .get_mut(slot / usize::from(GAP_BLOCK))
            .map(|b| b.push(index));
        self.slots[slot].outstanding = Some(Outstanding {
            index,
            first_sent: now,
            deadline,
            retries: 0,
            data_retries: 0,
            last_tx,
            first_tx: last_tx,
            block_ordinal: block_ordinal.unwrap_or(0),
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
        self.stall.progress_at = Some(now);
        if self.reports() && self.sent_new == self.packets {
            self.arm_tail_timers();
        }
        if self.tensor.is_float() && self.has(Rule::LookaheadCopies) {
            // R8: the first window's headers are copied once the last of them has gone; a
            // header that waited for a slot (behind the descriptor) is copied as it goes.
            let headers_end = DESCRIPTOR_PACKETS + self.lookahead;
            let first_window = u64::from(self.cfg.lane.window).min(self.packets);
            if index + 1 == headers_end.min(first_window) {
                self.retransmit
                    .extend((DESCRIPTOR_PACKETS..=index).map(|i| (i, Retransmit::LookaheadCopy)));
            } else if (first_window..headers_end).contains(&index) {
                self.retransmit
                    .push_back((index, Retransmit::LookaheadCopy));
            }
        }
        let gap = block_ordinal.map(|o| (o % u64::from(GAP_COUNTER)) as u8);
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
        let tx = self.loss.transmissions;
        self.loss.transmissions += 1;
        self.loss.in_flight.push_back((tx, index));
        tx
    }

    /// Whether the switch answers this stream's data with Missing reports.
    fn reports(&self) -> bool {
        !self.gaps.blocks.is_empty()
    }

    /// Whether fewer than a window of packets are left to send for the first time.
    fn in_last_window(&self) -> bool {
        self.sent_new + u64::from(self.cfg.lane.window) >= self.packets
    }

    /// Whether the stream follows `rule`.
    fn has(&self, rule: Rule) -> bool {
        self.cfg.rules.has(rule)
    }

    /// Whether every packet of the stream has had its first transmission: the stream's end.
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
                // Only a refusal of a packet this stream has outstanding counts.
                let slot = hdr.slot.checked_sub(self.cfg.lane.slot_base);
                let out = slot.and_then(|s| self.slots.get(usize::from(s))?.outstanding);
                let ours = out.is_some_and(|o| self.header_of(o.index, hdr.kind).seq == hdr.seq);
                if self.failed.is_some() || !ours {
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

    /// The lane's slot and the outstanding packet that `hdr` answers: the header names the
    /// packet's slot, set, sequence number and epoch.
    fn answered(&self, hdr: &AggRepr) -> Option<(usize, Outstanding)> {
        let slot = usize::from(hdr.slot.checked_sub(self.cfg.lane.slot_base)?);
        let out = self.slots.get(slot)?.outstanding?;
        let ours = self.header_of(out.index, hdr.kind);
        let matches = hdr.epoch == ours.epoch && hdr.seq == ours.seq && hdr.set == ours.set;
        matches.then_some((slot, out))
    }

    /// The lane's slot of packet `index` and its outstanding transmission, if it is still
    /// unanswered.
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
        // Drops the timers that no longer apply.
        let mut timer = None;
        while let Some(&Reverse((deadline, index))) = self.timers.peek() {
            if self
                .outstanding_at(index)
                .is_some_and(|(_, o)| o.deadline == deadline)
            {
                timer = Some(deadline);
                break;
            }
            self.timers.pop();
        }
        [timer, self.stall_probe_at(), self.redetect_at()]
            .into_iter()
            .flatten()
            .min()
    }
}
