//! The controller's state: its switches, its jobs and where they run, and the operations on
//! them. Pure: an operation changes the state and returns the data-plane changes it implies,
//! which the caller applies through the switches' drivers. Serializable as a whole, so that a
//! restarted controller finds it again (see [`crate::store`]).

use crate::alloc::{self, Demand, JobId, Policy, Range, Step};
use crate::api::{
    valid_name, JobRequest, JobState, JobStatus, Place, RackStatus, Rank, SwitchInfo, SwitchSpec,
    SwitchState, MAX_NAME, MAX_TREE_WORKERS, MAX_WORKERS,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

mod tree;
use std::net::SocketAddr;

/// Why an operation was refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("a switch named {0:?} exists")]
    SwitchExists(String),
    #[error("no switch named {0:?}")]
    NoSuchSwitch(String),
    #[error("a job named {0:?} exists")]
    JobExists(String),
    #[error("no job named {0:?}")]
    NoSuchJob(String),
    #[error("no active switch can ever hold job {job:?} ({why})")]
    Unplaceable { job: String, why: String },
    #[error("every job number is taken")]
    NoJobId,
}

/// A switch the controller manages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchRecord {
    pub spec: SwitchSpec,
    pub draining: bool,
    /// Its control endpoint's access token (kept here: [`SwitchSpec`] never serializes it).
    #[serde(default)]
    pub token: Option<String>,
}

/// A job the controller manages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub request: JobRequest,
    pub id: JobId,
    pub switch: String,
    pub arrival: u64,
    /// Its slots, while placed.
    pub slots: Option<Range>,
    /// The epoch its switch installed it under (`None` until installed, and after a change of
    /// its slots until installed again).
    pub epoch: Option<u16>,
    /// The workers' addresses by rank (all of them from the start when the request listed
    /// them; else as they join).
    #[serde(default)]
    pub members: BTreeMap<Rank, SocketAddr>,
    /// Set when the job failed: the ranks whose heartbeats stopped.
    #[serde(default)]
    pub failed: Option<Vec<Rank>>,
    /// Why it went to its switch.
    #[serde(default)]
    pub placement: String,
    /// Placed by the topology: each worker sits on the rack switch of its host, with a rank
    /// there ([`Seat`]), and the job is placed once all have joined (on their one rack
    /// switch, or as a tree over theirs). Until then `switch` is empty.
    #[serde(default)]
    pub by_topology: bool,
    /// Where each worker sits, for a job placed by the topology.
    #[serde(default)]
    pub seats: BTreeMap<Rank, Seat>,
    /// A tree job's parts on its rack switches, by switch name; `switch` is the upper switch,
    /// and `slots` the same range on every switch of the tree.
    #[serde(default)]
    pub racks: BTreeMap<String, RackPart>,
    /// Each worker's instance ([`crate::api::JoinRequest::instance`]), and whether the job has
    /// been installed since it joined.
    #[serde(default)]
    pub instances: BTreeMap<Rank, (u64, bool)>,
}

/// A worker's place in a job placed by the topology.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seat {
    /// Its switch (its host's rack switch).
    pub switch: String,
    /// Its rank on that switch.
    pub rank: u8,
}

/// A tree job on one of its rack switches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RackPart {
    /// The epoch the rack switch installed it under (`None` until installed, and again once
    /// the upper switch's epoch changes).
    pub epoch: Option<u16>,
    /// The upper switch's epoch its uplink names, once installed.
    #[serde(default)]
    pub under: Option<u16>,
    /// The rack switch's rank in the upper switch's job.
    pub up_rank: u8,
}

impl JobRecord {
    /// Workers in the job.
    pub fn size(&self) -> Rank {
        if self.request.workers.is_empty() {
            self.request.size.unwrap_or(0)
        } else {
            self.request.workers.len() as Rank
        }
    }

    /// Every worker's address in rank order, once all are known.
    pub fn addresses(&self) -> Option<Vec<SocketAddr>> {
        (0..self.size())
            .map(|r| self.members.get(&r).copied())
            .collect()
    }

    /// Whether it is aggregated in a tree.
    pub fn is_tree(&self) -> bool {
        !self.racks.is_empty()
    }

    /// Whether it has a part on `switch`.
    pub fn is_on(&self, switch: &str) -> bool {
        self.switch == switch || self.racks.contains_key(switch)
    }

    /// Its switches: its one switch, or a tree's upper switch then its rack switches.
    pub fn switches(&self) -> Vec<String> {
        let mut all = Vec::with_capacity(1 + self.racks.len());
        if !self.switch.is_empty() {
            all.push(self.switch.clone());
        }
        all.extend(self.racks.keys().cloned());
        all
    }

    /// The epoch of its part on `switch`, as installed.
    pub fn epoch_on(&self, switch: &str) -> Option<u16> {
        match self.racks.get(switch) {
            Some(part) => part.epoch,
            None if self.switch == switch => self.epoch,
            None => None,
        }
    }

    /// The addresses a switch takes as the job's ranks there, in rank order, once all are
    /// known: its workers'; on a rack switch of a tree, the workers seated there; on a tree's
    /// upper switch, the rack switches' (`rack_data` gives a switch's data address).
    pub fn ranks_on(
        &self,
        switch: &str,
        rack_data: impl Fn(&str) -> Option<SocketAddr>,
    ) -> Option<Vec<SocketAddr>> {
        if self.is_tree() && self.switch == switch {
            let mut racks: Vec<(&String, &RackPart)> = self.racks.iter().collect();
            racks.sort_by_key(|(_, p)| p.up_rank);
            return racks.into_iter().map(|(name, _)| rack_data(name)).collect();
        }
        if !self.by_topology {
            return self.addresses();
        }
        let mut seated: Vec<(u8, SocketAddr)> = Vec::new();
        for (rank, seat) in &self.seats {
            if seat.switch == switch {
                seated.push((seat.rank, *self.members.get(rank)?));
            }
        }
        seated.sort_by_key(|(r, _)| *r);
        if seated.is_empty() || self.addresses().is_none() {
            return None;
        }
        Some(seated.into_iter().map(|(_, a)| a).collect())
    }

    /// The demand its one switch's policy weighs (a tree's range is set apart from them).
    fn demand(&self) -> Demand {
        Demand {
            job: self.id,
            want: self.request.window,
            min: self.request.min_window.unwrap_or(self.request.window),
            priority: self.request.priority,
            arrival: self.arrival,
        }
    }
}

/// One data-plane change on one switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub switch: String,
    pub step: Step,
}

/// Everything the controller knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct State {
    pub policy: Policy,
    pub switches: BTreeMap<String, SwitchRecord>,
    pub jobs: BTreeMap<String, JobRecord>,
    /// Jobs created so far: the next one's arrival number.
    pub arrivals: u64,
}

impl State {
    pub fn new(policy: Policy) -> State {
        State {
            policy,
            ..State::default()
        }
    }

    /// Adds a switch.
    pub fn add_switch(&mut self, mut spec: SwitchSpec) -> Result<(), StateError> {
        if !valid_name(&spec.name) {
            return Err(bad_name("switch", &spec.name));
        }
        if self.switches.contains_key(&spec.name) {
            return Err(StateError::SwitchExists(spec.name));
        }
        if alloc::usable(spec.slots) == 0 {
            return Err(StateError::BadRequest(format!(
                "switch {:?}: a pool of {} slots holds no whole block of {}",
                spec.name,
                spec.slots,
                alloc::BLOCK
            )));
        }
        crate::driver::check_spec(&spec).map_err(StateError::BadRequest)?;
        if spec.elems_per_slot == 0 {
            return Err(StateError::BadRequest(format!(
                "switch {:?}: elems_per_slot must be at least 1",
                spec.name
            )));
        }
        // Two rack switches may share a data address: each is reached only by its own
        // rack's hosts (racks on private networks that repeat each other's addresses).
        let racks = |a: &SwitchSpec, b: &SwitchSpec| {
            matches!(a.place, Place::Rack { .. }) && matches!(b.place, Place::Rack { .. })
        };
        if let Some(other) = self.switches.values().find(|s| {
            s.spec.control == spec.control || (s.spec.data == spec.data && !racks(&s.spec, &spec))
        }) {
            return Err(StateError::BadRequest(format!(
                "switch {:?} already has the control endpoint {} or the data address {}",
                other.spec.name, spec.control, spec.data
            )));
        }
        let token = spec.token.take();
        let mut switches = self.switches.clone();
        switches.insert(
            spec.name.clone(),
            SwitchRecord {
                spec,
                draining: false,
                token,
            },
        );
        crate::topology::check(&switches).map_err(StateError::BadRequest)?;
        self.switches = switches;
        Ok(())
    }

    /// Stops placing new jobs on a switch; its jobs run on.
    pub fn drain_switch(&mut self, name: &str) -> Result<(), StateError> {
        let s = self
            .switches
            .get_mut(name)
            .ok_or_else(|| StateError::NoSuchSwitch(name.to_string()))?;
        s.draining = true;
        Ok(())
    }

    /// Creates a job: places it (or queues it) on its switch, and returns the changes to that
    /// switch (the new job's installation, and under fair share or priority the other jobs'
    /// new ranges). A job whose workers join by name, in a cluster with rack switches and no
    /// switch named, waits for them: it is placed by the topology once all have joined.
    pub fn create_job(&mut self, request: JobRequest) -> Result<Vec<Change>, StateError> {
        self.check_request(&request)?;
        let by_topology = self.places_by_topology(&request);
        let (switch, placement) = match &request.switch {
            Some(name) => {
                self.open_for(&request, name, "switch")?;
                (name.clone(), "the switch the request named".to_string())
            }
            None if by_topology => (
                String::new(),
                "waiting for its workers: placed on their rack switches once all have joined"
                    .to_string(),
            ),
            None => self.choose_switch(&request)?,
        };
        let id = self.free_job_id()?;
        let arrival = self.arrivals;
        self.arrivals += 1;
        let members = request
            .workers
            .iter()
            .enumerate()
            .map(|(r, a)| (r as Rank, *a))
            .collect();
        self.jobs.insert(
            request.name.clone(),
            JobRecord {
                request,
                id,
                switch: switch.clone(),
                arrival,
                slots: None,
                epoch: None,
                members,
                failed: None,
                placement,
                by_topology,
                seats: BTreeMap::new(),
                racks: BTreeMap::new(),
                instances: BTreeMap::new(),
            },
        );
        if switch.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.relayout(&switch))
    }

    /// Deletes a job and returns the changes to its switches (its removal, and the other
    /// jobs' new ranges, and the trees that now find room).
    pub fn delete_job(&mut self, name: &str) -> Result<Vec<Change>, StateError> {
        let switches = self
            .jobs
            .get(name)
            .map(JobRecord::switches)
            .ok_or_else(|| StateError::NoSuchJob(name.to_string()))?;
        let before: Vec<_> = switches.iter().map(|s| self.wanted(s)).collect();
        self.jobs.remove(name);
        Ok(self.relayout_all(switches, before))
    }

    /// Relayouts `switches` from their layouts `before`, then places the trees that waited
    /// for room.
    fn relayout_all(
        &mut self,
        switches: Vec<String>,
        before: Vec<BTreeMap<JobId, Range>>,
    ) -> Vec<Change> {
        let mut changes = Vec::new();
        for (switch, before) in switches.iter().zip(before) {
            changes.extend(self.relayout_from(switch, before));
        }
        changes.extend(self.place_waiting_trees());
        changes
    }

    /// A worker joins job `name` at `addr`, as `rank` or the lowest free rank, as worker
    /// process `instance`. Returns its rank and the changes it implies: the job's
    /// installation if that made its membership complete (for a job placed by the topology,
    /// its placement first), or its installation afresh (a changed address; a new run of a
    /// tree job).
    pub fn join(
        &mut self,
        name: &str,
        rank: Option<Rank>,
        addr: SocketAddr,
        instance: Option<u64>,
    ) -> Result<(Rank, Vec<Change>), StateError> {
        let before = self.jobs.get(name).cloned();
        let result = self.join_inner(name, rank, addr, instance);
        if result.is_err() {
            // Nothing changed: a refused join (a bad topology found at placement included).
            if let Some(j) = before {
                self.jobs.insert(name.to_string(), j);
            }
        }
        result
    }

    fn join_inner(
        &mut self,
        name: &str,
        rank: Option<Rank>,
        addr: SocketAddr,
        instance: Option<u64>,
    ) -> Result<(Rank, Vec<Change>), StateError> {
        let j = self
            .jobs
            .get(name)
            .ok_or_else(|| StateError::NoSuchJob(name.to_string()))?;
        let size = j.size();
        let bad = |m: String| Err(StateError::BadRequest(format!("job {name:?}: {m}")));
        if addr.ip().is_unspecified() || addr.port() == 0 {
            return bad(format!(
                "{addr} is not an address the switch can check packets against: bind the worker to its own IP and port"
            ));
        }
        // The rank this address already holds, if any: joining again is idempotent.
        let held = j.members.iter().find(|(_, a)| **a == addr).map(|(r, _)| *r);
        let rank = match (rank, held) {
            (Some(r), _) if r >= size => {
                return bad(format!(
                    "rank {r}, but the job has {size} workers (0..{size})"
                ))
            }
            (Some(r), Some(h)) if r != h => {
                return bad(format!("{addr} has joined as rank {h} already"))
            }
            (Some(r), _) => r,
            (None, Some(h)) => h,
            (None, None) => match (0..size).find(|r| !j.members.contains_key(r)) {
                Some(r) => r,
                None => return bad(format!("all {size} ranks have joined")),
            },
        };
        if !j.request.workers.is_empty() {
            // The request named every address: a join only confirms one.
            return if j.members.get(&rank) == Some(&addr) {
                Ok((rank, Vec::new()))
            } else {
                bad(format!(
                    "rank {rank} is {} in the job's request, not {addr}",
                    j.members
                        .get(&rank)
                        .map(|a| a.to_string())
                        .unwrap_or_default()
                ))
            };
        }
        let new_run = match (instance, j.instances.get(&rank)) {
            (Some(i), Some((known, installed))) => i != *known && *installed,
            _ => false,
        };
        if j.members.get(&rank) == Some(&addr) && !new_run {
            if let Some(i) = instance {
                let installed = j
                    .instances
                    .get(&rank)
                    .is_some_and(|(k, inst)| *k == i && *inst);
                if let Some(j) = self.jobs.get_mut(name) {
                    j.instances.insert(rank, (i, installed));
                }
            }
            return Ok((rank, Vec::new()));
        }
        if j.failed.is_some() {
            return bad(
                "it failed (a worker stopped sending heartbeats): delete it and create it again"
                    .into(),
            );
        }
        let seat = if j.by_topology {
            Some(self.seat(name, rank, addr)?)
        } else {
            None
        };
        let Some(j) = self.jobs.get_mut(name) else {
            return Err(StateError::NoSuchJob(name.to_string()));
        };
        j.members.insert(rank, addr);
        if let Some(i) = instance {
            j.instances.insert(rank, (i, false));
        }
        if new_run {
            // A new run: every worker's instance is of this run from now on, whichever
            // joins next.
            for (_, installed) in j.instances.values_mut() {
                *installed = false;
            }
        }
        let moved_rack = match seat {
            Some(seat) => {
                let moved = j.seats.get(&rank).is_some_and(|s| s.switch != seat.switch);
                j.seats.insert(rank, seat);
                moved
            }
            None => false,
        };
        if j.addresses().is_none() {
            return Ok((rank, Vec::new()));
        }
        if j.by_topology && (j.switch.is_empty() || moved_rack) {
            // Complete: place it where its workers are (again, if one moved to another rack).
            let changes = self.place_by_topology(name)?;
            return Ok((rank, changes));
        }
        // The last address missing, or one changed, or a new run: (re)install once complete.
        let Some(j) = self.jobs.get_mut(name) else {
            return Err(StateError::NoSuchJob(name.to_string()));
        };
        let Some(slots) = j.slots else {
            return Ok((rank, Vec::new()));
        };
        let parts: Vec<String> = if j.is_tree() && !new_run {
            // A worker's address changed: its rack switch installs it afresh.
            let on = j.seats.get(&rank).map(|s| s.switch.clone());
            on.into_iter().collect()
        } else {
            j.switches()
        };
        for part in &parts {
            if let Some(p) = j.racks.get_mut(part) {
                p.epoch = None;
            } else if *part == j.switch {
                j.epoch = None;
            }
        }
        let id = j.id;
        Ok((
            rank,
            parts
                .into_iter()
                .map(|switch| Change {
                    switch,
                    step: Step::Set(id, slots),
                })
                .collect(),
        ))
    }

    /// Fails job `name` because `missing` went silent: it leaves its switches (its slots go
    /// to the others) and stays listed, failed, until deleted. Returns the switches' changes.
    pub fn fail_job(&mut self, name: &str, missing: Vec<Rank>) -> Result<Vec<Change>, StateError> {
        let j = self
            .jobs
            .get_mut(name)
            .ok_or_else(|| StateError::NoSuchJob(name.to_string()))?;
        if j.failed.is_some() {
            return Ok(Vec::new());
        }
        let switches = j.switches();
        let before: Vec<_> = switches.iter().map(|s| self.wanted(s)).collect();
        if let Some(j) = self.jobs.get_mut(name) {
            j.failed = Some(missing);
        }
        Ok(self.relayout_all(switches, before))
    }

    /// Records the epoch a switch installed a job under. A tree's upper switch installing it
    /// under a new epoch takes its rack switches' parts out of date (their uplinks name the
    /// upper switch's epoch): those switches are returned, to be installed afresh.
    pub fn installed(&mut self, switch: &str, id: JobId, epoch: u16) -> Vec<String> {
        let Some(j) = self
            .jobs
            .values_mut()
            .find(|j| j.id == id && j.is_on(switch))
        else {
            return Vec::new();
        };
        let mut stale = Vec::new();
        let upper = j.epoch;
        if let Some(part) = j.racks.get_mut(switch) {
            part.epoch = Some(epoch);
            part.under = upper;
        } else {
            j.epoch = Some(epoch);
            for (name, part) in j.racks.iter_mut() {
                if part.under != Some(epoch) || part.epoch.is_none() {
                    part.epoch = None;
                    stale.push(name.clone());
                }
            }
        }
        if j.epoch.is_some() && j.racks.values().all(|p| p.epoch.is_some()) {
            for (_, installed) in j.instances.values_mut() {
                *installed = true;
            }
        }
        stale
    }

    /// The layout the controller wants on a switch: every placed job's range.
    pub fn wanted(&self, switch: &str) -> BTreeMap<JobId, Range> {
        self.jobs
            .values()
            .filter(|j| j.is_on(switch) && j.failed.is_none())
            .filter_map(|j| Some((j.id, j.slots?)))
            .collect()
    }

    /// The record of job number `id` on `switch`.
    pub fn job_by_id(&self, switch: &str, id: JobId) -> Option<&JobRecord> {
        self.jobs.values().find(|j| j.id == id && j.is_on(switch))
    }

    pub fn switch_info(&self, name: &str) -> Option<SwitchInfo> {
        let s = self.switches.get(name)?;
        let used: u32 = self.wanted(name).values().map(|r| u32::from(r.count)).sum();
        Some(SwitchInfo {
            spec: s.spec.clone(),
            state: if s.draining {
                SwitchState::Draining
            } else {
                SwitchState::Active
            },
            free_slots: (u32::from(alloc::usable(s.spec.slots)).saturating_sub(used)) as u16,
            jobs: self
                .jobs
                .values()
                .filter(|j| j.is_on(name))
                .map(|j| j.request.name.clone())
                .collect(),
        })
    }

    pub fn job_info(&self, name: &str) -> Option<JobStatus> {
        let j = self.jobs.get(name)?;
        let racks = j
            .racks
            .iter()
            .map(|(switch, part)| RackStatus {
                switch: switch.clone(),
                slots: j.slots,
                epoch: part.epoch,
                up_rank: part.up_rank,
                ranks: {
                    let mut seated: Vec<(u8, Rank)> = j
                        .seats
                        .iter()
                        .filter(|(_, s)| s.switch == *switch)
                        .map(|(r, s)| (s.rank, *r))
                        .collect();
                    seated.sort();
                    seated.into_iter().map(|(_, r)| r).collect()
                },
            })
            .collect();
        Some(JobStatus {
            request: j.request.clone(),
            id: j.id,
            switch: j.switch.clone(),
            state: if j.failed.is_some() {
                JobState::Failed
            } else if j.slots.is_some() {
                JobState::Running
            } else {
                JobState::Queued
            },
            slots: j.slots,
            epoch: j.epoch,
            size: j.size(),
            members: j.members.iter().map(|(r, a)| (*r, *a)).collect(),
            missing: j.failed.clone().unwrap_or_default(),
            park_at: None,
            placement: j.placement.clone(),
            racks,
        })
    }

    /// Runs the policy on `switch` and records the new layout; returns the steps from the
    /// layout before to the new one, in a safe order.
    fn relayout(&mut self, switch: &str) -> Vec<Change> {
        let before = self.wanted(switch);
        self.relayout_from(switch, before)
    }

    /// [`relayout`](Self::relayout) from the layout `before` (which may hold a job just
    /// deleted). The policy shares the pool below the trees' ranges, which stay where they
    /// were placed.
    fn relayout_from(&mut self, switch: &str, before: BTreeMap<JobId, Range>) -> Vec<Change> {
        let Some(s) = self.switches.get(switch) else {
            return Vec::new();
        };
        let capacity = self.below_trees(switch, s.spec.slots);
        let runs = |j: &JobRecord| j.switch == switch && j.failed.is_none() && !j.is_tree();
        let demands: Vec<Demand> = self
            .jobs
            .values()
            .filter(|j| runs(j))
            .map(JobRecord::demand)
            .collect();
        let trees: BTreeMap<JobId, Range> = self
            .jobs
            .values()
            .filter(|j| j.is_on(switch) && j.is_tree() && j.failed.is_none())
            .filter_map(|j| Some((j.id, j.slots?)))
            .collect();
        let mut layout = alloc::layout(self.policy, capacity, &demands, &before);
        for j in self.jobs.values_mut().filter(|j| runs(j)) {
            let new = layout.placed.get(&j.id).copied();
            if new != j.slots {
                j.slots = new;
                j.epoch = None;
            }
        }
        layout.placed.extend(trees);
        alloc::plan(&before, &layout.placed)
            .into_iter()
            .map(|step| Change {
                switch: switch.to_string(),
                step,
            })
            .collect()
    }

    /// The pool of `switch` below every tree's range on it: what its policy shares out.
    fn below_trees(&self, switch: &str, slots: u16) -> u16 {
        self.jobs
            .values()
            .filter(|j| j.is_on(switch) && j.is_tree() && j.failed.is_none())
            .filter_map(|j| j.slots.map(|r| r.base))
            .fold(alloc::usable(slots), u16::min)
    }

    fn check_request(&self, r: &JobRequest) -> Result<(), StateError> {
        if !valid_name(&r.name) {
            return Err(bad_name("job", &r.name));
        }
        if self.jobs.contains_key(&r.name) {
            return Err(StateError::JobExists(r.name.clone()));
        }
        let bad = |m: String| Err(StateError::BadRequest(format!("job {:?}: {m}", r.name)));
        let size = match (r.workers.len(), r.size) {
            (0, Some(n)) => usize::from(n),
            (0, None) => {
                return bad(
                    "give the workers' addresses, or their number (size) for workers that join"
                        .into(),
                )
            }
            (n, Some(s)) if usize::from(s) != n => {
                return bad(format!("size {s} but {n} worker addresses"))
            }
            (n, _) => n,
        };
        let most = if self.places_by_topology(r) {
            MAX_TREE_WORKERS
        } else {
            MAX_WORKERS
        };
        if size == 0 || size > most {
            return bad(if most == MAX_TREE_WORKERS {
                format!("{size} workers: a job has 1 to {MAX_TREE_WORKERS} (32 racks of 32)")
            } else if size > MAX_WORKERS && r.workers.is_empty() && r.switch.is_none() {
                format!(
                    "{size} workers: a job on one switch has 1 to {MAX_WORKERS}, and one of up to {MAX_TREE_WORKERS} is aggregated in a tree, which needs rack switches (`ina switch add ... --rack NAME --hosts ...`) under an upper switch (`--upper`)"
                )
            } else if size > MAX_WORKERS {
                format!(
                    "{size} workers: a job on one switch has 1 to {MAX_WORKERS} (a larger one joins by name, without naming a switch, and is aggregated in a tree over its workers' racks)"
                )
            } else {
                format!("{size} workers: a job has 1 to {most}")
            });
        }
        if let Some(a) = r
            .workers
            .iter()
            .find(|a| a.ip().is_unspecified() || a.port() == 0)
        {
            return bad(format!(
                "worker address {a}: give each worker's own IP and port"
            ));
        }
        let mut seen = HashSet::new();
        if let Some(dup) = r.workers.iter().find(|a| !seen.insert(**a)) {
            return bad(format!("worker address {dup} appears twice"));
        }
        if r.elems_per_packet == 0 {
            return bad("elems_per_packet must be at least 1".into());
        }
        let d = Demand {
            job: 0,
            want: r.window,
            min: r.min_window.unwrap_or(r.window),
            priority: r.priority,
            arrival: 0,
        };
        alloc::check(&d, u16::MAX).map_err(|_| {
            StateError::BadRequest(format!(
                "job {:?}: a window of {} slots with a minimum of {}: both must be whole blocks of {} slots, at least one block, the minimum at most the window",
                r.name,
                d.want,
                d.min,
                alloc::BLOCK
            ))
        })?;
        Ok(())
    }

    /// Switch `name`, if it takes new jobs and `r` can ever run on it; the error calls it
    /// `what` ("switch", "its workers' rack switch", ...).
    fn open_for(
        &self,
        r: &JobRequest,
        name: &str,
        what: &str,
    ) -> Result<&SwitchRecord, StateError> {
        let s = self
            .switches
            .get(name)
            .ok_or_else(|| StateError::NoSuchSwitch(name.to_string()))?;
        if s.draining {
            return Err(StateError::Unplaceable {
                job: r.name.clone(),
                why: format!("{what} {name:?} is draining"),
            });
        }
        self.check_fits(r, s)?;
        Ok(s)
    }

    /// Whether `r` can ever run on `s`: its minimum fits the pool, its packets the slots.
    fn check_fits(&self, r: &JobRequest, s: &SwitchRecord) -> Result<(), StateError> {
        let min = r.min_window.unwrap_or(r.window);
        let why = if min > alloc::usable(s.spec.slots) {
            format!(
                "a minimum of {min} slots, and switch {:?} has {}",
                s.spec.name,
                alloc::usable(s.spec.slots)
            )
        } else if r.elems_per_packet > s.spec.elems_per_slot {
            format!(
                "{} elements per packet, and switch {:?} holds {} per slot",
                r.elems_per_packet, s.spec.name, s.spec.elems_per_slot
            )
        } else {
            return Ok(());
        };
        Err(StateError::Unplaceable {
            job: r.name.clone(),
            why,
        })
    }

    /// The switch of a job that names none, and why: the first active switch in the network
    /// (by name) with room for the job's window, else the first with room for its minimum;
    /// else, where every such switch would make it queue, the first host aggregator
    /// ([`Place::Aggregator`]) with room for its window or its minimum (a job that queues
    /// moves no bits, so any host is sooner); else the first switch it can ever run on, where
    /// it queues.
    fn choose_switch(&self, r: &JobRequest) -> Result<(String, String), StateError> {
        let fits = |s: &&SwitchRecord| !s.draining && self.check_fits(r, s).is_ok();
        let aggregator = |s: &SwitchRecord| matches!(s.spec.place, Place::Aggregator { .. });
        let network: Vec<&SwitchRecord> = self
            .switches
            .values()
            .filter(fits)
            .filter(|s| !aggregator(s))
            .collect();
        let hosts: Vec<&SwitchRecord> = self
            .switches
            .values()
            .filter(fits)
            .filter(|s| aggregator(s))
            .collect();
        let free = |s: &SwitchRecord| {
            self.switch_info(&s.spec.name)
                .map(|i| i.free_slots)
                .unwrap_or(0)
        };
        let min = r.min_window.unwrap_or(r.window);
        let with_room = |list: &[&SwitchRecord], n: u16| {
            list.iter()
                .find(|s| free(s) >= n)
                .map(|s| s.spec.name.clone())
        };
        let full = || {
            network
                .iter()
                .map(|s| format!("{} has {} free", s.spec.name, free(s)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let chosen = if let Some(name) = with_room(&network, r.window) {
            Some((name, format!("room for its window of {} slots", r.window)))
        } else if let Some(name) = with_room(&network, min) {
            Some((name, format!("room for its minimum of {min} slots")))
        } else if let Some(name) = with_room(&hosts, min) {
            let why = if network.is_empty() {
                "a host aggregator: no switch in the network can run it".to_string()
            } else {
                format!(
                    "a host aggregator instead of queueing: no switch in the network has room for its minimum of {min} slots ({})",
                    full()
                )
            };
            Some((name, why))
        } else {
            network.first().or(hosts.first()).map(|s| {
                (
                    s.spec.name.clone(),
                    "queued: no switch has room for its minimum now".to_string(),
                )
            })
        };
        chosen.ok_or_else(|| StateError::Unplaceable {
            job: r.name.clone(),
            why: if self.switches.is_empty() {
                "the controller has no switches: add one with `ina switch add`".into()
            } else {
                self.switches
                    .values()
                    .map(|s| match self.check_fits(r, s) {
                        Err(StateError::Unplaceable { why, .. }) => why,
                        _ => format!("switch {:?} is draining", s.spec.name),
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            },
        })
    }

    fn free_job_id(&self) -> Result<JobId, StateError> {
        let taken: HashSet<JobId> = self.jobs.values().map(|j| j.id).collect();
        (1..=JobId::MAX)
            .find(|id| !taken.contains(id))
            .ok_or(StateError::NoJobId)
    }
}

fn bad_name(what: &str, name: &str) -> StateError {
    StateError::BadRequest(format!(
        "{what} name {name:?}: 1 to {MAX_NAME} characters of letters, digits, '.', '_' and '-'"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    fn switch(name: &str, n: u16, place: Place) -> SwitchSpec {
        let addr = |p: u16| SocketAddr::from((Ipv4Addr::LOCALHOST, p));
        let mut spec = SwitchSpec::software(name, addr(7000 + n), addr(8000 + n), 1024, 256);
        spec.place = place;
        spec
    }

    fn job(name: &str, window: u16) -> JobRequest {
        JobRequest {
            name: name.into(),
            workers: Vec::new(),
            size: Some(2),
            elems_per_packet: 256,
            window,
            min_window: None,
            priority: 0,
            switch: None,
            heartbeat_ms: None,
        }
    }

    #[test]
    fn a_switchs_token_goes_to_the_controller_and_never_comes_back() {
        let mut spec = switch("sw", 1, Place::Unplaced);
        spec.token = Some("switch-token-0123456789".into());
        // Over the API the request carries it...
        let sent = serde_json::to_string(&spec).unwrap();
        assert!(sent.contains("switch-token-0123456789"), "{sent}");
        let received: SwitchSpec = serde_json::from_str(&sent).unwrap();
        let mut s = State::new(Policy::FirstFit);
        s.add_switch(received).unwrap();
        // ...the controller keeps it apart, and what it answers with holds none.
        assert_eq!(
            s.switches["sw"].token.as_deref(),
            Some("switch-token-0123456789")
        );
        let answer = serde_json::to_string(&s.switch_info("sw").unwrap()).unwrap();
        assert!(!answer.contains("switch-token"), "{answer}");
    }

    #[test]
    fn a_job_spills_to_a_host_aggregator_only_where_it_would_queue() {
        let mut s = State::new(Policy::FirstFit);
        let full = alloc::usable(1024);
        // (A switch without a rack: jobs are placed as they are created.)
        s.add_switch(switch("tor", 1, Place::Unplaced)).unwrap();
        // Without an aggregator, a job that finds no room queues on the switch.
        s.create_job(job("a", full)).unwrap();
        s.create_job(job("b", full)).unwrap();
        let b = s.job_info("b").unwrap();
        assert_eq!((b.switch.as_str(), b.state), ("tor", JobState::Queued));
        assert!(b.placement.starts_with("queued"), "{}", b.placement);
        let a = s.job_info("a").unwrap();
        assert_eq!(a.switch, "tor");
        assert!(
            a.placement.contains("room for its window"),
            "{}",
            a.placement
        );
        // With one, the next such job goes to the host, and says why.
        s.add_switch(switch(
            "agg",
            2,
            Place::Aggregator {
                host: IpAddr::V4(Ipv4Addr::new(198, 18, 9, 9)),
            },
        ))
        .unwrap();
        s.create_job(job("c", full)).unwrap();
        let c = s.job_info("c").unwrap();
        assert_eq!((c.switch.as_str(), c.state), ("agg", JobState::Running));
        assert!(
            c.placement.contains("host aggregator instead of queueing")
                && c.placement.contains("tor has 0 free"),
            "{}",
            c.placement
        );
        // A job the network's switch has room for stays in the network.
        s.delete_job("a").unwrap();
        s.delete_job("b").unwrap();
        s.create_job(job("d", full)).unwrap();
        assert_eq!(s.job_info("d").unwrap().switch, "tor");
    }
}
