//! What a switch counts, as the control endpoint's `stats` request answers it.

use ina_proto::pipeline::Counters;
use serde::{Deserialize, Serialize};

/// Socket counters of a shard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoStats {
    pub rx_datagrams: u64,
    pub rx_bytes: u64,
    pub rx_truncated: u64,
    pub rx_syscalls: u64,
    pub tx_datagrams: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
    pub tx_syscalls: u64,
}

impl IoStats {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &IoStats) {
        self.rx_datagrams += o.rx_datagrams;
        self.rx_bytes += o.rx_bytes;
        self.rx_truncated += o.rx_truncated;
        self.rx_syscalls += o.rx_syscalls;
        self.tx_datagrams += o.tx_datagrams;
        self.tx_bytes += o.tx_bytes;
        self.tx_errors += o.tx_errors;
        self.tx_syscalls += o.tx_syscalls;
    }
}

/// What one shard saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardStats {
    pub shard: usize,
    pub pipeline: Counters,
    pub io: IoStats,
    /// Slots of this shard with a use still collecting.
    pub busy_slots: usize,
    /// Datagrams from addresses no job lists (dropped by the pipeline too).
    pub unknown_source: u64,
    /// Truncated datagrams (larger than a receive slot), dropped.
    pub truncated: u64,
    pub injected_drops_in: u64,
    pub injected_drops_out: u64,
    /// Datagrams received for another shard's slots and handed to it.
    #[serde(default)]
    pub forwarded_out: u64,
    /// Datagrams handed over by other shards.
    #[serde(default)]
    pub forwarded_in: u64,
    /// Datagrams received for another shard's slots and dropped, because that shard's inbox
    /// was full (it is behind; the workers resend what was lost).
    #[serde(default)]
    pub forward_dropped: u64,
    /// Probes left unanswered while their job is reinstalled for a new worker.
    #[serde(default)]
    pub probes_held: u64,
    /// Probes of a new worker left unanswered because their job was reinstalled less than
    /// the switch's minimum interval between reinstalls before (the worker probes again).
    #[serde(default)]
    pub reinstalls_deferred: u64,
    /// Results of finished uses (the pipeline's `results_multicast`) sent to a worker's own
    /// address: one per worker and use for a job without a multicast group.
    #[serde(default)]
    pub results_to_workers: u64,
    /// Results of finished uses sent once to the job's multicast group.
    #[serde(default)]
    pub results_to_group: u64,
}

/// The whole switch: the sum over shards, and each shard.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchStats {
    pub total: ShardStats,
    pub shards: Vec<ShardStats>,
}

impl SwitchStats {
    /// The statistics of a switch from its shards': sorted by shard, and their sum (whose
    /// `shard` is the number of shards).
    pub fn from_shards(mut shards: Vec<ShardStats>) -> SwitchStats {
        shards.sort_by_key(|s| s.shard);
        let mut total = ShardStats::default();
        for s in &shards {
            total.pipeline.add(&s.pipeline);
            total.io.add(&s.io);
            total.busy_slots += s.busy_slots;
            total.unknown_source += s.unknown_source;
            total.truncated += s.truncated;
            total.injected_drops_in += s.injected_drops_in;
            total.injected_drops_out += s.injected_drops_out;
            total.forwarded_out += s.forwarded_out;
            total.forwarded_in += s.forwarded_in;
            total.forward_dropped += s.forward_dropped;
            total.probes_held += s.probes_held;
            total.reinstalls_deferred += s.reinstalls_deferred;
            total.results_to_workers += s.results_to_workers;
            total.results_to_group += s.results_to_group;
        }
        total.shard = shards.len();
        SwitchStats { total, shards }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The total is the sum of every shard's counts, the shards come out in order, and the
    /// total's `shard` is their number.
    #[test]
    fn the_total_sums_every_shard() {
        let one = ShardStats {
            shard: 1,
            forward_dropped: 3,
            busy_slots: 2,
            io: IoStats {
                rx_datagrams: 5,
                ..IoStats::default()
            },
            ..ShardStats::default()
        };
        let zero = ShardStats {
            shard: 0,
            forward_dropped: 20,
            results_to_group: 7,
            io: IoStats {
                rx_datagrams: 1,
                tx_errors: 4,
                ..IoStats::default()
            },
            ..ShardStats::default()
        };
        let s = SwitchStats::from_shards(vec![one, zero]);
        assert_eq!(s.shards.iter().map(|s| s.shard).collect::<Vec<_>>(), [0, 1]);
        let t = s.total;
        assert_eq!(
            (t.shard, t.forward_dropped, t.busy_slots, t.results_to_group),
            (2, 23, 2, 7)
        );
        assert_eq!((t.io.rx_datagrams, t.io.tx_errors), (6, 4));
    }

    /// Statistics of a switch that did not count `forward_dropped` yet still read.
    #[test]
    fn statistics_without_a_newer_counter_still_read() {
        let stats = ShardStats {
            forward_dropped: 9,
            probes_held: 2,
            ..ShardStats::default()
        };
        let mut json = serde_json::to_value(stats).expect("serializes");
        let fields = json.as_object_mut().expect("an object");
        assert!(fields.remove("forward_dropped").is_some());
        let old: ShardStats = serde_json::from_value(json).expect("reads");
        assert_eq!((old.forward_dropped, old.probes_held), (0, 2));
    }
}
