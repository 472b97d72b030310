//! The packet rate of bmv2 running the v1model program (not a conformance check: run with
//! `cargo test -p ina-conformance --test rate -- --ignored --nocapture`, as root).

use ina_conformance::bmv2::{environment, Bmv2Target};
use ina_conformance::frames::{Context, InaSpec, Kind};
use ina_conformance::scenario::{default_switch, FrameSpec, ScenarioJob, Send};
use ina_conformance::Target;
use std::time::{Duration, Instant};

#[test]
#[ignore = "a measurement, not a check"]
fn bmv2_packet_rate() {
    if let Err(why) = environment() {
        panic!("the measurement cannot run here: {why}");
    }
    let mut t = Bmv2Target::new(4).expect("bmv2 target");
    t.set_quiet(Duration::from_millis(1));
    let sw = default_switch();
    for elems in [64u16, 256] {
        let job = ScenarioJob {
            id: 1,
            epoch: 1,
            slot_base: 0,
            slot_count: 64,
            elems,
            mgrp: None,
            workers: Some(2),
            ranks: None,
            uplink: None,
        }
        .desc(&sw);
        t.configure(&sw, std::slice::from_ref(&job))
            .expect("configure");
        let ctx = Context {
            switch: &sw,
            jobs: std::slice::from_ref(&job),
        };
        let batches = 20u32;
        let uses = 32u32;
        let mut frames = Vec::new();
        for b in 0..batches {
            let mut batch = Vec::new();
            for u in 0..uses {
                for rank in 0..2u8 {
                    let spec = InaSpec {
                        job: 1,
                        rank,
                        kind: Kind::Name("data".into()),
                        slot: u as u16,
                        set: (b % 2) as u8,
                        seq: 1 + b * uses + u,
                        count: Some(elems),
                        values: Some(vec![1]),
                        ..InaSpec::default()
                    };
                    let send = Send {
                        port: None,
                        frame: FrameSpec {
                            ina: Some(spec),
                            ..FrameSpec::default()
                        },
                    };
                    batch.push(ctx.sent(&send).expect("frame"));
                }
            }
            frames.push(batch);
        }
        let start = Instant::now();
        let mut received = 0;
        for batch in &frames {
            for (port, f) in batch {
                t.send(*port, f).expect("send");
            }
            // Every use's result to both ranks.
            received += t
                .collect(batch.len(), Duration::from_secs(10))
                .expect("collect")
                .len();
        }
        let secs = start.elapsed().as_secs_f64();
        let sent = frames.iter().map(Vec::len).sum::<usize>();
        eprintln!(
            "bmv2, {elems} elements: {sent} data frames in, {received} results out in {secs:.2} s: {:.0} frames/s in",
            sent as f64 / secs
        );
        assert_eq!(received, sent);
    }
}
