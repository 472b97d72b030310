//! Loss detection by order (docs/design/RECOVERY.md E2, R1): a transmission further behind
//! the newest answered one than the reordering tolerance is taken for lost.

use crate::stream::recovery::{Retransmit, Rule};
use crate::stream::slots::Outstanding;
use crate::stream::Stream;
use crate::Instant;
use core::cmp::Reverse;
use core::time::Duration;

impl<'a> Stream<'a> {
    /// When the earliest retransmission waiting in `deferred` may be judged lost again
    /// (without waiting for another answer to come).
    pub(in crate::stream) fn redetect_at(&self) -> Option<Instant> {
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

    /// The tolerance for a first transmission whose loss the switch would report, given the
    /// reordering `tolerance` (R1, `held-reordering`): `held_reordering + 3` if larger, at most an
    /// eighth of the window. Late answers are mostly uses held up by another worker's repair, and
    /// such a packet's loss the switch or the results' counters would reveal. Not in the last
    /// window, nor with more than half the window in flight, where a slot held longer costs more
    /// than a Query.
    pub(in crate::stream) fn held_tolerance(&self, tolerance: u64) -> u64 {
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
    pub(in crate::stream) fn tolerates(&self, tx: u64, index: u64) -> bool {
        self.slots[self.slot_of(index)]
            .outstanding
            .is_some_and(|o| {
                o.index == index && o.last_tx == tx && o.retries == 0 && self.loss_reportable(&o)
            })
    }

    /// How many later transmissions must have been answered before an unanswered one counts as
    /// lost (R1): three more than the largest reordering seen, at most half the window; with
    /// `last-window-tolerance`, at most 3 in the last window, where few later results are left
    /// and the stream's end waits for every packet.
    pub(in crate::stream) fn reorder_tolerance(&self) -> u64 {
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
    pub(in crate::stream) fn redetect_after(&self, retries: u32) -> Duration {
        let rtt = self
            .rtt
            .srtt()
            .unwrap_or(Duration::ZERO)
            .max(self.rtt.config().granularity);
        let cap = if self.reports { 2 } else { 16 };
        rtt.saturating_mul(1 << retries.saturating_sub(1).min(cap))
    }

    /// Loss detection by order (E2): every transmission more than the tolerance behind the newest
    /// answered one, and still its packet's latest, is judged (see [`Self::judge`]). A
    /// retransmission is judged again only after [`Self::redetect_after`] (R2; until then it waits
    /// in `deferred`).
    pub(in crate::stream) fn detect_losses(&mut self, now: Instant) {
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
    }

    /// Transmission `tx` of packet `index` is older than the loss-detection threshold: queues
    /// the packet's retransmission if `tx` is still its latest transmission and unanswered.
    /// Returns whether it must be judged again later (a retransmission sent too recently).
    pub(in crate::stream) fn judge(&mut self, now: Instant, tx: u64, index: u64) -> bool {
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
}
