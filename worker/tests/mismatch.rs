//! Ranks that disagree on what they all-reduce (the tensor's length, its element type, the
//! number of workers every sum covers) end with a typed error that names the mismatch, on
//! every rank, and never hand back a wrong sum as a success.
#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
mod common;

use common::{free_addrs, switch, Running};
use ina_switch::JobSpec;
use ina_worker::{Communicator, WorkerConfig, WorkerError};
use std::net::SocketAddr;
use std::time::Duration;

fn start(workers: &[SocketAddr]) -> Running {
    switch(
        1,
        vec![JobSpec {
            job: 9,
            epoch: None,
            slot_base: 0,
            slot_count: 16,
            elems_per_packet: 64,
            workers: workers.to_vec(),
            group: None,
            uplink: None,
        }],
    )
}

/// What each rank's all-reduce does.
#[derive(Clone, Copy)]
enum Call {
    F32(usize),
    I32(usize),
}

/// Runs one all-reduce per rank (rank r does `calls[r]`, counting `totals[r]` workers), then
/// a second; returns each rank's two outcomes.
fn run(calls: &[Call], totals: &[Option<u16>]) -> Vec<[Result<(), WorkerError>; 2]> {
    let n = calls.len();
    let workers = free_addrs(n);
    let sw = start(&workers);
    let threads: Vec<_> = (0..n)
        .map(|r| {
            let mut cfg = WorkerConfig::new(sw.addr, workers[r], 9, r as u8);
            cfg.total_workers = totals[r];
            cfg.give_up = Duration::from_secs(3);
            let call = calls[r];
            std::thread::spawn(move || {
                let mut comm = Communicator::connect(cfg).unwrap();
                let mut once = || match call {
                    Call::F32(len) => {
                        let mut x = vec![1.0f32; len];
                        comm.allreduce_f32(&mut x).map(|_| ())
                    }
                    Call::I32(len) => {
                        let mut x = vec![1i32; len];
                        comm.allreduce_i32(&mut x).map(|_| ())
                    }
                };
                [once(), once()]
            })
        })
        .collect();
    let out = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let _ = sw.stop();
    out
}

/// Every rank's first call fails with a mismatch whose message contains `says`, and its next
/// call fails too (the ranks' slots are out of step): nothing returns as a success.
fn assert_every_rank_names(out: &[[Result<(), WorkerError>; 2]], says: &[&str]) {
    for (r, [first, second]) in out.iter().enumerate() {
        let e = first
            .as_ref()
            .expect_err("a mismatched all-reduce succeeded");
        assert_eq!(e.kind(), "mismatch", "rank {r}: {e}");
        let text = e.to_string();
        assert!(
            says.iter().any(|s| text.contains(s)),
            "rank {r}: {text} names none of {says:?}"
        );
        assert!(second.is_err(), "rank {r}: the next all-reduce succeeded");
    }
}

#[test]
fn tensors_of_different_lengths_fail_on_every_rank() {
    let out = run(&[Call::F32(100_000), Call::F32(300_000)], &[None, None]);
    assert_every_rank_names(&out, &["different lengths"]);
    let text = out[0][0].as_ref().unwrap_err().to_string();
    assert!(text.contains("100000") && text.contains("200000"), "{text}");
}

#[test]
fn tensors_of_different_types_fail_on_every_rank() {
    let out = run(&[Call::F32(10_000), Call::I32(10_000)], &[None, None]);
    assert_every_rank_names(&out, &["element types"]);
}

#[test]
fn a_rank_that_counts_other_workers_fails_and_so_do_the_others() {
    // Rank 1 believes three workers' data make every sum (its quantizer scales for three):
    // every rank finds out before any result is handed back.
    let out = run(&[Call::F32(50_000), Call::F32(50_000)], &[None, Some(3)]);
    assert_every_rank_names(&out, &["contributed", "different tensors"]);
    let text = out[1][0].as_ref().unwrap_err().to_string();
    assert!(
        text.contains("2 workers contributed") && text.contains("counts 3"),
        "{text}"
    );
}

#[test]
fn ranks_that_agree_succeed() {
    let out = run(&[Call::F32(100_000), Call::F32(100_000)], &[None, None]);
    for (r, [a, b]) in out.iter().enumerate() {
        assert!(a.is_ok() && b.is_ok(), "rank {r}: {a:?} {b:?}");
    }
}
