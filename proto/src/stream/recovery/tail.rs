//! The stream's end (docs/design/RECOVERY.md, "The tail"): once every packet has gone, no
//! later first transmission reveals a loss, and the job's end waits for every repair.

use crate::stream::recovery::{Retransmit, Rule};
use crate::stream::slots::{Held, Outstanding};
use crate::stream::Stream;
use crate::Instant;
use core::cmp::Reverse;

impl<'a> Stream<'a> {
    /// Once every packet has gone out, no later first transmission will make the switch report
    /// the loss of a block's last one: those packets get the query timeout as their timer
    /// (a round trip or two, not a retransmission timeout), and go again when it expires. The
    /// link has room at the end of the stream, so a copy sent while the use merely waits for
    /// another worker costs nothing but its bytes, and its Pending answer turns the next
    /// attempts into Queries. Rank 0 of a rack also has the uses it was told wait asked about
    /// at the end's pace ([`ask_held_at_the_ends_pace`](Self::ask_held_at_the_ends_pace)).
    pub(in crate::stream) fn arm_tail_timers(&mut self, now: Instant) {
        let timeout = self.query_timeout();
        // A packet whose data loss would be reported may still lose its result, which only
        // results of later packets or its timer reveal, and at the end there are few later
        // packets: its timer is a result's timeout, without the retransmission timeout's floor.
        let result_timeout = self.timeout_of(&self.rtt);
        let racks_timer = self.asks_for_partial() && self.has(Rule::Rank0HeldAtEndPace);
        for slot in 0..self.slots.len() {
            let Some(out) = self.slots[slot].outstanding else {
                continue;
            };
            let queued = out.is_queued();
            if out.held == Held::Yes && racks_timer {
                if !queued {
                    self.ask_held_at_the_ends_pace(now, slot, out);
                }
                continue;
            }
            if queued || out.retries > 0 || !self.has(Rule::TailTimers) {
                continue;
            }
            let timeout = if self.loss_reportable(&out) {
                match result_timeout {
                    Some(t) => t,
                    None => continue,
                }
            } else {
                timeout
            };
            let deadline = out.deadline.min(out.last_sent + timeout);
            if deadline != out.deadline {
                self.slots[slot].outstanding = Some(Outstanding { deadline, ..out });
                self.timers.push(Reverse((deadline, out.index)));
            }
        }
    }

    /// Rank 0 of a rack, once every packet has gone: a use found held before (a Pending with
    /// this worker's bit) is asked about again a spacing of the stream's end after the Query
    /// that found it held, as a use found held from now on is
    /// ([`next_ask_after_held`](Self::next_ask_after_held)), not after the spacing set while
    /// packets were still going. Rank 0's Queries are its rack's only timer for a total lost
    /// on its way down (PROTOCOL.md §9), and the spacing set mid-stream, the path's timeout
    /// through the tree (at least twice its smoothed round trip), ran 47 µs after the
    /// Pending: traced at 32 racks of 32 and 1% loss (seed 1), two racks lost the total of a
    /// block's last slot at 1383.0 and 1387.7 µs, their ranks 0 had been told at 1396.8 µs
    /// that the use waited for its total, and asked again only at 1443.6 and 1444.1 µs, while
    /// every worker of those racks waited for that result (PROTOCOL.md §5, "The tail"). A
    /// fetch that a "complete" answer deferred is held too, and goes at the same pace.
    pub(in crate::stream) fn ask_held_at_the_ends_pace(
        &mut self,
        now: Instant,
        slot: usize,
        out: Outstanding,
    ) {
        let deadline = out.deadline.min(self.next_ask_after_held(now, &out));
        if deadline != out.deadline {
            self.slots[slot].outstanding = Some(Outstanding { deadline, ..out });
            self.timers.push(Reverse((deadline, out.index)));
        }
    }

    /// At the stream's end, the first transmission `last` of its block, whose loss no Missing
    /// report could reveal, is taken for lost: so are the reports it would have made. The
    /// packets sent to the block just before it, still unanswered and never sent again, are
    /// asked about at once, up to the reports' longest gap
    /// ([`crate::gap::MAX_REPORTED_GAP`]). The walk stops at one that was answered or sent
    /// again, whose own arrival would have revealed the losses before it. `expired` are
    /// packets whose timers this round handles already.
    ///
    /// The ask is a status Query, even once every packet has gone: it asks whether the data
    /// arrived (a Pending answer without this worker's bit sends it again), and most of these
    /// packets' results are only queued behind others on the downlink, where a fetch's copy
    /// would queue behind them.
    ///
    /// Their timers were a result's timeout, waiting for a report that cannot come: traced at
    /// 32 racks of 32 and 1% loss (seed 6), a worker lost its stream's last two first
    /// transmissions, the last went again 12 µs later, and the one before it only after 79
    /// µs, when the whole job waited for it (86.72 Gbit/s; 968 stall probes).
    pub(in crate::stream) fn ask_about_unrevealed_before(
        &mut self,
        last: &Outstanding,
        expired: &[u64],
    ) {
        let block = self.gap_block_of(last.index);
        let earliest = last
            .block_ordinal
            .saturating_sub(u64::from(crate::gap::MAX_REPORTED_GAP));
        for ordinal in (earliest..last.block_ordinal).rev() {
            let Some(index) = self.gap_blocks.get(block).map(|b| b.index_at(ordinal)) else {
                return;
            };
            let Some((slot, out)) = self.outstanding_at(index) else {
                break;
            };
            if out.retries > 0 || out.is_queued() || expired.contains(&index) {
                break;
            }
            self.queue_retransmission(slot, out, Retransmit::Unrevealed);
        }
    }
}
