//! Benchmark tensors: generated from (seed, rank) so every process can rebuild any worker's
//! input, and the exact f64 reference the results are checked against.

use ina_proto::quant::{block_exponent, error_bound};

/// Worker `rank`'s gradient: uniform values whose magnitude changes every 4096 elements
/// (2^0 down to 2^-7), as the layers of a model differ in scale. (The simulator makes the same
/// tensors element by element.)
pub use ina_sim::data::generate;
use ina_sim::data::unit;

/// How the blocks a worker holds in a sparse benchmark tensor are laid out.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// Each worker holds each block with probability `density`, on its own.
    Uniform,
    /// An embedding table's gradient: rows of 16 blocks, a worker's batch touching whole rows,
    /// popular rows (a Zipf-like ranking shared by all workers) more often than the others.
    Rows,
    /// Per-layer top-k: in every layer (eight equal parts of the tensor) a worker keeps the
    /// `density` fraction of its blocks with the largest magnitude.
    Topk,
}

/// A sparse benchmark tensor: the shape of its support, and how dense each worker's is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sparse {
    pub shape: Shape,
    /// The fraction of blocks each worker holds.
    pub density: f64,
    /// Elements per block.
    pub block: usize,
}

/// Blocks per row of the `rows` shape.
const ROW_BLOCKS: usize = 16;
/// Layers of the `topk` shape.
const LAYERS: usize = 8;

impl Sparse {
    /// Which blocks of worker `rank`'s `input` it holds.
    pub fn held(&self, seed: u64, rank: usize, input: &[f32]) -> Vec<bool> {
        let e = self.block.max(1);
        let blocks = input.len().div_ceil(e);
        let key = |x: u64| seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ ((rank as u64) << 48) ^ x;
        if self.density >= 1.0 {
            return vec![true; blocks];
        }
        match self.shape {
            Shape::Uniform => (0..blocks)
                .map(|b| unit(key(b as u64)) < self.density)
                .collect(),
            Shape::Rows => {
                // Row `k` of the popularity ranking is touched with probability
                // min(1, c / (k + 1)^0.8), c chosen so that the mean is `density`.
                let rows = blocks.div_ceil(ROW_BLOCKS);
                let weight = |k: usize| 1.0 / ((k + 1) as f64).powf(0.8);
                let mean = |c: f64| (0..rows).map(|k| (c * weight(k)).min(1.0)).sum::<f64>();
                let target = self.density.clamp(0.0, 1.0) * rows as f64;
                let (mut lo, mut hi) = (0.0, (rows as f64).powf(0.8) + 1.0);
                for _ in 0..50 {
                    let mid = (lo + hi) / 2.0;
                    if mean(mid) < target {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
                let c = hi;
                // The ranking: a permutation of the rows shared by every worker.
                let mut order: Vec<usize> = (0..rows).collect();
                order.sort_by(|a, b| {
                    unit(seed ^ (*a as u64) << 20).total_cmp(&unit(seed ^ (*b as u64) << 20))
                });
                let mut touched = vec![false; rows];
                for (k, &row) in order.iter().enumerate() {
                    touched[row] = unit(key(row as u64)) < (c * weight(k)).min(1.0);
                }
                (0..blocks).map(|b| touched[b / ROW_BLOCKS]).collect()
            }
            Shape::Topk => {
                let mut held = vec![false; blocks];
                let per_layer = blocks.div_ceil(LAYERS).max(1);
                for layer in (0..blocks).step_by(per_layer) {
                    let end = (layer + per_layer).min(blocks);
                    let norm = |b: usize| {
                        input[b * e..((b + 1) * e).min(input.len())]
                            .iter()
                            .map(|x| x.abs())
                            .fold(0f32, f32::max)
                    };
                    let mut ranked: Vec<(f32, usize)> =
                        (layer..end).map(|b| (norm(b), b)).collect();
                    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
                    let keep = ((end - layer) as f64 * self.density).round() as usize;
                    for &(_, b) in ranked.iter().take(keep) {
                        held[b] = true;
                    }
                }
                held
            }
        }
    }
}

/// Worker `rank`'s benchmark tensor: [`generate`]'s, with the blocks it does not hold zeroed
/// when `sparse` is given.
pub fn input(seed: u64, rank: usize, len: usize, sparse: Option<&Sparse>) -> Vec<f32> {
    let mut t = generate(seed, rank, len);
    if let Some(s) = sparse {
        let held = s.held(seed, rank, &t);
        for (block, h) in t.chunks_mut(s.block.max(1)).zip(held) {
            if !h {
                block.fill(0.0);
            }
        }
    }
    t
}

/// Result check of one worker's tensor.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Check {
    pub max_abs_err: f64,
    /// The largest error divided by the largest |exact sum| of the tensor.
    pub max_rel_err: f64,
    /// Elements outside the error bound of the algorithm.
    pub violations: u64,
    /// The first element outside the bound.
    pub first_violation: Option<usize>,
}

/// How results are bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Block floating point through the switch: PROTOCOL.md's per-block bound.
    Quantized,
    /// Float32 additions in some order: n·ε·Σ|x|.
    Float,
}

/// The exact sums of all workers' tensors.
#[derive(Debug)]
pub struct Reference {
    workers: usize,
    exact: Vec<f64>,
    abs_sum: Vec<f32>,
    max_exact: f64,
    /// Per block of `elems_per_packet`: the exponent the switch ends up with (the largest).
    block_exps: Vec<u8>,
    elems_per_packet: usize,
}

impl Reference {
    /// Builds the reference for `workers` tensors of `len` generated with `seed`.
    pub fn new(seed: u64, workers: usize, len: usize, elems_per_packet: usize) -> Reference {
        Reference::of(seed, workers, len, elems_per_packet, None)
    }

    /// Builds the reference for the workers' [`input`]s.
    pub fn of(
        seed: u64,
        workers: usize,
        len: usize,
        elems_per_packet: usize,
        sparse: Option<&Sparse>,
    ) -> Reference {
        let elems_per_packet = elems_per_packet.max(1);
        let mut exact = vec![0f64; len];
        let mut abs_sum = vec![0f32; len];
        let mut block_exps = vec![0u8; len.div_ceil(elems_per_packet)];
        for rank in 0..workers {
            let t = input(seed, rank, len, sparse);
            for ((e, a), x) in exact.iter_mut().zip(abs_sum.iter_mut()).zip(&t) {
                *e += f64::from(*x);
                *a += x.abs();
            }
            for (b, chunk) in block_exps.iter_mut().zip(t.chunks(elems_per_packet)) {
                *b = (*b).max(block_exponent(chunk));
            }
        }
        let max_exact = exact.iter().fold(0f64, |m, x| m.max(x.abs()));
        Reference {
            workers,
            exact,
            abs_sum,
            max_exact,
            block_exps,
            elems_per_packet,
        }
    }

    /// Compares a result with the exact sums.
    pub fn check(&self, got: &[f32], bound: Bound) -> Check {
        let mut c = Check::default();
        if got.len() != self.exact.len() {
            c.violations = self.exact.len().abs_diff(got.len()) as u64;
            c.first_violation = Some(got.len().min(self.exact.len()));
            return c;
        }
        let n = self.workers as f64;
        // The exponent-dependent part of the quantized bound, once per block.
        let block_base: Vec<f64> = match bound {
            Bound::Quantized => self
                .block_exps
                .iter()
                .map(|&exp| error_bound(self.workers as u16, exp, 0.0))
                .collect(),
            Bound::Float => Vec::new(),
        };
        let eps = f64::from(f32::EPSILON);
        for (i, (g, e)) in got.iter().zip(&self.exact).enumerate() {
            let err = (f64::from(*g) - e).abs();
            let limit = match bound {
                Bound::Quantized => {
                    let base = block_base
                        .get(i / self.elems_per_packet)
                        .copied()
                        .unwrap_or(0.0);
                    // error_bound(n, exp, x) = error_bound(n, exp, 0) + 2^-24 |x| for every
                    // non-zero block; a zero block must be exact.
                    if base == 0.0 {
                        0.0
                    } else {
                        base + e.abs() * (1.0 / 16_777_216.0)
                    }
                }
                Bound::Float => n * eps * f64::from(self.abs_sum[i]) + f64::from(f32::MIN_POSITIVE),
            };
            // NaN compares false: a NaN result is a violation.
            if err.is_nan() || err > limit {
                c.violations += 1;
                c.first_violation.get_or_insert(i);
            }
            if err > c.max_abs_err || err.is_nan() {
                c.max_abs_err = err;
            }
        }
        c.max_rel_err = if self.max_exact > 0.0 {
            c.max_abs_err / self.max_exact
        } else {
            c.max_abs_err
        };
        c
    }
}

/// A fingerprint of a result's bits, to check that every worker holds the same result.
pub fn fingerprint(v: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in v {
        h ^= u64::from(x.to_bits());
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_shapes_hold_about_their_density() {
        let len = 256 * 4096;
        for shape in [Shape::Uniform, Shape::Rows, Shape::Topk] {
            let s = Sparse {
                shape,
                density: 0.1,
                block: 256,
            };
            let t = input(5, 1, len, Some(&s));
            let held = t
                .chunks(256)
                .filter(|b| b.iter().any(|x| *x != 0.0))
                .count();
            let d = held as f64 / 4096.0;
            assert!((0.07..0.13).contains(&d), "{shape:?}: {d}");
            if shape == Shape::Rows {
                // Whole rows: a row's blocks are held together.
                let rows = t.chunks(256 * ROW_BLOCKS);
                assert!(rows.into_iter().all(|r| {
                    let h: Vec<bool> = r.chunks(256).map(|b| b.iter().any(|x| *x != 0.0)).collect();
                    h.iter().all(|x| *x) || h.iter().all(|x| !x)
                }));
            }
        }
    }

    #[test]
    fn generation_is_deterministic_and_rank_dependent() {
        let a = generate(7, 0, 10_000);
        assert_eq!(a, generate(7, 0, 10_000));
        assert_ne!(a, generate(7, 1, 10_000));
        assert!(a.iter().all(|x| x.is_finite() && x.abs() <= 1.0));
        // The magnitude steps down every 4096 elements.
        assert!(a[4096..8192].iter().all(|x| x.abs() <= 0.5));
    }

    #[test]
    fn exact_sum_passes_and_a_wrong_element_is_caught() {
        let r = Reference::new(3, 3, 5_000, 256);
        let mut sum = vec![0f32; 5_000];
        for rank in 0..3 {
            for (s, x) in sum.iter_mut().zip(generate(3, rank, 5_000)) {
                *s += x;
            }
        }
        let ok = r.check(&sum, Bound::Float);
        assert_eq!(ok.violations, 0, "{ok:?}");
        sum[1234] += 0.01;
        let bad = r.check(&sum, Bound::Quantized);
        assert_eq!(bad.first_violation, Some(1234));
        assert!(bad.max_abs_err >= 0.009);
        assert_eq!(r.check(&sum[..10], Bound::Float).first_violation, Some(10));
        assert_ne!(fingerprint(&sum), fingerprint(&sum[1..]));
    }
}
