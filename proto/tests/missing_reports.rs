//! Loss recovery with the switch's Missing reports: the worker whose data was lost resends
//! it when the switch reports the gap; the others only ask, and never resend data the switch
//! holds.
#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
mod common;
use common::{kind_of, seq_of};

use common::Net;
use ina_proto::rtt::RtoConfig;
use ina_proto::stream::StreamStats;
use std::collections::HashSet;
use std::time::Duration;

fn net(workers: u8, packets: usize, gap_reports: bool) -> Net {
    Net {
        workers,
        packets,
        window: 64,
        max_retries: 50,
        give_up: Duration::from_secs(1),
        rto: RtoConfig::default(),
        rounds: 4_000,
        gap_reports,
    }
}

/// Every rank's tensor holds the exact sum of the run's ranks (element `i` of rank `w` is
/// `i * (w + 1)`); returns each stream's statistics.
fn exact_and_finished(ran: common::Ran) -> Vec<StreamStats> {
    let ranks = ran.tensors.len() as i32;
    let sum_of_factors = ranks * (ranks + 1) / 2;
    for (r, t) in ran.tensors.iter().enumerate() {
        for (i, x) in t.iter().enumerate() {
            assert_eq!(*x, i as i32 * sum_of_factors, "rank {r} element {i}");
        }
    }
    ran.outcomes
        .into_iter()
        .map(|o| o.unwrap().unwrap())
        .collect()
}

/// Runs three ranks of 640 packets; rank 1 loses the first transmission of every 10th packet.
/// Returns each stream's statistics and the number of packets lost.
fn rank_1_loses_every_tenth(gap_reports: bool) -> (Vec<StreamStats>, u64) {
    let mut dropped = HashSet::new();
    let ran = common::run(
        &net(3, 640, gap_reports),
        |_, _| false,
        &[],
        |rank, p| {
            let data = kind_of(p) == 1 && p.len() > 16;
            // (Only the first transmission: a copy of a lost packet finds `s` in the set.)
            let s = seq_of(p);
            rank == 1 && data && s % 10 == 3 && dropped.insert(s)
        },
    );
    (exact_and_finished(ran), dropped.len() as u64)
}

/// The switch reports each of rank 1's losses to rank 1, which resends exactly those; ranks 0
/// and 2 resend no data at all, and ask about few of the uses that wait for rank 1.
#[test]
fn only_the_worker_whose_data_was_lost_resends_it() {
    let (stats, lost) = rank_1_loses_every_tenth(true);
    assert!(lost >= 60, "{lost}");
    // The reports named the losses (a loss in a block's last position, or with no later first
    // transmission to its block, is found by a Query instead).
    assert!(stats[1].resent_reported >= lost * 9 / 10, "{:?}", stats[1]);
    // Rank 1 sent exactly its lost packets' data again (the rest were Queries), plus a second
    // copy of those sent again in the stream's last window.
    let s1 = &stats[1];
    assert_eq!(s1.resent() - s1.queries - s1.tail_copies, lost, "{s1:?}");
    assert!(s1.tail_copies <= lost, "{s1:?}");
    for r in [0, 2] {
        let s = &stats[r];
        assert_eq!(s.resent_reported + s.resent_missing, 0, "rank {r}: {s:?}");
        // What they sent again were Queries, but for at most the stream's last packet, whose
        // loss no later transmission could reveal (it goes as data at once).
        assert!(s.resent() - s.queries <= 1, "rank {r}: {s:?}");
        // Mid-stream they wait a repair's time before asking, and rank 1's repair comes
        // first: only the last window's packets, asked about at once, cost them Queries.
        assert!(s.queries <= lost / 4, "rank {r}: {s:?}");
        assert_eq!(s.missing_reports, 0, "rank {r}: {s:?}");
    }
}

/// The same losses without reports: every worker repairs by resending data, as before.
#[test]
fn without_reports_every_worker_resends_data() {
    let (stats, _) = rank_1_loses_every_tenth(false);
    assert_eq!(stats[1].missing_reports, 0, "{:?}", stats[1]);
    assert!(stats[0].resent() > stats[0].queries, "{:?}", stats[0]);
}

/// Rank 1's data for one use mid-stream is lost `times` times in a row (its first
/// transmission and then every copy); returns when the streams finished.
fn delay_of_a_repair_lost(times: usize) -> Duration {
    repair_of(200, times).0
}

/// A repair that is lost again and again is attempted again at round-trip pace: each further
/// loss costs a Query's round trip and the data's, a few rounds, not a timer backed off per
/// attempt (spaced by the retransmission timeout doubled per retry, each further loss cost
/// more than twice as much here).
#[test]
fn a_repair_lost_again_and_again_is_not_backed_off() {
    let lossless = common::run(&net(3, 640, true), |_, _| false, &[], |_, _| false).finished;
    let once = delay_of_a_repair_lost(1);
    let six = delay_of_a_repair_lost(6);
    let cost = |t: Duration| t.saturating_sub(lossless);
    // Each further loss costs about a Query's round trip and a data packet's: a few rounds.
    let per_loss = (cost(six).saturating_sub(cost(once))) / 5;
    assert!(
        per_loss <= common::ROUND * 6,
        "each further loss of the repair cost {per_loss:?} (one loss: {:?}, six: {:?})",
        cost(once),
        cost(six)
    );
    assert!(cost(six) > cost(once), "{:?} {:?}", cost(six), cost(once));
}

/// Rank 1's data for the use at `index` is lost `times` times in a row (its first
/// transmission and then every copy); returns when the streams finished and rank 1's
/// statistics.
fn repair_of(index: u32, times: usize) -> (Duration, StreamStats) {
    let mut lost = 0;
    let ran = common::run(
        &net(3, 640, true),
        |_, _| false,
        &[],
        |rank, p| {
            let data = kind_of(p) == 1 && p.len() > 16;
            let hit = rank == 1 && data && seq_of(p) == 64 + index && lost < times;
            lost += usize::from(hit);
            hit
        },
    );
    assert_eq!(lost, times, "the repair was not attempted {times} times");
    let finished = ran.finished;
    let stats = exact_and_finished(ran);
    (finished, stats[1])
}

/// In the stream's last window, where the stream's end waits for every repair, data sent
/// again goes twice: a repair lost once more costs nothing, where mid-stream it costs a
/// Query's round trip and the data's again.
#[test]
fn a_repair_in_the_last_window_goes_twice() {
    let (once, stats) = repair_of(600, 1);
    assert_eq!(stats.tail_copies, 1, "{stats:?}");
    let (twice, stats) = repair_of(600, 2);
    assert_eq!(stats.tail_copies, 1, "{stats:?}");
    assert_eq!(once, twice, "the second copy of the repair was not used");
    // Mid-stream, a repair goes once.
    let (_, stats) = repair_of(200, 1);
    assert_eq!(stats.tail_copies, 0, "{stats:?}");
}

/// Runs three ranks of 640 packets; rank 2 loses, on their way down, the results for which
/// `result` holds whose seq is 5 modulo 10 (the first copy only). Returns each stream's
/// statistics and the number of results lost.
fn rank_2_loses_every_tenth_result(
    gap_reports: bool,
    result: impl Fn(&[u8]) -> bool,
) -> (Vec<StreamStats>, u64) {
    let mut lost = HashSet::new();
    let ran = common::run_both_ways(
        &net(3, 640, gap_reports),
        |_, _| false,
        &[],
        |_, _| false,
        |rank, p| rank == 2 && result(p) && seq_of(p) % 10 == 5 && lost.insert(seq_of(p)),
    );
    (exact_and_finished(ran), lost.len() as u64)
}

/// Rank 2 loses every tenth multicast result on its way down (the copy that carries a gap
/// counter). The next result to the same block shows the skip: rank 2 reports the counter,
/// and the switch sends its stored copy. The sums are exact, rank 2 asks the switch about few
/// of them (a status Query answered "complete"), and the other ranks report nothing.
#[test]
fn a_lost_result_is_reported_by_its_gap_counter_and_sent_again() {
    let counted_result = |p: &[u8]| kind_of(p) == 2 && p[1] & 0b10 != 0;
    let (stats, lost) = rank_2_loses_every_tenth_result(true, counted_result);
    assert!(lost >= 60, "{lost}");
    let s2 = &stats[2];
    // Each loss is reported once, unless no later result to its block came before the
    // stream's end asked about it.
    assert!(
        s2.results_reported >= lost * 9 / 10 && s2.results_reported <= lost,
        "{lost} lost: {s2:?}"
    );
    assert!(s2.completions_seen <= lost / 10, "{lost} lost: {s2:?}");
    for r in [0, 1] {
        assert_eq!(stats[r].results_reported, 0, "rank {r}: {:?}", stats[r]);
    }
}

/// Without the switch's reports, results carry no counters and nothing is reported: a lost
/// result is found by the worker's Queries, as before.
#[test]
fn without_reports_lost_results_are_asked_about() {
    let full_result = |p: &[u8]| kind_of(p) == 2 && p.len() > 16;
    let (stats, lost) = rank_2_loses_every_tenth_result(false, full_result);
    assert!(lost >= 60, "{lost}");
    assert_eq!(stats[2].results_reported, 0, "{:?}", stats[2]);
    assert!(stats[2].resent() >= lost / 2, "{:?}", stats[2]);
}

/// Runs two ranks of 640 packets through a window of one block (64 slots). Rank 1 loses the
/// first transmission of the packet with seq `lost`, and the switch's reports to rank 1 come
/// back `late` rounds late: by then rank 1 has sent the block's next 64 packets, and a
/// newer packet carries the lost one's gap counter. Returns rank 1's statistics and the
/// seqs whose data rank 1 sent again, with the round after the loss in which each went.
fn report_of_a_loss_arriving_late(lost: u32, late: usize) -> (StreamStats, Vec<(u32, usize)>) {
    let mut resent = Vec::new();
    let mut lost_in = None;
    let round = std::cell::Cell::new(0);
    let ran = common::run_delayed(
        &net(2, 640, true),
        |rank, r| {
            if rank == 0 {
                round.set(r);
            }
            false
        },
        &[],
        |rank, p| {
            let data = kind_of(p) == 1 && p.len() > 16;
            let first = p[1] & 0b10 != 0;
            if rank == 1 && data && !first {
                resent.push((seq_of(p), round.get() - lost_in.unwrap_or(0)));
            }
            let hit = rank == 1 && data && first && seq_of(p) == lost && lost_in.is_none();
            if hit {
                lost_in = Some(round.get());
            }
            hit
        },
        |_, _| false,
        |rank, p| {
            if rank == 1 && kind_of(p) == 8 {
                late
            } else {
                0
            }
        },
    );
    assert!(lost_in.is_some(), "seq {lost} was never sent");
    let stats = exact_and_finished(ran);
    (stats[1], resent)
}

/// A report names the packet that was lost: its data goes again the round after the loss,
/// and nothing else does.
#[test]
fn a_report_names_the_packet_that_was_lost() {
    let lost = 64 * 3 + 10;
    let (stats, resent) = report_of_a_loss_arriving_late(lost, 0);
    assert_eq!(resent, vec![(lost, 1)], "{stats:?}");
}
