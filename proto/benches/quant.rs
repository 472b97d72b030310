//! Quantizer throughput over a 4 MiB float32 tensor in blocks of 256 elements, next to memcpy of
//! the same bytes in the same group, so that the ratio shows in one run.
//!
//! Throughput is tensor bytes (4 per element) per second. The cases:
//!
//! * `memcpy/to_packet`, `quantize/to_packet`, `exp+quantize/to_packet`: each block goes into one
//!   reused packet-sized buffer, as the worker writes its transmit buffer (`exp+` also computes
//!   the block's exponent byte, the worker's real per-block cost).
//! * `memcpy/whole`, `quantize/whole`, `exp+quantize/whole`, `dequantize/whole`: a 4 MiB source
//!   into a 4 MiB destination.
//! * `memcpy/from_packet`, `dequantize/from_packet`: one reused packet-sized buffer into each
//!   block of the tensor, as the worker writes results back.
//!
//! `cargo bench -p ina-proto --bench quant` (add `-- --quick` for a shorter run).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ina_proto::quant::{block_exponent, dequantize_be, quantize_be};

const TENSOR_BYTES: usize = 4 << 20;
const ELEMS: usize = TENSOR_BYTES / 4;
const BLOCK: usize = 256;
const WORKERS: u8 = 4;

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

fn quant(c: &mut Criterion) {
    let t = tensor();
    let exps: Vec<u8> = t.chunks(BLOCK).map(block_exponent).collect();
    let mut t_bytes = vec![0u8; TENSOR_BYTES];
    as_bytes(&t, &mut t_bytes);
    let mut whole = vec![0u8; TENSOR_BYTES];
    let mut packet = vec![0u8; BLOCK * 4];
    let mut back = vec![0f32; ELEMS];

    // Quantized bytes of the whole tensor, the source of dequantization.
    let mut q = vec![0u8; TENSOR_BYTES];
    for ((block, e), dst) in t.chunks(BLOCK).zip(&exps).zip(q.chunks_mut(BLOCK * 4)) {
        quantize_be(block, *e, WORKERS, dst);
    }
    let q_packet = q[..BLOCK * 4].to_vec();

    let mut g = c.benchmark_group("quant_4MiB");
    g.throughput(Throughput::Bytes(TENSOR_BYTES as u64))
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);

    // Into one reused packet buffer.
    g.bench_function("memcpy/to_packet", |b| {
        b.iter(|| {
            for src in t_bytes.chunks_exact(BLOCK * 4) {
                packet.copy_from_slice(black_box(src));
                black_box(&mut packet);
            }
        })
    });
    g.bench_function("quantize/to_packet", |b| {
        b.iter(|| {
            for (block, e) in t.chunks_exact(BLOCK).zip(&exps) {
                quantize_be(black_box(block), *e, WORKERS, &mut packet);
                black_box(&mut packet);
            }
        })
    });
    g.bench_function("exp+quantize/to_packet", |b| {
        b.iter(|| {
            for block in t.chunks_exact(BLOCK) {
                let e = block_exponent(black_box(block));
                quantize_be(block, e, WORKERS, &mut packet);
                black_box(&mut packet);
            }
        })
    });

    // Whole tensor into a whole output.
    g.bench_function("memcpy/whole", |b| {
        b.iter(|| {
            whole.copy_from_slice(black_box(&t_bytes));
            black_box(&mut whole);
        })
    });
    g.bench_function("quantize/whole", |b| {
        b.iter(|| {
            for ((block, e), dst) in t
                .chunks_exact(BLOCK)
                .zip(&exps)
                .zip(whole.chunks_exact_mut(BLOCK * 4))
            {
                quantize_be(black_box(block), *e, WORKERS, dst);
            }
            black_box(&mut whole);
        })
    });
    g.bench_function("exp+quantize/whole", |b| {
        b.iter(|| {
            for (block, dst) in t.chunks_exact(BLOCK).zip(whole.chunks_exact_mut(BLOCK * 4)) {
                let e = block_exponent(black_box(block));
                quantize_be(block, e, WORKERS, dst);
            }
            black_box(&mut whole);
        })
    });
    g.bench_function("dequantize/whole", |b| {
        b.iter(|| {
            for ((src, e), dst) in q
                .chunks_exact(BLOCK * 4)
                .zip(&exps)
                .zip(back.chunks_exact_mut(BLOCK))
            {
                dequantize_be(black_box(src), *e, WORKERS, dst);
            }
            black_box(&mut back);
        })
    });

    // From one reused packet buffer into the tensor.
    g.bench_function("memcpy/from_packet", |b| {
        b.iter(|| {
            for dst in whole.chunks_exact_mut(BLOCK * 4) {
                dst.copy_from_slice(black_box(&q_packet));
            }
            black_box(&mut whole);
        })
    });
    g.bench_function("dequantize/from_packet", |b| {
        b.iter(|| {
            for (e, dst) in exps.iter().zip(back.chunks_exact_mut(BLOCK)) {
                dequantize_be(black_box(&q_packet), *e, WORKERS, dst);
            }
            black_box(&mut back);
        })
    });
    g.finish();
}

criterion_group!(benches, quant);
criterion_main!(benches);
