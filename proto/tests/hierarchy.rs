//! Hierarchical aggregation in the model: rack switches that send their partial sums, as one
//! rank each, to an upper switch, and multicast the totals that come back (PROTOCOL.md §9).
//! Real worker streams run over a network of rounds in which every hop (worker to rack, rack
//! to upper, and back) may lose, duplicate and delay packets.
#![allow(clippy::unwrap_used)]

use ina_proto::pipeline::{
    DropReason, JobConfig, Pipeline, PipelineConfig, PortId, Uplink, Verdict, AWAITING_TOTAL,
    DATA_REPORT_COPIES,
};
use ina_proto::rtt::{RtoConfig, RttEstimator};
use ina_proto::stream::{Lane, Stream, StreamConfig, Tensor};
use ina_proto::Instant;
use ina_wire::{AggRepr, MessageType, QueryAsk};
use proptest::prelude::*;
use std::time::Duration;

/// The uses of a slot a stream of `packets` data packets makes: its descriptor's and theirs.
fn uses(packets: usize) -> u64 {
    packets as u64 + ina_proto::stream::DESCRIPTOR_PACKETS
}

const ROUND: Duration = Duration::from_micros(10);
const ELEMS: u16 = 4;
/// The job's id on the upper switch (the racks' job is 7).
const UPPER_JOB: u16 = 9;
/// The upper switch's port towards rack `r` is `PortId(r)`; a rack's port towards the upper
/// switch is `UPLINK`, towards its worker `i` `PortId(i)`.
const UPLINK: PortId = PortId(100);

/// splitmix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 1.0 < p
    }
}

#[derive(Debug, Clone, Copy)]
struct Faults {
    loss: f64,
    duplicate: f64,
    /// Probability that a packet takes 1-3 rounds more.
    delay: f64,
}

struct Tree {
    racks: Vec<Pipeline>,
    upper: Pipeline,
}

fn rack_job(rack: usize, workers: usize, window: u16, upper_slot_base: u16) -> JobConfig {
    JobConfig {
        job: 7,
        epoch: 3,
        slot_base: 0,
        slot_count: window,
        elems_per_packet: ELEMS,
        ranks: (0..workers).map(|i| PortId(i as u16)).collect(),
        uplink: Some(Uplink {
            port: UPLINK,
            job: UPPER_JOB,
            epoch: 11,
            rank: rack as u8,
            slot_base: upper_slot_base,
        }),
    }
}

fn tree(racks: usize, per_rack: usize, window: u16) -> Tree {
    let cfg = PipelineConfig {
        pool_slots: 256,
        max_elems: 64,
    };
    // The upper switch holds the job at other slots than the racks: the uplink maps them.
    let upper_base = 40;
    let mut upper = Pipeline::new(cfg);
    upper
        .add_job(JobConfig {
            job: UPPER_JOB,
            epoch: 11,
            slot_base: upper_base,
            slot_count: window,
            elems_per_packet: ELEMS,
            ranks: (0..racks).map(|r| PortId(r as u16)).collect(),
            uplink: None,
        })
        .unwrap();
    let racks = (0..racks)
        .map(|r| {
            let mut p = Pipeline::new(cfg);
            p.set_gap_reports(true);
            p.add_job(rack_job(r, per_rack, window, upper_base))
                .unwrap();
            p
        })
        .collect();
    Tree { racks, upper }
}

/// Checks every worker's tensor: element `k` of the sum of `total` workers is
/// `k * total (total + 1) / 2`.
fn assert_exact(tensors: &[Vec<i32>], total: usize) {
    let weight = (total * (total + 1) / 2) as i32;
    for (w, tensor) in tensors.iter().enumerate() {
        for (k, v) in tensor.iter().enumerate() {
            assert_eq!(
                *v,
                (k as i32).wrapping_mul(weight),
                "worker {w} element {k}"
            );
        }
    }
}

/// Runs `racks` racks of `per_rack` workers under one upper switch (see [`run_any`]).
fn run(
    racks: usize,
    per_rack: usize,
    packets: usize,
    window: u16,
    faults: Faults,
    seed: u64,
) -> AnyTree {
    let (tensors, tree) = run_any(&[per_rack, racks], packets, (window, 40), faults, seed);
    assert_exact(&tensors, racks * per_rack);
    tree
}

#[test]
fn two_racks_sum_through_the_upper_switch_without_loss() {
    let (racks, per_rack, packets, window) = (2, 3, 40, 8);
    let ran = run(
        racks,
        per_rack,
        packets,
        window,
        Faults {
            loss: 0.0,
            duplicate: 0.0,
            delay: 0.0,
        },
        1,
    );
    let upper = ran.switches[0].counters();
    // Every use is completed once on the upper switch, from one partial per rack.
    assert_eq!(upper.results_multicast, uses(packets));
    assert_eq!(
        upper.data_first + upper.data_added,
        uses(packets) * racks as u64
    );
    for rack in &ran.switches[1..] {
        let c = rack.counters();
        assert_eq!(c.partials_sent, uses(packets));
        assert_eq!(c.totals_received, uses(packets));
        assert_eq!(c.partials_resent, 0);
        assert_eq!(c.data_first + c.data_added, uses(packets) * per_rack as u64);
    }
}

#[test]
fn losses_between_the_switches_are_repaired_by_the_workers_retransmissions() {
    let (racks, per_rack, packets, window) = (3, 4, 200, 8);
    let ran = run(
        racks,
        per_rack,
        packets,
        window,
        Faults {
            loss: 0.1,
            duplicate: 0.05,
            delay: 0.1,
        },
        7,
    );
    let resent: u64 = ran.switches[1..]
        .iter()
        .map(|r| r.counters().partials_resent)
        .sum();
    let pending = ran.switches[0].counters().pending_sent;
    let fetched: u64 = ran.switches[1..]
        .iter()
        .map(|r| r.counters().partials_for_fetch)
        .sum();
    // Partials and totals were lost on the way up and down, and workers' retransmissions sent
    // them again: a Query up found a partial missing, and rank 0's fetching at the end of its
    // stream sent partials up as its ask; the upper switch answered some asks with Pending.
    assert!(resent > 0, "no partial was sent again");
    assert!(fetched > 0, "no partial went up as a fetch");
    assert!(pending > 0, "no Pending came down");
    assert_eq!(ran.switches[0].counters().results_multicast, uses(packets));
    assert!(
        ran.switches[0].counters().results_unicast > 0,
        "no total was sent again"
    );
}

fn parse(b: &[u8]) -> AggRepr {
    AggRepr::parse(&ina_wire::AggPacket::new_checked(b).unwrap()).unwrap()
}

/// `packet` in on `port` of `p`: it must be answered with one packet to one port; that port
/// and the answer's bytes.
fn unicast(p: &mut Pipeline, port: PortId, packet: &[u8]) -> (PortId, Vec<u8>) {
    let mut out = vec![0u8; 2048];
    match p.process(port, packet, Instant::ZERO, &mut out) {
        Verdict::Unicast { port, len } => (port, out[..len].to_vec()),
        v => panic!("one packet out expected, got {v:?}"),
    }
}

/// `packet` in on `port` of a rack switch: it must send a Query up; the Query.
fn query_up(rack: &mut Pipeline, port: PortId, packet: &[u8]) -> Vec<u8> {
    let (to, q) = unicast(rack, port, packet);
    assert_eq!((to, q.len()), (UPLINK, 16));
    assert_eq!(parse(&q).kind, MessageType::Query);
    q
}

/// `from_upper` in on the rack switch's uplink port: it must go on to rank 0 as a Pending with
/// `bitmap`; its header.
fn rank0_told(rack: &mut Pipeline, from_upper: &[u8], bitmap: u32) -> AggRepr {
    let mut out = vec![0u8; 2048];
    let v = rack.process(UPLINK, from_upper, Instant::ZERO, &mut out);
    let Verdict::Unicast {
        port: PortId(0),
        len,
    } = v
    else {
        panic!("rank 0 gets a Pending, got {v:?}")
    };
    let told = parse(&out[..len]);
    assert_eq!(told.kind, MessageType::Pending);
    assert_eq!(out[16..20], bitmap.to_be_bytes());
    told
}

#[test]
fn a_rack_waits_for_the_total_and_answers_with_it() {
    // One rack of two workers, driven by hand: the partial goes up and is lost; rank 0's
    // retransmission asks the upper switch, whose answer sends the partial again; the total
    // is lost on the way down, and rank 0's Query fetches it through the rack switch; it is
    // multicast once, and a late copy of it is dropped.
    let mut t = tree(2, 2, 4);
    let now = Instant::ZERO;
    let mut out = vec![0u8; 2048];
    let data = |rank: u8, v: i32| {
        let repr = AggRepr {
            kind: MessageType::Data,
            set: 0,
            gap: None,
            job: 7,
            epoch: 3,
            rank,
            exponent: 0x7f,
            slot: 1,
            count: ELEMS,
            seq: 5,
        };
        let mut b = vec![0u8; repr.buffer_len()];
        let mut pkt = repr.emit_into(&mut b).unwrap();
        for (k, c) in pkt.payload_mut().chunks_exact_mut(4).enumerate() {
            c.copy_from_slice(&(v + k as i32).to_be_bytes());
        }
        b
    };
    let rack = &mut t.racks[0];
    assert_eq!(
        rack.process(PortId(0), &data(0, 10), now, &mut out),
        Verdict::Absorbed
    );
    let v = rack.process(PortId(1), &data(1, 20), now, &mut out);
    let Verdict::Unicast { port, len } = v else {
        panic!("the partial goes up, got {v:?}")
    };
    assert_eq!(port, UPLINK);
    let partial = out[..len].to_vec();
    let h = AggRepr::parse(&ina_wire::AggPacket::new_checked(&partial[..]).unwrap()).unwrap();
    assert_eq!(
        (h.kind, h.job, h.epoch, h.rank, h.slot, h.seq),
        (MessageType::Data, UPPER_JOB, 11, 0, 41, 5)
    );
    assert_eq!(h.gap, None);
    assert_eq!(rack.registers().slots()[1].count[0], AWAITING_TOTAL);
    // Rank 0's retransmission now: a status Query to the upper switch, nothing to the
    // worker.
    let v = rack.process(PortId(0), &data(0, 10), now, &mut out);
    let Verdict::Unicast { port: UPLINK, len } = v else {
        panic!("rank 0's retransmission asks the upper switch, got {v:?}")
    };
    let ask = out[..len].to_vec();
    let h = parse(&ask);
    assert_eq!(
        (h.kind, h.job, h.epoch, h.rank, h.slot, h.seq, h.set, h.exponent, h.count),
        (MessageType::Query, UPPER_JOB, 11, 0, 41, 5, 0, 0, 0)
    );
    assert_eq!(rack.counters().queries_up, 1);
    // Rank 1's retransmission: a Pending that shows both ranks held (only rank 0's asking
    // reaches the upper switch).
    let v = rack.process(PortId(1), &data(1, 20), now, &mut out);
    let Verdict::Unicast {
        port: PortId(1),
        len,
    } = v
    else {
        panic!("rank 1 gets a Pending, got {v:?}")
    };
    assert_eq!(parse(&out[..len]).kind, MessageType::Pending);
    assert_eq!(out[16..20], 0b11u32.to_be_bytes());
    assert_eq!(rack.counters().queries_up, 1);
    // The partial was lost: the upper switch has not seen the use and says so; the rack
    // switch sends the partial again.
    let v = t.upper.process(PortId(0), &ask, now, &mut out);
    let Verdict::Unicast {
        port: PortId(0),
        len,
    } = v
    else {
        panic!("the upper switch answers the Query, got {v:?}")
    };
    let answer = out[..len].to_vec();
    assert_eq!(parse(&answer).kind, MessageType::Pending);
    assert_eq!(answer[16..20], 0u32.to_be_bytes());
    let rack = &mut t.racks[0];
    let v = rack.process(UPLINK, &answer, now, &mut out);
    assert!(matches!(v, Verdict::Unicast { port: UPLINK, .. }), "{v:?}");
    assert_eq!(out[..partial.len()], partial[..]);
    assert_eq!(rack.counters().partials_resent, 1);
    // The upper switch takes it; rank 0's status Query asks again, and the upper switch's
    // Pending now holds this rack: rank 0 is told that the use waits (every rank here held).
    let query = |exponent: u8| {
        let repr = AggRepr {
            kind: MessageType::Query,
            set: 0,
            gap: None,
            job: 7,
            epoch: 3,
            rank: 0,
            exponent,
            slot: 1,
            count: 0,
            seq: 5,
        };
        let mut b = vec![0u8; repr.buffer_len()];
        repr.emit_into(&mut b).unwrap();
        b
    };
    let upper = &mut t.upper;
    assert_eq!(
        upper.process(PortId(0), &partial, now, &mut out),
        Verdict::Absorbed
    );
    assert_eq!(query_up(&mut t.racks[0], PortId(0), &query(0)), ask);
    let (_, answer) = unicast(&mut t.upper, PortId(0), &ask);
    assert_eq!(answer[16..20], 0b01u32.to_be_bytes());
    let rack = &mut t.racks[0];
    let told = rank0_told(rack, &answer, 0b11);
    assert_eq!(
        (told.job, told.epoch, told.rank, told.slot, told.seq),
        (7, 3, 0, 1, 5)
    );
    assert_eq!(rack.counters().partials_resent, 1);
    // The other rack's partial completes the use up there; its total is lost on the way down.
    let mut other = partial.clone();
    {
        let mut pkt = ina_wire::AggPacket::new_unchecked(&mut other[..]);
        pkt.set_rank(1);
    }
    let v = t.upper.process(PortId(1), &other, now, &mut out);
    let Verdict::Multicast { len, .. } = v else {
        panic!("the upper switch completes the use, got {v:?}")
    };
    let total = out[..len].to_vec();
    // Rank 0 asks again: the upper switch's answer to the status Query is the total's header
    // alone, so the rack switch fetches the total, which comes down and is multicast.
    assert_eq!(query_up(&mut t.racks[0], PortId(0), &query(0)), ask);
    let (_, complete) = unicast(&mut t.upper, PortId(0), &ask);
    assert_eq!(complete.len(), 16, "a status answer is the header alone");
    assert_eq!(parse(&complete).kind, MessageType::Result);
    let rack = &mut t.racks[0];
    let fetch = query_up(rack, UPLINK, &complete);
    assert_eq!(parse(&fetch).exponent, 1);
    assert_eq!(rack.counters().queries_up, 4);
    let v = t.upper.process(PortId(0), &fetch, now, &mut out);
    let Verdict::Unicast { len, .. } = v else {
        panic!("the fetching Query brings the total, got {v:?}")
    };
    assert_eq!(out[16..len], total[16..]);
    let total = out[..len].to_vec();
    let rack = &mut t.racks[0];
    let v = rack.process(UPLINK, &total, now, &mut out);
    let Verdict::Multicast { ports, len } = v else {
        panic!("the total goes down, got {v:?}")
    };
    assert_eq!(ports, &[PortId(0), PortId(1)]);
    let down = AggRepr::parse(&ina_wire::AggPacket::new_checked(&out[..len]).unwrap()).unwrap();
    assert_eq!(
        (down.kind, down.job, down.epoch, down.slot, down.seq),
        (MessageType::Result, 7, 3, 1, 5)
    );
    let sums: Vec<i32> = out[16..len]
        .chunks_exact(4)
        .map(|c| i32::from_be_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(sums, vec![60, 64, 68, 72]);
    assert_eq!(rack.registers().slots()[1].count[0], 0);
    // A copy of the total: dropped. A worker's retransmission: the stored total.
    assert_eq!(
        rack.process(UPLINK, &total, now, &mut out),
        Verdict::Drop(DropReason::Duplicate)
    );
    assert!(matches!(
        rack.process(PortId(1), &data(1, 20), now, &mut out),
        Verdict::Unicast {
            port: PortId(1),
            ..
        }
    ));
    assert_eq!(out[16..len], total[16..len]);
    // The upper switch's packets on a rank's port, or of another job, are not totals.
    assert_eq!(
        rack.process(PortId(0), &total, now, &mut out),
        Verdict::Drop(DropReason::UnexpectedType)
    );
    assert_eq!(rack.counters().totals_received, 1);
}

#[test]
fn an_upper_switch_that_refuses_tells_rank_0_through_a_pending() {
    // The upper switch runs the job under another epoch: it refuses the partial and rank 0's
    // Query. The rack switch counts each Reject, and answers rank 0's ask with the local
    // Pending (every rank held), so that the worker's error points past the rack switch.
    let mut t = tree(1, 2, 4);
    let now = Instant::ZERO;
    let mut out = vec![0u8; 2048];
    let mut upper = Pipeline::new(PipelineConfig {
        pool_slots: 256,
        max_elems: 64,
    });
    upper
        .add_job(JobConfig {
            job: UPPER_JOB,
            epoch: 12,
            slot_base: 40,
            slot_count: 4,
            elems_per_packet: ELEMS,
            ranks: vec![PortId(0)],
            uplink: None,
        })
        .unwrap();
    let data = |rank: u8| {
        let repr = AggRepr {
            kind: MessageType::Data,
            set: 1,
            gap: None,
            job: 7,
            epoch: 3,
            rank,
            exponent: 0x7f,
            slot: 2,
            count: ELEMS,
            seq: 6,
        };
        let mut b = vec![0u8; repr.buffer_len()];
        repr.emit_into(&mut b).unwrap();
        b
    };
    let rack = &mut t.racks[0];
    rack.process(PortId(0), &data(0), now, &mut out);
    let Verdict::Unicast { port: UPLINK, len } = rack.process(PortId(1), &data(1), now, &mut out)
    else {
        panic!("no partial")
    };
    let partial = out[..len].to_vec();
    let Verdict::Unicast { len, .. } = upper.process(PortId(0), &partial, now, &mut out) else {
        panic!("no Reject")
    };
    let reject = out[..len].to_vec();
    assert_eq!(parse(&reject).kind, MessageType::Reject);
    // The Reject of the partial: rank 0 is told the use waits.
    let rack = &mut t.racks[0];
    let told = rank0_told(rack, &reject, 0b11);
    assert_eq!(
        (told.job, told.epoch, told.rank, told.slot, told.seq, told.set),
        (7, 3, 0, 2, 6, 1)
    );
    assert_eq!(rack.counters().upstream_rejects, 1);
    assert_eq!(rack.counters().pending_sent, 0);
    // A Reject of another use (or after the total came down) goes no further.
    let mut stale = reject.clone();
    ina_wire::AggPacket::new_unchecked(&mut stale[..]).set_seq(5);
    assert_eq!(
        rack.process(UPLINK, &stale, now, &mut out),
        Verdict::Absorbed
    );
    assert_eq!(rack.counters().upstream_rejects, 2);
}

#[test]
fn an_uplink_port_that_serves_a_rank_is_refused() {
    let mut p = Pipeline::new(PipelineConfig::default());
    let mut job = rack_job(0, 2, 4, 0);
    job.uplink.as_mut().unwrap().port = PortId(1);
    assert_eq!(
        p.add_job(job).unwrap_err(),
        ina_proto::pipeline::JobError::UplinkIsRank(PortId(1))
    );
    let mut a = rack_job(0, 2, 4, 0);
    let mut b = rack_job(0, 2, 4, 0);
    b.job = 8;
    b.slot_base = 8;
    a.uplink.as_mut().unwrap().port = PortId(50);
    b.uplink.as_mut().unwrap().port = PortId(50);
    p.add_job(a).unwrap();
    assert!(matches!(
        p.add_job(b),
        Err(ina_proto::pipeline::JobError::UplinkShared { other: 7, .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever every hop loses, duplicates or delays: every worker ends with the exact total,
    /// and the upper switch completes every use exactly once.
    #[test]
    fn exact_totals_under_loss_duplication_and_delay_on_every_hop(
        racks in 1usize..=4,
        per_rack in 1usize..=4,
        packets in 1usize..60,
        window in 1u16..=8,
        loss in 0.0f64..0.2,
        duplicate in 0.0f64..0.1,
        delay in 0.0f64..0.2,
        seed in any::<u64>(),
    ) {
        let ran = run(racks, per_rack, packets, window, Faults { loss, duplicate, delay }, seed);
        prop_assert_eq!(ran.switches[0].counters().results_multicast, uses(packets));
        for rack in &ran.switches[1..] {
            prop_assert_eq!(rack.counters().partials_sent, uses(packets));
            prop_assert_eq!(rack.counters().totals_received, uses(packets));
        }
    }

    /// The same with whole blocks of slots at every level, so that partial sums carry gap
    /// counters and the upper switch reports the lost ones (PROTOCOL.md §9): Missing reports
    /// that come late, twice, or for a use already repaired change no sum, and every use
    /// still completes exactly once up there.
    #[test]
    fn exact_totals_with_missing_reports_between_the_switches(
        racks in 1usize..=3,
        per_rack in 1usize..=3,
        packets in 1usize..300,
        loss in 0.0f64..0.2,
        duplicate in 0.0f64..0.1,
        delay in 0.0f64..0.2,
        seed in any::<u64>(),
    ) {
        let faults = Faults { loss, duplicate, delay };
        let (tensors, tree) = run_any(&[per_rack, racks], packets, (64, 64), faults, seed);
        assert_exact(&tensors, racks * per_rack);
        prop_assert_eq!(tree.switches[0].counters().results_multicast, uses(packets));
        for rack in &tree.switches[1..] {
            prop_assert_eq!(rack.counters().partials_sent, uses(packets));
            prop_assert_eq!(rack.counters().totals_received, uses(packets));
        }
    }
}

/// A tree of any depth: `fanout[0]` workers per rack switch, `fanout[1]` rack switches per
/// switch of the next level, and so on up to one top switch. The switches of level `l` (0:
/// the racks) hold the job as id `7 + l`, epoch `3 + l`, at slots `step * l ..`, so that every
/// uplink maps ids, epochs and slots; a switch reaches its parent through `UPLINK`, and child
/// `i` on `PortId(i)`. Switch 0 is the top. With `step` and the window multiples of 64, every
/// level's slots are whole blocks of the gap register: workers and switches alike send gap
/// counters, and every switch answers gaps with Missing reports.
struct AnyTree {
    switches: Vec<Pipeline>,
    /// Per switch: its parent and its rank there.
    parent: Vec<Option<(usize, u8)>>,
    /// Per switch: its children, switches (`Ok`) or workers (`Err(global rank)`).
    children: Vec<Vec<Result<usize, usize>>>,
}

impl AnyTree {
    fn new(fanout: &[usize], window: u16, step: u16) -> AnyTree {
        let mut t = AnyTree {
            switches: Vec::new(),
            parent: Vec::new(),
            children: Vec::new(),
        };
        let mut next_worker = 0;
        t.build(fanout, window, step, None, &mut next_worker);
        t
    }

    /// Builds the subtree of a switch at the level `fanout.len() - 1`; returns its index.
    fn build(
        &mut self,
        fanout: &[usize],
        window: u16,
        step: u16,
        parent: Option<(usize, u8)>,
        next_worker: &mut usize,
    ) -> usize {
        let me = self.switches.len();
        let (&n, below) = fanout.split_last().unwrap();
        let level = below.len() as u16;
        let mut p = Pipeline::new(PipelineConfig {
            pool_slots: 256,
            max_elems: 64,
        });
        p.set_gap_reports(true);
        p.add_job(JobConfig {
            job: 7 + level,
            epoch: 3 + level,
            slot_base: step * level,
            slot_count: window,
            elems_per_packet: ELEMS,
            ranks: (0..n).map(|i| PortId(i as u16)).collect(),
            uplink: parent.map(|(_, rank)| Uplink {
                port: UPLINK,
                job: 8 + level,
                epoch: 4 + level,
                rank,
                slot_base: step * (level + 1),
            }),
        })
        .unwrap();
        self.switches.push(p);
        self.parent.push(parent);
        self.children.push(Vec::new());
        for i in 0..n {
            let child = if below.is_empty() {
                *next_worker += 1;
                Err(*next_worker - 1)
            } else {
                Ok(self.build(below, window, step, Some((me, i as u8)), next_worker))
            };
            self.children[me].push(child);
        }
        me
    }
}

/// Where a packet goes in an [`AnyTree`]: a switch with the port it arrives on, or a worker.
#[derive(Debug, Clone, Copy)]
enum To {
    Switch(usize, PortId),
    Worker(usize),
}

/// Runs every worker of the tree over `packets` packets of int32 through a window of `window`
/// slots, with `faults` on every hop; returns the tensors (element `k` of worker `w` is
/// `k * (w + 1)`) and the tree. The levels' slots start `step` apart (see [`AnyTree`]).
fn run_any(
    fanout: &[usize],
    packets: usize,
    (window, step): (u16, u16),
    faults: Faults,
    seed: u64,
) -> (Vec<Vec<i32>>, AnyTree) {
    let total: usize = fanout.iter().product();
    let mut tree = AnyTree::new(fanout, window, step);
    // Each worker's switch and rank there.
    let mut attach = vec![(0usize, 0u8); total];
    for (s, kids) in tree.children.iter().enumerate() {
        for (i, k) in kids.iter().enumerate() {
            if let Err(w) = k {
                attach[*w] = (s, i as u8);
            }
        }
    }
    let len = packets * usize::from(ELEMS);
    let mut tensors: Vec<Vec<i32>> = (0..total)
        .map(|w| {
            (0..len as i32)
                .map(|k| k.wrapping_mul(w as i32 + 1))
                .collect()
        })
        .collect();
    let rto = RtoConfig {
        initial: Duration::from_micros(200),
        min: Duration::from_micros(60),
        max: Duration::from_millis(5),
        granularity: Duration::from_micros(1),
    };
    let mut rng = Rng(seed);
    {
        let mut streams: Vec<Stream<'_>> = tensors
            .iter_mut()
            .enumerate()
            .map(|(w, t)| {
                let (s, rank) = attach[w];
                let cfg = StreamConfig {
                    job: 7,
                    epoch: 3,
                    rank,
                    workers: tree.children[s].len() as u8,
                    total_workers: total as u16,
                    elems_per_packet: ELEMS,
                    lane: Lane::new(0, window),
                    max_retries: 1000,
                    give_up: Duration::from_secs(10),
                    gap_reports: true,
                    rules: Default::default(),
                };
                Stream::new(cfg, Tensor::I32(t), RttEstimator::new(rto)).unwrap()
            })
            .collect();
        let mut flight: Vec<(usize, To, Vec<u8>)> = Vec::new();
        let (mut out, mut buf) = (vec![0u8; 2048], vec![0u8; 2048]);
        let mut done = false;
        for round in 0..400_000usize {
            let now = Instant::ZERO + ROUND * round as u32;
            let (due, rest): (Vec<_>, Vec<_>) = flight.drain(..).partition(|(at, ..)| *at <= round);
            flight = rest;
            let mut outputs: Vec<(To, Vec<u8>)> = Vec::new();
            for (_, to, bytes) in due {
                match to {
                    To::Worker(w) => streams[w].handle_datagram(now, &bytes),
                    To::Switch(s, port) => {
                        let v = tree.switches[s].process(port, &bytes, now, &mut out);
                        let dest = |p: PortId| {
                            if p == UPLINK {
                                let (up, rank) = tree.parent[s].unwrap();
                                To::Switch(up, PortId(rank.into()))
                            } else {
                                match tree.children[s][usize::from(p.0)] {
                                    Ok(child) => To::Switch(child, UPLINK),
                                    Err(w) => To::Worker(w),
                                }
                            }
                        };
                        match v {
                            Verdict::Unicast { port, len } => {
                                outputs.push((dest(port), out[..len].to_vec()))
                            }
                            Verdict::Multicast { ports, len } => {
                                for p in ports {
                                    outputs.push((dest(*p), out[..len].to_vec()));
                                }
                            }
                            Verdict::Absorbed | Verdict::Drop(_) => {}
                        }
                        if let Some(rep) = tree.switches[s].poll_report() {
                            for _ in 0..rep.copies {
                                outputs.push((dest(rep.port), rep.header.to_vec()));
                            }
                        }
                    }
                }
            }
            for (w, st) in streams.iter_mut().enumerate() {
                if st.poll_timeout().is_some_and(|at| at <= now) {
                    st.handle_timeout(now);
                }
                let (s, rank) = attach[w];
                while let Some(n) = st.poll_transmit(now, &mut buf).unwrap() {
                    outputs.push((To::Switch(s, PortId(rank.into())), buf[..n].to_vec()));
                }
            }
            for (to, bytes) in outputs {
                if rng.chance(faults.loss) {
                    continue;
                }
                let copies = if rng.chance(faults.duplicate) { 2 } else { 1 };
                for _ in 0..copies {
                    let extra = if rng.chance(faults.delay) {
                        1 + (rng.next() % 3) as usize
                    } else {
                        0
                    };
                    flight.push((round + 1 + extra, to, bytes.clone()));
                }
            }
            if streams.iter().all(|s| s.poll_outcome().is_some()) {
                for s in &streams {
                    assert!(
                        matches!(s.poll_outcome(), Some(Ok(_))),
                        "{:?}",
                        s.poll_outcome()
                    );
                }
                done = true;
                break;
            }
        }
        assert!(done, "the streams did not finish");
    }
    (tensors, tree)
}

#[test]
fn three_levels_compose_under_loss() {
    // 2 workers per rack, 3 racks per middle switch, 2 middle switches under the top: 12
    // workers, 9 switches, 5% loss on every hop.
    let (fanout, packets) = ([2, 3, 2], 80);
    for seed in 1..=3 {
        let faults = Faults {
            loss: 0.05,
            duplicate: 0.0,
            delay: 0.0,
        };
        let (tensors, tree) = run_any(&fanout, packets, (8, 40), faults, seed);
        assert_exact(&tensors, 12);
        let top = tree.switches[0].counters();
        assert_eq!(top.results_multicast, uses(packets), "seed {seed}");
        for (s, p) in tree.switches.iter().enumerate().skip(1) {
            let c = p.counters();
            assert_eq!(c.partials_sent, uses(packets), "seed {seed} switch {s}");
            assert_eq!(c.totals_received, uses(packets), "seed {seed} switch {s}");
        }
        let resent: u64 = tree
            .switches
            .iter()
            .map(|p| p.counters().partials_resent)
            .sum();
        assert!(
            resent > 0,
            "seed {seed}: no loss was repaired across the levels"
        );
    }
}

/// A tree of one rack of two workers under an upper switch, both on whole blocks of slots and
/// both answering gaps with Missing reports: the rack's job at slots 0..128, the upper's at
/// 64..192.
fn aligned_tree() -> Tree {
    let cfg = PipelineConfig {
        pool_slots: 256,
        max_elems: 64,
    };
    let mut upper = Pipeline::new(cfg);
    upper.set_gap_reports(true);
    upper
        .add_job(JobConfig {
            job: UPPER_JOB,
            epoch: 11,
            slot_base: 64,
            slot_count: 128,
            elems_per_packet: ELEMS,
            ranks: vec![PortId(0)],
            uplink: None,
        })
        .unwrap();
    let mut rack = Pipeline::new(cfg);
    rack.set_gap_reports(true);
    rack.add_job(rack_job(0, 2, 128, 64)).unwrap();
    Tree {
        racks: vec![rack],
        upper,
    }
}

/// Worker `rank`'s Data for `slot`, use `seq`, with element `k` equal to `v + k`.
fn data_packet(rank: u8, slot: u16, seq: u32, v: i32) -> Vec<u8> {
    let repr = AggRepr {
        kind: MessageType::Data,
        set: (seq % 2) as u8,
        gap: None,
        job: 7,
        epoch: 3,
        rank,
        exponent: 0x7f,
        slot,
        count: ELEMS,
        seq,
    };
    let mut b = vec![0u8; repr.buffer_len()];
    let mut pkt = repr.emit_into(&mut b).unwrap();
    for (k, c) in pkt.payload_mut().chunks_exact_mut(4).enumerate() {
        c.copy_from_slice(&(v + k as i32).to_be_bytes());
    }
    b
}

/// Both workers' data for `slot` into the rack switch: the partial it sends up.
fn partial_of(rack: &mut Pipeline, slot: u16, seq: u32) -> Vec<u8> {
    let mut out = vec![0u8; 2048];
    let v = rack.process(
        PortId(0),
        &data_packet(0, slot, seq, 10),
        Instant::ZERO,
        &mut out,
    );
    assert_eq!(v, Verdict::Absorbed);
    let (to, partial) = unicast(rack, PortId(1), &data_packet(1, slot, seq, 20));
    assert_eq!(to, UPLINK);
    partial
}

#[test]
fn a_lost_partial_is_reported_by_the_upper_switch_and_sent_again() {
    let mut t = aligned_tree();
    let now = Instant::ZERO;
    let mut out = vec![0u8; 2048];
    // Partials carry their block's counter, in the order they go up: slots 3, 1 and 2 of
    // block 0, then slot 70, the first of block 1.
    let p3 = partial_of(&mut t.racks[0], 3, 1);
    let p1 = partial_of(&mut t.racks[0], 1, 1);
    let p2 = partial_of(&mut t.racks[0], 2, 1);
    let p70 = partial_of(&mut t.racks[0], 70, 1);
    let gaps: Vec<_> = [&p3, &p1, &p2, &p70].iter().map(|p| parse(p).gap).collect();
    assert_eq!(gaps, [Some(0), Some(1), Some(2), Some(0)]);
    assert_eq!(parse(&p1).slot, 65);
    // The upper switch gets slot 3's partial and slot 2's; slot 1's was lost. Slot 2's
    // skipped a counter: it completes its use there and reports counter 1 missing to the
    // rack.
    for p in [&p3, &p2] {
        let v = t.upper.process(PortId(0), p, now, &mut out);
        assert!(matches!(v, Verdict::Multicast { .. }), "{v:?}");
    }
    let report = t.upper.poll_report().expect("a Missing report");
    assert_eq!(report.port, PortId(0));
    let missing = parse(&report.header);
    assert_eq!(
        (missing.kind, missing.gap, missing.exponent, missing.slot),
        (MessageType::Missing, Some(1), 1, 66)
    );
    // The rack switch sends slot 1's partial again, without a counter (a first transmission's
    // only), and the upper switch completes the use with it.
    let (to, again) = unicast(&mut t.racks[0], UPLINK, &report.header);
    assert_eq!(to, UPLINK);
    let h = parse(&again);
    assert_eq!(
        (h.kind, h.slot, h.seq, h.gap),
        (MessageType::Data, 65, 1, None)
    );
    assert_eq!(again[16..], p1[16..]);
    let c = t.racks[0].counters();
    assert_eq!((c.partials_reported, c.upstream_missing), (1, 0));
    // Its copy (a report of lost data goes twice) finds the record cleared: no second
    // partial goes up.
    assert_eq!(report.copies, DATA_REPORT_COPIES);
    let v = t.racks[0].process(UPLINK, &report.header, now, &mut out);
    assert_eq!(v, Verdict::Absorbed);
    let c = t.racks[0].counters();
    assert_eq!((c.partials_reported, c.upstream_missing), (1, 1));
    let v = t.upper.process(PortId(0), &again, now, &mut out);
    assert!(matches!(v, Verdict::Multicast { .. }), "{v:?}");
    assert!(t.upper.poll_report().is_none());
    // The total comes down: the use no longer waits, and the same report again (a duplicate)
    // changes nothing.
    let total = out[..again.len()].to_vec();
    let v = t.racks[0].process(UPLINK, &total, now, &mut out);
    assert!(matches!(v, Verdict::Multicast { .. }), "{v:?}");
    let v = t.racks[0].process(UPLINK, &report.header, now, &mut out);
    assert_eq!(v, Verdict::Absorbed);
    let c = t.racks[0].counters();
    assert_eq!((c.partials_reported, c.upstream_missing), (1, 2));
}

/// Worker `rank`'s Query of `slot`'s use `seq`, asking for `ask`.
fn query_packet(rank: u8, slot: u16, seq: u32, ask: QueryAsk) -> Vec<u8> {
    let repr = AggRepr {
        kind: MessageType::Query,
        count: 0,
        exponent: ask.byte(),
        ..parse(&data_packet(rank, slot, seq, 0))
    };
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit_into(&mut b).unwrap();
    b
}

#[test]
fn rank_0s_status_query_asking_for_the_partial_pushes_it_and_is_answered_with_a_header() {
    let mut t = aligned_tree();
    let now = Instant::ZERO;
    let mut out = vec![0u8; 2048];
    // Slot 5's partial goes up and is lost.
    let partial = partial_of(&mut t.racks[0], 5, 1);
    // Rank 0's Query asking for the partial sends it up again, with the same sums and no
    // gap counter.
    let ask = query_packet(0, 5, 1, QueryAsk::StatusPushingPartial);
    let (to, again) = unicast(&mut t.racks[0], PortId(0), &ask);
    assert_eq!(to, UPLINK);
    let h = parse(&again);
    assert_eq!((h.kind, h.slot, h.gap), (MessageType::Data, 69, None));
    assert_eq!(again[16..], partial[16..]);
    assert_eq!(t.racks[0].counters().partials_for_fetch, 1);
    // Another rank's gets a Pending with every rank's bit; rank 0's plain status Query goes
    // up as a status Query.
    let other = query_packet(1, 5, 1, QueryAsk::StatusPushingPartial);
    let (to, pending) = unicast(&mut t.racks[0], PortId(1), &other);
    assert_eq!(
        (to, parse(&pending).kind),
        (PortId(1), MessageType::Pending)
    );
    assert_eq!(pending[16..20], 0b11u32.to_be_bytes());
    let status = query_up(
        &mut t.racks[0],
        PortId(0),
        &query_packet(0, 5, 1, QueryAsk::Status),
    );
    assert_eq!(parse(&status).exponent, QueryAsk::Status.byte());
    assert_eq!(t.racks[0].counters().partials_for_fetch, 1);
    // The partial completes the use up there, and the total comes down.
    let v = t.upper.process(PortId(0), &again, now, &mut out);
    let Verdict::Multicast { len, .. } = v else {
        panic!("the upper switch multicasts the total, got {v:?}")
    };
    let total = out[..len].to_vec();
    let v = t.racks[0].process(UPLINK, &total, now, &mut out);
    assert!(matches!(v, Verdict::Multicast { .. }), "{v:?}");
    // The use is complete: the same ask is answered with the result's header alone, a fetch
    // with the sums.
    let (to, header) = unicast(&mut t.racks[0], PortId(0), &ask);
    let h = parse(&header);
    assert_eq!(
        (to, h.kind, h.count, header.len()),
        (PortId(0), MessageType::Result, 0, 16)
    );
    let fetch = query_packet(0, 5, 1, QueryAsk::Fetch);
    let (_, full) = unicast(&mut t.racks[0], PortId(0), &fetch);
    assert_eq!(parse(&full).count, ELEMS);
    assert_eq!(full[16..], total[16..]);
    assert_eq!(t.racks[0].counters().partials_for_fetch, 1);
}

#[test]
fn a_missing_report_for_another_switch_or_epoch_resends_nothing() {
    let mut t = aligned_tree();
    let mut out = vec![0u8; 2048];
    let p0 = partial_of(&mut t.racks[0], 0, 1);
    let _lost = partial_of(&mut t.racks[0], 1, 1);
    let p2 = partial_of(&mut t.racks[0], 2, 1);
    t.upper.process(PortId(0), &p0, Instant::ZERO, &mut out);
    t.upper.process(PortId(0), &p2, Instant::ZERO, &mut out);
    let report = t.upper.poll_report().expect("a Missing report");
    for (rank, epoch) in [(1, 11), (0, 12)] {
        let mut header = report.header;
        let mut pkt = ina_wire::AggPacket::new_unchecked(&mut header[..]);
        pkt.set_rank(rank);
        pkt.set_epoch(epoch);
        let v = t.racks[0].process(UPLINK, &header, Instant::ZERO, &mut out);
        assert_eq!(v, Verdict::Absorbed, "rank {rank} epoch {epoch}");
    }
    assert_eq!(t.racks[0].counters().partials_reported, 0);
    assert_eq!(t.racks[0].counters().upstream_missing, 2);
    // The genuine report resends the partial.
    let (to, _) = unicast(&mut t.racks[0], UPLINK, &report.header);
    assert_eq!(to, UPLINK);
}

#[test]
fn a_late_missing_report_names_no_newer_use_of_the_set() {
    let mut t = aligned_tree();
    let now = Instant::ZERO;
    let mut out = vec![0u8; 2048];
    let p0 = partial_of(&mut t.racks[0], 0, 1);
    let p1 = partial_of(&mut t.racks[0], 1, 1);
    let p2 = partial_of(&mut t.racks[0], 2, 1);
    // The upper switch gets slot 1's partial last (sent again on rank 0's asking): its
    // report of counter 1 is on its way when slot 1's total comes down.
    for p in [&p0, &p2] {
        t.upper.process(PortId(0), p, now, &mut out);
    }
    let report = t.upper.poll_report().expect("a Missing report");
    assert_eq!(parse(&report.header).gap, Some(1));
    let Verdict::Multicast { len, .. } = t.upper.process(PortId(0), &p1, now, &mut out) else {
        panic!("the upper switch multicasts slot 1's total")
    };
    let total = out[..len].to_vec();
    let v = t.racks[0].process(UPLINK, &total, now, &mut out);
    assert!(matches!(v, Verdict::Multicast { .. }), "{v:?}");
    // Slot 1's set 1 goes on to use 3, whose partial goes up and waits for its total.
    let p1_next = partial_of(&mut t.racks[0], 1, 3);
    assert_eq!(parse(&p1_next).gap, Some(3));
    // The report names use 1, not use 3: nothing goes up again.
    let v = t.racks[0].process(UPLINK, &report.header, now, &mut out);
    assert_eq!(v, Verdict::Absorbed);
    let c = t.racks[0].counters();
    assert_eq!((c.partials_reported, c.upstream_missing), (0, 1));
}

#[test]
fn with_whole_blocks_the_upper_switch_reports_lost_partials() {
    // 3 racks of 2 on whole blocks of slots, 5% loss on every hop: the upper switch's
    // Missing reports send lost partials again before any worker asks.
    let faults = Faults {
        loss: 0.05,
        duplicate: 0.0,
        delay: 0.0,
    };
    let (tensors, tree) = run_any(&[2, 3], 400, (64, 64), faults, 5);
    assert_exact(&tensors, 6);
    let top = tree.switches[0].counters();
    assert_eq!(top.results_multicast, uses(400));
    assert!(top.missing_sent > 0, "the upper switch reported no gap");
    let reported: u64 = tree.switches[1..]
        .iter()
        .map(|p| p.counters().partials_reported)
        .sum();
    assert!(reported > 0, "no partial was sent again on a report");
    // Totals lost on the way down: the racks report them, the upper switch sends them again.
    let missing_up: u64 = tree.switches[1..]
        .iter()
        .map(|p| p.counters().missing_up)
        .sum();
    assert!(missing_up > 0, "no rack reported a lost total");
    assert!(top.missing_received > 0, "{top:?}");
    assert!(top.missing_received + top.missing_unmatched <= missing_up);
    // Without whole blocks (the levels' slots 40 apart), partials carry no counters.
    let (_, tree) = run_any(&[2, 3], 400, (64, 40), faults, 5);
    assert_eq!(tree.switches[0].counters().missing_sent, 0);
}

#[test]
fn a_lost_total_is_reported_by_the_rack_switch_and_sent_again() {
    let mut t = aligned_tree();
    let now = Instant::ZERO;
    let mut out = vec![0u8; 2048];
    // Three uses of block 0 complete up there; their totals carry the block's counters 0, 1
    // and 2 in the order they are multicast.
    let mut totals = Vec::new();
    for slot in [5u16, 6, 7] {
        let partial = partial_of(&mut t.racks[0], slot, 1);
        let v = t.upper.process(PortId(0), &partial, now, &mut out);
        let Verdict::Multicast { len, .. } = v else {
            panic!("the upper switch completes the use, got {v:?}")
        };
        totals.push(out[..len].to_vec());
    }
    let gaps: Vec<_> = totals.iter().map(|p| parse(p).gap).collect();
    assert_eq!(gaps, [Some(0), Some(1), Some(2)]);
    // Slot 6's total is lost on the way down. Slot 7's shows the gap: the rack switch stores
    // and multicasts it, and reports counter 1 missing to the upper switch.
    let v = t.racks[0].process(UPLINK, &totals[0], now, &mut out);
    assert!(matches!(v, Verdict::Multicast { .. }), "{v:?}");
    assert!(t.racks[0].poll_report().is_none());
    let v = t.racks[0].process(UPLINK, &totals[2], now, &mut out);
    assert!(matches!(v, Verdict::Multicast { .. }), "{v:?}");
    let report = t.racks[0].poll_report().expect("a Missing report up");
    assert_eq!((report.port, report.copies), (UPLINK, 1));
    let missing = parse(&report.header);
    assert_eq!(
        (missing.kind, missing.job, missing.epoch, missing.rank),
        (MessageType::Missing, UPPER_JOB, 11, 0)
    );
    assert_eq!((missing.gap, missing.exponent), (Some(1), 1));
    assert_eq!(t.racks[0].counters().missing_up, 1);
    // The upper switch answers it as the rack's fetching Query of slot 6's use: the stored
    // total, unicast, without a counter; the rack switch stores and multicasts it.
    let (to, again) = unicast(&mut t.upper, PortId(0), &report.header);
    assert_eq!(to, PortId(0));
    let h = parse(&again);
    assert_eq!(
        (h.kind, h.slot, h.seq, h.gap),
        (MessageType::Result, 70, 1, None)
    );
    assert_eq!(again[16..], totals[1][16..]);
    assert_eq!(t.upper.counters().missing_received, 1);
    let v = t.racks[0].process(UPLINK, &again, now, &mut out);
    assert!(matches!(v, Verdict::Multicast { .. }), "{v:?}");
    assert_eq!(t.racks[0].counters().totals_received, 3);
    // A report for a counter the block never carried names nothing.
    let mut header = report.header;
    let mut pkt = ina_wire::AggPacket::new_unchecked(&mut header[..]);
    let set = pkt.set();
    pkt.set_flags(set, Some(40));
    let v = t.upper.process(PortId(0), &header, now, &mut out);
    assert_eq!(v, Verdict::Absorbed);
    assert_eq!(t.upper.counters().missing_unmatched, 1);
}
