//! The bulk loops of the quantizer and the pipeline, and the run-time choice between their
//! baseline and AVX2 compilations (and, for the pipeline, AVX-512: see [`Isa`]).
//!
//! Every x86-64 CPU has SSE2, so that is all the default target may assume; with AVX2 (x86-64
//! CPUs since 2013) the loops run on twice as wide vectors and swap the bytes of the big-endian
//! wire format with one `vpshufb` per 8 elements, where SSE2 needs shifts and masks. The loops
//! are written once, in [`portable`], as `#[inline(always)]` functions that the compiler
//! vectorizes for the features of the function they are inlined into; a caller compiled for
//! AVX2 (see [`has_avx2`]) gets the AVX2 loops, one compiled for AVX-512 the AVX-512 loops.
//! Every compilation computes exactly the same
//! results: the loops use only integer operations and IEEE-754 multiplications and conversions,
//! which do not depend on the instructions chosen. The tests check every compilation the CPU
//! runs (the dispatched one, the baseline one, and the AVX2 ones when the CPU has AVX2)
//! against references written from the documented results; the one hand-written loop,
//! [`quantize_be`]'s AVX2 version, at every alignment of its output.
//!
//! `unsafe` code in this crate is limited to calling functions compiled with
//! `#[target_feature(enable = ...)]` after [`has_avx2`] or [`Isa::detect`] found those
//! features (here and in the pipeline's `process_dispatch` and `burst`), and to the loads and
//! stores of the AVX2 quantizer.
#![allow(unsafe_code)]

/// Whether the CPU supports AVX2, so that functions compiled with
/// `#[target_feature(enable = "avx2")]` may be called (std caches the answer).
#[inline]
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The widest vectors a function may be compiled for on this CPU: the pipeline keeps one
/// compilation of its data path for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// The target's baseline (SSE2 on x86-64).
    Baseline,
    /// AVX2: 8 elements a vector.
    Avx2,
    /// AVX-512 F, BW and VL: 16 elements a vector, byte swaps included.
    Avx512,
}

impl Isa {
    /// The widest this CPU supports.
    pub(crate) fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vl")
            {
                return Isa::Avx512;
            }
        }
        if has_avx2() {
            Isa::Avx2
        } else {
            Isa::Baseline
        }
    }
}

/// Defines `pub(crate) fn $name` that runs `$body` compiled for AVX2 when the CPU has it, and
/// compiled for the baseline target otherwise (each copy out of line, so that the choice
/// between them costs the caller little).
macro_rules! dispatch {
    ($(#[$attr:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? => $body:path) => {
        $(#[$attr])*
        #[inline]
        pub(crate) fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                if has_avx2() {
                    // SAFETY: `avx2` has no requirement other than running on a CPU with
                    // AVX2, which was just detected.
                    return unsafe { avx2($($arg),*) };
                }
            }
            #[inline(never)]
            fn baseline($($arg: $ty),*) $(-> $ret)? {
                $body($($arg),*)
            }
            baseline($($arg),*)
        }
    };
}

/// Asks the CPU to start loading the cache lines of `bytes` past its first 256 bytes, so that
/// the loads of a long packet's payload overlap with the work on its header and first
/// elements. (The first lines are read at once anyway; prefetching them, or the few lines of a
/// short packet, costs more than it saves.)
#[inline(always)]
pub(crate) fn prefetch(bytes: &[u8]) {
    /// The first byte prefetched.
    const PREFETCH_FROM: usize = 256;
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // (A packet of up to 5 lines has no line worth prefetching: checking costs less than
        // the loop's set-up.)
        if bytes.len() <= PREFETCH_FROM + 64 {
            return;
        }
        let p = bytes.as_ptr();
        let mut off = PREFETCH_FROM;
        while off < bytes.len() {
            // SAFETY: prefetching has no effect on memory and does not fault; the address
            // lies within `bytes` anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off).cast()) };
            off += 64;
        }
    }
    // (Elsewhere the hardware's own prefetching has to do.)
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

dispatch! {
    /// The largest `bits & 0x7fff_ffff` (magnitude bits) of `values`; 0 for none.
    fn max_magnitude_bits(values: &[f32]) -> u32 => portable::max_magnitude_bits
}

/// `round_even_i32(x * scale)` of each value as big-endian int32 into `out`,
/// `min(values.len(), out.len() / 4)` of them; returns that number.
#[inline]
pub(crate) fn quantize_be(values: &[f32], scale: f32, out: &mut [u8]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: `x86::quantize_be_avx2` has no requirement other than running on a CPU with
        // AVX2, which was just detected.
        return unsafe { x86::quantize_be_avx2(values, scale, out) };
    }
    #[inline(never)]
    fn baseline(values: &[f32], scale: f32, out: &mut [u8]) -> usize {
        portable::quantize_be(values, scale, out);
        values.len().min(out.len() / 4)
    }
    baseline(values, scale, out)
}

dispatch! {
    /// `q as f32 * scale` of each big-endian int32 `q` of `bytes` into `out`,
    /// `min(bytes.len() / 4, out.len())` of them.
    fn dequantize_be(bytes: &[u8], scale: f32, out: &mut [f32]) => portable::dequantize_be
}

/// The loops, to be inlined into a caller compiled for the features at hand. Each processes
/// as many elements as the shorter of its two slices holds.
pub(crate) mod portable {
    #[inline(always)]
    fn be(src: &[u8]) -> i32 {
        i32::from_be_bytes([src[0], src[1], src[2], src[3]])
    }

    /// Decodes big-endian int32 elements of `bytes` into `out`.
    #[inline(always)]
    pub(crate) fn decode_be(bytes: &[u8], out: &mut [i32]) {
        for (dst, src) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *dst = be(src);
        }
    }

    /// Encodes `values` as big-endian int32 elements into `bytes`.
    #[inline(always)]
    pub(crate) fn encode_be(values: &[i32], bytes: &mut [u8]) {
        for (src, dst) in values.iter().zip(bytes.chunks_exact_mut(4)) {
            dst.copy_from_slice(&src.to_be_bytes());
        }
    }

    /// Adds big-endian int32 elements of `bytes` to `acc` with wrap-around.
    #[inline(always)]
    pub(crate) fn accumulate_be(bytes: &[u8], acc: &mut [i32]) {
        for (dst, src) in acc.iter_mut().zip(bytes.chunks_exact(4)) {
            *dst = dst.wrapping_add(be(src));
        }
    }

    /// The largest `bits & 0x7fff_ffff` (magnitude bits) of `values`; 0 for none.
    #[inline(always)]
    pub(crate) fn max_magnitude_bits(values: &[f32]) -> u32 {
        // The magnitude bits are below 2^31, so a signed max orders them as well; it is
        // cheaper than an unsigned one without SSE4.1 (no sign flips before each compare).
        let mut max_bits = 0i32;
        for v in values {
            max_bits = max_bits.max((v.to_bits() & 0x7fff_ffff) as i32);
        }
        max_bits as u32
    }

    /// `round_even_i32(x * scale)` of each value as big-endian int32 into `out`.
    #[inline(always)]
    pub(crate) fn quantize_be(values: &[f32], scale: f32, out: &mut [u8]) {
        for (x, dst) in values.iter().zip(out.chunks_exact_mut(4)) {
            let q = crate::quant::round_even_i32(x * scale);
            dst.copy_from_slice(&q.to_be_bytes());
        }
    }

    /// `q as f32 * scale` of each big-endian int32 `q` of `bytes` into `out`.
    #[inline(always)]
    pub(crate) fn dequantize_be(bytes: &[u8], scale: f32, out: &mut [f32]) {
        for (src, dst) in bytes.chunks_exact(4).zip(out.iter_mut()) {
            *dst = be(src) as f32 * scale;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    /// [`super::quantize_be`] with AVX2 intrinsics.
    ///
    /// `vcvtps2dq` converts with the rounding mode of MXCSR, round to nearest even (the mode
    /// Rust code runs in, and the one `round_even_i32` relies on as well), so for `|y| < 2^31`
    /// it gives exactly `round_even_i32(y)`. It gives `i32::MIN` for everything else (NaN,
    /// larger magnitudes), where `round_even_i32` wraps instead; so when the minimum of the
    /// results is `i32::MIN` (rare: quantization only produces `|y| < 2^31`, and `-2^31` itself
    /// is exact either way), the elements are computed again with the portable code.
    ///
    /// Returns the number of elements quantized. The tail of fewer than 8 elements and the
    /// recomputation are out of line, so that a block of whole vectors runs a leaf function
    /// that saves no registers.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_be_avx2(values: &[f32], scale: f32, out: &mut [u8]) -> usize {
        let n = values.len().min(out.len() / 4);
        let k = QuantizeConsts::new(scale);
        let (x, d) = (values.as_ptr(), out.as_mut_ptr());
        let mut min = _mm256_set1_epi32(i32::MAX);
        // One index for both slices, 32 elements a turn, the minimum as a tree: one step of
        // its chain per turn.
        let mut i = 0;
        let whole_turns = n & !31;
        while i < whole_turns {
            // SAFETY: elements i..i + 32 lie within `values` and their bytes within `out`
            // (i + 32 <= n); loads and stores are unaligned.
            unsafe {
                let q0 = quantize8(&k, x.add(i), d.add(4 * i));
                let q1 = quantize8(&k, x.add(i + 8), d.add(4 * i + 32));
                let q2 = quantize8(&k, x.add(i + 16), d.add(4 * i + 64));
                let q3 = quantize8(&k, x.add(i + 24), d.add(4 * i + 96));
                let m = _mm256_min_epi32(_mm256_min_epi32(q0, q1), _mm256_min_epi32(q2, q3));
                min = _mm256_min_epi32(min, m);
                // The source 2 KiB ahead, a line per 16 elements: with the hardware prefetcher
                // alone, quantizing a tensor block by block into packets waits on its loads
                // (`quant` bench, quantize/to_packet: 0.78 of memcpy without, 0.87 with). A
                // prefetch past the end of `values` is harmless: it changes no memory the
                // program can see, and cannot fault.
                _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add(i + PREFETCH_AHEAD).cast());
                _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add(i + PREFETCH_AHEAD + 16).cast());
            }
            i += 32;
        }
        while i + 8 <= n {
            // SAFETY: elements i..i + 8 lie within both slices.
            min = _mm256_min_epi32(min, unsafe { quantize8(&k, x.add(i), d.add(4 * i)) });
            i += 8;
        }
        let invalid = _mm256_cmpeq_epi32(min, _mm256_set1_epi32(i32::MIN));
        let invalid = _mm256_testz_si256(invalid, invalid) == 0;
        if i < n || invalid {
            tail_or_again(values, scale, out, i, n, invalid);
        }
        n
    }

    /// The end of [`quantize_be_avx2`]: elements `i..n` with the portable loop, and all `n`
    /// again when a vector's result was `i32::MIN` (`invalid`).
    #[cold]
    #[inline(never)]
    fn tail_or_again(
        values: &[f32],
        scale: f32,
        out: &mut [u8],
        i: usize,
        n: usize,
        invalid: bool,
    ) {
        let from = if invalid { 0 } else { i };
        super::portable::quantize_be(&values[from..n], scale, &mut out[4 * from..4 * n]);
    }

    /// How far ahead of the element being quantized its source is prefetched, in elements.
    const PREFETCH_AHEAD: usize = 512;

    struct QuantizeConsts {
        scale: __m256,
        bswap: __m256i,
    }

    impl QuantizeConsts {
        #[target_feature(enable = "avx2")]
        #[inline]
        unsafe fn new(scale: f32) -> QuantizeConsts {
            QuantizeConsts {
                scale: _mm256_set1_ps(scale),
                bswap: bswap32(),
            }
        }
    }

    /// The `vpshufb` control that reverses the bytes of each 32-bit lane: native
    /// (little-endian) to big-endian and back.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn bswap32() -> __m256i {
        _mm256_setr_epi8(
            3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12, //
            3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
        )
    }

    /// Quantizes the 8 floats at `x` into 32 bytes at `d`; returns the quantized lanes (in
    /// native byte order).
    ///
    /// # Safety
    /// The CPU must support AVX2; `x` must be valid for reading 8 floats and `d` for writing
    /// 32 bytes (no alignment needed).
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn quantize8(k: &QuantizeConsts, x: *const f32, d: *mut u8) -> __m256i {
        // SAFETY: the caller's guarantees.
        unsafe {
            let q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), k.scale));
            _mm256_storeu_si256(d.cast(), _mm256_shuffle_epi8(q, k.bswap));
            q
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The loops of `portable` compiled for AVX2, to compare with their references.
    #[cfg(target_arch = "x86_64")]
    mod avx2 {
        use super::portable;

        #[target_feature(enable = "avx2")]
        pub(super) unsafe fn decode_be(bytes: &[u8], out: &mut [i32]) {
            portable::decode_be(bytes, out)
        }
        #[target_feature(enable = "avx2")]
        pub(super) unsafe fn encode_be(values: &[i32], bytes: &mut [u8]) {
            portable::encode_be(values, bytes)
        }
        #[target_feature(enable = "avx2")]
        pub(super) unsafe fn accumulate_be(bytes: &[u8], acc: &mut [i32]) {
            portable::accumulate_be(bytes, acc)
        }
        #[target_feature(enable = "avx2")]
        pub(super) unsafe fn max_magnitude_bits(values: &[f32]) -> u32 {
            portable::max_magnitude_bits(values)
        }
        #[target_feature(enable = "avx2")]
        pub(super) unsafe fn dequantize_be(bytes: &[u8], scale: f32, out: &mut [f32]) {
            portable::dequantize_be(bytes, scale, out)
        }
    }

    fn bits(xs: &[f32]) -> Vec<u32> {
        xs.iter().map(|x| x.to_bits()).collect()
    }

    /// `quantize_be` as documented, written apart from `portable`: `min(values.len(),
    /// out.len() / 4)` elements, each `x * scale` rounded half to even by std's
    /// `round_ties_even` and wrapped modulo 2^32, which `round_even_i32` promises for
    /// `|x * scale| < 2^51`. Beyond that, and for NaN, `round_even_i32` leaves its value
    /// unspecified, so the reference takes that value from it.
    fn reference_quantize(values: &[f32], scale: f32, out: &mut [u8]) -> usize {
        let n = values.len().min(out.len() / 4);
        for (i, x) in values[..n].iter().enumerate() {
            let y = x * scale;
            let q = if y.abs() < 2f32.powi(51) {
                f64::from(y).round_ties_even() as i64 as i32
            } else {
                crate::quant::round_even_i32(y)
            };
            out[4 * i..4 * i + 4].copy_from_slice(&q.to_be_bytes());
        }
        n
    }

    /// `dequantize_be` as documented: `min(bytes.len() / 4, out.len())` elements.
    fn reference_dequantize(bytes: &[u8], scale: f32, out: &mut [f32]) {
        let n = (bytes.len() / 4).min(out.len());
        for i in 0..n {
            let q = i32::from_be_bytes([
                bytes[4 * i],
                bytes[4 * i + 1],
                bytes[4 * i + 2],
                bytes[4 * i + 3],
            ]);
            out[i] = q as f32 * scale;
        }
    }

    /// `max_magnitude_bits` as documented (an unsigned maximum, where the loop takes a signed
    /// one).
    fn reference_max_magnitude_bits(values: &[f32]) -> u32 {
        values
            .iter()
            .map(|v| v.to_bits() & 0x7fff_ffff)
            .max()
            .unwrap_or(0)
    }

    type Quantize = fn(&[f32], f32, &mut [u8]) -> usize;
    type Dequantize = fn(&[u8], f32, &mut [f32]);
    type MaxBits = fn(&[f32]) -> u32;

    /// The compilations of the quantizer this CPU runs, by name: the dispatched one (the one
    /// the CPU gets), the portable loop compiled for the baseline target (the one a CPU
    /// without AVX2 gets), and on a CPU with AVX2 the hand-written AVX2 loop.
    fn quantizers() -> Vec<(&'static str, Quantize)> {
        let mut q: Vec<(&'static str, Quantize)> = vec![
            ("dispatched", quantize_be),
            ("baseline", |values, scale, out| {
                portable::quantize_be(values, scale, out);
                values.len().min(out.len() / 4)
            }),
        ];
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            // SAFETY: only called on this CPU, which has AVX2 (checked above).
            q.push(("avx2", |values, scale, out| unsafe {
                x86::quantize_be_avx2(values, scale, out)
            }));
        }
        q
    }

    /// The compilations of `dequantize_be` and `max_magnitude_bits` this CPU runs, as
    /// [`quantizers`] names them.
    fn dequantizers() -> Vec<(&'static str, Dequantize, MaxBits)> {
        let mut d: Vec<(&'static str, Dequantize, MaxBits)> = vec![
            ("dispatched", dequantize_be, max_magnitude_bits),
            (
                "baseline",
                |bytes, scale, out| portable::dequantize_be(bytes, scale, out),
                |values| portable::max_magnitude_bits(values),
            ),
        ];
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            // SAFETY: only called on this CPU, which has AVX2 (checked above).
            d.push((
                "avx2",
                |bytes, scale, out| unsafe { avx2::dequantize_be(bytes, scale, out) },
                |values| unsafe { avx2::max_magnitude_bits(values) },
            ));
        }
        d
    }

    /// Says which compilations the tests compare with their references on this CPU (one
    /// without AVX2 cannot run, and so cannot check, the AVX2 ones), and checks that the
    /// run-time choice follows the CPU's features.
    #[test]
    fn kernel_compilations_checked() {
        let q: Vec<&str> = quantizers().iter().map(|(name, _)| *name).collect();
        let d: Vec<&str> = dequantizers().iter().map(|(name, ..)| *name).collect();
        eprintln!("quantize_be compared with its reference: {q:?}");
        eprintln!("dequantize_be and max_magnitude_bits compared with theirs: {d:?}");
        if !has_avx2() {
            eprintln!("this CPU has no AVX2: its loops are not checked here");
        }
        #[cfg(target_arch = "x86_64")]
        assert_eq!(has_avx2(), std::is_x86_feature_detected!("avx2"));
        assert_eq!(has_avx2(), Isa::detect() != Isa::Baseline);
        assert_eq!(q.contains(&"avx2"), has_avx2());
        assert_eq!(d.contains(&"avx2"), has_avx2());
        assert!(q.starts_with(&["dispatched", "baseline"]), "{q:?}");
        assert!(d.starts_with(&["dispatched", "baseline"]), "{d:?}");
    }

    /// Every compilation of `quantize_be` (see [`quantizers`]) against the reference, with
    /// every scale the quantizer uses, and (for some scales) at every alignment of the output:
    /// `out_len` bytes from offset 0 to 35 of a larger buffer, whose bytes outside the
    /// elements written must stay untouched.
    fn check_quantize(values: &[f32], out_len: usize) {
        let quantizers = quantizers();
        for k in -126..=127 {
            let scale = f32::from_bits(((k + 127) as u32) << 23);
            let offsets = if k % 16 == 0 { 0..36 } else { 0..1 };
            for off in offsets {
                let mut want = vec![0xA5u8; off + out_len + 4];
                let want_n = reference_quantize(values, scale, &mut want[off..off + out_len]);
                for (name, quantize) in &quantizers {
                    let mut got = vec![0xA5u8; off + out_len + 4];
                    let n = quantize(values, scale, &mut got[off..off + out_len]);
                    assert_eq!(n, want_n, "{name}: elements quantized, scale 2^{k}");
                    assert_eq!(
                        got,
                        want,
                        "{name}: scale 2^{k}, offset {off}, values {:x?}",
                        bits(values)
                    );
                }
            }
        }
    }

    #[test]
    fn quantize_edges_match_the_reference() {
        let two31 = 2147483648.0f32;
        let edges = [
            0.0f32,
            -0.0,
            0.5,
            1.5,
            2.5,
            -0.5,
            -2.5,
            8388607.5,
            two31,
            -two31,
            two31 - 128.0,
            -(two31 - 128.0),
            2.0 * two31,
            1e30,
            -1e30,
            f32::MAX,
            f32::MIN_POSITIVE / 2.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7fc0_0001),
        ];
        // Every edge alone, at every position of a 40-element block, and all together.
        for e in edges {
            for at in [0, 7, 8, 31, 32, 39] {
                let mut v = vec![1.25f32; 40];
                v[at] = e;
                check_quantize(&v, 160);
            }
        }
        check_quantize(&edges, 4 * edges.len());
        // Short outputs and short inputs.
        check_quantize(&edges, 4 * 5 + 3);
        check_quantize(&edges[..3], 400);
        check_quantize(&[], 40);
    }

    proptest! {
        #[test]
        fn quantize_matches_the_reference(
            raw in proptest::collection::vec(any::<u32>(), 0..80),
            out_len in 0usize..400,
        ) {
            let values: Vec<f32> = raw.into_iter().map(f32::from_bits).collect();
            check_quantize(&values, out_len);
        }

        /// Every compilation of `dequantize_be` and `max_magnitude_bits` (see
        /// [`dequantizers`]) against the references.
        #[test]
        fn dequantize_and_exponent_match_the_references(
            raw in proptest::collection::vec(any::<u32>(), 0..80),
            k in -126i32..=127,
        ) {
            let values: Vec<f32> = raw.iter().map(|b| f32::from_bits(*b)).collect();
            let bytes: Vec<u8> = raw.iter().flat_map(|b| b.to_be_bytes()).collect();
            let scale = f32::from_bits(((k + 127) as u32) << 23);
            let want_bits = reference_max_magnitude_bits(&values);
            for (name, dequantize, max_bits) in dequantizers() {
                prop_assert_eq!(max_bits(&values), want_bits, "{}", name);
                // At every alignment of the output, and with outputs shorter than the input;
                // the floats around the output stay untouched.
                for off in 0..9 {
                    for short in [0, 3] {
                        let len = raw.len().saturating_sub(short);
                        let mut want = vec![-1.5f32; off + raw.len() + 2];
                        let mut got = want.clone();
                        reference_dequantize(&bytes, scale, &mut want[off..off + len]);
                        dequantize(&bytes, scale, &mut got[off..off + len]);
                        prop_assert_eq!(
                            bits(&got), bits(&want), "{}: offset {} len {}", name, off, len
                        );
                    }
                }
                // Bytes that do not fill the last element.
                let mut want = vec![0f32; raw.len()];
                let mut got = want.clone();
                let cut = bytes.len().saturating_sub(1);
                reference_dequantize(&bytes[..cut], scale, &mut want);
                dequantize(&bytes[..cut], scale, &mut got);
                prop_assert_eq!(bits(&got), bits(&want), "{}: a cut element", name);
            }
        }

        /// The payload loops against the wire crate's, in both compilations.
        #[test]
        fn payload_loops_match_the_wire_crate(
            a in proptest::collection::vec(any::<i32>(), 0..300),
            b in proptest::collection::vec(any::<i32>(), 0..300),
        ) {
            let mut bytes = vec![0u8; 4 * b.len()];
            ina_wire::payload::encode_from(&b, &mut bytes);
            let mut want = a.clone();
            ina_wire::payload::accumulate(&bytes, &mut want);
            let mut got = a.clone();
            portable::accumulate_be(&bytes, &mut got);
            prop_assert_eq!(&got, &want);
            let mut want_dec = a.clone();
            ina_wire::payload::decode_into(&bytes, &mut want_dec);
            let mut got_dec = a.clone();
            portable::decode_be(&bytes, &mut got_dec);
            prop_assert_eq!(&got_dec, &want_dec);
            let mut want_enc = vec![0xA5u8; 4 * a.len() + 3];
            ina_wire::payload::encode_from(&b, &mut want_enc);
            let mut got_enc = vec![0xA5u8; 4 * a.len() + 3];
            portable::encode_be(&b, &mut got_enc);
            prop_assert_eq!(&got_enc, &want_enc);
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                let (mut acc, mut dec, mut enc) = (a.clone(), a.clone(), vec![0xA5u8; 4 * a.len() + 3]);
                // SAFETY: the CPU has AVX2.
                unsafe {
                    avx2::accumulate_be(&bytes, &mut acc);
                    avx2::decode_be(&bytes, &mut dec);
                    avx2::encode_be(&b, &mut enc);
                }
                prop_assert_eq!(acc, want);
                prop_assert_eq!(dec, want_dec);
                prop_assert_eq!(enc, want_enc);
            }
        }
    }
}
