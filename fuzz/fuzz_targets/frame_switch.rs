//! The frame switch (PROTOCOL.md §7) on arbitrary frames from arbitrary ports, with a job of
//! three ranks and a rack job of two under an upper switch behind port 3 (§9) installed: never a panic; every frame counts exactly one event; every frame out
//! leaves on a port of the switch; a reply to an `ina` packet is a well-formed frame from the
//! switch's addresses; an ARP reply is as long as its request. Also
//! `checksum::complete_l4_checksum` on the same bytes: never a panic, and completing a
//! completed checksum changes nothing.
#![no_main]

use ina_proto::event::Event;
use ina_proto::l2::{Endpoint, FrameJob, FrameSwitch, FrameSwitchConfig, FrameUplink, Outputs};
use ina_proto::pipeline::PipelineConfig;
use ina_proto::Instant;
use ina_wire::MacAddr;
use ina_wire::{checksum, frame};
use libfuzzer_sys::fuzz_target;

const MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x64];
const IP: [u8; 4] = [198, 18, 0, 100];

/// Ranks `0..n`, rank `r` on port `r` at UDP port `udp_port`.
fn ranks(n: u8, udp_port: u16) -> Vec<Endpoint> {
    (0..n)
        .map(|r| Endpoint {
            port: u16::from(r),
            mac: MacAddr([2, 0, 0, 0, 1, r]),
            ip: [198, 18, 0, r + 1],
            udp_port,
        })
        .collect()
}

fn switch() -> FrameSwitch {
    let mut sw = FrameSwitch::new(FrameSwitchConfig {
        mac: MacAddr(MAC),
        ip: IP,
        ports: vec![0, 1, 2, 3],
        l2: vec![
            (MacAddr([2, 0, 0, 0, 1, 0]), 0),
            (MacAddr([2, 0, 0, 0, 1, 1]), 1),
        ],
        pipeline: PipelineConfig {
            pool_slots: 16,
            max_elems: 64,
        },
        gap_reports: true,
    })
    .expect("switch");
    sw.add_job(FrameJob {
        job: 1,
        epoch: 5,
        slot_base: 2,
        slot_count: 4,
        elems_per_packet: 4,
        ranks: ranks(3, 9000),
        uplink: None,
    })
    .expect("job");
    sw.add_job(FrameJob {
        job: 2,
        epoch: 3,
        slot_base: 8,
        slot_count: 4,
        elems_per_packet: 4,
        ranks: ranks(2, 9001),
        uplink: Some(FrameUplink {
            switch: Endpoint {
                port: 3,
                mac: MacAddr([2, 0, 0, 0, 2, 0]),
                ip: [198, 19, 0, 1],
                udp_port: ina_wire::UDP_PORT,
            },
            job: 7,
            epoch: 9,
            slot_base: 0,
            rank: 1,
        }),
    })
    .expect("rack job");
    sw
}

fuzz_target!(|data: &[u8]| {
    let mut sw = switch();
    let mut out = Outputs::new();
    let mut frames = 0u64;
    // Several frames per input: [port, length, bytes...] repeated.
    let mut rest = data;
    while let [port, len, tail @ ..] = rest {
        let take = usize::from(*len).min(tail.len());
        let (frame_bytes, after) = tail.split_at(take);
        rest = after;
        let ingress = u16::from(*port % 5);
        let event = sw.process(ingress, frame_bytes, Instant::from_nanos(frames), &mut out);
        frames += 1;
        for (egress, bytes) in out.iter() {
            assert!(egress < 4, "egress port {egress}");
            match event {
                Event::ArpReplied => assert_eq!(bytes.len(), frame_bytes.len()),
                Event::L2Forwarded => assert_eq!(bytes, frame_bytes),
                _ => {
                    let parsed = frame::parse(bytes).expect("a reply parses as a frame");
                    assert_eq!((parsed.addrs.src_mac.0, parsed.addrs.src_ip), (MAC, IP));
                    assert_eq!(parsed.addrs.src_port, ina_wire::UDP_PORT);
                }
            }
        }
        let mut copy = frame_bytes.to_vec();
        if checksum::complete_l4_checksum(&mut copy).is_ok() {
            let once = copy.clone();
            checksum::complete_l4_checksum(&mut copy).expect("completes again");
            assert_eq!(copy, once);
        }
    }
    assert_eq!(sw.events().iter().sum::<u64>(), frames);
});
