//! The hot loop allocates nothing per packet once warm.
#![allow(clippy::unwrap_used)]
#![allow(unsafe_code)] // the counting global allocator below

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::SocketAddr;
use std::time::Duration;

use ina_io::{MemNetwork, Port, RecvBatch, SendBatch, UdpConfig};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Runs `rounds` send+receive rounds of 100 datagrams (a GSO-able run and
/// assorted sizes) and returns the allocations made by this thread.
fn pump<P: Port<Addr = SocketAddr>>(
    tx: &mut P,
    rx: &mut P,
    out: &mut SendBatch,
    batch: &mut RecvBatch,
    rounds: usize,
) -> u64 {
    let before = allocs();
    for r in 0..rounds {
        out.clear();
        for i in 0..100usize {
            let len = if i < 60 { 512 } else { (i * 37 + r) % 1400 };
            out.push_with(rx.local_addr(), len, |b| b.fill(i as u8));
        }
        assert_eq!(tx.send_batch(out).unwrap(), 100);
        let mut got = 0;
        while got < 100 {
            let n = rx.recv_batch(batch, Some(Duration::from_secs(2))).unwrap();
            assert!(n > 0);
            got += n;
        }
    }
    allocs() - before
}

#[test]
fn no_allocation_per_packet() {
    let before = allocs();
    drop(std::hint::black_box(vec![1u8; 10]));
    assert_eq!(allocs(), before + 1, "the counter works");

    let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut out = SendBatch::with_capacity(100, 100 * 1400);
    let mut batch = RecvBatch::new(64, 2048);
    for cfg in [
        UdpConfig::default(),
        UdpConfig::default().gso(false).gro(false),
    ] {
        let mut tx = cfg.bind(lo).unwrap();
        let mut rx = cfg.bind(lo).unwrap();
        pump(&mut tx, &mut rx, &mut out, &mut batch, 3); // warm up
        let n = pump(&mut tx, &mut rx, &mut out, &mut batch, 50);
        assert_eq!(
            n,
            0,
            "UdpPort {}: {n} allocations for 5000 datagrams",
            tx.features()
        );
    }
    let net = MemNetwork::new();
    let mut tx = net.port("127.0.0.1:1".parse().unwrap()).unwrap();
    let mut rx = net.port("127.0.0.1:2".parse().unwrap()).unwrap();
    pump(&mut tx, &mut rx, &mut out, &mut batch, 3);
    let n = pump(&mut tx, &mut rx, &mut out, &mut batch, 50);
    assert_eq!(n, 0, "MemPort: {n} allocations for 5000 datagrams");
}
