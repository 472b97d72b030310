//! Gap counters and Missing reports (PROTOCOL.md §5 "Missing reports" and "Lost results",
//! §9 "Loss between the switches"): the counters a switch notes and stamps per block of
//! [`GAP_BLOCK`] slots, the uses it records by counter, and the reports it sends and answers.

use super::checks::job_has_slot;
use super::jobs::Job;
use super::{Counters, DropReason, JobConfig, Pipeline, PortId, Uplink, Verdict};
use crate::gap::take_counter;
use crate::Instant;
use ina_wire::agg::{GAP_BLOCK, GAP_COUNTER, MAX_RANK};
use ina_wire::{AggPacket, AggRepr, MessageType, QueryAsk, HEADER_LEN, PROTOCOL_VERSION};

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
pub(super) fn note_counter(
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

impl Pipeline {
    /// A Missing report from rank `hdr.rank`, a worker or a lower switch (PROTOCOL.md §5
    /// "Lost results", §9): the multicast results that carried the gap counters it names
    /// never reached it. The first one's use, looked up in `reg_result_use`, is answered as
    /// that rank's fetching Query of it: its stored result if the use is complete, else a
    /// Pending.
    #[cold]
    pub(super) fn answer_lower_missing(
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
            .then(|| {
                let counter = hdr.gap?;
                let results = (&self.regs.result_uses[..], &self.regs.result_seqs[..]);
                recorded_use(results, hdr.slot, counter)
            })
            .flatten();
        let Some((slot, set, seq)) = named else {
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
            seq,
            ..hdr
        };
        let mut header = [0u8; HEADER_LEN];
        if repr.emit_into(&mut header).is_err() {
            return self.drop(DropReason::Malformed);
        }
        self.answer_query(job_idx, &header, ingress, now, out)
    }
}

/// Whether the block of `slot` lies wholly in `job`'s range and is a block of the upper
/// job's as well (the two jobs' first slots differ by a multiple of [`GAP_BLOCK`]): only then
/// do the upper switch's gap cells and this switch's count the same slots.
pub(super) fn block_of_both_jobs(job: &JobConfig, up: Uplink, slot: usize) -> bool {
    let b = usize::from(GAP_BLOCK);
    let block_start = slot - slot % b;
    (usize::from(up.slot_base) + block_start)
        .checked_sub(usize::from(job.slot_base))
        .is_some_and(|d| d % b == 0)
        && block_in_job(job, slot)
}

/// Whether the block of `slot` lies wholly in `job`'s range (a block partly outside could be
/// shared with another job: it keeps no gap cells).
pub(super) fn block_in_job(job: &JobConfig, slot: usize) -> bool {
    let b = usize::from(GAP_BLOCK);
    let block_start = slot - slot % b;
    let job_start = usize::from(job.slot_base);
    block_start >= job_start && block_start + b <= job_start + usize::from(job.slot_count)
}

/// The block's next gap counter for the first transmission of use `(slot, set)` with
/// sequence number `seq` (a partial sum, or a multicast result), recorded in `uses` (cell
/// `block * 64 + counter` = `2 * slot + set + 1`) and `seqs` (the same cell = `seq`) so that
/// a Missing report naming it names the use (PROTOCOL.md §5, §9). The caller checks that the
/// block keeps cells ([`block_in_job`], and for a partial [`block_of_both_jobs`]).
#[inline(always)]
pub(super) fn stamp_use(
    (next_counters, uses, seqs): (&mut [u8], &mut [u32], &mut [u32]),
    slot: usize,
    set: usize,
    seq: u32,
) -> Option<u8> {
    let block = slot / usize::from(GAP_BLOCK);
    let next = next_counters.get_mut(block)?;
    let counter = *next;
    *next = (counter + 1) % GAP_COUNTER;
    let cell = use_cell(slot, counter);
    *uses.get_mut(cell)? = (2 * slot + set + 1) as u32;
    *seqs.get_mut(cell)? = seq;
    Some(counter)
}

/// The cell of `uses` (see [`stamp_use`]) for `counter` in the block of `slot`.
fn use_cell(slot: usize, counter: u8) -> usize {
    slot / usize::from(GAP_BLOCK) * usize::from(GAP_COUNTER) + usize::from(counter % GAP_COUNTER)
}

/// The use `(slot, set, seq)` recorded in `uses` and `seqs` (see [`stamp_use`]) for `counter`
/// in the block of `slot`, if any.
pub(super) fn recorded_use(
    (uses, seqs): (&[u32], &[u32]),
    slot: u16,
    counter: u8,
) -> Option<(u16, u8, u32)> {
    let block = usize::from(slot / GAP_BLOCK);
    let cell = use_cell(usize::from(slot), counter);
    let use_index = usize::try_from(uses.get(cell)?.checked_sub(1)?).ok()?;
    let (named, set) = (use_index / 2, use_index % 2);
    if named / usize::from(GAP_BLOCK) != block {
        return None;
    }
    Some((u16::try_from(named).ok()?, set as u8, *seqs.get(cell)?))
}

/// [`recorded_use`], and the record cleared (read and cleared in one stateful access on a P4
/// switch): a second report naming the same counter then names nothing.
pub(super) fn take_recorded_use(
    (uses, seqs): (&mut [u32], &[u32]),
    slot: u16,
    counter: u8,
) -> Option<(u16, u8, u32)> {
    let named = recorded_use((uses, seqs), slot, counter)?;
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
pub(super) fn note_total_counter(
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
