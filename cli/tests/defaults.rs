//! Every subcommand runs at its defaults: only the flags a command cannot do without are given
//! (and a small `--size` where a run's length is all a flag changes). Defaults that do not fit
//! together (a packet larger than the links' MTU, a worker no switch answers) fail here.
#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
mod common;

use common::*;
use ina_testkit::{Suite, RACK};
use serde_json::Value;
use std::process::{Command, Output};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ina");

fn ina(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn assert_ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The flags that shorten a bench run to one timed iteration (they change nothing else).
const ONE_TIMED_ITERATION: &[&str] =
    &["--rounds", "1", "--iterations", "1", "--warmup-rounds", "0"];

/// A bench run at its defaults, shortened to one timed iteration of `size`; its JSON report.
fn short_bench(extra: &[&str]) -> Value {
    let json = std::env::temp_dir().join(format!(
        "ina-defaults-{}-{}.json",
        std::process::id(),
        extra.len()
    ));
    let mut args = vec!["bench", "--size", "2MiB"];
    args.extend_from_slice(ONE_TIMED_ITERATION);
    args.extend_from_slice(&["--json", json.to_str().unwrap()]);
    args.extend_from_slice(extra);
    let stdout = assert_ok(&ina(&args));
    println!("{stdout}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    for r in report["results"].as_array().unwrap() {
        assert_eq!(r["verified"], true, "{r}");
        let of_bound = r["of_bound"].as_f64().unwrap();
        assert!(of_bound > 0.0, "{r}");
    }
    report
}

/// In process, every worker sits behind a paced link of its own, and both algorithms are
/// reported against that link's bound.
fn bench_runs_behind_paced_links_at_its_defaults() {
    let report = short_bench(&[]);
    assert_eq!(report["links"]["rate_bps"], 500_000_000u64);
    assert_eq!(report["elems_per_packet"], 2048);
    let links = &report["links"];
    let ring = links["ring_bound_s"].as_f64().unwrap();
    let ina = links["ina_bound_s"].as_f64().unwrap();
    // n = 4: the ring moves 1.5 tensors per link, ina one and its headers.
    assert!((ring / ina - 1.5 / links["ina_framing"].as_f64().unwrap()).abs() < 1e-9);
}

/// `--link unlimited` says what it measures, and `--link` with `--processes` is refused.
fn bench_on_bare_loopback_says_it_measures_cpu() {
    let mut args = vec!["bench", "--size", "1MiB"];
    args.extend_from_slice(ONE_TIMED_ITERATION);
    args.extend_from_slice(&["--link", "unlimited"]);
    let stdout = assert_ok(&ina(&args));
    assert!(stdout.contains("measures CPU cost, not links"), "{stdout}");
    let out = ina(&["bench", "--processes", "--link", "1gbit"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--link"));
}

/// On the rack: 1 Gbit/s links, and packets that fit the default MTU of 1500.
fn bench_on_the_testbed_at_its_defaults() {
    let _guard = serial();
    let report = short_bench(&["--testbed"]);
    assert_eq!(report["testbed"]["rate_bps"], 1_000_000_000u64);
    assert_eq!(report["testbed"]["mtu"], 1500);
    assert_eq!(report["elems_per_packet"], 364);
}

fn sim_at_its_defaults() {
    let stdout = assert_ok(&ina(&["sim"]));
    let row = stdout
        .lines()
        .find(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() >= 10 && cols[..2].iter().all(|c| c.parse::<u64>().is_ok())
        })
        .unwrap_or_else(|| panic!("no result row: {stdout}"));
    assert!(row.trim_end().ends_with("yes"), "{row}");
}

/// A switch at its defaults, a job on it, and a worker with only the flags it needs.
fn switch_and_worker_at_their_defaults() {
    let bind = free_udp_addrs(1)[0];
    let job = format!("id=1;slots=0..64;elems=256;workers={bind}");
    let mut sw = SwitchProc::start(&["--job", &job]);
    let mut w = Proc::spawn(
        "worker",
        &[
            "worker",
            "--switch",
            &sw.udp.to_string(),
            "--bind",
            &bind.to_string(),
            "--rank",
            "0",
            "--workers",
            "1",
        ],
    );
    let outcome = Outcome::collect(&mut w, after(Duration::from_secs(120)));
    // The defaults: one warmup and three timed iterations.
    outcome.assert_verified(4);
    sw.terminate();
}

/// The controller at its defaults (loopback, its state and its token next to it), and
/// `ina job list` with its defaults, run from the same directory, finds it and is let in.
fn controller_and_job_list_at_their_defaults() {
    let _guard = serial();
    let dir = std::env::temp_dir().join(format!("ina-defaults-ctl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ctl = Command::new(BIN)
        .arg("controller")
        .current_dir(&dir)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(ctl.stdout.take().unwrap()));
    let ready = lines.next().unwrap().unwrap();
    assert!(ready.contains("\"ready\""), "{ready}");
    assert!(
        ready.contains("\"token_file\":\"ina-controller/token\""),
        "{ready}"
    );
    let list = Command::new(BIN)
        .args(["job", "list"])
        .current_dir(&dir)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    // From elsewhere, without the token, the controller refuses and says where it is.
    let elsewhere = ina(&["job", "list"]);
    // SAFETY: kill with a pid of our own child.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(ctl.id() as i32, libc::SIGTERM);
    }
    let status = ctl.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_ok(&list);
    assert!(status.success(), "{status:?}");
    let refused = String::from_utf8_lossy(&elsewhere.stderr);
    assert!(
        !elsewhere.status.success() && refused.contains("401") && refused.contains("token"),
        "{refused}"
    );
}

fn main() -> std::process::ExitCode {
    Suite::new()
        .test("sim_at_its_defaults", &[], sim_at_its_defaults)
        .test(
            "bench_runs_behind_paced_links_at_its_defaults",
            &[],
            bench_runs_behind_paced_links_at_its_defaults,
        )
        .test(
            "bench_on_bare_loopback_says_it_measures_cpu",
            &[],
            bench_on_bare_loopback_says_it_measures_cpu,
        )
        .test(
            "bench_on_the_testbed_at_its_defaults",
            RACK,
            bench_on_the_testbed_at_its_defaults,
        )
        .test(
            "switch_and_worker_at_their_defaults",
            &[],
            switch_and_worker_at_their_defaults,
        )
        .test(
            "controller_and_job_list_at_their_defaults",
            &[],
            controller_and_job_list_at_their_defaults,
        )
        .run()
}
