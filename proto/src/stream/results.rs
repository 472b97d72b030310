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
        let slot = hdr
            .slot
            .checked_sub(self.cfg.lane.slot_base)
            .map(usize::from);
        let Some(slot) = slot.filter(|s| *s < self.slots.len() && hdr.epoch == self.cfg.epoch)
        else {
            self.stats.foreign += 1;
            return;
        };
        if let Some(counter) = hdr.gap {
            self.note_result_counter(hdr.slot, slot, counter);
        }
        let Some(out) = self.slots[slot].outstanding else {
            self.stats.duplicate_results += 1;
            return;
        };
        let ours = self.header_of(out.index, hdr.kind);
        if hdr.seq != ours.seq || hdr.set != ours.set {
            self.stats.duplicate_results += 1;
            return;
        }
        if hdr.count != self.count_of(out.index) {
            if hdr.count == 0 {
                self.handle_complete(now, slot, out);
            } else {
                self.stats.duplicate_results += 1;
            }
            return;
        }
        // Accepted: the packet's use of the slot is complete, the slot free for its next packet.
        self.on_result_sample(now, &out, hdr);
        self.slots[slot].outstanding = None;
        self.slots[slot].done_upto = Some(out.index);
        self.note_occupancy(now);
        self.received += 1;
        self.stall.progress_at = Some(now);
        self.stall.rounds = 0;
        self.stall.probe_last = None;
        let next = out.index + u64::from(self.cfg.lane.window);
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
        self.write_result(out.index, hdr, payload);
    }

    /// Writes the accepted result of packet `index` into the tensor, notes the exponent it
    /// agrees for the lookahead, and checks the descriptor.
    fn write_result(&mut self, index: u64, hdr: &AggRepr, payload: &[u8]) {
        if let Some(b) = self.data_block(index) {
            let r = self.block_range(b);
            let workers = self.cfg.total_workers;
            let agreed = (self.exps.get((b % self.lookahead.max(1)) as usize).copied())
                .filter(|a| *a != NON_FINITE);
            match (&mut self.tensor, agreed) {
                (Tensor::Generated(g), Some(agreed)) => {
                    let x = &mut self.scratch[..r.len()];
                    quant::dequantize_be(payload, agreed, workers, x);
                    g.result(r.start, x);
                }
                (t, agreed) => match (t.elements_mut(), agreed) {
                    (Some(ElementsMut::F32(t)), Some(agreed)) => {
                        quant::dequantize_be(payload, agreed, workers, &mut t[r]);
                    }
                    (Some(ElementsMut::I32(t)), _) => {
                        ina_wire::payload::decode_into(payload, &mut t[r]);
                    }
                    _ => {}
                },
            }
        }
        if let Some(b) = self.exponent_block(index) {
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
