//! The end of a rack worker's stream in a two-level tree: a packet found unanswered by order,
//! whose losses the gap counters would reveal, waits a query timeout before its Query while an
//! older packet of its block is unanswered; rank 0 of the rack, the rack's timer for losses
//! between the switches, asks at once. One int32 stream driven by hand: every packet sent,
//! then results for all but the block's two oldest. Rank 0's Queries there ask for the use's
//! state and its partial, the other ranks' fetch, and a result found lost once every packet
//! has gone is fetched at once. A block's last packet taken for lost at the end has the
//! packet before it asked about at once: the report that would have revealed its loss went
//! with it. Once every packet has gone, a use that holds the worker's data is asked about
//! again a spacing after the Query that found it waiting, not after that Query's answer; rank 0
//! does so too for a use found waiting before its last packets went.
#![allow(clippy::unwrap_used)]

use ina_proto::descriptor::Descriptor;
use ina_proto::rtt::{RtoConfig, RttEstimator};
use ina_proto::stream::{Lane, Stream, StreamConfig, Tensor};
use ina_proto::Instant;
use ina_wire::agg::{AggPacket, AggRepr, MessageType, QueryAsk};
use std::time::Duration;

const WINDOW: u16 = 64;
const ELEMS: u16 = 4;
/// One block of the lane: every packet, the descriptor's and the data's, has a slot of its own.
const PACKETS: usize = 64;
/// The data packets of such a stream.
const DATA: usize = PACKETS - ina_proto::stream::DESCRIPTOR_PACKETS as usize;

/// A stream of `rank` in a rack of 4 workers under a tree of 8, with Missing reports.
fn stream(rank: u8, tensor: &mut [i32]) -> Stream<'_> {
    stream_with(rank, tensor, RtoConfig::default())
}

/// The same, with the round-trip estimator's settings `rto`.
fn stream_with(rank: u8, tensor: &mut [i32], rto: RtoConfig) -> Stream<'_> {
    ELEMENTS.with(|e| e.set(tensor.len() as u64));
    let cfg = StreamConfig {
        job: 1,
        epoch: 2,
        rank,
        workers: 4,
        total_workers: 8,
        elems_per_packet: ELEMS,
        lane: Lane::new(0, WINDOW),
        max_retries: 50,
        give_up: Duration::from_secs(1),
        gap_reports: true,
        rules: Default::default(),
    };
    Stream::new(cfg, Tensor::I32(tensor), RttEstimator::new(rto)).unwrap()
}

/// Everything the stream sends at `now`.
fn drain(s: &mut Stream<'_>, now: Instant) -> Vec<AggRepr> {
    let mut buf = vec![0u8; 2048];
    let mut sent = Vec::new();
    while let Some(len) = s.poll_transmit(now, &mut buf).unwrap() {
        sent.push(AggRepr::parse_bytes(&buf[..len]).unwrap().0);
    }
    sent
}

thread_local! {
    /// The elements of this test's stream (each test runs on a thread of its own).
    static ELEMENTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The multicast result of `data`, numbered `counter` among its block's results: zeros, or
/// for the stream's descriptor (its lane's first position) the sums of the tree's 8 ranks'
/// equal descriptors.
fn result_of(data: &AggRepr, counter: u8) -> Vec<u8> {
    let repr = AggRepr {
        kind: MessageType::Result,
        gap: Some(counter),
        rank: 0,
        exponent: 0,
        ..*data
    };
    let mut bytes = vec![0u8; repr.buffer_len()];
    let mut pkt = AggPacket::new_unchecked(&mut bytes[..]);
    repr.emit(&mut pkt);
    if data.seq == u32::from(WINDOW) {
        let d = Descriptor {
            elements: ELEMENTS.with(std::cell::Cell::get),
            float: false,
            support: false,
            total_workers: 8,
        };
        let sums: Vec<i32> = d.encode(usize::from(ELEMS)).iter().map(|v| v * 8).collect();
        ina_wire::payload::encode_from(&sums, pkt.payload_mut());
    }
    bytes
}

/// Sends the whole stream of `s` and answers every packet but the two oldest with its
/// result; returns the time after the last result.
fn all_but_two_oldest_answered(s: &mut Stream<'_>, start: Instant) -> Instant {
    let data = drain(s, start);
    assert_eq!(data.len(), PACKETS, "the window holds the whole stream");
    let mut now = start + Duration::from_micros(20);
    for (counter, d) in data.iter().skip(2).enumerate() {
        s.handle_datagram(now, &result_of(d, counter as u8));
        now = now + Duration::from_nanos(100);
    }
    now
}

/// The seqs of the Queries `rank` sends: when the results of every packet but the two
/// oldest have come, and then at each timer until both have been asked about.
fn queries(rank: u8) -> (Vec<u32>, Vec<(Duration, u32)>) {
    let mut tensor = vec![1i32; DATA * usize::from(ELEMS)];
    let mut s = stream(rank, &mut tensor);
    let start = Instant::ZERO;
    let mut now = all_but_two_oldest_answered(&mut s, start);
    let asked = |sent: Vec<AggRepr>| -> Vec<u32> {
        sent.iter()
            .filter(|r| r.kind == MessageType::Query)
            .map(|r| r.seq)
            .collect()
    };
    let at_once = asked(drain(&mut s, now));
    let mut later = Vec::new();
    for _ in 0..8 {
        let Some(at) = s.poll_timeout() else { break };
        now = now.max(at);
        s.handle_timeout(now);
        for seq in asked(drain(&mut s, now)) {
            later.push((now - start, seq));
        }
        if later.len() + at_once.len() >= 2 {
            break;
        }
    }
    (at_once, later)
}

#[test]
fn a_rack_worker_leaves_a_packet_to_the_counters_while_an_older_one_is_unanswered() {
    let first = u32::from(WINDOW);
    let (at_once, later) = queries(1);
    assert_eq!(
        at_once,
        vec![first],
        "only the block's oldest is asked about at once"
    );
    assert_eq!(
        later.iter().map(|(_, seq)| *seq).collect::<Vec<_>>(),
        vec![first + 1],
        "the younger one is asked about when its wait ends"
    );
    assert!(
        later[0].0 < Duration::from_micros(200),
        "the wait is a query timeout, not a retransmission timeout: {later:?}"
    );
}

#[test]
fn rank_0_of_a_rack_asks_at_once() {
    let first = u32::from(WINDOW);
    let (at_once, _) = queries(0);
    assert_eq!(at_once, vec![first, first + 1]);
}

/// The Queries among `sent`: (seq, exponent byte).
fn asks(sent: &[AggRepr]) -> Vec<(u32, u8)> {
    sent.iter()
        .filter(|r| r.kind == MessageType::Query)
        .map(|r| (r.seq, r.exponent))
        .collect()
}

#[test]
fn rank_0_asks_for_the_state_and_the_partial_and_fetches_a_lost_result_at_once() {
    let first = u32::from(WINDOW);
    let mut tensor = vec![1i32; DATA * usize::from(ELEMS)];
    let mut s = stream(0, &mut tensor);
    let mut now = all_but_two_oldest_answered(&mut s, Instant::ZERO);
    let status = QueryAsk::StatusPushingPartial.byte();
    let sent = drain(&mut s, now);
    assert_eq!(asks(&sent), vec![(first, status), (first + 1, status)]);
    // The header-only answer to the first: the use is complete and its result, which went
    // ahead of the answer, was lost. Every packet has gone: the fetch goes at once.
    let query = sent.iter().find(|r| r.seq == first).unwrap();
    let complete = AggRepr {
        kind: MessageType::Result,
        count: 0,
        ..*query
    };
    let mut bytes = vec![0u8; complete.buffer_len()];
    complete.emit_into(&mut bytes).unwrap();
    now = now + Duration::from_micros(10);
    s.handle_datagram(now, &bytes);
    assert_eq!(
        asks(&drain(&mut s, now)),
        vec![(first, QueryAsk::Fetch.byte())]
    );
}

#[test]
fn the_other_ranks_fetch() {
    let mut tensor = vec![1i32; DATA * usize::from(ELEMS)];
    let mut s = stream(1, &mut tensor);
    let now = all_but_two_oldest_answered(&mut s, Instant::ZERO);
    assert_eq!(
        asks(&drain(&mut s, now)),
        vec![(u32::from(WINDOW), QueryAsk::Fetch.byte())]
    );
}

/// The Pending answer to `query`, with contributor `bitmap`.
fn pending_of(query: &AggRepr, bitmap: u32) -> Vec<u8> {
    let repr = AggRepr {
        kind: MessageType::Pending,
        count: 1,
        exponent: 0,
        ..*query
    };
    let mut bytes = vec![0u8; repr.buffer_len()];
    repr.emit(&mut AggPacket::new_unchecked(&mut bytes[..]));
    bytes[16..20].copy_from_slice(&bitmap.to_be_bytes());
    bytes
}

/// Runs the timers of `s` from `now` on (at most 64 of them) until it asks about the packet
/// with `seq` again: when it does.
fn next_ask_about(s: &mut Stream<'_>, mut now: Instant, seq: u32) -> Option<Instant> {
    for _ in 0..64 {
        now = now.max(s.poll_timeout()?);
        s.handle_timeout(now);
        if asks(&drain(s, now)).iter().any(|(asked, _)| *asked == seq) {
            return Some(now);
        }
    }
    None
}

#[test]
fn at_the_end_a_held_use_is_asked_about_again_a_spacing_after_the_query_not_after_its_answer() {
    let mut tensor = vec![1i32; DATA * usize::from(ELEMS)];
    let rto = RtoConfig {
        granularity: Duration::from_micros(1),
        ..RtoConfig::default()
    };
    let mut s = stream_with(1, &mut tensor, rto);
    let first = u32::from(WINDOW);
    // Every packet has gone; results for all but the two oldest came 20 µs after them. The
    // oldest is asked about at once.
    let mut now = all_but_two_oldest_answered(&mut s, Instant::ZERO);
    let sent = drain(&mut s, now);
    let query = *sent
        .iter()
        .find(|r| r.kind == MessageType::Query && r.seq == first)
        .expect("the oldest packet is asked about");
    let asked_at = now;
    // Its use waits for another worker's repair: a Pending with this worker's bit, 8 µs later
    // (the query timeout is the larger of that and half the results' round trip, 10 µs).
    now = now + Duration::from_micros(8);
    s.handle_datagram(now, &pending_of(&query, 0b11));
    let answered_at = now;
    // The next Query about it goes a spacing after the first Query went, not after the answer.
    let next = next_ask_about(&mut s, now, first).expect("asked about again");
    let (after_query, after_answer) = (next - asked_at, next - answered_at);
    assert!(
        after_query <= Duration::from_micros(11),
        "asked again {after_query:?} after the first Query, {after_answer:?} after its answer"
    );
    // Not at once either: the answer came 8 µs after the Query, before the spacing had passed.
    assert!(
        after_query >= Duration::from_micros(9),
        "asked again {after_query:?} after the first Query, {after_answer:?} after its answer"
    );
}
