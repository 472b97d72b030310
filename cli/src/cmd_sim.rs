//! `ina sim`: one or more jobs of workers against the switch model in virtual time.
//!
//! Predicts completion time and goodput for a link speed, latency and loss, and checks every
//! run the same way the simulation tests do: all workers of a job end with identical bits,
//! within the quantizer's bound of the exact sum.

use crate::data::{fingerprint, generate, Bound, Reference};
use anyhow::bail;
use ina_sim::data::{Generated, Sparsity};
use ina_sim::{Data, LinkConfig, Scenario, SimJob, SparseData, WorkerSpec};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Workers per job: 1..=32 on one switch; with --rack-size up to 32 racks of workers.
    #[arg(long, default_value_t = 8)]
    pub(crate) workers: usize,
    /// Two levels of switches: racks of this many workers (1..=32) under rack switches, which
    /// send their partial sums to one upper switch (hierarchical aggregation). The workers
    /// of all jobs fill the racks in order. 0: every worker on one switch.
    #[arg(long, default_value_t = 0)]
    pub(crate) rack_size: usize,
    /// With --rack-size: the speed of each rack switch's link to the upper switch, Gbit/s
    /// (default: --gbps).
    #[arg(long)]
    pub(crate) uplink_gbps: Option<f64>,
    /// With --rack-size: the one-way latency of each rack switch's link to the upper switch,
    /// microseconds (default: --latency-us).
    #[arg(long)]
    pub(crate) uplink_latency_us: Option<f64>,
    /// With --rack-size: the buffer of each switch port on the links between the levels, KiB;
    /// a packet that finds it full is dropped (default: no limit).
    #[arg(long)]
    pub(crate) uplink_buffer_kib: Option<u64>,
    /// With --rack-size: the loss probability of the links between the levels, per packet and
    /// direction (default: --loss).
    #[arg(long)]
    pub(crate) uplink_loss: Option<f64>,
    /// With --rack-size: deal each job's ranks round-robin over the racks instead of filling
    /// racks job after job, so that every job crosses the uplinks and shares them.
    #[arg(long)]
    pub(crate) striped: bool,
    /// Each worker keeps a delay-based AIMD window of packets in flight (below --window)
    /// instead of filling every slot: jobs that share a link then take equal shares of it and
    /// keep its queue near --target-queueing-us. The base round trip it aims above is the
    /// topology's.
    #[arg(long)]
    pub(crate) adaptive_window: bool,
    /// With --adaptive-window: the queueing delay the jobs may add together, microseconds.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) target_queueing_us: f64,
    /// Jobs sharing the switch, each with its own slots.
    #[arg(long, default_value_t = 1)]
    pub(crate) jobs: usize,
    /// Float32 elements per tensor.
    #[arg(long, default_value_t = 1 << 20)]
    pub(crate) elements: usize,
    /// Elements per packet.
    #[arg(long, default_value_t = 256)]
    pub(crate) elems: u16,
    /// Slots per job (the window). The default is the larger of twelve bandwidth-delay
    /// products of the round trip between a worker and its own switch and eight of the round
    /// trip through every level of switches, in whole blocks of 64 (the switch's gap
    /// register): 1408 on one switch at the default link, 1856 with --rack-size. Lossless, two
    /// would do; under loss a use of a slot lasts as long as its repairs, and the link stays
    /// busy only while the window covers the mean use (docs/BENCHMARKS.md, "Loss in the
    /// simulator").
    #[arg(long)]
    pub(crate) window: Option<u16>,
    /// Link speed, Gbit/s.
    #[arg(long, default_value_t = 100.0)]
    pub(crate) gbps: f64,
    /// One-way link latency, microseconds.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) latency_us: f64,
    /// Loss probability per packet and direction.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) loss: f64,
    /// Duplication probability per packet and direction.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) duplicate: f64,
    /// Reordering probability per packet and direction.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) reorder: f64,
    /// Smallest retransmission timeout, microseconds (a data-center fabric's round trip is a
    /// few microseconds).
    #[arg(long, default_value_t = 100.0)]
    pub(crate) rto_min_us: f64,
    /// Full-size packets a worker's NIC holds before the worker stops handing it more, as a
    /// driver that polls its transmit ring keeps it (DPDK, AF_XDP); 0 for no limit (a deep
    /// kernel queue: every packet then waits behind the whole window, repairs included).
    #[arg(long, default_value_t = ina_sim::DEFAULT_NIC_QUEUE)]
    pub(crate) nic_queue: u32,
    /// Bytes each `ina` packet takes on every link beyond its datagram: 66 for UDP over IPv4
    /// on Ethernet (headers, preamble and inter-frame gap), 42 on the testbed's veth links
    /// (the shaper counts the Ethernet frame without preamble or FCS); 0 counts the datagram
    /// alone.
    #[arg(long, default_value_t = 0)]
    pub(crate) framing_bytes: u32,
    /// Runs once per loss probability in the list (per packet and direction; the lossless
    /// run is added) and reports each one's goodput as a fraction of the lossless run's,
    /// beside the ideal 1 − p and the ceiling of any loss recovery by repair on the same
    /// topology (one job; every loss found at once and repaired over its hop's round trip).
    #[arg(long, value_delimiter = ',')]
    pub(crate) sweep_loss: Vec<f64>,
    /// With --sweep-loss: an SVG of the fraction of lossless goodput against loss, with the
    /// ideal 1 − p and the ceiling drawn. With --cluster and several loads: an SVG of each scheme's mean and
    /// p99 completion time against load.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
    /// The slot-sharing experiment instead of the packet simulation: a stream of this many
    /// jobs (many small, a few large) sharing one switch's pool, under each of the
    /// controller's policies and the baselines (static partitions, ATP-like best effort);
    /// prints mean and tail job completion times (see docs/CONTROLLER.md).
    #[arg(long)]
    pub(crate) cluster: Option<usize>,
    /// With --cluster: arrivals at this many times the rate the pool serves at full windows;
    /// several (`0.5,1,1.5`) run the experiment at each, and with --plot draw mean and p99
    /// completion time against load.
    #[arg(long, value_delimiter = ',', default_value = "1.0")]
    pub(crate) cluster_load: Vec<f64>,
    /// With --cluster: the pool's slots.
    #[arg(long, default_value_t = 8192)]
    pub(crate) cluster_pool: u16,
    /// With --cluster: the rate of a job that aggregates on a host (best effort's fallback),
    /// Gbit/s.
    #[arg(long, default_value_t = 25.0)]
    pub(crate) cluster_host_gbps: f64,
    /// Make every worker's input from the seed block by block, and check the results as they
    /// come (rank 0 of each job against the exact sums, every rank by fingerprint), instead of
    /// holding each worker's tensor: memory no longer grows with workers × elements.
    #[arg(long)]
    pub(crate) generated: bool,
    /// Sparse tensors (implies --generated): each worker holds about this fraction of the
    /// blocks (ranks from half to one and a half times it) and all-reduces them as a sparse
    /// all-reduce: the support stream, then the values stream over the union.
    #[arg(long)]
    pub(crate) density: Option<f64>,
    /// With --density: how the workers' blocks overlap: `overlapping` (nested, as the hot rows
    /// of an embedding table), `independent` (each draws its own), `disjoint` (no block held by
    /// two workers).
    #[arg(long, default_value = "independent")]
    pub(crate) support: ina_sim::data::Pattern,
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Runs with seeds seed, seed+1, ...
    #[arg(long, default_value_t = 1)]
    pub(crate) seeds: u64,
    /// The links' MTU, for the ring's model (its TCP segments and acknowledgements).
    #[arg(long, default_value_t = 9000)]
    pub(crate) mtu: u32,
    /// Bytes of the ring's pipelined chunk, for its model.
    #[arg(long, default_value_t = 256 << 10)]
    pub(crate) ring_chunk_bytes: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// A TOML file describing the run: any of the flags above by name (`workers`, `jobs`,
    /// `rack_size`, `uplink_gbps`, `uplink_latency_us`, `elements`, `elems`, `window`,
    /// `gbps`, `latency_us`, `loss`, `duplicate`, `reorder`, `rto_min_us`, `nic_queue`,
    /// `framing_bytes`, `generated`, `seed`, `seeds`), `switch_restart_us` (the switch loses
    /// its state and comes back with the jobs under new epochs), and `[[fault]]` tables that name
    /// one worker (`job` from 1, `rank`) and change it: `starts_at_us`, `dies_at_us`, or its
    /// link (`loss`, `duplicate`, `reorder`, `gbps`, `latency_us`). The file's values replace
    /// the flags'.
    #[arg(long)]
    pub(crate) scenario: Option<PathBuf>,
    /// Leaves these loss-recovery rules out (comma-separated names), to measure what each is
    /// worth against the same seeds with every rule on (docs/design/RECOVERY.md lists them).
    #[arg(long, value_delimiter = ',')]
    pub(crate) without: Vec<ina_proto::stream::Rule>,
}

/// A `--scenario` file (see [`SimArgs::scenario`]).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SimFile {
    #[serde(default)]
    description: Option<String>,
    workers: Option<usize>,
    rack_size: Option<usize>,
    uplink_gbps: Option<f64>,
    uplink_latency_us: Option<f64>,
    uplink_buffer_kib: Option<u64>,
    uplink_loss: Option<f64>,
    striped: Option<bool>,
    adaptive_window: Option<bool>,
    target_queueing_us: Option<f64>,
    jobs: Option<usize>,
    elements: Option<usize>,
    elems: Option<u16>,
    window: Option<u16>,
    gbps: Option<f64>,
    latency_us: Option<f64>,
    loss: Option<f64>,
    duplicate: Option<f64>,
    reorder: Option<f64>,
    rto_min_us: Option<f64>,
    nic_queue: Option<u32>,
    framing_bytes: Option<u32>,
    generated: Option<bool>,
    seed: Option<u64>,
    seeds: Option<u64>,
    switch_restart_us: Option<f64>,
    #[serde(default)]
    fault: Vec<Fault>,
}

/// One worker changed by a scenario file.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Fault {
    /// The job, from 1.
    job: u16,
    rank: usize,
    starts_at_us: Option<f64>,
    dies_at_us: Option<f64>,
    loss: Option<f64>,
    duplicate: Option<f64>,
    reorder: Option<f64>,
    gbps: Option<f64>,
    latency_us: Option<f64>,
}

/// What a scenario file adds to the flags: faults and a switch restart.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    workers: Vec<Fault>,
    switch_restart_us: Option<f64>,
}

impl SimArgs {
    /// The slots per job: `--window`, or [`default_window`].
    pub(crate) fn window(&self) -> u16 {
        self.window.unwrap_or_else(|| default_window(self))
    }
}

/// The larger of twelve bandwidth-delay products of the round trip between a worker and its
/// own switch and eight of the round trip through every level (to the upper switch and back,
/// with racks), in packets of `--elems` elements with their frame headers, rounded up to whole
/// blocks of 64 slots: 1408 on one switch at the default link, 1856 in racks.
fn default_window(args: &SimArgs) -> u16 {
    let own_rtt_s = 2.0 * args.latency_us * 1e-6;
    let mut rtt_s = own_rtt_s;
    if args.rack_size > 0 {
        rtt_s += 2.0 * args.uplink_latency_us.unwrap_or(args.latency_us) * 1e-6;
    }
    // Twelve round trips to the job's own switch, or eight through every level.
    let own = ina_proto::alloc::window_for(args.gbps, own_rtt_s * 1e6, args.elems);
    let through = ina_proto::alloc::window_of_bdps(8.0, args.gbps, rtt_s * 1e6, args.elems);
    own.max(through)
}

/// Reads `path` into `args`; returns its faults.
fn apply_file(path: &std::path::Path, args: &mut SimArgs) -> anyhow::Result<Faults> {
    let f: SimFile = crate::bench::read_toml(path)?;
    macro_rules! set {
        ($($field:ident),*) => { $( if let Some(v) = f.$field { args.$field = v; } )* };
    }
    // (The flags that are themselves optional.)
    macro_rules! set_some {
        ($($field:ident),*) => { $( if f.$field.is_some() { args.$field = f.$field; } )* };
    }
    set!(
        workers,
        jobs,
        elements,
        elems,
        gbps,
        latency_us,
        loss,
        duplicate,
        reorder,
        rto_min_us,
        nic_queue,
        framing_bytes,
        generated,
        seed,
        seeds,
        rack_size,
        striped,
        adaptive_window,
        target_queueing_us
    );
    set_some!(
        window,
        uplink_gbps,
        uplink_latency_us,
        uplink_buffer_kib,
        uplink_loss
    );
    if let Some(d) = &f.description {
        println!("scenario {}: {d}", path.display());
    }
    for x in &f.fault {
        let probability = |p: Option<f64>| p.is_none_or(|p| (0.0..=1.0).contains(&p));
        if !(probability(x.loss) && probability(x.duplicate) && probability(x.reorder))
            || x.gbps.is_some_and(|g| g.is_nan() || g <= 0.0)
            || x.latency_us.is_some_and(|l| l.is_nan() || l < 0.0)
        {
            bail!(
                "{}: the fault of job {} rank {} needs probabilities in [0, 1], a positive gbps and a latency of at least 0",
                path.display(),
                x.job,
                x.rank
            );
        }
        if x.job == 0 || usize::from(x.job) > args.jobs || x.rank >= args.workers {
            bail!(
                "{}: a fault names job {} rank {}, but the run has jobs 1..={} of ranks 0..{}",
                path.display(),
                x.job,
                x.rank,
                args.jobs,
                args.workers
            );
        }
    }
    Ok(Faults {
        workers: f.fault,
        switch_restart_us: f.switch_restart_us,
    })
}

/// Applies `faults` to the scenario's workers.
fn apply_faults(faults: &Faults, scenario: &mut Scenario) {
    let us = |x: f64| Duration::from_secs_f64(x.max(0.0) * 1e-6);
    for f in &faults.workers {
        let Some(w) = scenario
            .jobs
            .get_mut(usize::from(f.job) - 1)
            .and_then(|j| j.workers.get_mut(f.rank))
        else {
            continue;
        };
        if let Some(t) = f.starts_at_us {
            w.start_at = us(t);
        }
        if let Some(t) = f.dies_at_us {
            w.dies_at = Some(us(t));
        }
        let changed = [f.loss, f.duplicate, f.reorder, f.gbps, f.latency_us]
            .iter()
            .any(Option::is_some);
        if changed {
            let mut link = w.link.unwrap_or(scenario.link);
            link.loss = f.loss.unwrap_or(link.loss);
            link.duplicate = f.duplicate.unwrap_or(link.duplicate);
            link.reorder = f.reorder.unwrap_or(link.reorder);
            if let Some(g) = f.gbps {
                link.bandwidth_bps = Some((g * 1e9) as u64);
            }
            if let Some(l) = f.latency_us {
                link.latency = us(l);
            }
            w.link = Some(link);
        }
    }
    scenario.switch_restart_at = faults.switch_restart_us.map(us);
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct SimResult {
    pub(crate) seed: u64,
    pub(crate) job: u16,
    pub(crate) virtual_seconds: f64,
    pub(crate) goodput_gbit_per_s: f64,
    /// The 2(n-1)/n bytes-per-link lower bound of a ring at the same link speed, as a time.
    ring_bound_seconds: f64,
    /// The ring all-reduce of the same tensor on the same links, as `ina_sim::ring` models
    /// it (TCP framing at --mtu, its chunks' pipeline, retransmitted bytes).
    ring_model_seconds: Option<f64>,
    packets_sent: u64,
    retransmissions: u64,
    fast_retransmissions: u64,
    /// Packets sent again as stall probes, on no evidence of loss (not in
    /// `retransmissions`).
    stall_probes: u64,
    /// Queries asking again about a use that holds the worker's data and waits for another
    /// worker's repair (not in `retransmissions`).
    rechecks: u64,
    /// Packets sent again as header-only Queries (retransmissions, stall probes or
    /// rechecks).
    queries: u64,
    /// Second copies of the exponent lookahead's headers (not in `retransmissions`).
    lookahead_copies: u64,
    /// Pending answers the workers received.
    pending_answers: u64,
    /// Data sent again because a Pending answer showed it missing (included in
    /// `retransmissions`).
    resent_missing: u64,
    /// Missing reports of the switch that named an unanswered packet.
    missing_reports: u64,
    /// Data sent again because a Missing report named it (included in `retransmissions`).
    resent_reported: u64,
    /// Results the workers found lost by their gap counters and reported to the switch.
    results_reported: u64,
    /// Packets the links lost, both directions.
    packets_lost: u64,
    /// Bytes of `ina` packets the workers sent, retransmissions included.
    bytes_sent: u64,
    duplicate_results: u64,
    /// With --density: the fraction of blocks some worker held.
    union_density: Option<f64>,
    identical: bool,
    within_bound: bool,
    error: Option<String>,
}

pub fn run(mut args: SimArgs) -> anyhow::Result<()> {
    let faults = match args.scenario.clone() {
        Some(path) => apply_file(&path, &mut args)?,
        None => Faults::default(),
    };
    if let Some(n) = args.cluster {
        return crate::sim_cluster::run(&args, n);
    }
    if !args.sweep_loss.is_empty() {
        return crate::sim_sweep::run(args, &faults);
    }
    if args.plot.is_some() {
        bail!("--plot draws a --sweep-loss: add --sweep-loss 0.001,0.01,0.1 (for example)");
    }
    let results = simulate(&args, &faults)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&results)? + "\n")?;
    }
    if results.iter().any(|r| !r.ok()) {
        bail!("a simulated job failed or produced a wrong or inconsistent result");
    }
    Ok(())
}

impl SimResult {
    /// Finished, identical on every worker and within the quantizer's bound.
    pub(crate) fn ok(&self) -> bool {
        self.error.is_none() && self.identical && self.within_bound
    }
}

/// Runs every seed of `args` with `faults`, prints a line per job, returns them.
pub(crate) fn simulate(args: &SimArgs, faults: &Faults) -> anyhow::Result<Vec<SimResult>> {
    if args.rack_size > 32 {
        bail!("--rack-size must be 0 (one switch) or 1..=32 workers per rack");
    }
    if args.rack_size == 0
        && (args.uplink_gbps.is_some()
            || args.uplink_latency_us.is_some()
            || args.uplink_buffer_kib.is_some()
            || args.uplink_loss.is_some()
            || args.striped)
    {
        bail!("--uplink-gbps, --uplink-latency-us, --uplink-buffer-kib, --uplink-loss and --striped describe the racks: add --rack-size");
    }
    if args.uplink_loss.is_some_and(|p| !(0.0..1.0).contains(&p)) {
        bail!("--uplink-loss must be a probability in [0, 1)");
    }
    let max_workers = if args.rack_size == 0 {
        32
    } else {
        32 * args.rack_size
    };
    if args.workers == 0 || args.workers > max_workers {
        if args.rack_size == 0 {
            bail!("--workers must be 1..=32 on one switch (add --rack-size for up to 32 racks)");
        }
        bail!(
            "--workers must be 1..={max_workers}: a job spans at most 32 racks of --rack-size {}",
            args.rack_size
        );
    }
    if args.uplink_gbps.is_some_and(|g| g.is_nan() || g <= 0.0)
        || args
            .uplink_latency_us
            .is_some_and(|l| l.is_nan() || l < 0.0)
    {
        bail!("--uplink-gbps must be positive and --uplink-latency-us at least 0");
    }
    let window = args.window();
    if window == 0 {
        bail!("--window must be at least 1");
    }
    if args.density.is_some_and(|d| !(d > 0.0 && d <= 1.0)) {
        bail!("--density must be a fraction of the blocks in (0, 1]");
    }
    let generated = args.generated || args.density.is_some();
    if args.jobs == 0 || args.jobs * usize::from(window) > 60_000 {
        bail!("--jobs times --window must fit the switch's slots");
    }
    if args.gbps.is_nan() || args.gbps <= 0.0 {
        bail!("--gbps must be positive");
    }
    let link = LinkConfig {
        latency: Duration::from_secs_f64(args.latency_us * 1e-6),
        bandwidth_bps: Some((args.gbps * 1e9) as u64),
        loss: args.loss,
        duplicate: args.duplicate,
        reorder: args.reorder,
        reorder_delay: Duration::from_secs_f64(args.latency_us * 4e-6),
        buffer_bytes: None,
        framing_bytes: args.framing_bytes,
    };
    // (A generated run checks as it goes, without the reference's 12 bytes per element.)
    let reference = (!generated)
        .then(|| Reference::new(1, args.workers, args.elements, usize::from(args.elems)));
    let n = args.workers as f64;
    let bytes = args.elements as f64 * 4.0;
    let ring_bound = 2.0 * (n - 1.0) / n * bytes * 8.0 / (args.gbps * 1e9);
    let ring_model = ina_sim::ring::predict(&ina_sim::ring::RingModel {
        workers: args.workers,
        bytes: bytes as u64,
        chunk_bytes: args.ring_chunk_bytes,
        mtu: args.mtu,
        link,
    });
    if let Some(r) = &ring_model {
        println!(
            "ring (model, MTU {}, {} KiB chunks): {:.3} ms, {:.3} of its links' bound",
            args.mtu,
            args.ring_chunk_bytes / 1024,
            r.seconds * 1e3,
            r.bound_seconds / r.seconds.max(1e-12)
        );
    }
    let mut results = Vec::new();
    println!(
        "{} job(s) of {} workers, {window} slots each{}",
        args.jobs,
        args.workers,
        if args.window.is_some() {
            ""
        } else {
            " (the default: twelve bandwidth-delay products of one switch's round trip, eight of a tree's)"
        }
    );
    println!(
        "{:>6} {:>4} {:>12} {:>10} {:>12} {:>10} {:>8} {:>7} {:>6} {:>8} {:>7} {:>6}",
        "seed",
        "job",
        "virtual ms",
        "Gbit/s",
        "ring bound",
        "packets",
        "retrans",
        "fast",
        "probes",
        "queries",
        "resent",
        "ok"
    );
    for seed in args.seed..args.seed + args.seeds {
        let jobs = (0..args.jobs)
            .map(|j| SimJob {
                job: j as u16 + 1,
                epoch: 7,
                slot_base: j as u16 * window,
                window,
                elems_per_packet: args.elems,
                workers: (0..args.workers)
                    .map(|r| {
                        let g = Generated::new(
                            1,
                            r,
                            args.elements,
                            args.workers,
                            usize::from(args.elems),
                            r == 0,
                        );
                        let data = if let Some(density) = args.density {
                            let sparsity = Sparsity {
                                density,
                                pattern: args.support,
                                block: usize::from(args.elems),
                                workers: args.workers,
                            };
                            Data::Sparse(Box::new(SparseData::new(
                                g.with_sparsity(sparsity),
                                usize::from(args.elems),
                            )))
                        } else if generated {
                            Data::Generated(g)
                        } else {
                            Data::F32(generate(1, r, args.elements))
                        };
                        WorkerSpec::new(vec![data])
                    })
                    .collect(),
            })
            .collect();
        let mut scenario = Scenario::new(seed, jobs);
        scenario.link = link;
        scenario.rules = args
            .without
            .iter()
            .fold(scenario.rules, |rules, r| rules.without(*r));
        scenario.rto.min = Duration::from_secs_f64(args.rto_min_us * 1e-6);
        scenario.rto.initial = scenario.rto.initial.max(scenario.rto.min);
        scenario.nic_queue = (args.nic_queue > 0).then_some(args.nic_queue);
        let uplink = (args.rack_size > 0).then(|| LinkConfig {
            bandwidth_bps: Some((args.uplink_gbps.unwrap_or(args.gbps) * 1e9) as u64),
            latency: Duration::from_secs_f64(
                args.uplink_latency_us.unwrap_or(args.latency_us) * 1e-6,
            ),
            buffer_bytes: args.uplink_buffer_kib.map(|k| k * 1024),
            loss: args.uplink_loss.unwrap_or(link.loss),
            ..link
        });
        scenario.racks = uplink.map(|uplink| ina_sim::Racks {
            per_rack: args.rack_size,
            uplink,
            striped: args.striped,
        });
        if args.adaptive_window {
            // The empty path's round trip: each hop's latency and one full packet's
            // serialization, both ways.
            let packet_bits = (16.0 + 4.0 * f64::from(args.elems)) * 8.0;
            let hop = |l: &LinkConfig| {
                l.latency.as_secs_f64() + packet_bits / l.bandwidth_bps.unwrap_or(u64::MAX) as f64
            };
            let one_way = hop(&link) + uplink.as_ref().map_or(0.0, hop);
            scenario.window_control = Some(ina_proto::window::WindowConfig {
                target_queueing: Duration::from_secs_f64(args.target_queueing_us.max(0.0) * 1e-6),
                base_rtt: Some(Duration::from_secs_f64(2.0 * one_way)),
                ..ina_proto::window::WindowConfig::default()
            });
        }
        scenario.pipeline.pool_slots = (args.jobs as u16) * window;
        apply_faults(faults, &mut scenario);
        scenario.pipeline.max_elems = args.elems;
        let wall = std::time::Instant::now();
        let report = ina_sim::run(&scenario);
        let wall = wall.elapsed().as_secs_f64();
        for job in &report.jobs {
            let mut prints = Vec::new();
            let mut within = true;
            let mut error = None;
            let mut ended = Duration::ZERO;
            let mut t = ina_proto::stream::StreamStats::default();
            let mut lost = 0;
            let mut union_density = 0.0f64;
            for w in &job.workers {
                lost += w.uplink.lost + w.downlink.lost;
                match &w.outcome {
                    Some(Ok(stats)) => {
                        for s in stats {
                            t.accumulate(s);
                        }
                    }
                    Some(Err(e)) => error = Some(e.to_string()),
                    None => error = Some("did not finish".into()),
                }
                ended = ended.max(w.ended_at.unwrap_or(report.elapsed));
                match (w.tensors.first(), &reference) {
                    (Some(Data::F32(t)), Some(reference)) => {
                        prints.push(fingerprint(t));
                        within &= reference.check(t, Bound::Quantized).violations == 0;
                    }
                    (Some(Data::Generated(g)), _) => {
                        prints.push(g.fingerprint);
                        within &= g.violations == 0 && g.received == args.elements as u64;
                    }
                    (Some(Data::Sparse(s)), _) => {
                        let g = s.values.inner();
                        prints.push(g.fingerprint);
                        within &= g.violations == 0 && g.received == args.elements as u64;
                        union_density = union_density.max(s.union_density(usize::from(args.elems)));
                    }
                    _ => within = false,
                }
            }
            let identical = prints.windows(2).all(|p| p[0] == p[1]);
            let secs = ended.as_secs_f64();
            let r = SimResult {
                seed,
                job: job.job,
                virtual_seconds: secs,
                goodput_gbit_per_s: bytes * 8.0 / secs / 1e9,
                ring_bound_seconds: ring_bound,
                ring_model_seconds: ring_model.map(|r| r.seconds),
                packets_sent: t.packets_sent,
                retransmissions: t.retransmissions,
                fast_retransmissions: t.fast_retransmissions,
                stall_probes: t.stall_probes,
                rechecks: t.rechecks,
                queries: t.queries,
                lookahead_copies: t.lookahead_copies,
                pending_answers: t.pending_answers,
                resent_missing: t.resent_missing,
                missing_reports: t.missing_reports,
                resent_reported: t.resent_reported,
                results_reported: t.results_reported,
                packets_lost: lost,
                bytes_sent: t.bytes_sent,
                duplicate_results: t.duplicate_results,
                union_density: args.density.map(|_| union_density),
                identical,
                within_bound: within,
                error,
            };
            let ok = r.ok();
            println!(
                "{:>6} {:>4} {:>12.3} {:>10.2} {:>10.3}ms {:>10} {:>8} {:>7} {:>6} {:>8} {:>7} {:>6}",
                seed,
                r.job,
                secs * 1e3,
                r.goodput_gbit_per_s,
                ring_bound * 1e3,
                r.packets_sent,
                r.retransmissions,
                r.fast_retransmissions,
                r.stall_probes,
                r.queries,
                r.resent_missing,
                if ok { "yes" } else { "NO" }
            );
            if let Some(e) = &r.error {
                println!("       job {}: {e}", r.job);
            }
            if args.density.is_some() {
                println!(
                    "       job {}: sparse, {:?} supports: union density {:.4}, {} packets ({:.1} per worker)",
                    r.job,
                    args.support,
                    union_density,
                    r.packets_sent,
                    r.packets_sent as f64 / args.workers as f64
                );
            }
            results.push(r);
        }
        if !report.rack_uplinks.is_empty() {
            let racks = report.rack_uplinks.len();
            let up = report.rack_uplinks.iter().chain(&report.rack_downlinks);
            let (sent, lost) = up
                .clone()
                .fold((0, 0), |(s, l), x| (s + x.sent, l + x.lost + x.queue_drops));
            let max_queue = up.clone().map(|x| x.max_queue_bytes).max().unwrap_or(0);
            let (qb, b) = up.fold((0u128, 0u128), |(q, b), x| {
                (q + x.queue_byte_bytes, b + u128::from(x.bytes))
            });
            let mean_queue = qb.checked_div(b).unwrap_or(0);
            let resent: u64 = report.switches[..racks]
                .iter()
                .map(|c| c.partials_resent + c.partials_reported + c.partials_for_fetch)
                .sum();
            let asked: u64 = report.switches[..racks].iter().map(|c| c.queries_up).sum();
            let totals_again = report.switches.get(racks).map_or(0, |c| c.missing_received);
            println!(
                "       seed {seed}: {racks} racks under one upper switch: {sent} packets between the levels ({lost} lost), {asked} Queries up, {resent} partial sums and {totals_again} totals sent again; queues between the levels: mean {:.1} KiB, max {:.1} KiB",
                mean_queue as f64 / 1024.0,
                max_queue as f64 / 1024.0
            );
        }
        println!(
            "       seed {seed}: {} events simulated in {wall:.2} s of wall time ({:.2} M events/s)",
            report.events,
            report.events as f64 / wall.max(1e-9) / 1e6
        );
    }
    Ok(results)
}
