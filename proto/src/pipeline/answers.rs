//! The answers the switch writes from its registers (PROTOCOL.md §6): the Query's decision
//! table, the Probe's reply, and the Pending and Result packets every table sends.

use super::counters::drop_counted;
use super::registers::UseState;
use super::{Counters, DropReason, Pipeline, PortId, Verdict};
use crate::kernels;
use crate::Instant;
use ina_wire::agg::{PendingInfo, ProbeInfo};
use ina_wire::{AggPacket, AggRepr, MessageType, QueryAsk, HEADER_LEN, PROTOCOL_VERSION};

impl Pipeline {
    /// A Query of one use of a slot, row by row of the table. Changes no register.
    pub(super) fn answer_query(
        &mut self,
        job_idx: usize,
        header: &[u8; HEADER_LEN],
        ingress: PortId,
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        let view = AggPacket::new_unchecked(header);
        let x = usize::from(view.set());
        let regs = &self.regs.slots[usize::from(view.slot())];
        let (state, bitmap) = (
            UseState::of(regs, x, view.seq(), view.rank()),
            regs.bitmap[x],
        );
        match state {
            UseState::Older => self.drop(DropReason::StaleSeq),
            // Not seen yet: no packet of this use has arrived.
            UseState::Newer => emit_pending(&mut self.counters, &view, 0, ingress, out),
            UseState::Collecting { .. } => {
                emit_pending(&mut self.counters, &view, bitmap, ingress, out)
            }
            UseState::Complete { seen: true } => {
                self.query_result(job_idx, &view, ingress, now, out)
            }
            // Complete, and the rank moved on.
            UseState::Complete { seen: false } => self.drop(DropReason::Duplicate),
            // Every rank here contributed and the total has not come down (§9).
            UseState::AwaitingTotal { seen } => {
                self.query_of_waiting_use(job_idx, &view, seen, ingress, now, out)
            }
        }
    }

    /// Row "complete, contributed": the stored Result, with E elements if the Query asks for
    /// the sums ([`QueryAsk::wants_sums`]), else its header alone.
    fn query_result(
        &mut self,
        job_idx: usize,
        view: &AggPacket<&[u8; HEADER_LEN]>,
        ingress: PortId,
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        let job = &mut self.jobs[job_idx];
        let count = if QueryAsk::wants_sums(view.exponent()) {
            job.cfg.elems_per_packet
        } else {
            0
        };
        let result_len = HEADER_LEN + 4 * usize::from(count);
        let Some(out) = out.get_mut(..result_len) else {
            return drop_counted(&mut self.counters, DropReason::OutputTooSmall);
        };
        let (slot, x) = (usize::from(view.slot()), usize::from(view.set()));
        let (regs, cells) = self.regs.slot_and_cells(slot, x, usize::from(count));
        emit_result(view, regs.exp[x], cells, None, out);
        if let Some(mut pkt) = out
            .first_chunk_mut::<HEADER_LEN>()
            .map(AggPacket::new_unchecked)
        {
            pkt.set_count(count);
        }
        job.last_activity = Some(now);
        self.counters.results_unicast += 1;
        Verdict::Unicast {
            port: ingress,
            len: result_len,
        }
    }

    /// A Probe's answer: the job's parameters, and whether this switch sends Missing reports.
    pub(super) fn answer_probe(
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

/// Writes the Pending answer to `view`'s packet (its header echoed, type Pending, exponent 0,
/// one element: the use's contributor `bitmap`) and counts it.
pub(super) fn emit_pending<'a>(
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
pub(super) fn write_pending(
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
pub(super) fn reply_to<'o>(
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

/// Writes the Result of the use of `view`'s packet into `out`, which is exactly
/// `HEADER_LEN + 4 * cells.len()` bytes long: exponent byte `exp`, `cells` as the payload,
/// and the gap counter `gap` of a first multicast (see `reports::stamp_use`).
///
/// The result's header is the packet's, as a P4 program rewrites it in place: type Result,
/// the set with the other flags cleared, and the slot's exponent. Every other field already
/// holds what the result carries: job, rank, slot and count are the packet's, its epoch was
/// checked against the job's, and its sequence number is the one in the set's register (the
/// packet either started the use or matched it).
pub(super) fn emit_result(
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
