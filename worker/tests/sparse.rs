//! Sparse all-reduce through the software switch (PROTOCOL.md §5, "Sparse streams"): ranks
//! holding different blocks (one block held by every rank, one by a single rank, most by
//! none, a short last block) get, on every rank, exactly the dense all-reduce's result; the
//! stats say sparse and measure the densities; `auto` follows the union density measured
//! before; ranks that disagree on the mode fail, every one of them.
#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
mod common;

use common::{free_addrs, switch, Running};
use ina_switch::JobSpec;
use ina_worker::{Communicator, Mode, OpStats, WorkerConfig, WorkerError};
use std::net::SocketAddr;
use std::time::Duration;

const E: usize = 64;
/// 200 whole blocks and a short one.
const LEN: usize = 200 * E + 17;
const RANKS: usize = 4;

fn start(workers: &[SocketAddr]) -> Running {
    switch(
        1,
        vec![JobSpec {
            job: 5,
            epoch: None,
            slot_base: 0,
            slot_count: 32,
            elems_per_packet: E as u16,
            workers: workers.to_vec(),
            group: None,
            uplink: None,
        }],
    )
}

/// Whether rank `r` holds block `b`: block 0 every rank, block 7 rank 2 alone, the last (short)
/// block rank 1, and every block a multiple of 9 + 2r.
fn holds(r: usize, b: usize) -> bool {
    b == 0 || (b == 7 && r == 2) || (b == 200 && r == 1) || (b > 0 && b.is_multiple_of(9 + 2 * r))
}

fn tensor_f32(r: usize) -> Vec<f32> {
    (0..LEN)
        .map(|i| {
            if holds(r, i / E) && i % 5 != 1 {
                ((i * 7 + r * 13) % 101) as f32 * 0.37 - 18.0
            } else {
                0.0
            }
        })
        .collect()
}

fn union_blocks() -> usize {
    (0..=200)
        .filter(|&b| (0..RANKS).any(|r| holds(r, b)))
        .count()
}

/// Runs `f` on every rank's communicator, in parallel; returns what each returned.
fn on_every_rank<T: Send + 'static>(
    f: impl Fn(usize, &mut Communicator) -> T + Send + Sync + Copy + 'static,
) -> Vec<T> {
    on_every_rank_with(0.0, f)
}

/// [`on_every_rank`] with a sparse threshold.
fn on_every_rank_with<T: Send + 'static>(
    threshold: f32,
    f: impl Fn(usize, &mut Communicator) -> T + Send + Sync + Copy + 'static,
) -> Vec<T> {
    let workers = free_addrs(RANKS);
    let sw = start(&workers);
    let threads: Vec<_> = (0..RANKS)
        .map(|r| {
            let mut cfg = WorkerConfig::new(sw.addr, workers[r], 5, r as u8);
            cfg.give_up = Duration::from_secs(3);
            cfg.sparse_threshold = threshold;
            std::thread::spawn(move || {
                let mut comm = Communicator::connect(cfg).unwrap();
                f(r, &mut comm)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn sparse_float32_is_the_dense_result_bit_for_bit_on_every_rank() {
    let out = on_every_rank(|r, comm| {
        let mut sparse = tensor_f32(r);
        let s = comm.allreduce_f32_with(&mut sparse, Mode::Sparse).unwrap();
        let mut dense = tensor_f32(r);
        let d = comm.allreduce_f32_with(&mut dense, Mode::Dense).unwrap();
        (sparse, dense, s, d)
    });
    let blocks = 201.0;
    for (r, (sparse, dense, s, d)) in out.iter().enumerate() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(sparse),
            bits(dense),
            "rank {r}: sparse and dense differ"
        );
        assert_eq!(
            bits(sparse),
            bits(&out[0].0),
            "rank {r} differs from rank 0"
        );
        let st = s.sparse.expect("the sparse all-reduce says so");
        assert_eq!(st.union_density, union_blocks() as f64 / blocks);
        let own = (0..=200).filter(|&b| holds(r, b)).count() as f64 / blocks;
        assert_eq!(st.own_density, own);
        assert!(d.sparse.is_none());
        // The values stream carried the union's blocks only (its packets, not its
        // transmissions: a loaded machine adds stall probes to either).
        assert!(s.stream.packets < d.stream.packets / 2, "{s:?} {d:?}");
    }
    // Blocks no rank holds are +0.0; the block rank 2 alone holds is its values (times one).
    let r0 = &out[0].0;
    assert!(r0[3 * E..4 * E].iter().all(|x| x.to_bits() == 0));
    let alone = tensor_f32(2);
    for i in 7 * E..8 * E {
        assert!(
            (r0[i] - alone[i]).abs() <= alone[i].abs() * 1e-6 + 1e-6,
            "{i}"
        );
    }
}

#[test]
fn sparse_int32_sums_exactly_and_an_empty_union_sends_no_values() {
    let out = on_every_rank(|r, comm| {
        let mut x: Vec<i32> = (0..LEN)
            .map(|i| {
                if holds(r, i / E) {
                    (i as i32) * (r as i32 + 1)
                } else {
                    0
                }
            })
            .collect();
        let s = comm.allreduce_i32_with(&mut x, Mode::Sparse).unwrap();
        let mut zeros = vec![0i32; 1000];
        let z = comm.allreduce_i32_with(&mut zeros, Mode::Sparse).unwrap();
        (x, s, zeros, z)
    });
    let expected: Vec<i32> = (0..LEN)
        .map(|i| {
            (0..RANKS)
                .filter(|&r| holds(r, i / E))
                .map(|r| (i as i32) * (r as i32 + 1))
                .sum()
        })
        .collect();
    for (x, s, zeros, z) in &out {
        assert_eq!(x, &expected);
        assert!(s.sparse.is_some());
        assert!(zeros.iter().all(|&v| v == 0));
        assert_eq!(z.sparse.map(|st| st.union_density), Some(0.0));
        assert_eq!(
            z.stream.packets_sent, 0,
            "an empty union sends no values stream"
        );
    }
}

#[test]
fn auto_follows_the_union_density_measured_before_on_every_rank() {
    let out = on_every_rank(|r, comm| {
        let mut modes = Vec::new();
        // Dense data: the first call goes sparse (nothing measured), measures a full union,
        // and the next call of the same shape goes dense.
        for _ in 0..2 {
            let mut x = vec![1.0f32 + r as f32; LEN];
            let s: OpStats = comm.allreduce_f32_with(&mut x, Mode::Auto).unwrap();
            assert!(x.iter().all(|&v| v == 10.0), "{:?}", &x[..4]);
            modes.push(s.sparse.is_some());
        }
        // A sparse tensor of another shape goes sparse, and stays so.
        for _ in 0..2 {
            let mut x = tensor_f32(r);
            x.truncate(LEN - 1);
            let s = comm.allreduce_f32_with(&mut x, Mode::Auto).unwrap();
            modes.push(s.sparse.is_some());
        }
        modes
    });
    for modes in &out {
        assert_eq!(modes, &[true, false, true, true]);
    }
}

#[test]
fn ranks_that_disagree_on_the_mode_all_fail() {
    let out = on_every_rank(|r, comm| {
        let mut x = tensor_f32(r);
        let mode = if r == 0 { Mode::Sparse } else { Mode::Dense };
        comm.allreduce_f32_with(&mut x, mode).map(|_| ())
    });
    for (r, o) in out.iter().enumerate() {
        // The descriptors differ, or a use mixes the ranks' packets of different kinds:
        // either way every rank fails, none hands back a sum.
        assert!(
            matches!(o, Err(WorkerError::Mismatch(_) | WorkerError::Rejected(_))),
            "rank {r}: {o:?}"
        );
    }
}

#[test]
fn a_threshold_drops_a_ranks_small_blocks_and_only_those() {
    // Block 0: every rank 10 + r. Block 1: every rank 0.1 (under the threshold everywhere:
    // outside the union). Block 2: rank 0 has 0.1 (dropped), rank 1 has 5 (kept).
    let out = on_every_rank_with(0.5, |r, comm| {
        let mut x = vec![0f32; 4 * E];
        x[..E].fill(10.0 + r as f32);
        x[E..2 * E].fill(0.1);
        if r == 0 {
            x[2 * E..3 * E].fill(0.1);
        }
        if r == 1 {
            x[2 * E..3 * E].fill(5.0);
        }
        let s = comm.allreduce_f32_with(&mut x, Mode::Sparse).unwrap();
        (x, s)
    });
    for (x, s) in &out {
        assert!(x[..E].iter().all(|&v| v == 46.0), "{:?}", &x[..4]);
        assert!(x[E..2 * E].iter().all(|v| v.to_bits() == 0));
        assert!(
            x[2 * E..3 * E].iter().all(|&v| v == 5.0),
            "{:?}",
            &x[2 * E..2 * E + 4]
        );
        assert!(x[3 * E..].iter().all(|v| v.to_bits() == 0));
        assert_eq!(s.sparse.map(|st| st.union_density), Some(0.5));
    }
}
