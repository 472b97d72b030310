//! The gap counters (PROTOCOL.md §5, "Missing reports"): the numbering of a lane's first
//! transmissions per block, which lets the switch report this worker's lost data, and of the
//! switch's results per block, which lets the worker report a lost result.

use super::slots::Outstanding;
use super::Stream;
use ina_wire::agg::{GAP_BLOCK, GAP_COUNTER};
use std::collections::VecDeque;

/// How many of a block's latest first transmissions a Missing report can name.
const HISTORY: usize = GAP_COUNTER as usize;

/// The gap counters a stream keeps; every vector is empty without Missing reports (see
/// [`super::StreamConfig::gap_reports`]).
#[derive(Debug)]
pub(super) struct GapCounters {
    /// Per gap-tracking block of the lane, its first transmissions.
    pub(super) blocks: Vec<BlockTx>,
    /// Per gap-tracking block, the latest gap counter of a multicast result plus
    /// [`GAP_COUNTER`] (0: none yet); empty unless the stream follows the results' counters.
    pub(super) results_seen: Vec<u32>,
    /// Results found lost by their counters, to report: `(a slot of the block, counter)`.
    pub(super) reports: VecDeque<(u16, u8)>,
}

/// The first transmissions to one block of [`GAP_BLOCK`] slots of the lane, counted over the
/// lane's life as the switch's register counts them.
#[derive(Debug)]
pub(super) struct BlockTx {
    /// First transmissions to the block so far, on the lane.
    pub(super) sent: u64,
    /// The packet index of each of the latest [`HISTORY`] first transmissions, at its number
    /// modulo [`HISTORY`] (`u64::MAX`: none).
    recent: [u64; HISTORY],
}

impl BlockTx {
    pub(super) fn new(sent: u64) -> BlockTx {
        BlockTx {
            sent,
            recent: [u64::MAX; HISTORY],
        }
    }

    /// Notes packet `index` as the block's next first transmission; returns its number.
    pub(super) fn push(&mut self, index: u64) -> u64 {
        let ordinal = self.sent;
        self.recent[ordinal as usize % HISTORY] = index;
        self.sent += 1;
        ordinal
    }

    /// The packet of first transmission number `ordinal` if it is among the latest
    /// [`HISTORY`], else `u64::MAX`.
    pub(super) fn index_at(&self, ordinal: u64) -> u64 {
        if ordinal >= self.sent || self.sent - ordinal > HISTORY as u64 {
            return u64::MAX;
        }
        self.recent[ordinal as usize % HISTORY]
    }
}

impl<'a> Stream<'a> {
    /// The gap-tracking block (of [`GAP_BLOCK`] slots of the lane) of packet `index`.
    pub(super) fn gap_block_of(&self, index: u64) -> usize {
        self.slot_of(index) / usize::from(GAP_BLOCK)
    }

    /// Whether the switch would have reported the loss of `out`'s first transmission: a later
    /// first transmission to the same block has been sent.
    pub(super) fn loss_reportable(&self, out: &Outstanding) -> bool {
        self.gaps
            .blocks
            .get(self.gap_block_of(out.index))
            .is_some_and(|b| b.sent > out.block_ordinal + 1)
    }

    /// A multicast result's gap counter (PROTOCOL.md §5, "Lost results"; RECOVERY.md R11): each
    /// skipped counter is queued to be reported. `slot` is the lane's index of the result's
    /// slot, `switch_slot` the switch's.
    pub(super) fn note_result_counter(&mut self, switch_slot: u16, slot: usize, counter: u8) {
        let Some(latest) = self
            .gaps
            .results_seen
            .get_mut(slot / usize::from(GAP_BLOCK))
        else {
            return;
        };
        if let Some((first, skipped)) = crate::gap::take_counter(latest, counter) {
            // Bounded, should `poll_transmit` never be called.
            let room = self.gaps.results_seen.len() * crate::gap::MAX_REPORTED_GAP as usize;
            let free = room.saturating_sub(self.gaps.reports.len());
            let named = (0..skipped)
                .take(free)
                .map(|k| (switch_slot, (first + k) % GAP_COUNTER));
            self.gaps.reports.extend(named);
        }
    }

    /// Whether the stream follows the results' gap counters (R11; implies Missing reports).
    pub(super) fn counts_results(&self) -> bool {
        !self.gaps.results_seen.is_empty()
    }
}
