//! The switches' counters in Prometheus' text format (for `ina switch --metrics`): one family
//! per counter, with the `shard`-less totals of the UDP switch ([`render`]) and the per-event
//! and per-port counts of the L2 switch ([`render_frames`]). The names are a contract with
//! dashboards and alerts: a renamed metric is a breaking change.

use crate::frames::{FramesStats, PortStats};
use ina_io::metrics::Exposition;
use ina_switch_api::SwitchStats;

/// The UDP switch's counters in Prometheus' text format.
pub fn render(stats: Option<&SwitchStats>) -> String {
    let mut e = Exposition::new();
    let Some(s) = stats else {
        return e.finish();
    };
    let t = &s.total;
    let p = &t.pipeline;
    e.counter(
        "ina_switch_packets_total",
        "Datagrams the pipeline took in.",
        p.packets_in,
    )
    .counter(
        "ina_switch_bytes_total",
        "Bytes the pipeline took in.",
        p.bytes_in,
    )
    .counter(
        "ina_switch_data_first_total",
        "First arrivals of a slot use.",
        p.data_first,
    )
    .counter(
        "ina_switch_data_added_total",
        "Later arrivals added into a slot use.",
        p.data_added,
    )
    .counter(
        "ina_switch_results_multicast_total",
        "Slot uses completed and their results sent to every rank.",
        p.results_multicast,
    )
    .counter(
        "ina_switch_results_unicast_total",
        "Stored results sent again to one worker (retransmissions, queries).",
        p.results_unicast,
    )
    .counter(
        "ina_switch_results_to_workers_total",
        "Results of completed slot uses sent to a worker's own address (one per worker).",
        t.results_to_workers,
    )
    .counter(
        "ina_switch_results_to_group_total",
        "Results of completed slot uses sent once to the job's multicast group.",
        t.results_to_group,
    )
    .counter(
        "ina_switch_pending_total",
        "Pending answers: retransmissions and queries of slot uses still collecting.",
        p.pending_sent,
    )
    .counter(
        "ina_switch_missing_reports_total",
        "Missing reports: first transmissions of a worker that never arrived, told to it.",
        p.missing_sent,
    )
    .counter(
        "ina_switch_partials_sent_total",
        "Partial sums sent to the upper switch of a tree (a rack switch's completed uses).",
        p.partials_sent,
    )
    .counter(
        "ina_switch_partials_resent_total",
        "Partial sums sent again to the upper switch, which had answered a Query without this switch's partial.",
        p.partials_resent,
    )
    .counter(
        "ina_switch_partials_reported_total",
        "Partial sums sent again to the upper switch, whose Missing report named them.",
        p.partials_reported,
    )
    .counter(
        "ina_switch_partials_for_fetch_total",
        "Partial sums sent up again as rank 0's fetching Query at the end of its stream.",
        p.partials_for_fetch,
    )
    .counter(
        "ina_switch_missing_up_total",
        "Missing reports sent to the upper switch: totals that a gap counter showed lost on the way down.",
        p.missing_up,
    )
    .counter(
        "ina_switch_missing_from_lower_total",
        "Missing reports of lost results, from workers or lower switches, answered with the stored result (or a Pending).",
        p.missing_received,
    )
    .counter(
        "ina_switch_missing_unmatched_total",
        "Missing reports of lost results that named no use recorded here.",
        p.missing_unmatched,
    )
    .counter(
        "ina_switch_upstream_missing_total",
        "Missing reports from the upper switch that named no use still waiting here.",
        p.upstream_missing,
    )
    .counter(
        "ina_switch_queries_up_total",
        "Queries sent to the upper switch about uses whose total has not come down (rank 0 asked).",
        p.queries_up,
    )
    .counter(
        "ina_switch_totals_received_total",
        "Totals received from the upper switch and sent on to the workers.",
        p.totals_received,
    )
    .counter(
        "ina_switch_upstream_pending_total",
        "Pending answers from the upper switch with nothing left to do (the total had come down meanwhile).",
        p.upstream_pending,
    )
    .counter(
        "ina_switch_upstream_rejects_total",
        "Rejects from the upper switch: the uplink is misconfigured or the upper switch restarted.",
        p.upstream_rejects,
    )
    .counter(
        "ina_switch_probes_total",
        "Probes answered.",
        p.probes_answered,
    )
    .counter(
        "ina_switch_rejects_total",
        "Packets refused with a Reject.",
        p.rejects_sent,
    )
    .counters_by(
        "ina_switch_drops_total",
        "Packets dropped or refused, by reason.",
        "reason",
        p.drops_by_reason(),
    )
    .gauge(
        "ina_switch_busy_slots",
        "Slots with a use still collecting.",
        t.busy_slots as f64,
    )
    .counter(
        "ina_switch_rx_datagrams_total",
        "Datagrams received by the sockets.",
        t.io.rx_datagrams,
    )
    .counter(
        "ina_switch_tx_datagrams_total",
        "Datagrams sent by the sockets.",
        t.io.tx_datagrams,
    )
    .counter(
        "ina_switch_tx_errors_total",
        "Datagrams the sockets failed to send.",
        t.io.tx_errors,
    )
    .counter(
        "ina_switch_forward_dropped_total",
        "Datagrams for another shard's slots dropped because that shard's inbox was full.",
        t.forward_dropped,
    );
    e.finish()
}

/// The L2 switch's counters in Prometheus' text format.
pub fn render_frames(stats: Option<&FramesStats>) -> String {
    let mut e = Exposition::new();
    let Some(s) = stats else {
        return e.finish();
    };
    e.counters_by(
        "ina_switch_frames_total",
        "Frames the switch took in, by the event each counted (PROTOCOL.md section 7).",
        "event",
        s.events.iter().map(|(name, n)| (*name, *n)),
    )
    .counter(
        "ina_switch_results_multicast_total",
        "Slot uses completed and their results sent to every rank.",
        s.results_multicast,
    );
    let by_port = |f: fn(&PortStats) -> u64| {
        s.ports
            .iter()
            .map(move |p| (p.ifname.as_str(), f(p)))
            .collect::<Vec<_>>()
    };
    e.counters_by(
        "ina_port_rx_frames_total",
        "Frames received per port.",
        "port",
        by_port(|p| p.rx_frames),
    )
    .counters_by(
        "ina_port_tx_frames_total",
        "Frames sent per port.",
        "port",
        by_port(|p| p.tx_frames),
    )
    .counters_by(
        "ina_port_tx_dropped_total",
        "Frames not sent per port: the transmit ring was full.",
        "port",
        by_port(|p| p.tx_dropped),
    )
    .counters_by(
        "ina_port_rx_truncated_total",
        "Frames dropped on receipt per port: larger than a ring slot (GSO super-frames).",
        "port",
        by_port(|p| p.rx_truncated),
    );
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family has its HELP and TYPE lines and one sample with the switch's value.
    #[test]
    fn switch_metrics_carry_the_totals() {
        assert_eq!(render(None), "");
        let mut stats = SwitchStats::default();
        stats.total.pipeline.packets_in = 11;
        stats.total.pipeline.results_multicast = 3;
        stats.total.results_to_group = 2;
        stats.total.busy_slots = 5;
        stats.total.io.tx_errors = 1;
        stats.total.forward_dropped = 4;
        let text = render(Some(&stats));
        for line in [
            "# HELP ina_switch_packets_total Datagrams the pipeline took in.\n",
            "# TYPE ina_switch_packets_total counter\n",
            "ina_switch_packets_total 11\n",
            "ina_switch_results_multicast_total 3\n",
            "ina_switch_results_to_group_total 2\n",
            "# TYPE ina_switch_busy_slots gauge\nina_switch_busy_slots 5\n",
            "ina_switch_tx_errors_total 1\n",
            "ina_switch_forward_dropped_total 4\n",
            "# TYPE ina_switch_drops_total counter\n",
            "ina_switch_drops_total{reason=\"malformed\"} 0\n",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        let families = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
        assert_eq!(families, helps);
        assert_eq!(families, 30, "{text}");
    }

    #[test]
    fn metrics_name_every_event_and_port() {
        assert_eq!(render_frames(None), "");
        let stats = FramesStats {
            events: ina_proto::event::Event::ALL
                .iter()
                .enumerate()
                .map(|(i, e)| (e.name(), i as u64))
                .collect(),
            results_multicast: 9,
            ports: vec![PortStats {
                ifname: "sw0".into(),
                rx_frames: 5,
                rx_bytes: 500,
                rx_truncated: 1,
                tx_frames: 4,
                tx_bytes: 400,
                tx_dropped: 2,
            }],
        };
        let text = render_frames(Some(&stats));
        for e in ina_proto::event::Event::ALL {
            let line = format!(
                "ina_switch_frames_total{{event=\"{}\"}} {}",
                e.name(),
                e.index()
            );
            assert!(text.contains(&line), "{line}\n{text}");
        }
        assert!(text.contains("ina_switch_results_multicast_total 9\n"));
        assert!(text.contains("ina_port_tx_dropped_total{port=\"sw0\"} 2\n"));
        assert!(text.contains("ina_port_rx_truncated_total{port=\"sw0\"} 1\n"));
    }
}
