//! `ina worker`: one worker process. All-reduces generated tensors (see `data.rs`) through a
//! switch or a TCP ring and reports one JSON line per event on stdout:
//!
//! - `{"event":"bound","udp":ADDR}` or `{"event":"bound","ring":ADDR}` once its socket is bound
//!   (a ring worker given `--peers -` then reads the peers' addresses, a JSON array, from stdin);
//! - `{"event":"joined",...}` once the switch answered its probe;
//! - `{"event":"iteration",...}` per all-reduce (`retransmissions` counts packets sent again
//!   to repair a loss, `fast_retransmissions` those of them found by later answers;
//!   `stall_probes`, sent on no evidence of loss, are counted apart);
//! - `{"event":"done",...}` or `{"event":"error","kind":...,"message":...}` at the end.
//!
//! The exit status is 0 when every iteration ran and verified, 2 on an error, 3 when a result
//! was outside its bound.

use crate::bench::runner::{run_iterations, InaReducer, IterRecord, Reducer, RingReducer};
use crate::data::{input, Reference, Shape, Sparse};
use anyhow::Context;
use ina_io::{Port, UdpConfig, UdpPort};
use ina_proto::window::WindowConfig;
use ina_worker::ring::{RingComm, RingOptions};
use ina_worker::{Communicator, WorkerConfig};
use std::io::{BufRead, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkerAlgorithm {
    Ina,
    Ring,
    /// The sparse all-gather baseline over the ring's connections (OmniReduce's AGsparse).
    Agsparse,
}

#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[arg(long, value_enum, default_value = "ina")]
    algorithm: WorkerAlgorithm,
    /// The switch's UDP address (ina).
    #[arg(long)]
    switch: Option<SocketAddr>,
    /// Local address: the UDP address the switch lists for this rank (ina), or the TCP
    /// listener of the ring.
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
    #[arg(long, default_value_t = 1)]
    job: u16,
    /// This worker's rank in the job (its data and the check of the sums follow it). With
    /// --job-name, the rank to join as (default: the lowest free one).
    #[arg(long, required_unless_present = "job_name")]
    rank: Option<u16>,
    /// Workers in the job: all of them, whatever switch each is attached to.
    #[arg(long, required_unless_present = "job_name")]
    workers: Option<usize>,
    /// Ina: join this job through the controller (--controller), which gives the switch, the
    /// job number, the rank and the number of workers, and installs the job once all its
    /// workers have joined. --bind must then be this worker's own IP address.
    #[arg(long, conflicts_with_all = ["switch", "workers", "switch_rank"])]
    job_name: Option<String>,
    /// The controller's API address, with --job-name.
    #[arg(long, env = "INA_CONTROLLER", default_value = "127.0.0.1:7070")]
    controller: String,
    /// The controller's access token, with --job-name.
    #[arg(long, env = "INA_CONTROLLER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A file holding the controller's access token, with --job-name and without --token
    /// [default: ina-controller/token, for a controller on loopback].
    #[arg(long, env = "INA_CONTROLLER_TOKEN_FILE")]
    token_file: Option<std::path::PathBuf>,
    /// With --job-name: how long to wait for the other workers to join, milliseconds.
    #[arg(long, default_value_t = 60_000)]
    join_timeout_ms: u64,
    /// Ina, when the switch is a rack switch of an aggregation tree: this worker's rank on
    /// that switch (the switch lists this many fewer workers than --workers, and every
    /// result sums all --workers).
    #[arg(long)]
    switch_rank: Option<u8>,
    /// Whether the job is aggregated in a tree (the controller says so; else --switch-rank
    /// does).
    #[arg(skip)]
    tree: Option<bool>,
    /// Ina: keep a delay-based AIMD window of packets in flight instead of filling every slot
    /// (for jobs that share links): it grows while results come back within the smallest
    /// round trip seen plus --target-queueing-us, and shrinks in proportion beyond.
    #[arg(long)]
    adaptive_window: bool,
    /// With --adaptive-window: the queueing delay allowed above the smallest round trip,
    /// microseconds (a kernel UDP path's round trip varies by tens of microseconds by itself).
    #[arg(long, default_value_t = 200.0)]
    target_queueing_us: f64,
    /// Ring peers, `rank`-th is this worker; `-` reads a JSON array from stdin after binding.
    #[arg(long)]
    peers: Option<String>,
    /// Float32 elements per tensor.
    #[arg(long, default_value_t = 1 << 20)]
    elements: usize,
    #[arg(long, default_value_t = 3)]
    iterations: usize,
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Seed of the generated tensors (every worker of a run must use the same).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Slots per stream (default: all the job's slots).
    #[arg(long)]
    window: Option<u16>,
    /// Give up on a packet unanswered this long.
    #[arg(long, default_value_t = 5000)]
    give_up_ms: u64,
    /// Wait this long for the switch to answer the job probe.
    #[arg(long, default_value_t = 20_000)]
    probe_timeout_ms: u64,
    /// Ring: how long to keep trying to connect to the next peer (and to wait for the
    /// previous one) before failing.
    #[arg(long, default_value_t = 30_000)]
    connect_timeout_ms: u64,
    /// Ring: the TCP congestion control of its connections (`cubic`, `bbr`, ...; default: the
    /// system's, net.ipv4.tcp_congestion_control).
    #[arg(long)]
    tcp_congestion: Option<String>,
    /// Ina: serve this worker's counters (packets, results, resends by cause, RTT) in
    /// Prometheus' text format at http://ADDR/metrics, updated after every all-reduce.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Skip checking results against the exact sums.
    #[arg(long)]
    no_verify: bool,
    #[command(flatten)]
    dpdk: crate::dpdk_args::DpdkArgs,
    /// The multicast group the switch sends the job's results to (ina; the job's `group`).
    /// Without it the worker joins the group the switch names for the job, if any; a group
    /// other than the job's fails the worker with `job_mismatch`.
    #[arg(long)]
    group: Option<std::net::SocketAddrV4>,
    /// Ina: send each tensor dense, sparse (only the blocks some worker holds: the support
    /// stream, then the values stream over the union) or as the union density measured by
    /// the previous all-reduce says (auto). Every worker of a job must use the same.
    #[arg(long, default_value = "dense")]
    mode: ina_worker::Mode,
    /// Make the generated tensor sparse: each worker holds about this fraction of its blocks
    /// (of --sparse-block elements), the others are zeros.
    #[arg(long)]
    density: Option<f64>,
    /// With --density: how the held blocks are laid out.
    #[arg(long, value_enum, default_value = "uniform")]
    shape: Shape,
    /// With --density: elements per block (ina sends blocks of its packets' elements: give
    /// the same count) [default: 256].
    #[arg(long, default_value_t = 256)]
    sparse_block: usize,
}

fn emit(value: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

fn fail(kind: &str, message: String) -> ! {
    emit(serde_json::json!({"event": "error", "kind": kind, "message": message}));
    std::process::exit(2);
}

/// The delay-based window of `--adaptive-window`, allowing `target_queueing_us` of queueing
/// above the smallest round trip (the other settings as [`WindowConfig::default`]); refused
/// unless it is a positive number of microseconds. `ina bench` builds its workers' windows here
/// too.
pub(crate) fn adaptive_window(target_queueing_us: f64) -> anyhow::Result<WindowConfig> {
    if !(target_queueing_us.is_finite() && target_queueing_us > 0.0) {
        anyhow::bail!("--target-queueing-us must be a positive number of microseconds");
    }
    Ok(WindowConfig {
        target_queueing: Duration::from_secs_f64(target_queueing_us * 1e-6),
        ..WindowConfig::default()
    })
}

pub fn run(mut args: WorkerArgs) -> anyhow::Result<()> {
    // With --job-name: the port the controller knows, and the membership that heartbeats
    // and holds the communicator while the controller moves the job.
    let (prebound, membership) = match args.job_name.clone() {
        Some(name) => {
            let (port, member) = join_through_controller(&mut args, &name)?;
            (Some(port), member)
        }
        None => (None, None),
    };
    let (Some(arg_rank), Some(workers)) = (args.rank, args.workers) else {
        anyhow::bail!("--rank and --workers are required without --job-name");
    };
    let rank = usize::from(arg_rank);
    if rank >= workers {
        anyhow::bail!("--rank {arg_rank} but only {workers} workers");
    }
    if args.density.is_some_and(|d| !(d > 0.0 && d <= 1.0)) {
        anyhow::bail!("--density must be a fraction of the blocks in (0, 1]");
    }
    if args.sparse_block == 0 {
        anyhow::bail!("--sparse-block must be at least 1");
    }
    let sparse = args.density.map(|density| Sparse {
        shape: args.shape,
        density,
        block: args.sparse_block,
    });
    let input = input(args.seed, rank, args.elements, sparse.as_ref());
    let mut block_elems = 256;
    // The metrics endpoint, served until the worker exits.
    let mut metrics = None;
    let mut reducer: Box<dyn Reducer> = match args.algorithm {
        WorkerAlgorithm::Ina => {
            let switch = args.switch.context("--switch is required for ina")?;
            let (reducer, elems, server) = match args.dpdk.port {
                crate::dpdk_args::PortKind::Udp => {
                    let mut port = match prebound {
                        Some(p) => p,
                        None => UdpPort::bind_with(args.bind, &UdpConfig::default())
                            .with_context(|| format!("binding {}", args.bind))?,
                    };
                    if let Some(group) = args.group {
                        port.join_group(group)
                            .with_context(|| format!("joining {group}"))?;
                    }
                    emit(
                        serde_json::json!({"event": "bound", "udp": port.local_addr().to_string()}),
                    );
                    ina_reducer(port, &args, switch, arg_rank, workers, &membership, None)?
                }
                crate::dpdk_args::PortKind::Dpdk => {
                    if args.job_name.is_some() {
                        anyhow::bail!("--port dpdk with --job-name is not supported: give --switch, --rank and --workers");
                    }
                    let local = crate::dpdk_args::DpdkArgs::local(args.bind, "--bind")?;
                    if args.dpdk.dpdk_device.len() > 1 {
                        anyhow::bail!("--dpdk-device: a worker uses one device");
                    }
                    let SocketAddr::V4(switch4) = switch else {
                        anyhow::bail!("--port dpdk: --switch {switch} must be an IPv4 address");
                    };
                    let groups: Vec<_> = args.group.into_iter().collect();
                    #[cfg(feature = "dpdk")]
                    {
                        let mut port = args.dpdk.open(local, groups)?;
                        let mac = port
                            .resolve(*switch4.ip(), Duration::from_millis(args.probe_timeout_ms))
                            .context("resolving the switch's MAC address")?;
                        emit(serde_json::json!({
                            "event": "bound", "dpdk": local.to_string(),
                            "device": port.devices().iter().map(|d| d.name()).collect::<Vec<_>>(),
                            "switch_mac": format!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]),
                        }));
                        // The path's MTU is the device's largest frame's.
                        let mtu = port
                            .devices()
                            .iter()
                            .map(|d| d.max_frame().saturating_sub(14))
                            .min();
                        ina_reducer(port, &args, switch, arg_rank, workers, &membership, mtu)?
                    }
                    #[cfg(not(feature = "dpdk"))]
                    {
                        let _ = (switch4, local, groups);
                        return Err(args.dpdk.unavailable());
                    }
                }
            };
            block_elems = elems;
            metrics = server;
            reducer
        }
        WorkerAlgorithm::Ring | WorkerAlgorithm::Agsparse => {
            let listener =
                TcpListener::bind(args.bind).with_context(|| format!("binding {}", args.bind))?;
            let local = listener.local_addr()?;
            emit(serde_json::json!({"event": "bound", "ring": local.to_string()}));
            let peers: Vec<SocketAddr> = match args.peers.as_deref() {
                Some("-") => {
                    let mut line = String::new();
                    std::io::stdin().lock().read_line(&mut line)?;
                    serde_json::from_str(&line).context("reading the peers from stdin")?
                }
                Some(list) => list
                    .split(',')
                    .map(|a| a.trim().parse())
                    .collect::<Result<_, _>>()
                    .context("parsing --peers")?,
                None => anyhow::bail!("--peers is required for ring"),
            };
            if peers.len() != workers {
                anyhow::bail!("{} peers for {workers} workers", peers.len());
            }
            if args.connect_timeout_ms == 0 {
                anyhow::bail!("--connect-timeout-ms must be at least 1");
            }
            let opts = RingOptions::default()
                .with_job_id(u64::from(args.job))
                .with_connect_timeout(Duration::from_millis(args.connect_timeout_ms))
                .with_congestion(args.tcp_congestion.clone());
            match RingComm::connect_with_listener(rank, listener, &peers, opts) {
                Ok(comm) => {
                    let sparse = args.algorithm == WorkerAlgorithm::Agsparse;
                    if sparse {
                        block_elems = args.sparse_block;
                    }
                    Box::new(RingReducer {
                        comm,
                        sparse_block: sparse.then_some(args.sparse_block),
                    })
                }
                Err(e) => fail("ring", e.to_string()),
            }
        }
    };
    let reference = (!args.no_verify).then(|| {
        Reference::of(
            args.seed,
            workers,
            args.elements,
            block_elems,
            sparse.as_ref(),
        )
    });
    let mut bad = false;
    let result = run_iterations(
        reducer.as_mut(),
        &input,
        &mut Vec::new(),
        reference.as_ref(),
        args.warmup,
        args.iterations,
        &mut |r: &IterRecord| {
            bad |= r.violations.is_some_and(|v| v > 0);
            let mut v = serde_json::to_value(r).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("event".into(), "iteration".into());
            }
            emit(v);
        },
    );
    let _metrics = metrics;
    match result {
        Ok(_) => {
            emit(serde_json::json!({
                "event": "done",
                "peak_rss_kib": crate::mem::peak_rss_kib(),
                "verified": reference.is_some() && !bad,
            }));
            if bad {
                std::process::exit(3);
            }
            Ok(())
        }
        Err(e) => fail(&e.kind, e.message),
    }
}

/// With --job-name: binds this worker's port, joins the job through the controller, waits
/// until every worker has joined and the job is installed, and fills in the switch, the job
/// number, the rank and the number of workers. Returns the bound port.
fn join_through_controller(
    args: &mut WorkerArgs,
    name: &str,
) -> anyhow::Result<(UdpPort, Option<Membership>)> {
    if !matches!(args.algorithm, WorkerAlgorithm::Ina) {
        anyhow::bail!(
            "--job-name joins an ina job through the controller: not for --algorithm ring"
        );
    }
    let token = crate::cmd_controller::client_token(
        &args.controller,
        args.token.clone(),
        args.token_file.as_deref(),
    )?;
    let client = ina_controller::client::Client::new(&args.controller, token);
    let ina_controller_client::join::JoinedJob { port, joined, job } =
        ina_controller_client::join::join(
            &client,
            name,
            args.rank,
            args.bind,
            &UdpConfig::default(),
            Duration::from_millis(args.join_timeout_ms),
        )?;
    let me = port.local_addr();
    emit(serde_json::json!({
        "event": "provisioned", "job_name": name, "job": joined.job, "rank": joined.rank,
        "workers": joined.workers, "switch": joined.switch.to_string(), "udp": me.to_string(),
    }));
    // Everything the controller gave this worker: the switch, its job's slots and epoch,
    // and its peers by rank (the ring's order).
    emit(serde_json::json!({
        "event": "installed", "job_name": name, "switch": joined.switch.to_string(),
        "slots": job.slots, "window": job.slots.map(|r| r.count), "epoch": job.epoch,
        "peers": job.members.iter().map(|(_, a)| a.to_string()).collect::<Vec<_>>(),
    }));
    let membership = match job.request.heartbeat_ms {
        Some(period) => {
            let gate = std::sync::Arc::new(ina_worker::Gate::new());
            let job_name = name.to_string();
            let member = ina_controller::member::Member::spawn(
                client,
                name.to_string(),
                joined.rank,
                Duration::from_millis(u64::from(period.max(1))),
                gate.clone(),
                move |missing| {
                    fail(
                        "job_failed",
                        format!(
                            "job {job_name:?}: ranks {missing:?} stopped sending heartbeats, and the controller removed the job from its switch"
                        ),
                    )
                },
            )
            .context("starting the heartbeat thread")?;
            Some((gate, member))
        }
        None => None,
    };
    args.switch = Some(joined.switch);
    args.job = joined.job;
    args.rank = Some(joined.rank);
    args.switch_rank = Some(joined.switch_rank);
    args.tree = Some(joined.tree);
    args.workers = Some(usize::from(joined.workers));
    Ok((port, membership))
}

/// A worker's membership of its job: the gate its communicator is behind, and the thread
/// that heartbeats (every period; a job that failed ends the worker with a `job_failed` error
/// naming the missing ranks) and holds the gate while the controller moves the job. A
/// controller that cannot be reached changes nothing: the switch does not need it.
type Membership = (
    std::sync::Arc<ina_worker::Gate>,
    ina_controller::member::Member,
);

/// The ina reducer of this worker on `port` (a kernel UDP socket or a DPDK device): the
/// communicator behind the controller's gate, the `joined` line, and the metrics endpoint.
/// Returns it with the job's elements per packet and the metrics server, if any.
fn ina_reducer<P: ina_io::Port<Addr = SocketAddr> + 'static>(
    port: P,
    args: &WorkerArgs,
    switch: SocketAddr,
    arg_rank: u16,
    workers: usize,
    membership: &Option<Membership>,
    mtu: Option<usize>,
) -> anyhow::Result<(
    Box<dyn Reducer>,
    usize,
    Option<ina_io::metrics::MetricsServer>,
)> {
    let mut metrics = None;
    let switch_rank = match args.switch_rank {
        Some(r) => r,
        None => u8::try_from(arg_rank).ok().filter(|r| usize::from(*r) < 32).context(
            "--rank: a switch takes ranks 0 to 31 of a job (add --switch-rank for a rack switch of a tree)",
        )?,
    };
    let mut cfg = WorkerConfig::new(switch, port.local_addr(), args.job, switch_rank);
    cfg.window = args.window;
    if let Some(m) = mtu {
        cfg.mtu = Some(m);
    }
    cfg.give_up = Duration::from_millis(args.give_up_ms);
    cfg.probe_timeout = Duration::from_millis(args.probe_timeout_ms);
    if args.tree.unwrap_or(args.switch_rank.is_some()) {
        cfg.total_workers = Some(
            u16::try_from(workers)
                .ok()
                .filter(|n| *n <= 1024)
                .context("--workers: an aggregation tree has at most 1024 workers")?,
        );
    } else {
        cfg.expect_workers = Some(
            u8::try_from(workers)
                .ok()
                .filter(|n| *n <= 32)
                .context("--workers: a switch takes at most 32 workers of a job (add --switch-rank for a rack switch of a tree)")?,
        );
    }
    cfg.group = args.group;
    cfg.mode = args.mode;
    if args.adaptive_window {
        cfg.window_control = Some(adaptive_window(args.target_queueing_us)?);
    }
    let mut comm = match Communicator::with_port(port, cfg) {
        Ok(c) => c,
        Err(e) => fail(e.kind(), e.to_string()),
    };
    if let Some((gate, _)) = &membership {
        comm.set_gate(gate.clone());
    }
    let job = comm.job();
    let block_elems = usize::from(job.info.elems_per_packet);
    emit(serde_json::json!({
        "event": "joined", "epoch": job.epoch, "window": job.window,
        "elems_per_packet": job.info.elems_per_packet, "workers": job.info.workers,
        "group": job.group.map(|g| g.to_string()),
    }));
    let mut reducer = InaReducer::new(comm);
    if let Some(addr) = args.metrics {
        let totals = std::sync::Arc::new(std::sync::Mutex::new(
            ina_worker::metrics::StreamTotals::default(),
        ));
        reducer.totals = Some(totals.clone());
        let server = ina_io::metrics::MetricsServer::spawn(
            addr,
            move || {
                let t = totals.lock().map(|t| *t).unwrap_or_default();
                ina_worker::metrics::render(&t)
            },
            std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        )?;
        emit(serde_json::json!({"event": "metrics", "addr": server.local_addr.to_string()}));
        metrics = Some(server);
    }
    Ok((Box::new(reducer), block_elems, metrics))
}
