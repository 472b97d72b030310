//! Timers and the stall probe: what happens when time passes without answers.

use crate::stream::recovery::{Retransmit, Rule};
use crate::stream::slots::{Held, Outstanding};
use crate::stream::Stream;
use crate::Instant;
use core::cmp::Reverse;

/// How many unanswered packets one stall probe round sends at most.
pub(in crate::stream) const STALL_PROBE_PACKETS: usize = 4;

impl<'a> Stream<'a> {
    /// When the stall probe is due (E9): once no result came and no packet went for the first
    /// time for the stall timeout; later rounds, with reports, spaced like Queries (an eighth of
    /// the time without progress, at least the timeout), without, doubled each round. Loss
    /// detection by order has nothing to go on when nothing more is answered.
    pub(in crate::stream) fn stall_probe_at(&self) -> Option<Instant> {
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
    pub(in crate::stream) fn probe_stall(&mut self, now: Instant) {
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
                // With `tail-timers`, a block's last packet at the end: its data goes again.
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
