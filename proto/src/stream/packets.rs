//! Writing the stream's packets: Data, Queries and the reports of lost results.

use super::tensor::{Elements, Tensor};
use super::{Stream, DESCRIPTOR_PACKETS};
use crate::quant::{self};
use ina_wire::{AggRepr, MessageType, QueryAsk, HEADER_LEN};

impl<'a> Stream<'a> {
    /// The header of packet `index` (its slot, set, sequence number), as `kind`.
    pub(super) fn header_of(&self, index: u64, kind: MessageType) -> AggRepr {
        let position = self.cfg.lane.next_position + index;
        let window = u64::from(self.cfg.lane.window);
        AggRepr {
            kind,
            set: ((position / window) & 1) as u8,
            gap: None,
            job: self.cfg.job,
            epoch: self.cfg.epoch,
            rank: self.cfg.rank,
            exponent: 0,
            slot: self.cfg.lane.slot_base + (position % window) as u16,
            count: 0,
            seq: position as u32,
        }
    }

    /// The payload elements of packet `index`'s data and result: E, or 0 for a header-only
    /// packet of the exponent lookahead.
    pub(super) fn count_of(&self, index: u64) -> u16 {
        if index < DESCRIPTOR_PACKETS || self.data_block(index).is_some_and(|b| b < self.blocks) {
            self.cfg.elems_per_packet
        } else {
            0
        }
    }

    /// Writes a Query of packet `index`'s use of its slot that asks for `ask`: the use's
    /// state (a complete use is answered with the result's header alone), or its result.
    ///
    /// The status Query keeps copies of results off the way back: most Queries are sent
    /// while another worker's repair completes the use, and cross its result. Its answer
    /// travels behind the result on the same path, so an answer "complete" without the
    /// result means the result was lost: the fetching Query follows at once.
    pub(super) fn write_query(&mut self, index: u64, ask: QueryAsk, buf: &mut [u8]) -> usize {
        // A use whose data carried no payload has a header-only result: its state is all
        // there is to ask for.
        let ask = if self.count_of(index) == 0 {
            QueryAsk::Status
        } else {
            ask
        };
        let repr = AggRepr {
            exponent: ask.byte(),
            ..self.header_of(index, MessageType::Query)
        };
        if repr.emit_into(buf).is_err() {
            // Unreachable: poll_transmit checked the buffer against max_packet_len.
            return 0;
        }
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += HEADER_LEN as u64;
        HEADER_LEN
    }

    /// Writes a Missing report of the multicast result that carried gap `counter` in the
    /// block of `slot`: the switch answers it with that use's stored result.
    pub(super) fn write_result_report(&mut self, slot: u16, counter: u8, buf: &mut [u8]) -> usize {
        let repr = AggRepr {
            kind: MessageType::Missing,
            set: 0,
            gap: Some(counter),
            job: self.cfg.job,
            epoch: self.cfg.epoch,
            rank: self.cfg.rank,
            exponent: 1,
            slot,
            count: 0,
            seq: 0,
        };
        if repr.emit_into(buf).is_err() {
            // Unreachable: poll_transmit checked the buffer against max_packet_len.
            return 0;
        }
        self.stats.results_reported += 1;
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += HEADER_LEN as u64;
        HEADER_LEN
    }

    /// Writes the Data packet `index`; `gap` is the gap counter of a first transmission.
    pub(super) fn write_packet(&mut self, index: u64, gap: Option<u8>, buf: &mut [u8]) -> usize {
        let data_block = self.data_block(index).filter(|b| *b < self.blocks);
        let e = usize::from(self.cfg.elems_per_packet);
        let lookahead_of = self
            .body(index)
            .filter(|b| self.tensor.is_float() && *b < self.blocks);
        let exponent = if let Some(b) = lookahead_of {
            let r = self.block_range(b);
            match &mut self.tensor {
                Tensor::Generated(g) => {
                    let x = &mut self.scratch[..r.len()];
                    g.input(r.start, x);
                    quant::block_exponent(x)
                }
                t => match t.elements() {
                    Some(Elements::F32(t)) => quant::block_exponent(&t[r]),
                    _ => 0,
                },
            }
        } else {
            0
        };
        let repr = AggRepr {
            exponent,
            count: self.count_of(index),
            gap,
            ..self.header_of(index, MessageType::Data)
        };
        let len = repr.buffer_len();
        let Ok(mut pkt) = repr.emit_into(buf) else {
            // Unreachable: poll_transmit checked the buffer against max_packet_len.
            return 0;
        };
        if index < DESCRIPTOR_PACKETS {
            let values = self.descriptor().encode(e);
            ina_wire::payload::encode_from(&values, pkt.payload_mut());
        }
        if let Some(b) = data_block {
            let r = self.block_range(b);
            let n = r.len();
            let payload = pkt.payload_mut();
            let agreed = self.exps.get((b % self.lookahead.max(1)) as usize).copied();
            match &mut self.tensor {
                Tensor::Generated(g) => {
                    let x = &mut self.scratch[..n];
                    g.input(r.start, x);
                    quant::quantize_be(x, agreed.unwrap_or(0), self.cfg.total_workers, payload);
                }
                t => match t.elements() {
                    Some(Elements::F32(t)) => {
                        quant::quantize_be(
                            &t[r],
                            agreed.unwrap_or(0),
                            self.cfg.total_workers,
                            payload,
                        );
                    }
                    Some(Elements::I32(t)) => {
                        ina_wire::payload::encode_from(&t[r], payload);
                    }
                    None => {}
                },
            }
            payload[n * 4..e * 4].fill(0);
        }
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += len as u64;
        len
    }
}
