//! The gap counters (PROTOCOL.md §5, "Missing reports"): the numbering of a lane's first
//! transmissions per block, which lets the switch report this worker's lost data, and of the
//! switch's results per block, which lets the worker report a lost result.

use super::slots::Outstanding;
use super::Stream;
use ina_wire::agg::{GAP_BLOCK, GAP_COUNTER};

/// The first transmissions to one block of [`GAP_BLOCK`] slots of a stream's lane, for the
/// switch's Missing reports: each carries its number modulo [`GAP_COUNTER`], counted over the
/// lane's life (a new stream continues where the one before it stopped, as the switch's
/// register does).
#[derive(Debug, Clone)]
pub(super) struct BlockTx {
    /// First transmissions to the block so far, on the lane.
    pub(super) sent: u64,
    /// The packet index of each of the block's latest [`REPORT_HISTORY`] first transmissions,
    /// at its number modulo [`REPORT_HISTORY`].
    pub(super) recent: Box<[u64]>,
}

impl BlockTx {
    /// Notes packet `index` as the block's first transmission number `ordinal`.
    pub(super) fn record(&mut self, ordinal: u64, index: u64) {
        if let Some(at) = self.recent.get_mut(ordinal as usize % REPORT_HISTORY) {
            *at = index;
        }
    }

    /// The packet of the block's first transmission number `ordinal`, if it is still among
    /// the latest [`REPORT_HISTORY`] (`u64::MAX` otherwise, or if none was recorded there).
    pub(super) fn index_at(&self, ordinal: u64) -> u64 {
        if ordinal >= self.sent || self.sent - ordinal > REPORT_HISTORY as u64 {
            return u64::MAX;
        }
        self.recent
            .get(ordinal as usize % REPORT_HISTORY)
            .copied()
            .unwrap_or(u64::MAX)
    }
}

/// How many of a block's latest first transmissions a Missing report can name: one counter's
/// range, since a counter names the latest first transmission that carried it.
pub(super) const REPORT_HISTORY: usize = GAP_COUNTER as usize;

impl<'a> Stream<'a> {
    /// The gap-tracking block (of [`GAP_BLOCK`] slots of the lane) of packet `index`.
    pub(super) fn gap_block_of(&self, index: u64) -> usize {
        self.slot_of(index) / usize::from(GAP_BLOCK)
    }

    /// Whether the switch would have reported the loss of `out`'s first transmission: a later
    /// first transmission to the same block has been sent.
    pub(super) fn loss_reportable(&self, out: &Outstanding) -> bool {
        self.gap_blocks
            .get(self.gap_block_of(out.index))
            .is_some_and(|b| b.sent > out.block_ordinal + 1)
    }

    /// A multicast result's gap counter (PROTOCOL.md §5, "Lost results"): the switch numbers
    /// the results it multicasts per block, and every worker of the job receives them in that
    /// order. Counters skipped (1 to [`crate::gap::MAX_REPORTED_GAP`], by the rule of
    /// the switch's gap register) are results lost on the way here: each is reported at
    /// once, in a Missing of its own, and the switch answers with its stored copy. `slot` is
    /// the lane's index of the result's slot, `switch_slot` the switch's.
    pub(super) fn note_result_counter(&mut self, switch_slot: u16, slot: usize, counter: u8) {
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

    /// Whether the stream follows the results' gap counters: with Missing reports, on a
    /// lane of whole blocks.
    pub(super) fn counts_results(&self) -> bool {
        !self.results_seen.is_empty()
    }
}
