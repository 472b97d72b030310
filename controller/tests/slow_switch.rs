//! One switch that stops answering must not fail the jobs of another, nor hang the API: the
//! controller never holds what it knows while a switch works, and heartbeats never wait for
//! a switch.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use ina_controller::alloc::Policy;
use ina_controller::api::{JobState, SwitchSpec};
use ina_controller::client::ClientError;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

/// A control endpoint that accepts connections and answers none of them for `stall`, as a
/// switch stuck in its I/O; then it closes them all.
fn stalled_endpoint(stall: Duration) -> (SocketAddr, std::thread::JoinHandle<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let thread = std::thread::spawn(move || {
        let until = Instant::now() + stall;
        let mut held = Vec::new();
        while Instant::now() < until {
            match listener.accept() {
                Ok((stream, _)) => held.push(stream),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        held.len()
    });
    (addr, thread)
}

/// The error of a call that should have failed at the controller.
fn api_error<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, String) {
    match r {
        Err(ClientError::Api { status, message }) => (status, message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[test]
fn a_stalled_switch_fails_no_job_of_another_and_does_not_hang_the_api() {
    let stall = Duration::from_secs(20);
    let (sw, ctl) = switch_and_controller(Policy::FairShare);
    let c = ctl.client();
    // A job on the healthy switch whose workers beat every 100 ms: three silent periods, and
    // it would fail.
    let mut req = job("healthy", free_addrs(2), 256, 64);
    req.heartbeat_ms = Some(100);
    let healthy = c.create_job(&req).unwrap();
    c.wait_installed("healthy", Duration::from_secs(10))
        .unwrap();
    let workers = HeldJob::new("healthy", healthy.id, req.workers.clone(), u64::MAX);
    let threads = workers.start(&ctl, &sw);
    wait_for("the healthy job's first operations", || workers.ops() >= 5);

    // A second switch whose control endpoint stalls. Adding it, and creating a job on it,
    // each end with a clear error after the driver's timeout, while everything else goes on.
    let (stalled, endpoint) = stalled_endpoint(stall);
    let stall_began = Instant::now();
    let data: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let c2 = c.clone();
    let on_stalled = std::thread::spawn(move || {
        let c = c2;
        let spec = SwitchSpec::software("stalled", stalled, data, 512, 256);
        let started = Instant::now();
        let added = api_error(c.add_switch(&spec));
        let add_took = started.elapsed();
        let mut req = job("stuck", free_addrs(2), 128, 64);
        req.switch = Some("stalled".into());
        let started = Instant::now();
        let created = api_error(c.create_job(&req));
        (added, add_took, created, started.elapsed())
    });
    let ops_at_stall = workers.ops();

    // Through the whole stall the API answers at once, and the healthy job runs.
    let mut polls = 0;
    while stall_began.elapsed() < stall {
        let asked = Instant::now();
        let jobs = c.jobs().unwrap();
        let took = asked.elapsed();
        assert!(took < Duration::from_secs(2), "GET /v1/jobs took {took:?}");
        let h = jobs.iter().find(|j| j.request.name == "healthy").unwrap();
        assert_eq!(h.state, JobState::Running, "{h:?}");
        polls += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(polls > 50, "{polls} polls in {stall:?}");
    assert!(
        workers.ops() >= ops_at_stall + 20,
        "the healthy job ran {} operations during the stall",
        workers.ops() - ops_at_stall
    );

    // The stalled switch's requests ended with errors that say what happened.
    let (added, add_took, created, create_took) = on_stalled.join().unwrap();
    for ((status, message), took) in [(added, add_took), (created, create_took)] {
        assert_eq!(status, 502, "{message}");
        assert!(
            message.contains("\"stalled\"") && message.contains("no answer within"),
            "{message}"
        );
        assert!(took < Duration::from_secs(15), "took {took:?}: {message}");
    }
    assert!(endpoint.join().unwrap() > 0, "the controller never called");

    // The healthy job was never failed, and every sum was exact (each worker checks its own
    // and panics on a wrong one).
    workers.stop_soon();
    for t in threads {
        assert_eq!(t.join().unwrap().into_iter().collect::<Vec<_>>(), vec![256]);
    }
    let h = c.job("healthy").unwrap();
    assert_eq!((h.state, h.missing.len()), (JobState::Running, 0), "{h:?}");
    // The stuck job is kept, placed, and waits for its switch (retried by the resync).
    let stuck = c.job("stuck").unwrap();
    assert_eq!((stuck.state, stuck.epoch), (JobState::Running, None));
    ctl.stop();
}
