//! The register file: the layout of the Tofino program, and what a slot's cells say about
//! one use of it.
//!
//! Every array is indexed by slot and holds 2x32-bit cells, one 32-bit half per shadow set
//! (PROTOCOL.md §6, "Registers"):
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
//! and §9; the P4 programs do not have them yet; the `reports` module keeps them):
//!
//! | register        | cell                                   | P4 name          |
//! |-----------------|----------------------------------------|------------------|
//! | `gap[block*32 + rank]` | gap counter of `rank`'s latest Data to the block, plus 64 (0: none yet) | `reg_gap` |
//! | `partial_gaps[block]` | the counter the block's next partial sum carries (a switch with an uplink) | `reg_partial_gap` |
//! | `partial_uses[block*64 + counter]` | `2*slot + set + 1` of the use whose partial carried `counter` | `reg_partial_use` |
//! | `partial_seqs[block*64 + counter]` | the sequence number of that use | `reg_partial_seq` |
//! | `result_gaps[block]` | the counter the block's next multicast result carries | `reg_result_gap` |
//! | `result_uses[block*64 + counter]` | `2*slot + set + 1` of the use whose result carried `counter` | `reg_result_use` |
//! | `totals_seen[block]` | the counter of the latest total from the upper switch, plus 64 (0: none yet) | `reg_total_gap` |
//!
//! The four control registers of a slot are stored together, as one [`SlotRegisters`] record,
//! so that a packet's lookups touch one cache line; each field is the slot's cell of that
//! register array. `values` is stored flat, `(2*slot + set) * max_elems + k`, which is the same
//! set of cells as `max_elems/2` pair arrays indexed by `2*slot+set`; the array starts on a
//! cache line, so that with `max_elems` a multiple of 16 the cells of every `(slot, set)` do.

use super::PipelineConfig;
use ina_wire::agg::{GAP_BLOCK, GAP_COUNTER, MAX_RANK};

/// The bit of `reg_count` that marks a use whose first arrival carried no payload (an exponent
/// lookahead header): the use's later arrivals must carry none either, and one that carries a
/// payload is refused with `BadCount`, as is a payload-less arrival to a use that began with
/// one (PROTOCOL.md §6). Without it a header-only use would leave the registers' previous
/// values in place for a later payload to be added to.
pub const HEADER_USE: u32 = 1 << 31;
/// The bits of `reg_count` that count the arrivals still pending.
pub(super) const PENDING_ARRIVALS: u32 = !HEADER_USE;

/// `reg_count` of a use whose ranks have all contributed on a lower switch, which waits for
/// the upper switch's total (a count of arrivals never reaches it: a job has at most 32 ranks).
/// The use's packets carried payload: its partial sum is sent with the job's elements.
pub const AWAITING_TOTAL: u32 = 0xffff;
/// As [`AWAITING_TOTAL`], for a use whose packets carried no payload (the exponent
/// lookahead's headers): its partial sum is a header. The register, not the packet that asks,
/// says which: a rank's status Query carries no payload whatever the use's packets did.
pub const AWAITING_TOTAL_HEADER: u32 = 0xfffe;

/// The element count of the partial sum of a use waiting for its total, or `None` when
/// `pending` is a count of arrivals (or 0).
#[inline(always)]
pub(super) fn awaiting(pending: u32, elems: u16) -> Option<u16> {
    match pending {
        AWAITING_TOTAL => Some(elems),
        AWAITING_TOTAL_HEADER => Some(0),
        _ => None,
    }
}

/// What a slot's registers say about use `seq` of set `set`, for `rank`: the conditions
/// of PROTOCOL.md §6's decision tables (`d`, `seen`, `pending`) and §9's waiting uses, one
/// variant per case the tables tell apart. `seen`: the rank's contribution is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UseState {
    /// `d < 0`: a use older than the set's current one.
    Older,
    /// `d > 0`: a use the switch has not seen yet.
    Newer,
    /// `d = 0`, every rank here contributed, and the upper switch's total has not come down
    /// (`count` is [`AWAITING_TOTAL`] or [`AWAITING_TOTAL_HEADER`], §9).
    AwaitingTotal { seen: bool },
    /// `d = 0`, arrivals pending; `header_use`: the use's first arrival carried no payload.
    Collecting { seen: bool, header_use: bool },
    /// `d = 0`, no arrival pending: the set holds the use's result.
    Complete { seen: bool },
}

impl UseState {
    /// The state of use `seq` of set `set` of the slot whose registers are `regs`, for `rank`.
    #[inline(always)]
    pub(super) fn of(regs: &SlotRegisters, set: usize, seq: u32, rank: u8) -> UseState {
        let delta = seq.wrapping_sub(regs.seq[set]) as i32;
        let seen = regs.bitmap[set] & (1u32 << (rank % 32)) != 0;
        let pending = regs.count[set];
        if delta < 0 {
            UseState::Older
        } else if delta > 0 {
            UseState::Newer
        } else if awaiting(pending, 0).is_some() {
            UseState::AwaitingTotal { seen }
        } else if pending != 0 {
            let header_use = pending & HEADER_USE != 0;
            UseState::Collecting { seen, header_use }
        } else {
            UseState::Complete { seen }
        }
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
pub(super) struct CellLine([i32; 16]);

/// The value cells of `lines` as one array (with the padding of the last line, if any).
#[inline(always)]
pub(super) fn cells_of(lines: &mut [CellLine]) -> &mut [i32] {
    bytemuck::cast_slice_mut(lines)
}

/// The register file (see the module docs for the layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registers {
    pub(super) slots: Vec<SlotRegisters>,
    /// `reg_gap`: per block of [`GAP_BLOCK`] slots and rank, the gap counter of the latest Data
    /// packet that carried one, plus [`GAP_COUNTER`]; 0 before the first (PROTOCOL.md §5,
    /// loss recovery).
    pub(super) gaps: Vec<u32>,
    /// `reg_partial_gap` (a switch with an uplink): per block of [`GAP_BLOCK`] slots, the gap
    /// counter the next partial sum sent up to the block carries (PROTOCOL.md §9).
    pub(super) partial_gaps: Vec<u8>,
    /// `reg_partial_use`: per block and gap counter, `2 * slot + set + 1` of the use whose
    /// partial sum carried that counter (0: none), so that the upper switch's Missing report,
    /// which names a counter, names a use here.
    pub(super) partial_uses: Vec<u32>,
    /// `reg_partial_seq`: the sequence number of that use. A slot and set name a use only
    /// with it: a report that comes after the set has gone on to a newer use names none.
    pub(super) partial_seqs: Vec<u32>,
    /// `reg_result_gap`: per block, the gap counter the block's next multicast result
    /// carries (PROTOCOL.md §9: a lower switch finds a lost total by it).
    pub(super) result_gaps: Vec<u8>,
    /// `reg_result_use`: per block and gap counter, `2 * slot + set + 1` of the use whose
    /// multicast result carried it (0: none), so that a rank's Missing report names a use.
    pub(super) result_uses: Vec<u32>,
    /// `reg_result_seq`: the sequence number of that use, so that a report that comes after
    /// the set has gone on to a newer use names no use (a rank that lacks a result holds its
    /// set back, so only a late report meets a newer use).
    pub(super) result_seqs: Vec<u32>,
    /// `reg_total_gap` (a switch with an uplink): per block, the gap counter of the latest
    /// total that came down with one, plus 64 (0: none yet).
    pub(super) totals_seen: Vec<u32>,
    /// The value cells: element `(2*slot + set) * max_elems + k` of [`cells_of`] them.
    pub(super) values: Vec<CellLine>,
    /// (As configured, 16 bits: an offset computed from it and a 16-bit slot cannot overflow,
    /// which spares the slot update a check.)
    pub(super) max_elems: u16,
}

impl Registers {
    pub(super) fn new(cfg: PipelineConfig) -> Registers {
        let slots = usize::from(cfg.pool_slots);
        Registers {
            slots: vec![SlotRegisters::default(); slots],
            gaps: vec![0; slots.div_ceil(usize::from(GAP_BLOCK)) * (usize::from(MAX_RANK) + 1)],
            partial_gaps: vec![0; slots.div_ceil(usize::from(GAP_BLOCK))],
            partial_uses: vec![
                0;
                slots.div_ceil(usize::from(GAP_BLOCK)) * usize::from(GAP_COUNTER)
            ],
            partial_seqs: vec![
                0;
                slots.div_ceil(usize::from(GAP_BLOCK)) * usize::from(GAP_COUNTER)
            ],
            result_gaps: vec![0; slots.div_ceil(usize::from(GAP_BLOCK))],
            result_uses: vec![0; slots.div_ceil(usize::from(GAP_BLOCK)) * usize::from(GAP_COUNTER)],
            result_seqs: vec![0; slots.div_ceil(usize::from(GAP_BLOCK)) * usize::from(GAP_COUNTER)],
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

    /// The control registers of `slot` and the first `count` value cells of `(slot, set)`,
    /// borrowed apart, so that stores to one are known not to change the other.
    #[inline(always)]
    pub(super) fn slot_and_cells(
        &mut self,
        slot: usize,
        set: usize,
        count: usize,
    ) -> (&mut SlotRegisters, &mut [i32]) {
        let base = (2 * slot + set) * usize::from(self.max_elems);
        let cells = &mut cells_of(&mut self.values)[base..base + count];
        (&mut self.slots[slot], cells)
    }

    pub(super) fn clear_range(&mut self, base: usize, count: usize) {
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
            self.partial_seqs[first * m..end * m].fill(0);
            self.result_uses[first * m..end * m].fill(0);
            self.result_seqs[first * m..end * m].fill(0);
        }
        let m = usize::from(self.max_elems);
        cells_of(&mut self.values)[2 * base * m..2 * (base + count) * m].fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registers of set 0 holding use `seq` with `bitmap` and `count`.
    fn slot(seq: u32, bitmap: u32, count: u32) -> SlotRegisters {
        SlotRegisters {
            seq: [seq, 0],
            bitmap: [bitmap, 0],
            count: [count, 0],
            exp: [0, 0],
        }
    }

    #[test]
    fn use_states_follow_the_decision_tables() {
        let rank = 3;
        let bit = 1 << rank;
        let collecting = slot(10, bit, 2);
        assert_eq!(UseState::of(&collecting, 0, 9, rank), UseState::Older);
        assert_eq!(UseState::of(&collecting, 0, 11, rank), UseState::Newer);
        // Serial-number arithmetic: a sequence number that wrapped is newer, not older.
        assert_eq!(
            UseState::of(&slot(u32::MAX, 0, 0), 0, 1, rank),
            UseState::Newer
        );
        assert_eq!(
            UseState::of(&slot(1, 0, 0), 0, u32::MAX, rank),
            UseState::Older
        );
        let seen_collecting = UseState::Collecting {
            seen: true,
            header_use: false,
        };
        assert_eq!(UseState::of(&collecting, 0, 10, rank), seen_collecting);
        let others = UseState::of(&slot(10, 1, 2 | HEADER_USE), 0, 10, rank);
        let unseen_headers = UseState::Collecting {
            seen: false,
            header_use: true,
        };
        assert_eq!(others, unseen_headers);
        assert_eq!(
            UseState::of(&slot(10, bit, 0), 0, 10, rank),
            UseState::Complete { seen: true }
        );
        assert_eq!(
            UseState::of(&slot(10, 1, 0), 0, 10, rank),
            UseState::Complete { seen: false }
        );
        for waiting in [AWAITING_TOTAL, AWAITING_TOTAL_HEADER] {
            assert_eq!(
                UseState::of(&slot(10, bit, waiting), 0, 10, rank),
                UseState::AwaitingTotal { seen: true }
            );
        }
        // The other set's registers say nothing about set 0's use.
        let mut other_set = slot(10, bit, 0);
        other_set.seq[1] = 10;
        other_set.count[1] = 1;
        assert_eq!(
            UseState::of(&other_set, 1, 10, rank),
            UseState::Collecting {
                seen: false,
                header_use: false
            }
        );
    }
}
