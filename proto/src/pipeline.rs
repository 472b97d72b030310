//! The switch's data plane as a pure component: the model the P4 programs mirror.
//!
//! [`Pipeline::process`] takes one `ina` packet (a UDP payload) with its ingress port and the
//! current time, updates the registers exactly as PROTOCOL.md §6 prescribes, and says what
//! to send: nothing (a counted drop), one packet back to one port, or one packet to every port of
//! the job (multicast). [`Pipeline::process_frame`] does the same for whole Ethernet/IPv4/UDP
//! frames, as the P4 switch sees them.
//!
//! # Registers
//! The register file has the layout of the Tofino program: every array is indexed by slot and
//! holds 2x32-bit cells, one 32-bit half per shadow set.
//!
//! | register        | cell                                   | P4 name          |
//! |-----------------|----------------------------------------|------------------|
//! | `seq[slot]`     | (seq of set 0, seq of set 1)           | `reg_seq`        |
//! | `bitmap[slot]`  | (worker bitmap set 0, set 1)           | `reg_bitmap`     |
//! | `count[slot]`   | (arrivals pending in set 0, in set 1)  | `reg_count`      |
//! | `exp[slot]`     | (max exponent byte set 0, set 1)       | `reg_exp`        |
//! | `values`        | element pairs (2j, 2j+1) of `(slot, set)` at index `2*slot+set` | `reg_value_j` |
//!
//! More arrays are indexed by block of [`GAP_BLOCK`] slots (Missing reports, PROTOCOL.md §5
//! and §9; the P4 programs do not have them yet):
//!
//! | register        | cell                                   | P4 name          |
//! |-----------------|----------------------------------------|------------------|
//! | `gap[block*32 + rank]` | gap counter of `rank`'s latest Data to the block, plus 64 (0: none yet) | `reg_gap` |
//! | `partial_gaps[block]` | the counter the block's next partial sum carries (a switch with an uplink) | `reg_partial_gap` |
//! | `partial_uses[block*64 + counter]` | `2*slot + set + 1` of the use whose partial carried `counter` | `reg_partial_use` |
//! | `result_gaps[block]` | the counter the block's next multicast result carries | `reg_result_gap` |
//! | `result_uses[block*64 + counter]` | `2*slot + set + 1` of the use whose result carried `counter` | `reg_result_use` |
//! | `totals_seen[block]` | the counter of the latest total from the upper switch, plus 64 (0: none yet) | `reg_total_gap` |
//!
//! The four control registers of a slot are stored together, as one [`SlotRegisters`] record,
//! so that a packet's lookups touch one cache line; each field is the slot's cell of that
//! register array. `values` is stored flat, `(2*slot + set) * max_elems + k`, which is the same
//! set of cells as `max_elems/2` pair arrays indexed by `2*slot+set`; the array starts on a
//! cache line, so that with `max_elems` a multiple of 16 the cells of every `(slot, set)` do.

use crate::gap::take_counter;
pub use crate::gap::MAX_REPORTED_GAP;
use crate::kernels::{self, Isa};
use crate::Instant;
use ina_wire::agg::{PendingInfo, ProbeInfo, GAP_BLOCK, GAP_COUNTER, MAX_RANK};
use ina_wire::{
    frame, AggPacket, AggRepr, MessageType, QueryAsk, RejectReason, HEADER_LEN, PROTOCOL_VERSION,
};

/// A switch port: on the software switch, one peer address; on Tofino, a front-panel port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortId(pub u16);

/// Size of the switch: the register file it allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Slots in the pool shared by all jobs (each slot has two shadow sets).
    pub pool_slots: u16,
    /// The largest elements-per-packet any job may use (64 or 256 on Tofino).
    pub max_elems: u16,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            pool_slots: 4096,
            max_elems: 256,
        }
    }
}

/// An epoch for a job's next install, from `entropy` (a clock, a counter, a process id, mixed
/// in here): never 0, never `previous`, and unlikely to be any earlier one, so that a packet
/// of an earlier install is refused as stale.
pub fn fresh_epoch(entropy: u64, previous: Option<u16>) -> u16 {
    let mut x = entropy;
    x ^= x >> 31;
    x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 32;
    let mut e = (x as u16).max(1);
    if Some(e) == previous {
        e = e.wrapping_add(1).max(1);
    }
    e
}

/// One job as the control plane installs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobConfig {
    pub job: u16,
    /// The job's generation; packets carrying another epoch are refused.
    pub epoch: u16,
    /// First slot of the job's range.
    pub slot_base: u16,
    /// Number of slots in the range.
    pub slot_count: u16,
    /// Elements per full data packet.
    pub elems_per_packet: u16,
    /// The port of each rank; `ranks.len()` is the number of workers (1..=32).
    pub ranks: Vec<PortId>,
    /// Set when this switch is the lower level of an aggregation tree for the job: each use's
    /// sum of the ranks above is a partial sum, sent as Data to the upper switch, and the
    /// total that comes back is what the ranks get (PROTOCOL.md §9). `None`: this switch
    /// finishes the sums itself.
    pub uplink: Option<Uplink>,
}

/// The upper switch of a job, as the lower switch sees it: where its partial sums go and
/// what they are called there. The lower switch is one rank of a job on the upper switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uplink {
    /// The port the upper switch is reached on (and answers from).
    pub port: PortId,
    /// The job's id on the upper switch.
    pub job: u16,
    /// The job's epoch on the upper switch.
    pub epoch: u16,
    /// This switch's rank in the upper switch's job.
    pub rank: u8,
    /// The first slot of the upper switch's job: slot `slot_base + i` here is slot
    /// `uplink.slot_base + i` there.
    pub slot_base: u16,
}

impl Uplink {
    /// The upper switch's slot for slot `slot` of `job` here.
    #[inline(always)]
    fn slot_up(&self, job: &JobConfig, slot: u16) -> u16 {
        slot.wrapping_sub(job.slot_base)
            .wrapping_add(self.slot_base)
    }

    /// This switch's slot for slot `slot` of the upper switch, if `job` has it.
    #[inline(always)]
    fn slot_down(&self, job: &JobConfig, slot: u16) -> Option<u16> {
        let i = slot.wrapping_sub(self.slot_base);
        (i < job.slot_count).then(|| job.slot_base.wrapping_add(i))
    }
}

/// The bit of `reg_count` that marks a use whose first arrival carried no payload (an exponent
/// lookahead header): the use's later arrivals must carry none either, and one that carries a
/// payload is refused with `BadCount`, as is a payload-less arrival to a use that began with
/// one (PROTOCOL.md §6). Without it a header-only use would leave the registers' previous
/// values in place for a later payload to be added to.
pub const HEADER_USE: u32 = 1 << 31;
/// The bits of `reg_count` that count the arrivals still pending.
const PENDING_ARRIVALS: u32 = !HEADER_USE;

/// `reg_count` of a use whose ranks have all contributed on a lower switch, which waits for
/// the upper switch's total (a count of arrivals never reaches it: a job has at most 32 ranks).
/// The use's packets carried payload: its partial sum is sent with the job's elements.
pub const AWAITING_TOTAL: u32 = 0xffff;
/// As [`AWAITING_TOTAL`], for a use whose packets carried no payload (the exponent
/// lookahead's headers): its partial sum is a header. The register, not the packet that asks,
/// says which: a rank's status Query carries no payload whatever the use's packets did.
pub const AWAITING_TOTAL_HEADER: u32 = 0xfffe;

/// The rank whose retransmissions and Queries of a use waiting for its total are passed up as a
/// Query to the upper switch: the lower switch has no timer of its own, and borrows this rank's.
/// The upper switch's answer decides: the total (it was lost on the way down), a Pending
/// without this switch's bit (the partial was lost on the way up: it is sent again), or a
/// Pending with it (another rack is late: passed on to rank 0, which waits). The other ranks
/// are answered here with a Pending that shows every rank's contribution held. A partial is
/// thus sent again only when the upper switch lacks it, and a total that is only late costs a
/// 16-byte Query and its answer.
pub const UPLINK_TIMER_RANK: u8 = 0;

/// The element count of the partial sum of a use waiting for its total, or `None` when
/// `pending` is a count of arrivals (or 0).
#[inline(always)]
fn awaiting(pending: u32, elems: u16) -> Option<u16> {
    match pending {
        AWAITING_TOTAL => Some(elems),
        AWAITING_TOTAL_HEADER => Some(0),
        _ => None,
    }
}

/// Why a job cannot be installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    #[error("job {0} is already installed")]
    Exists(u16),
    #[error("job {0} is not installed")]
    Unknown(u16),
    #[error("a job has 1 to 32 workers, got {0}")]
    Workers(usize),
    #[error("slots {base}..{end} do not fit the pool of {pool} slots")]
    OutOfPool { base: u16, end: u32, pool: u16 },
    #[error("an empty slot range")]
    NoSlots,
    #[error("slots {base}..{end} overlap job {other}")]
    Overlap { base: u16, end: u32, other: u16 },
    #[error("elements per packet must be 1..={max}, got {got}")]
    Elems { got: u16, max: u16 },
    #[error("port {0:?} serves two ranks of the job")]
    DuplicatePort(PortId),
    #[error("the uplink's port {0:?} also serves a rank of the job")]
    UplinkIsRank(PortId),
    #[error("the uplink's port {port:?} and job {job} already carry job {other}")]
    UplinkShared { port: PortId, job: u16, other: u16 },
}

/// Where the packet in the caller's buffer goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Nothing to send; the reason was counted. A dropped packet changed no register.
    Drop(DropReason),
    /// The packet was taken in: a contribution aggregated (nothing to send until the other
    /// workers' arrive), or an upper switch's Pending or Reject counted.
    Absorbed,
    /// Send `len` bytes to one port.
    Unicast { port: PortId, len: usize },
    /// Send `len` bytes to each of these ports.
    Multicast { ports: &'a [PortId], len: usize },
}

/// Why a packet was dropped. Every reason has a counter in [`Counters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Not a well-formed `ina` packet (length, version, type).
    Malformed,
    /// A frame that is not Ethernet/IPv4/UDP to the `ina` port.
    NotIna,
    /// A well-formed packet of a type the switch does not accept (Result, Reject, ProbeReply).
    UnexpectedType,
    /// No job with this id is installed.
    UnknownJob,
    /// The rank is not part of the job.
    UnknownRank,
    /// The rank exists but arrived on another port than the one installed for it.
    WrongPort,
    /// Refused with a Reject: wrong epoch.
    StaleEpoch,
    /// Refused with a Reject: slot outside the job's range.
    SlotOutOfRange,
    /// Refused with a Reject: count neither 0 nor the job's elements per packet.
    BadCount,
    /// A packet of an older use of the slot (its sequence number is behind the slot's).
    StaleSeq,
    /// A copy of a contribution to a use that already completed, from a worker that has moved on.
    Duplicate,
    /// The reply (a result, a Reject or a ProbeReply) does not fit the caller's output buffer
    /// ([`Pipeline::process_frame`]: not even the frame headers fit, which is checked first).
    /// The packet is dropped before it changes any register, as if it had been lost on the way
    /// in: a retransmission with a large enough buffer is processed as this packet would have
    /// been. Counted instead of the reason of a refusal whose Reject could not be written.
    OutputTooSmall,
}

/// Counters of the pipeline. All monotonic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Counters {
    pub packets_in: u64,
    pub bytes_in: u64,
    pub data_first: u64,
    pub data_added: u64,
    pub results_multicast: u64,
    pub results_unicast: u64,
    pub probes_answered: u64,
    pub rejects_sent: u64,
    pub elements_aggregated: u64,
    pub malformed: u64,
    pub not_ina: u64,
    pub unexpected_type: u64,
    pub unknown_job: u64,
    pub unknown_rank: u64,
    pub wrong_port: u64,
    pub stale_epoch: u64,
    pub slot_out_of_range: u64,
    pub bad_count: u64,
    pub stale_seq: u64,
    pub duplicate: u64,
    /// Pending answers sent: to a retransmission or a Query of a use still collecting, or to a
    /// Query of a use the switch has not seen.
    #[cfg_attr(feature = "serde", serde(default))]
    pub pending_sent: u64,
    /// Absent from counters serialized before it existed.
    #[cfg_attr(feature = "serde", serde(default))]
    pub output_too_small: u64,
    /// Missing reports sent: a gap-reporting worker skipped positions within a block.
    #[cfg_attr(feature = "serde", serde(default))]
    pub missing_sent: u64,
    /// Partial sums sent to the upper switch when a use completed here (lower switch only).
    #[cfg_attr(feature = "serde", serde(default))]
    pub partials_sent: u64,
    /// Partial sums sent again: the upper switch answered a Query with a Pending that lacks
    /// this switch's contribution (the partial was lost on the way up).
    #[cfg_attr(feature = "serde", serde(default))]
    pub partials_resent: u64,
    /// Queries sent to the upper switch: rank 0 asked about a use whose total has not come
    /// down (PROTOCOL.md §9).
    #[cfg_attr(feature = "serde", serde(default))]
    pub queries_up: u64,
    /// Totals received from the upper switch and multicast to the ranks.
    #[cfg_attr(feature = "serde", serde(default))]
    pub totals_received: u64,
    /// Pending answers from the upper switch with nothing to do: the use is no longer waiting
    /// here (its total came down meanwhile), or the answer is not of the current use. (A Pending
    /// that holds this switch's partial is passed on to rank 0 and counted in `pending_sent`;
    /// one without it sends the partial again, `partials_resent`.)
    #[cfg_attr(feature = "serde", serde(default))]
    pub upstream_pending: u64,
    /// Rejects from the upper switch: the job's uplink is configured wrong, or the upper
    /// switch restarted (its epoch changed). The ranks' sums cannot finish until the job is
    /// installed again.
    #[cfg_attr(feature = "serde", serde(default))]
    pub upstream_rejects: u64,
    /// Partial sums sent again because the upper switch's Missing report named them (their
    /// gap counters never arrived there, PROTOCOL.md §9).
    #[cfg_attr(feature = "serde", serde(default))]
    pub partials_reported: u64,
    /// Missing reports from the upper switch with nothing to send again: the use they name
    /// no longer waits here (its total came down, or the report came twice).
    #[cfg_attr(feature = "serde", serde(default))]
    pub upstream_missing: u64,
    /// Partial sums sent up again as the ask of rank 0's Query at the end of its stream, a
    /// Query that asks for the partial ([`QueryAsk::pushes_partial`]), instead of a Query up
    /// (PROTOCOL.md §9).
    #[cfg_attr(feature = "serde", serde(default))]
    pub partials_for_fetch: u64,
    /// Missing reports from a rank, a worker or a lower switch: results multicast to it with
    /// gap counters that never arrived (PROTOCOL.md §5 "Lost results", §9). Each is answered
    /// as that rank's fetching Query of the use it names (a Result, or a Pending), counted
    /// there too.
    #[cfg_attr(feature = "serde", serde(default))]
    pub missing_received: u64,
    /// Missing reports from a rank that name no use this switch recorded.
    #[cfg_attr(feature = "serde", serde(default))]
    pub missing_unmatched: u64,
    /// Missing reports sent to the upper switch: totals that a gap counter showed lost on
    /// the way down.
    #[cfg_attr(feature = "serde", serde(default))]
    pub missing_up: u64,
}

impl Counters {
    /// Adds another set of counters (of another shard) to these.
    pub fn add(&mut self, o: &Counters) {
        self.packets_in += o.packets_in;
        self.bytes_in += o.bytes_in;
        self.data_first += o.data_first;
        self.data_added += o.data_added;
        self.results_multicast += o.results_multicast;
        self.results_unicast += o.results_unicast;
        self.probes_answered += o.probes_answered;
        self.rejects_sent += o.rejects_sent;
        self.elements_aggregated += o.elements_aggregated;
        self.malformed += o.malformed;
        self.not_ina += o.not_ina;
        self.unexpected_type += o.unexpected_type;
        self.unknown_job += o.unknown_job;
        self.unknown_rank += o.unknown_rank;
        self.wrong_port += o.wrong_port;
        self.stale_epoch += o.stale_epoch;
        self.slot_out_of_range += o.slot_out_of_range;
        self.bad_count += o.bad_count;
        self.stale_seq += o.stale_seq;
        self.duplicate += o.duplicate;
        self.pending_sent += o.pending_sent;
        self.output_too_small += o.output_too_small;
        self.missing_sent += o.missing_sent;
        self.partials_sent += o.partials_sent;
        self.partials_resent += o.partials_resent;
        self.queries_up += o.queries_up;
        self.totals_received += o.totals_received;
        self.upstream_pending += o.upstream_pending;
        self.upstream_rejects += o.upstream_rejects;
        self.partials_reported += o.partials_reported;
        self.upstream_missing += o.upstream_missing;
        self.partials_for_fetch += o.partials_for_fetch;
        self.missing_received += o.missing_received;
        self.missing_unmatched += o.missing_unmatched;
        self.missing_up += o.missing_up;
    }

    fn drop_counter(&mut self, reason: DropReason) -> &mut u64 {
        match reason {
            DropReason::Malformed => &mut self.malformed,
            DropReason::NotIna => &mut self.not_ina,
            DropReason::UnexpectedType => &mut self.unexpected_type,
            DropReason::UnknownJob => &mut self.unknown_job,
            DropReason::UnknownRank => &mut self.unknown_rank,
            DropReason::WrongPort => &mut self.wrong_port,
            DropReason::StaleEpoch => &mut self.stale_epoch,
            DropReason::SlotOutOfRange => &mut self.slot_out_of_range,
            DropReason::BadCount => &mut self.bad_count,
            DropReason::StaleSeq => &mut self.stale_seq,
            DropReason::Duplicate => &mut self.duplicate,
            DropReason::OutputTooSmall => &mut self.output_too_small,
        }
    }

    fn count_drop(&mut self, reason: DropReason) {
        *self.drop_counter(reason) += 1;
    }

    /// The counter of one drop reason.
    pub fn drops(&self, reason: DropReason) -> u64 {
        let mut copy = *self;
        *copy.drop_counter(reason)
    }

    /// Every drop reason's counter, by name.
    pub fn drops_by_reason(&self) -> [(&'static str, u64); 12] {
        [
            ("malformed", self.malformed),
            ("not_ina", self.not_ina),
            ("unexpected_type", self.unexpected_type),
            ("unknown_job", self.unknown_job),
            ("unknown_rank", self.unknown_rank),
            ("wrong_port", self.wrong_port),
            ("stale_epoch", self.stale_epoch),
            ("slot_out_of_range", self.slot_out_of_range),
            ("bad_count", self.bad_count),
            ("stale_seq", self.stale_seq),
            ("duplicate", self.duplicate),
            ("output_too_small", self.output_too_small),
        ]
    }

    /// All drops together.
    pub fn drops_total(&self) -> u64 {
        self.malformed
            + self.not_ina
            + self.unexpected_type
            + self.unknown_job
            + self.unknown_rank
            + self.wrong_port
            + self.stale_epoch
            + self.slot_out_of_range
            + self.bad_count
            + self.stale_seq
            + self.duplicate
            + self.output_too_small
    }
}

/// The control registers of one slot: its cell of each register array, one 32-bit half per
/// shadow set (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C, align(32))]
pub struct SlotRegisters {
    /// `reg_seq`: the sequence number of the set's current use.
    pub seq: [u32; 2],
    /// `reg_bitmap`: the workers whose contribution to the set's use arrived.
    pub bitmap: [u32; 2],
    /// `reg_count`: arrivals still pending in the set's use (0: complete or unused).
    pub count: [u32; 2],
    /// `reg_exp`: the largest exponent byte of the set's use.
    pub exp: [u32; 2],
}

/// 16 value cells on a cache line of their own. The value cells are stored as these, so that
/// with `max_elems` a multiple of 16 (64 and 256 are) the cells of every `(slot, set)` start on
/// a cache line, and no 32-byte vector load or store of a payload's cells straddles two lines.
/// (With the cells 16 bytes off a line, as a plain allocation put them, the 64-element bench
/// of the pipeline ran 5-10% slower.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct CellLine([i32; 16]);

/// The value cells of `lines` as one array (with the padding of the last line, if any).
#[inline(always)]
fn cells_of(lines: &mut [CellLine]) -> &mut [i32] {
    bytemuck::cast_slice_mut(lines)
}

/// The register file (see the module docs for the layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registers {
    slots: Vec<SlotRegisters>,
    /// `reg_gap`: per block of [`GAP_BLOCK`] slots and rank, the gap counter of the latest Data
    /// packet that carried one, plus [`GAP_COUNTER`]; 0 before the first (PROTOCOL.md §5,
    /// loss recovery).
    gaps: Vec<u32>,
    /// `reg_partial_gap` (a switch with an uplink): per block of [`GAP_BLOCK`] slots, the gap
    /// counter the next partial sum sent up to the block carries (PROTOCOL.md §9).
    partial_gaps: Vec<u8>,
    /// `reg_partial_use`: per block and gap counter, `2 * slot + set + 1` of the use whose
    /// partial sum carried that counter (0: none), so that the upper switch's Missing report,
    /// which names a counter, names a use here.
    partial_uses: Vec<u32>,
    /// `reg_result_gap`: per block, the gap counter the block's next multicast result
    /// carries (PROTOCOL.md §9: a lower switch finds a lost total by it).
    result_gaps: Vec<u8>,
    /// `reg_result_use`: per block and gap counter, `2 * slot + set + 1` of the use whose
    /// multicast result carried it (0: none), so that a rank's Missing report names a use.
    result_uses: Vec<u32>,
    /// `reg_total_gap` (a switch with an uplink): per block, the gap counter of the latest
    /// total that came down with one, plus 64 (0: none yet).
    totals_seen: Vec<u32>,
    /// The value cells: element `(2*slot + set) * max_elems + k` of [`cells_of`] them.
    values: Vec<CellLine>,
    /// (As configured, 16 bits: an offset computed from it and a 16-bit slot cannot overflow,
    /// which spares the slot update a check.)
    max_elems: u16,
}

impl Registers {
    fn new(cfg: PipelineConfig) -> Registers {
        let slots = usize::from(cfg.pool_slots);
        Registers {
            slots: vec![SlotRegisters::default(); slots],
            gaps: vec![0; slots.div_ceil(usize::from(GAP_BLOCK)) * (usize::from(MAX_RANK) + 1)],
            partial_gaps: vec![0; slots.div_ceil(usize::from(GAP_BLOCK))],
            partial_uses: vec![
                0;
                slots.div_ceil(usize::from(GAP_BLOCK)) * usize::from(GAP_COUNTER)
            ],
            result_gaps: vec![0; slots.div_ceil(usize::from(GAP_BLOCK))],
            result_uses: vec![0; slots.div_ceil(usize::from(GAP_BLOCK)) * usize::from(GAP_COUNTER)],
            totals_seen: vec![0; slots.div_ceil(usize::from(GAP_BLOCK))],
            values: vec![CellLine([0; 16]); (slots * 2 * usize::from(cfg.max_elems)).div_ceil(16)],
            max_elems: cfg.max_elems,
        }
    }

    /// The control registers of every slot of the pool.
    pub fn slots(&self) -> &[SlotRegisters] {
        &self.slots
    }

    /// The gap register: cell `block * 32 + rank` for the block of slots
    /// `block * GAP_BLOCK..(block + 1) * GAP_BLOCK`.
    pub fn gaps(&self) -> &[u32] {
        &self.gaps
    }

    /// The value cells of the whole pool, `(2*slot + set) * max_elems + k`.
    pub fn values(&self) -> &[i32] {
        let all: &[i32] = bytemuck::cast_slice(&self.values);
        all.get(..2 * self.slots.len() * usize::from(self.max_elems))
            .unwrap_or(all)
    }

    /// The value cells of `(slot, set)`.
    pub fn values_of(&self, slot: usize, set: usize) -> &[i32] {
        let m = usize::from(self.max_elems);
        let start = (2 * slot + set) * m;
        &self.values()[start..start + m]
    }

    fn clear_range(&mut self, base: usize, count: usize) {
        self.slots[base..base + count].fill(SlotRegisters::default());
        // The gap cells of the blocks wholly inside the range (only those take reports).
        let b = usize::from(GAP_BLOCK);
        let ranks = usize::from(MAX_RANK) + 1;
        let (first, end) = (base.div_ceil(b), (base + count) / b);
        if first < end {
            self.gaps[first * ranks..end * ranks].fill(0);
            self.partial_gaps[first..end].fill(0);
            self.result_gaps[first..end].fill(0);
            self.totals_seen[first..end].fill(0);
            let m = usize::from(GAP_COUNTER);
            self.partial_uses[first * m..end * m].fill(0);
            self.result_uses[first * m..end * m].fill(0);
        }
        let m = usize::from(self.max_elems);
        cells_of(&mut self.values)[2 * base * m..2 * (base + count) * m].fill(0);
    }
}

#[derive(Debug, Clone)]
struct Job {
    cfg: JobConfig,
    /// What the data fast path compares the header's bytes 2..6 with: job id and epoch, as
    /// they lie in a packet.
    key: [u8; 4],
    /// What the data fast path compares the header's bytes 10..12 with: the element count, as
    /// it lies in a packet.
    count_bytes: [u8; 2],
    /// The length of the job's data packets: header and `elems_per_packet` elements.
    packet_len: usize,
    /// `cfg.ranks.len()`.
    workers: u32,
    /// `cfg.ranks`, padded, in place: the rank check needs no indirection.
    ports: [PortId; MAX_RANK as usize + 1],
    last_activity: Option<Instant>,
}

impl Job {
    /// The port installed for `rank`, if the job has that rank.
    #[inline(always)]
    fn port_of(&self, rank: u8) -> Option<PortId> {
        if u32::from(rank) < self.workers {
            Some(self.ports[usize::from(rank % 32)])
        } else {
            None
        }
    }

    fn new(cfg: JobConfig) -> Job {
        let mut ports = [PortId(0); MAX_RANK as usize + 1];
        for (p, r) in ports.iter_mut().zip(&cfg.ranks) {
            *p = *r;
        }
        Job {
            key: (u32::from(cfg.job) << 16 | u32::from(cfg.epoch)).to_be_bytes(),
            count_bytes: cfg.elems_per_packet.to_be_bytes(),
            packet_len: HEADER_LEN + 4 * usize::from(cfg.elems_per_packet),
            workers: cfg.ranks.len() as u32,
            ports,
            cfg,
            last_activity: None,
        }
    }
}

/// The switch data plane.
#[derive(Debug, Clone)]
pub struct Pipeline {
    cfg: PipelineConfig,
    regs: Registers,
    jobs: Vec<Job>,
    counters: Counters,
    /// Whether Data with a gap counter updates `reg_gap` and is answered with Missing reports
    /// (see [`Self::set_gap_reports`]).
    gap_reports: bool,
    /// The Missing report the latest packet caused, for [`Self::poll_report`].
    report: Option<Report>,
    /// The widest vectors the CPU has (see `process_dispatch`), asked once, when the pipeline
    /// was made: a test of this field per packet takes fewer instructions than std's feature
    /// cache.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    isa: Isa,
}

impl Pipeline {
    /// A switch with an empty job table and cleared registers.
    pub fn new(cfg: PipelineConfig) -> Pipeline {
        Pipeline {
            cfg,
            regs: Registers::new(cfg),
            jobs: Vec::new(),
            counters: Counters::default(),
            gap_reports: false,
            report: None,
            isa: Isa::detect(),
        }
    }

    /// Turns the gap register and its Missing reports on or off (off when made). The P4
    /// programs keep no gap register yet: with reports off, this model is theirs register for
    /// register, and a ProbeReply tells the workers that no reports come. A caller that turns
    /// them on must send what [`Self::poll_report`] returns.
    pub fn set_gap_reports(&mut self, on: bool) {
        self.gap_reports = on;
    }

    /// The Missing report caused by the packet just processed, if any: a second packet to
    /// send, besides the verdict's, to one port. A caller that never asks sends none, and the
    /// workers recover the loss without it (more slowly). The next packet processed replaces it.
    pub fn poll_report(&mut self) -> Option<Report> {
        self.report.take()
    }

    /// The configuration.
    pub fn config(&self) -> PipelineConfig {
        self.cfg
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The register file, for inspection.
    pub fn registers(&self) -> &Registers {
        &self.regs
    }

    /// The installed jobs.
    pub fn jobs(&self) -> impl Iterator<Item = &JobConfig> {
        self.jobs.iter().map(|j| &j.cfg)
    }

    /// When a packet of `job` last passed the checks.
    pub fn last_activity(&self, job: u16) -> Option<Instant> {
        self.jobs
            .iter()
            .find(|j| j.cfg.job == job)
            .and_then(|j| j.last_activity)
    }

    /// Slots of the pool in which a use is collecting (some but not all arrivals in).
    pub fn busy_slots(&self) -> usize {
        self.regs.slots.iter().filter(|r| r.count != [0, 0]).count()
    }

    /// Installs a job and clears its slots.
    pub fn add_job(&mut self, cfg: JobConfig) -> Result<(), JobError> {
        if self.jobs.iter().any(|j| j.cfg.job == cfg.job) {
            return Err(JobError::Exists(cfg.job));
        }
        if cfg.ranks.is_empty() || cfg.ranks.len() > usize::from(MAX_RANK) + 1 {
            return Err(JobError::Workers(cfg.ranks.len()));
        }
        if cfg.elems_per_packet == 0 || cfg.elems_per_packet > self.cfg.max_elems {
            return Err(JobError::Elems {
                got: cfg.elems_per_packet,
                max: self.cfg.max_elems,
            });
        }
        if cfg.slot_count == 0 {
            return Err(JobError::NoSlots);
        }
        let end = u32::from(cfg.slot_base) + u32::from(cfg.slot_count);
        if end > u32::from(self.cfg.pool_slots) {
            return Err(JobError::OutOfPool {
                base: cfg.slot_base,
                end,
                pool: self.cfg.pool_slots,
            });
        }
        for other in &self.jobs {
            let o_base = u32::from(other.cfg.slot_base);
            let o_end = o_base + u32::from(other.cfg.slot_count);
            if u32::from(cfg.slot_base) < o_end && o_base < end {
                return Err(JobError::Overlap {
                    base: cfg.slot_base,
                    end,
                    other: other.cfg.job,
                });
            }
        }
        for (i, p) in cfg.ranks.iter().enumerate() {
            if cfg.ranks[..i].contains(p) {
                return Err(JobError::DuplicatePort(*p));
            }
        }
        if let Some(up) = cfg.uplink {
            if cfg.ranks.contains(&up.port) {
                return Err(JobError::UplinkIsRank(up.port));
            }
            // The totals coming down are told apart by port and job on the upper switch.
            if let Some(other) = self.jobs.iter().find(|j| {
                j.cfg
                    .uplink
                    .is_some_and(|o| o.port == up.port && o.job == up.job)
            }) {
                return Err(JobError::UplinkShared {
                    port: up.port,
                    job: up.job,
                    other: other.cfg.job,
                });
            }
        }
        self.regs
            .clear_range(usize::from(cfg.slot_base), usize::from(cfg.slot_count));
        self.jobs.push(Job::new(cfg));
        Ok(())
    }

    /// Removes a job and clears its slots.
    pub fn remove_job(&mut self, job: u16) -> Result<JobConfig, JobError> {
        let idx = self
            .jobs
            .iter()
            .position(|j| j.cfg.job == job)
            .ok_or(JobError::Unknown(job))?;
        let removed = self.jobs.swap_remove(idx).cfg;
        self.regs.clear_range(
            usize::from(removed.slot_base),
            usize::from(removed.slot_count),
        );
        Ok(removed)
    }

    /// Counts a packet or frame of `len` bytes in.
    #[inline(always)]
    fn count_arrival(&mut self, len: usize) {
        self.report = None;
        self.counters.packets_in += 1;
        self.counters.bytes_in += len as u64;
    }

    fn drop(&mut self, reason: DropReason) -> Verdict<'static> {
        drop_counted(&mut self.counters, reason)
    }

    /// Processes a whole Ethernet/IPv4/UDP frame. Replies are written into `out` as frames;
    /// the unicast reply goes back with addresses swapped, and a multicast result carries
    /// the switch's addresses as source and the sender's as destination, which the egress of
    /// each port rewrites (on the software switch: `frame_addrs_for` of the port).
    pub fn process_frame(
        &mut self,
        ingress: PortId,
        frame_bytes: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        self.count_arrival(frame_bytes.len());
        let Ok(parsed) = frame::parse(frame_bytes) else {
            return self.drop(DropReason::NotIna);
        };
        if parsed.addrs.dst_port != ina_wire::UDP_PORT {
            return self.drop(DropReason::NotIna);
        }
        if out.len() < frame::FRAME_HEADER_LEN {
            return self.drop(DropReason::OutputTooSmall);
        }
        let addrs = parsed.addrs.reversed();
        let (head, body) = out.split_at_mut(frame::FRAME_HEADER_LEN);
        let verdict = self.process_dispatch(ingress, parsed.payload, now, body);
        let len = match verdict {
            Verdict::Drop(_) | Verdict::Absorbed => return verdict,
            Verdict::Unicast { len, .. } | Verdict::Multicast { len, .. } => len,
        };
        if frame::emit_headers(head, &addrs, len).is_err() {
            // Unreachable: `head` is exactly FRAME_HEADER_LEN long and len fits in a UDP datagram.
            return Verdict::Drop(DropReason::Malformed);
        }
        match verdict {
            Verdict::Unicast { port, len } => Verdict::Unicast {
                port,
                len: len + frame::FRAME_HEADER_LEN,
            },
            Verdict::Multicast { ports, len } => Verdict::Multicast {
                ports,
                len: len + frame::FRAME_HEADER_LEN,
            },
            other => other,
        }
    }

    /// Processes one `ina` packet (a UDP payload) that arrived on `ingress`. Any reply is
    /// written at the start of `out`, which should hold `16 + 4 * max_elems` bytes.
    #[inline]
    pub fn process(
        &mut self,
        ingress: PortId,
        packet: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        self.count_arrival(packet.len());
        self.process_dispatch(ingress, packet, now, out)
    }

    /// Runs `f` with a [`Burst`] of this pipeline: the same [`Burst::process`] as
    /// [`Self::process`], but inlined, with `f`, into one function compiled for the widest
    /// vectors the CPU has. A caller that has several packets at hand (a receive batch) saves
    /// a call, and the saving and restoring of registers, per packet: the fast path of every
    /// packet runs inside its own loop.
    ///
    /// `f` should be a closure marked `#[inline(always)]`, and so should every function and
    /// closure between it and [`Burst::process`]: code the compiler keeps out of line is
    /// compiled for the baseline target (still correct, only slower).
    #[inline]
    pub fn burst<R>(&mut self, f: impl FnOnce(&mut Burst<'_>) -> R) -> R {
        #[cfg(target_arch = "x86_64")]
        match self.isa {
            // SAFETY: the CPU has the features of each function (`isa` is `Isa::detect`'s
            // answer, asked in `new`), their only requirement.
            #[allow(unsafe_code)]
            Isa::Avx512 => return unsafe { burst_avx512(self, f) },
            #[allow(unsafe_code)]
            Isa::Avx2 => return unsafe { burst_avx2(self, f) },
            Isa::Baseline => {}
        }
        f(&mut Burst { pipe: self })
    }

    /// [`Self::process_inner`] compiled for the widest vectors the CPU has, so that the loops
    /// over the elements are inlined in that form (see the `kernels` module).
    #[inline]
    fn process_dispatch(
        &mut self,
        ingress: PortId,
        packet: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        #[cfg(target_arch = "x86_64")]
        match self.isa {
            // SAFETY: the CPU has the features of each function (`isa` is `Isa::detect`'s
            // answer, asked in `new`), their only requirement.
            #[allow(unsafe_code)]
            Isa::Avx512 => return unsafe { self.process_inner_avx512(ingress, packet, now, out) },
            #[allow(unsafe_code)]
            Isa::Avx2 => return unsafe { self.process_inner_avx2(ingress, packet, now, out) },
            Isa::Baseline => {}
        }
        self.process_baseline::<true>(ingress, packet, now, out)
    }

    /// [`Self::process_inner`] out of line, compiled for the baseline target. With the fast path
    /// (`FAST`) it is the baseline compilation of `process`. Without it, it is the general path,
    /// which every compilation calls for every packet the fast path does not take: its checks,
    /// refusals and replies then take no room (nor registers) in the fast path's function.
    #[inline(never)]
    fn process_baseline<const FAST: bool>(
        &mut self,
        ingress: PortId,
        packet: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        self.process_inner::<FAST>(ingress, packet, now, out)
    }

    #[inline(always)]
    fn process_inner<const FAST: bool>(
        &mut self,
        ingress: PortId,
        packet: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        // The header as a fixed-size view: its accessors need no bounds checks, and each field
        // is read where it is used.
        let (Some(header), Some(payload_bytes)) =
            (packet.first_chunk::<HEADER_LEN>(), packet.get(HEADER_LEN..))
        else {
            return self.drop(DropReason::Malformed);
        };
        if FAST {
            // (A result must fit `out` as well: the fast path's slot update then needs no
            // check of its own that it does.)
            if let Some(job_idx) = self
                .fast_data_job(header, packet.len(), ingress)
                .filter(|_| out.len() >= packet.len())
            {
                let view = AggPacket::new_unchecked(header);
                // The payload lengths of Tofino's element counts (64 and 256) as constants:
                // the slot update is compiled for each, with its loops over the elements
                // unrolled into straight-line vector code.
                if let Ok(p) = <&[u8; 256]>::try_from(payload_bytes) {
                    return self.aggregate(job_idx, &view, p, ingress, now, out);
                }
                if let Ok(p) = <&[u8; 1024]>::try_from(payload_bytes) {
                    return self.aggregate(job_idx, &view, p, ingress, now, out);
                }
                return self.aggregate(job_idx, &view, payload_bytes, ingress, now, out);
            }
            return self.process_baseline::<false>(ingress, packet, now, out);
        }
        let view = AggPacket::new_unchecked(header);
        // Data of this protocol version: the version and type `AggRepr::parse_header` accepts
        // without further checks. Everything else takes the general path.
        if view.version() != PROTOCOL_VERSION || view.msg_type_raw() != MessageType::Data as u8 {
            return self.process_control(ingress, header, payload_bytes, now, out);
        }
        if payload_bytes.len() != 4 * usize::from(view.count()) {
            return self.drop(DropReason::Malformed);
        }
        let job_idx = match self.authenticate(view.job(), view.rank(), ingress) {
            Ok(i) => i,
            Err(reason) => return self.drop(reason),
        };
        let job = &self.jobs[job_idx].cfg;
        // From here on the sender is authenticated: refusals are answered with a Reject.
        let refusal = if view.epoch() != job.epoch {
            Some(RejectReason::StaleEpoch)
        } else if !job_has_slot(job, view.slot()) {
            Some(RejectReason::SlotOutOfRange)
        } else if view.count() != 0 && view.count() != job.elems_per_packet {
            Some(RejectReason::BadCount)
        } else {
            None
        };
        if let Some(reason) = refusal {
            return self.reject_header(job_idx, header, reason, ingress, out);
        }
        self.aggregate(job_idx, &view, payload_bytes, ingress, now, out)
    }

    /// The job of a data packet that passes every check of the decision table before the
    /// registers: version and type, job, rank and port, epoch, slot range, a full payload.
    /// `None` for every other packet, which the general path then examines (so that this
    /// path only needs to be fast, and the general one alone decides refusals and drops).
    #[inline(always)]
    fn fast_data_job(
        &self,
        header: &[u8; HEADER_LEN],
        packet_len: usize,
        ingress: PortId,
    ) -> Option<usize> {
        const DATA: u8 = PROTOCOL_VERSION << 4 | MessageType::Data as u8;
        let [ver_type, _, j0, j1, e0, e1, rank, _, s0, s1, c0, c1, ..] = *header;
        if ver_type != DATA {
            return None;
        }
        // Job id, epoch and count are compared in the packet's byte order; with the count
        // matching, the packet's length tells that the payload holds the count's elements.
        let job_idx = self.jobs.iter().position(|j| j.key == [j0, j1, e0, e1])?;
        let job = self.jobs.get(job_idx)?;
        let slot = u16::from_be_bytes([s0, s1]);
        // (`Job::port_of` spelled out: this form takes fewer instructions here.)
        let rank = u32::from(rank);
        let fits = [c0, c1] == job.count_bytes
            && packet_len == job.packet_len
            && rank < job.workers
            && job.ports[(rank % 32) as usize] == ingress
            && slot.wrapping_sub(job.cfg.slot_base) < job.cfg.slot_count;
        fits.then_some(job_idx)
    }

    /// Every packet but data of this version: probes and queries are answered, the rest dropped.
    #[inline(never)]
    fn process_control(
        &mut self,
        ingress: PortId,
        header: &[u8; HEADER_LEN],
        payload_bytes: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        let Ok(hdr) = AggRepr::parse_header(header) else {
            return self.drop(DropReason::Malformed);
        };
        if payload_bytes.len() != 4 * usize::from(hdr.count) {
            return self.drop(DropReason::Malformed);
        }
        if !matches!(hdr.kind, MessageType::Probe | MessageType::Query) {
            if let Some(job_idx) = self.job_of_uplink(ingress, hdr.job) {
                return self.handle_from_upper(job_idx, hdr, payload_bytes, now, out);
            }
            if hdr.kind == MessageType::Missing && self.gap_reports {
                return self.answer_lower_missing(hdr, ingress, now, out);
            }
            return self.drop(DropReason::UnexpectedType);
        }
        let job_idx = match self.authenticate(hdr.job, hdr.rank, ingress) {
            Ok(job_idx) => job_idx,
            Err(reason) => return self.drop(reason),
        };
        if hdr.kind == MessageType::Probe {
            return self.answer_probe(job_idx, hdr, ingress, out);
        }
        let job = &self.jobs[job_idx].cfg;
        let refusal = if hdr.epoch != job.epoch {
            Some(RejectReason::StaleEpoch)
        } else if !job_has_slot(job, hdr.slot) {
            Some(RejectReason::SlotOutOfRange)
        } else if hdr.count != 0 {
            Some(RejectReason::BadCount)
        } else {
            None
        };
        match refusal {
            Some(reason) => self.reject(job_idx, hdr, reason, ingress, out),
            None => self.answer_query(job_idx, header, ingress, now, out),
        }
    }

    /// A Missing report from rank `hdr.rank`, a worker or a lower switch (PROTOCOL.md §5
    /// "Lost results", §9): the multicast results that carried the gap counters it names
    /// never reached it. The first one's use, looked up in `reg_result_use`, is answered as
    /// that rank's fetching Query of it: its stored result if the use is complete, else a
    /// Pending.
    #[cold]
    fn answer_lower_missing(
        &mut self,
        hdr: AggRepr,
        ingress: PortId,
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        let job_idx = match self.authenticate(hdr.job, hdr.rank, ingress) {
            Ok(job_idx) => job_idx,
            Err(reason) => return self.drop(reason),
        };
        let job = &self.jobs[job_idx].cfg;
        let named = (hdr.epoch == job.epoch && job_has_slot(job, hdr.slot))
            .then(|| recorded_use(&self.regs.result_uses, hdr.slot, hdr.gap?))
            .flatten();
        let Some((slot, set)) = named else {
            self.counters.missing_unmatched += 1;
            return Verdict::Absorbed;
        };
        self.counters.missing_received += 1;
        let repr = AggRepr {
            kind: MessageType::Query,
            gap: None,
            set,
            exponent: QueryAsk::Fetch.byte(),
            slot,
            count: 0,
            seq: self.regs.slots[usize::from(slot)].seq[usize::from(set)],
            ..hdr
        };
        let mut header = [0u8; HEADER_LEN];
        if repr.emit_into(&mut header).is_err() {
            return self.drop(DropReason::Malformed);
        }
        self.answer_query(job_idx, &header, ingress, now, out)
    }

    /// A Query of one use of a slot (PROTOCOL.md §6, the Query's decision table): the stored
    /// result if the use is complete, else a Pending answer. Changes no register.
    fn answer_query(
        &mut self,
        job_idx: usize,
        header: &[u8; HEADER_LEN],
        ingress: PortId,
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        let Pipeline {
            regs,
            jobs,
            counters,
            gap_reports,
            ..
        } = self;
        let job = &mut jobs[job_idx];
        let view = AggPacket::new_unchecked(header);
        let slot = usize::from(view.slot());
        let x = usize::from(view.set());
        let bit = 1u32 << (view.rank() % 32);
        let SlotRegisters {
            seq,
            bitmap,
            count: pending,
            exp,
        } = regs.slots[slot];
        let delta = view.seq().wrapping_sub(seq[x]) as i32;
        if delta < 0 {
            return drop_counted(counters, DropReason::StaleSeq);
        }
        if delta > 0 {
            // No packet of this use has arrived.
            return emit_pending(counters, &view, 0, ingress, out);
        }
        let count = if QueryAsk::wants_sums(view.exponent()) {
            job.cfg.elems_per_packet
        } else {
            0
        };
        let base = (2 * slot + x) * usize::from(regs.max_elems);
        if let Some(partial_elems) = awaiting(pending[x], job.cfg.elems_per_packet) {
            // Every rank here contributed and the total has not come down: rank 0's Query
            // asks the upper switch (PROTOCOL.md §9), the others get a Pending.
            job.last_activity = Some(now);
            let pushes = QueryAsk::pushes_partial(view.exponent());
            let up = job.cfg.uplink.filter(|_| {
                pushes && *gap_reports && view.rank() == UPLINK_TIMER_RANK && bitmap[x] & bit != 0
            });
            if let Some(up) = up {
                // Rank 0 asks for the partial: its stream has sent every packet, and this use
                // is late. The partial goes up again as the ask: it repairs a lost partial at
                // once, and the upper switch answers a copy with the total or a Pending.
                let stored = (view.slot(), x, partial_elems);
                let verdict = emit_stored_partial(regs, counters, &view, &job.cfg, up, stored, out);
                if matches!(verdict, Verdict::Unicast { .. }) {
                    counters.partials_for_fetch += 1;
                }
                return verdict;
            }
            return answer_waiting(counters, &view, &job.cfg, bitmap[x], ingress, out);
        }
        if pending[x] != 0 {
            return emit_pending(counters, &view, bitmap[x], ingress, out);
        }
        if bitmap[x] & bit == 0 {
            return drop_counted(counters, DropReason::Duplicate);
        }
        let result_len = HEADER_LEN + 4 * usize::from(count);
        let Some(out) = out.get_mut(..result_len) else {
            return drop_counted(counters, DropReason::OutputTooSmall);
        };
        let cells = &cells_of(&mut regs.values)[base..base + usize::from(count)];
        emit_result(&view, exp[x], cells, None, out);
        if let Some(mut pkt) = out
            .first_chunk_mut::<HEADER_LEN>()
            .map(AggPacket::new_unchecked)
        {
            pkt.set_count(count);
        }
        job.last_activity = Some(now);
        counters.results_unicast += 1;
        Verdict::Unicast {
            port: ingress,
            len: result_len,
        }
    }

    /// The job whose uplink is `port` and job `upper_job` on the upper switch.
    fn job_of_uplink(&self, port: PortId, upper_job: u16) -> Option<usize> {
        self.jobs.iter().position(|j| {
            j.cfg
                .uplink
                .is_some_and(|u| u.port == port && u.job == upper_job)
        })
    }

    /// A packet of the upper switch for a job this switch is the lower level of (PROTOCOL.md
    /// §9): a total is stored as the use's result and multicast to the ranks; a Pending answers
    /// rank 0's Query ([`Self::handle_upper_pending`]); a Reject is counted; anything else is
    /// dropped.
    #[cold]
    fn handle_from_upper(
        &mut self,
        job_idx: usize,
        hdr: AggRepr,
        payload_bytes: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        let Pipeline {
            regs,
            jobs,
            counters,
            gap_reports,
            report,
            ..
        } = self;
        let job = &mut jobs[job_idx];
        let Some(up) = job.cfg.uplink else {
            return drop_counted(counters, DropReason::UnexpectedType);
        };
        match hdr.kind {
            MessageType::Result => {}
            MessageType::Pending => {
                return Self::handle_upper_pending(regs, job, counters, hdr, payload_bytes, out);
            }
            MessageType::Reject => {
                counters.upstream_rejects += 1;
                return Self::pass_upper_reject(regs, job, hdr, out);
            }
            MessageType::Missing => {
                return Self::resend_reported_partial(regs, job, counters, hdr, out);
            }
            _ => return drop_counted(counters, DropReason::UnexpectedType),
        }
        if hdr.epoch != up.epoch {
            return drop_counted(counters, DropReason::StaleEpoch);
        }
        let Some(slot) = up.slot_down(&job.cfg, hdr.slot) else {
            return drop_counted(counters, DropReason::SlotOutOfRange);
        };
        if hdr.count != 0 && hdr.count != job.cfg.elems_per_packet {
            return drop_counted(counters, DropReason::BadCount);
        }
        if let Some(counter) = hdr.gap.filter(|_| *gap_reports) {
            let totals = &mut regs.totals_seen;
            if note_total_counter(totals, &job.cfg, up, slot, &hdr, counter, report) {
                counters.missing_up += 1;
            }
        }
        let count = usize::from(hdr.count);
        let result_len = HEADER_LEN + 4 * count;
        if out.len() < result_len {
            return drop_counted(counters, DropReason::OutputTooSmall);
        }
        let slot_idx = usize::from(slot);
        let x = usize::from(hdr.set);
        let SlotRegisters {
            seq,
            count: pending,
            exp,
            ..
        } = &mut regs.slots[slot_idx];
        if hdr.seq != seq[x] {
            return drop_counted(counters, DropReason::StaleSeq);
        }
        match awaiting(pending[x], job.cfg.elems_per_packet) {
            Some(c) if c == hdr.count => {}
            Some(c) if c != 0 && hdr.count == 0 => {
                // The answer to a status Query: the use is complete up there, and the total,
                // which this answer followed, was lost. Fetch it.
                let header = rank0_ask(&job.cfg, slot, hdr);
                let view = AggPacket::new_unchecked(&header);
                return emit_query_up(counters, &view, &job.cfg, up, QueryAsk::Fetch, out);
            }
            _ => {
                // A copy of a total already multicast (an answer to a Query that crossed the
                // total): the ranks that ask again get it from the registers.
                return drop_counted(counters, DropReason::Duplicate);
            }
        }
        let base = (2 * slot_idx + x) * usize::from(regs.max_elems);
        let cells = &mut cells_of(&mut regs.values)[base..base + count];
        in_turns(payload_bytes, cells, kernels::portable::decode_be);
        exp[x] = u32::from(hdr.exponent);
        pending[x] = 0;
        job.last_activity = Some(now);
        counters.totals_received += 1;
        counters.results_multicast += 1;
        let gap = (*gap_reports && block_in_job(&job.cfg, slot_idx))
            .then(|| stamp(&mut regs.result_gaps, &mut regs.result_uses, slot_idx, x))
            .flatten();
        let repr = AggRepr {
            kind: MessageType::Result,
            gap,
            job: job.cfg.job,
            epoch: job.cfg.epoch,
            rank: 0,
            slot,
            ..hdr
        };
        let Ok(mut pkt) = repr.emit_into(out) else {
            // Unreachable: `out` was checked to hold the result.
            return drop_counted(counters, DropReason::OutputTooSmall);
        };
        kernels::portable::encode_be(cells, pkt.payload_mut());
        Verdict::Multicast {
            ports: &job.cfg.ranks,
            len: result_len,
        }
    }

    /// The upper switch's Pending answer to this switch's Query (PROTOCOL.md §9), for a use
    /// that still waits here for its total: without this switch's bit, the partial was lost on
    /// the way up and is sent again; with it, another rack is late, and rank 0 (whose Query
    /// this answers) is told that every rank here contributed. Any other Pending is counted.
    #[cold]
    fn handle_upper_pending<'a>(
        regs: &mut Registers,
        job: &'a Job,
        counters: &mut Counters,
        hdr: AggRepr,
        payload_bytes: &[u8],
        out: &mut [u8],
    ) -> Verdict<'a> {
        let named = job
            .cfg
            .uplink
            .filter(|u| u.epoch == hdr.epoch)
            .and_then(|_| waiting_use_named(regs, &job.cfg, &hdr));
        let (Some(w), Ok(info)) = (named, PendingInfo::parse(payload_bytes)) else {
            counters.upstream_pending += 1;
            return Verdict::Absorbed;
        };
        let header = rank0_ask(&job.cfg, w.slot, hdr);
        let view = AggPacket::new_unchecked(&header);
        if info.bitmap & (1u32 << (w.up.rank % 32)) == 0 {
            let stored = (w.slot, usize::from(hdr.set), w.partial_elems);
            let verdict = emit_stored_partial(regs, counters, &view, &job.cfg, w.up, stored, out);
            if matches!(verdict, Verdict::Unicast { .. }) {
                counters.partials_resent += 1;
            }
            return verdict;
        }
        emit_pending(counters, &view, w.bitmap, w.rank0_port, out)
    }

    /// The upper switch's Missing report: the partial sums that carried
    /// the gap counters it names never arrived there. The first one is sent again, if its use
    /// still waits here for its total; the others, if several were lost in a row, are left to
    /// rank 0's asking (one packet in, one out, as on a P4 switch).
    #[cold]
    fn resend_reported_partial<'a>(
        regs: &mut Registers,
        job: &'a Job,
        counters: &mut Counters,
        hdr: AggRepr,
        out: &mut [u8],
    ) -> Verdict<'a> {
        let Some(w) = reported_use(regs, &job.cfg, &hdr) else {
            counters.upstream_missing += 1;
            return Verdict::Absorbed;
        };
        let header = rank0_ask(
            &job.cfg,
            w.slot,
            AggRepr {
                set: w.set,
                seq: w.seq,
                ..hdr
            },
        );
        let view = AggPacket::new_unchecked(&header);
        let stored = (w.slot, usize::from(w.set), w.partial_elems);
        let verdict = emit_stored_partial(regs, counters, &view, &job.cfg, w.up, stored, out);
        if matches!(verdict, Verdict::Unicast { .. }) {
            counters.partials_reported += 1;
        }
        verdict
    }

    /// The upper switch's Reject of this switch's Query or partial (counted by the caller): if
    /// it names a use that waits here for its total, rank 0, whose ask it answers, is told that
    /// every rank here contributed (a Pending with the use's bitmap), so that its error, when it
    /// gives up, points past this switch. The Reject itself stays here: the upper job's
    /// refusal means nothing to a worker. (The epoch is not checked: a wrong one is what
    /// most Rejects are about.)
    #[cold]
    fn pass_upper_reject<'a>(
        regs: &Registers,
        job: &'a Job,
        hdr: AggRepr,
        out: &mut [u8],
    ) -> Verdict<'a> {
        let Some(w) = waiting_use_named(regs, &job.cfg, &hdr) else {
            return Verdict::Absorbed;
        };
        let header = rank0_ask(&job.cfg, w.slot, hdr);
        match write_pending(&AggPacket::new_unchecked(&header), w.bitmap, out) {
            Some(len) => Verdict::Unicast {
                port: w.rank0_port,
                len,
            },
            None => Verdict::Absorbed,
        }
    }

    /// The job table and rank check: the index of job `job_id`, if `rank` is one of its ranks
    /// and the packet came in on that rank's port.
    #[inline(always)]
    fn authenticate(&self, job_id: u16, rank: u8, ingress: PortId) -> Result<usize, DropReason> {
        let Some(job_idx) = self.jobs.iter().position(|j| j.cfg.job == job_id) else {
            return Err(DropReason::UnknownJob);
        };
        match self.jobs[job_idx].port_of(rank) {
            None => Err(DropReason::UnknownRank),
            Some(port) if port != ingress => Err(DropReason::WrongPort),
            Some(_) => Ok(job_idx),
        }
    }

    /// The slot update: PROTOCOL.md §6, decision table.
    #[inline(always)]
    fn aggregate(
        &mut self,
        job_idx: usize,
        view: &AggPacket<&[u8; HEADER_LEN]>,
        payload_bytes: &[u8],
        ingress: PortId,
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        if self.differs_from_its_use(view, payload_bytes.is_empty()) {
            if let Some(&header) = view.as_bytes().first_chunk::<HEADER_LEN>() {
                return self.reject_header(job_idx, &header, RejectReason::BadCount, ingress, out);
            }
        }
        // Borrowed apart, so that stores to one are known not to change the others.
        let Pipeline {
            regs,
            jobs,
            counters,
            report,
            gap_reports,
            ..
        } = self;
        let job = &mut jobs[job_idx];
        job.last_activity = Some(now);
        if let Some(counter) = view.gap().filter(|_| *gap_reports) {
            note_counter(
                &mut regs.gaps,
                job,
                view,
                counter,
                ingress,
                counters,
                report,
            );
        }
        let workers = job.workers;
        let slot = usize::from(view.slot());
        let x = usize::from(view.set());
        let bit = 1u32 << view.rank();
        // The header's count: both callers checked that the payload holds `count` elements.
        let count = payload_bytes.len() / 4;
        let SlotRegisters {
            seq,
            bitmap,
            count: pending,
            exp,
        } = &mut regs.slots[slot];
        let base = (2 * slot + x) * usize::from(regs.max_elems);
        let cells = &mut cells_of(&mut regs.values)[base..base + count];

        // Stage 1: sequence register of the set.
        let delta = view.seq().wrapping_sub(seq[x]) as i32;
        if delta < 0 {
            return drop_counted(counters, DropReason::StaleSeq);
        }
        let new_use = delta > 0;
        // Stage 2: bitmap. Stage 3: count.
        let seen = bitmap[x] & bit != 0;
        // The result of this slot, if one is sent: header and `count` elements.
        let result_len = HEADER_LEN + 4 * count;
        if !new_use && awaiting(pending[x], job.cfg.elems_per_packet).is_some() {
            // Every rank here contributed and the total has not come down: rank 0's
            // retransmission asks the upper switch with a Query (PROTOCOL.md §9).
            return answer_waiting(counters, view, &job.cfg, bitmap[x], ingress, out);
        }
        if !new_use && (seen || pending[x] == 0) {
            if !seen {
                // The use completed and this worker already moved on (its bit was cleared by
                // its next packet): a late copy.
                return drop_counted(counters, DropReason::Duplicate);
            }
            // Retransmission: answered from the registers, with the result if the use is
            // complete, else with the contributors so far.
            if pending[x] != 0 {
                return emit_pending(counters, view, bitmap[x], ingress, out);
            }
            let Some(out) = out.get_mut(..result_len) else {
                return drop_counted(counters, DropReason::OutputTooSmall);
            };
            debug_assert_eq!(seq[x], view.seq());
            emit_result(view, exp[x], cells, None, out);
            counters.results_unicast += 1;
            return Verdict::Unicast {
                port: ingress,
                len: result_len,
            };
        }
        // An arrival that counts. Arrivals pending: a new use starts at workers - 1 still to
        // come.
        let remaining = if new_use {
            workers - 1
        } else {
            (pending[x] & PENDING_ARRIVALS) - 1
        };
        let header_use = if new_use {
            count == 0
        } else {
            pending[x] & HEADER_USE != 0
        };
        // The arrival that completes the use must be able to send the result; refusing it
        // before any register changes keeps the slot collecting, so that its retransmission
        // completes the use as this packet would have.
        if remaining == 0 && out.len() < result_len {
            return drop_counted(counters, DropReason::OutputTooSmall);
        }
        if new_use {
            seq[x] = view.seq();
            bitmap[x] = bit;
            bitmap[1 - x] &= !bit;
            exp[x] = u32::from(view.exponent());
            in_turns(payload_bytes, cells, kernels::portable::decode_be);
            counters.data_first += 1;
        } else {
            bitmap[x] |= bit;
            bitmap[1 - x] &= !bit;
            exp[x] = exp[x].max(u32::from(view.exponent()));
            in_turns(payload_bytes, cells, kernels::portable::accumulate_be);
            counters.data_added += 1;
        }
        counters.elements_aggregated += count as u64;
        pending[x] = if remaining != 0 && header_use {
            remaining | HEADER_USE
        } else {
            remaining
        };
        if remaining != 0 {
            return Verdict::Absorbed;
        }
        if let Some(up) = job.cfg.uplink {
            pending[x] = if count == 0 {
                AWAITING_TOTAL_HEADER
            } else {
                AWAITING_TOTAL
            };
            counters.partials_sent += 1;
            let gap = (*gap_reports && block_of_both_jobs(&job.cfg, up, slot))
                .then(|| stamp(&mut regs.partial_gaps, &mut regs.partial_uses, slot, x))
                .flatten();
            return emit_partial(counters, view, &job.cfg, up, exp[x], cells, gap, out);
        }
        let Some(out) = out.get_mut(..result_len) else {
            // Unreachable: checked before the registers changed.
            return drop_counted(counters, DropReason::OutputTooSmall);
        };
        let job = &*job;
        debug_assert_eq!(seq[x], view.seq());
        let gap = (*gap_reports && block_in_job(&job.cfg, slot))
            .then(|| stamp(&mut regs.result_gaps, &mut regs.result_uses, slot, x))
            .flatten();
        emit_result(view, exp[x], cells, gap, out);
        counters.results_multicast += 1;
        Verdict::Multicast {
            ports: &job.cfg.ranks,
            len: result_len,
        }
    }

    /// [`Self::reject`] of a data packet's header, which parsed as data already.
    #[cold]
    /// Whether a Data arrival that would count towards its slot's current use (new from its
    /// rank, the use collecting) carries a payload where the use's first arrival carried none,
    /// or none where it carried one.
    #[inline(always)]
    fn differs_from_its_use(
        &self,
        view: &AggPacket<&[u8; HEADER_LEN]>,
        headers_only: bool,
    ) -> bool {
        let x = usize::from(view.set());
        let Some(r) = self.regs.slots.get(usize::from(view.slot())) else {
            return false;
        };
        let pending = r.count[x];
        let collecting = pending & PENDING_ARRIVALS != 0 && awaiting(pending, 0).is_none();
        collecting
            && view.seq() == r.seq[x]
            && r.bitmap[x] & (1u32 << (view.rank() % 32)) == 0
            && (pending & HEADER_USE != 0) != headers_only
    }

    fn reject_header(
        &mut self,
        job_idx: usize,
        header: &[u8; HEADER_LEN],
        reason: RejectReason,
        ingress: PortId,
        out: &mut [u8],
    ) -> Verdict<'_> {
        match AggRepr::parse_header(header) {
            Ok(hdr) => self.reject(job_idx, hdr, reason, ingress, out),
            // Unreachable: the caller checked version and type.
            Err(_) => self.drop(DropReason::Malformed),
        }
    }

    fn reject(
        &mut self,
        job_idx: usize,
        hdr: AggRepr,
        reason: RejectReason,
        ingress: PortId,
        out: &mut [u8],
    ) -> Verdict<'_> {
        let repr = AggRepr {
            kind: MessageType::Reject,
            gap: None,
            epoch: self.jobs[job_idx].cfg.epoch,
            exponent: reason as u8,
            count: 0,
            ..hdr
        };
        // A refusal that cannot be answered counts as that, not as the refusal.
        if repr.emit_into(out).is_err() {
            return self.drop(DropReason::OutputTooSmall);
        }
        self.counters.count_drop(match reason {
            RejectReason::StaleEpoch => DropReason::StaleEpoch,
            RejectReason::SlotOutOfRange => DropReason::SlotOutOfRange,
            RejectReason::BadCount => DropReason::BadCount,
        });
        self.counters.rejects_sent += 1;
        Verdict::Unicast {
            port: ingress,
            len: HEADER_LEN,
        }
    }

    fn answer_probe(
        &mut self,
        job_idx: usize,
        hdr: AggRepr,
        ingress: PortId,
        out: &mut [u8],
    ) -> Verdict<'_> {
        let job = &self.jobs[job_idx].cfg;
        let info = ProbeInfo {
            workers: job.ranks.len() as u8,
            elems_per_packet: job.elems_per_packet,
            slot_base: job.slot_base,
            slot_count: job.slot_count,
        };
        let repr = AggRepr {
            kind: MessageType::ProbeReply,
            // Whether this switch answers gaps with Missing reports.
            gap: self.gap_reports.then_some(0),
            epoch: job.epoch,
            count: ProbeInfo::COUNT,
            ..hdr
        };
        let Ok(mut pkt) = repr.emit_into(out) else {
            return self.drop(DropReason::OutputTooSmall);
        };
        if info.emit(pkt.payload_mut()).is_err() {
            // Unreachable: the payload is ProbeInfo::COUNT elements long.
            return self.drop(DropReason::OutputTooSmall);
        }
        self.counters.probes_answered += 1;
        Verdict::Unicast {
            port: ingress,
            len: repr.buffer_len(),
        }
    }
}

/// The pipeline inside [`Pipeline::burst`]: [`Burst::process`] is [`Pipeline::process`],
/// inlined into the caller's loop.
#[derive(Debug)]
pub struct Burst<'p> {
    pipe: &'p mut Pipeline,
}

impl Burst<'_> {
    /// [`Pipeline::poll_report`].
    #[inline(always)]
    pub fn poll_report(&mut self) -> Option<Report> {
        self.pipe.report.take()
    }

    /// [`Pipeline::process`] of one packet.
    #[inline(always)]
    pub fn process(
        &mut self,
        ingress: PortId,
        packet: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        self.pipe.count_arrival(packet.len());
        kernels::prefetch(packet);
        self.pipe.process_inner::<true>(ingress, packet, now, out)
    }
}

/// Compiles the data path for the CPU features `$features`: `Pipeline::$process`, one packet
/// through [`Pipeline::process_inner`] with the fast path, and `$burst`, [`Pipeline::burst`].
/// Each is `unsafe`: the CPU must support `$features`, their only requirement.
macro_rules! compile_for {
    ($features:literal, $process:ident, $burst:ident) => {
        impl Pipeline {
            #[target_feature(enable = $features)]
            #[allow(unsafe_code)]
            unsafe fn $process(
                &mut self,
                ingress: PortId,
                packet: &[u8],
                now: Instant,
                out: &mut [u8],
            ) -> Verdict<'_> {
                kernels::prefetch(packet);
                self.process_inner::<true>(ingress, packet, now, out)
            }
        }

        #[target_feature(enable = $features)]
        #[allow(unsafe_code)]
        unsafe fn $burst<R>(pipe: &mut Pipeline, f: impl FnOnce(&mut Burst<'_>) -> R) -> R {
            f(&mut Burst { pipe })
        }
    };
}

#[cfg(target_arch = "x86_64")]
compile_for!("avx2", process_inner_avx2, burst_avx2);
// (With byte and word operations, for the byte swaps of 16 elements at a time.)
#[cfg(target_arch = "x86_64")]
compile_for!(
    "avx512f,avx512bw,avx512vl",
    process_inner_avx512,
    burst_avx512
);

/// A Missing report: the header of the packet to send, the port it goes to, and how many
/// copies to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub port: PortId,
    pub header: [u8; HEADER_LEN],
    /// Copies to send, back to back: [`DATA_REPORT_COPIES`] for a report of lost Data, 1 for
    /// a lower switch's report of lost totals.
    pub copies: u8,
}

/// The copies of a report of lost Data (PROTOCOL.md §5, "Missing reports"). A report lost
/// too leaves the loss to its sender's Queries, a round trip or two later, and the stream's
/// end waits for exactly such a chain where thousands of packets are in flight: in the
/// simulator at 1% loss, the last use of a tree's stream most often waited for a worker's
/// data lost in the last window whose report was lost as well. The second copy costs 16
/// bytes. (A lower switch's report of lost totals goes once: its answer is a full total,
/// and a second one would queue behind the totals on the link between the levels; sending
/// every report twice cost 4 racks of 8 1.4 Gbit/s.)
pub const DATA_REPORT_COPIES: u8 = 2;

/// The gap register's update for a Data packet with a gap counter (PROTOCOL.md §5, loss
/// recovery): the cell of the sender and the packet's block takes the counter, and the numbers
/// between the cell's previous counter and this one are reported missing. A block not wholly
/// in the job's range keeps no cell: another job could share it.
#[inline(always)]
fn note_counter(
    gaps: &mut [u32],
    job: &Job,
    view: &AggPacket<&[u8; HEADER_LEN]>,
    counter: u8,
    ingress: PortId,
    counters: &mut Counters,
    report: &mut Option<Report>,
) {
    let slot = view.slot();
    if !block_in_job(&job.cfg, usize::from(slot)) {
        return;
    }
    let cell =
        usize::from(slot / GAP_BLOCK) * (usize::from(MAX_RANK) + 1) + usize::from(view.rank() % 32);
    let Some(latest) = gaps.get_mut(cell) else {
        return;
    };
    let Some((first, skipped)) = take_counter(latest, counter) else {
        return;
    };
    let mut header = *view.clone().into_inner();
    let mut pkt = AggPacket::new_unchecked(&mut header);
    let set = pkt.set();
    pkt.set_version_type(PROTOCOL_VERSION, MessageType::Missing);
    pkt.set_flags(set, Some(first));
    pkt.set_exponent(skipped);
    pkt.set_count(0);
    counters.missing_sent += 1;
    *report = Some(Report {
        port: ingress,
        header,
        copies: DATA_REPORT_COPIES,
    });
}

#[cold]
fn drop_counted(counters: &mut Counters, reason: DropReason) -> Verdict<'static> {
    counters.count_drop(reason);
    Verdict::Drop(reason)
}

/// Writes the result of the packet with the header `view` into `out`, which is exactly
/// `HEADER_LEN + 4 * count` bytes long: the registers of its `(slot, set)` hold `exp` and
/// `cells`.
///
/// The result's header is the packet's, as a P4 program rewrites it in place: type Result,
/// the set with the other flags cleared, and the slot's exponent. Every other field already
/// holds what the result carries: job, rank, slot and count are the packet's, its epoch was
/// checked against the job's, and its sequence number is the one in the set's register (the
/// packet either started the use or matched it).
#[inline(always)]
/// Whether `slot` lies in the job's slot range.
fn job_has_slot(job: &JobConfig, slot: u16) -> bool {
    slot.wrapping_sub(job.slot_base) < job.slot_count
}

/// Writes the Pending answer to `view`'s packet (its header echoed, type Pending, exponent 0,
/// one element: the use's contributor `bitmap`) and counts it.
fn emit_pending<'a>(
    counters: &mut Counters,
    view: &AggPacket<&[u8; HEADER_LEN]>,
    bitmap: u32,
    ingress: PortId,
    out: &mut [u8],
) -> Verdict<'a> {
    let Some(len) = write_pending(view, bitmap, out) else {
        return drop_counted(counters, DropReason::OutputTooSmall);
    };
    counters.pending_sent += 1;
    Verdict::Unicast { port: ingress, len }
}

/// Writes the Pending answer to `view`'s packet into `out`; its length, or `None` when `out`
/// is too short.
fn write_pending(
    view: &AggPacket<&[u8; HEADER_LEN]>,
    bitmap: u32,
    out: &mut [u8],
) -> Option<usize> {
    const LEN: usize = HEADER_LEN + 4 * PendingInfo::COUNT as usize;
    let (mut pkt, payload) = reply_to(view, MessageType::Pending, LEN, out)?;
    pkt.set_exponent(0);
    pkt.set_count(PendingInfo::COUNT);
    (PendingInfo { bitmap }).emit(payload).ok()?;
    Some(LEN)
}

/// The first `len` bytes of `out` as an answer to `view`: its header with type `kind` (the set
/// kept, the gap counter cleared), and the payload after it; `None` when `out` is shorter.
#[inline(always)]
fn reply_to<'o>(
    view: &AggPacket<&[u8; HEADER_LEN]>,
    kind: MessageType,
    len: usize,
    out: &'o mut [u8],
) -> Option<(AggPacket<&'o mut [u8; HEADER_LEN]>, &'o mut [u8])> {
    let (head, payload) = out.get_mut(..len)?.split_first_chunk_mut::<HEADER_LEN>()?;
    *head = *view.clone().into_inner();
    let mut pkt = AggPacket::new_unchecked(head);
    let set = pkt.set();
    pkt.set_version_type(PROTOCOL_VERSION, kind);
    pkt.set_set(set);
    Some((pkt, payload))
}

/// The partial sum of a use, `cells` with exponent byte `exp`, as the Data packet of this
/// switch's rank in the upper switch's job: the header of `view` (set, seq, count) with the
/// upper job's id, epoch, rank and slot, and the gap counter `gap` (a first transmission's,
/// see [`stamp_partial`]; none on a partial sent again).
#[allow(clippy::too_many_arguments)]
fn emit_partial<'a>(
    counters: &mut Counters,
    view: &AggPacket<&[u8; HEADER_LEN]>,
    job: &JobConfig,
    up: Uplink,
    exp: u32,
    cells: &[i32],
    gap: Option<u8>,
    out: &mut [u8],
) -> Verdict<'a> {
    let len = HEADER_LEN + 4 * cells.len();
    let Some((mut pkt, payload)) = reply_to(view, MessageType::Data, len, out) else {
        return drop_counted(counters, DropReason::OutputTooSmall);
    };
    let set = pkt.set();
    pkt.set_flags(set, gap);
    pkt.set_job(up.job);
    pkt.set_epoch(up.epoch);
    pkt.set_rank(up.rank);
    pkt.set_slot(up.slot_up(job, view.slot()));
    pkt.set_exponent(exp as u8);
    pkt.set_count(cells.len() as u16);
    kernels::portable::encode_be(cells, payload);
    Verdict::Unicast { port: up.port, len }
}

/// The partial sum stored for use `(slot, set)`, `elems` elements, sent up again with the
/// header of `view` (no gap counter: only a first transmission carries one).
fn emit_stored_partial<'a>(
    regs: &mut Registers,
    counters: &mut Counters,
    view: &AggPacket<&[u8; HEADER_LEN]>,
    job: &JobConfig,
    up: Uplink,
    (slot, set, elems): (u16, usize, u16),
    out: &mut [u8],
) -> Verdict<'a> {
    let slot_idx = usize::from(slot);
    let exp = regs.slots[slot_idx].exp[set];
    let base = (2 * slot_idx + set) * usize::from(regs.max_elems);
    let cells = &cells_of(&mut regs.values)[base..base + usize::from(elems)];
    emit_partial(counters, view, job, up, exp, cells, None, out)
}

/// Whether the block of `slot` lies wholly in `job`'s range and is a block of the upper
/// job's as well (the two jobs' first slots differ by a multiple of [`GAP_BLOCK`]): only then
/// do the upper switch's gap cells and this switch's count the same slots.
fn block_of_both_jobs(job: &JobConfig, up: Uplink, slot: usize) -> bool {
    let b = usize::from(GAP_BLOCK);
    let block_start = slot - slot % b;
    (usize::from(up.slot_base) + block_start)
        .checked_sub(usize::from(job.slot_base))
        .is_some_and(|d| d % b == 0)
        && block_in_job(job, slot)
}

/// Whether the block of `slot` lies wholly in `job`'s range (a block partly outside could be
/// shared with another job: it keeps no gap cells).
fn block_in_job(job: &JobConfig, slot: usize) -> bool {
    let b = usize::from(GAP_BLOCK);
    let block_start = slot - slot % b;
    let job_start = usize::from(job.slot_base);
    block_start >= job_start && block_start + b <= job_start + usize::from(job.slot_count)
}

/// The block's next gap counter for the first transmission of use `(slot, set)` (a partial
/// sum, or a multicast result), recorded with the use in `uses` (cell `block * 64 + counter`
/// = `2 * slot + set + 1`) so that a Missing report naming it can be answered (PROTOCOL.md
/// §9). The caller checks that the block keeps cells ([`block_in_job`], and for a partial
/// [`block_of_both_jobs`]).
#[inline(always)]
fn stamp(next_counters: &mut [u8], uses: &mut [u32], slot: usize, set: usize) -> Option<u8> {
    let block = slot / usize::from(GAP_BLOCK);
    let next = next_counters.get_mut(block)?;
    let counter = *next;
    *next = (counter + 1) % GAP_COUNTER;
    let cell = uses.get_mut(use_cell(slot, counter))?;
    *cell = (2 * slot + set + 1) as u32;
    Some(counter)
}

/// The cell of `uses` (see [`stamp`]) for `counter` in the block of `slot`.
fn use_cell(slot: usize, counter: u8) -> usize {
    slot / usize::from(GAP_BLOCK) * usize::from(GAP_COUNTER) + usize::from(counter % GAP_COUNTER)
}

/// The use `(slot, set)` recorded in `uses` (see [`stamp`]) for `counter` in the block of
/// `slot`, if any.
fn recorded_use(uses: &[u32], slot: u16, counter: u8) -> Option<(u16, u8)> {
    let block = usize::from(slot / GAP_BLOCK);
    let cell = *uses.get(use_cell(usize::from(slot), counter))?;
    let use_index = usize::try_from(cell.checked_sub(1)?).ok()?;
    let (named, set) = (use_index / 2, use_index % 2);
    if named / usize::from(GAP_BLOCK) != block {
        return None;
    }
    Some((u16::try_from(named).ok()?, set as u8))
}

/// [`recorded_use`], and the record cleared (read and cleared in one stateful access on a P4
/// switch): a second report naming the same counter then names nothing.
fn take_recorded_use(uses: &mut [u32], slot: u16, counter: u8) -> Option<(u16, u8)> {
    let named = recorded_use(uses, slot, counter)?;
    if let Some(cell) = uses.get_mut(use_cell(usize::from(slot), counter)) {
        *cell = 0;
    }
    Some(named)
}

/// A total's gap counter, on the lower switch it came down to (PROTOCOL.md §9): the cell of
/// its block takes it, and counters it skipped (1 to [`MAX_REPORTED_GAP`]) are reported to
/// the upper switch in a Missing of this switch's rank there, as a worker's skipped Data is
/// reported to it (§5). Only blocks that are blocks of the upper job as well keep a cell.
/// Returns whether a report was made.
fn note_total_counter(
    totals_seen: &mut [u32],
    job: &JobConfig,
    up: Uplink,
    slot: u16,
    hdr: &AggRepr,
    counter: u8,
    report: &mut Option<Report>,
) -> bool {
    let local = usize::from(slot);
    if !block_of_both_jobs(job, up, local) {
        return false;
    }
    let Some(latest) = totals_seen.get_mut(local / usize::from(GAP_BLOCK)) else {
        return false;
    };
    let Some((first, skipped)) = take_counter(latest, counter) else {
        return false;
    };
    let repr = AggRepr {
        kind: MessageType::Missing,
        gap: Some(first),
        job: up.job,
        epoch: up.epoch,
        rank: up.rank,
        exponent: skipped,
        count: 0,
        ..*hdr
    };
    let mut header = [0u8; HEADER_LEN];
    if repr.emit_into(&mut header).is_err() {
        return false;
    }
    *report = Some(Report {
        port: up.port,
        header,
        copies: 1,
    });
    true
}

/// A use that waits here for its total, as a packet of the upper switch names it.
struct NamedWaitingUse {
    up: Uplink,
    /// This switch's slot.
    slot: u16,
    /// The use's contributors here.
    bitmap: u32,
    /// The element count of its partial sum.
    partial_elems: u16,
    /// Where rank 0, whose asking the upper switch answers, is.
    rank0_port: PortId,
}

/// The use that the upper switch's packet `hdr` (an answer to this switch's Query or partial)
/// names, if it still waits here for its total: addressed to this switch's rank there, its
/// slot in the job's range, of the set's current use (`seq`). The epoch is the caller's to
/// check.
fn waiting_use_named(regs: &Registers, job: &JobConfig, hdr: &AggRepr) -> Option<NamedWaitingUse> {
    let up = job.uplink.filter(|u| u.rank == hdr.rank)?;
    let slot = up.slot_down(job, hdr.slot)?;
    let x = usize::from(hdr.set);
    let regs = regs.slots.get(usize::from(slot))?;
    let partial_elems =
        awaiting(regs.count[x], job.elems_per_packet).filter(|_| hdr.seq == regs.seq[x])?;
    Some(NamedWaitingUse {
        up,
        slot,
        bitmap: regs.bitmap[x],
        partial_elems,
        rank0_port: *job.ranks.get(usize::from(UPLINK_TIMER_RANK))?,
    })
}

/// A use that waits here for its total, named by the first gap counter of the upper switch's
/// Missing report `hdr`.
struct ReportedUse {
    up: Uplink,
    slot: u16,
    set: u8,
    seq: u32,
    partial_elems: u16,
}

/// The use whose partial carried the first counter the Missing report `hdr` names, if it
/// still waits here for its total: the report is for this switch's rank and epoch there, its
/// slot (the later partial's) in the job's range, and the recorded use in the same block.
/// The record is read and cleared (one stateful access on a P4 switch): only the upper switch
/// reports this switch's partials, each counter once, so a second report of it is a copy (the
/// upper switch sends its reports twice, [`DATA_REPORT_COPIES`]), which must not send a
/// second partial.
fn reported_use(regs: &mut Registers, job: &JobConfig, hdr: &AggRepr) -> Option<ReportedUse> {
    let up = job
        .uplink
        .filter(|u| u.rank == hdr.rank && u.epoch == hdr.epoch)?;
    let later = up.slot_down(job, hdr.slot)?;
    let (slot, set) = take_recorded_use(&mut regs.partial_uses, later, hdr.gap?)?;
    let (slot, set) = (usize::from(slot), usize::from(set));
    let regs = regs.slots.get(slot)?;
    let partial_elems = awaiting(regs.count[set], job.elems_per_packet)?;
    Some(ReportedUse {
        up,
        slot: u16::try_from(slot).ok()?,
        set: set as u8,
        seq: regs.seq[set],
        partial_elems,
    })
}

/// The header of rank 0's Query of the use of slot `slot` here that the upper switch's packet
/// `hdr` names (same set and seq): what an answer from the upper switch answers, and what the
/// messages this switch sends on from it are written from.
fn rank0_ask(job: &JobConfig, slot: u16, hdr: AggRepr) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    let mut pkt = AggPacket::new_unchecked(&mut header);
    pkt.set_version_type(PROTOCOL_VERSION, MessageType::Query);
    pkt.set_flags(hdr.set, None);
    pkt.set_job(job.job);
    pkt.set_epoch(job.epoch);
    pkt.set_rank(UPLINK_TIMER_RANK);
    pkt.set_slot(slot);
    pkt.set_seq(hdr.seq);
    header
}

/// A rank's retransmission or Query of a use waiting for the upper switch's total
/// (PROTOCOL.md §9): rank 0's asks the upper switch with a status Query; every other rank
/// gets a Pending with the use's contributors (`bitmap`); a rank that did not contribute sent
/// a late copy.
fn answer_waiting<'a>(
    counters: &mut Counters,
    view: &AggPacket<&[u8; HEADER_LEN]>,
    job: &JobConfig,
    bitmap: u32,
    ingress: PortId,
    out: &mut [u8],
) -> Verdict<'a> {
    let seen = bitmap & (1u32 << (view.rank() % 32)) != 0;
    let Some(up) = job.uplink.filter(|_| seen) else {
        return drop_counted(counters, DropReason::Duplicate);
    };
    if view.rank() != UPLINK_TIMER_RANK {
        return emit_pending(counters, view, bitmap, ingress, out);
    }
    emit_query_up(counters, view, job, up, QueryAsk::Status, out)
}

/// The Query of this switch's rank in the upper switch's job for the use of `view` (its set,
/// seq and slot, mapped to the upper job). A status Query (exponent byte 0) is answered with
/// the header of the total alone if the use is complete there: that answer travels behind the
/// total itself, so it arrives first only when the total was lost, and then a fetching Query
/// (`ask` [`QueryAsk::Fetch`], exponent 1) follows. Fetching at once would send a second copy
/// of every total still queued on the way down (at 1% loss, 4 racks of 4 asked the upper
/// switch for 9158 totals again, and the downlinks' queues grew to 200 KB).
fn emit_query_up<'a>(
    counters: &mut Counters,
    view: &AggPacket<&[u8; HEADER_LEN]>,
    job: &JobConfig,
    up: Uplink,
    ask: QueryAsk,
    out: &mut [u8],
) -> Verdict<'a> {
    let Some((mut pkt, _)) = reply_to(view, MessageType::Query, HEADER_LEN, out) else {
        return drop_counted(counters, DropReason::OutputTooSmall);
    };
    pkt.set_job(up.job);
    pkt.set_epoch(up.epoch);
    pkt.set_rank(up.rank);
    pkt.set_slot(up.slot_up(job, view.slot()));
    pkt.set_exponent(ask.byte());
    pkt.set_count(0);
    counters.queries_up += 1;
    Verdict::Unicast {
        port: up.port,
        len: HEADER_LEN,
    }
}

/// The Result of `view`'s use into `out` (sized for it): exponent byte `exp`, `cells` as the
/// payload, and the gap counter `gap` of a first multicast (see [`stamp`]).
fn emit_result(
    view: &AggPacket<&[u8; HEADER_LEN]>,
    exp: u32,
    cells: &[i32],
    gap: Option<u8>,
    out: &mut [u8],
) {
    let len = out.len();
    let Some((mut pkt, payload)) = reply_to(view, MessageType::Result, len, out) else {
        // Unreachable: the callers size `out` for the header and the payload.
        return;
    };
    if gap.is_some() {
        let set = pkt.set();
        pkt.set_flags(set, gap);
    }
    pkt.set_exponent(exp as u8);
    kernels::portable::encode_be(cells, payload);
}

/// `kernel` (`decode_be` or `accumulate_be` of `kernels::portable`) of a payload into its cells
/// (as many elements as `cells` holds), in whole turns of 32 elements and the rest apart: the
/// vectorized loop then needs no remainder of its own, and a packet of 64 or 256 elements runs
/// no set-up for one.
#[inline(always)]
fn in_turns(payload: &[u8], cells: &mut [i32], kernel: impl Fn(&[u8], &mut [i32]) + Copy) {
    let n = cells.len() & !31;
    if let (Some(p), Some(c)) = (payload.get(..4 * n), cells.get_mut(..n)) {
        kernel(p, c);
    }
    if n < cells.len() {
        the_rest(payload, cells, n, kernel);
    }
}

/// Elements `from..` of [`in_turns`].
#[cold]
#[inline(never)]
fn the_rest(payload: &[u8], cells: &mut [i32], from: usize, kernel: impl Fn(&[u8], &mut [i32])) {
    if let (Some(p), Some(c)) = (payload.get(4 * from..), cells.get_mut(from..)) {
        kernel(p, c);
    }
}

/// Checks that `PROTOCOL_VERSION` is what the pipeline was written for.
const _: () = assert!(PROTOCOL_VERSION == 1);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What a verdict says, without the borrow of the pipeline.
    fn owned(v: Verdict<'_>, out: &[u8]) -> Owned {
        match v {
            Verdict::Drop(r) => (Some(r), vec![], vec![]),
            Verdict::Absorbed => (None, vec![], vec![]),
            Verdict::Unicast { port, len } => (None, vec![port], out[..len].to_vec()),
            Verdict::Multicast { ports, len } => (None, ports.to_vec(), out[..len].to_vec()),
        }
    }

    /// Two jobs (3 and 5) with 4 and 3 workers on an 8-slot pool.
    fn two_jobs(elems: u16) -> Result<Pipeline, JobError> {
        let mut p = Pipeline::new(PipelineConfig {
            pool_slots: 8,
            max_elems: 257,
        });
        p.add_job(JobConfig {
            job: 3,
            epoch: 9,
            slot_base: 1,
            slot_count: 4,
            elems_per_packet: elems,
            ranks: (0..4).map(PortId).collect(),
            uplink: None,
        })?;
        p.add_job(JobConfig {
            job: 5,
            epoch: 2,
            slot_base: 5,
            slot_count: 3,
            elems_per_packet: elems,
            ranks: (10..13).map(PortId).collect(),
            uplink: None,
        })?;
        Ok(p)
    }

    /// One packet the tests send: rank, slot, set, seq, exponent, payload (as the seed of
    /// [`payload`]), variant.
    type Op = (u8, u16, u8, u32, u8, u64, u8);

    /// Element counts: small ones, and the counts the pipeline compiles apart (64, 256).
    fn counts() -> impl Strategy<Value = u16> {
        prop_oneof![1u16..=40, Just(64), Just(256)]
    }

    /// `n` elements drawn from `seed`, with the extremes of int32 among them.
    fn payload(seed: u64, n: usize) -> Vec<i32> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let z = (x ^ (x >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                match z % 16 {
                    0 => i32::MAX,
                    1 => i32::MIN,
                    _ => (z >> 32) as i32,
                }
            })
            .collect()
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            (
                0u8..6,
                0u16..9,
                0u8..2,
                0u32..3,
                any::<u8>(),
                any::<u64>(),
                0u8..16,
            ),
            1..150,
        )
    }

    /// The packet of `op` for [`two_jobs`], the port it arrives on, the length of the reply
    /// buffer and the time. Mostly well-formed contributions of both jobs; by `variant`, packets
    /// that miss each check of the data fast path (count, type, epoch, port, job, payload
    /// length, version, reserved flag), ranks past the job's on the port that pads its table
    /// of rank ports, and reply buffers too short for any reply, one byte short of a result,
    /// and exactly a result long.
    fn packet(op: &Op, elems: u16) -> (PortId, Vec<u8>, usize, Instant) {
        let &(rank, slot, set, seq, exponent, seed, variant) = op;
        let second = slot >= 5;
        let (job, epoch, base_port) = if second { (5, 2, 10) } else { (3, 9, 0) };
        let repr = AggRepr {
            kind: if variant == 3 {
                MessageType::Probe
            } else {
                MessageType::Data
            },
            set,
            gap: None,
            job: if variant == 7 { 4 } else { job },
            epoch: if variant == 4 { epoch + 1 } else { epoch },
            rank,
            exponent,
            slot,
            count: match variant {
                1 => elems - 1,
                2 => 0,
                8 => elems + 1,
                _ => elems,
            },
            seq,
        };
        let mut pkt = vec![0u8; repr.buffer_len()];
        if let Ok(mut view) = repr.emit_into(&mut pkt) {
            let vals = payload(seed, usize::from(repr.count));
            ina_wire::payload::encode_from(&vals, view.payload_mut());
        }
        match variant {
            // A payload shorter, or longer, than the count says.
            9 => pkt.truncate(pkt.len() - 4),
            13 => pkt.extend_from_slice(&[0; 4]),
            10 => pkt[0] = 0x21,  // another version
            11 => pkt[1] |= 0x80, // a reserved flag
            _ => {}
        }
        let port = match variant {
            5 => PortId(base_port + u16::from((rank + 1) % 4)),
            // The port that pads the job's table of rank ports.
            12 => PortId(0),
            _ => PortId(base_port + u16::from(rank)),
        };
        let result_len = HEADER_LEN + 4 * usize::from(elems);
        let out_len = match variant {
            6 => 20,
            14 => result_len - 1,
            15 => result_len,
            _ => HEADER_LEN + 4 * 257,
        };
        (port, pkt, out_len, Instant::from_nanos(u64::from(seq)))
    }

    /// What a verdict says, and the reply it sent.
    type Owned = (Option<DropReason>, Vec<PortId>, Vec<u8>);

    /// Sends the packets of `ops` to two pipelines of [`two_jobs`], one through `run_a` and
    /// one through `run_b`; fails unless every verdict and reply agrees. Returns both.
    fn send_both(
        elems: u16,
        ops: &[Op],
        run_a: impl Fn(&mut Pipeline, PortId, &[u8], Instant, &mut [u8]) -> Owned,
        run_b: impl Fn(&mut Pipeline, PortId, &[u8], Instant, &mut [u8]) -> Owned,
    ) -> Result<(Pipeline, Pipeline), TestCaseError> {
        let (Ok(mut a), Ok(mut b)) = (two_jobs(elems), two_jobs(elems)) else {
            return Err(TestCaseError::fail("jobs install"));
        };
        for op in ops {
            let (port, pkt, out_len, now) = packet(op, elems);
            let (mut out_a, mut out_b) = (vec![0u8; out_len], vec![0u8; out_len]);
            let va = run_a(&mut a, port, &pkt, now, &mut out_a);
            let vb = run_b(&mut b, port, &pkt, now, &mut out_b);
            prop_assert_eq!(va, vb);
        }
        prop_assert_eq!(a.counters(), b.counters());
        prop_assert_eq!(a.registers(), b.registers());
        Ok((a, b))
    }

    proptest! {
        /// The data fast path only takes packets the general path would aggregate, and
        /// handles them as it would: the same verdicts, replies, counters, registers and
        /// activity times as the general path alone.
        #[test]
        fn fast_path_agrees_with_the_general_path(elems in counts(), ops in ops()) {
            let (fast, general) = send_both(
                elems,
                &ops,
                |p, port, pkt, now, out| owned(p.process(port, pkt, now, out), out),
                // The general path alone.
                |p, port, pkt, now, out| {
                    p.count_arrival(pkt.len());
                    owned(p.process_inner::<false>(port, pkt, now, out), out)
                },
            )?;
            for job in [3, 5] {
                prop_assert_eq!(fast.last_activity(job), general.last_activity(job));
            }
        }

        /// The pipeline is compiled for the baseline target, for AVX2 and for AVX-512 (see
        /// `process_dispatch`); every copy the CPU can run takes the same decisions and
        /// computes the same sums as the baseline one (`vector_compilations_checked` says
        /// which copies this CPU checks).
        #[cfg(target_arch = "x86_64")]
        #[test]
        #[allow(unsafe_code)]
        fn baseline_and_vector_compilations_agree(elems in counts(), ops in ops()) {
            let baseline =
                |p: &mut Pipeline, port, pkt: &[u8], now, out: &mut [u8]| {
                    owned(p.process_baseline::<true>(port, pkt, now, out), out)
                };
            if kernels::has_avx2() {
                // SAFETY: the CPU has AVX2 (checked above).
                send_both(elems, &ops, baseline, |p, port, pkt, now, out| {
                    owned(unsafe { p.process_inner_avx2(port, pkt, now, out) }, out)
                })?;
            }
            if Isa::detect() == Isa::Avx512 {
                // SAFETY: the CPU has AVX-512 F, BW and VL (checked above).
                send_both(elems, &ops, baseline, |p, port, pkt, now, out| {
                    owned(unsafe { p.process_inner_avx512(port, pkt, now, out) }, out)
                })?;
            }
        }

        /// A burst, whichever compilation runs it, handles a whole sequence of packets as
        /// `process` of the baseline compilation handles them one call at a time: the same
        /// verdicts, replies, counters, registers and activity times.
        #[test]
        fn a_burst_agrees_with_one_call_per_packet(elems in counts(), ops in ops()) {
            let packets: Vec<_> = ops.iter().map(|op| packet(op, elems)).collect();
            let (Ok(mut single), Ok(fresh)) = (two_jobs(elems), two_jobs(elems)) else {
                return Err(TestCaseError::fail("jobs install"));
            };
            single.isa = Isa::Baseline;
            let want: Vec<Owned> = packets
                .iter()
                .map(|(port, pkt, out_len, now)| {
                    let mut out = vec![0u8; *out_len];
                    owned(single.process(*port, pkt, *now, &mut out), &out)
                })
                .collect();
            for isa in compilations() {
                let mut p = fresh.clone();
                p.isa = isa;
                let got: Vec<Owned> = p.burst(|b| {
                    packets
                        .iter()
                        .map(|(port, pkt, out_len, now)| {
                            let mut out = vec![0u8; *out_len];
                            owned(b.process(*port, pkt, *now, &mut out), &out)
                        })
                        .collect()
                });
                prop_assert_eq!(&got, &want, "{:?}", isa);
                prop_assert_eq!(p.counters(), single.counters(), "{:?}", isa);
                prop_assert_eq!(p.registers(), single.registers(), "{:?}", isa);
                for job in [3, 5] {
                    prop_assert_eq!(p.last_activity(job), single.last_activity(job));
                }
            }
        }
    }

    /// The compilations of the pipeline this CPU can run.
    fn compilations() -> Vec<Isa> {
        let mut isas = vec![Isa::Baseline];
        let widest = Isa::detect();
        if widest != Isa::Baseline {
            isas.push(Isa::Avx2);
        }
        if widest == Isa::Avx512 {
            isas.push(Isa::Avx512);
        }
        isas
    }

    /// The compilations the agreement tests above check are every one this CPU can run, as
    /// the standard library's own feature detection says (a dispatch that missed a feature
    /// would leave that copy unchecked, and unused); which ones those are is printed. A CPU
    /// without AVX-512 (or AVX2) cannot run, and so cannot check, those copies.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_compilations_checked() {
        let isas = compilations();
        let avx2 = std::arch::is_x86_feature_detected!("avx2");
        let avx512 = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl");
        assert_eq!(isas.first(), Some(&Isa::Baseline));
        assert_eq!(isas.contains(&Isa::Avx2), avx2 || avx512, "{isas:?}");
        assert_eq!(isas.contains(&Isa::Avx512), avx512, "{isas:?}");
        assert_eq!(kernels::has_avx2(), avx2, "the kernels' own detection");
        println!("compilations checked against the baseline on this CPU: {isas:?}");
        for missing in [Isa::Avx2, Isa::Avx512] {
            if !isas.contains(&missing) {
                println!("not checked here (this CPU cannot run it): {missing:?}");
            }
        }
    }
}
