//! Datagrams/s through a loopback UDP pair: batched `UdpPort` (with and
//! without GSO/GRO) against one datagram per system call with
//! `std::net::UdpSocket`, in the same run.
//!
//! Each iteration sends `BATCH` datagrams from one socket and receives them
//! on the other (single thread), so the figure covers both the send and the
//! receive path.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ina_io::{Port, RecvBatch, SendBatch, UdpConfig, UdpPort};

const BATCH: usize = 64;
const SIZES: [usize; 2] = [64, 1024];

fn lo() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn std_pair() -> (UdpSocket, UdpSocket) {
    let tx = UdpSocket::bind(lo()).unwrap();
    let rx = UdpSocket::bind(lo()).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    // Same buffer sizes as the UdpPort pairs.
    let rx_ref = socket2::SockRef::from(&rx);
    rx_ref.set_recv_buffer_size(4 << 20).unwrap();
    (tx, rx)
}

fn port_pair(cfg: &UdpConfig) -> (UdpPort, UdpPort) {
    (cfg.bind(lo()).unwrap(), cfg.bind(lo()).unwrap())
}

fn udp(c: &mut Criterion) {
    let mut g = c.benchmark_group("udp_loopback");
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(2));
    g.sample_size(20);
    for size in SIZES {
        g.throughput(Throughput::Elements(BATCH as u64));
        let payload = vec![0xA5u8; size];

        let (tx, rx) = std_pair();
        let dest = rx.local_addr().unwrap();
        let mut buf = vec![0u8; 65_536];
        g.bench_with_input(
            BenchmarkId::new("std_1_per_syscall", size),
            &size,
            |b, _| {
                b.iter(|| {
                    for _ in 0..BATCH {
                        tx.send_to(&payload, dest).unwrap();
                    }
                    for _ in 0..BATCH {
                        black_box(rx.recv_from(&mut buf).unwrap());
                    }
                })
            },
        );

        for (name, cfg) in [
            ("udpport_mmsg", UdpConfig::default().gso(false).gro(false)),
            ("udpport_mmsg_gso_gro", UdpConfig::default()),
        ] {
            let (mut tx, mut rx) = port_pair(&cfg);
            let mut out = SendBatch::with_capacity(BATCH, BATCH * size);
            for _ in 0..BATCH {
                out.push(rx.local_addr(), &payload);
            }
            let mut batch = RecvBatch::new(BATCH, 2048);
            g.bench_with_input(BenchmarkId::new(name, size), &size, |b, _| {
                b.iter(|| {
                    assert_eq!(tx.send_batch(&out).unwrap(), BATCH);
                    let mut got = 0;
                    while got < BATCH {
                        let n = rx
                            .recv_batch(&mut batch, Some(Duration::from_secs(1)))
                            .unwrap();
                        assert!(n > 0, "datagrams lost on loopback");
                        got += n;
                    }
                    black_box(&batch);
                })
            });
            let (t, r) = (tx.counters(), rx.counters());
            eprintln!(
                "{name}/{size}: features {}, {:.1} datagrams per send syscall, {:.1} per receive syscall",
                tx.features(),
                t.tx_datagrams_per_syscall(),
                r.rx_datagrams_per_syscall()
            );
        }
    }
    g.finish();
}

criterion_group!(benches, udp);
criterion_main!(benches);
