//! The switch and the workers as threads of the bench process, over loopback sockets.

use super::runner::{run_iterations, InaReducer, IterRecord, Reducer, RingReducer, RunError};
use super::{summarize, AlgoResult, Algorithm, Ctx};
use crate::data::generate;
use anyhow::{anyhow, Context};
use ina_io::paced::PacedPort;
use ina_io::{Port, UdpConfig, UdpPort};
use ina_switch::{JobSpec, Switch, SwitchConfig};
use ina_worker::ring::{RingComm, RingOptions};
use ina_worker::{Communicator, WorkerConfig};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Runs every worker on a thread of its own; `make(rank)` builds its reducer on that thread.
fn run_workers<F>(ctx: &Ctx, make: F) -> anyhow::Result<Vec<Vec<IterRecord>>>
where
    F: Fn(usize) -> Result<Box<dyn Reducer>, RunError> + Sync,
{
    let args = &ctx.args;
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..args.workers)
            .map(|rank| {
                let make = &make;
                std::thread::Builder::new()
                    .name(format!("ina-worker-{rank}"))
                    .spawn_scoped(scope, move || -> Result<Vec<IterRecord>, RunError> {
                        let mut reducer = make(rank)?;
                        let mut held = ctx.tensors[rank].lock().unwrap_or_else(|p| p.into_inner());
                        let (input, buf) = held.get_or_insert_with(|| {
                            (generate(args.seed, rank, ctx.elements), Vec::new())
                        });
                        run_iterations(
                            reducer.as_mut(),
                            input,
                            buf,
                            ctx.reference.as_deref(),
                            args.warmup,
                            args.iterations,
                            &mut |_| {
                                if rank == 0 {
                                    ctx.progress.inc(1);
                                }
                            },
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut out = Vec::new();
        for (rank, t) in threads.into_iter().enumerate() {
            match t.join() {
                Ok(Ok(records)) => out.push(records),
                Ok(Err(e)) => return Err(anyhow!("worker {rank}: {e}")),
                Err(_) => return Err(anyhow!("worker {rank} panicked")),
            }
        }
        Ok(out)
    })
}

/// Runs the `ina` workers, rank `r` on `ports[r]`, against the switch at `switch` (which has
/// the job installed); `mtu`, when set, is the path's (else the kernel's routes tell); `group`,
/// the multicast group the ports receive the results on (ports other than a bare UDP port
/// cannot join one themselves).
pub(crate) fn run_ina_workers<P: Port<Addr = SocketAddr> + Send + 'static>(
    ctx: &Ctx,
    ports: Vec<P>,
    switch: SocketAddr,
    mtu: Option<usize>,
    group: Option<std::net::SocketAddrV4>,
) -> anyhow::Result<Vec<Vec<IterRecord>>> {
    let args = &ctx.args;
    let addrs: Vec<SocketAddr> = ports.iter().map(|p| p.local_addr()).collect();
    let ports = std::sync::Mutex::new(ports.into_iter().map(Some).collect::<Vec<_>>());
    run_workers(ctx, |rank| {
        let port = ports
            .lock()
            .ok()
            .and_then(|mut p| p.get_mut(rank).and_then(Option::take))
            .ok_or_else(|| RunError {
                kind: "internal".into(),
                message: "port taken twice".into(),
            })?;
        let mut wc = WorkerConfig::new(switch, addrs[rank], 1, rank as u8);
        wc.window = args.window;
        if args.adaptive_window {
            let window = crate::cmd_worker::adaptive_window(args.target_queueing_us);
            wc.window_control = Some(window.map_err(|e| RunError {
                kind: "config".into(),
                message: e.to_string(),
            })?);
        }
        wc.give_up = Duration::from_millis(args.give_up_ms);
        wc.mtu = mtu.or(wc.mtu);
        wc.group = group;
        Ok(Box::new(InaReducer::new(Communicator::with_port(port, wc)?)) as Box<dyn Reducer>)
    })
}

pub(crate) fn ina(ctx: &Ctx) -> anyhow::Result<AlgoResult> {
    let args = &ctx.args;
    let mut cfg = SwitchConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    cfg.shards = args.shards;
    cfg.loss = args.loss;
    cfg.seed = args.seed;
    cfg.pipeline.pool_slots = args.slots;
    let udp = if args.no_offload {
        UdpConfig::default().gso(false).gro(false)
    } else {
        UdpConfig::default()
    };
    cfg.udp = udp.clone();
    cfg.pipeline.max_elems = cfg.pipeline.max_elems.max(args.elems);
    let switch = Switch::bind(cfg).context("starting the switch")?;
    let switch_addr = switch.local_addr();
    let handle = switch.handle();
    let stop = Arc::new(AtomicBool::new(false));
    let switch_thread = switch.spawn(stop.clone())?;
    let result = (|| {
        let mut ports = Vec::new();
        for _ in 0..args.workers {
            ports.push(UdpPort::bind_with(
                SocketAddr::from(([127, 0, 0, 1], 0)),
                &udp,
            )?);
        }
        let addrs: Vec<SocketAddr> = ports.iter().map(|p| p.local_addr()).collect();
        let group = if !args.unicast {
            let group = super::free_group()?;
            for p in ports.iter_mut() {
                p.join_group(group)
                    .context("joining the results' multicast group")?;
            }
            Some(group)
        } else {
            None
        };
        handle
            .add_job(JobSpec {
                job: 1,
                epoch: None,
                slot_base: 0,
                slot_count: args.slots,
                elems_per_packet: args.elems,
                workers: addrs.clone(),
                group,
                uplink: None,
            })
            .context("installing the job")?;
        let records = match ctx.link_rate {
            Some(bps) => {
                let paced = ports.into_iter().map(|p| PacedPort::new(p, bps)).collect();
                run_ina_workers(ctx, paced, switch_addr, None, group)?
            }
            None => run_ina_workers(ctx, ports, switch_addr, None, group)?,
        };
        let stats = handle.stats().context("reading switch statistics")?;
        anyhow::Ok((records, stats))
    })();
    stop.store(true, Ordering::SeqCst);
    let _ = switch_thread.join();
    let (records, stats) = result?;
    let mut r = summarize(ctx, Algorithm::Ina, &records)?;
    r.switch = Some(super::switch_summary(&stats.total, None));
    r.worker_peak_rss_kib = crate::mem::peak_rss_kib();
    Ok(r)
}

pub(crate) fn ring(ctx: &Ctx) -> anyhow::Result<AlgoResult> {
    let args = &ctx.args;
    let mut listeners = Vec::new();
    for _ in 0..args.workers {
        listeners.push(Some(TcpListener::bind("127.0.0.1:0")?));
    }
    let peers: Vec<SocketAddr> = listeners
        .iter()
        .flatten()
        .map(TcpListener::local_addr)
        .collect::<Result<_, _>>()?;
    let listeners = std::sync::Mutex::new(listeners);
    let records = run_workers(ctx, |rank| {
        let listener = listeners
            .lock()
            .ok()
            .and_then(|mut l| l.get_mut(rank).and_then(Option::take))
            .ok_or_else(|| RunError {
                kind: "internal".into(),
                message: "listener taken twice".into(),
            })?;
        let opts = RingOptions::default().with_max_pacing_rate(ctx.link_rate);
        let comm = RingComm::connect_with_listener(rank, listener, &peers, opts)?;
        Ok(Box::new(RingReducer {
            comm,
            sparse_block: None,
        }) as Box<dyn Reducer>)
    })?;
    let mut r = summarize(ctx, Algorithm::Ring, &records)?;
    r.worker_peak_rss_kib = crate::mem::peak_rss_kib();
    Ok(r)
}
