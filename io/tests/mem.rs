//! Tests of the in-memory network.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ina_io::{IoError, MemConfig, MemNetwork, Port, RecvBatch, SendBatch};

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn recv_all(
    port: &mut impl Port<Addr = SocketAddr>,
    batch: &mut RecvBatch,
) -> Vec<(SocketAddr, Vec<u8>, bool)> {
    let mut got = Vec::new();
    while port.recv_batch(batch, Some(Duration::ZERO)).unwrap() > 0 {
        got.extend(batch.iter().map(|d| (d.addr, d.data.to_vec(), d.truncated)));
    }
    got
}

#[test]
fn roundtrip_keeps_order_and_source() {
    let net = MemNetwork::new();
    let mut a = net.port(addr(1)).unwrap();
    let mut b = net.port(addr(2)).unwrap();
    let mut out = SendBatch::new();
    for i in 0..100u32 {
        out.push(b.local_addr(), &vec![i as u8; i as usize % 7]);
    }
    assert_eq!(a.send_batch(&out).unwrap(), 100);
    assert_eq!(b.queued(), 100);
    let mut batch = RecvBatch::new(30, 16);
    let got = recv_all(&mut b, &mut batch);
    let want: Vec<_> = (0..100u32)
        .map(|i| (a.local_addr(), vec![i as u8; i as usize % 7], false))
        .collect();
    assert_eq!(got, want);
    assert_eq!(net.stats().delivered, 100);
    let (ca, cb) = (a.counters(), b.counters());
    assert_eq!(ca.tx_datagrams, 100);
    assert_eq!(cb.rx_datagrams, 100);
    assert_eq!(ca.tx_bytes, cb.rx_bytes);
    assert_eq!(cb.rx_syscalls, 0);
}

#[test]
fn bounded_queue_drops_and_counts() {
    let net = MemNetwork::with_config(MemConfig {
        queue_datagrams: 4,
        queue_bytes: 100,
        ..MemConfig::default()
    });
    let mut a = net.port(addr(1)).unwrap();
    let mut b = net.port(addr(2)).unwrap();
    let mut out = SendBatch::new();
    for i in 0..10u8 {
        out.push(b.local_addr(), &[i]);
    }
    // Drops happen in the network: the sender sees every datagram accepted.
    assert_eq!(a.send_batch(&out).unwrap(), 10);
    assert_eq!(net.stats().dropped_full, 6);
    let mut batch = RecvBatch::new(16, 16);
    let got: Vec<u8> = recv_all(&mut b, &mut batch)
        .into_iter()
        .map(|g| g.1[0])
        .collect();
    assert_eq!(got, vec![0, 1, 2, 3], "tail drop keeps the oldest");

    // Byte bound.
    out.clear();
    for i in 0..3u8 {
        out.push(b.local_addr(), &[i; 40]);
    }
    a.send_batch(&out).unwrap();
    assert_eq!(net.stats().dropped_full, 7);
    assert_eq!(recv_all(&mut b, &mut batch).len(), 2);
}

#[test]
fn unknown_destination_is_counted() {
    let net = MemNetwork::new();
    let mut a = net.port(addr(1)).unwrap();
    let mut b = net.port(addr(2)).unwrap();
    let mut out = SendBatch::new();
    out.push(addr(99), b"nobody");
    out.push(b.local_addr(), b"somebody");
    out.push(addr(98), b"nobody either");
    assert_eq!(a.send_batch(&out).unwrap(), 3);
    let s = net.stats();
    assert_eq!((s.dropped_unknown, s.delivered), (2, 1));
    let mut batch = RecvBatch::new(4, 64);
    assert_eq!(recv_all(&mut b, &mut batch).len(), 1);

    // A dropped port's address becomes unknown; the address can be reused.
    drop(b);
    a.send_batch(&out).unwrap();
    assert_eq!(net.stats().dropped_unknown, 5);
    let mut b2 = net.port(addr(2)).unwrap();
    a.send_batch(&out).unwrap();
    assert_eq!(recv_all(&mut b2, &mut batch).len(), 1);
}

#[test]
fn addresses_are_exclusive_and_port_zero_picks_one() {
    let net = MemNetwork::new();
    let _a = net.port(addr(1)).unwrap();
    assert!(matches!(net.port(addr(1)), Err(IoError::AddrInUse(a)) if a == addr(1)));
    let e1 = net.port(addr(0)).unwrap();
    let e2 = net.port(addr(0)).unwrap();
    assert_ne!(e1.local_addr(), e2.local_addr());
    assert_ne!(e1.local_addr().port(), 0);
    assert_eq!(e1.local_addr().ip(), addr(0).ip());
}

#[test]
fn truncation_and_oversize() {
    let net = MemNetwork::with_config(MemConfig {
        max_datagram: 100,
        ..MemConfig::default()
    });
    let mut a = net.port(addr(1)).unwrap();
    let mut b = net.port(addr(2)).unwrap();
    let mut out = SendBatch::new();
    out.push(b.local_addr(), &[1; 60]);
    out.push(b.local_addr(), &[2; 101]); // refused: over max_datagram
    out.push(b.local_addr(), &[3; 10]);
    assert_eq!(a.send_batch(&out).unwrap(), 2);
    assert_eq!(a.counters().tx_errors, 1);
    let mut batch = RecvBatch::new(4, 32);
    let got = recv_all(&mut b, &mut batch);
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].1.len(), got[0].2), (32, true));
    assert_eq!((got[1].1.clone(), got[1].2), (vec![3; 10], false));
    assert_eq!(b.counters().rx_truncated, 1);

    out.clear();
    out.push(b.local_addr(), &[0; 500]);
    assert!(matches!(
        a.send_batch(&out),
        Err(IoError::Send { sent: 0, .. })
    ));
}

#[test]
fn receive_timeouts() {
    let net = MemNetwork::new();
    let mut a = net.port(addr(1)).unwrap();
    let mut batch = RecvBatch::new(4, 64);
    let t = Instant::now();
    assert_eq!(a.recv_batch(&mut batch, Some(Duration::ZERO)).unwrap(), 0);
    assert_eq!(
        a.recv_batch(&mut batch, Some(Duration::from_millis(100)))
            .unwrap(),
        0
    );
    let e = t.elapsed();
    assert!(
        e >= Duration::from_millis(95) && e < Duration::from_secs(3),
        "{e:?}"
    );

    // Blocking receives wake up when data arrives.
    let mut b = net.port(addr(2)).unwrap();
    let dest = a.local_addr();
    let sender = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        let mut out = SendBatch::new();
        out.push(dest, b"late");
        b.send_batch(&out).unwrap();
        thread::sleep(Duration::from_millis(50));
        b.send_batch(&out).unwrap();
    });
    assert_eq!(a.recv_batch(&mut batch, None).unwrap(), 1);
    assert_eq!(a.recv_batch(&mut batch, Some(Duration::MAX)).unwrap(), 1);
    assert_eq!(batch.get(0).unwrap().data, b"late");
    sender.join().unwrap();
}

#[test]
fn multithreaded_senders_one_receiver() {
    let net = MemNetwork::with_config(MemConfig {
        queue_datagrams: 1 << 20,
        queue_bytes: 1 << 26,
        ..MemConfig::default()
    });
    let mut rx = net.port(addr(100)).unwrap();
    const SENDERS: u16 = 4;
    const PER: u32 = 5000;
    let net = Arc::new(net);
    let dest = rx.local_addr();
    let handles: Vec<_> = (0..SENDERS)
        .map(|s| {
            let net = Arc::clone(&net);
            thread::spawn(move || {
                let mut tx = net.port(addr(1 + s)).unwrap();
                let mut out = SendBatch::new();
                for chunk in 0..PER / 50 {
                    out.clear();
                    for i in 0..50 {
                        out.push(dest, &(chunk * 50 + i).to_be_bytes());
                    }
                    assert_eq!(tx.send_batch(&out).unwrap(), 50);
                }
                // Keep the port alive until the receiver is done counting.
                tx
            })
        })
        .collect();
    let mut batch = RecvBatch::new(64, 16);
    let mut last = vec![None::<u32>; SENDERS as usize + 1];
    let mut total = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while total < SENDERS as usize * PER as usize && Instant::now() < deadline {
        rx.recv_batch(&mut batch, Some(Duration::from_millis(100)))
            .unwrap();
        for d in &batch {
            let s = d.addr.port() as usize;
            let seq = u32::from_be_bytes(d.data.try_into().unwrap());
            // Per-sender FIFO order.
            assert_eq!(seq, last[s].map_or(0, |l| l + 1));
            last[s] = Some(seq);
            total += 1;
        }
    }
    for h in handles {
        drop(h.join().unwrap());
    }
    assert_eq!(total, SENDERS as usize * PER as usize);
    assert_eq!(net.stats().dropped_full, 0);
}

#[test]
fn byte_ring_wraps_around() {
    let net = MemNetwork::with_config(MemConfig {
        queue_bytes: 1000,
        ..MemConfig::default()
    });
    let mut a = net.port(addr(1)).unwrap();
    let mut b = net.port(addr(2)).unwrap();
    let mut out = SendBatch::new();
    let mut batch = RecvBatch::new(8, 512);
    for round in 0..500usize {
        out.clear();
        let lens = [round % 97, (round * 7) % 301, 3];
        for (k, &len) in lens.iter().enumerate() {
            out.push(b.local_addr(), &vec![(round + k) as u8; len]);
        }
        a.send_batch(&out).unwrap();
        let got = recv_all(&mut b, &mut batch);
        let want: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(k, &len)| (a.local_addr(), vec![(round + k) as u8; len], false))
            .collect();
        assert_eq!(got, want, "round {round}");
    }
}

#[test]
fn works_behind_dyn_port() {
    let net = MemNetwork::new();
    let mut ports: Vec<Box<dyn Port<Addr = SocketAddr>>> = vec![
        Box::new(net.port(addr(1)).unwrap()),
        Box::new(net.port(addr(2)).unwrap()),
    ];
    let mut out = SendBatch::new();
    out.push(ports[1].local_addr(), b"x");
    ports[0].send_batch(&out).unwrap();
    let mut batch = RecvBatch::new(2, 8);
    assert_eq!(
        ports[1]
            .recv_batch(&mut batch, Some(Duration::from_secs(1)))
            .unwrap(),
        1
    );
}
