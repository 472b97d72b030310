//! `ina switch`: the software switch daemon.
//!
//! Prints one JSON line when it is ready (`{"event":"ready","udp":...,"control":...}`) and one
//! when it stopped (`{"event":"stopped","stats":...}`) on stdout; logs go to stderr.

use anyhow::{bail, Context};
use ina_switch::{ControlServer, Switch, SwitchConfig};
use ina_switch_api::{JobKeys, JobSpec, UplinkKeys};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SwitchArgs {
    /// Manage the controller's switches instead of running one.
    #[command(subcommand)]
    pub(crate) manage: Option<crate::cmd_controller::SwitchCommand>,
    /// UDP address to serve workers on.
    #[arg(long)]
    listen: Option<SocketAddr>,
    #[command(flatten)]
    dpdk: crate::dpdk_args::DpdkArgs,
    /// Threads; the block of 64 slots `b` (slots `64b..64b+64`) belongs to thread `b mod shards`.
    #[arg(long)]
    shards: Option<usize>,
    /// TCP address of the control endpoint (JSON lines: add_job, remove_job, jobs, stats).
    /// Beyond loopback it needs --control-token.
    #[arg(long)]
    control: Option<SocketAddr>,
    /// Access token the control endpoint requires as every connection's first request
    /// (`{"op":"auth","token":...}`), 16 to 256 printable characters.
    #[arg(long, env = "INA_SWITCH_TOKEN", hide_env_values = true)]
    control_token: Option<String>,
    /// Control connections served at once; one more is told so and closed.
    #[arg(long, default_value_t = 32)]
    control_max_connections: usize,
    /// Seconds a control connection may stay without a request before it is closed.
    #[arg(long, default_value_t = 60)]
    control_idle_s: u64,
    /// A TOML file with any of the settings below and `[[job]]` tables.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A job: "id=1;slots=0..128;elems=256;workers=127.0.0.1:9000,127.0.0.1:9001"
    /// (worker r's address is the r-th), optionally ";group=239.1.0.1:18800", a multicast
    /// group the workers joined, to which each result is sent once. With --ports, each worker
    /// is INTERFACE/MAC/IP:UDP_PORT instead. Repeatable. A rack switch of an aggregation tree
    /// adds its upper switch: ";uplink=ADDR;uplink_rank=R;uplink_epoch=E" (the upper switch's
    /// job must be given that epoch=E), and ";uplink_job=J;uplink_slot=S" when the job's id or
    /// first slot differ there.
    #[arg(long = "job")]
    jobs: Vec<String>,
    /// Serve raw Ethernet ports instead of a UDP socket (the L2 software switch, as a P4
    /// switch sits on the wire): interface names, port i being the i-th. Needs root.
    #[arg(long, value_delimiter = ',')]
    ports: Option<Vec<String>>,
    /// With --ports: the switch's own MAC address.
    #[arg(long, requires = "ports")]
    mac: Option<String>,
    /// With --ports: the switch's own IPv4 address (it answers ARP for it).
    #[arg(long, requires = "ports")]
    ip: Option<std::net::Ipv4Addr>,
    /// With --ports: a static L2 entry MAC=INTERFACE for ordinary traffic (every job's worker
    /// MACs are added by themselves). Repeatable.
    #[arg(long, requires = "ports")]
    l2: Vec<String>,
    /// With --ports: the largest IP packet the ports carry (jumbo frames: 9000).
    #[arg(long, default_value_t = 1500, requires = "ports")]
    mtu: usize,
    /// Aggregation slots in the register pool.
    #[arg(long)]
    pool_slots: Option<u16>,
    /// Largest elements per packet a job may use (the register pool holds this many values
    /// per slot and set) [default: 256, or the largest `elems` of the jobs given at start].
    #[arg(long)]
    max_elems: Option<u16>,
    /// Drop each datagram with this probability on the way in, and again on the way out.
    #[arg(long)]
    loss: Option<f64>,
    /// Seed of the loss injection.
    #[arg(long)]
    seed: Option<u64>,
    /// Serve the counters in Prometheus' text format at http://ADDR/metrics.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Log statistics every this many seconds (0: never).
    #[arg(long, default_value_t = 0.0)]
    stats_every: f64,
}

/// The config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    shards: Option<usize>,
    control: Option<SocketAddr>,
    pool_slots: Option<u16>,
    max_elems: Option<u16>,
    loss: Option<f64>,
    seed: Option<u64>,
    #[serde(default)]
    job: Vec<JobSpec>,
}

/// The largest elements per packet the switch takes: `given` (by --max-elems or the config
/// file), which must cover every job given at start, or else 256 raised to the largest job's.
/// `jobs` are `(where the job was given, its elements per packet)`.
pub fn size_max_elems(given: Option<u16>, jobs: &[(String, u16)]) -> anyhow::Result<u16> {
    let largest = jobs.iter().max_by_key(|(_, e)| *e);
    let max = match (given, largest) {
        (Some(m), Some((job, e))) if *e > m => bail!(
            "--max-elems {m} is below the {e} elements per packet of {job}: pass --max-elems {e} or more (or drop it: it defaults to the largest job's)"
        ),
        (Some(m), _) => m,
        (None, Some((_, e))) => (*e).max(DEFAULT_MAX_ELEMS),
        (None, None) => DEFAULT_MAX_ELEMS,
    };
    if usize::from(max) > crate::bench::MAX_UDP_ELEMS {
        bail!(
            "--max-elems {max} does not fit a UDP datagram (at most {})",
            crate::bench::MAX_UDP_ELEMS
        );
    }
    Ok(max)
}

/// `--max-elems` when neither it nor any job says otherwise.
const DEFAULT_MAX_ELEMS: u16 = 256;

pub fn run(args: SwitchArgs) -> anyhow::Result<()> {
    if let Some(ports) = args.ports {
        if args.listen.is_some() || args.shards.is_some() || args.control.is_some() {
            bail!("--ports serves raw Ethernet ports: --listen, --shards and --control are for the UDP switch");
        }
        if args.config.is_some() || args.loss.is_some() {
            bail!("--ports takes its jobs from --job flags; --config and --loss are for the UDP switch");
        }
        let mut sizes = Vec::new();
        for j in &args.jobs {
            let (common, _) =
                UplinkKeys::split(j).map_err(|e| anyhow::anyhow!("--job `{j}`: {e}"))?;
            let keys = JobKeys::parse(&common).map_err(|e| anyhow::anyhow!("--job `{j}`: {e}"))?;
            sizes.push((format!("--job `{j}`"), keys.elems));
        }
        let max_elems = Some(size_max_elems(args.max_elems, &sizes)?);
        return crate::cmd_switch_ports::run(crate::cmd_switch_ports::PortsArgs {
            ports,
            mac: args.mac,
            ip: args.ip,
            l2: args.l2,
            jobs: args.jobs,
            pool_slots: args.pool_slots,
            max_elems,
            mtu: args.mtu,
            stats_every: args.stats_every,
            metrics: args.metrics,
        });
    }
    let file: FileConfig = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
        }
        None => FileConfig::default(),
    };
    let listen = args
        .listen
        .or(file.listen)
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], ina_wire::UDP_PORT)));
    let mut cfg = SwitchConfig::new(listen);
    if let Some(s) = args.shards.or(file.shards) {
        cfg.shards = s;
    }
    if let Some(p) = args.pool_slots.or(file.pool_slots) {
        cfg.pipeline.pool_slots = p;
    }
    if let Some(l) = args.loss.or(file.loss) {
        if !(0.0..1.0).contains(&l) {
            bail!("--loss must be in [0, 1), got {l}");
        }
        cfg.loss = l;
    }
    if let Some(s) = args.seed.or(file.seed) {
        cfg.seed = s;
    }
    let mut sizes: Vec<(String, u16)> = file
        .job
        .iter()
        .map(|j| (format!("job {} of --config", j.job), j.elems_per_packet))
        .collect();
    cfg.jobs = file.job;
    for j in &args.jobs {
        let job: JobSpec = j.parse().map_err(|e| anyhow::anyhow!("--job `{j}`: {e}"))?;
        sizes.push((format!("--job `{j}`"), job.elems_per_packet));
        cfg.jobs.push(job);
    }
    cfg.pipeline.max_elems = size_max_elems(args.max_elems.or(file.max_elems), &sizes)?;
    let control_addr = args.control.or(file.control);

    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())
        .context("installing the SIGINT handler")?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())
        .context("installing the SIGTERM handler")?;

    let switch = match args.dpdk.port {
        crate::dpdk_args::PortKind::Udp => Switch::bind(cfg).context("starting the switch")?,
        crate::dpdk_args::PortKind::Dpdk => {
            if cfg.shards != 1 {
                bail!("--port dpdk runs one shard (one queue of one device): drop --shards");
            }
            let local = crate::dpdk_args::DpdkArgs::local(listen, "--listen")?;
            #[cfg(feature = "dpdk")]
            {
                let port = args.dpdk.open(local, Vec::new())?;
                Switch::with_dpdk(cfg, port).context("starting the switch")?
            }
            #[cfg(not(feature = "dpdk"))]
            {
                let _ = local;
                return Err(args.dpdk.unavailable());
            }
        }
    };
    let handle = switch.handle();
    let mut control_local = None;
    let control_thread = match control_addr {
        Some(addr) => {
            let limits = ina_switch::ControlLimits {
                token: args.control_token.clone(),
                max_connections: args.control_max_connections.max(1),
                idle: Duration::from_secs(args.control_idle_s.max(1)),
                ..Default::default()
            };
            let server = ControlServer::bind_with(addr, handle.clone(), limits)?;
            control_local = Some(server.local_addr()?);
            Some(server.spawn(stop.clone())?)
        }
        None => None,
    };
    let metrics = match args.metrics {
        Some(addr) => {
            let handle = handle.clone();
            let server = ina_io::metrics::MetricsServer::spawn(
                addr,
                move || ina_switch::metrics::render(handle.stats().ok().as_ref()),
                stop.clone(),
            )?;
            tracing::info!(addr = %server.local_addr, "metrics endpoint");
            Some(server)
        }
        None => None,
    };
    let ready = serde_json::json!({
        "event": "ready",
        "metrics": metrics.as_ref().map(|m| m.local_addr.to_string()),
        "udp": switch.local_addr().to_string(),
        "control": control_local.map(|a| a.to_string()),
        "steered": switch.steered(),
        "jobs": handle.jobs(),
    });
    // The ready line goes out once the shards answer, so that a request sent after it (to
    // the control port or the metrics endpoint) finds the switch running: printed before
    // `run`, a scrape on a busy machine got an empty page.
    let ready_thread = {
        let handle = handle.clone();
        let stop = stop.clone();
        let udp = switch.local_addr();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if handle.wait_running(Duration::from_millis(100)) {
                    println!("{ready}");
                    tracing::info!(%udp, control = ?control_local, "switch ready");
                    return;
                }
            }
        })
    };

    // Logs the statistics every --stats-every seconds, and warns, within a second, when the
    // upper switch of a tree starts refusing this switch's partial sums.
    let stats_thread = Some({
        let log_every = (args.stats_every > 0.0).then(|| Duration::from_secs_f64(args.stats_every));
        let stop = stop.clone();
        let handle = handle.clone();
        std::thread::spawn(move || {
            let mut last_log = std::time::Instant::now();
            let mut last_check = std::time::Instant::now();
            let mut upstream_rejects = 0;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                let log_due = log_every.is_some_and(|e| last_log.elapsed() >= e);
                if !log_due && last_check.elapsed() < Duration::from_secs(1) {
                    continue;
                }
                last_check = std::time::Instant::now();
                let Ok(s) = handle.stats() else { continue };
                let t = &s.total;
                if t.pipeline.upstream_rejects > upstream_rejects {
                    upstream_rejects = t.pipeline.upstream_rejects;
                    tracing::warn!(
                        upstream_rejects,
                        "the upper switch refuses this switch's partial sums: check the jobs' uplink (address, job, rank, epoch) against the upper switch's jobs; if it restarted, install its jobs again under the epoch the uplinks name"
                    );
                }
                if log_due {
                    last_log = std::time::Instant::now();
                    tracing::info!(
                        packets = t.pipeline.packets_in,
                        results = t.pipeline.results_multicast,
                        results_to_workers = t.results_to_workers,
                        results_to_group = t.results_to_group,
                        partials_sent = t.pipeline.partials_sent,
                        partials_resent = t.pipeline.partials_resent
                            + t.pipeline.partials_reported
                            + t.pipeline.partials_for_fetch,
                        queries_up = t.pipeline.queries_up,
                        drops = t.pipeline.drops_total(),
                        unknown_source = t.unknown_source,
                        busy_slots = t.busy_slots,
                        rx_bytes = t.io.rx_bytes,
                        tx_bytes = t.io.tx_bytes,
                        "stats"
                    );
                }
            }
        })
    });

    let stats = switch.run(stop.clone());
    stop.store(true, Ordering::SeqCst);
    let _ = ready_thread.join();
    if let Some(t) = control_thread {
        let _ = t.join();
    }
    if let Some(t) = stats_thread {
        let _ = t.join();
    }
    let stats = stats.context("switch failed")?;
    let stopped = serde_json::json!({
        "event": "stopped",
        "stats": stats,
        "peak_rss_kib": crate::mem::peak_rss_kib(),
    });
    println!("{stopped}");
    tracing::info!(
        packets = stats.total.pipeline.packets_in,
        drops = stats.total.pipeline.drops_total(),
        "switch stopped"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_elems_covers_every_job_or_names_the_flag() {
        let jobs = |e: &[u16]| -> Vec<(String, u16)> {
            e.iter().map(|e| (format!("job of {e}"), *e)).collect()
        };
        assert_eq!(size_max_elems(None, &[]).unwrap(), 256);
        assert_eq!(size_max_elems(None, &jobs(&[64])).unwrap(), 256);
        assert_eq!(
            size_max_elems(None, &jobs(&[64, 2048, 1024])).unwrap(),
            2048
        );
        assert_eq!(size_max_elems(Some(64), &jobs(&[64])).unwrap(), 64);
        let e = size_max_elems(Some(256), &jobs(&[64, 2048]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--max-elems 256"), "{e}");
        assert!(e.contains("job of 2048"), "{e}");
        assert!(e.contains("--max-elems 2048 or more"), "{e}");
        assert!(size_max_elems(Some(u16::MAX), &[]).is_err());
        assert!(size_max_elems(None, &jobs(&[u16::MAX])).is_err());
    }

    #[test]
    fn config_file_parses() {
        let f: FileConfig = toml::from_str(
            r#"
            listen = "127.0.0.1:18766"
            shards = 2
            [[job]]
            job = 1
            slot_base = 0
            slot_count = 64
            elems_per_packet = 256
            workers = ["127.0.0.1:9000", "127.0.0.1:9001"]
            [[job]]
            job = 2
            slot_base = 64
            slot_count = 64
            elems_per_packet = 256
            workers = ["127.0.0.1:9002"]
            group = "239.1.0.2:18800"
            "#,
        )
        .unwrap();
        assert_eq!(f.shards, Some(2));
        assert_eq!(f.job.len(), 2);
        assert_eq!(f.job[0].group, None);
        assert_eq!(f.job[1].group, Some("239.1.0.2:18800".parse().unwrap()));
        assert!(toml::from_str::<FileConfig>("shardz = 2").is_err());
    }
}
