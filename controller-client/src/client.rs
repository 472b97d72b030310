//! A typed, blocking client of the controller's API (see [`crate::api`]).

use crate::api::{
    ErrorBody, Health, JobRequest, JobState, JobStatus, JoinRequest, Joined, Rank, SwitchInfo,
    SwitchSpec, PREFIX,
};
use serde::de::DeserializeOwned;
use std::time::Duration;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The controller answered with an error.
    #[error("controller: {message} (HTTP {status})")]
    Api { status: u16, message: String },
    /// The controller could not be reached.
    #[error("controller at {addr} unreachable: {message}")]
    Unreachable { addr: String, message: String },
    /// The job failed: these ranks stopped sending heartbeats.
    #[error("job {job:?} failed: ranks {missing:?} stopped sending heartbeats, and the controller removed it from its switch")]
    JobFailed { job: String, missing: Vec<Rank> },
    /// The job was not installed in time.
    #[error("job {job:?} not installed after {waited:?}: {joined} of {size} workers joined{}", if *queued { ", and it waits for slots" } else { "" })]
    NotReady {
        job: String,
        joined: usize,
        size: Rank,
        queued: bool,
        waited: Duration,
    },
    /// The answer was not what this version of the API sends.
    #[error("controller at {addr}: unexpected answer: {message}")]
    Decode { addr: String, message: String },
}

/// A client of one controller.
#[derive(Debug, Clone)]
pub struct Client {
    addr: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Client {
    /// A client of the controller at `addr` (`host:port`), sending `token` if given.
    pub fn new(addr: &str, token: Option<String>) -> Client {
        Client {
            addr: addr.to_string(),
            token,
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(5))
                .timeout(Duration::from_secs(60))
                .build(),
        }
    }

    pub fn health(&self) -> Result<Health, ClientError> {
        self.call("GET", "/health", None)
    }

    pub fn switches(&self) -> Result<Vec<SwitchInfo>, ClientError> {
        self.call("GET", "/switches", None)
    }

    pub fn add_switch(&self, spec: &SwitchSpec) -> Result<SwitchInfo, ClientError> {
        self.call("POST", "/switches", Some(to_value(spec)))
    }

    pub fn drain_switch(&self, name: &str) -> Result<SwitchInfo, ClientError> {
        self.call("POST", &format!("/switches/{}/drain", segment(name)), None)
    }

    pub fn jobs(&self) -> Result<Vec<JobStatus>, ClientError> {
        self.call("GET", "/jobs", None)
    }

    pub fn create_job(&self, req: &JobRequest) -> Result<JobStatus, ClientError> {
        self.call("POST", "/jobs", Some(to_value(req)))
    }

    pub fn job(&self, name: &str) -> Result<JobStatus, ClientError> {
        self.call("GET", &format!("/jobs/{}", segment(name)), None)
    }

    /// Joins job `name` from `addr`, as `rank` or the lowest free rank; `instance` names
    /// the worker process (see [`JoinRequest::instance`]).
    pub fn join(
        &self,
        name: &str,
        rank: Option<Rank>,
        addr: std::net::SocketAddr,
        instance: Option<u64>,
    ) -> Result<Joined, ClientError> {
        let req = JoinRequest {
            rank,
            addr,
            instance,
        };
        self.call(
            "POST",
            &format!("/jobs/{}/join", segment(name)),
            Some(to_value(&req)),
        )
    }

    /// Waits until job `name` is installed on its switch (every worker joined, slots given,
    /// an epoch known), up to `timeout`.
    pub fn wait_installed(&self, name: &str, timeout: Duration) -> Result<JobStatus, ClientError> {
        let start = std::time::Instant::now();
        loop {
            let j = self.job(name)?;
            if j.is_installed() {
                return Ok(j);
            }
            if j.state == JobState::Failed {
                return Err(ClientError::JobFailed {
                    job: name.to_string(),
                    missing: j.missing,
                });
            }
            if start.elapsed() >= timeout {
                return Err(ClientError::NotReady {
                    job: name.to_string(),
                    joined: j.members.len(),
                    size: j.size,
                    queued: j.state == JobState::Queued,
                    waited: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Reports rank `rank` of job `name` alive; returns the job, whose state says whether it
    /// failed (and `missing`, which ranks went silent).
    pub fn heartbeat(&self, name: &str, rank: Rank) -> Result<JobStatus, ClientError> {
        self.report(
            name,
            &crate::api::Heartbeat {
                rank,
                started: None,
                parked: false,
            },
        )
    }

    /// A heartbeat with the worker's gate (see [`crate::member`]).
    pub fn report(&self, name: &str, hb: &crate::api::Heartbeat) -> Result<JobStatus, ClientError> {
        self.call(
            "POST",
            &format!("/jobs/{}/heartbeat", segment(name)),
            Some(to_value(hb)),
        )
    }

    pub fn delete_job(&self, name: &str) -> Result<(), ClientError> {
        self.send("DELETE", &format!("/jobs/{}", segment(name)), None)
            .map(|_| ())
    }

    fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T, ClientError> {
        let r = self.send(method, path, body)?;
        r.into_json().map_err(|e| ClientError::Decode {
            addr: self.addr.clone(),
            message: e.to_string(),
        })
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<ureq::Response, ClientError> {
        let url = format!("http://{}{PREFIX}{path}", self.addr);
        let mut req = self.agent.request(method, &url);
        if let Some(t) = &self.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        let result = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        match result {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(status, r)) => {
                let message = r
                    .into_json::<ErrorBody>()
                    .map(|b| b.error)
                    .unwrap_or_else(|_| "no error message".into());
                Err(ClientError::Api { status, message })
            }
            Err(e) => Err(ClientError::Unreachable {
                addr: self.addr.clone(),
                message: e.to_string(),
            }),
        }
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

/// A name as one path segment (names are checked to be letters, digits, `.`, `_`, `-`; any
/// other byte is percent-encoded so that the server, not the URL, refuses it).
fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
