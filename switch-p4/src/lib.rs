//! The P4 data plane of `ina`, as programs generated from this crate, and their runtime
//! configuration.
//!
//! The counters the programs keep are `ina_proto::event::Event`'s, at its indices.
//!
//! What it must not do: run a switch or open a socket. It writes program text and control-plane
//! commands; the conformance suite (top-level `tests/`) runs them.

pub mod tna;
