//! A datagram that a firewall of the sending host drops (netfilter answers the send with
//! EPERM) is a loss, as on a wire: the batch still counts as sent and the error is counted, so
//! a worker behind such a firewall goes on and the protocol repairs the loss. Needs root and
//! nft (skipped with the reason otherwise; required under INA_REQUIRE_PRIVILEGED=1).
#![allow(clippy::unwrap_used)]

use ina_io::{Port, SendBatch, UdpConfig, UdpPort};
use std::process::Command;

fn ok(cmd: &mut Command) -> bool {
    cmd.status().is_ok_and(|s| s.success())
}

fn datagrams_a_firewall_drops_on_the_way_out_are_losses_not_errors() {
    let ns = "inaiofw";
    let _ = ok(Command::new("ip").args(["netns", "del", ns]));
    if !ok(Command::new("ip").args(["netns", "add", ns])) {
        panic!("cannot create a network namespace");
    }
    let nft = |args: &[&str]| {
        ok(Command::new("ip")
            .args(["netns", "exec", ns, "nft"])
            .args(args))
    };
    let set_up = ok(Command::new("ip").args(["-n", ns, "link", "set", "lo", "up"]))
        && nft(&["add", "table", "inet", "fw"])
        && nft(&[
            "add",
            "chain",
            "inet",
            "fw",
            "out",
            "{ type filter hook output priority 0; }",
        ])
        && nft(&[
            "add", "rule", "inet", "fw", "out", "udp", "dport", "9", "drop",
        ]);
    let result = set_up.then(|| {
        std::thread::spawn(move || {
            let file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
            use std::os::fd::AsRawFd;
            // SAFETY: setns on this thread only, with a namespace file held open.
            #[allow(unsafe_code)]
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0);
            let mut port =
                UdpPort::bind_with("127.0.0.1:0".parse().unwrap(), &UdpConfig::default()).unwrap();
            let mut out = SendBatch::new();
            for i in 0..5u8 {
                out.push("127.0.0.1:9".parse().unwrap(), &[i; 100]);
            }
            let sent = port.send_batch(&out);
            (sent.map_err(|e| e.to_string()), port.counters().tx_errors)
        })
        .join()
        .unwrap()
    });
    let _ = ok(Command::new("ip").args(["netns", "del", ns]));
    let Some((sent, errors)) = result else {
        panic!("cannot load an nftables rule");
    };
    assert_eq!(sent, Ok(5), "the batch failed");
    assert!(errors >= 1, "no send error was counted");
}

fn main() -> std::process::ExitCode {
    ina_testkit::Suite::new()
        .test(
            "datagrams_a_firewall_drops_on_the_way_out_are_losses_not_errors",
            &[
                ina_testkit::Need::Root,
                ina_testkit::Need::NetNamespaces,
                ina_testkit::IP,
                ina_testkit::NFT,
            ],
            datagrams_a_firewall_drops_on_the_way_out_are_losses_not_errors,
        )
        .run()
}
