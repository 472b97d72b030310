//! Sparse all-reduce (PROTOCOL.md §5, "Sparse streams"): the support a rank sends and the
//! blocks it must clean (one scan), the union the summed supports give, the choice of mode,
//! and the values stream of a generated tensor ([`UnionSource`]); the values stream of a
//! tensor in memory runs in place (`stream::Tensor::Blocks`). Every function here is pure; the
//! worker and the simulator run the two streams.

use crate::stream::Source;

/// How a rank all-reduces a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Every block.
    #[default]
    Dense,
    /// The support, then the union's blocks.
    Sparse,
    /// Sparse or dense, from the union density the previous all-reduce of a tensor of the
    /// same shape measured ([`ModeChooser`]).
    Auto,
}

impl core::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "dense" => Ok(Mode::Dense),
            "sparse" => Ok(Mode::Sparse),
            "auto" => Ok(Mode::Auto),
            other => Err(format!("mode `{other}`: one of dense, sparse, auto")),
        }
    }
}

/// The union density from which [`Mode::Auto`] sends a tensor dense: above it, the support
/// and the second stream's start cost more than the zero blocks save.
pub const AUTO_DENSE_FROM: f64 = 0.9;

/// [`Mode::Auto`]'s memory: the union density last measured per tensor shape (length and
/// element type). Every rank measures the same densities from the same results, so every rank
/// decides the same without asking the others.
#[derive(Debug, Clone, Default)]
pub struct ModeChooser {
    measured: Vec<((usize, bool), f64)>,
}

impl ModeChooser {
    /// Whether a tensor of `len` elements (float32 if `float`) goes sparse under `mode`.
    pub fn sparse(&self, mode: Mode, len: usize, float: bool) -> bool {
        match mode {
            Mode::Dense => false,
            Mode::Sparse => true,
            Mode::Auto => self
                .measured
                .iter()
                .find(|(shape, _)| *shape == (len, float))
                .is_none_or(|(_, u)| *u < AUTO_DENSE_FROM),
        }
    }

    /// Notes the union density an all-reduce of this shape measured.
    pub fn record(&mut self, len: usize, float: bool, union_density: f64) {
        match self.measured.iter_mut().find(|(s, _)| *s == (len, float)) {
            Some((_, u)) => *u = union_density,
            None => self.measured.push(((len, float), union_density)),
        }
    }
}

/// Blocks of `elems_per_block` elements in a tensor of `len`.
pub fn blocks(len: usize, elems_per_block: usize) -> usize {
    len.div_ceil(elems_per_block.max(1))
}

/// Elements of the support stream's tensor: one per block, padded to whole packets.
pub fn support_len(len: usize, elems_per_block: usize) -> usize {
    let e = elems_per_block.max(1);
    blocks(len, e).div_ceil(e) * e
}

/// An element type a sparse all-reduce handles.
pub trait Element: Copy + PartialEq + Default {
    /// Whether a block whose elements are `block` is held by this rank: one element is not
    /// zero, and (float32) its largest magnitude reaches `threshold`.
    fn held(block: &[Self], threshold: f32) -> bool;
    /// Whether every element of `block` is zero in every bit (+0.0 for float32).
    fn all_bits_zero(block: &[Self]) -> bool;
    /// [`Self::held`], and else [`Self::all_bits_zero`].
    fn classify(block: &[Self], threshold: f32) -> (bool, bool) {
        if Self::held(block, threshold) {
            (true, false)
        } else {
            (false, Self::all_bits_zero(block))
        }
    }
}

/// The bitwise OR of every element's bits: a pass the compiler vectorizes.
fn f32_bits_or(block: &[f32]) -> u32 {
    let mut acc = [0u32; 16];
    let mut chunks = block.chunks_exact(16);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a |= x.to_bits();
        }
    }
    let rest = chunks.remainder().iter().fold(0, |a, x| a | x.to_bits());
    acc.iter().fold(rest, |a, x| a | x)
}

impl Element for f32 {
    fn held(block: &[f32], threshold: f32) -> bool {
        if threshold <= 0.0 {
            // Some element other than ±0.0 (NaN included: the values stream carries it, and
            // the result reports it); a dense block decides in its first 64 elements.
            return block.chunks(64).any(|c| f32_bits_or(c) & 0x7fff_ffff != 0);
        }
        block
            .iter()
            .any(|x| x.is_nan() || (*x != 0.0 && x.abs() >= threshold))
    }

    fn all_bits_zero(block: &[f32]) -> bool {
        f32_bits_or(block) == 0
    }

    fn classify(block: &[f32], threshold: f32) -> (bool, bool) {
        if threshold > 0.0 {
            return (Self::held(block, threshold), Self::all_bits_zero(block));
        }
        // One pass: a dense block decides in its first 64 elements; the others are read once.
        let mut signs = 0;
        for c in block.chunks(64) {
            let or = f32_bits_or(c);
            if or & 0x7fff_ffff != 0 {
                return (true, false);
            }
            signs |= or;
        }
        (false, signs == 0)
    }
}

impl Element for i32 {
    fn held(block: &[i32], _threshold: f32) -> bool {
        block.iter().fold(0, |a, x| a | x) != 0
    }

    fn all_bits_zero(block: &[i32]) -> bool {
        !Self::held(block, 0.0)
    }
}

/// This rank's support of `data`: element `b` is 1 if it holds block `b`, else 0; padded with
/// zeros to [`support_len`].
pub fn support<T: Element>(data: &[T], elems_per_block: usize, threshold: f32) -> Vec<i32> {
    scan(data, elems_per_block, threshold).0
}

/// [`support`], and the blocks this rank does not hold that are not all +0.0 (-0.0, or values
/// under `threshold`): the only ones a sparse all-reduce run in place
/// ([`Tensor::Blocks`](crate::stream::Tensor::Blocks)) must write zeros into, since every
/// other block is either in the union (and gets its result) or +0.0 already.
pub fn scan<T: Element>(
    data: &[T],
    elems_per_block: usize,
    threshold: f32,
) -> (Vec<i32>, Vec<usize>) {
    let e = elems_per_block.max(1);
    let mut s = vec![0i32; support_len(data.len(), e)];
    let mut unclean = Vec::new();
    for (b, block) in data.chunks(e).enumerate() {
        match T::classify(block, threshold) {
            (true, _) => s[b] = 1,
            (false, false) => unclean.push(b),
            (false, true) => {}
        }
    }
    (s, unclean)
}

/// The union: the blocks some rank holds, in increasing order, from the summed supports
/// `sums` of a tensor of `blocks` blocks.
pub fn union(sums: &[i32], blocks: usize) -> Vec<usize> {
    sums.iter()
        .take(blocks)
        .enumerate()
        .filter(|(_, &c)| c != 0)
        .map(|(b, _)| b)
        .collect()
}

/// The fraction of `blocks` blocks in the union.
pub fn density(union: &[usize], blocks: usize) -> f64 {
    if blocks == 0 {
        return 0.0;
    }
    union.len() as f64 / blocks as f64
}

/// The union density a dense result measures: the fraction of its blocks with an element that
/// is not zero. Every rank holds the same result, so every rank measures the same density.
pub fn result_density<T: Element>(result: &[T], elems_per_block: usize) -> f64 {
    let e = elems_per_block.max(1);
    let total = blocks(result.len(), e);
    if total == 0 {
        return 0.0;
    }
    let held = result.chunks(e).filter(|b| T::held(b, 0.0)).count();
    held as f64 / total as f64
}

/// A generated float32 tensor's support (see [`support`]), read block by block from `source`.
pub fn source_support(source: &mut dyn Source, elems_per_block: usize, threshold: f32) -> Vec<i32> {
    let e = elems_per_block.max(1);
    let len = source.len();
    let mut s = vec![0i32; support_len(len, e)];
    let mut block = vec![0f32; e];
    for (b, start) in (0..len).step_by(e).enumerate() {
        let x = &mut block[..e.min(len - start)];
        source.input(start, x);
        s[b] = i32::from(f32::held(x, threshold));
    }
    s
}

/// A generated tensor's values stream (over a [`Source`]): the
/// blocks of the union, concatenated; a block this rank does not hold reads as zeros. Once the
/// union is known ([`UnionSource::set_union`]), the blocks outside it are given to the source's
/// result as zeros at once: their sums need no packet.
#[derive(Debug, Clone, PartialEq)]
pub struct UnionSource<S> {
    inner: S,
    union: Vec<usize>,
    elems_per_block: usize,
    threshold: f32,
}

impl<S: Source> UnionSource<S> {
    /// The values stream of `inner`, with an empty union until [`Self::set_union`].
    pub fn new(inner: S, elems_per_block: usize, threshold: f32) -> UnionSource<S> {
        UnionSource {
            inner,
            union: Vec::new(),
            elems_per_block: elems_per_block.max(1),
            threshold,
        }
    }

    /// The tensor whose blocks this reads.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The tensor whose blocks this reads.
    pub fn inner_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The tensor whose blocks this reads.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Sets the union (increasing block indices) and gives zeros to the source's result for
    /// every block outside it.
    pub fn set_union(&mut self, union: Vec<usize>) {
        let e = self.elems_per_block;
        let zeros = vec![0f32; e];
        let len = self.inner.len();
        let mut next = union.iter().peekable();
        for (b, start) in (0..len).step_by(e).enumerate() {
            if next.peek() == Some(&&b) {
                next.next();
                continue;
            }
            self.inner.result(start, &zeros[..e.min(len - start)]);
        }
        self.union = union;
    }

    /// The block `b` of the source and its length.
    fn block(&self, b: usize) -> (usize, usize) {
        let start = b * self.elems_per_block;
        (start, self.elems_per_block.min(self.inner.len() - start))
    }

    /// Maps `start..start + n` of the concatenation onto the union's blocks: calls `f` with
    /// (block, offset within it, offset within the request, count).
    fn pieces(&self, start: usize, n: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
        let e = self.elems_per_block;
        let mut done = 0;
        while done < n {
            let at = start + done;
            let (i, within) = (at / e, at % e);
            let Some(&b) = self.union.get(i) else {
                return;
            };
            let (_, len) = self.block(b);
            let take = (len - within).min(n - done);
            f(b, within, done, take);
            done += take;
        }
    }
}

impl<S: Source> Source for UnionSource<S> {
    fn len(&self) -> usize {
        self.union.iter().map(|&b| self.block(b).1).sum()
    }

    fn input(&mut self, start: usize, out: &mut [f32]) {
        let mut pieces = Vec::new();
        self.pieces(start, out.len(), |b, within, at, n| {
            pieces.push((b, within, at, n))
        });
        let mut block = vec![0f32; self.elems_per_block];
        for (b, within, at, n) in pieces {
            let (bstart, len) = self.block(b);
            let x = &mut block[..len];
            self.inner.input(bstart, x);
            if !f32::held(x, self.threshold) {
                x.fill(0.0);
            }
            out[at..at + n].copy_from_slice(&x[within..within + n]);
        }
    }

    fn result(&mut self, start: usize, values: &[f32]) {
        let mut pieces = Vec::new();
        self.pieces(start, values.len(), |b, within, at, n| {
            pieces.push((b, within, at, n))
        });
        for (b, within, at, n) in pieces {
            let bstart = self.block(b).0;
            self.inner.result(bstart + within, &values[at..at + n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition of the values stream's tensor (run in place by `stream::Tensor::Blocks`):
    /// the blocks of `union` concatenated in order, a block this rank does not hold (under
    /// `threshold`) as zeros.
    fn gather<T: Element>(
        data: &[T],
        elems_per_block: usize,
        union: &[usize],
        threshold: f32,
    ) -> Vec<T> {
        let e = elems_per_block.max(1);
        let mut out = Vec::with_capacity(union.len() * e);
        for &b in union {
            let block = &data[b * e..((b + 1) * e).min(data.len())];
            if T::held(block, threshold) {
                out.extend_from_slice(block);
            } else {
                out.extend(core::iter::repeat_n(T::default(), block.len()));
            }
        }
        out
    }

    /// Writes the values stream's result `values` back into the blocks of `union`, and zeros
    /// (+0.0) into every other block.
    fn scatter<T: Element>(data: &mut [T], elems_per_block: usize, union: &[usize], values: &[T]) {
        let e = elems_per_block.max(1);
        let mut next = union.iter().peekable();
        let mut at = 0;
        for (b, block) in data.chunks_mut(e).enumerate() {
            if next.peek() == Some(&&b) {
                next.next();
                let n = block.len();
                block.copy_from_slice(&values[at..at + n]);
                at += n;
            } else {
                block.fill(T::default());
            }
        }
    }

    #[test]
    fn zero_blocks_are_not_held_and_a_threshold_drops_small_ones() {
        let e = 4;
        let data = [
            0.0, -0.0, 0.0, 0.0, 0.0, 1e-9, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, -0.0,
        ];
        assert_eq!(support(&data, e, 0.0), vec![0, 1, 1, 0]);
        assert_eq!(support(&data, e, 1e-6), vec![0, 0, 1, 0]);
        assert_eq!(support(&[0i32, 0, 7, 0, 0], 2, 0.0), vec![0, 1, 0, 0]);
        assert_eq!(support_len(13, 4), 4);
        assert_eq!(support_len(1000, 4), 252);
    }

    #[test]
    fn auto_goes_sparse_until_a_dense_union_was_measured() {
        let mut c = ModeChooser::default();
        assert!(c.sparse(Mode::Auto, 100, true));
        assert!(!c.sparse(Mode::Dense, 100, true));
        c.record(100, true, 0.95);
        assert!(!c.sparse(Mode::Auto, 100, true));
        // Another shape has its own memory.
        assert!(c.sparse(Mode::Auto, 100, false));
        c.record(100, true, 0.2);
        assert!(c.sparse(Mode::Auto, 100, true));
        assert!(c.sparse(Mode::Sparse, 100, true));
        assert_eq!("auto".parse::<Mode>(), Ok(Mode::Auto));
        assert!("sometimes".parse::<Mode>().is_err());
    }

    /// The generated tensor of the simulator: element `i` is `f(i)`, results kept.
    #[derive(Debug)]
    struct Gen {
        data: Vec<f32>,
        out: Vec<f32>,
    }

    impl Source for Gen {
        fn len(&self) -> usize {
            self.data.len()
        }
        fn input(&mut self, start: usize, out: &mut [f32]) {
            out.copy_from_slice(&self.data[start..start + out.len()]);
        }
        fn result(&mut self, start: usize, values: &[f32]) {
            self.out[start..start + values.len()].copy_from_slice(values);
        }
    }

    fn sparse_tensor(len: usize, e: usize, held: &[bool]) -> Vec<f32> {
        (0..len)
            .map(|i| {
                if held[(i / e) % held.len()] && i % 3 != 0 {
                    (i as f32) * 0.5 - 7.0
                } else {
                    0.0
                }
            })
            .collect()
    }

    proptest! {
        /// The vectorized `held` is its definition: some element is NaN, or the largest
        /// magnitude is not zero and reaches the threshold.
        #[test]
        fn held_is_its_definition(
            block in proptest::collection::vec(
                prop_oneof![
                    Just(0.0f32), Just(-0.0f32), Just(f32::NAN), Just(f32::INFINITY),
                    Just(f32::MIN_POSITIVE / 2.0), -2.0f32..2.0,
                ],
                0..40,
            ),
            threshold in prop_oneof![Just(0.0f32), 0.0f32..1.5],
        ) {
            let max = block.iter().fold(0f32, |m, x| m.max(x.abs()));
            let defined = block.iter().any(|x| x.is_nan()) || (max != 0.0 && max >= threshold);
            prop_assert_eq!(f32::held(&block, threshold), defined);
            let clean = block.iter().all(|x| x.to_bits() == 0);
            prop_assert_eq!(
                <f32 as Element>::classify(&block, threshold),
                (defined, !defined && clean)
            );
            prop_assert_eq!(
                f32::all_bits_zero(&block),
                block.iter().all(|x| x.to_bits() == 0)
            );
            let ints: Vec<i32> = block.iter().map(|x| x.to_bits() as i32 & 7).collect();
            prop_assert_eq!(i32::held(&ints, 0.0), ints.iter().any(|&x| x != 0));
        }

        /// Over ranks with any supports, summing the gathered values and scattering them back
        /// gives every rank the dense sum (exactly, for integers), and the support counts
        /// each block's holders.
        #[test]
        fn the_union_round_trip_is_the_dense_sum(
            len in 1usize..300,
            e in 1usize..20,
            ranks in proptest::collection::vec(proptest::collection::vec(any::<bool>(), 1..8), 1..5),
        ) {
            let tensors: Vec<Vec<i32>> = ranks
                .iter()
                .map(|held| {
                    sparse_tensor(len, e, held).iter().map(|x| (*x * 2.0) as i32).collect()
                })
                .collect();
            let nblocks = blocks(len, e);
            let mut sums = vec![0i32; support_len(len, e)];
            for t in &tensors {
                for (s, x) in sums.iter_mut().zip(support(t, e, 0.0)) {
                    *s += x;
                }
            }
            let u = union(&sums, nblocks);
            for b in 0..nblocks {
                let holders = tensors
                    .iter()
                    .filter(|t| i32::held(&t[b * e..((b + 1) * e).min(len)], 0.0))
                    .count();
                prop_assert_eq!(sums[b] as usize, holders);
                prop_assert_eq!(u.contains(&b), holders > 0);
            }
            let mut values = vec![0i32; u.iter().map(|&b| e.min(len - b * e)).sum()];
            for t in &tensors {
                let g = gather(t, e, &u, 0.0);
                prop_assert_eq!(g.len(), values.len());
                for (v, x) in values.iter_mut().zip(g) {
                    *v = v.wrapping_add(x);
                }
            }
            let dense: Vec<i32> = (0..len)
                .map(|i| tensors.iter().fold(0i32, |a, t| a.wrapping_add(t[i])))
                .collect();
            for t in &tensors {
                let mut r = t.clone();
                scatter(&mut r, e, &u, &values);
                prop_assert_eq!(&r, &dense);
            }
        }

        /// A generated tensor's union source reads and writes what gather and scatter do.
        #[test]
        fn the_union_source_is_gather_and_scatter(
            len in 1usize..200,
            e in 1usize..16,
            held in proptest::collection::vec(any::<bool>(), 1..6),
            chunk in 1usize..40,
        ) {
            let data = sparse_tensor(len, e, &held);
            let mut g = Gen { data: data.clone(), out: vec![f32::NAN; len] };
            let s = source_support(&mut g, e, 0.0);
            prop_assert_eq!(&s, &support(&data, e, 0.0));
            let u = union(&s, blocks(len, e));
            let gathered = gather(&data, e, &u, 0.0);
            let mut src = UnionSource::new(&mut g, e, 0.0);
            src.set_union(u.clone());
            prop_assert_eq!(src.len(), gathered.len());
            let mut read = vec![0f32; gathered.len()];
            for start in (0..read.len()).step_by(chunk) {
                let end = (start + chunk).min(read.len());
                src.input(start, &mut read[start..end]);
            }
            prop_assert_eq!(&read, &gathered);
            let doubled: Vec<f32> = gathered.iter().map(|x| x * 2.0).collect();
            for start in (0..doubled.len()).step_by(chunk) {
                let end = (start + chunk).min(doubled.len());
                src.result(start, &doubled[start..end]);
            }
            let mut expected = data.clone();
            scatter(&mut expected, e, &u, &doubled);
            prop_assert_eq!(g.out, expected);
        }
    }

    #[test]
    fn a_scan_names_the_blocks_to_clean() {
        let data = [1.0f32, 0.0, -0.0, 0.0, 0.0, 0.0, 0.25, 0.0, 0.0];
        let (s, unclean) = scan(&data, 2, 0.5);
        // Blocks: held, -0.0, +0.0, under the threshold, a short +0.0 one (padded to 6).
        assert_eq!(s, vec![1, 0, 0, 0, 0, 0]);
        assert_eq!(unclean, vec![1, 3]);
        assert_eq!(scan(&data, 2, 0.0), (vec![1, 0, 0, 1, 0, 0], vec![1]));
    }

    #[test]
    fn a_dense_result_measures_the_union_density() {
        let r = [0.0f32, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, -2.0];
        assert_eq!(result_density(&r, 2), 0.5);
        assert_eq!(result_density::<f32>(&[], 2), 0.0);
        assert_eq!(density(&[1, 3], 8), 0.25);
    }
}
