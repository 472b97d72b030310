//! Ring all-reduce throughput: 4 ranks on loopback all-reducing 16 MiB of f32 (and 4 KiB, for
//! the per-call latency).
//!
//! Throughput is tensor bytes per second (algorithm bandwidth): each rank moves
//! `2 (n - 1) / n` times that on the wire in each direction. `RING_CHUNK_BYTES` overrides the
//! chunk size.

use std::hint::black_box;
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ina_worker::ring::{RingComm, RingOptions, DEFAULT_CHUNK_BYTES};

const RANKS: usize = 4;
const BYTES: usize = 16 << 20;
const SMALL_BYTES: usize = 4 << 10;

/// Ranks 1.. run on their own threads and mirror every batch of calls rank 0 makes.
struct Ring {
    rank0: RingComm,
    data0: Vec<f32>,
    go: Vec<mpsc::Sender<u64>>,
    done: mpsc::Receiver<()>,
    others: Vec<JoinHandle<()>>,
}

impl Ring {
    fn new(elems: usize) -> Self {
        let chunk = std::env::var("RING_CHUNK_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_CHUNK_BYTES);
        let opts = RingOptions::default().with_chunk_bytes(chunk);
        let ls: Vec<TcpListener> = (0..RANKS)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
            .collect();
        let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().expect("addr")).collect();
        let (done_tx, done) = mpsc::channel();
        let mut go = Vec::new();
        let mut others = Vec::new();
        let mut ls = ls.into_iter();
        let l0 = ls.next().expect("listener");
        for (i, l) in ls.enumerate() {
            let rank = i + 1;
            let (tx, rx) = mpsc::channel::<u64>();
            go.push(tx);
            let addrs = addrs.clone();
            let opts = opts.clone();
            let done_tx = done_tx.clone();
            others.push(thread::spawn(move || {
                let mut comm =
                    RingComm::connect_with_listener(rank, l, &addrs, opts).expect("connect");
                let mut data = vec![1.0f32; elems];
                while let Ok(iters) = rx.recv() {
                    for _ in 0..iters {
                        comm.allreduce_f32(&mut data).expect("allreduce");
                    }
                    done_tx.send(()).expect("done");
                }
            }));
        }
        let rank0 = RingComm::connect_with_listener(0, l0, &addrs, opts).expect("connect");
        Self {
            rank0,
            data0: vec![1.0f32; elems],
            go,
            done,
            others,
        }
    }

    fn run(&mut self, iters: u64) -> Duration {
        for tx in &self.go {
            tx.send(iters).expect("go");
        }
        let start = Instant::now();
        for _ in 0..iters {
            self.rank0
                .allreduce_f32(black_box(&mut self.data0))
                .expect("allreduce");
        }
        for _ in &self.go {
            self.done.recv().expect("done");
        }
        start.elapsed()
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.go.clear();
        for h in self.others.drain(..) {
            let _ = h.join();
        }
    }
}

fn ring_allreduce(c: &mut Criterion) {
    let mut group = c.benchmark_group("ring_allreduce_f32");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Bytes(BYTES as u64));
    let mut ring = Ring::new(BYTES / 4);
    group.bench_function("n4_16MiB_loopback", |b| {
        b.iter_custom(|iters| ring.run(iters))
    });
    drop(ring);
    // The latency-bound end: 2 (n - 1) = 6 dependent steps per call.
    group.throughput(Throughput::Bytes(SMALL_BYTES as u64));
    let mut ring = Ring::new(SMALL_BYTES / 4);
    group.bench_function("n4_4KiB_loopback", |b| {
        b.iter_custom(|iters| ring.run(iters))
    });
    group.finish();
}

criterion_group!(benches, ring_allreduce);
criterion_main!(benches);
