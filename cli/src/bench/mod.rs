//! `ina bench`: in-network aggregation against a ring all-reduce, and the switch's packet rate
//! against a plain UDP reflector.

mod inproc;
mod procs;
mod rate;
pub mod runner;
mod scenario;
pub(crate) use scenario::read_toml;
mod density;
mod links;
mod sweep;
mod testbed;

use crate::data::Reference;
use crate::mem::{format_kib, peak_rss_kib};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use runner::IterRecord;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;

/// What `ina bench` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// All-reduce through the software switch.
    Ina,
    /// Bandwidth-optimal ring all-reduce over TCP.
    Ring,
    /// All-reduce through the switch, every tensor as a sparse all-reduce (the support
    /// stream, then the values stream over the union; `--testbed`).
    InaSparse,
    /// The sparse all-gather baseline (OmniReduce's AGsparse): every worker sends its
    /// (index, block) pairs to all over the ring's TCP connections (`--testbed`).
    Agsparse,
    /// Packet rate of the switch with lightweight load generators.
    Switch,
    /// Packet rate of a plain UDP reflector with the same generators and batched I/O.
    Reflector,
    /// Packet rate of the switch on DPDK (memif links, this process; feature `dpdk`).
    DpdkSwitch,
    /// Packet rate of the reflector on the same DPDK links and I/O code.
    DpdkReflector,
    /// The all-reduce with the switch and the workers on DPDK (memif links, this process;
    /// results sent to each worker).
    DpdkIna,
    /// Packet rate of DPDK's `dpdk-testpmd` forwarding on a memif link (io mode, loop), one
    /// generator: the yardstick of the DPDK reflector.
    DpdkTestpmd,
}

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Workers.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Tensor size in bytes (suffixes K, M, G, KiB, MiB, GiB); float32 elements = size / 4.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub size: u64,
    /// Algorithms to run, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "ina,ring")]
    pub algorithms: Vec<Algorithm>,
    /// Timed iterations per round.
    #[arg(long, default_value_t = 3)]
    pub iterations: usize,
    /// Untimed iterations first.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Runs of the whole algorithm list, one after the other (ina, ring, ina, ring, ...); each
    /// algorithm's timed iterations of all rounds are reported together. Alternating keeps
    /// drift of a shared machine from favouring whichever algorithm runs first.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Untimed rounds before the timed ones: each algorithm once, one iteration (packet
    /// rates: 0.1 s). Whichever algorithm runs first in a fresh process pays for warming the
    /// machine (the kernel's and the allocator's memory), which would bias the comparison.
    #[arg(long, default_value_t = 1)]
    pub warmup_rounds: usize,
    /// Elements per packet [default: 2048 in process; with --testbed the most a frame of --mtu
    /// carries (364 at 1500) on the bridge hub, 256 on the l2 and bmv2 hubs]. Tofino takes 64
    /// or 256; the software switch takes any count that fits a datagram, and 2048 (8 KiB)
    /// moves loopback traffic with far fewer packets.
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    pub elems: u16,
    /// Aggregation slots given to the job [default: 32, or 64 with --testbed]. With
    /// 2048-element packets, 32 slots make a 256 KiB window per worker: on one host a larger
    /// window costs more in cache misses than it hides in latency. On the rack, 64 slots make
    /// a whole block of the switch's gap register, which lets a lost packet be repaired by the
    /// worker that lost it alone (PROTOCOL.md §5).
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    pub slots: u16,
    /// Slots per stream (default: all the job's slots).
    #[arg(long)]
    pub window: Option<u16>,
    /// Ina: each worker keeps a delay-based AIMD window of packets in flight instead of
    /// filling every slot (`ina worker --adaptive-window`), so that the links' queues stay
    /// short and a repair does not wait behind a whole window (docs/BENCHMARKS.md).
    #[arg(long)]
    pub adaptive_window: bool,
    /// With --adaptive-window: the queueing delay allowed above the smallest round trip,
    /// microseconds.
    #[arg(long, default_value_t = 200.0, requires = "adaptive_window")]
    pub target_queueing_us: f64,
    /// The TCP congestion control of the ring's connections, in worker processes (`cubic`,
    /// `bbr`, ...; default: the system's). Under random loss `bbr` keeps its rate where
    /// `cubic` backs off; without loss, `bbr`'s periodic probing costs long transfers a few
    /// percent. The testbed report says which one ran.
    #[arg(long)]
    pub ring_congestion: Option<String>,
    /// Switch threads.
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    /// In-process runs: each worker's link, each way, paced inside this process (`500mbit`,
    /// `1gbit`, ...), so that the ring's 2(n-1)/n shows as on a rack; `unlimited` runs on bare
    /// loopback, which measures CPU cost, not links [default: 500mbit].
    #[arg(long, value_parser = links::parse_link)]
    pub link: Option<links::LinkArg>,
    /// Run the switch and each worker in its own OS process (ina and ring), on bare loopback
    /// (not with --link).
    #[arg(long)]
    pub processes: bool,
    /// Run on an emulated rack (root): the switch in a hub namespace, each worker a process
    /// in a namespace of its own behind its own link (`--hub`, `--rate`, `--mtu`,
    /// `--link-loss`); the ring runs over the same links.
    #[arg(long)]
    pub testbed: bool,
    /// With --testbed: the switch in the hub (a kernel bridge with the UDP software switch, the
    /// L2 software switch, or bmv2; the last two take --elems 64 or 256).
    #[arg(long, value_enum, default_value = "bridge")]
    pub hub: crate::cmd_testbed::HubKind,
    /// The DPDK EAL arguments of the dpdk-switch and dpdk-reflector algorithms (default: no
    /// hugepages, no PCI, 1 GiB; their memif links are created by the benchmark).
    #[arg(long, allow_hyphen_values = true)]
    pub dpdk: Option<String>,
    #[command(flatten)]
    pub links: crate::cmd_testbed::LinkArgs,
    /// A scenario file (TOML; see `benches/`): its settings replace the flags', and it runs
    /// on the testbed unless it says `testbed = false`.
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// With --testbed: run once per number of workers in this list (e.g. 2,4,8).
    #[arg(long, value_delimiter = ',')]
    pub sweep_workers: Vec<usize>,
    /// With --testbed: run once per link loss in this list (e.g. 0,0.001,0.01).
    #[arg(long, value_delimiter = ',')]
    pub sweep_link_loss: Vec<f64>,
    /// Draw the sweep's goodput of ina and the ring, with their bounds, into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Drop this fraction of datagrams entering the switch, and of those leaving it.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Skip checking results against the exact f64 sums.
    #[arg(long)]
    pub no_verify: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Sparse tensors (`--testbed`): each worker holds about this fraction of the blocks of
    /// its tensor (blocks of --elems elements), the others are zeros.
    #[arg(long)]
    pub density: Option<f64>,
    /// With --density: how the blocks a worker holds are laid out (uniformly random blocks,
    /// the clustered rows of an embedding table, per-layer top-k).
    #[arg(long, value_enum, default_value = "uniform")]
    pub shape: crate::data::Shape,
    /// With --testbed: run once per density in this list (e.g. 0.01,0.05,0.1,0.25,0.5,1).
    #[arg(long, value_delimiter = ',')]
    pub sweep_density: Vec<f64>,
    /// Seed of the generated tensors and of the loss.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seconds each packet-rate measurement (switch, reflector) runs.
    #[arg(long, default_value_t = 2.0)]
    pub rate_seconds: f64,
    /// Send each result to every worker separately, instead of once to a multicast group all
    /// workers joined (the switch's default here, as a hardware switch replicates a result to
    /// its ports).
    #[arg(long)]
    pub unicast: bool,
    /// Disable UDP GSO and GRO on every socket (in-process runs).
    #[arg(long)]
    pub no_offload: bool,
    /// A worker gives up on a packet unanswered this long.
    #[arg(long, default_value_t = 5000)]
    pub give_up_ms: u64,
}

/// A multicast group on a port no socket of this host uses now, for a job's results.
pub(crate) fn free_group() -> anyhow::Result<std::net::SocketAddrV4> {
    let probe = std::net::UdpSocket::bind("127.0.0.1:0").context("finding a free UDP port")?;
    let port = probe.local_addr()?.port();
    Ok(std::net::SocketAddrV4::new(
        std::net::Ipv4Addr::new(239, 255, 73, 1),
        port,
    ))
}

/// The most elements a UDP datagram carries: (65 507 − 16 header bytes) / 4.
pub const MAX_UDP_ELEMS: usize = (65_507 - ina_wire::HEADER_LEN) / 4;

/// Parses `64MiB`, `1G`, `4096`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("`{s}` is not a size"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        other => return Err(format!("unknown unit `{other}` in `{s}`")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// Switch-side figures of a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SwitchSummary {
    pub packets_in: u64,
    pub results_multicast: u64,
    /// Pending answers (to retransmissions and queries of slots still collecting).
    pub pending_sent: u64,
    pub drops: u64,
    /// The drops by reason (only reasons that occurred).
    pub drop_reasons: std::collections::BTreeMap<&'static str, u64>,
    pub injected_drops: u64,
    pub peak_rss_kib: Option<u64>,
}

/// Summarizes the switch's counters.
pub(crate) fn switch_summary(
    s: &ina_switch::ShardStats,
    peak_rss_kib: Option<u64>,
) -> SwitchSummary {
    let c = &s.pipeline;
    let reasons = c.drops_by_reason();
    SwitchSummary {
        packets_in: c.packets_in,
        results_multicast: c.results_multicast,
        pending_sent: c.pending_sent,
        drops: c.drops_total(),
        drop_reasons: reasons.into_iter().filter(|(_, n)| *n > 0).collect(),
        injected_drops: s.injected_drops_in + s.injected_drops_out,
        peak_rss_kib,
    }
}

/// A packet-rate measurement.
#[derive(Debug, Clone, Serialize)]
pub struct RateResult {
    /// Datagrams received plus sent by the server per second.
    pub packets_per_s: f64,
    /// Payload bits the server received per second.
    pub rx_gbit_per_s: f64,
    pub seconds: f64,
    pub packet_bytes: usize,
    pub resends: u64,
}

/// One algorithm's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct AlgoResult {
    pub algorithm: Algorithm,
    pub processes: bool,
    pub workers: usize,
    pub bytes: u64,
    pub elements: usize,
    pub loss: f64,
    /// Per timed iteration: the slowest worker's time.
    pub seconds: Vec<f64>,
    /// Per timed iteration: in-process runs, the CPU time of every thread of the bench process
    /// (switch, workers, helpers) during the slowest worker's all-reduce; runs on a testbed,
    /// the CPU time of every worker process during its all-reduce, added up (the hosts' cost,
    /// the switch not included).
    pub cpu_seconds: Vec<f64>,
    /// Median of `cpu_seconds`.
    pub median_cpu_s: Option<f64>,
    pub median_s: f64,
    pub min_s: f64,
    pub max_s: f64,
    /// Tensor bits per second at the median.
    pub goodput_gbit_per_s: f64,
    /// Elements summed per second at the median.
    pub elements_per_s: f64,
    pub max_abs_err: Option<f64>,
    pub max_rel_err: Option<f64>,
    /// Every worker held the same bits and every element was within its bound.
    pub verified: Option<bool>,
    pub retransmissions: u64,
    /// Of the retransmissions, those sent on evidence of loss before a timer expired.
    pub fast_retransmissions: u64,
    /// Copies sent as stall probes, apart from `retransmissions` (nothing had come back for
    /// about two round trips: a loss near the end, or a worker elsewhere not running).
    pub stall_probes: u64,
    pub switch: Option<SwitchSummary>,
    /// The largest worker process's peak memory (in-process runs: the bench process's).
    pub worker_peak_rss_kib: Option<u64>,
    pub rate: Option<RateResult>,
    /// `--testbed`: packets the switch took in per second of all-reduce (warm-up included),
    /// the packet rate the switch sustained.
    pub switch_frames_per_s: Option<f64>,
    /// Tensor bytes over the median time, Gbit/s (nccl-tests' algbw).
    pub algbw_gbit_per_s: f64,
    /// algbw times 2(n-1)/n (nccl-tests' busbw for all-reduce).
    pub busbw_gbit_per_s: f64,
    /// `--testbed` with `--rate`: the least time the links allow this algorithm, framing
    /// included (S/B for ina, 2(n-1)/n S/B for the ring).
    pub bound_s: Option<f64>,
    /// `bound_s` over the median time.
    pub of_bound: Option<f64>,
    /// Sparse all-reduces: the fraction of blocks some worker held.
    pub union_density: Option<f64>,
}

impl AlgoResult {
    /// Adds another run of the same algorithm: its timed iterations join this one's, counts
    /// add up, error bounds and peaks take the larger, and rates are weighted by duration.
    fn absorb(&mut self, o: AlgoResult) {
        self.seconds.extend_from_slice(&o.seconds);
        self.cpu_seconds.extend_from_slice(&o.cpu_seconds);
        self.median_cpu_s = median_of(&self.cpu_seconds);
        let mut sorted = self.seconds.clone();
        sorted.sort_by(f64::total_cmp);
        if !sorted.is_empty() {
            self.median_s = median(&sorted);
            self.min_s = sorted[0];
            self.max_s = sorted[sorted.len() - 1];
            self.goodput_gbit_per_s = self.elements as f64 * 32.0 / self.median_s / 1e9;
            self.algbw_gbit_per_s = self.goodput_gbit_per_s;
            self.busbw_gbit_per_s = self.goodput_gbit_per_s * ring_factor(self.workers);
            self.elements_per_s = self.elements as f64 / self.median_s;
        }
        let larger = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.max_abs_err = larger(self.max_abs_err, o.max_abs_err);
        self.max_rel_err = larger(self.max_rel_err, o.max_rel_err);
        self.verified = match (self.verified, o.verified) {
            (Some(a), Some(b)) => Some(a && b),
            (a, b) => a.or(b),
        };
        self.retransmissions += o.retransmissions;
        self.fast_retransmissions += o.fast_retransmissions;
        self.stall_probes += o.stall_probes;
        self.worker_peak_rss_kib = self.worker_peak_rss_kib.max(o.worker_peak_rss_kib);
        self.switch_frames_per_s = match (self.switch_frames_per_s, o.switch_frames_per_s) {
            (Some(a), Some(b)) => Some((a + b) / 2.0),
            (a, b) => a.or(b),
        };
        self.switch = match (self.switch.take(), o.switch) {
            (Some(mut a), Some(b)) => {
                a.packets_in += b.packets_in;
                a.results_multicast += b.results_multicast;
                a.drops += b.drops;
                for (k, v) in b.drop_reasons {
                    *a.drop_reasons.entry(k).or_insert(0) += v;
                }
                a.injected_drops += b.injected_drops;
                a.peak_rss_kib = a.peak_rss_kib.max(b.peak_rss_kib);
                Some(a)
            }
            (a, b) => a.or(b),
        };
        self.rate = match (self.rate.take(), o.rate) {
            (Some(mut a), Some(b)) => {
                let total = a.seconds + b.seconds;
                if total > 0.0 {
                    a.packets_per_s =
                        (a.packets_per_s * a.seconds + b.packets_per_s * b.seconds) / total;
                    a.rx_gbit_per_s =
                        (a.rx_gbit_per_s * a.seconds + b.rx_gbit_per_s * b.seconds) / total;
                }
                a.seconds = total;
                a.resends += b.resends;
                Some(a)
            }
            (a, b) => a.or(b),
        };
    }
}

/// Everything `--json` writes.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    /// `--testbed`: the rack's hub and links.
    pub testbed: Option<testbed::TestbedReport>,
    /// In-process runs behind `--link`: the links and each algorithm's bound.
    pub links: Option<links::LinkReport>,
    pub workers: usize,
    pub bytes: u64,
    pub elems_per_packet: u16,
    pub slots: u16,
    pub shards: usize,
    pub loss: f64,
    pub processes: bool,
    pub cpus: usize,
    pub rounds: usize,
    /// `--adaptive-window`: its target queueing delay, µs (`None`: every slot filled).
    #[serde(default)]
    pub adaptive_window_us: Option<f64>,
    pub results: Vec<AlgoResult>,
    /// `ina` goodput over `ring` goodput.
    pub ina_over_ring: Option<f64>,
    /// Switch packet rate over reflector packet rate.
    pub switch_over_reflector: Option<f64>,
    /// The DPDK switch's packet rate over the DPDK reflector's.
    #[serde(default)]
    pub dpdk_switch_over_dpdk_reflector: Option<f64>,
    /// The DPDK switch's packet rate over the kernel UDP switch's.
    #[serde(default)]
    pub dpdk_switch_over_switch: Option<f64>,
    /// The DPDK reflector's packet rate over `dpdk-testpmd`'s.
    #[serde(default)]
    pub dpdk_reflector_over_testpmd: Option<f64>,
    /// The all-reduce goodput with DPDK workers and switch over the kernel UDP one's.
    #[serde(default)]
    pub dpdk_ina_over_ina: Option<f64>,
    pub bench_peak_rss_kib: Option<u64>,
}

/// One rank's input tensor and the tensor its iterations reduce in place.
pub(crate) type Tensors = (Vec<f32>, Vec<f32>);

/// Shared state of one bench run.
pub(crate) struct Ctx {
    pub args: BenchArgs,
    pub elements: usize,
    pub reference: Option<Arc<Reference>>,
    pub progress: ProgressBar,
    /// In-process runs: each rank's input and working tensor, made by its first worker thread
    /// and kept for every later algorithm and round. (Memory freed and allocated again can be
    /// much slower to touch the first time on a virtual machine that returns free pages to its
    /// host; keeping it makes every algorithm run on the same warm buffers.)
    pub tensors: Vec<std::sync::Mutex<Option<Tensors>>>,
    /// In-process runs: the rate of each worker's link, each way (`None`: bare loopback).
    pub link_rate: Option<u64>,
}

/// The median of unsorted values; `None` for none.
fn median_of(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(median(&sorted))
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Folds the workers' records (one list per worker) into one result.
pub(crate) fn summarize(
    ctx: &Ctx,
    algorithm: Algorithm,
    per_worker: &[Vec<IterRecord>],
) -> anyhow::Result<AlgoResult> {
    let args = &ctx.args;
    let total = args.warmup + args.iterations;
    if per_worker.len() != args.workers || per_worker.iter().any(|w| w.len() != total) {
        bail!("{algorithm:?}: a worker reported fewer iterations than it ran");
    }
    let mut seconds = Vec::new();
    let mut cpu_seconds = Vec::new();
    let mut retransmissions = 0;
    let mut fast_retransmissions = 0;
    let mut stall_probes = 0;
    let mut max_abs: Option<f64> = None;
    let mut max_rel: Option<f64> = None;
    let mut verified = ctx.reference.as_ref().map(|_| true);
    let mut union_density: Option<f64> = None;
    for i in 0..total {
        let recs: Vec<&IterRecord> = per_worker.iter().map(|w| &w[i]).collect();
        if let Some(v) = verified.as_mut() {
            let same = recs
                .windows(2)
                .all(|p| p[0].fingerprint == p[1].fingerprint);
            let within = recs.iter().all(|r| r.violations == Some(0));
            *v &= same && within;
        }
        for r in &recs {
            if let Some(u) = r.union_density {
                union_density = Some(union_density.map_or(u, |m| m.max(u)));
            }
            if let Some(e) = r.max_abs_err {
                max_abs = Some(max_abs.map_or(e, |m| m.max(e)));
            }
            if let Some(e) = r.max_rel_err {
                max_rel = Some(max_rel.map_or(e, |m| m.max(e)));
            }
        }
        if i >= args.warmup {
            seconds.push(recs.iter().map(|r| r.seconds).fold(0.0, f64::max));
            if !args.processes {
                // The slowest worker's window covers everyone's work.
                let slowest = recs.iter().max_by(|a, b| a.seconds.total_cmp(&b.seconds));
                if let Some(cpu) = slowest.and_then(|r| r.process_cpu_seconds) {
                    cpu_seconds.push(cpu);
                }
            } else if args.testbed {
                // Each worker is a process of its own: the hosts' CPU is their sum.
                let all: Option<f64> = recs.iter().map(|r| r.process_cpu_seconds).sum();
                if let Some(cpu) = all {
                    cpu_seconds.push(cpu);
                }
            }
            retransmissions += recs.iter().map(|r| r.retransmissions).sum::<u64>();
            fast_retransmissions += recs.iter().map(|r| r.fast_retransmissions).sum::<u64>();
            stall_probes += recs.iter().map(|r| r.stall_probes).sum::<u64>();
        }
    }
    let mut sorted = seconds.clone();
    sorted.sort_by(f64::total_cmp);
    let med = median(&sorted);
    Ok(AlgoResult {
        algorithm,
        processes: args.processes,
        workers: args.workers,
        bytes: ctx.elements as u64 * 4,
        elements: ctx.elements,
        loss: if algorithm == Algorithm::Ring {
            0.0
        } else {
            args.loss
        },
        median_s: med,
        min_s: sorted.first().copied().unwrap_or(f64::NAN),
        max_s: sorted.last().copied().unwrap_or(f64::NAN),
        goodput_gbit_per_s: ctx.elements as f64 * 32.0 / med / 1e9,
        elements_per_s: ctx.elements as f64 / med,
        seconds,
        median_cpu_s: median_of(&cpu_seconds),
        cpu_seconds,
        max_abs_err: max_abs,
        max_rel_err: max_rel,
        verified,
        retransmissions,
        fast_retransmissions,
        stall_probes,
        switch: None,
        worker_peak_rss_kib: None,
        rate: None,
        switch_frames_per_s: None,
        algbw_gbit_per_s: ctx.elements as f64 * 32.0 / med / 1e9,
        busbw_gbit_per_s: ctx.elements as f64 * 32.0 / med / 1e9 * ring_factor(args.workers),
        bound_s: None,
        of_bound: None,
        union_density,
    })
}

/// Elements per packet when `--elems` is not given: 2048 in process; on a rack, the most a
/// frame of the links' MTU carries through the bridge hub (a P4-like hub takes 256 or 64).
fn default_elems(args: &BenchArgs) -> u16 {
    use crate::cmd_testbed::HubKind;
    if !args.testbed {
        return 2048;
    }
    let fits = args
        .links
        .mtu
        .saturating_sub((20 + 8 + ina_wire::HEADER_LEN) as u32)
        / 4;
    match args.hub {
        HubKind::Bridge => u16::try_from(fits.min(MAX_UDP_ELEMS as u32)).unwrap_or(2048),
        _ if fits >= 256 => 256,
        _ => 64,
    }
}

/// The sparse tensors of `--density`, in blocks of `--elems`.
pub(crate) fn sparse_of(args: &BenchArgs) -> Option<crate::data::Sparse> {
    args.density.map(|density| crate::data::Sparse {
        shape: args.shape,
        density,
        block: usize::from(args.elems),
    })
}

/// The window a worker streams with: `--window`, at most the job's `--slots`.
pub(crate) fn window_of(args: &BenchArgs) -> u16 {
    args.window.unwrap_or(args.slots).min(args.slots)
}

/// 2(n-1)/n: what a ring moves per link, in tensors; nccl-tests' busbw factor of all-reduce.
pub(crate) fn ring_factor(workers: usize) -> f64 {
    let n = workers as f64;
    2.0 * (n - 1.0) / n
}

pub fn run(mut args: BenchArgs) -> anyhow::Result<()> {
    if let Some(path) = args.scenario.clone() {
        if let Some(d) = scenario::apply(&path, &mut args)? {
            println!("scenario {}: {d}", path.display());
        }
    }
    if !args.sweep_density.is_empty() {
        return density::run(args);
    }
    if sweep::requested(&args) {
        return sweep::run(args);
    }
    if args.plot.is_some() {
        bail!("--plot draws a sweep: give --sweep-workers or --sweep-link-loss");
    }
    run_one(args).map(|_| ())
}

/// One bench run: prints its report, writes `--json`, and fails if a result was wrong.
pub(crate) fn run_one(mut args: BenchArgs) -> anyhow::Result<BenchReport> {
    // On a rack every worker is a process of its own.
    args.processes |= args.testbed;
    if args.slots == 0 {
        args.slots = if args.testbed { 64 } else { 32 };
    }
    if args.elems == 0 {
        args.elems = default_elems(&args);
    }
    if args.testbed && args.links.rate.is_none() {
        args.links.rate = Some(testbed::DEFAULT_RATE_BPS);
    }
    if args.workers == 0 || args.workers > 32 {
        bail!("--workers must be 1..=32 (a switch slot tracks at most 32 workers)");
    }
    if args.iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if !(0.0..1.0).contains(&args.loss) {
        bail!("--loss must be in [0, 1)");
    }
    if args.elems == 0 || args.slots == 0 {
        bail!("--elems and --slots must be positive");
    }
    if args.adaptive_window {
        crate::cmd_worker::adaptive_window(args.target_queueing_us)?;
    }
    if usize::from(args.elems) > MAX_UDP_ELEMS {
        bail!(
            "--elems {} does not fit a UDP datagram (at most {MAX_UDP_ELEMS})",
            args.elems
        );
    }
    if args.algorithms.is_empty() {
        bail!("no --algorithms given");
    }
    let sparse_algos = args
        .algorithms
        .iter()
        .any(|a| matches!(a, Algorithm::InaSparse | Algorithm::Agsparse));
    if (sparse_algos || args.density.is_some()) && !args.testbed {
        bail!("--density and the ina-sparse and agsparse algorithms run on the emulated rack: add --testbed (root)");
    }
    if args.density.is_some_and(|d| !(d > 0.0 && d <= 1.0)) {
        bail!("--density must be a fraction of the blocks in (0, 1]");
    }
    let testbed = if args.testbed {
        if args.algorithms.iter().any(|a| {
            matches!(
                a,
                Algorithm::Switch
                    | Algorithm::Reflector
                    | Algorithm::DpdkSwitch
                    | Algorithm::DpdkReflector
            )
        }) {
            bail!("--testbed runs the ina and ring algorithms; the packet-rate algorithms (switch, reflector) are for loopback");
        }
        if args.loss > 0.0 {
            bail!("--loss is injected by the UDP switch on loopback; on --testbed the links drop packets (--link-loss)");
        }
        Some(testbed::TestbedCtx::new(
            args.hub,
            &args.links,
            args.workers,
            args.elems,
        )?)
    } else {
        None
    };
    let link_rate = match (args.link, args.processes) {
        (Some(_), true) => bail!(
            "--link paces in-process workers; --processes runs on bare loopback and --testbed on links of --rate"
        ),
        (_, true) | (Some(links::LinkArg::Unlimited), false) => None,
        (Some(links::LinkArg::Rate(bps)), false) => Some(bps),
        (None, false) => Some(links::DEFAULT_RATE_BPS),
    };
    let elements = usize::try_from(args.size / 4).context("--size too large")?;
    let tensor_algos = args
        .algorithms
        .iter()
        .filter(|a| {
            matches!(
                a,
                Algorithm::Ina
                    | Algorithm::Ring
                    | Algorithm::DpdkIna
                    | Algorithm::InaSparse
                    | Algorithm::Agsparse
            )
        })
        .count();
    let progress = ProgressBar::new(
        ((args.warmup_rounds + args.rounds * (args.warmup + args.iterations)) * tensor_algos)
            as u64,
    );
    progress.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:30}] {pos}/{len} iterations, {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let reference = if args.no_verify || tensor_algos == 0 {
        None
    } else {
        progress.set_message("reference");
        Some(Arc::new(Reference::of(
            args.seed,
            args.workers,
            elements,
            usize::from(args.elems),
            sparse_of(&args).as_ref(),
        )))
    };
    let mut ctx = Ctx {
        tensors: (0..args.workers).map(|_| Default::default()).collect(),
        args: args.clone(),
        elements,
        reference,
        progress,
        link_rate,
    };
    let mut results: Vec<AlgoResult> = Vec::new();
    for round in 0..args.warmup_rounds + args.rounds {
        let warming = round < args.warmup_rounds;
        if warming {
            ctx.args.warmup = 0;
            ctx.args.iterations = 1;
            ctx.args.rate_seconds = 0.1;
        } else {
            ctx.args = args.clone();
        }
        for &algo in &args.algorithms {
            let name = format!("{algo:?}").to_lowercase();
            ctx.progress.set_message(if warming {
                format!("{name} (warming)")
            } else {
                name
            });
            let r = match (algo, args.processes) {
                (Algorithm::Ina | Algorithm::InaSparse, _) if testbed.is_some() => {
                    testbed::ina(&ctx, testbed.as_ref().context("rack")?, algo)
                }
                (Algorithm::Ring | Algorithm::Agsparse, _) if testbed.is_some() => {
                    testbed::ring(&ctx, testbed.as_ref().context("rack")?, algo)
                }
                (Algorithm::InaSparse | Algorithm::Agsparse, _) => {
                    Err(anyhow::anyhow!("{algo:?} runs with --testbed"))
                }
                (Algorithm::Ina, false) => inproc::ina(&ctx),
                (Algorithm::Ring, false) => inproc::ring(&ctx),
                (Algorithm::Ina, true) => procs::ina(&ctx),
                (Algorithm::Ring, true) => procs::ring(&ctx),
                (Algorithm::Switch, _) => rate::switch(&ctx),
                (Algorithm::Reflector, _) => rate::reflector(&ctx),
                #[cfg(feature = "dpdk")]
                (Algorithm::DpdkSwitch, _) => rate::dpdk::switch(&ctx),
                #[cfg(feature = "dpdk")]
                (Algorithm::DpdkReflector, _) => rate::dpdk::reflector(&ctx),
                #[cfg(feature = "dpdk")]
                (Algorithm::DpdkTestpmd, _) => rate::dpdk::testpmd(&ctx),
                #[cfg(feature = "dpdk")]
                (Algorithm::DpdkIna, _) => rate::dpdk::ina(&ctx),
                #[cfg(not(feature = "dpdk"))]
                (
                    Algorithm::DpdkSwitch
                    | Algorithm::DpdkReflector
                    | Algorithm::DpdkTestpmd
                    | Algorithm::DpdkIna,
                    _,
                ) => Err(anyhow::anyhow!(
                    "this ina was built without DPDK (cargo build --release --features dpdk, with libdpdk-dev installed)"
                )),
            }
            .with_context(|| format!("running {algo:?}"))?;
            if warming {
                continue;
            }
            match results.iter_mut().find(|e| e.algorithm == algo) {
                Some(earlier) => earlier.absorb(r),
                None => results.push(r),
            }
        }
    }
    ctx.progress.finish_and_clear();
    let find = |a: Algorithm| results.iter().find(|r| r.algorithm == a);
    let ina_over_ring = match (find(Algorithm::Ina), find(Algorithm::Ring)) {
        (Some(i), Some(r)) => Some(i.goodput_gbit_per_s / r.goodput_gbit_per_s),
        _ => None,
    };
    let switch_over_reflector = match (find(Algorithm::Switch), find(Algorithm::Reflector)) {
        (Some(s), Some(r)) => match (&s.rate, &r.rate) {
            (Some(s), Some(r)) => Some(s.packets_per_s / r.packets_per_s),
            _ => None,
        },
        _ => None,
    };
    let rate_of = |a: Algorithm| {
        find(a)
            .and_then(|r| r.rate.as_ref())
            .map(|r| r.packets_per_s)
    };
    let ratio = |a: Algorithm, b: Algorithm| Some(rate_of(a)? / rate_of(b)?);
    let dpdk_switch_over_dpdk_reflector = ratio(Algorithm::DpdkSwitch, Algorithm::DpdkReflector);
    let dpdk_switch_over_switch = ratio(Algorithm::DpdkSwitch, Algorithm::Switch);
    let dpdk_reflector_over_testpmd = ratio(Algorithm::DpdkReflector, Algorithm::DpdkTestpmd);
    let dpdk_ina_over_ina = match (find(Algorithm::DpdkIna), find(Algorithm::Ina)) {
        (Some(d), Some(i)) => Some(d.goodput_gbit_per_s / i.goodput_gbit_per_s),
        _ => None,
    };
    let report = BenchReport {
        testbed: testbed.as_ref().map(|t| {
            let mut r = testbed::report(
                t,
                &mut results,
                args.workers,
                elements,
                args.elems,
                window_of(&args),
            );
            if args.ring_congestion.is_some() {
                r.tcp_congestion_control = args.ring_congestion.clone();
            }
            r
        }),
        links: link_rate
            .filter(|_| {
                results
                    .iter()
                    .any(|r| matches!(r.algorithm, Algorithm::Ina | Algorithm::Ring))
            })
            .map(|bps| {
                links::report(
                    bps,
                    &mut results,
                    args.workers,
                    elements,
                    args.elems,
                    window_of(&args),
                )
            }),
        workers: args.workers,
        bytes: elements as u64 * 4,
        elems_per_packet: args.elems,
        slots: args.slots,
        shards: args.shards,
        loss: args.loss,
        processes: args.processes,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        rounds: args.rounds,
        adaptive_window_us: args.adaptive_window.then_some(args.target_queueing_us),
        results,
        ina_over_ring,
        switch_over_reflector,
        dpdk_switch_over_dpdk_reflector,
        dpdk_switch_over_switch,
        dpdk_reflector_over_testpmd,
        dpdk_ina_over_ina,
        bench_peak_rss_kib: peak_rss_kib(),
    };
    print_report(&report);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        println!("results written to {}", path.display());
    }
    let failed: Vec<_> = report
        .results
        .iter()
        .filter(|r| r.verified == Some(false))
        .map(|r| format!("{:?}", r.algorithm))
        .collect();
    if !failed.is_empty() {
        bail!("results outside their bound or differing between workers: {failed:?}");
    }
    Ok(report)
}

fn fmt_bytes(b: u64) -> String {
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{} GiB", b >> 30)
    } else if b >= 1 << 20 {
        format!("{:.0} MiB", b as f64 / f64::from(1 << 20))
    } else if b >= 1 << 10 {
        format!("{:.0} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

fn fmt_opt_e(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.1e}"))
}

fn print_report(r: &BenchReport) {
    let tensor: Vec<&AlgoResult> = r.results.iter().filter(|x| x.rate.is_none()).collect();
    if !tensor.is_empty() {
        println!(
            "{:<10} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>8} {:>8}",
            "algorithm",
            "workers",
            "size",
            "median",
            "min",
            "max",
            "Gbit/s",
            "Melem/s",
            "abs err",
            "rel err",
            "retrans",
            "verified"
        );
        for x in tensor {
            let name = format!(
                "{:?}{}",
                x.algorithm,
                if x.processes { " (proc)" } else { "" }
            )
            .to_lowercase();
            println!(
                "{:<10} {:>7} {:>9} {:>8.1}ms {:>7.1}ms {:>7.1}ms {:>9.2} {:>10.1} {:>9} {:>9} {:>8} {:>8}",
                name,
                x.workers,
                fmt_bytes(x.bytes),
                x.median_s * 1e3,
                x.min_s * 1e3,
                x.max_s * 1e3,
                x.goodput_gbit_per_s,
                x.elements_per_s / 1e6,
                fmt_opt_e(x.max_abs_err),
                fmt_opt_e(x.max_rel_err),
                x.retransmissions,
                match x.verified {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "-",
                }
            );
        }
    }
    if let Some(t) = &r.testbed {
        testbed::print(t, r);
    }
    if let Some(l) = &r.links {
        links::print(l, r);
    } else if !r.processes && r.results.iter().any(|x| x.algorithm == Algorithm::Ina) {
        links::print_unlimited();
    }
    let rates: Vec<&AlgoResult> = r.results.iter().filter(|x| x.rate.is_some()).collect();
    if !rates.is_empty() {
        println!();
        println!(
            "{:<10} {:>7} {:>9} {:>12} {:>10} {:>8}",
            "server", "clients", "packet", "packets/s", "rx Gbit/s", "resends"
        );
        for x in rates {
            if let Some(rate) = &x.rate {
                println!(
                    "{:<10} {:>7} {:>8}B {:>11.2}M {:>10.2} {:>8}",
                    format!("{:?}", x.algorithm).to_lowercase(),
                    x.workers,
                    rate.packet_bytes,
                    rate.packets_per_s / 1e6,
                    rate.rx_gbit_per_s,
                    rate.resends
                );
            }
        }
    }
    for x in &r.results {
        if x.rate.is_none() && x.retransmissions + x.stall_probes > 0 {
            let others = x.retransmissions.saturating_sub(x.fast_retransmissions);
            println!(
                "{} retransmissions: {} on evidence of loss, {} on timers or Pending answers; and {} stall probes",
                format!("{:?}", x.algorithm).to_lowercase(),
                x.fast_retransmissions,
                others,
                x.stall_probes
            );
        }
    }
    println!();
    if let Some(x) = r.ina_over_ring {
        println!("ina / ring goodput:          {x:.2}x");
    }
    let cpu: Vec<String> = r
        .results
        .iter()
        .filter_map(|x| {
            x.median_cpu_s.map(|c| {
                format!(
                    "{} {:.0} ms",
                    format!("{:?}", x.algorithm).to_lowercase(),
                    c * 1e3
                )
            })
        })
        .collect();
    if !cpu.is_empty() {
        println!(
            "CPU per all-reduce (median; {}): {}",
            if r.testbed.is_some() {
                "every worker process, added up"
            } else {
                "every thread of this process"
            },
            cpu.join(", ")
        );
    }
    if let Some(x) = r.switch_over_reflector {
        println!("switch / reflector pkt rate: {x:.2}x");
    }
    if let Some(x) = r.dpdk_switch_over_dpdk_reflector {
        println!("dpdk-switch / dpdk-reflector pkt rate: {x:.2}x");
    }
    if let Some(x) = r.dpdk_switch_over_switch {
        println!("dpdk-switch / switch (kernel UDP) pkt rate: {x:.2}x");
    }
    if let Some(x) = r.dpdk_reflector_over_testpmd {
        println!("dpdk-reflector / dpdk-testpmd pkt rate: {x:.2}x");
    }
    if let Some(x) = r.dpdk_ina_over_ina {
        println!("dpdk-ina / ina goodput: {x:.2}x");
    }
    for x in &r.results {
        if let Some(s) = &x.switch {
            let reasons: Vec<String> = s
                .drop_reasons
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            println!(
                "{:?} switch: {} packets in, {} results, {} dropped ({}), {} lost by injection, peak memory {}",
                x.algorithm,
                s.packets_in,
                s.results_multicast,
                s.drops,
                if reasons.is_empty() { "none".to_string() } else { reasons.join(", ") },
                s.injected_drops,
                s.peak_rss_kib.map_or_else(|| "-".into(), format_kib)
            );
        }
        if x.processes {
            if let Some(k) = x.worker_peak_rss_kib {
                println!("{:?} worker peak memory: {}", x.algorithm, format_kib(k));
            }
        }
    }
    if let Some(k) = r.bench_peak_rss_kib {
        println!(
            "bench process peak memory: {} ({})",
            format_kib(k),
            if r.processes {
                "orchestration and reference"
            } else {
                "switch, workers, inputs and reference"
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999999GiB").is_err());
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(&[1.0, 2.0, 10.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 4.0, 10.0]), 3.0);
        assert!(median(&[]).is_nan());
    }
}
