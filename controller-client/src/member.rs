//! A worker's membership of a job the controller runs: its heartbeats, and the
//! [`Gate`] the controller holds while it moves the job to other slots (a live resize, or a
//! preemption). Runs on its own thread beside the worker's communicator.
//!
//! Each heartbeat reports the gate's count of tensors started and whether the worker is
//! parked. While the controller answers with `park_at`, the gate is held at that count and
//! heartbeats go out every [`HELD_PERIOD`] (the move waits for them); when `park_at` clears,
//! the gate is released and the communicator asks the switch for the job's new slots before
//! its next tensor.

use crate::api::{Heartbeat, JobState};
use crate::client::Client;
use ina_worker::Gate;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a held worker reports.
pub const HELD_PERIOD: Duration = Duration::from_millis(10);

/// A held worker whose controller cannot be reached for this long lets its communicator go on
/// on the old slots (the controller holds it again when it is back).
pub const UNREACHABLE_RELEASE: Duration = Duration::from_secs(20);

/// The membership thread; stopped when dropped.
#[derive(Debug)]
pub struct Member {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Member {
    /// Starts reporting rank `rank` of job `name` every `period`. `on_failed` runs (on the
    /// membership thread, once) with the missing ranks if the controller answers that the job
    /// failed; the thread then ends.
    pub fn spawn(
        client: Client,
        name: String,
        rank: crate::api::Rank,
        period: Duration,
        gate: Arc<Gate>,
        on_failed: impl FnOnce(Vec<crate::api::Rank>) + Send + 'static,
    ) -> std::io::Result<Member> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ina-member".into())
            .spawn(move || {
                let mut on_failed = Some(on_failed);
                let mut unreachable_since: Option<Instant> = None;
                while !stopped.load(Ordering::Relaxed) {
                    let hb = Heartbeat {
                        rank,
                        started: Some(gate.started()),
                        parked: gate.is_parked(),
                    };
                    match client.report(&name, &hb) {
                        Ok(j) if j.state == JobState::Failed => {
                            gate.release();
                            if let Some(f) = on_failed.take() {
                                f(j.missing);
                            }
                            return;
                        }
                        Ok(j) => {
                            unreachable_since = None;
                            match j.park_at {
                                Some(n) => gate.hold_at(n),
                                None if gate.is_held() => {
                                    tracing::info!(job = %name, epoch = ?j.epoch, slots = ?j.slots, "job moved; going on on its new slots");
                                    gate.release()
                                }
                                None => {}
                            }
                        }
                        Err(e) => {
                            let since = *unreachable_since.get_or_insert_with(|| {
                                tracing::warn!(error = %e, "heartbeat not delivered; the job runs on");
                                Instant::now()
                            });
                            if gate.is_held() && since.elapsed() >= UNREACHABLE_RELEASE {
                                tracing::warn!("controller unreachable while the job was held: going on on the old slots");
                                gate.release();
                            }
                        }
                    }
                    let wait = if gate.is_held() { HELD_PERIOD } else { period };
                    let until = Instant::now() + wait;
                    while !stopped.load(Ordering::Relaxed) && Instant::now() < until {
                        std::thread::sleep(wait.min(Duration::from_millis(20)));
                    }
                }
            })?;
        Ok(Member {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
