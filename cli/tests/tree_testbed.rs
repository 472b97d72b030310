//! The controller builds an aggregation tree as a cluster deploys it (root; skips otherwise,
//! fails under INA_REQUIRE_PRIVILEGED=1): three racks in network namespaces, each a hub with a
//! software rack switch and its workers on rate-limited links, under an upper switch in a
//! namespace of its own that also runs the controller. The switches are declared with their
//! places by `ina switch add`, the job created by `ina job create --size`, and twelve `ina
//! worker --job-name` processes join from their racks' hosts: the controller builds the tree
//! by itself, and every sum is exact. The same twelve-worker job on one rack switch runs for
//! comparison, and both times are printed, not asserted.
#![allow(clippy::unwrap_used)]

// (Each test binary uses part of the shared harness.)
#[allow(dead_code)]
mod common;

use common::*;
use ina_io::netns::{Hub, Rack, RackConfig};
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::Duration;

/// Every link's rate, each way: low enough that twelve workers and four switches on two
/// cores keep up with their links.
const RATE_BPS: u64 = 50_000_000;
const TOKEN: &str = "tree-testbed-token-0123456789";
const UPPER_NS: &str = "inatt-up";
const API: &str = "198.19.0.1:7070";
const ELEMENTS: usize = 1 << 20;
const ITERATIONS: usize = 3;

fn sh(ns: &str, cmd: &str) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", cmd])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "in {ns}: {cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Racks `0..n` in namespaces `inatt{i}-*` (rack `i`'s hosts 198.18.{10+i}.{r+1}, its rack
/// switch's uplink 198.19.{i+1}.2), and the upper namespace, whose bridge 198.19.0.1 links
/// them all at the same rate.
struct Cluster {
    racks: Vec<Rack>,
    dir: std::path::PathBuf,
}

impl Cluster {
    fn build(workers: &[usize]) -> Cluster {
        ina_io::netns::remove_prefix("inatt");
        let racks: Vec<Rack> = workers
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let mut cfg = RackConfig::new(&format!("tt{i}"), n);
                cfg.hub = Hub::Bridge;
                cfg.rate_bps = Some(RATE_BPS);
                Rack::build(cfg).unwrap()
            })
            .collect();
        let ok = Command::new("ip")
            .args(["netns", "add", UPPER_NS])
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip netns add {UPPER_NS}");
        sh(
            UPPER_NS,
            "ip link set lo up && ip link add br0 type bridge && \
             ip addr add 198.19.0.1/16 dev br0 && ip link set br0 up",
        );
        let tbf = format!("tbf rate {RATE_BPS}bit burst 32768 latency 100ms");
        for (i, rack) in racks.iter().enumerate() {
            let hub = rack.hub();
            let up = format!("up{i}");
            uplink_veth(UPPER_NS, &up, &hub);
            for (ns, dev) in [(UPPER_NS, up.as_str()), (hub.as_str(), "uplink")] {
                sh(
                    ns,
                    &format!(
                        "ip link set {dev} gso_max_segs 1 && ip link set {dev} up && \
                         tc qdisc replace dev {dev} root {tbf}"
                    ),
                );
            }
            sh(UPPER_NS, &format!("ip link set {up} master br0"));
            // The hub forwards its hosts' controller traffic up; the upper namespace routes
            // the answers back by the rack's host addresses.
            sh(
                &hub,
                &format!(
                    "ip addr add 198.19.{}.2/16 dev uplink && sysctl -qw net.ipv4.ip_forward=1",
                    i + 1
                ),
            );
            sh(
                UPPER_NS,
                &format!("ip route add 198.18.{}.0/24 via 198.19.{}.2", 10 + i, i + 1),
            );
            for r in 0..rack.workers {
                let host = Self::host(i, r);
                sh(
                    &rack.worker_ns(r),
                    &format!(
                        "ip addr add {host}/16 dev eth0 && \
                         ip route add 198.19.0.0/16 via 198.18.0.100 src {host}"
                    ),
                );
            }
        }
        let dir = std::env::temp_dir().join(format!("ina-tree-testbed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Cluster { racks, dir }
    }

    /// Worker `r`'s host address in rack `i`.
    fn host(i: usize, r: usize) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 10 + i as u8, r as u8 + 1)
    }

    /// `ina ARGS --controller API --token TOKEN` in the upper namespace; its stdout.
    fn ina(&self, args: &[String]) -> String {
        let out = ina_io::netns::command_in(Some(UPPER_NS), BIN)
            .args(args)
            .args([format!("--controller={API}"), format!("--token={TOKEN}")])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ina {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Workers of job `name`: rank `g` on rack `at(g).0`'s host `at(g).1`.
    fn workers(&self, name: &str, size: usize, at: impl Fn(usize) -> (usize, usize)) -> Vec<Proc> {
        (0..size)
            .map(|g| {
                let (i, r) = at(g);
                Proc::spawn_in(
                    Some(&self.racks[i].worker_ns(r)),
                    &format!("worker {g}"),
                    &[
                        "worker".to_string(),
                        format!("--job-name={name}"),
                        format!("--controller={API}"),
                        format!("--token={TOKEN}"),
                        format!("--bind={}:19000", Self::host(i, r)),
                        format!("--rank={g}"),
                        format!("--elements={ELEMENTS}"),
                        format!("--iterations={ITERATIONS}"),
                        "--warmup=1".into(),
                        "--seed=7".into(),
                        "--give-up-ms=60000".into(),
                    ],
                )
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", UPPER_NS]).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The median of every worker's iteration times, seconds; asserts every sum exact and the
/// same on every worker.
fn run_exactly(workers: &mut [Proc], what: &str) -> f64 {
    let outcomes = collect_all(workers, after(Duration::from_secs(300)));
    for o in &outcomes {
        o.assert_verified(ITERATIONS + 1);
    }
    let first = outcomes[0].fingerprints();
    assert!(
        outcomes.iter().all(|o| o.fingerprints() == first),
        "{what}: workers disagree"
    );
    let mut times: Vec<f64> = outcomes
        .iter()
        .flat_map(|o| o.iterations.iter())
        .filter(|l| l.value["warmup"] == false)
        .map(|l| l.value["seconds"].as_f64().unwrap())
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn twelve_workers_across_three_racks_become_a_tree_and_sum_exactly() {
    let _guard = serial();
    // Rack 0 holds twelve hosts: four for the tree, all twelve for the one-switch run.
    let cluster = Cluster::build(&[12, 4, 4]);
    let mut controller = Proc::spawn_in(
        Some(UPPER_NS),
        "controller",
        &[
            "controller".to_string(),
            format!("--listen={API}"),
            format!("--state-dir={}", cluster.dir.display()),
            format!("--token={TOKEN}"),
            "--resync-ms=500".into(),
        ],
    );
    controller.expect("ready", after(Duration::from_secs(10)));
    let mut upper = Proc::spawn_in(
        Some(UPPER_NS),
        "upper switch",
        &[
            "switch",
            "--listen=198.19.0.1:18000",
            "--control=127.0.0.1:18001",
            "--pool-slots=1024",
        ],
    );
    upper.expect("ready", after(Duration::from_secs(10)));
    cluster.ina(&[
        "switch".into(),
        "add".into(),
        "top".into(),
        "--control=127.0.0.1:18001".into(),
        "--data=198.19.0.1:18000".into(),
        "--slots=1024".into(),
        "--upper".into(),
    ]);
    let mut racks = Vec::new();
    for (i, rack) in cluster.racks.iter().enumerate() {
        let control = format!("198.19.{}.2:18001", i + 1);
        let mut sw = Proc::spawn_in(
            Some(&rack.hub()),
            &format!("rack switch {i}"),
            &[
                "switch".to_string(),
                "--listen=0.0.0.0:18000".into(),
                format!("--control={control}"),
                format!("--control-token={TOKEN}"),
                "--pool-slots=1024".into(),
            ],
        );
        sw.expect("ready", after(Duration::from_secs(10)));
        racks.push(sw);
        let hosts: Vec<String> = (0..rack.workers)
            .map(|r| Cluster::host(i, r).to_string())
            .collect();
        cluster.ina(&[
            "switch".into(),
            "add".into(),
            format!("tor{i}"),
            format!("--control={control}"),
            format!("--control-token={TOKEN}"),
            "--data=198.18.0.100:18000".into(),
            format!("--up-data=198.19.{}.2:18000", i + 1),
            "--slots=1024".into(),
            format!("--rack=r{i}"),
            format!("--hosts={}", hosts.join(",")),
            "--under=top".into(),
        ]);
    }
    let list = cluster.ina(&["switch".into(), "list".into()]);
    println!("{list}");
    assert!(list.contains("tor2"), "{list}");
    // Twelve workers, four in each rack.
    cluster.ina(&[
        "job".into(),
        "create".into(),
        "tree".into(),
        "--size=12".into(),
        "--window=256".into(),
    ]);
    let mut workers = cluster.workers("tree", 12, |g| (g % 3, g / 3));
    let tree = run_exactly(&mut workers, "tree");
    let shown = cluster.ina(&["job".into(), "show".into(), "tree".into()]);
    let job: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(job["switch"], "top", "{shown}");
    let parts = job["racks"].as_array().unwrap();
    assert_eq!(parts.len(), 3, "{shown}");
    assert!(parts
        .iter()
        .all(|p| p["ranks"].as_array().unwrap().len() == 4));
    // The same twelve workers' job on one rack switch.
    cluster.ina(&[
        "job".into(),
        "create".into(),
        "flat".into(),
        "--size=12".into(),
        "--window=256".into(),
    ]);
    let mut workers = cluster.workers("flat", 12, |g| (0, g));
    let flat = run_exactly(&mut workers, "flat");
    let shown = cluster.ina(&["job".into(), "show".into(), "flat".into()]);
    let job: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(job["switch"], "tor0", "{shown}");
    // 4 MiB at the link rate, each way: the bound both runs approach.
    let bound = (ELEMENTS * 4 * 8) as f64 / RATE_BPS as f64;
    println!(
        "all-reduce of {} MiB, 12 workers, {} Mbit/s links: tree of 3 racks {tree:.3} s, one switch {flat:.3} s (tree / one switch {:.3}); payload at line rate {bound:.3} s",
        (ELEMENTS * 4) >> 20,
        RATE_BPS / 1_000_000,
        tree / flat
    );
    for mut r in racks {
        r.kill();
    }
    upper.kill();
    controller.kill();
}

fn main() -> std::process::ExitCode {
    ina_testkit::Suite::new()
        .test(
            "twelve_workers_across_three_racks_become_a_tree_and_sum_exactly",
            ina_testkit::RACK,
            twelve_workers_across_three_racks_become_a_tree_and_sum_exactly,
        )
        .run()
}
