//! A worker learns the job's multicast group from the switch's probe reply: it joins the group
//! when it was given none, and refuses to start with a group the job does not use.
#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
mod common;

use common::{free_addrs, switch, Running};
use ina_switch::JobSpec;
use ina_worker::{Communicator, WorkerConfig, WorkerError};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// The switch with job 7 of `workers` on slots 0..16, its results to `group` if given.
fn start(workers: &[SocketAddr], group: Option<SocketAddrV4>) -> Running {
    switch(
        1,
        vec![JobSpec {
            job: 7,
            epoch: None,
            slot_base: 0,
            slot_count: 16,
            elems_per_packet: 64,
            workers: workers.to_vec(),
            group,
            uplink: None,
        }],
    )
}

fn group_at(last: u8) -> SocketAddrV4 {
    let port = free_addrs(1)[0].port();
    SocketAddrV4::new(Ipv4Addr::new(239, 255, 74, last), port)
}

/// Workers started without `group` on a job whose results go to a group join it from the
/// probe reply, and get their results from the group, not as answers to retransmissions.
#[test]
fn a_worker_without_the_group_joins_the_one_the_switch_names() {
    let n = 2;
    let workers = free_addrs(n);
    let group = group_at(11);
    let sw = start(&workers, Some(group));
    let len = 64 * 200;
    let threads: Vec<_> = (0..n)
        .map(|r| {
            let cfg = WorkerConfig::new(sw.addr, workers[r], 7, r as u8);
            assert_eq!(cfg.group, None);
            std::thread::spawn(move || {
                let mut comm = Communicator::connect(cfg).unwrap();
                let job = comm.job();
                let mut ints: Vec<i32> = (0..len).map(|i| i * (r as i32 + 1)).collect();
                comm.allreduce_i32(&mut ints).unwrap();
                (job, ints)
            })
        })
        .collect();
    for t in threads {
        let (job, ints) = t.join().unwrap();
        assert_eq!(job.group, Some(group));
        for (i, x) in ints.iter().enumerate() {
            assert_eq!(*x, i as i32 * 3, "element {i}");
        }
    }
    let p = sw.handle.stats().unwrap().total.pipeline;
    // The tensor's 200 packets and its descriptor.
    assert_eq!(p.results_multicast, 201);
    // Outside the group every result would be an answer to a retransmission or a Query.
    assert!(
        p.results_unicast * 4 <= p.results_multicast,
        "results came as answers to retransmissions: {p:?}"
    );
    let _ = sw.stop();
}

/// A worker given another group than the job's refuses to start, naming the job's group.
#[test]
fn a_mistyped_group_fails_the_connection_naming_the_right_one() {
    let workers = free_addrs(1);
    let group = group_at(12);
    let wrong = group_at(13);
    let sw = start(&workers, Some(group));
    let mut cfg = WorkerConfig::new(sw.addr, workers[0], 7, 0);
    cfg.group = Some(wrong);
    match Communicator::connect(cfg) {
        Err(WorkerError::JobMismatch(msg)) => {
            assert!(msg.contains(&group.to_string()), "{msg}");
            assert!(msg.contains(&wrong.to_string()), "{msg}");
        }
        other => panic!("expected a job mismatch, got {other:?}"),
    }
    let _ = sw.stop();
}

/// A worker that joined a group for a job that sends to every worker's own address refuses
/// to start.
#[test]
fn a_group_the_job_does_not_use_fails_the_connection() {
    let workers = free_addrs(1);
    let wrong = group_at(14);
    let sw = start(&workers, None);
    let mut cfg = WorkerConfig::new(sw.addr, workers[0], 7, 0);
    cfg.group = Some(wrong);
    match Communicator::connect(cfg) {
        Err(WorkerError::JobMismatch(msg)) => {
            assert!(msg.contains(&wrong.to_string()), "{msg}");
            assert!(msg.contains("no group"), "{msg}");
        }
        other => panic!("expected a job mismatch, got {other:?}"),
    }
    // Without the group the same worker starts and reports none.
    let cfg = WorkerConfig::new(sw.addr, workers[0], 7, 0);
    let comm = Communicator::connect(cfg).unwrap();
    assert_eq!(comm.job().group, None);
    drop(comm);
    let _ = sw.stop();
}
