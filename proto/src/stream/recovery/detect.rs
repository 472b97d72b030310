//! Loss detection by order (docs/design/RECOVERY.md, rule D): a transmission further behind
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

    /// Every transmission made more than [`reorder_tolerance`](Self::reorder_tolerance)
    /// transmissions before the latest answered one, and still the latest transmission of an
    /// unanswered packet, was lost: its packet is retransmitted now rather than when its timer
    /// expires. A lost retransmission is detected the same way, by answers to transmissions
    /// made after it, once [`redetect_after`](Self::redetect_after) has passed since it was
    /// sent (until then it waits in `deferred`). The data, another worker's data for the slot,
    /// or the result was lost; a retransmission repairs the first and the last, and the other
    /// worker repairs its own. A packet found lost that has used up its retransmissions or its
    /// give-up time fails the stream, as its timer would.
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
    pub(in crate::stream) fn arm_reorder_timers(&mut self, answered: u64) {
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
