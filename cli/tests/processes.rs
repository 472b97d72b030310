//! `ina switch` and `ina worker` as real OS processes over loopback: correct sums through one
//! or two shards and through a ring, a worker killed mid-run, a switch restarted mid-run,
//! garbage and foreign datagrams during a run, clean shutdown on SIGTERM/SIGINT, the config
//! file, bad input to the daemons, and a retransmission answered from the registers after
//! batched (GSO) sends.
//!
//! The results of the switch path are compared bit for bit with a model of PROTOCOL.md §4
//! written here (`common::expected_ina_sum`), besides the workers' own check.
//!
//! The `#[ignore]`d tests at the end state behaviour the daemons should have and do not have
//! yet; `cargo test -p ina --test processes -- --ignored` runs them.
//!
//! Every child is killed when its handle drops, on every path; every wait has a deadline.
#![allow(clippy::unwrap_used)]

// (Each test binary uses part of the shared harness.)
#[allow(dead_code)]
mod common;

use common::*;
use ina_switch::{JobSpec, Request, SwitchStats};
use ina_wire::agg::ProbeInfo;
use ina_wire::{AggRepr, MessageType, RejectReason, HEADER_LEN};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Packets of one float32 all-reduce of `elements` (PROTOCOL.md §5: B blocks plus a
/// lookahead of L = min(W, B) header-only packets) plus the one-packet int32 barrier the
/// worker runs before each iteration.
fn uses_per_iteration(elements: usize, elems_per_packet: usize, window: usize) -> u64 {
    let blocks = elements.div_ceil(elems_per_packet);
    // The tensor's packets (the exponent lookahead included, which shares the first window
    // with the descriptor), and one each for the barriers before and after the timed
    // all-reduce (an int32 all-reduce of one element); and each of the three streams'
    // descriptor.
    let descriptor = ina_proto::stream::DESCRIPTOR_PACKETS as usize;
    (blocks + blocks.min(window - descriptor) + 2 + 3 * descriptor) as u64
}

/// Asserts that every worker's every iteration holds exactly `expected` (bit for bit).
fn assert_fingerprints(outcomes: &[Outcome], expected: u64) {
    for o in outcomes {
        let fps = o.fingerprints();
        assert!(
            fps.iter().all(|&f| f == expected),
            "{}: fingerprints {fps:?}, the exact block floating point sum is {expected}",
            o.name
        );
    }
}

fn joined(p: &mut Proc) -> Line {
    p.expect("joined", after(START))
}

fn ina_sums_are_exact(shards: usize) {
    let _serial = serial();
    let run = Run::new(3, 100_000, 3);
    let mut sw = SwitchProc::start(&[&format!("--shards={shards}")]);
    assert_eq!(sw.ready.value["steered"], Value::Bool(shards > 1));
    assert_eq!(sw.ready.value["jobs"], serde_json::json!([]));
    let (mut workers, addrs) = run.ina_workers(sw.udp);
    let job = sw.add_job(JobSpec {
        slot_count: 128,
        ..job_spec(1, addrs.clone())
    });
    let epoch = job.epoch.expect("the switch chose an epoch");
    assert_eq!(job.workers, addrs);
    let listed = sw.call(&Request::Jobs).jobs.expect("jobs");
    assert_eq!(listed, vec![job.clone()]);

    for w in &mut workers {
        let j = joined(w);
        assert_eq!(j.value["epoch"], serde_json::json!(epoch), "{}", j.value);
        assert_eq!(j.value["workers"], 3);
        assert_eq!(j.value["elems_per_packet"], 256);
        assert_eq!(j.value["window"], 128);
    }
    let outcomes = collect_all(&mut workers, after(Duration::from_secs(60)));
    for o in &outcomes {
        o.assert_verified(run.total());
    }
    let expected = fingerprint(&expected_ina_sum(run.seed, 3, run.elements, 256));
    assert_fingerprints(&outcomes, expected);

    let stats = sw.stats();
    let t = &stats.total.pipeline;
    assert!(t.packets_in > 0 && t.results_multicast > 0, "{t:?}");
    let uses = run.total() as u64 * uses_per_iteration(run.elements, 256, 128);
    // Every use of a slot is completed and multicast exactly once, with one first arrival and
    // n - 1 later ones, however many shards share the work (datagrams a shard receives for
    // another shard's slots are handed over, not processed in the wrong registers).
    assert_eq!(t.results_multicast, uses, "{stats:#?}");
    assert_eq!(t.data_first, uses, "{stats:#?}");
    assert_eq!(t.data_added, 2 * uses, "{stats:#?}");
    assert!(t.probes_answered >= 3, "{t:?}");
    assert_eq!(
        (
            t.malformed,
            t.unknown_rank,
            t.wrong_port,
            t.stale_epoch,
            t.slot_out_of_range,
            t.bad_count,
            t.rejects_sent,
            t.output_too_small
        ),
        (0, 0, 0, 0, 0, 0, 0, 0),
        "{t:?}"
    );
    assert_eq!(stats.shards.len(), shards);
    for s in &stats.shards {
        // Slots 0..64 cover every shard: each one got some of them.
        assert!(s.pipeline.packets_in > 0, "shard {} idle: {s:?}", s.shard);
    }
    let sum: u64 = stats.shards.iter().map(|s| s.pipeline.packets_in).sum();
    assert_eq!(sum, t.packets_in);

    let stopped = sw.terminate();
    let last: SwitchStats = serde_json::from_value(stopped.value["stats"].clone()).unwrap();
    assert!(last.total.pipeline.results_multicast >= t.results_multicast);
    assert!(last.total.pipeline.packets_in >= t.packets_in);
}

#[test]
fn three_workers_through_one_shard_get_exact_sums() {
    ina_sums_are_exact(1);
}

#[test]
fn three_workers_through_two_shards_get_exact_sums() {
    ina_sums_are_exact(2);
}

#[test]
fn killing_a_worker_mid_run_times_the_others_out() {
    let _serial = serial();
    let give_up = Duration::from_millis(1500);
    let mut run = Run::new(3, 200_000, 1000);
    run.warmup = 0;
    run.give_up_ms = give_up.as_millis() as u64;
    let sw = SwitchProc::start(&[]);
    let (mut workers, addrs) = run.ina_workers(sw.udp);
    sw.add_job(job_spec(1, addrs));
    let first = workers[2].expect("iteration", after(Duration::from_secs(30)));
    assert_eq!(first.value["violations"], 0, "{}", first.value);
    let killed_at = Instant::now();
    workers[2].kill();

    let outcomes = collect_all(&mut workers[..2], killed_at + Duration::from_secs(20));
    let expected = fingerprint(&expected_ina_sum(run.seed, 3, run.elements, 256));
    for o in &outcomes {
        let End::Error(err) = &o.end else {
            panic!("{}: ended with {:?}; stderr:\n{}", o.name, o.end, o.stderr);
        };
        assert_eq!(o.error_kind(), Some("timeout"), "{}: {}", o.name, err.value);
        assert!(err.value["message"].as_str().is_some_and(|m| !m.is_empty()));
        let waited = err.at.saturating_duration_since(killed_at);
        eprintln!("{}: timeout reported {waited:?} after the kill", o.name);
        assert!(
            waited <= give_up + Duration::from_secs(3),
            "{}: timed out {waited:?} after the kill, give-up time {give_up:?}",
            o.name
        );
        assert!(
            o.violations().iter().all(|&v| v == 0),
            "{}: {:?}",
            o.name,
            o.violations()
        );
        assert_fingerprints(std::slice::from_ref(o), expected);
        assert_eq!(o.status.and_then(|s| s.code()), Some(2), "{}", o.name);
    }
    // The switch is unharmed.
    assert!(sw.stats().total.pipeline.results_multicast > 0);
}

#[test]
fn restarting_the_switch_mid_run_is_a_clear_error_never_a_wrong_sum() {
    let _serial = serial();
    let mut run = Run::new(3, 100_000, 1000);
    run.warmup = 0;
    run.give_up_ms = 3000;
    let mut first_switch = SwitchProc::start(&[]);
    let udp = first_switch.udp;
    let (mut workers, addrs) = run.ina_workers(udp);
    let old = first_switch.add_job(job_spec(1, addrs.clone()));
    let first = workers[0].expect("iteration", after(Duration::from_secs(30)));
    assert_eq!(first.value["violations"], 0, "{}", first.value);

    first_switch.proc.kill();
    let second = SwitchProc::start(&[&format!("--listen={udp}")]);
    assert_eq!(second.udp, udp);
    let new = second.add_job(job_spec(1, addrs));
    assert_eq!(new.workers, old.workers);

    let outcomes = collect_all(&mut workers, after(Duration::from_secs(20)));
    let expected = fingerprint(&expected_ina_sum(run.seed, 3, run.elements, 256));
    let mut restarted = 0;
    for o in &outcomes {
        assert!(
            o.violations().iter().all(|&v| v == 0),
            "{}: {:?}",
            o.name,
            o.violations()
        );
        assert_fingerprints(std::slice::from_ref(o), expected);
        assert_ne!(o.status.and_then(|s| s.code()), Some(3), "{}", o.name);
        match &o.end {
            End::Error(err) => {
                let kind = o.error_kind();
                assert!(
                    matches!(kind, Some("switch_restarted" | "timeout")),
                    "{}: {}",
                    o.name,
                    err.value
                );
                restarted += usize::from(kind == Some("switch_restarted"));
                assert_eq!(o.status.and_then(|s| s.code()), Some(2), "{}", o.name);
            }
            End::Done(done) => {
                assert_eq!(done.value["verified"], true, "{}: {}", o.name, done.value);
                assert_eq!(o.status.and_then(|s| s.code()), Some(0), "{}", o.name);
            }
            other => panic!("{}: ended with {other:?}; stderr:\n{}", o.name, o.stderr),
        }
    }
    let t = second.stats().total.pipeline;
    eprintln!(
        "after the restart: {:?}",
        outcomes
            .iter()
            .map(|o| (o.iterations.len(), o.error_kind()))
            .collect::<Vec<_>>()
    );
    if restarted > 0 {
        // A worker only learns of the restart from the new switch's Reject(StaleEpoch).
        assert!(t.stale_epoch > 0 && t.rejects_sent > 0, "{t:?}");
    }
    if outcomes.iter().all(|o| matches!(o.end, End::Error(_))) {
        // Nobody went on with the new epoch: the new switch completed no use, so none mixed
        // old and new contributions.
        assert_eq!(t.results_multicast, 0, "{t:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Garbage and foreign datagrams.
// ---------------------------------------------------------------------------------------------

/// xorshift64*: random bytes without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next() as u8;
        }
    }
}

/// A packet with the given header and a payload of large values (that would wreck any sum
/// they were added to).
fn packet(
    kind: MessageType,
    job: u16,
    epoch: u16,
    rank: u8,
    slot: u16,
    count: u16,
    seq: u32,
) -> Vec<u8> {
    let repr = AggRepr {
        kind,
        set: 0,
        gap: None,
        job,
        epoch,
        rank,
        exponent: 130,
        slot,
        count,
        seq,
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit_into(&mut buf).unwrap();
    for w in buf[HEADER_LEN..].chunks_exact_mut(4) {
        w.copy_from_slice(&0x1fff_ffffi32.to_be_bytes());
    }
    buf
}

/// What the spraying thread sent and what came back.
#[derive(Debug, Default)]
struct Sprayed {
    started: Option<Instant>,
    rounds: u64,
    from_unknown: u64,
    rejects: BTreeSet<u8>,
    probe_replies: Vec<ProbeInfo>,
    foreign_replies: Vec<String>,
}

/// Sprays the switch until `stop` (and for at least 20 rounds): from `unknown` sockets no job
/// lists, random bytes and crafted headers; from `member`, rank 0 of job 2, refusable packets
/// of job 2 and packets posing as job 1's rank 0.
fn spray(
    stop: &AtomicBool,
    switch: SocketAddr,
    unknown: &[UdpSocket],
    member: &UdpSocket,
    (epoch1, epoch2): (u16, u16),
) -> Sprayed {
    use MessageType::{Data, Probe, Result as ResultMsg};
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut out = Sprayed {
        started: Some(Instant::now()),
        ..Sprayed::default()
    };
    member.set_nonblocking(true).unwrap();
    let mut buf = vec![0u8; 65536];
    while out.rounds < 20 || !stop.load(Ordering::Relaxed) {
        let u = &unknown[out.rounds as usize % unknown.len()];
        let mut from_unknown: Vec<Vec<u8>> = Vec::new();
        // Random bytes of random lengths, and an empty datagram (malformed).
        for _ in 0..8 {
            let mut junk = vec![0u8; rng.below(1501)];
            rng.fill(&mut junk);
            from_unknown.push(junk);
        }
        from_unknown.push(Vec::new());
        // A truncated header, and a payload shorter than the count says (malformed).
        let valid = packet(Data, 1, epoch1, 0, 3, 256, 70);
        from_unknown.push(valid[..1 + rng.below(HEADER_LEN - 1)].to_vec());
        from_unknown.push(valid[..HEADER_LEN + 100].to_vec());
        // Version 2 (malformed).
        let mut v2 = packet(Probe, 1, epoch1, 0, 0, 0, 0);
        v2[0] = 0x24;
        from_unknown.push(v2);
        // A Result sent to the switch (unexpected type).
        from_unknown.push(packet(ResultMsg, 1, epoch1, 0, 3, 256, 70));
        // A foreign job (unknown job), a rank the job lacks (unknown rank).
        from_unknown.push(packet(Data, 777, epoch1, 0, 3, 256, 70));
        from_unknown.push(packet(Data, 1, epoch1, 9, 3, 256, 70));
        // Job 1's ranks from an address the job does not list, with a plausible future
        // sequence number, a stale epoch, an out-of-range slot, and a probe (wrong port).
        from_unknown.push(packet(Data, 1, epoch1, 0, 3, 256, 70 + 64 * 1000));
        from_unknown.push(packet(Data, 1, epoch1.wrapping_add(1), 1, 3, 256, 70));
        from_unknown.push(packet(Data, 1, epoch1, 2, 4000, 256, 70));
        from_unknown.push(packet(Probe, 1, 0, 0, 0, 0, 0));
        // Larger than any packet the switch accepts (truncated).
        let mut big = vec![0u8; 3000];
        rng.fill(&mut big);
        from_unknown.push(big);
        for d in &from_unknown {
            if u.send_to(d, switch).is_ok() {
                out.from_unknown += 1;
            }
        }
        // Job 2's own rank: a stale epoch, job 1's slot 5, a bad count (each refused with a
        // Reject), job 1's rank 0 (wrong port), a probe (answered).
        let from_member = [
            packet(Data, 2, epoch2.wrapping_add(1), 0, 64, 256, 1),
            packet(Data, 2, epoch2, 0, 5, 256, 1),
            packet(Data, 2, epoch2, 0, 64, 7, 1),
            packet(Data, 1, epoch1, 0, 3, 256, 70 + 64 * 1000),
            packet(Probe, 2, 0, 0, 0, 0, 0),
        ];
        for d in &from_member {
            let _ = member.send_to(d, switch);
        }
        while let Ok((n, from)) = member.recv_from(&mut buf) {
            match AggRepr::parse_bytes(&buf[..n]) {
                Ok((h, payload)) if from == switch && h.job == 2 => match h.kind {
                    MessageType::Reject => {
                        out.rejects.insert(h.exponent);
                    }
                    MessageType::ProbeReply => {
                        out.probe_replies.push(ProbeInfo::parse(payload).unwrap());
                    }
                    _ => out.foreign_replies.push(format!("{h:?}")),
                },
                other => out.foreign_replies.push(format!("{from}: {other:?}")),
            }
        }
        out.rounds += 1;
        // (Pacing, not a wait: a round every few milliseconds for as long as the run goes
        // on, so that the spray overlaps it without taking the switch's whole time.)
        std::thread::sleep(Duration::from_millis(3));
    }
    out
}

#[test]
fn garbage_and_foreign_datagrams_are_counted_and_change_no_sum() {
    let _serial = serial();
    let mut run = Run::new(3, 100_000, 12);
    run.give_up_ms = 10_000;
    let sw = SwitchProc::start(&[]);
    let (mut workers, addrs) = run.ina_workers(sw.udp);
    let unknown: Vec<UdpSocket> = (0..3)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let member = UdpSocket::bind("127.0.0.1:0").unwrap();
    let job1 = sw.add_job(job_spec(1, addrs));
    let job2 = sw.add_job(JobSpec {
        job: 2,
        epoch: None,
        slot_base: 64,
        slot_count: 8,
        elems_per_packet: 256,
        workers: vec![member.local_addr().unwrap()],
        group: None,
        uplink: None,
    });
    let epochs = (job1.epoch.unwrap(), job2.epoch.unwrap());
    let before = sw.stats().total;

    let stop = Arc::new(AtomicBool::new(false));
    let sprayer = {
        let stop = stop.clone();
        let switch = sw.udp;
        let unknown: Vec<UdpSocket> = unknown.iter().map(|s| s.try_clone().unwrap()).collect();
        std::thread::spawn(move || spray(&stop, switch, &unknown, &member, epochs))
    };
    let outcomes = collect_all(&mut workers, after(Duration::from_secs(60)));
    stop.store(true, Ordering::Relaxed);
    let sprayed = sprayer.join().expect("the spraying thread");
    // The switch has worked off its receive queue once it answers a probe sent after the
    // spray: its one shard takes the datagrams of its one socket in order. The probe comes
    // from the one member of a job of its own (slots 72..80), again every 200 ms in case a
    // full queue dropped it.
    let marker = UdpSocket::bind("127.0.0.1:0").unwrap();
    marker
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    sw.add_job(JobSpec {
        job: 3,
        epoch: None,
        slot_base: 72,
        slot_count: 8,
        elems_per_packet: 256,
        workers: vec![marker.local_addr().unwrap()],
        group: None,
        uplink: None,
    });
    let probe = packet(MessageType::Probe, 3, 0, 0, 0, 0, 0);
    wait_until(
        "the switch to answer a probe sent after the spray",
        after(Duration::from_secs(30)),
        || {
            marker.send_to(&probe, sw.udp).unwrap();
            let mut buf = [0u8; 2048];
            let (n, _) = marker.recv_from(&mut buf).ok()?;
            let (h, _) = AggRepr::parse_bytes(&buf[..n]).ok()?;
            (h.kind == MessageType::ProbeReply && h.job == 3).then_some(())
        },
    );

    for o in &outcomes {
        o.assert_verified(run.total());
    }
    let expected = fingerprint(&expected_ina_sum(run.seed, 3, run.elements, 256));
    assert_fingerprints(&outcomes, expected);
    // The spray overlapped the run: every worker ran iterations while it went on.
    let started = sprayed.started.unwrap();
    for o in &outcomes {
        let during = o.iterations.iter().filter(|l| l.at > started).count();
        assert!(
            during >= 3,
            "{}: {during} iterations during the spray",
            o.name
        );
    }
    eprintln!(
        "spray: {} rounds, {} datagrams from unknown sources, last iteration {:?} after it started",
        sprayed.rounds,
        sprayed.from_unknown,
        outcomes
            .iter()
            .map(|o| o.iterations.last().unwrap().at - started)
            .max()
    );

    let after_stats = sw.stats().total;
    let (a, b) = (&after_stats.pipeline, &before.pipeline);
    let delta = |x: u64, y: u64| x - y;
    let counters = [
        ("malformed", delta(a.malformed, b.malformed)),
        (
            "unexpected_type",
            delta(a.unexpected_type, b.unexpected_type),
        ),
        ("unknown_job", delta(a.unknown_job, b.unknown_job)),
        ("unknown_rank", delta(a.unknown_rank, b.unknown_rank)),
        ("wrong_port", delta(a.wrong_port, b.wrong_port)),
        ("stale_epoch", delta(a.stale_epoch, b.stale_epoch)),
        (
            "slot_out_of_range",
            delta(a.slot_out_of_range, b.slot_out_of_range),
        ),
        ("bad_count", delta(a.bad_count, b.bad_count)),
        (
            "probes_answered",
            delta(a.probes_answered, b.probes_answered),
        ),
        (
            "unknown_source",
            delta(after_stats.unknown_source, before.unknown_source),
        ),
        ("truncated", delta(after_stats.truncated, before.truncated)),
    ];
    for (name, d) in counters {
        assert!(
            d > 0,
            "{name} did not count the spray ({} rounds): {counters:?}",
            sprayed.rounds
        );
    }
    let refused = delta(a.stale_epoch, b.stale_epoch)
        + delta(a.slot_out_of_range, b.slot_out_of_range)
        + delta(a.bad_count, b.bad_count);
    assert_eq!(delta(a.rejects_sent, b.rejects_sent), refused, "{a:?}");
    let unknown_source = delta(after_stats.unknown_source, before.unknown_source);
    assert!(
        unknown_source <= sprayed.from_unknown,
        "{unknown_source} unknown-source datagrams counted, {} sent",
        sprayed.from_unknown
    );
    assert_eq!(a.output_too_small, 0);

    // The member of job 2 was told why, for each refusal, and got its own job's configuration.
    let want: BTreeSet<u8> = [
        RejectReason::StaleEpoch as u8,
        RejectReason::SlotOutOfRange as u8,
        RejectReason::BadCount as u8,
    ]
    .into();
    assert_eq!(sprayed.rejects, want, "{sprayed:?}");
    assert!(!sprayed.probe_replies.is_empty(), "{sprayed:?}");
    for info in &sprayed.probe_replies {
        assert_eq!(
            (
                info.workers,
                info.elems_per_packet,
                info.slot_base,
                info.slot_count
            ),
            (1, 256, 64, 8)
        );
    }
    assert!(sprayed.foreign_replies.is_empty(), "{sprayed:?}");
    // Nothing is ever sent to a source no job lists.
    let mut buf = [0u8; 2048];
    for u in &unknown {
        u.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let got = u.recv_from(&mut buf);
        assert!(got.is_err(), "an unknown source got an answer: {got:?}");
    }
}

/// The slots of the Result packets `port` receives, sorted, until it has `n` or `deadline`.
fn result_slots(port: &mut ina_io::UdpPort, n: usize, deadline: Instant) -> Vec<u16> {
    use ina_io::Port;
    let mut batch = ina_io::RecvBatch::new(16, 2048);
    let mut slots = Vec::new();
    while slots.len() < n && Instant::now() < deadline {
        let wait = deadline.saturating_duration_since(Instant::now());
        port.recv_batch(&mut batch, Some(wait.min(Duration::from_millis(100))))
            .unwrap();
        for d in batch.iter() {
            if let Ok((h, _)) = AggRepr::parse_bytes(d.data) {
                if h.kind == MessageType::Result {
                    slots.push(h.slot);
                }
            }
        }
    }
    slots.sort_unstable();
    slots
}

/// Two workers each send their packets for slots 0 and 1 in one batch (a GSO buffer where
/// the kernel has UDP GSO, as the worker's port sends them); then rank 0 retransmits slot 1
/// alone, as after losing its result. PROTOCOL.md §6: a retransmission of a complete use is
/// answered with the stored result.
fn a_retransmission_after_batched_sends_gets_the_stored_result(shards: usize) {
    use ina_io::{Port, SendBatch, UdpConfig, UdpPort};
    let _serial = serial();
    let sw = SwitchProc::start(&[&format!("--shards={shards}")]);
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut ports: Vec<UdpPort> = (0..2)
        .map(|_| UdpPort::bind_with(any, &UdpConfig::default()).unwrap())
        .collect();
    let job = sw.add_job(JobSpec {
        job: 1,
        epoch: None,
        slot_base: 0,
        slot_count: 64,
        elems_per_packet: 16,
        workers: ports.iter().map(|p| p.local_addr()).collect(),
        group: None,
        uplink: None,
    });
    let epoch = job.epoch.unwrap();
    // Header-only Data packets: the first use of slots 0 and 1.
    let data = |rank: u8, slot: u16| {
        packet(
            MessageType::Data,
            1,
            epoch,
            rank,
            slot,
            0,
            64 + u32::from(slot),
        )
    };
    for (rank, port) in ports.iter_mut().enumerate() {
        let mut batch = SendBatch::with_capacity(2, 64);
        batch.push(sw.udp, &data(rank as u8, 0));
        batch.push(sw.udp, &data(rank as u8, 1));
        assert_eq!(port.send_batch(&batch).unwrap(), 2);
    }
    for port in &mut ports {
        assert_eq!(result_slots(port, 2, after(Duration::from_secs(5))), [0, 1]);
    }
    let mut batch = SendBatch::with_capacity(1, 64);
    batch.push(sw.udp, &data(0, 1));
    ports[0].send_batch(&batch).unwrap();
    let stats_if_silent = |got: &[u16]| {
        if got.is_empty() {
            format!("{:#?}", sw.stats())
        } else {
            String::new()
        }
    };
    let got = result_slots(&mut ports[0], 1, after(Duration::from_secs(3)));
    assert_eq!(
        got,
        [1],
        "no answer to the retransmission; {}",
        stats_if_silent(&got)
    );
    let t = sw.stats().total.pipeline;
    assert_eq!((t.results_multicast, t.results_unicast), (2, 1), "{t:?}");
}

#[test]
fn a_retransmission_after_batched_sends_gets_the_stored_result_from_one_shard() {
    a_retransmission_after_batched_sends_gets_the_stored_result(1);
}

#[test]
fn a_retransmission_after_batched_sends_gets_the_stored_result_from_two_shards() {
    a_retransmission_after_batched_sends_gets_the_stored_result(2);
}

// ---------------------------------------------------------------------------------------------
// Shutdown, ring, config file.
// ---------------------------------------------------------------------------------------------

#[test]
fn sigterm_and_sigint_stop_the_switch_cleanly_with_its_statistics() {
    let _serial = serial();
    let me = UdpSocket::bind("127.0.0.1:0").unwrap();
    me.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let job = format!(
        "id=4;slots=8..16;elems=16;workers={}",
        me.local_addr().unwrap()
    );
    let mut sw = SwitchProc::start(&["--job", &job]);
    let jobs: Vec<JobSpec> = serde_json::from_value(sw.ready.value["jobs"].clone()).unwrap();
    assert_eq!(jobs.len(), 1);
    let epoch = jobs[0].epoch.expect("an epoch");
    assert_eq!(
        (
            jobs[0].job,
            jobs[0].slot_base,
            jobs[0].slot_count,
            jobs[0].elems_per_packet
        ),
        (4, 8, 8, 16)
    );

    // A one-worker job: the probe is answered, and a Data packet is its own sum.
    let mut buf = [0u8; 2048];
    me.send_to(&packet(MessageType::Probe, 4, 0, 0, 0, 0, 0), sw.udp)
        .unwrap();
    let (n, _) = me.recv_from(&mut buf).unwrap();
    let (h, payload) = AggRepr::parse_bytes(&buf[..n]).unwrap();
    assert_eq!((h.kind, h.epoch), (MessageType::ProbeReply, epoch));
    let info = ProbeInfo::parse(payload).unwrap();
    assert_eq!(
        (
            info.workers,
            info.elems_per_packet,
            info.slot_base,
            info.slot_count
        ),
        (1, 16, 8, 8)
    );
    let data = packet(MessageType::Data, 4, epoch, 0, 9, 16, 1);
    me.send_to(&data, sw.udp).unwrap();
    let (n, _) = me.recv_from(&mut buf).unwrap();
    let (h, payload) = AggRepr::parse_bytes(&buf[..n]).unwrap();
    assert_eq!(
        (h.kind, h.slot, h.seq, h.count, h.exponent),
        (MessageType::Result, 9, 1, 16, 130)
    );
    assert_eq!(payload, &data[HEADER_LEN..]);

    let stopped = sw.terminate();
    let stats: SwitchStats = serde_json::from_value(stopped.value["stats"].clone())
        .unwrap_or_else(|e| panic!("stopped stats do not parse: {e}: {}", stopped.value));
    let t = &stats.total.pipeline;
    assert_eq!(
        (t.packets_in, t.probes_answered, t.results_multicast),
        (2, 1, 1),
        "{t:?}"
    );
    assert!(stopped.value["peak_rss_kib"]
        .as_u64()
        .is_some_and(|k| k > 0));
    assert!(!sw.proc.stderr_text().contains("panicked"));

    let mut sw = SwitchProc::start(&["--shards=2"]);
    sw.proc.signal(libc::SIGINT);
    let stopped = sw.proc.expect("stopped", after(Duration::from_secs(10)));
    let stats: SwitchStats = serde_json::from_value(stopped.value["stats"].clone()).unwrap();
    assert_eq!(stats.shards.len(), 2);
    assert!(sw.proc.wait(after(Duration::from_secs(10))).success());
}

#[test]
fn a_ring_of_three_worker_processes_gets_correct_sums() {
    let _serial = serial();
    let run = Run::new(3, 100_000, 3);
    let mut workers: Vec<Proc> = (0..3).map(|r| run.ring_worker(r)).collect();
    let peers: Vec<SocketAddr> = workers
        .iter_mut()
        .map(|w| w.expect("bound", after(START)).addr("ring"))
        .collect();
    let line = serde_json::to_string(&peers).unwrap();
    for w in &mut workers {
        w.send_line(&line);
    }
    let outcomes = collect_all(&mut workers, after(Duration::from_secs(60)));
    for o in &outcomes {
        o.assert_verified(run.total());
    }
    // Every rank holds the same bits.
    let fps = outcomes[0].fingerprints();
    for o in &outcomes[1..] {
        assert_eq!(o.fingerprints(), fps, "{}", o.name);
    }
}

/// Deletes a file when dropped.
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_config_file_serves_workers_at_their_preset_addresses() {
    let _serial = serial();
    let addrs = free_udp_addrs(4);
    let (listen, worker_addrs) = (addrs[0], addrs[1..].to_vec());
    let quoted: Vec<String> = worker_addrs.iter().map(|a| format!("\"{a}\"")).collect();
    let toml = format!(
        "listen = \"{listen}\"\ncontrol = \"127.0.0.1:0\"\nshards = 2\n\n\
         [[job]]\njob = 5\nslot_base = 128\nslot_count = 128\nelems_per_packet = 128\n\
         workers = [{}]\n",
        quoted.join(", ")
    );
    let file = TempFile(std::env::temp_dir().join(format!(
        "ina-processes-{}-{}.toml",
        std::process::id(),
        listen.port()
    )));
    std::fs::write(&file.0, toml).unwrap();

    let sw = SwitchProc::start(&[&format!("--config={}", file.0.display())]);
    assert_eq!(sw.udp, listen);
    assert_eq!(sw.ready.value["steered"], true);
    let jobs: Vec<JobSpec> = serde_json::from_value(sw.ready.value["jobs"].clone()).unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        (
            jobs[0].job,
            jobs[0].slot_base,
            jobs[0].slot_count,
            jobs[0].elems_per_packet
        ),
        (5, 128, 128, 128)
    );
    assert_eq!(jobs[0].workers, worker_addrs);

    let mut run = Run::new(3, 60_000, 2);
    run.job = 5;
    let mut workers: Vec<Proc> = worker_addrs
        .iter()
        .enumerate()
        .map(|(r, a)| run.ina_worker(sw.udp, r, *a))
        .collect();
    for (w, a) in workers.iter_mut().zip(&worker_addrs) {
        assert_eq!(w.expect("bound", after(START)).addr("udp"), *a);
        let j = joined(w);
        assert_eq!(j.value["epoch"], serde_json::json!(jobs[0].epoch.unwrap()));
        assert_eq!(
            (&j.value["elems_per_packet"], &j.value["window"]),
            (&128.into(), &128.into())
        );
    }
    let outcomes = collect_all(&mut workers, after(Duration::from_secs(60)));
    for o in &outcomes {
        o.assert_verified(run.total());
    }
    let expected = fingerprint(&expected_ina_sum(run.seed, 3, run.elements, 128));
    assert_fingerprints(&outcomes, expected);
    // Two shards: a use may complete in both (see `ina_sums_are_exact`).
    let stats = sw.stats();
    let uses = run.total() as u64 * uses_per_iteration(run.elements, 128, 128);
    assert!(stats.total.pipeline.results_multicast >= uses, "{stats:#?}");
    assert!(
        stats.shards.iter().all(|s| s.pipeline.packets_in > 0),
        "{stats:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Bad input.
// ---------------------------------------------------------------------------------------------

/// Runs `ina ARGS...` expecting it to refuse: a non-zero exit that is not a panic, with a
/// message on stderr containing `needle`.
fn refuses(args: &[&str], needle: &str) {
    let mut p = Proc::spawn(&format!("ina {}", args.join(" ")), args);
    let status = p.wait(after(Duration::from_secs(20)));
    let stderr = p.stderr_text();
    assert!(!status.success(), "{}: {status}", p.name);
    assert_ne!(status.code(), Some(101), "{}: panicked: {stderr}", p.name);
    assert!(!stderr.contains("panicked"), "{}: {stderr}", p.name);
    assert!(
        stderr.contains(needle),
        "{}: stderr lacks `{needle}`:\n{stderr}",
        p.name
    );
}

#[test]
fn bad_flags_and_config_files_are_clear_errors() {
    let dir = std::env::temp_dir();
    let bad_toml = TempFile(dir.join(format!("ina-processes-bad-{}.toml", std::process::id())));
    std::fs::write(&bad_toml.0, "listen = \"127.0.0.1:0\"\nshardz = 2\n").unwrap();
    let missing = dir.join(format!("ina-processes-missing-{}.toml", std::process::id()));
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["switch".into(), "--job".into(), "id=1;slots=5..2".into()],
            "empty",
        ),
        (
            vec!["switch".into(), "--job".into(), "id=1;slots=0..4".into()],
            "missing workers",
        ),
        (
            vec![
                "switch".into(),
                "--job".into(),
                "id=1;slots=0..4;workers=nowhere".into(),
            ],
            "workers",
        ),
        (
            vec![
                "switch".into(),
                "--listen=127.0.0.1:0".into(),
                "--job=id=1;slots=0..8;workers=127.0.0.1:9".into(),
                "--job=id=2;slots=4..12;workers=127.0.0.1:9".into(),
            ],
            "overlap",
        ),
        (
            vec![
                "switch".into(),
                "--listen=127.0.0.1:0".into(),
                "--loss=1.5".into(),
            ],
            "--loss",
        ),
        (
            vec![
                "switch".into(),
                "--listen=127.0.0.1:0".into(),
                "--shards=0".into(),
            ],
            "shards",
        ),
        (
            vec![
                "switch".into(),
                format!("--config={}", bad_toml.0.display()),
            ],
            "shardz",
        ),
        (
            vec!["switch".into(), format!("--config={}", missing.display())],
            "reading",
        ),
        (
            vec![
                "worker".into(),
                "--switch=127.0.0.1:9".into(),
                "--rank=3".into(),
                "--workers=3".into(),
            ],
            "--rank 3",
        ),
    ];
    for (args, needle) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refuses(&args, needle);
    }
}

#[test]
fn a_worker_whose_job_is_not_installed_reports_switch_unreachable() {
    let _serial = serial();
    let sw = SwitchProc::start(&[]);
    let mut w = Proc::spawn(
        "worker",
        &[
            "worker".to_string(),
            format!("--switch={}", sw.udp),
            "--rank=0".into(),
            "--workers=2".into(),
            "--elements=1000".into(),
            "--probe-timeout-ms=500".into(),
        ],
    );
    let o = Outcome::collect(&mut w, after(Duration::from_secs(20)));
    assert_eq!(o.error_kind(), Some("switch_unreachable"), "{o:?}");
    assert_eq!(o.status.and_then(|s| s.code()), Some(2));
    assert!(sw.stats().total.pipeline.unknown_job > 0);
}

/// Sends raw lines on one control connection and returns the answers.
fn control_lines(addr: SocketAddr, lines: &[&[u8]]) -> Vec<Value> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    lines
        .iter()
        .map(|l| {
            writer.write_all(l).unwrap();
            writer.write_all(b"\n").unwrap();
            let mut answer = String::new();
            reader.read_line(&mut answer).unwrap();
            serde_json::from_str(&answer).unwrap_or_else(|e| {
                panic!(
                    "answer to {:?} is not JSON ({e}): {answer:?}",
                    String::from_utf8_lossy(l)
                )
            })
        })
        .collect()
}

#[test]
fn bad_control_requests_are_refused_and_the_switch_keeps_serving() {
    let _serial = serial();
    let mut sw = SwitchProc::start(&[]);
    let w = |n: u16| format!("\"127.0.0.1:{}\"", 7000 + n);
    let too_many: Vec<String> = (0..33).map(w).collect();
    let job = |id: u16, base: u16, count: u16, workers: &str| {
        format!(
            r#"{{"op":"add_job","job":{{"job":{id},"slot_base":{base},"slot_count":{count},"elems_per_packet":256,"workers":[{workers}]}}}}"#
        )
    };
    let good = job(1, 0, 64, &w(1));
    let bad: Vec<String> = vec![
        "this is not json".into(),
        "".into(),
        r#"{"op":"launch"}"#.into(),
        r#"{"op":"add_job","job":{"job":1}}"#.into(),
        r#"{"op":"remove_job","job":"one"}"#.into(),
        r#"[1,2,3]"#.into(),
        job(1, 0, 0, &w(1)),
        job(1, 4090, 64, &w(1)),
        job(1, 0, 64, ""),
        job(1, 0, 64, &too_many.join(",")),
        r#"{"op":"remove_job","job":99}"#.into(),
    ];
    let mut lines: Vec<&[u8]> = bad.iter().map(|s| s.as_bytes()).collect();
    lines.push(b"\xff\xfe{\"op\":\x00}");
    lines.push(good.as_bytes());
    let clash_id = job(1, 100, 8, &w(2));
    let clash_slots = job(2, 32, 64, &w(2));
    lines.push(clash_id.as_bytes());
    lines.push(clash_slots.as_bytes());
    lines.push(br#"{"op":"ping"}"#);
    let answers = control_lines(sw.control, &lines);
    let n_bad = bad.len() + 1;
    for (i, a) in answers[..n_bad].iter().enumerate() {
        assert_eq!(
            a["ok"],
            false,
            "{:?} -> {a}",
            String::from_utf8_lossy(lines[i])
        );
        assert!(
            a["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{:?} -> {a}",
            String::from_utf8_lossy(lines[i])
        );
    }
    assert_eq!(answers[n_bad]["ok"], true, "{}", answers[n_bad]);
    assert_eq!(answers[n_bad + 1]["ok"], false, "{}", answers[n_bad + 1]);
    assert_eq!(answers[n_bad + 2]["ok"], false, "{}", answers[n_bad + 2]);
    assert_eq!(answers[n_bad + 3]["ok"], true, "{}", answers[n_bad + 3]);

    // A fresh connection sees exactly the one valid job, and statistics.
    let jobs = sw.call(&Request::Jobs).jobs.expect("jobs");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!((jobs[0].job, jobs[0].slot_count), (1, 64));
    sw.stats();
    let stopped = sw.terminate();
    assert!(stopped.value["stats"].is_object());
    assert!(!sw.proc.stderr_text().contains("panicked"));
}

// ---------------------------------------------------------------------------------------------
// Known defects: these state the behaviour the daemons should have and fail today. Run them
// with `cargo test -p ina --test processes -- --ignored`.
// ---------------------------------------------------------------------------------------------

#[test]
fn a_second_run_on_an_installed_job_never_gets_the_first_runs_sums() {
    let _serial = serial();
    let addrs = free_udp_addrs(3);
    let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    let job = format!("id=1;slots=0..64;elems=256;workers={}", list.join(","));
    let sw = SwitchProc::start(&["--job", &job]);
    for seed in [1, 2] {
        let mut run = Run::new(3, 256, 1);
        run.warmup = 0;
        run.seed = seed;
        run.give_up_ms = 2000;
        let mut workers: Vec<Proc> = addrs
            .iter()
            .enumerate()
            .map(|(r, a)| run.ina_worker(sw.udp, r, *a))
            .collect();
        let outcomes = collect_all(&mut workers, after(Duration::from_secs(30)));
        let expected = fingerprint(&expected_ina_sum(seed, 3, run.elements, 256));
        for o in &outcomes {
            // The second run's workers are new: the switch reinstalls the job for them, and
            // they finish with their own sums.
            assert!(matches!(o.end, End::Done(_)), "seed {seed}: {o:?}");
            assert_ne!(
                o.status.and_then(|s| s.code()),
                Some(3),
                "seed {seed}: {o:?}"
            );
            assert!(o.violations().iter().all(|&v| v == 0), "seed {seed}: {o:?}");
            if let End::Done(_) = o.end {
                assert_fingerprints(std::slice::from_ref(o), expected);
            }
        }
    }
}

#[test]
fn an_endless_control_request_line_does_not_grow_the_switch() {
    let _serial = serial();
    let sw = SwitchProc::start(&[]);
    let before = sw.proc.rss_kib();
    let mut stream = TcpStream::connect_timeout(&sw.control, Duration::from_secs(5)).unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let chunk = vec![b'x'; 1 << 20];
    // 64 MiB without a newline; the switch may hang up once the line is too long.
    for _ in 0..64 {
        if stream.write_all(&chunk).is_err() {
            break;
        }
    }
    let grown = sw.proc.rss_kib().saturating_sub(before);
    assert!(
        grown < 16 * 1024,
        "the switch grew by {grown} KiB for one request line (the limit is 1 MiB)"
    );
    sw.stats();
}

#[test]
fn a_second_switch_on_a_taken_address_refuses_to_start() {
    let _serial = serial();
    let first = SwitchProc::start(&["--shards=2"]);
    let mut second = Proc::spawn(
        "second switch",
        &[
            "switch".to_string(),
            format!("--listen={}", first.udp),
            "--shards=2".into(),
        ],
    );
    if let Next::Line(l) = second.next(after(Duration::from_secs(10))) {
        assert_ne!(
            l.event(),
            "ready",
            "a second switch serves {} alongside the first",
            first.udp
        );
    }
    let status = second.wait(after(Duration::from_secs(10)));
    assert!(!status.success());
}

/// A rack switch whose uplink names another epoch than the upper switch's job: the upper
/// switch refuses its partial sums, the rack switch counts the refusals and warns within a
/// second, naming what to check, and the worker's error points there.
#[test]
fn a_rack_switch_refused_by_its_upper_switch_says_so() {
    let _guard = serial();
    let addrs = free_udp_addrs(2);
    let (worker, rack) = (addrs[0], addrs[1]);
    let mut upper = SwitchProc::start(&[
        "--job",
        &format!("id=1;epoch=77;slots=0..64;elems=256;workers={rack}"),
    ]);
    let mut rack_switch = SwitchProc::start(&[
        &format!("--listen={rack}"),
        "--job",
        &format!(
            "id=1;slots=0..64;elems=256;workers={worker};uplink={};uplink_rank=0;uplink_epoch=76",
            upper.udp
        ),
    ]);
    let mut w = Proc::spawn(
        "worker",
        &[
            "worker",
            "--switch",
            &rack.to_string(),
            "--bind",
            &worker.to_string(),
            "--rank",
            "0",
            "--switch-rank",
            "0",
            "--workers",
            "1",
            "--elements",
            "65536",
            "--iterations",
            "1",
            "--give-up-ms",
            "1000",
        ],
    );
    let error = w.expect("error", after(Duration::from_secs(30)));
    let message = error.value["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("upper switch refuses"), "{message}");
    // The rack switch checks its counters once a second and warns when the refusals grow.
    wait_until(
        "the rack switch's warning about the refusals",
        after(Duration::from_secs(30)),
        || {
            rack_switch
                .proc
                .stderr_text()
                .contains("the upper switch refuses this switch's partial sums")
                .then_some(())
        },
    );
    let stats = rack_switch.stats();
    assert!(stats.total.pipeline.upstream_rejects > 0, "{stats:?}");
    assert_eq!(stats.total.pipeline.totals_received, 0);
    rack_switch.terminate();
    let log = rack_switch.proc.stderr_tail();
    assert!(
        log.contains("the upper switch refuses this switch's partial sums"),
        "{log}"
    );
    let upper_stats = upper.stats();
    assert!(
        upper_stats.total.pipeline.stale_epoch > 0,
        "{upper_stats:?}"
    );
    upper.terminate();
}
