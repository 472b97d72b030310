//! `ina bench --fabric l2|bmv2`: the switch on raw Ethernet ports of an emulated rack (a hub
//! namespace with a veth port per worker), as a P4 switch sits on the wire, and each worker an
//! `ina worker` process in a namespace of its own speaking kernel UDP to the switch's address.
//! `l2` is the L2 software switch (`ina switch --ports`), `bmv2` is `simple_switch` running the
//! v1model program. A ring all-reduce runs between the worker namespaces through the same
//! switch, as ordinary traffic.

use super::procs::{collect, worker_common, Proc, START};
use super::{summarize, AlgoResult, Algorithm, Ctx};
use anyhow::{bail, Context};
use ina_io::netns::{Rack, SWITCH_IP, SWITCH_MAC, SWITCH_MAC_BYTES};
use ina_switch_p4::bmv2::{Bmv2, Bmv2Config};
use ina_switch_p4::runtime::{JobDesc, L2Entry, MacAddr, RankDesc, SwitchDesc};
use std::io::Write;

/// Which switch sits in the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fabric {
    /// A UDP socket on loopback (no rack).
    Udp,
    /// The L2 software switch on the hub's raw ports.
    L2,
    /// bmv2 `simple_switch` with the v1model program on the hub's raw ports.
    Bmv2,
}

/// The rack of a bench run, built once and torn down when the run ends.
pub(crate) struct FabricCtx {
    pub fabric: Fabric,
    pub rack: Rack,
    /// Where bmv2's program and log go.
    pub scratch: std::path::PathBuf,
}

impl FabricCtx {
    pub fn new(fabric: Fabric, workers: usize, elems: u16) -> anyhow::Result<FabricCtx> {
        if !ina_switch_p4::v1model::SUPPORTED_ELEMS.contains(&elems) {
            bail!(
                "--fabric {fabric:?} carries {} elements per packet, as the P4 switch does; got --elems {elems}",
                ina_switch_p4::v1model::SUPPORTED_ELEMS
                    .map(|e| e.to_string())
                    .join(" or ")
            );
        }
        if fabric == Fabric::Bmv2 && !ina_switch_p4::bmv2::available() {
            bail!("--fabric bmv2 needs p4c-bm2-ss, simple_switch and simple_switch_CLI (see README.md, \"P4 targets\")");
        }
        let rack = Rack::new("bench", workers).context("building the rack of namespaces")?;
        let scratch = std::env::temp_dir().join(format!("ina-bench-{}", std::process::id()));
        std::fs::create_dir_all(&scratch)?;
        Ok(FabricCtx {
            fabric,
            rack,
            scratch,
        })
    }
}

impl Drop for FabricCtx {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

const UDP_PORT: u16 = 9000;
const RING_PORT: u16 = 7000;

/// The switch in the hub, whichever it is.
enum HubSwitch {
    L2(Proc),
    Bmv2(Bmv2),
}

impl HubSwitch {
    fn start(ctx: &Ctx, f: &FabricCtx) -> anyhow::Result<HubSwitch> {
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
        match f.fabric {
            Fabric::L2 => {
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
                Ok(HubSwitch::L2(p))
            }
            Fabric::Bmv2 => {
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
                let desc = SwitchDesc {
                    mac: MacAddr(SWITCH_MAC_BYTES),
                    ip: SWITCH_IP,
                    ports: (0..f.rack.workers as u16).collect(),
                    l2: (0..f.rack.workers)
                        .map(|r| L2Entry {
                            mac: MacAddr(Rack::worker_mac_bytes(r)),
                            port: r as u16,
                        })
                        .collect(),
                    flood_mgrp: 0xffff,
                };
                let job = JobDesc {
                    id: 1,
                    epoch: 1,
                    slot_base: 0,
                    slot_count: a.slots,
                    elems: a.elems,
                    mgrp: 1,
                    ranks: (0..f.rack.workers)
                        .map(|r| RankDesc {
                            port: r as u16,
                            mac: MacAddr(Rack::worker_mac_bytes(r)),
                            ip: Rack::worker_ip(r),
                            udp_port: UDP_PORT,
                        })
                        .collect(),
                };
                sw.configure(&desc, &[job])?;
                Ok(HubSwitch::Bmv2(sw))
            }
            Fabric::Udp => bail!("the UDP fabric has no hub"),
        }
    }

    /// Frames the switch took in (every event), and results multicast.
    fn stop(self) -> anyhow::Result<(u64, u64)> {
        match self {
            HubSwitch::L2(mut p) => {
                p.terminate();
                let stopped = p.expect("stopped", START)?;
                let stats = &stopped["stats"];
                let frames: u64 = stats["events"]
                    .as_array()
                    .map(|e| e.iter().filter_map(|x| x[1].as_u64()).sum())
                    .unwrap_or(0);
                Ok((frames, stats["results_multicast"].as_u64().unwrap_or(0)))
            }
            HubSwitch::Bmv2(sw) => {
                let (events, multicast) = sw.counters()?;
                Ok((events.iter().sum(), multicast))
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

pub(crate) fn ina(ctx: &Ctx, f: &FabricCtx) -> anyhow::Result<AlgoResult> {
    let hub = HubSwitch::start(ctx, f)?;
    let mut workers = Vec::new();
    for rank in 0..f.rack.workers {
        let mut args = worker_common(ctx, rank);
        args.push("--algorithm=ina".into());
        args.push(format!("--switch={SWITCH_IP}:{}", ina_wire::UDP_PORT));
        args.push(format!("--bind={}:{UDP_PORT}", Rack::worker_ip(rank)));
        if let Some(w) = ctx.args.window {
            args.push(format!("--window={w}"));
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
    let mut r = summarize(ctx, Algorithm::Ina, &records)?;
    r.worker_peak_rss_kib = Some(worker_peak);
    r.switch_frames_per_s = switch_rate(frames_in, &records);
    tracing::debug!(frames_in, multicast, "switch counters");
    Ok(r)
}

pub(crate) fn ring(ctx: &Ctx, f: &FabricCtx) -> anyhow::Result<AlgoResult> {
    let hub = HubSwitch::start(ctx, f)?;
    let peers: Vec<String> = (0..f.rack.workers)
        .map(|r| format!("{}:{RING_PORT}", Rack::worker_ip(r)))
        .collect();
    let mut workers = Vec::new();
    for rank in 0..f.rack.workers {
        let mut args = worker_common(ctx, rank);
        args.push("--algorithm=ring".into());
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
    let mut r = summarize(ctx, Algorithm::Ring, &records)?;
    r.worker_peak_rss_kib = Some(worker_peak);
    r.switch_frames_per_s = switch_rate(frames_in, &records);
    Ok(r)
}
