use super::*;
use ina_wire::{AggRepr, MacAddr, MessageType};
use proptest::prelude::*;

const SM: [u8; 6] = [2, 0, 0, 0, 0, 0xfe];
const SIP: [u8; 4] = [198, 18, 0, 254];

fn endpoint(rank: u8) -> Endpoint {
    Endpoint {
        port: u16::from(rank % 3),
        mac: MacAddr([2, 0, 0, 0, 1, rank]),
        ip: [198, 18, 1, rank],
        udp_port: 9000 + u16::from(rank),
    }
}

fn switch(workers: u8, elems: u16) -> FrameSwitch {
    let mut s = FrameSwitch::new(FrameSwitchConfig {
        mac: MacAddr(SM),
        ip: SIP,
        ports: vec![0, 1, 2, 3],
        l2: vec![
            (MacAddr([2, 0, 0, 0, 9, 1]), 1),
            (MacAddr([2, 0, 0, 0, 9, 3]), 3),
        ],
        pipeline: PipelineConfig {
            pool_slots: 64,
            max_elems: 256,
        },
        gap_reports: false,
    })
    .unwrap();
    s.add_job(FrameJob {
        job: 7,
        epoch: 3,
        slot_base: 8,
        slot_count: 8,
        elems_per_packet: elems,
        ranks: (0..workers).map(endpoint).collect(),
        uplink: None,
    })
    .unwrap();
    s
}

fn ina_frame(from: &Endpoint, repr: &AggRepr, values: &[i32]) -> Vec<u8> {
    ina_frame_to(from, (MacAddr(SM), SIP), repr, values)
}

/// [`ina_frame`] to the switch at `to` (its MAC and IPv4 address).
fn ina_frame_to(
    from: &Endpoint,
    to: (MacAddr, [u8; 4]),
    repr: &AggRepr,
    values: &[i32],
) -> Vec<u8> {
    let mut buf = vec![0u8; FRAME_HEADER_LEN + repr.buffer_len()];
    let addrs = FrameAddrs {
        src_mac: from.mac,
        dst_mac: to.0,
        src_ip: from.ip,
        dst_ip: to.1,
        src_port: from.udp_port,
        dst_port: UDP_PORT,
    };
    emit_headers(&mut buf, &addrs, repr.buffer_len()).unwrap();
    let mut p = repr.emit_into(&mut buf[FRAME_HEADER_LEN..]).unwrap();
    ina_wire::payload::encode_from(values, p.payload_mut());
    buf
}

fn data(rank: u8, count: u16, seq: u32) -> AggRepr {
    AggRepr {
        kind: MessageType::Data,
        set: 0,
        gap: None,
        job: 7,
        epoch: 3,
        rank,
        exponent: 100 + rank,
        slot: 9,
        count,
        seq,
    }
}

fn collect(out: &Outputs) -> Vec<(u16, Vec<u8>)> {
    out.iter().map(|(p, f)| (p, f.to_vec())).collect()
}

fn arp_request(sha: [u8; 6], spa: [u8; 4], tpa: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&BROADCAST);
    f.extend_from_slice(&sha);
    f.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&sha);
    f.extend_from_slice(&spa);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&tpa);
    f.resize(60, 0);
    f
}

#[test]
fn aggregation_multicasts_to_every_rank_endpoint() {
    let mut s = switch(3, 4);
    let mut out = Outputs::new();
    let now = Instant::ZERO;
    for r in 0..2 {
        let f = ina_frame(&endpoint(r), &data(r, 4, 1), &[1, 2, 3, i32::MAX]);
        let e = s.process(endpoint(r).port, &f, now, &mut out);
        assert_eq!(
            e,
            if r == 0 {
                Event::DataFirst
            } else {
                Event::DataAdded
            }
        );
        assert!(out.is_empty());
    }
    let f = ina_frame(&endpoint(2), &data(2, 4, 1), &[1, 2, 3, 1]);
    assert_eq!(s.process(2, &f, now, &mut out), Event::DataAdded);
    assert_eq!(out.len(), 3);
    assert_eq!(s.results_multicast(), 1);
    for (r, (port, frame)) in collect(&out).into_iter().enumerate() {
        let ep = endpoint(r as u8);
        assert_eq!(port, ep.port);
        let parsed = ina_wire::frame::parse(&frame).unwrap();
        assert_eq!(
            parsed.addrs,
            FrameAddrs {
                src_mac: MacAddr(SM),
                dst_mac: ep.mac,
                src_ip: SIP,
                dst_ip: ep.ip,
                src_port: UDP_PORT,
                dst_port: ep.udp_port
            }
        );
        let (h, payload) = AggRepr::parse_bytes(parsed.payload).unwrap();
        assert_eq!(h.kind, MessageType::Result);
        assert_eq!((h.exponent, h.rank, h.seq, h.count), (102, 2, 1, 4));
        let mut v = [0i32; 4];
        ina_wire::payload::decode_into(payload, &mut v);
        assert_eq!(
            v,
            [3, 6, 9, i32::MAX.wrapping_add(i32::MAX).wrapping_add(1)]
        );
        // The headers are the ones emit_headers writes.
        let mut head = [0u8; FRAME_HEADER_LEN];
        emit_headers(&mut head, &parsed.addrs, 32).unwrap();
        assert_eq!(&frame[..FRAME_HEADER_LEN], &head[..]);
    }
    // A retransmission of a contributor gets the result back on its own port.
    let f = ina_frame(&endpoint(1), &data(1, 4, 1), &[0; 4]);
    assert_eq!(s.process(1, &f, now, &mut out), Event::ResultUnicast);
    let got = collect(&out);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, 1);
    let parsed = ina_wire::frame::parse(&got[0].1).unwrap();
    assert_eq!(parsed.addrs.dst_ip, endpoint(1).ip);
    assert_eq!(s.event_count(Event::DataAdded), 2);
}

#[test]
fn sender_identity_is_checked() {
    let mut s = switch(2, 4);
    let mut out = Outputs::new();
    let good = endpoint(1);
    let cases = [
        (Endpoint { port: 2, ..good }, Event::WrongPort),
        (
            Endpoint {
                ip: [198, 18, 1, 77],
                ..good
            },
            Event::WrongPort,
        ),
        (
            Endpoint {
                udp_port: 1,
                ..good
            },
            Event::WrongPort,
        ),
        (
            Endpoint {
                mac: MacAddr([2, 2, 2, 2, 2, 2]),
                ..good
            },
            Event::DataFirst,
        ),
    ];
    for (ep, want) in cases {
        let f = ina_frame(&ep, &data(1, 4, 1), &[1; 4]);
        assert_eq!(
            s.process(ep.port, &f, Instant::ZERO, &mut out),
            want,
            "{ep:?}"
        );
        assert!(out.is_empty());
    }
    let f = ina_frame(&good, &data(2, 4, 1), &[1; 4]);
    assert_eq!(
        s.process(good.port, &f, Instant::ZERO, &mut out),
        Event::UnknownRank
    );
    let f = ina_frame(
        &good,
        &AggRepr {
            job: 8,
            ..data(1, 4, 1)
        },
        &[1; 4],
    );
    assert_eq!(
        s.process(good.port, &f, Instant::ZERO, &mut out),
        Event::UnknownJob
    );
    let f = ina_frame(
        &good,
        &AggRepr {
            epoch: 4,
            ..data(1, 4, 1)
        },
        &[1; 4],
    );
    assert_eq!(
        s.process(good.port, &f, Instant::ZERO, &mut out),
        Event::StaleEpoch
    );
    assert_eq!(out.len(), 1);
}

#[test]
fn frames_to_the_switch_that_are_not_ina() {
    let mut s = switch(2, 4);
    let mut out = Outputs::new();
    let good = ina_frame(&endpoint(0), &data(0, 4, 1), &[1; 4]);
    let mut cases: Vec<(Vec<u8>, Event)> = Vec::new();
    let mut f = good.clone();
    f[14] = 0x46; // IHL 6
    cases.push((f, Event::NotIna));
    let mut f = good.clone();
    f[14 + 6] = 0x20; // MF
    cases.push((f, Event::NotIna));
    let mut f = good.clone();
    f[14 + 7] = 1; // fragment offset
    cases.push((f, Event::NotIna));
    let mut f = good.clone();
    f[14 + 9] = 6; // TCP
    cases.push((f, Event::NotIna));
    let mut f = good.clone();
    f[36] = 0x49;
    f[37] = 0x4f; // another UDP port
    cases.push((f, Event::NotIna));
    cases.push((good[..40].to_vec(), Event::Malformed)); // no room for UDP
    let mut f = good.clone();
    f[38..40].copy_from_slice(&23u16.to_be_bytes()); // UDP length below 8 + 16
    cases.push((f, Event::Malformed));
    let mut f = good.clone();
    let too_long = (good.len() - 34 + 1) as u16;
    f[38..40].copy_from_slice(&too_long.to_be_bytes()); // beyond the frame
    cases.push((f, Event::Malformed));
    let mut f = good.clone();
    f.extend_from_slice(&[0xaa; 7]); // padding after the UDP length is ignored
    cases.push((f, Event::DataFirst));
    let mut f = good.clone();
    let short = (good.len() - 34 - 4) as u16; // UDP length one element short
    f[38..40].copy_from_slice(&short.to_be_bytes());
    cases.push((f, Event::Malformed));
    cases.push((good[..10].to_vec(), Event::Malformed)); // not even Ethernet
    for (i, (f, want)) in cases.iter().enumerate() {
        let mut s2 = s.clone();
        assert_eq!(s2.process(0, f, Instant::ZERO, &mut out), *want, "case {i}");
        assert!(out.is_empty(), "case {i}");
    }
    let total: u64 = s.events().iter().sum();
    assert_eq!(total, 0);
    // An IPv4 frame too short to hold a destination address is ordinary traffic.
    assert_eq!(
        s.process(0, &good[..30], Instant::ZERO, &mut out),
        Event::L2Unknown
    );
}

#[test]
fn arp_for_the_switch_and_for_others() {
    let mut s = switch(1, 4);
    let mut out = Outputs::new();
    let sha = [2, 0, 0, 0, 5, 5];
    let req = arp_request(sha, [198, 18, 0, 5], SIP);
    assert_eq!(
        s.process(2, &req, Instant::ZERO, &mut out),
        Event::ArpReplied
    );
    let got = collect(&out);
    assert_eq!(got.len(), 1);
    let (port, reply) = &got[0];
    assert_eq!(*port, 2);
    assert_eq!(reply.len(), req.len());
    let mut want = req.clone();
    want[0..6].copy_from_slice(&sha);
    want[6..12].copy_from_slice(&SM);
    want[20..22].copy_from_slice(&[0, 2]);
    want[22..28].copy_from_slice(&SM);
    want[28..32].copy_from_slice(&SIP);
    want[32..38].copy_from_slice(&sha);
    want[38..42].copy_from_slice(&[198, 18, 0, 5]);
    assert_eq!(reply, &want);
    // For another address: flooded as ordinary broadcast traffic.
    let other = arp_request(sha, [198, 18, 0, 5], [198, 18, 0, 6]);
    assert_eq!(
        s.process(2, &other, Instant::ZERO, &mut out),
        Event::L2Forwarded
    );
    let ports: Vec<u16> = out.iter().map(|(p, _)| p).collect();
    assert_eq!(ports, vec![0, 1, 3]);
    assert!(out.iter().all(|(_, f)| f == &other[..]));
    // A reply (oper 2) to the switch's address is not answered.
    let mut rep = req.clone();
    rep[21] = 2;
    assert_eq!(
        s.process(2, &rep, Instant::ZERO, &mut out),
        Event::L2Forwarded
    );
    // A truncated request is ordinary traffic.
    assert_eq!(
        s.process(2, &req[..40], Instant::ZERO, &mut out),
        Event::L2Forwarded
    );
}

#[test]
fn l2_forward_flood_and_unknown() {
    let mut s = switch(1, 4);
    let mut out = Outputs::new();
    let mut f = vec![0u8; 64];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 9, 3]);
    f[12] = 0x88;
    f[13] = 0xb5;
    assert_eq!(
        s.process(0, &f, Instant::ZERO, &mut out),
        Event::L2Forwarded
    );
    assert_eq!(collect(&out), vec![(3, f.clone())]);
    // To the port it came from: dropped.
    assert_eq!(s.process(3, &f, Instant::ZERO, &mut out), Event::L2Unknown);
    assert!(out.is_empty());
    // Unknown MAC.
    f[5] = 0x44;
    assert_eq!(s.process(0, &f, Instant::ZERO, &mut out), Event::L2Unknown);
    // IPv4 to another host, even an ina datagram, is ordinary traffic.
    let mut ina = ina_frame(&endpoint(0), &data(0, 4, 1), &[1; 4]);
    ina[0..6].copy_from_slice(&[2, 0, 0, 0, 9, 1]);
    ina[30..34].copy_from_slice(&[198, 18, 0, 9]);
    assert_eq!(
        s.process(0, &ina, Instant::ZERO, &mut out),
        Event::L2Forwarded
    );
    assert_eq!(collect(&out), vec![(1, ina)]);
    assert_eq!(s.event_count(Event::L2Forwarded), 2);
    assert_eq!(s.event_count(Event::L2Unknown), 2);
}

#[test]
fn configuration_errors() {
    let cfg = FrameSwitchConfig {
        mac: MacAddr(SM),
        ip: SIP,
        ports: vec![0],
        l2: vec![(MacAddr([1; 6]), 0), (MacAddr([1; 6]), 1)],
        pipeline: PipelineConfig::default(),
        gap_reports: false,
    };
    assert_eq!(
        FrameSwitch::new(cfg.clone()).unwrap_err(),
        L2Error::DuplicateMac(MacAddr([1; 6]))
    );
    let bcast = FrameSwitchConfig {
        l2: vec![(MacAddr(BROADCAST), 0)],
        ..cfg.clone()
    };
    assert_eq!(
        FrameSwitch::new(bcast).unwrap_err(),
        L2Error::BroadcastEntry
    );
    let mut s = switch(2, 4);
    let dup = FrameJob {
        job: 9,
        epoch: 1,
        slot_base: 0,
        slot_count: 4,
        elems_per_packet: 4,
        ranks: vec![
            endpoint(1),
            Endpoint {
                mac: MacAddr([9; 6]),
                ..endpoint(1)
            },
        ],
        uplink: None,
    };
    assert!(matches!(
        s.add_job(dup),
        Err(L2Error::DuplicateEndpoint {
            first: 0,
            second: 1,
            ..
        })
    ));
    let overlap = FrameJob {
        job: 9,
        epoch: 1,
        slot_base: 10,
        slot_count: 4,
        elems_per_packet: 4,
        ranks: vec![endpoint(1)],
        uplink: None,
    };
    assert!(matches!(
        s.add_job(overlap),
        Err(L2Error::Job(JobError::Overlap { .. }))
    ));
    assert_eq!(s.remove_job(7).unwrap().job, 7);
    assert!(s.remove_job(7).is_err());
}

fn arb_frame() -> impl Strategy<Value = Vec<u8>> {
    let valid = (0u8..3, any::<u32>(), 0usize..60, any::<u64>()).prop_map(|(r, seq, at, x)| {
        let mut f = ina_frame(&endpoint(r), &data(r, 4, seq % 4), &[1, 2, 3, 4]);
        // Corrupt one byte (or none).
        if at < f.len() {
            f[at] ^= x as u8;
        }
        f.truncate(f.len() - (x >> 8) as usize % 3 * (x >> 16 & 1) as usize);
        f
    });
    prop_oneof![proptest::collection::vec(any::<u8>(), 0..120), valid]
}

proptest! {
    /// Any bytes: no panic, exactly one event per frame, outputs only where they belong.
    #[test]
    fn never_panics_and_counts_one_event(frames in proptest::collection::vec((0u16..4, arb_frame()), 1..40)) {
        let mut s = switch(3, 4);
        let mut out = Outputs::new();
        for (i, (port, f)) in frames.iter().enumerate() {
            let e = s.process(*port, f, Instant::from_nanos(i as u64), &mut out);
            let total: u64 = s.events().iter().sum();
            prop_assert_eq!(total, i as u64 + 1);
            match e {
                Event::L2Unknown | Event::NotIna | Event::Malformed | Event::UnexpectedType
                | Event::UnknownJob | Event::UnknownRank | Event::WrongPort | Event::StaleSeq
                | Event::Duplicate => prop_assert!(out.is_empty()),
                Event::ArpReplied | Event::StaleEpoch | Event::SlotOutOfRange | Event::BadCount
                | Event::ResultUnicast | Event::ProbeAnswered | Event::PendingSent => {
                    prop_assert_eq!(out.len(), 1);
                    prop_assert_eq!(out.iter().next().map(|(p, _)| p), Some(*port));
                }
                _ => {}
            }
            for (_, frame) in out.iter() {
                prop_assert!(frame.len() >= ETHERNET_LEN);
            }
        }
    }

    /// An ARP request for the switch is answered with exactly the reply §7 describes.
    #[test]
    fn arp_reply_is_exact(sha in any::<[u8; 6]>(), spa in any::<[u8; 4]>(), port in 0u16..4, pad in 0usize..30) {
        let mut s = switch(1, 4);
        let mut out = Outputs::new();
        let mut req = arp_request(sha, spa, SIP);
        req.resize(req.len() + pad, 0x5a);
        prop_assert_eq!(s.process(port, &req, Instant::ZERO, &mut out), Event::ArpReplied);
        let got = collect(&out);
        prop_assert_eq!(got.len(), 1);
        let mut want = req.clone();
        want[0..6].copy_from_slice(&sha);
        want[6..12].copy_from_slice(&SM);
        want[20..22].copy_from_slice(&[0, 2]);
        want[22..28].copy_from_slice(&SM);
        want[28..32].copy_from_slice(&SIP);
        want[32..38].copy_from_slice(&sha);
        want[38..42].copy_from_slice(&spa);
        prop_assert_eq!(&got[0], &(port, want));
    }

    /// The last arrival sends one Result per rank, each to that rank's endpoint, with the
    /// same ina packet.
    #[test]
    fn multicast_fan_out(workers in 1u8..=32, seq in 1u32..1000) {
        let mut s = switch(workers, 4);
        let mut out = Outputs::new();
        for r in 0..workers {
            let f = ina_frame(&endpoint(r), &data(r, 4, seq), &[i32::from(r); 4]);
            s.process(endpoint(r).port, &f, Instant::ZERO, &mut out);
        }
        prop_assert_eq!(out.len(), usize::from(workers));
        prop_assert_eq!(s.results_multicast(), 1);
        let sum: i32 = (0..i32::from(workers)).sum();
        for (r, (port, frame)) in out.iter().enumerate() {
            let ep = endpoint(r as u8);
            prop_assert_eq!(port, ep.port);
            let parsed = ina_wire::frame::parse(frame).unwrap();
            prop_assert_eq!((parsed.addrs.dst_mac, parsed.addrs.dst_ip, parsed.addrs.dst_port), (ep.mac, ep.ip, ep.udp_port));
            prop_assert_eq!((parsed.addrs.src_mac, parsed.addrs.src_ip, parsed.addrs.src_port), (MacAddr(SM), SIP, UDP_PORT));
            let (h, payload) = AggRepr::parse_bytes(parsed.payload).unwrap();
            prop_assert_eq!((h.kind, h.seq), (MessageType::Result, seq));
            prop_assert_eq!(&payload[..4], &sum.to_be_bytes()[..]);
        }
    }
}

/// Counts the allocations of the current thread (for the test below; every other test runs
/// with it as well, which only costs them a thread-local increment).
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    pub struct Counting;

    thread_local! {
        pub static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    }

    // SAFETY: every call is forwarded to the system allocator unchanged.
    #[allow(unsafe_code)]
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
            // SAFETY: the caller's contract is the system allocator's.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: as above.
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
            // SAFETY: as above.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    pub fn count() -> u64 {
        ALLOCATIONS.with(|c| c.get())
    }
}

/// Once its output buffers have grown to their working size, the switch allocates nothing per
/// frame: aggregation with multicast, retransmissions, Pending, Rejects, Probes, ARP,
/// forwarding and flooding, malformed frames.
#[test]
fn the_per_frame_path_does_not_allocate() {
    let mut s = switch(3, 64);
    let mut out = Outputs::new();
    let round = |seq: u32| -> Vec<(u16, Vec<u8>)> {
        let mut frames = Vec::new();
        for r in 0..3 {
            let ep = endpoint(r);
            frames.push((ep.port, ina_frame(&ep, &data(r, 64, seq), &[7; 64])));
        }
        let ep = endpoint(0);
        frames.push((ep.port, ina_frame(&ep, &data(0, 64, seq), &[7; 64])));
        frames.push((ep.port, ina_frame(&ep, &data(0, 64, seq + 1), &[7; 64])));
        frames.push((ep.port, ina_frame(&ep, &data(0, 64, seq + 1), &[7; 64])));
        frames.push((
            ep.port,
            ina_frame(
                &ep,
                &AggRepr {
                    epoch: 9,
                    ..data(0, 64, seq)
                },
                &[],
            ),
        ));
        frames.push((
            ep.port,
            ina_frame(
                &ep,
                &AggRepr {
                    kind: MessageType::Probe,
                    count: 0,
                    ..data(0, 0, seq)
                },
                &[],
            ),
        ));
        frames.push((1, arp_request([2, 0, 0, 0, 5, 5], [198, 18, 0, 5], SIP)));
        let mut eth = vec![0u8; 64];
        eth[0..6].copy_from_slice(&[2, 0, 0, 0, 9, 3]);
        frames.push((0, eth.clone()));
        eth[0..6].copy_from_slice(&BROADCAST);
        frames.push((0, eth));
        frames.push((0, vec![1, 2, 3]));
        frames
    };
    // Two rounds grow the buffers; the frames of a third are made before counting.
    for seq in [10, 20] {
        for (p, f) in round(seq) {
            s.process(p, &f, Instant::ZERO, &mut out);
        }
    }
    let frames = round(30);
    let mut events = Vec::with_capacity(frames.len());
    let mut allocations = Vec::with_capacity(frames.len());
    for (p, f) in &frames {
        let before = counting::count();
        let e = s.process(*p, f, Instant::ZERO, &mut out);
        allocations.push(counting::count() - before);
        events.push(e);
    }
    assert!(
        allocations.iter().all(|&a| a == 0),
        "allocations per frame {allocations:?} for {events:?}"
    );
    assert!(events.contains(&Event::PendingSent) && events.contains(&Event::ResultUnicast));
    assert_eq!(s.results_multicast(), 3);
}

/// A switch at `mac`/`ip` with ports 0..6 and no L2 table.
fn bare_switch(mac: [u8; 6], ip: [u8; 4], gap_reports: bool) -> FrameSwitch {
    FrameSwitch::new(FrameSwitchConfig {
        mac: MacAddr(mac),
        ip,
        ports: (0..6).collect(),
        l2: Vec::new(),
        pipeline: PipelineConfig {
            pool_slots: 128,
            max_elems: 256,
        },
        gap_reports,
    })
    .unwrap()
}

/// Two rack switches of two workers each under an upper switch (PROTOCOL.md §9), as frame
/// switches wired port to port, their jobs on whole blocks of slots (rack slots 64.. are the
/// upper switch's 0..): every worker gets the sum of all four, addressed to it, with the
/// total's gap counter when reports are on, and each rack sends one partial and takes one
/// total.
fn tree_of_frame_switches(gap_reports: bool) {
    const UPLINK_PORT: u16 = 5;
    let rack_addr = |k: u8| ([2, 0, 0, 0, 0, 0x10 + k], [198, 18, 0, 10 + k]);
    let (upper_mac, upper_ip) = ([2, 0, 0, 0, 0, 0x20], [198, 18, 0, 20]);
    let worker = |k: u8, r: u8| Endpoint {
        port: u16::from(r),
        mac: MacAddr([2, 0, 0, 1, k, r]),
        ip: [198, 18, 1 + k, 1 + r],
        udp_port: 9000 + u16::from(r),
    };
    let mut upper = bare_switch(upper_mac, upper_ip, gap_reports);
    upper
        .add_job(FrameJob {
            job: 20,
            epoch: 5,
            slot_base: 0,
            slot_count: 64,
            elems_per_packet: 4,
            ranks: (0..2)
                .map(|k| Endpoint {
                    port: u16::from(k),
                    mac: MacAddr(rack_addr(k).0),
                    ip: rack_addr(k).1,
                    udp_port: UDP_PORT,
                })
                .collect(),
            uplink: None,
        })
        .unwrap();
    let mut racks: Vec<FrameSwitch> = (0..2u8)
        .map(|k| {
            let (mac, ip) = rack_addr(k);
            let mut s = bare_switch(mac, ip, gap_reports);
            s.add_job(FrameJob {
                job: 7,
                epoch: 3,
                slot_base: 64,
                slot_count: 64,
                elems_per_packet: 4,
                ranks: (0..2).map(|r| worker(k, r)).collect(),
                uplink: Some(FrameUplink {
                    switch: Endpoint {
                        port: UPLINK_PORT,
                        mac: MacAddr(upper_mac),
                        ip: upper_ip,
                        udp_port: UDP_PORT,
                    },
                    job: 20,
                    epoch: 5,
                    slot_base: 0,
                    rank: k,
                }),
            })
            .unwrap();
            s
        })
        .collect();
    // Frames in flight: (switch: 0, 1 the racks, 2 the upper one; ingress port; bytes).
    let mut wire: Vec<(usize, u16, Vec<u8>)> = Vec::new();
    let mut sum = [0i32; 4];
    for k in 0..2u8 {
        for r in 0..2u8 {
            let ep = worker(k, r);
            let mut repr = data(r, 4, 1);
            repr.exponent = 100;
            repr.slot = 73;
            let values = [i32::from(10 * k + r), 1, -2, i32::MAX - 1];
            for (s, v) in sum.iter_mut().zip(values) {
                *s = s.wrapping_add(v);
            }
            let (mac, ip) = rack_addr(k);
            let f = ina_frame_to(&ep, (MacAddr(mac), ip), &repr, &values);
            wire.push((usize::from(k), ep.port, f));
        }
    }
    let mut delivered: Vec<(u8, u8, Vec<u8>)> = Vec::new();
    let mut out = Outputs::new();
    let mut steps = 0;
    while let Some((at, port, f)) = wire.pop() {
        steps += 1;
        assert!(steps < 100, "the tree does not settle");
        let sw = if at == 2 { &mut upper } else { &mut racks[at] };
        sw.process(port, &f, Instant::ZERO, &mut out);
        for (p, frame) in collect(&out) {
            match (at, p) {
                (2, k) => wire.push((usize::from(k), UPLINK_PORT, frame)),
                (k, UPLINK_PORT) => wire.push((2, k as u16, frame)),
                (k, r) => delivered.push((k as u8, r as u8, frame)),
            }
        }
    }
    assert_eq!(delivered.len(), 4, "one result per worker");
    for (k, r, frame) in delivered {
        let ep = worker(k, r);
        let parsed = ina_wire::frame::parse(&frame).unwrap();
        assert_eq!(
            (
                parsed.addrs.dst_mac,
                parsed.addrs.dst_ip,
                parsed.addrs.dst_port
            ),
            (ep.mac, ep.ip, ep.udp_port)
        );
        assert_eq!(parsed.addrs.src_ip, rack_addr(k).1);
        let (h, payload) = AggRepr::parse_bytes(parsed.payload).unwrap();
        assert_eq!(
            (h.kind, h.job, h.epoch, h.slot, h.seq),
            (MessageType::Result, 7, 3, 73, 1)
        );
        assert_eq!(
            h.gap.is_some(),
            gap_reports,
            "a total's counter on the way down"
        );
        let mut v = [0i32; 4];
        ina_wire::payload::decode_into(payload, &mut v);
        assert_eq!(v, sum);
    }
    for rack in &racks {
        assert_eq!(rack.pipeline().counters().partials_sent, 1);
        assert_eq!(rack.pipeline().counters().totals_received, 1);
    }
    assert_eq!(upper.results_multicast(), 1);
}

#[test]
fn a_tree_of_frame_switches_sums_exactly() {
    tree_of_frame_switches(false);
    tree_of_frame_switches(true);
}

#[test]
fn an_upper_switch_is_not_a_rank() {
    let mut s = bare_switch(SM, SIP, false);
    let job = FrameJob {
        job: 1,
        epoch: 1,
        slot_base: 0,
        slot_count: 8,
        elems_per_packet: 4,
        ranks: vec![endpoint(0), endpoint(1)],
        uplink: Some(FrameUplink {
            switch: endpoint(1),
            job: 9,
            epoch: 1,
            slot_base: 0,
            rank: 0,
        }),
    };
    assert_eq!(
        s.add_job(job.clone()),
        Err(L2Error::UplinkIsRank { job: 1, rank: 1 })
    );
    let mut ok = job.clone();
    ok.uplink = ok.uplink.map(|mut u| {
        u.switch = endpoint(2);
        u
    });
    s.add_job(ok.clone()).unwrap();
    let mut second = ok;
    second.job = 2;
    second.slot_base = 8;
    assert_eq!(
        s.add_job(second),
        Err(L2Error::DuplicateUplink { job: 2, upper: 9 })
    );
}
