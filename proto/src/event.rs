//! The events the data plane counts, one per frame, with the index each has in the P4
//! programs' indexed counter `ina_events`.
//!
//! Every frame a switch receives counts exactly one event. A Result multicast on the last
//! arrival counts the arrival's event (`DataFirst` or `DataAdded`) here and, in addition, one
//! `results_multicast` in the one-entry counter `ina_multicast`. With Missing reports on, a
//! frame may also count in the two-entry counter `ina_missing` ([`MISSING_SENT`]: it caused a
//! report of lost data; [`MISSING_RECEIVED`]: it was a report answered as a Query).

/// Index in `ina_missing` of the reports of lost data sent (one per report, not per copy).
pub const MISSING_SENT: usize = 0;
/// Index in `ina_missing` of the Missing reports answered as their rank's fetching Query.
pub const MISSING_RECEIVED: usize = 1;
/// Entries of `ina_missing`.
pub const MISSING_COUNTERS: usize = 2;

/// One event of the data plane. The discriminant is the counter index in the P4 programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Event {
    /// An ordinary frame forwarded by the L2 table (or flooded, for broadcast).
    L2Forwarded = 0,
    /// An ordinary frame whose destination MAC is not in the L2 table: dropped.
    L2Unknown = 1,
    /// An ARP request for the switch's own address, answered.
    ArpReplied = 2,
    /// A frame to the switch's IPv4 address that is not an `ina` datagram: dropped.
    NotIna = 3,
    /// An `ina` datagram that does not parse (length, version, type): dropped.
    Malformed = 4,
    /// A well-formed `ina` message of a type the switch does not accept: dropped.
    UnexpectedType = 5,
    /// Job not installed: dropped.
    UnknownJob = 6,
    /// Rank not part of the job: dropped.
    UnknownRank = 7,
    /// Rank known, but the frame came from another port or address: dropped.
    WrongPort = 8,
    /// Refused with Reject(StaleEpoch).
    StaleEpoch = 9,
    /// Refused with Reject(SlotOutOfRange).
    SlotOutOfRange = 10,
    /// Refused with Reject(BadCount).
    BadCount = 11,
    /// Data or Query of an older use of the slot: dropped.
    StaleSeq = 12,
    /// A late copy of a contribution to a completed use: dropped.
    Duplicate = 13,
    /// First arrival of a new use.
    DataFirst = 14,
    /// Later arrival of a use.
    DataAdded = 15,
    /// The stored result sent back to one worker (retransmission or Query to a complete use).
    ResultUnicast = 16,
    /// A Pending answer sent (retransmission or Query to an incomplete use, or a Query of a use
    /// the switch has not seen).
    PendingSent = 17,
    /// A Probe answered with a ProbeReply.
    ProbeAnswered = 18,
    /// A Missing report (of a worker's lost results, PROTOCOL.md §5) that names no recorded
    /// use, or comes with another epoch or a slot outside the job: counted and dropped.
    MissingUnmatched = 19,
    /// A total from the upper switch of a tree (PROTOCOL.md §9), multicast to the ranks.
    TotalReceived = 20,
    /// Any other packet of the upper switch (its Pending, Reject or Missing, a total's header
    /// alone), handled: passed on to rank 0, answered with the partial or a Query up, or
    /// nothing to do.
    UpperAnswer = 21,
    /// A rank's packet that made the switch send a Query or the partial up to the upper
    /// switch (rank 0's ask about a use waiting for its total).
    SentUp = 22,
}

impl Event {
    /// Every event, in index order.
    pub const ALL: [Event; 23] = [
        Event::L2Forwarded,
        Event::L2Unknown,
        Event::ArpReplied,
        Event::NotIna,
        Event::Malformed,
        Event::UnexpectedType,
        Event::UnknownJob,
        Event::UnknownRank,
        Event::WrongPort,
        Event::StaleEpoch,
        Event::SlotOutOfRange,
        Event::BadCount,
        Event::StaleSeq,
        Event::Duplicate,
        Event::DataFirst,
        Event::DataAdded,
        Event::ResultUnicast,
        Event::PendingSent,
        Event::ProbeAnswered,
        Event::MissingUnmatched,
        Event::TotalReceived,
        Event::UpperAnswer,
        Event::SentUp,
    ];

    /// The size of the P4 counter array.
    pub const COUNT: usize = Event::ALL.len();

    /// The counter's index.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The counter's name (as in the switch's statistics).
    pub fn name(self) -> &'static str {
        match self {
            Event::L2Forwarded => "l2_forwarded",
            Event::L2Unknown => "l2_unknown",
            Event::ArpReplied => "arp_replied",
            Event::NotIna => "not_ina",
            Event::Malformed => "malformed",
            Event::UnexpectedType => "unexpected_type",
            Event::UnknownJob => "unknown_job",
            Event::UnknownRank => "unknown_rank",
            Event::WrongPort => "wrong_port",
            Event::StaleEpoch => "stale_epoch",
            Event::SlotOutOfRange => "slot_out_of_range",
            Event::BadCount => "bad_count",
            Event::StaleSeq => "stale_seq",
            Event::Duplicate => "duplicate",
            Event::DataFirst => "data_first",
            Event::DataAdded => "data_added",
            Event::ResultUnicast => "results_unicast",
            Event::PendingSent => "pending_sent",
            Event::ProbeAnswered => "probes_answered",
            Event::MissingUnmatched => "missing_unmatched",
            Event::TotalReceived => "totals_received",
            Event::UpperAnswer => "upper_answers",
            Event::SentUp => "sent_up",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_dense_and_names_unique() {
        for (i, e) in Event::ALL.iter().enumerate() {
            assert_eq!(e.index(), i, "{e:?}");
        }
        let mut names: Vec<_> = Event::ALL.iter().map(|e| e.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Event::COUNT);
    }
}
