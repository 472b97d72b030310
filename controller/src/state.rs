//! The controller's state: its switches, its jobs and where they run, and the operations on
//! them. Pure: an operation changes the state and returns the data-plane changes it implies,
//! which the caller applies through the switches' drivers. Serializable as a whole, so that a
//! restarted controller finds it again (see [`crate::store`]).

use crate::alloc::{self, Demand, JobId, Policy, Range, Step};
use crate::api::{
    valid_name, JobRequest, JobState, JobStatus, Place, SwitchInfo, SwitchSpec, SwitchState,
    MAX_NAME, MAX_WORKERS,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
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
    pub members: BTreeMap<u8, SocketAddr>,
    /// Set when the job failed: the ranks whose heartbeats stopped.
    #[serde(default)]
    pub failed: Option<Vec<u8>>,
    /// Why it went to its switch.
    #[serde(default)]
    pub placement: String,
}

impl JobRecord {
    /// Workers in the job.
    pub fn size(&self) -> u8 {
        if self.request.workers.is_empty() {
            self.request.size.unwrap_or(0)
        } else {
            self.request.workers.len() as u8
        }
    }

    /// Every worker's address in rank order, once all are known.
    pub fn addresses(&self) -> Option<Vec<SocketAddr>> {
        (0..self.size())
            .map(|r| self.members.get(&r).copied())
            .collect()
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
        if let Some(other) = self
            .switches
            .values()
            .find(|s| s.spec.control == spec.control || s.spec.data == spec.data)
        {
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
    /// new ranges).
    pub fn create_job(&mut self, request: JobRequest) -> Result<Vec<Change>, StateError> {
        self.check_request(&request)?;
        let switch = match &request.switch {
            Some(name) => {
                let s = self
                    .switches
                    .get(name)
                    .ok_or_else(|| StateError::NoSuchSwitch(name.clone()))?;
                if s.draining {
                    return Err(StateError::Unplaceable {
                        job: request.name.clone(),
                        why: format!("switch {name:?} is draining"),
                    });
                }
                self.check_fits(&request, s)?;
                (name.clone(), "the switch the request named".to_string())
            }
            None => self.choose_switch(&request)?,
        };
        let (switch, placement) = switch;
        let id = self.free_job_id()?;
        let arrival = self.arrivals;
        self.arrivals += 1;
        let members = request
            .workers
            .iter()
            .enumerate()
            .map(|(r, a)| (r as u8, *a))
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
            },
        );
        Ok(self.relayout(&switch))
    }

    /// Deletes a job and returns the changes to its switch (its removal, and the other jobs'
    /// new ranges).
    pub fn delete_job(&mut self, name: &str) -> Result<Vec<Change>, StateError> {
        let switch = self
            .jobs
            .get(name)
            .map(|j| j.switch.clone())
            .ok_or_else(|| StateError::NoSuchJob(name.to_string()))?;
        let before = self.wanted(&switch);
        self.jobs.remove(name);
        Ok(self.relayout_from(&switch, before))
    }

    /// A worker joins job `name` at `addr`, as `rank` or the lowest free rank. Returns its
    /// rank and, if that made the job's membership complete, the job's installation.
    pub fn join(
        &mut self,
        name: &str,
        rank: Option<u8>,
        addr: SocketAddr,
    ) -> Result<(u8, Vec<Change>), StateError> {
        let j = self
            .jobs
            .get_mut(name)
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
        if j.members.get(&rank) == Some(&addr) {
            return Ok((rank, Vec::new()));
        }
        if j.failed.is_some() {
            return bad(
                "it failed (a worker stopped sending heartbeats): delete it and create it again"
                    .into(),
            );
        }
        j.members.insert(rank, addr);
        // The last address missing, or one changed: (re)install once complete.
        let changes = match (j.addresses(), j.slots) {
            (Some(_), Some(slots)) => {
                j.epoch = None;
                vec![Change {
                    switch: j.switch.clone(),
                    step: Step::Set(j.id, slots),
                }]
            }
            _ => Vec::new(),
        };
        Ok((rank, changes))
    }

    /// Fails job `name` because `missing` went silent: it leaves its switch (its slots go to
    /// the others) and stays listed, failed, until deleted. Returns the switch's changes.
    pub fn fail_job(&mut self, name: &str, missing: Vec<u8>) -> Result<Vec<Change>, StateError> {
        let j = self
            .jobs
            .get_mut(name)
            .ok_or_else(|| StateError::NoSuchJob(name.to_string()))?;
        if j.failed.is_some() {
            return Ok(Vec::new());
        }
        let switch = j.switch.clone();
        let before = self.wanted(&switch);
        if let Some(j) = self.jobs.get_mut(name) {
            j.failed = Some(missing);
        }
        Ok(self.relayout_from(&switch, before))
    }

    /// Records the epoch a switch installed a job under.
    pub fn installed(&mut self, switch: &str, id: JobId, epoch: u16) {
        if let Some(j) = self
            .jobs
            .values_mut()
            .find(|j| j.switch == switch && j.id == id)
        {
            j.epoch = Some(epoch);
        }
    }

    /// The layout the controller wants on a switch: every placed job's range.
    pub fn wanted(&self, switch: &str) -> BTreeMap<JobId, Range> {
        self.jobs
            .values()
            .filter(|j| j.switch == switch && j.failed.is_none())
            .filter_map(|j| Some((j.id, j.slots?)))
            .collect()
    }

    /// The record of job number `id` on `switch`.
    pub fn job_by_id(&self, switch: &str, id: JobId) -> Option<&JobRecord> {
        self.jobs
            .values()
            .find(|j| j.switch == switch && j.id == id)
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
                .filter(|j| j.switch == name)
                .map(|j| j.request.name.clone())
                .collect(),
        })
    }

    pub fn job_info(&self, name: &str) -> Option<JobStatus> {
        let j = self.jobs.get(name)?;
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
        })
    }

    /// Runs the policy on `switch` and records the new layout; returns the steps from the
    /// layout before to the new one, in a safe order.
    fn relayout(&mut self, switch: &str) -> Vec<Change> {
        let before = self.wanted(switch);
        self.relayout_from(switch, before)
    }

    /// [`relayout`](Self::relayout) from the layout `before` (which may hold a job just
    /// deleted).
    fn relayout_from(&mut self, switch: &str, before: BTreeMap<JobId, Range>) -> Vec<Change> {
        let Some(s) = self.switches.get(switch) else {
            return Vec::new();
        };
        let capacity = s.spec.slots;
        let demands: Vec<Demand> = self
            .jobs
            .values()
            .filter(|j| j.switch == switch && j.failed.is_none())
            .map(|j| Demand {
                job: j.id,
                want: j.request.window,
                min: j.request.min_window.unwrap_or(j.request.window),
                priority: j.request.priority,
                arrival: j.arrival,
            })
            .collect();
        let layout = alloc::layout(self.policy, capacity, &demands, &before);
        for j in self
            .jobs
            .values_mut()
            .filter(|j| j.switch == switch && j.failed.is_none())
        {
            let new = layout.placed.get(&j.id).copied();
            if new != j.slots {
                j.slots = new;
                j.epoch = None;
            }
        }
        alloc::plan(&before, &layout.placed)
            .into_iter()
            .map(|step| Change {
                switch: switch.to_string(),
                step,
            })
            .collect()
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
        if size == 0 || size > MAX_WORKERS {
            return bad(format!("{size} workers: a job has 1 to {MAX_WORKERS}"));
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
    fn a_job_spills_to_a_host_aggregator_only_where_it_would_queue() {
        let mut s = State::new(Policy::FirstFit);
        let full = alloc::usable(1024);
        s.add_switch(switch(
            "tor",
            1,
            Place::Rack {
                rack: "a".into(),
                hosts: vec![IpAddr::V4(Ipv4Addr::new(198, 18, 1, 1))],
                under: None,
            },
        ))
        .unwrap();
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
