//! PROTOCOL.md §9 on the lower switch of a tree: the partial sum of a use goes up as this
//! switch's Data in the upper job, the total comes down and is multicast, and the upper
//! switch's answers (Result, Pending, Reject, Missing) decide what is sent again. Rank 0's
//! asking drives it all: the switch has no timer.

use super::answers::{emit_pending, reply_to, write_pending};
use super::counters::drop_counted;
use super::data::in_turns;
use super::jobs::Job;
use super::registers::{awaiting, cells_of};
use super::reports::{block_in_job, note_total_counter, stamp_use, take_recorded_use};
use super::{
    Counters, DropReason, JobConfig, Pipeline, PortId, Registers, SlotRegisters, Uplink, Verdict,
};
use crate::kernels;
use crate::Instant;
use ina_wire::agg::PendingInfo;
use ina_wire::{AggPacket, AggRepr, MessageType, QueryAsk, HEADER_LEN, PROTOCOL_VERSION};

/// The rank whose retransmissions and Queries of a use waiting for its total are passed up as a
/// Query to the upper switch: the lower switch has no timer of its own, and borrows this rank's.
/// The upper switch's answer decides: the total (it was lost on the way down), a Pending
/// without this switch's bit (the partial was lost on the way up: it is sent again), or a
/// Pending with it (another rack is late: passed on to rank 0, which waits). The other ranks
/// are answered here with a Pending that shows every rank's contribution held. A partial is
/// thus sent again only when the upper switch lacks it, and a total that is only late costs a
/// 16-byte Query and its answer.
pub const UPLINK_TIMER_RANK: u8 = 0;

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

impl Pipeline {
    /// A packet of the upper switch for a job this switch is the lower level of, one arm per
    /// row of §9's table for packets in on the uplink port.
    #[cold]
    pub(super) fn handle_from_upper(
        &mut self,
        job_idx: usize,
        hdr: AggRepr,
        payload_bytes: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        if hdr.kind == MessageType::Result {
            return self.receive_total(job_idx, hdr, payload_bytes, now, out);
        }
        let Pipeline {
            regs,
            jobs,
            counters,
            ..
        } = self;
        let job = &jobs[job_idx];
        match hdr.kind {
            MessageType::Pending => {
                Self::handle_upper_pending(regs, job, counters, hdr, payload_bytes, out)
            }
            MessageType::Reject => {
                counters.upstream_rejects += 1;
                Self::pass_upper_reject(regs, job, hdr, out)
            }
            MessageType::Missing => Self::resend_reported_partial(regs, job, counters, hdr, out),
            _ => drop_counted(counters, DropReason::UnexpectedType),
        }
    }

    /// A Result in on the uplink port: rows "total", "total's counter", "total lost" and
    /// "copy of a total". The total of a use waiting for it is stored as the use's result and
    /// multicast to the ranks.
    fn receive_total(
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
            .then(|| {
                let results = (
                    &mut regs.result_gaps[..],
                    &mut regs.result_uses[..],
                    &mut regs.result_seqs[..],
                );
                stamp_use(results, slot_idx, x, hdr.seq)
            })
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

    /// A rank's Query of a use waiting for its total (rows "waiting, …" of §9's table): with
    /// reports on, rank 0's Query that asks for the partial sends the partial up again;
    /// otherwise [`answer_waiting`].
    pub(super) fn query_of_waiting_use(
        &mut self,
        job_idx: usize,
        view: &AggPacket<&[u8; HEADER_LEN]>,
        seen: bool,
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
        job.last_activity = Some(now);
        let x = usize::from(view.set());
        let slot_regs = regs.slots[usize::from(view.slot())];
        let pushes = QueryAsk::pushes_partial(view.exponent());
        let up = job
            .cfg
            .uplink
            .filter(|_| pushes && *gap_reports && view.rank() == UPLINK_TIMER_RANK && seen);
        let partial_elems = awaiting(slot_regs.count[x], job.cfg.elems_per_packet);
        if let (Some(up), Some(elems)) = (up, partial_elems) {
            // Rank 0 asks for the partial: its stream has sent every packet, and this use is
            // late. The partial goes up again as the ask: it repairs a lost partial at once,
            // and the upper switch answers a copy with the total or a Pending.
            let stored = (view.slot(), x, elems);
            let verdict = emit_stored_partial(regs, counters, view, &job.cfg, up, stored, out);
            if matches!(verdict, Verdict::Unicast { .. }) {
                counters.partials_for_fetch += 1;
            }
            return verdict;
        }
        answer_waiting(counters, view, &job.cfg, slot_regs.bitmap[x], ingress, out)
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
}

/// The partial sum of a use, `cells` with exponent byte `exp`, as the Data packet of this
/// switch's rank in the upper switch's job: the header of `view` (set, seq, count) with the
/// upper job's id, epoch, rank and slot, and the gap counter `gap` (a first transmission's,
/// see [`stamp_use`]; none on a partial sent again).
#[allow(clippy::too_many_arguments)]
pub(super) fn emit_partial<'a>(
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
/// slot (the later partial's) in the job's range, and the recorded use (slot, set and
/// sequence number) in the same block and still the set's current use.
/// The record is read and cleared (one stateful access on a P4 switch): only the upper switch
/// reports this switch's partials, each counter once, so a second report of it is a copy (the
/// upper switch sends its reports twice, [`DATA_REPORT_COPIES`]), which must not send a
/// second partial.
fn reported_use(regs: &mut Registers, job: &JobConfig, hdr: &AggRepr) -> Option<ReportedUse> {
    let up = job
        .uplink
        .filter(|u| u.rank == hdr.rank && u.epoch == hdr.epoch)?;
    let later = up.slot_down(job, hdr.slot)?;
    let partials = (&mut regs.partial_uses[..], &regs.partial_seqs[..]);
    let (slot, set, seq) = take_recorded_use(partials, later, hdr.gap?)?;
    let cells = regs.slots.get(usize::from(slot))?;
    let x = usize::from(set);
    let partial_elems =
        awaiting(cells.count[x], job.elems_per_packet).filter(|_| cells.seq[x] == seq)?;
    Some(ReportedUse {
        up,
        slot,
        set,
        seq,
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
pub(super) fn answer_waiting<'a>(
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
