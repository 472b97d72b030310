//! The switch's decision table, row by row, and its invariants under arbitrary arrival orders.
#![allow(clippy::unwrap_used)]

use ina_proto::pipeline::{
    DropReason, JobConfig, JobError, Pipeline, PipelineConfig, PortId, SlotRegisters, Verdict,
    DATA_REPORT_COPIES,
};
use ina_proto::Instant;
use ina_wire::agg::ProbeInfo;
use ina_wire::{frame, AggRepr, MacAddr, MessageType, RejectReason};
use proptest::prelude::*;

const JOB: u16 = 4;
const EPOCH: u16 = 21;
const E: u16 = 4;

fn pipe(workers: u16) -> Pipeline {
    let mut p = Pipeline::new(PipelineConfig {
        pool_slots: 32,
        max_elems: 8,
    });
    p.add_job(JobConfig {
        job: JOB,
        epoch: EPOCH,
        slot_base: 8,
        slot_count: 4,
        elems_per_packet: E,
        ranks: (0..workers).map(|r| PortId(10 + r)).collect(),
        uplink: None,
    })
    .unwrap();
    p
}

fn data(rank: u8, slot: u16, set: u8, seq: u32, exp: u8, values: &[i32]) -> Vec<u8> {
    let repr = AggRepr {
        kind: MessageType::Data,
        set,
        gap: None,
        job: JOB,
        epoch: EPOCH,
        rank,
        exponent: exp,
        slot,
        count: values.len() as u16,
        seq,
    };
    let mut buf = vec![0; repr.buffer_len()];
    let mut p = repr.emit_into(&mut buf).unwrap();
    ina_wire::payload::encode_from(values, p.payload_mut());
    buf
}

/// What came out: (kind, ports, header, values).
#[derive(Debug, PartialEq)]
enum Out {
    Drop(DropReason),
    Absorbed,
    Unicast(PortId, AggRepr, Vec<i32>),
    Multicast(Vec<PortId>, AggRepr, Vec<i32>),
}

fn send(p: &mut Pipeline, port: u16, bytes: &[u8]) -> Out {
    send_with(p, port, bytes, 256)
}

/// `send` with an output buffer of `out_len` bytes.
fn send_with(p: &mut Pipeline, port: u16, bytes: &[u8], out_len: usize) -> Out {
    let mut out = vec![0u8; out_len];
    let decode = |bytes: &[u8]| {
        let (h, payload) = AggRepr::parse_bytes(bytes).unwrap();
        let mut v = vec![0; usize::from(h.count)];
        ina_wire::payload::decode_into(payload, &mut v);
        (h, v)
    };
    match p.process(PortId(port), bytes, Instant::ZERO, &mut out) {
        Verdict::Drop(r) => Out::Drop(r),
        Verdict::Absorbed => Out::Absorbed,
        Verdict::Unicast { port, len } => {
            let (h, v) = decode(&out[..len]);
            Out::Unicast(port, h, v)
        }
        Verdict::Multicast { ports, len } => {
            let ports = ports.to_vec();
            let (h, v) = decode(&out[..len]);
            Out::Multicast(ports, h, v)
        }
    }
}

fn values(out: &Out) -> Vec<i32> {
    match out {
        Out::Unicast(_, _, v) | Out::Multicast(_, _, v) => v.clone(),
        other => panic!("no result: {other:?}"),
    }
}

#[test]
fn first_later_and_last_arrival() {
    let mut p = pipe(3);
    assert_eq!(
        send(&mut p, 10, &data(0, 9, 1, 100, 130, &[1, 2, 3, 4])),
        Out::Absorbed
    );
    assert_eq!(
        send(&mut p, 12, &data(2, 9, 1, 100, 140, &[10, 20, 30, 40])),
        Out::Absorbed
    );
    let last = send(&mut p, 11, &data(1, 9, 1, 100, 120, &[i32::MAX, 0, -3, 0]));
    let Out::Multicast(ports, h, v) = last else {
        panic!("{last:?}")
    };
    assert_eq!(ports, vec![PortId(10), PortId(11), PortId(12)]);
    assert_eq!(v, vec![11i32.wrapping_add(i32::MAX), 22, 30, 44]);
    assert_eq!(
        (h.kind, h.exponent, h.seq, h.slot, h.set, h.epoch),
        (MessageType::Result, 140, 100, 9, 1, EPOCH)
    );
    let c = p.counters();
    assert_eq!((c.data_first, c.data_added, c.results_multicast), (1, 2, 1));
    assert_eq!(p.busy_slots(), 0);
}

fn query(rank: u8, slot: u16, set: u8, seq: u32, wants_data: bool) -> Vec<u8> {
    let repr = AggRepr {
        kind: MessageType::Query,
        set,
        gap: None,
        job: JOB,
        epoch: EPOCH,
        rank,
        exponent: u8::from(wants_data),
        slot,
        count: 0,
        seq,
    };
    let mut buf = vec![0; repr.buffer_len()];
    repr.emit_into(&mut buf).unwrap();
    buf
}

/// The Pending answer's (kind, port, slot, set, seq, bitmap), or panics.
fn pending_of(out: &Out) -> (PortId, u16, u8, u32, i32) {
    match out {
        Out::Unicast(port, h, v) if h.kind == MessageType::Pending && v.len() == 1 => {
            assert_eq!((h.count, h.exponent, h.epoch), (1, 0, EPOCH));
            (*port, h.slot, h.set, h.seq, v[0])
        }
        other => panic!("not a Pending answer: {other:?}"),
    }
}

#[test]
fn queries_answer_every_row_of_their_table_and_change_nothing() {
    let mut p = pipe(3);
    // Not seen yet: Pending with an empty bitmap.
    assert_eq!(
        pending_of(&send(&mut p, 11, &query(1, 9, 1, 40, true))),
        (PortId(11), 9, 1, 40, 0)
    );
    send(&mut p, 10, &data(0, 9, 1, 40, 130, &[1, 2, 3, 4]));
    send(&mut p, 12, &data(2, 9, 1, 40, 131, &[1, 1, 1, 1]));
    // Incomplete: the contributors so far, whoever asks.
    let regs = p.registers().clone();
    for rank in 0..3u8 {
        assert_eq!(
            pending_of(&send(
                &mut p,
                10 + u16::from(rank),
                &query(rank, 9, 1, 40, true)
            )),
            (PortId(10 + u16::from(rank)), 9, 1, 40, 0b101)
        );
    }
    assert_eq!(p.registers(), &regs, "a query changed a register");
    // Rank 1 learnt that its data is missing and sends it: the use completes.
    let done = send(&mut p, 11, &data(1, 9, 1, 40, 120, &[0, 0, 0, 10]));
    assert_eq!(values(&done), vec![2, 3, 4, 15]);
    // Complete: the stored result, with E elements or none as the query asks.
    let full = send(&mut p, 12, &query(2, 9, 1, 40, true));
    let Out::Unicast(port, h, v) = full else {
        panic!("{full:?}")
    };
    assert_eq!(
        (port, h.kind, h.count, h.exponent, h.seq, h.set, h.rank, v),
        (
            PortId(12),
            MessageType::Result,
            E,
            131,
            40,
            1,
            2,
            vec![2, 3, 4, 15]
        )
    );
    let empty = send(&mut p, 12, &query(2, 9, 1, 40, false));
    assert!(
        matches!(&empty, Out::Unicast(_, h, v) if h.kind == MessageType::Result && h.count == 0 && v.is_empty()),
        "{empty:?}"
    );
    // Rank 0 moves on to set 0: its query of the finished use is now a late copy.
    send(&mut p, 10, &data(0, 9, 0, 44, 0, &[0; 4]));
    assert_eq!(
        send(&mut p, 10, &query(0, 9, 1, 40, true)),
        Out::Drop(DropReason::Duplicate)
    );
    // Older than the set's use: stale.
    assert_eq!(
        send(&mut p, 11, &query(1, 9, 1, 36, true)),
        Out::Drop(DropReason::StaleSeq)
    );
    let c = *p.counters();
    assert_eq!((c.pending_sent, c.results_unicast), (4, 2));
    assert_eq!((c.duplicate, c.stale_seq), (1, 1));
}

#[test]
fn queries_are_authenticated_and_refused_like_data() {
    let mut p = pipe(2);
    // Wrong port, unknown rank: dropped, no answer to an unauthenticated source.
    assert_eq!(
        send(&mut p, 11, &query(0, 9, 0, 4, true)),
        Out::Drop(DropReason::WrongPort)
    );
    assert_eq!(
        send(&mut p, 10, &query(7, 9, 0, 4, true)),
        Out::Drop(DropReason::UnknownRank)
    );
    let reject = |out: Out| match out {
        Out::Unicast(_, h, _) if h.kind == MessageType::Reject => h.reject_reason(),
        other => panic!("{other:?}"),
    };
    let mut q = query(0, 30, 0, 4, true);
    assert_eq!(
        reject(send(&mut p, 10, &q)),
        Some(RejectReason::SlotOutOfRange)
    );
    q = query(0, 9, 0, 4, true);
    q[5] ^= 1; // epoch
    assert_eq!(reject(send(&mut p, 10, &q)), Some(RejectReason::StaleEpoch));
    // A query with a payload is refused for its count.
    let mut long = query(0, 9, 0, 4, true);
    long[11] = 1;
    long.extend_from_slice(&[0; 4]);
    assert_eq!(
        reject(send(&mut p, 10, &long)),
        Some(RejectReason::BadCount)
    );
}

#[test]
fn a_new_use_overwrites_stale_values() {
    let mut p = pipe(2);
    send(&mut p, 10, &data(0, 8, 0, 50, 0, &[5, 5, 5, 5]));
    send(&mut p, 11, &data(1, 8, 0, 50, 0, &[1, 1, 1, 1]));
    // Both moved to set 1, then back to set 0 with a newer seq: the old sum must not leak in.
    send(&mut p, 10, &data(0, 8, 1, 54, 0, &[0, 0, 0, 0]));
    send(&mut p, 11, &data(1, 8, 1, 54, 0, &[0, 0, 0, 0]));
    send(&mut p, 10, &data(0, 8, 0, 58, 0, &[7, 0, 0, 0]));
    let out = send(&mut p, 11, &data(1, 8, 0, 58, 0, &[1, 0, 0, 0]));
    assert_eq!(values(&out), vec![8, 0, 0, 0]);
}

#[test]
fn retransmissions_to_complete_and_incomplete_slots() {
    let mut p = pipe(2);
    assert_eq!(
        send(&mut p, 10, &data(0, 10, 0, 7, 0, &[1, 2, 3, 4])),
        Out::Absorbed
    );
    // Incomplete: the retransmission is answered with the contributors so far (rank 0), and
    // changes nothing; the sum will come by multicast.
    let pending = send(&mut p, 10, &data(0, 10, 0, 7, 0, &[1, 2, 3, 4]));
    let Out::Unicast(port, h, v) = pending else {
        panic!("{pending:?}")
    };
    assert_eq!(
        (port, h.kind, h.slot, h.set, h.seq, h.rank, h.exponent, v),
        (PortId(10), MessageType::Pending, 10, 0, 7, 0, 0, vec![0b01])
    );
    assert_eq!(p.counters().pending_sent, 1);
    let done = send(&mut p, 11, &data(1, 10, 0, 7, 0, &[1, 1, 1, 1]));
    assert_eq!(values(&done), vec![2, 3, 4, 5]);
    // Complete: the retransmission gets the stored sum back on its own port, unchanged.
    let again = send(&mut p, 11, &data(1, 10, 0, 7, 0, &[1, 1, 1, 1]));
    let Out::Unicast(port, h, v) = again else {
        panic!("{again:?}")
    };
    assert_eq!((port, h.seq, v), (PortId(11), 7, vec![2, 3, 4, 5]));
    // Rank 0 moves on to the other set of the slot; a late copy of its old packet is dropped.
    assert_eq!(
        send(&mut p, 10, &data(0, 10, 1, 11, 0, &[0; 4])),
        Out::Absorbed
    );
    assert_eq!(
        send(&mut p, 10, &data(0, 10, 0, 7, 0, &[1, 2, 3, 4])),
        Out::Drop(DropReason::Duplicate)
    );
    // Rank 1 can still fetch the old result from set 0.
    assert_eq!(
        values(&send(&mut p, 11, &data(1, 10, 0, 7, 0, &[9; 4]))),
        vec![2, 3, 4, 5]
    );
    // A packet older than the set's current use is stale.
    assert_eq!(
        send(&mut p, 11, &data(1, 10, 0, 3, 0, &[9; 4])),
        Out::Drop(DropReason::StaleSeq)
    );
}

#[test]
fn refusals_of_authenticated_workers_are_answered() {
    let mut p = pipe(2);
    let reject = |out: Out| match out {
        Out::Unicast(port, h, _) => (port, h.reject_reason().unwrap(), h.epoch, h.seq),
        other => panic!("{other:?}"),
    };
    let mut stale = data(0, 8, 0, 5, 0, &[0; 4]);
    stale[5] ^= 1; // epoch
    assert_eq!(
        reject(send(&mut p, 10, &stale)),
        (PortId(10), RejectReason::StaleEpoch, EPOCH, 5)
    );
    assert_eq!(
        reject(send(&mut p, 10, &data(0, 12, 0, 5, 0, &[0; 4]))),
        (PortId(10), RejectReason::SlotOutOfRange, EPOCH, 5)
    );
    assert_eq!(
        reject(send(&mut p, 10, &data(0, 7, 0, 5, 0, &[0; 4]))).1,
        RejectReason::SlotOutOfRange
    );
    assert_eq!(
        reject(send(&mut p, 11, &data(1, 8, 0, 5, 0, &[0; 3]))).1,
        RejectReason::BadCount
    );
    let c = *p.counters();
    assert_eq!(
        (
            c.stale_epoch,
            c.slot_out_of_range,
            c.bad_count,
            c.rejects_sent
        ),
        (1, 2, 1, 4)
    );
    assert_eq!(
        p.registers().slots()[8],
        SlotRegisters::default(),
        "refused packets leave no trace"
    );
}

#[test]
fn refusals_that_cannot_be_answered_count_once() {
    let mut p = pipe(2);
    let mut stale = data(0, 8, 0, 5, 0, &[0; 4]);
    stale[5] ^= 1; // epoch
    let refused = [
        (10, stale),
        (10, data(0, 12, 0, 5, 0, &[0; 4])),
        (11, data(1, 8, 0, 5, 0, &[0; 3])),
    ];
    // A Reject is a bare header: 15 bytes cannot hold it.
    for (i, (port, pkt)) in refused.iter().enumerate() {
        assert_eq!(
            send_with(&mut p, *port, pkt, 15),
            Out::Drop(DropReason::OutputTooSmall)
        );
        let c = *p.counters();
        assert_eq!(c.output_too_small, i as u64 + 1);
        assert_eq!(c.drops(DropReason::OutputTooSmall), i as u64 + 1);
        assert_eq!(c.drops_total(), i as u64 + 1, "{c:?}");
        assert_eq!(
            (
                c.stale_epoch,
                c.slot_out_of_range,
                c.bad_count,
                c.rejects_sent
            ),
            (0, 0, 0, 0)
        );
    }
    // With room for the header, the same packets are refused and counted as such.
    for (port, pkt) in &refused {
        assert!(matches!(
            send_with(&mut p, *port, pkt, 16),
            Out::Unicast(..)
        ));
    }
    let c = *p.counters();
    assert_eq!(
        (
            c.stale_epoch,
            c.slot_out_of_range,
            c.bad_count,
            c.rejects_sent,
            c.output_too_small
        ),
        (1, 1, 1, 3, 3)
    );
    assert_eq!(c.drops_total(), 6);
    // A probe whose reply does not fit is dropped the same way.
    let mut probe = data(0, 0, 0, 0, 0, &[]);
    probe[0] = 0x14;
    assert_eq!(
        send_with(&mut p, 10, &probe, 31),
        Out::Drop(DropReason::OutputTooSmall)
    );
    assert_eq!(p.counters().probes_answered, 0);
    assert_eq!(p.counters().output_too_small, 4);
}

#[test]
fn a_result_that_does_not_fit_is_never_sent() {
    let mut p = pipe(2);
    let a = data(0, 9, 1, 40, 120, &[1, 2, 3, 4]);
    let b = data(1, 9, 1, 40, 130, &[10, 20, 30, 40]);
    // An arrival that completes nothing needs no output buffer at all.
    assert_eq!(send_with(&mut p, 10, &a, 0), Out::Absorbed);
    let regs = p.registers().clone();
    let before = *p.counters();
    // The completing arrival cannot write its 32-byte result: dropped, registers untouched.
    assert_eq!(
        send_with(&mut p, 11, &b, 31),
        Out::Drop(DropReason::OutputTooSmall)
    );
    assert_eq!(p.registers(), &regs);
    assert_eq!(p.busy_slots(), 1);
    let c = *p.counters();
    assert_eq!(c.output_too_small, 1);
    assert_eq!(c.drops_total(), before.drops_total() + 1);
    assert_eq!(
        (c.data_added, c.elements_aggregated, c.results_multicast),
        (before.data_added, before.elements_aggregated, 0)
    );
    // The first worker's retransmission is still one to a collecting slot: answered with
    // Pending when that fits the output, else dropped as too large for it.
    assert_eq!(
        send_with(&mut p, 10, &a, 19),
        Out::Drop(DropReason::OutputTooSmall)
    );
    let pending = send_with(&mut p, 10, &a, 20);
    assert!(
        matches!(&pending, Out::Unicast(PortId(10), h, v) if h.kind == MessageType::Pending && v == &[1]),
        "{pending:?}"
    );
    // The retransmission with room completes the use as the first copy would have.
    let done = send_with(&mut p, 11, &b, 32);
    let Out::Multicast(ports, h, v) = done else {
        panic!("{done:?}")
    };
    assert_eq!(ports, vec![PortId(10), PortId(11)]);
    assert_eq!(v, vec![11, 22, 33, 44]);
    assert_eq!((h.exponent, h.seq, h.set), (130, 40, 1));
    assert_eq!(
        (p.counters().data_added, p.counters().results_multicast),
        (1, 1)
    );
    // Retransmissions to the completed use: without room dropped, with room answered.
    assert_eq!(
        send_with(&mut p, 10, &a, 20),
        Out::Drop(DropReason::OutputTooSmall)
    );
    let again = send_with(&mut p, 10, &a, 32);
    let Out::Unicast(port, _, v) = again else {
        panic!("{again:?}")
    };
    assert_eq!((port, v), (PortId(10), vec![11, 22, 33, 44]));
    let c = *p.counters();
    let by_reason: u64 = c.drops_by_reason().iter().map(|(_, n)| n).sum();
    assert_eq!(by_reason, c.drops_total());
    assert!(c.drops_by_reason().contains(&("output_too_small", 3)));
    assert_eq!((c.output_too_small, c.results_unicast), (3, 1));
    assert_eq!((c.drops_total(), c.pending_sent), (3, 1));
}

#[test]
fn unauthenticated_and_malformed_packets_are_silently_dropped() {
    let mut p = pipe(2);
    let mut foreign = data(0, 8, 0, 5, 0, &[0; 4]);
    foreign[3] = 99; // job
    assert_eq!(
        send(&mut p, 10, &foreign),
        Out::Drop(DropReason::UnknownJob)
    );
    assert_eq!(
        send(&mut p, 10, &data(5, 8, 0, 5, 0, &[0; 4])),
        Out::Drop(DropReason::UnknownRank)
    );
    assert_eq!(
        send(&mut p, 11, &data(0, 8, 0, 5, 0, &[0; 4])),
        Out::Drop(DropReason::WrongPort)
    );
    assert_eq!(
        send(&mut p, 10, &[1, 2, 3]),
        Out::Drop(DropReason::Malformed)
    );
    let mut result = data(0, 8, 0, 5, 0, &[0; 4]);
    result[0] = 0x12;
    assert_eq!(
        send(&mut p, 10, &result),
        Out::Drop(DropReason::UnexpectedType)
    );
    // Another version, an unknown type, a payload shorter or longer than its count, a
    // reject with an unknown reason: malformed, whatever the type.
    let good = data(0, 8, 0, 5, 0, &[0; 4]);
    let mut malformed = Vec::new();
    for (at, byte) in [(0, 0x21u8), (0, 0x19), (0, 0x01)] {
        let mut b = good.clone();
        b[at] = byte;
        malformed.push(b);
    }
    malformed.push(good[..good.len() - 4].to_vec());
    malformed.push([&good[..], &[0; 4]].concat());
    let mut short_result = result.clone();
    short_result.truncate(good.len() - 1);
    malformed.push(short_result);
    let mut reject = good[..16].to_vec();
    reject[0] = 0x13;
    reject[7] = 200;
    reject[10..12].copy_from_slice(&[0, 0]);
    malformed.push(reject);
    for b in &malformed {
        assert_eq!(
            send(&mut p, 10, b),
            Out::Drop(DropReason::Malformed),
            "{b:x?}"
        );
    }
    // Probes are authenticated as data is.
    let mut probe = good[..16].to_vec();
    probe[0] = 0x14;
    probe[10..12].copy_from_slice(&[0, 0]);
    assert_eq!(send(&mut p, 11, &probe), Out::Drop(DropReason::WrongPort));
    probe[3] = 99;
    assert_eq!(send(&mut p, 10, &probe), Out::Drop(DropReason::UnknownJob));
    assert_eq!(p.counters().drops_total(), 5 + malformed.len() as u64 + 2);
    assert_eq!(p.counters().drops(DropReason::WrongPort), 2);
    assert_eq!(p.counters().data_first, 0);
}

#[test]
fn probes_report_the_job() {
    let mut p = pipe(3);
    let mut probe = data(2, 0, 0, 0, 0, &[]);
    probe[0] = 0x14;
    probe[5] = 0; // any epoch
    let out = send(&mut p, 12, &probe);
    let Out::Unicast(port, h, v) = out else {
        panic!("{out:?}")
    };
    assert_eq!(
        (port, h.kind, h.epoch),
        (PortId(12), MessageType::ProbeReply, EPOCH)
    );
    let mut bytes = [0u8; 16];
    ina_wire::payload::encode_from(&v, &mut bytes);
    assert_eq!(
        ProbeInfo::parse(&bytes).unwrap(),
        ProbeInfo {
            workers: 3,
            elems_per_packet: E,
            slot_base: 8,
            slot_count: 4
        }
    );
}

#[test]
fn job_table_validation_and_isolation() {
    let mut p = pipe(2);
    let job = |job: u16, base: u16, count: u16, elems: u16, ranks: Vec<u16>| JobConfig {
        job,
        epoch: 1,
        slot_base: base,
        slot_count: count,
        elems_per_packet: elems,
        ranks: ranks.into_iter().map(PortId).collect(),
        uplink: None,
    };
    assert_eq!(
        p.add_job(job(JOB, 0, 2, 4, vec![1])),
        Err(JobError::Exists(JOB))
    );
    assert!(matches!(
        p.add_job(job(5, 10, 4, 4, vec![1])),
        Err(JobError::Overlap { other: JOB, .. })
    ));
    assert!(matches!(
        p.add_job(job(5, 30, 4, 4, vec![1])),
        Err(JobError::OutOfPool { .. })
    ));
    assert!(matches!(
        p.add_job(job(5, 0, 4, 9, vec![1])),
        Err(JobError::Elems { .. })
    ));
    assert_eq!(
        p.add_job(job(5, 0, 4, 4, vec![])),
        Err(JobError::Workers(0))
    );
    assert_eq!(
        p.add_job(job(5, 0, 4, 4, (0..33).collect())),
        Err(JobError::Workers(33))
    );
    assert_eq!(
        p.add_job(job(5, 0, 4, 4, vec![3, 3])),
        Err(JobError::DuplicatePort(PortId(3)))
    );
    assert_eq!(p.add_job(job(5, 0, 0, 4, vec![3])), Err(JobError::NoSlots));
    p.add_job(job(5, 0, 8, 4, vec![20])).unwrap();
    // Job 5's single worker aggregates on its slots; job 4's registers stay untouched.
    let mut pkt = data(0, 3, 0, 9, 0, &[1, 1, 1, 1]);
    pkt[3] = 5;
    pkt[5] = 1;
    pkt[4] = 0;
    assert!(matches!(send(&mut p, 20, &pkt), Out::Multicast(..)));
    // Job 5 cannot reach into job 4's slots.
    pkt[9] = 8;
    assert!(
        matches!(send(&mut p, 20, &pkt), Out::Unicast(_, h, _) if h.reject_reason() == Some(RejectReason::SlotOutOfRange))
    );
    assert!(p.registers().slots()[8..12]
        .iter()
        .all(|s| *s == SlotRegisters::default()));
    assert_eq!(p.remove_job(5).unwrap().job, 5);
    assert_eq!(
        p.registers().slots()[3],
        SlotRegisters::default(),
        "removal clears the job's slots"
    );
    assert_eq!(p.remove_job(5), Err(JobError::Unknown(5)));
}

#[test]
fn frames_are_parsed_and_answered_as_frames() {
    let mut p = pipe(1);
    let payload = data(0, 8, 0, 5, 0, &[1, 2, 3, 4]);
    let addrs = frame::FrameAddrs {
        src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: MacAddr([2, 0, 0, 0, 0, 0xfe]),
        src_ip: [198, 18, 0, 1],
        dst_ip: [198, 18, 0, 254],
        src_port: 40000,
        dst_port: ina_wire::UDP_PORT,
    };
    let mut f = vec![0u8; frame::FRAME_HEADER_LEN + payload.len()];
    frame::emit_headers(&mut f, &addrs, payload.len()).unwrap();
    f[frame::FRAME_HEADER_LEN..].copy_from_slice(&payload);
    let mut out = vec![0u8; 512];
    let v = p.process_frame(PortId(10), &f, Instant::ZERO, &mut out);
    let Verdict::Multicast { len, .. } = v else {
        panic!("no multicast: {v:?}")
    };
    let reply = frame::parse(&out[..len]).unwrap();
    assert_eq!(reply.addrs, addrs.reversed());
    let (h, _) = AggRepr::parse_bytes(reply.payload).unwrap();
    assert_eq!(h.kind, MessageType::Result);
    // Wrong UDP port: not ours.
    let mut other = f.clone();
    other[36] = 0;
    assert_eq!(
        p.process_frame(PortId(10), &other, Instant::ZERO, &mut out),
        Verdict::Drop(DropReason::NotIna)
    );
    assert_eq!(
        p.process_frame(PortId(10), &f[..20], Instant::ZERO, &mut out),
        Verdict::Drop(DropReason::NotIna)
    );
    // No room for the reply frame: dropped, nothing emitted, the use stays complete.
    for short in [frame::FRAME_HEADER_LEN - 1, len - 1] {
        assert_eq!(
            p.process_frame(PortId(10), &f, Instant::ZERO, &mut out[..short]),
            Verdict::Drop(DropReason::OutputTooSmall)
        );
    }
    assert_eq!(p.counters().output_too_small, 2);
    assert!(matches!(
        p.process_frame(PortId(10), &f, Instant::ZERO, &mut out[..len]),
        Verdict::Unicast { len: l, .. } if l == len
    ));
}

proptest! {
    /// Whatever the order of arrivals and however many copies of each arrive, a slot use
    /// multicasts exactly once, with exactly the sum, and copies never change the registers.
    #[test]
    fn exactly_once_under_any_arrival_order(
        workers in 1u16..=32,
        order in proptest::collection::vec((0u16..32, 0u8..3), 1..200),
        vals in proptest::collection::vec(any::<i32>(), 32 * 4),
    ) {
        let mut p = pipe(workers);
        let packets: Vec<Vec<u8>> = (0..workers)
            .map(|r| data(r as u8, 11, 1, 1000, r as u8, &vals[usize::from(r) * 4..usize::from(r) * 4 + 4]))
            .collect();
        let expect: Vec<i32> = (0..4)
            .map(|k| (0..usize::from(workers)).fold(0i32, |a, r| a.wrapping_add(vals[r * 4 + k])))
            .collect();
        // Every worker arrives at least once; then arbitrary copies in arbitrary order.
        let mut arrivals: Vec<u16> = (0..workers).collect();
        for (r, copies) in order {
            for _ in 0..copies {
                arrivals.push(r % workers);
            }
        }
        let mut multicasts = 0;
        let mut seen = std::collections::HashSet::new();
        for r in &arrivals {
            let out = send(&mut p, 10 + r, &packets[usize::from(*r)]);
            let first = seen.insert(*r);
            match out {
                Out::Multicast(ports, h, v) => {
                    multicasts += 1;
                    prop_assert_eq!(ports.len(), usize::from(workers));
                    prop_assert_eq!(&v, &expect);
                    prop_assert_eq!(h.exponent as u16, workers - 1);
                }
                Out::Unicast(_, h, v) if h.kind == MessageType::Result => {
                    prop_assert!(!first);
                    prop_assert_eq!(multicasts, 1);
                    prop_assert_eq!(&v, &expect);
                }
                Out::Unicast(_, h, v) => {
                    // A copy before the use completed: the contributors so far, its own
                    // among them.
                    prop_assert!(!first);
                    prop_assert_eq!(h.kind, MessageType::Pending);
                    prop_assert_eq!(multicasts, 0);
                    let expect_bits = seen.iter().fold(0u32, |b, r| b | 1 << r);
                    prop_assert_eq!(v, vec![expect_bits as i32]);
                }
                Out::Absorbed => prop_assert!(first),
                Out::Drop(reason) => prop_assert!(false, "dropped: {:?}", reason),
            }
        }
        prop_assert_eq!(multicasts, 1);
        prop_assert_eq!(p.registers().values_of(11, 1)[..4].to_vec(), expect);
    }
}

/// A pipeline with one job of `workers` ranks on slots `base..base + count`, ranks on ports
/// 10.., with the gap register and its reports on.
fn with_gaps(workers: u16, base: u16, count: u16) -> Pipeline {
    let mut p = Pipeline::new(PipelineConfig {
        pool_slots: 256,
        max_elems: 64,
    });
    p.set_gap_reports(true);
    p.add_job(JobConfig {
        job: JOB,
        epoch: EPOCH,
        slot_base: base,
        slot_count: count,
        elems_per_packet: E,
        ranks: (0..workers).map(|r| PortId(10 + r)).collect(),
        uplink: None,
    })
    .unwrap();
    p
}

fn counted(rank: u8, slot: u16, seq: u32, counter: u8) -> Vec<u8> {
    let mut b = data(rank, slot, 0, seq, 0, &[1; E as usize]);
    b[1] = 0x02 | counter << 2;
    b
}

/// The gap register: skipped counters of a rank's first transmissions to a block are reported
/// to that rank (first skipped counter, how many), per block and rank, across the counter's
/// wrap; a block not wholly in the job's range, or reports turned off, report nothing.
#[test]
fn skipped_gap_counters_are_reported_to_their_sender() {
    let mut p = with_gaps(2, 64, 128);
    assert_eq!(send(&mut p, 10, &counted(0, 64, 100, 0)), Out::Absorbed);
    assert_eq!(p.poll_report(), None);
    assert_eq!(send(&mut p, 10, &counted(0, 65, 101, 1)), Out::Absorbed);
    assert_eq!(p.poll_report(), None);
    // Counters 2, 3 and 4 never arrived.
    assert_eq!(send(&mut p, 10, &counted(0, 69, 105, 5)), Out::Absorbed);
    let r = p.poll_report().expect("a report");
    assert_eq!((r.port, r.copies), (PortId(10), DATA_REPORT_COPIES));
    let (h, _) = AggRepr::parse_bytes(&r.header).unwrap();
    assert_eq!(
        (h.kind, h.gap, h.exponent, h.slot, h.seq, h.rank, h.count),
        (MessageType::Missing, Some(2), 3, 69, 105, 0, 0)
    );
    // Another rank and another block keep their own cells.
    assert!(matches!(
        send(&mut p, 11, &counted(1, 64, 100, 7)),
        Out::Multicast(..)
    ));
    assert_eq!(p.poll_report(), None);
    assert_eq!(send(&mut p, 10, &counted(0, 128, 200, 9)), Out::Absorbed);
    assert_eq!(p.poll_report(), None);
    assert_eq!(send(&mut p, 10, &counted(0, 130, 202, 11)), Out::Absorbed);
    assert_eq!(report_of(&mut p), Some((10, 1)));
    // Up to seven skipped are reported, across the wrap of the 6-bit counter too: 6..=12,
    // then 63 and 0 after 62.
    send(&mut p, 10, &counted(0, 70, 106, 13));
    assert_eq!(report_of(&mut p), Some((6, 7)));
    send(&mut p, 10, &counted(0, 71, 107, 62));
    assert_eq!(report_of(&mut p), None);
    // (62 is 49 counters behind 13 modulo 64: a late packet, ignored; the cell keeps 13.)
    for c in 14..=61u8 {
        send(&mut p, 10, &counted(0, 71, 107, c));
    }
    assert_eq!(p.poll_report(), None);
    send(&mut p, 10, &counted(0, 71, 107, 62));
    assert_eq!(p.poll_report(), None);
    send(&mut p, 10, &counted(0, 72, 108, 1));
    assert_eq!(report_of(&mut p), Some((63, 2)));
    // A counter behind the latest (a packet the network delayed, here 62 after 1), one
    // behind it by more than half the range (40 counters behind 1 looks 23 ahead) and a
    // duplicate (1 again) report nothing and leave the cell: read as jumps ahead they would
    // report 60, 22 and 63 counters missing.
    send(&mut p, 10, &counted(0, 71, 107, 62));
    assert_eq!(p.poll_report(), None);
    send(&mut p, 10, &counted(0, 71, 107, 25));
    assert_eq!(p.poll_report(), None);
    send(&mut p, 10, &counted(0, 72, 108, 1));
    assert_eq!(p.poll_report(), None);
    // A retransmission (no counter) changes nothing.
    send(&mut p, 10, &data(0, 69, 0, 105, 0, &[1; E as usize]));
    assert_eq!(p.poll_report(), None);
    send(&mut p, 10, &counted(0, 73, 109, 2));
    assert_eq!(p.poll_report(), None);
    assert_eq!(p.counters().missing_sent, 4);

    // Slots 128..164: block 2 is not wholly the job's.
    let mut q = with_gaps(1, 64, 100);
    send(&mut q, 10, &counted(0, 130, 5, 0));
    send(&mut q, 10, &counted(0, 140, 9, 5));
    assert_eq!(q.poll_report(), None);
    // Reports off: the register is not used, and a ProbeReply says so.
    let mut off = pipe(2);
    send(&mut off, 10, &counted(0, 8, 5, 0));
    send(&mut off, 10, &counted(0, 9, 9, 5));
    assert_eq!(off.poll_report(), None);
    assert_eq!(off.counters().missing_sent, 0);
    for (pipe, want) in [(&mut off, None), (&mut p, Some(0))] {
        let probe = AggRepr {
            kind: MessageType::Probe,
            set: 0,
            gap: None,
            job: JOB,
            epoch: 0,
            rank: 0,
            exponent: 0,
            slot: 0,
            count: 0,
            seq: 1,
        };
        let mut b = [0u8; 16];
        probe.emit_into(&mut b).unwrap();
        let Out::Unicast(_, h, _) = send(pipe, 10, &b) else {
            panic!("no ProbeReply");
        };
        assert_eq!((h.kind, h.gap), (MessageType::ProbeReply, want));
    }
}

/// The first skipped counter and how many, of the pipeline's pending Missing report.
fn report_of(p: &mut Pipeline) -> Option<(u8, u8)> {
    let r = p.poll_report()?;
    let (h, _) = AggRepr::parse_bytes(&r.header).ok()?;
    assert_eq!(h.kind, MessageType::Missing);
    Some((h.gap?, h.exponent))
}

#[test]
fn an_arrival_of_the_other_kind_is_refused_but_its_rank_has_moved_on() {
    let mut p = pipe(2);
    // Use 5 of slot 8 in set 0, complete.
    assert_eq!(
        send(&mut p, 10, &data(0, 8, 0, 5, 0, &[1; 4])),
        Out::Absorbed
    );
    assert!(matches!(
        send(&mut p, 11, &data(1, 8, 0, 5, 0, &[2; 4])),
        Out::Multicast(..)
    ));
    // Use 6 begins in set 1 with a header; rank 1 sends it a payload.
    assert_eq!(send(&mut p, 10, &data(0, 8, 1, 6, 0, &[])), Out::Absorbed);
    let refused = send(&mut p, 11, &data(1, 8, 1, 6, 0, &[3; 4]));
    let Out::Unicast(PortId(11), h, _) = refused else {
        panic!("{refused:?}")
    };
    assert_eq!(h.reject_reason(), Some(RejectReason::BadCount));
    let regs = p.registers().slots()[8];
    // Set 1 is unchanged: rank 0 alone, one arrival still missing, begun by a header.
    assert_eq!(regs.bitmap[1], 0b01);
    assert_eq!(regs.count[1], 1 | ina_proto::pipeline::HEADER_USE);
    // Rank 1 left set 0 all the same, as rank 0 did with its header: a late copy of its
    // use 5 is a duplicate now.
    assert_eq!(regs.bitmap[0], 0);
    assert_eq!(
        send(&mut p, 11, &data(1, 8, 0, 5, 0, &[2; 4])),
        Out::Drop(DropReason::Duplicate)
    );
    // The header rank 1 owes completes use 6.
    assert!(matches!(
        send(&mut p, 11, &data(1, 8, 1, 6, 0, &[])),
        Out::Multicast(..)
    ));
}
