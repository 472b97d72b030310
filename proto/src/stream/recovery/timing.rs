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

    /// The probe timeout of the path's round trips (see `path_rtt`), once the switch has
    /// answered a Query or repeated data.
    ///
    /// Once every packet has been sent, the results of the last window drain and the path
    /// empties: an answer then takes the path's smallest round trip, and one that takes longer
    /// was lost or waits for another worker, which a second 16-byte Query costs nothing to
    /// find out, while the job's end waits for every loss left. The timeout is then that
    /// round trip: `path_min`, from answers to a packet's only retransmission, which cannot
    /// be mistaken for the answer to an earlier one (before any, the smallest round trip of a
    /// result, which is the path's or longer); at least half the smallest round trip of a
    /// result, so that a duplicated packet's early answer cannot make it a few hundred
    /// nanoseconds; and at least the clock granularity `G`, below which a host cannot time
    /// anything (with 30 µs on loopback, a worker whose switch paused for 4 ms used up its 30
    /// retries). n = 32 on one switch at 1% loss, 12 seeds: 0.967 of lossless against 0.959
    /// with `SRTT + max(G, 4 RTTVAR, SRTT / 4)` of the path (which mid-stream queueing
    /// inflates to 1.5 times the empty path's), and 0.966 with a quarter of the round trip
    /// added (BENCHMARKS.md, "Loss in the simulator").
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

    /// How much longer a full-size result's round trip is than a header-only one's: the
    /// data's and the result's time on the links (from the smallest round trips of each,
    /// zero until both are known). A fetching Query's answer is a full result, and at the
    /// stream's end, where Queries are timed by the empty path's round trip (measured with
    /// header-only answers), a fetch repeated before its answer could come brings a second
    /// copy: at n = 8, 500 Mbit/s and 8 KiB packets, a worker whose last results were lost
    /// fetched 18 of them every 40 µs, each answer 131 µs on its downlink, and the job took
    /// 1.154 s against 1.090 (seed 1 of 8 at 1% loss; with this wait, 1.090–1.093 in every
    /// seed). At 100 Gbit/s it adds a fraction of a microsecond, and 24 seeds at 1% loss
    /// gave the same goodput within 0.04 Gbit/s at n = 32, 4 racks of 4 and 4 racks of 8.
    pub(in crate::stream) fn full_result_time(&self) -> Duration {
        if !self.has(Rule::FetchWaitsFullResult) {
            return Duration::ZERO;
        }
        self.min_full_rtt
            .zip(self.rtt.min_rtt())
            .map_or(Duration::ZERO, |(full, any)| full.saturating_sub(any))
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

    /// When a packet whose use holds this worker's data (a Pending answer with its bit, at
    /// `now`) is asked about again, in case its result to this worker is lost: a spacing
    /// after the answer. Once every packet has gone, a spacing after the Query it answers
    /// (at once if the answer took longer): the job's end waits for every use, and a result
    /// lost on its way down is found by the next Query only. Measured from the answer, each
    /// round of asking took a round trip more than the spacing. Traced at 4 racks of 32 and
    /// 1% loss (seed 11), a worker's Query found the job's slowest use still waiting for a
    /// lost partial at 1440.2 µs; the total reached the rack at 1436.3 µs and its copy to
    /// this worker was lost. The next Query went at 1450.2 µs, a query timeout after the
    /// answer, and the result came at 1460.3 µs: the job's end. From the Query, it goes at
    /// once (PROTOCOL.md §5, "The tail").
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
