//! The L2 software switch (`ina switch --ports`) deployed as a P4 switch would be: on raw
//! Ethernet ports of a hub namespace, with `ina worker` processes in their own namespaces
//! speaking kernel UDP to its address. Needs root (skips otherwise, fails under
//! INA_REQUIRE_PRIVILEGED=1).
#![allow(clippy::unwrap_used)]

// (Each test binary uses part of the shared harness.)
#[allow(dead_code)]
mod common;

use common::*;
use ina_io::netns::{self, Rack, SWITCH_IP, SWITCH_MAC};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;

fn start_switch(rack: &Rack, elems: u16, extra: &[String]) -> Proc {
    start_switch_ready(rack, elems, extra).0
}

/// The same, with the ready line's fields.
fn start_switch_ready(rack: &Rack, elems: u16, extra: &[String]) -> (Proc, Line) {
    let workers: Vec<String> = (0..rack.workers)
        .map(|r| {
            format!(
                "{}/{}/{}:9000",
                Rack::port(r),
                Rack::worker_mac(r),
                Rack::worker_ip(r)
            )
        })
        .collect();
    let mut args = vec![
        "switch".to_string(),
        format!("--ports={}", rack.ports()),
        format!("--mac={SWITCH_MAC}"),
        format!("--ip={SWITCH_IP}"),
        format!(
            "--job=id=1;slots=0..64;elems={elems};workers={}",
            workers.join(",")
        ),
    ];
    args.extend(extra.iter().cloned());
    let mut sw = Proc::spawn_in(Some(&rack.hub()), "l2 switch", &args);
    let ready = sw.expect("ready", after(START));
    (sw, ready)
}

fn stop(sw: &mut Proc) -> Value {
    sw.signal(libc::SIGINT);
    let line = sw.expect("stopped", after(Duration::from_secs(10)));
    line.value["stats"].clone()
}

fn event(stats: &Value, name: &str) -> u64 {
    stats["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e[0] == name)
        .and_then(|e| e[1].as_u64())
        .unwrap_or_else(|| panic!("no event {name} in {stats}"))
}

/// Every packet the switch took was one of its jobs', from the rank it names.
fn assert_nothing_refused(stats: &Value) {
    for bad in [
        "malformed",
        "unknown_job",
        "wrong_port",
        "unknown_rank",
        "stale_epoch",
    ] {
        assert_eq!(event(stats, bad), 0, "{bad}: {stats}");
    }
}

fn workers_all_reduce_through_the_l2_switch_over_kernel_udp() {
    let _guard = serial();
    let rack = match Rack::new("l2a", 4) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    for elems in [64u16, 256] {
        let mut sw = start_switch(&rack, elems, &[]);
        let run = Run::new(4, 262_144, 2);
        let mut procs = run.ina_workers_on(&rack, SocketAddr::from((SWITCH_IP, 18766)));
        let outcomes: Vec<Outcome> = procs
            .iter_mut()
            .map(|p| Outcome::collect(p, after(Duration::from_secs(60))))
            .collect();
        let stats = stop(&mut sw);
        assert_all_exact(
            &outcomes,
            run.total(),
            &format!("({elems} elements) switch: {stats}"),
        );
        // Every packet was one of the job's; each worker resolved the switch by ARP (in the
        // first round: the second finds it in its cache).
        // Each tensor is B blocks plus the lookahead's min(window, B) header-only packets.
        let blocks = 262_144 / u64::from(elems);
        let packets_per_worker = run.total() as u64 * (blocks + blocks.min(64));
        assert!(event(&stats, "data_first") >= packets_per_worker, "{stats}");
        if elems == 64 {
            assert_eq!(event(&stats, "arp_replied"), 4, "{stats}");
        }
        assert_nothing_refused(&stats);
        assert!(stats["results_multicast"].as_u64().unwrap() >= packets_per_worker);
        for p in stats["ports"].as_array().unwrap() {
            assert_eq!(p["rx_truncated"], 0, "{stats}");
            assert_eq!(p["tx_dropped"], 0, "{stats}");
        }
    }
}

fn a_ring_all_reduce_crosses_the_l2_switch_as_ordinary_traffic() {
    let _guard = serial();
    let rack = match Rack::new("l2r", 3) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    let mut sw = start_switch(&rack, 256, &[]);
    let run = Run::new(3, 100_000, 2);
    let peers: Vec<String> = (0..3)
        .map(|r| format!("{}:7000", Rack::worker_ip(r)))
        .collect();
    let mut procs: Vec<Proc> = (0..3)
        .map(|r| {
            let mut args = run.common(r);
            args.push("--algorithm=ring".into());
            args.push(format!("--bind={}:7000", Rack::worker_ip(r)));
            args.push(format!("--peers={}", peers.join(",")));
            Proc::spawn_in(Some(&rack.worker_ns(r)), &format!("ring {r}"), &args)
        })
        .collect();
    for p in &mut procs {
        let o = Outcome::collect(p, after(Duration::from_secs(60)));
        assert!(
            matches!(o.end, End::Done(_)),
            "{}: {:?}\n{}",
            o.name,
            o.end,
            o.stderr
        );
        assert_eq!(o.violations(), vec![0; run.total()]);
    }
    let stats = stop(&mut sw);
    // The workers' TCP segments and ARP went through the L2 table and flooding.
    assert!(event(&stats, "l2_forwarded") > 100, "{stats}");
    assert_eq!(event(&stats, "data_first"), 0);
}

/// The metrics page at `addr`, fetched from inside namespace `netns` (the endpoint listens on
/// the hub's loopback) with bash's `/dev/tcp`.
fn scrape_in(netns: &str, addr: SocketAddr) -> String {
    let script = format!(
        "exec 3<>/dev/tcp/{}/{} && printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3",
        addr.ip(),
        addr.port()
    );
    let out = netns::command_in(Some(netns), "bash")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "scraping {addr} in {netns}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn the_l2_switch_serves_its_counters_once_it_says_it_is_ready() {
    let _guard = serial();
    let rack = match Rack::new("l2m", 2) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    let (mut sw, ready) = start_switch_ready(&rack, 64, &["--metrics=127.0.0.1:0".into()]);
    // The ready line names the endpoint, which already serves every counter (no frame yet).
    let page = scrape_in(&rack.hub(), ready.addr("metrics"));
    assert!(page.starts_with("HTTP/1.0 200 OK"), "{page}");
    assert!(
        page.contains("ina_switch_frames_total{event=\"data_first\"} 0\n"),
        "{page}"
    );
    for r in 0..2 {
        let line = format!(
            "ina_port_tx_dropped_total{{port=\"{}\"}} 0\n",
            Rack::port(r)
        );
        assert!(page.contains(&line), "{line}\n{page}");
    }
    stop(&mut sw);
}

/// A tree of switches (PROTOCOL.md §9) whose racks are L2 switches on raw ports: two racks of
/// two workers, each rack's switch (`ina switch --ports`, its own address 198.18.0.100 + i)
/// with a third port `uplink` towards an upper UDP switch (`ina switch --listen`) in its own
/// namespace, which lists the rack switches as its workers. Every worker's sums are exact,
/// each rack sent its partials up as frames and took the totals down.
fn a_tree_of_l2_rack_switches_under_a_udp_switch_sums_exactly() {
    let _guard = serial();
    let racks: Vec<Rack> = (0..2)
        .map(|i| Rack::new(&format!("l2t{i}"), 2).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let upper = UpperNs::link("l2tree-up", &racks);
    let mut upper_sw = Proc::spawn_in(
        Some(&upper.name),
        "upper switch",
        &[
            "switch",
            "--listen=0.0.0.0:18000",
            "--job=id=1;epoch=77;slots=0..128;elems=256;workers=198.18.0.100:18766,198.18.0.101:18766",
        ],
    );
    upper_sw.expect("ready", after(START));
    let mut rack_sw: Vec<Proc> = racks
        .iter()
        .enumerate()
        .map(|(i, rack)| {
            let workers: Vec<String> = (0..2)
                .map(|r| format!("{}/{}/{}:19000", Rack::port(r), Rack::worker_mac(r), Rack::worker_ip(r)))
                .collect();
            let mut sw = Proc::spawn_in(
                Some(&rack.hub()),
                "rack switch",
                &[
                    "switch".to_string(),
                    format!("--ports={},uplink", rack.ports()),
                    format!("--mac=02:00:00:00:00:{:02x}", 0x64 + i),
                    format!("--ip={}", UpperNs::rack_switch_ip(i)),
                    format!(
                        "--job=id=1;slots=0..128;elems=256;workers={};uplink=uplink/{}/{}:18000;uplink_rank={i};uplink_epoch=77",
                        workers.join(","),
                        UpperNs::mac(i),
                        UpperNs::ip(i)
                    ),
                ],
            );
            sw.expect("ready", after(START));
            sw
        })
        .collect();
    let run = Run::new(4, 262_144, 2);
    let mut workers = tree_workers(&run, 2, 2, |i, r| {
        (
            racks[i].worker_ns(r),
            format!("{}:18766", UpperNs::rack_switch_ip(i)),
            format!("{}:19000", Rack::worker_ip(r)),
        )
    });
    let outcomes: Vec<Outcome> = workers
        .iter_mut()
        .map(|p| Outcome::collect(p, after(Duration::from_secs(60))))
        .collect();
    let rack_stats: Vec<Value> = rack_sw.iter_mut().map(stop).collect();
    upper_sw.signal(libc::SIGINT);
    let upper_stats = upper_sw
        .expect("stopped", after(Duration::from_secs(10)))
        .value;
    for o in &outcomes {
        o.assert_verified(run.total());
    }
    for s in &rack_stats {
        assert!(event(s, "data_first") > 0, "{s}");
        assert_nothing_refused(s);
    }
    // Every use the upper switch finished came down to both racks as a total.
    let finished = upper_stats["stats"]["total"]["pipeline"]["results_multicast"]
        .as_u64()
        .unwrap_or_else(|| panic!("{upper_stats}"));
    let totals: u64 = rack_stats.iter().map(|s| event(s, "totals_received")).sum();
    assert!(finished > 0, "{upper_stats}");
    assert_eq!(totals, 2 * finished, "{upper_stats}");
}

fn main() -> std::process::ExitCode {
    ina_testkit::Suite::new()
        .test(
            "workers_all_reduce_through_the_l2_switch_over_kernel_udp",
            ina_testkit::RACK,
            workers_all_reduce_through_the_l2_switch_over_kernel_udp,
        )
        .test(
            "a_ring_all_reduce_crosses_the_l2_switch_as_ordinary_traffic",
            ina_testkit::RACK,
            a_ring_all_reduce_crosses_the_l2_switch_as_ordinary_traffic,
        )
        .test(
            "the_l2_switch_serves_its_counters_once_it_says_it_is_ready",
            ina_testkit::RACK,
            the_l2_switch_serves_its_counters_once_it_says_it_is_ready,
        )
        .test(
            "a_tree_of_l2_rack_switches_under_a_udp_switch_sums_exactly",
            ina_testkit::RACK,
            a_tree_of_l2_rack_switches_under_a_udp_switch_sums_exactly,
        )
        .run()
}
