//! Block floating point: float32 blocks to int32 and back, as in PROTOCOL.md §4.
//!
//! A block of float32 values travels as int32 fixed point numbers sharing one exponent:
//!
//! * The **exponent byte** `b` of a block is the IEEE-754 biased exponent of its largest
//!   magnitude (so `2^(b-127) <= max|x| < 2^(b-126)`); 0 for an all-zero block (+0.0 and -0.0
//!   alike), 1 for a block whose largest magnitude is subnormal, and [`NON_FINITE`] (255) when the
//!   block holds a NaN or an infinity. The switch keeps the maximum over workers; the byte is
//!   unsigned so that the switch's max is a plain 8-bit max.
//! * With the agreed byte `b` (1..=254) and `n` workers, let `e = b - 126` (so every worker's
//!   `|x| < 2^e`), `c = ceil(log2 n)` (`ceil(log2 (n + 1))` above 128 workers, see
//!   [`headroom_bits`]) and the **shift** `s = 31 - c - e`. Each value becomes
//!   `q = round_half_even(x * 2^s)`. Since `|x * 2^s| < 2^(31-c)` and a float32 scaled by a power
//!   of two is exact, `|q| <= 2^(31-c)`, with equality only when `c >= 8`, where `n < 2^c`: the
//!   sum of `n` values never overflows int32.
//! * The sum `Q` comes back as `fl32(Q * 2^-s)`: one rounding to float32.
//!
//! Error bound (checked by property tests): with `exact` the f64 sum of the workers' values,
//! `|result - exact| <= n * 2^(c+e-32) * (1 + 2^-24) + 2^-24 * |exact| + 2^-149`.
//! A sum whose magnitude exceeds `f32::MAX` becomes an infinity, as float32 addition would.
//! A block with agreed byte 0 is all zeros everywhere; one with 255 is poisoned and the stream
//! reports [`QuantError::NonFinite`] instead of a result.

/// The exponent byte of a block that holds NaN or an infinity.
pub const NON_FINITE: u8 = 255;
/// The exponent byte of an all-zero block.
pub const ZERO_BLOCK: u8 = 0;

/// A quantization failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// A block (of this worker or another) held NaN or an infinity.
    #[error("block {block} holds NaN or infinity on at least one worker")]
    NonFinite { block: u64 },
    /// The worker count is outside 1..=32.
    #[error("{0} workers: a job has 1 to 32 workers")]
    Workers(usize),
}

/// The headroom bits `c` for a sum of `n` values: `ceil(log2 n)`, and above 128 workers
/// `ceil(log2 (n + 1))`.
///
/// Why the exception: a value becomes `round(x * 2^s)` with `|x * 2^s| <= 2^(31-c) - 2^(7-c)`
/// (float32 has 24 significant bits). Below `c = 8` the rounding stays below `2^(31-c)`; from
/// `c = 8` on it can reach `2^(31-c)` itself, and `n = 2^c` such values would sum to `2^31`,
/// one past int32. One more bit for exactly those `n` (powers of two from 256) rules it out.
pub fn headroom_bits(workers: u16) -> u32 {
    let ceil_log2 = |n: u32| u32::BITS - (n - 1).leading_zeros();
    match workers {
        0 | 1 => 0,
        n @ 2..=128 => ceil_log2(u32::from(n)),
        n => ceil_log2(u32::from(n) + 1),
    }
}

/// The exponent byte of a block (see the module docs).
pub fn block_exponent(values: &[f32]) -> u8 {
    match crate::kernels::max_magnitude_bits(values) {
        0 => ZERO_BLOCK,
        b if b >= 0x7f80_0000 => NON_FINITE,
        b => ((b >> 23) as u8).max(1),
    }
}

/// The shift `s` for an agreed exponent byte in 1..=254.
fn shift(exp: u8, headroom: u32) -> i32 {
    let e = i32::from(exp) - 126;
    31 - headroom as i32 - e
}

/// `2^k` as f32 when it is a normal float32.
fn pow2_f32(k: i32) -> Option<f32> {
    (-126..=127)
        .contains(&k)
        .then(|| f32::from_bits(((k + 127) as u32) << 23))
}

/// 1.5 * 2^52. For a float64 `y` with `|y| < 2^51`, `y + ROUND_I32` lands in [2^52, 2^53), where
/// float64 spacing is exactly 1, so the addition itself rounds `y` to an integer (nearest, ties to
/// even: the FPU's default mode), and the low 32 bits of the sum hold that integer in two's
/// complement (the mantissa is `2^51 + round(y)`, and `2^51` is 0 modulo `2^32`).
const ROUND_I32: f64 = 6_755_399_441_055_744.0;

/// `round_half_even(v)` as i32 for `|v| < 2^31`, without a libm call and without Rust's
/// saturating `as i32`, which LLVM does not vectorize on x86 (it made the quantize loop one
/// `cvttss2si` and two compares per element, at a third of this speed). Quantization only ever
/// produces `|v| < 2^(31-c)` (see the module docs); larger magnitudes wrap modulo 2^32 (up to
/// 2^51) and NaN gives an unspecified value, but nothing panics.
#[inline(always)]
pub(crate) fn round_even_i32(v: f32) -> i32 {
    (f64::from(v) + ROUND_I32).to_bits() as u32 as i32
}

/// Quantizes `values` with the agreed exponent byte `exp` into big-endian int32 elements at
/// the start of `out`; returns the number of elements written (`min(values.len(), out.len()/4)`).
///
/// Bytes 0 and [`NON_FINITE`] write zeros: the block carries no information (all zero, or
/// poisoned).
pub fn quantize_be(values: &[f32], exp: u8, workers: u16, out: &mut [u8]) -> usize {
    match normal_scale(exp, workers, 1) {
        // (The kernel takes the shorter of the two slices itself.)
        Some(scale) => crate::kernels::quantize_be(values, scale, out),
        None => quantize_rare(values, exp, workers, out),
    }
}

/// The scale `2^(sign * s)` as a normal float32, for an exponent byte in 1..=254 whose scale
/// is one (it is unless the block's magnitudes are around 2^-100 or below).
#[inline]
fn normal_scale(exp: u8, workers: u16, sign: i32) -> Option<f32> {
    if exp == ZERO_BLOCK || exp == NON_FINITE {
        return None;
    }
    pow2_f32(sign * shift(exp, headroom_bits(workers)))
}

/// [`quantize_be`] for the exponent bytes without a [`normal_scale`].
#[cold]
#[inline(never)]
fn quantize_rare(values: &[f32], exp: u8, workers: u16, out: &mut [u8]) -> usize {
    let n = values.len().min(out.len() / 4);
    let (values, out) = (&values[..n], &mut out[..n * 4]);
    if exp == ZERO_BLOCK || exp == NON_FINITE {
        out.fill(0);
        return n;
    }
    let scale = 2f64.powi(shift(exp, headroom_bits(workers)));
    for (x, dst) in values.iter().zip(out.chunks_exact_mut(4)) {
        let q = (f64::from(*x) * scale).round_ties_even() as i32;
        dst.copy_from_slice(&q.to_be_bytes());
    }
    n
}

/// Turns big-endian int32 sums back into float32 with the agreed exponent byte; returns the
/// number of elements written (`min(out.len(), bytes.len()/4)`). Byte 0 writes zeros; callers
/// must handle [`NON_FINITE`] before (it writes NaN).
pub fn dequantize_be(bytes: &[u8], exp: u8, workers: u16, out: &mut [f32]) -> usize {
    let n = out.len().min(bytes.len() / 4);
    let (bytes, out) = (&bytes[..n * 4], &mut out[..n]);
    match normal_scale(exp, workers, -1) {
        Some(scale) => crate::kernels::dequantize_be(bytes, scale, out),
        None => dequantize_rare(bytes, exp, workers, out),
    }
    n
}

/// [`dequantize_be`] for the exponent bytes without a [`normal_scale`].
#[cold]
#[inline(never)]
fn dequantize_rare(bytes: &[u8], exp: u8, workers: u16, out: &mut [f32]) {
    match exp {
        ZERO_BLOCK => out.fill(0.0),
        NON_FINITE => out.fill(f32::NAN),
        _ => {
            let scale = 2f64.powi(-shift(exp, headroom_bits(workers)));
            for (src, dst) in bytes.chunks_exact(4).zip(out.iter_mut()) {
                let q = i32::from_be_bytes([src[0], src[1], src[2], src[3]]);
                *dst = (f64::from(q) * scale) as f32;
            }
        }
    }
}

/// The documented bound on `|result - exact|` for one element (see the module docs).
pub fn error_bound(workers: u16, exp: u8, exact: f64) -> f64 {
    if exp == ZERO_BLOCK {
        return 0.0;
    }
    let c = headroom_bits(workers) as i32;
    let e = i32::from(exp) - 126;
    f64::from(workers) * 2f64.powi(c + e - 32) * (1.0 + 2f64.powi(-24))
        + 2f64.powi(-24) * exact.abs()
        + 2f64.powi(-149)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rounding_is_half_to_even_everywhere() {
        for v in [
            0.5f32, 1.5, 2.5, -0.5, -1.5, 4398533.2, 4398533.5, 4398534.5, 8388607.5, -8388607.5,
            8388609.0, 1e9, 0.49999997,
        ] {
            assert_eq!(round_even_i32(v), v.round_ties_even() as i32, "{v}");
        }
        // The ends of the range quantization uses.
        for v in [-0.0f32, 2147483520.0, -2147483520.0, -2147483648.0] {
            assert_eq!(round_even_i32(v), v.round_ties_even() as i32, "{v}");
        }
    }

    #[test]
    fn headroom() {
        let want = [
            (1, 0),
            (2, 1),
            (3, 2),
            (4, 2),
            (5, 3),
            (8, 3),
            (9, 4),
            (16, 4),
            (17, 5),
            (32, 5),
        ];
        for (n, c) in want {
            assert_eq!(headroom_bits(n), c, "n={n}");
        }
    }

    #[test]
    fn exponent_rules() {
        assert_eq!(block_exponent(&[]), ZERO_BLOCK);
        assert_eq!(block_exponent(&[0.0, -0.0]), ZERO_BLOCK);
        assert_eq!(block_exponent(&[1.0]), 127);
        assert_eq!(block_exponent(&[-1.5, 0.25]), 127);
        assert_eq!(block_exponent(&[2.0]), 128);
        assert_eq!(block_exponent(&[f32::MIN_POSITIVE / 4.0]), 1);
        assert_eq!(block_exponent(&[f32::MAX]), 254);
        assert_eq!(block_exponent(&[1.0, f32::NAN]), NON_FINITE);
        assert_eq!(block_exponent(&[f32::NEG_INFINITY]), NON_FINITE);
        // Every magnitude lies below 2^(b-126).
        for x in [1e-30f32, 3.7, 1e30, 65535.0] {
            let e = i32::from(block_exponent(&[x])) - 126;
            assert!(f64::from(x) < 2f64.powi(e) && f64::from(x) >= 2f64.powi(e - 1));
        }
    }

    #[test]
    fn zero_and_poison_blocks() {
        let mut bytes = [0xAAu8; 8];
        assert_eq!(quantize_be(&[1.0, 2.0], ZERO_BLOCK, 2, &mut bytes), 2);
        assert_eq!(bytes, [0; 8]);
        let mut out = [1.0f32; 2];
        dequantize_be(&bytes, ZERO_BLOCK, 2, &mut out);
        assert_eq!(out, [0.0, 0.0]);
        dequantize_be(&bytes, NON_FINITE, 2, &mut out);
        assert!(out.iter().all(|x| x.is_nan()));
    }

    #[test]
    fn single_worker_is_near_exact_and_keeps_sign_of_zero_block() {
        let xs = [1.0f32, -0.5, 0.333, -0.0, 1e-7];
        let exp = block_exponent(&xs);
        let mut bytes = [0u8; 20];
        quantize_be(&xs, exp, 1, &mut bytes);
        let mut back = [0f32; 5];
        dequantize_be(&bytes, exp, 1, &mut back);
        for (a, b) in xs.iter().zip(back) {
            assert!((f64::from(*a) - f64::from(b)).abs() <= error_bound(1, exp, f64::from(*a)));
        }
        assert_eq!(back[0], 1.0);
        assert_eq!(back[1], -0.5);
    }

    #[test]
    fn largest_magnitudes_do_not_overflow() {
        for n in [
            1u16, 2, 3, 4, 7, 8, 31, 32, 33, 100, 1000, 1024, 1025, 65535,
        ] {
            let xs = vec![f32::MAX; 1];
            let exp = block_exponent(&xs);
            let mut bytes = [0u8; 4];
            quantize_be(&xs, exp, n, &mut bytes);
            let q = i64::from(i32::from_be_bytes(bytes));
            assert!(q * i64::from(n) <= i64::from(i32::MAX), "n={n} q={q}");
            let neg = [-f32::MAX];
            quantize_be(&neg, exp, n, &mut bytes);
            let q = i64::from(i32::from_be_bytes(bytes));
            assert!(q * i64::from(n) >= i64::from(i32::MIN), "n={n} q={q}");
        }
    }

    /// A float32 of random magnitude: mantissa, exponent across the whole range, sign; with
    /// zeros and subnormals mixed in.
    fn any_finite() -> impl Strategy<Value = f32> {
        prop_oneof![
            8 => (any::<u32>(), -40i32..40).prop_map(|(m, e)| {
                let x = f32::from_bits((m & 0x807f_ffff) | (127 << 23));
                x * 2f32.powi(e)
            }),
            1 => (any::<u32>()).prop_map(|b| f32::from_bits(b & 0x807f_ffff)), // subnormal
            1 => (any::<u32>()).prop_map(|b| {
                let x = f32::from_bits(b);
                if x.is_finite() { x } else { 0.0 }
            }),
            1 => Just(0.0f32),
            1 => Just(-0.0f32),
        ]
    }

    proptest! {
        /// n workers quantize their blocks with the agreed (max) exponent; the int32 sum,
        /// dequantized, lies within the documented bound of the exact sum. Up to 1024
        /// workers, as an aggregation tree has them (worker `w` holds block `w mod 32`).
        #[test]
        fn sum_within_bound(n in prop_oneof![1u16..=32, 33u16..=1024], len in 1usize..40, seed in proptest::collection::vec(any_finite(), 32 * 40)) {
            let blocks: Vec<&[f32]> = (0..usize::from(n)).map(|w| w % 32).map(|w| &seed[w * len..(w + 1) * len]).collect();
            let exp = blocks.iter().map(|b| block_exponent(b)).max().unwrap();
            prop_assert!(exp != NON_FINITE);
            let mut sum = vec![0i32; len];
            let mut bytes = vec![0u8; len * 4];
            for b in &blocks {
                quantize_be(b, exp, n, &mut bytes);
                for (acc, chunk) in sum.iter_mut().zip(bytes.chunks_exact(4)) {
                    let q = i32::from_be_bytes(chunk.try_into().unwrap());
                    *acc = acc.checked_add(q).expect("no overflow by construction");
                }
            }
            for (acc, chunk) in sum.iter().zip(bytes.chunks_exact_mut(4)) {
                chunk.copy_from_slice(&acc.to_be_bytes());
            }
            let mut out = vec![0f32; len];
            dequantize_be(&bytes, exp, n, &mut out);
            for i in 0..len {
                let exact: f64 = blocks.iter().map(|b| f64::from(b[i])).sum();
                if exact.abs() > f64::from(f32::MAX) {
                    // The sum itself leaves float32's range: it overflows as float addition does.
                    prop_assert!(out[i].is_infinite() || (f64::from(out[i]) - exact).abs() <= error_bound(n, exp, exact));
                    continue;
                }
                let err = (f64::from(out[i]) - exact).abs();
                let bound = error_bound(n, exp, exact);
                prop_assert!(err <= bound, "n={} i={} exact={} got={} err={} bound={}", n, i, exact, out[i], err, bound);
            }
        }

        #[test]
        fn quantize_round_trip_is_close_for_one_worker(xs in proptest::collection::vec(any_finite(), 0..300)) {
            let exp = block_exponent(&xs);
            let mut bytes = vec![0u8; xs.len() * 4];
            prop_assert_eq!(quantize_be(&xs, exp, 1, &mut bytes), xs.len());
            let mut back = vec![0f32; xs.len()];
            dequantize_be(&bytes, exp, 1, &mut back);
            for (a, b) in xs.iter().zip(&back) {
                prop_assert!((f64::from(*a) - f64::from(*b)).abs() <= error_bound(1, exp, f64::from(*a)));
            }
        }
    }
}
