//! A lost packet is retransmitted as soon as results of later packets show it lost, or as soon
//! as the stream stalls, without waiting for its timer; without loss nothing is retransmitted.
#![allow(clippy::unwrap_used)]

// (Each test binary uses part of the shared harness.)
#[allow(dead_code)]
mod common;
use common::seq_of;

use common::{Net, Outcome};
use ina_proto::rtt::RtoConfig;
use ina_proto::stream::{StreamError, StreamStats};
use std::time::Duration;

/// Runs `workers` int32 streams with the switch model in rounds of virtual time, dropping the
/// data packets `drop` says to drop.
fn run(
    workers: u8,
    packets: usize,
    window: u16,
    drop: impl FnMut(usize, &[u8]) -> bool,
) -> (Vec<Vec<i32>>, Vec<Option<StreamStats>>) {
    let (tensors, outcomes) = run_raw(workers, packets, window, 3, drop);
    let stats = outcomes
        .into_iter()
        .map(|o| o.map(|r| r.unwrap_or_else(|e| panic!("{e}"))))
        .collect();
    (tensors, stats)
}

/// [`run`], with each stream's outcome as it is.
fn run_raw(
    workers: u8,
    packets: usize,
    window: u16,
    max_retries: u32,
    drop: impl FnMut(usize, &[u8]) -> bool,
) -> (Vec<Vec<i32>>, Vec<Outcome>) {
    let (tensors, outcomes, _) = run_timed(
        workers,
        packets,
        window,
        max_retries,
        RtoConfig::default(),
        drop,
    );
    (tensors, outcomes)
}

/// [`run_raw`] with timeouts `rto`; also returns the virtual time at which every stream had
/// its outcome.
fn run_timed(
    workers: u8,
    packets: usize,
    window: u16,
    max_retries: u32,
    rto: RtoConfig,
    drop: impl FnMut(usize, &[u8]) -> bool,
) -> (Vec<Vec<i32>>, Vec<Outcome>, Duration) {
    let net = Net {
        workers,
        packets,
        window,
        max_retries,
        give_up: Duration::from_secs(1),
        rto,
        rounds: ROUNDS,
        gap_reports: false,
    };
    let ran = common::run(&net, |_, _| false, &[], drop);
    (ran.tensors, ran.outcomes, ran.finished)
}

/// Rounds the harness runs at most (of [`common::ROUND`] each, about a round trip: answers to
/// one round's packets arrive in the next). Timers are at least 500 µs: 10 rounds.
const ROUNDS: usize = 2_000;

#[test]
fn a_lost_data_packet_is_repaired_without_its_timer() {
    let mut dropped = false;
    let (tensors, outcomes) = run(2, 64, 16, |rank, p| {
        // Rank 1's first data packet (position = window = 16) is lost once.
        if rank == 1 && !dropped && seq_of(p) == 16 {
            dropped = true;
            return true;
        }
        false
    });
    assert!(dropped);
    for (r, o) in outcomes.iter().enumerate() {
        let stats = o.unwrap_or_else(|| panic!("rank {r} stalled: the loss waited for a timer"));
        assert_eq!(stats.results, 64);
        if r == 1 {
            assert_eq!(stats.fast_retransmissions, 1, "{stats:?}");
            assert_eq!(stats.retransmissions, 1, "{stats:?}");
        }
    }
    for (i, (a, b)) in tensors[0].iter().zip(&tensors[1]).enumerate() {
        assert_eq!(*a, i as i32 * 3);
        assert_eq!(a, b);
    }
}

#[test]
fn a_loss_in_a_small_window_mid_stream_is_repaired() {
    // Rank 0's packet for position 20 does not reach the switch on the first try, so nobody
    // gets that result; both see later results, rank 0 retransmits, the slot completes.
    let mut dropped = false;
    let (_, outcomes) = run(2, 40, 8, |rank, p| {
        if rank == 0 && !dropped && seq_of(p) == 20 {
            dropped = true;
            return true;
        }
        false
    });
    assert!(dropped);
    assert!(outcomes.iter().all(Option::is_some), "{outcomes:?}");
}

#[test]
fn without_loss_nothing_is_retransmitted() {
    let (_, outcomes) = run(3, 200, 16, |_, _| false);
    for o in outcomes {
        let stats = o.unwrap();
        assert_eq!(stats.retransmissions, 0, "{stats:?}");
        assert_eq!(stats.fast_retransmissions, 0, "{stats:?}");
        assert_eq!(stats.stall_probes, 0, "{stats:?}");
    }
}

/// The worker library's timeouts: at least 10 ms.
fn library_rto() -> RtoConfig {
    RtoConfig {
        min: Duration::from_millis(10),
        ..RtoConfig::default()
    }
}

/// Two workers, 64 packets (positions 16 to 79) in a window of 16, the library's timeouts:
/// every transmission of rank 1's packet at `position` is lost until `times` of them were.
/// Both streams must finish with the same sums; returns rank 1's statistics and when every
/// stream had finished.
fn lose_rank1(position: u32, times: usize) -> (StreamStats, Duration) {
    let mut drops = 0;
    let (tensors, outcomes, took) = run_timed(2, 64, 16, 5, library_rto(), |rank, p| {
        if rank == 1 && drops < times && seq_of(p) == position {
            drops += 1;
            return true;
        }
        false
    });
    assert_eq!(drops, times, "position {position}");
    let stats = match &outcomes[1] {
        Some(Ok(s)) => *s,
        other => panic!("position {position}: rank 1 {other:?}"),
    };
    assert!(matches!(outcomes[0], Some(Ok(_))), "{outcomes:?}");
    assert_eq!(tensors[0], tensors[1]);
    (stats, took)
}

#[test]
fn a_loss_among_the_last_packets_is_probed_for_without_its_timer() {
    // Each of the last four packets of rank 1 is lost once in turn (a separate run each): no
    // later transmission can show it lost, and its timer would wait 10 ms. The stall probe
    // sends it again after two round trips. (Positions 16 to 80: the descriptor and 64 data
    // packets.)
    let (_, _, lossless) = run_timed(2, 64, 16, 5, library_rto(), |_, _| false);
    for last in 77..81 {
        let (stats, took) = lose_rank1(last, 1);
        assert!(stats.stall_probes >= 1, "position {last}: {stats:?}");
        assert!(
            took < lossless + Duration::from_millis(2),
            "position {last}: {took:?} against {lossless:?} without loss"
        );
    }
}

#[test]
fn a_lost_repair_that_holds_up_the_last_packets_is_probed_for() {
    // Rank 1's packet at position 62 (slot 14) is lost, and so is its repair. By then every
    // other slot has finished: nothing more is answered that could show the repair lost, and
    // position 78, slot 14's next use, cannot go before 62 completes. Not every packet has
    // been sent, yet the stream has stalled.
    let (stats, took) = lose_rank1(62, 2);
    assert!(stats.stall_probes >= 1, "{stats:?}");
    assert!(took < Duration::from_millis(10), "{took:?}");
}

#[test]
fn a_stall_probe_lost_again_is_probed_again() {
    // Rank 1's last packet is lost three times: the original and two probes. Probe rounds
    // come ever further apart, but still well before the 10 ms timer.
    let (stats, took) = lose_rank1(79, 3);
    assert_eq!(stats.stall_probes, 3, "{stats:?}");
    assert!(took < Duration::from_millis(10), "{took:?}");
}

#[test]
fn a_retransmission_lost_again_is_detected_like_the_first() {
    // Rank 1's packet at position 16 is lost twice: the original and its first
    // retransmission. Answers to packets sent after the retransmission show it lost too.
    let mut drops = 0;
    let (tensors, outcomes) = run(2, 64, 16, |rank, p| {
        if rank == 1 && drops < 2 && seq_of(p) == 16 {
            drops += 1;
            return true;
        }
        false
    });
    assert_eq!(drops, 2);
    let stats = outcomes[1].unwrap_or_else(|| panic!("rank 1 stalled: waited for a timer"));
    assert_eq!(stats.retransmissions, 2, "{stats:?}");
    assert_eq!(stats.fast_retransmissions, 2, "{stats:?}");
    assert!(outcomes[0].is_some());
    assert_eq!(tensors[0], tensors[1]);
}

#[test]
fn a_slot_waiting_for_a_repair_holds_back_only_itself() {
    // Rank 0's packet at position 16 (slot 0) is lost, and so is its first retransmission.
    // Until the second one gets through, rank 0 keeps using the other slots, beyond position
    // 32 (slot 0's second use), which must wait for slot 0's first use to complete.
    let window = 16;
    let mut lost = 0;
    let mut repaired = false;
    let mut while_waiting = Vec::new();
    let mut slot0 = Vec::new();
    let (tensors, outcomes) = run(2, 96, window, |rank, p| {
        if rank != 0 {
            return false;
        }
        let seq = seq_of(p);
        if seq.is_multiple_of(u32::from(window)) {
            slot0.push(seq);
        }
        if seq == 16 {
            if lost < 2 {
                lost += 1;
                return true;
            }
            repaired = true;
        } else if lost > 0 && !repaired {
            while_waiting.push(seq);
        }
        false
    });
    assert_eq!(lost, 2);
    assert!(repaired);
    assert!(
        while_waiting.iter().any(|&s| s > 32),
        "rank 0 stopped at the stalled slot: {while_waiting:?}"
    );
    assert!(
        !while_waiting.contains(&32),
        "slot 0's second use went before its first completed: {while_waiting:?}"
    );
    // Slot 0's uses went in order; a use may be sent again while it waits for rank 1.
    assert_eq!(&slot0[..3], &[16, 16, 16]);
    slot0.dedup();
    // (The descriptor and 96 data packets: positions 16 to 112.)
    assert_eq!(slot0, vec![16, 32, 48, 64, 80, 96, 112]);
    assert!(outcomes.iter().all(Option::is_some), "{outcomes:?}");
    assert_eq!(tensors[0], tensors[1]);
}

#[test]
fn copies_of_a_packet_waiting_for_another_workers_repair_are_spaced_out() {
    // Every transmission of rank 1's packet at position 16 is lost until rank 0 has sent 300
    // packets (about 20 rounds, a millisecond). Rank 0's own packet for that slot arrived, but
    // rank 0 cannot tell: it sends copies, ever further apart, not one per round trip.
    let mut rank0_sent = 0;
    let mut rank0_copies = 0;
    let (tensors, outcomes) = run_raw(2, 400, 16, 30, |rank, p| {
        let seq = seq_of(p);
        if rank == 0 {
            rank0_sent += 1;
            rank0_copies += usize::from(seq == 16);
            return false;
        }
        seq == 16 && rank0_sent < 300
    });
    assert!(rank0_sent >= 300);
    assert!(rank0_copies <= 6, "{rank0_copies} copies");
    assert!(
        outcomes.iter().all(|o| matches!(o, Some(Ok(_)))),
        "{outcomes:?}"
    );
    assert_eq!(tensors[0], tensors[1]);
}

#[test]
fn detected_losses_respect_the_retry_limit() {
    // With one retransmission allowed, the second detected loss fails the stream.
    let mut lost = 0;
    let (_, outcomes) = run_raw(2, 200, 16, 1, |rank, p| {
        if rank == 1 && seq_of(p) == 16 {
            lost += 1;
            return true;
        }
        false
    });
    assert_eq!(lost, 2, "the original and one retransmission");
    match &outcomes[1] {
        Some(Err(StreamError::GaveUp { seq, retries, .. })) => {
            assert_eq!((*seq, *retries), (16, 1));
        }
        other => panic!("rank 1: {other:?}"),
    }
}

#[test]
fn workers_whose_data_the_switch_holds_ask_with_queries_instead_of_resending() {
    // Rank 3's packet at position 20 is lost three times: the slot stays incomplete while the
    // other ranks see later results. Their first retransmission is the data (answered with
    // Pending, their bit set); every later one is a 16-byte Query.
    const POSITION: u32 = 20;
    let mut lost = 0;
    let mut data_copies = [0usize; 4];
    let mut queries = [0usize; 4];
    let (tensors, outcomes) = run(4, 48, 8, |rank, p| {
        if seq_of(p) == POSITION {
            match p[0] & 0x0f {
                1 => data_copies[rank] += 1,
                7 => queries[rank] += 1,
                other => panic!("rank {rank} sent type {other}"),
            }
            if rank == 3 && p[0] & 0x0f == 1 && lost < 3 {
                lost += 1;
                return true;
            }
        }
        false
    });
    assert_eq!(lost, 3);
    for rank in 0..3 {
        let stats = outcomes[rank].unwrap();
        assert_eq!(
            data_copies[rank], 2,
            "rank {rank}: data resent more than once"
        );
        assert!(queries[rank] >= 1, "rank {rank} never queried: {stats:?}");
        assert_eq!(stats.queries as usize, queries[rank]);
        assert!(stats.pending_answers >= 1, "{stats:?}");
    }
    assert_eq!(
        queries[3], 0,
        "rank 3's data never arrived; it has nothing to query for"
    );
    assert_eq!(data_copies[3], 4);
    for t in &tensors[1..] {
        assert_eq!(t, &tensors[0]);
    }
    for (i, v) in tensors[0].iter().enumerate() {
        assert_eq!(*v, i as i32 * 10);
    }
}

/// A switch slow to answer (its queue holds the Pending answers and Missing reports for 100
/// rounds): the last data packet of rank 0 is lost three times, rank 0 then asks with Queries many more times than
/// `max_retries` before the first Pending answer says the switch lacks its data, and its data,
/// sent again then, still completes the use. Queries are cheap: they do not spend the
/// retransmissions of the data.
#[test]
fn queries_to_a_slow_switch_do_not_spend_the_data_retransmissions() {
    let net = common::Net {
        workers: 2,
        packets: 128,
        window: 64,
        max_retries: 5,
        give_up: Duration::from_secs(1),
        rto: RtoConfig::default(),
        rounds: ROUNDS,
        gap_reports: true,
    };
    let last = 64 + 127;
    let mut dropped = 0;
    let mut queries = 0;
    let ran = common::run_delayed(
        &net,
        |_, _| false,
        &[],
        |rank, p| {
            if rank == 0 && seq_of(p) == last {
                if common::kind_of(p) == 7 {
                    queries += 1;
                } else if dropped < 3 {
                    dropped += 1;
                    return true;
                }
            }
            false
        },
        |_, _| false,
        |rank, p| usize::from(rank == 0 && matches!(common::kind_of(p), 6 | 8)) * 100,
    );
    assert_eq!(dropped, 3);
    assert!(
        queries > 5,
        "{queries} queries: the case needs more than max_retries"
    );
    for (r, o) in ran.outcomes.iter().enumerate() {
        match o {
            Some(Ok(stats)) => assert_eq!(stats.results, 128, "rank {r}"),
            other => panic!("rank {r}: {other:?}"),
        }
    }
    assert_eq!(ran.tensors[0], ran.tensors[1]);
}
