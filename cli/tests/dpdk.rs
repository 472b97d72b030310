//! Workers and the software switch on DPDK (feature `dpdk`; root): separate processes over
//! DPDK's memif shared-memory links, a mixed run in which a kernel UDP worker in a network
//! namespace reaches the DPDK switch through `net_af_packet` on its veth, and bad flags.
#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
mod common;

use common::*;
use ina_io::netns::{Rack, SWITCH_IP};
use std::time::Duration;

/// EAL arguments for one process: no hugepages, no PCI, its own runtime files, `vdevs`.
fn eal(prefix: &str, lcore: u32, vdevs: &[String]) -> String {
    let mut a = format!(
        "--no-huge --no-pci --no-shconf -m 256 --log-level=*:warning --file-prefix=ina-{prefix}-{} -l {lcore}",
        std::process::id()
    );
    for v in vdevs {
        a += &format!(" --vdev={v}");
    }
    a
}

fn memif(n: usize, role: &str, sock: &str) -> String {
    format!("net_memif{n},role={role},socket={sock},socket-abstract=no")
}

/// SIGTERM, then the switch's `stopped` line, and a clean exit.
fn stop(p: &mut Proc) -> Line {
    p.signal(libc::SIGTERM);
    let stopped = p.expect("stopped", after(Duration::from_secs(10)));
    assert!(p.wait(after(Duration::from_secs(10))).success());
    stopped
}

const SWITCH: &str = "198.18.0.100:18766";

/// The DPDK switch: one job of `workers` ranks at 198.18.1.{r+1}:9000, on the devices.
fn dpdk_switch(netns: Option<&str>, vdevs: &[String], workers: usize) -> Proc {
    let list: Vec<String> = (0..workers)
        .map(|r| format!("198.18.1.{}:9000", r + 1))
        .collect();
    let mut p = Proc::spawn_in(
        netns,
        "switch",
        &[
            "switch".to_string(),
            "--port=dpdk".into(),
            format!("--dpdk={}", eal("sw", 0, vdevs)),
            format!("--listen={SWITCH}"),
            format!(
                "--job=id=1;slots=0..64;elems=256;workers={}",
                list.join(",")
            ),
        ],
    );
    p.expect("ready", after(Duration::from_secs(30)));
    p
}

fn dpdk_worker(rank: usize, vdev: String, run: &Run) -> Proc {
    let mut args = run.common(rank);
    args.extend([
        "--port=dpdk".to_string(),
        format!("--dpdk={}", eal(&format!("w{rank}"), 1, &[vdev])),
        format!("--bind=198.18.1.{}:9000", rank + 1),
        format!("--switch={SWITCH}"),
    ]);
    Proc::spawn(&format!("dpdk worker {rank}"), &args)
}

fn dpdk_workers_all_reduce_through_the_dpdk_switch_over_memif() {
    let _serial = serial();
    let dir = std::env::temp_dir();
    let socks: Vec<String> = (0..3)
        .map(|r| {
            let s = dir.join(format!("ina-memif-{}-{r}.sock", std::process::id()));
            let _ = std::fs::remove_file(&s);
            s.display().to_string()
        })
        .collect();
    let vdevs: Vec<String> = socks
        .iter()
        .enumerate()
        .map(|(r, s)| memif(r, "server", s))
        .collect();
    let mut sw = dpdk_switch(None, &vdevs, 3);
    let run = Run::new(3, 200_000, 3);
    let mut workers: Vec<Proc> = (0..3)
        .map(|r| dpdk_worker(r, memif(0, "client", &socks[r]), &run))
        .collect();
    let outcomes = collect_all(&mut workers, after(Duration::from_secs(120)));
    assert_all_exact(&outcomes, run.total(), &"memif");
    let stopped = stop(&mut sw);
    // Every packet went through the DPDK port: nothing malformed, nothing refused.
    let total = &stopped.value["stats"]["total"];
    assert!(
        total["pipeline"]["packets_in"].as_u64().unwrap() > 3 * 3 * 782,
        "{total}"
    );
    assert_eq!(total["pipeline"]["malformed"].as_u64(), Some(0), "{total}");
    // `tx_errors` are datagrams the device refused (its transmit ring full while the memif
    // peer drains it, which a loaded machine makes happen), each repaired by the workers'
    // retransmissions (their sums were exact): the exception, never the path.
    let tx_errors = total["io"]["tx_errors"].as_u64().unwrap();
    let tx = total["io"]["tx_datagrams"].as_u64().unwrap();
    assert!(tx_errors * 10 < tx, "{total}");
    for s in socks {
        let _ = std::fs::remove_file(s);
    }
}

fn kernel_and_dpdk_workers_share_the_dpdk_switch() {
    let _serial = serial();
    // Rank 1 is a kernel UDP worker in its namespace; the switch, in the hub namespace, takes
    // its veth with net_af_packet. Rank 0 is a DPDK worker on a memif link.
    let rack = match Rack::new("dk", 2) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    let sock = std::env::temp_dir().join(format!("ina-memif-mixed-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&sock);
    let sock = sock.display().to_string();
    let vdevs = vec![
        memif(0, "server", &sock),
        format!("net_af_packet0,iface={}", Rack::port(1)),
    ];
    let mut sw = dpdk_switch(Some(&rack.hub()), &vdevs, 2);
    let run = Run::new(2, 200_000, 3);
    let mut dpdk = dpdk_worker(0, memif(0, "client", &sock), &run);
    let mut args = run.common(1);
    args.extend([
        "--algorithm=ina".to_string(),
        format!("--switch={}:18766", SWITCH_IP),
        format!("--bind={}:9000", Rack::worker_ip(1)),
    ]);
    let mut kernel = Proc::spawn_in(Some(&rack.worker_ns(1)), "kernel worker 1", &args);
    let outcomes = vec![
        Outcome::collect(&mut dpdk, after(Duration::from_secs(120))),
        Outcome::collect(&mut kernel, after(Duration::from_secs(120))),
    ];
    assert_all_exact(&outcomes, run.total(), &"memif and af_packet");
    stop(&mut sw);
    let _ = std::fs::remove_file(sock);
}

fn bad_dpdk_flags_fail_with_a_clear_error() {
    let _serial = serial();
    let fails = |args: &[&str], needle: &str| {
        let mut p = Proc::spawn("bad", args);
        let status = p.wait(after(Duration::from_secs(30)));
        assert_eq!(status.code(), Some(2), "{args:?}: {}", p.stderr_text());
        assert!(
            p.stderr_text().contains(needle),
            "{args:?}: {}",
            p.stderr_text()
        );
    };
    let base = [
        "worker",
        "--port=dpdk",
        "--rank=0",
        "--workers=1",
        "--switch=198.18.0.100:18766",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let run = |extra: &[&str], needle: &str| {
        let a = with(extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        fails(&a, needle);
    };
    run(&["--bind=198.18.1.1:9000"], "needs --dpdk");
    run(
        &["--bind=0.0.0.0:9000", "--dpdk=--no-huge"],
        "owns one IPv4 address",
    );
    run(
        &[
            "--bind=198.18.1.1:9000",
            "--dpdk=--no-huge --no-pci --bogus-option --vdev=net_null0",
        ],
        "refused its arguments",
    );
    run(
        &[
            "--bind=198.18.1.1:9000",
            "--dpdk=--no-huge --no-pci --no-shconf -m 128 --vdev=net_null0",
            "--dpdk-device=net_nothing",
        ],
        "no DPDK device named",
    );
    // A switch that never answers ARP: the worker says so and stops.
    run(
        &[
            "--bind=198.18.1.1:9000",
            "--dpdk=--no-huge --no-pci --no-shconf -m 128 --vdev=net_null0",
            "--probe-timeout-ms=300",
        ],
        "no answer from 198.18.0.100",
    );
}

fn a_dpdk_worker_all_reduces_through_bmv2_beside_kernel_workers() {
    let _serial = serial();
    use ina_switch_p4::bmv2;
    const WORKERS: usize = 3;
    let rack = match Rack::new("db", WORKERS) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    let dir = std::env::temp_dir().join(format!("ina-dpdk-bmv2-{}", std::process::id()));
    let program = bmv2::compile_v1model(&dir).unwrap();
    let sw = start_bmv2(&rack, &program, &dir, 9093);
    let (desc, job) = rack_descriptions(WORKERS, 256);
    sw.configure(&desc, &[job]).unwrap();
    // Rank 0 on DPDK: net_af_packet on its namespace's interface, the same frames as a
    // kernel socket's, resolved by the P4 program's ARP answer; ranks 1 and 2 on kernel UDP.
    let mut run = Run::new(WORKERS, 65_536, 2);
    run.give_up_ms = 20_000;
    let mut args = run.common(0);
    args.extend([
        "--port=dpdk".to_string(),
        format!(
            "--dpdk={}",
            eal("bw0", 1, &["net_af_packet0,iface=eth0".to_string()])
        ),
        format!("--bind={}:9000", Rack::worker_ip(0)),
        format!("--switch={SWITCH_IP}:18766"),
    ]);
    let mut procs = vec![Proc::spawn_in(
        Some(&rack.worker_ns(0)),
        "dpdk worker 0",
        &args,
    )];
    for r in 1..WORKERS {
        let mut args = run.common(r);
        args.extend([
            "--algorithm=ina".to_string(),
            format!("--switch={SWITCH_IP}:18766"),
            format!("--bind={}:9000", Rack::worker_ip(r)),
        ]);
        procs.push(Proc::spawn_in(
            Some(&rack.worker_ns(r)),
            &format!("worker {r}"),
            &args,
        ));
    }
    let outcomes = collect_all(&mut procs, after(Duration::from_secs(300)));
    let events = sw.counters().unwrap().events;
    assert_all_exact(
        &outcomes,
        run.total(),
        &format!("bmv2 counters: {events:?}"),
    );
    drop(sw);
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() -> std::process::ExitCode {
    ina_testkit::Suite::new()
        .test(
            "dpdk_workers_all_reduce_through_the_dpdk_switch_over_memif",
            &[ina_testkit::Need::Root],
            dpdk_workers_all_reduce_through_the_dpdk_switch_over_memif,
        )
        .test(
            "kernel_and_dpdk_workers_share_the_dpdk_switch",
            ina_testkit::RACK,
            kernel_and_dpdk_workers_share_the_dpdk_switch,
        )
        .test(
            "bad_dpdk_flags_fail_with_a_clear_error",
            &[ina_testkit::Need::Root],
            bad_dpdk_flags_fail_with_a_clear_error,
        )
        .test(
            "a_dpdk_worker_all_reduces_through_bmv2_beside_kernel_workers",
            ina_testkit::BMV2_RACK,
            a_dpdk_worker_all_reduces_through_bmv2_beside_kernel_workers,
        )
        .run()
}
