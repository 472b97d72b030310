//! Ranks that disagree on what they all-reduce, over lossy, duplicating and reordering links:
//! every rank's stream ends with a mismatch error naming what differs (or, for element types,
//! the switch's refusal of a payload to a header-only use, which names it too), well within
//! its give-up time, and none finishes as if its sums were right.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use ina_proto::descriptor::Mismatch;
use ina_proto::stream::StreamError;
use ina_sim::rng::Rng;
use ina_sim::{run, Data, LinkConfig, Scenario, SimJob, WorkerSpec};
use ina_wire::RejectReason;
use std::time::Duration;

fn scenario(seed: u64, tensors: Vec<Data>) -> Scenario {
    let job = SimJob {
        job: 1,
        epoch: 1,
        slot_base: 0,
        window: 8,
        elems_per_packet: 64,
        workers: tensors
            .into_iter()
            .map(|t| WorkerSpec::new(vec![t]))
            .collect(),
    };
    let mut s = Scenario::new(seed, vec![job]);
    s.link = LinkConfig {
        loss: 0.05,
        duplicate: 0.02,
        reorder: 0.1,
        ..LinkConfig::default()
    };
    s
}

/// Every rank's outcome is a mismatch that `named` accepts (or, with `count_refused`, the
/// switch's refusal of a packet whose count differs from its use's, which may come first),
/// before a second has passed.
fn assert_every_rank(
    s: &Scenario,
    named: impl Fn(&Mismatch) -> bool,
    count_refused: bool,
    seed: u64,
) {
    let report = run(s);
    for (r, w) in report.jobs[0].workers.iter().enumerate() {
        match &w.outcome {
            Some(Err(StreamError::Mismatch(m))) => assert!(named(m), "seed {seed} rank {r}: {m}"),
            Some(Err(StreamError::Rejected(RejectReason::BadCount))) if count_refused => {}
            other => panic!("seed {seed} rank {r}: {other:?}"),
        }
        let at = w.ended_at.unwrap();
        assert!(
            at < Duration::from_secs(1),
            "seed {seed} rank {r}: ended at {at:?}"
        );
    }
}

#[test]
fn different_lengths_end_every_rank_with_a_mismatch() {
    for seed in seeds(8) {
        let mut rng = Rng::new(seed);
        let tensors = vec![
            Data::F32(float_tensor(&mut rng, 1_000)),
            Data::F32(float_tensor(&mut rng, 3_000)),
            Data::F32(float_tensor(&mut rng, 1_000)),
        ];
        assert_every_rank(
            &scenario(seed, tensors),
            |m| matches!(m, Mismatch::Length { mean: 1667, .. }),
            false,
            seed,
        );
    }
}

#[test]
fn different_element_types_end_every_rank_with_a_mismatch() {
    for seed in seeds(8) {
        let mut rng = Rng::new(seed);
        let tensors = vec![
            Data::F32(float_tensor(&mut rng, 2_000)),
            Data::I32(vec![7; 2_000]),
        ];
        assert_every_rank(
            &scenario(seed, tensors),
            |m| matches!(m, Mismatch::Type { .. }),
            true,
            seed,
        );
    }
}
