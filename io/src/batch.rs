//! Reusable batch buffers: [`RecvBatch`] and [`SendBatch`].

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Largest slot size a [`RecvBatch`] allocates (a UDP payload is at most
/// 65 507 bytes over IPv4, 65 527 over IPv6).
pub const MAX_SLOT_SIZE: usize = 65_536;

/// Largest number of slots a [`RecvBatch`] allocates.
pub const MAX_SLOTS: usize = 65_536;

/// One received datagram, borrowed from a [`RecvBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a, A = SocketAddr> {
    /// The sender.
    pub addr: A,
    /// The bytes (at most the batch's slot size).
    pub data: &'a [u8],
    /// The datagram was larger than the slot; `data` holds only its first
    /// `slot_size` bytes.
    pub truncated: bool,
}

#[derive(Debug, Clone, Copy)]
struct RecvMeta<A> {
    addr: A,
    /// Offset of the datagram's first byte in the batch's buffer.
    start: usize,
    len: usize,
    truncated: bool,
}

/// Source of lease numbers (see [`RecvBatch::exchange`]); 0 means "no lease".
static NEXT_LEASE: AtomicU64 = AtomicU64::new(1);

/// Preallocated receive buffers: `capacity` slots of `slot_size` bytes each,
/// filled by [`Port::recv_batch`](crate::Port::recv_batch).
///
/// The slots are one contiguous allocation made by [`RecvBatch::new`];
/// receiving into the batch never allocates. Ports fill it with
/// [`free_slot`](RecvBatch::free_slot) + [`commit`](RecvBatch::commit) or
/// [`push`](RecvBatch::push); users read it with [`get`](RecvBatch::get) or
/// [`iter`](RecvBatch::iter).
///
/// A port that receives into buffers of its own (UDP GRO: several datagrams
/// coalesced in one buffer) can instead hand its whole buffer to the batch in
/// exchange for the batch's ([`exchange`](RecvBatch::exchange)) and record
/// where each datagram lies in it, so that the datagrams are delivered
/// without being copied. Every later write into the slots ends that lease.
pub struct RecvBatch<A = SocketAddr> {
    buf: Vec<u8>,
    slot_size: usize,
    slots: usize,
    meta: Vec<RecvMeta<A>>,
    /// Nonzero while `buf` is a buffer handed over by a port and unchanged
    /// since (apart from delivered datagrams, through `data_mut`).
    lease: u64,
}

impl<A> fmt::Debug for RecvBatch<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvBatch")
            .field("len", &self.meta.len())
            .field("capacity", &self.slots)
            .field("slot_size", &self.slot_size)
            .finish_non_exhaustive()
    }
}

impl<A: Copy> RecvBatch<A> {
    /// A batch of `slots` slots of `slot_size` bytes each.
    ///
    /// `slots` is clamped to `1..=MAX_SLOTS` and `slot_size` to
    /// `0..=MAX_SLOT_SIZE`; `slots * slot_size` bytes are allocated now and
    /// never again.
    pub fn new(slots: usize, slot_size: usize) -> Self {
        let slots = slots.clamp(1, MAX_SLOTS);
        let slot_size = slot_size.min(MAX_SLOT_SIZE);
        Self {
            buf: vec![0; slots * slot_size],
            slot_size,
            slots,
            meta: Vec::with_capacity(slots),
            lease: 0,
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots
    }

    /// Size of each slot in bytes: the largest datagram stored whole.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Number of datagrams held.
    pub fn len(&self) -> usize {
        self.meta.len()
    }

    /// No datagram held.
    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }

    /// Every slot is used.
    pub fn is_full(&self) -> bool {
        self.meta.len() >= self.slots
    }

    /// Number of free slots.
    pub fn remaining(&self) -> usize {
        self.slots - self.meta.len()
    }

    /// Forgets the datagrams held (keeps the memory).
    pub fn clear(&mut self) {
        self.meta.clear();
    }

    /// The `i`-th datagram.
    pub fn get(&self, i: usize) -> Option<Datagram<'_, A>> {
        let m = self.meta.get(i)?;
        Some(Datagram {
            addr: m.addr,
            data: self.buf.get(m.start..m.start + m.len)?,
            truncated: m.truncated,
        })
    }

    /// The `i`-th datagram's bytes, mutable (e.g. to rewrite a header in
    /// place before copying it elsewhere).
    pub fn data_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        let m = self.meta.get(i)?;
        self.buf.get_mut(m.start..m.start + m.len)
    }

    /// The buffer as slot storage: at least `slots * slot_size` bytes, and
    /// no longer lent by a port. `None` if datagrams of a lent buffer are
    /// still held (slots written now would overwrite them).
    fn slot_storage(&mut self) -> Option<&mut Vec<u8>> {
        if self.lease != 0 {
            if !self.meta.is_empty() {
                return None;
            }
            self.lease = 0;
        }
        let need = self.slots * self.slot_size;
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
        Some(&mut self.buf)
    }

    /// Iterates over the datagrams held, in arrival order.
    pub fn iter(&self) -> RecvIter<'_, A> {
        RecvIter { batch: self, i: 0 }
    }

    /// The first free slot (its full `slot_size` bytes), for a port to
    /// write a datagram into before [`commit`](Self::commit)ting it.
    /// `None` if the batch is full.
    pub fn free_slot(&mut self) -> Option<&mut [u8]> {
        if self.is_full() {
            return None;
        }
        let start = self.meta.len() * self.slot_size;
        let size = self.slot_size;
        self.slot_storage()?.get_mut(start..start + size)
    }

    /// Records that the first free slot now holds a datagram of `len`
    /// bytes from `addr`. A `len` beyond the slot size is clamped and the
    /// datagram flagged truncated. Returns `false` (and records nothing) if
    /// the batch is full.
    pub fn commit(&mut self, addr: A, len: usize, truncated: bool) -> bool {
        if self.is_full() || self.slot_storage().is_none() {
            return false;
        }
        let cut = len > self.slot_size;
        self.meta.push(RecvMeta {
            addr,
            start: self.meta.len() * self.slot_size,
            len: len.min(self.slot_size),
            truncated: truncated || cut,
        });
        true
    }

    /// Gives the batch `buf` (filled by a port) in exchange for the batch's
    /// buffer, which the port keeps for its next receive, and returns the
    /// lease number of the handed-over buffer. The batch must be empty
    /// (`None` otherwise, and nothing is exchanged). Datagrams in it are
    /// then recorded with [`commit_at`](Self::commit_at).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn exchange(&mut self, buf: &mut Vec<u8>) -> Option<u64> {
        if !self.meta.is_empty() {
            return None;
        }
        std::mem::swap(&mut self.buf, buf);
        self.lease = NEXT_LEASE.fetch_add(1, Ordering::Relaxed);
        Some(self.lease)
    }

    /// The lease number of the buffer held (0: the batch's own slot
    /// storage): a port that left datagrams of its last
    /// [`exchange`](Self::exchange)d buffer undelivered may deliver them
    /// later only while this is still that exchange's number.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn lease(&self) -> u64 {
        self.lease
    }

    /// Records a datagram of `len` bytes at offset `start` of a buffer
    /// handed over by [`exchange`](Self::exchange), cut to the slot size
    /// like any other. Returns `false` (and records nothing) if the batch
    /// is full, holds no lent buffer, or the range lies outside it.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn commit_at(&mut self, addr: A, start: usize, len: usize, truncated: bool) -> bool {
        let kept = len.min(self.slot_size);
        if self.is_full() || self.lease == 0 || start + kept > self.buf.len() {
            return false;
        }
        self.meta.push(RecvMeta {
            addr,
            start,
            len: kept,
            truncated: truncated || len > self.slot_size,
        });
        true
    }

    /// Copies `data` into the first free slot and commits it (flagged
    /// truncated if it does not fit). Returns `false` if the batch is full.
    pub fn push(&mut self, addr: A, data: &[u8]) -> bool {
        self.push_parts(addr, data, &[], false)
    }

    /// Like [`push`](Self::push) for a datagram given in two pieces (e.g.
    /// the two halves of a ring buffer); `truncated` marks a datagram
    /// already cut before it got here.
    pub(crate) fn push_parts(
        &mut self,
        addr: A,
        first: &[u8],
        second: &[u8],
        truncated: bool,
    ) -> bool {
        let Some(slot) = self.free_slot() else {
            return false;
        };
        let n1 = first.len().min(slot.len());
        slot[..n1].copy_from_slice(&first[..n1]);
        let n2 = second.len().min(slot.len() - n1);
        slot[n1..n1 + n2].copy_from_slice(&second[..n2]);
        let total = first.len() + second.len();
        self.commit(addr, total, truncated)
    }

    /// The free slots as one contiguous region, and how many slots it
    /// spans: for ports that receive several datagrams in one call.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn free_region(&mut self) -> (&mut [u8], usize) {
        let used = self.meta.len();
        let start = used * self.slot_size;
        let free = self.slots - used;
        match self.slot_storage() {
            Some(buf) => {
                let start = start.min(buf.len());
                (&mut buf[start..], free)
            }
            None => (&mut [], 0),
        }
    }
}

/// Iterator over the datagrams of a [`RecvBatch`].
#[derive(Debug)]
pub struct RecvIter<'a, A> {
    batch: &'a RecvBatch<A>,
    i: usize,
}

impl<'a, A: Copy> Iterator for RecvIter<'a, A> {
    type Item = Datagram<'a, A>;

    fn next(&mut self) -> Option<Self::Item> {
        let d = self.batch.get(self.i)?;
        self.i += 1;
        Some(d)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.batch.len().saturating_sub(self.i);
        (n, Some(n))
    }
}

impl<A: Copy> ExactSizeIterator for RecvIter<'_, A> {}

impl<'a, A: Copy> IntoIterator for &'a RecvBatch<A> {
    type Item = Datagram<'a, A>;
    type IntoIter = RecvIter<'a, A>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[derive(Debug, Clone, Copy)]
struct SendEntry<A> {
    addr: A,
    start: usize,
    len: usize,
}

/// Bytes written into a [`SendBatch`] by [`SendBatch::write_in_place`], not yet (or not only)
/// carried by one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    start: usize,
    len: usize,
}

impl Extent {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: an extent holds at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Datagrams to send: one contiguous byte buffer plus, per datagram, its
/// destination and extent.
///
/// Datagrams are stored back to back in push order, which lets a UDP port
/// hand a run of equal-size datagrams to one destination to the kernel as a
/// single GSO buffer without copying. [`clear`](Self::clear) keeps the
/// memory, so a batch reused across iterations stops allocating once it has
/// grown to its working size (or from the start with
/// [`with_capacity`](Self::with_capacity)).
#[derive(Clone)]
pub struct SendBatch<A = SocketAddr> {
    /// Initialized bytes; only `..used` belong to datagrams. The rest is kept initialized
    /// across [`clear`](Self::clear) so that in-place writes never re-zero it.
    buf: Vec<u8>,
    used: usize,
    entries: Vec<SendEntry<A>>,
}

impl<A> fmt::Debug for SendBatch<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendBatch")
            .field("len", &self.entries.len())
            .field("bytes", &self.used)
            .finish_non_exhaustive()
    }
}

impl<A> Default for SendBatch<A> {
    fn default() -> Self {
        Self {
            buf: Vec::new(),
            used: 0,
            entries: Vec::new(),
        }
    }
}

impl<A: Copy> SendBatch<A> {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch with room for `datagrams` datagrams totalling `bytes`
    /// bytes.
    pub fn with_capacity(datagrams: usize, bytes: usize) -> Self {
        Self {
            buf: Vec::with_capacity(bytes),
            used: 0,
            entries: Vec::with_capacity(datagrams),
        }
    }

    /// Makes `len` bytes after the used ones available, initializing only memory never used
    /// before; returns where they start.
    fn reserve_tail(&mut self, len: usize) -> usize {
        let start = self.used;
        if self.buf.len() < start + len {
            self.buf.resize(start + len, 0);
        }
        start
    }

    /// Appends a datagram for `addr` (copies `data`).
    pub fn push(&mut self, addr: A, data: &[u8]) {
        let start = self.reserve_tail(data.len());
        self.buf[start..start + data.len()].copy_from_slice(data);
        self.used = start + data.len();
        self.entries.push(SendEntry {
            addr,
            start,
            len: data.len(),
        });
    }

    /// Appends a `len`-byte datagram for `addr` whose bytes `fill` writes
    /// in place (they start zeroed): serialise straight into the batch.
    pub fn push_with<F: FnOnce(&mut [u8])>(&mut self, addr: A, len: usize, fill: F) {
        let start = self.reserve_tail(len);
        let region = &mut self.buf[start..start + len];
        region.fill(0);
        fill(region);
        self.used = start + len;
        self.entries.push(SendEntry { addr, start, len });
    }

    /// Writes bytes for datagrams to come, without adding a datagram: `fill` gets at most
    /// `max_len` bytes (stale, not zeroed) and returns how many it wrote. Hand the returned
    /// [`Extent`] to [`push_extent`](Self::push_extent), once per destination: the bytes are
    /// stored once however many datagrams carry them. `None` when `fill` wrote nothing.
    ///
    /// Always inlined, with `fill`: a caller's loop compiled for wider vectors (the switch's
    /// `Pipeline::burst`) keeps them for the code in `fill`.
    #[inline(always)]
    pub fn write_in_place<F: FnOnce(&mut [u8]) -> usize>(
        &mut self,
        max_len: usize,
        fill: F,
    ) -> Option<Extent> {
        let start = self.reserve_tail(max_len);
        let len = fill(&mut self.buf[start..start + max_len]).min(max_len);
        if len == 0 {
            return None;
        }
        self.used = start + len;
        Some(Extent { start, len })
    }

    /// Appends a datagram for `addr` carrying bytes written by
    /// [`write_in_place`](Self::write_in_place) since the last [`clear`](Self::clear); no copy.
    /// An extent from before the last `clear` is ignored.
    pub fn push_extent(&mut self, addr: A, extent: Extent) {
        if extent.start + extent.len <= self.used {
            self.entries.push(SendEntry {
                addr,
                start: extent.start,
                len: extent.len,
            });
        }
    }

    /// Reorders the datagrams by `key` of their destination, keeping the order of datagrams
    /// with equal keys. Grouping datagrams by destination lets runs of them to one destination,
    /// adjacent in the buffer, leave as single GSO buffers.
    pub fn sort_by_destination<K: Ord, F: FnMut(&A) -> K>(&mut self, mut key: F) {
        self.entries.sort_by_key(|e| key(&e.addr));
    }

    /// Where datagram `i`'s bytes start in the buffer.
    pub(crate) fn datagram_start(&self, i: usize) -> Option<usize> {
        self.entries.get(i).map(|e| e.start)
    }

    /// Appends a datagram of at most `max_len` bytes that `fill` writes in place and whose
    /// length it returns; the bytes it is given hold stale data, not zeros. Nothing is
    /// appended when `fill` returns 0 (a length above `max_len` counts as `max_len`).
    /// Returns the datagram's length.
    pub fn push_in_place<F: FnOnce(&mut [u8]) -> usize>(
        &mut self,
        addr: A,
        max_len: usize,
        fill: F,
    ) -> usize {
        let start = self.reserve_tail(max_len);
        let len = fill(&mut self.buf[start..start + max_len]).min(max_len);
        if len > 0 {
            self.used = start + len;
            self.entries.push(SendEntry { addr, start, len });
        }
        len
    }

    /// Number of datagrams.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No datagram.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Total payload bytes.
    pub fn total_bytes(&self) -> usize {
        self.used
    }

    /// Removes every datagram (keeps the memory).
    pub fn clear(&mut self) {
        self.used = 0;
        self.entries.clear();
    }

    /// The `i`-th datagram: destination and bytes.
    pub fn get(&self, i: usize) -> Option<(A, &[u8])> {
        let e = self.entries.get(i)?;
        Some((e.addr, self.buf.get(e.start..e.start + e.len)?))
    }

    /// Destination of the `i`-th datagram.
    pub fn addr(&self, i: usize) -> Option<A> {
        self.entries.get(i).map(|e| e.addr)
    }

    /// Length of the `i`-th datagram.
    pub fn datagram_len(&self, i: usize) -> Option<usize> {
        self.entries.get(i).map(|e| e.len)
    }

    /// The bytes of datagrams `first..first + count`, which must be stored back
    /// to back (as pushed, or as checked by `gso_run`). Empty if the range is out of bounds.
    pub fn contiguous(&self, first: usize, count: usize) -> &[u8] {
        let (Some(a), Some(b)) = (
            self.entries.get(first),
            count
                .checked_sub(1)
                .and_then(|c| first.checked_add(c))
                .and_then(|last| self.entries.get(last)),
        ) else {
            return &[];
        };
        self.buf.get(a.start..b.start + b.len).unwrap_or(&[])
    }

    /// Iterates over `(destination, bytes)` in push order.
    pub fn iter(&self) -> SendIter<'_, A> {
        SendIter { batch: self, i: 0 }
    }
}

/// Iterator over the datagrams of a [`SendBatch`].
#[derive(Debug)]
pub struct SendIter<'a, A> {
    batch: &'a SendBatch<A>,
    i: usize,
}

impl<'a, A: Copy> Iterator for SendIter<'a, A> {
    type Item = (A, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let d = self.batch.get(self.i)?;
        self.i += 1;
        Some(d)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.batch.len().saturating_sub(self.i);
        (n, Some(n))
    }
}

impl<A: Copy> ExactSizeIterator for SendIter<'_, A> {}

impl<'a, A: Copy> IntoIterator for &'a SendBatch<A> {
    type Item = (A, &'a [u8]);
    type IntoIter = SendIter<'a, A>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recv_batch_push_and_truncate() {
        let mut b: RecvBatch<u8> = RecvBatch::new(3, 4);
        assert!(b.push(1, b"ab"));
        assert!(b.push(2, b"abcdef"));
        assert!(b.push_parts(3, b"xy", b"z", false));
        assert!(!b.push(4, b"full"));
        assert!(b.is_full());
        let d: Vec<_> = b
            .iter()
            .map(|d| (d.addr, d.data.to_vec(), d.truncated))
            .collect();
        assert_eq!(
            d,
            vec![
                (1, b"ab".to_vec(), false),
                (2, b"abcd".to_vec(), true),
                (3, b"xyz".to_vec(), false)
            ]
        );
        b.clear();
        assert!(b.is_empty());
        assert_eq!(b.remaining(), 3);
    }

    #[test]
    fn recv_batch_zero_slot_size_flags_everything() {
        let mut b: RecvBatch<u8> = RecvBatch::new(0, 0);
        assert_eq!(b.capacity(), 1);
        assert!(b.push(1, b""));
        assert_eq!(b.get(0).map(|d| d.truncated), Some(false));
        b.clear();
        assert!(b.push(1, b"x"));
        assert_eq!(
            b.get(0).map(|d| (d.data.len(), d.truncated)),
            Some((0, true))
        );
    }

    #[test]
    fn send_batch_contiguous() {
        let mut b: SendBatch<u8> = SendBatch::new();
        b.push(1, b"aa");
        b.push_with(1, 3, |s| s.copy_from_slice(b"bbb"));
        assert_eq!(b.push_in_place(4, 10, |_| 0), 0);
        b.push(2, b"");
        b.push(2, b"c");
        assert_eq!(b.len(), 4);
        assert_eq!(b.contiguous(0, 2), b"aabbb");
        assert_eq!(b.contiguous(1, 3), b"bbbc");
        assert_eq!(b.contiguous(3, 2), b"");
        assert_eq!(b.contiguous(0, 0), b"");
        assert_eq!(b.get(1), Some((1, &b"bbb"[..])));
        assert_eq!(b.total_bytes(), 6);
        let all: Vec<_> = b.iter().map(|(a, d)| (a, d.len())).collect();
        assert_eq!(all, vec![(1, 2), (1, 3), (2, 0), (2, 1)]);
    }

    #[test]
    fn send_batch_in_place_reuses_memory_and_keeps_extents() {
        let mut b: SendBatch<u8> = SendBatch::with_capacity(4, 64);
        b.push(1, b"hello");
        b.clear();
        // The bytes handed out are stale, not zeroed; only the returned length counts.
        let n = b.push_in_place(7, 16, |s| {
            assert_eq!(&s[..5], b"hello");
            s[..3].copy_from_slice(b"abc");
            3
        });
        assert_eq!(n, 3);
        b.push(8, b"zz");
        assert_eq!(b.get(0), Some((7, &b"abc"[..])));
        assert_eq!(b.get(1), Some((8, &b"zz"[..])));
        assert_eq!(b.total_bytes(), 5);
        assert_eq!(b.contiguous(0, 2), b"abczz");
        // An over-long claim is clamped to the space given.
        assert_eq!(b.push_in_place(9, 4, |_| 100), 4);
        assert_eq!(b.total_bytes(), 9);
    }

    #[test]
    fn send_batch_shares_bytes_between_destinations() {
        let mut b: SendBatch<u8> = SendBatch::new();
        let x = b
            .write_in_place(8, |s| {
                s[..2].copy_from_slice(b"xx");
                2
            })
            .unwrap();
        let y = b
            .write_in_place(8, |s| {
                s[..2].copy_from_slice(b"yy");
                2
            })
            .unwrap();
        assert!(b.write_in_place(8, |_| 0).is_none());
        for dest in [3, 1] {
            b.push_extent(dest, x);
            b.push_extent(dest, y);
        }
        assert_eq!(b.total_bytes(), 4, "each reply stored once");
        b.sort_by_destination(|d| *d);
        let all: Vec<_> = b.iter().map(|(a, d)| (a, d.to_vec())).collect();
        assert_eq!(
            all,
            vec![
                (1, b"xx".to_vec()),
                (1, b"yy".to_vec()),
                (3, b"xx".to_vec()),
                (3, b"yy".to_vec())
            ]
        );
        b.clear();
        b.push_extent(9, x);
        assert!(b.is_empty(), "an extent from before clear is ignored");
    }
}
