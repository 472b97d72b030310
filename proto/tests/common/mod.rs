//! The harness the stream tests share: `workers` int32 streams through the switch model, in
//! rounds of virtual time, with answers produced in one round arriving in the next.

use ina_proto::pipeline::{JobConfig, Pipeline, PipelineConfig, PortId, Verdict};
use ina_proto::rtt::{RtoConfig, RttEstimator};
use ina_proto::stream::{Lane, Stream, StreamConfig, StreamError, StreamStats, Tensor};
use ina_proto::Instant;
use std::time::Duration;

/// Virtual time of one round (about a round trip).
pub const ROUND: Duration = Duration::from_micros(50);

/// How a stream ended: `None` if it had not by the last round.
pub type Outcome = Option<Result<StreamStats, StreamError>>;

/// The streams and the network of a run.
#[derive(Debug, Clone)]
pub struct Net {
    pub workers: u8,
    pub packets: usize,
    pub window: u16,
    pub max_retries: u32,
    pub give_up: Duration,
    pub rto: RtoConfig,
    /// Rounds run at most.
    pub rounds: usize,
    /// Whether the switch sends Missing reports and the streams ask for them.
    pub gap_reports: bool,
}

/// What a run left: each worker's tensor and outcome, and the virtual time at which every
/// live stream had its outcome (or the run stopped).
#[derive(Debug)]
pub struct Ran {
    pub tensors: Vec<Vec<i32>>,
    pub outcomes: Vec<Outcome>,
    pub finished: Duration,
}

/// Elements per packet of every stream.
pub const ELEMS: u16 = 4;

/// The switch model with the job of `net` installed: rank `r` on port `r`.
pub fn pipeline(net: &Net) -> Pipeline {
    let mut pipe = Pipeline::new(PipelineConfig {
        pool_slots: 64,
        max_elems: 64,
    });
    pipe.set_gap_reports(net.gap_reports);
    pipe.add_job(JobConfig {
        job: 1,
        epoch: 2,
        slot_base: 0,
        slot_count: net.window,
        elems_per_packet: ELEMS,
        ranks: (0..net.workers).map(|r| PortId(u16::from(r))).collect(),
        uplink: None,
    })
    .unwrap();
    pipe
}

/// Every rank's tensor: element `i` of rank `w` is `i * (w + 1)`.
pub fn inputs(net: &Net) -> Vec<Vec<i32>> {
    let len = net.packets * usize::from(ELEMS);
    (0..net.workers)
        .map(|w| (0..len as i32).map(|i| i * (i32::from(w) + 1)).collect())
        .collect()
}

/// One stream per rank of `net`, over `tensors`.
pub fn streams<'a>(net: &Net, tensors: &'a mut [Vec<i32>]) -> Vec<Stream<'a>> {
    tensors
        .iter_mut()
        .enumerate()
        .map(|(r, t)| {
            Stream::new(config(net, r), Tensor::I32(t), RttEstimator::new(net.rto)).unwrap()
        })
        .collect()
}

/// The configuration of rank `rank`'s stream in `net`: the job of [`pipeline`], a lane of the
/// whole window.
pub fn config(net: &Net, rank: usize) -> StreamConfig {
    StreamConfig {
        job: 1,
        epoch: 2,
        rank: rank as u8,
        workers: net.workers,
        total_workers: net.workers.into(),
        elems_per_packet: ELEMS,
        lane: Lane::new(0, net.window),
        max_retries: net.max_retries,
        give_up: net.give_up,
        gap_reports: net.gap_reports,
        rules: Default::default(),
    }
}

/// Runs the streams of `net`. In a round where `asleep(rank, round)` holds, the worker neither
/// reads nor sends (its answers wait for it); a worker in `dead` never sends; a packet for
/// which `drop(rank, packet)` holds is lost on its way to the switch. Element `i` of rank `w`'s
/// tensor is `i * (w + 1)`.
pub fn run(
    net: &Net,
    asleep: impl Fn(usize, usize) -> bool,
    dead: &[usize],
    drop: impl FnMut(usize, &[u8]) -> bool,
) -> Ran {
    run_both_ways(net, asleep, dead, drop, |_, _| false)
}

/// [`run`], where also a packet for which `drop_down(rank, packet)` holds is lost on its way
/// from the switch to `rank`.
pub fn run_both_ways(
    net: &Net,
    asleep: impl Fn(usize, usize) -> bool,
    dead: &[usize],
    drop: impl FnMut(usize, &[u8]) -> bool,
    drop_down: impl FnMut(usize, &[u8]) -> bool,
) -> Ran {
    run_delayed(net, asleep, dead, drop, drop_down, |_, _| 0)
}

/// [`run_both_ways`], where a packet from the switch to `rank` for which
/// `delay_down(rank, packet)` is `n` arrives `n` rounds later than the others.
pub fn run_delayed(
    net: &Net,
    asleep: impl Fn(usize, usize) -> bool,
    dead: &[usize],
    mut drop: impl FnMut(usize, &[u8]) -> bool,
    mut drop_down: impl FnMut(usize, &[u8]) -> bool,
    mut delay_down: impl FnMut(usize, &[u8]) -> usize,
) -> Ran {
    let mut pipe = pipeline(net);
    let mut tensors = inputs(net);
    let mut outcomes = Vec::new();
    let mut now = Instant::ZERO;
    {
        let mut streams = streams(net, &mut tensors);
        let (mut buf, mut out) = (vec![0u8; 2048], vec![0u8; 2048]);
        let mut inbox: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut delayed: Vec<(usize, usize, Vec<u8>)> = Vec::new();
        for round in 0..net.rounds {
            now = now + ROUND;
            for (r, bytes) in std::mem::take(&mut inbox) {
                delayed.push((round + delay_down(r, &bytes), r, bytes));
            }
            let mut later = Vec::new();
            for (due, r, bytes) in std::mem::take(&mut delayed) {
                if due > round || asleep(r, round) {
                    later.push((due, r, bytes));
                } else if !drop_down(r, &bytes) {
                    streams[r].handle_datagram(now, &bytes);
                }
            }
            delayed = later;
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
                    if drop(r, &buf[..n]) {
                        continue;
                    }
                    through_switch(&mut pipe, r, &buf[..n], now, &mut out, &mut inbox);
                }
            }
            let mut live = streams
                .iter()
                .enumerate()
                .filter(|(r, _)| !dead.contains(r));
            if live.all(|(_, s)| s.poll_outcome().is_some()) {
                break;
            }
        }
        for s in &streams {
            outcomes.push(s.poll_outcome().map(|o| o.map(|_| s.stats())));
        }
    }
    Ran {
        tensors,
        outcomes,
        finished: now - Instant::ZERO,
    }
}

/// Passes `packet` from rank `rank`'s port through the switch model, and queues what comes
/// out for the ranks it goes to in `inbox`: results, answers, and the switch's Missing
/// reports (each copy; the model makes them only with gap reports on).
pub fn through_switch(
    pipe: &mut Pipeline,
    rank: usize,
    packet: &[u8],
    now: Instant,
    out: &mut [u8],
    inbox: &mut Vec<(usize, Vec<u8>)>,
) {
    match pipe.process(PortId(rank as u16), packet, now, out) {
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
    if let Some(report) = pipe.poll_report() {
        for _ in 0..report.copies {
            inbox.push((usize::from(report.port.0), report.header.to_vec()));
        }
    }
}

/// The seq field of a packet the harness carries (every packet is at least a header).
pub fn seq_of(packet: &[u8]) -> u32 {
    u32::from_be_bytes([packet[12], packet[13], packet[14], packet[15]])
}

/// The message type of a packet the harness carries.
pub fn kind_of(packet: &[u8]) -> u8 {
    packet[0] & 0x0f
}
