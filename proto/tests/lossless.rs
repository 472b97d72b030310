//! Workers and the switch model wired back to back, no network in between.
#![allow(clippy::unwrap_used)]

use ina_proto::pipeline::{JobConfig, Pipeline, PipelineConfig, PortId, Verdict};
use ina_proto::rtt::{RtoConfig, RttEstimator};
use ina_proto::stream::{Lane, Stream, StreamConfig, Tensor};
use ina_proto::Instant;
use std::time::Duration;

fn run(workers: u8, len: usize, window: u16, elems: u16) -> Vec<Vec<f32>> {
    let mut pipe = Pipeline::new(PipelineConfig {
        pool_slots: 64,
        max_elems: 64,
    });
    pipe.add_job(JobConfig {
        job: 7,
        epoch: 3,
        slot_base: 10,
        slot_count: window,
        elems_per_packet: elems,
        ranks: (0..workers).map(|r| PortId(100 + u16::from(r))).collect(),
        uplink: None,
    })
    .unwrap();
    let mut tensors: Vec<Vec<f32>> = (0..workers)
        .map(|w| {
            (0..len)
                .map(|i| ((i * 7 + usize::from(w) * 13) % 17) as f32 - 8.0 + 0.25)
                .collect()
        })
        .collect();
    let expect: Vec<f64> = (0..len)
        .map(|i| tensors.iter().map(|t| f64::from(t[i])).sum())
        .collect();
    {
        let mut streams: Vec<Stream<'_>> = tensors
            .iter_mut()
            .enumerate()
            .map(|(r, t)| {
                Stream::new(
                    StreamConfig {
                        job: 7,
                        epoch: 3,
                        rank: r as u8,
                        workers,
                        total_workers: workers.into(),
                        elems_per_packet: elems,
                        lane: Lane::new(10, window),
                        max_retries: 3,
                        give_up: Duration::from_secs(1),
                        gap_reports: true,
                        rules: Default::default(),
                    },
                    Tensor::F32(t),
                    RttEstimator::new(RtoConfig::default()),
                )
                .unwrap()
            })
            .collect();
        let now = Instant::ZERO;
        let mut buf = vec![0u8; 4096];
        let mut out = vec![0u8; 4096];
        for _round in 0..100_000 {
            if streams.iter().all(|s| s.poll_outcome().is_some()) {
                break;
            }
            for r in 0..streams.len() {
                while let Some(n) = streams[r].poll_transmit(now, &mut buf).unwrap() {
                    let v = pipe.process(PortId(100 + r as u16), &buf[..n], now, &mut out);
                    match v {
                        Verdict::Multicast { ports, len } => {
                            let ports = ports.to_vec();
                            for p in ports {
                                streams[usize::from(p.0 - 100)].handle_datagram(now, &out[..len]);
                            }
                        }
                        // The answers to the lookahead's second copies.
                        Verdict::Unicast { port, len } => {
                            streams[usize::from(port.0 - 100)].handle_datagram(now, &out[..len]);
                        }
                        Verdict::Absorbed => {}
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
        }
        for s in &streams {
            let stats = s.poll_outcome().expect("finished").expect("ok");
            assert_eq!(stats.retransmissions, 0);
        }
    }
    for t in &tensors {
        for (i, x) in t.iter().enumerate() {
            assert!(
                (f64::from(*x) - expect[i]).abs() < 1e-3,
                "i={i} {x} vs {}",
                expect[i]
            );
        }
    }
    tensors
}

#[test]
fn back_to_back_sums_are_right() {
    for (workers, len, window, elems) in [
        (1, 10, 4, 8),
        (2, 100, 4, 8),
        (3, 1000, 8, 64),
        (4, 5, 8, 64),
        (8, 0, 2, 2),
        (5, 333, 1, 16),
    ] {
        let r = run(workers, len, window, elems);
        for t in &r[1..] {
            assert_eq!(
                t.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                r[0].iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}
