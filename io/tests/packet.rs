//! Raw Ethernet ports on a veth pair in a network namespace of the test's own: frames sent on
//! one end arrive whole and in order on the other, a port does not see its own frames, and
//! the counters add up. Needs root; skips with a reason otherwise (fails instead when
//! INA_REQUIRE_PRIVILEGED=1).
#![allow(clippy::unwrap_used)]

use ina_io::packet::{RawConfig, RawPort};
use std::process::Command;
use std::time::{Duration, Instant};

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// A network namespace with a veth pair `rawa`/`rawb`, both up; removed on drop.
struct Netns(String);

impl Netns {
    fn new(name: &str) -> Option<Netns> {
        let _ = ip(&["netns", "del", name]);
        if !ip(&["netns", "add", name]) {
            return None;
        }
        let ns = Netns(name.to_string());
        let ok = ip(&[
            "-n", name, "link", "add", "rawa", "type", "veth", "peer", "name", "rawb",
        ]) && ip(&["-n", name, "link", "set", "rawa", "up"])
            && ip(&["-n", name, "link", "set", "rawb", "up"]);
        ok.then_some(ns)
    }

    /// Runs `f` on a thread inside the namespace.
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{}", self.0);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap();
            use std::os::fd::AsRawFd;
            // SAFETY: setns on this thread only, with a namespace file we hold open.
            #[allow(unsafe_code)]
            let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}

fn frame(i: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xbb]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xaa]);
    // A local experimental EtherType, so that the kernel does not answer or forward it.
    f[12..14].copy_from_slice(&[0x88, 0xb5]);
    f[14..18].copy_from_slice(&i.to_be_bytes());
    for (k, b) in f[18..].iter_mut().enumerate() {
        *b = (k as u32 ^ i) as u8;
    }
    f
}

fn frames_cross_a_veth_pair_whole_and_in_order() {
    let Some(ns) = Netns::new("inaio-raw") else {
        panic!("cannot create a network namespace with a veth pair (ip netns)");
    };
    let (got, a_counters, b_counters, echo) = ns.run(|| {
        let mut a = RawPort::open("rawa", RawConfig::default()).unwrap();
        let mut b = RawPort::open("rawb", RawConfig::for_mtu(9000)).unwrap();
        assert!(matches!(
            RawPort::open("nonexistent0", RawConfig::default()),
            Err(ina_io::packet::RawError::NoInterface(_))
        ));
        // Let the kernel's own traffic on fresh links (IPv6 router solicitations) pass.
        std::thread::sleep(Duration::from_millis(50));
        a.recv(usize::MAX, |_, _| {});
        b.recv(usize::MAX, |_, _| {});
        let sent: Vec<Vec<u8>> = (0..500u32)
            .map(|i| frame(i, 60 + (i as usize * 7) % 1400))
            .collect();
        for chunk in sent.chunks(64) {
            for f in chunk {
                assert!(a.send(f));
            }
            a.flush().unwrap();
        }
        let mut got: Vec<Vec<u8>> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < sent.len() && Instant::now() < deadline {
            RawPort::wait(std::slice::from_ref(&b), Some(Duration::from_millis(100))).unwrap();
            b.recv(usize::MAX, |f, _| {
                if f.get(12..14) == Some(&[0x88, 0xb5]) {
                    got.push(f.to_vec());
                }
            });
        }
        // `a` must not see its own frames.
        let mut echo = 0;
        a.recv(usize::MAX, |f, _| {
            if f.get(12..14) == Some(&[0x88, 0xb5]) {
                echo += 1;
            }
        });
        assert_eq!(got, sent);
        // A frame larger than a slot is refused, not cut.
        assert!(!a.send(&vec![0u8; a.config().frame_size]));
        (got.len(), a.counters(), b.counters(), echo)
    });
    assert_eq!(got, 500);
    assert_eq!(echo, 0, "a port received its own frames");
    assert_eq!(a_counters.tx_frames, 500);
    assert_eq!(a_counters.tx_dropped, 1);
    assert!(a_counters.tx_flushes >= 8);
    assert!(b_counters.rx_frames >= 500);
    assert_eq!(b_counters.rx_truncated, 0);
}

fn main() -> std::process::ExitCode {
    ina_testkit::Suite::new()
        .test(
            "frames_cross_a_veth_pair_whole_and_in_order",
            ina_testkit::NAMESPACE,
            frames_cross_a_veth_pair_whole_and_in_order,
        )
        .run()
}
