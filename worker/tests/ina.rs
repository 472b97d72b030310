//! The worker library against the real software switch over loopback UDP.
#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
mod common;

use common::{free_addrs, start, switch};
use ina_proto::stream::Tensor;
use ina_switch::{JobSpec, SwitchConfig};
use ina_worker::{AsyncCommunicator, Communicator, WorkerConfig, WorkerError};
use std::time::Duration;

fn tensor(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 31 + rank * 7) % 101) as f32 * 0.01 - 0.5)
        .collect()
}

#[test]
fn workers_sum_through_a_sharded_switch() {
    let n = 3;
    let workers = free_addrs(n);
    let sw = switch(
        2,
        vec![JobSpec {
            job: 1,
            epoch: None,
            slot_base: 0,
            // Two blocks of 64 slots: the shards own whole blocks.
            slot_count: 128,
            elems_per_packet: 64,
            workers: workers.clone(),
            group: None,
            uplink: None,
        }],
    );
    let len = 100_003;
    let threads: Vec<_> = (0..n)
        .map(|r| {
            let cfg = WorkerConfig::new(sw.addr, workers[r], 1, r as u8);
            std::thread::spawn(move || {
                let mut comm = Communicator::connect(cfg).unwrap();
                let mut out = Vec::new();
                let mut resent = 0;
                for round in 0..3 {
                    let mut t = tensor(r + round, len);
                    let stats = comm.allreduce_f32(&mut t).unwrap();
                    assert_eq!(stats.elements, len);
                    resent += stats.stream.retransmissions;
                    out.push(t);
                }
                let mut ints: Vec<i32> = (0..999).map(|i| i * (r as i32 + 1)).collect();
                resent += comm
                    .allreduce_i32(&mut ints)
                    .unwrap()
                    .stream
                    .retransmissions;
                (out, ints, resent)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for round in 0..3 {
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| tensor(r + round, len)).collect();
        for i in 0..len {
            let exact: f64 = inputs.iter().map(|t| f64::from(t[i])).sum();
            let got = results[0].0[round][i];
            assert!(
                (f64::from(got) - exact).abs() < 1e-6,
                "round {round} i {i}: {got} vs {exact}"
            );
            for other in &results[1..] {
                assert_eq!(other.0[round][i].to_bits(), got.to_bits());
            }
        }
    }
    for (i, x) in results[0].1.iter().enumerate() {
        assert_eq!(*x, i as i32 * 6);
    }
    let stats = sw.handle.stats().unwrap();
    assert!(
        stats
            .shards
            .iter()
            .all(|s| s.pipeline.results_multicast > 0),
        "both shards worked: {stats:?}"
    );
    // Only a copy can come too late for its slot: a worker that was not scheduled for a while
    // may have sent one (a stall probe) just before the result reached it, and the shards may
    // deliver it after the slot's next uses.
    let resent: u64 = results.iter().map(|r| r.2).sum();
    assert!(
        stats.total.pipeline.stale_seq <= resent,
        "stale packets that were no copies: {stats:?}"
    );
    sw.stop();
}

/// With the job's results going to a multicast group the workers joined, every worker gets
/// every sum from one datagram per result, and answers to retransmissions still reach the
/// worker that asked.
#[test]
fn results_through_a_multicast_group() {
    let n = 3;
    let workers = free_addrs(n);
    let group_port = free_addrs(1)[0].port();
    let group = std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(239, 255, 73, 9), group_port);
    let mut cfg = SwitchConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.jobs = vec![JobSpec {
        job: 4,
        epoch: None,
        slot_base: 0,
        slot_count: 32,
        elems_per_packet: 128,
        workers: workers.clone(),
        group: Some(group),
        uplink: None,
    }];
    // 2% loss on the way out: some results are lost to one worker only, which then asks again.
    cfg.loss = 0.02;
    cfg.seed = 5;
    let sw = start(cfg);
    let len = 50_000;
    let threads: Vec<_> = (0..n)
        .map(|r| {
            let mut cfg = WorkerConfig::new(sw.addr, workers[r], 4, r as u8);
            cfg.group = Some(group);
            cfg.rto.min = Duration::from_millis(2);
            std::thread::spawn(move || {
                let mut comm = Communicator::connect(cfg).unwrap();
                let mut ints: Vec<i32> = (0..len).map(|i| i * (r as i32 + 1)).collect();
                comm.allreduce_i32(&mut ints).unwrap();
                ints
            })
        })
        .collect();
    let results: Vec<Vec<i32>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for ints in &results {
        for (i, x) in ints.iter().enumerate() {
            assert_eq!(*x, i as i32 * 6, "element {i}");
        }
    }
    let stats = sw.handle.stats().unwrap();
    let p = &stats.total.pipeline;
    assert!(p.results_multicast > 0);
    assert!(
        p.results_unicast > 0,
        "lost results were asked for again: {p:?}"
    );
    // One datagram per finished slot use plus the unicast answers (results, Pending answers,
    // probe replies), not one per worker.
    let sent = stats.total.io.tx_datagrams;
    assert!(
        sent <= p.results_multicast
            + p.results_unicast
            + p.pending_sent
            + p.probes_answered
            + p.rejects_sent,
        "{sent} datagrams sent for {p:?}"
    );
    sw.stop();
}

#[test]
fn several_tensors_in_flight_and_async() {
    let n = 2;
    let workers = free_addrs(n);
    let sw = switch(
        1,
        vec![JobSpec {
            job: 9,
            epoch: None,
            slot_base: 100,
            slot_count: 64,
            elems_per_packet: 256,
            workers: workers.clone(),
            group: None,
            uplink: None,
        }],
    );
    let threads: Vec<_> = (0..n)
        .map(|r| {
            let mut cfg = WorkerConfig::new(sw.addr, workers[r], 9, r as u8);
            cfg.lanes = 4;
            std::thread::spawn(move || {
                let comm = Communicator::connect(cfg).unwrap();
                assert_eq!(comm.job().window, 16);
                let comm = AsyncCommunicator::start(comm).unwrap();
                let pending: Vec<_> = (0..10)
                    .map(|k| comm.submit_f32(tensor(r + k, 5_000 + k)))
                    .collect();
                pending
                    .into_iter()
                    .map(|p| match p.wait() {
                        (Ok(_), Tensor::F32Owned(v)) => v,
                        (other, _) => panic!("{other:?}"),
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for (k, (first, second)) in results[0].iter().zip(&results[1]).enumerate() {
        let len = 5_000 + k;
        assert_eq!(first.len(), len);
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| tensor(r + k, len)).collect();
        for i in 0..len {
            let exact: f64 = inputs.iter().map(|t| f64::from(t[i])).sum();
            assert!((f64::from(first[i]) - exact).abs() < 1e-6);
            assert_eq!(second[i].to_bits(), first[i].to_bits());
        }
    }
    sw.stop();
}

#[test]
fn unreachable_switch_and_unknown_rank_are_typed_errors() {
    let workers = free_addrs(2);
    let sw = switch(
        1,
        vec![JobSpec {
            job: 2,
            epoch: None,
            slot_base: 0,
            slot_count: 8,
            elems_per_packet: 64,
            workers: workers.clone(),
            group: None,
            uplink: None,
        }],
    );
    // A worker the switch does not list for rank 0 gets no answer.
    let stranger = free_addrs(1)[0];
    let mut cfg = WorkerConfig::new(sw.addr, stranger, 2, 0);
    cfg.probe_timeout = Duration::from_millis(300);
    assert!(matches!(
        Communicator::connect(cfg),
        Err(WorkerError::SwitchUnreachable { .. })
    ));
    // Expecting another worker count is a job mismatch.
    let mut cfg = WorkerConfig::new(sw.addr, workers[0], 2, 0);
    cfg.expect_workers = Some(5);
    assert!(matches!(
        Communicator::connect(cfg),
        Err(WorkerError::JobMismatch(_))
    ));
    let stats = sw.stop();
    assert!(stats.total.unknown_source > 0);
    assert!(stats.total.pipeline.wrong_port > 0);
}
