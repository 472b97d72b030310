//! The controller's network API, version 1: HTTP/1.1 with JSON bodies.
//!
//! | method and path | body | answer |
//! |---|---|---|
//! | `GET /v1/health` | | [`Health`] |
//! | `GET /v1/switches` | | `[SwitchInfo]` |
//! | `POST /v1/switches` | [`SwitchSpec`] | [`SwitchInfo`], 201 |
//! | `POST /v1/switches/{name}/drain` | | [`SwitchInfo`] |
//! | `GET /v1/jobs` | | `[JobStatus]` |
//! | `POST /v1/jobs` | [`JobRequest`] | [`JobStatus`], 201 |
//! | `GET /v1/jobs/{name}` | | [`JobStatus`] |
//! | `DELETE /v1/jobs/{name}` | | 204 |
//! | `POST /v1/jobs/{name}/join` | [`JoinRequest`] | [`Joined`] |
//! | `POST /v1/jobs/{name}/heartbeat` | [`Heartbeat`] | [`JobStatus`] |
//!
//! An error is a status (400 a bad request, 401 a missing or wrong token, 404 no such switch
//! or job, 409 a name taken, 502 a switch that did not take a change) and an [`ErrorBody`].
//! When the controller listens beyond loopback every request carries `Authorization: Bearer
//! TOKEN`.

use ina_proto::alloc::{JobId, Policy, Range};
use ina_switch_p4::runtime::{MacAddr, SwitchDesc};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};

/// The path prefix of this version.
pub const PREFIX: &str = "/v1";

/// Longest switch or job name.
pub const MAX_NAME: usize = 64;

/// Most workers of a job on one switch (the switch's contributor bitmap).
pub const MAX_WORKERS: usize = 32;

/// Most workers in a job aggregated in a tree: 32 racks of 32 (the headroom that
/// `total_workers` quantizes with, PROTOCOL.md §9).
pub const MAX_TREE_WORKERS: usize = 1024;

/// A worker's rank in its job (up to [`MAX_TREE_WORKERS`]); on its switch it has a rank of
/// its own, below [`MAX_WORKERS`].
pub type Rank = u16;

/// What kind of switch a driver talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SwitchKind {
    /// `ina switch`, through its TCP control endpoint.
    #[default]
    Software,
    /// bmv2's `simple_switch` running the v1model program, through `simple_switch_CLI` (the
    /// control endpoint is its thrift server); needs [`SwitchSpec::p4`].
    Bmv2,
    /// A Tofino running the TNA program: the controller writes the switch's BfRt entries to
    /// the controller's Tofino directory, for the BfRt client on the switch to apply; needs
    /// [`SwitchSpec::p4`].
    Tofino,
}

impl std::fmt::Display for SwitchKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SwitchKind::Software => "software",
            SwitchKind::Bmv2 => "bmv2",
            SwitchKind::Tofino => "tofino",
        })
    }
}

/// A worker host behind a P4 switch: its IPv4 address and MAC (the port it is behind comes
/// from the switch's L2 table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct P4Host {
    pub ip: std::net::Ipv4Addr,
    pub mac: MacAddr,
}

/// What the controller must know of a P4 switch's data plane to install jobs on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct P4Spec {
    /// The switch's addresses, ports, L2 table and flood group (configured by the driver on
    /// a switch that holds none yet: a freshly started bmv2).
    pub switch: SwitchDesc,
    /// Where workers may be: a worker joins with an address listed here.
    pub hosts: Vec<P4Host>,
    // (No path or namespace: where a driver writes or runs is the controller's own
    // configuration, `service::LocalDrivers`, never a request's.)
}

/// Where a switch sits in the cluster (docs/CONTROLLER.md, "Topology"). A switch names the
/// switch it is under; an upper switch's racks are the switches that name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "role", deny_unknown_fields)]
pub enum Place {
    /// Not declared: a switch on its own, whose workers' hosts are not known.
    #[default]
    Unplaced,
    /// A rack switch: the rack's name, the hosts under it (their addresses, as workers join
    /// with them), and the upper switch it is under, if any.
    Rack {
        rack: String,
        hosts: Vec<IpAddr>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        under: Option<String>,
        /// The UDP address its upper switch sees it at, where that is not `data` (a switch
        /// with one address toward its hosts and another toward its upper switch).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        up_data: Option<SocketAddr>,
    },
    /// An upper switch: the rack switches (or upper switches) that name it are under it; it
    /// may itself be under another.
    Upper {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        under: Option<String>,
    },
    /// A software switch on a host, an aggregator for jobs the switches have no room for
    /// (BytePS's spare hosts): the host's address.
    Aggregator { host: IpAddr },
}

impl Place {
    /// Whether no place was declared.
    pub fn is_unplaced(&self) -> bool {
        *self == Place::Unplaced
    }

    /// The switch this one is under, if any.
    pub fn under(&self) -> Option<&str> {
        match self {
            Place::Rack { under, .. } | Place::Upper { under } => under.as_deref(),
            Place::Unplaced | Place::Aggregator { .. } => None,
        }
    }
}

/// A switch as an operator declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchSpec {
    pub name: String,
    #[serde(default)]
    pub kind: SwitchKind,
    /// Its control endpoint.
    pub control: SocketAddr,
    /// The UDP address its workers send to.
    pub data: SocketAddr,
    /// Slots in its pool (the software switch's `--pool-slots`, the P4 program's pool).
    pub slots: u16,
    /// Elements per slot (the software switch's `--max-elems`).
    pub elems_per_slot: u16,
    /// The control endpoint's access token, if it has one: sent with the switch when it is
    /// added, then kept by the controller apart from the spec, and never sent back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The data plane of a bmv2 or Tofino switch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p4: Option<P4Spec>,
    /// Where it sits in the cluster.
    #[serde(default, skip_serializing_if = "Place::is_unplaced")]
    pub place: Place,
}

impl SwitchSpec {
    /// A software switch (`ina switch`) with no token: its control endpoint, the address its
    /// workers send to, its `--pool-slots` and its `--max-elems`.
    pub fn software(
        name: &str,
        control: SocketAddr,
        data: SocketAddr,
        slots: u16,
        elems_per_slot: u16,
    ) -> SwitchSpec {
        SwitchSpec {
            name: name.into(),
            kind: SwitchKind::Software,
            control,
            data,
            slots,
            elems_per_slot,
            token: None,
            p4: None,
            place: Place::Unplaced,
        }
    }
}

/// Whether a switch takes new jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwitchState {
    /// Takes new jobs.
    Active,
    /// Keeps its jobs, takes no new ones.
    Draining,
}

/// A switch and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchInfo {
    pub spec: SwitchSpec,
    pub state: SwitchState,
    /// Slots no job holds, in whole blocks.
    pub free_slots: u16,
    /// Its jobs, placed or queued.
    pub jobs: Vec<String>,
}

/// A job as a user asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    pub name: String,
    /// The workers' addresses, in rank order (the switch accepts a rank's packets only from
    /// its address). Empty: the job has `size` workers, which join with their addresses
    /// (`POST /v1/jobs/{name}/join`), and it is installed once all have.
    #[serde(default)]
    pub workers: Vec<SocketAddr>,
    /// Workers in the job when `workers` is empty (up to [`MAX_TREE_WORKERS`] where the
    /// topology has racks under an upper switch).
    #[serde(default)]
    pub size: Option<u16>,
    pub elems_per_packet: u16,
    /// Slots it wants: its window, whole blocks of 64.
    pub window: u16,
    /// Slots it can run with, whole blocks (default: the window).
    #[serde(default)]
    pub min_window: Option<u16>,
    /// Higher first under the priority policy.
    #[serde(default)]
    pub priority: u8,
    /// The switch its workers are attached to (default: the first active switch with room).
    #[serde(default)]
    pub switch: Option<String>,
    /// When set, every worker sends a heartbeat at least this often, milliseconds; a job
    /// installed on its switch whose worker is silent for three periods fails: it is removed
    /// from the switch, its slots go to the others, and its workers' heartbeats are answered
    /// with the missing ranks.
    #[serde(default)]
    pub heartbeat_ms: Option<u32>,
}

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for slots.
    Queued,
    /// Holding slots on its switch.
    Running,
    /// A worker stopped sending heartbeats: see [`JobStatus::missing`].
    Failed,
}

/// A job and where it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStatus {
    pub request: JobRequest,
    /// The data plane's job number.
    pub id: JobId,
    pub switch: String,
    pub state: JobState,
    /// Its slots, while running.
    pub slots: Option<Range>,
    /// The epoch its switch installed it under, once installed.
    pub epoch: Option<u16>,
    /// Workers in the job.
    pub size: Rank,
    /// The workers' addresses known so far, by rank.
    pub members: Vec<(Rank, SocketAddr)>,
    /// When it failed: the ranks whose heartbeats stopped.
    #[serde(default)]
    pub missing: Vec<Rank>,
    /// Set while the controller moves the job to other slots (a resize, or a preemption):
    /// its workers start no tensor past this count until it clears, and report when they
    /// are parked at it (see `ina_worker::gate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park_at: Option<u64>,
    /// Why the job went to its switch (a host aggregator only where every switch in the
    /// network would make it queue).
    #[serde(default)]
    pub placement: String,
    /// A job aggregated in a tree: its parts on the rack switches (`switch` is then the
    /// upper switch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub racks: Vec<RackStatus>,
}

impl JobStatus {
    /// Whether it runs on every switch it needs: slots given and installed under an epoch,
    /// on its switch and on every rack switch of its tree.
    pub fn is_installed(&self) -> bool {
        self.state == JobState::Running
            && self.epoch.is_some()
            && self.racks.iter().all(|r| r.epoch.is_some())
    }
}

/// A tree job's part on one rack switch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RackStatus {
    pub switch: String,
    /// Its slots there, while placed (as many as on every other switch of the tree).
    pub slots: Option<Range>,
    /// The epoch the rack switch installed it under, once installed.
    pub epoch: Option<u16>,
    /// The rack switch's rank in the upper switch's job.
    pub up_rank: u8,
    /// The job's ranks under this rack switch, in their order there (rank `i` on the rack
    /// switch is `ranks[i]`).
    pub ranks: Vec<Rank>,
}

/// `POST /v1/jobs/{name}/heartbeat`: a worker is alive. Answered with the job (its state says
/// whether it failed, and `missing` which ranks went silent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    pub rank: Rank,
    /// Tensors this worker started so far (its gate's count), when it can be held.
    #[serde(default)]
    pub started: Option<u64>,
    /// Held at [`JobStatus::park_at`] and at it, with nothing in flight.
    #[serde(default)]
    pub parked: bool,
}

/// `POST /v1/jobs/{name}/join`: a worker's address, and the rank it wants (the lowest free
/// one if none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    #[serde(default)]
    pub rank: Option<Rank>,
    pub addr: SocketAddr,
    /// The joining worker's instance: a number drawn once per worker process. A rank of a
    /// tree job that joins again with a new instance once the job was installed starts a new
    /// run, for which the whole tree is installed afresh (an upper switch keeps the sums of
    /// the run before, which a rack switch cannot clear). The same instance joining again
    /// changes nothing.
    #[serde(default)]
    pub instance: Option<u64>,
}

/// What a worker that joined needs to run: everything but the epoch, which it learns from
/// the switch once the job is installed (see [`JobStatus::epoch`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Joined {
    /// The data plane's job number (the same on every switch of a tree).
    pub job: JobId,
    /// The worker's rank in the job (heartbeats name it).
    pub rank: Rank,
    /// Workers in the job: in a tree, every worker of every rack, which its results sum.
    pub workers: Rank,
    /// Its switch's UDP address (in a tree, its rack switch's).
    pub switch: SocketAddr,
    /// Its rank on that switch (what its packets carry).
    pub switch_rank: u8,
    /// Whether the job is aggregated in a tree: then its switch holds only some of the
    /// `workers`, and the worker quantizes with the headroom of all of them
    /// (`total_workers`, PROTOCOL.md §9). Known for certain once the job is installed.
    #[serde(default)]
    pub tree: bool,
    pub elems_per_packet: u16,
}

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub version: String,
    pub policy: Policy,
    pub switches: usize,
    pub jobs: usize,
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

/// Whether `name` may name a switch or a job: 1 to [`MAX_NAME`] characters of ASCII letters,
/// digits, `.`, `_` and `-`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}
