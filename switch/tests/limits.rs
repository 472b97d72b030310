//! What the switch says about jobs it cannot serve, and how it counts what it sends.
#![allow(clippy::unwrap_used)]

use ina_switch::{JobSpec, Switch, SwitchConfig};
use std::net::SocketAddr;

fn job(elems: u16, workers: Vec<SocketAddr>) -> JobSpec {
    JobSpec {
        job: 9,
        epoch: None,
        slot_base: 0,
        slot_count: 8,
        elems_per_packet: elems,
        workers,
        group: None,
    }
}

/// A job with more elements per packet than the switch's `max_elems` is refused with the
/// value it would need, whether it comes at start or through the control plane.
#[test]
fn a_job_beyond_max_elems_is_refused_naming_the_setting() {
    let worker: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut cfg = SwitchConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.jobs = vec![job(2048, vec![worker])];
    let e = Switch::bind(cfg).unwrap_err().to_string();
    assert!(e.contains("max_elems of 256"), "{e}");
    assert!(e.contains("--max-elems 2048 or more"), "{e}");

    let sw = Switch::bind(SwitchConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
    let e = sw
        .handle()
        .add_job(job(512, vec![worker]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("--max-elems 512 or more"), "{e}");
    sw.handle().add_job(job(256, vec![worker])).unwrap();
}
