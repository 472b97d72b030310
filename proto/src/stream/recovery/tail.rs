//! The stream's end (docs/design/RECOVERY.md R10): once every packet has gone, no
//! later first transmission reveals a loss, and the job's end waits for every repair.

use crate::stream::recovery::Rule;
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
}
