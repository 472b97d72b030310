//! `ina bench` and `ina sim` end to end, on small sizes: the commands README.md points at.
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn ina() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ina"));
    c.env("RUST_LOG", "warn");
    c
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ina-{}-{name}", std::process::id()))
}

/// Runs `ina` with `args` plus `--json FILE`, checks that it succeeded, and returns the report.
fn run_json(args: &[&str], name: &str) -> Value {
    let json = scratch(name);
    let out = ina().args(args).arg("--json").arg(&json).output().unwrap();
    assert!(
        out.status.success(),
        "ina {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    report
}

fn bench(args: &[&str]) -> Value {
    let name = format!("bench-{}.json", args.join("").replace(['-', ','], ""));
    run_json(&[&["bench"], args].concat(), &name)
}

fn result<'a>(report: &'a Value, algorithm: &str) -> &'a Value {
    report["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["algorithm"] == algorithm)
        .unwrap_or_else(|| panic!("no {algorithm} in {report}"))
}

#[test]
fn bench_in_process_verifies_ina_and_ring() {
    let r = bench(&[
        "--size",
        "1MiB",
        "--iterations",
        "2",
        "--rounds",
        "3",
        "--workers",
        "3",
    ]);
    assert_eq!(r["rounds"], 3);
    for algo in ["ina", "ring"] {
        let x = result(&r, algo);
        assert_eq!(x["verified"], true, "{x}");
        assert_eq!(x["workers"], 3);
        assert_eq!(x["elements"], 1 << 18);
        // Every round's timed iterations, and only those (not the warm-up round's).
        assert_eq!(x["seconds"].as_array().unwrap().len(), 6);
        assert!(x["goodput_gbit_per_s"].as_f64().unwrap() > 0.0);
        assert!(x["max_abs_err"].as_f64().unwrap() < 1e-5);
        // CPU time of the process during each timed iteration, some of it on this all-reduce.
        assert_eq!(x["cpu_seconds"].as_array().unwrap().len(), 6);
        assert!(x["median_cpu_s"].as_f64().unwrap() > 0.0, "{x}");
    }
    let ina = result(&r, "ina");
    assert!(ina["switch"]["results_multicast"].as_u64().unwrap() > 0);
    assert!(r["ina_over_ring"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_in_processes_with_loss_verifies() {
    let r = bench(&[
        "--size",
        "512KiB",
        "--iterations",
        "2",
        "--processes",
        "--loss",
        "0.02",
        "--elems",
        "256",
        "--rounds",
        "1",
        "--warmup-rounds",
        "0",
    ]);
    let ina = result(&r, "ina");
    assert_eq!(ina["verified"], true, "{ina}");
    assert_eq!(ina["processes"], true);
    assert!(ina["retransmissions"].as_u64().unwrap() > 0, "{ina}");
    // The kinds of resend, carried over from the worker processes: fast retransmissions are
    // among the retransmissions (the rest were sent by timers or on Pending answers); stall
    // probes are counted apart.
    let fast = ina["fast_retransmissions"].as_u64().unwrap();
    assert!(fast <= ina["retransmissions"].as_u64().unwrap(), "{ina}");
    assert!(fast + ina["stall_probes"].as_u64().unwrap() > 0, "{ina}");
    assert!(
        ina["switch"]["injected_drops"].as_u64().unwrap() > 0,
        "{ina}"
    );
    assert!(ina["switch"]["peak_rss_kib"].as_u64().unwrap() > 0, "{ina}");
    assert_eq!(result(&r, "ring")["verified"], true);
}

/// `--adaptive-window` reaches the worker processes (an unknown flag would fail them) and
/// the in-process workers alike, and the report says it ran.
#[test]
fn bench_with_an_adaptive_window_verifies() {
    for processes in [true, false] {
        let mut args = vec![
            "--size",
            "512KiB",
            "--iterations",
            "2",
            "--rounds",
            "1",
            "--warmup-rounds",
            "0",
            "--elems",
            "256",
            "--algorithms",
            "ina",
            "--adaptive-window",
            "--target-queueing-us",
            "300",
        ];
        if processes {
            args.push("--processes");
        }
        let r = bench(&args);
        assert_eq!(r["adaptive_window_us"], 300.0, "{r}");
        let ina = result(&r, "ina");
        assert_eq!(ina["verified"], true, "{ina}");
        assert_eq!(ina["processes"], processes, "{ina}");
    }
}

#[test]
fn bench_measures_switch_and_reflector_packet_rates() {
    let r = bench(&[
        "--algorithms",
        "switch,reflector",
        "--rate-seconds",
        "0.3",
        "--elems",
        "256",
    ]);
    for algo in ["switch", "reflector"] {
        let rate = &result(&r, algo)["rate"];
        assert!(rate["packets_per_s"].as_f64().unwrap() > 1000.0, "{rate}");
        assert_eq!(rate["packet_bytes"], 16 + 4 * 256);
    }
    assert!(r["switch_over_reflector"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_refuses_impossible_settings() {
    for args in [
        &["--workers", "33"][..],
        &["--elems", "20000"],
        &["--loss", "1.5"],
        &["--size", "twelve"],
        &["--iterations", "0"],
        &["--rounds", "0"],
        &["--adaptive-window", "--target-queueing-us", "0"],
        &["--target-queueing-us", "500"],
    ] {
        let out = ina().arg("bench").args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.trim().is_empty(), "{args:?}: no message");
    }
}

#[test]
fn bench_refuses_a_testbed_it_cannot_build_for_what_it_is() {
    // Offloads would hand a switch on raw ports GSO super-frames: refused as a setting, root
    // or not, before anything is built.
    let out = ina()
        .args([
            "bench",
            "--testbed",
            "--workers",
            "2",
            "--offloads",
            "--hub",
            "l2",
        ])
        .args(["--elems", "256", "--size", "1MiB", "--algorithms", "ina"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "accepted");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs offloads off"), "{err}");
    assert!(!err.contains("root"), "{err}");
}

#[test]
fn sim_runs_and_checks_every_job() {
    let v = run_json(
        &[
            "sim",
            "--workers",
            "3",
            "--jobs",
            "2",
            "--elements",
            "20000",
            "--window",
            "16",
            "--loss",
            "0.01",
            "--seeds",
            "2",
        ],
        "sim.json",
    );
    let runs = v.as_array().unwrap();
    assert_eq!(runs.len(), 4, "2 seeds x 2 jobs");
    for r in runs {
        assert_eq!(r["identical"], true, "{r}");
        assert_eq!(r["within_bound"], true, "{r}");
        assert!(r["error"].is_null(), "{r}");
        assert!(r["virtual_seconds"].as_f64().unwrap() > 0.0);
    }
    assert!(runs
        .iter()
        .any(|r| r["retransmissions"].as_u64().unwrap() > 0));
}

/// `ina sim --scenario`: the committed fault scenarios run as they say (a late and a lossy
/// worker still get exact sums, later; a dead worker makes the others give up naming it), and a
/// fault that names no worker of the run is refused by name.
#[test]
fn sim_scenario_files_describe_jobs_and_faults() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/sim");
    let faults = format!("{dir}/faults.toml");
    let v = run_json(&["sim", "--scenario", &faults], "sim-faults.json");
    let r = &v.as_array().unwrap()[0];
    assert_eq!(
        (&r["identical"], &r["within_bound"]),
        (&true.into(), &true.into()),
        "{r}"
    );
    // The late start alone costs 200 µs; the clean run of the same size takes about 0.1 ms.
    assert!(r["virtual_seconds"].as_f64().unwrap() > 300e-6, "{r}");
    assert!(r["packets_lost"].as_u64().unwrap() > 0, "{r}");

    let dead = format!("{dir}/dead-worker.toml");
    let out = ina().args(["sim", "--scenario", &dead]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains("missing ranks 3 "), "{stdout}");

    let bad = scratch("bad-fault.toml");
    std::fs::write(
        &bad,
        "workers = 4\n[[fault]]\njob = 1\nrank = 4\ndies_at_us = 1\n",
    )
    .unwrap();
    let out = ina()
        .args(["sim", "--scenario", bad.to_str().unwrap()])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&bad);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("job 1 rank 4"), "{stderr}");
}

/// `--framing-bytes` (or `framing_bytes` in a scenario file) puts every packet's headers and
/// line framing on the simulated links: a lossless run of 1040-byte packets is then bounded
/// by 1106 bytes per packet.
#[test]
fn sim_framing_takes_link_time() {
    let base = [
        "sim",
        "--workers",
        "2",
        "--elements",
        "262144",
        "--window",
        "128",
        "--generated",
    ];
    let seconds = |v: &Value| {
        v.as_array().unwrap()[0]["virtual_seconds"]
            .as_f64()
            .unwrap()
    };
    let bare = seconds(&run_json(&base, "sim-bare.json"));
    let flag = seconds(&run_json(
        &[&base[..], &["--framing-bytes", "66"]].concat(),
        "sim-framed.json",
    ));
    let file = scratch("framed.toml");
    std::fs::write(&file, "framing_bytes = 66\n").unwrap();
    let from_file = seconds(&run_json(
        &[&base[..], &["--scenario", file.to_str().unwrap()]].concat(),
        "sim-framed-file.json",
    ));
    let _ = std::fs::remove_file(&file);
    assert_eq!(flag, from_file);
    // Most of the run is its packets' serialization: the ratio approaches 1106 / 1040.
    let ratio = flag / bare;
    assert!((1.03..1.07).contains(&ratio), "{flag} / {bare} = {ratio}");
}

/// `ina sim --sweep-loss` runs the lossless case and every loss asked for, reports each as a
/// fraction of the lossless goodput beside `1 - p` and the ceiling of recovery by repair, and
/// draws them with `--plot`.
#[test]
fn sim_sweeps_loss_and_plots_the_fractions() {
    let svg = scratch("sim-sweep.svg");
    let args = [
        "sim",
        "--workers",
        "4",
        "--elements",
        "65536",
        "--window",
        "64",
        "--sweep-loss",
        "0.05,0.01",
        "--plot",
        svg.to_str().unwrap(),
    ];
    let v = run_json(&args, "sim-sweep.json");
    let points = v.as_array().unwrap();
    let losses: Vec<f64> = points.iter().map(|p| p["loss"].as_f64().unwrap()).collect();
    assert_eq!(
        losses,
        [0.0, 0.01, 0.05],
        "the lossless run first, then in order"
    );
    assert_eq!(points[0]["fraction_mean"].as_f64().unwrap(), 1.0);
    for p in points {
        let ideal = p["ideal"].as_f64().unwrap();
        assert_eq!(ideal, 1.0 - p["loss"].as_f64().unwrap());
        let f = p["fraction_mean"].as_f64().unwrap();
        assert!(f > 0.0 && f <= 1.0 + 1e-9, "{p}");
        // A loss costs a round trip at the end besides its bytes: the ceiling is below 1 - p.
        let ceiling = p["ceiling"].as_f64().unwrap();
        assert!(ceiling > 0.0 && ceiling <= ideal, "{p}");
        for r in p["runs"].as_array().unwrap() {
            assert_eq!(r["within_bound"], true, "{r}");
        }
    }
    // Losing packets never made a run faster than the lossless one, and the ceiling falls
    // with the loss.
    assert!(points[2]["fraction_mean"].as_f64().unwrap() < 1.0);
    assert_eq!(points[0]["ceiling"].as_f64().unwrap(), 1.0);
    let ceilings: Vec<f64> = points
        .iter()
        .map(|p| p["ceiling"].as_f64().unwrap())
        .collect();
    assert!(ceilings[2] < ceilings[1] && ceilings[1] < ceilings[0] && ceilings[1] < 0.99);
    let plot = std::fs::read_to_string(&svg).unwrap();
    let _ = std::fs::remove_file(&svg);
    assert!(
        plot.contains("<svg") && plot.contains("1 - p") && plot.contains("ceiling"),
        "{plot:.200}"
    );

    // A plot needs a sweep, and a sweep probabilities.
    let out = ina().args(["sim", "--plot", "x.svg"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--sweep-loss"));
    let out = ina().args(["sim", "--sweep-loss", "1.5"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("[0, 1)"));
}

#[test]
fn sim_runs_racks_under_an_upper_switch_and_refuses_a_job_too_large_for_them() {
    let out = ina()
        .args([
            "sim",
            "--workers",
            "40",
            "--rack-size",
            "8",
            "--elements",
            "65536",
            "--loss",
            "0.01",
            "--uplink-gbps",
            "40",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("5 racks under one upper switch"),
        "{stdout}"
    );
    assert!(stdout.contains(" yes"), "{stdout}");
    for (args, words) in [
        (&["--workers", "33"][..], "1..=32 on one switch"),
        (&["--workers", "300", "--rack-size", "8"][..], "1..=256"),
        (&["--rack-size", "33"][..], "--rack-size must be"),
        (&["--uplink-gbps", "10"][..], "add --rack-size"),
        (&["--uplink-loss", "0.1"][..], "add --rack-size"),
        (
            &["--rack-size", "4", "--uplink-loss", "1.5"][..],
            "probability in [0, 1)",
        ),
    ] {
        let out = ina().arg("sim").args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(words),
            "{args:?}: {stderr}"
        );
    }
}
