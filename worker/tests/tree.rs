//! Hierarchical aggregation through software switches on loopback: two rack switches (two
//! shards each, or sending to a multicast group) send their partial sums to an upper switch;
//! four workers, two per rack, get the exact totals. And a rack switch refuses an upper slot
//! range its shards cannot serve.
#![allow(clippy::unwrap_used)]

mod common;

use common::{free_addrs, switch};
use ina_switch::{JobSpec, UplinkSpec};
use ina_worker::{Communicator, WorkerConfig};
use std::net::SocketAddr;

fn job(workers: Vec<SocketAddr>, epoch: Option<u16>, uplink: Option<UplinkSpec>) -> JobSpec {
    JobSpec {
        job: 4,
        epoch,
        slot_base: 128,
        slot_count: 128,
        elems_per_packet: 64,
        workers,
        group: None,
        uplink,
    }
}

/// Runs four workers (two per rack switch of `racks`, bound to `addrs`), each on a thread of
/// its own: worker `g` is rank `g mod 2` of the rack switch `racks[g / 2]` and runs `f(g, its
/// communicator)`. Returns what each returned, in order.
fn run_workers<T: Send + 'static>(
    racks: &[common::Running],
    addrs: &[SocketAddr],
    f: impl Fn(usize, Communicator) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let threads: Vec<_> = (0..4)
        .map(|g| {
            let mut cfg = WorkerConfig::new(racks[g / 2].addr, addrs[g], 4, (g % 2) as u8);
            cfg.total_workers = Some(4);
            let f = f.clone();
            std::thread::spawn(move || f(g, Communicator::connect(cfg).unwrap()))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Two racks of two workers whose rack switches send each total once to a multicast group of
/// the rack (the totals carry the upper job's id when they arrive: the group is the rack
/// job's), with the upper job under another id and at other slots.
#[test]
fn totals_reach_the_racks_multicast_groups() {
    let addrs = free_addrs(4);
    let upper_addr = free_addrs(1)[0];
    let racks: Vec<_> = (0..2u8)
        .map(|i| {
            let port = free_addrs(1)[0].port();
            let group =
                std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(239, 255, 75, 10 + i), port);
            let uplink = UplinkSpec {
                addr: upper_addr,
                job: Some(9),
                rank: i,
                epoch: 41,
                slot_base: Some(0),
            };
            let mut spec = job(
                addrs[2 * usize::from(i)..2 * usize::from(i) + 2].to_vec(),
                None,
                Some(uplink),
            );
            spec.group = Some(group);
            switch(1, vec![spec])
        })
        .collect();
    let mut cfg = ina_switch::SwitchConfig::new(upper_addr);
    let mut upper_job = job(racks.iter().map(|r| r.addr).collect(), Some(41), None);
    upper_job.job = 9;
    upper_job.slot_base = 0;
    cfg.jobs = vec![upper_job];
    let upper = common::start(cfg);
    let results = run_workers(&racks, &addrs, |g, mut comm| {
        assert!(
            comm.job().group.is_some(),
            "the worker joined the rack's group"
        );
        let mut data: Vec<i32> = (0..6_400).map(|k| k * (g as i32 + 1)).collect();
        comm.allreduce_i32(&mut data).unwrap();
        data
    });
    for data in results {
        for (k, v) in data.iter().enumerate() {
            assert_eq!(*v, k as i32 * 10);
        }
    }
    let _ = upper.stop();
    for r in racks {
        let s = r.stop();
        // The tensor's 100 packets and its descriptor.
        assert_eq!(s.total.pipeline.totals_received, 101);
        assert_eq!(s.total.results_to_group, 101, "{s:?}");
        assert_eq!(s.total.results_to_workers, 0);
    }
}

#[test]
fn two_rack_switches_and_an_upper_switch_sum_exactly() {
    let addrs = free_addrs(4);
    // The racks' addresses are their listen addresses, known once bound: bind the racks
    // first with the upper switch's address reserved.
    let upper_addr = free_addrs(1)[0];
    let racks: Vec<_> = (0..2)
        .map(|i| {
            let uplink = UplinkSpec {
                addr: upper_addr,
                job: None,
                rank: i as u8,
                epoch: 31,
                slot_base: None,
            };
            switch(
                2,
                vec![job(addrs[2 * i..2 * i + 2].to_vec(), None, Some(uplink))],
            )
        })
        .collect();
    let mut cfg = ina_switch::SwitchConfig::new(upper_addr);
    cfg.jobs = vec![job(racks.iter().map(|r| r.addr).collect(), Some(31), None)];
    let upper = common::start(cfg);
    let results = run_workers(&racks, &addrs, |g, mut comm| {
        let mut data: Vec<i32> = (0..10_000).map(|k| k * (g as i32 + 1)).collect();
        comm.allreduce_i32(&mut data).unwrap();
        let mut floats: Vec<f32> = (0..5_000)
            .map(|k| k as f32 * 0.25 * (g as f32 + 1.0))
            .collect();
        comm.allreduce_f32(&mut floats).unwrap();
        (data, floats)
    });
    for (data, floats) in results {
        for (k, v) in data.iter().enumerate() {
            assert_eq!(*v, k as i32 * 10);
        }
        for (k, v) in floats.iter().enumerate() {
            let exact = k as f64 * 0.25 * 10.0;
            assert!(
                (f64::from(*v) - exact).abs() <= exact * 1e-6 + 1e-6,
                "{k}: {v}"
            );
        }
    }
    let upper = upper.stop();
    for r in racks {
        let s = r.stop();
        assert!(s.total.pipeline.partials_sent > 0);
        assert_eq!(
            s.total.pipeline.totals_received,
            s.total.pipeline.partials_sent
        );
    }
    assert_eq!(
        upper.total.pipeline.data_first,
        upper.total.pipeline.results_multicast
    );
}

#[test]
fn an_upper_slot_range_the_shards_cannot_serve_is_refused() {
    let addrs = free_addrs(3);
    let uplink = UplinkSpec {
        addr: addrs[2],
        job: Some(9),
        rank: 0,
        epoch: 1,
        // 64 slots off, with 2 shards of 64-slot blocks: totals would reach the other shard.
        slot_base: Some(192),
    };
    let rack = switch(2, vec![]);
    let err = rack
        .handle
        .add_job(job(addrs[..2].to_vec(), None, Some(uplink)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("multiple of 128 apart"), "{err}");
    rack.stop();
}
