//! How long each wait lasts: the probe, query and result timeouts, and the spacing of Queries
//! (docs/design/RECOVERY.md §4, "Timeouts").

use crate::rtt::RttEstimator;
use crate::stream::recovery::Rule;
use crate::stream::slots::Outstanding;
use crate::stream::Stream;
use crate::Instant;
use core::time::Duration;

impl<'a> Stream<'a> {
    /// `max(SRTT + max(G, 4 RTTVAR), 2 SRTT)` of `estimate`; `None` before its first sample.
    /// Of the results' estimator, it is the probe timeout.
    pub(super) fn timeout_of(&self, estimate: &RttEstimator) -> Option<Duration> {
        let srtt = estimate.srtt()?;
        Some((srtt + self.spread_of(estimate)).max(srtt.saturating_mul(2)))
    }

    /// `max(G, 4 RTTVAR)` of `estimate`: the margin a timeout adds to the smoothed round trip.
    fn spread_of(&self, estimate: &RttEstimator) -> Duration {
        self.rtt.config().granularity.max(estimate.rttvar() * 4)
    }

    /// The timeout of the path's round trips; with `empty-path-timeout`, once every packet has
    /// gone, `max(path_min, min_rtt / 2, G)` instead.
    fn path_timeout(&self) -> Option<Duration> {
        if self.all_sent() && self.has(Rule::EmptyPathTimeout) {
            if let Some(result_min) = self.rtt.min_rtt() {
                let path = self.loss.path_min.unwrap_or(result_min);
                let granularity = self.rtt.config().granularity;
                return Some(path.max(result_min / 2).max(granularity));
            }
            let srtt = self.path_rtt.srtt()?;
            return Some(srtt + self.spread_of(&self.path_rtt).max(srtt / 4));
        }
        self.timeout_of(&self.path_rtt)
    }

    /// The stall probe's timeout: the path's with Missing reports, else the probe timeout.
    pub(super) fn stall_timeout(&self) -> Option<Duration> {
        let path = self.path_timeout().filter(|_| self.reports());
        path.or_else(|| self.timeout_of(&self.rtt))
    }

    /// How long an answer to a Query may take: the path's timeout, else the probe timeout,
    /// else the retransmission timeout.
    pub(super) fn query_timeout(&self) -> Duration {
        self.path_timeout()
            .or_else(|| self.timeout_of(&self.rtt))
            .unwrap_or_else(|| self.rtt.rto())
    }

    /// When a use that holds this worker's data (a Pending with its bit, at `now`) is asked about
    /// again (R7): a spacing after the answer; with `ask-again-from-query`, once every packet has
    /// gone, a spacing after the Query it answers (at once if the answer took longer).
    pub(super) fn next_ask_after_held(&self, now: Instant, out: &Outstanding) -> Instant {
        let spacing = self.spacing(now, out);
        if self.all_sent() && out.last_was_query && self.has(Rule::AskAgainFromQuery) {
            now.max(out.last_sent + spacing)
        } else {
            now + spacing
        }
    }

    /// How long to wait before asking about `out` again (R7): the query timeout, or with
    /// `spacing-by-wait` an eighth of the time since it was first sent if that is longer.
    pub(super) fn spacing(&self, now: Instant, out: &Outstanding) -> Duration {
        let timeout = self.query_timeout();
        if self.has(Rule::SpacingByWait) {
            timeout.max(now.saturating_duration_since(out.first_sent) / 8)
        } else {
            timeout
        }
    }
}
