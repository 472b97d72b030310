//! Loss detection by order (docs/design/RECOVERY.md E2, R1): a transmission further behind
//! the newest answered one than the reordering tolerance is taken for lost.

use crate::stream::recovery::{Retransmit, Rule};
use crate::stream::slots::Outstanding;
use crate::stream::Stream;
use crate::Instant;
use core::cmp::Reverse;
use core::time::Duration;
use std::collections::VecDeque;

/// The order of transmissions and answers, from which losses are found.
#[derive(Debug, Default)]
pub(in crate::stream) struct LossDetection {
    /// Transmissions so far, first ones and retransmissions: numbers them in sending order.
    pub(in crate::stream) transmissions: u64,
    /// `(transmission, packet index)` of every transmission not yet examined, oldest first.
    pub(in crate::stream) in_flight: VecDeque<(u64, u64)>,
    /// Retransmissions past the threshold but sent too recently to be judged lost yet (R2).
    pub(in crate::stream) deferred: VecDeque<(u64, u64)>,
    /// The latest transmission known to have been answered.
    pub(in crate::stream) highest_answered: Option<u64>,
    /// The smallest round trip of an answer to a packet's only retransmission.
    pub(in crate::stream) path_min: Option<Duration>,
    /// The largest distance, in transmissions, by which an answer came back behind a newer one.
    pub(in crate::stream) reordering: u64,
    /// The largest distance behind the newest answer at which a packet was asked about and
    /// found held (R1, `held-reordering`).
    pub(in crate::stream) held_reordering: u64,
    /// First transmissions past the reordering tolerance but within the held one.
    pub(in crate::stream) tolerated: VecDeque<(u64, u64)>,
}

impl<'a> Stream<'a> {
    /// When the earliest retransmission waiting in `deferred` may be judged again.
    pub(in crate::stream) fn redetect_at(&self) -> Option<Instant> {
        if !self.reports() {
            return None;
        }
        self.loss
            .deferred
            .iter()
            .filter_map(|&(tx, index)| self.unanswered_tx(tx, index))
            .map(|(_, out)| out.last_sent + self.redetect_after(out.retries))
            .min()
    }

    /// Packet `index`'s slot and state, if transmission `tx` is its latest and unanswered.
    fn unanswered_tx(&self, tx: u64, index: u64) -> Option<(usize, Outstanding)> {
        self.outstanding_at(index).filter(|(_, o)| o.last_tx == tx)
    }

    /// The tolerance for a first transmission whose loss the switch would report, given the
    /// reordering `tolerance` (R1, `held-reordering`).
    pub(super) fn held_tolerance(&self, tolerance: u64) -> u64 {
        let window = u64::from(self.cfg.lane.window);
        if !self.has(Rule::HeldReordering)
            || self.in_last_window()
            || self.sent_new - self.received > window / 2
        {
            return tolerance;
        }
        let cap = (window / 8).max(3);
        tolerance.max((self.loss.held_reordering + 3).min(cap))
    }

    /// Whether transmission `tx` of `index` waits for the held tolerance: an unanswered first
    /// transmission whose loss the switch would report.
    pub(super) fn tolerates(&self, tx: u64, index: u64) -> bool {
        self.unanswered_tx(tx, index)
            .is_some_and(|(_, o)| o.retries == 0 && self.loss_reportable(&o))
    }

    /// How many later transmissions must have been answered before an unanswered one counts as
    /// lost (R1, with `last-window-tolerance`).
    pub(super) fn reorder_tolerance(&self) -> u64 {
        let half = (u64::from(self.cfg.lane.window) / 2).max(3);
        let tolerance = (self.loss.reordering + 3).min(half);
        if self.in_last_window() && self.has(Rule::LastWindowTolerance) {
            tolerance.min(3)
        } else {
            tolerance
        }
    }

    /// How long after its `retries`-th retransmission a packet may be found lost again by
    /// order (R2).
    pub(super) fn redetect_after(&self, retries: u32) -> Duration {
        let granularity = self.rtt.config().granularity;
        let rtt = self.rtt.srtt().map_or(granularity, |s| s.max(granularity));
        let cap = if self.reports() { 2 } else { 16 };
        rtt.saturating_mul(1 << retries.saturating_sub(1).min(cap))
    }

    /// Loss detection by order (E2): judges every transmission more than the tolerance behind
    /// the newest answered one.
    pub(in crate::stream) fn detect_losses(&mut self, now: Instant) {
        let Some(answered) = self.loss.highest_answered else {
            return;
        };
        // Retransmissions judged too early before, first: they are older.
        let mut deferred = std::mem::take(&mut self.loss.deferred);
        deferred.retain(|&(tx, index)| self.judge(now, tx, index));
        let tolerance = self.reorder_tolerance();
        let upto = answered.saturating_sub(tolerance);
        let upto_held = answered.saturating_sub(self.held_tolerance(tolerance));
        while let Some(&(tx, index)) = self.loss.tolerated.front() {
            if tx >= upto_held {
                break;
            }
            self.loss.tolerated.pop_front();
            if self.judge(now, tx, index) {
                deferred.push_back((tx, index));
            }
        }
        while let Some(&(tx, index)) = self.loss.in_flight.front() {
            if tx >= upto {
                break;
            }
            self.loss.in_flight.pop_front();
            if tx >= upto_held && self.tolerates(tx, index) {
                self.loss.tolerated.push_back((tx, index));
                continue;
            }
            if self.judge(now, tx, index) {
                deferred.push_back((tx, index));
            }
        }
        self.loss.deferred = deferred;
    }

    /// Transmission `tx` of packet `index` is past the threshold: if it is still the packet's
    /// latest and unanswered, the packet goes again or waits (R3, R4). Returns whether it must
    /// be judged again later (a retransmission sent too recently, R2).
    pub(super) fn judge(&mut self, now: Instant, tx: u64, index: u64) -> bool {
        if self.failed.is_some() {
            return false;
        }
        let Some((slot, out)) = self.unanswered_tx(tx, index) else {
            return false;
        };
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
