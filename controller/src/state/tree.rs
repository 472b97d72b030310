//! Placement by the topology (docs/CONTROLLER.md, "Trees"): a job whose workers join by name
//! in a cluster with rack switches seats each worker on its host's rack switch, and once all
//! have joined goes where they are: on their one rack switch, or as a tree of their rack
//! switches under their upper switch (PROTOCOL.md §9), with the same range of slots on every
//! switch of the tree.
//!
//! A tree's range is set apart at the top of each of its switches' pools, below any tree
//! placed before it: the same range everywhere (a switch's shards, and the upper switch's gap
//! register, need the two levels' slots to coincide), while each switch's policy shares out
//! what lies below the trees.

use super::{Change, JobRecord, RackPart, Seat, State, StateError};
use crate::alloc::{self, Policy, Range, BLOCK};
use crate::api::{Place, Rank, MAX_WORKERS};
use std::collections::BTreeSet;
use std::net::SocketAddr;

impl State {
    /// Whether a job is placed by the topology: its workers join by name, the request names
    /// no switch, and some switch is a rack switch.
    pub(super) fn places_by_topology(&self, r: &crate::api::JobRequest) -> bool {
        r.switch.is_none()
            && r.workers.is_empty()
            && self
                .switches
                .values()
                .any(|s| matches!(s.spec.place, Place::Rack { .. }))
    }

    /// The switch a worker joining job `name` from `addr` (as `rank`, if given) will send to,
    /// if known now: its host's rack switch for a job placed by the topology, else the job's
    /// switch.
    pub fn worker_switch(
        &self,
        name: &str,
        rank: Option<Rank>,
        addr: SocketAddr,
    ) -> Option<String> {
        let j = self.jobs.get(name)?;
        if !j.by_topology {
            return Some(j.switch.clone()).filter(|s| !s.is_empty());
        }
        let rank = rank.unwrap_or(0);
        self.seat(name, rank, addr).ok().map(|s| s.switch)
    }

    /// The UDP address an upper switch sees switch `name` at: a rack switch's `up_data` if
    /// declared, else its data address.
    pub fn seen_from_above(&self, name: &str) -> Option<SocketAddr> {
        let s = self.switches.get(name)?;
        match s.spec.place {
            Place::Rack {
                up_data: Some(a), ..
            } => Some(a),
            _ => Some(s.spec.data),
        }
    }

    /// The rack switch a worker at `addr` sits on in job `name` as `rank`, and its rank there:
    /// the one it has if it sat there before, else the lowest free one.
    pub(super) fn seat(
        &self,
        name: &str,
        rank: Rank,
        addr: SocketAddr,
    ) -> Result<Seat, StateError> {
        let bad = |m: String| StateError::BadRequest(format!("job {name:?}: {m}"));
        let switch = self
            .switches
            .values()
            .find(|s| match &s.spec.place {
                Place::Rack { hosts, .. } => hosts.contains(&addr.ip()),
                _ => false,
            })
            .map(|s| s.spec.name.clone())
            .ok_or_else(|| {
                bad(format!(
                    "host {} is under no rack switch: declare it with `ina switch add ... --rack NAME --hosts ...`",
                    addr.ip()
                ))
            })?;
        let j = self
            .jobs
            .get(name)
            .ok_or_else(|| StateError::NoSuchJob(name.to_string()))?;
        if let Some(seat) = j.seats.get(&rank).filter(|s| s.switch == switch) {
            return Ok(seat.clone());
        }
        let taken: BTreeSet<u8> = j
            .seats
            .iter()
            .filter(|(r, s)| **r != rank && s.switch == switch)
            .map(|(_, s)| s.rank)
            .collect();
        let free = (0..MAX_WORKERS as u8).find(|r| !taken.contains(r)).ok_or_else(|| {
            bad(format!(
                "rack switch {switch:?} holds {MAX_WORKERS} of its workers already; a switch takes at most {MAX_WORKERS} ranks of a job"
            ))
        })?;
        Ok(Seat { switch, rank: free })
    }

    /// Places job `name`, whose workers have all joined, where they sit: on their one rack
    /// switch (or, if it has no room, a host aggregator), or as a tree. A job placed before
    /// leaves its switches first. The error names what in the topology keeps it from being
    /// placed.
    pub(super) fn place_by_topology(&mut self, name: &str) -> Result<Vec<Change>, StateError> {
        let j = self
            .jobs
            .get(name)
            .ok_or_else(|| StateError::NoSuchJob(name.to_string()))?;
        let racks: BTreeSet<String> = j.seats.values().map(|s| s.switch.clone()).collect();
        let plan = if racks.len() == 1 {
            let rack = racks.iter().next().cloned().unwrap_or_default();
            Plan::Single(self.single(j, &rack)?)
        } else {
            Plan::Tree(self.tree(j, &racks)?)
        };
        // Off the switches it was on.
        let old = j.switches();
        let before: Vec<_> = old.iter().map(|s| self.wanted(s)).collect();
        if let Some(j) = self.jobs.get_mut(name) {
            j.slots = None;
            j.epoch = None;
            j.racks.clear();
        }
        let mut changes = Vec::new();
        for (switch, before) in old.iter().zip(before) {
            changes.extend(self.relayout_from(switch, before));
        }
        let Some(j) = self.jobs.get_mut(name) else {
            return Err(StateError::NoSuchJob(name.to_string()));
        };
        match plan {
            Plan::Single((switch, why)) => {
                for seat in j.seats.values_mut() {
                    seat.switch = switch.clone();
                }
                j.switch = switch.clone();
                j.placement = why;
                changes.extend(self.relayout(&switch));
            }
            Plan::Tree((upper, parts)) => {
                j.placement = format!(
                    "a tree: its workers are under rack switches {}, under upper switch {upper:?}",
                    parts
                        .iter()
                        .map(|(n, _)| format!("{n:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                j.switch = upper;
                j.racks = parts.into_iter().collect();
                changes.extend(self.place_tree_range(name));
            }
        }
        Ok(changes)
    }

    /// The switch of a job whose workers are all under `rack`, and why: the rack switch if it
    /// has room for the job's minimum, else a host aggregator that has, else the rack switch,
    /// where it queues.
    fn single(&self, j: &JobRecord, rack: &str) -> Result<(String, String), StateError> {
        self.open_for(&j.request, rack, "its workers' rack switch")?;
        let min = j.request.min_window.unwrap_or(j.request.window);
        let room = self.room(rack, Some(j.id));
        if room >= min {
            return Ok((
                rack.to_string(),
                format!("rack switch {rack:?}, which holds every one of its workers"),
            ));
        }
        let aggregator = self.switches.values().find(|a| {
            matches!(a.spec.place, Place::Aggregator { .. })
                && !a.draining
                && self.check_fits(&j.request, a).is_ok()
                && self.room(&a.spec.name, Some(j.id)) >= min
        });
        Ok(match aggregator {
            Some(a) => (
                a.spec.name.clone(),
                format!(
                    "a host aggregator instead of queueing: its workers' rack switch {rack:?} has room for {room} of its minimum of {min} slots"
                ),
            ),
            None => (
                rack.to_string(),
                format!("queued: its workers' rack switch {rack:?} has no room for its minimum of {min} slots now"),
            ),
        })
    }

    /// The upper switch and the rack switches' parts of a tree over `racks`.
    fn tree(
        &self,
        j: &JobRecord,
        racks: &BTreeSet<String>,
    ) -> Result<(String, Vec<(String, RackPart)>), StateError> {
        let name = &j.request.name;
        let bad = |m: String| StateError::BadRequest(format!("job {name:?}: {m}"));
        let listed = racks
            .iter()
            .map(|r| format!("{r:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        if racks.len() > MAX_WORKERS {
            return Err(bad(format!(
                "its workers are under {} rack switches; an upper switch takes at most {MAX_WORKERS} (its ranks)",
                racks.len()
            )));
        }
        let mut uppers = BTreeSet::new();
        for rack in racks {
            let s = self
                .switches
                .get(rack)
                .ok_or_else(|| StateError::NoSuchSwitch(rack.clone()))?;
            match s.spec.place.under() {
                Some(u) => {
                    uppers.insert(u.to_string());
                }
                None => {
                    return Err(bad(format!(
                        "its workers are under rack switches {listed}, and {rack:?} is under no upper switch: a job across racks needs its rack switches under one upper switch (`ina switch add NAME --upper`, then the racks with `--under NAME`)"
                    )))
                }
            }
        }
        let upper = match uppers.len() {
            1 => uppers.into_iter().next().unwrap_or_default(),
            _ => {
                return Err(bad(format!(
                    "its rack switches {listed} are under different upper switches ({}): the controller builds trees of two levels, rack switches under one upper switch",
                    uppers
                        .iter()
                        .map(|u| format!("{u:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
        };
        for switch in std::iter::once(&upper).chain(racks) {
            let s = self.open_for(&j.request, switch, "the switch of its tree")?;
            if racks.contains(switch) && s.spec.kind == crate::api::SwitchKind::Tofino {
                return Err(bad(format!(
                    "rack switch {switch:?} is a Tofino: its program has no uplink yet (PROTOCOL.md §9, \"On a P4 switch\")"
                )));
            }
        }
        let parts = racks
            .iter()
            .enumerate()
            .map(|(i, r)| {
                (
                    r.clone(),
                    RackPart {
                        epoch: None,
                        under: None,
                        up_rank: i as u8,
                    },
                )
            })
            .collect();
        Ok((upper, parts))
    }

    /// Gives tree job `name` its range: as much of its window as every switch of the tree
    /// has room for (at least its minimum), at the same slots on each, below the trees
    /// already there. A tree without room for its minimum waits, holding nothing.
    fn place_tree_range(&mut self, name: &str) -> Vec<Change> {
        let Some(j) = self.jobs.get(name) else {
            return Vec::new();
        };
        let switches = j.switches();
        let (id, want) = (j.id, j.request.window);
        let min = j.request.min_window.unwrap_or(want);
        let mut room = u16::MAX;
        let mut top = u16::MAX;
        let mut fullest = String::new();
        for s in &switches {
            let r = self.room(s, Some(id));
            if r < room {
                room = r;
                fullest = s.clone();
            }
            let slots = self.switches.get(s).map(|x| x.spec.slots).unwrap_or(0);
            top = top.min(self.below_trees(s, slots));
        }
        let count = want.min(room).min(top);
        let count = count - count % BLOCK;
        if count < min || count == 0 {
            if let Some(j) = self.jobs.get_mut(name) {
                let note = format!(
                    "; queued: switch {fullest:?} has room for {room} of its minimum of {min} slots"
                );
                if !j.placement.ends_with(&note) {
                    let base = j
                        .placement
                        .split("; queued:")
                        .next()
                        .unwrap_or("")
                        .to_string();
                    j.placement = base + &note;
                }
            }
            return Vec::new();
        }
        let before: Vec<_> = switches.iter().map(|s| self.wanted(s)).collect();
        if let Some(j) = self.jobs.get_mut(name) {
            j.slots = Some(Range {
                base: top - count,
                count,
            });
            j.epoch = None;
            for part in j.racks.values_mut() {
                part.epoch = None;
            }
            if let Some(i) = j.placement.find("; queued:") {
                j.placement.truncate(i);
            }
        }
        let mut changes = Vec::new();
        for (switch, before) in switches.iter().zip(before) {
            changes.extend(self.relayout_from(switch, before));
        }
        changes
    }

    /// Places the trees that wait for room, oldest first.
    pub(super) fn place_waiting_trees(&mut self) -> Vec<Change> {
        let mut waiting: Vec<(u64, String)> = self
            .jobs
            .values()
            .filter(|j| j.is_tree() && j.slots.is_none() && j.failed.is_none())
            .map(|j| (j.arrival, j.request.name.clone()))
            .collect();
        waiting.sort();
        waiting
            .into_iter()
            .flat_map(|(_, name)| self.place_tree_range(&name))
            .collect()
    }

    /// The slots of `switch` a job other than `except` could have: those no job holds under
    /// first fit; under the other policies, also what the jobs there hold beyond their
    /// minimums (they shrink to make room).
    fn room(&self, switch: &str, except: Option<alloc::JobId>) -> u16 {
        let Some(s) = self.switches.get(switch) else {
            return 0;
        };
        let held: u32 = self
            .jobs
            .values()
            .filter(|j| j.is_on(switch) && j.failed.is_none() && Some(j.id) != except)
            .filter_map(|j| {
                let r = j.slots?;
                let keeps = match self.policy {
                    Policy::FirstFit => r.count,
                    _ if j.is_tree() => r.count,
                    _ => j
                        .request
                        .min_window
                        .unwrap_or(j.request.window)
                        .min(r.count),
                };
                Some(u32::from(keeps))
            })
            .sum();
        u32::from(alloc::usable(s.spec.slots)).saturating_sub(held) as u16
    }
}

/// Where a job whose workers have all joined goes.
enum Plan {
    Single((String, String)),
    Tree((String, Vec<(String, RackPart)>)),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Step;
    use crate::api::{JobRequest, JobState, SwitchSpec};
    use std::net::{IpAddr, Ipv4Addr};

    fn host(rack: u8, n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(198, 18, rack, n))
    }

    fn worker(rack: u8, n: u8) -> SocketAddr {
        SocketAddr::new(host(rack, n), 9000)
    }

    fn switch(name: &str, n: u16, place: Place) -> SwitchSpec {
        let addr = |p: u16| SocketAddr::from((Ipv4Addr::LOCALHOST, p));
        let mut spec = SwitchSpec::software(name, addr(7000 + n), addr(8000 + n), 1024, 256);
        spec.place = place;
        spec
    }

    fn rack(i: u8, under: Option<&str>) -> SwitchSpec {
        switch(
            &format!("tor{i}"),
            u16::from(i),
            Place::Rack {
                rack: format!("r{i}"),
                hosts: (1..=4).map(|n| host(i, n)).collect(),
                under: under.map(str::to_string),
                up_data: None,
            },
        )
    }

    /// An upper switch `top` with racks 1 to 3 under it (4 hosts each), and rack 4 under
    /// none.
    fn cluster(policy: Policy) -> State {
        let mut s = State::new(policy);
        s.add_switch(switch("top", 0, Place::Upper { under: None }))
            .unwrap();
        for i in 1..=3 {
            s.add_switch(rack(i, Some("top"))).unwrap();
        }
        s.add_switch(rack(4, None)).unwrap();
        s
    }

    fn job(name: &str, size: u16, window: u16) -> JobRequest {
        JobRequest {
            name: name.into(),
            workers: Vec::new(),
            size: Some(size),
            elems_per_packet: 256,
            window,
            min_window: None,
            priority: 0,
            switch: None,
            heartbeat_ms: None,
        }
    }

    fn join(s: &mut State, name: &str, addr: SocketAddr) -> Result<Rank, StateError> {
        s.join(name, None, addr, Some(1)).map(|(r, _)| r)
    }

    #[test]
    fn workers_across_racks_make_a_tree_with_one_range_on_every_switch() {
        let mut s = cluster(Policy::FairShare);
        // Another job on rack 2 holds slots: the tree's range must be free there too.
        s.create_job(JobRequest {
            switch: Some("tor2".into()),
            ..job("other", 2, 512)
        })
        .unwrap();
        s.create_job(job("t", 6, 256)).unwrap();
        let waiting = s.job_info("t").unwrap();
        assert_eq!(
            (waiting.switch.as_str(), waiting.state),
            ("", JobState::Queued)
        );
        let addrs = [
            worker(1, 1),
            worker(2, 1),
            worker(3, 1),
            worker(1, 2),
            worker(2, 2),
            worker(3, 2),
        ];
        for a in &addrs[..5] {
            join(&mut s, "t", *a).unwrap();
            assert!(s.job_info("t").unwrap().racks.is_empty());
        }
        let (_, changes) = s.join("t", None, addrs[5], Some(1)).unwrap();
        let t = s.job_info("t").unwrap();
        assert_eq!((t.switch.as_str(), t.state), ("top", JobState::Running));
        assert!(t.placement.starts_with("a tree"), "{}", t.placement);
        let slots = t.slots.unwrap();
        assert_eq!(slots.count, 256);
        let names: Vec<&str> = t.racks.iter().map(|r| r.switch.as_str()).collect();
        assert_eq!(names, ["tor1", "tor2", "tor3"]);
        for (i, r) in t.racks.iter().enumerate() {
            assert_eq!((r.up_rank, r.slots), (i as u8, Some(slots)));
            // Ranks 0 and 3 sit on tor1, in join order.
            assert_eq!(r.ranks, vec![i as Rank, i as Rank + 3]);
        }
        // The same range on every switch of the tree, apart from the other job's.
        for sw in ["top", "tor1", "tor2", "tor3"] {
            assert_eq!(s.wanted(sw).get(&t.id), Some(&slots), "{sw}");
            assert!(alloc::is_sound(1024, &s.wanted(sw)), "{sw}");
            assert!(changes.iter().any(|c| c.switch == sw), "{sw}");
        }
        let other = s.job_info("other").unwrap().slots.unwrap();
        assert!(!other.overlaps(&slots));
        // The upper switch's ranks are the rack switches, in up_rank order; a rack switch's
        // are its workers.
        let j = &s.jobs["t"];
        let data = |n: &str| s.switches.get(n).map(|x| x.spec.data);
        let upper = j.ranks_on("top", data).unwrap();
        assert_eq!(upper, ["tor1", "tor2", "tor3"].map(|n| data(n).unwrap()));
        assert_eq!(j.ranks_on("tor2", data).unwrap(), [addrs[1], addrs[4]]);
        // Deleting the tree frees its range everywhere; the other job grows into it.
        s.delete_job("t").unwrap();
        for sw in ["top", "tor1", "tor3"] {
            assert!(s.wanted(sw).is_empty(), "{sw}");
        }
        assert_eq!(s.job_info("other").unwrap().slots.unwrap().count, 512);
    }

    #[test]
    fn the_upper_switchs_new_epoch_sends_every_rack_switch_to_install_again() {
        let mut s = cluster(Policy::FirstFit);
        s.create_job(job("t", 2, 128)).unwrap();
        join(&mut s, "t", worker(1, 1)).unwrap();
        join(&mut s, "t", worker(2, 1)).unwrap();
        let id = s.jobs["t"].id;
        // The racks wait for the upper switch's epoch; once it is known, both go.
        let mut stale = s.installed("top", id, 10);
        stale.sort();
        assert_eq!(stale, ["tor1", "tor2"]);
        assert!(s.installed("tor1", id, 20).is_empty());
        assert!(s.installed("tor2", id, 21).is_empty());
        assert!(s.job_info("t").unwrap().is_installed());
        // The same epoch learned again changes nothing; a new one takes both racks again.
        assert!(s.installed("top", id, 10).is_empty());
        let mut stale = s.installed("top", id, 11);
        stale.sort();
        assert_eq!(stale, ["tor1", "tor2"]);
        assert!(!s.job_info("t").unwrap().is_installed());
    }

    #[test]
    fn a_new_run_of_a_tree_installs_it_afresh_once() {
        let mut s = cluster(Policy::FirstFit);
        s.create_job(job("t", 2, 128)).unwrap();
        s.join("t", None, worker(1, 1), Some(1)).unwrap();
        s.join("t", None, worker(2, 1), Some(2)).unwrap();
        let id = s.jobs["t"].id;
        s.installed("top", id, 10);
        s.installed("tor1", id, 20);
        s.installed("tor2", id, 21);
        // The same worker process asking again: nothing.
        let (_, same) = s.join("t", None, worker(1, 1), Some(1)).unwrap();
        assert!(same.is_empty());
        // A new process on rank 0: every switch of the tree installs the job again.
        let (rank, changes) = s.join("t", None, worker(1, 1), Some(3)).unwrap();
        assert_eq!(rank, 0);
        let mut switches: Vec<&str> = changes.iter().map(|c| c.switch.as_str()).collect();
        switches.sort();
        assert_eq!(switches, ["top", "tor1", "tor2"]);
        assert_eq!(s.jobs["t"].epoch, None);
        // Its peer's new process, of the same run, changes nothing more.
        let (_, peer) = s.join("t", None, worker(2, 1), Some(4)).unwrap();
        assert!(peer.is_empty());
    }

    #[test]
    fn workers_of_one_rack_run_on_its_switch_with_their_seats_as_ranks() {
        let mut s = cluster(Policy::FirstFit);
        s.create_job(job("j", 2, 128)).unwrap();
        assert_eq!(
            s.join("t", Some(1), worker(4, 1), None).unwrap_err(),
            StateError::NoSuchJob("t".into())
        );
        s.join("j", Some(1), worker(4, 1), None).unwrap();
        s.join("j", Some(0), worker(4, 2), None).unwrap();
        let j = s.job_info("j").unwrap();
        assert_eq!((j.switch.as_str(), j.state), ("tor4", JobState::Running));
        assert!(j.racks.is_empty());
        // Rank 1 joined first: rank 0 on the switch.
        let seats = &s.jobs["j"].seats;
        assert_eq!((seats[&1].rank, seats[&0].rank), (0, 1));
        let data = |n: &str| s.switches.get(n).map(|x| x.spec.data);
        assert_eq!(
            s.jobs["j"].ranks_on("tor4", data).unwrap(),
            [worker(4, 1), worker(4, 2)]
        );
    }

    #[test]
    fn bad_topologies_are_refused_by_name_and_change_nothing() {
        let mut s = cluster(Policy::FirstFit);
        s.create_job(job("j", 2, 128)).unwrap();
        let e = join(&mut s, "j", worker(9, 1)).unwrap_err().to_string();
        assert!(e.contains("host 198.18.9.1 is under no rack switch"), "{e}");
        // Rack 4 has no upper switch: the join that completes the job is refused.
        join(&mut s, "j", worker(1, 1)).unwrap();
        let before = s.clone();
        let e = join(&mut s, "j", worker(4, 1)).unwrap_err().to_string();
        assert!(
            e.contains("\"tor4\" is under no upper switch") && e.contains("\"tor1\", \"tor4\""),
            "{e}"
        );
        assert_eq!(s, before);
        // Racks under two upper switches.
        s.add_switch(switch("top2", 9, Place::Upper { under: None }))
            .unwrap();
        s.add_switch(rack(5, Some("top2"))).unwrap();
        let e = join(&mut s, "j", worker(5, 1)).unwrap_err().to_string();
        assert!(
            e.contains("different upper switches (\"top\", \"top2\")"),
            "{e}"
        );
        // A job larger than a switch needs racks.
        let mut flat = State::new(Policy::FirstFit);
        flat.add_switch(switch("one", 1, Place::Unplaced)).unwrap();
        let e = flat.create_job(job("big", 40, 64)).unwrap_err().to_string();
        assert!(e.contains("1 to 32") && e.contains("--rack"), "{e}");
        let e = s.create_job(job("huge", 1025, 64)).unwrap_err().to_string();
        assert!(e.contains("1 to 1024"), "{e}");
        s.create_job(job("big", 40, 64)).unwrap();
    }

    #[test]
    fn a_thousand_and_twenty_four_workers_make_a_tree_of_32_racks_of_32() {
        let mut s = State::new(Policy::FairShare);
        s.add_switch(switch("top", 0, Place::Upper { under: None }))
            .unwrap();
        let ip =
            |rack: u16, n: u16| IpAddr::V4(Ipv4Addr::new(198, 18, 100 + rack as u8, n as u8 + 1));
        for rack in 0..32u16 {
            s.add_switch(switch(
                &format!("tor{rack:02}"),
                rack + 1,
                Place::Rack {
                    rack: format!("r{rack}"),
                    hosts: (0..32).map(|n| ip(rack, n)).collect(),
                    under: Some("top".into()),
                    up_data: None,
                },
            ))
            .unwrap();
        }
        s.create_job(job("big", 1024, 64)).unwrap();
        for g in 0..1024u16 {
            let (rack, n) = (g % 32, g / 32);
            s.join(
                "big",
                None,
                SocketAddr::new(ip(rack, n), 9000),
                Some(u64::from(g)),
            )
            .unwrap();
        }
        let j = s.job_info("big").unwrap();
        assert_eq!((j.switch.as_str(), j.state), ("top", JobState::Running));
        assert_eq!(j.racks.len(), 32);
        assert!(j.racks.iter().all(|r| r.ranks.len() == 32));
        // Every switch of the tree holds it on one range.
        let slots = j.slots.unwrap();
        assert!((0..32).all(|r| s.wanted(&format!("tor{r:02}")).get(&j.id) == Some(&slots)));
        // A 33rd worker on a rack: no rank is left (1024 joined).
        let e = s
            .join("big", None, SocketAddr::new(ip(0, 31), 9001), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("all 1024 ranks have joined"), "{e}");
    }

    #[test]
    fn a_worker_that_joins_again_from_another_rack_moves_the_tree_and_a_failed_tree_frees_every_switch(
    ) {
        let mut s = cluster(Policy::FirstFit);
        s.create_job(JobRequest {
            heartbeat_ms: Some(100),
            ..job("t", 2, 128)
        })
        .unwrap();
        s.join("t", Some(0), worker(1, 1), Some(1)).unwrap();
        s.join("t", Some(1), worker(2, 1), Some(2)).unwrap();
        let racks = |s: &State| -> Vec<String> {
            s.job_info("t")
                .unwrap()
                .racks
                .into_iter()
                .map(|r| r.switch)
                .collect()
        };
        assert_eq!(racks(&s), ["tor1", "tor2"]);
        // Rank 1's new process on a host of rack 3: the tree is placed again over racks 1 and
        // 3, and rack 2 holds nothing of it any more.
        let (_, changes) = s.join("t", Some(1), worker(3, 1), Some(3)).unwrap();
        assert_eq!(racks(&s), ["tor1", "tor3"]);
        assert!(s.wanted("tor2").is_empty());
        assert!(changes
            .iter()
            .any(|c| c.switch == "tor2" && matches!(c.step, Step::Remove(_))));
        assert!(changes.iter().any(|c| c.switch == "tor3"));
        // A silent rank fails it: it leaves every switch of its tree, and stays listed.
        s.fail_job("t", vec![1]).unwrap();
        for sw in ["top", "tor1", "tor3"] {
            assert!(s.wanted(sw).is_empty(), "{sw}");
        }
        assert_eq!(s.job_info("t").unwrap().state, JobState::Failed);
    }

    #[test]
    fn a_tree_without_room_waits_and_is_placed_when_room_frees() {
        let mut s = cluster(Policy::FirstFit);
        s.create_job(JobRequest {
            switch: Some("tor2".into()),
            ..job("full", 2, 1024)
        })
        .unwrap();
        s.create_job(job("t", 2, 128)).unwrap();
        join(&mut s, "t", worker(1, 1)).unwrap();
        join(&mut s, "t", worker(2, 1)).unwrap();
        let t = s.job_info("t").unwrap();
        assert_eq!((t.switch.as_str(), t.state), ("top", JobState::Queued));
        assert!(
            t.placement
                .contains("queued: switch \"tor2\" has room for 0"),
            "{}",
            t.placement
        );
        let changes = s.delete_job("full").unwrap();
        let t = s.job_info("t").unwrap();
        assert_eq!(t.state, JobState::Running);
        assert!(!t.placement.contains("queued"), "{}", t.placement);
        assert!(changes.iter().any(|c| c.switch == "tor1"));
    }
}
