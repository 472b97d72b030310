//! `ina testbed` and `ina bench --testbed` as a user runs them (root; skips otherwise, fails
//! under INA_REQUIRE_PRIVILEGED=1): the CI smoke scenario (3 workers, 200 Mbit/s links, 8 MiB)
//! with ina and the ring both correct, its figures printed, not asserted; a testbed built,
//! inspected and removed; wrong settings refused with messages that name them.
#![allow(clippy::unwrap_used)]

// (Each test binary uses part of the shared harness.)
#[allow(dead_code)]
mod common;

use common::serial;
use ina_io::netns::privileged_required;
use serde_json::Value;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ina");

fn skip_unless_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        assert!(
            !privileged_required(),
            "required test cannot run: the testbed needs root"
        );
        eprintln!("skipped: the testbed needs root");
    }
    !root
}

fn ina(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

#[test]
fn ci_smoke_ina_and_ring_through_the_testbed() {
    let _guard = serial();
    if skip_unless_root() {
        return;
    }
    let namespaces = || {
        let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
        String::from_utf8_lossy(&list.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect::<std::collections::BTreeSet<_>>()
    };
    let before = namespaces();
    let json = std::env::temp_dir().join(format!("ina-smoke-{}.json", std::process::id()));
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/ci-smoke.toml");
    let out = ina(&[
        "bench",
        "--scenario",
        scenario,
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        assert_eq!(r["verified"], true, "{r}");
        assert!(r["bound_s"].as_f64().unwrap() > 0.0);
        assert!(r["algbw_gbit_per_s"].as_f64().unwrap() > 0.0);
    }
    let t = &report["testbed"];
    assert_eq!(t["rate_bps"], 200_000_000u64);
    assert!(t["speedup"].as_f64().is_some());
    assert!((t["speedup_ceiling"].as_f64().unwrap() - 4.0 / 3.0).abs() < 1e-9);
    // Nothing is left behind (other runs on the machine may have namespaces of their own).
    let left: Vec<_> = namespaces().difference(&before).cloned().collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

#[test]
fn a_testbed_is_built_inspected_and_removed() {
    let _guard = serial();
    if skip_unless_root() {
        return;
    }
    let up = ina(&[
        "testbed",
        "up",
        "--name",
        "inatbt",
        "--workers",
        "2",
        "--rate",
        "100mbit",
        "--link-loss",
        "0.01",
        "--mtu",
        "9000",
    ]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let status = ina(&["testbed", "status", "--name", "inatbt"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success());
    assert!(
        text.contains("inatbt-hub") && text.contains("inatbt-w1"),
        "{text}"
    );
    assert!(text.contains("rate 100Mbit"), "{text}");
    assert!(
        text.contains("mtu 9000") || text.contains("\"mtu\": 9000"),
        "{text}"
    );
    assert!(text.contains("numgen random mod 1000 < 10"), "{text}");
    // A second `up` of the same name replaces it.
    let again = ina(&["testbed", "up", "--name", "inatbt", "--workers", "1"]);
    assert!(again.status.success());
    let down = ina(&["testbed", "down", "--name", "inatbt"]);
    assert!(down.status.success());
    assert!(String::from_utf8_lossy(&down.stdout).contains("removed 2 namespaces"));
    let gone = ina(&["testbed", "status", "--name", "inatbt"]);
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no testbed named inatbt"));
}

#[test]
fn wrong_settings_are_refused_with_their_names() {
    let _guard = serial();
    for (args, says) in [
        (
            &["bench", "--testbed", "--elems", "2048", "--mtu", "1500"][..],
            "--mtu 1500",
        ),
        (&["bench", "--testbed", "--rate", "fast"][..], "rate `fast`"),
        (
            &["bench", "--testbed", "--hub", "l2", "--elems", "100"][..],
            "--elems 100",
        ),
        (
            &["testbed", "up", "--name", "a-b"][..],
            "letters and digits",
        ),
    ] {
        let out = ina(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        // Root or not, the message names what is wrong (a non-root run may stop at root).
        assert!(
            err.contains(says) || err.contains("root"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_sweep_runs_each_value_on_its_own_testbed_and_plots_them() {
    let _guard = serial();
    if skip_unless_root() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ina-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, svg) = (dir.join("sweep.json"), dir.join("sweep.svg"));
    let out = ina(&[
        "bench",
        "--testbed",
        "--rate=200mbit",
        "--size=1MiB",
        "--elems=256",
        "--rounds=1",
        "--warmup-rounds=0",
        "--iterations=1",
        "--sweep-workers=2,3",
        "--sweep-link-loss=0.01",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let workers: Vec<u64> = report["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["report"]["workers"].as_u64().unwrap())
        .collect();
    assert_eq!(workers, vec![2, 3]);
    let lossy = &report["link_loss"][0]["report"];
    assert_eq!(lossy["testbed"]["link_loss"], 0.01);
    for p in report["workers"].as_array().unwrap() {
        for r in p["report"]["results"].as_array().unwrap() {
            assert_eq!(r["verified"], true);
        }
    }
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg"));
    for text in [
        "goodput against workers",
        "goodput against loss per link direction",
        "links&apos; bound",
    ] {
        assert!(
            plot.contains(text) || plot.contains(&text.replace("&apos;", "'")),
            "{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    // --plot without a sweep says what is missing.
    let lone = ina(&["bench", "--plot", "x.svg"]);
    assert!(String::from_utf8_lossy(&lone.stderr).contains("--sweep-workers"));
}
