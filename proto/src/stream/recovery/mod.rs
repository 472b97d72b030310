//! Loss recovery: the policy that decides, for each event, what goes again and when. The model,
//! its events (E1–E12) and rules (R1–R11) are docs/design/RECOVERY.md.
//!
//! The stream's mechanics live in the parent module; this one only reads them. Each event has
//! its file: `answers` (Pending, Missing), `detect` (an answer out of order), `timers` (a timer,
//! the stall probe), `tail` (the stream's end), `waits` (when a packet waits before it is asked
//! about), with the durations in `timing` and the optional rules, by name, in `rules`.

mod answers;
mod detect;
mod rules;
mod tail;
mod timers;
mod timing;
mod waits;

pub use rules::{Rule, Rules, UnknownRule};

pub(in crate::stream) use detect::LossDetection;
pub(in crate::stream) use timers::Stall;

use crate::stream::config::StreamError;
use crate::stream::slots::{Held, Outstanding, QUEUED};
use crate::stream::Stream;
use crate::Instant;
use core::cmp::Reverse;
use ina_wire::{AggRepr, QueryAsk};

/// Why a packet is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retransmit {
    /// Answers to later transmissions showed it lost (E2, E7).
    Detected,
    /// Its timer expired (E8).
    Timer,
    /// The stall probe (E9).
    StallProbe,
    /// A Pending answer showed that the switch lacks this worker's data (E5).
    Missing,
    /// A Missing report named it (E6).
    Reported,
    /// Its data is held and its use has waited long enough to ask again (R7).
    Recheck,
    /// A second copy of data sent again in the last window (R9).
    TailCopy,
    /// A second copy of a header-only packet of the exponent lookahead (R8).
    LookaheadCopy,
}

impl<'a> Stream<'a> {
    /// The next retransmission due, if any: a report of lost results first, then the packets
    /// queued to go again, each as data or as a Query.
    pub(super) fn poll_retransmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        if let Some((slot, counter)) = self.gaps.reports.pop_front() {
            return Some(self.write_result_report(slot, counter, buf));
        }
        while let Some((index, why)) = self.retransmit.pop_front() {
            let Some((slot, out)) = self.outstanding_at(index) else {
                continue;
            };
            match why {
                Retransmit::TailCopy => {
                    if out.held == Held::Yes || out.last_was_query {
                        continue;
                    }
                    self.stats.retransmissions += 1;
                    self.stats.tail_copies += 1;
                    return Some(self.write_packet(index, None, buf));
                }
                Retransmit::LookaheadCopy => {
                    if out.held == Held::Yes || out.retries > 0 {
                        continue;
                    }
                    self.stats.lookahead_copies += 1;
                    return Some(self.write_packet(index, None, buf));
                }
                Retransmit::Detected => {
                    self.stats.retransmissions += 1;
                    self.stats.fast_retransmissions += 1;
                }
                Retransmit::StallProbe => self.stats.stall_probes += 1,
                Retransmit::Recheck => self.stats.rechecks += 1,
                Retransmit::Missing => {
                    self.stats.retransmissions += 1;
                    self.stats.resent_missing += 1;
                }
                Retransmit::Reported => {
                    self.stats.retransmissions += 1;
                    self.stats.resent_reported += 1;
                }
                Retransmit::Timer => self.stats.retransmissions += 1,
            }
            let query = self.retransmits_as_query(&out);
            // R6: `status-queries`, `fetch-at-end`; R5 `rank0-asks-partial`.
            let fetch = out.complete_seen
                || !self.reports()
                || (self.all_sent() && self.has(Rule::FetchAtEnd))
                || !self.has(Rule::StatusQueries);
            let ask = if !fetch {
                QueryAsk::Status
            } else if !out.complete_seen
                && self.cfg.rank == 0
                && self.in_tree()
                && self.counts_results()
                && self.has(Rule::Rank0AsksPartial)
            {
                QueryAsk::StatusPushingPartial
            } else {
                QueryAsk::Fetch
            };
            let deadline = now
                + if !self.reports() {
                    self.rtt.backed_off(out.retries)
                } else if query {
                    self.query_timeout()
                } else {
                    self.spacing(now, &out)
                };
            let last_tx = self.next_transmission(index);
            self.slots[slot].outstanding = Some(Outstanding {
                deadline,
                last_tx,
                last_sent: now,
                last_was_query: query,
                data_retries: out.data_retries + u32::from(!query),
                // Data sent again may be lost again.
                held: if query { out.held } else { Held::Unknown },
                awaiting_repair: false,
                ..out
            });
            self.timers.push(Reverse((deadline, index)));
            if query {
                self.stats.queries += 1;
                return Some(self.write_query(index, ask, buf));
            }
            return Some(self.write_packet(index, None, buf));
        }
        None
    }

    /// Whether the retransmission of `out` is a Query rather than its data (R6): known held, a
    /// Query; known lost, data; else with reports and `query-first` a Query, except for a
    /// block's last first transmission once every packet has gone.
    pub(super) fn retransmits_as_query(&self, out: &Outstanding) -> bool {
        match out.held {
            Held::Yes => true,
            Held::No => false,
            Held::Unknown => {
                self.reports()
                    && self.has(Rule::QueryFirst)
                    && (out.retries > 1 || self.loss_reportable(out) || !self.all_sent())
            }
        }
    }

    /// Queues the data of `out` (on `slot`), which the switch lacks, to go again now (twice in
    /// the last window, R9), unless a retransmission is already queued, which then carries the
    /// data. Returns false if the stream gave up instead.
    pub(super) fn resend_data(
        &mut self,
        now: Instant,
        slot: usize,
        out: Outstanding,
        why: Retransmit,
    ) -> bool {
        let lost = Outstanding {
            held: Held::No,
            ..out
        };
        if out.is_queued() {
            self.slots[slot].outstanding = Some(lost);
            return true;
        }
        if self.give_up_if_spent(now, &out) {
            return false;
        }
        self.queue_retransmission(slot, lost, why);
        if self.in_last_window() && self.has(Rule::TailCopies) {
            self.retransmit.push_back((out.index, Retransmit::TailCopy));
        }
        true
    }

    /// A result accepted for `out`: a round-trip sample if it answers the packet's only
    /// transmission (Karn; with the results' counters, only a result that carries one), and the
    /// reordering and newest answer that loss detection counts from.
    pub(super) fn on_result_sample(&mut self, now: Instant, out: &Outstanding, hdr: &AggRepr) {
        if out.retries == 0 && (hdr.gap.is_some() || !self.counts_results()) {
            let sample = now - out.first_sent;
            self.rtt.on_sample(sample);
            if let Some(w) = self.window.as_mut() {
                let srtt = self.rtt.srtt().unwrap_or(sample);
                w.on_rtt(now, sample, srtt, self.cfg.lane.window);
            }
            let h = self.loss.highest_answered.unwrap_or(out.last_tx);
            self.loss.reordering = self.loss.reordering.max(h.saturating_sub(out.last_tx));
            self.loss.highest_answered = Some(h.max(out.last_tx));
        }
    }

    /// An immediate answer of the switch to `out`'s latest retransmission: a sample of the
    /// path's round trip; only an answer to the only retransmission may lower `path_min`.
    pub(super) fn on_path_sample(&mut self, now: Instant, out: &Outstanding) {
        let sample = now - out.last_sent;
        self.path_rtt.on_sample(sample);
        if out.retries == 1 {
            self.loss.path_min = Some(self.loss.path_min.map_or(sample, |m| m.min(sample)));
        }
    }

    /// The header-only answer to a status Query (E7): the use of `out` is complete and its
    /// result was lost. The result is fetched now.
    pub(super) fn handle_complete(&mut self, now: Instant, slot: usize, out: Outstanding) {
        self.stats.completions_seen += 1;
        if out.last_was_query {
            self.on_path_sample(now, &out);
        }
        if out.complete_seen || out.is_queued() {
            self.slots[slot].outstanding = Some(Outstanding {
                complete_seen: true,
                ..out
            });
            return;
        }
        if self.give_up_if_spent(now, &out) {
            return;
        }
        let out = Outstanding {
            held: Held::Yes,
            complete_seen: true,
            ..out
        };
        self.queue_retransmission(slot, out, Retransmit::Detected);
    }

    /// Queues the next transmission of `out` (in `slot`), one more retry, for the next
    /// `poll_transmit`; `why` says what asked for it.
    pub(super) fn queue_retransmission(&mut self, slot: usize, out: Outstanding, why: Retransmit) {
        self.slots[slot].outstanding = Some(Outstanding {
            retries: out.retries + 1,
            deadline: QUEUED,
            ..out
        });
        self.retransmit.push_back((out.index, why));
    }

    /// Fails the stream if `out` has used up its give-up time, or its retransmissions while not
    /// known held and, with reports, not last asked with a Query (E12). With reports, only its
    /// data sent again counts: Queries are cheap, and a switch slow to answer them must not
    /// spend the retransmissions its data needs once a Pending says it is lacking.
    pub(super) fn give_up_if_spent(&mut self, now: Instant, out: &Outstanding) -> bool {
        let waited = now - out.first_sent;
        let cheap = self.reports() && (out.held == Held::Yes || out.last_was_query);
        let spent = if self.reports() {
            out.data_retries
        } else {
            out.retries
        };
        let retries_left = spent < self.cfg.max_retries || cheap;
        if retries_left && waited < self.cfg.give_up {
            return false;
        }
        let workers = self.cfg.workers;
        let contributors = out.contributors.or_else(|| {
            self.slots
                .iter()
                .filter_map(|s| s.outstanding)
                .filter_map(|o| Some((o.index, o.contributors?)))
                .min_by_key(|(index, _)| *index)
                .map(|(_, bits)| bits)
        });
        self.failed = Some(StreamError::GaveUp {
            seq: (self.cfg.lane.next_position + out.index) as u32,
            retries: out.retries,
            waited,
            missing: contributors.map(|bits| (0..workers).filter(|r| bits >> r & 1 == 0).collect()),
        });
        true
    }
}
