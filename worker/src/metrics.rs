//! A worker's counters in Prometheus' text format (for `ina worker --metrics`): the stream
//! statistics of every all-reduce, added up. The names are a contract with dashboards and
//! alerts: a renamed metric is a breaking change.

use ina_io::metrics::Exposition;
use ina_proto::stream::StreamStats;

/// What a worker's all-reduces added up to (a metrics endpoint reads it: [`render`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamTotals {
    pub operations: u64,
    /// Every all-reduce's stream statistics, added up.
    pub streams: ina_proto::stream::StreamStats,
    /// Slots the worker streams through (its window).
    pub window: u16,
}

impl StreamTotals {
    /// Adds one all-reduce's stream statistics, made through a window of `window` slots.
    pub fn record(&mut self, stream: &StreamStats, window: u16) {
        self.operations += 1;
        self.streams.accumulate(stream);
        self.window = window;
    }
}

/// A worker's all-reduces in Prometheus' text format.
pub fn render(totals: &StreamTotals) -> String {
    let t = &totals.streams;
    let mut e = Exposition::new();
    e.counter(
        "ina_worker_allreduces_total",
        "All-reduces finished.",
        totals.operations,
    )
    .counter(
        "ina_worker_packets_total",
        "Packets the streams carried (first transmissions).",
        t.packets,
    )
    .counter(
        "ina_worker_packets_sent_total",
        "Packets sent, every copy included.",
        t.packets_sent,
    )
    .counter(
        "ina_worker_bytes_sent_total",
        "Bytes of ina packets sent.",
        t.bytes_sent,
    )
    .counter("ina_worker_results_total", "Results accepted.", t.results)
    .counter(
        "ina_worker_duplicate_results_total",
        "Results that matched no outstanding packet.",
        t.duplicate_results,
    )
    .counter(
        "ina_worker_foreign_total",
        "Datagrams that were not this job's results.",
        t.foreign,
    )
    .counters_by(
        "ina_worker_resends_total",
        "Packets sent again, by cause.",
        "cause",
        [
            ("loss_detected", t.fast_retransmissions),
            ("missing_report", t.resent_reported),
            ("pending_missing", t.resent_missing),
            (
                "timer",
                t.retransmissions
                    .saturating_sub(t.fast_retransmissions)
                    .saturating_sub(t.resent_reported)
                    .saturating_sub(t.resent_missing),
            ),
            ("stall_probe", t.stall_probes),
            ("recheck", t.rechecks),
        ],
    )
    .counter(
        "ina_worker_results_reported_total",
        "Results whose gap counter showed them lost, reported to the switch for its stored copy.",
        t.results_reported,
    )
    .counter(
        "ina_worker_queries_total",
        "Retransmissions sent as 16-byte Queries (the switch held the data).",
        t.queries,
    )
    .counter(
        "ina_worker_lookahead_copies_total",
        "Second copies of the exponent lookahead's 16-byte headers (every float32 stream sends its first window's headers twice).",
        t.lookahead_copies,
    )
    .counter(
        "ina_worker_pending_answers_total",
        "Pending answers received.",
        t.pending_answers,
    )
    .counter(
        "ina_worker_resent_missing_total",
        "Data sent again because a Pending answer showed it missing.",
        t.resent_missing,
    )
    .counter(
        "ina_worker_missing_reports_total",
        "Missing reports of the switch that named an unanswered packet.",
        t.missing_reports,
    )
    .counter(
        "ina_worker_completions_seen_total",
        "Status Queries answered 'complete' whose result had been lost.",
        t.completions_seen,
    )
    .gauge(
        "ina_worker_window_slots",
        "Slots the worker streams through.",
        f64::from(totals.window),
    )
    .gauge(
        "ina_worker_slot_occupancy",
        "Mean fraction of the window in flight while all-reducing, over the worker's life.",
        occupancy(t.slot_ns, t.active_ns, totals.window),
    );
    if let Some(rtt) = t.srtt {
        e.gauge(
            "ina_worker_srtt_seconds",
            "Smoothed round trip to the switch.",
            rtt.as_secs_f64(),
        );
    }
    if let Some(rtt) = t.min_rtt {
        e.gauge(
            "ina_worker_min_rtt_seconds",
            "Smallest round trip seen.",
            rtt.as_secs_f64(),
        );
    }
    e.finish()
}

/// The mean fraction of a window of `window` slots in flight: `slot_ns` slot-nanoseconds over
/// `active_ns` nanoseconds (0 before any).
fn occupancy(slot_ns: u64, active_ns: u64, window: u16) -> f64 {
    if active_ns == 0 || window == 0 {
        return 0.0;
    }
    slot_ns as f64 / (active_ns as f64 * f64::from(window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_metrics_carry_the_totals_and_split_resends_by_cause() {
        let mut totals = StreamTotals::default();
        let one = StreamStats {
            packets: 8,
            results: 8,
            retransmissions: 10,
            fast_retransmissions: 3,
            resent_reported: 2,
            resent_missing: 1,
            stall_probes: 4,
            slot_ns: 500,
            active_ns: 100,
            ..StreamStats::default()
        };
        totals.record(&one, 10);
        totals.record(&one, 10);
        let text = render(&totals);
        for line in [
            "# HELP ina_worker_allreduces_total All-reduces finished.\n",
            "# TYPE ina_worker_allreduces_total counter\nina_worker_allreduces_total 2\n",
            "ina_worker_packets_total 16\n",
            "ina_worker_results_total 16\n",
            "ina_worker_resends_total{cause=\"loss_detected\"} 6\n",
            "ina_worker_resends_total{cause=\"missing_report\"} 4\n",
            "ina_worker_resends_total{cause=\"pending_missing\"} 2\n",
            "ina_worker_resends_total{cause=\"timer\"} 8\n",
            "ina_worker_resends_total{cause=\"stall_probe\"} 8\n",
            "# TYPE ina_worker_window_slots gauge\nina_worker_window_slots 10\n",
            "ina_worker_slot_occupancy 0.5\n",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        // No round trip measured yet: no RTT gauges.
        assert!(!text.contains("ina_worker_srtt_seconds"), "{text}");
    }

    #[test]
    fn occupancy_is_zero_before_any_time_or_window() {
        assert_eq!(occupancy(100, 0, 8), 0.0);
        assert_eq!(occupancy(100, 10, 0), 0.0);
        assert_eq!(occupancy(40, 10, 8), 0.5);
    }
}
