//! Quantizer throughput over a 4 MiB float32 tensor in blocks of 256 elements, next to memcpy of
//! the same bytes in the same group, so that the ratio shows in one run.
//!
//! Throughput is tensor bytes (4 per element) per second. The cases:
//!
//! * `memcpy/to_packet`, `quantize/to_packet`, `exp+quantize/to_packet`: each block goes into the
//!   payload of the next of 64 reused datagrams, as the worker writes its send batch of 64
//!   (`exp+` also computes the block's exponent byte, the worker's real per-block cost). The
//!   datagrams lie back to back, as in a send batch: a 16-byte header and 1 KiB of payload
//!   each, so every other payload starts on a 32-byte boundary and the others 16 bytes past
//!   one, and from one block to the next the payload moves 16 bytes further along the page
//!   than the block does in the tensor.
//! * `memcpy/whole`, `quantize/whole`, `exp+quantize/whole`, `dequantize/whole`: a 4 MiB source
//!   into a 4 MiB destination.
//! * `memcpy/from_packet`, `dequantize/from_packet`: the payloads of 64 datagrams laid out the
//!   same way, in turn, into each block of the tensor, as the worker writes results back from
//!   its receive batch of 64.
//!
//! `ratio` lines at the end time each case and its memcpy in alternation (see
//! `side_by_side`): the figures the target is judged by.
//!
//! `cargo bench -p ina-proto --bench quant` (add `-- --quick` for a shorter run, or `-- ratio`
//! for the ratios alone).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, Criterion, Throughput};
use ina_proto::quant::{block_exponent, dequantize_be, quantize_be};

mod side_by_side;

const TENSOR_BYTES: usize = 4 << 20;
const ELEMS: usize = TENSOR_BYTES / 4;
const BLOCK: usize = 256;
const WORKERS: u16 = 4;

/// Gradient-like values: magnitudes spread over a few binades, both signs (xorshift, fixed seed).
fn tensor() -> Vec<f32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    (0..ELEMS)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let mantissa = (s >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            let scale = [1.0f32, 0.25, 1e-2, 3e-3][(s & 3) as usize];
            if s & 4 == 0 {
                mantissa * scale
            } else {
                -mantissa * scale
            }
        })
        .collect()
}

fn as_bytes(values: &[f32], out: &mut [u8]) {
    for (v, b) in values.iter().zip(out.chunks_exact_mut(4)) {
        b.copy_from_slice(&v.to_ne_bytes());
    }
}

/// The tensor, its exponents and the buffers every case reads and writes.
struct Data {
    t: Vec<f32>,
    exps: Vec<u8>,
    t_bytes: Vec<u8>,
    whole: Vec<u8>,
    /// A send batch of datagrams back to back (see the module docs), for the `to_packet` cases.
    packets: Datagrams,
    back: Vec<f32>,
    /// Quantized bytes of the whole tensor, the source of dequantization.
    q: Vec<u8>,
    /// The same, holding quantized blocks, for the `from_packet` cases.
    q_packets: Datagrams,
}

/// [`Datagrams::COUNT`] datagrams of a 16-byte header and a block's payload, back to back from
/// a 64-byte boundary: the first payload is 32-byte aligned, the second 16 bytes off, and so on.
struct Datagrams {
    buf: Vec<u8>,
    start: usize,
}

impl Datagrams {
    const LEN: usize = 16 + BLOCK * 4;
    /// As many as the worker's send and receive batches hold.
    const COUNT: usize = 64;

    fn new() -> Datagrams {
        let buf = vec![0u8; Self::COUNT * Self::LEN + 64];
        let start = (64 - (buf.as_ptr() as usize % 64)) % 64;
        Datagrams { buf, start }
    }

    /// The payload of datagram `k % COUNT`.
    fn payload(&mut self, k: usize) -> &mut [u8] {
        let at = self.start + (k % Self::COUNT) * Self::LEN + 16;
        &mut self.buf[at..at + BLOCK * 4]
    }
}

impl Data {
    fn new() -> Data {
        let t = tensor();
        let exps: Vec<u8> = t.chunks(BLOCK).map(block_exponent).collect();
        let mut t_bytes = vec![0u8; TENSOR_BYTES];
        as_bytes(&t, &mut t_bytes);
        let mut q = vec![0u8; TENSOR_BYTES];
        for ((block, e), dst) in t.chunks(BLOCK).zip(&exps).zip(q.chunks_mut(BLOCK * 4)) {
            quantize_be(block, *e, WORKERS, dst);
        }
        let mut q_packets = Datagrams::new();
        for k in 0..Datagrams::COUNT {
            q_packets
                .payload(k)
                .copy_from_slice(&q[k * BLOCK * 4..(k + 1) * BLOCK * 4]);
        }
        Data {
            t,
            exps,
            t_bytes,
            whole: vec![0u8; TENSOR_BYTES],
            packets: Datagrams::new(),
            back: vec![0f32; ELEMS],
            q,
            q_packets,
        }
    }

    // Into the datagrams of a send batch, in turn.
    fn memcpy_to_packet(&mut self) {
        for (k, src) in self.t_bytes.chunks_exact(BLOCK * 4).enumerate() {
            let dst = self.packets.payload(k);
            dst.copy_from_slice(black_box(src));
            black_box(dst);
        }
    }

    fn quantize_to_packet(&mut self) {
        for (k, (block, e)) in self.t.chunks_exact(BLOCK).zip(&self.exps).enumerate() {
            let dst = self.packets.payload(k);
            quantize_be(black_box(block), *e, WORKERS, dst);
            black_box(dst);
        }
    }

    fn exp_quantize_to_packet(&mut self) {
        for (k, block) in self.t.chunks_exact(BLOCK).enumerate() {
            let e = block_exponent(black_box(block));
            let dst = self.packets.payload(k);
            quantize_be(block, e, WORKERS, dst);
            black_box(dst);
        }
    }

    // Whole tensor into a whole output.
    fn memcpy_whole(&mut self) {
        self.whole.copy_from_slice(black_box(&self.t_bytes));
        black_box(&mut self.whole);
    }

    fn quantize_whole(&mut self) {
        for ((block, e), dst) in self
            .t
            .chunks_exact(BLOCK)
            .zip(&self.exps)
            .zip(self.whole.chunks_exact_mut(BLOCK * 4))
        {
            quantize_be(black_box(block), *e, WORKERS, dst);
        }
        black_box(&mut self.whole);
    }

    fn exp_quantize_whole(&mut self) {
        for (block, dst) in self
            .t
            .chunks_exact(BLOCK)
            .zip(self.whole.chunks_exact_mut(BLOCK * 4))
        {
            let e = block_exponent(black_box(block));
            quantize_be(block, e, WORKERS, dst);
        }
        black_box(&mut self.whole);
    }

    fn dequantize_whole(&mut self) {
        for ((src, e), dst) in self
            .q
            .chunks_exact(BLOCK * 4)
            .zip(&self.exps)
            .zip(self.back.chunks_exact_mut(BLOCK))
        {
            dequantize_be(black_box(src), *e, WORKERS, dst);
        }
        black_box(&mut self.back);
    }

    // From the datagrams of a receive batch, in turn, into the tensor.
    fn memcpy_from_packet(&mut self) {
        for (k, dst) in self.whole.chunks_exact_mut(BLOCK * 4).enumerate() {
            dst.copy_from_slice(black_box(self.q_packets.payload(k)));
        }
        black_box(&mut self.whole);
    }

    fn dequantize_from_packet(&mut self) {
        for (k, (e, dst)) in self
            .exps
            .iter()
            .zip(self.back.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            dequantize_be(black_box(self.q_packets.payload(k)), *e, WORKERS, dst);
        }
        black_box(&mut self.back);
    }
}

/// A measured case: its name, its loop and the memcpy it is compared with.
type Case = (&'static str, fn(&mut Data), fn(&mut Data));

/// A memcpy baseline: its name and its loop.
type Memcpy = (&'static str, fn(&mut Data));

const CASES: [Case; 6] = [
    (
        "quantize/to_packet",
        Data::quantize_to_packet,
        Data::memcpy_to_packet,
    ),
    (
        "exp+quantize/to_packet",
        Data::exp_quantize_to_packet,
        Data::memcpy_to_packet,
    ),
    ("quantize/whole", Data::quantize_whole, Data::memcpy_whole),
    (
        "exp+quantize/whole",
        Data::exp_quantize_whole,
        Data::memcpy_whole,
    ),
    (
        "dequantize/whole",
        Data::dequantize_whole,
        Data::memcpy_whole,
    ),
    (
        "dequantize/from_packet",
        Data::dequantize_from_packet,
        Data::memcpy_from_packet,
    ),
];

fn quant(c: &mut Criterion) {
    let mut d = Data::new();
    let mut g = c.benchmark_group("quant_4MiB");
    g.throughput(Throughput::Bytes(TENSOR_BYTES as u64))
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    let memcpys: [Memcpy; 3] = [
        ("memcpy/to_packet", Data::memcpy_to_packet),
        ("memcpy/whole", Data::memcpy_whole),
        ("memcpy/from_packet", Data::memcpy_from_packet),
    ];
    for (name, f) in memcpys {
        g.bench_function(name, |b| b.iter(|| f(&mut d)));
    }
    for (name, f, _) in CASES {
        g.bench_function(name, |b| b.iter(|| f(&mut d)));
    }
    g.finish();
}

/// Every case against its memcpy, timed in alternation: the target ratios (see
/// `side_by_side`).
fn ratios() {
    let mut d = None;
    for (name, case, base) in CASES {
        let name = format!("quant_4MiB/{name}");
        if !side_by_side::wanted(&name) {
            continue;
        }
        let d = d.get_or_insert_with(Data::new);
        let cell = std::cell::RefCell::new(d);
        let r = side_by_side::alternate(
            500,
            || base(&mut cell.borrow_mut()),
            || case(&mut cell.borrow_mut()),
        );
        side_by_side::report(&name, "memcpy", &r);
    }
}

criterion_group!(benches, quant);

fn main() {
    benches();
    ratios();
    Criterion::default().configure_from_args().final_summary();
}
