//! What a stream knows of each slot's packet in flight: its transmissions, its timer, and
//! what the switch is known to hold of its data.

use crate::Instant;

/// What the switch is known to hold of an outstanding packet's data (from Pending answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    Unknown,
    /// The switch holds it: a Query repairs any loss.
    Yes,
    /// The switch lacks it: the data must go again.
    No,
}

/// The deadline of a packet whose retransmission is queued: its timer is off until it goes.
pub(super) const QUEUED: Instant = Instant::from_nanos(u64::MAX);

/// A slot's packet in flight.
#[derive(Debug, Clone, Copy)]
pub(super) struct Outstanding {
    pub(super) index: u64,
    pub(super) first_sent: Instant,
    pub(super) deadline: Instant,
    pub(super) retries: u32,
    /// Of its retransmissions, those of its data (the others were Queries).
    pub(super) data_retries: u32,
    /// Transmission number of its latest transmission (see `Stream::transmissions`).
    pub(super) last_tx: u64,
    /// Transmission number of its first transmission.
    pub(super) first_tx: u64,
    /// Its first transmission's number among those to its block (see `BlockTx`).
    pub(super) block_ordinal: u64,
    /// When its latest transmission was sent.
    pub(super) last_sent: Instant,
    /// Whether its latest transmission was a Query.
    pub(super) last_was_query: bool,
    /// What the switch holds of its data.
    pub(super) held: Held,
    /// The contributor bitmap of the latest Pending answer for this use, if any.
    pub(super) contributors: Option<u32>,
    /// A status Query found the use complete and its result has not come (E7).
    pub(super) complete_seen: bool,
    /// Found unanswered by order, its timer is the wait before it is asked about (R3, R4).
    pub(super) awaiting_repair: bool,
}

impl Outstanding {
    /// Whether its retransmission is queued (see [`QUEUED`]).
    pub(super) fn is_queued(&self) -> bool {
        self.deadline == QUEUED
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SlotState {
    pub(super) outstanding: Option<Outstanding>,
    /// Index of the last packet on this slot whose result arrived.
    pub(super) done_upto: Option<u64>,
}
