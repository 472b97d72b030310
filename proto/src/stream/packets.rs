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
        if index < DESCRIPTOR_PACKETS || self.data_block(index).is_some() {
            self.cfg.elems_per_packet
        } else {
            0
        }
    }

    /// Writes a Query of packet `index`'s use of its slot that asks for `ask` (a header-only
    /// use can only be asked for its state).
    pub(super) fn write_query(&mut self, index: u64, ask: QueryAsk, buf: &mut [u8]) -> usize {
        let ask = if self.count_of(index) == 0 {
            QueryAsk::Status
        } else {
            ask
        };
        let repr = AggRepr {
            exponent: ask.byte(),
            ..self.header_of(index, MessageType::Query)
        };
        self.write_header_only(repr, buf)
    }

    /// Writes a Missing report of the multicast result that carried gap `counter` in the
    /// block of `slot`: the switch answers it with that use's stored result.
    pub(super) fn write_result_report(&mut self, slot: u16, counter: u8, buf: &mut [u8]) -> usize {
        let repr = AggRepr {
            set: 0,
            gap: Some(counter),
            exponent: 1,
            slot,
            seq: 0,
            ..self.header_of(0, MessageType::Missing)
        };
        self.stats.results_reported += 1;
        self.write_header_only(repr, buf)
    }

    fn write_header_only(&mut self, repr: AggRepr, buf: &mut [u8]) -> usize {
        if repr.emit_into(buf).is_err() {
            return 0; // Unreachable: poll_transmit checked the buffer against max_packet_len.
        }
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += HEADER_LEN as u64;
        HEADER_LEN
    }

    /// The float32 input elements of `block`: read, or generated into `scratch`.
    fn input_f32(&mut self, block: u64) -> Option<&[f32]> {
        let r = self.block_range(block);
        match &mut self.tensor {
            Tensor::Generated(g) => {
                let x = &mut self.scratch[..r.len()];
                g.input(r.start, x);
                Some(x)
            }
            t => match t.elements() {
                Some(Elements::F32(t)) => Some(&t[r]),
                _ => None,
            },
        }
    }

    /// Writes the Data packet `index`; `gap` is the gap counter of a first transmission.
    pub(super) fn write_packet(&mut self, index: u64, gap: Option<u8>, buf: &mut [u8]) -> usize {
        let e = usize::from(self.cfg.elems_per_packet);
        let exponent = self
            .exponent_block(index)
            .map_or(0, |b| self.input_f32(b).map_or(0, quant::block_exponent));
        let repr = AggRepr {
            exponent,
            count: self.count_of(index),
            gap,
            ..self.header_of(index, MessageType::Data)
        };
        let len = repr.buffer_len();
        let Ok(mut pkt) = repr.emit_into(buf) else {
            return 0; // Unreachable: poll_transmit checked the buffer against max_packet_len.
        };
        if index < DESCRIPTOR_PACKETS {
            let values = self.descriptor().encode(e);
            ina_wire::payload::encode_from(&values, pkt.payload_mut());
        }
        if let Some(b) = self.data_block(index) {
            let n = self.block_range(b).len();
            let payload = pkt.payload_mut();
            let agreed = self.exps.get((b % self.lookahead.max(1)) as usize).copied();
            let workers = self.cfg.total_workers;
            if let Some(x) = self.input_f32(b) {
                quant::quantize_be(x, agreed.unwrap_or(0), workers, payload);
            } else if let Some(Elements::I32(t)) = self.tensor.elements() {
                ina_wire::payload::encode_from(&t[self.block_range(b)], payload);
            }
            payload[n * 4..e * 4].fill(0);
        }
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += len as u64;
        len
    }
}
