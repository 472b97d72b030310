//! The switch and each worker in an OS process of its own (`ina switch`, `ina worker`),
//! talking over loopback; the bench process only orchestrates and collects their reports.

use super::runner::IterRecord;
use super::{summarize, AlgoResult, Algorithm, Ctx};
use anyhow::{anyhow, bail, Context};
use ina_switch::{ControlClient, JobSpec, Request};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A child process whose stdout JSON lines arrive on a channel.
pub(super) struct Proc {
    name: String,
    child: Child,
    pub(super) stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Value>,
}

impl Proc {
    fn spawn(name: String, args: &[String]) -> anyhow::Result<Proc> {
        Proc::spawn_in(None, name, args)
    }

    /// [`Proc::spawn`] inside network namespace `netns`.
    pub(super) fn spawn_in(
        netns: Option<&str>,
        name: String,
        args: &[String],
    ) -> anyhow::Result<Proc> {
        let exe = std::env::current_exe().context("locating the ina binary")?;
        let mut command = ina_io::netns::command_in(netns, exe);
        if std::env::var_os("RUST_LOG").is_none() {
            // The bench prints its own summary; the daemons' logs would only interleave.
            command.env("RUST_LOG", "warn");
        }
        let mut child = command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        Ok(Proc {
            name,
            child,
            stdin,
            lines,
        })
    }

    /// The next event, or an error if the process ended or stayed silent too long.
    fn next(&mut self, timeout: Duration) -> anyhow::Result<Value> {
        match self.lines.recv_timeout(timeout) {
            Ok(v) => Ok(v),
            Err(mpsc::RecvTimeoutError::Timeout) => bail!("{} silent for {timeout:?}", self.name),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().ok();
                bail!("{} exited ({status:?})", self.name)
            }
        }
    }

    /// The next event if one is waiting; an error if the process ended.
    fn try_next(&mut self) -> anyhow::Result<Option<Value>> {
        match self.lines.try_recv() {
            Ok(v) => Ok(Some(v)),
            Err(mpsc::TryRecvError::Empty) => Ok(None),
            Err(mpsc::TryRecvError::Disconnected) => {
                let status = self.child.wait().ok();
                bail!("{} exited ({status:?})", self.name)
            }
        }
    }

    /// Waits for an event of the given name, failing on an `error` event.
    pub(super) fn expect(&mut self, event: &str, timeout: Duration) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self.next(left)?;
            match v.get("event").and_then(Value::as_str) {
                Some(e) if e == event => return Ok(v),
                Some("error") => bail!("{}: {}", self.name, v),
                _ => {}
            }
        }
    }

    pub(super) fn terminate(&mut self) {
        // SIGTERM first: the switch reports its statistics on a clean shutdown.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: sending a signal to our own child's pid has no memory-safety
            // preconditions.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

pub(super) const START: Duration = Duration::from_secs(30);

pub(super) fn worker_common(ctx: &Ctx, rank: usize) -> Vec<String> {
    let a = &ctx.args;
    let mut v = vec![
        "worker".to_string(),
        format!("--rank={rank}"),
        format!("--workers={}", a.workers),
        format!("--elements={}", ctx.elements),
        format!("--iterations={}", a.iterations),
        format!("--warmup={}", a.warmup),
        format!("--seed={}", a.seed),
        format!("--give-up-ms={}", a.give_up_ms),
    ];
    if a.no_verify {
        v.push("--no-verify".into());
    }
    if let Some(d) = a.density {
        v.push(format!("--density={d}"));
        v.push(format!(
            "--shape={}",
            clap::ValueEnum::to_possible_value(&a.shape)
                .map(|p| p.get_name().to_string())
                .unwrap_or_default()
        ));
        v.push(format!("--sparse-block={}", a.elems));
    }
    if a.adaptive_window {
        v.push("--adaptive-window".into());
        v.push(format!("--target-queueing-us={}", a.target_queueing_us));
    }
    v
}

/// Collects every worker's iteration records until each is done, showing each worker's
/// progress live on the progress bar's line (`w0 3/4 0.54s`: iterations done of all, and the
/// latest one's time).
pub(super) fn collect(
    ctx: &Ctx,
    workers: &mut [Proc],
) -> anyhow::Result<(Vec<Vec<IterRecord>>, u64)> {
    let total = ctx.args.warmup + ctx.args.iterations;
    let mut records: Vec<Vec<IterRecord>> = workers.iter().map(|_| Vec::new()).collect();
    let mut done = vec![false; workers.len()];
    let mut heard = vec![Instant::now(); workers.len()];
    let mut peak = 0;
    // Generous: the first iteration includes building the reference in each worker.
    let patience = Duration::from_secs(120);
    while done.iter().any(|d| !d) {
        let mut moved = false;
        for (rank, w) in workers.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            while let Some(v) = w.try_next()? {
                moved = true;
                heard[rank] = Instant::now();
                match v.get("event").and_then(Value::as_str) {
                    Some("iteration") => {
                        let r: IterRecord = serde_json::from_value(v)?;
                        if rank == 0 {
                            ctx.progress.inc(1);
                        }
                        records[rank].push(r);
                    }
                    Some("done") => {
                        peak = peak.max(v.get("peak_rss_kib").and_then(Value::as_u64).unwrap_or(0));
                        done[rank] = true;
                        break;
                    }
                    Some("error") => bail!("worker {rank}: {v}"),
                    _ => {}
                }
            }
            if !done[rank] && heard[rank].elapsed() > patience {
                bail!("worker {rank} silent for {patience:?}");
            }
        }
        if moved {
            let line: Vec<String> = records
                .iter()
                .enumerate()
                .map(|(rank, r)| match r.last() {
                    Some(last) => format!("w{rank} {}/{total} {:.2}s", r.len(), last.seconds),
                    None => format!("w{rank} 0/{total}"),
                })
                .collect();
            ctx.progress.set_message(line.join("  "));
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for (rank, mine) in records.iter().enumerate() {
        if mine.len() != total {
            bail!(
                "worker {rank} reported {} of {total} iterations",
                mine.len()
            );
        }
    }
    Ok((records, peak))
}

fn addr_of(v: &Value, key: &str) -> anyhow::Result<SocketAddr> {
    v.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("no `{key}` in {v}"))?
        .parse()
        .with_context(|| format!("parsing `{key}` of {v}"))
}

pub(crate) fn ina(ctx: &Ctx) -> anyhow::Result<AlgoResult> {
    let a = &ctx.args;
    let mut switch = Proc::spawn(
        "switch".into(),
        &[
            "switch".into(),
            "--listen=127.0.0.1:0".into(),
            "--control=127.0.0.1:0".into(),
            format!("--shards={}", a.shards),
            format!("--loss={}", a.loss),
            format!("--seed={}", a.seed),
            format!("--pool-slots={}", a.slots),
            format!("--max-elems={}", a.elems),
        ],
    )?;
    let ready = switch.expect("ready", START)?;
    let udp = addr_of(&ready, "udp")?;
    let control = addr_of(&ready, "control")?;
    let group = if a.unicast {
        None
    } else {
        Some(super::free_group()?)
    };
    let mut workers = Vec::new();
    for rank in 0..a.workers {
        let mut args = worker_common(ctx, rank);
        args.push("--algorithm=ina".into());
        args.push(format!("--switch={udp}"));
        if let Some(g) = group {
            args.push(format!("--group={g}"));
        }
        if let Some(w) = a.window {
            args.push(format!("--window={w}"));
        }
        workers.push(Proc::spawn(format!("worker {rank}"), &args)?);
    }
    let mut addrs = Vec::new();
    for w in &mut workers {
        addrs.push(addr_of(&w.expect("bound", START)?, "udp")?);
    }
    let mut client =
        ControlClient::connect(control).context("connecting to the control endpoint")?;
    let resp = client.call(&Request::AddJob {
        job: JobSpec {
            job: 1,
            epoch: None,
            slot_base: 0,
            slot_count: a.slots,
            elems_per_packet: a.elems,
            workers: addrs,
            group,
            uplink: None,
        },
    })?;
    if !resp.ok {
        bail!("installing the job: {:?}", resp.error);
    }
    let (records, worker_peak) = collect(ctx, &mut workers)?;
    switch.terminate();
    let stopped = switch.expect("stopped", START)?;
    let stats: ina_switch::SwitchStats = serde_json::from_value(
        stopped
            .get("stats")
            .cloned()
            .ok_or_else(|| anyhow!("no stats in {stopped}"))?,
    )?;
    let mut r = summarize(ctx, Algorithm::Ina, &records)?;
    r.switch = Some(super::switch_summary(
        &stats.total,
        stopped.get("peak_rss_kib").and_then(Value::as_u64),
    ));
    r.worker_peak_rss_kib = Some(worker_peak);
    Ok(r)
}

pub(crate) fn ring(ctx: &Ctx) -> anyhow::Result<AlgoResult> {
    let a = &ctx.args;
    let mut workers = Vec::new();
    for rank in 0..a.workers {
        let mut args = worker_common(ctx, rank);
        args.push("--algorithm=ring".into());
        if let Some(cc) = &ctx.args.ring_congestion {
            args.push(format!("--tcp-congestion={cc}"));
        }
        args.push("--peers=-".into());
        workers.push(Proc::spawn(format!("worker {rank}"), &args)?);
    }
    let mut peers = Vec::new();
    for w in &mut workers {
        peers.push(addr_of(&w.expect("bound", START)?, "ring")?);
    }
    let line = serde_json::to_string(&peers)? + "\n";
    for w in &mut workers {
        let stdin = w.stdin.as_mut().context("worker stdin")?;
        stdin.write_all(line.as_bytes())?;
        stdin.flush()?;
    }
    let (records, worker_peak) = collect(ctx, &mut workers)?;
    let mut r = summarize(ctx, Algorithm::Ring, &records)?;
    r.worker_peak_rss_kib = Some(worker_peak);
    Ok(r)
}
