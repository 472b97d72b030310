//! What a stream reports: stall probes apart from retransmissions, and, when it gives up,
//! which ranks the switch was still waiting for.
#![allow(clippy::unwrap_used)]

// (Each test binary uses part of the shared harness.)
#[allow(dead_code)]
mod common;

use common::{Net, Outcome};
use ina_proto::rtt::RtoConfig;
use ina_proto::stream::StreamError;
use std::time::Duration;

/// Runs `workers` int32 streams of `packets` packets through the switch model, on a window
/// of 8 slots. In a round where `asleep(rank, round)` holds, the worker neither reads nor
/// sends (its answers wait for it); a worker in `dead` never sends at all; `drop_all` loses
/// every packet on the way to the switch.
fn run(
    workers: u8,
    packets: usize,
    rto: RtoConfig,
    give_up: Duration,
    asleep: impl Fn(usize, usize) -> bool,
    dead: &[usize],
    drop_all: bool,
) -> (Vec<Vec<i32>>, Vec<Outcome>) {
    let net = Net {
        workers,
        packets,
        window: 8,
        max_retries: 1000,
        give_up,
        rto,
        rounds: 20_000,
        gap_reports: false,
    };
    let ran = common::run(&net, asleep, dead, |_, _| drop_all);
    (ran.tensors, ran.outcomes)
}

/// The worker library's timer floor: a worker asleep for less than that costs the others
/// stall probes only.
fn rto() -> RtoConfig {
    RtoConfig {
        min: Duration::from_millis(10),
        ..RtoConfig::default()
    }
}

/// Without loss, a worker that is not scheduled for a few milliseconds makes the others send
/// stall probes; they are counted as such, not as retransmissions.
#[test]
fn stall_probes_of_a_lossless_run_are_not_retransmissions() {
    // Rank 1 sleeps for 3 ms (60 rounds) in the middle of the stream.
    let asleep = |rank: usize, round: usize| rank == 1 && (6..66).contains(&round);
    let (tensors, outcomes) = run(2, 256, rto(), Duration::from_secs(1), asleep, &[], false);
    assert_eq!(tensors[0], tensors[1]);
    for (i, x) in tensors[0].iter().enumerate() {
        assert_eq!(*x, i as i32 * 3, "element {i}");
    }
    let stats: Vec<_> = outcomes.into_iter().map(|o| o.unwrap().unwrap()).collect();
    assert!(stats[0].stall_probes >= 1, "{:?}", stats[0]);
    for s in &stats {
        assert_eq!(s.retransmissions, 0, "{s:?}");
        assert_eq!(s.fast_retransmissions, 0, "{s:?}");
        assert_eq!(s.resent(), s.stall_probes + s.rechecks, "{s:?}");
    }
}

/// A dead worker: the others give up, and the switch's Pending answers told them which rank
/// never contributed.
#[test]
fn giving_up_names_the_ranks_the_switch_was_missing() {
    let (_, outcomes) = run(
        3,
        32,
        rto(),
        Duration::from_millis(200),
        |_, _| false,
        &[2],
        false,
    );
    for (rank, o) in outcomes.iter().take(2).enumerate() {
        match o {
            Some(Err(e @ StreamError::GaveUp { missing, .. })) => {
                assert_eq!(missing.as_deref(), Some(&[2u8][..]), "rank {rank}: {e}");
                assert!(e.to_string().contains("missing ranks 2 "), "{e}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
}

/// With no answer at all from the switch, nothing is known of the other ranks, and the
/// error says so.
#[test]
fn giving_up_without_answers_says_the_missing_ranks_are_unknown() {
    let (_, outcomes) = run(
        2,
        8,
        rto(),
        Duration::from_millis(200),
        |_, _| false,
        &[],
        true,
    );
    for o in &outcomes {
        match o {
            Some(Err(e @ StreamError::GaveUp { missing: None, .. })) => {
                assert!(e.to_string().contains("missing ranks unknown"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}
