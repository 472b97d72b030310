//! DPDK ports on virtual devices (feature `dpdk`; needs DPDK installed, and root). One EAL per
//! process, so this file holds one test: a memif pair in one process (server and client ends
//! of the same socket), over which two UDP ports resolve each other by ARP and exchange
//! batches of datagrams in both directions, and the errors of bad arguments.
#![allow(clippy::unwrap_used)]

use ina_io::dpdk::{Device, DeviceConfig, DpdkError, DpdkUdpConfig, DpdkUdpPort, Eal};
use ina_io::{Port, RecvBatch, SendBatch};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

fn udp_ports_over_a_memif_pair_resolve_each_other_and_exchange_batches() {
    let sock = format!("/tmp/ina-dpdk-test-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let args: Vec<String> = [
        "--no-huge",
        "--no-pci",
        "--no-shconf",
        &format!("--file-prefix=ina-test-{}", std::process::id()),
        "-m",
        "256",
        "-l",
        "0",
        "--log-level=*:warning",
        &format!("--vdev=net_memif0,role=server,socket={sock},socket-abstract=no"),
        &format!("--vdev=net_memif1,role=client,socket={sock},socket-abstract=no"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // (Bad arguments are tested through `ina worker --port dpdk`: after a failed attempt the
    // EAL cannot be initialised again in the same process.)
    let eal = Eal::init(&args).unwrap();
    assert!(matches!(Eal::init(&args), Err(DpdkError::EalTwice)));
    assert!(eal.devices() >= 2, "{} devices", eal.devices());
    assert!(matches!(
        Device::open(&eal, "net_nothing9", DeviceConfig::default()),
        Err(DpdkError::NoDevice { .. })
    ));
    let a_dev = Device::open(&eal, "net_memif0", DeviceConfig::default()).unwrap();
    let b_dev = Device::open(&eal, "net_memif1", DeviceConfig::default()).unwrap();
    let a_addr = SocketAddrV4::new(Ipv4Addr::new(198, 18, 5, 1), 9000);
    let b_addr = SocketAddrV4::new(Ipv4Addr::new(198, 18, 5, 2), 9001);
    let mut a = DpdkUdpPort::new(a_dev, &DpdkUdpConfig::new(a_addr));
    let mut b = DpdkUdpPort::new(b_dev, &DpdkUdpConfig::new(b_addr));
    // The memif link comes up once the client connects: resolve with both ends polling.
    let b_mac = b.devices()[0].mac();
    let start = Instant::now();
    let resolved = loop {
        let mut batch = RecvBatch::new(8, 2048);
        let _ = b.recv_batch(&mut batch, Some(Duration::ZERO));
        if let Ok(mac) = a.resolve(*b_addr.ip(), Duration::from_millis(50)) {
            break mac;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no ARP answer over memif"
        );
    };
    assert_eq!(resolved, b_mac);
    assert!(b.stats().arp_replies_sent >= 1);
    // 1000 datagrams a → b in batches of 50, every byte checked.
    let mut recv = RecvBatch::new(64, 2048);
    let mut got = Vec::new();
    for round in 0..20u32 {
        let mut out = SendBatch::new();
        for i in 0..50u32 {
            let n = round * 50 + i;
            let len = 16 + (n as usize * 7) % 1000;
            let data: Vec<u8> = (0..len).map(|k| (k as u32 ^ n) as u8).collect();
            out.push(SocketAddr::V4(b_addr), &data);
        }
        assert_eq!(a.send_batch(&out).unwrap(), 50);
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < ((round + 1) * 50) as usize {
            assert!(
                Instant::now() < deadline,
                "only {} datagrams arrived",
                got.len()
            );
            b.recv_batch(&mut recv, Some(Duration::from_millis(10)))
                .unwrap();
            for d in recv.iter() {
                assert_eq!(d.addr, SocketAddr::V4(a_addr));
                got.push(d.data.to_vec());
            }
        }
    }
    for (n, data) in got.iter().enumerate() {
        let len = 16 + (n * 7) % 1000;
        let want: Vec<u8> = (0..len).map(|k| (k as u32 ^ n as u32) as u8).collect();
        assert!(*data == want, "datagram {n} differs");
    }
    // b learns no neighbour from datagrams (their source MAC is not evidence of anything):
    // its table is as empty after 1000 of them as before, and its first answer asks (ARP).
    assert_eq!(b.neighbour_count(), 0);
    let mut back = SendBatch::new();
    back.push(SocketAddr::V4(a_addr), b"reply");
    assert!(b.send_batch(&back).is_err());
    assert_eq!(b.stats().unresolved, 1);
    assert_eq!(b.stats().arp_requests_sent, 1);
    let resolved = loop {
        let _ = a.recv_batch(&mut recv, Some(Duration::ZERO));
        if let Ok(mac) = b.resolve(*a_addr.ip(), Duration::from_millis(50)) {
            break mac;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "a never answered b's ARP"
        );
    };
    assert_eq!(resolved, a.devices()[0].mac());
    assert_eq!((a.neighbour_count(), b.neighbour_count()), (1, 1));
    assert_eq!(b.send_batch(&back).unwrap(), 1);
    assert_eq!(
        a.recv_batch(&mut recv, Some(Duration::from_secs(5)))
            .unwrap(),
        1
    );
    assert_eq!(recv.get(0).unwrap().data, b"reply");
    assert_eq!(a.counters().tx_datagrams, 1000);
    assert_eq!(b.counters().rx_datagrams, 1000);
    // A destination nobody answers for: not sent, counted, an ARP request out.
    let mut lost = SendBatch::new();
    lost.push(SocketAddr::from(([198, 18, 5, 99], 1)), b"x");
    assert!(a.send_batch(&lost).is_err());
    assert_eq!(a.stats().unresolved, 1);
    // The ports stay open until the process ends: DPDK 22.11's memif driver handles a peer's
    // disconnection in the EAL's interrupt thread, which then races with the closing of the
    // other end (and its pool) in this one. A process has one end in a deployment.
    std::mem::forget(a);
    std::mem::forget(b);
    let _ = std::fs::remove_file(&sock);
}

fn main() -> std::process::ExitCode {
    let code = ina_testkit::Suite::new()
        .test(
            "udp_ports_over_a_memif_pair_resolve_each_other_and_exchange_batches",
            &[ina_testkit::Need::Root],
            udp_ports_over_a_memif_pair_resolve_each_other_and_exchange_batches,
        )
        .run();
    // The EAL's interrupt thread runs until the process ends, and the libraries' destructors
    // would run beside it at exit: the process leaves without running them.
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: ends the process; nothing of it is used afterwards.
    unsafe { libc::_exit(i32::from(code != std::process::ExitCode::SUCCESS)) }
}
