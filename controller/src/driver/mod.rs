//! Switch drivers: how the controller changes one switch's data plane.
//!
//! - [`SoftwareSwitch`]: `ina switch`, through its TCP control endpoint (one JSON line per
//!   request); the switch picks each job's epoch.
//! - [`bmv2::Bmv2Switch`]: bmv2's `simple_switch` running the v1model program, through
//!   `simple_switch_CLI`'s runtime commands.
//! - [`tofino::TofinoSwitch`]: the Tofino program's BfRt entries, written as one document for
//!   the BfRt client on the switch.
//!
//! The P4 drivers describe each job with `ina_switch_p4::runtime` (the one description every
//! P4 target is configured from), checked against the target's limits before anything is
//! sent.

pub mod bmv2;
mod p4;
pub use p4::check_spec;
pub mod tofino;

use crate::alloc::{JobId, Range};
use ina_switch_api::{ControlClient, Request};
use ina_switch_api::{JobSpec, UplinkSpec};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// How long connecting to a software switch's control endpoint may take.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// How long one of its answers may take (installing a job waits for every shard).
pub const IO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// What installing a job on a switch takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    pub job: JobId,
    pub slots: Range,
    pub elems_per_packet: u16,
    /// The workers' addresses, in rank order (on a tree's upper switch, its rack switches').
    pub workers: Vec<SocketAddr>,
    /// On a tree's rack switch: the upper switch, and the job there (PROTOCOL.md §9).
    pub uplink: Option<UplinkSpec>,
}

/// Why a switch did not take a change.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("switch at {addr} unreachable: {source}")]
    Unreachable {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("switch at {addr} refused: {message}")]
    Refused { addr: SocketAddr, message: String },
}

/// One switch's data plane, as the controller changes it. The controller calls it from any
/// thread, one change at a time per switch, and never while it holds its own lock; only
/// [`check_worker`](Self::check_worker) is called under that lock, and must do no I/O.
pub trait SwitchDriver: Send + Sync {
    /// Installs a job on its slots; returns the epoch the switch gave it.
    fn install(&self, job: &Install) -> Result<u16, DriverError>;
    /// Removes a job; removing one the switch does not hold is not an error.
    fn remove(&self, job: JobId) -> Result<(), DriverError>;
    /// The jobs the switch holds now, with their slots.
    fn installed(&self) -> Result<BTreeMap<JobId, Range>, DriverError>;
    /// Whether a worker may join from `addr` (a P4 switch must know where the address
    /// lives); the answer says why not.
    fn check_worker(&self, addr: SocketAddr) -> Result<(), String> {
        let _ = addr;
        Ok(())
    }
}

/// The driver of `ina switch`, through its control endpoint.
pub struct SoftwareSwitch {
    addr: SocketAddr,
    token: Option<String>,
}

impl SoftwareSwitch {
    /// The driver of the switch whose control endpoint is `addr`, presenting `token` if set.
    pub fn new(addr: SocketAddr, token: Option<String>) -> SoftwareSwitch {
        SoftwareSwitch { addr, token }
    }

    fn call(&self, req: &Request) -> Result<ina_switch_api::Response, DriverError> {
        let unreachable = |source| DriverError::Unreachable {
            addr: self.addr,
            source,
        };
        // A read from a switch that never answers fails "would block" when it times out.
        let silent = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::WouldBlock => std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {IO_TIMEOUT:?}"),
            ),
            _ => e,
        };
        // Short: the requests that change this switch wait for it meanwhile.
        let mut c = ControlClient::connect_with_token_within(
            self.addr,
            self.token.as_deref(),
            CONNECT_TIMEOUT,
            IO_TIMEOUT,
        )
        .map_err(|e| unreachable(silent(e)))?;
        let r = c.call(req).map_err(|e| unreachable(silent(e)))?;
        if r.ok {
            Ok(r)
        } else {
            Err(DriverError::Refused {
                addr: self.addr,
                message: r.error.unwrap_or_else(|| "no reason given".into()),
            })
        }
    }
}

impl std::fmt::Debug for SoftwareSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftwareSwitch")
            .field("addr", &self.addr)
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .finish()
    }
}

impl SwitchDriver for SoftwareSwitch {
    fn install(&self, job: &Install) -> Result<u16, DriverError> {
        let spec = JobSpec {
            job: job.job,
            epoch: None,
            slot_base: job.slots.base,
            slot_count: job.slots.count,
            elems_per_packet: job.elems_per_packet,
            workers: job.workers.clone(),
            group: None,
            uplink: job.uplink,
        };
        let r = self.call(&Request::AddJob { job: spec })?;
        r.job
            .and_then(|j| j.epoch)
            .ok_or_else(|| DriverError::Refused {
                addr: self.addr,
                message: "the answer to add_job carried no epoch".into(),
            })
    }

    fn remove(&self, job: JobId) -> Result<(), DriverError> {
        match self.call(&Request::RemoveJob { job }) {
            Ok(_) => Ok(()),
            // Already gone (a restarted switch, or a removal retried).
            Err(DriverError::Refused { message, .. }) if message.contains("is not installed") => {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn installed(&self) -> Result<BTreeMap<JobId, Range>, DriverError> {
        let r = self.call(&Request::Jobs)?;
        Ok(r.jobs
            .unwrap_or_default()
            .into_iter()
            .map(|j| {
                (
                    j.job,
                    Range {
                        base: j.slot_base,
                        count: j.slot_count,
                    },
                )
            })
            .collect())
    }
}
