//! Benchmark tensors: generated from (seed, rank) so every process can rebuild any worker's
//! input, and the exact f64 reference the results are checked against.

use ina_proto::quant::{block_exponent, error_bound};

/// Worker `rank`'s gradient: uniform values whose magnitude changes every 4096 elements
/// (2^0 down to 2^-7), as the layers of a model differ in scale. (The simulator makes the same
/// tensors element by element.)
pub use ina_sim::data::generate;

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
        let elems_per_packet = elems_per_packet.max(1);
        let mut exact = vec![0f64; len];
        let mut abs_sum = vec![0f32; len];
        let mut block_exps = vec![0u8; len.div_ceil(elems_per_packet)];
        for rank in 0..workers {
            let t = generate(seed, rank, len);
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
