//! What `ina` says when it is given flags it cannot work with: plain messages that name the
//! flag at fault, no backtraces, and timeouts the user can set.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn ina() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ina"));
    c.env("RUST_LOG", "warn");
    c
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `ina` with `args` and RUST_BACKTRACE=1; returns the output and its stderr.
fn run_failing(args: &[&str]) -> (Output, String) {
    let out = ina()
        .env("RUST_BACKTRACE", "1")
        .args(args)
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "ina {args:?} succeeded: {stderr}");
    (out, stderr)
}

/// A configuration error is one plain line, with its causes, and exit status 2, even with
/// RUST_BACKTRACE set.
#[test]
fn configuration_errors_print_no_backtrace() {
    let worker = format!("127.0.0.1:{}", free_port());
    let cases: [(Vec<String>, &str); 3] = [
        (
            vec![
                "switch".into(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--job".into(),
                format!("id=1;slots=0..8;colour=blue;workers={worker}"),
            ],
            "unknown key `colour`",
        ),
        (
            ["worker", "--rank", "3", "--workers", "2"]
                .map(String::from)
                .to_vec(),
            "--rank 3 but only 2 workers",
        ),
        (
            vec![
                "switch".into(),
                "--config".into(),
                "/nonexistent/ina-switch.toml".into(),
            ],
            "reading /nonexistent/ina-switch.toml: No such file",
        ),
    ];
    for (args, want) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (out, stderr) = run_failing(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        for noise in ["backtrace", "Caused by", "Stack", "panicked"] {
            assert!(!stderr.contains(noise), "{args:?}: {noise} in {stderr}");
        }
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    }
}

/// `--connect-timeout-ms` bounds how long a ring worker waits for a peer that never comes.
#[test]
fn ring_connect_timeout_is_a_flag() {
    let help = ina().args(["worker", "--help"]).output().unwrap();
    let help = text(&help.stdout);
    assert!(help.contains("--connect-timeout-ms"), "{help}");
    assert!(help.contains("[default: 30000]"), "{help}");

    let me = format!("127.0.0.1:{}", free_tcp_port());
    let absent = format!("127.0.0.1:{}", free_tcp_port());
    let peers = format!("{me},{absent}");
    let give_up_after = |ms: &str| {
        let started = Instant::now();
        let out = ina()
            .args([
                "worker",
                "--algorithm",
                "ring",
                "--rank",
                "0",
                "--workers",
                "2",
            ])
            .args(["--bind", &me, "--peers", &peers, "--connect-timeout-ms", ms])
            .args(["--elements", "16", "--iterations", "1", "--warmup", "0"])
            .output()
            .unwrap();
        let waited = started.elapsed();
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{stdout}{}", text(&out.stderr));
        assert!(
            stdout.contains(r#""event":"error""#) && stdout.contains(r#""kind":"ring""#),
            "{stdout}"
        );
        waited
    };
    let short = give_up_after("300");
    assert!(short < Duration::from_secs(5), "failed after {short:?}");
    let long = give_up_after("2500");
    assert!(
        long >= Duration::from_millis(1500) && long < Duration::from_secs(10),
        "failed after {long:?}, not after about 2.5 s"
    );

    let (out, stderr) = run_failing(&[
        "worker",
        "--algorithm",
        "ring",
        "--rank",
        "0",
        "--workers",
        "2",
        "--peers",
        &peers,
        "--connect-timeout-ms",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("--connect-timeout-ms"), "{stderr}");
}

/// A job with more elements per packet than `--max-elems` stops the switch with a message
/// that names the flag and the value needed; without the flag the switch sizes itself for
/// its jobs; `--help` shows the default.
#[test]
fn max_elems_is_named_and_sized_from_the_jobs() {
    let help = text(&ina().args(["switch", "--help"]).output().unwrap().stdout);
    let line = help
        .lines()
        .skip_while(|l| !l.contains("--max-elems"))
        .take(4)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(line.contains("default: 256"), "{help}");

    let job = format!(
        "id=1;slots=0..8;elems=2048;workers=127.0.0.1:{}",
        free_port()
    );
    let (out, stderr) = run_failing(&[
        "switch",
        "--listen",
        "127.0.0.1:0",
        "--max-elems",
        "256",
        "--job",
        &job,
    ]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--max-elems 256"), "{stderr}");
    assert!(stderr.contains("--max-elems 2048 or more"), "{stderr}");

    // Without --max-elems the switch takes the job.
    let mut child = ina()
        .args(["switch", "--listen", "127.0.0.1:0", "--job", &job])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let stdout = child.stdout.take().unwrap();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut first).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let ready: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(ready["event"], "ready", "{first}");
    assert_eq!(ready["jobs"][0]["elems_per_packet"], 2048, "{first}");
}

/// `--port dpdk` on a build without DPDK says how to get one; its other flags are checked
/// first, with the same errors as on a DPDK build.
#[cfg(not(feature = "dpdk"))]
#[test]
fn port_dpdk_without_the_feature_says_how_to_build_it() {
    let common = [
        "worker",
        "--port=dpdk",
        "--rank=0",
        "--workers=1",
        "--switch=198.18.0.100:18766",
    ];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        common
            .iter()
            .copied()
            .chain(extra.iter().copied())
            .collect()
    };
    let (_, err) = run_failing(&with(&[
        "--bind=198.18.1.1:9000",
        "--dpdk=--no-huge --vdev=net_null0",
    ]));
    assert!(
        err.contains("built without DPDK") && err.contains("--features dpdk"),
        "{err}"
    );
    let (_, err) = run_failing(&with(&["--bind=198.18.1.1:9000"]));
    assert!(err.contains("needs --dpdk"), "{err}");
    let (_, err) = run_failing(&with(&["--bind=0.0.0.0:9000", "--dpdk=--no-huge"]));
    assert!(err.contains("owns one IPv4 address"), "{err}");
    let (_, err) = run_failing(&[
        "switch",
        "--port=dpdk",
        "--listen=198.18.0.100:18766",
        "--dpdk=--no-huge --vdev=net_null0",
    ]);
    assert!(err.contains("built without DPDK"), "{err}");
}
