//! The ring all-reduce in virtual time: a model of its TCP streams, for comparing `ina` with
//! the ring on the same simulated links.
//!
//! Unlike `ina`, whose real stream and pipeline code the simulator runs, the ring is modelled:
//! the chunks and their order are the real schedule's ([`RingSchedule`]), and each chunk
//! crosses two link directions (the sender's uplink to the hub, the receiver's downlink) as
//! TCP segments. What the model holds, and what it leaves out:
//!
//! - **Framing.** Segments of `mtu - 52` bytes (IPv4, TCP with timestamps) in frames of
//!   `mtu + 14`, and a 66-byte acknowledgement per two segments on the same link the other
//!   way (every worker's link carries its own data one way and the acknowledgements of its
//!   left neighbour's the other).
//! - **Pipelining.** A rank sends chunk `k` of step `t + 1` once it has received chunk `k` of
//!   step `t` (and, on its stream, after chunk `k - 1` of step `t + 1`); a chunk is
//!   store-and-forwarded at the hub one frame at a time.
//! - **Loss.** A segment lost on either link is sent again over both: each link carries
//!   `1 / (1 - p')` of the bytes, `p' = 1 - (1 - p)^2` the loss of the two hops, and a chunk
//!   that lost a segment arrives a round trip later (fast retransmit). The congestion control's reaction to a loss is not modelled (a loss-blind
//!   control such as BBR behaves this way; CUBIC halves its window and is slower).
//! - **No** receive-window or CPU limits: the ring is limited by its links.
//!
//! The model is pure arithmetic over the schedule; it keeps no clock and draws no random
//! numbers (losses enter as their expectation).

use crate::link::LinkConfig;
use ina_proto::ring::RingSchedule;

/// One ring all-reduce to predict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RingModel {
    pub workers: usize,
    /// Bytes of the tensor.
    pub bytes: u64,
    /// Bytes of a pipelined chunk (the ring's `chunk_bytes`).
    pub chunk_bytes: u64,
    /// The links' MTU.
    pub mtu: u32,
    /// Every link direction: rate, one-way latency per hop, loss.
    pub link: LinkConfig,
}

/// What the model predicts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RingPrediction {
    /// Time of one all-reduce.
    pub seconds: f64,
    /// The least time the links allow: `2 (n - 1) / n` of the tensor per link, framed.
    pub bound_seconds: f64,
    /// Bytes on a link per byte of data (segments and acknowledgements).
    pub framing: f64,
}

/// Bytes on a link per data byte: frames of `mtu + 14` carrying `mtu - 52`, and half an
/// acknowledgement of 66 bytes per segment.
pub fn ring_framing(mtu: u32) -> f64 {
    let mtu = f64::from(mtu);
    (mtu + 14.0 + 33.0) / (mtu - 52.0)
}

/// Predicts one ring all-reduce of `m` (`None` when the links have no rate or the model
/// makes no sense: no workers, an MTU too small for a segment).
pub fn predict(m: &RingModel) -> Option<RingPrediction> {
    let bps = m.link.bandwidth_bps.filter(|b| *b > 0)? as f64;
    if m.workers == 0 || m.mtu <= 52 || !(0.0..1.0).contains(&m.link.loss) {
        return None;
    }
    let n = m.workers;
    let framing = ring_framing(m.mtu);
    let factor = 2.0 * (n as f64 - 1.0) / n as f64;
    let bound_seconds = m.bytes as f64 * framing * factor * 8.0 / bps;
    if n == 1 {
        return Some(RingPrediction {
            seconds: 0.0,
            bound_seconds,
            framing,
        });
    }
    // The schedule in elements of 4 bytes, as the ring's driver cuts it.
    let elements = (m.bytes / 4) as usize;
    let chunk_elems = (m.chunk_bytes / 4).max(1) as usize;
    let schedule = RingSchedule::new(n, 0, elements, chunk_elems).ok()?;
    let p = m.link.loss;
    let latency = m.link.latency.as_secs_f64();
    let frame_time = f64::from(m.mtu + 14) * 8.0 / bps;
    // A segment crosses two link directions; the round trip a lost one waits is two hops each
    // way.
    let seg_loss = 1.0 - (1.0 - p) * (1.0 - p);
    let rtt = 4.0 * latency + 2.0 * frame_time;
    let seg_bytes = f64::from(m.mtu - 52);
    // A segment lost on either hop is sent again over both: each link carries the data
    // `1 / (1 - seg_loss)` times.
    let wire = |elems: usize| -> f64 {
        let data = elems as f64 * 4.0;
        data * framing / (1.0 - seg_loss) * 8.0 / bps
    };
    let steps = schedule.num_steps();
    let chunks = schedule.chunks_per_segment();
    // Every rank does the same at the same time (the ring is symmetric): one rank's stream
    // stands for all. `arrived[k]`: when chunk k of the previous step reached this rank.
    let mut arrived = vec![0.0f64; chunks];
    let mut link_free = 0.0f64;
    for t in 0..steps {
        let mut next = vec![0.0f64; chunks];
        for (k, at) in next.iter_mut().enumerate() {
            let elems = schedule.transfer(t, k).map_or(0, |x| x.send.len());
            let ready = if t == 0 { 0.0 } else { arrived[k] };
            let start = link_free.max(ready);
            let busy = wire(elems);
            link_free = start + busy;
            // The last frame crosses the hub's second link after the first; a chunk with a
            // lost segment waits for its repair.
            let segments = (elems as f64 * 4.0 / seg_bytes).ceil();
            let p_chunk = 1.0 - (1.0 - seg_loss).powf(segments);
            *at = link_free + 2.0 * latency + frame_time + p_chunk * rtt;
        }
        arrived = next;
    }
    let seconds = arrived.iter().copied().fold(0.0, f64::max);
    Some(RingPrediction {
        seconds,
        bound_seconds,
        framing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn model(workers: usize, loss: f64) -> RingModel {
        RingModel {
            workers,
            bytes: 64 << 20,
            chunk_bytes: 256 << 10,
            mtu: 9000,
            link: LinkConfig {
                latency: Duration::from_micros(20),
                bandwidth_bps: Some(1_000_000_000),
                loss,
                ..LinkConfig::default()
            },
        }
    }

    #[test]
    fn a_lossless_ring_takes_its_bound_plus_the_last_chunks_latency() {
        let p = predict(&model(4, 0.0)).unwrap();
        // 2 (n-1)/n of 64 MiB at 1 Gbit/s, framed: about 0.814 s.
        assert!((p.bound_seconds - 0.8143).abs() < 0.001, "{p:?}");
        // The chunks keep every link busy from the first to the last: only the last chunk's
        // latency and store-and-forward come on top (about 0.1 ms).
        let extra = p.seconds - p.bound_seconds;
        assert!(extra > 0.00005 && extra < 0.001, "{p:?}");
    }

    #[test]
    fn loss_costs_its_retransmitted_bytes_and_some_round_trips() {
        let clean = predict(&model(4, 0.0)).unwrap();
        let lossy = predict(&model(4, 0.01)).unwrap();
        let ratio = lossy.seconds / clean.seconds;
        assert!(ratio > 1.01 && ratio < 1.05, "{ratio}");
        assert!(predict(&model(0, 0.0)).is_none());
        assert!(predict(&model(4, 1.0)).is_none());
        assert_eq!(predict(&model(1, 0.0)).unwrap().seconds, 0.0);
    }

    #[test]
    fn more_workers_approach_twice_the_tensor_per_link() {
        let four = predict(&model(4, 0.0)).unwrap();
        let eight = predict(&model(8, 0.0)).unwrap();
        let r = eight.bound_seconds / four.bound_seconds;
        assert!((r - (1.75 / 1.5)).abs() < 1e-9);
        assert!(eight.seconds > four.seconds);
    }
}
