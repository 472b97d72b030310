//! What a stream reports: stall probes apart from retransmissions, and, when it gives up,
//! which ranks the switch was still waiting for.
#![allow(clippy::unwrap_used)]

use ina_proto::pipeline::{JobConfig, Pipeline, PipelineConfig, PortId, Verdict};
use ina_proto::rtt::{RtoConfig, RttEstimator};
use ina_proto::session::{Lane, Stream, StreamConfig, StreamError, Tensor};
use ina_proto::Instant;
use std::time::Duration;

/// Virtual time of one round: answers to one round's packets arrive in the next.
const ROUND: Duration = Duration::from_micros(50);

type Outcome = Option<Result<ina_proto::session::StreamStats, StreamError>>;

/// Runs `workers` int32 streams of `packets` packets through the switch model. In a round
/// where `asleep(rank, round)` holds, the worker neither reads nor sends (its answers wait
/// for it); a worker in `dead` never sends at all; `drop_all` loses every packet on the way
/// to the switch.
fn run(
    workers: u8,
    packets: usize,
    rto: RtoConfig,
    give_up: Duration,
    asleep: impl Fn(usize, usize) -> bool,
    dead: &[usize],
    drop_all: bool,
) -> (Vec<Vec<i32>>, Vec<Outcome>) {
    let elems = 4u16;
    let window = 8u16;
    let mut pipe = Pipeline::new(PipelineConfig {
        pool_slots: 16,
        max_elems: 16,
    });
    pipe.add_job(JobConfig {
        job: 1,
        epoch: 3,
        slot_base: 0,
        slot_count: window,
        elems_per_packet: elems,
        ranks: (0..workers).map(|r| PortId(u16::from(r))).collect(),
    })
    .unwrap();
    let len = packets * usize::from(elems);
    let mut tensors: Vec<Vec<i32>> = (0..workers)
        .map(|w| (0..len as i32).map(|i| i * (i32::from(w) + 1)).collect())
        .collect();
    let mut outcomes = Vec::new();
    {
        let mut streams: Vec<Stream<'_>> = tensors
            .iter_mut()
            .enumerate()
            .map(|(r, t)| {
                let cfg = StreamConfig {
                    job: 1,
                    epoch: 3,
                    rank: r as u8,
                    workers,
                    elems_per_packet: elems,
                    lane: Lane::new(0, window),
                    max_retries: 1000,
                    give_up,
                };
                Stream::new(cfg, Tensor::I32(t), RttEstimator::new(rto)).unwrap()
            })
            .collect();
        let mut now = Instant::ZERO;
        let (mut buf, mut out) = (vec![0u8; 256], vec![0u8; 256]);
        let mut inbox: Vec<(usize, Vec<u8>)> = Vec::new();
        for round in 0..20_000 {
            now = now + ROUND;
            let mut later = Vec::new();
            for (r, bytes) in std::mem::take(&mut inbox) {
                if asleep(r, round) {
                    later.push((r, bytes));
                } else {
                    streams[r].handle_datagram(now, &bytes);
                }
            }
            inbox = later;
            for (r, s) in streams.iter_mut().enumerate() {
                if !asleep(r, round) && s.poll_timeout().is_some_and(|t| t <= now) {
                    s.handle_timeout(now);
                }
            }
            for (r, stream) in streams.iter_mut().enumerate() {
                if asleep(r, round) || dead.contains(&r) {
                    continue;
                }
                while let Some(n) = stream.poll_transmit(now, &mut buf).unwrap() {
                    if drop_all {
                        continue;
                    }
                    match pipe.process(PortId(r as u16), &buf[..n], now, &mut out) {
                        Verdict::Multicast { ports, len } => {
                            for p in ports.iter().copied() {
                                inbox.push((usize::from(p.0), out[..len].to_vec()));
                            }
                        }
                        Verdict::Unicast { port, len } => {
                            inbox.push((usize::from(port.0), out[..len].to_vec()));
                        }
                        Verdict::Absorbed | Verdict::Drop(_) => {}
                    }
                }
            }
            let live = streams
                .iter()
                .enumerate()
                .filter(|(r, _)| !dead.contains(r));
            if live.clone().all(|(_, s)| s.poll_outcome().is_some()) {
                break;
            }
        }
        for s in &streams {
            outcomes.push(s.poll_outcome().map(|o| o.map(|_| s.stats())));
        }
    }
    (tensors, outcomes)
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
        assert_eq!(s.resent(), s.stall_probes, "{s:?}");
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
