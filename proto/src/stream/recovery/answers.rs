//! The switch's answers that steer recovery: Pending (does the switch hold this worker's
//! data?) and Missing reports (which first transmissions never arrived).

use crate::stream::recovery::Retransmit;
use crate::stream::slots::{Held, Outstanding};
use crate::stream::Stream;
use crate::Instant;
use core::cmp::Reverse;
use ina_wire::agg::{PendingInfo, GAP_BLOCK, GAP_COUNTER};
use ina_wire::AggRepr;

impl<'a> Stream<'a> {
    /// A Pending answer: the switch's use of the slot is still collecting, and its bitmap says
    /// whether it holds this worker's data. If it does, further retransmissions are Queries;
    /// if not, the data goes again now (unless data was sent after the Query this answers).
    pub(in crate::stream) fn handle_pending(
        &mut self,
        now: Instant,
        hdr: &AggRepr,
        payload: &[u8],
    ) {
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

    /// A Missing report (E6): the switch never got `hdr.exponent` first transmissions to the block
    /// of `hdr.slot`, numbered from the report's gap counter on. Each of the latest first
    /// transmissions with those counters, still unanswered, not known held and not resent since,
    /// goes again now.
    pub(in crate::stream) fn handle_missing(&mut self, now: Instant, hdr: &AggRepr) {
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
    }
}
