//! Pure segmentation logic for UDP GSO (send) and GRO (receive).
//!
//! * **GSO**: the kernel accepts one buffer plus a segment size and emits
//!   it as consecutive datagrams of that size to one destination, the last
//!   one possibly shorter. [`gso_run`] finds, in a [`SendBatch`], the
//!   longest such run starting at a given datagram.
//! * **GRO**: the kernel hands over one buffer holding several datagrams of
//!   the same flow, with their common size; [`gro_split`] cuts it back into
//!   datagrams.
//!
//! The two are inverse: a run found by [`gso_run`], sent as one buffer and
//! received coalesced, splits back into the same datagram lengths.

use std::ops::Range;

use crate::SendBatch;

/// Limits of one GSO buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GsoLimits {
    /// Most datagrams in one buffer (the kernel's `UDP_MAX_SEGMENTS`, 64 on
    /// older kernels).
    pub max_segments: usize,
    /// Most payload bytes in one buffer (a UDP length is 16 bits; headers
    /// take the rest).
    pub max_bytes: usize,
}

impl GsoLimits {
    /// Limits every Linux kernel with UDP GSO accepts.
    pub const LINUX: GsoLimits = GsoLimits {
        max_segments: 64,
        max_bytes: 65_000,
    };
}

impl Default for GsoLimits {
    fn default() -> Self {
        Self::LINUX
    }
}

/// Length of the GSO run starting at datagram `start` of `batch`: the
/// number of datagrams (at least 1 if `start` is in bounds, 0 otherwise)
/// that can be sent as one GSO buffer.
///
/// A run has one destination, a segment size equal to its first
/// datagram's length (non-zero, at most `u16::MAX`), every datagram of that
/// size except possibly a shorter, non-empty last one, and fits `limits`.
/// A result of 1 means "send this datagram on its own".
pub fn gso_run<A: Copy + PartialEq>(
    batch: &SendBatch<A>,
    start: usize,
    limits: GsoLimits,
) -> usize {
    let (Some(addr), Some(seg)) = (batch.addr(start), batch.datagram_len(start)) else {
        return 0;
    };
    if seg == 0 || seg > usize::from(u16::MAX) || seg > limits.max_bytes {
        return 1;
    }
    let mut count = 1;
    let mut total = seg;
    while count < limits.max_segments {
        let i = start + count;
        let (Some(a), Some(len)) = (batch.addr(i), batch.datagram_len(i)) else {
            break;
        };
        if a != addr || len == 0 || len > seg || total + len > limits.max_bytes {
            break;
        }
        // Segments of one GSO buffer must lie back to back (datagrams sharing bytes with
        // others, or reordered, may not).
        let adjacent = match (batch.datagram_start(i - 1), batch.datagram_start(i)) {
            (Some(prev), Some(this)) => prev + total_last(batch, i - 1) == this,
            _ => false,
        };
        if !adjacent {
            break;
        }
        count += 1;
        total += len;
        if len < seg {
            break;
        }
    }
    count
}

fn total_last<A: Copy>(batch: &SendBatch<A>, i: usize) -> usize {
    batch.datagram_len(i).unwrap_or(0)
}

/// Cuts a `total`-byte coalesced buffer into datagrams of `segment` bytes
/// (the last one possibly shorter).
///
/// `segment == 0` (no GRO metadata) or `total == 0` yields the whole buffer
/// as one datagram, so the iterator always yields at least one range.
pub fn gro_split(total: usize, segment: usize) -> GroSplit {
    GroSplit {
        total,
        segment: if total == 0 { 0 } else { segment },
        next: 0,
        done: false,
    }
}

/// Iterator of byte ranges returned by [`gro_split`].
#[derive(Debug, Clone)]
pub struct GroSplit {
    total: usize,
    segment: usize,
    next: usize,
    done: bool,
}

impl Iterator for GroSplit {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        if self.done {
            return None;
        }
        if self.segment == 0 {
            self.done = true;
            return Some(0..self.total);
        }
        let start = self.next;
        let end = start.saturating_add(self.segment).min(self.total);
        self.next = end;
        if end >= self.total {
            self.done = true;
        }
        Some(start..end)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = if self.done {
            0
        } else if self.segment == 0 {
            1
        } else {
            (self.total - self.next).div_ceil(self.segment)
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for GroSplit {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn batch_of(items: &[(u8, usize)]) -> SendBatch<u8> {
        let mut b = SendBatch::new();
        for (i, &(addr, len)) in items.iter().enumerate() {
            b.push_with(addr, len, |s| s.fill(i as u8));
        }
        b
    }

    #[test]
    fn runs_examples() {
        let l = GsoLimits::LINUX;
        let b = batch_of(&[
            (1, 100),
            (1, 100),
            (1, 50),
            (1, 50),
            (2, 50),
            (2, 0),
            (2, 7),
        ]);
        assert_eq!(gso_run(&b, 0, l), 3);
        assert_eq!(gso_run(&b, 3, l), 1);
        assert_eq!(gso_run(&b, 4, l), 1);
        assert_eq!(gso_run(&b, 5, l), 1);
        assert_eq!(gso_run(&b, 6, l), 1);
        assert_eq!(gso_run(&b, 7, l), 0);
        // Limits cut runs.
        let b = batch_of(&[(1, 1000); 100]);
        assert_eq!(gso_run(&b, 0, l), 64);
        assert_eq!(gso_run(&b, 64, l), 36);
        let b = batch_of(&[(1, 1400); 100]);
        assert_eq!(gso_run(&b, 0, l), 46); // 46 * 1400 = 64 400 <= 65 000
    }

    #[test]
    fn runs_stop_where_shared_or_reordered_bytes_are_not_adjacent() {
        let l = GsoLimits::LINUX;
        let mut b: SendBatch<u8> = SendBatch::new();
        let e: Vec<_> = (0..3)
            .map(|i| {
                b.write_in_place(10, |s| {
                    s.fill(i);
                    10
                })
            })
            .collect::<Option<_>>()
            .unwrap();
        // Destination 1 gets all three (adjacent), destination 2 gets the first and third.
        for &x in &e {
            b.push_extent(1, x);
        }
        b.push_extent(2, e[0]);
        b.push_extent(2, e[2]);
        assert_eq!(gso_run(&b, 0, l), 3);
        assert_eq!(b.contiguous(0, 3).len(), 30);
        assert_eq!(gso_run(&b, 3, l), 1, "e0 and e2 are not back to back");
        assert_eq!(gso_run(&b, 4, l), 1);
    }

    #[test]
    fn split_examples() {
        let v: Vec<_> = gro_split(10, 4).collect();
        assert_eq!(v, vec![0..4, 4..8, 8..10]);
        assert_eq!(gro_split(10, 4).len(), 3);
        assert_eq!(gro_split(0, 4).collect::<Vec<_>>(), vec![0..0]);
        assert_eq!(gro_split(7, 0).collect::<Vec<_>>(), vec![0..7]);
        assert_eq!(gro_split(8, 4).collect::<Vec<_>>(), vec![0..4, 4..8]);
        assert_eq!(gro_split(3, 100).collect::<Vec<_>>(), vec![0..3]);
    }

    fn limits() -> impl Strategy<Value = GsoLimits> {
        (1usize..80, 1usize..70_000).prop_map(|(max_segments, max_bytes)| GsoLimits {
            max_segments,
            max_bytes,
        })
    }

    fn items() -> impl Strategy<Value = Vec<(u8, usize)>> {
        // Few addresses and few sizes, so that runs actually form.
        prop::collection::vec(
            (
                0u8..3,
                prop_oneof![
                    Just(0usize),
                    Just(1),
                    Just(100),
                    Just(1400),
                    0usize..2000,
                    60_000usize..70_000
                ],
            ),
            0..200,
        )
    }

    proptest! {
        #[test]
        fn gso_runs_partition_and_roundtrip_through_gro(items in items(), limits in limits()) {
            let b = batch_of(&items);
            let mut i = 0;
            while i < b.len() {
                let k = gso_run(&b, i, limits);
                prop_assert!(k >= 1);
                prop_assert!(i + k <= b.len());
                let run = &items[i..i + k];
                if k > 1 {
                    let seg = run[0].1;
                    prop_assert!(seg > 0 && seg <= usize::from(u16::MAX));
                    prop_assert!(k <= limits.max_segments);
                    let total: usize = run.iter().map(|r| r.1).sum();
                    prop_assert!(total <= limits.max_bytes);
                    prop_assert_eq!(b.contiguous(i, k).len(), total);
                    for (j, r) in run.iter().enumerate() {
                        prop_assert_eq!(r.0, run[0].0);
                        if j + 1 < k {
                            prop_assert_eq!(r.1, seg);
                        } else {
                            prop_assert!(r.1 > 0 && r.1 <= seg);
                        }
                    }
                    // What GRO would hand back is exactly the run.
                    let lens: Vec<usize> = gro_split(total, seg).map(|r| r.len()).collect();
                    let want: Vec<usize> = run.iter().map(|r| r.1).collect();
                    prop_assert_eq!(lens, want);
                }
                // Greedy: a run ending on a full-size datagram could not take the next one.
                let last = run[k - 1].1;
                if i + k < b.len() && last == run[0].1 && run[0].1 > 0 {
                    let (na, nl) = items[i + k];
                    let total: usize = run.iter().map(|r| r.1).sum();
                    prop_assert!(
                        na != run[0].0
                            || nl == 0
                            || nl > run[0].1
                            || total + nl > limits.max_bytes
                            || k >= limits.max_segments
                            || run[0].1 > usize::from(u16::MAX)
                            || run[0].1 > limits.max_bytes
                    );
                }
                i += k;
            }
            prop_assert_eq!(gso_run(&b, b.len(), limits), 0);
        }

        #[test]
        fn gro_split_covers_buffer(total in 0usize..200_000, segment in 0usize..70_000) {
            let ranges: Vec<_> = gro_split(total, segment).collect();
            prop_assert!(!ranges.is_empty());
            prop_assert_eq!(gro_split(total, segment).len(), ranges.len());
            prop_assert_eq!(ranges[0].start, 0);
            prop_assert_eq!(ranges[ranges.len() - 1].end, total);
            for w in ranges.windows(2) {
                prop_assert_eq!(w[0].end, w[1].start);
            }
            if segment == 0 || total == 0 {
                prop_assert_eq!(ranges.len(), 1);
            } else {
                prop_assert_eq!(ranges.len(), total.div_ceil(segment));
                for (j, r) in ranges.iter().enumerate() {
                    if j + 1 < ranges.len() {
                        prop_assert_eq!(r.len(), segment);
                    } else {
                        prop_assert!(!r.is_empty() && r.len() <= segment);
                    }
                }
            }
        }
    }
}
