//! The aggregation header and its payload.
//!
//! ```text
//!  offset  size  field      meaning
//!  0       1     ver_type   version (high nibble, = 1) | message type (low nibble)
//!  1       1     flags      bit 0: shadow set of the slot (0 or 1); bit 1: gap tracking, and
//!                            bits 2-7 its 6-bit counter (see `AggRepr::gap`); else 0
//!  2       2     job        job id; the switch drops packets of jobs it does not hold
//!  4       2     epoch      generation of the job on the switch; changes when the switch restarts
//!  6       1     rank       worker rank within the job, 0..=31
//!  7       1     exponent   biased block exponent (Data/Result), reject reason (Reject)
//!  8       2     slot       aggregator slot index in the switch's pool
//!  10      2     count      number of 32-bit elements in the payload
//!  12      4     seq        stream sequence number, echoed back
//!  16      4*n   payload    `count` int32 elements, big-endian
//! ```
//!
//! All multi-byte fields are big-endian. A packet is exactly `16 + 4 * count` bytes long.

use crate::{Error, Result};

/// The UDP port the switch listens on (ASCII "IN").
pub const UDP_PORT: u16 = 0x494E;
/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u8 = 1;
/// Length of the fixed header in bytes.
pub const HEADER_LEN: usize = 16;
/// The largest rank a job may have: the switch's worker bitmap is 32 bits wide.
pub const MAX_RANK: u8 = 31;

mod field {
    use core::ops::Range;
    pub const VER_TYPE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const JOB: Range<usize> = 2..4;
    pub const EPOCH: Range<usize> = 4..6;
    pub const RANK: usize = 6;
    pub const EXPONENT: usize = 7;
    pub const SLOT: Range<usize> = 8..10;
    pub const COUNT: Range<usize> = 10..12;
    pub const SEQ: Range<usize> = 12..16;
}

const FLAG_SET: u8 = 0x01;
const FLAG_GAP: u8 = 0x02;
const GAP_SHIFT: u8 = 2;

/// Slots per gap-tracking block. A worker numbers its first transmissions of Data to each
/// block modulo [`GAP_COUNTER`]; the switch keeps, per block and rank, the counter of the latest
/// one it received, and reports the numbers it skipped (PROTOCOL.md §5, loss recovery). A lane
/// whose slots cover whole blocks may ask for reports.
pub const GAP_BLOCK: u16 = 64;
/// The modulus of the gap counter (6 bits).
pub const GAP_COUNTER: u8 = 64;

/// What a packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageType {
    /// Worker to switch: a contribution to one slot.
    Data = 1,
    /// Switch to worker(s): the finished sum of one slot.
    Result = 2,
    /// Switch to worker: the packet was refused; the exponent byte holds a [`RejectReason`].
    Reject = 3,
    /// Worker to switch: asks for the job's configuration and current epoch.
    Probe = 4,
    /// Switch to worker: answers a probe; the payload is a [`ProbeInfo`].
    ProbeReply = 5,
    /// Switch to worker: answers a retransmission or a [`MessageType::Query`] of a slot whose
    /// use is still collecting; the payload is one element, the slot's contributor bitmap
    /// ([`PendingInfo`]).
    Pending = 6,
    /// Worker to switch: asks, without contributing, for the state of one use of a slot
    /// (header only). Answered with the stored Result when the use is complete, else Pending.
    Query = 7,
    /// Switch to worker: first transmissions of this worker's Data to a block never arrived
    /// (header only). The header is that of the Data packet whose arrival showed it (slot,
    /// set, seq); its gap counter ([`AggRepr::gap`]) is the first missing one, and the exponent
    /// byte holds how many consecutive counters are missing (1..=63).
    Missing = 8,
}

impl TryFrom<u8> for MessageType {
    type Error = Error;
    fn try_from(v: u8) -> Result<Self> {
        Ok(match v {
            1 => MessageType::Data,
            2 => MessageType::Result,
            3 => MessageType::Reject,
            4 => MessageType::Probe,
            5 => MessageType::ProbeReply,
            6 => MessageType::Pending,
            7 => MessageType::Query,
            8 => MessageType::Missing,
            other => return Err(Error::MessageType(other)),
        })
    }
}

/// Why the switch refused a packet of an authenticated worker (known job, rank and port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RejectReason {
    /// The packet's epoch is not the job's current epoch: the switch restarted or the job was
    /// reinstalled, and the state of the stream is gone.
    StaleEpoch = 1,
    /// The slot lies outside the job's slot range.
    SlotOutOfRange = 2,
    /// The element count is neither 0 nor the job's elements per packet.
    BadCount = 3,
}

impl TryFrom<u8> for RejectReason {
    type Error = Error;
    fn try_from(v: u8) -> Result<Self> {
        Ok(match v {
            1 => RejectReason::StaleEpoch,
            2 => RejectReason::SlotOutOfRange,
            3 => RejectReason::BadCount,
            other => return Err(Error::RejectReason(other)),
        })
    }
}

/// What a [`MessageType::Query`] asks for, in its exponent byte (PROTOCOL.md §6 and §9).
///
/// Bit 0 asks for the stored sums: a complete use is answered with its whole Result, or, with
/// bit 0 clear, with the Result's header alone (a *status* Query: "complete", without the sums
/// again). Any nonzero byte also asks a rack switch, for its rank 0's Query about a use that
/// waits for the upper switch's total, to send the use's partial sum up again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueryAsk {
    /// 0: the use's state; a complete use answers with the Result's header alone.
    Status,
    /// 1: the stored Result with its sums; on a rack switch, rank 0's pushes the partial up.
    Fetch,
    /// 2: the use's state as [`QueryAsk::Status`]; on a rack switch, rank 0's pushes the
    /// partial up as [`QueryAsk::Fetch`] does.
    StatusPushingPartial,
}

impl QueryAsk {
    /// The exponent byte that carries this ask.
    pub const fn byte(self) -> u8 {
        match self {
            QueryAsk::Status => 0,
            QueryAsk::Fetch => 1,
            QueryAsk::StatusPushingPartial => 2,
        }
    }

    /// Whether a Query with this exponent byte wants a complete use's sums (bit 0).
    pub const fn wants_sums(exponent: u8) -> bool {
        exponent & 1 != 0
    }

    /// Whether a Query with this exponent byte, from rank 0 of a rack about a use that waits
    /// for its total, sends the partial up again (any nonzero byte).
    pub const fn pushes_partial(exponent: u8) -> bool {
        exponent != 0
    }
}

/// A zero-copy view of an aggregation packet over a byte buffer.
#[derive(Debug, Clone)]
pub struct AggPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> AggPacket<T> {
    /// Wraps a buffer without checking it. Accessors may panic until [`Self::check_len`] passed.
    pub const fn new_unchecked(buffer: T) -> Self {
        AggPacket { buffer }
    }

    /// Wraps a buffer after checking that header and payload are all there.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds the header and exactly the announced payload.
    ///
    /// After this returns `Ok`, no accessor of this view panics.
    pub fn check_len(&self) -> Result<()> {
        let data = self.buffer.as_ref();
        if data.len() < HEADER_LEN {
            return Err(Error::Truncated { len: data.len() });
        }
        let count = self.count();
        let expected = HEADER_LEN + usize::from(count) * 4;
        if data.len() != expected {
            return Err(Error::LengthMismatch {
                count,
                expected,
                actual: data.len(),
            });
        }
        Ok(())
    }

    /// Consumes the view, returning the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The bytes under the view.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        let d = &self.buffer.as_ref()[r];
        u16::from_be_bytes([d[0], d[1]])
    }

    /// The version nibble.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_TYPE] >> 4
    }
    /// The raw message type nibble.
    pub fn msg_type_raw(&self) -> u8 {
        self.buffer.as_ref()[field::VER_TYPE] & 0x0f
    }
    /// The shadow set (0 or 1).
    pub fn set(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & FLAG_SET
    }
    /// The gap counter, if the gap flag is set (see [`AggRepr::gap`]).
    pub fn gap(&self) -> Option<u8> {
        let flags = self.buffer.as_ref()[field::FLAGS];
        (flags & FLAG_GAP != 0).then_some(flags >> GAP_SHIFT)
    }
    /// The job id.
    pub fn job(&self) -> u16 {
        self.u16_at(field::JOB)
    }
    /// The epoch.
    pub fn epoch(&self) -> u16 {
        self.u16_at(field::EPOCH)
    }
    /// The worker rank.
    pub fn rank(&self) -> u8 {
        self.buffer.as_ref()[field::RANK]
    }
    /// The exponent byte (reject reason on Reject packets).
    pub fn exponent(&self) -> u8 {
        self.buffer.as_ref()[field::EXPONENT]
    }
    /// The slot index.
    pub fn slot(&self) -> u16 {
        self.u16_at(field::SLOT)
    }
    /// The element count.
    pub fn count(&self) -> u16 {
        self.u16_at(field::COUNT)
    }
    /// The sequence number.
    pub fn seq(&self) -> u32 {
        let d = &self.buffer.as_ref()[field::SEQ];
        u32::from_be_bytes([d[0], d[1], d[2], d[3]])
    }
    /// The payload bytes (`4 * count` of them once checked).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AggPacket<T> {
    fn set_u16_at(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets version and message type.
    pub fn set_version_type(&mut self, version: u8, kind: MessageType) {
        self.buffer.as_mut()[field::VER_TYPE] = (version << 4) | (kind as u8 & 0x0f);
    }
    /// Sets the flags byte from the shadow set (every other bit cleared).
    pub fn set_set(&mut self, set: u8) {
        self.buffer.as_mut()[field::FLAGS] = set & FLAG_SET;
    }
    /// Sets the flags byte from the shadow set and the gap counter (modulo [`GAP_COUNTER`]).
    pub fn set_flags(&mut self, set: u8, gap: Option<u8>) {
        let gap = match gap {
            Some(c) => FLAG_GAP | (c % GAP_COUNTER) << GAP_SHIFT,
            None => 0,
        };
        self.buffer.as_mut()[field::FLAGS] = set & FLAG_SET | gap;
    }
    /// Sets the job id.
    pub fn set_job(&mut self, v: u16) {
        self.set_u16_at(field::JOB, v)
    }
    /// Sets the epoch.
    pub fn set_epoch(&mut self, v: u16) {
        self.set_u16_at(field::EPOCH, v)
    }
    /// Sets the rank.
    pub fn set_rank(&mut self, v: u8) {
        self.buffer.as_mut()[field::RANK] = v;
    }
    /// Sets the exponent byte.
    pub fn set_exponent(&mut self, v: u8) {
        self.buffer.as_mut()[field::EXPONENT] = v;
    }
    /// Sets the slot index.
    pub fn set_slot(&mut self, v: u16) {
        self.set_u16_at(field::SLOT, v)
    }
    /// Sets the element count.
    pub fn set_count(&mut self, v: u16) {
        self.set_u16_at(field::COUNT, v)
    }
    /// Sets the sequence number.
    pub fn set_seq(&mut self, v: u32) {
        self.buffer.as_mut()[field::SEQ].copy_from_slice(&v.to_be_bytes());
    }
    /// The payload bytes, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// The header of an aggregation packet as plain values.
///
/// The payload is not part of the representation: it is read and written in place through
/// [`AggPacket::payload`] and [`AggPacket::payload_mut`], so that no element is copied twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AggRepr {
    pub kind: MessageType,
    /// Shadow set, 0 or 1.
    pub set: u8,
    /// The gap counter (flag bit 1, and bits 2-7), `0..GAP_COUNTER`. On Data: the number of this
    /// first transmission among the sender's first transmissions to the slot's block of
    /// [`GAP_BLOCK`] slots, modulo [`GAP_COUNTER`]; the switch answers skipped numbers with a
    /// [`MessageType::Missing`] report. On Missing: the first skipped number. On ProbeReply:
    /// `Some(0)` when the switch sends such reports. `None` on every other packet.
    pub gap: Option<u8>,
    pub job: u16,
    pub epoch: u16,
    pub rank: u8,
    /// Biased block exponent; on Reject packets the [`RejectReason`] code.
    pub exponent: u8,
    pub slot: u16,
    /// Number of payload elements.
    pub count: u16,
    pub seq: u32,
}

impl AggRepr {
    /// Parses a view: its length (see [`AggPacket::check_len`]), then the header.
    pub fn parse<T: AsRef<[u8]>>(packet: &AggPacket<T>) -> Result<AggRepr> {
        packet.check_len()?;
        match packet.buffer.as_ref().first_chunk::<HEADER_LEN>() {
            Some(header) => AggRepr::parse_header(header),
            // Unreachable: `check_len` passed.
            None => Err(Error::Truncated {
                len: packet.buffer.as_ref().len(),
            }),
        }
    }

    /// Parses the fixed-size header alone: version, type and fields. The payload's length is
    /// not checked: the caller must compare it with `count` (as [`AggPacket::check_len`]
    /// does) before it trusts the packet. A data plane uses this to read the header without a
    /// bounds check per field.
    #[inline]
    pub fn parse_header(header: &[u8; HEADER_LEN]) -> Result<AggRepr> {
        let packet = AggPacket::new_unchecked(header);
        if packet.version() != PROTOCOL_VERSION {
            return Err(Error::Version(packet.version()));
        }
        let kind = MessageType::try_from(packet.msg_type_raw())?;
        if kind == MessageType::Reject {
            RejectReason::try_from(packet.exponent())?;
        }
        Ok(AggRepr {
            kind,
            set: packet.set(),
            gap: packet.gap(),
            job: packet.job(),
            epoch: packet.epoch(),
            rank: packet.rank(),
            exponent: packet.exponent(),
            slot: packet.slot(),
            count: packet.count(),
            seq: packet.seq(),
        })
    }

    /// Parses a byte buffer, returning the header and the payload bytes.
    pub fn parse_bytes(bytes: &[u8]) -> Result<(AggRepr, &[u8])> {
        let packet = AggPacket::new_checked(bytes)?;
        let repr = AggRepr::parse(&packet)?;
        Ok((repr, &bytes[HEADER_LEN..]))
    }

    /// The number of bytes the whole packet takes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + usize::from(self.count) * 4
    }

    /// The reject reason of a Reject packet.
    pub fn reject_reason(&self) -> Option<RejectReason> {
        match self.kind {
            MessageType::Reject => RejectReason::try_from(self.exponent).ok(),
            _ => None,
        }
    }

    /// Writes the header into the view; the payload is left as it is.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut AggPacket<T>) {
        packet.set_version_type(PROTOCOL_VERSION, self.kind);
        packet.set_flags(self.set, self.gap);
        packet.set_job(self.job);
        packet.set_epoch(self.epoch);
        packet.set_rank(self.rank);
        packet.set_exponent(self.exponent);
        packet.set_slot(self.slot);
        packet.set_count(self.count);
        packet.set_seq(self.seq);
    }

    /// Writes the header at the start of `buf` and returns the view over exactly
    /// [`Self::buffer_len`] bytes, whose payload the caller fills.
    pub fn emit_into<'a>(&self, buf: &'a mut [u8]) -> Result<AggPacket<&'a mut [u8]>> {
        let need = self.buffer_len();
        let have = buf.len();
        let Some(buf) = buf.get_mut(..need) else {
            return Err(Error::BufferTooSmall { need, have });
        };
        let mut packet = AggPacket::new_unchecked(buf);
        self.emit(&mut packet);
        Ok(packet)
    }
}

/// Bytes the IP and UDP headers add to an `ina` packet: 28 over IPv4, 48 over IPv6.
pub const fn ip_udp_overhead(ipv6: bool) -> usize {
    if ipv6 {
        48
    } else {
        28
    }
}

/// The IP packet that carries a Data or Result packet of `elems` elements: it must fit the
/// path MTU, or every datagram is fragmented (or dropped where fragments are).
pub const fn ip_packet_len(elems: u16, ipv6: bool) -> usize {
    ip_udp_overhead(ipv6) + HEADER_LEN + 4 * elems as usize
}

/// The most elements per packet whose IP packets fit an MTU of `mtu` bytes.
pub const fn max_elems_for_mtu(mtu: usize, ipv6: bool) -> usize {
    mtu.saturating_sub(ip_udp_overhead(ipv6) + HEADER_LEN) / 4
}

/// A job's configuration as the switch reports it in a ProbeReply payload (four elements:
/// workers, elements per packet, first slot, slot count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProbeInfo {
    /// Number of workers in the job.
    pub workers: u8,
    /// Elements per full data packet.
    pub elems_per_packet: u16,
    /// First slot of the job's range.
    pub slot_base: u16,
    /// Number of slots in the job's range.
    pub slot_count: u16,
}

impl ProbeInfo {
    /// Payload elements of a ProbeReply.
    pub const COUNT: u16 = 4;

    /// Encodes into payload bytes (at least 16 bytes).
    pub fn emit(&self, payload: &mut [u8]) -> Result<()> {
        let words = [
            i32::from(self.workers),
            i32::from(self.elems_per_packet),
            i32::from(self.slot_base),
            i32::from(self.slot_count),
        ];
        if payload.len() < 16 {
            return Err(Error::BufferTooSmall {
                need: 16,
                have: payload.len(),
            });
        }
        crate::payload::encode_from(&words, payload);
        Ok(())
    }

    /// Payload elements of a ProbeReply that also names the job's multicast group
    /// ([`ProbeGroup`]).
    pub const COUNT_WITH_GROUP: u16 = Self::COUNT + ProbeGroup::COUNT;

    /// Decodes a ProbeReply payload: its first four elements. The payload is 4 elements long,
    /// or 6 when it names the job's multicast group (read by [`ProbeGroup::parse`]).
    pub fn parse(payload: &[u8]) -> Result<ProbeInfo> {
        let mut w = [0i32; 4];
        let whole = payload.len() == 16 || payload.len() == 24;
        if crate::payload::decode_into(payload, &mut w) != 4 || !whole {
            return Err(Error::LengthMismatch {
                count: Self::COUNT,
                expected: 16,
                actual: payload.len(),
            });
        }
        let field = |v: i32, max: i32| -> Result<i32> {
            if (0..=max).contains(&v) {
                Ok(v)
            } else {
                Err(Error::Frame("probe reply field out of range"))
            }
        };
        Ok(ProbeInfo {
            workers: field(w[0], 32)? as u8,
            elems_per_packet: field(w[1], 0xffff)? as u16,
            slot_base: field(w[2], 0xffff)? as u16,
            slot_count: field(w[3], 0xffff)? as u16,
        })
    }
}

/// The tail of a ProbeReply from a switch that sends the job's finished results once to a
/// multicast group instead of to every worker's own address: two more payload elements, the
/// group's IPv4 address (its four bytes as one big-endian element) and UDP port. A worker
/// that has not joined the group would get every result only as the answer to a
/// retransmission; with this it joins the group, or refuses to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProbeGroup {
    pub group: core::net::SocketAddrV4,
}

impl ProbeGroup {
    /// Payload elements the group adds to a ProbeReply.
    pub const COUNT: u16 = 2;

    /// Encodes the two elements into `tail` (at least 8 bytes; the bytes after the four
    /// elements of [`ProbeInfo`]).
    pub fn emit(&self, tail: &mut [u8]) -> Result<()> {
        let Some(words) = tail.first_chunk_mut::<8>() else {
            return Err(Error::BufferTooSmall {
                need: 8,
                have: tail.len(),
            });
        };
        words[..4].copy_from_slice(&self.group.ip().octets());
        words[4..].copy_from_slice(&u32::from(self.group.port()).to_be_bytes());
        Ok(())
    }

    /// The group a whole ProbeReply payload names: `None` for the four-element form, an error
    /// for any length but 16 and 24 bytes, an address that is not multicast, or port 0.
    pub fn parse(payload: &[u8]) -> Result<Option<ProbeGroup>> {
        match payload.len() {
            16 => return Ok(None),
            24 => {}
            actual => {
                return Err(Error::LengthMismatch {
                    count: ProbeInfo::COUNT_WITH_GROUP,
                    expected: 24,
                    actual,
                })
            }
        }
        let (Some(ip), Some(port)) = (payload.get(16..20), payload.get(20..24)) else {
            return Err(Error::Frame("probe reply group truncated"));
        };
        let ip = core::net::Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]);
        let port = u32::from_be_bytes([port[0], port[1], port[2], port[3]]);
        let port = match u16::try_from(port) {
            Ok(p) if p != 0 => p,
            _ => return Err(Error::Frame("probe reply group port out of range")),
        };
        if !ip.is_multicast() {
            return Err(Error::Frame("probe reply group is not a multicast address"));
        }
        Ok(Some(ProbeGroup {
            group: core::net::SocketAddrV4::new(ip, port),
        }))
    }
}

/// The payload of a Pending answer: which ranks have contributed to the slot's current use
/// (bit `1 << rank`; 0 when the switch has not seen this use at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PendingInfo {
    pub bitmap: u32,
}

impl PendingInfo {
    /// Payload elements of a Pending answer.
    pub const COUNT: u16 = 1;

    /// Encodes into payload bytes (at least 4 bytes).
    pub fn emit(&self, payload: &mut [u8]) -> Result<()> {
        let Some(word) = payload.first_chunk_mut::<4>() else {
            return Err(Error::BufferTooSmall {
                need: 4,
                have: payload.len(),
            });
        };
        *word = self.bitmap.to_be_bytes();
        Ok(())
    }

    /// Decodes a Pending payload (exactly one element).
    pub fn parse(payload: &[u8]) -> Result<PendingInfo> {
        match <[u8; 4]>::try_from(payload) {
            Ok(word) => Ok(PendingInfo {
                bitmap: u32::from_be_bytes(word),
            }),
            Err(_) => Err(Error::LengthMismatch {
                count: Self::COUNT,
                expected: 4,
                actual: payload.len(),
            }),
        }
    }

    /// Whether `rank` has contributed.
    pub fn has(&self, rank: u8) -> bool {
        rank <= MAX_RANK && self.bitmap & (1 << rank) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_query_ask_has_its_own_byte_and_meaning() {
        let meaning = |a: QueryAsk| {
            let b = a.byte();
            (QueryAsk::wants_sums(b), QueryAsk::pushes_partial(b))
        };
        assert_eq!(meaning(QueryAsk::Status), (false, false));
        assert_eq!(meaning(QueryAsk::Fetch), (true, true));
        assert_eq!(meaning(QueryAsk::StatusPushingPartial), (false, true));
        assert_eq!(
            [
                QueryAsk::Status,
                QueryAsk::Fetch,
                QueryAsk::StatusPushingPartial
            ]
            .map(QueryAsk::byte),
            [0, 1, 2]
        );
    }

    fn kind() -> impl Strategy<Value = MessageType> {
        prop_oneof![
            Just(MessageType::Data),
            Just(MessageType::Result),
            Just(MessageType::Probe),
            Just(MessageType::ProbeReply),
            Just(MessageType::Pending),
            Just(MessageType::Query),
            Just(MessageType::Missing),
        ]
    }

    prop_compose! {
        fn repr()(kind in kind(), set in 0u8..2, gap in proptest::option::of(0u8..GAP_COUNTER),
                  job in any::<u16>(), epoch in any::<u16>(), rank in any::<u8>(),
                  exponent in any::<u8>(), slot in any::<u16>(), count in 0u16..600,
                  seq in any::<u32>()) -> AggRepr {
            AggRepr { kind, set, gap, job, epoch, rank, exponent, slot, count, seq }
        }
    }

    proptest! {
        #[test]
        fn emit_parse_round_trip(r in repr(), fill in any::<u8>()) {
            let mut buf = vec![fill; r.buffer_len() + 7];
            let len = {
                let p = r.emit_into(&mut buf).unwrap();
                p.into_inner().len()
            };
            prop_assert_eq!(len, r.buffer_len());
            let (back, payload) = AggRepr::parse_bytes(&buf[..len]).unwrap();
            prop_assert_eq!(back, r);
            prop_assert_eq!(payload.len(), usize::from(r.count) * 4);
        }

        #[test]
        fn reject_round_trip(reason in 1u8..=3, r in repr()) {
            let r = AggRepr { kind: MessageType::Reject, exponent: reason, count: 0, ..r };
            let mut buf = [0u8; HEADER_LEN];
            r.emit_into(&mut buf).unwrap();
            let (back, _) = AggRepr::parse_bytes(&buf).unwrap();
            prop_assert_eq!(back.reject_reason().map(|x| x as u8), Some(reason));
        }

        /// The header alone parses as the whole packet does, whenever the length is right,
        /// and fails with the same error on every header whatever follows it.
        #[test]
        fn header_parses_as_the_packet(bytes in proptest::collection::vec(any::<u8>(), 16..120), r in repr()) {
            let mut buf = vec![0u8; r.buffer_len()];
            r.emit_into(&mut buf).unwrap();
            let header = buf.first_chunk::<HEADER_LEN>().unwrap();
            prop_assert_eq!(AggRepr::parse_header(header), Ok(r));
            let header = bytes.first_chunk::<HEADER_LEN>().unwrap();
            let whole = AggRepr::parse(&AggPacket::new_unchecked(&bytes[..]));
            match AggRepr::parse_header(header) {
                Ok(h) => prop_assert!(whole == Ok(h) || usize::from(h.count) * 4 + HEADER_LEN != bytes.len()),
                Err(e) => prop_assert!(whole == Err(e) || AggPacket::new_checked(&bytes[..]).is_err()),
            }
        }

        #[test]
        fn a_query_asks_for_the_sums_by_bit_0_and_for_the_partial_by_any_nonzero_byte(
            exponent in any::<u8>(),
        ) {
            prop_assert_eq!(QueryAsk::wants_sums(exponent), exponent % 2 == 1);
            prop_assert_eq!(QueryAsk::pushes_partial(exponent), exponent != 0);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = AggRepr::parse_bytes(&bytes);
            let _ = ProbeInfo::parse(&bytes);
            let _ = ProbeGroup::parse(&bytes);
            let _ = PendingInfo::parse(&bytes);
        }

        #[test]
        fn pending_info_round_trip(bitmap in any::<u32>(), rank in 0u8..64) {
            let info = PendingInfo { bitmap };
            let mut buf = [0u8; 4];
            info.emit(&mut buf).unwrap();
            let back = PendingInfo::parse(&buf).unwrap();
            prop_assert_eq!(back, info);
            prop_assert_eq!(back.has(rank), rank < 32 && bitmap >> rank & 1 == 1);
            prop_assert!(PendingInfo::parse(&buf[..3]).is_err());
            prop_assert!(info.emit(&mut buf[..3]).is_err());
        }

        #[test]
        fn probe_info_round_trip(workers in 0u8..=32, e in any::<u16>(), b in any::<u16>(), c in any::<u16>()) {
            let info = ProbeInfo { workers, elems_per_packet: e, slot_base: b, slot_count: c };
            let mut buf = [0u8; 16];
            info.emit(&mut buf).unwrap();
            prop_assert_eq!(ProbeInfo::parse(&buf).unwrap(), info);
            prop_assert_eq!(ProbeGroup::parse(&buf).unwrap(), None);
        }

        #[test]
        fn probe_info_with_group_round_trip(
            workers in 0u8..=32, e in any::<u16>(), b in any::<u16>(), c in any::<u16>(),
            ip in 0xe000_0000u32..=0xefff_ffff, port in 1u16..,
        ) {
            let info = ProbeInfo { workers, elems_per_packet: e, slot_base: b, slot_count: c };
            let group = ProbeGroup {
                group: core::net::SocketAddrV4::new(ip.into(), port),
            };
            let mut buf = [0u8; 24];
            info.emit(&mut buf).unwrap();
            group.emit(&mut buf[16..]).unwrap();
            prop_assert_eq!(ProbeInfo::parse(&buf).unwrap(), info);
            prop_assert_eq!(ProbeGroup::parse(&buf).unwrap(), Some(group));
            // Every other length is refused, by both.
            for len in [0, 4, 12, 20, 28] {
                let mut longer = [0u8; 28];
                longer[..24].copy_from_slice(&buf);
                prop_assert!(ProbeInfo::parse(&longer[..len]).is_err());
                prop_assert!(ProbeGroup::parse(&longer[..len]).is_err());
            }
            prop_assert!(group.emit(&mut buf[..7]).is_err());
        }

        #[test]
        fn probe_group_refuses_unicast_addresses_and_port_zero(
            ip in any::<u32>(), port in any::<u32>(),
        ) {
            let mut buf = [0u8; 24];
            buf[16..20].copy_from_slice(&ip.to_be_bytes());
            buf[20..].copy_from_slice(&port.to_be_bytes());
            let valid = core::net::Ipv4Addr::from(ip).is_multicast() && (1..=0xffff).contains(&port);
            prop_assert_eq!(ProbeGroup::parse(&buf).is_ok(), valid);
        }
    }

    #[test]
    fn ip_packets_of_a_job_against_the_mtu() {
        // 256 elements fit a 1500-byte link, 2048 need jumbo frames.
        assert_eq!(ip_packet_len(256, false), 1068);
        assert_eq!(ip_packet_len(2048, false), 8236);
        assert_eq!(ip_packet_len(256, true), 1088);
        assert_eq!(max_elems_for_mtu(1500, false), 364);
        assert_eq!(max_elems_for_mtu(9000, false), 2239);
        assert_eq!(max_elems_for_mtu(1500, true), 359);
        assert_eq!(max_elems_for_mtu(20, false), 0);
        for mtu in [68, 576, 1280, 1500, 9000, 65535] {
            for ipv6 in [false, true] {
                let e = max_elems_for_mtu(mtu, ipv6) as u16;
                assert!(ip_packet_len(e, ipv6) <= mtu);
                assert!(ip_packet_len(e + 1, ipv6) > mtu);
            }
        }
    }

    #[test]
    fn field_layout_is_big_endian() {
        let r = AggRepr {
            kind: MessageType::Data,
            set: 1,
            gap: None,
            job: 0x0102,
            epoch: 0x0304,
            rank: 5,
            exponent: 0x86,
            slot: 0x0708,
            count: 1,
            seq: 0x090a_0b0c,
        };
        let mut buf = [0u8; 20];
        let mut p = r.emit_into(&mut buf).unwrap();
        p.payload_mut().copy_from_slice(&(-2i32).to_be_bytes());
        assert_eq!(
            buf,
            [
                0x11, 0x01, 0x01, 0x02, 0x03, 0x04, 5, 0x86, 0x07, 0x08, 0, 1, 0x09, 0x0a, 0x0b,
                0x0c, 0xff, 0xff, 0xff, 0xfe
            ]
        );
    }

    #[test]
    fn typed_errors() {
        assert_eq!(
            AggRepr::parse_bytes(&[0x11; 5]).unwrap_err(),
            Error::Truncated { len: 5 }
        );
        let mut buf = [0u8; HEADER_LEN + 4];
        let r = AggRepr {
            kind: MessageType::Data,
            set: 0,
            gap: None,
            job: 1,
            epoch: 1,
            rank: 0,
            exponent: 0,
            slot: 0,
            count: 1,
            seq: 0,
        };
        r.emit_into(&mut buf).unwrap();
        assert!(matches!(
            AggRepr::parse_bytes(&buf[..HEADER_LEN + 3]),
            Err(Error::LengthMismatch { .. })
        ));
        buf[0] = 0x21;
        assert_eq!(AggRepr::parse_bytes(&buf).unwrap_err(), Error::Version(2));
        buf[0] = 0x19;
        assert_eq!(
            AggRepr::parse_bytes(&buf).unwrap_err(),
            Error::MessageType(9)
        );
        buf[0] = 0x13;
        buf[7] = 77;
        assert_eq!(
            AggRepr::parse_bytes(&buf).unwrap_err(),
            Error::RejectReason(77)
        );
        assert_eq!(
            r.emit_into(&mut [0u8; 10]).unwrap_err(),
            Error::BufferTooSmall { need: 20, have: 10 }
        );
    }
}
