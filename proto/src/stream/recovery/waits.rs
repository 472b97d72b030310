//! When a packet found unanswered waits before it is asked about: on one switch mid-stream,
//! and in a tree of switches (PROTOCOL.md §9).

use crate::stream::recovery::Rule;
use crate::stream::slots::{Held, Outstanding};
use crate::stream::Stream;
use ina_wire::agg::GAP_BLOCK;

impl<'a> Stream<'a> {
    /// Whether `out`, found unanswered by order, waits a query timeout before it is asked about
    /// (R3, `hold-off-mid-stream`): on one switch, with reports and other workers, a first
    /// transmission whose loss the switch would report, before the last window. Such a packet far
    /// more often waits for another worker's repair than lost its result. Not in a tree, where a
    /// slot held longer holds up every rack.
    pub(in crate::stream) fn holds_off(&self, out: &Outstanding) -> bool {
        self.has(Rule::HoldOffMidStream)
            && self.reports
            && self.cfg.workers > 1
            && !self.in_tree()
            && out.retries == 0
            && !out.awaiting_repair
            && out.held == Held::Unknown
            && self.loss_reportable(out)
            && !self.in_last_window()
    }

    /// Whether `out`, found unanswered by order in a tree once every packet has gone, waits a
    /// query timeout (R4, `tree-waits-for-counters`): ranks other than 0, when the switch would
    /// have reported the loss of its data and an older packet of its block is unanswered, whose
    /// result's gap counter would show this one's loss. Rank 0's Queries are the rack's timer for
    /// what is lost between the switches, so it asks at once.
    pub(in crate::stream) fn waits_for_counters(&self, out: &Outstanding) -> bool {
        // (Following the results' counters implies Missing reports: both need whole blocks.)
        self.has(Rule::TreeWaitsForCounters)
            && self.counts_results()
            && self.in_tree()
            && self.cfg.rank != 0
            && self.all_sent()
            && out.held != Held::No
            && self.loss_reportable(out)
            && self.older_unanswered_in_block(out)
    }

    /// Whether a packet sent before `out` to a slot of the same block is still unanswered.
    pub(in crate::stream) fn older_unanswered_in_block(&self, out: &Outstanding) -> bool {
        let block = usize::from(GAP_BLOCK);
        let first = self.gap_block_of(out.index) * block;
        self.slots.get(first..first + block).is_some_and(|slots| {
            slots
                .iter()
                .any(|s| s.outstanding.is_some_and(|o| o.index < out.index))
        })
    }

    /// Whether the job spans more than this worker's switch: a rack of a two-level tree
    /// (PROTOCOL.md §9).
    pub(in crate::stream) fn in_tree(&self) -> bool {
        u16::from(self.cfg.workers) < self.cfg.total_workers
    }

    /// Whether a Query that would fetch a result not yet answered "complete" asks for the use's
    /// state and for its partial to be sent up again ([`QueryAsk::StatusPushingPartial`](ina_wire::QueryAsk::StatusPushingPartial)): rank 0
    /// of a rack, once every packet has gone (R5, `rank0-asks-partial`). Most of what it asks
    /// about is only queued on its downlink, where a fetch's copy would queue behind it.
    pub(in crate::stream) fn asks_for_partial(&self) -> bool {
        self.cfg.rank == 0 && self.in_tree() && self.counts_results()
    }
}
