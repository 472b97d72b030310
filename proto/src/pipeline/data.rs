//! PROTOCOL.md §6, "Decision table for an accepted Data packet": the slot update.
//!
//! [`Pipeline::aggregate`] decides the table's rows in order, each marked where it is decided:
//! a first or later arrival adds the payload, and the one that completes the use multicasts
//! the result, or, on a switch with an uplink, sends the partial sum up (§9).

use super::answers::{emit_pending, emit_result};
use super::counters::drop_counted;
use super::registers::{
    awaiting, cells_of, AWAITING_TOTAL, AWAITING_TOTAL_HEADER, HEADER_USE, PENDING_ARRIVALS,
};
use super::reports::{block_in_job, block_of_both_jobs, note_counter, stamp_use};
use super::uplink::{answer_waiting, emit_partial};
use super::{DropReason, Pipeline, PortId, SlotRegisters, Verdict};
use crate::kernels;
use crate::Instant;
use ina_wire::{AggPacket, RejectReason, HEADER_LEN};

impl Pipeline {
    /// The slot update of a Data packet that passed the checks, row by row of the table:
    /// the rows are marked where they are decided (the `UseState` of the packet's use, as
    /// the Query's table matches on it, spelled out here: this is the data path, and one
    /// body for every row keeps its compilation small).
    #[inline(always)]
    pub(super) fn aggregate(
        &mut self,
        job_idx: usize,
        view: &AggPacket<&[u8; HEADER_LEN]>,
        payload_bytes: &[u8],
        ingress: PortId,
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        // The gap register sees every Data packet that passed the checks, before the slot's
        // registers decide on it (a P4 switch keeps it in the stage of the sequence
        // registers, before the stage that finds a count that differs from the use's).
        if let Some(counter) = view.gap().filter(|_| self.gap_reports) {
            note_counter(
                &mut self.regs.gaps,
                &self.jobs[job_idx],
                view,
                counter,
                ingress,
                &mut self.counters,
                &mut self.report,
            );
        }
        // Row "count differs from the use's": refused before the set's registers change. The
        // rank has moved on to this use all the same, so it leaves the other set's bitmap as
        // any arrival to the current use makes it (a Tofino switch takes it out of the other
        // set in the stage that finds the count differs).
        if self.differs_from_its_use(view, payload_bytes.is_empty()) {
            self.take_out_of_other_set(view);
            return self.reject_header(job_idx, view, RejectReason::BadCount, ingress, out);
        }
        // Borrowed apart, so that stores to one are known not to change the others.
        let Pipeline {
            regs,
            jobs,
            counters,
            gap_reports,
            ..
        } = self;
        let job = &mut jobs[job_idx];
        job.last_activity = Some(now);
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

        // Stage 1: sequence register of the set. Row "stale".
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
            // retransmission asks the upper switch with a Query (§9's rows "waiting").
            return answer_waiting(counters, view, &job.cfg, bitmap[x], ingress, out);
        }
        if !new_use && (seen || pending[x] == 0) {
            if !seen {
                // Row "late copy": the use completed and this worker already moved on (its bit
                // was cleared by its next packet).
                return drop_counted(counters, DropReason::Duplicate);
            }
            // Rows "retransmission, complete" and "retransmission, incomplete": answered from
            // the registers, with the result if the use is complete, else with the
            // contributors so far.
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
        // Rows "first arrival" (a new use) and "later arrival": an arrival that counts.
        // Arrivals pending: a new use starts at workers - 1 still to come.
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
        // Row "last arrival": on a switch with an uplink (§9) the partial goes up, and the
        // use waits for the total; else the result goes to every rank.
        if let Some(up) = job.cfg.uplink {
            pending[x] = if count == 0 {
                AWAITING_TOTAL_HEADER
            } else {
                AWAITING_TOTAL
            };
            counters.partials_sent += 1;
            let gap = (*gap_reports && block_of_both_jobs(&job.cfg, up, slot))
                .then(|| {
                    let partials = (
                        &mut regs.partial_gaps[..],
                        &mut regs.partial_uses[..],
                        &mut regs.partial_seqs[..],
                    );
                    stamp_use(partials, slot, x, seq[x])
                })
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
            .then(|| {
                let results = (
                    &mut regs.result_gaps[..],
                    &mut regs.result_uses[..],
                    &mut regs.result_seqs[..],
                );
                stamp_use(results, slot, x, seq[x])
            })
            .flatten();
        emit_result(view, exp[x], cells, gap, out);
        counters.results_multicast += 1;
        Verdict::Multicast {
            ports: &job.cfg.ranks,
            len: result_len,
        }
    }

    /// Whether a Data arrival that would count towards its slot's current use (new from its
    /// rank, the use collecting) carries a payload where the use's first arrival carried none,
    /// or none where it carried one. (Cold: only a faulty sender's packet is refused so.)
    #[cold]
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

    /// Takes the packet's rank out of the other set's bitmap, unless that set holds a newer
    /// use than the packet's.
    #[cold]
    fn take_out_of_other_set(&mut self, view: &AggPacket<&[u8; HEADER_LEN]>) {
        let x = usize::from(view.set());
        let Some(r) = self.regs.slots.get_mut(usize::from(view.slot())) else {
            return;
        };
        let other_newer = r.seq[1 - x].wrapping_sub(view.seq()) as i32 > 0;
        if !other_newer {
            r.bitmap[1 - x] &= !(1u32 << (view.rank() % 32));
        }
    }
}

/// `kernel` (`decode_be` or `accumulate_be` of `kernels::portable`) of a payload into its cells
/// (as many elements as `cells` holds), in whole turns of 32 elements and the rest apart: the
/// vectorized loop then needs no remainder of its own, and a packet of 64 or 256 elements runs
/// no set-up for one.
#[inline(always)]
pub(super) fn in_turns(
    payload: &[u8],
    cells: &mut [i32],
    kernel: impl Fn(&[u8], &mut [i32]) + Copy,
) {
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
