//! The worker's and the tools' side of the ina controller: the types of its HTTP/JSON API
//! ([`api`], versioned under `/v1`), a typed blocking [`client`], a worker's [`member`]ship of a
//! job (heartbeats and the gate the controller holds while it moves the job), and [`join`]ing
//! a job by name.
//!
//! What it must not do: serve anything or pull in an async runtime. A worker, the Python
//! package and the CLI link it; the controller daemon (`ina-controller`) sits on top.

pub mod api;
pub mod client;
pub mod join;
pub mod member;
