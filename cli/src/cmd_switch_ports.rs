//! `ina switch --ports IF0,IF1,...`: the L2 software switch on raw Ethernet ports.
//!
//! Prints `{"event":"ready",...}` when every port is open (and the metrics endpoint, whose
//! address the line names, serves) and `{"event":"stopped","stats":...}`
//! on SIGINT/SIGTERM, like the UDP switch.

use anyhow::{bail, Context};
use ina_io::packet::RawConfig;
use ina_proto::l2::FrameSwitchConfig;
use ina_proto::pipeline::PipelineConfig;
use ina_switch::frames::{parse_frame_job, port_index, FramesSwitch};
use ina_wire::MacAddr;
use std::net::Ipv4Addr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The settings of the L2 mode (from `ina switch`'s flags).
#[derive(Debug)]
pub struct PortsArgs {
    pub ports: Vec<String>,
    pub mac: Option<String>,
    pub ip: Option<Ipv4Addr>,
    pub l2: Vec<String>,
    pub jobs: Vec<String>,
    pub pool_slots: Option<u16>,
    pub max_elems: Option<u16>,
    pub mtu: usize,
    pub stats_every: f64,
    pub metrics: Option<std::net::SocketAddr>,
}

/// The L2 switch's counters in Prometheus' text format.
pub fn render_metrics(stats: Option<&ina_switch::frames::FramesStats>) -> String {
    let mut e = ina_io::metrics::Exposition::new();
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
    let by_port = |f: fn(&ina_switch::frames::PortStats) -> u64| {
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

pub fn run(args: PortsArgs) -> anyhow::Result<()> {
    if args.ports.iter().any(String::is_empty) {
        bail!("--ports takes interface names separated by commas");
    }
    let Some(mac) = &args.mac else {
        bail!("--ports needs the switch's own --mac (its address on the LAN)");
    };
    let mac: MacAddr = mac
        .trim()
        .parse()
        .map_err(|e| anyhow::anyhow!("--mac: {e}"))?;
    let Some(ip) = args.ip else {
        bail!("--ports needs the switch's own --ip (workers send to it)");
    };
    let jobs = args
        .jobs
        .iter()
        .map(|j| parse_frame_job(j, &args.ports).map_err(|e| anyhow::anyhow!("`{j}`: {e}")))
        .collect::<anyhow::Result<Vec<_>>>()
        .context("--job")?;
    let mut l2: Vec<([u8; 6], u16)> = Vec::new();
    for entry in &args.l2 {
        let (m, port) = entry
            .split_once('=')
            .with_context(|| format!("--l2 `{entry}` is not MAC=INTERFACE"))?;
        let m: MacAddr = m
            .trim()
            .parse()
            .map_err(|e| anyhow::anyhow!("--l2 `{entry}`: {e}"))?;
        let port = port_index(&args.ports, port.trim())
            .map_err(|e| anyhow::anyhow!("--l2 `{entry}`: {e}"))?;
        l2.push((m.octets(), port));
    }
    // Every worker's MAC is reachable through its port: ordinary traffic between workers
    // (a ring all-reduce, ARP answers) crosses the switch without extra flags.
    for ep in jobs.iter().flat_map(|j| &j.ranks) {
        if !l2.iter().any(|(m, _)| *m == ep.mac) {
            l2.push((ep.mac, ep.port));
        }
    }
    let mut pipeline = PipelineConfig::default();
    if let Some(p) = args.pool_slots {
        pipeline.pool_slots = p;
    }
    if let Some(m) = args.max_elems {
        pipeline.max_elems = m;
    }
    let cfg = FrameSwitchConfig {
        mac: mac.octets(),
        ip: ip.octets(),
        ports: Vec::new(),
        l2,
        pipeline,
    };
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())
        .context("installing the SIGINT handler")?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())
        .context("installing the SIGTERM handler")?;
    let mut switch = FramesSwitch::open(&args.ports, cfg, jobs, RawConfig::for_mtu(args.mtu))
        .context("starting the L2 switch")?;
    let job_list: Vec<_> = switch
        .frame_switch()
        .jobs()
        .iter()
        .map(|j| {
            serde_json::json!({
                "job": j.job, "epoch": j.epoch, "slot_base": j.slot_base,
                "slot_count": j.slot_count, "elems_per_packet": j.elems_per_packet,
                "workers": j.ranks.len(),
            })
        })
        .collect();
    // The endpoint is up before the ready line, which names its address: a scraper that
    // reads the line finds it serving (the switch publishes its counters from the start).
    let metrics = match args.metrics {
        Some(addr) => {
            let published = switch.published();
            let server = ina_io::metrics::MetricsServer::spawn(
                addr,
                move || {
                    let snapshot = published.lock().ok().and_then(|s| s.clone());
                    render_metrics(snapshot.as_ref())
                },
                stop.clone(),
            )?;
            tracing::info!(addr = %server.local_addr, "metrics endpoint");
            Some(server)
        }
        None => None,
    };
    println!(
        "{}",
        serde_json::json!({
            "event": "ready",
            "ports": args.ports,
            "ip": ip.to_string(),
            "jobs": job_list,
            "metrics": metrics.as_ref().map(|m| m.local_addr.to_string()),
        })
    );
    tracing::info!(ports = ?args.ports, %ip, "L2 switch ready");
    let every =
        (args.stats_every > 0.0).then(|| std::time::Duration::from_secs_f64(args.stats_every));
    let result = switch.run(&stop, every);
    let stats = switch.stats();
    println!(
        "{}",
        serde_json::json!({"event": "stopped", "stats": stats})
    );
    result.context("L2 switch failed")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_name_every_event_and_port() {
        use ina_switch::frames::{FramesStats, PortStats};
        assert_eq!(render_metrics(None), "");
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
        let text = render_metrics(Some(&stats));
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
