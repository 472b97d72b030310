//! The stream's end (docs/design/RECOVERY.md R10, `tail-timers`).

use crate::stream::recovery::Rule;
use crate::stream::slots::Outstanding;
use crate::stream::Stream;
use core::cmp::Reverse;

impl<'a> Stream<'a> {
    /// Once every packet has gone out (E10): a block's last first transmission gets the query
    /// timeout as its timer, the others the results' timeout.
    pub(in crate::stream) fn arm_tail_timers(&mut self) {
        if !self.has(Rule::TailTimers) {
            return;
        }
        let query_timeout = Some(self.query_timeout());
        let result_timeout = self.timeout_of(&self.rtt);
        for slot in 0..self.slots.len() {
            let out = self.slots[slot].outstanding;
            let Some(out) = out.filter(|o| !o.is_queued() && o.retries == 0) else {
                continue;
            };
            let timeout = if self.loss_reportable(&out) {
                result_timeout
            } else {
                query_timeout
            };
            let Some(timeout) = timeout else {
                continue;
            };
            let deadline = out.deadline.min(out.last_sent + timeout);
            if deadline != out.deadline {
                self.slots[slot].outstanding = Some(Outstanding { deadline, ..out });
                self.timers.push(Reverse((deadline, out.index)));
            }
        }
    }
}
