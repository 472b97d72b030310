//! When a packet found unanswered by order waits before it is asked about: on one switch
//! mid-stream, and in a tree of switches (PROTOCOL.md §9).

use crate::stream::recovery::Rule;
use crate::stream::slots::{Held, Outstanding};
use crate::stream::Stream;
use ina_wire::agg::GAP_BLOCK;

impl<'a> Stream<'a> {
    /// Whether `out` waits a query timeout before it is asked about (R3, `hold-off-mid-stream`).
    pub(super) fn holds_off(&self, out: &Outstanding) -> bool {
        self.has(Rule::HoldOffMidStream)
            && self.reports()
            && self.cfg.workers > 1
            && !self.in_tree()
            && out.retries == 0
            && !out.awaiting_repair
            && out.held == Held::Unknown
            && self.loss_reportable(out)
            && !self.in_last_window()
    }

    /// Whether `out`, in a tree once every packet has gone, waits a query timeout while an older
    /// packet of its block is unanswered (R4, `tree-waits-for-counters`).
    pub(super) fn waits_for_counters(&self, out: &Outstanding) -> bool {
        let block = usize::from(GAP_BLOCK);
        let first = self.gap_block_of(out.index) * block;
        let older_unanswered = || {
            self.slots.get(first..first + block).is_some_and(|slots| {
                slots
                    .iter()
                    .any(|s| s.outstanding.is_some_and(|o| o.index < out.index))
            })
        };
        self.has(Rule::TreeWaitsForCounters)
            && self.counts_results()
            && self.in_tree()
            && self.cfg.rank != 0
            && self.all_sent()
            && out.held != Held::No
            && self.loss_reportable(out)
            && older_unanswered()
    }

    /// Whether the job spans more than this worker's switch (PROTOCOL.md §9).
    pub(super) fn in_tree(&self) -> bool {
        u16::from(self.cfg.workers) < self.cfg.total_workers
    }
}
