//! The controller against real software switches over loopback: jobs placed and installed
//! through the API, workers summing through them, clear errors, the access token, and both
//! restarts (the controller's and the switch's).
#![allow(clippy::unwrap_used)]

use ina_controller::alloc::{self, Policy};
use ina_controller::api::{Heartbeat, JobState};
use ina_controller::client::{Client, ClientError};
use ina_controller::server::{self, ServeError, ServerConfig};
use ina_controller::service::{drivers, Controller};
use ina_controller::store::Store;
use ina_controller::token::TokenError;
use ina_switch_api::{ControlClient, Request};
use ina_worker::{Communicator, WorkerConfig};
use std::net::UdpSocket;
use std::time::{Duration, Instant};

mod common;

use common::*;
#[test]
fn four_jobs_share_one_switch_and_every_sum_is_exact() {
    let sw = RunningSwitch::start("127.0.0.1:0", "127.0.0.1:0", 1024);
    let ctl = RunningController::start(None, Policy::FairShare, "127.0.0.1:0");
    let c = ctl.client();
    c.add_switch(&switch_spec("tor-1", &sw, 1024)).unwrap();
    let sizes = [2usize, 3, 4, 2];
    let windows = [(512, 128), (256, 64), (256, 128), (128, 64)];
    let mut jobs = Vec::new();
    for (j, (&n, &(w, m))) in sizes.iter().zip(&windows).enumerate() {
        let workers = free_addrs(n);
        let info = c
            .create_job(&job(&format!("job-{j}"), workers.clone(), w, m))
            .unwrap();
        assert_eq!(info.state, JobState::Running);
        jobs.push((info, workers));
    }
    // Every job holds slots the switch agrees on, and no two overlap; fair share gives the
    // 1024 slots out as 384 + 256 + 256 + 128 (max-min: the two largest windows split the
    // rest evenly after the others are satisfied).
    let held = sw.jobs();
    for (info, _) in jobs.iter_mut() {
        *info = c.job(&info.request.name).unwrap();
    }
    let mut ranges = Vec::new();
    for (info, _) in &jobs {
        let r = info.slots.unwrap();
        assert!(
            held.contains(&(info.id, r.base, r.count)),
            "{held:?} lacks {info:?}"
        );
        ranges.push(r);
        assert!(info.epoch.is_some());
    }
    let counts: Vec<u16> = ranges.iter().map(|r| r.count).collect();
    assert_eq!(counts, vec![384, 256, 256, 128]);
    for (i, a) in ranges.iter().enumerate() {
        for b in &ranges[i + 1..] {
            assert!(!a.overlaps(b));
        }
    }
    // All four jobs' workers sum at once.
    let len = 50_000;
    let mut threads = Vec::new();
    for (j, (info, workers)) in jobs.iter().enumerate() {
        for (r, &addr) in workers.iter().enumerate() {
            let cfg = WorkerConfig::new(sw.udp, addr, info.id, r as u8);
            threads.push(std::thread::spawn(move || {
                let mut comm = Communicator::connect(cfg).unwrap();
                let mut t = tensor(j, r, len);
                comm.allreduce_i32(&mut t).unwrap();
                (j, t)
            }));
        }
    }
    for t in threads {
        let (j, got) = t.join().unwrap();
        let inputs: Vec<Vec<i32>> = (0..sizes[j]).map(|r| tensor(j, r, len)).collect();
        let want: Vec<i32> = (0..len)
            .map(|i| inputs.iter().map(|t| t[i]).sum())
            .collect();
        assert!(got == want, "job {j}: wrong sum");
    }
    // Isolation: job 0's rank 0, from its own address, writes into job 1 (as job 1's rank 0)
    // and into job 1's slots (as itself): both dropped, and counted.
    let stats = |sw: &RunningSwitch| {
        let mut c = ControlClient::connect(sw.control).unwrap();
        c.call(&Request::Stats)
            .unwrap()
            .stats
            .unwrap()
            .total
            .pipeline
    };
    let before = stats(&sw);
    let (a, a_workers) = &jobs[0];
    let (b, _) = &jobs[1];
    let from = UdpSocket::bind(a_workers[0]).unwrap();
    let b_slot = b.slots.unwrap().base;
    for (job, epoch, slot) in [
        (b.id, b.epoch.unwrap(), b_slot),
        (a.id, a.epoch.unwrap(), b_slot),
    ] {
        let h = ina_wire::AggRepr {
            kind: ina_wire::MessageType::Data,
            set: 0,
            gap: None,
            job,
            epoch,
            rank: 0,
            exponent: 0,
            slot,
            count: 64,
            seq: 1 << 20,
        };
        let mut bytes = vec![0u8; ina_wire::HEADER_LEN + 4 * 64];
        h.emit_into(&mut bytes).unwrap();
        from.send_to(&bytes, sw.udp).unwrap();
    }
    let up = Instant::now();
    loop {
        let after = stats(&sw);
        if after.wrong_port > before.wrong_port
            && after.slot_out_of_range > before.slot_out_of_range
        {
            break;
        }
        assert!(up.elapsed() < Duration::from_secs(5), "{after:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(from);
    // Deleting the largest job gives its slots to the others, on the switch too.
    c.delete_job("job-0").unwrap();
    let after: Vec<u16> = (1..4)
        .map(|j| c.job(&format!("job-{j}")).unwrap().slots.unwrap().count)
        .collect();
    assert_eq!(after, vec![256, 256, 128]);
    let held = sw.jobs();
    assert_eq!(held.len(), 3);
    assert!(!held.iter().any(|(id, _, _)| *id == jobs[0].0.id));
    ctl.stop();
}

#[test]
fn workers_join_by_job_name_and_the_job_runs_once_all_have() {
    let sw = RunningSwitch::start("127.0.0.1:0", "127.0.0.1:0", 512);
    let ctl = RunningController::start(None, Policy::FairShare, "127.0.0.1:0");
    let c = ctl.client();
    c.add_switch(&switch_spec("tor", &sw, 512)).unwrap();
    let mut req = job("joined", Vec::new(), 256, 64);
    req.size = Some(3);
    let info = c.create_job(&req).unwrap();
    assert_eq!((info.state, info.epoch), (JobState::Running, None));
    assert!(sw.jobs().is_empty(), "installed before its workers joined");
    let len = 20_000;
    let ctl_addr = ctl.addr.to_string();
    let threads: Vec<_> = (0..3)
        .map(|i| {
            let ctl_addr = ctl_addr.clone();
            std::thread::spawn(move || {
                // Each worker knows only the controller and the job's name.
                let c = Client::new(&ctl_addr, Some(TOKEN.into()));
                let port = ina_io::UdpPort::bind_with(
                    "127.0.0.1:0".parse().unwrap(),
                    &ina_io::UdpConfig::default(),
                )
                .unwrap();
                let me = ina_io::Port::local_addr(&port);
                // Rank 2 asks for its rank; the others take the lowest free one.
                let joined = c.join("joined", (i == 2).then_some(2), me, None).unwrap();
                c.wait_installed("joined", Duration::from_secs(20)).unwrap();
                let cfg = WorkerConfig::new(joined.switch, me, joined.job, joined.switch_rank);
                let mut comm = Communicator::with_port(port, cfg).unwrap();
                let mut t = tensor(9, usize::from(joined.rank), len);
                comm.allreduce_i32(&mut t).unwrap();
                (joined.rank, t)
            })
        })
        .collect();
    let mut ranks = Vec::new();
    let inputs: Vec<Vec<i32>> = (0..3).map(|r| tensor(9, r, len)).collect();
    let want: Vec<i32> = (0..len)
        .map(|i| inputs.iter().map(|t| t[i]).sum())
        .collect();
    for t in threads {
        let (rank, got) = t.join().unwrap();
        assert!(got == want, "rank {rank}: wrong sum");
        ranks.push(rank);
    }
    ranks.sort();
    assert_eq!(ranks, vec![0, 1, 2]);
    let info = c.job("joined").unwrap();
    assert_eq!(info.members.len(), 3);
    assert_eq!(sw.jobs(), vec![(info.id, 0, 256)]);
    // A fourth worker, an unspecified address, a rank out of range: refused.
    for (rank, addr) in [
        (None, "127.0.0.1:9"),
        (Some(0), "0.0.0.0:5"),
        (Some(7), "127.0.0.1:10"),
    ] {
        match c.join("joined", rank, addr.parse().unwrap(), None) {
            Err(ClientError::Api { status: 400, .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    ctl.stop();
}

#[test]
fn a_silent_worker_fails_its_job_and_frees_its_slots() {
    let (sw, ctl, metrics) = switch_and_fair_share_controller_with_metrics();
    let c = ctl.client();
    let mut hb = job("watched", free_addrs(3), 512, 64);
    hb.heartbeat_ms = Some(100);
    let watched = c.create_job(&hb).unwrap();
    let other = c.create_job(&job("other", free_addrs(2), 512, 64)).unwrap();
    assert_eq!(c.job("other").unwrap().slots.unwrap().count, 256);
    // Ranks 0 and 1 beat; rank 2 never does.
    let up = Instant::now();
    let failed = loop {
        let a = c.heartbeat("watched", 0).unwrap();
        c.heartbeat("watched", 1).unwrap();
        if a.state == JobState::Failed {
            break a;
        }
        assert!(up.elapsed() < Duration::from_secs(10), "{a:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(failed.missing, vec![2]);
    // Off the switch, its slots to the other job, and joining it again is refused.
    let up = Instant::now();
    while sw.jobs() != vec![(other.id, 0, 512)] {
        assert!(up.elapsed() < Duration::from_secs(10), "{:?}", sw.jobs());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!sw.jobs().iter().any(|(id, _, _)| *id == watched.id));
    match c.wait_installed("watched", Duration::from_secs(1)) {
        Err(ClientError::JobFailed { missing, .. }) => assert_eq!(missing, vec![2]),
        other => panic!("{other:?}"),
    }
    // Deleting it lets the name be used again.
    c.delete_job("watched").unwrap();
    c.create_job(&job("watched", free_addrs(1), 128, 64))
        .unwrap();
    // The counters say so.
    assert_metrics(
        metrics,
        &[
            "ina_controller_jobs_created_total 3",
            "ina_controller_jobs_failed_total 1",
            "ina_controller_jobs_deleted_total 1",
            "ina_controller_jobs_running 2",
            "ina_controller_switches_unreachable 0",
        ],
    );
    ctl.stop();
}

#[test]
fn a_higher_priority_job_preempts_a_lower_one_and_gives_its_slots_back() {
    let (sw, ctl) = switch_and_controller(Policy::Priority);
    let c = ctl.client();
    let low = c.create_job(&job("low", free_addrs(2), 512, 256)).unwrap();
    assert_eq!(sw.jobs(), vec![(low.id, 0, 512)]);
    // A higher-priority job that needs 384: the low one cannot keep its minimum of 256, so it
    // is preempted (off the switch, queued) rather than shrunk below it.
    let mut req = job("high", free_addrs(2), 384, 384);
    req.priority = 7;
    let high = c.create_job(&req).unwrap();
    assert_eq!(c.job("low").unwrap().state, JobState::Queued);
    assert_eq!(sw.jobs(), vec![(high.id, 0, 384)]);
    // A second high-priority job takes the rest: 128.
    let mut req = job("high2", free_addrs(1), 128, 64);
    req.priority = 7;
    let high2 = c.create_job(&req).unwrap();
    assert_eq!(high2.slots.map(|r| r.count), Some(128));
    // When the high jobs leave, the low one runs again with its whole window.
    c.delete_job("high").unwrap();
    c.delete_job("high2").unwrap();
    let low = c.job("low").unwrap();
    assert_eq!(low.state, JobState::Running);
    assert_eq!(sw.jobs(), vec![(low.id, 0, 512)]);
    ctl.stop();
}

#[test]
fn requests_are_validated_with_clear_errors() {
    let ctl = RunningController::start(None, Policy::FirstFit, "127.0.0.1:0");
    let c = ctl.client();
    let api = |r: Result<_, ClientError>| match r {
        Err(ClientError::Api { status, message }) => (status, message),
        other => panic!("expected an API error, got {other:?}"),
    };
    let (s, m) = api(c.create_job(&job("j", free_addrs(2), 128, 64)).map(|_| ()));
    assert_eq!(s, 400);
    assert!(m.contains("no switches"), "{m}");
    let sw = RunningSwitch::start("127.0.0.1:0", "127.0.0.1:0", 512);
    c.add_switch(&switch_spec("s1", &sw, 512)).unwrap();
    let (s, m) = api(c.add_switch(&switch_spec("s1", &sw, 512)).map(|_| ()));
    assert_eq!((s, m.contains("exists")), (409, true), "{m}");
    let (s, m) = api(c
        .create_job(&job("bad name!", free_addrs(1), 128, 64))
        .map(|_| ()));
    assert_eq!((s, m.contains("name")), (400, true), "{m}");
    let (s, m) = api(c.create_job(&job("j", free_addrs(1), 100, 64)).map(|_| ()));
    assert_eq!((s, m.contains("whole blocks")), (400, true), "{m}");
    let (s, m) = api(c
        .create_job(&job("j", free_addrs(1), 1024, 1024))
        .map(|_| ()));
    assert_eq!((s, m.contains("has 512")), (400, true), "{m}");
    let a = free_addrs(1)[0];
    let (s, m) = api(c.create_job(&job("j", vec![a, a], 128, 64)).map(|_| ()));
    assert_eq!((s, m.contains("twice")), (400, true), "{m}");
    c.create_job(&job("j", free_addrs(2), 256, 256)).unwrap();
    let (s, _) = api(c.create_job(&job("j", free_addrs(2), 128, 64)).map(|_| ()));
    assert_eq!(s, 409);
    // First fit: a job that finds no room queues, and runs once room frees up.
    c.create_job(&job("k", free_addrs(2), 256, 256)).unwrap();
    let q = c.create_job(&job("q", free_addrs(2), 128, 128)).unwrap();
    assert_eq!(q.state, JobState::Queued);
    c.delete_job("j").unwrap();
    let q = c.job("q").unwrap();
    assert_eq!(q.state, JobState::Running);
    assert!(sw.jobs().iter().any(|(id, _, n)| *id == q.id && *n == 128));
    let (s, _) = api(c.job("nope").map(|_| ()));
    assert_eq!(s, 404);
    let (s, _) = api(c.delete_job("nope"));
    assert_eq!(s, 404);
    // A body that is not a request, and a field this version does not know.
    let http = ureq::post(&format!("http://{}/v1/jobs", ctl.addr))
        .set("Content-Type", "application/json")
        .set("Authorization", &format!("Bearer {TOKEN}"))
        .send_string("{\"name\": \"x\", \"colour\": 1}");
    match http {
        Err(ureq::Error::Status(400, r)) => {
            assert!(r.into_string().unwrap().contains("bad request body"))
        }
        other => panic!("{other:?}"),
    }
    ctl.stop();
}

#[test]
fn every_listener_requires_a_token_and_checks_it() {
    // Without a token the server does not start, on loopback too.
    let ctl = Controller::open(Policy::FairShare, None, drivers()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        server::serve(l, ctl, ServerConfig::default(), async {}).await
    });
    assert!(
        matches!(err, Err(ServeError::Token(TokenError::Missing))),
        "{err:?}"
    );
    // Every request must carry it.
    let ctl = RunningController::start(None, Policy::FairShare, "127.0.0.1:0");
    match ctl.client_with(None).health() {
        Err(ClientError::Api {
            status: 401,
            message,
        }) => assert!(message.contains("STATE_DIR/token"), "{message}"),
        other => panic!("{other:?}"),
    }
    match ctl.client_with(Some("0123456789abcdef-wrong")).jobs() {
        Err(ClientError::Api { status: 401, .. }) => {}
        other => panic!("{other:?}"),
    }
    let h = ctl.client().health().unwrap();
    assert_eq!(h.version, "v1");
    ctl.stop();
}

#[test]
fn restarts_of_the_controller_and_the_switch_keep_every_job() {
    let dir = temp_dir("restart");
    let sw = RunningSwitch::start("127.0.0.1:0", "127.0.0.1:0", 1024);
    let control = sw.control;
    let ctl = RunningController::start(Some(&dir), Policy::FairShare, "127.0.0.1:0");
    let c = ctl.client();
    c.add_switch(&switch_spec("tor", &sw, 1024)).unwrap();
    for (j, w) in [512u16, 256, 256].into_iter().enumerate() {
        c.create_job(&job(&format!("j{j}"), free_addrs(2), w, 64))
            .unwrap();
    }
    let before = c.jobs().unwrap();
    let held = sw.jobs();
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("controller-state.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the state file holds tokens");
    }
    ctl.stop();

    // A new controller on the same state: the same jobs, and the switch untouched.
    let ctl = RunningController::start(Some(&dir), Policy::FairShare, "127.0.0.1:0");
    let c = ctl.client();
    assert_eq!(c.jobs().unwrap(), before);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(sw.jobs(), held);
    // The wrong policy for the saved state is refused with the way out.
    let e = Controller::open(
        Policy::Priority,
        Some(Store::open(&dir).unwrap()),
        drivers(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("--policy fair-share or move"), "{e}");

    // The switch restarts empty on the same control address: provisioned again.
    drop(sw);
    let sw = RunningSwitch::start("127.0.0.1:0", &control.to_string(), 1024);
    let up = Instant::now();
    while sw.jobs() != held {
        assert!(
            up.elapsed() < Duration::from_secs(10),
            "not provisioned again: {:?} against {held:?}",
            sw.jobs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Under new epochs, which the controller now reports.
    let after = c.jobs().unwrap();
    let up = Instant::now();
    loop {
        let after = c.jobs().unwrap();
        if after
            .iter()
            .zip(&before)
            .all(|(a, b)| a.epoch.is_some() && a.epoch != b.epoch)
        {
            break;
        }
        assert!(up.elapsed() < Duration::from_secs(10), "{after:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(alloc::is_sound(
        1024,
        &after.iter().map(|j| (j.id, j.slots.unwrap())).collect()
    ));
    ctl.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn running_jobs_shrink_and_grow_live_between_tensors_and_every_sum_is_exact() {
    let (sw, ctl, metrics) = switch_and_fair_share_controller_with_metrics();
    let c = ctl.client();
    let mut req = job("a", free_addrs(2), 512, 64);
    req.heartbeat_ms = Some(100);
    let a = c.create_job(&req).unwrap();
    assert_eq!(a.slots.unwrap().count, 512);
    let held_a = HeldJob::new("a", a.id, req.workers.clone(), u64::MAX);
    let a_threads = held_a.start(&ctl, &sw);
    wait_for("a's first operations", || held_a.ops() >= 10);
    // B arrives: fair share gives each 256, and A moves to its new slots between two of its
    // tensors, while it runs.
    let mut req_b = job("b", free_addrs(2), 512, 64);
    req_b.heartbeat_ms = Some(100);
    let b = c.create_job(&req_b).unwrap();
    let moved = |c: &Client, n: &str, count: u16| {
        let j = c.job(n).unwrap();
        j.park_at.is_none() && j.epoch.is_some() && j.slots.map(|r| r.count) == Some(count)
    };
    wait_for("a to shrink", || moved(&c, "a", 256));
    c.wait_installed("b", Duration::from_secs(30)).unwrap();
    let b_threads = HeldJob::new("b", b.id, req_b.workers.clone(), 30).start(&ctl, &sw);
    let before = held_a.ops();
    wait_for("a to go on after the move", || held_a.ops() >= before + 10);
    for t in b_threads {
        assert_eq!(t.join().unwrap().into_iter().collect::<Vec<_>>(), vec![256]);
    }
    // B leaves: A grows back to its whole window, again between tensors.
    c.delete_job("b").unwrap();
    wait_for("a to grow", || moved(&c, "a", 512));
    let before = held_a.ops();
    wait_for("a to go on after growing", || held_a.ops() >= before + 10);
    held_a.stop_soon();
    for t in a_threads {
        let windows: Vec<u16> = t.join().unwrap().into_iter().collect();
        assert_eq!(
            windows,
            vec![256, 512],
            "a ran with its halved and its whole window"
        );
    }
    let s = c.job("a").unwrap().slots.unwrap();
    assert_eq!(sw.jobs(), vec![(a.id, s.base, 512)]);
    assert_metrics(
        metrics,
        &[
            "ina_controller_moves_live_total 2",
            "ina_controller_moves_forced_total 0",
        ],
    );
    ctl.stop();
}

#[test]
fn a_preempted_job_parks_between_tensors_and_resumes_with_exact_sums() {
    let (sw, ctl) = switch_and_controller(Policy::Priority);
    let c = ctl.client();
    let mut req = job("low", free_addrs(2), 512, 256);
    req.heartbeat_ms = Some(100);
    let low = c.create_job(&req).unwrap();
    let held_low = HeldJob::new("low", low.id, req.workers.clone(), u64::MAX);
    let threads = held_low.start(&ctl, &sw);
    wait_for("low's first operations", || held_low.ops() >= 10);
    // A higher-priority job that leaves less than low's minimum: low is taken off the switch
    // once its workers park, and they stay parked while it is queued.
    let mut high = job("high", free_addrs(2), 384, 384);
    high.priority = 9;
    high.heartbeat_ms = Some(100);
    let h = c.create_job(&high).unwrap();
    c.wait_installed("high", Duration::from_secs(30)).unwrap();
    assert_eq!(c.job("low").unwrap().state, JobState::Queued);
    let parked_at = held_low.ops();
    for t in HeldJob::new("high", h.id, high.workers.clone(), 20).start(&ctl, &sw) {
        t.join().unwrap();
    }
    assert_eq!(
        held_low.ops(),
        parked_at,
        "a preempted job's workers ran on"
    );
    // The high job leaves: low runs again on its whole window, from where it parked.
    c.delete_job("high").unwrap();
    wait_for("low to run again", || held_low.ops() >= parked_at + 10);
    held_low.stop_soon();
    for t in threads {
        assert_eq!(t.join().unwrap().into_iter().collect::<Vec<_>>(), vec![512]);
    }
    assert_eq!(c.job("low").unwrap().state, JobState::Running);
    ctl.stop();
}

#[test]
fn a_report_of_a_worker_parked_for_the_last_move_does_not_make_the_next_one() {
    let (sw, ctl) = switch_and_controller(Policy::FairShare);
    let c = ctl.client();
    let mut req = job("a", free_addrs(2), 512, 64);
    req.heartbeat_ms = Some(5_000);
    let a = c.create_job(&req).unwrap();
    c.wait_installed("a", Duration::from_secs(30)).unwrap();
    // The slots A has on the switch.
    let installed = || sw.jobs().iter().find(|j| j.0 == a.id).map(|j| j.2);
    let report = |rank: u8, started: u64, parked: bool| {
        c.report(
            "a",
            &Heartbeat {
                rank: rank.into(),
                started: Some(started),
                parked,
            },
        )
        .unwrap()
    };
    for rank in 0..2 {
        report(rank, 5, false);
    }
    // B arrives: A is held at 5 tensors, both ranks report parked there, and A shrinks.
    let mut req_b = job("b", free_addrs(2), 512, 64);
    req_b.heartbeat_ms = Some(5_000);
    c.create_job(&req_b).unwrap();
    wait_for("a to be held", || c.job("a").unwrap().park_at == Some(5));
    for rank in 0..2 {
        report(rank, 5, true);
    }
    wait_for("a to shrink", || {
        c.job("a").unwrap().park_at.is_none() && installed() == Some(256)
    });
    // Released, both ranks run their next tensors and have not reported since. B leaves:
    // their last reports, parked at 5 for the shrink, must not make the growth, which
    // would reinstall A under tensors in flight.
    c.delete_job("b").unwrap();
    wait_for("a to be held again", || {
        c.job("a").unwrap().park_at.is_some()
    });
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        (installed(), c.job("a").unwrap().park_at),
        (Some(256), Some(5)),
        "moved on reports made for the last move"
    );
    // Reports made for this move do.
    for rank in 0..2 {
        report(rank, 5, true);
    }
    wait_for("a to grow", || {
        c.job("a").unwrap().park_at.is_none() && installed() == Some(512)
    });
    assert_eq!(sw.jobs().len(), 1);
    ctl.stop();
}
