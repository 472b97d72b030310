//! The ring all-reduce schedule: the bandwidth-optimal baseline `ina` is measured against.
//!
//! # Algorithm
//!
//! `n` ranks sit on a ring; rank `r` only ever sends to its right neighbour `r + 1 (mod n)` and
//! only ever receives from its left neighbour `r - 1 (mod n)`. The tensor of `len` elements is
//! cut into `n` contiguous *segments* whose lengths differ by at most one (the first
//! `len % n` segments get the extra element; with `len < n` some segments are empty).
//!
//! * **Reduce-scatter**, steps `t = 0 ..= n - 2`: rank `r` sends segment `r - t` and receives
//!   segment `r - t - 1`, which it adds into its own copy. What it receives at step `t` is
//!   exactly what it sends at step `t + 1`, so every segment travels once around the ring
//!   collecting one contribution per hop. After `n - 1` steps rank `r` holds the complete sum of
//!   segment `r + 1`; that value is computed exactly once, on that rank.
//! * **All-gather**, steps `t = n - 1 ..= 2n - 3`: rank `r` sends segment `r + 1 - t'` and
//!   receives segment `r - t'` (with `t' = t - (n - 1)`), which it *overwrites* into its copy.
//!   Again what arrives at one step leaves at the next, so the finished segments circulate and
//!   every rank ends with bit-identical values for every element.
//!
//! # Cost
//!
//! Each rank sends, and receives, `2 (n - 1)` segments, i.e. `2 (n - 1) / n * len` elements up to
//! rounding (it sends exactly `2 len - |seg(r + 1)| - |seg(r + 2)|` and receives
//! `2 len - |seg(r)| - |seg(r + 1)|`); for a tensor of `S` bytes that is `2 (n - 1) / n * S`
//! bytes each way per rank, which is the lower bound for any
//! all-reduce in which every rank ends with the whole result: the algorithm is
//! bandwidth-optimal, independent of `n`. It needs `2 (n - 1)` latency-bound steps, so it is the
//! right baseline for large tensors, not for tiny ones.
//!
//! # Chunking and pipelining
//!
//! Every segment is further split into [`RingSchedule::chunks_per_segment`] chunks of at most
//! `chunk_elems` elements (the same count for all segments, so a chunk index names the same
//! piece on both ends of a link; some chunks may be empty when `len` is small). A driver walks
//! the [`Transfer`]s in the order of [`RingSchedule::transfers`] (step-major, chunk-minor): that
//! order is also the order of the bytes on each TCP stream, and because chunk `k` of step `t + 1`
//! is chunk `k` of step `t` once it has been received ([`Transfer::send_is_forward`]), the
//! driver can send one chunk while it is still receiving and reducing the next.
//!
//! This module only computes index ranges; it does no I/O, keeps no clock and never panics.

use core::ops::Range;

/// Why a [`RingSchedule`] could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingPlanError {
    /// A ring needs at least one rank.
    #[error("a ring needs at least one rank")]
    EmptyWorld,
    /// The rank does not name a member of the ring.
    #[error("rank {rank} is out of range for a ring of {world} ranks")]
    RankOutOfRange {
        /// The offending rank.
        rank: usize,
        /// The ring's size.
        world: usize,
    },
    /// Chunks must hold at least one element.
    #[error("the chunk size must be at least one element")]
    ZeroChunk,
}

/// The two halves of a ring all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Steps `0 ..= n - 2`: partial sums travel around the ring and get added into.
    ReduceScatter,
    /// Steps `n - 1 ..= 2n - 3`: finished segments travel around the ring and get copied.
    AllGather,
}

/// What a rank does with a range it receives from its left neighbour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecvOp {
    /// Elementwise add the received values into the local ones (reduce-scatter).
    Reduce,
    /// Overwrite the local values with the received ones (all-gather).
    Copy,
}

/// One step of the ring for one rank, at segment granularity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Step {
    /// Step index, `0 .. 2 (n - 1)`.
    pub index: usize,
    /// Which half of the algorithm the step belongs to.
    pub phase: Phase,
    /// Index of the segment sent to the right neighbour.
    pub send_segment: usize,
    /// Index of the segment received from the left neighbour.
    pub recv_segment: usize,
    /// Element range sent to the right neighbour.
    pub send: Range<usize>,
    /// Element range received from the left neighbour.
    pub recv: Range<usize>,
    /// Whether the received range is added in or copied over.
    pub op: RecvOp,
}

/// One chunk of one step for one rank: the unit a driver puts on the wire.
///
/// Invariants (checked by the tests): `send` of `(step + 1, chunk)` equals `recv` of
/// `(step, chunk)`; `send` of a rank equals `recv` of its right neighbour for the same
/// `(step, chunk)`; `send` and `recv` never overlap.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Transfer {
    /// Step index, `0 .. 2 (n - 1)`.
    pub step: usize,
    /// Chunk index inside the step's segments, `0 .. chunks_per_segment`.
    pub chunk: usize,
    /// Which half of the algorithm the step belongs to.
    pub phase: Phase,
    /// Element range sent to the right neighbour (possibly empty).
    pub send: Range<usize>,
    /// Element range received from the left neighbour (possibly empty); same length as the
    /// `send` of the left neighbour for this `(step, chunk)`.
    pub recv: Range<usize>,
    /// Whether the received range is added in or copied over.
    pub op: RecvOp,
    /// `send` holds exactly what was received (and reduced) at `(step - 1, chunk)`: a driver
    /// may transmit the buffer it produced then instead of reading the tensor again. False only
    /// at step 0, where a rank sends its own input.
    pub send_is_forward: bool,
    /// The result of this receive is sent on at `(step + 1, chunk)`. False only at the last
    /// step.
    pub recv_is_forwarded: bool,
    /// After this receive is applied, `recv` holds final all-reduced values. True for the last
    /// reduce-scatter step (the rank's owned segment) and every all-gather step. When it is
    /// false the local values in `recv` are overwritten later in the all-gather, so a driver that
    /// forwards the reduced buffer need not store the partial sum into the tensor at all.
    pub recv_is_final: bool,
}

/// The ring all-reduce plan of one rank over a tensor of `len` elements.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RingSchedule {
    world: usize,
    rank: usize,
    len: usize,
    chunk_elems: usize,
    chunks: usize,
}

impl RingSchedule {
    /// Plans the all-reduce of `len` elements for `rank` of a ring of `world` ranks, with chunks
    /// of at most `chunk_elems` elements.
    pub fn new(
        world: usize,
        rank: usize,
        len: usize,
        chunk_elems: usize,
    ) -> Result<Self, RingPlanError> {
        if world == 0 {
            return Err(RingPlanError::EmptyWorld);
        }
        if rank >= world {
            return Err(RingPlanError::RankOutOfRange { rank, world });
        }
        if chunk_elems == 0 {
            return Err(RingPlanError::ZeroChunk);
        }
        let max_segment = len.div_ceil(world);
        let chunks = max_segment.div_ceil(chunk_elems).max(1);
        Ok(Self {
            world,
            rank,
            len,
            chunk_elems,
            chunks,
        })
    }

    /// Number of ranks on the ring.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The rank this plan is for.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of elements of the tensor.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the tensor is empty (then every transfer is empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Upper bound on the elements of one chunk.
    pub fn chunk_elems(&self) -> usize {
        self.chunk_elems
    }

    /// The rank this one sends to.
    pub fn right(&self) -> usize {
        (self.rank + 1) % self.world
    }

    /// The rank this one receives from.
    pub fn left(&self) -> usize {
        (self.rank + self.world - 1) % self.world
    }

    /// Number of steps: `2 (n - 1)` (zero for a single rank).
    pub fn num_steps(&self) -> usize {
        2 * (self.world - 1)
    }

    /// Number of chunks every segment is split into (at least one).
    pub fn chunks_per_segment(&self) -> usize {
        self.chunks
    }

    /// Number of transfers, `num_steps * chunks_per_segment`.
    pub fn num_transfers(&self) -> usize {
        self.num_steps() * self.chunks
    }

    /// Element range of segment `index mod n`.
    pub fn segment(&self, index: usize) -> Range<usize> {
        let s = index % self.world;
        let base = self.len / self.world;
        let extra = self.len % self.world;
        let start = s * base + s.min(extra);
        let size = base + usize::from(s < extra);
        start..start + size
    }

    /// The segment this rank owns after the reduce-scatter: `r + 1 mod n`.
    pub fn owned_segment(&self) -> usize {
        (self.rank + 1) % self.world
    }

    /// `(rank + world - (k mod world)) mod world`: the segment `k` places left of `rank`.
    fn back(&self, k: usize) -> usize {
        (self.rank + self.world - k % self.world) % self.world
    }

    /// `(send segment, recv segment, phase)` of step `t`, if `t < num_steps`.
    fn segments(&self, t: usize) -> Option<(usize, usize, Phase)> {
        let n = self.world;
        if t >= self.num_steps() {
            None
        } else if t < n - 1 {
            Some((self.back(t), self.back(t + 1), Phase::ReduceScatter))
        } else {
            // All-gather step t' = t - (n - 1): send r + 1 - t', receive r - t'.
            let tp = t - (n - 1);
            Some((self.back(tp + n - 1), self.back(tp), Phase::AllGather))
        }
    }

    /// Element range of chunk `k` of segment `s`.
    fn chunk_of(&self, s: usize, k: usize) -> Range<usize> {
        let seg = self.segment(s);
        let size = (seg.end - seg.start) as u128;
        let c = self.chunks as u128;
        let k = (k.min(self.chunks)) as u128;
        // size * k / c <= size, so the conversions back cannot truncate.
        let lo = usize::try_from(size * k / c).unwrap_or(0);
        let hi = usize::try_from(size * (k + 1).min(c) / c).unwrap_or(0);
        seg.start + lo..seg.start + hi
    }

    /// Step `t` at segment granularity, or `None` past the last step.
    pub fn step(&self, t: usize) -> Option<Step> {
        let (send_segment, recv_segment, phase) = self.segments(t)?;
        Some(Step {
            index: t,
            phase,
            send_segment,
            recv_segment,
            send: self.segment(send_segment),
            recv: self.segment(recv_segment),
            op: op_of(phase),
        })
    }

    /// Chunk `k` of step `t`, or `None` if either is out of range.
    pub fn transfer(&self, t: usize, k: usize) -> Option<Transfer> {
        if k >= self.chunks {
            return None;
        }
        let (send_segment, recv_segment, phase) = self.segments(t)?;
        let last = self.num_steps() - 1;
        Some(Transfer {
            step: t,
            chunk: k,
            phase,
            send: self.chunk_of(send_segment, k),
            recv: self.chunk_of(recv_segment, k),
            op: op_of(phase),
            send_is_forward: t > 0,
            recv_is_forwarded: t < last,
            recv_is_final: t + 2 >= self.world,
        })
    }

    /// All transfers in wire order: step by step, chunk by chunk.
    pub fn transfers(&self) -> Transfers<'_> {
        Transfers {
            schedule: self,
            next: 0,
        }
    }

    /// Elements this rank sends in one all-reduce: `2 len - |seg(r + 1)| - |seg(r + 2)|`.
    pub fn elements_sent(&self) -> usize {
        (0..self.num_steps())
            .filter_map(|t| self.step(t))
            .map(|s| s.send.len())
            .sum()
    }

    /// Elements this rank receives in one all-reduce: `2 len - |seg(r)| - |seg(r + 1)|`.
    pub fn elements_received(&self) -> usize {
        (0..self.num_steps())
            .filter_map(|t| self.step(t))
            .map(|s| s.recv.len())
            .sum()
    }
}

fn op_of(phase: Phase) -> RecvOp {
    match phase {
        Phase::ReduceScatter => RecvOp::Reduce,
        Phase::AllGather => RecvOp::Copy,
    }
}

/// Iterator over the [`Transfer`]s of a [`RingSchedule`], in wire order.
#[derive(Debug, Clone)]
pub struct Transfers<'a> {
    schedule: &'a RingSchedule,
    next: usize,
}

impl Iterator for Transfers<'_> {
    type Item = Transfer;

    fn next(&mut self) -> Option<Transfer> {
        let c = self.schedule.chunks;
        let item = self.schedule.transfer(self.next / c, self.next % c)?;
        self.next += 1;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.schedule.num_transfers().saturating_sub(self.next);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Transfers<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn plans(n: usize, len: usize, chunk: usize) -> Vec<RingSchedule> {
        (0..n)
            .map(|r| RingSchedule::new(n, r, len, chunk).unwrap())
            .collect()
    }

    /// Applies the schedule literally: every rank snapshots what it sends, then every rank
    /// applies what its left neighbour sent to its own tensor.
    fn simulate<T: Copy>(inputs: &[Vec<T>], chunk: usize, add: impl Fn(T, T) -> T) -> Vec<Vec<T>> {
        let n = inputs.len();
        let len = inputs[0].len();
        let plans = plans(n, len, chunk);
        let mut data: Vec<Vec<T>> = inputs.to_vec();
        let transfers: Vec<Vec<Transfer>> = plans.iter().map(|p| p.transfers().collect()).collect();
        for i in 0..plans[0].num_transfers() {
            let msgs: Vec<Vec<T>> = (0..n)
                .map(|r| data[r][transfers[r][i].send.clone()].to_vec())
                .collect();
            for r in 0..n {
                let tr = &transfers[r][i];
                let msg = &msgs[plans[r].left()];
                assert_eq!(msg.len(), tr.recv.len());
                for (d, &m) in data[r][tr.recv.clone()].iter_mut().zip(msg) {
                    *d = match tr.op {
                        RecvOp::Reduce => add(*d, m),
                        RecvOp::Copy => m,
                    };
                }
            }
        }
        data
    }

    /// Applies the schedule the way the TCP driver does: steps >= 1 send the buffer produced
    /// by the previous step's receive, and non-final partial sums are never stored locally.
    fn simulate_forwarding<T: Copy + Default>(
        inputs: &[Vec<T>],
        chunk: usize,
        add: impl Fn(T, T) -> T,
    ) -> Vec<Vec<T>> {
        let n = inputs.len();
        let len = inputs[0].len();
        let plans = plans(n, len, chunk);
        let c = plans[0].chunks_per_segment();
        let mut data: Vec<Vec<T>> = inputs.to_vec();
        // Per rank, per chunk: the buffer to send at the next step.
        let mut outbox: Vec<Vec<Option<Vec<T>>>> = vec![vec![None; c]; n];
        for tr0 in plans[0].transfers() {
            let (t, k) = (tr0.step, tr0.chunk);
            let msgs: Vec<Vec<T>> = (0..n)
                .map(|r| {
                    let tr = plans[r].transfer(t, k).unwrap();
                    if tr.send_is_forward {
                        let buf = outbox[r][k].take().unwrap();
                        assert_eq!(buf.len(), tr.send.len());
                        buf
                    } else {
                        data[r][tr.send].to_vec()
                    }
                })
                .collect();
            for r in 0..n {
                let tr = plans[r].transfer(t, k).unwrap();
                let mut buf = msgs[plans[r].left()].clone();
                match tr.op {
                    RecvOp::Reduce => {
                        for (b, &d) in buf.iter_mut().zip(&data[r][tr.recv.clone()]) {
                            *b = add(d, *b);
                        }
                    }
                    RecvOp::Copy => {}
                }
                if tr.recv_is_final {
                    data[r][tr.recv.clone()].copy_from_slice(&buf);
                } else {
                    // Poison the stale local partial so a wrong flag would be caught.
                    data[r][tr.recv.clone()].fill(T::default());
                }
                if tr.recv_is_forwarded {
                    outbox[r][k] = Some(buf);
                }
            }
        }
        data
    }

    fn reference_i32(inputs: &[Vec<i32>]) -> Vec<i32> {
        let mut out = vec![0i32; inputs[0].len()];
        for v in inputs {
            for (o, &x) in out.iter_mut().zip(v) {
                *o = o.wrapping_add(x);
            }
        }
        out
    }

    #[test]
    fn ring_rejects_bad_parameters() {
        assert_eq!(
            RingSchedule::new(0, 0, 10, 4),
            Err(RingPlanError::EmptyWorld)
        );
        assert_eq!(
            RingSchedule::new(3, 3, 10, 4),
            Err(RingPlanError::RankOutOfRange { rank: 3, world: 3 })
        );
        assert_eq!(
            RingSchedule::new(3, 0, 10, 0),
            Err(RingPlanError::ZeroChunk)
        );
    }

    #[test]
    fn ring_single_rank_is_a_no_op() {
        let p = RingSchedule::new(1, 0, 1000, 7).unwrap();
        assert_eq!(p.num_steps(), 0);
        assert_eq!(p.transfers().count(), 0);
        assert_eq!(p.elements_sent(), 0);
        assert_eq!(p.segment(0), 0..1000);
        assert_eq!(p.step(0), None);
    }

    #[test]
    fn ring_segments_partition_uneven_lengths() {
        let p = RingSchedule::new(4, 0, 10, 100).unwrap();
        let segs: Vec<_> = (0..4).map(|s| p.segment(s)).collect();
        assert_eq!(segs, vec![0..3, 3..6, 6..8, 8..10]);
        let p = RingSchedule::new(4, 0, 2, 100).unwrap();
        let segs: Vec<_> = (0..4).map(|s| p.segment(s)).collect();
        assert_eq!(segs, vec![0..1, 1..2, 2..2, 2..2]);
        let p = RingSchedule::new(3, 0, 0, 1).unwrap();
        assert!(p.is_empty());
        assert!(p
            .transfers()
            .all(|t| t.send.is_empty() && t.recv.is_empty()));
    }

    #[test]
    fn ring_steps_follow_the_textbook_order() {
        // n = 3, rank 0: RS sends 0 then 2, receives 2 then 1 (owns 1); AG sends 1 then 0,
        // receives 0 then 2.
        let p = RingSchedule::new(3, 0, 9, 3).unwrap();
        let steps: Vec<_> = (0..4)
            .map(|t| {
                let s = p.step(t).unwrap();
                (s.send_segment, s.recv_segment, s.op)
            })
            .collect();
        assert_eq!(
            steps,
            vec![
                (0, 2, RecvOp::Reduce),
                (2, 1, RecvOp::Reduce),
                (1, 0, RecvOp::Copy),
                (0, 2, RecvOp::Copy),
            ]
        );
        assert_eq!(p.owned_segment(), 1);
        assert_eq!(p.step(4), None);
        assert_eq!(p.transfer(0, 1), None);
    }

    #[test]
    fn ring_chunks_respect_the_bound() {
        let p = RingSchedule::new(2, 1, 11, 2).unwrap();
        // Segments of 6 and 5 elements, three chunks each.
        assert_eq!(p.chunks_per_segment(), 3);
        let t: Vec<_> = (0..3).map(|k| p.transfer(0, k).unwrap().send).collect();
        assert_eq!(t, vec![6..7, 7..9, 9..11]);
        let t: Vec<_> = (0..3).map(|k| p.transfer(0, k).unwrap().recv).collect();
        assert_eq!(t, vec![0..2, 2..4, 4..6]);
    }

    #[test]
    fn ring_four_ranks_small_example() {
        let inputs: Vec<Vec<i32>> = (0..4)
            .map(|r| (0..10).map(|i| r * 100 + i).collect())
            .collect();
        let want = reference_i32(&inputs);
        for out in simulate(&inputs, 2, i32::wrapping_add) {
            assert_eq!(out, want);
        }
        for out in simulate_forwarding(&inputs, 2, i32::wrapping_add) {
            assert_eq!(out, want);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Structural invariants of the plan, for every rank.
        #[test]
        fn ring_schedule_invariants(n in 1usize..=16, len in 0usize..5000, chunk in 1usize..700) {
            let plans = plans(n, len, chunk);
            let c = plans[0].chunks_per_segment();
            for p in &plans {
                // Segments partition 0..len with sizes differing by at most one.
                let mut at = 0;
                for s in 0..n {
                    let seg = p.segment(s);
                    prop_assert_eq!(seg.start, at);
                    prop_assert!(seg.len() == len / n || seg.len() == len / n + 1);
                    at = seg.end;
                }
                prop_assert_eq!(at, len);
                prop_assert_eq!(p.transfers().len(), p.num_transfers());
                let right = &plans[p.right()];
                for tr in p.transfers() {
                    prop_assert!(tr.send.len() <= chunk && tr.recv.len() <= chunk);
                    prop_assert!(tr.send.end <= len && tr.recv.end <= len);
                    if !tr.send.is_empty() && !tr.recv.is_empty() {
                        prop_assert!(tr.send.end <= tr.recv.start || tr.recv.end <= tr.send.start);
                    }
                    // What I send is what my right neighbour expects.
                    prop_assert_eq!(&right.transfer(tr.step, tr.chunk).unwrap().recv, &tr.send);
                    // What I receive now is what I send next.
                    if let Some(next) = p.transfer(tr.step + 1, tr.chunk) {
                        prop_assert!(tr.recv_is_forwarded && next.send_is_forward);
                        prop_assert_eq!(&next.send, &tr.recv);
                    } else {
                        prop_assert!(!tr.recv_is_forwarded);
                    }
                }
                // Chunks of a step tile the step's segments in order.
                for t in 0..p.num_steps() {
                    let step = p.step(t).unwrap();
                    let mut at = step.recv.start;
                    for k in 0..c {
                        let tr = p.transfer(t, k).unwrap();
                        prop_assert_eq!(tr.recv.start, at);
                        at = tr.recv.end;
                    }
                    prop_assert_eq!(at, step.recv.end);
                }
            }
        }

        /// Bandwidth optimality: each rank sends and receives 2 (n - 1) / n * len elements, up
        /// to rounding of the segment sizes.
        #[test]
        fn ring_is_bandwidth_optimal(n in 1usize..=16, len in 0usize..5000, chunk in 1usize..700) {
            for p in plans(n, len, chunk) {
                let sent = p.elements_sent();
                let per_chunk: usize = p.transfers().map(|t| t.send.len()).sum();
                let recv_chunk: usize = p.transfers().map(|t| t.recv.len()).sum();
                prop_assert_eq!(sent, per_chunk);
                prop_assert_eq!(p.elements_received(), recv_chunk);
                let ideal_f = 2.0 * (n as f64 - 1.0) / n as f64 * len as f64;
                prop_assert!((recv_chunk as f64 - ideal_f).abs() < 2.0);
                let ideal = 2.0 * (n as f64 - 1.0) / n as f64 * len as f64;
                prop_assert!((sent as f64 - ideal).abs() < 2.0, "sent {} ideal {}", sent, ideal);
                if n > 1 {
                    let exact = 2 * len - p.segment(p.rank() + 1).len() - p.segment(p.rank() + 2).len();
                    prop_assert_eq!(sent, exact);
                    let exact_recv = 2 * len - p.segment(p.rank()).len() - p.segment(p.rank() + 1).len();
                    prop_assert_eq!(p.elements_received(), exact_recv);
                }
            }
        }

        /// Simulating all ranks with wrapping i32 addition yields the exact sum everywhere.
        #[test]
        fn ring_simulation_sums_i32(
            n in 1usize..=16,
            len in 0usize..5000,
            chunk in 1usize..700,
            seed in any::<u64>(),
        ) {
            let mut state = seed | 1;
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as i32
            };
            let inputs: Vec<Vec<i32>> = (0..n).map(|_| (0..len).map(|_| next()).collect()).collect();
            let want = reference_i32(&inputs);
            for out in simulate(&inputs, chunk, i32::wrapping_add) {
                prop_assert_eq!(&out, &want);
            }
            for out in simulate_forwarding(&inputs, chunk, i32::wrapping_add) {
                prop_assert_eq!(&out, &want);
            }
        }

        /// With f32 addition every rank ends bit-identical, close to the f64 sum.
        #[test]
        fn ring_simulation_sums_f32(
            n in 1usize..=16,
            len in 0usize..5000,
            chunk in 1usize..700,
            seed in any::<u64>(),
        ) {
            let mut state = seed | 1;
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            };
            let inputs: Vec<Vec<f32>> = (0..n).map(|_| (0..len).map(|_| next()).collect()).collect();
            let outs = simulate(&inputs, chunk, |a, b| a + b);
            let fwd = simulate_forwarding(&inputs, chunk, |a, b| a + b);
            for i in 0..len {
                let exact: f64 = inputs.iter().map(|v| f64::from(v[i])).sum();
                let got = outs[0][i];
                prop_assert!((f64::from(got) - exact).abs() <= 1e-5 * n as f64, "{} vs {}", got, exact);
                for r in 0..n {
                    prop_assert_eq!(outs[r][i].to_bits(), got.to_bits());
                    prop_assert_eq!(fwd[r][i].to_bits(), got.to_bits());
                }
            }
        }
    }
}
