//! Joining a job by name: the worker binds its port (its address is its identity on the
//! switch), asks the controller for a rank in the job, and waits until every worker joined and
//! the job is installed. What comes back is all a communicator needs: the bound port, the
//! switch, the job number, the rank and the number of workers.

use crate::api::{JobStatus, Joined};
use crate::client::{Client, ClientError};
use ina_io::{Port, UdpConfig, UdpPort};
use std::net::SocketAddr;
use std::time::Duration;

/// Why joining failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The worker's address is not one the switch could name it by.
    #[error("bind address {0}: a worker's address is its identity on the switch; bind its own IP (and a port, or 0 for any)")]
    UnspecifiedBind(SocketAddr),
    /// The port could not be bound.
    #[error("binding {addr}: {message}")]
    Bind { addr: SocketAddr, message: String },
    /// The controller refused, could not be reached, or the job was not installed in time.
    #[error(transparent)]
    Controller(#[from] ClientError),
}

/// A worker that joined its job, with its bound port.
#[derive(Debug)]
pub struct JoinedJob {
    pub port: UdpPort,
    /// The rank, the job's number and size, the switch.
    pub joined: Joined,
    /// The job as installed: its slots, epoch and members.
    pub job: JobStatus,
}

impl JoinedJob {
    /// The heartbeat period the job asked for, if it did.
    pub fn heartbeat(&self) -> Option<Duration> {
        self.job
            .request
            .heartbeat_ms
            .map(|ms| Duration::from_millis(u64::from(ms.max(1))))
    }
}

/// Binds `bind`, joins job `name` as `rank` (or the lowest free rank) and waits up to `timeout`
/// for the job to be installed. The worker's rank on its switch, and whether the job is a
/// tree, are final only then: they are asked again once it is.
pub fn join(
    client: &Client,
    name: &str,
    rank: Option<crate::api::Rank>,
    bind: SocketAddr,
    udp: &UdpConfig,
    timeout: Duration,
) -> Result<JoinedJob, JoinError> {
    if bind.ip().is_unspecified() {
        return Err(JoinError::UnspecifiedBind(bind));
    }
    let port = UdpPort::bind_with(bind, udp).map_err(|e| JoinError::Bind {
        addr: bind,
        message: e.to_string(),
    })?;
    let instance = Some(instance());
    let joined = client.join(name, rank, port.local_addr(), instance)?;
    let job = client.wait_installed(name, timeout)?;
    // The same address and instance again: changes nothing, tells what is final now.
    let joined = client.join(name, Some(joined.rank), port.local_addr(), instance)?;
    Ok(JoinedJob { port, joined, job })
}

/// A number for this joining, different from any other worker process's with near
/// certainty: the process id and the clock, through a randomly keyed hash.
fn instance() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.write_u128(now.as_nanos());
    h.finish()
}
