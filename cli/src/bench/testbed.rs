//! `ina bench --testbed`: an emulated rack (`ina_io::netns`: a hub namespace with a veth link
//! per worker, rate-limited and lossy as asked) with the switch in the hub and each worker an
//! `ina worker` process in a namespace of its own, speaking kernel UDP to the switch's address.
//! The hub is a kernel bridge with the UDP software switch on it, the L2 software switch on the
//! raw ports, or bmv2 running the v1model program. The ring runs between the worker namespaces
//! over the same links (through the bridge or the switch's L2 forwarding).

use super::procs::{collect, worker_common, Proc, START};
use super::{summarize, AlgoResult, Algorithm, Ctx};
use crate::cmd_testbed::{HubKind, LinkArgs};
use anyhow::{bail, Context};
use ina_io::netns::{Rack, SWITCH_IP, SWITCH_MAC, SWITCH_MAC_BYTES};
use ina_switch_p4::bmv2::{Bmv2, Bmv2Config};
use ina_switch_p4::runtime::{MacAddr, P4Job, SwitchDesc};
use std::io::Write;

/// The links' rate of `ina bench --testbed` when `--rate` is not given, bits per second.
pub(crate) const DEFAULT_RATE_BPS: u64 = 1_000_000_000;

/// The multicast group results go to on a bridge hub (unless `--unicast`).
const GROUP: &str = "239.1.0.1:18800";

/// The rack of a bench run, built once and torn down when the run ends (also on failure).
pub(crate) struct TestbedCtx {
    pub hub: HubKind,
    pub links: LinkArgs,
    pub rack: Rack,
    /// Where bmv2's program and log go.
    pub scratch: std::path::PathBuf,
}

impl TestbedCtx {
    pub fn new(
        hub: HubKind,
        links: &LinkArgs,
        workers: usize,
        elems: u16,
    ) -> anyhow::Result<TestbedCtx> {
        if hub != HubKind::Bridge && !ina_switch_p4::v1model::SUPPORTED_ELEMS.contains(&elems) {
            bail!(
                "--hub {hub:?} carries {} elements per packet, as the P4 switch does; got --elems {elems}",
                ina_switch_p4::v1model::SUPPORTED_ELEMS
                    .map(|e| e.to_string())
                    .join(" or ")
            );
        }
        let packet = 14 + 20 + 8 + 16 + 4 * u32::from(elems);
        if packet > links.mtu + 14 {
            bail!(
                "--elems {elems} makes {packet}-byte frames, more than --mtu {} carries: use --elems {} or less, or a larger --mtu",
                links.mtu,
                (links.mtu - 20 - 8 - 16) / 4
            );
        }
        if hub == HubKind::Bmv2 && !ina_switch_p4::bmv2::available() {
            bail!("--hub bmv2 needs p4c-bm2-ss, simple_switch and simple_switch_CLI (see README.md, \"P4 targets\")");
        }
        let name = format!("inab{}", std::process::id() % 100_000);
        let rack =
            Rack::build(links.rack_config(&name, workers, hub)).context("building the testbed")?;
        let scratch = std::env::temp_dir().join(format!("ina-bench-{}", std::process::id()));
        std::fs::create_dir_all(&scratch)?;
        Ok(TestbedCtx {
            hub,
            links: links.clone(),
            rack,
            scratch,
        })
    }
}

impl Drop for TestbedCtx {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

const UDP_PORT: u16 = 9000;
const RING_PORT: u16 = 7000;

/// The switch in the hub, whichever it is.
enum HubSwitch {
    /// `ina switch` on UDP or on the raw ports.
    Daemon(Proc),
    Bmv2(Bmv2),
}

impl HubSwitch {
    fn start(ctx: &Ctx, f: &TestbedCtx) -> anyhow::Result<HubSwitch> {
        let a = &ctx.args;
        let workers = (0..f.rack.workers)
            .map(|r| {
                format!(
                    "{}/{}/{}:{UDP_PORT}",
                    Rack::port(r),
                    Rack::worker_mac(r),
                    Rack::worker_ip(r)
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        match f.hub {
            HubKind::Bridge => {
                let addrs = (0..f.rack.workers)
                    .map(|r| format!("{}:{UDP_PORT}", Rack::worker_ip(r)))
                    .collect::<Vec<_>>()
                    .join(",");
                let group = if a.unicast {
                    String::new()
                } else {
                    format!(";group={GROUP}")
                };
                let mut p = Proc::spawn_in(
                    Some(&f.rack.hub()),
                    "switch".into(),
                    &[
                        "switch".into(),
                        format!("--listen={SWITCH_IP}:{}", ina_wire::UDP_PORT),
                        format!("--shards={}", a.shards),
                        format!("--pool-slots={}", a.slots),
                        format!("--max-elems={}", a.elems),
                        format!(
                            "--job=id=1;slots=0..{};elems={};workers={addrs}{group}",
                            a.slots, a.elems
                        ),
                    ],
                )?;
                p.expect("ready", START)?;
                Ok(HubSwitch::Daemon(p))
            }
            HubKind::L2 => {
                let mut p = Proc::spawn_in(
                    Some(&f.rack.hub()),
                    "l2 switch".into(),
                    &[
                        "switch".into(),
                        format!("--ports={}", f.rack.ports()),
                        format!("--mac={SWITCH_MAC}"),
                        format!("--ip={SWITCH_IP}"),
                        format!("--pool-slots={}", a.slots),
                        format!("--max-elems={}", a.elems),
                        format!(
                            "--job=id=1;slots=0..{};elems={};workers={workers}",
                            a.slots, a.elems
                        ),
                    ],
                )?;
                p.expect("ready", START)?;
                Ok(HubSwitch::Daemon(p))
            }
            HubKind::Bmv2 => {
                let program = ina_switch_p4::bmv2::compile_v1model(&f.scratch)?;
                let ports: Vec<(u16, String)> = (0..f.rack.workers)
                    .map(|r| (r as u16, Rack::port(r)))
                    .collect();
                let sw = Bmv2::start(Bmv2Config {
                    program,
                    ports,
                    thrift_port: 9090,
                    netns: Some(f.rack.hub()),
                    log_file: f.scratch.join("simple_switch.log"),
                    packet_log: None,
                })?;
                let hosts: Vec<(MacAddr, std::net::Ipv4Addr)> = (0..f.rack.workers)
                    .map(|r| (MacAddr(Rack::worker_mac_bytes(r)), Rack::worker_ip(r)))
                    .collect();
                let macs: Vec<MacAddr> = hosts.iter().map(|h| h.0).collect();
                let desc =
                    SwitchDesc::one_host_per_port(MacAddr(SWITCH_MAC_BYTES), SWITCH_IP, &macs);
                let job = P4Job::one_rank_per_port(1, 1, a.slots, a.elems, &hosts, UDP_PORT);
                sw.configure(&desc, &[job])?;
                Ok(HubSwitch::Bmv2(sw))
            }
        }
    }

    /// Packets the switch took in (every frame or datagram), and results multicast.
    fn stop(self) -> anyhow::Result<(u64, u64)> {
        match self {
            HubSwitch::Daemon(mut p) => {
                p.terminate();
                let stopped = p.expect("stopped", START)?;
                let stats = &stopped["stats"];
                if let Some(events) = stats["events"].as_array() {
                    // The L2 switch: one event per frame.
                    let frames = events.iter().filter_map(|x| x[1].as_u64()).sum();
                    return Ok((frames, stats["results_multicast"].as_u64().unwrap_or(0)));
                }
                let total = &stats["total"]["pipeline"];
                Ok((
                    total["packets_in"].as_u64().unwrap_or(0),
                    total["results_multicast"].as_u64().unwrap_or(0),
                ))
            }
            HubSwitch::Bmv2(sw) => {
                let c = sw.counters()?;
                Ok((c.events.iter().sum(), c.multicast))
            }
        }
    }
}

/// The switch's frame rate over the workers' all-reduce time (warm-up iterations included:
/// the switch's counters cover them too).
fn switch_rate(frames_in: u64, records: &[Vec<super::runner::IterRecord>]) -> Option<f64> {
    let seconds: f64 = records
        .iter()
        .map(|r| r.iter().map(|i| i.seconds).sum::<f64>())
        .fold(0.0, f64::max);
    (seconds > 0.0).then(|| frames_in as f64 / seconds)
}

/// `algo`: [`Algorithm::Ina`] (dense) or [`Algorithm::InaSparse`].
pub(crate) fn ina(ctx: &Ctx, f: &TestbedCtx, algo: Algorithm) -> anyhow::Result<AlgoResult> {
    let hub = HubSwitch::start(ctx, f)?;
    let mut workers = Vec::new();
    for rank in 0..f.rack.workers {
        let mut args = worker_common(ctx, rank);
        args.push("--algorithm=ina".into());
        if algo == Algorithm::InaSparse {
            args.push("--mode=sparse".into());
        }
        args.push(format!("--switch={SWITCH_IP}:{}", ina_wire::UDP_PORT));
        args.push(format!("--bind={}:{UDP_PORT}", Rack::worker_ip(rank)));
        if let Some(w) = ctx.args.window {
            args.push(format!("--window={w}"));
        }
        if f.hub == HubKind::Bridge && !ctx.args.unicast {
            args.push(format!("--group={GROUP}"));
        }
        workers.push(Proc::spawn_in(
            Some(&f.rack.worker_ns(rank)),
            format!("worker {rank}"),
            &args,
        )?);
    }
    let collected = collect(ctx, &mut workers);
    let stopped = hub.stop();
    let (records, worker_peak) = collected?;
    let (frames_in, multicast) = stopped?;
    let mut r = summarize(ctx, algo, &records)?;
    r.worker_peak_rss_kib = Some(worker_peak);
    r.switch_frames_per_s = switch_rate(frames_in, &records);
    tracing::debug!(frames_in, multicast, "switch counters");
    Ok(r)
}

/// `algo`: [`Algorithm::Ring`] or [`Algorithm::Agsparse`] (over the same connections).
pub(crate) fn ring(ctx: &Ctx, f: &TestbedCtx, algo: Algorithm) -> anyhow::Result<AlgoResult> {
    let hub = HubSwitch::start(ctx, f)?;
    let peers: Vec<String> = (0..f.rack.workers)
        .map(|r| format!("{}:{RING_PORT}", Rack::worker_ip(r)))
        .collect();
    let mut workers = Vec::new();
    for rank in 0..f.rack.workers {
        let mut args = worker_common(ctx, rank);
        args.push(if algo == Algorithm::Agsparse {
            "--algorithm=agsparse".into()
        } else {
            "--algorithm=ring".into()
        });
        if let Some(cc) = &ctx.args.ring_congestion {
            args.push(format!("--tcp-congestion={cc}"));
        }
        args.push(format!("--bind={}:{RING_PORT}", Rack::worker_ip(rank)));
        args.push("--peers=-".into());
        workers.push(Proc::spawn_in(
            Some(&f.rack.worker_ns(rank)),
            format!("ring worker {rank}"),
            &args,
        )?);
    }
    let line = serde_json::to_string(&peers)? + "\n";
    for w in &mut workers {
        w.expect("bound", START)?;
        let stdin = w.stdin.as_mut().context("worker stdin")?;
        stdin.write_all(line.as_bytes())?;
        stdin.flush()?;
    }
    let collected = collect(ctx, &mut workers);
    let stopped = hub.stop();
    let (records, worker_peak) = collected?;
    let (frames_in, _) = stopped?;
    let mut r = summarize(ctx, algo, &records)?;
    r.worker_peak_rss_kib = Some(worker_peak);
    r.switch_frames_per_s = switch_rate(frames_in, &records);
    Ok(r)
}

/// The testbed's part of the bench's report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TestbedReport {
    pub hub: HubKind,
    /// Rate limit of each link direction, bits per second (none: unlimited).
    pub rate_bps: Option<u64>,
    pub mtu: u32,
    pub link_loss: f64,
    /// Packets the links' loss rules dropped, both directions of every link.
    pub dropped_by_links: u64,
    /// Packets the links' rate limiters dropped from a full queue (senders overrunning a link),
    /// both directions of every link, over the whole run.
    pub dropped_by_queues: u64,
    /// The TCP congestion control of the ring's streams (`--ring-congestion`, else the
    /// namespaces' default).
    pub tcp_congestion_control: Option<String>,
    /// Bytes an `ina` packet of the run takes on a link per byte of tensor it carries.
    pub ina_framing: f64,
    /// The same for the ring's TCP segments (data frames and their acknowledgements).
    pub ring_framing: f64,
    /// The least time the links allow each algorithm (with `rate_bps`).
    pub ina_bound_s: Option<f64>,
    pub ring_bound_s: Option<f64>,
    /// Ring time over ina time, and the most it can be: 2(n-1)/n.
    pub speedup: Option<f64>,
    pub speedup_ceiling: f64,
}

/// Bytes on a link per tensor byte for `ina`: every full packet is Ethernet (14), IPv4 (20),
/// UDP (8) and ina (16) headers and 4E bytes of payload, and the exponent lookahead adds one
/// header-only packet per slot of the window (`window` of them per tensor).
pub fn ina_framing(elements: usize, elems: u16, window: u16) -> f64 {
    super::links::framing_with_headers(elements, elems, window, 14 + 20 + 8 + 16)
}

/// Bytes on a link per tensor byte for the ring's TCP: segments of MTU − 52 bytes of data
/// (IPv4 20, TCP 20, timestamps 12) in frames of MTU + 14, and one 66-byte acknowledgement
/// per two segments going back over the same link (each link carries data one way and the
/// acknowledgements of the other direction's data).
pub fn ring_framing(mtu: u32) -> f64 {
    let mtu = f64::from(mtu);
    (mtu + 14.0 + 33.0) / (mtu - 52.0)
}

/// Sets each ina and ring result's bound and fraction of it; returns the ring's time over
/// ina's where both ran.
pub(crate) fn fill_bounds(
    results: &mut [AlgoResult],
    ina_bound_s: Option<f64>,
    ring_bound_s: Option<f64>,
    elems: u16,
) -> Option<f64> {
    let mut times = (None, None);
    for r in results.iter_mut() {
        let b = match r.algorithm {
            Algorithm::Ina => {
                times.0 = Some(r.median_s);
                ina_bound_s
            }
            Algorithm::Ring => {
                times.1 = Some(r.median_s);
                ring_bound_s
            }
            // What a sparse all-reduce must send: the union's blocks, and the support stream's
            // one int32 per block of `elems` elements (1/elems of the tensor).
            Algorithm::InaSparse => match (ina_bound_s, r.union_density) {
                (Some(b), Some(u)) if r.elements > 0 => {
                    let blocks = r.elements.div_ceil(usize::from(elems.max(1)));
                    Some(b * (u + blocks as f64 / r.elements as f64))
                }
                _ => None,
            },
            _ => None,
        };
        r.bound_s = b;
        r.of_bound = b.map(|b| b / r.median_s);
    }
    match times {
        (Some(i), Some(r)) => Some(r / i),
        _ => None,
    }
}

/// Fills in every result's bound and fraction of it; returns the testbed's report.
pub(crate) fn report(
    t: &TestbedCtx,
    results: &mut [AlgoResult],
    workers: usize,
    elements: usize,
    elems: u16,
    window: u16,
) -> TestbedReport {
    let bytes = (elements * 4) as f64;
    let ina_framing = ina_framing(elements, elems, window);
    let ring_framing = ring_framing(t.links.mtu);
    let bound = |framing: f64, factor: f64| {
        t.links
            .rate
            .map(|bps| bytes * framing * factor * 8.0 / bps as f64)
    };
    let ina_bound_s = bound(ina_framing, 1.0);
    let ring_bound_s = bound(ring_framing, super::ring_factor(workers));
    let speedup = fill_bounds(results, ina_bound_s, ring_bound_s, elems);
    TestbedReport {
        hub: t.hub,
        rate_bps: t.links.rate,
        mtu: t.links.mtu,
        link_loss: t.links.link_loss,
        dropped_by_links: t.rack.dropped(),
        dropped_by_queues: t.rack.queue_drops(),
        tcp_congestion_control: t.rack.tcp_congestion_control(),
        ina_framing,
        ring_framing,
        ina_bound_s,
        ring_bound_s,
        speedup,
        speedup_ceiling: super::ring_factor(workers),
    }
}

/// Prints the testbed's lines of the report.
pub(crate) fn print(t: &TestbedReport, r: &super::BenchReport) {
    println!(
        "testbed: {} workers, hub {:?}, links {} each way, MTU {}{}",
        r.workers,
        t.hub,
        t.rate_bps
            .map_or("unlimited".into(), crate::cmd_testbed::fmt_rate),
        t.mtu,
        if t.link_loss > 0.0 {
            format!(
                ", {} loss each way ({} packets dropped)",
                t.link_loss, t.dropped_by_links
            )
        } else {
            String::new()
        }
    );
    if let Some(cc) = &t.tcp_congestion_control {
        println!("  the ring's TCP streams use congestion control {cc}");
    }
    if let Some(us) = r.adaptive_window_us {
        println!("  ina's workers keep an adaptive window ({us} µs of queueing allowed)");
    }
    if t.dropped_by_queues > 0 {
        println!(
            "  the links' queues dropped {} packets: a sender overran its link's rate limiter",
            t.dropped_by_queues
        );
    }
    print_algorithms(r, t.speedup, t.speedup_ceiling);
    match t.rate_bps {
        None => println!(
            "  the links are not limited: the hosts' CPUs, not the links, bound both algorithms, and in-network aggregation has no bandwidth to save (give --rate)"
        ),
        Some(_) => {
            let short = r
                .results
                .iter()
                .filter(|x| x.of_bound.is_some_and(|f| f < 0.8))
                .map(|x| format!("{:?}", x.algorithm).to_lowercase())
                .collect::<Vec<_>>();
            if !short.is_empty() {
                println!(
                    "  {} ran below 0.8 of the links' bound: {}",
                    short.join(" and "),
                    if t.link_loss > 0.0 {
                        "the losses and their repair, or something other than the links (CPU, the switch), limit it"
                    } else {
                        "something other than the links (CPU, the switch) limits it"
                    }
                );
            }
        }
    }
}

/// Each algorithm's line (bandwidths, its bound and the fraction of it) and ina's speedup over
/// the ring against its ceiling.
pub(crate) fn print_algorithms(r: &super::BenchReport, speedup: Option<f64>, ceiling: f64) {
    for x in &r.results {
        let name = format!("{:?}", x.algorithm).to_lowercase();
        let bound = match (x.bound_s, x.of_bound) {
            (Some(b), Some(f)) => format!(", bound {:.1} ms, {:.3} of it", b * 1e3, f),
            _ => String::new(),
        };
        let rate = x
            .switch_frames_per_s
            .filter(|p| *p > 0.0)
            .map_or(String::new(), |p| {
                format!(", switch took in {p:.0} packets/s")
            });
        let cpu = x.median_cpu_s.map_or(String::new(), |c| {
            let gbit = x.bytes as f64 * 8.0 / 1e9;
            let whose = if r.testbed.is_some() {
                "hosts' CPU"
            } else {
                "CPU"
            };
            format!(", {whose} {:.2} s per Gbit all-reduced", c / gbit)
        });
        println!(
            "  {name:<5} algbw {:.3} Gbit/s, busbw {:.3} Gbit/s{bound}{rate}{cpu}",
            x.algbw_gbit_per_s, x.busbw_gbit_per_s
        );
    }
    if let Some(s) = speedup {
        println!(
            "  ina over ring: {s:.2}x, ceiling {ceiling:.2}x ({:.2} of it)",
            s / ceiling
        );
    }
}
