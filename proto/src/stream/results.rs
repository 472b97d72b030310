//! Taking in results: completing a slot's use, freeing the slot for its next packet, and
//! writing the sums back into the tensor.

use super::config::StreamError;
use super::tensor::{ElementsMut, Tensor};
use super::{Stream, DESCRIPTOR_PACKETS};
use crate::quant::{self, NON_FINITE};
use crate::Instant;
use core::cmp::Reverse;
use ina_wire::AggRepr;

impl<'a> Stream<'a> {
    pub(super) fn handle_result(&mut self, now: Instant, hdr: &AggRepr, payload: &[u8]) {
        let base = self.cfg.lane.slot_base;
        let in_lane =
            hdr.slot >= base && u32::from(hdr.slot - base) < u32::from(self.cfg.lane.window);
        if !in_lane || hdr.epoch != self.cfg.epoch {
            self.stats.foreign += 1;
            return;
        }
        let slot = usize::from(hdr.slot - base);
        if let Some(counter) = hdr.gap {
            self.note_result_counter(hdr.slot, slot, counter);
        }
        let Some(out) = self.slots[slot].outstanding else {
            self.stats.duplicate_results += 1;
            return;
        };
        let position = self.cfg.lane.next_position + out.index;
        let window = u64::from(self.cfg.lane.window);
        let data_block = self.data_block(out.index).filter(|b| *b < self.blocks);
        let want_count = if data_block.is_some() || out.index < DESCRIPTOR_PACKETS {
            self.cfg.elems_per_packet
        } else {
            0
        };
        if hdr.seq != position as u32 || hdr.set != ((position / window) & 1) as u8 {
            self.stats.duplicate_results += 1;
            return;
        }
        if hdr.count != want_count {
            if hdr.count == 0 {
                self.handle_complete(now, slot, out);
            } else {
                self.stats.duplicate_results += 1;
            }
            return;
        }
        // Accepted: the packet's use of the slot is complete.
        self.on_result_sample(now, &out, hdr);
        self.slots[slot].outstanding = None;
        self.slots[slot].done_upto = Some(out.index);
        self.note_occupancy(now);
        self.received += 1;
        self.progress_at = Some(now);
        self.stall_rounds = 0;
        self.stall_probe_last = None;
        // The slot is free for its next packet.
        let next = out.index + window;
        if next < self.packets {
            self.ready.push(Reverse(next));
        }
        // A packet parked for this packet's exponent can go.
        if self.lookahead > 0 && self.parked.remove(&(out.index + self.lookahead)) {
            self.ready.push(Reverse(out.index + self.lookahead));
        }
        self.detect_losses(now);
        if out.index >= DESCRIPTOR_PACKETS {
            self.stats.results += 1;
        }
        self.write_result(out.index, data_block, hdr, payload);
    }

    /// Writes an accepted result of packet `index` (carrying `data_block`, if any) into the
    /// tensor, notes the exponent it agrees for the lookahead, and checks the descriptor.
    pub(super) fn write_result(
        &mut self,
        index: u64,
        data_block: Option<u64>,
        hdr: &AggRepr,
        payload: &[u8],
    ) {
        if let Some(b) = data_block {
            let r = self.block_range(b);
            let workers = self.cfg.total_workers;
            let agreed = self.exps.get((b % self.lookahead.max(1)) as usize).copied();
            match &mut self.tensor {
                Tensor::Generated(g) => {
                    if let Some(agreed) = agreed.filter(|a| *a != NON_FINITE) {
                        let x = &mut self.scratch[..r.len()];
                        quant::dequantize_be(payload, agreed, workers, x);
                        g.result(r.start, x);
                    }
                }
                t => match t.elements_mut() {
                    Some(ElementsMut::F32(t)) => {
                        if let Some(agreed) = agreed.filter(|a| *a != NON_FINITE) {
                            quant::dequantize_be(payload, agreed, workers, &mut t[r]);
                        }
                    }
                    Some(ElementsMut::I32(t)) => {
                        ina_wire::payload::decode_into(payload, &mut t[r]);
                    }
                    None => {}
                },
            }
        }
        if let Some(b) = self
            .body(index)
            .filter(|b| self.tensor.is_float() && *b < self.blocks)
        {
            self.exps[(b % self.lookahead) as usize] = hdr.exponent;
            if hdr.exponent == NON_FINITE && self.poisoned.is_none() {
                self.poisoned = Some(b);
            }
        }
        if index < DESCRIPTOR_PACKETS {
            let mut sums = vec![0i32; usize::from(self.cfg.elems_per_packet)];
            ina_wire::payload::decode_into(payload, &mut sums);
            if let Err(m) = self.descriptor().check(&sums) {
                self.failed = Some(StreamError::Mismatch(m));
            }
        }
    }
}
