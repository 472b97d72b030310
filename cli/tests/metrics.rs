//! The switch's Prometheus endpoint (`ina switch --metrics ADDR`) as a scraper sees it: after
//! two workers all-reduced through the switch, its counters say so.
#![allow(clippy::unwrap_used)]

// (Each test binary uses part of the shared harness.)
#[allow(dead_code)]
mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: ina\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The value of the sample `line` (a metric name with its labels).
fn value(text: &str, line: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{line}` in:\n{text}"))
}

#[test]
fn the_switch_serves_its_counters_to_a_scraper() {
    let _serial = serial();
    let sw = SwitchProc::start(&["--metrics=127.0.0.1:0"]);
    let metrics = sw.ready.addr("metrics");
    let before = scrape(metrics);
    assert!(before.starts_with("HTTP/1.0 200 OK"), "{before}");
    assert_eq!(value(&before, "ina_switch_packets_total"), 0.0);
    let run = Run::new(2, 10_000, 1);
    let (mut workers, addrs) = run.ina_workers(sw.udp);
    sw.add_job(job_spec(1, addrs));
    for w in &mut workers {
        let o = Outcome::collect(w, after(Duration::from_secs(60)));
        assert!(matches!(o.end, End::Done(_)), "{}: {:?}", o.name, o.end);
    }
    // A scrape between two readings of the pipeline's counters (through the control
    // endpoint) that agree: the workers are done, but the switch may still be taking in their
    // last datagrams. (The socket counters keep moving: an idle shard still polls.)
    let (p, after_run) = wait_until(
        "the pipeline's counters to settle",
        after(Duration::from_secs(30)),
        || {
            let before = sw.stats().total.pipeline;
            let text = scrape(metrics);
            (sw.stats().total.pipeline == before).then_some((before, text))
        },
    );
    // Each counter is served under its name and type, with the switch's own count; the
    // run cannot complete without the first three.
    for (name, want, produced_by_the_run) in [
        ("ina_switch_packets_total", p.packets_in, true),
        (
            "ina_switch_results_multicast_total",
            p.results_multicast,
            true,
        ),
        ("ina_switch_data_first_total", p.data_first, true),
        ("ina_switch_missing_reports_total", p.missing_sent, false),
    ] {
        assert!(
            after_run.contains(&format!("# TYPE {name} counter\n")),
            "no counter {name} in:\n{after_run}"
        );
        assert_eq!(value(&after_run, name), want as f64, "{name}: {p:?}");
        assert!(!produced_by_the_run || want > 0, "{name}: {p:?}");
    }
    assert_eq!(
        value(&after_run, "ina_switch_drops_total{reason=\"malformed\"}"),
        0.0
    );
    assert!(after_run.contains("# TYPE ina_switch_drops_total counter"));
    let other = {
        let mut s = TcpStream::connect(metrics).unwrap();
        s.write_all(b"GET /other HTTP/1.0\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(other.starts_with("HTTP/1.0 404"));
}

#[test]
fn a_worker_serves_its_counters_between_all_reduces() {
    let _serial = serial();
    let sw = SwitchProc::start(&[]);
    // Enough iterations that the workers are still running when the test scrapes after the
    // first (30 finished in under 0.2 s on an idle host, and the scrape met a closed socket).
    let mut run = Run::new(2, 50_000, 1000);
    run.warmup = 0;
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut procs: Vec<Proc> = (0..2)
        .map(|r| {
            let mut args = run.common(r);
            args.push("--algorithm=ina".into());
            args.push(format!("--switch={}", sw.udp));
            args.push(format!("--bind={any}"));
            if r == 0 {
                args.push("--metrics=127.0.0.1:0".into());
            }
            Proc::spawn(&format!("worker {r}"), &args)
        })
        .collect();
    let addrs: Vec<SocketAddr> = procs
        .iter_mut()
        .map(|p| p.expect("bound", after(START)).addr("udp"))
        .collect();
    sw.add_job(job_spec(1, addrs));
    let metrics = procs[0].expect("metrics", after(START)).addr("addr");
    procs[0].expect("iteration", after(Duration::from_secs(60)));
    let text = scrape(metrics);
    assert!(value(&text, "ina_worker_allreduces_total") >= 1.0, "{text}");
    assert!(value(&text, "ina_worker_results_total") >= 1.0);
    assert!(value(&text, "ina_worker_srtt_seconds") > 0.0);
    assert!(value(&text, "ina_worker_window_slots") >= 1.0);
    assert!(text.contains("ina_worker_resends_total{cause=\"stall_probe\"}"));
    assert!(text.contains("ina_worker_resends_total{cause=\"missing_report\"}"));
    // The window was in flight part of the time: a fraction of it, and more than nothing.
    let occupancy = value(&text, "ina_worker_slot_occupancy");
    assert!(occupancy > 0.0 && occupancy <= 1.0, "{occupancy}: {text}");
    for p in &mut procs {
        let o = Outcome::collect(p, after(Duration::from_secs(120)));
        assert!(matches!(o.end, End::Done(_)), "{}: {:?}", o.name, o.end);
    }
}
