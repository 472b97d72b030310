//! Scenarios recorded from sparse all-reduces (PROTOCOL.md §5, "Sparse streams"): every rank
//! runs `ina_proto`'s worker streams, the support stream and then the values stream over the
//! union, through the frame model, with chosen packets lost on their way. The model's answers
//! are the expectations; the recording fails unless every rank ends with the exact sums (int32)
//! or the same bits and the sums within the quantizer's error (float32), and zeros outside the
//! union.
//!
//! Without Missing reports (the streams do not ask for them), a loss is repaired by the
//! streams' timers: a lost packet is sent again, a lost result asked for by a Query or a copy.
//! Virtual time goes in rounds: what the streams send in a round reaches the switch in that
//! round, and its answers reach the streams at the start of the next; a round in which nothing
//! moves jumps to the earliest timer.

use crate::frames::Context;
use crate::model::ModelTarget;
use crate::scenario::{ConcreteStep, Scenario, ScenarioError, ScenarioFile};
use crate::Target;
use ina_proto::rtt::{RtoConfig, RttEstimator};
use ina_proto::sparse::{self, Element};
use ina_proto::stream::{Lane, Stream, StreamConfig, Tensor};
use ina_proto::Instant;
use ina_switch_p4::runtime::P4Job;
use ina_wire::frame::{self, FrameAddrs, FRAME_HEADER_LEN};
use ina_wire::{AggPacket, UDP_PORT};
use serde::Deserialize;
use std::time::Duration;

/// A sparse all-reduce to record.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SparseSpec {
    /// The scenario's name, after the file's.
    pub name: String,
    /// Blocks of the tensor (one block: one packet's elements).
    pub blocks: u32,
    /// Elements of the last block (default: a whole block).
    pub last_block: Option<u16>,
    /// Float32 (with the exponent lookahead) or int32.
    #[serde(default)]
    pub float: bool,
    /// Per rank, the blocks it holds; a rank not listed holds none.
    pub holds: Vec<Vec<u32>>,
    /// Packets lost on their way.
    #[serde(default)]
    pub lose: Vec<Loss>,
}

/// One lost packet: the first copy of packet `packet` of stream `stream` (`support` or
/// `values`; packet 0 is the descriptor) sent by `rank` (`way = "up"`), or the first copy of
/// its result delivered to `rank` (`way = "down"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Loss {
    pub rank: u8,
    pub stream: String,
    pub packet: u64,
    pub way: String,
}

/// Virtual time of one round.
const ROUND: Duration = Duration::from_micros(50);
/// Frames a recording may send before it is declared stuck.
const MAX_FRAMES: usize = 20_000;

/// Element `i` of block `b` of rank `r`, for a block it holds: never zero, different per rank.
fn value(r: u8, b: u32, i: usize) -> i32 {
    let v = (i32::from(r) + 1) * 1000 + (b as i32 % 97) * 10 + (i as i32 % 7) + 1;
    if (b + i as u32).is_multiple_of(3) {
        -v
    } else {
        v
    }
}

/// The scenario of `file` (a switch and one job) recording the all-reduce `spec`.
pub fn scenario(
    name: &str,
    file: &ScenarioFile,
    window: u16,
    spec: &SparseSpec,
) -> Result<Scenario, ScenarioError> {
    let err = |s: String| ScenarioError::Frame(format!("{name}: {s}"));
    let jobs: Vec<P4Job> = file.jobs.iter().map(|j| j.desc(&file.switch)).collect();
    let job = jobs
        .first()
        .ok_or_else(|| err("a sparse scenario needs a job".into()))?
        .clone();
    let n = job.ranks.len();
    let e = usize::from(job.elems);
    if spec.holds.len() > n {
        return Err(err(format!(
            "{} ranks hold blocks, the job has {n}",
            spec.holds.len()
        )));
    }
    for loss in &spec.lose {
        if usize::from(loss.rank) >= n
            || !["support", "values"].contains(&loss.stream.as_str())
            || !["up", "down"].contains(&loss.way.as_str())
        {
            return Err(err(format!("invalid loss {loss:?}")));
        }
    }
    let len = match spec.last_block {
        Some(k) if k == 0 || usize::from(k) > e => {
            return Err(err(format!("last_block must be 1..={e}")))
        }
        Some(k) => (spec.blocks as usize).saturating_sub(1) * e + usize::from(k),
        None => spec.blocks as usize * e,
    };
    // Every rank's tensor as int32 values (float32 takes the same numbers).
    let inputs: Vec<Vec<i32>> = (0..n)
        .map(|r| {
            let mut t = vec![0i32; len];
            for &b in spec.holds.get(r).map_or(&[][..], |h| &h[..]) {
                let start = b as usize * e;
                for (i, x) in t.iter_mut().enumerate().skip(start).take(e) {
                    *x = value(r as u8, b, i - start);
                }
            }
            t
        })
        .collect();
    let mut rec = Recorder::new(file, &jobs, job.clone(), window).map_err(&err)?;
    if spec.float {
        let tensors: Vec<Vec<f32>> = inputs
            .iter()
            .map(|t| t.iter().map(|&x| x as f32).collect())
            .collect();
        let results = rec.allreduce(tensors, spec).map_err(&err)?;
        check_float(&inputs, &results, e).map_err(&err)?;
    } else {
        let results = rec.allreduce(inputs.clone(), spec).map_err(&err)?;
        let sums = int_sums(&inputs);
        for (r, t) in results.iter().enumerate() {
            if *t != sums {
                return Err(err(format!("rank {r}'s result is not the exact sum")));
            }
        }
    }
    let counters = rec.model.counters().map_err(|e| err(e.to_string()))?;
    let steps = std::mem::take(&mut rec.steps);
    drop(rec);
    Ok(Scenario {
        name: name.to_string(),
        skip: Vec::new(),
        skip_reason: String::new(),
        only: Vec::new(),
        switch: file.switch.clone(),
        jobs,
        steps,
        counters,
    })
}

fn int_sums(inputs: &[Vec<i32>]) -> Vec<i32> {
    let mut sums = vec![0i32; inputs.first().map_or(0, Vec::len)];
    for t in inputs {
        for (s, x) in sums.iter_mut().zip(t) {
            *s = s.wrapping_add(*x);
        }
    }
    sums
}

/// Every rank's float32 result has the same bits, is +0.0 where no rank held a value, and is
/// within the quantizer's error of the sum elsewhere.
fn check_float(inputs: &[Vec<i32>], results: &[Vec<f32>], e: usize) -> Result<(), String> {
    let sums = int_sums(inputs);
    let first = results.first().ok_or("no ranks")?;
    for (r, t) in results.iter().enumerate() {
        if t.iter()
            .map(|x| x.to_bits())
            .ne(first.iter().map(|x| x.to_bits()))
        {
            return Err(format!("rank {r}'s result differs from rank 0's"));
        }
    }
    for (b, block) in first.chunks(e).enumerate() {
        let held = inputs
            .iter()
            .any(|t| t[b * e..(b * e + block.len())].iter().any(|&x| x != 0));
        for (i, &x) in block.iter().enumerate() {
            let want = sums[b * e + i] as f32;
            if !held && x.to_bits() != 0 {
                return Err(format!(
                    "element {} of block {b}, held by no rank, is {x}",
                    b * e + i
                ));
            }
            // 2^-20 of the block's range: far above the quantizer's rounding, far below a
            // wrong sum.
            if (x - want).abs() > 1e-2 {
                return Err(format!("element {} is {x}, the sum is {want}", b * e + i));
            }
        }
    }
    Ok(())
}

/// Drives the ranks' streams through the frame model and records every frame.
struct Recorder<'f> {
    ctx: Context<'f>,
    job: P4Job,
    model: ModelTarget,
    lane: Vec<Lane>,
    rtt: Vec<RttEstimator>,
    now: Instant,
    steps: Vec<ConcreteStep>,
}

impl<'f> Recorder<'f> {
    fn new(
        file: &'f ScenarioFile,
        jobs: &'f [P4Job],
        job: P4Job,
        window: u16,
    ) -> Result<Recorder<'f>, String> {
        let mut model = ModelTarget::new();
        model
            .configure(&file.switch, jobs)
            .map_err(|e| e.to_string())?;
        let n = job.ranks.len();
        Ok(Recorder {
            ctx: Context {
                switch: &file.switch,
                jobs,
            },
            lane: vec![Lane::new(job.slot_base, window); n],
            rtt: vec![RttEstimator::new(RtoConfig::default()); n],
            job,
            model,
            now: Instant::ZERO,
            steps: Vec::new(),
        })
    }

    /// A sparse all-reduce of every rank's tensor, as the worker does it: the results.
    fn allreduce<T: Element>(
        &mut self,
        mut data: Vec<Vec<T>>,
        spec: &SparseSpec,
    ) -> Result<Vec<Vec<T>>, String>
    where
        for<'x> &'x mut [T]: IntoTensor<'x>,
    {
        let e = usize::from(self.job.elems);
        let float = spec.float;
        let blocks = sparse::blocks(data.first().map_or(0, Vec::len), e);
        // As the worker does: one scan gives the support and the blocks to clean, and the
        // values stream runs in place over the union's blocks.
        let mut supports = Vec::new();
        for t in &mut data {
            let (support, unclean) = sparse::scan(t, e, 0.0);
            for b in unclean {
                let end = ((b + 1) * e).min(t.len());
                t[b * e..end].fill(T::default());
            }
            supports.push(support);
        }
        self.run(
            "support",
            supports
                .iter_mut()
                .map(|s| Tensor::Support(s, float))
                .collect(),
            spec,
        )?;
        let union = sparse::union(&supports[0], blocks);
        if supports.iter().any(|s| sparse::union(s, blocks) != union) {
            return Err("the ranks' unions differ".into());
        }
        if !union.is_empty() {
            self.run(
                "values",
                data.iter_mut()
                    .map(|t| Tensor::Blocks {
                        of: Box::new(t.as_mut_slice().into_tensor()),
                        blocks: union.clone(),
                        elems_per_block: e,
                    })
                    .collect(),
                spec,
            )?;
        }
        Ok(data)
    }

    /// One stream per rank, over `tensors`, to the end.
    fn run(
        &mut self,
        which: &str,
        tensors: Vec<Tensor<'_>>,
        spec: &SparseSpec,
    ) -> Result<(), String> {
        let n = tensors.len();
        let starts: Vec<u64> = self.lane.iter().map(|l| l.next_position).collect();
        let mut streams = Vec::with_capacity(n);
        for (r, t) in tensors.into_iter().enumerate() {
            let cfg = StreamConfig {
                job: self.job.id,
                epoch: self.job.epoch,
                rank: r as u8,
                workers: n as u8,
                total_workers: n as u16,
                elems_per_packet: self.job.elems,
                lane: self.lane[r],
                max_retries: 20,
                give_up: Duration::from_secs(10),
                gap_reports: false,
                rules: Default::default(),
            };
            let rtt = self.rtt[r].clone();
            streams.push(Stream::new(cfg, t, rtt).map_err(|e| e.to_string())?);
        }
        let mut lost_up = vec![false; spec.lose.len()];
        let mut lost_down = vec![false; spec.lose.len()];
        let first_loss = |done: &mut Vec<bool>, r: usize, seq: u32, way: &str| -> bool {
            for (k, l) in spec.lose.iter().enumerate() {
                if !done[k]
                    && usize::from(l.rank) == r
                    && l.stream == which
                    && l.way == way
                    && u64::from(seq) == (starts[r] + l.packet) & 0xffff_ffff
                {
                    done[k] = true;
                    return true;
                }
            }
            false
        };
        let mut inbox: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut buf = vec![0u8; 9000];
        let mut frames = 0usize;
        loop {
            for (r, bytes) in std::mem::take(&mut inbox) {
                streams[r].handle_datagram(self.now, &bytes);
            }
            if streams.iter().all(|s| s.poll_outcome().is_some()) {
                break;
            }
            let mut moved = false;
            for (r, stream) in streams.iter_mut().enumerate() {
                while let Some(len) = stream
                    .poll_transmit(self.now, &mut buf)
                    .map_err(|e| e.to_string())?
                {
                    moved = true;
                    frames += 1;
                    if frames > MAX_FRAMES {
                        return Err(format!(
                            "the {which} streams did not end in {MAX_FRAMES} frames"
                        ));
                    }
                    let seq = AggPacket::new_checked(&buf[..len])
                        .map_err(|e| e.to_string())?
                        .seq();
                    if first_loss(&mut lost_up, r, seq, "up") {
                        continue;
                    }
                    let (port, frame) = self.frame_of(r, &buf[..len]);
                    self.model.send(port, &frame).map_err(|e| e.to_string())?;
                    let expect = self
                        .model
                        .collect(0, Duration::ZERO)
                        .map_err(|e| e.to_string())?;
                    for (_, out) in &expect {
                        let Some((to, payload)) = self.addressee(out) else {
                            continue;
                        };
                        let seq = AggPacket::new_checked(&payload[..])
                            .map_err(|e| e.to_string())?
                            .seq();
                        if !first_loss(&mut lost_down, to, seq, "down") {
                            inbox.push((to, payload));
                        }
                    }
                    self.steps.push(ConcreteStep {
                        note: format!("{which} stream: rank {r}, seq {seq}"),
                        port,
                        frame,
                        expect,
                    });
                }
            }
            self.now = self.now + ROUND;
            if !moved && inbox.is_empty() {
                let next = streams
                    .iter_mut()
                    .filter_map(|s| s.poll_timeout())
                    .min()
                    .ok_or_else(|| format!("the {which} streams wait for nothing"))?;
                self.now = self.now.max(next);
                for s in &mut streams {
                    s.handle_timeout(self.now);
                }
            }
        }
        for (r, s) in streams.iter().enumerate() {
            if let Some(Err(e)) = s.poll_outcome() {
                return Err(format!("rank {r}'s {which} stream failed: {e}"));
            }
            self.lane[r] = s.lane_after();
            self.rtt[r] = s.rtt().clone();
        }
        for (k, l) in spec.lose.iter().enumerate() {
            let done = if l.way == "up" {
                lost_up[k]
            } else {
                lost_down[k]
            };
            if l.stream == which && !done {
                return Err(format!("no packet matched the loss {l:?}"));
            }
        }
        Ok(())
    }

    /// The frame rank `r` sends with `datagram`, and the port it comes in on.
    fn frame_of(&self, r: usize, datagram: &[u8]) -> (u16, Vec<u8>) {
        let ep = self.job.ranks[r];
        let addrs = FrameAddrs {
            src_mac: ep.mac,
            dst_mac: self.ctx.switch.mac,
            src_ip: ep.ip.octets(),
            dst_ip: self.ctx.switch.ip.octets(),
            src_port: ep.udp_port,
            dst_port: UDP_PORT,
        };
        let mut frame = vec![0u8; FRAME_HEADER_LEN + datagram.len()];
        frame::emit_headers(&mut frame, &addrs, datagram.len()).expect("room for the headers");
        frame[FRAME_HEADER_LEN..].copy_from_slice(datagram);
        (ep.port, frame)
    }

    /// The rank a frame out of the switch is addressed to, and its datagram.
    fn addressee(&self, out: &[u8]) -> Option<(usize, Vec<u8>)> {
        let f = frame::parse(out).ok()?;
        let r =
            self.job.ranks.iter().position(|ep| {
                ep.ip.octets() == f.addrs.dst_ip && ep.udp_port == f.addrs.dst_port
            })?;
        Some((r, f.payload.to_vec()))
    }
}

/// The tensor of a rank's data.
trait IntoTensor<'x> {
    fn into_tensor(self) -> Tensor<'x>;
}

impl<'x> IntoTensor<'x> for &'x mut [f32] {
    fn into_tensor(self) -> Tensor<'x> {
        Tensor::F32(self)
    }
}

impl<'x> IntoTensor<'x> for &'x mut [i32] {
    fn into_tensor(self) -> Tensor<'x> {
        Tensor::I32(self)
    }
}

#[cfg(test)]
mod tests {
    use crate::scenario::{load, ScenarioFile};
    use ina_proto::event::Event;

    fn scenarios() -> Vec<crate::scenario::Scenario> {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scenarios/sparse.toml"
        ))
        .unwrap();
        load("sparse", &text).unwrap()
    }

    #[test]
    fn recordings_hold_the_support_and_values_streams_and_their_repairs() {
        let all = scenarios();
        let find = |name: &str| all.iter().find(|s| s.name.contains(name)).unwrap();
        // An empty union: each of the 2 ranks sends its support stream only (a descriptor and
        // two packets for 70 blocks of 64), and nothing else.
        assert_eq!(find("empty-union").steps.len(), 2 * 3);
        // Three ranks, 200 blocks, a union of 5: int32 support (1 + 4 packets) and values
        // (1 + 5 packets), lossless.
        let clean = find("holds-int32");
        assert_eq!(clean.steps.len(), 3 * ((1 + 4) + (1 + 5)));
        assert_eq!(clean.counters.events[Event::ResultUnicast.index()], 0);
        // The lossy recording repaired its losses: results sent again to one rank.
        let lossy = find("holds-float32-lossy");
        assert!(lossy.counters.events[Event::ResultUnicast.index()] > 0);
    }

    #[test]
    fn a_loss_that_matches_no_packet_is_refused() {
        let text = r#"
[[generate]]
kind = "sparse"
workers = [2]
elems = [64]
window = 2
[generate.sparse]
name = "x"
blocks = 3
holds = [[0], [2]]
lose = [{ rank = 0, stream = "values", packet = 99, way = "up" }]
"#;
        let f: ScenarioFile = toml::from_str(text).unwrap();
        let e = f.expand("bad").unwrap_err().to_string();
        assert!(e.contains("no packet matched"), "{e}");
    }
}
