//! The P4 data plane of `ina`, as programs generated from this crate, and their runtime
//! configuration.
//!
//! The counters the programs keep are `ina_proto::event::Event`'s, at its indices.
//!
//! - [`v1model`]: the bmv2 program; [`tna`]: the Tofino 1 program; [`runtime`]: one
//!   description of a switch and its jobs, emitted as `simple_switch_CLI` commands and Tofino
//!   BfRt entries; [`bmv2`]: compiling, starting, configuring and reading a `simple_switch`
//!   process.
//!
//! What it must not do: make a data-plane decision itself, or open a socket. The decisions are
//! the programs' (and `ina_proto`'s, which they mirror); the conformance suite (top-level
//! `tests/`) holds all of them to the same behaviour.

pub mod bmv2;
pub mod bmv2_cli;
mod common;
pub mod runtime;
pub mod tna;
pub mod v1model;
mod writer;
