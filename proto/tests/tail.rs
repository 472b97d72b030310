//! The stream's end: losses there are found within about a round trip of the empty path,
//! not after a timeout, because the job's end waits for every one of them. Three int32
//! streams through the switch model, with Missing reports, over links of fixed latency in
//! continuous virtual time (events at the nanosecond), so that the time a loss costs can be
//! measured against the round trip.
#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
mod common;
use common::{kind_of, seq_of};

use common::Net;
use ina_proto::pipeline::{PortId, Verdict};
use ina_proto::rtt::RtoConfig;
use ina_proto::stream::StreamStats;
use ina_proto::Instant;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// One-way latency of every link.
const LATENCY: Duration = Duration::from_micros(5);
/// Time between two packets a worker sends.
const GAP: Duration = Duration::from_nanos(100);
const PACKETS: usize = 640;
const WINDOW: u16 = 64;

/// Three ranks, one block of 64 slots, and a host clock of `granularity`.
fn net(granularity: Duration) -> Net {
    Net {
        workers: 3,
        packets: PACKETS,
        window: WINDOW,
        max_retries: 50,
        give_up: Duration::from_secs(1),
        rto: RtoConfig {
            granularity,
            ..RtoConfig::default()
        },
        rounds: 0,
        gap_reports: true,
    }
}

/// The library's default clock granularity (a host's timers), 100 µs: ten round trips here.
const HOST: Duration = Duration::from_micros(100);
/// A clock finer than the round trip (a polling worker's).
const FINE: Duration = Duration::from_micros(1);

/// Which way a packet travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Up,
    Down,
}

/// A packet on its way: (arrival, order of sending, rank, whether up to the switch, bytes).
type Event = (Instant, u64, usize, bool, Vec<u8>);

struct Ran {
    finished: Duration,
    stats: Vec<StreamStats>,
}

/// Runs the streams; `drop(rank, way, packet)` loses a packet on rank's link. Every rank
/// ends with the exact sum.
fn run(net: &Net, mut drop: impl FnMut(usize, Way, &[u8]) -> bool) -> Ran {
    let mut pipe = common::pipeline(net);
    let mut tensors = common::inputs(net);
    let mut finished = Duration::ZERO;
    let mut stats = Vec::new();
    {
        let mut streams = common::streams(net, &mut tensors);
        let mut events: BinaryHeap<Reverse<Event>> = BinaryHeap::new();
        let mut order = 0u64;
        let mut next_send = vec![Instant::ZERO; usize::from(net.workers)];
        let (mut buf, mut out) = (vec![0u8; 2048], vec![0u8; 2048]);
        let mut now = Instant::ZERO;
        for _ in 0..1_000_000 {
            // Every worker sends what it may, one packet per GAP.
            for (r, s) in streams.iter_mut().enumerate() {
                let mut at = next_send[r].max(now);
                while let Some(n) = s.poll_transmit(at, &mut buf).unwrap() {
                    if !drop(r, Way::Up, &buf[..n]) {
                        order += 1;
                        events.push(Reverse((at + LATENCY, order, r, true, buf[..n].to_vec())));
                    }
                    at = at + GAP;
                }
                next_send[r] = at;
            }
            if streams.iter().all(|s| s.poll_outcome().is_some()) {
                finished = now - Instant::ZERO;
                break;
            }
            let timer = streams.iter_mut().filter_map(|s| s.poll_timeout()).min();
            let arrival = events.peek().map(|Reverse(e)| e.0);
            let Some(t) = [timer, arrival].into_iter().flatten().min() else {
                panic!("nothing left to happen and the streams have not ended");
            };
            now = now.max(t);
            while let Some(Reverse((at, _, r, up, bytes))) = events.peek().cloned() {
                if at > now {
                    break;
                }
                events.pop();
                if !up {
                    streams[r].handle_datagram(now, &bytes);
                    continue;
                }
                let mut deliver = |port: usize, bytes: &[u8], events: &mut BinaryHeap<_>| {
                    if !drop(port, Way::Down, bytes) {
                        order += 1;
                        events.push(Reverse((now + LATENCY, order, port, false, bytes.to_vec())));
                    }
                };
                match pipe.process(PortId(r as u16), &bytes, now, &mut out) {
                    Verdict::Multicast { ports, len } => {
                        let ports: Vec<usize> = ports.iter().map(|p| usize::from(p.0)).collect();
                        let answer = out[..len].to_vec();
                        for p in ports {
                            deliver(p, &answer, &mut events);
                        }
                    }
                    Verdict::Unicast { port, len } => {
                        let answer = out[..len].to_vec();
                        deliver(usize::from(port.0), &answer, &mut events);
                    }
                    Verdict::Absorbed | Verdict::Drop(_) => {}
                }
                if let Some(report) = pipe.poll_report() {
                    let header = report.header.to_vec();
                    deliver(usize::from(report.port.0), &header, &mut events);
                }
            }
            for s in streams.iter_mut() {
                if s.poll_timeout().is_some_and(|t| t <= now) {
                    s.handle_timeout(now);
                }
            }
        }
        assert!(finished > Duration::ZERO, "the streams did not end");
        for s in &streams {
            stats.push(s.poll_outcome().unwrap().unwrap());
        }
    }
    for (r, t) in tensors.iter().enumerate() {
        for (i, x) in t.iter().enumerate() {
            assert_eq!(*x, i as i32 * 6, "rank {r} element {i}");
        }
    }
    Ran { finished, stats }
}

/// Sequence number of stream index `i` (a fresh lane starts at position `WINDOW`).
fn seq(i: u32) -> u32 {
    u32::from(WINDOW) + i
}

fn lossless(net: &Net) -> Duration {
    run(net, |_, _, _| false).finished
}

/// The result of one of the last packets, lost on the way to rank 0, is found missing when
/// a later packet's result has come and the round trip has passed (RACK, RFC 8985), not by
/// the result timeout (twice the smoothed round trip and at least the host's clock
/// granularity, 100 µs here) that was all the stream's end had: three later answers, which
/// loss detection by order needs, do not exist there.
#[test]
fn a_result_lost_at_the_end_costs_about_a_round_trip() {
    let net = net(HOST);
    let base = lossless(&net);
    let rtt = LATENCY * 2;
    let mut hit = false;
    let lost = run(&net, |rank, way, p| {
        let chosen = rank == 0 && way == Way::Down && kind_of(p) == 2 && p.len() > 16;
        let drop = chosen && seq_of(p) == seq(PACKETS as u32 - 2) && !hit;
        hit |= drop;
        drop
    });
    assert!(hit, "the result was never sent");
    let cost = lost.finished.saturating_sub(base);
    assert!(
        cost <= rtt * 3,
        "a lost result at the end cost {cost:?} (round trip {rtt:?}; {:?})",
        lost.stats[0]
    );
}

/// With a clock finer than the round trip, a repair lost at the stream's end is asked about
/// again after the path's round trip (the smallest answer to a lone retransmission, or of a
/// result before there is one), not after a timeout inflated by the queueing of the
/// stream's middle.
#[test]
fn a_query_lost_at_the_end_is_asked_again_after_a_round_trip() {
    let net = net(FINE);
    let base = lossless(&net);
    let rtt = LATENCY * 2;
    // Rank 1's last data packet is lost, and so is the first repair of it (data or
    // Query): the worker must find out without a timeout.
    let mut lost_data = false;
    let mut lost_repair = false;
    let lost = run(&net, |rank, way, p| {
        if rank != 1 || way != Way::Up || seq_of(p) != seq(PACKETS as u32 - 1) {
            return false;
        }
        if !lost_data {
            lost_data = true;
            return true;
        }
        if !lost_repair {
            lost_repair = true;
            return true;
        }
        false
    });
    assert!(lost_data && lost_repair, "the repair was never sent");
    let cost = lost.finished.saturating_sub(base);
    // The loss, the repair's loss and the repair again: three round trips (with the smoothed
    // timeout of the path, about 1.25 round trips each wait, 50 µs here).
    assert!(
        cost <= rtt * 4,
        "the last packet lost twice cost {cost:?} (round trip {rtt:?}; {:?})",
        lost.stats[1]
    );
}
