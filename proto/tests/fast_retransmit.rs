//! A lost packet is retransmitted as soon as results of later packets show it lost, without
//! waiting for its timer; without loss nothing is retransmitted.
#![allow(clippy::unwrap_used)]

use ina_proto::pipeline::{JobConfig, Pipeline, PipelineConfig, PortId, Verdict};
use ina_proto::rtt::{RtoConfig, RttEstimator};
use ina_proto::session::{Lane, Stream, StreamConfig, StreamStats, Tensor};
use ina_proto::Instant;
use std::time::Duration;

/// Runs `workers` int32 streams back to back with the switch model, at a frozen clock (no
/// timer ever fires), dropping the data packets `drop` says to drop.
fn run(
    workers: u8,
    packets: usize,
    window: u16,
    mut drop: impl FnMut(usize, &[u8]) -> bool,
) -> (Vec<Vec<i32>>, Vec<Option<StreamStats>>) {
    let elems = 4u16;
    let mut pipe = Pipeline::new(PipelineConfig {
        pool_slots: 64,
        max_elems: 64,
    });
    pipe.add_job(JobConfig {
        job: 1,
        epoch: 2,
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
                Stream::new(
                    StreamConfig {
                        job: 1,
                        epoch: 2,
                        rank: r as u8,
                        workers,
                        elems_per_packet: elems,
                        lane: Lane::new(0, window),
                        max_retries: 3,
                        give_up: Duration::from_secs(1),
                    },
                    Tensor::I32(t),
                    RttEstimator::new(RtoConfig::default()),
                )
                .unwrap()
            })
            .collect();
        let now = Instant::ZERO;
        let mut buf = vec![0u8; 2048];
        let mut out = vec![0u8; 2048];
        for _round in 0..10_000 {
            let mut sent = false;
            for r in 0..streams.len() {
                while let Some(n) = streams[r].poll_transmit(now, &mut buf).unwrap() {
                    sent = true;
                    if drop(r, &buf[..n]) {
                        continue;
                    }
                    match pipe.process(PortId(r as u16), &buf[..n], now, &mut out) {
                        Verdict::Multicast { ports, len } => {
                            for p in ports.iter().copied() {
                                streams[usize::from(p.0)].handle_datagram(now, &out[..len]);
                            }
                        }
                        Verdict::Unicast { port, len } => {
                            streams[usize::from(port.0)].handle_datagram(now, &out[..len]);
                        }
                        Verdict::Absorbed | Verdict::Drop(_) => {}
                    }
                }
            }
            if !sent {
                break;
            }
        }
        for s in &streams {
            outcomes.push(s.poll_outcome().map(|o| o.unwrap()).map(|_| s.stats()));
        }
    }
    (tensors, outcomes)
}

fn seq_of(packet: &[u8]) -> u32 {
    u32::from_be_bytes([packet[12], packet[13], packet[14], packet[15]])
}

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
    }
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
    // Every transmission of rank 1's packet at position 16 (slot 0) is lost until rank 0 has
    // sent position 64. Meanwhile both keep using the other slots, several uses ahead of
    // slot 0, which stays at its first use; then the repair completes everything.
    let window = 16;
    let mut lost = 0;
    let mut rank0_max = 0;
    let mut rank0_slot0 = Vec::new();
    let (tensors, outcomes) = run(2, 96, window, |rank, p| {
        let seq = seq_of(p);
        if rank == 0 {
            rank0_max = rank0_max.max(seq);
            if seq % u32::from(window) == 0 {
                rank0_slot0.push(seq);
            }
        }
        if rank == 1 && seq == 16 && rank0_max < 64 {
            lost += 1;
            return true;
        }
        false
    });
    assert!(lost >= 2, "{lost}");
    assert!(rank0_max >= 64);
    // Slot 0's uses went in order (a use may be sent again while it waits for rank 1), and
    // none before the first one completed.
    let mut uses: Vec<u32> = rank0_slot0.iter().copied().filter(|s| *s != 16).collect();
    uses.dedup();
    assert_eq!(uses, vec![32, 48, 64, 80, 96]);
    let first_32 = rank0_slot0.iter().position(|s| *s == 32).unwrap();
    assert!(rank0_slot0[first_32..].iter().all(|s| *s != 16));
    assert!(outcomes.iter().all(Option::is_some), "{outcomes:?}");
    assert_eq!(tensors[0], tensors[1]);
}
