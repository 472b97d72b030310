//! When a packet found unanswered waits before it is asked about: on one switch mid-stream,
//! and in a tree of switches (PROTOCOL.md §9).

use crate::stream::recovery::Rule;
use crate::stream::slots::{Held, Outstanding};
use crate::stream::Stream;
use ina_wire::agg::GAP_BLOCK;

impl<'a> Stream<'a> {
    /// Whether `out`, found unanswered by order, waits a query timeout before it is asked
    /// about. With Missing reports and other workers in the job, an unanswered first
    /// transmission mid-stream is far more often waiting for another worker's repair (which
    /// the switch has asked for, and which completes the use about a round trip later) than
    /// missing its result; the loss of its own data the switch would have reported. At
    /// n = 32 and 1% loss a quarter of the uses lose some worker's packet, and asking at once
    /// cost each worker a Query for every fifth packet (167 000 Queries in all; 39 000 with
    /// the wait, and the last packet sent 0.3% sooner). A lost result waits a round trip
    /// or two longer, which the window covers. Not held back: a packet of the stream's last
    /// window (the stream's end waits for every one of them), and any packet in a tree (§9
    /// of PROTOCOL.md), where a late result more often waits for the upper switch, whose
    /// losses rank 0's asking repairs, and where a slot held longer holds up every rack:
    /// held back there, 4 racks of 32 reached 0.908 of lossless goodput at 1% loss against
    /// 0.937 (seeds 1-3), and 4 racks of 8 0.944 against 0.951 (seeds 1-6). (Once a tree's
    /// stream has sent every packet, [`waits_for_counters`](Self::waits_for_counters) holds
    /// some packets back there.)
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
    /// query timeout before it is asked about (as [`holds_off`](Self::holds_off) waits on one
    /// switch mid-stream). A tree's last window of results reaches the workers long after the
    /// sending ends (a use crosses two levels of switches and waits for their repairs), and
    /// the workers' downlinks still carry them: a fetching Query about a packet whose result
    /// is merely queued brings a copy that queues behind it, and every answer and report
    /// queues behind the copies. Here the switch would have reported the loss of the packet's
    /// data, and an older packet of its block is unanswered, so its block has a result due
    /// that would show a lost result of this one by its gap counter; if that result comes
    /// first, the Query goes a query timeout later. Rank 0 of a rack still asks at once: its
    /// Queries are the rack's only timer for a partial or total lost between the switches
    /// (PROTOCOL.md §9). At 4 racks of 32 and 1% loss, 16 MiB, 0.958 of lossless goodput
    /// against 0.952 (seeds 1-3); 4 racks of 8 and of 4 unchanged (seeds 1-12).
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

    /// Whether the fetch that a status Query's header-only answer asks for (the use is
    /// complete, its result was lost) waits a query timeout. With the results' gap counters
    /// the loss has most likely been reported already, by a later result to the same block,
    /// and the switch's copy is on its way. In a tree, where a packet found unanswered by
    /// order is asked about at once ([`Self::holds_off`]), such Queries race the report, and
    /// fetching at once brought a second copy of most lost results: at 4 racks of 32 and 1%
    /// loss, the workers' downlinks, busy with the multicast results, held 4.8 µs of queue
    /// at the end of sending against 0.9 without the counters, and the stream's end took
    /// 120 µs against 66 (seed 3; 1.3 µs and 87 µs with the wait). On one switch the Query
    /// itself waited a query timeout, and a result still missing then is fetched at once.
    ///
    /// Once every packet has gone, the fetch goes at once. The header-only answers then come
    /// to rank 0's Queries ([`Self::asks_for_partial`]) and to status Queries sent before,
    /// and the job's end waits for every result still missing. At 4 racks of 32 and 1% loss,
    /// this and rank 0's asking give 0.963 of lossless goodput against 0.957 (seeds 1-12);
    /// rank 0's asking with the wait kept gave 92.04 Gbit/s where this gives 92.34 (seeds
    /// 7-12).
    pub(in crate::stream) fn defers_fetch(&self) -> bool {
        self.has(Rule::TreeDefersFetch)
            && self.in_tree()
            && self.counts_results()
            && !self.all_sent()
    }

    /// Whether a Query that would fetch the result of a use not yet answered "complete" asks
    /// for the use's state instead, and for its partial sum to be sent up again
    /// ([`QueryAsk::StatusPushingPartial`]): rank 0 of a rack in a tree, once every packet
    /// has gone (PROTOCOL.md §9).
    ///
    /// Rank 0 asks at once about a packet found unanswered by order
    /// ([`Self::waits_for_counters`] holds the other ranks back), and most of the results it
    /// asks about are only queued behind the rack's last results on its downlink: fetching,
    /// each such Query brought a full copy that queued behind them in turn. At 4 racks of 32
    /// and 1% loss (seed 1), rank 0's downlink carried 414 copies from 1380 µs to the
    /// stream's end (rank 1's: 64), and the last total to reach rank 0 waited 22.7 µs in its
    /// queue. Asking for the state, a use waiting for its total still has its partial sent up
    /// at once, and a complete one is answered with its header alone (5 copies), which says
    /// "lost" when its result did not come first.
    pub(in crate::stream) fn asks_for_partial(&self) -> bool {
        self.cfg.rank == 0 && self.in_tree() && self.counts_results()
    }
}
