//! The ina controller: makes switches a shared resource. It hands every job a contiguous range
//! of a switch's slots under a policy (first fit, max-min fair share, priority with
//! preemption), installs the job's isolation (its slots, its workers' addresses by rank, its
//! epoch) through a driver per switch, keeps its state in a file that survives restarts, and
//! brings every switch back to that state after either restarts. Users and tools reach it
//! through an HTTP/JSON API, versioned under `/v1` ([`api`]), with a typed client
//! ([`client`]).
//!
//! HTTP/JSON rather than gRPC: every request is a small document a person can read, send with
//! `curl` and see in a log; the build needs no protocol compiler; and the API's rate is a few
//! requests per job, far from where an encoding's cost shows.
//!
//! Every request carries an access token ([`token`]), on loopback too.
//!
//! What it must not do: touch a switch's data plane other than through a [`driver`], or give
//! one slot to two jobs at any instant ([`alloc::plan`] orders every change so).
//! [`alloc`], [`state`] and [`topology`] are pure: no I/O, no clock.

pub use ina_controller_client::{api, client, member};
/// The slot allocator, pure, in `ina-proto` so that the simulator runs it too.
pub use ina_proto::alloc;
pub mod driver;
pub mod server;
pub mod service;
pub mod state;
pub mod store;
pub mod token;
pub mod topology;
