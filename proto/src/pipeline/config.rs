//! What the control plane installs: the switch's size, its jobs, and a job's uplink.

/// A switch port: on the software switch, one peer address; on Tofino, a front-panel port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortId(pub u16);

/// Size of the switch: the register file it allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Slots in the pool shared by all jobs (each slot has two shadow sets).
    pub pool_slots: u16,
    /// The largest elements-per-packet any job may use (64 or 256 on Tofino).
    pub max_elems: u16,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            pool_slots: 4096,
            max_elems: 256,
        }
    }
}

/// An epoch for a job's next install, from `entropy` (a clock, a counter, a process id, mixed
/// in here): never 0, never `previous`, and unlikely to be any earlier one, so that a packet
/// of an earlier install is refused as stale.
pub fn fresh_epoch(entropy: u64, previous: Option<u16>) -> u16 {
    let mut x = entropy;
    x ^= x >> 31;
    x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 32;
    let mut e = (x as u16).max(1);
    if Some(e) == previous {
        e = e.wrapping_add(1).max(1);
    }
    e
}

/// One job as the control plane installs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobConfig {
    pub job: u16,
    /// The job's generation; packets carrying another epoch are refused.
    pub epoch: u16,
    /// First slot of the job's range.
    pub slot_base: u16,
    /// Number of slots in the range.
    pub slot_count: u16,
    /// Elements per full data packet.
    pub elems_per_packet: u16,
    /// The port of each rank; `ranks.len()` is the number of workers (1..=32).
    pub ranks: Vec<PortId>,
    /// Set when this switch is the lower level of an aggregation tree for the job: each use's
    /// sum of the ranks above is a partial sum, sent as Data to the upper switch, and the
    /// total that comes back is what the ranks get (PROTOCOL.md §9). `None`: this switch
    /// finishes the sums itself.
    pub uplink: Option<Uplink>,
}

/// The upper switch of a job, as the lower switch sees it: where its partial sums go and
/// what they are called there. The lower switch is one rank of a job on the upper switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uplink {
    /// The port the upper switch is reached on (and answers from).
    pub port: PortId,
    /// The job's id on the upper switch.
    pub job: u16,
    /// The job's epoch on the upper switch.
    pub epoch: u16,
    /// This switch's rank in the upper switch's job.
    pub rank: u8,
    /// The first slot of the upper switch's job: slot `slot_base + i` here is slot
    /// `uplink.slot_base + i` there.
    pub slot_base: u16,
}

/// Why a job cannot be installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    #[error("job {0} is already installed")]
    Exists(u16),
    #[error("job {0} is not installed")]
    Unknown(u16),
    #[error("a job has 1 to 32 workers, got {0}")]
    Workers(usize),
    #[error("slots {base}..{end} do not fit the pool of {pool} slots")]
    OutOfPool { base: u16, end: u32, pool: u16 },
    #[error("an empty slot range")]
    NoSlots,
    #[error("slots {base}..{end} overlap job {other}")]
    Overlap { base: u16, end: u32, other: u16 },
    #[error("elements per packet must be 1..={max}, got {got}")]
    Elems { got: u16, max: u16 },
    #[error("port {0:?} serves two ranks of the job")]
    DuplicatePort(PortId),
    #[error("the uplink's port {0:?} also serves a rank of the job")]
    UplinkIsRank(PortId),
    #[error("the uplink's port {port:?} and job {job} already carry job {other}")]
    UplinkShared { port: PortId, job: u16, other: u16 },
}
