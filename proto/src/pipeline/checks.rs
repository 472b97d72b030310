//! PROTOCOL.md §6, "Checks, in order", on the general path: every packet the fast path did
//! not take. Each check either passes the packet on or ends it with a counted drop or, once
//! the sender is authenticated, a Reject; what passes goes to the table that decides it.

use super::{DropReason, JobConfig, Pipeline, PortId, Verdict};
use crate::Instant;
use ina_wire::{AggPacket, AggRepr, MessageType, RejectReason, HEADER_LEN, PROTOCOL_VERSION};

impl Pipeline {
    /// The checks of a packet whose header is `header` and payload `payload_bytes`.
    #[inline(always)]
    pub(super) fn check(
        &mut self,
        ingress: PortId,
        header: &[u8; HEADER_LEN],
        payload_bytes: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        let view = AggPacket::new_unchecked(header);
        // Data of this protocol version: the version and type `AggRepr::parse_header` accepts
        // without further checks. Everything else is parsed in full.
        if view.version() != PROTOCOL_VERSION || view.msg_type_raw() != MessageType::Data as u8 {
            return self.check_other(ingress, header, payload_bytes, now, out);
        }
        // 1. The length.
        if payload_bytes.len() != 4 * usize::from(view.count()) {
            return self.drop(DropReason::Malformed);
        }
        // 3-5. The sender.
        let job_idx = match self.authenticate(view.job(), view.rank(), ingress) {
            Ok(i) => i,
            Err(reason) => return self.drop(reason),
        };
        // 7-9. From here on the sender is authenticated: refusals are answered with a Reject.
        let job = &self.jobs[job_idx].cfg;
        let full_or_none = view.count() == 0 || view.count() == job.elems_per_packet;
        if let Some(reason) = refusal(job, view.epoch(), view.slot(), full_or_none) {
            return self.reject_header(job_idx, &view, reason, ingress, out);
        }
        self.aggregate(job_idx, &view, payload_bytes, ingress, now, out)
    }

    /// The checks of every packet but Data of this version: a Probe or a Query of a rank, a
    /// packet of an upper switch (§9), or a Missing report of a rank (§5 "Lost results").
    #[inline(never)]
    fn check_other(
        &mut self,
        ingress: PortId,
        header: &[u8; HEADER_LEN],
        payload_bytes: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        // 1. Parse.
        let Ok(hdr) = AggRepr::parse_header(header) else {
            return self.drop(DropReason::Malformed);
        };
        if payload_bytes.len() != 4 * usize::from(hdr.count) {
            return self.drop(DropReason::Malformed);
        }
        // 2. The type.
        if !matches!(hdr.kind, MessageType::Probe | MessageType::Query) {
            if let Some(job_idx) = self.job_of_uplink(ingress, hdr.job) {
                return self.handle_from_upper(job_idx, hdr, payload_bytes, now, out);
            }
            if hdr.kind == MessageType::Missing && self.gap_reports {
                return self.answer_lower_missing(hdr, ingress, now, out);
            }
            return self.drop(DropReason::UnexpectedType);
        }
        // 3-5. The sender.
        let job_idx = match self.authenticate(hdr.job, hdr.rank, ingress) {
            Ok(job_idx) => job_idx,
            Err(reason) => return self.drop(reason),
        };
        // 6. A Probe is answered.
        if hdr.kind == MessageType::Probe {
            return self.answer_probe(job_idx, hdr, ingress, out);
        }
        // 7-9. A Query carries no payload.
        match refusal(&self.jobs[job_idx].cfg, hdr.epoch, hdr.slot, hdr.count == 0) {
            Some(reason) => self.reject(job_idx, hdr, reason, ingress, out),
            None => self.answer_query(job_idx, header, ingress, now, out),
        }
    }

    /// Checks 3-5, the job table and rank check: the index of job `job_id`, if `rank` is one
    /// of its ranks and the packet came in on that rank's port.
    #[inline(always)]
    pub(super) fn authenticate(
        &self,
        job_id: u16,
        rank: u8,
        ingress: PortId,
    ) -> Result<usize, DropReason> {
        let Some(job_idx) = self.jobs.iter().position(|j| j.cfg.job == job_id) else {
            return Err(DropReason::UnknownJob);
        };
        match self.jobs[job_idx].port_of(rank) {
            None => Err(DropReason::UnknownRank),
            Some(port) if port != ingress => Err(DropReason::WrongPort),
            Some(_) => Ok(job_idx),
        }
    }

    /// [`Self::reject`] of a data packet's header, which parsed as data already.
    #[cold]
    pub(super) fn reject_header(
        &mut self,
        job_idx: usize,
        view: &AggPacket<&[u8; HEADER_LEN]>,
        reason: RejectReason,
        ingress: PortId,
        out: &mut [u8],
    ) -> Verdict<'_> {
        match AggRepr::parse_header(view.clone().into_inner()) {
            Ok(hdr) => self.reject(job_idx, hdr, reason, ingress, out),
            // Unreachable: the caller checked version and type.
            Err(_) => self.drop(DropReason::Malformed),
        }
    }

    /// The Reject of `hdr`'s packet, for `reason`, to the sender; counted as that refusal.
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
}

/// Checks 7-9 of an authenticated sender's Data or Query: the epoch, the slot range, and the
/// count (`count_ok`: 0 or E for Data, 0 for a Query).
#[inline(always)]
fn refusal(job: &JobConfig, epoch: u16, slot: u16, count_ok: bool) -> Option<RejectReason> {
    if epoch != job.epoch {
        Some(RejectReason::StaleEpoch)
    } else if !job_has_slot(job, slot) {
        Some(RejectReason::SlotOutOfRange)
    } else if !count_ok {
        Some(RejectReason::BadCount)
    } else {
        None
    }
}

/// Whether `slot` lies in the job's slot range.
#[inline(always)]
pub(super) fn job_has_slot(job: &JobConfig, slot: u16) -> bool {
    slot.wrapping_sub(job.slot_base) < job.slot_count
}
