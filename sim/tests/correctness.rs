//! Every worker ends with the lossless result, bit for bit, under loss, duplication and
//! reordering; and within the quantizer's bound of the exact sum. Each case runs over many
//! seeds; a failure names its seed (replay with INA_SIM_SEED_BASE=<seed> INA_SIM_SEEDS=1).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use ina_sim::data::Generated;
use ina_sim::rng::Rng;
use ina_sim::{run, Data, LinkConfig, Scenario, SimJob, WorkerSpec};
use std::time::Duration;

struct Case {
    workers: usize,
    lens: Vec<usize>,
    window: u16,
    elems: u16,
    link: LinkConfig,
    ints: bool,
    /// Tensors made from a seed (`ina_sim::data::Generated`) instead of held ones.
    generated: bool,
}

fn scenario(seed: u64, case: &Case) -> (Scenario, Vec<Vec<Vec<Data>>>) {
    let mut rng = Rng::new(seed ^ 0x5eed);
    let inputs: Vec<Vec<Data>> = (0..case.workers)
        .map(|rank| {
            case.lens
                .iter()
                .map(|&len| {
                    if case.generated {
                        Data::Generated(Generated::new(
                            seed,
                            rank,
                            len,
                            case.workers,
                            usize::from(case.elems),
                            rank == 0,
                        ))
                    } else if case.ints {
                        Data::I32((0..len).map(|_| rng.next_u64() as i32).collect())
                    } else {
                        Data::F32(float_tensor(&mut rng, len))
                    }
                })
                .collect()
        })
        .collect();
    let job = SimJob {
        job: 3,
        epoch: 9,
        // A window of whole 64-slot blocks gets the switch's Missing reports.
        slot_base: if case.window.is_multiple_of(64) {
            128
        } else {
            100
        },
        window: case.window,
        elems_per_packet: case.elems,
        workers: inputs.iter().cloned().map(WorkerSpec::new).collect(),
    };
    let mut s = Scenario::new(seed, vec![job]);
    s.link = case.link;
    (s, vec![inputs])
}

fn check(case: Case, seeds: u64) {
    for seed in common::seeds(seeds) {
        let (s, inputs) = scenario(seed, &case);
        let report = run(&s);
        assert_correct(&report, &inputs, &[case.elems], seed);
        let stats: Vec<_> = report.jobs[0]
            .workers
            .iter()
            .flat_map(|w| w.outcome.clone().unwrap().unwrap())
            .collect();
        let retx: u64 = stats.iter().map(|s| s.resent()).sum();
        let packets: u64 = stats.iter().map(|s| s.packets).sum();
        let lost: u64 = report.jobs[0]
            .workers
            .iter()
            .map(|w| w.uplink.lost + w.downlink.lost)
            .sum();
        if seed == 0 {
            eprintln!(
                "workers={} packets={packets} retx={retx} lost={lost} switch: first={} added={} mcast={} ucast={} stale={} dup={} pending={} t={:?}",
                case.workers, report.switch.data_first, report.switch.data_added,
                report.switch.results_multicast, report.switch.results_unicast,
                report.switch.stale_seq, report.switch.duplicate, report.switch.pending_sent,
                report.elapsed
            );
        }
        // A loss is only repaired by a packet sent again (a retransmission or a stall probe).
        assert!(
            lost == 0 || retx > 0,
            "seed {seed}: lost {lost}, retransmitted {retx}"
        );
        assert!(packets > 0 || case.lens.iter().all(|l| *l == 0));
        let reference = lossless(&s);
        assert_correct(&reference, &inputs, &[case.elems], seed);
        assert!(
            bit_identical(
                &report.jobs[0].workers[0].tensors,
                &reference.jobs[0].workers[0].tensors
            ),
            "seed {seed}: result differs from the lossless run"
        );
    }
}

fn lossy(loss: f64, dup: f64, reorder: f64) -> LinkConfig {
    LinkConfig {
        loss,
        duplicate: dup,
        reorder,
        reorder_delay: Duration::from_micros(200),
        ..LinkConfig::default()
    }
}

#[test]
fn one_worker_clean_and_lossy() {
    for loss in [0.0, 0.05, 0.2] {
        check(
            Case {
                workers: 1,
                lens: vec![0, 1, 255, 1000],
                window: 4,
                elems: 64,
                link: lossy(loss, 0.05, 0.1),
                ints: false,
                generated: false,
            },
            30,
        );
    }
}

#[test]
fn two_and_three_workers_with_odd_tails() {
    for (workers, loss) in [(2, 0.01), (3, 0.1), (3, 0.2)] {
        check(
            Case {
                workers,
                lens: vec![1, 63, 64, 65, 3001],
                window: 8,
                elems: 64,
                link: lossy(loss, 0.02, 0.2),
                ints: false,
                generated: false,
            },
            40,
        );
    }
}

#[test]
fn eight_workers_duplication_and_reordering() {
    check(
        Case {
            workers: 8,
            lens: vec![10_007, 5],
            window: 16,
            elems: 256,
            link: lossy(0.05, 0.1, 0.3),
            ints: false,
            generated: false,
        },
        20,
    );
}

#[test]
fn thirty_two_workers_heavy_loss() {
    check(
        Case {
            workers: 32,
            lens: vec![2_049],
            window: 8,
            elems: 64,
            link: lossy(0.2, 0.05, 0.2),
            ints: false,
            generated: false,
        },
        10,
    );
}

#[test]
fn int32_sums_are_exact_with_wraparound() {
    check(
        Case {
            workers: 5,
            lens: vec![777, 0, 1],
            window: 6,
            elems: 32,
            link: lossy(0.1, 0.1, 0.2),
            ints: true,
            generated: false,
        },
        30,
    );
}

#[test]
fn window_of_one_and_tensors_shorter_than_the_window() {
    check(
        Case {
            workers: 3,
            lens: vec![3, 100, 7],
            window: 1,
            elems: 8,
            link: lossy(0.1, 0.05, 0.1),
            ints: false,
            generated: false,
        },
        20,
    );
    check(
        Case {
            workers: 3,
            lens: vec![3, 20, 7],
            window: 32,
            elems: 8,
            link: lossy(0.1, 0.05, 0.1),
            ints: false,
            generated: false,
        },
        20,
    );
}

#[test]
fn same_seed_replays_exactly() {
    let case = Case {
        workers: 4,
        lens: vec![999],
        window: 8,
        elems: 64,
        link: lossy(0.1, 0.1, 0.3),
        ints: false,
        generated: false,
    };
    let (s, _) = scenario(77, &case);
    let a = run(&s);
    let b = run(&s);
    assert_eq!(a.events, b.events);
    assert_eq!(a.elapsed, b.elapsed);
    assert_eq!(a.switch, b.switch);
    let c = run(&scenario(78, &case).0);
    assert_ne!((a.events, a.elapsed), (c.events, c.elapsed));
}

#[test]
fn workers_learn_from_pending_answers_and_query_instead_of_resending() {
    let case = Case {
        workers: 8,
        lens: vec![20_000],
        window: 16,
        elems: 64,
        link: lossy(0.03, 0.0, 0.0),
        ints: false,
        generated: false,
    };
    for seed in common::seeds(5) {
        let (s, inputs) = scenario(seed, &case);
        let report = run(&s);
        assert_correct(&report, &inputs, &[case.elems], seed);
        let stats: Vec<_> = report.jobs[0]
            .workers
            .iter()
            .flat_map(|w| w.outcome.clone().unwrap().unwrap())
            .collect();
        let queries: u64 = stats.iter().map(|s| s.queries).sum();
        let pendings: u64 = stats.iter().map(|s| s.pending_answers).sum();
        assert!(
            report.switch.pending_sent > 0,
            "seed {seed}: no Pending sent"
        );
        assert!(pendings > 0 && pendings <= report.switch.pending_sent);
        assert!(queries > 0, "seed {seed}: no worker queried");
        // A query is answered like a retransmission: with the result, or Pending again.
        assert!(report.switch.results_unicast + report.switch.pending_sent > 0);
    }
}

#[test]
fn eight_workers_with_missing_reports_under_loss_duplication_and_reordering() {
    check(
        Case {
            workers: 8,
            lens: vec![40_007, 5],
            window: 64,
            elems: 64,
            link: lossy(0.05, 0.1, 0.3),
            ints: false,
            generated: false,
        },
        10,
    );
}

#[test]
fn thirty_two_workers_with_missing_reports_heavy_loss() {
    check(
        Case {
            workers: 32,
            lens: vec![8_193],
            window: 64,
            elems: 64,
            link: lossy(0.2, 0.05, 0.2),
            ints: false,
            generated: false,
        },
        4,
    );
}

#[test]
fn generated_tensors_are_checked_as_they_come() {
    check(
        Case {
            workers: 6,
            lens: vec![20_000, 3],
            window: 64,
            elems: 128,
            link: lossy(0.05, 0.05, 0.2),
            ints: false,
            generated: true,
        },
        6,
    );
}
