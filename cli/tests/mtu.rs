//! The switch and the worker find the path MTU and refuse a job whose packets it does not
//! fit, in a network namespace whose loopback has a 1500-byte MTU. Needs root and `ip`
//! (skips otherwise, fails under INA_REQUIRE_PRIVILEGED=1).
#![allow(clippy::unwrap_used)]

use ina_wire::agg::ProbeInfo;
use ina_wire::{AggRepr, MessageType, HEADER_LEN};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::process::{Command, Output};

/// A namespace of this test's own, removed when dropped (also when the test fails).
struct Netns(String);

impl Netns {
    fn create() -> Result<Netns, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root".into());
        }
        let name = format!("inamtu{}", std::process::id());
        let ok = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("ip: {e}"))
                .and_then(|o| {
                    o.status.success().then_some(()).ok_or_else(|| {
                        format!("ip {args:?}: {}", String::from_utf8_lossy(&o.stderr))
                    })
                })
        };
        ok(&["netns", "add", &name])?;
        let ns = Netns(name);
        ok(&["-n", &ns.0, "link", "set", "lo", "mtu", "1500", "up"])?;
        Ok(ns)
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("ip")
            // (Bounded: a switch that took the job would serve it until stopped.)
            .args(["netns", "exec", &self.0, "timeout", "20"])
            .arg(env!("CARGO_BIN_EXE_ina"))
            .args(args)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    }

    /// A UDP socket bound inside the namespace (by a thread that enters it).
    fn bind(&self, addr: &str) -> UdpSocket {
        let path = format!("/var/run/netns/{}", self.0);
        let addr = addr.to_string();
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap();
            // SAFETY: the descriptor is open; only this thread changes namespace.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            UdpSocket::bind(addr).unwrap()
        })
        .join()
        .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn switch_and_worker_refuse_packets_beyond_the_path_mtu() {
    let ns = match Netns::create() {
        Ok(ns) => ns,
        Err(reason) => panic!("{reason}"),
    };
    // The switch: a job of 1024 elements per packet (4140-byte IP packets) on a 1500-byte path.
    let out = ns.run(&[
        "switch",
        "--listen",
        "127.0.0.1:0",
        "--job",
        "id=1;slots=0..8;elems=1024;workers=127.0.0.1:9",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for part in [
        "1024 elements per packet",
        "4140-byte IP packets",
        "path MTU to rank 0 at 127.0.0.1:9 is 1500 bytes",
        "elems=364",
    ] {
        assert!(stderr.contains(part), "{part} not in {stderr}");
    }
    // The worker, against a switch (this test) that reports a job of 1024 elements.
    let switch = ns.bind("127.0.0.1:0");
    let switch_addr = switch.local_addr().unwrap().to_string();
    let answer = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        switch
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let (n, from) = switch.recv_from(&mut buf).unwrap();
        let (probe, _) = AggRepr::parse_bytes(&buf[..n]).unwrap();
        assert_eq!(probe.kind, MessageType::Probe);
        let reply = AggRepr {
            kind: MessageType::ProbeReply,
            epoch: 7,
            count: ProbeInfo::COUNT,
            ..probe
        };
        let mut out = [0u8; HEADER_LEN + 16];
        let mut pkt = reply.emit_into(&mut out).unwrap();
        let info = ProbeInfo {
            workers: 1,
            elems_per_packet: 1024,
            slot_base: 0,
            slot_count: 8,
        };
        info.emit(pkt.payload_mut()).unwrap();
        switch.send_to(&out, from).unwrap();
    });
    let out = ns.run(&[
        "worker",
        "--switch",
        &switch_addr,
        "--rank",
        "0",
        "--workers",
        "1",
        "--probe-timeout-ms",
        "5000",
    ]);
    answer.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    assert!(stdout.contains(r#""kind":"path_mtu""#), "{stdout}");
    for part in ["1024 elements", "4140-byte", "is 1500 bytes", "elems=364"] {
        assert!(stdout.contains(part), "{part} not in {stdout}");
    }
}

fn main() -> std::process::ExitCode {
    ina_testkit::Suite::new()
        .test(
            "switch_and_worker_refuse_packets_beyond_the_path_mtu",
            ina_testkit::NAMESPACE,
            switch_and_worker_refuse_packets_beyond_the_path_mtu,
        )
        .run()
}
