//! The control protocol of the `ina` software switch, for whoever talks to one: the jobs an
//! operator writes ([`JobSpec`], [`UplinkSpec`], parsed from the `--job` syntax too), the JSON
//! lines of the control endpoint ([`Request`], [`Response`]), the statistics it answers with
//! ([`SwitchStats`]), and a blocking [`ControlClient`].
//!
//! The controller, tools and tests depend on this crate instead of the switch itself, so that
//! talking to a switch does not link one.
//!
//! What it must not do: serve anything (the endpoint is `ina-switch`'s `ControlServer`), open
//! any socket but the client's TCP stream, or depend on an async runtime or on the switch's
//! data path (pipeline shards, ports).

pub mod control;
pub mod job;
pub mod stats;

pub use control::{tokens_match, ControlClient, Request, Response};
pub use job::{JobKeys, JobParseError, JobSpec, UplinkKeys, UplinkSpec};
pub use stats::{IoStats, ShardStats, SwitchStats};
