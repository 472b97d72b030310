//! Timers and the stall probe: what happens when time passes without answers.

use crate::stream::recovery::{Retransmit, Rule};
use crate::stream::slots::{Held, Outstanding};
use crate::stream::Stream;
use crate::Instant;
use core::cmp::Reverse;

/// Progress and the stall probe (E9).
#[derive(Debug, Default)]
pub(in crate::stream) struct Stall {
    /// The latest accepted result or first transmission.
    pub(in crate::stream) progress_at: Option<Instant>,
    /// Stall probe rounds since then.
    pub(in crate::stream) rounds: u32,
    /// When the latest of those rounds was sent.
    pub(in crate::stream) probe_last: Option<Instant>,
}

/// How many unanswered packets one stall probe round sends at most.
const STALL_PROBE_PACKETS: usize = 4;

impl<'a> Stream<'a> {
    /// When the stall probe is due (E9): the stall timeout after the latest progress; later
    /// rounds spaced like Queries with reports, doubled each round without.
    pub(in crate::stream) fn stall_probe_at(&self) -> Option<Instant> {
        if self.is_over() {
            return None;
        }
        let pto = self.stall_timeout()?;
        let since = self.stall.progress_at?;
        Some(match (self.reports(), self.stall.probe_last) {
            (true, Some(last)) => last + pto.max(last.saturating_duration_since(since) / 8),
            (true, None) => since + pto,
            (false, _) => since + pto.saturating_mul(1 << self.stall.rounds.min(16)),
        })
    }

    /// Sends the stall probe: the [`STALL_PROBE_PACKETS`] oldest unanswered transmissions
    /// not queued go again, if at least the stall timeout old (and as old as R2 requires).
    pub(super) fn probe_stall(&mut self, now: Instant) {
        let Some(pto) = self.stall_timeout() else {
            return;
        };
        let mut eligible: Vec<(u64, u64)> = self
            .slots
            .iter()
            .filter_map(|s| s.outstanding)
            .filter(|o| {
                !o.is_queued() && now - o.last_sent >= pto.max(self.redetect_after(o.retries))
            })
            .map(|o| (o.last_tx, o.index))
            .collect();
        eligible.sort_unstable();
        for &(_, index) in eligible.iter().take(STALL_PROBE_PACKETS) {
            let Some((slot, out)) = self.outstanding_at(index) else {
                continue;
            };
            if self.give_up_if_spent(now, &out) {
                break;
            }
            self.queue_retransmission(slot, out, Retransmit::StallProbe);
        }
        self.stall.rounds += 1;
        self.stall.probe_last = Some(now);
    }

    /// Handles expired timers (E8): queues retransmissions or backs timers off, or fails the
    /// stream when a packet has exhausted its retries or its give-up time (E12).
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut expired = Vec::new();
        while let Some(Reverse((deadline, index))) = self.timers.peek().copied() {
            if deadline > now || self.failed.is_some() {
                break;
            }
            self.timers.pop();
            let Some((_, out)) = self
                .outstanding_at(index)
                .filter(|(_, o)| o.deadline == deadline)
            else {
                continue;
            };
            if self.give_up_if_spent(now, &out) {
                break;
            }
            expired.push(index);
        }
        // The oldest expired packet goes again as a probe.
        let probe = expired.iter().min().copied();
        if self.failed.is_none() && !expired.is_empty() {
            // Back the estimate off (RFC 6298) only for data's timers: a Query's, or a recheck
            // of held data, expire by design.
            let data_expired = expired.iter().any(|&index| {
                self.outstanding_at(index).is_some_and(|(_, o)| {
                    !o.awaiting_repair
                        && (!self.reports() || (!o.last_was_query && o.held != Held::Yes))
                })
            });
            if data_expired {
                self.rtt.on_timeout();
            }
            for &index in &expired {
                let Some((slot, out)) = self.outstanding_at(index) else {
                    continue;
                };
                let unreportable_tail =
                    self.all_sent() && !self.loss_reportable(&out) && self.has(Rule::TailTimers);
                let lost = Some(index) == probe
                    || out.awaiting_repair
                    || (self.reports()
                        && (out.last_was_query || out.held == Held::Yes || unreportable_tail))
                    || self.loss.highest_answered.is_some_and(|h| h > out.last_tx);
                if lost {
                    let why = if out.awaiting_repair {
                        Retransmit::Detected
                    } else if self.reports() && out.held == Held::Yes {
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
        if self.failed.is_none() && self.redetect_at().is_some_and(|t| t <= now) {
            self.detect_losses(now);
        }
        if self.failed.is_none() && self.stall_probe_at().is_some_and(|t| t <= now) {
            self.probe_stall(now);
        }
    }
}
