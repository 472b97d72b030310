//! The switch pipeline fed a sequence of packets and frames from arbitrary ports: never a panic,
//! every packet is accounted for by exactly one outcome counter, and every reply parses.
//!
//! Input: records of `op, port, dt, ...`. The low two bits of `op` choose a raw `ina` packet
//! (arbitrary bytes), a raw frame, a templated packet (header fields from the input but
//! well-formed: the right version, mostly the installed job and epoch, a small slot, rank and
//! seq range, so that the decision table is reached), or a templated packet in a frame. Bit 2
//! makes the reply buffer short; bit 3 sends a templated frame to a port other than the `ina`
//! port.
#![no_main]

use ina_proto::pipeline::{Counters, JobConfig, Pipeline, PipelineConfig, PortId, Uplink, Verdict};
use ina_proto::Instant;
use ina_wire::frame::{self, FrameAddrs, FRAME_HEADER_LEN};
use ina_wire::{AggRepr, MessageType, HEADER_LEN, UDP_PORT};
use libfuzzer_sys::fuzz_target;

const JOB: u16 = 5;
const EPOCH: u16 = 9;
const MAX_ELEMS: u16 = 8;
const ELEMS: u16 = 4;
const SLOT_BASE: u16 = 4;
const SLOT_COUNT: u16 = 8;
const PORTS: [u16; 3] = [10, 11, 12];

struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Outcome counters: each packet moves exactly one of them by one.
fn outcomes(c: &Counters) -> u64 {
    c.drops_total()
        + c.data_first
        + c.data_added
        + c.results_unicast
        + c.pending_sent
        + c.probes_answered
        // (A rack switch of a tree: a partial sent again, a Query up, a total, the upper's
        // answers and Missing reports.)
        + c.partials_resent
        + c.queries_up
        + c.totals_received
        + c.upstream_pending
        + c.upstream_rejects
        + c.partials_reported
        + c.upstream_missing
        + c.partials_for_fetch
        // (An upper switch: a rank's Missing report that names no use.)
        + c.missing_unmatched
}

fn templated(inp: &mut Input<'_>) -> Vec<u8> {
    let kinds = [
        MessageType::Data,
        MessageType::Data,
        MessageType::Data,
        MessageType::Probe,
        MessageType::Result,
        MessageType::Reject,
        MessageType::ProbeReply,
        MessageType::Query,
        MessageType::Pending,
        MessageType::Missing,
    ];
    let k = inp.byte();
    let kind = kinds[usize::from(k) % kinds.len()];
    let sel = inp.byte();
    let job = if sel & 0x80 == 0 { JOB } else { u16::from(sel) };
    let epoch = if sel & 0x40 == 0 {
        EPOCH
    } else {
        u16::from(inp.byte())
    };
    let rank = inp.byte() % 5;
    let exponent = inp.byte();
    let slot = u16::from(inp.byte()) % (SLOT_BASE + SLOT_COUNT + 2);
    let count = match inp.byte() % 8 {
        0 => 0,
        1 => u16::from(inp.byte()) % (MAX_ELEMS + 2),
        _ => ELEMS,
    };
    let seq = u32::from(inp.byte() % 24);
    let gap = inp.byte();
    let repr = AggRepr {
        kind,
        set: (sel >> 5) & 1,
        gap: (gap & 0x80 != 0).then_some(gap % 64),
        job,
        epoch,
        rank,
        exponent,
        slot,
        count,
        seq,
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    match repr.emit_into(&mut buf) {
        Ok(mut p) => {
            let src = inp.bytes(p.payload_mut().len());
            p.payload_mut()[..src.len()].copy_from_slice(src);
        }
        Err(e) => panic!("emit into a buffer of buffer_len: {e}"),
    }
    buf
}

fn check_reply(bytes: &[u8], framed: bool) {
    let packet = if framed {
        match frame::parse(bytes) {
            Ok(f) => f.payload,
            Err(e) => panic!("reply frame does not parse: {e}"),
        }
    } else {
        bytes
    };
    if let Err(e) = AggRepr::parse_bytes(packet) {
        panic!("reply does not parse: {e}");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut pipe = Pipeline::new(PipelineConfig {
        pool_slots: 16,
        max_elems: MAX_ELEMS,
    });
    pipe.set_gap_reports(true);
    let job = JobConfig {
        job: JOB,
        epoch: EPOCH,
        slot_base: SLOT_BASE,
        slot_count: SLOT_COUNT,
        elems_per_packet: ELEMS,
        ranks: PORTS.iter().map(|p| PortId(*p)).collect(),
        // With an odd first byte the switch is a rack switch of a tree, whose upper switch
        // (port 13, the same job id, another epoch) sends totals, Pendings and Rejects.
        uplink: (data.first().is_some_and(|b| b & 1 == 1)).then_some(Uplink {
            port: PortId(13),
            job: JOB,
            epoch: EPOCH + 1,
            rank: 2,
            slot_base: SLOT_BASE + 2,
        }),
    };
    if let Err(e) = pipe.add_job(job) {
        panic!("job: {e}");
    }
    let addrs = FrameAddrs {
        src_mac: ina_wire::MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: ina_wire::MacAddr([2, 0, 0, 0, 0, 2]),
        src_ip: [198, 18, 0, 1],
        dst_ip: [198, 18, 0, 2],
        src_port: 40000,
        dst_port: UDP_PORT,
    };
    let full = FRAME_HEADER_LEN + HEADER_LEN + 4 * usize::from(MAX_ELEMS);
    let mut now = Instant::ZERO;
    let mut inp = Input(data);
    while !inp.is_empty() {
        let op = inp.byte();
        let p = inp.byte();
        let port = PortId(if p < 192 {
            PORTS[usize::from(p) % PORTS.len()]
        } else {
            u16::from(p) % 16
        });
        now = now + core::time::Duration::from_micros(u64::from(inp.byte()));
        let framed = op & 1 == 1;
        let packet = if op & 2 == 0 {
            let len = usize::from(inp.byte());
            inp.bytes(len).to_vec()
        } else {
            let pkt = templated(&mut inp);
            if framed {
                let a = FrameAddrs {
                    dst_port: if op & 8 == 0 {
                        UDP_PORT
                    } else {
                        u16::from(inp.byte())
                    },
                    ..addrs
                };
                let mut f = vec![0u8; FRAME_HEADER_LEN + pkt.len()];
                if frame::emit_headers(&mut f, &a, pkt.len()).is_err() {
                    continue;
                }
                f[FRAME_HEADER_LEN..].copy_from_slice(&pkt);
                f
            } else {
                pkt
            }
        };
        let short = op & 4 != 0;
        let out_len = if short {
            usize::from(inp.byte()) % 64
        } else {
            full
        };
        let mut out = vec![0u8; out_len];

        let before = *pipe.counters();
        // What a verdict says: the reply's length, the drop reason.
        let summary = |verdict: Verdict<'_>| match verdict {
            Verdict::Drop(r) => (None, Some(r)),
            Verdict::Absorbed => (None, None),
            Verdict::Unicast { port: to, len } => {
                assert!(
                    to == port || to == PortId(13),
                    "unicast replies go back to the sender, partial sums to the upper switch"
                );
                (Some(len), None)
            }
            Verdict::Multicast { ports, len } => {
                let want: Vec<PortId> = PORTS.iter().map(|p| PortId(*p)).collect();
                assert_eq!(ports, &want[..]);
                (Some(len), None)
            }
        };
        let (reply, drop_reason) = if framed {
            summary(pipe.process_frame(port, &packet, now, &mut out))
        } else if op & 16 != 0 {
            // The same packet through a burst of one (the switch daemon's entry).
            pipe.burst(|b| summary(b.process(port, &packet, now, &mut out)))
        } else {
            summary(pipe.process(port, &packet, now, &mut out))
        };
        let after = *pipe.counters();
        assert_eq!(after.packets_in, before.packets_in + 1);
        assert_eq!(after.bytes_in, before.bytes_in + packet.len() as u64);
        assert_eq!(
            outcomes(&after),
            outcomes(&before) + 1,
            "one outcome per packet: {before:?} -> {after:?}"
        );
        // The reason in the verdict is the one counted, short reply buffer or not.
        if let Some(r) = drop_reason {
            assert_eq!(after.drops(r), before.drops(r) + 1, "{r:?} is counted");
        }
        if let Some(len) = reply {
            assert!(
                len <= out.len(),
                "reply of {len} bytes in {} bytes",
                out.len()
            );
            if !short {
                check_reply(&out[..len], framed);
            }
        }
        assert!(pipe.busy_slots() <= usize::from(SLOT_COUNT));
    }
    let c = pipe.counters();
    assert_eq!(outcomes(c), c.packets_in);
});
