//! A gate in front of a communicator's tensors, which another thread may hold: the
//! controller's agent holds it while the job's slots are moved (a live resize, or a
//! preemption), so that the move happens between tensors on every worker, never in the middle
//! of one.
//!
//! The gate counts the tensors the communicator started. Held *at* `n`, it lets the
//! communicator start tensors up to the `n`-th and no further; the communicator is *parked*
//! once it started exactly `n` and has none in flight. Workers of a job may be at different
//! counts when asked to hold (one finished a tensor a peer has not started), so the controller
//! holds every worker at the largest count any of them reported: the workers behind can finish
//! up to it (the ones ahead already sent their part), and when every worker is parked at the
//! same count, all of them have finished the same tensors and nothing of the job is in flight.
//! The controller then moves the job, and releases the gate; the communicator asks the switch
//! for the job (its new slots and epoch) before its next tensor.

use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct GateState {
    /// Tensors started so far.
    started: u64,
    /// A tensor is in flight.
    busy: bool,
    /// Held: no tensor past this count starts.
    limit: Option<u64>,
    /// Released since the communicator last started a tensor: the job moved.
    moved: bool,
}

/// The gate. Shared (`Arc`) between a [`crate::Communicator`] and whoever holds it.
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tensors the communicator started so far.
    pub fn started(&self) -> u64 {
        self.lock().started
    }

    /// Holds the gate at `limit` tensors: the communicator starts tensors up to that count,
    /// and no more until [`Gate::release`] (or a higher limit).
    pub fn hold_at(&self, limit: u64) {
        let mut s = self.lock();
        s.limit = Some(limit);
        self.changed.notify_all();
    }

    /// Whether the gate is held.
    pub fn is_held(&self) -> bool {
        self.lock().limit.is_some()
    }

    /// Whether the communicator is parked: held, at exactly its limit, nothing in flight.
    pub fn is_parked(&self) -> bool {
        let s = self.lock();
        s.limit == Some(s.started) && !s.busy
    }

    /// Opens the gate; the next tensor first asks the switch for the job again.
    pub fn release(&self) {
        let mut s = self.lock();
        if s.limit.take().is_some() {
            s.moved = true;
        }
        self.changed.notify_all();
    }

    fn may_start(s: &GateState) -> bool {
        s.limit.is_none_or(|l| s.started < l)
    }

    fn start(s: &mut GateState) -> bool {
        s.started += 1;
        s.busy = true;
        std::mem::take(&mut s.moved)
    }

    /// Starts a tensor if the gate lets one through: `Some(moved)`, where `moved` says the job
    /// moved since the last tensor. `None`: held.
    pub(crate) fn try_start(&self) -> Option<bool> {
        let mut s = self.lock();
        Gate::may_start(&s).then(|| Gate::start(&mut s))
    }

    /// With nothing in flight: waits until the gate lets a tensor through, and starts it.
    /// Returns whether the job moved.
    pub(crate) fn wait_start(&self) -> bool {
        let mut s = self.lock();
        s.busy = false;
        self.changed.notify_all();
        while !Gate::may_start(&s) {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        Gate::start(&mut s)
    }

    /// Nothing in flight (the communicator's call returned).
    pub(crate) fn idle(&self) {
        let mut s = self.lock();
        s.busy = false;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_gate_held_at_a_count_lets_tensors_through_up_to_it_then_parks() {
        let g = Arc::new(Gate::new());
        assert_eq!(g.try_start(), Some(false));
        g.hold_at(2);
        assert!(!g.is_parked(), "one tensor in flight, one more allowed");
        assert_eq!(g.try_start(), Some(false));
        assert_eq!(
            g.try_start(),
            None,
            "a third tensor went through a gate held at 2"
        );
        assert!(!g.is_parked(), "still in flight");
        g.idle();
        assert!(g.is_parked());
        assert_eq!(g.started(), 2);
        // The next tensor waits for the release, and learns that the job moved.
        let g2 = g.clone();
        let next = std::thread::spawn(move || g2.wait_start());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!next.is_finished(), "a tensor started through a held gate");
        assert!(g.is_parked());
        g.release();
        assert!(
            next.join().unwrap(),
            "the tensor after a release must ask the switch again"
        );
        assert_eq!(g.try_start(), Some(false), "a move is reported once");
        assert_eq!(g.started(), 4);
    }

    #[test]
    fn a_raised_limit_lets_a_worker_behind_catch_up() {
        let g = Arc::new(Gate::new());
        g.hold_at(0);
        g.idle();
        assert!(g.is_parked());
        let g2 = g.clone();
        let next = std::thread::spawn(move || g2.wait_start());
        std::thread::sleep(Duration::from_millis(20));
        assert!(!next.is_finished());
        // A peer reported one tensor started: the limit rises to 1 and this one goes on.
        g.hold_at(1);
        assert!(!next.join().unwrap(), "a raised limit is no move");
        assert!(!g.is_parked(), "in flight");
        g.idle();
        assert!(g.is_parked());
        // A worker past the limit (it started before it was told) is not parked.
        assert_eq!(g.started(), 1);
        g.hold_at(0);
        assert!(!g.is_parked());
        g.release();
        assert!(!g.is_held());
        g.release();
        assert_eq!(g.try_start(), Some(true));
    }
}
