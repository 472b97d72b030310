//! A worker's `Stream` over a small tensor, fed arbitrary datagrams, timeouts and transmit polls
//! in an arbitrary order: never a panic, never more packets in flight than the window, and
//! nothing sent but Data, Queries and (with reports) Missing reports of lost results, all in
//! the lane.
//!
//! Input: a config byte (float or int tensor, tensor length, elements per packet, window,
//! workers, rank), then records of `op, ...`:
//! * 0: poll_transmit (the packet is remembered);
//! * 1: arbitrary bytes as a datagram;
//! * 2: a Result built from a remembered packet (its slot, set and seq, the fuzzer's exponent,
//!   count and payload), as the switch would send it;
//! * 3: a remembered packet with a few bytes overwritten;
//! * 4: a Reject of a remembered packet;
//! * 5: time passes, poll_timeout and handle_timeout.
#![no_main]

use core::time::Duration;
use ina_proto::rtt::{RtoConfig, RttEstimator};
use ina_proto::stream::{Lane, Stream, StreamConfig, Tensor};
use ina_proto::Instant;
use ina_wire::{AggRepr, MessageType, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

const JOB: u16 = 3;
const EPOCH: u16 = 17;

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

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let c = inp.byte();
    let float = c & 1 == 0;
    let len = usize::from(inp.byte() % 24);
    let elems = u16::from(c >> 1 & 3) + 1;
    let window = u16::from(c >> 3 & 3) + 1;
    let workers = (c >> 5) + 1;
    let rank = inp.byte() % workers;
    // Every other run streams through a lane of one whole gap block, with Missing reports.
    let reports = inp.byte() & 1 == 1;
    let (slot_base, window) = if reports { (128, 64) } else { (100, window) };
    let cfg = StreamConfig {
        job: JOB,
        epoch: EPOCH,
        rank,
        workers,
        total_workers: workers.into(),
        elems_per_packet: elems,
        lane: Lane::new(slot_base, window),
        max_retries: u32::from(inp.byte() % 4),
        give_up: Duration::from_millis(200),
        gap_reports: reports,
        rules: Default::default(),
    };
    let values = inp.bytes(len * 4).to_vec();
    let tensor = if float {
        let mut t: Vec<f32> = values
            .chunks(4)
            .map(|b| {
                let mut w = [0u8; 4];
                w[..b.len()].copy_from_slice(b);
                f32::from_le_bytes(w)
            })
            .collect();
        t.resize(len, 0.5);
        Tensor::F32Owned(t)
    } else {
        let mut t: Vec<i32> = values
            .chunks(4)
            .map(|b| {
                let mut w = [0u8; 4];
                w[..b.len()].copy_from_slice(b);
                i32::from_le_bytes(w)
            })
            .collect();
        t.resize(len, 1);
        Tensor::I32Owned(t)
    };
    let Ok(mut stream) = Stream::new(cfg, tensor, RttEstimator::new(RtoConfig::default())) else {
        return;
    };
    let max_len = stream.max_packet_len();
    let mut buf = vec![0u8; max_len + 8];
    let mut sent: Vec<Vec<u8>> = Vec::new();
    let mut now = Instant::from_nanos(1_000_000);
    while !inp.is_empty() {
        match inp.byte() % 6 {
            0 => {
                if let Ok(Some(n)) = stream.poll_transmit(now, &mut buf) {
                    assert!(n <= max_len);
                    let pkt = &buf[..n];
                    match AggRepr::parse_bytes(pkt) {
                        Ok((h, _)) => {
                            // (A Missing: a result its gap counter showed lost, with reports.)
                            let report = reports && h.kind == MessageType::Missing;
                            assert!(
                                matches!(h.kind, MessageType::Data | MessageType::Query) || report
                            );
                            assert!(h.slot >= slot_base && h.slot < slot_base + window);
                        }
                        Err(e) => panic!("the stream sent an unparsable packet: {e}"),
                    }
                    sent.push(pkt.to_vec());
                    if sent.len() > 16 {
                        sent.remove(0);
                    }
                }
            }
            1 => {
                let n = usize::from(inp.byte());
                stream.handle_datagram(now, inp.bytes(n));
            }
            2 | 4 => {
                let Some(pkt) = pick(&mut inp, &sent) else {
                    continue;
                };
                let Ok((h, _)) = AggRepr::parse_bytes(pkt) else {
                    continue;
                };
                let reject = inp.byte();
                let exp = inp.byte();
                let count = match inp.byte() % 4 {
                    0 => 0,
                    1 => u16::from(inp.byte() % 8),
                    _ => h.count,
                };
                let repr = if reject & 4 == 4 {
                    // A Missing report naming some of this block's first transmissions.
                    AggRepr {
                        kind: MessageType::Missing,
                        gap: Some(exp % 64),
                        exponent: reject >> 3,
                        count: 0,
                        ..h
                    }
                } else if reject & 1 == 1 {
                    AggRepr {
                        kind: MessageType::Reject,
                        exponent: reject % 4,
                        epoch: if reject & 2 == 0 { EPOCH } else { EPOCH + 1 },
                        count: 0,
                        ..h
                    }
                } else {
                    AggRepr {
                        kind: MessageType::Result,
                        exponent: exp,
                        count,
                        rank: if reject & 2 == 0 { h.rank } else { reject },
                        ..h
                    }
                };
                let mut out = vec![0u8; repr.buffer_len()];
                if let Ok(mut p) = repr.emit_into(&mut out) {
                    let src = inp.bytes(p.payload_mut().len());
                    p.payload_mut()[..src.len()].copy_from_slice(src);
                }
                stream.handle_datagram(now, &out);
            }
            3 => {
                let Some(pkt) = pick(&mut inp, &sent) else {
                    continue;
                };
                let mut pkt = pkt.clone();
                for _ in 0..inp.byte() % 4 {
                    let i = usize::from(inp.byte()) % HEADER_LEN.min(pkt.len());
                    pkt[i] = inp.byte();
                }
                stream.handle_datagram(now, &pkt);
            }
            _ => {
                now = now + Duration::from_micros(u64::from(inp.byte()) * 500);
                if let Some(t) = stream.poll_timeout() {
                    if t <= now {
                        stream.handle_timeout(now);
                    }
                }
            }
        }
        let stats = stream.stats();
        assert!(stats.results <= stats.packets_sent);
        assert!(stats.results <= stats.packets);
        if stream.poll_outcome().is_some() {
            // A finished stream sends nothing more.
            assert!(matches!(stream.poll_transmit(now, &mut buf), Ok(None)));
        }
    }
    let _ = stream.into_tensor();
});

fn pick<'s>(inp: &mut Input<'_>, sent: &'s [Vec<u8>]) -> Option<&'s Vec<u8>> {
    if sent.is_empty() {
        return None;
    }
    let i = usize::from(inp.byte()) % sent.len();
    sent.get(sent.len() - 1 - i)
}
