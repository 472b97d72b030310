//! Slow and dying workers, a restarting switch, two jobs side by side, and hostile traffic.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use ina_proto::pipeline::PortId;
use ina_proto::stream::StreamError;
use ina_sim::rng::Rng;
use ina_sim::{run, Data, Injection, LinkConfig, Scenario, SimJob, WorkerSpec};
use ina_wire::{AggRepr, MessageType};
use std::time::Duration;

fn inputs(rng: &mut Rng, workers: usize, len: usize) -> Vec<Vec<Data>> {
    (0..workers)
        .map(|_| vec![Data::F32(float_tensor(rng, len))])
        .collect()
}

fn job(job: u16, slot_base: u16, inputs: &[Vec<Data>]) -> SimJob {
    SimJob {
        job,
        epoch: 1,
        slot_base,
        window: 8,
        elems_per_packet: 64,
        workers: inputs.iter().cloned().map(WorkerSpec::new).collect(),
    }
}

fn lossy() -> LinkConfig {
    LinkConfig {
        loss: 0.05,
        duplicate: 0.02,
        reorder: 0.1,
        ..LinkConfig::default()
    }
}

#[test]
fn a_slow_worker_delays_but_does_not_break_the_sum() {
    for seed in seeds(15) {
        let mut rng = Rng::new(seed);
        let ins = inputs(&mut rng, 4, 5_000);
        let mut j = job(1, 0, &ins);
        j.workers[2].start_at = Duration::from_millis(30);
        j.workers[2].link = Some(LinkConfig {
            latency: Duration::from_micros(300),
            bandwidth_bps: Some(1_000_000_000),
            loss: 0.05,
            ..LinkConfig::default()
        });
        let mut s = Scenario::new(seed, vec![j]);
        s.link = lossy();
        let report = run(&s);
        assert_correct(&report, &[ins], &[64], seed);
        // Nobody can finish before the slow worker has started.
        for w in &report.jobs[0].workers {
            assert!(
                w.ended_at.unwrap() > Duration::from_millis(30),
                "seed {seed}"
            );
        }
    }
}

#[test]
fn a_dying_worker_makes_the_others_fail_within_their_give_up_time() {
    for seed in seeds(15) {
        let mut rng = Rng::new(seed);
        let ins = inputs(&mut rng, 4, 50_000);
        let mut j = job(1, 0, &ins);
        let death = Duration::from_millis(2);
        j.workers[1].dies_at = Some(death);
        let mut s = Scenario::new(seed, vec![j]);
        s.link = lossy();
        s.give_up = Duration::from_millis(100);
        let report = run(&s);
        for (r, w) in report.jobs[0].workers.iter().enumerate() {
            if r == 1 {
                assert!(
                    w.outcome.is_none(),
                    "seed {seed}: the dead worker has no outcome"
                );
                continue;
            }
            match &w.outcome {
                Some(Err(StreamError::GaveUp { waited, .. })) => {
                    assert!(*waited >= s.give_up || *waited > Duration::ZERO);
                }
                other => panic!("seed {seed}: rank {r} ended with {other:?}"),
            }
            // Give-up time plus one capped retransmission interval past the death.
            let ended = w.ended_at.unwrap();
            assert!(
                ended <= death + s.give_up + s.rto.max + Duration::from_millis(1),
                "seed {seed}: rank {r} took until {ended:?}"
            );
        }
    }
}

#[test]
fn a_switch_restart_is_an_error_never_a_wrong_sum() {
    for seed in seeds(15) {
        let mut rng = Rng::new(seed);
        let ins = inputs(&mut rng, 3, 40_000);
        let mut s = Scenario::new(seed, vec![job(1, 0, &ins)]);
        s.link = lossy();
        s.switch_restart_at = Some(Duration::from_micros(500));
        let report = run(&s);
        for w in &report.jobs[0].workers {
            assert!(
                matches!(
                    w.outcome,
                    Some(Err(StreamError::SwitchRestarted { ours: 1, switch: 2 }))
                ),
                "seed {seed}: {:?}",
                w.outcome
            );
        }
        assert!(report.switch.stale_epoch > 0);
    }
}

#[test]
fn a_worker_with_the_wrong_epoch_is_told_so() {
    let mut rng = Rng::new(1);
    let ins = inputs(&mut rng, 2, 1_000);
    let mut j = job(1, 0, &ins);
    j.workers[0].epoch = Some(7);
    let mut s = Scenario::new(1, vec![j]);
    s.give_up = Duration::from_millis(50);
    let report = run(&s);
    assert!(matches!(
        report.jobs[0].workers[0].outcome,
        Some(Err(StreamError::SwitchRestarted { ours: 7, switch: 1 }))
    ));
    // Its partner never gets a result and gives up.
    assert!(matches!(
        report.jobs[0].workers[1].outcome,
        Some(Err(StreamError::GaveUp { .. }))
    ));
}

#[test]
fn two_jobs_share_the_switch_without_touching_each_other() {
    for seed in seeds(15) {
        let mut rng = Rng::new(seed);
        let a = inputs(&mut rng, 3, 7_000);
        let b = inputs(&mut rng, 5, 3_001);
        let mut both = Scenario::new(seed, vec![job(10, 0, &a), job(11, 8, &b)]);
        both.link = lossy();
        let report = run(&both);
        assert_correct(&report, &[a.clone(), b.clone()], &[64, 64], seed);
        // Each job alone, on the same slots, gives bit-identical results.
        let mut alone_a = Scenario::new(seed, vec![job(10, 0, &a)]);
        alone_a.link = lossy();
        let mut alone_b = Scenario::new(seed, vec![job(11, 8, &b)]);
        alone_b.link = lossy();
        let ra = run(&alone_a);
        let rb = run(&alone_b);
        assert!(bit_identical(
            &report.jobs[0].workers[0].tensors,
            &ra.jobs[0].workers[0].tensors
        ));
        assert!(bit_identical(
            &report.jobs[1].workers[0].tensors,
            &rb.jobs[0].workers[0].tensors
        ));
        assert_eq!(report.switch.slot_out_of_range, 0);
        assert_eq!(report.switch.wrong_port, 0);
    }
}

fn data_packet(job: u16, epoch: u16, rank: u8, slot: u16, count: u16, seq: u32) -> Vec<u8> {
    let repr = AggRepr {
        kind: MessageType::Data,
        set: 0,
        gap: None,
        job,
        epoch,
        rank,
        exponent: 200,
        slot,
        count,
        seq,
    };
    let mut buf = vec![0x5a; repr.buffer_len()];
    repr.emit_into(&mut buf).unwrap();
    buf
}

#[test]
fn hostile_and_malformed_packets_are_counted_and_change_no_sum() {
    for seed in seeds(10) {
        let mut rng = Rng::new(seed);
        let ins = inputs(&mut rng, 3, 20_000);
        let j = job(5, 16, &ins);
        // Worker ports are assigned in order from 2; port 99 belongs to nobody.
        let worker_port = |r: u16| PortId(2 + r);
        let mut injections = Vec::new();
        let mut at = Duration::from_micros(1);
        let mut add = |port: PortId, bytes: Vec<u8>| {
            injections.push(Injection { at, port, bytes });
            at += Duration::from_micros(37);
        };
        for i in 0..40u32 {
            let seq = rng.next_u64() as u32;
            add(worker_port(0), data_packet(9, 1, 0, 16, 64, seq)); // foreign job
            add(worker_port(1), data_packet(5, 1, 7, 16, 64, seq)); // unknown rank
            add(PortId(99), data_packet(5, 1, 1, 16, 64, seq)); // right rank, wrong port
            add(worker_port(2), data_packet(5, 1, 2, 3, 64, seq)); // slot outside the range
            add(worker_port(0), data_packet(5, 4, 0, 17, 64, seq)); // stale epoch
            add(worker_port(1), data_packet(5, 1, 1, 17, 63, seq)); // bad count
            let mut truncated = data_packet(5, 1, 0, 16, 64, seq);
            truncated.truncate(16 + (i as usize % 200));
            add(worker_port(0), truncated);
            let random: Vec<u8> = (0..rng.below(300)).map(|_| rng.next_u64() as u8).collect();
            add(worker_port(1), random);
        }
        let clean = Scenario::new(seed, vec![j.clone()]);
        let mut attacked = clean.clone();
        attacked.injections = injections;
        let r_clean = run(&clean);
        let r = run(&attacked);
        assert_correct(&r, &[ins], &[64], seed);
        assert!(bit_identical(
            &r.jobs[0].workers[0].tensors,
            &r_clean.jobs[0].workers[0].tensors
        ));
        let c = r.switch;
        assert_eq!(c.unknown_job, 40, "seed {seed}: {c:?}");
        assert_eq!(c.unknown_rank, 40);
        assert_eq!(c.wrong_port, 40);
        assert_eq!(c.slot_out_of_range, 40);
        assert_eq!(c.stale_epoch, 40);
        assert_eq!(c.bad_count, 40);
        assert!(c.malformed >= 40, "{c:?}");
        assert_eq!(r.switch.packets_in - r_clean.switch.packets_in, 320);
    }
}

/// A worker that hands its NIC only a few packets at a time keeps the round trip near the
/// path's: with a window of about two bandwidth-delay products and an unbounded NIC queue,
/// every packet waits behind a window of others, and so does every repair.
#[test]
fn a_short_nic_queue_keeps_round_trips_near_the_path() {
    let mut rng = Rng::new(5);
    let inputs = inputs(&mut rng, 4, 256 * 1024);
    let srtt = |nic_queue: Option<u32>| {
        let mut j = job(1, 0, &inputs);
        j.window = 256;
        j.elems_per_packet = 256;
        let mut scenario = Scenario::new(1, vec![j]);
        scenario.pipeline.pool_slots = 256;
        scenario.nic_queue = nic_queue;
        let report = run(&scenario);
        assert_correct(&report, std::slice::from_ref(&inputs), &[256], 1);
        let w = &report.jobs[0].workers[0];
        let stats = w.outcome.as_ref().unwrap().as_ref().unwrap();
        (stats[0].srtt.unwrap(), report.elapsed)
    };
    let (short, short_took) = srtt(Some(4));
    let (deep, deep_took) = srtt(None);
    // The path: 2 x 5 µs plus a packet's serialization each way; the window's serialization
    // is 256 x 83 ns = 21 µs.
    assert!(short < Duration::from_micros(13), "{short:?}");
    assert!(deep > Duration::from_micros(18), "{deep:?}");
    // Both keep the link busy: the lossless run takes the same time either way.
    let diff = short_took.abs_diff(deep_took);
    assert!(
        diff < deep_took / 50,
        "{short_took:?} against {deep_took:?}"
    );
}
