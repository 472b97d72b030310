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
    /// A Pending answer: the use of the slot is still collecting. With this worker's bit, ask
    /// again a spacing later (E4); without, the data goes again now (E5), unless data was sent
    /// after the Query this answers.
    pub(in crate::stream) fn handle_pending(
        &mut self,
        now: Instant,
        hdr: &AggRepr,
        payload: &[u8],
    ) {
        let (Some((slot, out)), Ok(info)) = (self.answered(hdr), PendingInfo::parse(payload))
        else {
            self.stats.duplicate_results += 1;
            return;
        };
        self.stats.pending_answers += 1;
        if out.retries > 0 {
            self.on_path_sample(now, &out);
        }
        let out = Outstanding {
            contributors: Some(info.bitmap),
            ..out
        };
        self.slots[slot].outstanding = Some(out);
        if info.has(self.cfg.rank) {
            // The first Query about it found it held (R1, `held-reordering`).
            if let (true, Some(h)) = (
                out.retries == 1 && out.last_was_query,
                self.loss.highest_answered,
            ) {
                self.loss.held_reordering = self
                    .loss
                    .held_reordering
                    .max(h.saturating_sub(out.first_tx));
            }
            let queued = out.is_queued() || !self.reports();
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
        } else if out.last_was_query {
            self.resend_data(now, slot, out, Retransmit::Missing);
        }
    }

    /// A Missing report (E6): the switch never got `hdr.exponent` first transmissions to the
    /// block of `hdr.slot`, numbered from the report's gap counter on. Each of the latest first
    /// transmissions with those counters, still unanswered, not known held and not resent since,
    /// goes again now.
    pub(in crate::stream) fn handle_missing(&mut self, now: Instant, hdr: &AggRepr) {
        let block = hdr
            .slot
            .checked_sub(self.cfg.lane.slot_base)
            .map(|s| usize::from(s / GAP_BLOCK))
            .filter(|b| {
                *b < self.gaps.blocks.len() && hdr.epoch == self.cfg.epoch && hdr.count == 0
            });
        let (Some(first), Some(block)) = (hdr.gap, block) else {
            self.stats.foreign += 1;
            return;
        };
        let counters = u64::from(GAP_COUNTER);
        let latest = self.gaps.blocks[block].sent.saturating_sub(1);
        for k in 0..u64::from(hdr.exponent.min(GAP_COUNTER - 1)) {
            let counter = (u64::from(first) + k) % counters;
            let index = latest
                .checked_sub((latest + counters - counter) % counters)
                .map_or(u64::MAX, |o| self.gaps.blocks[block].index_at(o));
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
