//! Loopback tests of `UdpPort`.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use ina_io::{IoError, Port, RecvBatch, SendBatch, UdpConfig, UdpPort};

const LOOPBACK: &str = "127.0.0.1:0";

fn lo() -> SocketAddr {
    LOOPBACK.parse().unwrap()
}

/// A recognisable payload: unique per `seq` as long as `len >= 4`.
fn payload(seq: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|i| (seq as usize * 31 + i * 7) as u8)
        .collect();
    if len >= 4 {
        v[..4].copy_from_slice(&seq.to_be_bytes());
    }
    v
}

type Got = Vec<(SocketAddr, Vec<u8>, bool)>;

/// Receives until `n` datagrams arrived or 5 s passed.
fn recv_n(port: &mut UdpPort, batch: &mut RecvBatch, n: usize) -> Got {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.len() < n && Instant::now() < deadline {
        let k = port
            .recv_batch(batch, Some(Duration::from_millis(200)))
            .unwrap();
        assert_eq!(k, batch.len());
        got.extend(batch.iter().map(|d| (d.addr, d.data.to_vec(), d.truncated)));
    }
    got
}

fn sorted(mut v: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    v.sort();
    v
}

fn configs() -> Vec<(&'static str, UdpConfig)> {
    vec![
        ("default", UdpConfig::default()),
        ("off", UdpConfig::default().gso(false).gro(false)),
        ("gso-only", UdpConfig::default().gro(false)),
        ("gro-only", UdpConfig::default().gso(false)),
        (
            "tiny-batches",
            UdpConfig::default().max_batch(4).gro_buffers(3),
        ),
    ]
}

/// Sends `items` (destination, bytes) from `tx` and checks that `rx`
/// receives exactly them (as a multiset), from `tx`'s address, untruncated.
fn roundtrip(
    tx: &mut UdpPort,
    rx: &mut UdpPort,
    batch: &mut RecvBatch,
    sizes: &[usize],
    seq0: u32,
) {
    let mut out = SendBatch::new();
    let mut want = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let p = payload(seq0 + i as u32, len);
        out.push(rx.local_addr(), &p);
        want.push(p);
    }
    assert_eq!(tx.send_batch(&out).unwrap(), sizes.len());
    let got = recv_n(rx, batch, sizes.len());
    assert_eq!(got.len(), sizes.len(), "sizes {sizes:?}");
    for (src, _, truncated) in &got {
        assert_eq!(*src, tx.local_addr());
        assert!(!truncated);
    }
    let got: Vec<Vec<u8>> = got.into_iter().map(|g| g.1).collect();
    assert_eq!(sorted(got), sorted(want));
}

#[test]
fn features_are_probed_and_reported() {
    let p = UdpPort::bind(lo()).unwrap();
    let f = p.features();
    eprintln!("UDP features on this machine: {f} ({f:?})");
    #[cfg(target_os = "linux")]
    assert!(f.mmsg);
    assert!(p.recv_buffer_size().unwrap() > 0);
    let off = UdpConfig::default()
        .gso(false)
        .gro(false)
        .bind(lo())
        .unwrap();
    assert!(!off.features().gso && !off.features().gro);
    assert_eq!(
        off.features().to_string(),
        if cfg!(target_os = "linux") {
            "mmsg"
        } else {
            "none"
        }
    );
    // Out-of-range options are clamped, not rejected.
    let c = UdpConfig::default()
        .max_batch(0)
        .gro_buffers(1_000_000)
        .bind(lo())
        .unwrap();
    assert_eq!(c.config().max_batch, 1);
    assert_eq!(c.config().gro_buffers, 1024);
}

#[test]
fn roundtrip_batch_sizes() {
    for (name, cfg) in configs() {
        let mut tx = cfg.bind(lo()).unwrap();
        let mut rx = cfg.bind(lo()).unwrap();
        let mut batch = RecvBatch::new(64, 2048);
        let mut seq = 0;
        for n in [1usize, 2, 7, 63, 64, 65, 130, 200] {
            // Equal sizes (GSO-able) and varying sizes.
            let equal = vec![100; n];
            roundtrip(&mut tx, &mut rx, &mut batch, &equal, seq);
            seq += n as u32;
            let varying: Vec<usize> = (0..n).map(|i| 60 + i % 50).collect();
            roundtrip(&mut tx, &mut rx, &mut batch, &varying, seq);
            seq += n as u32;
        }
        let c = tx.counters();
        let expected: u64 = [1u64, 2, 7, 63, 64, 65, 130, 200].iter().sum::<u64>() * 2;
        assert_eq!(c.tx_datagrams, expected, "{name}");
        assert_eq!(rx.counters().rx_datagrams, expected, "{name}");
        assert_eq!(c.tx_errors, 0);
        // Batching: far fewer send calls than datagrams.
        #[cfg(target_os = "linux")]
        assert!(c.tx_syscalls * 3 < c.tx_datagrams, "{name}: {c:?}");
    }
}

#[test]
fn more_datagrams_than_one_syscall_and_one_recv_batch() {
    let cfg = UdpConfig::default().max_batch(8).gso(false).gro(false);
    let mut tx = cfg.bind(lo()).unwrap();
    let mut rx = cfg.bind(lo()).unwrap();
    let mut batch = RecvBatch::new(20, 512);
    let sizes: Vec<usize> = (0..100).map(|i| 10 + i).collect();
    roundtrip(&mut tx, &mut rx, &mut batch, &sizes, 0);
    let (t, r) = (tx.counters(), rx.counters());
    #[cfg(target_os = "linux")]
    {
        // 100 datagrams, 8 per sendmmsg.
        assert!(t.tx_syscalls >= 13, "{t:?}");
        assert!(r.rx_syscalls >= 13, "{r:?}");
    }
    assert_eq!(t.tx_bytes, sizes.iter().sum::<usize>() as u64);
    assert_eq!(r.rx_bytes, t.tx_bytes);
}

#[test]
fn mixed_sizes_and_empty_datagrams() {
    let sizes = [
        0, 1, 0, 1472, 9000, 3, 0, 0, 500, 500, 500, 200, 500, 65_507, 2, 2, 2, 0, 1, 1400, 1400,
    ];
    for (name, cfg) in configs() {
        let mut tx = cfg.bind(lo()).unwrap();
        let mut rx = cfg.bind(lo()).unwrap();
        let mut batch = RecvBatch::new(8, 65_536);
        roundtrip(&mut tx, &mut rx, &mut batch, &sizes, 1000);
        assert_eq!(rx.counters().rx_datagrams, sizes.len() as u64, "{name}");
        // A batch of only empty datagrams.
        roundtrip(&mut tx, &mut rx, &mut batch, &[0; 10], 0);
    }
}

#[test]
fn gso_and_gro_paths() {
    let mut tx = UdpPort::bind(lo()).unwrap();
    let mut rx = UdpPort::bind(lo()).unwrap();
    let mut batch = RecvBatch::new(128, 2048);
    let mut out = SendBatch::new();
    let mut want = Vec::new();
    for i in 0..64 {
        let p = payload(i, 1000);
        out.push(rx.local_addr(), &p);
        want.push(p);
    }
    assert_eq!(tx.send_batch(&out).unwrap(), 64);
    let got = recv_n(&mut rx, &mut batch, 64);
    let got: Vec<Vec<u8>> = got.into_iter().map(|g| g.1).collect();
    let (t, r) = (tx.counters(), rx.counters());
    eprintln!("gso/gro: tx {t:?}\nrx {r:?}");
    if tx.features().gso {
        assert_eq!(t.gso_batches, 1);
        assert_eq!(t.gso_segments, 64);
        assert_eq!(t.tx_syscalls, 1);
    }
    if tx.features().gso && rx.features().gro {
        // Loopback hands the GSO buffer intact to a GRO socket: one
        // coalesced buffer, split back in order.
        assert_eq!(r.gro_batches, 1, "{r:?}");
        assert_eq!(r.gro_segments, 64);
        assert_eq!(got, want);
    } else {
        assert_eq!(sorted(got), sorted(want));
    }
    assert_eq!(r.rx_datagrams, 64);
}

#[test]
fn gro_buffer_split_across_small_recv_batches() {
    let mut tx = UdpPort::bind(lo()).unwrap();
    let mut rx = UdpPort::bind(lo()).unwrap();
    let mut batch = RecvBatch::new(10, 2048);
    let mut out = SendBatch::new();
    let mut want = Vec::new();
    // Two GSO runs (the second with a short last segment), then singles.
    for i in 0..40 {
        let p = payload(i, 700);
        out.push(rx.local_addr(), &p);
        want.push(p);
    }
    for i in 40..63 {
        let p = payload(i, if i == 62 { 33 } else { 300 });
        out.push(rx.local_addr(), &p);
        want.push(p);
    }
    for i in 63..70 {
        let p = payload(i, 5 + i as usize);
        out.push(rx.local_addr(), &p);
        want.push(p);
    }
    assert_eq!(tx.send_batch(&out).unwrap(), 70);
    let mut calls = 0;
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < 70 && Instant::now() < deadline {
        let n = rx
            .recv_batch(&mut batch, Some(Duration::from_millis(200)))
            .unwrap();
        assert!(n <= 10);
        calls += usize::from(n > 0);
        got.extend(batch.iter().map(|d| d.data.to_vec()));
    }
    assert!(calls >= 7);
    if tx.features().gso && rx.features().gro {
        assert_eq!(got, want, "coalesced buffers are delivered in order");
        assert_eq!(rx.counters().gro_batches, 2);
        assert_eq!(rx.counters().gro_segments, 63);
        assert_eq!(tx.counters().gso_batches, 2);
    } else {
        assert_eq!(sorted(got), sorted(want));
    }
}

/// Datagrams are delivered where the kernel wrote them (the batch holds the
/// receive buffer). The rest of a coalesced receive survives a rewrite of a
/// delivered datagram, and is given up, counted, never misread, once the
/// batch is refilled by another port.
#[test]
fn undelivered_rest_of_a_coalesced_receive() {
    let mut tx = UdpPort::bind(lo()).unwrap();
    let mut rx = UdpPort::bind(lo()).unwrap();
    let mut other = UdpConfig::default().gro(false).bind(lo()).unwrap();
    if !(tx.features().gso && rx.features().gro) {
        eprintln!("no UDP GSO/GRO on this kernel; skipping");
        return;
    }
    let mut batch = RecvBatch::new(4, 2048);
    let mut out = SendBatch::new();
    for i in 0..20 {
        out.push(rx.local_addr(), &payload(i, 500));
    }
    assert_eq!(tx.send_batch(&out).unwrap(), 20);
    let n = rx
        .recv_batch(&mut batch, Some(Duration::from_secs(2)))
        .unwrap();
    assert_eq!(n, 4);
    for i in 0..4 {
        assert_eq!(batch.get(i).unwrap().data, &payload(i as u32, 500)[..]);
        batch.data_mut(i).unwrap().fill(0xee);
    }
    // The next four come from the same receive, untouched by the rewrite.
    assert_eq!(rx.recv_batch(&mut batch, Some(Duration::ZERO)).unwrap(), 4);
    for i in 0..4 {
        assert_eq!(batch.get(i).unwrap().data, &payload(4 + i as u32, 500)[..]);
    }
    assert_eq!(rx.counters().rx_syscalls, 1, "{:?}", rx.counters());

    // Another port fills the batch (slot storage); the 12 left are gone.
    let mut single = SendBatch::new();
    single.push(other.local_addr(), b"other");
    tx.send_batch(&single).unwrap();
    assert_eq!(
        other
            .recv_batch(&mut batch, Some(Duration::from_secs(2)))
            .unwrap(),
        1
    );
    assert_eq!(batch.get(0).unwrap().data, b"other");
    assert_eq!(
        rx.recv_batch(&mut batch, Some(Duration::ZERO)).unwrap(),
        0,
        "nothing is read from a buffer the batch gave up"
    );
    assert_eq!(rx.counters().rx_abandoned, 12);
    assert_eq!(rx.counters().rx_datagrams, 8);
    // The port goes on receiving normally.
    let mut again = SendBatch::new();
    again.push(rx.local_addr(), &payload(99, 300));
    tx.send_batch(&again).unwrap();
    let got = recv_n(&mut rx, &mut batch, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, payload(99, 300));
}

#[test]
fn fallback_path_forced_off() {
    let cfg = UdpConfig::default().gso(false).gro(false);
    let mut tx = cfg.bind(lo()).unwrap();
    let mut rx = cfg.bind(lo()).unwrap();
    let mut batch = RecvBatch::new(64, 2048);
    roundtrip(&mut tx, &mut rx, &mut batch, &[1000; 64], 0);
    let (t, r) = (tx.counters(), rx.counters());
    assert_eq!((t.gso_batches, t.gso_segments), (0, 0));
    assert_eq!((r.gro_batches, r.gro_segments), (0, 0));
    #[cfg(target_os = "linux")]
    assert_eq!(t.tx_syscalls, 1, "64 datagrams in one sendmmsg");
}

#[test]
fn gso_sender_to_non_gro_receiver() {
    let mut tx = UdpPort::bind(lo()).unwrap();
    let mut rx = UdpConfig::default().gro(false).bind(lo()).unwrap();
    let mut batch = RecvBatch::new(64, 2048);
    roundtrip(&mut tx, &mut rx, &mut batch, &[1200; 50], 0);
    assert_eq!(rx.counters().gro_segments, 0);
    if tx.features().gso {
        assert_eq!(tx.counters().gso_segments, 50);
    }
}

#[test]
fn gso_runs_to_several_destinations() {
    let mut tx = UdpPort::bind(lo()).unwrap();
    let mut a = UdpPort::bind(lo()).unwrap();
    let mut b = UdpPort::bind(lo()).unwrap();
    let mut out = SendBatch::new();
    let (mut want_a, mut want_b) = (Vec::new(), Vec::new());
    let plan = [
        (0, 10, 200),
        (1, 5, 200),
        (0, 3, 50),
        (1, 1, 7),
        (0, 20, 1300),
    ];
    let mut seq = 0;
    for (dest, count, len) in plan {
        for _ in 0..count {
            let p = payload(seq, len);
            seq += 1;
            if dest == 0 {
                out.push(a.local_addr(), &p);
                want_a.push(p);
            } else {
                out.push(b.local_addr(), &p);
                want_b.push(p);
            }
        }
    }
    assert_eq!(tx.send_batch(&out).unwrap(), 39);
    let mut batch = RecvBatch::new(64, 2048);
    let got_a: Vec<_> = recv_n(&mut a, &mut batch, want_a.len())
        .into_iter()
        .map(|g| g.1)
        .collect();
    let got_b: Vec<_> = recv_n(&mut b, &mut batch, want_b.len())
        .into_iter()
        .map(|g| g.1)
        .collect();
    assert_eq!(sorted(got_a), sorted(want_a));
    assert_eq!(sorted(got_b), sorted(want_b));
    if tx.features().gso {
        // Runs of >= 2: (a,10), (b,5), (a,3), (a,20) -> 38 datagrams in GSO buffers.
        assert_eq!(tx.counters().gso_batches, 4);
        assert_eq!(tx.counters().gso_segments, 38);
    }
}

#[test]
fn truncation_is_reported() {
    for (name, cfg) in configs() {
        let mut tx = cfg.bind(lo()).unwrap();
        let mut rx = cfg.bind(lo()).unwrap();
        let mut batch = RecvBatch::new(16, 100);
        let sizes = [500usize, 50, 100, 101, 0];
        let mut out = SendBatch::new();
        for (i, &len) in sizes.iter().enumerate() {
            out.push(rx.local_addr(), &payload(i as u32, len));
        }
        // And a GSO-able run of datagrams larger than the slot.
        for i in 0..3 {
            out.push(rx.local_addr(), &payload(10 + i, 300));
        }
        tx.send_batch(&out).unwrap();
        let got = recv_n(&mut rx, &mut batch, 8);
        assert_eq!(got.len(), 8, "{name}");
        let mut seen: Vec<(usize, bool, Vec<u8>)> =
            got.iter().map(|g| (g.1.len(), g.2, g.1.clone())).collect();
        seen.sort();
        let mut want: Vec<(usize, bool, Vec<u8>)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| (i as u32, len))
            .chain((0..3).map(|i| (10 + i, 300)))
            .map(|(seq, len)| {
                let p = payload(seq, len);
                (len.min(100), len > 100, p[..len.min(100)].to_vec())
            })
            .collect();
        want.sort();
        assert_eq!(seen, want, "{name}");
        assert_eq!(rx.counters().rx_truncated, 5, "{name}");
    }
}

#[test]
fn timeouts_return_zero_datagrams() {
    let mut rx = UdpPort::bind(lo()).unwrap();
    let mut batch = RecvBatch::new(8, 2048);
    // Stale contents are cleared even when nothing arrives.
    batch.push(lo(), b"stale");

    let t = Instant::now();
    assert_eq!(rx.recv_batch(&mut batch, Some(Duration::ZERO)).unwrap(), 0);
    assert!(batch.is_empty());
    assert!(t.elapsed() < Duration::from_millis(100));

    let t = Instant::now();
    assert_eq!(
        rx.recv_batch(&mut batch, Some(Duration::from_millis(150)))
            .unwrap(),
        0
    );
    let e = t.elapsed();
    assert!(e >= Duration::from_millis(140), "{e:?}");
    assert!(e < Duration::from_secs(3), "{e:?}");

    // Blocking without timeout returns once a datagram arrives.
    let dest = rx.local_addr();
    let sender = thread::spawn(move || {
        let mut tx = UdpPort::bind(lo()).unwrap();
        thread::sleep(Duration::from_millis(100));
        let mut out = SendBatch::new();
        out.push(dest, b"wake up");
        tx.send_batch(&out).unwrap()
    });
    let n = rx.recv_batch(&mut batch, None).unwrap();
    assert_eq!(n, 1);
    assert_eq!(batch.get(0).unwrap().data, b"wake up");
    assert_eq!(sender.join().unwrap(), 1);

    // A timeout too long to represent as a deadline means "no limit".
    let sender = thread::spawn(move || {
        let mut tx = UdpPort::bind(lo()).unwrap();
        thread::sleep(Duration::from_millis(50));
        let mut out = SendBatch::new();
        out.push(dest, b"eventually");
        tx.send_batch(&out).unwrap()
    });
    assert_eq!(rx.recv_batch(&mut batch, Some(Duration::MAX)).unwrap(), 1);
    assert_eq!(batch.get(0).unwrap().data, b"eventually");
    sender.join().unwrap();
}

#[test]
fn bind_error_names_the_address() {
    let a = UdpPort::bind(lo()).unwrap();
    let addr = a.local_addr();
    match UdpPort::bind(addr) {
        Err(IoError::Bind { addr: got, source }) => {
            assert_eq!(got, addr);
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
        }
        other => panic!("expected a bind error, got {other:?}"),
    }
    let msg = UdpPort::bind(addr).unwrap_err().to_string();
    assert!(msg.contains(&addr.to_string()), "{msg}");
}

#[test]
fn refused_datagrams_are_counted_not_fatal() {
    let mut tx = UdpPort::bind(lo()).unwrap();
    let mut rx = UdpPort::bind(lo()).unwrap();
    let v6: SocketAddr = "[::1]:9".parse().unwrap();

    // Only refusals: an error, nothing sent.
    let mut out = SendBatch::new();
    out.push(v6, b"wrong family");
    match tx.send_batch(&out) {
        Err(IoError::Send { sent: 0, .. }) => {}
        other => panic!("expected a send error, got {other:?}"),
    }
    assert_eq!(tx.counters().tx_errors, 1);

    // Mixed: the good ones still go out.
    out.clear();
    out.push(rx.local_addr(), b"one");
    out.push(v6, b"wrong family");
    out.push(rx.local_addr(), &vec![7u8; 70_000]); // larger than any UDP datagram
    out.push(rx.local_addr(), b"two");
    assert_eq!(tx.send_batch(&out).unwrap(), 2);
    assert_eq!(tx.counters().tx_errors, 3);
    let mut batch = RecvBatch::new(8, 2048);
    let got: Vec<_> = recv_n(&mut rx, &mut batch, 2)
        .into_iter()
        .map(|g| g.1)
        .collect();
    assert_eq!(sorted(got), vec![b"one".to_vec(), b"two".to_vec()]);
}

#[test]
fn cloned_handle_shares_the_socket() {
    let tx = UdpPort::bind(lo()).unwrap();
    let mut tx2 = tx.try_clone().unwrap();
    let mut rx = UdpPort::bind(lo()).unwrap();
    assert_eq!(tx2.local_addr(), tx.local_addr());
    assert_eq!(tx2.features(), tx.features());
    let mut out = SendBatch::new();
    out.push(rx.local_addr(), b"from the clone");
    assert_eq!(tx2.send_batch(&out).unwrap(), 1);
    let mut batch = RecvBatch::new(4, 64);
    let got = recv_n(&mut rx, &mut batch, 1);
    assert_eq!(got[0].0, tx.local_addr());
    assert_eq!(tx.counters().tx_datagrams, 0, "counters are per handle");
    assert_eq!(tx2.counters().tx_datagrams, 1);
}

#[test]
fn concurrent_sender_and_receiver_threads() {
    let mut rx = UdpPort::bind(lo()).unwrap();
    let dest = rx.local_addr();
    const N: u32 = 5000;
    let sender = thread::spawn(move || {
        let mut tx = UdpPort::bind(lo()).unwrap();
        let mut out = SendBatch::with_capacity(50, 50 * 64);
        let mut sent = 0;
        for chunk in 0..N / 50 {
            out.clear();
            for i in 0..50 {
                out.push(dest, &payload(chunk * 50 + i, 64));
            }
            sent += tx.send_batch(&out).unwrap();
            // Pace a little so that the receive buffer never overflows.
            thread::sleep(Duration::from_micros(200));
        }
        sent
    });
    let mut batch = RecvBatch::new(64, 2048);
    let got = recv_n(&mut rx, &mut batch, N as usize);
    assert_eq!(sender.join().unwrap(), N as usize);
    let mut seqs: Vec<u32> = got
        .iter()
        .map(|g| u32::from_be_bytes([g.1[0], g.1[1], g.1[2], g.1[3]]))
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..N).collect::<Vec<_>>());
}

#[test]
fn works_behind_dyn_port() {
    let mut tx: Box<dyn Port<Addr = SocketAddr>> = Box::new(UdpPort::bind(lo()).unwrap());
    let mut rx = UdpPort::bind(lo()).unwrap();
    let mut out = SendBatch::new();
    out.push(rx.local_addr(), b"dyn");
    assert_eq!(tx.send_batch(&out).unwrap(), 1);
    let mut batch = RecvBatch::new(4, 64);
    assert_eq!(recv_n(&mut rx, &mut batch, 1)[0].1, b"dyn");
    assert_eq!(tx.counters().tx_datagrams, 1);
}

#[test]
fn receive_buffer_grows_and_never_shrinks() {
    let p = UdpPort::bind(lo()).unwrap();
    let before = p.recv_buffer_size().unwrap();
    assert_eq!(p.grow_recv_buffer(1024).unwrap(), before, "never shrinks");
    let want = before * 4;
    let got = p.grow_recv_buffer(want).unwrap();
    // Without CAP_NET_ADMIN the kernel caps the request at twice net.core.rmem_max.
    let cap = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .map_or(usize::MAX, |m| 2 * m);
    assert!(
        got >= want.min(cap),
        "asked for {want}, got {got} (cap {cap})"
    );
    assert!(got >= before);
    // Through the Port trait: room for `bytes` of waiting datagrams.
    let mut q = UdpPort::bind(lo()).unwrap();
    let bytes = q.recv_buffer_size().unwrap() * 3;
    Port::reserve_recv(&mut q, bytes);
    let got = q.recv_buffer_size().unwrap();
    assert!(
        got >= bytes.min(cap),
        "reserved {bytes}, got {got} (cap {cap})"
    );
}

/// Datagrams sent once to a multicast group reach every member port on the host, next to the
/// members' own unicast traffic.
#[test]
fn group_datagrams_reach_every_member_next_to_unicast() {
    use std::net::{Ipv4Addr, SocketAddrV4};
    let group = SocketAddrV4::new(Ipv4Addr::new(239, 77, 0, 1), 0);
    // A free port for the group: bind a throwaway socket to learn one.
    let probe = UdpPort::bind(lo()).unwrap();
    let group = SocketAddrV4::new(*group.ip(), probe.local_addr().port());
    drop(probe);
    let mut members: Vec<UdpPort> = (0..3).map(|_| UdpPort::bind(lo()).unwrap()).collect();
    for m in &mut members {
        m.join_group(group).unwrap();
        assert_eq!(m.group(), Some(group));
    }
    let mut tx = UdpPort::bind(lo()).unwrap();
    tx.set_multicast_interface().unwrap();
    let mut out = SendBatch::new();
    for i in 0..20 {
        out.push(SocketAddr::V4(group), &payload(i, 600));
    }
    // And one unicast datagram to each member.
    for (k, m) in members.iter().enumerate() {
        out.push(m.local_addr(), &payload(1000 + k as u32, 100));
    }
    assert_eq!(tx.send_batch(&out).unwrap(), 23);
    let mut batch = RecvBatch::new(8, 2048);
    for (k, m) in members.iter_mut().enumerate() {
        let got = recv_n(m, &mut batch, 21);
        let mut want: Vec<Vec<u8>> = (0..20).map(|i| payload(i, 600)).collect();
        want.push(payload(1000 + k as u32, 100));
        let got: Vec<Vec<u8>> = got
            .into_iter()
            .map(|(src, d, truncated)| {
                assert_eq!(src, tx.local_addr());
                assert!(!truncated);
                d
            })
            .collect();
        assert_eq!(sorted(got), sorted(want), "member {k}");
    }
    // Nothing more, and an empty wait on both sockets times out.
    let t = Instant::now();
    assert_eq!(
        members[0]
            .recv_batch(&mut batch, Some(Duration::from_millis(30)))
            .unwrap(),
        0
    );
    assert!(t.elapsed() >= Duration::from_millis(25));
    // Not a multicast address: refused.
    assert!(members[0]
        .join_group(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9))
        .is_err());
}
