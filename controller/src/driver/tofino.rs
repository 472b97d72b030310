//! The driver of a Tofino running the TNA program: it keeps the switch's whole configuration
//! (its data-plane description and its jobs) in one JSON document in the controller's Tofino
//! directory (`service::LocalDrivers::tofino_dir`, named for the switch), with
//! the BfRt entries that configuration takes (`ina_switch_p4::runtime::bfrt_entries`). The
//! BfRt client on the switch's CPU applies the entries; this repository has no Tofino to run
//! one against, so the document is where the driver's work ends.
//!
//! Every change rewrites the document whole (a temporary file, fsynced, then renamed over
//! it), so a reader sees either the configuration before a change or after it, never a mix.
//! What the switch holds is read back from the same document.

use super::p4::{job_desc, next_epoch, rank_of};
use super::{DriverError, Install, SwitchDriver};
use crate::alloc::{JobId, Range};
use crate::api::P4Spec;
use ina_switch_p4::runtime::{bfrt_entries, P4Job, SwitchDesc, TOFINO};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The document the driver writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BfrtDocument {
    pub switch: SwitchDesc,
    pub jobs: Vec<P4Job>,
    /// `bfrt_entries(switch, jobs)`: `{"entries": [...]}`.
    pub bfrt: serde_json::Value,
}

/// The driver of one Tofino switch.
#[derive(Debug)]
pub struct TofinoSwitch {
    /// The switch's BfRt endpoint, as the operator declared it (named in errors).
    addr: SocketAddr,
    p4: P4Spec,
    path: PathBuf,
}

impl TofinoSwitch {
    /// The driver of the Tofino described by `p4`, whose entries go to `path` (the controller
    /// names it; a request never does).
    pub fn new(addr: SocketAddr, p4: P4Spec, path: PathBuf) -> TofinoSwitch {
        TofinoSwitch { addr, p4, path }
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) -> DriverError {
        DriverError::Refused {
            addr: self.addr,
            message: format!("{what} {}: {e}", self.path.display()),
        }
    }

    /// The jobs the document holds (none if it does not exist yet).
    fn read(&self) -> Result<Vec<P4Job>, DriverError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice::<BfrtDocument>(&bytes)
                .map(|d| d.jobs)
                .map_err(|e| self.fail("reading", e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(self.fail("reading", e)),
        }
    }

    fn write(&self, jobs: Vec<P4Job>) -> Result<(), DriverError> {
        let bfrt = bfrt_entries(&self.p4.switch, &jobs).map_err(|e| self.fail("configuring", e))?;
        let doc = BfrtDocument {
            switch: self.p4.switch.clone(),
            jobs,
            bfrt,
        };
        let text = serde_json::to_vec_pretty(&doc).map_err(|e| self.fail("encoding", e))?;
        let tmp = self.path.with_extension("json.tmp");
        let written = (|| {
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        })();
        written.map_err(|e| self.fail("writing", e))
    }
}

impl SwitchDriver for TofinoSwitch {
    fn install(&self, job: &Install) -> Result<u16, DriverError> {
        let mut jobs = self.read()?;
        let previous = jobs.iter().find(|j| j.id == job.job).map(|j| j.epoch);
        jobs.retain(|j| j.id != job.job);
        let epoch = next_epoch(job.job, previous);
        let desc = job_desc(&TOFINO, &self.p4, job, epoch).map_err(|m| DriverError::Refused {
            addr: self.addr,
            message: m,
        })?;
        jobs.push(desc);
        jobs.sort_by_key(|j| j.id);
        self.write(jobs)?;
        tracing::info!(file = %self.path.display(), job = job.job, epoch, slots = ?job.slots, "job written to the Tofino's BfRt entries");
        Ok(epoch)
    }

    fn remove(&self, job: JobId) -> Result<(), DriverError> {
        let mut jobs = self.read()?;
        let before = jobs.len();
        jobs.retain(|j| j.id != job);
        if jobs.len() != before || !self.path.exists() {
            self.write(jobs)?;
        }
        Ok(())
    }

    fn installed(&self) -> Result<BTreeMap<JobId, Range>, DriverError> {
        // A switch new to the controller gets its own entries (address, L2, flooding) at once.
        if !self.path.exists() {
            self.write(Vec::new())?;
        }
        Ok(self
            .read()?
            .iter()
            .map(|j| {
                (
                    j.id,
                    Range {
                        base: j.slot_base,
                        count: j.slot_count,
                    },
                )
            })
            .collect())
    }

    fn check_worker(&self, addr: SocketAddr) -> Result<(), String> {
        rank_of(&self.p4, addr).map(|_| ())
    }
}
