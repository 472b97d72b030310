//! Tensors made from a seed: every worker's input can be rebuilt element by element, so a run
//! of many workers holds no tensor of any ([`Generated`]), and results are checked as they come.

use ina_proto::quant::{block_exponent, error_bound};
use ina_proto::stream::Source;

/// splitmix64: a cheap, well-mixed hash.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform number in [0, 1) from a key (53 bits of [`mix`]).
pub fn unit(key: u64) -> f64 {
    (mix(key) >> 11) as f64 / (1u64 << 53) as f64
}

/// Element `i` of worker `rank`'s gradient for `seed`: uniform in [-1, 1), with a magnitude
/// that changes every 4096 elements (2^0 down to 2^-7), as the layers of a model differ in scale.
pub fn element(seed: u64, rank: usize, i: usize) -> f32 {
    let key = mix(seed ^ ((rank as u64) << 40));
    let r = mix(key ^ i as u64);
    // 24 random bits: a float in [-1, 1).
    let unit = ((r >> 40) as f32) * (1.0 / 8_388_608.0) - 1.0;
    let scale = 1.0 / (1u32 << ((i / 4096) % 8)) as f32;
    unit * scale
}

/// Which blocks the ranks of a sparse generated tensor hold (PROTOCOL.md §5, "Sparse
/// streams"). Densities differ per rank: rank `r` of `n` holds a fraction
/// `density × (0.5 + r / (n - 1))` of the blocks (capped at 1), from half to one and a half
/// times `density`, `density` on average.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sparsity {
    pub density: f64,
    pub pattern: Pattern,
    /// Elements per block.
    pub block: usize,
    /// Ranks of the job.
    pub workers: usize,
}

/// How the ranks' supports overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Nested: every rank holds the blocks below its density in one ranking of the blocks
    /// shared by all (the hot rows of an embedding table); the union is the densest rank's.
    Overlapping,
    /// Each rank draws its own blocks: the union grows as `1 - Π (1 - d_r)`.
    Independent,
    /// Every block belongs to one rank, which may hold it: no two supports meet, and the union
    /// is the sum of the supports.
    Disjoint,
}

impl core::str::FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Pattern, String> {
        match s {
            "overlapping" => Ok(Pattern::Overlapping),
            "independent" => Ok(Pattern::Independent),
            "disjoint" => Ok(Pattern::Disjoint),
            _ => Err(format!(
                "unknown support pattern {s:?}: overlapping, independent or disjoint"
            )),
        }
    }
}

impl Sparsity {
    /// Rank `r`'s fraction of the blocks.
    pub fn density_of(&self, r: usize) -> f64 {
        let spread = if self.workers > 1 {
            0.5 + r as f64 / (self.workers - 1) as f64
        } else {
            1.0
        };
        (self.density * spread).clamp(0.0, 1.0)
    }

    /// Whether rank `r` holds block `b`.
    pub fn holds(&self, seed: u64, r: usize, b: usize) -> bool {
        let key = mix(seed ^ 0x5ba2_5e00);
        let d = self.density_of(r);
        match self.pattern {
            Pattern::Overlapping => unit(key ^ b as u64) < d,
            Pattern::Independent => unit(key ^ ((r as u64) << 40) ^ b as u64) < d,
            Pattern::Disjoint => {
                let n = self.workers.max(1);
                let owner = (mix(key ^ b as u64) % n as u64) as usize;
                owner == r && unit(key ^ (1 << 62) ^ b as u64) < d * n as f64
            }
        }
    }
}

/// Worker `rank`'s whole gradient of `len` elements.
pub fn generate(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| element(seed, rank, i)).collect()
}

/// A worker's float32 tensor made on demand from `(seed, rank)`. Results are folded into an
/// order-independent fingerprint (equal on every worker that got the same sums); with `check`,
/// each result block is also compared with the exact sum of the `workers` ranks' inputs, within
/// the quantization bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    pub seed: u64,
    pub rank: usize,
    pub len: usize,
    /// The job's worker count, for the check.
    pub workers: usize,
    /// Elements per packet, for the check's per-block bound.
    pub block: usize,
    pub check: bool,
    /// Order-independent hash of every result element and its index.
    pub fingerprint: u64,
    /// Result elements received.
    pub received: u64,
    /// Result elements outside the bound (with `check`).
    pub violations: u64,
    /// The largest absolute error seen (with `check`).
    pub max_abs_err: f64,
    /// The blocks the ranks hold; `None`: every block.
    pub sparsity: Option<Sparsity>,
}

impl Generated {
    pub fn new(
        seed: u64,
        rank: usize,
        len: usize,
        workers: usize,
        block: usize,
        check: bool,
    ) -> Self {
        Generated {
            seed,
            rank,
            len,
            workers,
            block: block.max(1),
            check,
            fingerprint: 0,
            received: 0,
            violations: 0,
            max_abs_err: 0.0,
            sparsity: None,
        }
    }

    /// The same tensor with only the blocks `sparsity` gives this rank, the others zeros.
    pub fn with_sparsity(mut self, sparsity: Sparsity) -> Self {
        self.sparsity = Some(sparsity);
        self
    }

    /// Element `i` of rank `r`'s tensor.
    pub fn value(&self, r: usize, i: usize) -> f32 {
        match &self.sparsity {
            Some(s) if !s.holds(self.seed, r, i / s.block.max(1)) => 0.0,
            _ => element(self.seed, r, i),
        }
    }

    /// Compares result elements `start..` with the exact sums (blocks of `self.block`); a
    /// block no rank holds must be +0.0 exactly.
    fn check_block(&mut self, start: usize, values: &[f32]) {
        let mut exact = vec![0f64; values.len()];
        let mut exp = 0u8;
        let mut input = vec![0f32; values.len()];
        let mut held = false;
        for r in 0..self.workers {
            if let Some(s) = &self.sparsity {
                if !s.holds(self.seed, r, start / s.block.max(1)) {
                    continue;
                }
            }
            held = true;
            for (k, x) in input.iter_mut().enumerate() {
                *x = element(self.seed, r, start + k);
            }
            exp = exp.max(block_exponent(&input));
            for (e, x) in exact.iter_mut().zip(&input) {
                *e += f64::from(*x);
            }
        }
        for (g, e) in values.iter().zip(&exact) {
            let err = (f64::from(*g) - e).abs();
            self.max_abs_err = self.max_abs_err.max(err);
            let wrong = if held {
                err > error_bound(self.workers as u16, exp, *e)
            } else {
                g.to_bits() != 0
            };
            if wrong {
                self.violations += 1;
            }
        }
    }
}

impl Source for Generated {
    fn len(&self) -> usize {
        self.len
    }

    fn input(&mut self, start: usize, out: &mut [f32]) {
        for (k, x) in out.iter_mut().enumerate() {
            *x = self.value(self.rank, start + k);
        }
    }

    fn result(&mut self, start: usize, values: &[f32]) {
        for (k, v) in values.iter().enumerate() {
            let i = (start + k) as u64;
            self.fingerprint = self
                .fingerprint
                .wrapping_add(mix(i ^ u64::from(v.to_bits()) << 32));
        }
        self.received += values.len() as u64;
        if self.check {
            self.check_block(start, values);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_are_the_generated_tensor() {
        let t = generate(3, 2, 9000);
        assert!((0..9000).all(|i| t[i] == element(3, 2, i)));
        assert_ne!(generate(3, 1, 10), generate(3, 2, 10));
        assert!(t.iter().all(|x| (-1.0..1.0).contains(x)));
    }

    #[test]
    fn the_check_finds_a_wrong_sum_and_the_fingerprint_ignores_order() {
        let sum = |i: usize| (0..3).map(|r| element(5, r, i)).sum::<f32>();
        let mut a = Generated::new(5, 0, 64, 3, 32, true);
        let mut b = Generated::new(5, 1, 64, 3, 32, false);
        let lo: Vec<f32> = (0..32).map(sum).collect();
        let hi: Vec<f32> = (32..64).map(sum).collect();
        a.result(0, &lo);
        a.result(32, &hi);
        b.result(32, &hi);
        b.result(0, &lo);
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_eq!((a.violations, a.received), (0, 64));
        let mut wrong = hi.clone();
        wrong[7] += 0.5;
        a.result(32, &wrong);
        assert_eq!(a.violations, 1);
        assert!(a.max_abs_err >= 0.49);
    }
}
