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
    let mut l2: Vec<(MacAddr, u16)> = Vec::new();
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
        l2.push((m, port));
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
        mac,
        ip: ip.octets(),
        ports: Vec::new(),
        l2,
        pipeline,
        // The L2 switch sends Missing reports as the UDP one does (PROTOCOL.md §5).
        gap_reports: true,
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
                    ina_switch::metrics::render_frames(snapshot.as_ref())
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
