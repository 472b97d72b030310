//! The controller's operations: change the state, save it, then bring the switches to it
//! through their drivers. A switch that cannot be reached keeps the change pending; every
//! [`Controller::resync`] brings each switch from what it holds to what the state wants, so a
//! restarted switch (which holds nothing) or a restarted controller is provisioned again
//! without ever giving one slot to two jobs.

use crate::alloc::{self, Policy, Step};
use crate::api::SwitchKind;
use crate::api::{Health, JobInfo, JobRequest, JoinRequest, Joined, SwitchInfo, SwitchSpec};
use crate::driver::bmv2::Bmv2Switch;
use crate::driver::tofino::TofinoSwitch;
use crate::driver::{DriverError, Install, SoftwareSwitch, SwitchDriver};
use crate::state::{Change, State, StateError};
use crate::store::{Store, StoreError};
use std::collections::BTreeMap;

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("saving the state: {0}")]
    Store(#[from] StoreError),
    #[error(
        "the change is saved, but switch {switch:?} has not taken it yet (it is retried): {source}"
    )]
    Driver {
        switch: String,
        #[source]
        source: DriverError,
    },
    #[error("the saved state was made with the {saved} policy, not {asked}: start with --policy {saved} or move {path} away")]
    PolicyChanged {
        saved: Policy,
        asked: Policy,
        path: String,
    },
}

/// Makes the driver of a switch, from its spec and its control endpoint's token.
pub type DriverFactory = Box<dyn Fn(&SwitchSpec, Option<&str>) -> Box<dyn SwitchDriver> + Send>;

/// The controller: its state, where it is saved, and a driver per switch.
pub struct Controller {
    state: State,
    store: Option<Store>,
    drivers: BTreeMap<String, Box<dyn SwitchDriver>>,
    factory: DriverFactory,
    /// The latest heartbeat of each job's ranks (in memory: a restarted controller starts
    /// every clock afresh).
    heartbeats: BTreeMap<(String, u8), std::time::Instant>,
    /// Switches that could not be reached: when to try each again, and the wait after that.
    retry: BTreeMap<String, (std::time::Instant, std::time::Duration)>,
    counters: Counters,
}

/// What the controller has done since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub jobs_created: u64,
    pub jobs_deleted: u64,
    /// Jobs failed because a worker stopped sending heartbeats.
    pub jobs_failed: u64,
    pub joins: u64,
    pub heartbeats: u64,
    /// Data-plane changes a switch took (installs, removals).
    pub changes_applied: u64,
    /// Data-plane changes a switch did not take (retried by the resync).
    pub changes_failed: u64,
    /// Requests refused as invalid, or naming no such switch or job.
    pub requests_refused: u64,
}

/// The longest wait between two resyncs of an unreachable switch.
const MAX_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("state", &self.state)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// The driver of each switch's kind: the software switch's control endpoint, bmv2's runtime
/// CLI, or the Tofino's BfRt entries.
pub fn drivers() -> DriverFactory {
    Box::new(
        |spec: &SwitchSpec, token: Option<&str>| -> Box<dyn SwitchDriver> {
            match (spec.kind, spec.p4.clone()) {
                (SwitchKind::Bmv2, Some(p4)) => Box::new(Bmv2Switch::new(spec.control, p4)),
                (SwitchKind::Tofino, Some(p4)) => Box::new(TofinoSwitch::new(spec.control, p4)),
                // (A P4 switch without its description is refused before it gets a driver.)
                _ => Box::new(SoftwareSwitch::new(spec.control, token.map(str::to_string))),
            }
        },
    )
}

impl Controller {
    /// A controller with `policy`, whose state lives in `store` (loaded from it if saved
    /// before); `None` keeps it in memory only.
    pub fn open(
        policy: Policy,
        store: Option<Store>,
        factory: DriverFactory,
    ) -> Result<Controller, ControllerError> {
        let state = match store.as_ref().map(Store::load).transpose()?.flatten() {
            Some(saved) if saved.policy != policy => {
                return Err(ControllerError::PolicyChanged {
                    saved: saved.policy,
                    asked: policy,
                    path: store
                        .as_ref()
                        .map(|s| s.path().display().to_string())
                        .unwrap_or_default(),
                });
            }
            Some(saved) => saved,
            None => State::new(policy),
        };
        let mut c = Controller {
            state,
            store,
            drivers: BTreeMap::new(),
            factory,
            heartbeats: BTreeMap::new(),
            retry: BTreeMap::new(),
            counters: Counters::default(),
        };
        for s in c.state.switches.values() {
            let d = (c.factory)(&s.spec, s.token.as_deref());
            c.drivers.insert(s.spec.name.clone(), d);
        }
        Ok(c)
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Counts a request refused before it changed anything.
    pub fn refused(&mut self) {
        self.counters.requests_refused += 1;
    }

    /// The controller's counters and gauges in Prometheus' text format.
    pub fn metrics_text(&self) -> String {
        let c = &self.counters;
        let mut e = ina_io::metrics::Exposition::new();
        e.counter(
            "ina_controller_jobs_created_total",
            "Jobs created.",
            c.jobs_created,
        )
        .counter(
            "ina_controller_jobs_deleted_total",
            "Jobs deleted.",
            c.jobs_deleted,
        )
        .counter(
            "ina_controller_jobs_failed_total",
            "Jobs failed because a worker stopped sending heartbeats.",
            c.jobs_failed,
        )
        .counter("ina_controller_joins_total", "Workers joined.", c.joins)
        .counter(
            "ina_controller_heartbeats_total",
            "Heartbeats received.",
            c.heartbeats,
        )
        .counter(
            "ina_controller_changes_applied_total",
            "Data-plane changes the switches took.",
            c.changes_applied,
        )
        .counter(
            "ina_controller_changes_failed_total",
            "Data-plane changes a switch did not take (retried).",
            c.changes_failed,
        )
        .counter(
            "ina_controller_requests_refused_total",
            "Requests refused as invalid or naming nothing.",
            c.requests_refused,
        );
        let jobs = self.jobs();
        let count = |s: crate::api::JobState| jobs.iter().filter(|j| j.state == s).count() as f64;
        e.gauge(
            "ina_controller_jobs_running",
            "Jobs holding slots.",
            count(crate::api::JobState::Running),
        )
        .gauge(
            "ina_controller_jobs_queued",
            "Jobs waiting for slots.",
            count(crate::api::JobState::Queued),
        )
        .gauge(
            "ina_controller_jobs_failed",
            "Failed jobs not yet deleted.",
            count(crate::api::JobState::Failed),
        )
        .gauge(
            "ina_controller_switches",
            "Switches.",
            self.state.switches.len() as f64,
        )
        .gauge(
            "ina_controller_switches_unreachable",
            "Switches not reachable at their last resync.",
            self.retry.len() as f64,
        );
        let free: u64 = self
            .switches()
            .iter()
            .map(|s| u64::from(s.free_slots))
            .sum();
        e.gauge(
            "ina_controller_free_slots",
            "Slots no job holds, on every switch.",
            free as f64,
        );
        e.finish()
    }

    pub fn health(&self) -> Health {
        Health {
            version: crate::api::PREFIX.trim_start_matches('/').to_string(),
            policy: self.state.policy,
            switches: self.state.switches.len(),
            jobs: self.state.jobs.len(),
        }
    }

    pub fn switches(&self) -> Vec<SwitchInfo> {
        self.state
            .switches
            .keys()
            .filter_map(|n| self.state.switch_info(n))
            .collect()
    }

    pub fn jobs(&self) -> Vec<JobInfo> {
        self.state
            .jobs
            .keys()
            .filter_map(|n| self.state.job_info(n))
            .collect()
    }

    pub fn job(&self, name: &str) -> Result<JobInfo, ControllerError> {
        self.state
            .job_info(name)
            .ok_or_else(|| StateError::NoSuchJob(name.to_string()).into())
    }

    /// Adds a switch, and brings it to the state (it should hold no jobs of this controller's:
    /// any job it holds that the state does not place there is removed).
    pub fn add_switch(&mut self, spec: SwitchSpec) -> Result<SwitchInfo, ControllerError> {
        let name = spec.name.clone();
        let token = spec.token.clone();
        self.state.add_switch(spec.clone())?;
        self.save()?;
        self.drivers
            .insert(name.clone(), (self.factory)(&spec, token.as_deref()));
        tracing::info!(switch = %name, control = %spec.control, slots = spec.slots, "switch added");
        self.resync_one(&name)?;
        self.switch_info(&name)
    }

    /// Stops placing new jobs on a switch.
    pub fn drain_switch(&mut self, name: &str) -> Result<SwitchInfo, ControllerError> {
        self.state.drain_switch(name)?;
        self.save()?;
        tracing::info!(switch = %name, "switch draining");
        self.switch_info(name)
    }

    /// Creates a job and installs it (and the other jobs' new ranges) on its switch.
    pub fn create_job(&mut self, request: JobRequest) -> Result<JobInfo, ControllerError> {
        let name = request.name.clone();
        let workers = request.workers.clone();
        let changes = self.state.create_job(request)?;
        // Listed workers must be where the chosen switch can reach them (a P4 switch knows
        // its hosts); if not, the job is taken back before anything is saved or installed.
        let switch = self.job(&name)?.switch;
        if let Some(d) = self.drivers.get(&switch) {
            if let Some(why) = workers.iter().find_map(|a| d.check_worker(*a).err()) {
                let _ = self.state.delete_job(&name);
                return Err(StateError::BadRequest(format!(
                    "job {name:?}: switch {switch:?} refuses {why}"
                ))
                .into());
            }
        }
        self.counters.jobs_created += 1;
        self.save()?;
        self.apply(changes)?;
        let info = self.job(&name)?;
        tracing::info!(job = %name, id = info.id, switch = %info.switch, slots = ?info.slots, "job created");
        Ok(info)
    }

    /// A worker joins a job; once all have, the job is installed.
    pub fn join(&mut self, name: &str, req: JoinRequest) -> Result<Joined, ControllerError> {
        let switch = self.job(name)?.switch;
        if let Some(d) = self.drivers.get(&switch) {
            d.check_worker(req.addr).map_err(|why| {
                StateError::BadRequest(format!("job {name:?}: switch {switch:?} refuses {why}"))
            })?;
        }
        let (rank, changes) = self.state.join(name, req.rank, req.addr)?;
        self.counters.joins += 1;
        self.save()?;
        tracing::info!(job = %name, rank, addr = %req.addr, "worker joined");
        self.apply(changes)?;
        let j = self
            .state
            .jobs
            .get(name)
            .ok_or_else(|| StateError::NoSuchJob(name.to_string()))?;
        let switch = self
            .state
            .switches
            .get(&j.switch)
            .ok_or_else(|| StateError::NoSuchSwitch(j.switch.clone()))?;
        Ok(Joined {
            job: j.id,
            rank,
            workers: j.size(),
            switch: switch.spec.data,
            elems_per_packet: j.request.elems_per_packet,
        })
    }

    /// A worker of job `name` is alive; returns the job (failed, if its peers went silent).
    pub fn heartbeat(
        &mut self,
        name: &str,
        rank: u8,
        now: std::time::Instant,
    ) -> Result<JobInfo, ControllerError> {
        let j = self.job(name)?;
        if rank >= j.size {
            return Err(StateError::BadRequest(format!(
                "job {name:?}: rank {rank}, but the job has {} workers",
                j.size
            ))
            .into());
        }
        self.heartbeats.insert((name.to_string(), rank), now);
        self.counters.heartbeats += 1;
        Ok(j)
    }

    /// Fails every job installed on its switch with heartbeats whose rank has been silent for
    /// three heartbeat periods (counted from its latest heartbeat, or from when the job was
    /// first seen installed here). Returns the failed jobs and their missing ranks.
    pub fn check_members(&mut self, now: std::time::Instant) -> Vec<(String, Vec<u8>)> {
        let mut failing = Vec::new();
        for (name, j) in &self.state.jobs {
            let (Some(period), None, Some(_)) = (j.request.heartbeat_ms, &j.failed, j.epoch) else {
                continue;
            };
            let limit = std::time::Duration::from_millis(u64::from(period) * 3);
            let mut missing = Vec::new();
            for rank in 0..j.size() {
                let seen = *self.heartbeats.entry((name.clone(), rank)).or_insert(now);
                if now.saturating_duration_since(seen) > limit {
                    missing.push(rank);
                }
            }
            if !missing.is_empty() {
                failing.push((name.clone(), missing));
            }
        }
        for (name, missing) in &failing {
            tracing::warn!(job = %name, ?missing, "job failed: no heartbeat from these ranks");
            match self.state.fail_job(name, missing.clone()) {
                Ok(changes) => {
                    self.counters.jobs_failed += 1;
                    let _ = self.save();
                    if let Err(e) = self.apply(changes) {
                        tracing::warn!(job = %name, error = %e, "removing the failed job");
                    }
                }
                Err(e) => tracing::warn!(job = %name, error = %e, "failing the job"),
            }
        }
        failing
    }

    /// Deletes a job, frees its slots and gives them to the others on its switch.
    pub fn delete_job(&mut self, name: &str) -> Result<(), ControllerError> {
        let changes = self.state.delete_job(name)?;
        self.counters.jobs_deleted += 1;
        self.heartbeats.retain(|(job, _), _| job != name);
        self.save()?;
        tracing::info!(job = %name, "job deleted");
        self.apply(changes)
    }

    /// Brings every switch from what it holds to what the state wants; returns the switches
    /// that could not be reached, with why. A switch that could not be reached is tried again
    /// after a wait that doubles, from one period up to 30 s, so that a switch that is gone
    /// costs little (each attempt may wait for its connection timeout).
    pub fn resync(
        &mut self,
        now: std::time::Instant,
        period: std::time::Duration,
    ) -> Vec<(String, DriverError)> {
        let names: Vec<String> = self.drivers.keys().cloned().collect();
        let mut failed = Vec::new();
        for n in names {
            if self.retry.get(&n).is_some_and(|(at, _)| now < *at) {
                continue;
            }
            match self.resync_one(&n) {
                Err(ControllerError::Driver { switch, source }) => {
                    let wait = self
                        .retry
                        .get(&n)
                        .map_or(period, |(_, w)| (*w * 2).min(MAX_RETRY));
                    self.retry.insert(n, (now + wait, wait));
                    failed.push((switch, source));
                }
                _ => {
                    self.retry.remove(&n);
                }
            }
        }
        failed
    }

    /// The switches not reachable at their last resync.
    pub fn unreachable(&self) -> Vec<String> {
        self.retry.keys().cloned().collect()
    }

    fn resync_one(&mut self, switch: &str) -> Result<(), ControllerError> {
        let Some(driver) = self.drivers.get_mut(switch) else {
            return Ok(());
        };
        let held = driver
            .installed()
            .map_err(|source| ControllerError::Driver {
                switch: switch.to_string(),
                source,
            })?;
        let wanted = self.state.wanted(switch);
        // A job held with the wanted range but not known installed (the controller stopped
        // between the two) is installed again, to learn its epoch.
        let mut from = held.clone();
        for (id, r) in &held {
            let known = self.state.job_by_id(switch, *id);
            if known.is_none_or(|j| j.epoch.is_none() || j.slots != Some(*r)) {
                from.remove(id);
            }
        }
        let mut changes: Vec<Change> = held
            .keys()
            .filter(|id| !from.contains_key(id))
            .map(|id| Change {
                switch: switch.to_string(),
                step: Step::Remove(*id),
            })
            .collect();
        changes.extend(alloc::plan(&from, &wanted).into_iter().map(|step| Change {
            switch: switch.to_string(),
            step,
        }));
        if !changes.is_empty() {
            tracing::info!(
                switch,
                changes = changes.len(),
                "switch brought to the state"
            );
        }
        self.apply(changes)
    }

    /// Applies changes in order; stops at the first a switch does not take.
    fn apply(&mut self, changes: Vec<Change>) -> Result<(), ControllerError> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut result = Ok(());
        for c in changes {
            let Some(driver) = self.drivers.get_mut(&c.switch) else {
                continue;
            };
            let fail = |source| ControllerError::Driver {
                switch: c.switch.clone(),
                source,
            };
            let done = match c.step {
                Step::Remove(id) => driver.remove(id).map(|_| None),
                Step::Set(id, slots) => {
                    let Some(job) = self.state.job_by_id(&c.switch, id) else {
                        continue;
                    };
                    // Not every worker has joined: its slots wait for it, uninstalled.
                    let Some(workers) = job.addresses() else {
                        continue;
                    };
                    let install = Install {
                        job: id,
                        slots,
                        elems_per_packet: job.request.elems_per_packet,
                        workers,
                    };
                    driver
                        .remove(id)
                        .and_then(|_| driver.install(&install))
                        .map(|epoch| Some((id, epoch)))
                }
            };
            match done {
                Ok(Some((id, epoch))) => {
                    self.counters.changes_applied += 1;
                    self.state.installed(&c.switch, id, epoch)
                }
                Ok(None) => self.counters.changes_applied += 1,
                Err(e) => {
                    self.counters.changes_failed += 1;
                    tracing::warn!(switch = %c.switch, error = %e, "switch did not take a change");
                    result = Err(fail(e));
                    break;
                }
            }
        }
        self.save()?;
        result
    }

    fn save(&self) -> Result<(), ControllerError> {
        if let Some(s) = &self.store {
            s.save(&self.state)?;
        }
        Ok(())
    }

    fn switch_info(&self, name: &str) -> Result<SwitchInfo, ControllerError> {
        self.state
            .switch_info(name)
            .ok_or_else(|| StateError::NoSuchSwitch(name.to_string()).into())
    }
}
