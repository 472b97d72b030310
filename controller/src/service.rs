//! The controller's operations: change the state, save it, then bring the switches to it
//! through their drivers. A switch that cannot be reached keeps the change pending; every
//! [`Controller::resync`] brings each switch from what it holds to what the state wants, so a
//! restarted switch (which holds nothing) or a restarted controller is provisioned again
//! without ever giving one slot to two jobs.

use crate::alloc::{self, JobId, Policy, Range, Step};
use crate::api::SwitchKind;
use crate::api::{Health, JobInfo, JobRequest, JoinRequest, Joined, SwitchInfo, SwitchSpec};
use crate::driver::bmv2::Bmv2Switch;
use crate::driver::tofino::TofinoSwitch;
use crate::driver::{DriverError, Install, SoftwareSwitch, SwitchDriver};
use crate::state::{Change, State, StateError};
use crate::store::{Store, StoreError};
use std::collections::BTreeMap;
use std::path::PathBuf;

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
    /// What each switch holds, as last seen (its resync) or changed (a change it took), with
    /// the epoch when this controller installed it.
    holding: BTreeMap<String, BTreeMap<JobId, (Range, Option<u16>)>>,
    /// Jobs being moved to other slots, waiting for their workers to park.
    moving: BTreeMap<String, Moving>,
    /// The latest report of each job's ranks: tensors started (if the worker can be held)
    /// and whether it is parked.
    reports: BTreeMap<(String, u8), (Option<u64>, bool)>,
    counters: Counters,
}

/// A running job whose slots change: its workers are held at `park_at` tensors (the most any
/// of them reported), and the change waits until all are parked there.
#[derive(Debug, Clone, Copy)]
struct Moving {
    since: std::time::Instant,
    park_at: u64,
}

/// The longest a move waits for a job's workers to park before it is made anyway (the
/// tensors in flight then fail with `switch_restarted`, and the next ones run on the new
/// slots): at least this, and five heartbeat periods.
pub const MOVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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
    /// Running jobs moved to other slots with every worker parked between tensors.
    pub moves_live: u64,
    /// Running jobs moved without (workers that cannot be held, or did not park in time).
    pub moves_forced: u64,
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

/// Where the drivers of P4 switches write and run: the controller's own configuration (its
/// command line), never a request's, so that the API cannot make the controller write a file
/// or enter a namespace of a client's choosing.
#[derive(Debug, Clone, Default)]
pub struct LocalDrivers {
    /// The directory of the Tofino drivers' documents: switch NAME's is `NAME.json` here
    /// (switch names hold no path separator: [`crate::api::valid_name`]).
    pub tofino_dir: PathBuf,
    /// bmv2 switches whose runtime CLI runs in a network namespace: switch name, namespace.
    pub bmv2_netns: BTreeMap<String, String>,
}

/// The driver of each switch's kind, with the default [`LocalDrivers`] (Tofino documents in
/// the working directory, every bmv2 CLI in the controller's namespace).
pub fn drivers() -> DriverFactory {
    drivers_with(LocalDrivers::default())
}

/// The driver of each switch's kind: the software switch's control endpoint, bmv2's runtime
/// CLI, or the Tofino's BfRt entries, placed as `local` says.
pub fn drivers_with(local: LocalDrivers) -> DriverFactory {
    Box::new(
        move |spec: &SwitchSpec, token: Option<&str>| -> Box<dyn SwitchDriver> {
            match (spec.kind, spec.p4.clone()) {
                (SwitchKind::Bmv2, Some(p4)) => {
                    let netns = local.bmv2_netns.get(&spec.name).cloned();
                    Box::new(Bmv2Switch::new(spec.control, p4, netns))
                }
                (SwitchKind::Tofino, Some(p4)) => {
                    let path = local.tofino_dir.join(format!("{}.json", spec.name));
                    Box::new(TofinoSwitch::new(spec.control, p4, path))
                }
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
            holding: BTreeMap::new(),
            moving: BTreeMap::new(),
            reports: BTreeMap::new(),
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
        )
        .counter(
            "ina_controller_moves_live_total",
            "Running jobs moved to other slots with every worker parked between tensors.",
            c.moves_live,
        )
        .counter(
            "ina_controller_moves_forced_total",
            "Running jobs moved with tensors in flight (workers that cannot be held or did not park in time).",
            c.moves_forced,
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
            .filter_map(|n| self.job(n).ok())
            .collect()
    }

    pub fn job(&self, name: &str) -> Result<JobInfo, ControllerError> {
        let mut info = self
            .state
            .job_info(name)
            .ok_or_else(|| StateError::NoSuchJob(name.to_string()))?;
        info.park_at = self.moving.get(name).map(|m| m.park_at);
        Ok(info)
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
        self.state.create_job(request)?;
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
        self.bring(&switch)?;
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
        if !changes.is_empty() {
            self.bring(&switch)?;
        }
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

    /// A worker of job `name` is alive, has started `started` tensors (if it can be held) and
    /// is `parked` or not; returns the job (failed, if its peers went silent; with `park_at`
    /// while it is being moved). The report that completes a move's parking makes the move.
    pub fn heartbeat(
        &mut self,
        name: &str,
        hb: &crate::api::Heartbeat,
        now: std::time::Instant,
    ) -> Result<JobInfo, ControllerError> {
        let j = self.job(name)?;
        let rank = hb.rank;
        if rank >= j.size {
            return Err(StateError::BadRequest(format!(
                "job {name:?}: rank {rank}, but the job has {} workers",
                j.size
            ))
            .into());
        }
        self.heartbeats.insert((name.to_string(), rank), now);
        let before = self
            .reports
            .insert((name.to_string(), rank), (hb.started, hb.parked));
        self.counters.heartbeats += 1;
        if let Some(m) = self.moving.get_mut(name) {
            m.park_at = m.park_at.max(hb.started.unwrap_or(0));
            // The report that completes the parking makes the move at once (a preempted job
            // stays parked, and its reports change nothing until it runs again).
            let now_parked = (Some(m.park_at), true);
            if before != Some(now_parked) && self.parked(name, j.size) {
                if let Err(e) = self.resync_one(&j.switch) {
                    tracing::warn!(job = %name, error = %e, "moving the parked job");
                }
            }
        }
        self.job(name)
    }

    /// Whether every rank of a moving job reported itself parked at the move's count.
    fn parked(&self, name: &str, size: u8) -> bool {
        let Some(m) = self.moving.get(name) else {
            return false;
        };
        (0..size)
            .all(|r| self.reports.get(&(name.to_string(), r)) == Some(&(Some(m.park_at), true)))
    }

    /// Whether a change of a running job's slots can be made now: every worker is parked,
    /// or some worker cannot be held, or the wait ran out (the last two are counted as forced
    /// moves). If it cannot, the job is marked moving (its workers are told to park).
    fn may_move(&mut self, name: &str, size: u8, heartbeat_ms: u32) -> bool {
        let now = std::time::Instant::now();
        let unholdable =
            (0..size).any(|r| matches!(self.reports.get(&(name.to_string(), r)), Some((None, _))));
        if self.parked(name, size) {
            self.counters.moves_live += 1;
            return true;
        }
        let timeout = MOVE_TIMEOUT.max(std::time::Duration::from_millis(
            u64::from(heartbeat_ms) * 5,
        ));
        let reported = (0..size)
            .filter_map(|r| self.reports.get(&(name.to_string(), r)).and_then(|x| x.0))
            .max()
            .unwrap_or(0);
        if !self.moving.contains_key(name) {
            // A report of a worker parked came before this move, for the one before it: the
            // worker may have been released since and be running its next tensor. Only a
            // report made for this move says it is parked (a worker still held reports so
            // again within a held heartbeat period).
            for ((job, _), report) in self.reports.iter_mut() {
                if job == name {
                    report.1 = false;
                }
            }
        }
        let m = self.moving.entry(name.to_string()).or_insert(Moving {
            since: now,
            park_at: reported,
        });
        if unholdable || now.saturating_duration_since(m.since) >= timeout {
            tracing::warn!(job = %name, unholdable, "moving a running job without parking its workers: tensors in flight fail");
            self.counters.moves_forced += 1;
            return true;
        }
        false
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
            self.moving.remove(name);
            match self.state.fail_job(name, missing.clone()) {
                Ok(_) => {
                    self.counters.jobs_failed += 1;
                    let _ = self.save();
                    let switch = self.state.jobs.get(name).map(|j| j.switch.clone());
                    if let Err(e) = switch.map_or(Ok(()), |s| self.bring(&s)) {
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
        let switch = self.job(name)?.switch;
        self.state.delete_job(name)?;
        self.counters.jobs_deleted += 1;
        self.heartbeats.retain(|(job, _), _| job != name);
        self.reports.retain(|(job, _), _| job != name);
        self.moving.remove(name);
        self.save()?;
        tracing::info!(job = %name, "job deleted");
        self.bring(&switch)
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

    /// Asks a switch what it holds, then brings it to the state.
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
        // The epochs this controller installed under stand while the ranges do.
        let known = self.holding.remove(switch).unwrap_or_default();
        let held = held
            .into_iter()
            .map(|(id, r)| {
                let epoch = known
                    .get(&id)
                    .filter(|(k, _)| *k == r)
                    .and_then(|(_, e)| *e);
                (id, (r, epoch))
            })
            .collect();
        self.holding.insert(switch.to_string(), held);
        self.bring(switch)
    }

    /// Brings a switch from what it holds (as last seen) to what the state wants, every
    /// change ordered so that no slot is ever given to two jobs; a switch not seen yet is
    /// asked first.
    fn bring(&mut self, switch: &str) -> Result<(), ControllerError> {
        let Some(held) = self.holding.get(switch).cloned() else {
            return self.resync_one(switch);
        };
        let wanted = self.state.wanted(switch);
        // A job held with its wanted range keeps running; the state learns its epoch again
        // if a cancelled change had dropped it. One whose epoch nobody knows (the controller
        // stopped between installing it and saving) is installed again, to learn it.
        let mut from = BTreeMap::new();
        let mut changes = Vec::new();
        for (id, (r, epoch)) in &held {
            let wants = self
                .state
                .job_by_id(switch, *id)
                .map(|j| (j.slots, j.epoch));
            match wants {
                Some((Some(w), None)) if w == *r => match epoch {
                    Some(e) => {
                        self.state.installed(switch, *id, *e);
                        from.insert(*id, *r);
                    }
                    None => changes.push(Change {
                        switch: switch.to_string(),
                        step: Step::Remove(*id),
                    }),
                },
                _ => {
                    from.insert(*id, *r);
                }
            }
        }
        changes.extend(alloc::plan(&from, &wanted).into_iter().map(|step| Change {
            switch: switch.to_string(),
            step,
        }));
        if !changes.is_empty() {
            tracing::info!(
                switch,
                changes = changes.len(),
                "bringing the switch to the state"
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
            if !self.drivers.contains_key(&c.switch) {
                continue;
            }
            let fail = |source| ControllerError::Driver {
                switch: c.switch.clone(),
                source,
            };
            let (id, to) = match c.step {
                Step::Remove(id) => (id, None),
                Step::Set(id, slots) => (id, Some(slots)),
            };
            // A running job that can be held moves (or is preempted) between tensors: the
            // change, and every one after it (which may need its slots), waits for its
            // workers to park. A preempted job's workers stay parked until it runs again.
            let from = self
                .holding
                .get(&c.switch)
                .and_then(|h| h.get(&id))
                .map(|(r, _)| *r);
            if let Some(job) = self.state.job_by_id(&c.switch, id) {
                if let (Some(period), None, Some(from)) =
                    (job.request.heartbeat_ms, &job.failed, from)
                {
                    let (name, size) = (job.request.name.clone(), job.size());
                    if Some(from) != to && !self.may_move(&name, size, period) {
                        break;
                    }
                }
            }
            let install = match to {
                None => None,
                Some(slots) => {
                    let Some(job) = self.state.job_by_id(&c.switch, id) else {
                        continue;
                    };
                    // Not every worker has joined: its slots wait for it, uninstalled.
                    let Some(workers) = job.addresses() else {
                        continue;
                    };
                    Some(Install {
                        job: id,
                        slots,
                        elems_per_packet: job.request.elems_per_packet,
                        workers,
                    })
                }
            };
            let Some(driver) = self.drivers.get_mut(&c.switch) else {
                continue;
            };
            let done = match (c.step, install) {
                (Step::Remove(id), _) => driver.remove(id).map(|_| None),
                (Step::Set(id, _), Some(install)) => driver
                    .remove(id)
                    .and_then(|_| driver.install(&install))
                    .map(|epoch| Some((id, epoch))),
                (Step::Set(..), None) => continue,
            };
            match done {
                Ok(Some((id, epoch))) => {
                    self.counters.changes_applied += 1;
                    if let Step::Set(_, slots) = c.step {
                        self.holding
                            .entry(c.switch.clone())
                            .or_default()
                            .insert(id, (slots, Some(epoch)));
                    }
                    if let Some(name) = self
                        .state
                        .job_by_id(&c.switch, id)
                        .map(|j| j.request.name.clone())
                    {
                        if self.moving.remove(&name).is_some() {
                            tracing::info!(job = %name, slots = ?c.step, "running job moved");
                        }
                    }
                    self.state.installed(&c.switch, id, epoch)
                }
                Ok(None) => {
                    self.counters.changes_applied += 1;
                    if let Step::Remove(id) = c.step {
                        if let Some(h) = self.holding.get_mut(&c.switch) {
                            h.remove(&id);
                        }
                    }
                }
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
