//! The exponent lookahead's headers go twice: a use of the lookahead that lost a worker's
//! first header completes on its second copy, without a repair, and only a header whose two
//! copies were both lost is sent again.
#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
mod common;
use common::{config, pipeline, through_switch, Net, ELEMS, ROUND};

use ina_proto::rtt::{RtoConfig, RttEstimator};
use ina_proto::stream::{Stream, StreamStats, Tensor};
use ina_proto::Instant;
use std::time::Duration;

const WORKERS: u8 = 3;
/// One block of 64 slots, the switch's gap register's (a lane without a whole block gets no
/// gap counters).
const WINDOW: u16 = 64;
/// Blocks of the tensor: the lookahead is the window's 64 headers, 164 packets per stream.
const BLOCKS: usize = 100;
const LEN: usize = BLOCKS * ELEMS as usize;

struct Ran {
    tensors: Vec<Vec<f32>>,
    expect: Vec<f64>,
    stats: Vec<StreamStats>,
    rounds: usize,
}

/// Runs `WORKERS` float32 streams through the switch model with Missing reports; a packet
/// from rank `r` for which `drop(r, packet)` holds is lost on its way to the switch.
fn run(mut drop: impl FnMut(usize, &[u8]) -> bool) -> Ran {
    let net = Net {
        workers: WORKERS,
        packets: BLOCKS,
        window: WINDOW,
        max_retries: 10,
        give_up: Duration::from_secs(1),
        rto: RtoConfig::default(),
        rounds: 1_000,
        gap_reports: true,
    };
    let mut pipe = pipeline(&net);
    let mut tensors: Vec<Vec<f32>> = (0..WORKERS)
        .map(|w| {
            (0..LEN)
                .map(|i| ((i * 5 + usize::from(w) * 11) % 23) as f32 * 0.5 - 5.0)
                .collect()
        })
        .collect();
    let expect: Vec<f64> = (0..LEN)
        .map(|i| tensors.iter().map(|t| f64::from(t[i])).sum())
        .collect();
    let mut stats = Vec::new();
    let mut rounds = 0;
    {
        let mut streams: Vec<Stream<'_>> = tensors
            .iter_mut()
            .enumerate()
            .map(|(r, t)| {
                Stream::new(config(&net, r), Tensor::F32(t), RttEstimator::new(net.rto)).unwrap()
            })
            .collect();
        let (mut buf, mut out) = (vec![0u8; 2048], vec![0u8; 2048]);
        let mut inbox: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut now = Instant::ZERO;
        while streams.iter().any(|s| s.poll_outcome().is_none()) {
            assert!(rounds < net.rounds, "no end after {rounds} rounds");
            rounds += 1;
            now = now + ROUND;
            for (r, bytes) in std::mem::take(&mut inbox) {
                streams[r].handle_datagram(now, &bytes);
            }
            for s in &mut streams {
                if s.poll_timeout().is_some_and(|t| t <= now) {
                    s.handle_timeout(now);
                }
            }
            for (r, stream) in streams.iter_mut().enumerate() {
                while let Some(n) = stream.poll_transmit(now, &mut buf).unwrap() {
                    if drop(r, &buf[..n]) {
                        continue;
                    }
                    through_switch(&mut pipe, r, &buf[..n], now, &mut out, &mut inbox);
                }
            }
        }
        for s in &streams {
            stats.push(s.poll_outcome().unwrap().unwrap());
        }
    }
    Ran {
        tensors,
        expect,
        stats,
        rounds,
    }
}

/// Every rank holds the sum of the ranks' tensors (within the quantization's error).
fn assert_sums(ran: &Ran) {
    for (r, t) in ran.tensors.iter().enumerate() {
        for (i, x) in t.iter().enumerate() {
            let want = ran.expect[i];
            assert!(
                (f64::from(*x) - want).abs() < 1e-3,
                "rank {r} element {i}: {x} against {want}"
            );
        }
    }
}

/// Rank 1's header at stream index `index`, its first transmission (which carries the gap
/// counter) or its second copy (which does not). A fresh lane's first position is the window,
/// and the stream's descriptor takes it.
fn is_header(rank: usize, packet: &[u8], index: u32, first: bool) -> bool {
    let seq = u32::from_be_bytes([packet[12], packet[13], packet[14], packet[15]]);
    let data = packet[0] & 0x0f == 1;
    let gap = packet[1] & 0b10 != 0;
    let at = u32::from(WINDOW) + ina_proto::stream::DESCRIPTOR_PACKETS as u32 + index;
    rank == 1 && data && packet.len() == 16 && seq == at && gap == first
}

#[test]
fn every_header_of_the_lookahead_goes_twice_and_nothing_else_does() {
    let ran = run(|_, _| false);
    assert_sums(&ran);
    // The lookahead's headers share the first window with the descriptor.
    let headers = u64::from(WINDOW) - ina_proto::stream::DESCRIPTOR_PACKETS;
    for s in &ran.stats {
        assert_eq!(s.lookahead_copies, headers, "{s:?}");
        assert_eq!(s.retransmissions, 0, "{s:?}");
        // The stream's packets, and the lookahead's copies.
        assert_eq!(s.packets_sent, s.packets + headers, "{s:?}");
    }
}

#[test]
fn a_lost_header_is_made_good_by_its_copy_without_a_repair() {
    let lossless = run(|_, _| false);
    let ran = run(|r, p| is_header(r, p, 3, true));
    assert_sums(&ran);
    // The switch reported the gap, but the copy completed the use before the report came:
    // nothing went again, and the stream took no longer.
    assert!(ran.stats[1].missing_reports >= 1, "{:?}", ran.stats[1]);
    for s in &ran.stats {
        assert_eq!(s.retransmissions, 0, "{s:?}");
        assert_eq!(s.queries, 0, "{s:?}");
    }
    assert_eq!(ran.rounds, lossless.rounds);
}

#[test]
fn a_header_whose_two_copies_are_lost_is_sent_again_on_the_report() {
    // The first transmission and the copy; what goes after them gets through.
    let mut dropped = 0;
    let ran = run(|r, p| {
        let drop = dropped < 2 && (is_header(r, p, 3, true) || is_header(r, p, 3, false));
        dropped += usize::from(drop);
        drop
    });
    assert_eq!(dropped, 2);
    assert_sums(&ran);
    assert_eq!(ran.stats[1].resent_reported, 1, "{:?}", ran.stats[1]);
    for r in [0, 2] {
        let s = &ran.stats[r];
        assert_eq!(s.resent_reported + s.resent_missing, 0, "rank {r}: {s:?}");
    }
}
