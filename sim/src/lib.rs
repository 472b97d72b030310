//! A deterministic simulator for `ina`: virtual time, a seeded random source and a virtual
//! network of links with latency, bandwidth, loss, duplication and reordering, driving the very
//! same `proto` state machines as the daemons (the switch [`Pipeline`](ina_proto::pipeline) and
//! worker [`Stream`](ina_proto::stream::Stream)s); and, a level above, [`cluster`]: a stream of jobs
//! sharing a switch's slot pool under the controller's allocator and its baselines; and
//! [`ceiling`]: the goodput no loss recovery by repair can beat on a topology, to read a run's
//! figures against.
//!
//! What it must not do: read a clock, open a socket or spawn a thread. A run is a pure function
//! of its [`Scenario`]: the same seed gives the same packets in the same order, so a failing
//! seed replays exactly.
#![forbid(unsafe_code)]

pub mod ceiling;
pub mod cluster;
pub mod data;
pub mod link;
pub mod ring;
pub mod rng;
pub mod run;

pub use ceiling::{Ceiling, CeilingError, CeilingModel};
pub use link::{LinkConfig, LinkStats};
pub use run::{
    run, Data, Injection, JobReport, Racks, Report, Scenario, SimJob, SparseData, WorkerReport,
    WorkerSpec, DEFAULT_NIC_QUEUE, UPLINK_PORT,
};
