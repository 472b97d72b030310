//! Packet rate of the switch against a plain UDP reflector.
//!
//! The same closed-loop load generators drive both servers: each keeps a window of data
//! packets outstanding (no quantization, templates patched in place) and sends the next packet
//! for a slot as soon as the answer for it arrives: the switch's result, or the reflector's
//! echo. Both servers run one thread with the same batched UDP I/O, so the ratio of their
//! packet rates is the cost of the aggregation pipeline over bare I/O.

use super::{AlgoResult, Algorithm, Ctx, RateResult};
use anyhow::Context;
use ina_io::reflector::{Reflector, ReflectorConfig};
use ina_io::{Port, RecvBatch, SendBatch, UdpConfig, UdpPort};
use ina_switch::{JobSpec, Switch, SwitchConfig};
use ina_wire::{AggRepr, MessageType};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a generator sends and expects.
#[derive(Debug, Clone, Copy)]
struct GenConfig {
    server: SocketAddr,
    job: u16,
    epoch: u16,
    rank: u8,
    window: u16,
    elems: u16,
    /// The answer is the packet itself (reflector) rather than a result (switch).
    echo: bool,
}

fn header(cfg: &GenConfig, position: u64) -> AggRepr {
    let w = u64::from(cfg.window);
    AggRepr {
        kind: MessageType::Data,
        set: ((position / w) & 1) as u8,
        gap: None,
        job: cfg.job,
        epoch: cfg.epoch,
        rank: cfg.rank,
        exponent: 0,
        slot: (position % w) as u16,
        count: cfg.elems,
        seq: position as u32,
    }
}

/// Runs one generator until `stop`; counts answered packets in `done`.
fn generate<P: Port<Addr = SocketAddr>>(
    mut port: P,
    cfg: GenConfig,
    stop: &AtomicBool,
    done: &AtomicU64,
    resends: &AtomicU64,
) -> anyhow::Result<()> {
    let w = u64::from(cfg.window);
    let len = ina_wire::HEADER_LEN + 4 * usize::from(cfg.elems);
    let mut packet = vec![0u8; len];
    // Positions start at the window, as a worker's lane does.
    let mut outstanding: Vec<u64> = (w..2 * w).collect();
    let mut send = SendBatch::with_capacity(64, 64 * len);
    let mut recv = RecvBatch::new(64, len.max(2048) + 1);
    let emit = |pos: u64, send: &mut SendBatch, packet: &mut Vec<u8>| -> anyhow::Result<()> {
        header(&cfg, pos)
            .emit_into(packet)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        send.push(cfg.server, packet);
        Ok(())
    };
    let flush = |port: &mut P, send: &mut SendBatch| {
        if !send.is_empty() {
            // A refused datagram is a loss; the resend timer covers it.
            let _ = port.send_batch(send);
            send.clear();
        }
    };
    for &pos in &outstanding {
        emit(pos, &mut send, &mut packet)?;
        if send.len() >= 64 {
            flush(&mut port, &mut send);
        }
    }
    flush(&mut port, &mut send);
    let mut last_progress = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        port.recv_batch(&mut recv, Some(Duration::from_millis(5)))?;
        let mut answered = 0;
        for d in recv.iter() {
            let Ok((h, _)) = AggRepr::parse_bytes(d.data) else {
                continue;
            };
            let expected = if cfg.echo {
                MessageType::Data
            } else {
                MessageType::Result
            };
            if h.kind != expected || h.slot >= cfg.window {
                continue;
            }
            let i = usize::from(h.slot);
            let Some(pos) = outstanding.get_mut(i) else {
                continue;
            };
            if u64::from(h.seq) != *pos {
                continue;
            }
            *pos += w;
            answered += 1;
            emit(*pos, &mut send, &mut packet)?;
            if send.len() >= 64 {
                flush(&mut port, &mut send);
            }
        }
        flush(&mut port, &mut send);
        if answered > 0 {
            done.fetch_add(answered, Ordering::Relaxed);
            last_progress = Instant::now();
        } else if last_progress.elapsed() > Duration::from_millis(20) {
            for &pos in &outstanding {
                emit(pos, &mut send, &mut packet)?;
                if send.len() >= 64 {
                    flush(&mut port, &mut send);
                }
            }
            flush(&mut port, &mut send);
            resends.fetch_add(w, Ordering::Relaxed);
            last_progress = Instant::now();
        }
    }
    Ok(())
}

/// Drives `workers` generators against `server` and measures the answered rate.
fn measure<P: Port<Addr = SocketAddr> + Send>(
    ctx: &Ctx,
    ports: Vec<P>,
    cfgs: Vec<GenConfig>,
    packet_bytes: usize,
) -> anyhow::Result<RateResult> {
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let resends = AtomicU64::new(0);
    let seconds = ctx.args.rate_seconds.max(0.1);
    let (start_count, end_count, elapsed) = std::thread::scope(|scope| {
        let threads: Vec<_> = ports
            .into_iter()
            .zip(cfgs)
            .map(|(port, cfg)| {
                let (stop, done, resends) = (&stop, &done, &resends);
                scope.spawn(move || generate(port, cfg, stop, done, resends))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        let c0 = done.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs_f64(seconds));
        let c1 = done.load(Ordering::Relaxed);
        let dt = t0.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            match t.join() {
                Ok(r) => r?,
                Err(_) => anyhow::bail!("a load generator panicked"),
            }
        }
        anyhow::Ok((c0, c1, dt))
    })?;
    let answered = (end_count - start_count) as f64;
    Ok(RateResult {
        // Every answer is one datagram out of the server, matched by one datagram in.
        packets_per_s: 2.0 * answered / elapsed,
        rx_gbit_per_s: answered * packet_bytes as f64 * 8.0 / elapsed / 1e9,
        seconds: elapsed,
        packet_bytes,
        resends: resends.load(Ordering::Relaxed),
    })
}

/// One generator per port against `server`, measured.
fn drive<P: Port<Addr = SocketAddr> + Send>(
    ctx: &Ctx,
    ports: Vec<P>,
    server: SocketAddr,
    epoch: u16,
    echo: bool,
) -> anyhow::Result<RateResult> {
    let window = window(ctx);
    let cfgs = (0..ports.len())
        .map(|r| GenConfig {
            server,
            job: 1,
            epoch,
            rank: r as u8,
            window,
            elems: ctx.args.elems,
            echo,
        })
        .collect();
    let bytes = ina_wire::HEADER_LEN + 4 * usize::from(ctx.args.elems);
    measure(ctx, ports, cfgs, bytes)
}

fn bind_clients(n: usize) -> anyhow::Result<Vec<UdpPort>> {
    (0..n)
        .map(|_| {
            UdpPort::bind_with(SocketAddr::from(([127, 0, 0, 1], 0)), &UdpConfig::default())
                .context("binding a load generator")
        })
        .collect()
}

fn result(ctx: &Ctx, algorithm: Algorithm, rate: RateResult) -> AlgoResult {
    AlgoResult {
        algorithm,
        processes: false,
        workers: ctx.args.workers,
        bytes: 0,
        elements: 0,
        loss: 0.0,
        seconds: vec![rate.seconds],
        cpu_seconds: Vec::new(),
        median_cpu_s: None,
        median_s: rate.seconds,
        min_s: rate.seconds,
        max_s: rate.seconds,
        goodput_gbit_per_s: rate.rx_gbit_per_s,
        elements_per_s: 0.0,
        max_abs_err: None,
        max_rel_err: None,
        verified: None,
        retransmissions: rate.resends,
        fast_retransmissions: 0,
        stall_probes: 0,
        switch: None,
        worker_peak_rss_kib: None,
        rate: Some(rate),
        switch_frames_per_s: None,
        algbw_gbit_per_s: 0.0,
        busbw_gbit_per_s: 0.0,
        bound_s: None,
        of_bound: None,
        union_density: None,
    }
}

fn window(ctx: &Ctx) -> u16 {
    super::window_of(&ctx.args)
}

pub(crate) fn switch(ctx: &Ctx) -> anyhow::Result<AlgoResult> {
    let args = &ctx.args;
    let mut cfg = SwitchConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    cfg.shards = args.shards;
    cfg.pipeline.pool_slots = args.slots;
    cfg.pipeline.max_elems = cfg.pipeline.max_elems.max(args.elems);
    let sw = Switch::bind(cfg).context("starting the switch")?;
    let server = sw.local_addr();
    let handle = sw.handle();
    let stop = Arc::new(AtomicBool::new(false));
    let thread = sw.spawn(stop.clone())?;
    let run = (|| {
        let ports = bind_clients(args.workers)?;
        let window = window(ctx);
        let job = handle
            .add_job(JobSpec::new(
                1,
                window,
                args.elems,
                ports.iter().map(UdpPort::local_addr).collect(),
            ))
            .context("installing the job")?;
        drive(ctx, ports, server, job.epoch.unwrap_or(0), false)
    })();
    stop.store(true, Ordering::SeqCst);
    let stats = thread.join();
    let rate = run?;
    let mut r = result(ctx, Algorithm::Switch, rate);
    if let Ok(Ok(s)) = stats {
        r.switch = Some(super::switch_summary(&s.total, None));
    }
    Ok(r)
}

pub(crate) fn reflector(ctx: &Ctx) -> anyhow::Result<AlgoResult> {
    let args = &ctx.args;
    let bytes = ina_wire::HEADER_LEN + 4 * usize::from(args.elems);
    let port = UdpPort::bind_with(SocketAddr::from(([127, 0, 0, 1], 0)), &UdpConfig::default())
        .context("starting the reflector")?;
    // Receive slots as large as the switch's, so both servers copy the same bytes.
    let refl = Reflector::with_config(
        port,
        ReflectorConfig {
            slot_size: bytes.max(2048) + 1,
            ..ReflectorConfig::default()
        },
    );
    let server = refl.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let thread = refl.spawn(stop.clone())?;
    let run = (|| {
        let ports = bind_clients(args.workers)?;
        drive(ctx, ports, server, 0, true)
    })();
    stop.store(true, Ordering::SeqCst);
    let _ = thread.join();
    Ok(result(ctx, Algorithm::Reflector, run?))
}

/// The same measurements on DPDK: the switch and the reflector each on one memif link per
/// generator, the generators on the other ends, all in this process (one EAL), each link a
/// pair of virtual devices created for the run.
#[cfg(feature = "dpdk")]
pub(crate) mod dpdk {
    use super::*;
    use ina_io::dpdk::{Device, DeviceConfig, DpdkUdpConfig, DpdkUdpPort, Eal};
    use std::net::{Ipv4Addr, SocketAddrV4};
    use std::sync::atomic::AtomicU32;
    use std::sync::OnceLock;

    static EAL: OnceLock<Result<Eal, String>> = OnceLock::new();
    static LINKS: AtomicU32 = AtomicU32::new(0);

    fn eal(ctx: &Ctx) -> anyhow::Result<&'static Eal> {
        let r = EAL.get_or_init(|| {
            let args: Vec<String> = match &ctx.args.dpdk {
                Some(a) => a.split_whitespace().map(str::to_string).collect(),
                None => format!(
                    "--no-huge --no-pci --no-shconf -m 1024 --log-level=*:warning --file-prefix=ina-bench-{}",
                    std::process::id()
                )
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            };
            Eal::init(&args).map_err(|e| e.to_string())
        });
        r.as_ref().map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// `n` memif links: (server ends, client ends).
    fn links(ctx: &Ctx, n: usize) -> anyhow::Result<(Vec<Device>, Vec<Device>)> {
        let eal = eal(ctx)?;
        let mut servers = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..n {
            let k = LINKS.fetch_add(1, Ordering::SeqCst);
            let sock =
                std::env::temp_dir().join(format!("ina-bench-{}-{k}.sock", std::process::id()));
            let _ = std::fs::remove_file(&sock);
            let sock = sock.display();
            servers.push(Device::create(
                eal,
                &format!(
                    "net_memif{},role=server,socket={sock},socket-abstract=no",
                    2 * k
                ),
                DeviceConfig::default(),
            )?);
            clients.push(Device::create(
                eal,
                &format!(
                    "net_memif{},role=client,socket={sock},socket-abstract=no",
                    2 * k + 1
                ),
                DeviceConfig::default(),
            )?);
        }
        Ok((servers, clients))
    }

    /// The generators' ports: rank `r` at 198.18.1.{r+1}:9000 on client end `r`, knowing the
    /// server's MAC on its link.
    fn generators(
        server: SocketAddrV4,
        servers: &[Device],
        clients: Vec<Device>,
    ) -> Vec<DpdkUdpPort> {
        clients
            .into_iter()
            .zip(servers)
            .enumerate()
            .map(|(r, (c, s))| {
                DpdkUdpPort::new(
                    c,
                    &DpdkUdpConfig {
                        local: SocketAddrV4::new(Ipv4Addr::new(198, 18, 1, r as u8 + 1), 9000),
                        neighbours: vec![(*server.ip(), s.mac())],
                        groups: Vec::new(),
                    },
                )
            })
            .collect()
    }

    /// A running switch at `local` on the server ends of `servers`.
    type Running = (
        ina_switch::SwitchHandle,
        Arc<AtomicBool>,
        std::thread::JoinHandle<Result<ina_switch::SwitchStats, ina_switch::SwitchError>>,
    );

    fn start_switch(
        ctx: &Ctx,
        local: SocketAddrV4,
        servers: Vec<Device>,
    ) -> anyhow::Result<Running> {
        let args = &ctx.args;
        let port = DpdkUdpPort::on_devices(servers, &DpdkUdpConfig::new(local));
        let mut cfg = SwitchConfig::new(SocketAddr::V4(local));
        cfg.pipeline.pool_slots = args.slots;
        cfg.pipeline.max_elems = cfg.pipeline.max_elems.max(args.elems);
        let sw = Switch::with_dpdk(cfg, port).context("starting the switch on DPDK")?;
        let handle = sw.handle();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = sw.spawn(stop.clone())?;
        Ok((handle, stop, thread))
    }

    pub(crate) fn switch(ctx: &Ctx) -> anyhow::Result<AlgoResult> {
        let args = &ctx.args;
        let local = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 100), ina_wire::UDP_PORT);
        let (servers, clients) = links(ctx, args.workers)?;
        let ports = generators(local, &servers, clients);
        let (handle, stop, thread) = start_switch(ctx, local, servers)?;
        let run = (|| {
            let window = window(ctx);
            let job = handle
                .add_job(JobSpec::new(
                    1,
                    window,
                    args.elems,
                    ports.iter().map(|p| p.local_addr()).collect(),
                ))
                .context("installing the job")?;
            drive(
                ctx,
                ports,
                SocketAddr::V4(local),
                job.epoch.unwrap_or(0),
                false,
            )
        })();
        stop.store(true, Ordering::SeqCst);
        let stats = thread.join();
        let rate = run?;
        let mut r = result(ctx, Algorithm::DpdkSwitch, rate);
        if let Ok(Ok(s)) = stats {
            r.switch = Some(crate::bench::switch_summary(&s.total, None));
        }
        Ok(r)
    }

    /// DPDK's own forwarder as the server: `dpdk-testpmd` in io mode on a memif link in loop
    /// topology (every frame goes back out of the port it came in, unchanged), one forwarding
    /// core, in its own process. One generator sends to its own address, so the frames it gets
    /// back are its own: the reflector's measure with DPDK's tool in the reflector's place.
    pub(crate) fn testpmd(ctx: &Ctx) -> anyhow::Result<AlgoResult> {
        let tool = ["/usr/bin/dpdk-testpmd", "/usr/local/bin/dpdk-testpmd"]
            .into_iter()
            .find(|p| std::path::Path::new(p).is_file())
            .context("dpdk-testpmd not found (Debian: apt-get install dpdk-dev)")?;
        let eal = eal(ctx)?;
        let k = LINKS.fetch_add(1, Ordering::SeqCst);
        let sock = std::env::temp_dir().join(format!("ina-bench-{}-{k}.sock", std::process::id()));
        let _ = std::fs::remove_file(&sock);
        let log = std::fs::File::create(sock.with_extension("log"))
            .context("creating dpdk-testpmd's log")?;
        let log_err = log.try_clone().context("dpdk-testpmd's log")?;
        let mut child = std::process::Command::new(tool)
            .args([
                "--no-huge",
                "--no-pci",
                "--no-shconf",
                "-m",
                "512",
                "-l",
                "0-1",
                "--log-level=*:warning",
            ])
            .arg(format!(
                "--file-prefix=ina-testpmd-{}-{k}",
                std::process::id()
            ))
            .arg(format!(
                "--vdev=net_memif0,role=server,socket={},socket-abstract=no",
                sock.display()
            ))
            .args([
                "--",
                "--forward-mode=io",
                "--port-topology=loop",
                "--nb-cores=1",
                "--total-num-mbufs=16384",
                "--auto-start",
            ])
            .arg("--stats-period=1")
            .stdin(std::process::Stdio::piped())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .context("starting dpdk-testpmd")?;
        let run = (|| {
            let up = Instant::now();
            while !sock.exists() {
                if up.elapsed() > Duration::from_secs(20) {
                    anyhow::bail!("dpdk-testpmd did not open {} within 20 s", sock.display());
                }
                if let Ok(Some(status)) = child.try_wait() {
                    anyhow::bail!("dpdk-testpmd exited ({status})");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // The socket exists before testpmd accepts on it, and a memif client that found
            // nobody does not try again: a client whose link stays down is replaced.
            let mut attempt = 0;
            let dev = loop {
                let n = LINKS.fetch_add(1, Ordering::SeqCst);
                let dev = Device::create(
                    eal,
                    &format!(
                        "net_memif{},role=client,socket={},socket-abstract=no",
                        2 * n + 1,
                        sock.display()
                    ),
                    DeviceConfig::default(),
                )?;
                if dev.wait_link(Duration::from_secs(2)) {
                    break dev;
                }
                attempt += 1;
                if attempt == 10 {
                    anyhow::bail!("the memif link to dpdk-testpmd did not come up (10 tries)");
                }
            };
            let local = SocketAddrV4::new(Ipv4Addr::new(198, 18, 1, 1), 9000);
            let mac = dev.mac();
            let port = DpdkUdpPort::new(
                dev,
                &DpdkUdpConfig {
                    local,
                    neighbours: vec![(*local.ip(), mac)],
                    groups: Vec::new(),
                },
            );
            drive(ctx, vec![port], SocketAddr::V4(local), 0, true)
        })();
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_file(&sock);
        let _ = std::fs::remove_file(sock.with_extension("log"));
        let mut r = result(ctx, Algorithm::DpdkTestpmd, run?);
        r.workers = 1;
        Ok(r)
    }

    /// The all-reduce (the `ina` algorithm) with the switch and every worker on DPDK: a
    /// memif link per worker, results sent to each worker.
    pub(crate) fn ina(ctx: &Ctx) -> anyhow::Result<AlgoResult> {
        let args = &ctx.args;
        let local = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 102), ina_wire::UDP_PORT);
        let (servers, clients) = links(ctx, args.workers)?;
        let ports = generators(local, &servers, clients);
        let addrs: Vec<SocketAddr> = ports.iter().map(|p| p.local_addr()).collect();
        let mtu = servers
            .iter()
            .map(|d| d.max_frame().saturating_sub(14))
            .min()
            .unwrap_or(0);
        let (handle, stop, thread) = start_switch(ctx, local, servers)?;
        let result = (|| {
            handle
                .add_job(JobSpec::new(1, args.slots, args.elems, addrs.clone()))
                .context("installing the job")?;
            let records = crate::bench::inproc::run_ina_workers(
                ctx,
                ports,
                SocketAddr::V4(local),
                Some(mtu),
                None,
            )?;
            let stats = handle.stats().context("reading switch statistics")?;
            anyhow::Ok((records, stats))
        })();
        stop.store(true, Ordering::SeqCst);
        let _ = thread.join();
        let (records, stats) = result?;
        let mut r = crate::bench::summarize(ctx, Algorithm::DpdkIna, &records)?;
        r.switch = Some(crate::bench::switch_summary(&stats.total, None));
        Ok(r)
    }

    pub(crate) fn reflector(ctx: &Ctx) -> anyhow::Result<AlgoResult> {
        let args = &ctx.args;
        let bytes = ina_wire::HEADER_LEN + 4 * usize::from(args.elems);
        let local = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 101), ina_wire::UDP_PORT);
        let (servers, clients) = links(ctx, args.workers)?;
        let ports = generators(local, &servers, clients);
        let port = DpdkUdpPort::on_devices(servers, &DpdkUdpConfig::new(local));
        let refl = Reflector::with_config(
            port,
            ReflectorConfig {
                slot_size: bytes.max(2048) + 1,
                ..ReflectorConfig::default()
            },
        );
        let stop = Arc::new(AtomicBool::new(false));
        let thread = refl.spawn(stop.clone())?;
        let run = drive(ctx, ports, SocketAddr::V4(local), 0, true);
        stop.store(true, Ordering::SeqCst);
        let _ = thread.join();
        Ok(result(ctx, Algorithm::DpdkReflector, run?))
    }
}
