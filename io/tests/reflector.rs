//! The reflector echoes everything.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ina_io::reflector::{Reflector, ReflectorConfig};
use ina_io::{MemNetwork, Port, RecvBatch, SendBatch, UdpPort};

fn lo() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn payload(seq: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|i| (seq as usize + i) as u8).collect();
    if len >= 4 {
        v[..4].copy_from_slice(&seq.to_be_bytes());
    }
    v
}

/// Sends `sizes` to `dest` from `client` and returns what comes back.
fn exchange<P: Port<Addr = SocketAddr>>(
    client: &mut P,
    dest: SocketAddr,
    sizes: &[usize],
    seq0: u32,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut out = SendBatch::new();
    let mut want = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let p = payload(seq0 + i as u32, len);
        out.push(dest, &p);
        want.push(p);
    }
    assert_eq!(client.send_batch(&out).unwrap(), sizes.len());
    let mut batch = RecvBatch::new(64, 2048);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < sizes.len() && Instant::now() < deadline {
        client
            .recv_batch(&mut batch, Some(Duration::from_millis(100)))
            .unwrap();
        for d in &batch {
            assert_eq!(d.addr, dest, "echo comes from the reflector");
            assert!(!d.truncated);
            got.push(d.data.to_vec());
        }
    }
    got.sort();
    want.sort();
    (got, want)
}

#[test]
fn udp_reflector_echoes_everything() {
    let reflector = Reflector::bind(lo()).unwrap();
    let dest = reflector.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let handle = reflector.spawn(Arc::clone(&stop)).unwrap();

    let mut client = UdpPort::bind(lo()).unwrap();
    let mut total = 0u64;
    let mut bytes = 0u64;
    let mut seq = 0;
    let cases: Vec<Vec<usize>> = vec![
        vec![10],
        vec![0, 0, 5],
        vec![1000; 64],
        (0..150).map(|i| i * 13 % 1500).collect(),
        vec![1472; 100],
    ];
    for sizes in &cases {
        let (got, want) = exchange(&mut client, dest, sizes, seq);
        assert_eq!(got, want, "sizes {sizes:?}");
        seq += sizes.len() as u32;
        total += sizes.len() as u64;
        bytes += sizes.iter().sum::<usize>() as u64;
    }

    let t = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let report = handle.join().unwrap().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "stops promptly");
    assert_eq!(report.echoed, total);
    assert_eq!(report.echoed_bytes, bytes);
    assert_eq!(report.dropped_truncated, 0);
    assert!(report.batches >= cases.len() as u64);
    assert_eq!(report.port.rx_datagrams, total);
    assert_eq!(report.port.tx_datagrams, total);
}

#[test]
fn reflector_serves_several_clients() {
    let mut reflector = Reflector::bind(lo()).unwrap();
    let dest = reflector.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let clients = std::thread::spawn(move || {
        let mut a = UdpPort::bind(lo()).unwrap();
        let mut b = UdpPort::bind(lo()).unwrap();
        let (ga, wa) = exchange(&mut a, dest, &[100; 30], 0);
        let (gb, wb) = exchange(&mut b, dest, &[200; 30], 1000);
        stop2.store(true, Ordering::Relaxed);
        assert_eq!(ga, wa);
        assert_eq!(gb, wb);
    });
    let report = reflector.run(&stop).unwrap();
    clients.join().unwrap();
    assert_eq!(report.echoed, 60);
}

#[test]
fn oversize_datagrams_are_not_echoed_corrupted() {
    let net = MemNetwork::new();
    let port = net.port("127.0.0.1:7".parse().unwrap()).unwrap();
    let mut reflector = Reflector::with_config(
        port,
        ReflectorConfig {
            slot_size: 100,
            ..ReflectorConfig::default()
        },
    );
    let dest = reflector.local_addr();
    let mut client = net.port("127.0.0.1:8".parse().unwrap()).unwrap();
    let mut out = SendBatch::new();
    out.push(dest, &[1; 100]);
    out.push(dest, &[2; 101]);
    out.push(dest, &[3; 5]);
    client.send_batch(&out).unwrap();

    let mut rounds = 0;
    let report = reflector
        .run_until(|| {
            rounds += 1;
            rounds > 3
        })
        .unwrap();
    assert_eq!(report.echoed, 2);
    assert_eq!(report.dropped_truncated, 1);
    let mut batch = RecvBatch::new(8, 200);
    assert_eq!(
        client.recv_batch(&mut batch, Some(Duration::ZERO)).unwrap(),
        2
    );
    assert_eq!(batch.get(0).unwrap().data, &[1; 100][..]);
    assert_eq!(batch.get(1).unwrap().data, &[3; 5][..]);
}

#[test]
fn mem_reflector_echoes_everything() {
    let net = MemNetwork::new();
    let reflector = Reflector::new(net.port("127.0.0.1:9".parse().unwrap()).unwrap());
    let dest = reflector.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let handle = reflector.spawn(Arc::clone(&stop)).unwrap();
    let mut client = net.port("127.0.0.1:10".parse().unwrap()).unwrap();
    let sizes: Vec<usize> = (0..500).map(|i| i % 300).collect();
    let (got, want) = exchange(&mut client, dest, &sizes, 0);
    assert_eq!(got, want);
    stop.store(true, Ordering::Relaxed);
    let report = handle.join().unwrap().unwrap();
    assert_eq!(report.echoed, 500);
    assert_eq!(net.stats().dropped_unknown + net.stats().dropped_full, 0);
}
