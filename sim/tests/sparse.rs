//! Sparse all-reduces in the simulator (PROTOCOL.md §5, "Sparse streams"): every worker's
//! support stream, then its values stream over the union, with per-worker densities that
//! differ and overlapping, independent and disjoint supports; on one switch under loss,
//! duplication and reordering, and at 1024 workers in two levels. Every rank's result has the
//! same fingerprint, rank 0's is within the quantizer's bound of the exact sum in every block
//! some rank holds and +0.0 exactly in every other block, and the packets follow the union.
#![allow(clippy::unwrap_used)]

mod common;

use common::seeds;
use ina_sim::data::{Generated, Pattern, Sparsity};
use ina_sim::{run, Data, LinkConfig, Racks, Report, Scenario, SimJob, SparseData, WorkerSpec};
use std::time::Duration;

const ELEMS: u16 = 64;

/// One job of `workers` workers, each all-reducing `blocks` blocks sparse.
fn sparse_job(workers: usize, blocks: usize, window: u16, sparsity: Sparsity) -> SimJob {
    let len = blocks * usize::from(ELEMS) - 5;
    SimJob {
        job: 1,
        epoch: 3,
        slot_base: 0,
        window,
        elems_per_packet: ELEMS,
        workers: (0..workers)
            .map(|r| {
                let g = Generated::new(9, r, len, workers, usize::from(ELEMS), r == 0)
                    .with_sparsity(sparsity);
                WorkerSpec::new(vec![Data::Sparse(Box::new(SparseData::new(
                    g,
                    usize::from(ELEMS),
                )))])
            })
            .collect(),
    }
}

fn sparsity(density: f64, pattern: Pattern, workers: usize) -> Sparsity {
    Sparsity {
        density,
        pattern,
        block: usize::from(ELEMS),
        workers,
    }
}

/// Every worker finished with the same fingerprint, rank 0 within the bound everywhere; the
/// union density the support streams found.
fn assert_exact(report: &Report, what: &str) -> f64 {
    let job = &report.jobs[0];
    let mut prints = Vec::new();
    let mut union = None;
    for (r, w) in job.workers.iter().enumerate() {
        assert!(
            matches!(w.outcome, Some(Ok(_))),
            "{what}: rank {r} ended with {:?}",
            w.outcome
        );
        let Some(Data::Sparse(s)) = w.tensors.first() else {
            panic!("{what}: rank {r} has no sparse tensor");
        };
        let g = s.values.inner();
        assert_eq!(
            g.received, g.len as u64,
            "{what}: rank {r} got every element"
        );
        prints.push(g.fingerprint);
        let u = s.union_density(usize::from(ELEMS));
        assert_eq!(
            *union.get_or_insert(u),
            u,
            "{what}: rank {r}'s union differs"
        );
        if r == 0 {
            assert_eq!(g.violations, 0, "{what}: rank 0's result is wrong");
        }
    }
    assert!(
        prints.windows(2).all(|p| p[0] == p[1]),
        "{what}: the ranks' results differ"
    );
    union.unwrap_or(0.0)
}

/// The fraction of blocks some rank holds, counted from the generator.
fn expected_union(s: &Sparsity, blocks: usize) -> f64 {
    let held = (0..blocks)
        .filter(|&b| (0..s.workers).any(|r| s.holds(9, r, b)))
        .count();
    held as f64 / blocks as f64
}

#[test]
fn sparse_jobs_on_one_switch_survive_loss_duplication_and_reordering() {
    let link = LinkConfig {
        latency: Duration::from_micros(5),
        bandwidth_bps: Some(100_000_000_000),
        loss: 0.02,
        duplicate: 0.01,
        reorder: 0.02,
        reorder_delay: Duration::from_micros(20),
        ..LinkConfig::default()
    };
    for seed in seeds(3) {
        for pattern in [
            Pattern::Overlapping,
            Pattern::Independent,
            Pattern::Disjoint,
        ] {
            let sp = sparsity(0.1, pattern, 8);
            let mut s = Scenario::new(seed, vec![sparse_job(8, 300, 16, sp)]);
            s.link = link;
            let report = run(&s);
            let what = format!("seed {seed}, {pattern:?}");
            let u = assert_exact(&report, &what);
            assert_eq!(u, expected_union(&sp, 300), "{what}");
            let lost: u64 = report.jobs[0]
                .workers
                .iter()
                .map(|w| w.uplink.lost + w.downlink.lost)
                .sum();
            assert!(lost > 0, "{what}: the links lost nothing");
        }
    }
}

#[test]
fn sparse_supports_overlap_as_their_pattern_says() {
    let n = 8;
    let blocks = 2000;
    let u = |p| expected_union(&sparsity(0.05, p, n), blocks);
    let (over, ind, dis) = (
        u(Pattern::Overlapping),
        u(Pattern::Independent),
        u(Pattern::Disjoint),
    );
    // Nested supports: the densest rank's 7.5%; independent ones: 1 - Π(1 - d_r), about 33%;
    // disjoint ones: the sum of the densities, 8 × 5%, about 40%.
    assert!((0.06..0.09).contains(&over), "overlapping: {over}");
    assert!((0.28..0.38).contains(&ind), "independent: {ind}");
    assert!((0.36..0.44).contains(&dis), "disjoint: {dis}");
    let s = sparsity(0.05, Pattern::Disjoint, n);
    for b in 0..blocks {
        assert!((0..n).filter(|&r| s.holds(9, r, b)).count() <= 1);
    }
}

#[test]
fn sparse_jobs_of_1024_workers_in_two_levels_sum_exactly() {
    let link = LinkConfig {
        latency: Duration::from_micros(2),
        bandwidth_bps: Some(100_000_000_000),
        ..LinkConfig::default()
    };
    let blocks = 96;
    // Unions of about 7%, 10% and 50% of the blocks.
    for (pattern, density) in [
        (Pattern::Overlapping, 0.05),
        (Pattern::Independent, 0.0001),
        (Pattern::Disjoint, 0.0005),
    ] {
        let sp = sparsity(density, pattern, 1024);
        let mut s = Scenario::new(1, vec![sparse_job(1024, blocks, 32, sp)]);
        s.link = link;
        s.racks = Some(Racks {
            per_rack: 32,
            uplink: link,
            striped: false,
        });
        let report = run(&s);
        let what = format!("1024 workers, {pattern:?}");
        let u = assert_exact(&report, &what);
        assert_eq!(u, expected_union(&sp, blocks), "{what}");
        assert!(u > 0.0 && u < 1.0, "{what}: union density {u}");
        // Each worker sends its support stream (a descriptor and ceil(96 / 64) packets) and
        // the values stream over the union (a descriptor, the union's blocks and the
        // lookahead's headers twice), and nothing else without loss.
        let union_blocks = (u * blocks as f64).round() as u64;
        let lookahead = union_blocks.min(31);
        let expected = (1 + 2) + (1 + union_blocks + 2 * lookahead);
        for (r, w) in report.jobs[0].workers.iter().enumerate() {
            let Some(Ok(stats)) = &w.outcome else {
                unreachable!()
            };
            let sent: u64 = stats.iter().map(|s| s.packets_sent).sum();
            assert_eq!(sent, expected, "{what}: rank {r} sent {sent} packets");
        }
    }
}
