//! Switch data plane throughput: `Pipeline::process` aggregating the packets of 4 workers over a
//! pool of 1024 slots, for 64- and 256-element packets, next to memcpy of the same payload bytes
//! in the same group.
//!
//! One iteration is one use of every slot: 1024 slots x 4 workers, slot by slot (the 4 workers'
//! packets of a slot in turn, the last one completing it and emitting the multicast result).
//! Throughput is payload bytes (and aggregated elements) per second. After each packet was
//! processed, its sequence number and shadow set are patched in place for the next use (a
//! 5-byte store, timed with the rest), so that every iteration is a new use of the slots and
//! really aggregates; the counters are checked before and after measuring.
//!
//! `ratio` lines at the end time `process` and `memcpy` in alternation (see `side_by_side`):
//! the figures the target is judged by.
//!
//! The cases of each group:
//! * `memcpy`: each packet's payload copied into its slot's register cells (the data movement
//!   alone);
//! * `accumulate`: `ina_wire::payload::accumulate` of each payload into its slot's cells (the
//!   inner loop alone, without parsing or the decision table);
//! * `process`: the whole pipeline, one [`Pipeline::process`] call per packet;
//! * `burst`: the whole pipeline in bursts of 64 packets ([`Pipeline::burst`]), as the switch
//!   daemon runs each receive batch.
//!
//! `cargo bench -p ina-proto --bench pipeline` (add `-- --quick` for a shorter run).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, Criterion, Throughput};
use ina_proto::pipeline::{Counters, JobConfig, Pipeline, PipelineConfig, PortId, Verdict};
use ina_proto::Instant;
use ina_wire::{AggPacket, AggRepr, MessageType, HEADER_LEN};

mod side_by_side;

const POOL: u16 = 1024;
const WORKERS: u8 = 4;
const JOB: u16 = 7;
const EPOCH: u16 = 3;
/// Packets per burst: the switch daemon's receive batch.
const BURST: usize = 64;

/// The packets of one use of every slot, and the state that numbers the next use.
struct Round {
    elems: usize,
    /// `(rank, packet)` in arrival order.
    packets: Vec<(u8, Vec<u8>)>,
    /// The use the next iteration makes of every slot.
    next_use: u32,
}

impl Round {
    fn new(elems: u16) -> Round {
        let mut packets = Vec::with_capacity(usize::from(POOL) * usize::from(WORKERS));
        for slot in 0..POOL {
            for rank in 0..WORKERS {
                let repr = AggRepr {
                    kind: MessageType::Data,
                    set: 0,
                    gap: None,
                    job: JOB,
                    epoch: EPOCH,
                    rank,
                    exponent: 120 + rank,
                    slot,
                    count: elems,
                    seq: 0,
                };
                let mut buf = vec![0u8; repr.buffer_len()];
                let Ok(mut p) = repr.emit_into(&mut buf) else {
                    panic!("buffer sized by buffer_len");
                };
                for (i, b) in p.payload_mut().chunks_exact_mut(4).enumerate() {
                    let v = (i as i32 - 100) * (i32::from(rank) + 1) * 1000 + i32::from(slot);
                    b.copy_from_slice(&v.to_be_bytes());
                }
                packets.push((rank, buf));
            }
        }
        let mut round = Round {
            elems: usize::from(elems),
            packets,
            next_use: 0,
        };
        round.number_all(0);
        round
    }

    /// Sequence number and set of `slot` in use `u`: position `g = (u + 1) * POOL + slot` of a
    /// lane over the whole pool, as the worker's stream numbers them.
    fn seq_set(u: u32, slot: u16) -> (u32, u8) {
        let g = (u + 1)
            .wrapping_mul(u32::from(POOL))
            .wrapping_add(u32::from(slot));
        (g, ((g / u32::from(POOL)) & 1) as u8)
    }

    fn payload_bytes(&self) -> u64 {
        (self.packets.len() * self.elems * 4) as u64
    }

    fn elements(&self) -> u64 {
        (self.packets.len() * self.elems) as u64
    }

    /// The data movement of one use of every slot: each packet's payload copied into its
    /// slot's cells of set `x` (`cells` as bytes, 2 sets per slot).
    fn memcpy(&self, cells: &mut [Line], x: usize) {
        let cells: &mut [u8] = bytemuck::cast_slice_mut(cells);
        let e = self.elems;
        for (i, (_, pkt)) in self.packets.iter().enumerate() {
            let slot = i / usize::from(WORKERS);
            let start = (2 * slot + x) * e * 4;
            cells[start..start + e * 4].copy_from_slice(black_box(&pkt[HEADER_LEN..]));
        }
        black_box(cells);
    }

    /// Numbers every packet for use `u`.
    fn number_all(&mut self, u: u32) {
        for (i, (_, pkt)) in self.packets.iter_mut().enumerate() {
            Round::number(pkt, i, u);
        }
    }

    /// Numbers packet `i` (of the round) for use `u`.
    fn number(pkt: &mut [u8], i: usize, u: u32) {
        let slot = (i / usize::from(WORKERS)) as u16;
        let (seq, set) = Round::seq_set(u, slot);
        let mut view = AggPacket::new_unchecked(pkt);
        view.set_seq(seq);
        view.set_set(set);
    }

    /// One use of every slot through the pipeline, one [`Pipeline::process`] call per packet.
    /// Each packet is numbered for the next use right after it was processed, so that its
    /// header was written long before the pipeline reads it again, as a received packet's is.
    fn run(&mut self, pipe: &mut Pipeline, out: &mut [u8]) {
        self.next_use = self.next_use.wrapping_add(1);
        for (rank, pkt) in self.packets.iter_mut() {
            let sent = sent(pipe.process(PortId(u16::from(*rank)), pkt, Instant::ZERO, out));
            black_box(sent);
            Round::advance(pkt);
        }
    }

    /// [`Self::run`] in bursts ([`Pipeline::burst`]) of [`BURST`] packets, as the switch daemon
    /// runs each receive batch.
    fn run_bursts(&mut self, pipe: &mut Pipeline, out: &mut [u8]) {
        self.next_use = self.next_use.wrapping_add(1);
        for batch in self.packets.chunks_mut(BURST) {
            pipe.burst(
                #[inline(always)]
                |b| {
                    for (rank, pkt) in batch.iter_mut() {
                        let sent =
                            sent(b.process(PortId(u16::from(*rank)), pkt, Instant::ZERO, out));
                        black_box(sent);
                        Round::advance(pkt);
                    }
                },
            );
        }
    }

    /// Numbers a packet of one use for the next use of its slot: [`Self::number`] for `u + 1`
    /// of a packet numbered for `u` (the sequence number one pool further on, the other set).
    #[inline(always)]
    fn advance(pkt: &mut [u8]) {
        if let Some(header) = pkt.first_chunk_mut::<HEADER_LEN>() {
            let mut view = AggPacket::new_unchecked(header);
            view.set_seq(view.seq().wrapping_add(u32::from(POOL)));
            view.set_set(view.set() ^ 1);
        }
    }
}

/// What a caller reads of a verdict: how many bytes it sends. (Keeping the whole `Verdict`
/// alive with `black_box` would add a store-forwarding stall of its own: the caller reloading
/// it with 16-byte loads right after the callee wrote it field by field.)
#[inline(always)]
fn sent(v: Verdict<'_>) -> usize {
    match v {
        Verdict::Drop(_) | Verdict::Absorbed => 0,
        Verdict::Unicast { len, .. } => len,
        Verdict::Multicast { ports, len } => len * ports.len(),
    }
}

/// 64 bytes on a cache line of their own: the memcpy destination starts every slot's cells on
/// a line, as the pipeline's value registers do.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// The destination of `Round::memcpy`: `e` elements of 4 bytes for each set of each slot.
fn cell_lines(e: usize) -> Vec<Line> {
    vec![Line([0; 64]); (usize::from(POOL) * 2 * e * 4).div_ceil(64)]
}

fn pipeline() -> Pipeline {
    Pipeline::new(PipelineConfig {
        pool_slots: POOL,
        max_elems: 256,
    })
}

fn add_job(p: &mut Pipeline, elems: u16) {
    let r = p.add_job(JobConfig {
        job: JOB,
        epoch: EPOCH,
        slot_base: 0,
        slot_count: POOL,
        elems_per_packet: elems,
        ranks: (0..u16::from(WORKERS)).map(PortId).collect(),
        uplink: None,
    });
    assert_eq!(r, Ok(()), "job installs");
}

/// Every packet since `before` was aggregated: no drops, one first arrival and three additions
/// per slot use, one multicast per slot use.
fn assert_all_aggregated(before: &Counters, after: &Counters, elems: usize) {
    let packets = after.packets_in - before.packets_in;
    assert!(packets > 0 && packets.is_multiple_of(u64::from(WORKERS)));
    let uses = packets / u64::from(WORKERS);
    assert_eq!(after.drops_total(), before.drops_total(), "{after:?}");
    assert_eq!(after.stale_seq, 0, "{after:?}");
    assert_eq!(after.data_first - before.data_first, uses, "{after:?}");
    assert_eq!(
        after.data_added - before.data_added,
        uses * u64::from(WORKERS - 1),
        "{after:?}"
    );
    assert_eq!(
        after.results_multicast - before.results_multicast,
        uses,
        "{after:?}"
    );
    assert_eq!(
        after.elements_aggregated - before.elements_aggregated,
        packets * elems as u64
    );
}

fn bench_elems(c: &mut Criterion, elems: u16) {
    let mut round = Round::new(elems);
    let mut pipe = pipeline();
    add_job(&mut pipe, elems);
    let mut out = vec![0u8; HEADER_LEN + 4 * 256];

    // Two uses by hand, checked: the first on cleared registers, the second on used ones and in
    // bursts, and the result of the second checked against the sum of the four contributions.
    let before = *pipe.counters();
    round.run(&mut pipe, &mut out);
    round.run_bursts(&mut pipe, &mut out);
    assert_all_aggregated(&before, pipe.counters(), round.elems);
    // Every packet is numbered for the next use, as `number` numbers it.
    for (i, (_, pkt)) in round.packets.iter().enumerate() {
        let mut want = pkt.clone();
        Round::number(&mut want, i, round.next_use);
        assert_eq!(pkt[..HEADER_LEN], want[..HEADER_LEN], "packet {i} advanced");
    }
    // (The packets are numbered for the next use already: the slot and set of the last one
    // come from the use that was made.)
    let last = &round.packets[round.packets.len() - 1].1;
    let (hdr, _) = AggRepr::parse_bytes(last).unwrap_or_else(|e| panic!("{e}"));
    let (_, set) = Round::seq_set(round.next_use - 1, hdr.slot);
    let cells = pipe
        .registers()
        .values_of(usize::from(hdr.slot), usize::from(set));
    for (k, cell) in cells[..round.elems].iter().enumerate() {
        let want: i32 = round.packets[round.packets.len() - usize::from(WORKERS)..]
            .iter()
            .map(|(_, p)| {
                let b = &p[HEADER_LEN + 4 * k..HEADER_LEN + 4 * k + 4];
                i32::from_be_bytes([b[0], b[1], b[2], b[3]])
            })
            .sum();
        assert_eq!(*cell, want, "element {k} of the last slot");
    }

    let mut g = c.benchmark_group(format!("pipeline_e{elems}"));
    g.throughput(Throughput::ElementsAndBytes {
        elements: round.elements(),
        bytes: round.payload_bytes(),
    })
    .warm_up_time(Duration::from_secs(1))
    .measurement_time(Duration::from_secs(3))
    .sample_size(20);

    // The register cells as bytes: 2 sets per slot.
    let e = round.elems;
    let mut cells = cell_lines(e);
    g.bench_function("memcpy", |b| {
        let mut u = 0usize;
        b.iter(|| {
            round.memcpy(&mut cells, u & 1);
            u += 1;
        })
    });
    let mut acc = vec![0i32; usize::from(POOL) * 2 * e];
    g.bench_function("accumulate", |b| {
        let mut u = 0usize;
        b.iter(|| {
            let x = u & 1;
            u += 1;
            for (i, (_, pkt)) in round.packets.iter().enumerate() {
                let slot = i / usize::from(WORKERS);
                let start = (2 * slot + x) * e;
                ina_wire::payload::accumulate(
                    black_box(&pkt[HEADER_LEN..]),
                    &mut acc[start..start + e],
                );
            }
            black_box(&mut acc);
        })
    });
    let before = *pipe.counters();
    g.bench_function("process", |b| b.iter(|| round.run(&mut pipe, &mut out)));
    g.bench_function("burst", |b| {
        b.iter(|| round.run_bursts(&mut pipe, &mut out))
    });
    g.finish();
    // (Nothing ran when a filter on the command line left `process` out.)
    if pipe.counters().packets_in > before.packets_in {
        assert_all_aggregated(&before, pipe.counters(), round.elems);
    }
    let mut replay = round.packets[0].1.clone();
    Round::number(&mut replay, 0, round.next_use.wrapping_sub(1));
    let v = pipe.process(PortId(0), &replay, Instant::ZERO, &mut out);
    assert!(
        matches!(v, Verdict::Drop(_) | Verdict::Unicast { .. }),
        "a replayed packet is not aggregated again"
    );
}

fn pipeline_benches(c: &mut Criterion) {
    for elems in [64, 256] {
        bench_elems(c, elems);
    }
}

/// `process` (one call per packet) and `burst` (bursts of [`BURST`] packets) against `memcpy`,
/// timed in alternation: the target ratio (see `side_by_side`).
fn ratios() {
    type Pass = fn(&mut Round, &mut Pipeline, &mut [u8]);
    for elems in [64, 256] {
        for (case, pass) in [
            ("process", Round::run as Pass),
            ("burst", Round::run_bursts),
        ] {
            let name = format!("pipeline_e{elems}/{case}");
            if !side_by_side::wanted(&name) {
                continue;
            }
            let mut round = Round::new(elems);
            let mut pipe = pipeline();
            add_job(&mut pipe, elems);
            let mut out = vec![0u8; HEADER_LEN + 4 * 256];
            let mut cells = cell_lines(round.elems);
            let before = *pipe.counters();
            let mut x = 0;
            let r = std::cell::RefCell::new(&mut round);
            let ratio = side_by_side::alternate(
                400,
                || {
                    r.borrow().memcpy(&mut cells, x & 1);
                    x += 1;
                },
                || pass(&mut r.borrow_mut(), &mut pipe, &mut out),
            );
            assert_all_aggregated(&before, pipe.counters(), r.borrow().elems);
            side_by_side::report(&name, "memcpy", &ratio);
        }
    }
}

criterion_group!(benches, pipeline_benches);

fn main() {
    benches();
    ratios();
    Criterion::default().configure_from_args().final_summary();
}
