//! Ring all-reduce over real TCP on 127.0.0.1, one thread per rank.
#![allow(clippy::unwrap_used)]

use std::net::{SocketAddr, TcpListener};
use std::thread;
use std::time::{Duration, Instant};

use ina_proto::ring::RingSchedule;
use ina_worker::ring::{RingComm, RingError, RingOptions, CALL_HEADER_LEN};

/// Binds `n` listeners on ephemeral loopback ports.
fn listeners(n: usize) -> (Vec<TcpListener>, Vec<SocketAddr>) {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    (ls, addrs)
}

fn opts() -> RingOptions {
    RingOptions::default()
        .with_job_id(0xC0FFEE)
        .with_connect_timeout(Duration::from_secs(20))
        .with_io_timeout(Some(Duration::from_secs(20)))
}

/// Runs `f(rank, connect_result)` on one thread per rank and returns the results by rank.
fn run_ring<R, F>(n: usize, opts_of: impl Fn(usize) -> RingOptions, f: F) -> Vec<R>
where
    R: Send + 'static,
    F: Fn(usize, Result<RingComm, RingError>) -> R + Send + Sync + Clone + 'static,
{
    let (ls, addrs) = listeners(n);
    let handles: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(rank, l)| {
            let addrs = addrs.clone();
            let o = opts_of(rank);
            let f = f.clone();
            thread::Builder::new()
                .name(format!("rank-{rank}"))
                .spawn(move || f(rank, RingComm::connect_with_listener(rank, l, &addrs, o)))
                .unwrap()
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Deterministic test input in [-1, 1).
fn input_f32(rank: usize, len: usize, salt: u64) -> Vec<f32> {
    let mut s = (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt ^ len as u64;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn input_i32(rank: usize, len: usize) -> Vec<i32> {
    (0..len)
        .map(|i| {
            let x = (i as i64 * 7919 + rank as i64 * 104_729) as i32;
            // Large magnitudes so that the sums wrap.
            x.wrapping_mul(2_654_435_761u32 as i32) ^ (i32::MAX - rank as i32)
        })
        .collect()
}

const SIZES: &[usize] = &[0, 1, 2, 3, 5, 7, 8, 13, 1023, 65_537, (1 << 20) + 3];

fn check_f32(n: usize, sizes: &[usize], opts_of: impl Fn(usize) -> RingOptions) {
    let sizes_owned = sizes.to_vec();
    let outs = run_ring(n, opts_of, move |rank, comm| {
        let mut comm = comm.unwrap();
        let mut results = Vec::new();
        for &len in &sizes_owned {
            let mut data = input_f32(rank, len, 1);
            comm.allreduce_f32(&mut data).unwrap();
            results.push(data);
        }
        results
    });
    for (si, &len) in sizes.iter().enumerate() {
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| input_f32(r, len, 1)).collect();
        for i in 0..len {
            let exact: f64 = inputs.iter().map(|v| f64::from(v[i])).sum();
            let magnitude: f64 = inputs.iter().map(|v| f64::from(v[i]).abs()).sum();
            let got = outs[0][si][i];
            let tol = magnitude * f64::from(f32::EPSILON) * n as f64 + 1e-30;
            assert!(
                (f64::from(got) - exact).abs() <= tol,
                "n={n} len={len} i={i}: {got} vs {exact}"
            );
            for (r, out) in outs.iter().enumerate() {
                assert_eq!(
                    out[si][i].to_bits(),
                    got.to_bits(),
                    "n={n} len={len} i={i}: rank {r} differs from rank 0"
                );
            }
        }
    }
}

fn check_i32(n: usize, sizes: &[usize]) {
    let sizes_owned = sizes.to_vec();
    let outs = run_ring(
        n,
        |_| opts().with_chunk_bytes(4096),
        move |rank, comm| {
            let mut comm = comm.unwrap();
            sizes_owned
                .iter()
                .map(|&len| {
                    let mut data = input_i32(rank, len);
                    comm.allreduce_i32(&mut data).unwrap();
                    data
                })
                .collect::<Vec<_>>()
        },
    );
    for (si, &len) in sizes.iter().enumerate() {
        let mut want = vec![0i32; len];
        for r in 0..n {
            for (w, x) in want.iter_mut().zip(input_i32(r, len)) {
                *w = w.wrapping_add(x);
            }
        }
        for out in &outs {
            assert!(out[si] == want, "n={n} len={len}: wrong i32 sum");
        }
    }
}

#[test]
fn ring_f32_one_rank() {
    check_f32(1, SIZES, |_| opts());
}

#[test]
fn ring_f32_two_ranks() {
    check_f32(2, SIZES, |_| opts());
}

#[test]
fn ring_f32_three_ranks() {
    check_f32(3, SIZES, |_| opts());
}

#[test]
fn ring_f32_four_ranks() {
    check_f32(4, SIZES, |_| opts());
}

#[test]
fn ring_f32_eight_ranks() {
    check_f32(8, SIZES, |_| opts());
}

#[test]
fn ring_f32_small_chunks_many_mib() {
    // 4 MiB per rank in 4 KiB chunks: hundreds of chunks in flight per step.
    check_f32(4, &[(1 << 20) + 1, 3], |_| opts().with_chunk_bytes(4096));
}

#[test]
fn ring_f32_chunks_at_the_direct_write_limit() {
    // 64 KiB chunks are written by the calling thread when the sender is idle; with 8 MiB the
    // socket fills up and the rest of a chunk goes through the sender thread.
    check_f32(2, &[2 << 20, 16_385], |_| opts().with_chunk_bytes(64 << 10));
}

#[test]
fn ring_f32_odd_chunk_sizes_differ_between_ranks() {
    // The byte stream does not depend on the chunking, so ranks may disagree on it.
    check_f32(3, &[0, 10, 4099, 100_003], |rank| {
        opts().with_chunk_bytes([4, 1000, 65_536][rank])
    });
}

#[test]
fn ring_i32_wrapping_sums() {
    for n in [1, 2, 3, 4, 8] {
        check_i32(n, &[0, 1, 2, 7, 8, 9, 1001, 300_007]);
    }
}

#[test]
fn ring_mixed_calls_and_stats() {
    let n = 4;
    let lens = [1000usize, 0, 3, 77_777];
    let outs = run_ring(
        n,
        |_| opts().with_chunk_bytes(1024),
        move |rank, comm| {
            let mut comm = comm.unwrap();
            assert_eq!(comm.rank(), rank);
            assert_eq!(comm.world_size(), n);
            for (i, &len) in lens.iter().enumerate() {
                if i % 2 == 0 {
                    let mut d = input_f32(rank, len, 7);
                    comm.allreduce_f32(&mut d).unwrap();
                } else {
                    let mut d = input_i32(rank, len);
                    comm.allreduce_i32(&mut d).unwrap();
                }
            }
            assert!(!comm.is_broken());
            comm.release_buffers();
            let mut d = vec![rank as i32; 9];
            comm.allreduce_i32(&mut d).unwrap();
            assert_eq!(d, vec![6; 9]);
            comm.stats()
        },
    );
    for (rank, stats) in outs.iter().enumerate() {
        let sent: usize = lens
            .iter()
            .map(|&len| RingSchedule::new(n, rank, len, 1).unwrap().elements_sent())
            .sum();
        let received: usize = lens
            .iter()
            .map(|&len| {
                RingSchedule::new(n, rank, len, 1)
                    .unwrap()
                    .elements_received()
            })
            .sum();
        let lens = [&lens[..], &[9]].concat();
        let sent = sent + RingSchedule::new(n, rank, 9, 1).unwrap().elements_sent();
        let received = received
            + RingSchedule::new(n, rank, 9, 1)
                .unwrap()
                .elements_received();
        assert_eq!(stats.allreduces, lens.len() as u64);
        assert_eq!(stats.payload_bytes_sent, 4 * sent as u64);
        assert_eq!(stats.payload_bytes_received, 4 * received as u64);
        let headers = (lens.len() * CALL_HEADER_LEN) as u64;
        assert_eq!(stats.bytes_sent, stats.payload_bytes_sent + headers);
        assert_eq!(stats.bytes_received, stats.payload_bytes_received + headers);
        // Bandwidth optimality on the wire: 2 (n - 1) / n of the tensor, up to rounding.
        let total: usize = lens.iter().sum();
        let ideal = 2.0 * (n - 1) as f64 / n as f64 * total as f64;
        assert!((sent as f64 - ideal).abs() <= 2.0 * lens.len() as f64);
    }
}

#[test]
fn ring_connect_binds_its_own_address() {
    // Reserve ephemeral ports, release them, and let `connect` bind them itself.
    let addrs: Vec<SocketAddr> = listeners(3).1;
    let handles: Vec<_> = (0..3)
        .map(|rank| {
            let addrs = addrs.clone();
            thread::spawn(move || {
                let mut comm = RingComm::connect(rank, &addrs, opts()).unwrap();
                let mut d = vec![rank as i32 + 1; 5];
                comm.allreduce_i32(&mut d).unwrap();
                d
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), vec![6; 5]);
    }
}

#[test]
fn ring_peer_dropping_mid_allreduce_fails_the_others() {
    let n = 4;
    let timeout = Duration::from_secs(3);
    let outs = run_ring(
        n,
        move |_| opts().with_io_timeout(Some(timeout)),
        move |rank, comm| {
            let mut comm = comm.unwrap();
            let mut d = input_f32(rank, 1 << 20, 3);
            comm.allreduce_f32(&mut d).unwrap();
            if rank == 2 {
                // Die while the others are inside the next call.
                thread::sleep(Duration::from_millis(200));
                drop(comm);
                return None;
            }
            let start = Instant::now();
            let err = comm.allreduce_f32(&mut d).unwrap_err();
            let elapsed = start.elapsed();
            let again = comm.allreduce_f32(&mut d).unwrap_err();
            Some((err, elapsed, again))
        },
    );
    for (rank, out) in outs.into_iter().enumerate() {
        let Some((err, elapsed, again)) = out else {
            assert_eq!(rank, 2);
            continue;
        };
        eprintln!("rank {rank}: {err} after {elapsed:?}");
        assert!(
            matches!(
                err,
                RingError::PeerClosed { .. } | RingError::Timeout { .. } | RingError::Io { .. }
            ),
            "rank {rank}: {err}"
        );
        assert!(
            elapsed < timeout + Duration::from_secs(5),
            "rank {rank}: {elapsed:?}"
        );
        assert!(matches!(again, RingError::Broken), "rank {rank}: {again}");
    }
}

#[test]
fn ring_stalled_peer_times_out() {
    let n = 3;
    let timeout = Duration::from_secs(1);
    let outs = run_ring(
        n,
        move |_| opts().with_io_timeout(Some(timeout)),
        move |rank, comm| {
            let mut comm = comm.unwrap();
            if rank == 1 {
                // Alive, connected, but never calls: the others must not hang.
                thread::sleep(timeout * 4);
                return None;
            }
            let mut d = input_f32(rank, 4 << 20, 5);
            let start = Instant::now();
            let err = comm.allreduce_f32(&mut d).unwrap_err();
            Some((err, start.elapsed()))
        },
    );
    for (rank, out) in outs.into_iter().enumerate() {
        let Some((err, elapsed)) = out else { continue };
        eprintln!("rank {rank}: {err} after {elapsed:?}");
        assert!(
            matches!(
                err,
                RingError::PeerClosed { .. } | RingError::Timeout { .. }
            ),
            "rank {rank}: {err}"
        );
        assert!(
            elapsed < timeout + Duration::from_secs(5),
            "rank {rank}: {elapsed:?}"
        );
    }
}

#[test]
fn ring_wrong_job_id_is_a_handshake_error() {
    for (n, bad) in [(2usize, 1usize), (3, 2)] {
        let outs = run_ring(
            n,
            move |rank| {
                let o = opts().with_connect_timeout(Duration::from_secs(5));
                if rank == bad {
                    o.with_job_id(42)
                } else {
                    o
                }
            },
            |_, comm| comm.map(|_| ()),
        );
        for (rank, out) in outs.into_iter().enumerate() {
            let err = out.unwrap_err();
            assert!(
                matches!(err, RingError::HandshakeMismatch { .. }),
                "n={n} rank {rank}: {err}"
            );
        }
    }
}

#[test]
fn ring_mismatched_calls_fail_instead_of_hanging() {
    let outs = run_ring(
        3,
        |_| opts(),
        |rank, comm| {
            let mut comm = comm.unwrap();
            if rank == 0 {
                let mut d = vec![1.0f32; 10];
                comm.allreduce_f32(&mut d)
            } else {
                let mut d = vec![1.0f32; 11];
                comm.allreduce_f32(&mut d)
            }
        },
    );
    assert!(outs.iter().all(Result::is_err), "{outs:?}");
    assert!(outs
        .iter()
        .any(|r| matches!(r, Err(RingError::CallMismatch { .. }))));

    let outs = run_ring(
        2,
        |_| opts(),
        |rank, comm| {
            let mut comm = comm.unwrap();
            if rank == 0 {
                comm.allreduce_f32(&mut [1.0; 4])
            } else {
                comm.allreduce_i32(&mut [1; 4])
            }
        },
    );
    assert!(
        outs.iter()
            .all(|r| matches!(r, Err(RingError::CallMismatch { .. }))),
        "{outs:?}"
    );
}

#[test]
fn ring_connect_times_out_when_the_neighbour_is_absent() {
    // Rank 1's port is reserved and released: nobody listens there.
    let (mut ls, addrs) = listeners(2);
    drop(ls.pop());
    let l0 = ls.pop().unwrap();
    let start = Instant::now();
    let err = RingComm::connect_with_listener(
        0,
        l0,
        &addrs,
        opts().with_connect_timeout(Duration::from_millis(300)),
    )
    .unwrap_err();
    assert!(
        matches!(err, RingError::ConnectTimeout { peer: 1, .. }),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn ring_accept_times_out_when_the_left_neighbour_never_connects() {
    // Rank 1 listens (so rank 0 can connect) but never runs.
    let (mut ls, addrs) = listeners(2);
    let _l1 = ls.pop().unwrap();
    let l0 = ls.pop().unwrap();
    let err = RingComm::connect_with_listener(
        0,
        l0,
        &addrs,
        opts().with_connect_timeout(Duration::from_millis(300)),
    )
    .unwrap_err();
    assert!(
        matches!(err, RingError::AcceptTimeout { peer: 1, .. }),
        "{err}"
    );
}

#[test]
fn ring_rejects_bad_arguments() {
    let (mut ls, addrs) = listeners(2);
    let err = RingComm::connect_with_listener(2, ls.pop().unwrap(), &addrs, opts()).unwrap_err();
    assert!(
        matches!(err, RingError::InvalidRank { rank: 2, world: 2 }),
        "{err}"
    );
    let err = RingComm::connect(0, &[], opts()).unwrap_err();
    assert!(matches!(err, RingError::NoPeers), "{err}");
}

/// The connections take the congestion control asked for (`reno` is always built in); a name
/// the kernel does not have fails the connection with an error that names it.
#[test]
fn ring_sets_the_asked_congestion_control() {
    check_f32(3, &[10_000], |_| {
        opts().with_congestion(Some("reno".into()))
    });
    let errors = run_ring(
        2,
        |_| {
            opts()
                .with_congestion(Some("no-such-cc".into()))
                .with_connect_timeout(Duration::from_millis(500))
        },
        |_, r| r.err().map(|e| e.to_string()),
    );
    assert!(
        errors
            .iter()
            .flatten()
            .any(|e| e.contains("TCP congestion control `no-such-cc`")),
        "{errors:?}"
    );
}

#[test]
fn allgather_gives_every_rank_every_contribution_of_any_length() {
    for n in [1, 2, 3, 5] {
        let out = run_ring(
            n,
            |_| opts(),
            move |rank, c| {
                let mut c = c.unwrap();
                let mine: Vec<u8> = (0..rank * 1000 + 3).map(|i| (i * 7 + rank) as u8).collect();
                let first = c.allgather(&mine).unwrap();
                // A second call on the same connections, an empty contribution among them.
                let second = c
                    .allgather(if rank == 0 { &[] } else { &mine[..1] })
                    .unwrap();
                (first, second)
            },
        );
        for (rank, (first, second)) in out.iter().enumerate() {
            for (from, got) in first.iter().enumerate() {
                let want: Vec<u8> = (0..from * 1000 + 3).map(|i| (i * 7 + from) as u8).collect();
                assert_eq!(
                    got, &want,
                    "n={n}: rank {rank}'s copy of rank {from}'s bytes"
                );
            }
            assert_eq!(second[0].len(), 0);
            assert!(second[1..].iter().all(|s| s.len() == 1));
        }
    }
}

#[test]
fn the_sparse_all_gather_sums_blocks_bit_identically() {
    let n = 4;
    let block = 8;
    let len = 200;
    let input = move |rank: usize| -> Vec<f32> {
        let mut t = input_f32(rank, len, 5);
        for (b, chunk) in t.chunks_mut(block).enumerate() {
            // Rank r holds the blocks b with (b + r) % 3 == 0, and every rank block 7.
            if !(b + rank).is_multiple_of(3) && b != 7 {
                chunk.fill(0.0);
            }
        }
        t
    };
    let out = run_ring(
        n,
        |_| opts(),
        move |rank, c| {
            let mut c = c.unwrap();
            let mut t = input(rank);
            c.allreduce_sparse_f32(&mut t, block).unwrap();
            (t, c.stats())
        },
    );
    let mut exact = vec![0f64; len];
    for r in 0..n {
        for (e, x) in exact.iter_mut().zip(input(r)) {
            *e += f64::from(x);
        }
    }
    for (rank, (t, stats)) in out.iter().enumerate() {
        assert!(
            t.iter()
                .map(|x| x.to_bits())
                .eq(out[0].0.iter().map(|x| x.to_bits())),
            "rank {rank} differs"
        );
        for (i, (g, e)) in t.iter().zip(&exact).enumerate() {
            assert!((f64::from(*g) - e).abs() < 1e-5, "element {i}: {g} vs {e}");
        }
        // Only the other ranks' pairs came in: far less than the dense tensor n - 1 times.
        assert!(stats.payload_bytes_received < (n as u64 - 1) * len as u64 * 4 * 6 / 10);
    }
}
