//! `ina worker` processes that disagree on what they all-reduce, as a user may start them:
//! each rank stops with an error of kind `mismatch` that names what differs, within its
//! give-up time, and none reports an iteration as a success.
#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
mod common;

use common::*;
use std::time::Duration;

/// Starts a switch with one job of two workers and rank r with `extra[r]` flags; returns each
/// rank's outcome.
fn two_workers(extra: [&[&str]; 2]) -> Vec<Outcome> {
    let addrs = free_udp_addrs(2);
    let job = format!(
        "id=1;slots=0..64;elems=256;workers={},{}",
        addrs[0], addrs[1]
    );
    let mut sw = SwitchProc::start(&["--job", &job]);
    let run = Run::new(2, 100_000, 3);
    let mut procs: Vec<Proc> = (0..2)
        .map(|r| {
            // The run's flags, less those this rank overrides.
            let overridden = |a: &String| {
                extra[r]
                    .iter()
                    .any(|e| e.split('=').next() == a.split('=').next())
            };
            let mut args: Vec<String> = run
                .common(r)
                .into_iter()
                .filter(|a| !overridden(a))
                .collect();
            args.push("--algorithm=ina".into());
            args.push(format!("--switch={}", sw.udp));
            args.push(format!("--bind={}", addrs[r]));
            args.extend(extra[r].iter().map(|a| a.to_string()));
            Proc::spawn(&format!("worker {r}"), &args)
        })
        .collect();
    let outcomes = collect_all(&mut procs, after(Duration::from_secs(60)));
    sw.terminate();
    outcomes
}

/// Every rank stopped with an error of kind `mismatch` before reporting any iteration; the
/// messages of its error lines.
fn assert_every_rank_stopped_on_a_mismatch(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .map(|o| {
            assert_eq!(
                o.error_kind(),
                Some("mismatch"),
                "{}: {:?}\n{}",
                o.name,
                o.end,
                o.stderr
            );
            assert!(
                o.iterations.is_empty(),
                "{}: an iteration was reported",
                o.name
            );
            let End::Error(line) = &o.end else {
                unreachable!()
            };
            line.value["message"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn assert_mismatch_everywhere(outcomes: &[Outcome], says: &str) {
    let messages = assert_every_rank_stopped_on_a_mismatch(outcomes);
    for (o, message) in outcomes.iter().zip(messages) {
        assert!(message.contains(says), "{}: {message}", o.name);
        assert!(
            o.status.is_some_and(|s| !s.success()),
            "{}: {:?}",
            o.name,
            o.status
        );
    }
}

#[test]
fn workers_with_tensors_of_different_lengths_both_stop_naming_it() {
    let outcomes = two_workers([&["--elements=100000"], &["--elements=300000"]]);
    assert_mismatch_everywhere(&outcomes, "different lengths");
}

#[test]
fn workers_that_count_different_totals_both_stop_naming_it() {
    // Rank 1 believes it is one of three workers (as behind a rack switch of a tree).
    let outcomes = two_workers([&[], &["--workers=3", "--switch-rank=1"]]);
    assert_every_rank_stopped_on_a_mismatch(&outcomes);
}
