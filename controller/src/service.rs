//! The controller's operations: change the state, save it, then bring the switches to it
//! through their drivers. A switch that cannot be reached keeps the change pending; every
//! [`Controller::resync`] brings each switch from what it holds to what the state wants, so a
//! restarted switch (which holds nothing) or a restarted controller is provisioned again
//! without ever giving one slot to two jobs.
//!
//! **Locking.** What the controller knows sits behind one lock, which is never held while a
//! switch works (a software switch may take seconds to answer, bmv2's CLI up to 20 s). Each
//! change to a switch is planned under the lock, made through the driver without it, and its
//! outcome recorded under it again, checked against whatever changed meanwhile. The changes
//! to one switch are made one at a time (its turn), so a slow or stalled switch holds up only
//! the requests that change that switch; every other request, every heartbeat and the
//! liveness checks go on.

mod inner;

use crate::alloc::Policy;
use crate::api::{Health, Heartbeat, JobRequest, JobStatus, JoinRequest, Joined};
use crate::api::{SwitchInfo, SwitchKind, SwitchSpec};
use crate::driver::bmv2::Bmv2Switch;
use crate::driver::tofino::TofinoSwitch;
use crate::driver::{DriverError, SoftwareSwitch, SwitchDriver};
use crate::state::{State, StateError};
use crate::store::{Store, StoreError};
use inner::{Action, Inner, Link};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

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

/// The controller: its state, where it is saved, and a driver per switch. Shared between
/// threads (every method takes `&self`).
pub struct Controller {
    inner: Mutex<Inner>,
}

/// The longest a move waits for a job's workers to park before it is made anyway (the
/// tensors in flight then fail with `switch_restarted`, and the next ones run on the new
/// slots): at least this, and five heartbeat periods.
pub const MOVE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beat {
    /// The job, as `GET /v1/jobs/{name}` answers it.
    pub job: JobStatus,
    /// The job's switch, when this report completed the parking of a move: the move is to be
    /// made now, apart from the heartbeat ([`Controller::bring`]), which never waits for a
    /// switch.
    pub bring: Option<String>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("state", self.lock().state())
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
        Ok(Controller {
            inner: Mutex::new(Inner::open(policy, store, factory)?),
        })
    }

    /// The lock on what the controller knows; never held while a switch works.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of the state.
    pub fn state(&self) -> State {
        self.lock().state().clone()
    }

    pub fn counters(&self) -> Counters {
        self.lock().counters()
    }

    /// Counts a request refused before it changed anything.
    pub fn refused(&self) {
        self.lock().refused();
    }

    /// The controller's counters and gauges in Prometheus' text format.
    pub fn metrics_text(&self) -> String {
        self.lock().metrics_text()
    }

    pub fn health(&self) -> Health {
        self.lock().health()
    }

    pub fn switches(&self) -> Vec<SwitchInfo> {
        self.lock().switches()
    }

    /// The names of the switches.
    pub fn switch_names(&self) -> Vec<String> {
        self.lock().switch_names()
    }

    pub fn jobs(&self) -> Vec<JobStatus> {
        self.lock().jobs()
    }

    pub fn job(&self, name: &str) -> Result<JobStatus, ControllerError> {
        self.lock().job(name)
    }

    /// Adds a switch, and brings it to the state (it should hold no jobs of this controller's:
    /// any job it holds that the state does not place there is removed).
    pub fn add_switch(&self, spec: SwitchSpec) -> Result<SwitchInfo, ControllerError> {
        let name = spec.name.clone();
        self.lock().add_switch(spec)?;
        self.resync_now(&name)?;
        self.lock().switch_info(&name)
    }

    /// Stops placing new jobs on a switch.
    pub fn drain_switch(&self, name: &str) -> Result<SwitchInfo, ControllerError> {
        self.lock().drain_switch(name)
    }

    /// Creates a job and installs it (and the other jobs' new ranges) on its switch.
    pub fn create_job(&self, request: JobRequest) -> Result<JobStatus, ControllerError> {
        let name = request.name.clone();
        let switch = self.lock().create_job(request)?;
        self.bring(&switch)?;
        let info = self.job(&name)?;
        tracing::info!(job = %name, id = info.id, switch = %info.switch, slots = ?info.slots, "job created");
        Ok(info)
    }

    /// A worker joins a job; once all have, the job is installed.
    pub fn join(&self, name: &str, req: JoinRequest) -> Result<Joined, ControllerError> {
        let (rank, switches) = self.lock().join(name, &req)?;
        self.bring_all(switches)?;
        self.lock().joined(name, rank)
    }

    /// A worker of job `name` is alive, has started `started` tensors (if it can be held) and
    /// is `parked` or not; returns the job (failed, if its peers went silent; with `park_at`
    /// while it is being moved), and the switch to bring if this report completed a move's
    /// parking. Recorded at once: a heartbeat never waits for a switch.
    pub fn heartbeat(&self, name: &str, hb: &Heartbeat) -> Result<Beat, ControllerError> {
        let (job, bring) = self.lock().heartbeat(name, hb)?;
        Ok(Beat { job, bring })
    }

    /// Fails every job installed on its switch with heartbeats whose rank has been silent for
    /// three heartbeat periods (counted from its latest heartbeat, or from when the job was
    /// first seen installed here), up to now, after every heartbeat received so far. Returns
    /// the failed jobs and their missing ranks; the next [`resync`](Self::resync) (or
    /// [`bring`](Self::bring)) takes them off their switches.
    pub fn check_members(&self) -> Vec<(String, Vec<crate::api::Rank>)> {
        self.lock().check_members()
    }

    /// Deletes a job, frees its slots and gives them to the others on its switch.
    pub fn delete_job(&self, name: &str) -> Result<(), ControllerError> {
        let switches = self.lock().delete_job(name)?;
        self.bring_all(switches)
    }

    /// Brings every switch from what it holds to what the state wants; returns the switches
    /// that could not be reached, with why. A switch that could not be reached is tried again
    /// after a wait that doubles, from one period up to 30 s, so that a switch that is gone
    /// costs little (each attempt may wait for its connection timeout).
    pub fn resync(&self, now: Instant, period: Duration) -> Vec<(String, DriverError)> {
        self.switch_names()
            .into_iter()
            .filter_map(|name| {
                let e = self.resync_switch(&name, now, period)?;
                Some((name, e))
            })
            .collect()
    }

    /// [`resync`](Self::resync) of one switch: skipped while it waits after a failure, or
    /// while another operation changes it (that one brings it to the state as well).
    /// Returns why it could not be reached.
    pub fn resync_switch(
        &self,
        switch: &str,
        now: Instant,
        period: Duration,
    ) -> Option<DriverError> {
        let link = {
            let inner = self.lock();
            if !inner.due(switch, now) {
                return None;
            }
            inner.link(switch)?
        };
        let _turn = match link.turn.try_lock() {
            Ok(turn) => turn,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        let error = match self.resync_with(switch, &link) {
            Ok(()) => None,
            Err(ControllerError::Driver { source, .. }) => Some(source),
            Err(e) => {
                tracing::warn!(%switch, error = %e, "resync");
                None
            }
        };
        self.lock().reached(switch, error.as_ref(), now, period);
        drop(_turn);
        self.bring_follow();
        error
    }

    /// The switches not reachable at their last resync.
    pub fn unreachable(&self) -> Vec<String> {
        self.lock().unreachable()
    }

    /// Asks a switch what it holds, then brings it to the state, in its turn.
    fn resync_now(&self, switch: &str) -> Result<(), ControllerError> {
        let Some(link) = self.lock().link(switch) else {
            return Ok(());
        };
        let _turn = link.turn.lock().unwrap_or_else(PoisonError::into_inner);
        self.resync_with(switch, &link)
    }

    fn resync_with(&self, switch: &str, link: &Link) -> Result<(), ControllerError> {
        self.step(switch, link, Action::Read)?;
        self.bring_with(switch, link)
    }

    /// Brings a switch from what it holds (as last seen) to what the state wants, in its
    /// turn: one change at a time, every change ordered so that no slot is ever given to two
    /// jobs; a switch not seen yet is asked first.
    /// The switches whose changes waited on it (a tree's rack switches, after its upper
    /// switch) are brought after it.
    pub fn bring(&self, switch: &str) -> Result<(), ControllerError> {
        let result = self.bring_one(switch);
        self.bring_follow();
        result
    }

    /// [`bring`](Self::bring) each of `switches`, in order; the first error, after trying
    /// them all.
    pub fn bring_all(&self, switches: Vec<String>) -> Result<(), ControllerError> {
        let mut first = None;
        for switch in switches {
            if let Err(e) = self.bring_one(&switch) {
                first.get_or_insert(e);
            }
        }
        self.bring_follow();
        first.map_or(Ok(()), Err)
    }

    fn bring_one(&self, switch: &str) -> Result<(), ControllerError> {
        let Some(link) = self.lock().link(switch) else {
            return Ok(());
        };
        let _turn = link.turn.lock().unwrap_or_else(PoisonError::into_inner);
        self.bring_with(switch, &link)
    }

    /// Brings the switches that wait on changes just made; one that fails is tried again at
    /// its next resync.
    fn bring_follow(&self) {
        loop {
            let follow = self.lock().take_follow();
            if follow.is_empty() {
                return;
            }
            for switch in follow {
                if let Err(e) = self.bring_one(&switch) {
                    tracing::warn!(%switch, error = %e, "bringing a switch after the one it waits on");
                }
            }
        }
    }

    /// [`bring`](Self::bring), in the switch's turn already.
    fn bring_with(&self, switch: &str, link: &Link) -> Result<(), ControllerError> {
        loop {
            let next = self.lock().next_action(switch);
            let Some(action) = next else {
                return Ok(());
            };
            self.step(switch, link, action)?;
        }
    }

    /// Makes one change through the switch's driver, with the lock released, and records
    /// what the switch did.
    fn step(&self, switch: &str, link: &Link, action: Action) -> Result<(), ControllerError> {
        tracing::debug!(switch, ?action, "changing the switch");
        let read = action == Action::Read;
        match action.perform(link.driver.as_ref()) {
            Ok(done) => self.lock().commit(switch, done),
            Err(source) => {
                self.lock().failed(switch, read, &source);
                Err(ControllerError::Driver {
                    switch: switch.to_string(),
                    source,
                })
            }
        }
    }
}
