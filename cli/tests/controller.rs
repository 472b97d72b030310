//! The controller as it is deployed: separate processes for the switch, the controller and
//! the workers; the workers know only the controller and the job's name; the controller is
//! killed with SIGKILL mid-run and restarted, and the running job finishes correctly.
#![allow(clippy::unwrap_used)]

// (Each test binary uses part of the shared harness.)
#[allow(dead_code)]
mod common;

use common::*;
use ina_controller::api::{JobRequest, Place, SwitchSpec};
use ina_controller::client::Client;
use ina_switch::Request;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A controller started without a token, with its state in `dir`: it keeps its token in
/// `dir/token` and says so when ready.
fn controller(dir: &Path) -> (Proc, SocketAddr) {
    let mut p = Proc::spawn(
        "controller",
        &[
            "controller".to_string(),
            "--listen=127.0.0.1:0".into(),
            format!("--state-dir={}", dir.display()),
            "--resync-ms=200".into(),
        ],
    );
    let ready = p.expect("ready", after(START));
    let api = ready.addr("api");
    let file = ready.value["token_file"].as_str().map(PathBuf::from);
    assert_eq!(file, Some(token_file(dir)), "{}", ready.value);
    (p, api)
}

/// Where the controller with its state in `dir` keeps its token.
fn token_file(dir: &Path) -> PathBuf {
    dir.join("token")
}

/// A client of the controller at `api` with its state in `dir`, with its token.
fn client(api: SocketAddr, dir: &Path) -> Client {
    let token = ina_controller::token::read(&token_file(dir)).unwrap();
    Client::new(&api.to_string(), Some(token))
}

/// The spec of the software switch `sw` as "tor", with `slots` slots of 256 elements.
fn software_switch(sw: &SwitchProc, slots: u16) -> SwitchSpec {
    SwitchSpec::software("tor", sw.control, sw.udp, slots, 256)
}

/// A switch, a controller with its state in a fresh directory named `tag`, the switch added,
/// and a job `name` of `size` workers that join by name.
fn rack_with_job(
    tag: &str,
    name: &str,
    size: u8,
    heartbeat_ms: Option<u32>,
) -> (SwitchProc, Proc, SocketAddr, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("ina-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sw = SwitchProc::start(&[]);
    let (ctl, api) = controller(&dir);
    let c = client(api, &dir);
    c.add_switch(&software_switch(&sw, 4096)).unwrap();
    c.create_job(&JobRequest {
        name: name.into(),
        workers: Vec::new(),
        size: Some(u16::from(size)),
        elems_per_packet: 256,
        window: 256,
        min_window: Some(64),
        priority: 0,
        switch: None,
        heartbeat_ms,
    })
    .unwrap();
    (sw, ctl, api, dir)
}

/// A job `name` of two workers that join by name, 256 elements per packet, a window of 512
/// slots and a minimum of `min_window`, with heartbeats every `heartbeat_ms` if set.
fn pair_job(name: &str, min_window: u16, heartbeat_ms: Option<u32>) -> JobRequest {
    JobRequest {
        name: name.into(),
        workers: Vec::new(),
        size: Some(2),
        elems_per_packet: 256,
        window: 512,
        min_window: Some(min_window),
        priority: 0,
        switch: None,
        heartbeat_ms,
    }
}

/// Runs `ina ARGS`, which must fail with status 2 and `needle` in its error.
fn fails_with(args: &[&str], needle: &str) {
    let mut p = Proc::spawn(args[0], args);
    assert_eq!(p.wait(after(START)).code(), Some(2), "{args:?}");
    assert!(
        p.stderr_text().contains(needle),
        "{args:?}: {}",
        p.stderr_text()
    );
}

/// `size` workers of job `name` that join through the controller at `api` (its state in
/// `dir`), each running `iterations` all-reduces of `elements` with seed 7.
fn joining_workers(
    at: (SocketAddr, &Path),
    name: &str,
    size: usize,
    elements: usize,
    iterations: usize,
) -> Vec<Proc> {
    joining_workers_from(at, name, size, elements, iterations, 60_000, |_| {
        std::net::Ipv4Addr::LOCALHOST
    })
}

/// [`joining_workers`], rank `r` bound to `host(r)`.
fn joining_workers_from(
    (api, dir): (SocketAddr, &Path),
    name: &str,
    size: usize,
    elements: usize,
    iterations: usize,
    give_up_ms: u64,
    host: impl Fn(usize) -> std::net::Ipv4Addr,
) -> Vec<Proc> {
    (0..size)
        .map(|r| {
            let args = vec![
                "worker".to_string(),
                format!("--job-name={name}"),
                format!("--controller={api}"),
                format!("--token-file={}", token_file(dir).display()),
                format!("--bind={}:0", host(r)),
                format!("--rank={r}"),
                format!("--elements={elements}"),
                format!("--iterations={iterations}"),
                "--warmup=0".into(),
                "--seed=7".into(),
                format!("--give-up-ms={give_up_ms}"),
            ];
            Proc::spawn(&format!("worker {r}"), &args)
        })
        .collect()
}

fn epochs(sw: &SwitchProc) -> Vec<(u16, Option<u16>)> {
    sw.call(&Request::Jobs)
        .jobs
        .unwrap()
        .iter()
        .map(|j| (j.job, j.epoch))
        .collect()
}

#[test]
fn a_job_joined_by_name_finishes_across_a_kill_9_of_the_controller() {
    let _serial = serial();
    let (sw, mut ctl, api, dir) = rack_with_job("controller", "train", 2, None);
    let c = client(api, &dir);
    // Enough to be running when the controller is killed (about 2 s here).
    let iterations = 400;
    let mut workers = joining_workers((api, &dir), "train", 2, 200_000, iterations);
    let p = workers[0].expect("provisioned", after(START));
    assert_eq!(p.value.get("rank").and_then(|v| v.as_u64()), Some(0));
    // Once installed, the worker has its slots, epoch and peers from the controller.
    let i = workers[1].expect("installed", after(Duration::from_secs(60)));
    assert_eq!(i.value["window"].as_u64(), Some(256), "{}", i.value);
    assert!(i.value["epoch"].as_u64().is_some(), "{}", i.value);
    let peers = i.value["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 2);
    assert_eq!(peers[0].as_str(), Some(p.addr("udp").to_string().as_str()));
    workers[0].expect("joined", after(Duration::from_secs(60)));
    let held = epochs(&sw);
    let before = c.job("train").unwrap();
    assert!(before.epoch.is_some());
    // SIGKILL mid-run, then a new controller on the same state.
    ctl.kill();
    let (_ctl, api) = controller(&dir);
    let c = client(api, &dir);
    assert_eq!(c.job("train").unwrap(), before);
    let outcomes = collect_all(&mut workers, after(Duration::from_secs(120)));
    for o in &outcomes {
        o.assert_verified(iterations);
    }
    // The switch kept the job as installed: same epoch, never reinstalled.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(epochs(&sw), held);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `ina ARGS` to its end; returns its status code, stdout and stderr.
fn ina_run(args: &[String]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Switches declared with their places through `ina switch add` (an upper switch, two rack
/// switches under it with their hosts, a rack switch on its own, an aggregator on a host):
/// `ina switch list` shows them as a tree; a host under two racks, an upper switch that is not
/// declared and a rack switch named as an upper one are refused with messages that name
/// them; the places survive a restart of the controller.
#[test]
fn switches_declare_their_places_and_list_as_a_tree() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("ina-cli-topology-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut ctl, api) = controller(&dir);
    let switches: Vec<SwitchProc> = (0..5).map(|_| SwitchProc::start(&[])).collect();
    let with = |args: &[&str], sw: &SwitchProc| -> Vec<String> {
        let mut v: Vec<String> = ["switch", "add"].iter().map(|s| s.to_string()).collect();
        v.extend(args.iter().map(|s| s.to_string()));
        v.extend([
            format!("--control={}", sw.control),
            format!("--data={}", sw.udp),
            "--slots=1024".into(),
            format!("--controller={api}"),
            format!("--token-file={}", token_file(&dir).display()),
        ]);
        v
    };
    let added = |args: &[&str], sw: &SwitchProc| {
        let (code, out, err) = ina_run(&with(args, sw));
        assert_eq!(code, Some(0), "{args:?}: {out}{err}");
    };
    let refused = |args: &[&str], sw: &SwitchProc, needle: &str| {
        let (code, out, err) = ina_run(&with(args, sw));
        assert_ne!(code, Some(0), "{args:?}: {out}");
        assert!(err.contains(needle), "{args:?}: {err}");
    };
    added(&["spine", "--upper"], &switches[0]);
    added(
        &[
            "tor-a",
            "--rack=a",
            "--hosts=198.18.1.1,198.18.1.2",
            "--under=spine",
        ],
        &switches[1],
    );
    added(
        &["tor-b", "--rack=b", "--hosts=198.18.2.1", "--under=spine"],
        &switches[2],
    );
    added(&["tor-c", "--rack=c", "--hosts=198.18.3.1"], &switches[3]);
    added(&["agg", "--aggregator-on=198.18.9.9"], &switches[4]);
    let list = || {
        let (code, out, err) = ina_run(&[
            "switch".into(),
            "list".into(),
            format!("--controller={api}"),
            format!("--token-file={}", token_file(&dir).display()),
        ]);
        assert_eq!(code, Some(0), "{err}");
        out
    };
    let out = list();
    eprintln!("{out}");
    assert_eq!(out.lines().count(), 6, "{out}");
    let line = |name: &str| {
        out.lines()
            .find(|l| l.contains(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name}: {out}"))
            .to_string()
    };
    assert!(line("spine").starts_with("spine"), "{out}");
    assert!(line("spine").ends_with("upper"), "{out}");
    assert!(line("tor-a").starts_with("├─ tor-a"), "{out}");
    assert!(line("tor-a").ends_with("rack a (2 hosts)"), "{out}");
    assert!(line("tor-b").starts_with("└─ tor-b"), "{out}");
    assert!(line("tor-c").starts_with("tor-c"), "{out}");
    assert!(line("agg").ends_with("aggregator on 198.18.9.9"), "{out}");
    // Bad places, refused by name (the switch behind them is free again: nothing was added).
    let spare = SwitchProc::start(&[]);
    refused(
        &["tor-d", "--rack=d", "--hosts=198.18.4.1,198.18.1.2"],
        &spare,
        "host 198.18.1.2 is under two racks",
    );
    refused(
        &["tor-d", "--rack=d", "--hosts=198.18.4.1", "--under=core"],
        &spare,
        "under \"core\", which is not declared",
    );
    refused(
        &["tor-d", "--rack=d", "--hosts=198.18.4.1", "--under=tor-c"],
        &spare,
        "which is not an upper switch",
    );
    refused(&["tor-d", "--under=spine"], &spare, "only a rack switch");
    // The places are in the controller's state: a restarted controller lists the same tree.
    ctl.signal(libc::SIGKILL);
    let _ = ctl.wait(after(START));
    let (_ctl, api2) = controller(&dir);
    let (code, again, err) = ina_run(&[
        "switch".into(),
        "list".into(),
        format!("--controller={api2}"),
        format!("--token-file={}", token_file(&dir).display()),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let strip = |t: &str| -> Vec<String> {
        // Compare names and places; the free slots may differ while jobs come and go.
        t.lines()
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                format!(
                    "{} {}",
                    w[..w.len().min(2)].join(" "),
                    l.rsplit("  ").next().unwrap_or("")
                )
            })
            .collect()
    };
    assert_eq!(strip(&again), strip(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rack switch whose pool one job holds whole, and a host aggregator: a second job that
/// would queue on the rack switch goes to the aggregator, says so in `ina job show`, and its
/// workers, joining by name, all-reduce through it with exact sums.
#[test]
fn a_job_that_would_queue_spills_to_a_host_aggregator_and_sums_exactly() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("ina-cli-spill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let tor = SwitchProc::start(&["--pool-slots=512"]);
    let agg = SwitchProc::start(&["--pool-slots=512"]);
    let (_ctl, api) = controller(&dir);
    let c = client(api, &dir);
    let localhost = std::net::IpAddr::from([127, 0, 0, 1]);
    let mut rack = SwitchSpec::software("tor", tor.control, tor.udp, 512, 256);
    rack.place = Place::Rack {
        rack: "a".into(),
        hosts: vec![localhost],
        under: None,
        up_data: None,
    };
    c.add_switch(&rack).unwrap();
    let mut host = SwitchSpec::software("agg", agg.control, agg.udp, 512, 256);
    host.place = Place::Aggregator { host: localhost };
    c.add_switch(&host).unwrap();
    let request = |name: &str| pair_job(name, 512, None);
    let first = c
        .create_job(&JobRequest {
            switch: Some("tor".into()),
            ..request("first")
        })
        .unwrap();
    assert_eq!(first.switch, "tor", "{first:?}");
    // Its workers are under rack "a": it goes where they are once both have joined, and the
    // rack switch is full.
    c.create_job(&request("spilled")).unwrap();
    let mut workers = joining_workers((api, &dir), "spilled", 2, 100_000, 5);
    for o in collect_all(&mut workers, after(Duration::from_secs(120))) {
        o.assert_verified(5);
    }
    let spilled = c.job("spilled").unwrap();
    assert_eq!(spilled.switch, "agg", "{spilled:?}");
    assert!(
        spilled
            .placement
            .contains("host aggregator instead of queueing"),
        "{}",
        spilled.placement
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn wrong_controller_flags_fail_with_a_clear_error() {
    let _serial = serial();
    fails_with(
        &[
            "controller",
            "--listen=0.0.0.0:0",
            "--state-dir=/nonexistent-unused",
        ],
        "needs an access token",
    );
    fails_with(
        &[
            "worker",
            "--job-name=x",
            "--bind=0.0.0.0:0",
            "--controller=127.0.0.1:1",
        ],
        "its own IP",
    );
    fails_with(
        &[
            "worker",
            "--job-name=x",
            "--bind=127.0.0.1:0",
            "--controller=127.0.0.1:1",
        ],
        "unreachable",
    );
}

#[test]
fn a_worker_killed_mid_run_fails_its_job_and_the_others_are_told_which_rank() {
    let _serial = serial();
    let (sw, _ctl, api, dir) = rack_with_job("heartbeat", "hb", 3, Some(200));
    let c = client(api, &dir);
    // Far more iterations than the test waits for.
    let mut workers = joining_workers((api, &dir), "hb", 3, 100_000, 1_000_000);
    for w in &mut workers {
        w.expect("joined", after(Duration::from_secs(60)));
    }
    workers[2].kill();
    // Each survivor stops with a typed error naming rank 2: the controller's (its heartbeat
    // answered "failed") or its own stream's (it gave up on a use rank 2 never joined),
    // whichever comes first.
    for w in &mut workers[..2] {
        let o = Outcome::collect(w, after(Duration::from_secs(30)));
        let end = format!("{:?}", o.end);
        match o.error_kind() {
            Some("job_failed") => assert!(end.contains("ranks [2]"), "{end}"),
            Some("timeout") => assert!(end.contains("missing ranks 2"), "{end}"),
            other => panic!("{}: {other:?}: {end}", o.name),
        }
    }
    // The controller fails the job and takes it off the switch.
    let up = std::time::Instant::now();
    loop {
        let j = c.job("hb").unwrap();
        if j.missing == vec![2] && sw.call(&Request::Jobs).jobs.unwrap().is_empty() {
            break;
        }
        assert!(up.elapsed() < Duration::from_secs(10), "{j:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_job_shrinks_a_running_one_between_its_tensors_and_every_sum_is_exact() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("ina-cli-live-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sw = SwitchProc::start(&["--pool-slots=512"]);
    let (_ctl, api) = controller(&dir);
    let c = client(api, &dir);
    c.add_switch(&software_switch(&sw, 512)).unwrap();
    let request = |name: &str| pair_job(name, 64, Some(200));
    c.create_job(&request("first")).unwrap();
    let iterations = 300;
    let mut first = joining_workers((api, &dir), "first", 2, 200_000, iterations);
    for w in &mut first {
        w.expect("joined", after(Duration::from_secs(60)));
    }
    let before = c.job("first").unwrap();
    assert_eq!(before.slots.map(|r| r.count), Some(512));
    // A second job halves the first one's slots while it runs.
    c.create_job(&request("second")).unwrap();
    let mut second = joining_workers((api, &dir), "second", 2, 200_000, 20);
    for o in collect_all(&mut second, after(Duration::from_secs(120))) {
        o.assert_verified(20);
    }
    let during = c.job("first").unwrap();
    assert_eq!(during.slots.map(|r| r.count), Some(256), "{during:?}");
    assert_ne!(during.epoch, before.epoch);
    for o in collect_all(&mut first, after(Duration::from_secs(120))) {
        o.assert_verified(iterations);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_job_window_is_sized_from_the_link_and_round_trip() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("ina-cli-bdp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sw = SwitchProc::start(&[]);
    let (_ctl, api) = controller(&dir);
    let c = client(api, &dir);
    c.add_switch(&software_switch(&sw, 4096)).unwrap();
    // 100 Gbit/s and a 10 µs round trip: 117 frames of 256 elements in flight, twelve of
    // those in whole blocks.
    let mut p = Proc::spawn(
        "job create",
        &[
            "job",
            "create",
            "bdp",
            "--size=2",
            "--link-gbps=100",
            "--rtt-us=10",
            &format!("--controller={api}"),
            &format!("--token-file={}", token_file(&dir).display()),
        ],
    );
    assert!(p.wait(after(START)).success(), "{}", p.stderr_text());
    assert_eq!(c.job("bdp").unwrap().request.window, 1408);
    fails_with(
        &[
            "job",
            "create",
            "bad",
            "--size=2",
            "--link-gbps=-1",
            "--rtt-us=10",
            &format!("--controller={api}"),
            &format!("--token-file={}", token_file(&dir).display()),
        ],
        "must be positive",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cluster of software switches on loopback: an upper switch "top" and `racks` rack
/// switches "tor1".. under it, rack `i`'s one host being 127.0.`i`.1, all declared to a
/// controller; and a job of `size` workers that join by name.
struct TreeCluster {
    upper: SwitchProc,
    racks: Vec<SwitchProc>,
    ctl: Proc,
    api: SocketAddr,
    dir: PathBuf,
}

impl TreeCluster {
    fn start(tag: &str, racks: usize) -> TreeCluster {
        let dir = std::env::temp_dir().join(format!("ina-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let upper = SwitchProc::start(&["--pool-slots=1024"]);
        let racks: Vec<SwitchProc> = (0..racks)
            .map(|_| SwitchProc::start(&["--pool-slots=1024"]))
            .collect();
        let (ctl, api) = controller(&dir);
        let c = client(api, &dir);
        let mut top = SwitchSpec::software("top", upper.control, upper.udp, 1024, 256);
        top.place = Place::Upper { under: None };
        c.add_switch(&top).unwrap();
        for (i, r) in racks.iter().enumerate() {
            let mut spec =
                SwitchSpec::software(&format!("tor{}", i + 1), r.control, r.udp, 1024, 256);
            spec.place = Place::Rack {
                rack: format!("r{}", i + 1),
                hosts: vec![std::net::IpAddr::V4(Self::host(i))],
                under: Some("top".into()),
                up_data: None,
            };
            c.add_switch(&spec).unwrap();
        }
        TreeCluster {
            upper,
            racks,
            ctl,
            api,
            dir,
        }
    }

    /// Rack `i`'s host (from 0).
    fn host(i: usize) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(127, 0, i as u8 + 1, 1)
    }

    fn client(&self) -> Client {
        client(self.api, &self.dir)
    }

    /// `size` workers of job `name`, rank `r` on rack `r % racks`, giving up after
    /// `give_up_ms` without progress.
    fn workers(
        &self,
        name: &str,
        size: usize,
        (elements, iterations): (usize, usize),
        give_up_ms: u64,
    ) -> Vec<Proc> {
        let racks = self.racks.len();
        joining_workers_from(
            (self.api, &self.dir),
            name,
            size,
            elements,
            iterations,
            give_up_ms,
            |r| Self::host(r % racks),
        )
    }

    /// The switch named `name` (`top` or `torN`).
    fn switch_mut(&mut self, name: &str) -> &mut SwitchProc {
        match name.strip_prefix("tor") {
            Some(i) => &mut self.racks[i.parse::<usize>().unwrap() - 1],
            None => &mut self.upper,
        }
    }

    /// SIGKILLs switch `name`, and starts it again on the same addresses.
    fn kill_9_and_restart(&mut self, name: &str) {
        let sw = self.switch_mut(name);
        let (udp, control) = (sw.udp, sw.control);
        sw.proc.kill();
        *sw = SwitchProc::start(&[
            "--pool-slots=1024",
            &format!("--listen={udp}"),
            &format!("--control={control}"),
        ]);
    }
}

impl Drop for TreeCluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn twelve_workers_under_three_racks_become_a_tree_by_themselves_and_sum_exactly() {
    let _serial = serial();
    let cluster = TreeCluster::start("tree", 3);
    let c = cluster.client();
    let mut request = pair_job("tree", 256, None);
    request.size = Some(12);
    request.window = 256;
    let created = c.create_job(&request).unwrap();
    assert_eq!(
        created.switch, "",
        "placed once its workers have joined: {created:?}"
    );
    let mut workers = cluster.workers("tree", 12, (200_000, 3), 60_000);
    let outcomes = collect_all(&mut workers, after(Duration::from_secs(180)));
    for o in &outcomes {
        o.assert_verified(3);
    }
    // Every worker holds the same sums, which verified against all twelve ranks' data.
    let first = outcomes[0].fingerprints();
    assert!(outcomes.iter().all(|o| o.fingerprints() == first));
    let job = c.job("tree").unwrap();
    assert_eq!(job.switch, "top", "{job:?}");
    assert!(job.is_installed(), "{job:?}");
    let slots = job.slots.unwrap();
    for (i, r) in job.racks.iter().enumerate() {
        assert_eq!(r.switch, format!("tor{}", i + 1));
        // Its workers' ranks, in the order they joined.
        let mut ranks = r.ranks.clone();
        ranks.sort();
        assert_eq!(
            ranks,
            (0..4).map(|k| (i + 3 * k) as u16).collect::<Vec<_>>()
        );
    }
    // The upper switch summed the racks' partials; each rack switch holds the job on the
    // tree's one range, with its uplink to the upper switch's epoch.
    let upper = cluster.upper.call(&Request::Jobs).jobs.unwrap();
    assert_eq!(upper.len(), 1);
    assert_eq!(
        (upper[0].slot_base, upper[0].slot_count),
        (slots.base, slots.count)
    );
    assert_eq!(
        upper[0].workers,
        cluster.racks.iter().map(|r| r.udp).collect::<Vec<_>>()
    );
    for r in &cluster.racks {
        let jobs = r.call(&Request::Jobs).jobs.unwrap();
        let uplink = jobs[0].uplink.expect("an uplink");
        assert_eq!(
            (uplink.addr, uplink.epoch),
            (cluster.upper.udp, upper[0].epoch.unwrap())
        );
        assert_eq!(jobs[0].workers.len(), 4);
    }
    let upper = cluster.upper.stats().total.pipeline;
    assert!(
        upper.data_first > 0 && upper.data_added >= 2 * upper.data_first,
        "{upper:?}"
    );
    assert_eq!(upper.rejects_sent, 0, "{upper:?}");
}

/// A tree job runs; switch `which` of its tree is killed with SIGKILL mid-run and started
/// again on its addresses. Every worker ends with exact sums or a typed error, never a wrong
/// sum; the controller installs what the restart took (the upper switch's new epoch reaches
/// every rack switch's uplink); and a new run of the job sums exactly.
fn a_tree_survives_a_kill_9_of(which: &str) {
    let _serial = serial();
    let mut cluster = TreeCluster::start(&format!("tree-kill-{which}"), 3);
    let c = cluster.client();
    let mut request = pair_job("tree", 256, None);
    request.size = Some(6);
    request.window = 256;
    c.create_job(&request).unwrap();
    // Far more iterations than the test waits for.
    let mut workers = cluster.workers("tree", 6, (100_000, 1_000_000), 3_000);
    for w in &mut workers {
        w.expect("iteration", after(Duration::from_secs(60)));
        w.expect("iteration", after(Duration::from_secs(60)));
    }
    let before = c.job("tree").unwrap();
    cluster.kill_9_and_restart(which);
    for o in collect_all(&mut workers, after(Duration::from_secs(60))) {
        assert!(
            o.violations().iter().all(|&v| v == 0),
            "{}: a wrong sum: {:?}",
            o.name,
            o.violations()
        );
        let kind = o.error_kind().map(str::to_string);
        assert!(
            matches!(
                kind.as_deref(),
                Some("timeout" | "switch_restarted" | "rejected")
            ),
            "{}: {:?}; stderr:\n{}",
            o.name,
            o.end,
            o.stderr
        );
    }
    // The controller brings the restarted switch back, and what depends on it.
    let restarted = wait_until(
        "the tree installed again",
        after(Duration::from_secs(60)),
        || {
            let j = c.job("tree").ok()?;
            let held = cluster.switch_mut(which).call(&Request::Jobs).jobs?;
            (j.is_installed() && !held.is_empty()).then_some(j)
        },
    );
    if which == "top" {
        assert_ne!(restarted.epoch, before.epoch);
    }
    let upper = cluster.upper.call(&Request::Jobs).jobs.unwrap();
    for r in &cluster.racks {
        let jobs = r.call(&Request::Jobs).jobs.unwrap();
        assert_eq!(jobs[0].uplink.map(|u| u.epoch), upper[0].epoch, "{which}");
    }
    // A new run of the job: its workers join again, and the tree is installed afresh.
    let mut again = cluster.workers("tree", 6, (100_000, 5), 60_000);
    let outcomes = collect_all(&mut again, after(Duration::from_secs(120)));
    for o in &outcomes {
        o.assert_verified(5);
    }
    let after_run = c.job("tree").unwrap();
    assert_ne!(
        after_run.epoch, restarted.epoch,
        "a new run gets a new epoch"
    );
}

#[test]
fn a_tree_survives_a_kill_9_of_a_rack_switch() {
    a_tree_survives_a_kill_9_of("tor2");
}

#[test]
fn a_tree_survives_a_kill_9_of_its_upper_switch() {
    a_tree_survives_a_kill_9_of("top");
}

#[test]
fn a_tree_runs_on_across_a_kill_9_of_the_controller() {
    let _serial = serial();
    let mut cluster = TreeCluster::start("tree-controller", 3);
    let c = cluster.client();
    let mut request = pair_job("tree", 256, None);
    request.size = Some(6);
    c.create_job(&request).unwrap();
    let iterations = 60;
    let mut workers = cluster.workers("tree", 6, (100_000, iterations), 60_000);
    for w in &mut workers {
        w.expect("joined", after(Duration::from_secs(60)));
    }
    let before = c.job("tree").unwrap();
    let epochs = |sw: &SwitchProc| epochs(sw);
    let held: Vec<_> = std::iter::once(&cluster.upper)
        .chain(&cluster.racks)
        .map(epochs)
        .collect();
    // SIGKILL mid-run, then a new controller on the same state: it finds the tree as it
    // left it, and changes nothing on its switches.
    cluster.ctl.kill();
    let (ctl, api) = controller(&cluster.dir);
    cluster.ctl = ctl;
    cluster.api = api;
    let c = cluster.client();
    assert_eq!(c.job("tree").unwrap(), before);
    for o in collect_all(&mut workers, after(Duration::from_secs(120))) {
        o.assert_verified(iterations);
    }
    std::thread::sleep(Duration::from_millis(500));
    let now: Vec<_> = std::iter::once(&cluster.upper)
        .chain(&cluster.racks)
        .map(epochs)
        .collect();
    assert_eq!(now, held);
}
