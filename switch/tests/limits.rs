//! What the switch says about jobs it cannot serve, and how it counts what it sends.
#![allow(clippy::unwrap_used)]

use ina_switch::{JobSpec, Switch, SwitchConfig};
use std::net::SocketAddr;

fn job(elems: u16, workers: Vec<SocketAddr>) -> JobSpec {
    JobSpec {
        job: 9,
        epoch: None,
        slot_base: 0,
        slot_count: 8,
        elems_per_packet: elems,
        workers,
        group: None,
        uplink: None,
    }
}

/// A job with more elements per packet than the switch's `max_elems` is refused with the
/// value it would need, whether it comes at start or through the control plane.
#[test]
fn a_job_beyond_max_elems_is_refused_naming_the_setting() {
    let worker: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut cfg = SwitchConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.jobs = vec![job(2048, vec![worker])];
    let e = Switch::bind(cfg).unwrap_err().to_string();
    assert!(e.contains("max_elems of 256"), "{e}");
    assert!(e.contains("--max-elems 2048 or more"), "{e}");

    let sw = Switch::bind(SwitchConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
    let e = sw
        .handle()
        .add_job(job(512, vec![worker]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("--max-elems 512 or more"), "{e}");
    sw.handle().add_job(job(256, vec![worker])).unwrap();
}

/// Sends a Data packet of `rank` for the first use of `slot` of `job` (epoch 5, 4 elements).
fn contribute(from: &std::net::UdpSocket, to: SocketAddr, job: u16, rank: u8, slot: u16) {
    let repr = ina_wire::AggRepr {
        kind: ina_wire::MessageType::Data,
        set: 0,
        gap: None,
        job,
        epoch: 5,
        rank,
        exponent: 0,
        slot,
        count: 4,
        seq: 8,
    };
    let mut buf = [0u8; ina_wire::HEADER_LEN + 16];
    repr.emit_into(&mut buf).unwrap();
    from.send_to(&buf, to).unwrap();
}

/// A finished use counts once in `results_multicast` however it leaves; the datagrams it
/// takes are counted apart: one per worker without a group, one for a group.
#[test]
fn results_are_counted_per_use_and_per_destination() {
    let sockets: Vec<std::net::UdpSocket> = (0..6)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    let group_port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let group = std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(239, 255, 75, 1), group_port);
    let mut cfg = SwitchConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.pipeline.max_elems = 4;
    for (id, base, workers, group) in [(1, 0, &addrs[..3], None), (2, 4, &addrs[3..], Some(group))]
    {
        cfg.jobs.push(JobSpec {
            job: id,
            epoch: Some(5),
            slot_base: base,
            slot_count: 4,
            elems_per_packet: 4,
            workers: workers.to_vec(),
            group,
            uplink: None,
        });
    }
    let sw = Switch::bind(cfg).unwrap();
    let to = sw.local_addr();
    let handle = sw.handle();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let thread = sw.spawn(stop.clone()).unwrap();
    for (r, s) in sockets.iter().enumerate() {
        let (job, slot) = if r < 3 { (1, 0) } else { (2, 4) };
        contribute(s, to, job, (r % 3) as u8, slot);
    }
    // The unicast job's result reaches each of its workers.
    for s in &sockets[..3] {
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 64];
        let n = s.recv(&mut buf).unwrap();
        assert_eq!(n, ina_wire::HEADER_LEN + 16);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let stats = loop {
        let stats = handle.stats().unwrap();
        if stats.total.results_to_group > 0 || std::time::Instant::now() > deadline {
            break stats;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let t = &stats.total;
    assert_eq!(t.pipeline.results_multicast, 2, "{t:?}");
    assert_eq!(t.results_to_workers, 3, "{t:?}");
    assert_eq!(t.results_to_group, 1, "{t:?}");
    // As `ina switch` prints them.
    let json = serde_json::to_value(&stats).unwrap();
    assert_eq!(json["total"]["results_to_workers"], 3, "{json}");
    assert_eq!(json["total"]["results_to_group"], 1, "{json}");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    thread.join().unwrap().unwrap();
}
