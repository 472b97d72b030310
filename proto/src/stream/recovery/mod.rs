//! Loss recovery: the policy that decides, for each event, what goes again and when
//! (docs/design/RECOVERY.md states the model: its events, the action each triggers, and
//! the rules kept with what each is worth).
//!
//! The stream's mechanics (lanes, positions, self-clocking, the lookahead, writing results)
//! live in the parent module; this one only reads them. Each event has its file:
//! `answers` (Pending, Missing), `detect` (an answer out of order), `timers` (a timer, the
//! stall probe), `tail` (the stream's end), `waits` (when a packet waits before it is asked
//! about), with the durations in `timing` and the optional rules, by name, in `rules`.

mod answers;
mod detect;
mod rules;
mod tail;
mod timers;
mod timing;
mod waits;

pub use rules::{Rule, Rules, UnknownRule};

use crate::stream::config::StreamError;
use crate::stream::slots::{Held, Outstanding, QUEUED};
use crate::stream::{Stream, DESCRIPTOR_PACKETS};
use crate::Instant;
use core::cmp::Reverse;
use ina_wire::{AggRepr, QueryAsk};

/// Why a packet is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::stream) enum Retransmit {
    /// Answers to later transmissions showed it lost.
    Detected,
    /// Its timer expired.
    Timer,
    /// The stall probe (see [`Stream::stall_probe_at`]).
    StallProbe,
    /// A Pending answer showed that the switch lacks this worker's data.
    Missing,
    /// A Missing report named it: its data never reached the switch.
    Reported,
    /// Its data is held by the switch, and its use has waited long enough to ask again (no
    /// evidence of loss: counted with the stall probes).
    Recheck,
    /// A second copy of data sent again in the stream's last window (see
    /// [`Stream::resend_data`]).
    TailCopy,
    /// A second copy of a header-only packet of the exponent lookahead, sent once every one
    /// of them has gone.
    LookaheadCopy,
}

impl<'a> Stream<'a> {
    /// The next retransmission due, if any: a report of lost results first, then the packets
    /// queued to go again, each as data or as a Query (see [`Self::retransmits_as_query`]).
    pub(in crate::stream) fn poll_retransmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Option<usize> {
        if let Some((slot, counter)) = self.result_reports.pop_front() {
            return Some(self.write_result_report(slot, counter, buf));
        }
        while let Some((index, why)) = self.retransmit.pop_front() {
            let Some((slot, out)) = self.outstanding_at(index) else {
                continue;
            };
            if why == Retransmit::TailCopy {
                if out.held == Held::Yes || out.last_was_query {
                    continue;
                }
                self.stats.retransmissions += 1;
                self.stats.tail_copies += 1;
                return Some(self.write_packet(index, None, buf));
            }
            if why == Retransmit::LookaheadCopy {
                if out.held == Held::Yes || out.retries > 0 {
                    continue;
                }
                self.stats.lookahead_copies += 1;
                return Some(self.write_packet(index, None, buf));
            }
            let query = self.retransmits_as_query(&out);
            // (Without reports, Queries are rare and mostly repair a lost result: they fetch.)
            // Once every packet has been sent, Queries fetch at once: the downlink has room,
            // and a lost result at the stream's end costs one round trip less (at 4 MiB
            // and 1% loss, 0.933 of lossless goodput at n = 8 against 0.910 asking first;
            // fetching from the last window on, while results still stream, 0.909).
            let fetch = out.complete_seen
                || !self.reports
                || (self.all_sent() && self.has(Rule::FetchAtEnd))
                || !self.has(Rule::StatusQueries);
            let ask = if !fetch {
                QueryAsk::Status
            } else if !out.complete_seen
                && self.asks_for_partial()
                && self.has(Rule::Rank0AsksPartial)
            {
                QueryAsk::StatusPushingPartial
            } else {
                QueryAsk::Fetch
            };
            // A Query is answered at once, with the result or Pending: its answer is due a
            // round trip later. Data waits for the other workers' data.
            let deadline = if query && self.reports {
                now + self.query_timeout()
            } else if self.reports {
                // Its loss shows in a Query's Pending answer: asked about at round-trip pace.
                now + self.spacing(now, &out)
            } else {
                now + self.rtt.backed_off(out.retries)
            };
            let last_tx = self.next_transmission(index);
            self.slots[slot].outstanding = Some(Outstanding {
                deadline,
                last_tx,
                last_sent: now,
                last_was_query: query,
                // Data sent again may be lost again.
                held: if query { out.held } else { Held::Unknown },
                // (Cleared here only: a packet queued for retransmission has no timer.)
                awaiting_repair: false,
                ..out
            });
            self.timers.push(Reverse((deadline, index)));
            match why {
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
                Retransmit::TailCopy | Retransmit::LookaheadCopy => {}
            }
            if query {
                self.stats.queries += 1;
                return Some(self.write_query(index, ask, buf));
            }
            return Some(self.write_packet(index, None, buf));
        }
        None
    }

    /// Whether the retransmission of `out` is a Query rather than its data (R6). Known held: a
    /// Query; known lost: data. Otherwise, with reports and `query-first`, a Query, since the
    /// switch would have reported the loss of its data, except a packet whose loss no report can
    /// reveal (a block's last first transmission) once every packet has gone: then its data goes
    /// at once. Without reports, data.
    pub(in crate::stream) fn retransmits_as_query(&self, out: &Outstanding) -> bool {
        match out.held {
            Held::Yes => true,
            Held::No => false,
            Held::Unknown => {
                self.reports
                    && self.has(Rule::QueryFirst)
                    && (out.retries > 1 || self.loss_reportable(out) || !self.all_sent())
            }
        }
    }

    /// Queues a second copy of each of the stream's first `end` packets, the exponent lookahead's
    /// headers, once the last of them has gone (R8, `lookahead-copies`): a block's data waits for
    /// its lookahead use, which needs every worker's header. The copies carry no gap counter, and
    /// the switch answers a copy of a header it holds as it answers data sent again.
    pub(in crate::stream) fn queue_lookahead_copies(&mut self, end: u64) {
        self.retransmit
            .extend((DESCRIPTOR_PACKETS..end).map(|index| (index, Retransmit::LookaheadCopy)));
    }

    /// Queues the data of `out` (on `slot`), which the switch lacks, to go again now: unless a
    /// retransmission is already queued, which then carries the data. Returns false if the
    /// stream gave up instead.
    pub(in crate::stream) fn resend_data(
        &mut self,
        now: Instant,
        slot: usize,
        out: Outstanding,
        why: Retransmit,
    ) -> bool {
        let queued = out.is_queued();
        if queued {
            self.slots[slot].outstanding = Some(Outstanding {
                held: Held::No,
                ..out
            });
            return true;
        }
        if self.give_up_if_spent(now, &out) {
            return false;
        }
        self.slots[slot].outstanding = Some(Outstanding {
            held: Held::No,
            retries: out.retries + 1,
            deadline: QUEUED,
            ..out
        });
        self.retransmit.push_back((out.index, why));
        if self.in_last_window() && self.has(Rule::TailCopies) {
            self.retransmit.push_back((out.index, Retransmit::TailCopy));
        }
        true
    }

    /// A result accepted for `out`: a round-trip sample if it answers the packet's only
    /// transmission (Karn), and the reordering and newest answer that loss detection counts from.
    pub(in crate::stream) fn on_result_sample(
        &mut self,
        now: Instant,
        out: &Outstanding,
        hdr: &AggRepr,
    ) {
        if out.retries == 0 && (hdr.gap.is_some() || !self.counts_results()) {
            // Unambiguous (Karn): the answer is to the only transmission. (With the results'
            // gap counters, a result without one is a copy sent for a report of a lost one,
            // and its round trip includes the wait for a later result.)
            let sample = now - out.first_sent;
            self.rtt.on_sample(sample);
            if let Some(w) = self.window.as_mut() {
                let srtt = self.rtt.srtt().unwrap_or(sample);
                w.on_rtt(now, sample, srtt, self.cfg.lane.window);
            }
            if let Some(h) = self.highest_answered {
                self.reordering = self.reordering.max(h.saturating_sub(out.last_tx));
            }
            self.highest_answered = Some(
                self.highest_answered
                    .map_or(out.last_tx, |h| h.max(out.last_tx)),
            );
        }
    }

    /// An immediate answer of the switch (Pending, or the header-only answer to a status
    /// Query) to `out`'s latest retransmission: a sample of the path's round trip. Only the
    /// answer to a packet's only retransmission is sure to answer that transmission and not
    /// an earlier one, so only it may lower `path_min`.
    pub(in crate::stream) fn on_path_sample(&mut self, now: Instant, out: &Outstanding) {
        let sample = now - out.last_sent;
        self.path_rtt.on_sample(sample);
        if out.retries == 1 {
            self.path_min = Some(self.path_min.map_or(sample, |m| m.min(sample)));
        }
    }

    /// The header-only answer to a status Query: the use of `out` is complete, and its result,
    /// which travelled ahead of this answer, was lost. The result is fetched now.
    pub(in crate::stream) fn handle_complete(
        &mut self,
        now: Instant,
        slot: usize,
        out: Outstanding,
    ) {
        self.stats.completions_seen += 1;
        if out.last_was_query {
            self.on_path_sample(now, &out);
        }
        let queued = out.is_queued();
        if out.complete_seen || queued {
            self.slots[slot].outstanding = Some(Outstanding {
                complete_seen: true,
                ..out
            });
            return;
        }
        if self.give_up_if_spent(now, &out) {
            return;
        }
        self.slots[slot].outstanding = Some(Outstanding {
            held: Held::Yes,
            complete_seen: true,
            retries: out.retries + 1,
            deadline: QUEUED,
            ..out
        });
        self.retransmit.push_back((out.index, Retransmit::Detected));
    }

    /// Queues the next transmission of `out` (in `slot`), one more retry, for the next
    /// `poll_transmit`; `why` says what asked for it.
    pub(in crate::stream) fn queue_retransmission(
        &mut self,
        slot: usize,
        out: Outstanding,
        why: Retransmit,
    ) {
        self.slots[slot].outstanding = Some(Outstanding {
            retries: out.retries + 1,
            deadline: QUEUED,
            ..out
        });
        self.retransmit.push_back((out.index, why));
    }

    /// Fails the stream if `out` has used up its give-up time, or its retransmissions while not
    /// known held and, with reports, not last asked with a Query (E12): Queries are spaced by the
    /// time waited, so their number says nothing of how long the switch has been silent.
    pub(in crate::stream) fn give_up_if_spent(&mut self, now: Instant, out: &Outstanding) -> bool {
        let waited = now - out.first_sent;
        let cheap = self.reports && (out.held == Held::Yes || out.last_was_query);
        let retries_left = out.retries < self.cfg.max_retries || cheap;
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
