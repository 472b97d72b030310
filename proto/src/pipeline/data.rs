//! PROTOCOL.md §6, "Decision table for an accepted Data packet": the slot update.
//!
//! [`Pipeline::aggregate`] matches on the [`UseState`] of the packet's use, one arm per row of
//! the table; a first or later arrival adds the payload ([`Pipeline::contribute`]), and the one
//! that completes the use multicasts the result, or, on a switch with an uplink, sends the
//! partial sum up (§9).

use super::answers::{emit_pending, emit_result};
use super::counters::drop_counted;
use super::registers::{
    UseState, AWAITING_TOTAL, AWAITING_TOTAL_HEADER, HEADER_USE, PENDING_ARRIVALS,
};
use super::reports::{block_in_job, block_of_both_jobs, note_counter, stamp};
use super::uplink::{answer_waiting, emit_partial};
use super::{DropReason, Pipeline, PortId, SlotRegisters, Verdict};
use crate::kernels;
use crate::Instant;
use ina_wire::{AggPacket, RejectReason, HEADER_LEN};

impl Pipeline {
    /// The slot update of a Data packet that passed the checks, row by row of the table.
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
        let slot = usize::from(view.slot());
        let x = usize::from(view.set());
        let regs = &self.regs.slots[slot];
        let (state, bitmap) = (
            UseState::of(regs, x, view.seq(), view.rank()),
            regs.bitmap[x],
        );
        // Row "count differs from the use's": refused before any register changes.
        if let UseState::Collecting {
            seen: false,
            header_use,
        } = state
        {
            if header_use != payload_bytes.is_empty() {
                return self.reject_header(job_idx, view, RejectReason::BadCount, ingress, out);
            }
        }
        self.note_data(job_idx, view, ingress, now);
        match state {
            UseState::Older => self.drop(DropReason::StaleSeq),
            UseState::Newer => self.contribute(job_idx, view, payload_bytes, true, out),
            UseState::Collecting { seen: false, .. } => {
                self.contribute(job_idx, view, payload_bytes, false, out)
            }
            // Retransmission, incomplete: the contributors so far.
            UseState::Collecting { seen: true, .. } => {
                emit_pending(&mut self.counters, view, bitmap, ingress, out)
            }
            // Retransmission, complete: the stored result, to the sender alone.
            UseState::Complete { seen: true } => {
                self.unicast_result(view, payload_bytes.len() / 4, ingress, out)
            }
            // The use completed and this worker already moved on (its bit was cleared by its
            // next packet): a late copy.
            UseState::Complete { seen: false } => self.drop(DropReason::Duplicate),
            // Every rank here contributed and the total has not come down (§9).
            UseState::AwaitingTotal { .. } => {
                let job = &self.jobs[job_idx].cfg;
                answer_waiting(&mut self.counters, view, job, bitmap, ingress, out)
            }
        }
    }

    /// What every Data packet of a job does besides its row: it is the job's latest activity,
    /// and its gap counter, if it carries one, is noted (PROTOCOL.md §5, "Missing reports").
    #[inline(always)]
    fn note_data(
        &mut self,
        job_idx: usize,
        view: &AggPacket<&[u8; HEADER_LEN]>,
        ingress: PortId,
        now: Instant,
    ) {
        let job = &mut self.jobs[job_idx];
        job.last_activity = Some(now);
        if let Some(counter) = view.gap().filter(|_| self.gap_reports) {
            let (counters, report) = (&mut self.counters, &mut self.report);
            note_counter(
                &mut self.regs.gaps,
                job,
                view,
                counter,
                ingress,
                counters,
                report,
            );
        }
    }

    /// Rows "first arrival" (`new_use`) and "later arrival": the payload is added to the
    /// set's cells, and the last arrival multicasts the result, or sends the partial up.
    #[inline(always)]
    fn contribute(
        &mut self,
        job_idx: usize,
        view: &AggPacket<&[u8; HEADER_LEN]>,
        payload_bytes: &[u8],
        new_use: bool,
        out: &mut [u8],
    ) -> Verdict<'_> {
        let Pipeline {
            regs,
            jobs,
            counters,
            gap_reports,
            ..
        } = self;
        let job = &jobs[job_idx];
        let slot = usize::from(view.slot());
        let x = usize::from(view.set());
        let bit = 1u32 << (view.rank() % 32);
        // The header's count: both callers checked that the payload holds `count` elements.
        let count = payload_bytes.len() / 4;
        let (
            SlotRegisters {
                seq,
                bitmap,
                count: pending,
                exp,
            },
            cells,
        ) = regs.slot_and_cells(slot, x, count);
        // Arrivals pending: a new use starts at workers - 1 still to come.
        let remaining = if new_use {
            job.workers - 1
        } else {
            (pending[x] & PENDING_ARRIVALS) - 1
        };
        let header_use = if new_use {
            count == 0
        } else {
            pending[x] & HEADER_USE != 0
        };
        // The result of this slot, if one is sent: header and `count` elements.
        let result_len = HEADER_LEN + 4 * count;
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
        // Row "last arrival". On a switch with an uplink (§9): the partial goes up, and the
        // use waits for the total. (The registers are borrowed again below, for the gap
        // counter's registers besides the cells.)
        let exp = exp[x];
        debug_assert_eq!(seq[x], view.seq());
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
            let cells = &regs.slot_and_cells(slot, x, count).1[..];
            return emit_partial(counters, view, &job.cfg, up, exp, cells, gap, out);
        }
        let Some(out) = out.get_mut(..result_len) else {
            // Unreachable: checked before the registers changed.
            return drop_counted(counters, DropReason::OutputTooSmall);
        };
        let gap = (*gap_reports && block_in_job(&job.cfg, slot))
            .then(|| stamp(&mut regs.result_gaps, &mut regs.result_uses, slot, x))
            .flatten();
        let cells = &regs.slot_and_cells(slot, x, count).1[..];
        emit_result(view, exp, cells, gap, out);
        counters.results_multicast += 1;
        Verdict::Multicast {
            ports: &job.cfg.ranks,
            len: result_len,
        }
    }

    /// Row "retransmission, complete": the stored result of the packet's use, `count`
    /// elements, unicast to `ingress`.
    #[inline(always)]
    fn unicast_result(
        &mut self,
        view: &AggPacket<&[u8; HEADER_LEN]>,
        count: usize,
        ingress: PortId,
        out: &mut [u8],
    ) -> Verdict<'_> {
        let result_len = HEADER_LEN + 4 * count;
        let Some(out) = out.get_mut(..result_len) else {
            return self.drop(DropReason::OutputTooSmall);
        };
        let (slot, x) = (usize::from(view.slot()), usize::from(view.set()));
        let (regs, cells) = self.regs.slot_and_cells(slot, x, count);
        debug_assert_eq!(regs.seq[x], view.seq());
        emit_result(view, regs.exp[x], cells, None, out);
        self.counters.results_unicast += 1;
        Verdict::Unicast {
            port: ingress,
            len: result_len,
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
