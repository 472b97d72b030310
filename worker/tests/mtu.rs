//! A job whose packets do not fit the path MTU to the switch fails the connection with the
//! numbers at fault, instead of having every datagram fragmented.
#![allow(clippy::unwrap_used)]

use ina_switch::{JobSpec, Switch, SwitchConfig};
use ina_worker::{Communicator, WorkerConfig, WorkerError};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[test]
fn a_job_beyond_the_path_mtu_fails_the_connection() {
    let worker: SocketAddr = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut cfg = SwitchConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.pipeline.max_elems = 1024;
    cfg.jobs = vec![JobSpec {
        job: 3,
        epoch: None,
        slot_base: 0,
        slot_count: 8,
        elems_per_packet: 1024,
        workers: vec![worker],
        group: None,
        uplink: None,
    }];
    let sw = Switch::bind(cfg).unwrap();
    let addr = sw.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let thread = sw.spawn(stop.clone()).unwrap();

    // A 1500-byte path: 1024 elements make 16 + 4096 + 28 bytes.
    let mut wc = WorkerConfig::new(addr, worker, 3, 0);
    wc.mtu = Some(1500);
    match Communicator::connect(wc) {
        Err(e @ WorkerError::PathMtu { .. }) => {
            assert_eq!(
                e,
                WorkerError::PathMtu {
                    job: 3,
                    switch: addr,
                    elems: 1024,
                    packet: 4140,
                    mtu: 1500,
                    fits: 364,
                }
            );
            assert_eq!(e.kind(), "path_mtu");
            let msg = e.to_string();
            for part in ["1024 elements", "4140-byte", "MTU", "1500", "elems=364"] {
                assert!(msg.contains(part), "{part} not in {msg}");
            }
        }
        other => panic!("expected a path MTU error, got {other:?}"),
    }
    // Loopback's own MTU (65536 by default) takes them: the kernel is asked.
    let mut comm = Communicator::connect(WorkerConfig::new(addr, worker, 3, 0)).unwrap();
    let mut ints: Vec<i32> = (0..3000).collect();
    comm.allreduce_i32(&mut ints).unwrap();
    assert_eq!(ints[2999], 2999);
    drop(comm);
    stop.store(true, Ordering::SeqCst);
    thread.join().unwrap().unwrap();
}
