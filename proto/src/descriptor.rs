//! The stream descriptor: the first use of every stream, through which the ranks of a job
//! find out whether they all-reduce the same thing (PROTOCOL.md §5, "The descriptor").
//!
//! A switch only adds, so each rank sends, for every field of its descriptor, the field's
//! value `v` and its square `v²` in 8-bit limbs. Over `m` contributors the sums are
//! `S1 = Σv` and `S2 = Σv²`, and by Cauchy–Schwarz `m·S2 = S1²` exactly when every rank sent
//! the same `v`. A limb that is 1 for every rank counts the contributors (`S1 = m`), so a
//! rank also learns how many workers really contributed. Every rank receives the same sums,
//! so every rank finds a mismatch, and names it.
//!
//! The fields are the tensor's length, its element type and the number of workers the rank
//! believes every sum covers. With fewer than [`FULL_ELEMS`] elements per packet the fields
//! are replaced by a 32-bit digest of them (then a mismatch is found, with a chance of
//! 2^-32 of missing it, but not named field by field).

/// Elements a descriptor takes with its fields in full.
pub const FULL_ELEMS: usize = 2 * FULL_LIMBS;

/// Limbs of the full descriptor: the count, 6 of the length, 1 of the type, 2 of the workers.
const FULL_LIMBS: usize = 10;

/// Limbs of the digest descriptor: the count and 3 bytes of the digest.
const DIGEST_LIMBS: usize = 4;

/// What a rank all-reduces, as its descriptor says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// Elements of the tensor (at most 2^48 − 1 are told apart).
    pub elements: u64,
    /// Whether they are float32 (else int32).
    pub float: bool,
    /// Whether the stream is the support of a sparse all-reduce of such a tensor (PROTOCOL.md
    /// §5, "Sparse streams"): element type 3 or 4 instead of 1 or 2.
    pub support: bool,
    /// The workers every sum covers, as this rank believes.
    pub total_workers: u16,
}

/// How the ranks' descriptors differ, as the sums of one descriptor use show.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("{contributed} workers contributed to the job's sums, but this rank counts {ours} (--workers, or the tree's total): every rank must count the same")]
    Workers { ours: u16, contributed: u64 },
    #[error("the ranks all-reduce tensors of different lengths: this rank {ours} elements, the ranks' mean about {mean}")]
    Length { ours: u64, mean: u64 },
    #[error(
        "the ranks all-reduce different element types or modes: this rank {ours}, not every rank"
    )]
    Type { ours: &'static str },
    #[error("the ranks all-reduce different tensors (their lengths, element types or worker counts differ)")]
    Differs,
}

impl Descriptor {
    fn limbs(&self, elems: usize) -> Vec<u8> {
        let mut limbs = vec![1u8];
        if elems >= FULL_ELEMS {
            limbs.extend_from_slice(&self.elements.to_le_bytes()[..6]);
            limbs.push(self.type_code());
            limbs.extend_from_slice(&self.total_workers.to_le_bytes());
        } else {
            let digest = self.digest().to_le_bytes();
            let room = (elems / 2).saturating_sub(1).min(DIGEST_LIMBS - 1);
            limbs.extend_from_slice(&digest[..room]);
        }
        limbs.truncate(elems / 2);
        limbs
    }

    /// The element-type field: 1 float32, 2 int32, 3 and 4 the support of a sparse all-reduce
    /// of either.
    fn type_code(&self) -> u8 {
        1 + u8::from(!self.float) + 2 * u8::from(self.support)
    }

    /// The element type and mode, as an error names them.
    fn type_name(&self) -> &'static str {
        match (self.float, self.support) {
            (true, false) => "float32",
            (false, false) => "int32",
            (true, true) => "sparse float32",
            (false, true) => "sparse int32",
        }
    }

    /// FNV-1a over the fields.
    fn digest(&self) -> u32 {
        let mut h: u32 = 0x811c_9dc5;
        let bytes = self
            .elements
            .to_le_bytes()
            .into_iter()
            .chain([self.type_code()])
            .chain(self.total_workers.to_le_bytes());
        for b in bytes {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
        h
    }

    /// The values this rank sends in a packet of `elems` elements: the limbs, then their
    /// squares, then zeros.
    pub fn encode(&self, elems: usize) -> Vec<i32> {
        let limbs = self.limbs(elems);
        let mut v = vec![0i32; elems];
        for (k, &l) in limbs.iter().enumerate() {
            v[k] = i32::from(l);
            v[limbs.len() + k] = i32::from(l) * i32::from(l);
        }
        v
    }

    /// Checks the summed descriptors `sums` (as the switch returned them) against this rank's.
    pub fn check(&self, sums: &[i32]) -> Result<(), Mismatch> {
        let n = self.limbs(sums.len()).len();
        if n == 0 {
            return Ok(());
        }
        let s1 = |k: usize| i128::from(sums[k]);
        let s2 = |k: usize| i128::from(sums[n + k]);
        let contributed = s1(0);
        if contributed != i128::from(self.total_workers) {
            return Err(Mismatch::Workers {
                ours: self.total_workers,
                contributed: u64::try_from(contributed).unwrap_or(0),
            });
        }
        let m = contributed;
        let agree = |k: usize| m * s2(k) == s1(k) * s1(k);
        if sums.len() < FULL_ELEMS {
            return if (1..n).all(agree) {
                Ok(())
            } else {
                Err(Mismatch::Differs)
            };
        }
        if !(1..7).all(agree) {
            let total: i128 = (1..7).map(|k| s1(k) << (8 * (k - 1))).sum();
            let mean = u64::try_from((total + m / 2) / m).unwrap_or(u64::MAX);
            return Err(Mismatch::Length {
                ours: self.elements,
                mean,
            });
        }
        if !agree(7) {
            return Err(Mismatch::Type {
                ours: self.type_name(),
            });
        }
        if !(8..10).all(agree) {
            // (A rank that counts differently would have shown in the count.)
            return Err(Mismatch::Differs);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sum(ds: &[Descriptor], elems: usize) -> Vec<i32> {
        let mut s = vec![0i32; elems];
        for d in ds {
            for (a, b) in s.iter_mut().zip(d.encode(elems)) {
                *a = a.wrapping_add(b);
            }
        }
        s
    }

    fn d(elements: u64, float: bool, total_workers: u16) -> Descriptor {
        Descriptor {
            elements,
            float,
            support: false,
            total_workers,
        }
    }

    #[test]
    fn each_mismatch_is_named() {
        let e = 64;
        let ok = [d(100_000, true, 2), d(100_000, true, 2)];
        assert_eq!(ok[0].check(&sum(&ok, e)), Ok(()));
        let lengths = [d(100_000, true, 2), d(300_000, true, 2)];
        for r in &lengths {
            match r.check(&sum(&lengths, e)) {
                Err(Mismatch::Length { ours, mean }) => {
                    assert_eq!((ours, mean), (r.elements, 200_000));
                }
                other => panic!("{other:?}"),
            }
        }
        let mut sparse = d(1000, true, 2);
        sparse.support = true;
        let modes = [d(1000, true, 2), sparse];
        assert!(matches!(
            modes[1].check(&sum(&modes, e)),
            Err(Mismatch::Type {
                ours: "sparse float32"
            })
        ));
        let types = [d(1000, true, 2), d(1000, false, 2)];
        assert!(matches!(
            types[1].check(&sum(&types, e)),
            Err(Mismatch::Type { ours: "int32" })
        ));
        // One rank understates the workers: every rank sees that 3 contributed.
        let workers = [d(1000, true, 3), d(1000, true, 3), d(1000, true, 2)];
        let s = sum(&workers, e);
        assert_eq!(
            workers[2].check(&s),
            Err(Mismatch::Workers {
                ours: 2,
                contributed: 3
            })
        );
        // The ranks that count right still see that someone disagrees.
        assert_eq!(workers[0].check(&s), Err(Mismatch::Differs));
    }

    #[test]
    fn small_packets_compare_a_digest() {
        for e in [8usize, 12, 16] {
            let ok = [d(7, false, 4); 4];
            assert_eq!(ok[0].check(&sum(&ok, e)), Ok(()));
            let mut bad = ok;
            bad[3].elements = 8;
            assert_eq!(
                bad[0].check(&sum(&bad, e)),
                Err(Mismatch::Differs),
                "E = {e}"
            );
        }
    }

    proptest! {
        /// Equal descriptors always pass; any two different ones among up to 1024 ranks are
        /// always found (with the full fields).
        #[test]
        fn equal_pass_and_different_are_found(
            elements in 0u64..(1 << 48),
            other in 0u64..(1 << 48),
            float: bool,
            n in 2u16..=1024,
            odd in 0u16..1024,
        ) {
            let e = 64;
            let same = vec![d(elements, float, n); usize::from(n)];
            prop_assert_eq!(same[0].check(&sum(&same, e)), Ok(()));
            let mut diff = same.clone();
            let at = usize::from(odd % n);
            diff[at].elements = other;
            let verdict = diff[0].check(&sum(&diff, e));
            prop_assert_eq!(verdict.is_ok(), other == elements);
        }
    }
}
