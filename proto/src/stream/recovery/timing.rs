//! How long each wait lasts: the probe, query and result timeouts, and the spacing of Queries.

use crate::rtt::RttEstimator;
use crate::stream::recovery::Rule;
use crate::stream::slots::Outstanding;
use crate::stream::Stream;
use crate::Instant;
use core::time::Duration;

impl<'a> Stream<'a> {
    /// The probe timeout: the retransmission timeout without its floor,
    /// `SRTT + max(G, 4 RTTVAR)`, and at least two smoothed round trips; `None` before the
    /// first round-trip sample. On a steady network it is about two round trips; where round
    /// trips vary (a busy host that does not run every worker at once), it grows with them,
    /// so that a worker's short absence does not make the others probe.
    pub(in crate::stream) fn probe_timeout(&self) -> Option<Duration> {
        self.timeout_of(&self.rtt)
    }

    /// `SRTT + max(G, 4 RTTVAR)` of `estimate`, and at least two of its smoothed round trips;
    /// `None` before its first sample.
    pub(in crate::stream) fn timeout_of(&self, estimate: &RttEstimator) -> Option<Duration> {
        let srtt = estimate.srtt()?;
        Some((srtt + self.spread_of(estimate)).max(srtt.saturating_mul(2)))
    }

    /// `max(G, 4 RTTVAR)` of `estimate`: the margin a timeout adds to the smoothed round trip.
    pub(in crate::stream) fn spread_of(&self, estimate: &RttEstimator) -> Duration {
        self.rtt.config().granularity.max(estimate.rttvar() * 4)
    }

    /// The probe timeout of the path's round trips (the switch's immediate answers). With
    /// `empty-path-timeout`, once every packet has gone, the path's smallest round trip instead:
    /// `path_min` (answers to a packet's only retransmission; before any, the smallest round trip of
    /// a result), at least half the results' smallest and at least the granularity `G`.
    pub(in crate::stream) fn path_timeout(&self) -> Option<Duration> {
        if self.all_sent() && self.has(Rule::EmptyPathTimeout) {
            if let Some(result_min) = self.rtt.min_rtt() {
                let path = self.path_min.unwrap_or(result_min);
                let granularity = self.rtt.config().granularity;
                return Some(path.max(result_min / 2).max(granularity));
            }
            let srtt = self.path_rtt.srtt()?;
            return Some(srtt + self.spread_of(&self.path_rtt).max(srtt / 4));
        }
        self.timeout_of(&self.path_rtt)
    }

    /// The stall probe's timeout: the probe timeout, or with Missing reports the path's
    /// (the probe then mostly asks with Queries, which the switch answers at once).
    pub(in crate::stream) fn stall_timeout(&self) -> Option<Duration> {
        let path = self.path_timeout().filter(|_| self.reports);
        path.or_else(|| self.probe_timeout())
    }

    /// How long an answer to a Query may take: the probe timeout (about two round trips, see
    /// [`probe_timeout`](Self::probe_timeout)), or the retransmission timeout before the
    /// first round-trip sample. The switch answers a Query at once, so no floor for a slow
    /// peer is needed.
    pub(in crate::stream) fn query_timeout(&self) -> Duration {
        self.path_timeout()
            .or_else(|| self.probe_timeout())
            .unwrap_or_else(|| self.rtt.rto())
    }

    /// When a use that holds this worker's data (a Pending with its bit, at `now`) is asked about
    /// again (R7): a spacing after the answer; with `ask-again-from-query`, once every packet has
    /// gone, a spacing after the Query it answers (at once if the answer took longer).
    pub(in crate::stream) fn next_ask_after_held(
        &self,
        now: Instant,
        out: &Outstanding,
    ) -> Instant {
        let spacing = self.spacing(now, out);
        if self.all_sent() && out.last_was_query && self.has(Rule::AskAgainFromQuery) {
            now.max(out.last_sent + spacing)
        } else {
            now + spacing
        }
    }

    /// How long to wait before asking about `out` again, with Missing reports: the query
    /// timeout, or an eighth of the time the packet has waited since it was first sent if
    /// that is longer. The spacing grows with the time waited, not with the number of
    /// attempts: a repair lost again and again (at 10% loss a use often needs several) is
    /// still retried at round-trip pace, never after a backed-off timer, while a worker that
    /// is gone is asked about ever less often: about `8 ln(give_up / PTO)` times in all
    /// (some 90 Queries for a give-up time of 2 s and a 20 µs round trip).
    pub(in crate::stream) fn spacing(&self, now: Instant, out: &Outstanding) -> Duration {
        let waited = now.saturating_duration_since(out.first_sent);
        if !self.has(Rule::SpacingByWait) {
            return self.query_timeout();
        }
        self.query_timeout().max(waited / 8)
    }
}
