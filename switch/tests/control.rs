//! The switch daemon's control plane and its handling of hostile input, over loopback.
#![allow(clippy::unwrap_used)]

use ina_switch::{
    ControlClient, ControlServer, JobSpec, Request, Switch, SwitchConfig, SwitchError, SwitchHandle,
};
use ina_wire::{AggRepr, MessageType, HEADER_LEN};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Calls `check` every 10 ms until it returns `Some`, and returns that; panics naming `what`
/// was awaited if `within` passes first.
fn wait_until<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct Running {
    udp: SocketAddr,
    control: SocketAddr,
    handle: SwitchHandle,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn start(cfg: SwitchConfig) -> Running {
    let sw = Switch::bind(cfg).unwrap();
    let udp = sw.local_addr();
    let handle = sw.handle();
    let stop = Arc::new(AtomicBool::new(false));
    let server = ControlServer::bind("127.0.0.1:0".parse().unwrap(), sw.handle()).unwrap();
    let control = server.local_addr().unwrap();
    let s2 = stop.clone();
    let threads = vec![
        std::thread::spawn(move || {
            sw.run(s2).unwrap();
        }),
        server.spawn(stop.clone()).unwrap(),
    ];
    // The switch runs on its own thread: a request sent before that thread is up would be
    // refused with "not running".
    assert!(
        handle.wait_running(Duration::from_secs(10)),
        "the switch did not start"
    );
    Running {
        udp,
        control,
        handle,
        stop,
        threads,
    }
}

fn job(id: u16, base: u16, count: u16, workers: Vec<SocketAddr>) -> JobSpec {
    JobSpec {
        job: id,
        epoch: None,
        slot_base: base,
        slot_count: count,
        elems_per_packet: 64,
        workers,
        group: None,
        uplink: None,
    }
}

#[test]
fn jobs_are_added_listed_and_removed_over_tcp() {
    let sw = start(SwitchConfig::new("127.0.0.1:0".parse().unwrap()));
    let mut c = ControlClient::connect(sw.control).unwrap();
    assert!(c.call(&Request::Ping).unwrap().ok);
    let w: Vec<SocketAddr> = vec!["127.0.0.1:40001".parse().unwrap()];
    let r = c
        .call(&Request::AddJob {
            job: job(5, 0, 32, w.clone()),
        })
        .unwrap();
    assert!(r.ok, "{r:?}");
    let first_epoch = r.job.unwrap().epoch.unwrap();
    assert_ne!(first_epoch, 0);
    // Overlapping slots and a duplicate job id are refused with a reason.
    let r = c
        .call(&Request::AddJob {
            job: job(6, 16, 32, w.clone()),
        })
        .unwrap();
    assert!(!r.ok && r.error.is_some(), "{r:?}");
    let r = c
        .call(&Request::AddJob {
            job: job(5, 100, 8, w.clone()),
        })
        .unwrap();
    assert!(!r.ok, "{r:?}");
    let listed = c.call(&Request::Jobs).unwrap().jobs.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].job, 5);
    let stats = c.call(&Request::Stats).unwrap().stats.unwrap();
    assert_eq!(stats.shards.len(), 1);
    assert!(c.call(&Request::RemoveJob { job: 5 }).unwrap().ok);
    assert!(!c.call(&Request::RemoveJob { job: 5 }).unwrap().ok);
    assert!(c.call(&Request::Jobs).unwrap().jobs.unwrap().is_empty());
    // Reinstalled, the job gets a new epoch, so old packets cannot mix into new sums.
    let r = c
        .call(&Request::AddJob {
            job: job(5, 0, 32, w),
        })
        .unwrap();
    assert_ne!(r.job.unwrap().epoch.unwrap(), first_epoch);
}

#[test]
fn malformed_control_requests_get_an_error_and_the_endpoint_keeps_serving() {
    let sw = start(SwitchConfig::new("127.0.0.1:0".parse().unwrap()));
    let stream = TcpStream::connect(sw.control).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    for bad in [
        "this is not json",
        "{\"op\":\"launch_missiles\"}",
        "{\"op\":\"add_job\",\"job\":{\"job\":\"x\"}}",
        "[1,2,3]",
    ] {
        writeln!(w, "{bad}").unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["ok"], false, "{bad} -> {line}");
        assert!(v["error"].is_string());
    }
    writeln!(w, "{{\"op\":\"ping\"}}").unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("\"ok\":true"), "{line}");
}

#[test]
fn hostile_datagrams_are_counted_and_the_switch_keeps_answering() {
    let mut cfg = SwitchConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.shards = 2;
    let worker = UdpSocket::bind("127.0.0.1:0").unwrap();
    worker
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    cfg.jobs = vec![job(3, 0, 16, vec![worker.local_addr().unwrap()])];
    let sw = start(cfg);
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut seed = 0x1234_5678_u64;
    for i in 0..2000usize {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = (seed % 1200) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|k| (seed >> (k % 56)) as u8).collect();
        if i % 3 == 0 && len >= HEADER_LEN {
            // A plausible header of a job nobody installed.
            let h = AggRepr {
                kind: MessageType::Data,
                set: 0,
                gap: None,
                job: 999,
                epoch: 1,
                rank: 0,
                exponent: 0,
                slot: (i % 16) as u16,
                count: 0,
                seq: i as u32,
            };
            h.emit_into(&mut bytes[..HEADER_LEN]).unwrap();
            bytes.truncate(HEADER_LEN);
        }
        let from = if i % 2 == 0 { &stranger } else { &worker };
        from.send_to(&bytes, sw.udp).unwrap();
    }
    // The listed worker still gets its probe answered.
    let probe = AggRepr {
        kind: MessageType::Probe,
        set: 0,
        gap: None,
        job: 3,
        epoch: 0,
        rank: 0,
        exponent: 0,
        slot: 0,
        count: 0,
        seq: 0,
    };
    let mut p = [0u8; HEADER_LEN];
    probe.emit_into(&mut p).unwrap();
    let mut answered = false;
    let mut buf = [0u8; 2048];
    for _ in 0..20 {
        worker.send_to(&p, sw.udp).unwrap();
        if let Ok((n, _)) = worker.recv_from(&mut buf) {
            if let Ok((h, _)) = AggRepr::parse_bytes(&buf[..n]) {
                if h.kind == MessageType::ProbeReply && h.job == 3 {
                    answered = true;
                    break;
                }
            }
        }
    }
    assert!(answered, "probe not answered after the garbage");
    let mut c = ControlClient::connect(sw.control).unwrap();
    let t = c.call(&Request::Stats).unwrap().stats.unwrap().total;
    let dropped = t.pipeline.malformed
        + t.pipeline.not_ina
        + t.pipeline.unknown_job
        + t.pipeline.wrong_port
        + t.pipeline.unexpected_type
        + t.pipeline.bad_count
        + t.pipeline.unknown_rank
        + t.pipeline.stale_epoch
        + t.pipeline.slot_out_of_range;
    assert!(t.unknown_source >= 900, "{t:?}");
    assert!(t.pipeline.unknown_job >= 300, "{t:?}");
    assert!(dropped >= 1500, "{t:?}");
    assert_eq!(
        t.pipeline.results_multicast, 0,
        "garbage completed a slot: {t:?}"
    );
}

#[test]
fn injected_loss_is_counted() {
    let mut cfg = SwitchConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.loss = 0.5;
    let sw = start(cfg);
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..400 {
        s.send_to(b"x", sw.udp).unwrap();
    }
    let mut c = ControlClient::connect(sw.control).unwrap();
    // Until the switch has taken in all 400 (each either dropped or passed on), or 20 s have
    // passed (then the count below says how many it took in).
    let deadline = Instant::now() + Duration::from_secs(20);
    let t = loop {
        let t = c.call(&Request::Stats).unwrap().stats.unwrap().total;
        if t.injected_drops_in + t.pipeline.packets_in >= 400 || Instant::now() >= deadline {
            break t;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        (100..=300).contains(&t.injected_drops_in),
        "about half dropped: {t:?}"
    );
    assert_eq!(t.injected_drops_in + t.pipeline.packets_in, 400, "{t:?}");
}

#[test]
fn invalid_configurations_are_refused() {
    let mut cfg = SwitchConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.shards = 0;
    assert!(Switch::bind(cfg).is_err());
    let mut cfg = SwitchConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.jobs = vec![job(1, 4090, 64, vec!["127.0.0.1:1".parse().unwrap()])];
    assert!(Switch::bind(cfg).is_err(), "slots beyond the pool");
    let mut cfg = SwitchConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.jobs = vec![job(1, 0, 8, Vec::new())];
    assert!(Switch::bind(cfg).is_err(), "a job without workers");
}

#[test]
fn an_endless_request_line_is_refused_and_the_connection_closed() {
    let sw = start(SwitchConfig::new("127.0.0.1:0".parse().unwrap()));
    let stream = TcpStream::connect(sw.control).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut w = stream.try_clone().unwrap();
    // 2 MiB without a newline, twice the longest line, then more of the same line trickling
    // in, never pausing long enough for a read to time out: the refusal must not wait for the
    // line to end. The switch hangs up, which ends the writes with an error.
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'x'; 64 << 10];
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut sent = 0usize;
        while std::time::Instant::now() < deadline {
            let n = if sent < 2 << 20 { chunk.len() } else { 1024 };
            if w.write_all(&chunk[..n]).is_err() {
                return true;
            }
            sent += n;
            if sent >= 2 << 20 {
                // (Pacing, not a wait: the trickle must keep coming, each piece well within
                // the endpoint's read timeout, until the refusal ends it.)
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        false
    });
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["ok"], false, "{line}");
    assert_eq!(v["error"], "request line too long", "{line}");
    let mut rest = Vec::new();
    match r.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "more after the refusal: {rest:?}"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    assert!(writer.join().unwrap(), "the connection stayed open");
    // The endpoint keeps serving other connections.
    let mut c = ControlClient::connect(sw.control).unwrap();
    assert!(c.call(&Request::Ping).unwrap().ok);
}

#[test]
fn a_second_sharded_switch_on_a_taken_address_is_refused() {
    let mut cfg = SwitchConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.shards = 2;
    let first = Switch::bind(cfg.clone()).unwrap();
    let taken = first.local_addr();
    assert_ne!(taken.port(), 0);
    cfg.listen = taken;
    match Switch::bind(cfg.clone()) {
        Err(e @ SwitchError::Bind { .. }) => {
            assert!(e.to_string().contains("in use"), "{e}");
        }
        other => panic!("a second switch bound {taken}: {other:?}"),
    }
    // A single-shard switch is refused too, and the address is free again once the first goes.
    cfg.shards = 1;
    assert!(Switch::bind(cfg.clone()).is_err());
    drop(first);
    cfg.shards = 2;
    assert_eq!(Switch::bind(cfg).unwrap().local_addr(), taken);
}

/// Sends a probe of `job` as `rank` from `from`.
fn probe(from: &UdpSocket, to: SocketAddr, job: u16, rank: u8) {
    let h = AggRepr {
        kind: MessageType::Probe,
        set: 0,
        gap: None,
        job,
        epoch: 0,
        rank,
        exponent: 0,
        slot: 0,
        count: 0,
        seq: 0,
    };
    let mut p = [0u8; HEADER_LEN];
    h.emit_into(&mut p).unwrap();
    from.send_to(&p, to).unwrap();
}

/// The job of a probe reply received on `at`, if one comes.
fn probe_reply(at: &UdpSocket) -> Option<u16> {
    let mut buf = [0u8; 2048];
    let (n, _) = at.recv_from(&mut buf).ok()?;
    let (h, _) = AggRepr::parse_bytes(&buf[..n]).ok()?;
    (h.kind == MessageType::ProbeReply).then_some(h.job)
}

#[test]
fn worker_address_ids_are_freed_when_their_jobs_are_removed() {
    let sw = start(SwitchConfig::new("127.0.0.1:0".parse().unwrap()));
    // Without datagrams a shard applies commands every 10 ms; a steady trickle of stray
    // datagrams keeps the cycles below fast.
    let waking = Arc::new(AtomicBool::new(true));
    let waker = {
        let waking = waking.clone();
        let to = sw.udp;
        std::thread::spawn(move || {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            while waking.load(Ordering::Relaxed) {
                let _ = s.send_to(b"wake", to);
                // (Pacing, not a wait: the trickle's rate is the point, one datagram every
                // 200 µs for as long as the cycles run.)
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    // 32 new addresses per job: 2100 jobs list more addresses than the 65535 ids.
    let mut fresh = 0u32;
    for cycle in 0..2100u16 {
        let workers: Vec<SocketAddr> = (0..32)
            .map(|_| {
                fresh += 1;
                SocketAddrV4::new(Ipv4Addr::from(0x0a00_0000 + fresh), 4000).into()
            })
            .collect();
        let added = sw.handle.add_job(job(cycle % 7, 0, 8, workers));
        assert!(added.is_ok(), "cycle {cycle}: {added:?}");
        sw.handle.remove_job(cycle % 7).unwrap();
    }
    waking.store(false, Ordering::Relaxed);
    waker.join().unwrap();

    // The shards forget removed addresses too: a worker of a removed job cannot speak for the
    // rank whose id its address had, now given to another address.
    let old = UdpSocket::bind("127.0.0.1:0").unwrap();
    let new = UdpSocket::bind("127.0.0.1:0").unwrap();
    for s in [&old, &new] {
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
    }
    sw.handle
        .add_job(job(1, 0, 8, vec![old.local_addr().unwrap()]))
        .unwrap();
    probe(&old, sw.udp, 1, 0);
    assert_eq!(probe_reply(&old), Some(1));
    sw.handle.remove_job(1).unwrap();
    sw.handle
        .add_job(job(2, 0, 8, vec![new.local_addr().unwrap()]))
        .unwrap();
    probe(&old, sw.udp, 2, 0);
    probe(&new, sw.udp, 2, 0);
    assert_eq!(probe_reply(&new), Some(2));
    assert_eq!(
        probe_reply(&new),
        None,
        "the removed worker's probe was answered"
    );
    assert_eq!(probe_reply(&old), None);
    // Listed again, the old address gets a new id, and answers reach it.
    sw.handle.remove_job(2).unwrap();
    let other: SocketAddr = "127.0.0.1:9".parse().unwrap();
    sw.handle
        .add_job(job(3, 0, 8, vec![other, old.local_addr().unwrap()]))
        .unwrap();
    probe(&old, sw.udp, 3, 1);
    assert_eq!(probe_reply(&old), Some(3));
    assert!(sw.handle.stats().unwrap().total.unknown_source >= 1);
}

/// Starts a control endpoint with `limits` on loopback for a running switch.
fn endpoint(sw: &Running, limits: ina_switch::ControlLimits) -> SocketAddr {
    let server =
        ControlServer::bind_with("127.0.0.1:0".parse().unwrap(), sw.handle.clone(), limits)
            .unwrap();
    let addr = server.local_addr().unwrap();
    let stop = sw.stop.clone();
    std::thread::spawn(move || server.run(stop));
    addr
}

/// Reads one answer line, or `None` if the endpoint closed the connection.
fn answer(r: &mut BufReader<TcpStream>) -> Option<String> {
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line),
    }
}

#[test]
fn beyond_loopback_the_control_endpoint_needs_a_token_and_checks_it() {
    let sw = start(SwitchConfig::new("127.0.0.1:0".parse().unwrap()));
    let refused = ControlServer::bind_with(
        "0.0.0.0:0".parse().unwrap(),
        sw.handle.clone(),
        ina_switch::ControlLimits::default(),
    );
    assert!(matches!(
        refused,
        Err(ina_switch::ControlBindError::TokenRequired { .. })
    ));
    assert!(ControlServer::bind("0.0.0.0:0".parse().unwrap(), sw.handle.clone()).is_err());
    let token = "a-token-of-twenty-chars";
    let addr = endpoint(
        &sw,
        ina_switch::ControlLimits {
            token: Some(token.into()),
            ..Default::default()
        },
    );
    // A request before the token: refused, connection closed.
    let s = TcpStream::connect(addr).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    writeln!(&s, "{{\"op\":\"jobs\"}}").unwrap();
    assert!(answer(&mut r).unwrap().contains("needs an access token"));
    assert_eq!(answer(&mut r), None);
    // A wrong token: refused, closed.
    assert!(ControlClient::connect_with_token(addr, Some("a-wrong-token-of-20-chars")).is_err());
    // The right one: served.
    let mut c = ControlClient::connect_with_token(addr, Some(token)).unwrap();
    assert!(c.call(&Request::Jobs).unwrap().ok);
    assert!(
        c.call(&Request::AddJob {
            job: job(1, 0, 64, vec!["127.0.0.1:9".parse().unwrap()])
        })
        .unwrap()
        .ok
    );
}

#[test]
fn control_connections_are_bounded_and_idle_ones_closed() {
    let sw = start(SwitchConfig::new("127.0.0.1:0".parse().unwrap()));
    let idle_limit = Duration::from_millis(600);
    let addr = endpoint(
        &sw,
        ina_switch::ControlLimits {
            token: None,
            max_connections: 3,
            idle: idle_limit,
            ..Default::default()
        },
    );
    // Three connections, each served once: the endpoint holds all three.
    let idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut readers: Vec<BufReader<TcpStream>> = idle
        .iter()
        .map(|s| {
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            BufReader::new(s.try_clone().unwrap())
        })
        .collect();
    let mut last_request = Vec::new();
    let ping = |mut s: &TcpStream, r: &mut BufReader<TcpStream>| {
        let at = Instant::now();
        writeln!(s, "{{\"op\":\"ping\"}}").unwrap();
        let a = answer(r).expect("an answer to a ping");
        assert!(a.contains("\"ok\":true"), "{a}");
        at
    };
    for (s, r) in idle.iter().zip(&mut readers) {
        last_request.push(ping(s, r));
    }
    // A fourth is told so and closed.
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let _ = writeln!(&s, "{{\"op\":\"ping\"}}");
    let refused = answer(&mut r).expect("an answer to the fourth connection");
    assert!(
        refused.contains("too many control connections"),
        "{refused}"
    );
    assert_eq!(answer(&mut r), None);
    // The three are still served.
    last_request[0] = ping(&idle[0], &mut readers[0]);
    // Idle past the limit: each of the three is told so and closed, not before the limit
    // after its last request (the reads wait for that, up to 30 s).
    for (i, r) in readers.iter_mut().enumerate() {
        let closed = answer(r).expect("no idle close within 30 s");
        let after = last_request[i].elapsed();
        assert!(closed.contains("idle too long"), "{closed}");
        assert!(
            after >= idle_limit,
            "connection {i} closed {after:?} after its last request, within the idle limit of {idle_limit:?}"
        );
        assert_eq!(answer(r), None);
    }
    // Their places free again: a new connection is served (once the endpoint has counted the
    // closed ones out).
    wait_until(
        "a place among the control connections",
        Duration::from_secs(20),
        || {
            let mut c = ControlClient::connect(addr).ok()?;
            c.call(&Request::Ping).ok().filter(|r| r.ok)
        },
    );
    drop(idle);
}
