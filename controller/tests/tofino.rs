//! The Tofino driver: the controller keeps the switch's BfRt entries in one document, which
//! follows every job created, resized and deleted, and from which a restarted controller reads
//! what the switch holds.
#![allow(clippy::unwrap_used)]

use ina_controller::alloc::Policy;
use ina_controller::api::{JobRequest, P4Host, P4Spec, SwitchKind, SwitchSpec};
use ina_controller::driver::tofino::BfrtDocument;
use ina_controller::service::{drivers_with, Controller, LocalDrivers};
use ina_controller::store::Store;
use ina_switch_p4::runtime::{L2Entry, MacAddr, SwitchDesc};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ina-tofino-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn host(i: u8) -> (Ipv4Addr, MacAddr) {
    (
        Ipv4Addr::new(198, 18, 1, i + 1),
        MacAddr([2, 0, 0, 0, 1, i]),
    )
}

/// The switch `tofino`, whose document the controller writes to `tofino.json` in the Tofino
/// directory it is given ([`local`]).
fn spec() -> SwitchSpec {
    let ip = Ipv4Addr::new(198, 18, 0, 100);
    SwitchSpec {
        name: "tofino".into(),
        kind: SwitchKind::Tofino,
        control: "127.0.0.1:50052".parse().unwrap(),
        data: SocketAddr::from((ip, ina_wire::agg::UDP_PORT)),
        slots: 1024,
        elems_per_slot: 64,
        place: Default::default(),
        token: None,
        p4: Some(P4Spec {
            switch: SwitchDesc {
                mac: MacAddr([2, 0, 0, 0, 0, 0x64]),
                ip,
                ports: (0..8).collect(),
                l2: (0..8)
                    .map(|i| L2Entry {
                        mac: host(i).1,
                        port: u16::from(i),
                    })
                    .collect(),
                flood_mgrp: 0xffff,
                gap_reports: true,
            },
            hosts: (0..8)
                .map(|i| P4Host {
                    ip: host(i).0,
                    mac: host(i).1,
                })
                .collect(),
        }),
    }
}

fn job(name: &str, ranks: std::ops::Range<u8>, window: u16) -> JobRequest {
    JobRequest {
        name: name.into(),
        workers: ranks.map(|i| SocketAddr::from((host(i).0, 9000))).collect(),
        size: None,
        elems_per_packet: 64,
        window,
        min_window: Some(64),
        priority: 0,
        switch: None,
        heartbeat_ms: None,
    }
}

fn document(path: &Path) -> BfrtDocument {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The `pipe.InaIngress.ina_job` entries of the document: (job, epoch, slot base, count).
fn job_entries(doc: &BfrtDocument) -> Vec<(u64, u64, u64, u64)> {
    doc.bfrt["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["table"] == "pipe.InaIngress.ina_job")
        .map(|e| {
            let d = &e["data"];
            (
                e["key"]["hdr.ina.job"].as_u64().unwrap(),
                d["epoch"].as_u64().unwrap(),
                d["slot_base"].as_u64().unwrap(),
                d["slot_count"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Drivers that keep the Tofino documents in `dir`.
fn local(dir: &Path) -> ina_controller::service::DriverFactory {
    drivers_with(LocalDrivers {
        tofino_dir: dir.to_path_buf(),
        ..LocalDrivers::default()
    })
}

#[test]
fn the_bfrt_document_follows_the_jobs_and_survives_a_restart() {
    let d = dir("follow");
    let bfrt = d.join("tofino.json");
    let c = Controller::open(
        Policy::FairShare,
        Some(Store::open(&d.join("state")).unwrap()),
        local(&d),
    )
    .unwrap();
    c.add_switch(spec()).unwrap();
    // Added, it holds the switch's own entries and no job.
    let doc = document(&bfrt);
    assert!(doc.jobs.is_empty());
    assert!(job_entries(&doc).is_empty());
    let a = c.create_job(job("a", 0..4, 1024)).unwrap();
    assert_eq!(a.slots.unwrap().count, 1024);
    // A second job halves the first one's share (fair share): the document holds both, with
    // the controller's slots and epochs, and ranges that do not overlap.
    let b = c.create_job(job("b", 4..8, 1024)).unwrap();
    let a = c.job("a").unwrap();
    let doc = document(&bfrt);
    let held = job_entries(&doc);
    let want = |j: &ina_controller::api::JobStatus| {
        let s = j.slots.unwrap();
        (
            u64::from(j.id),
            u64::from(j.epoch.unwrap()),
            u64::from(s.base),
            u64::from(s.count),
        )
    };
    assert_eq!(held, vec![want(&a), want(&b)]);
    assert_eq!(a.slots.unwrap().count + b.slots.unwrap().count, 1024);
    let (ra, rb) = (a.slots.unwrap(), b.slots.unwrap());
    assert!(ra.end() <= u32::from(rb.base) || rb.end() <= u32::from(ra.base));
    // Each rank is bound to its host's port and address.
    let ranks: Vec<_> = doc.bfrt["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["table"] == "pipe.InaIngress.rank_source" && e["key"]["hdr.ina.job"] == b.id)
        .map(|e| {
            (
                e["key"]["hdr.ina.rank"].as_u64().unwrap(),
                e["key"]["ig_intr_md.ingress_port"].as_u64().unwrap(),
                e["key"]["hdr.ipv4.src_addr"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(ranks.len(), 4);
    for (rank, port, ip) in ranks {
        assert_eq!(port, rank + 4);
        assert_eq!(ip, host(rank as u8 + 4).0.to_string());
    }
    // A restarted controller reads what the switch holds from the document and changes
    // nothing.
    drop(c);
    let c = Controller::open(
        Policy::FairShare,
        Some(Store::open(&d.join("state")).unwrap()),
        local(&d),
    )
    .unwrap();
    let failed = c.resync(
        std::time::Instant::now(),
        std::time::Duration::from_millis(100),
    );
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(job_entries(&document(&bfrt)), held);
    // Deleting a job takes its entries out; the other grows back to its window.
    c.delete_job("a").unwrap();
    let b = c.job("b").unwrap();
    assert_eq!(job_entries(&document(&bfrt)), vec![want(&b)]);
    assert_eq!(b.slots.unwrap().count, 1024);
    // The Tofino program aggregates 64 elements per packet: a wider job is refused when it
    // is created, with the reason.
    let mut wide = job("wide", 0..2, 64);
    wide.elems_per_packet = 256;
    let e = c.create_job(wide).unwrap_err().to_string();
    assert!(
        e.contains("elements per packet") || e.contains("elements per slot"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_tofino_switch_without_its_description_or_a_stranger_worker_is_refused() {
    let d = dir("refuse");
    let c = Controller::open(Policy::FirstFit, None, local(&d)).unwrap();
    let mut s = spec();
    s.p4 = None;
    let e = c.add_switch(s).unwrap_err().to_string();
    assert!(e.contains("needs its p4 description"), "{e}");
    c.add_switch(spec()).unwrap();
    let mut j = job("j", 0..2, 64);
    j.workers[1] = "198.18.9.9:9000".parse().unwrap();
    let e = c.create_job(j).unwrap_err().to_string();
    assert!(
        e.contains("198.18.9.9 is not one of the switch's hosts"),
        "{e}"
    );
    assert!(c.job("j").is_err(), "a refused job is not kept");
    assert!(c.jobs().is_empty());
    let _ = std::fs::remove_dir_all(&d);
}

/// A software rack switch under the Tofino `tofino`, its hosts 198.18.{20+i}.1, seen from
/// above at `up`; its control endpoint answers nothing (the test needs only the Tofino's
/// document).
fn rack(i: u8, up: SocketAddr) -> SwitchSpec {
    let mut s = SwitchSpec::software(
        &format!("tor{i}"),
        SocketAddr::from(([127, 0, 0, 1], 1 + u16::from(i))),
        SocketAddr::from(([127, 0, 0, 1], 18766)),
        1024,
        256,
    );
    s.place = ina_controller::api::Place::Rack {
        rack: format!("r{i}"),
        hosts: vec![std::net::IpAddr::V4(Ipv4Addr::new(198, 18, 20 + i, 1))],
        under: Some("tofino".into()),
        up_data: Some(up),
    };
    s
}

#[test]
fn a_tree_under_a_p4_switch_that_would_refuse_a_rack_is_not_placed() {
    let d = dir("tree");
    let bfrt = d.join("tofino.json");
    let c = Controller::open(Policy::FirstFit, None, local(&d)).unwrap();
    let mut upper = spec();
    upper.place = ina_controller::api::Place::Upper { under: None };
    c.add_switch(upper).unwrap();
    // tor1 is seen from above at an address that is not one of the Tofino's hosts.
    let ups = [
        SocketAddr::from((host(1).0, 18766)),
        "198.19.9.9:18766".parse().unwrap(),
        SocketAddr::from((host(2).0, 18766)),
    ];
    for (i, up) in ups.iter().enumerate() {
        // (Added, but unreachable: the controller says so and keeps it.)
        let _ = c.add_switch(rack(i as u8, *up));
    }
    let worker = |i: u8, port: u16| SocketAddr::from((Ipv4Addr::new(198, 18, 20 + i, 1), port));
    let join = |name: &str, addr: SocketAddr| {
        c.join(
            name,
            ina_controller::api::JoinRequest {
                rank: None,
                addr,
                instance: Some(1),
            },
        )
    };
    let tree = |name: &str| JobRequest {
        workers: Vec::new(),
        size: Some(2),
        ..job(name, 0..0, 64)
    };
    c.create_job(tree("t")).unwrap();
    join("t", worker(0, 9000)).unwrap();
    let e = join("t", worker(1, 9000)).unwrap_err().to_string();
    assert!(
        e.contains("upper switch \"tofino\" refuses a rack switch")
            && e.contains("198.19.9.9 is not one of the switch's hosts"),
        "{e}"
    );
    let t = c.job("t").unwrap();
    assert_eq!((t.switch.as_str(), t.members.len()), ("", 1), "{t:?}");
    // Racks whose addresses the Tofino knows: the tree is placed, and the Tofino's document
    // holds the upper job, its ranks the two rack switches.
    c.create_job(tree("u")).unwrap();
    join("u", worker(0, 9001)).unwrap();
    // (The rack switches are unreachable: the join reports it, the tree is placed.)
    let _ = join("u", worker(2, 9001));
    let u = c.job("u").unwrap();
    assert_eq!((u.switch.as_str(), u.racks.len()), ("tofino", 2), "{u:?}");
    let doc = document(&bfrt);
    assert!(
        job_entries(&doc).iter().any(|e| e.0 == u64::from(u.id)),
        "{:?}",
        job_entries(&doc)
    );
    let held = doc.jobs.iter().find(|j| j.id == u.id).unwrap();
    let ports: Vec<u16> = held.ranks.iter().map(|r| r.port).collect();
    assert_eq!(ports, [1, 2]);
}
