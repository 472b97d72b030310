//! The pipeline's counters, and why a packet was dropped.

use super::Verdict;

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

    pub(super) fn count_drop(&mut self, reason: DropReason) {
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

#[cold]
pub(super) fn drop_counted(counters: &mut Counters, reason: DropReason) -> Verdict<'static> {
    counters.count_drop(reason);
    Verdict::Drop(reason)
}
