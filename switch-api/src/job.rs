//! Jobs as an operator writes them: workers by address.

use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, SocketAddrV4};

/// A job as an operator writes it: workers by address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub job: u16,
    /// The epoch; `None` lets the switch pick a fresh one (different on every install).
    #[serde(default)]
    pub epoch: Option<u16>,
    pub slot_base: u16,
    pub slot_count: u16,
    pub elems_per_packet: u16,
    /// Worker `r`'s UDP address is `workers[r]`.
    pub workers: Vec<SocketAddr>,
    /// A multicast group every worker of the job has joined: each finished result is sent
    /// once, to the group, instead of once to every worker (as a hardware switch's packet
    /// replication does). Answers to retransmissions still go to the one worker that asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<SocketAddrV4>,
    /// This switch is the lower level of an aggregation tree for the job: each finished sum of
    /// `workers` is a partial sum, sent to the upper switch as one rank of its job, and the
    /// total it sends back goes to the workers (PROTOCOL.md §9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uplink: Option<UplinkSpec>,
}

impl JobSpec {
    /// Job `job` on slots `0..slot_count`, `elems_per_packet` elements per packet, its
    /// workers' addresses in rank order; the switch picks its epoch; results go to each
    /// worker; no upper switch.
    pub fn new(
        job: u16,
        slot_count: u16,
        elems_per_packet: u16,
        workers: Vec<SocketAddr>,
    ) -> JobSpec {
        JobSpec {
            job,
            epoch: None,
            slot_base: 0,
            slot_count,
            elems_per_packet,
            workers,
            group: None,
            uplink: None,
        }
    }

    /// Every address the job exchanges packets with: its workers, then its upper switch.
    pub fn addresses(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.workers
            .iter()
            .copied()
            .chain(self.uplink.as_ref().map(|u| u.addr))
    }
}

/// The upper switch of a job, as an operator writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UplinkSpec {
    /// The upper switch's UDP address.
    pub addr: SocketAddr,
    /// The job's id on the upper switch (default: the same id).
    #[serde(default)]
    pub job: Option<u16>,
    /// This switch's rank in the upper switch's job: the upper switch lists this switch's
    /// address as that rank's worker.
    pub rank: u8,
    /// The job's epoch on the upper switch, which must therefore be installed there with this
    /// epoch given (not one the upper switch picks).
    pub epoch: u16,
    /// The first slot of the job on the upper switch (default: the same as here). With
    /// several shards, the two ranges must be a whole number of shard strides (64 slots
    /// times the shards) apart, so that a total reaches the shard that holds its use.
    #[serde(default)]
    pub slot_base: Option<u16>,
}
