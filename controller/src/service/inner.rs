//! What the controller knows, under its one lock: the state, what each switch holds, the
//! workers' heartbeats and reports, the moves in progress and the counters.
//!
//! Nothing here waits for a switch. [`Inner::next_action`] plans one change to a switch; the
//! caller makes it through the switch's driver with the lock released, then records what the
//! switch answered with [`Inner::commit`] (or [`Inner::failed`]), which checks the answer
//! against the state as it is by then. So the lock is only ever held for bookkeeping and the
//! state file, and a heartbeat never waits for a switch.

use super::{ControllerError, Counters, DriverFactory, MOVE_TIMEOUT};
use crate::alloc::{self, JobId, Policy, Range, Step};
use crate::api::{Health, Heartbeat, JobRequest, JobState, JobStatus, JoinRequest, Joined, Rank};
use crate::api::{SwitchInfo, SwitchSpec};
use crate::driver::{DriverError, Install, SwitchDriver};
use crate::state::{State, StateError};
use crate::store::Store;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest wait between two resyncs of an unreachable switch.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// A switch's driver and its turn: the changes to one switch are made one at a time, each
/// planned from what the one before left.
pub(super) struct Link {
    pub(super) driver: Box<dyn SwitchDriver>,
    pub(super) turn: Mutex<()>,
}

/// One change to a switch, planned under the lock and made outside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Action {
    /// Ask the switch what it holds.
    Read,
    /// Take a job off.
    Remove(JobId),
    /// Install a job (taking off what the switch holds of it first).
    Install(Install),
}

/// What the switch did.
#[derive(Debug)]
pub(super) enum Done {
    Holds(BTreeMap<JobId, Range>),
    Removed(JobId),
    Installed(Install, u16),
}

impl Action {
    /// Makes the change through `driver` (blocking I/O: never under the lock).
    pub(super) fn perform(self, driver: &dyn SwitchDriver) -> Result<Done, DriverError> {
        match self {
            Action::Read => driver.installed().map(Done::Holds),
            Action::Remove(id) => driver.remove(id).map(|()| Done::Removed(id)),
            Action::Install(install) => {
                driver.remove(install.job)?;
                let epoch = driver.install(&install)?;
                Ok(Done::Installed(install, epoch))
            }
        }
    }
}

/// A running job whose slots change: its workers are held at `park_at` tensors (the most any
/// of them reported), and the change waits until all are parked there.
#[derive(Debug, Clone, Copy)]
struct Moving {
    since: Instant,
    park_at: u64,
}

pub(super) struct Inner {
    state: State,
    store: Option<Store>,
    links: BTreeMap<String, Arc<Link>>,
    factory: DriverFactory,
    /// The latest heartbeat of each job's ranks (in memory: a restarted controller starts
    /// every clock afresh).
    heartbeats: BTreeMap<(String, Rank), Instant>,
    /// Switches that could not be reached: when to try each again, and the wait after that.
    retry: BTreeMap<String, (Instant, Duration)>,
    /// What each switch holds, as last seen (its resync) or changed (a change it took), with
    /// the epoch when this controller installed it.
    holding: BTreeMap<String, BTreeMap<JobId, (Range, Option<u16>)>>,
    /// Jobs being moved to other slots, waiting for their workers to park.
    moving: BTreeMap<String, Moving>,
    /// The latest report of each job's ranks: tensors started (if the worker can be held)
    /// and whether it is parked.
    reports: BTreeMap<(String, Rank), (Option<u64>, bool)>,
    /// Switches whose changes wait on one just made elsewhere (a tree's rack switches, once
    /// its upper switch installed it under a new epoch): to be brought to the state next.
    follow: BTreeSet<String>,
    counters: Counters,
}

impl Inner {
    /// The controller's knowledge, from `store` if it was saved there before.
    pub(super) fn open(
        policy: Policy,
        store: Option<Store>,
        factory: DriverFactory,
    ) -> Result<Inner, ControllerError> {
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
        let mut inner = Inner {
            state,
            store,
            links: BTreeMap::new(),
            factory,
            heartbeats: BTreeMap::new(),
            retry: BTreeMap::new(),
            holding: BTreeMap::new(),
            moving: BTreeMap::new(),
            reports: BTreeMap::new(),
            follow: BTreeSet::new(),
            counters: Counters::default(),
        };
        let switches: Vec<(SwitchSpec, Option<String>)> = inner
            .state
            .switches
            .values()
            .map(|s| (s.spec.clone(), s.token.clone()))
            .collect();
        for (spec, token) in switches {
            inner.link_switch(&spec, token.as_deref());
        }
        Ok(inner)
    }

    fn link_switch(&mut self, spec: &SwitchSpec, token: Option<&str>) {
        let link = Link {
            driver: (self.factory)(spec, token),
            turn: Mutex::new(()),
        };
        self.links.insert(spec.name.clone(), Arc::new(link));
    }

    pub(super) fn state(&self) -> &State {
        &self.state
    }

    pub(super) fn counters(&self) -> Counters {
        self.counters
    }

    pub(super) fn refused(&mut self) {
        self.counters.requests_refused += 1;
    }

    pub(super) fn link(&self, switch: &str) -> Option<Arc<Link>> {
        self.links.get(switch).cloned()
    }

    pub(super) fn switch_names(&self) -> Vec<String> {
        self.links.keys().cloned().collect()
    }

    pub(super) fn health(&self) -> Health {
        Health {
            version: crate::api::PREFIX.trim_start_matches('/').to_string(),
            policy: self.state.policy,
            switches: self.state.switches.len(),
            jobs: self.state.jobs.len(),
        }
    }

    pub(super) fn switches(&self) -> Vec<SwitchInfo> {
        self.state
            .switches
            .keys()
            .filter_map(|n| self.state.switch_info(n))
            .collect()
    }

    pub(super) fn switch_info(&self, name: &str) -> Result<SwitchInfo, ControllerError> {
        self.state
            .switch_info(name)
            .ok_or_else(|| StateError::NoSuchSwitch(name.to_string()).into())
    }

    pub(super) fn jobs(&self) -> Vec<JobStatus> {
        self.state
            .jobs
            .keys()
            .filter_map(|n| self.job(n).ok())
            .collect()
    }

    pub(super) fn job(&self, name: &str) -> Result<JobStatus, ControllerError> {
        let mut info = self
            .state
            .job_info(name)
            .ok_or_else(|| StateError::NoSuchJob(name.to_string()))?;
        info.park_at = self.moving.get(name).map(|m| m.park_at);
        Ok(info)
    }

    fn save(&self) -> Result<(), ControllerError> {
        if let Some(s) = &self.store {
            s.save(&self.state)?;
        }
        Ok(())
    }

    /// Adds a switch to the state and gives it a driver.
    pub(super) fn add_switch(&mut self, spec: SwitchSpec) -> Result<(), ControllerError> {
        let token = spec.token.clone();
        self.state.add_switch(spec.clone())?;
        self.save()?;
        self.link_switch(&spec, token.as_deref());
        tracing::info!(switch = %spec.name, control = %spec.control, slots = spec.slots, "switch added");
        Ok(())
    }

    pub(super) fn drain_switch(&mut self, name: &str) -> Result<SwitchInfo, ControllerError> {
        self.state.drain_switch(name)?;
        self.save()?;
        tracing::info!(switch = %name, "switch draining");
        self.switch_info(name)
    }

    /// Creates a job in the state; returns its switch.
    pub(super) fn create_job(&mut self, request: JobRequest) -> Result<String, ControllerError> {
        let name = request.name.clone();
        let workers = request.workers.clone();
        self.state.create_job(request)?;
        // Listed workers must be where the chosen switch can reach them (a P4 switch knows
        // its hosts); if not, the job is taken back before anything is saved or installed.
        let switch = self.job(&name)?.switch;
        if let Some(why) = self.refusal(&switch, &workers) {
            let _ = self.state.delete_job(&name);
            return Err(StateError::BadRequest(format!(
                "job {name:?}: switch {switch:?} refuses {why}"
            ))
            .into());
        }
        self.counters.jobs_created += 1;
        self.save()?;
        Ok(switch)
    }

    /// Why `switch` refuses one of `workers`, if it does (no I/O: a P4 switch's hosts).
    fn refusal(&self, switch: &str, workers: &[std::net::SocketAddr]) -> Option<String> {
        let link = self.links.get(switch)?;
        workers
            .iter()
            .find_map(|a| link.driver.check_worker(*a).err())
    }

    /// A worker joins job `name`; returns its rank and the switches that have changes to
    /// take (the job's membership is complete, or it is installed afresh), in the order to
    /// bring them (a tree's upper switch first).
    pub(super) fn join(
        &mut self,
        name: &str,
        req: &JoinRequest,
    ) -> Result<(Rank, Vec<String>), ControllerError> {
        if let Some(switch) = self.state.worker_switch(name, req.rank, req.addr) {
            if let Some(why) = self.refusal(&switch, &[req.addr]) {
                return Err(StateError::BadRequest(format!(
                    "job {name:?}: switch {switch:?} refuses {why}"
                ))
                .into());
            }
        }
        let before = self.state.clone();
        let (rank, changes) = self.state.join(name, req.rank, req.addr, req.instance)?;
        // A tree the switches would refuse (a P4 switch knows its hosts) is not placed.
        if let Some(why) = self.tree_refusal(name) {
            self.state = before;
            return Err(StateError::BadRequest(format!("job {name:?}: {why}")).into());
        }
        // The installations the state no longer stands by are taken off and made again.
        for c in &changes {
            if let Step::Set(id, _) = c.step {
                self.forget_epoch(&c.switch, id);
            }
        }
        self.counters.joins += 1;
        self.save()?;
        tracing::info!(job = %name, rank, addr = %req.addr, "worker joined");
        Ok((rank, self.switches_of(&changes)))
    }

    /// Why a switch of job `name`'s tree would refuse it, if one would (no I/O): its upper
    /// switch the rack switches' addresses, or a rack switch its upper switch's.
    fn tree_refusal(&self, name: &str) -> Option<String> {
        let j = self.state.jobs.get(name).filter(|j| j.is_tree())?;
        let racks: Vec<std::net::SocketAddr> = j
            .racks
            .keys()
            .filter_map(|r| self.state.seen_from_above(r))
            .collect();
        if let Some(why) = self.refusal(&j.switch, &racks) {
            return Some(format!(
                "its upper switch {:?} refuses a rack switch: {why}",
                j.switch
            ));
        }
        let upper = self.state.switches.get(&j.switch)?.spec.data;
        j.racks.keys().find_map(|rack| {
            self.refusal(rack, &[upper]).map(|why| {
                format!("rack switch {rack:?} refuses its upper switch's address: {why}")
            })
        })
    }

    /// The switches `changes` touch, each once, in their order.
    fn switches_of(&self, changes: &[crate::state::Change]) -> Vec<String> {
        let mut seen = BTreeSet::new();
        changes
            .iter()
            .filter(|c| seen.insert(c.switch.clone()))
            .map(|c| c.switch.clone())
            .collect()
    }

    /// Marks job `id` on `switch` as held under an epoch nobody keeps: the next plan takes
    /// it off and installs it again.
    fn forget_epoch(&mut self, switch: &str, id: JobId) {
        if let Some((_, epoch)) = self.holding.get_mut(switch).and_then(|h| h.get_mut(&id)) {
            *epoch = None;
        }
    }

    /// Records that job `id` runs on `switch` under `epoch`. The rack switches of a tree whose
    /// upper switch this is and whose uplinks name another epoch are brought next.
    fn learn_epoch(&mut self, switch: &str, id: JobId, epoch: u16) {
        for rack in self.state.installed(switch, id, epoch) {
            self.forget_epoch(&rack, id);
            self.follow.insert(rack);
        }
    }

    /// The switches to bring to the state after the ones just brought.
    pub(super) fn take_follow(&mut self) -> Vec<String> {
        std::mem::take(&mut self.follow).into_iter().collect()
    }

    /// What a worker that joined job `name` as `rank` is told.
    pub(super) fn joined(&self, name: &str, rank: Rank) -> Result<Joined, ControllerError> {
        let j = self
            .state
            .jobs
            .get(name)
            .ok_or_else(|| StateError::NoSuchJob(name.to_string()))?;
        let (switch, switch_rank) = match j.seats.get(&rank) {
            Some(seat) => (seat.switch.clone(), seat.rank),
            None => (j.switch.clone(), rank as u8),
        };
        let switch = self
            .state
            .switches
            .get(&switch)
            .ok_or_else(|| StateError::NoSuchSwitch(switch.clone()))?;
        Ok(Joined {
            job: j.id,
            rank,
            workers: j.size(),
            switch: switch.spec.data,
            switch_rank,
            tree: j.is_tree(),
            elems_per_packet: j.request.elems_per_packet,
        })
    }

    /// Deletes a job from the state; returns the switches that change.
    pub(super) fn delete_job(&mut self, name: &str) -> Result<Vec<String>, ControllerError> {
        let changes = self.state.delete_job(name)?;
        let switches = self.switches_of(&changes);
        self.counters.jobs_deleted += 1;
        self.heartbeats.retain(|(job, _), _| job != name);
        self.reports.retain(|(job, _), _| job != name);
        self.moving.remove(name);
        self.save()?;
        tracing::info!(job = %name, "job deleted");
        Ok(switches)
    }

    /// Records a heartbeat, now; returns the job, and its switch if this report completed
    /// the parking of a move (which the caller then makes, apart from the heartbeat).
    pub(super) fn heartbeat(
        &mut self,
        name: &str,
        hb: &Heartbeat,
    ) -> Result<(JobStatus, Option<String>), ControllerError> {
        let j = self.job(name)?;
        let rank = hb.rank;
        if rank >= j.size {
            return Err(StateError::BadRequest(format!(
                "job {name:?}: rank {rank}, but the job has {} workers",
                j.size
            ))
            .into());
        }
        self.heartbeats
            .insert((name.to_string(), rank), Instant::now());
        let before = self
            .reports
            .insert((name.to_string(), rank), (hb.started, hb.parked));
        self.counters.heartbeats += 1;
        let mut completes = false;
        if let Some(m) = self.moving.get_mut(name) {
            m.park_at = m.park_at.max(hb.started.unwrap_or(0));
            // The report that completes the parking makes the move (a preempted job stays
            // parked, and its reports change nothing until it runs again).
            let now_parked = (Some(m.park_at), true);
            completes = before != Some(now_parked) && self.parked(name, j.size);
        }
        Ok((self.job(name)?, completes.then_some(j.switch)))
    }

    /// Whether every rank of a moving job reported itself parked at the move's count.
    fn parked(&self, name: &str, size: Rank) -> bool {
        let Some(m) = self.moving.get(name) else {
            return false;
        };
        (0..size)
            .all(|r| self.reports.get(&(name.to_string(), r)) == Some(&(Some(m.park_at), true)))
    }

    /// Whether a change of a running job's slots can be made now: every worker is parked,
    /// or some worker cannot be held, or the wait ran out (the last two are counted as forced
    /// moves). If it cannot, the job is marked moving (its workers are told to park).
    fn may_move(&mut self, name: &str, size: Rank, heartbeat_ms: u32) -> bool {
        let now = Instant::now();
        let unholdable =
            (0..size).any(|r| matches!(self.reports.get(&(name.to_string(), r)), Some((None, _))));
        if self.parked(name, size) {
            self.counters.moves_live += 1;
            return true;
        }
        let timeout = MOVE_TIMEOUT.max(Duration::from_millis(u64::from(heartbeat_ms) * 5));
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
    /// three heartbeat periods, counted to now: after every heartbeat that took the lock
    /// before (a heartbeat never waits for a switch, so none is held back). Returns the
    /// failed jobs and their missing ranks; their switches are brought to the state apart.
    pub(super) fn check_members(&mut self) -> Vec<(String, Vec<Rank>)> {
        let now = Instant::now();
        let mut failing = Vec::new();
        for (name, j) in &self.state.jobs {
            let (Some(period), None, Some(_)) = (j.request.heartbeat_ms, &j.failed, j.epoch) else {
                continue;
            };
            let limit = Duration::from_millis(u64::from(period) * 3);
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
                    if let Err(e) = self.save() {
                        tracing::warn!(job = %name, error = %e, "saving the failed job");
                    }
                }
                Err(e) => tracing::warn!(job = %name, error = %e, "failing the job"),
            }
        }
        failing
    }

    /// The next change that brings `switch` from what it holds (as last seen) to what the
    /// state wants, in an order that never gives a slot to two jobs; a switch not seen yet
    /// is read first. `None` when there is nothing to do, or when the next change waits for
    /// a running job's workers to park (every change after it may need its slots).
    pub(super) fn next_action(&mut self, switch: &str) -> Option<Action> {
        if !self.links.contains_key(switch) {
            return None;
        }
        let Some(held) = self.holding.get(switch).cloned() else {
            return Some(Action::Read);
        };
        for step in self.steps(switch, &held) {
            let (id, to) = match step {
                Step::Remove(id) => (id, None),
                Step::Set(id, slots) => (id, Some(slots)),
            };
            let from = held.get(&id).map(|(r, _)| *r);
            if !self.may_change(switch, id, from, to) {
                return None;
            }
            if to.is_none() {
                return Some(Action::Remove(id));
            }
            // (Not every worker has joined: its slots wait for it, uninstalled.)
            if let Some(install) = self.wanted_install(switch, id) {
                return Some(Action::Install(install));
            }
        }
        None
    }

    /// The steps from what `switch` holds to what the state wants. A job held with its
    /// wanted range keeps running; the state learns its epoch again if a cancelled change had
    /// dropped it. One whose epoch nobody knows (the controller stopped between installing it
    /// and saving) is installed again, to learn it.
    fn steps(&mut self, switch: &str, held: &BTreeMap<JobId, (Range, Option<u16>)>) -> Vec<Step> {
        let mut from = BTreeMap::new();
        let mut steps = Vec::new();
        for (id, (r, epoch)) in held {
            let wants = self
                .state
                .job_by_id(switch, *id)
                .map(|j| (j.slots, j.epoch_on(switch)));
            match (wants, epoch) {
                (Some((Some(w), None)), Some(e)) if w == *r => {
                    self.learn_epoch(switch, *id, *e);
                    from.insert(*id, *r);
                }
                (Some((Some(w), None)), None) if w == *r => steps.push(Step::Remove(*id)),
                _ => {
                    from.insert(*id, *r);
                }
            }
        }
        steps.extend(alloc::plan(&from, &self.state.wanted(switch)));
        steps
    }

    /// Whether job `id` may change from `from` to `to` now: a running job that can be held
    /// moves (or is preempted) only between its tensors.
    fn may_change(
        &mut self,
        switch: &str,
        id: JobId,
        from: Option<Range>,
        to: Option<Range>,
    ) -> bool {
        let Some(job) = self.state.job_by_id(switch, id) else {
            return true;
        };
        let (Some(period), None, Some(from)) = (job.request.heartbeat_ms, &job.failed, from) else {
            return true;
        };
        if Some(from) == to {
            return true;
        }
        let (name, size) = (job.request.name.clone(), job.size());
        self.may_move(&name, size, period)
    }

    /// What installing job `id` on `switch` takes, as the state wants it now (`None` while
    /// it waits for slots or workers, or failed; a tree's rack switch also waits for the
    /// upper switch's epoch, which its uplink names).
    fn wanted_install(&self, switch: &str, id: JobId) -> Option<Install> {
        let job = self.state.job_by_id(switch, id)?;
        if job.failed.is_some() {
            return None;
        }
        let data = |name: &str| self.state.switches.get(name).map(|s| s.spec.data);
        let uplink = match job.racks.get(switch) {
            Some(part) => Some(ina_switch_api::UplinkSpec {
                addr: data(&job.switch)?,
                job: None,
                rank: part.up_rank,
                epoch: job.epoch?,
                slot_base: None,
            }),
            None => None,
        };
        Some(Install {
            job: id,
            slots: job.slots?,
            elems_per_packet: job.request.elems_per_packet,
            workers: job.ranks_on(switch, |name| self.state.seen_from_above(name))?,
            uplink,
        })
    }

    /// Records what `switch` did, checked against the state as it is now (it may have
    /// changed while the switch worked: the next plan then starts from what the switch holds).
    pub(super) fn commit(&mut self, switch: &str, done: Done) -> Result<(), ControllerError> {
        match done {
            Done::Holds(held) => self.record_holding(switch, held),
            Done::Removed(id) => {
                tracing::info!(%switch, job = id, "job taken off the switch");
                self.counters.changes_applied += 1;
                if let Some(h) = self.holding.get_mut(switch) {
                    h.remove(&id);
                }
            }
            Done::Installed(install, epoch) => self.record_install(switch, install, epoch),
        }
        self.save()
    }

    /// Records that `switch` did not make a change (a read, when `read`).
    pub(super) fn failed(&mut self, switch: &str, read: bool, e: &DriverError) {
        if !read {
            self.counters.changes_failed += 1;
            tracing::warn!(%switch, error = %e, "switch did not take a change");
        }
    }

    /// What the switch holds; the epochs this controller installed under stand while the
    /// ranges do.
    fn record_holding(&mut self, switch: &str, held: BTreeMap<JobId, Range>) {
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
    }

    /// A job installed. If the state still wants it so, its epoch is the job's; if not (it
    /// was deleted, resized or its workers changed meanwhile), the switch holds it under an
    /// epoch nobody keeps, and the next plan changes it.
    fn record_install(&mut self, switch: &str, install: Install, epoch: u16) {
        tracing::info!(%switch, job = install.job, epoch, slots = ?install.slots, "job installed on the switch");
        self.counters.changes_applied += 1;
        let current = self.wanted_install(switch, install.job).as_ref() == Some(&install);
        self.holding
            .entry(switch.to_string())
            .or_default()
            .insert(install.job, (install.slots, current.then_some(epoch)));
        if !current {
            return;
        }
        self.learn_epoch(switch, install.job, epoch);
        let name = self
            .state
            .job_by_id(switch, install.job)
            .map(|j| j.request.name.clone());
        if let Some(name) = name {
            if self.moving.remove(&name).is_some() {
                tracing::info!(job = %name, slots = ?install.slots, "running job moved");
            }
        }
    }

    /// Whether `switch` is due for a resync at `now` (not waiting after a failure).
    pub(super) fn due(&self, switch: &str, now: Instant) -> bool {
        self.retry.get(switch).is_none_or(|(at, _)| now >= *at)
    }

    /// Records a resync's outcome: an unreachable switch is logged once, tried again after a
    /// wait that doubles from `period` up to 30 s, and logged again when it is back.
    pub(super) fn reached(
        &mut self,
        switch: &str,
        error: Option<&DriverError>,
        now: Instant,
        period: Duration,
    ) {
        match error {
            Some(e) => {
                let wait = match self.retry.get(switch) {
                    Some((_, w)) => (*w * 2).min(MAX_RETRY),
                    None => {
                        tracing::warn!(%switch, error = %e, "switch unreachable; retrying with backoff");
                        period
                    }
                };
                self.retry.insert(switch.to_string(), (now + wait, wait));
            }
            None => {
                if self.retry.remove(switch).is_some() {
                    tracing::info!(%switch, "switch reachable again");
                }
            }
        }
    }

    /// The switches not reachable at their last resync.
    pub(super) fn unreachable(&self) -> Vec<String> {
        self.retry.keys().cloned().collect()
    }

    /// The controller's counters and gauges in Prometheus' text format.
    pub(super) fn metrics_text(&self) -> String {
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
        let count = |s: JobState| jobs.iter().filter(|j| j.state == s).count() as f64;
        e.gauge(
            "ina_controller_jobs_running",
            "Jobs holding slots.",
            count(JobState::Running),
        )
        .gauge(
            "ina_controller_jobs_queued",
            "Jobs waiting for slots.",
            count(JobState::Queued),
        )
        .gauge(
            "ina_controller_jobs_failed",
            "Failed jobs not yet deleted.",
            count(JobState::Failed),
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
}
