//! The stream's end (docs/design/RECOVERY.md, "The tail"): once every packet has gone, no
//! later first transmission reveals a loss, and the job's end waits for every repair.

use crate::stream::recovery::{Retransmit, Rule};
use crate::stream::slots::Outstanding;
use crate::stream::Stream;
use core::cmp::Reverse;

impl<'a> Stream<'a> {
    /// Once every packet has gone out, no later first transmission will make the switch report
    /// the loss of a block's last one: those packets get the query timeout as their timer
    /// (a round trip or two, not a retransmission timeout), and go again when it expires. The
    /// link has room at the end of the stream, so a copy sent while the use merely waits for
    /// another worker costs nothing but its bytes, and its Pending answer turns the next
    /// attempts into Queries.
    pub(in crate::stream) fn arm_tail_timers(&mut self) {
        let timeout = self.query_timeout();
        // A packet whose data loss would be reported may still lose its result, which only
        // results of later packets or its timer reveal, and at the end there are few later
        // packets: its timer is a result's timeout, without the retransmission timeout's floor.
        let result_timeout = self.timeout_of(&self.rtt);
        for slot in 0..self.slots.len() {
            let Some(out) = self.slots[slot].outstanding else {
                continue;
            };
            if out.is_queued() || out.retries > 0 || !self.has(Rule::TailTimers) {
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

    /// At the stream's end, the first transmission `last` of its block, whose loss no report could
    /// reveal, was taken for lost: so are the reports its arrival would have made
    /// (R12, `unrevealed-before`). Up to [`crate::gap::MAX_REPORTED_GAP`] packets sent to the block
    /// just before it, unanswered and never resent, get a status Query; the walk stops at one that
    /// was answered or resent. `expired` are packets this round's timers handle already.
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
