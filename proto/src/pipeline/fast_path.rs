//! The data path as it runs: [`Pipeline::process`] compiled for the widest vectors the CPU
//! has, and its fast path, which takes a full Data packet of an installed job straight to the
//! slot update (`data`) when one comparison of its header bytes shows that it passes every
//! check. Every other packet takes the general path (`checks`), compiled apart.

use super::{DropReason, Pipeline, PortId, Report, Verdict};
use crate::kernels::{self, Isa};
use crate::Instant;
use ina_wire::{AggPacket, MessageType, HEADER_LEN, PROTOCOL_VERSION};

#[cfg(test)]
mod tests;

impl Pipeline {
    /// Runs `f` with a [`Burst`] of this pipeline: the same [`Burst::process`] as
    /// [`Self::process`], but inlined, with `f`, into one function compiled for the widest
    /// vectors the CPU has. A caller that has several packets at hand (a receive batch) saves
    /// a call, and the saving and restoring of registers, per packet: the fast path of every
    /// packet runs inside its own loop.
    ///
    /// `f` should be a closure marked `#[inline(always)]`, and so should every function and
    /// closure between it and [`Burst::process`]: code the compiler keeps out of line is
    /// compiled for the baseline target (still correct, only slower).
    #[inline]
    pub fn burst<R>(&mut self, f: impl FnOnce(&mut Burst<'_>) -> R) -> R {
        #[cfg(target_arch = "x86_64")]
        match self.isa {
            // SAFETY: the CPU has the features of each function (`isa` is `Isa::detect`'s
            // answer, asked in `new`), their only requirement.
            #[allow(unsafe_code)]
            Isa::Avx512 => return unsafe { burst_avx512(self, f) },
            #[allow(unsafe_code)]
            Isa::Avx2 => return unsafe { burst_avx2(self, f) },
            Isa::Baseline => {}
        }
        f(&mut Burst { pipe: self })
    }

    /// [`Self::process_inner`] compiled for the widest vectors the CPU has, so that the loops
    /// over the elements are inlined in that form (see the `kernels` module).
    #[inline]
    pub(super) fn process_dispatch(
        &mut self,
        ingress: PortId,
        packet: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        #[cfg(target_arch = "x86_64")]
        match self.isa {
            // SAFETY: the CPU has the features of each function (`isa` is `Isa::detect`'s
            // answer, asked in `new`), their only requirement.
            #[allow(unsafe_code)]
            Isa::Avx512 => return unsafe { self.process_inner_avx512(ingress, packet, now, out) },
            #[allow(unsafe_code)]
            Isa::Avx2 => return unsafe { self.process_inner_avx2(ingress, packet, now, out) },
            Isa::Baseline => {}
        }
        self.process_baseline::<true>(ingress, packet, now, out)
    }

    /// [`Self::process_inner`] out of line, compiled for the baseline target. With the fast path
    /// (`FAST`) it is the baseline compilation of `process`. Without it, it is the general path,
    /// which every compilation calls for every packet the fast path does not take: its checks,
    /// refusals and replies then take no room (nor registers) in the fast path's function.
    #[inline(never)]
    fn process_baseline<const FAST: bool>(
        &mut self,
        ingress: PortId,
        packet: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        self.process_inner::<FAST>(ingress, packet, now, out)
    }

    /// One packet: with `FAST`, the fast path, and the general path out of line for what it
    /// does not take; without, the general path.
    #[inline(always)]
    fn process_inner<const FAST: bool>(
        &mut self,
        ingress: PortId,
        packet: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        // The header as a fixed-size view: its accessors need no bounds checks, and each field
        // is read where it is used.
        let (Some(header), Some(payload_bytes)) =
            (packet.first_chunk::<HEADER_LEN>(), packet.get(HEADER_LEN..))
        else {
            return self.drop(DropReason::Malformed);
        };
        if !FAST {
            return self.check(ingress, header, payload_bytes, now, out);
        }
        // (A result must fit `out` as well: the fast path's slot update then needs no
        // check of its own that it does.)
        if let Some(job_idx) = self
            .fast_data_job(header, packet.len(), ingress)
            .filter(|_| out.len() >= packet.len())
        {
            let view = AggPacket::new_unchecked(header);
            // The payload lengths of Tofino's element counts (64 and 256) as constants:
            // the slot update is compiled for each, with its loops over the elements
            // unrolled into straight-line vector code.
            if let Ok(p) = <&[u8; 256]>::try_from(payload_bytes) {
                return self.aggregate(job_idx, &view, p, ingress, now, out);
            }
            if let Ok(p) = <&[u8; 1024]>::try_from(payload_bytes) {
                return self.aggregate(job_idx, &view, p, ingress, now, out);
            }
            return self.aggregate(job_idx, &view, payload_bytes, ingress, now, out);
        }
        self.process_baseline::<false>(ingress, packet, now, out)
    }

    /// The job of a data packet that passes every check of the decision table before the
    /// registers: version and type, job, rank and port, epoch, slot range, a full payload.
    /// `None` for every other packet, which the general path then examines (so that this
    /// path only needs to be fast, and the general one alone decides refusals and drops).
    #[inline(always)]
    fn fast_data_job(
        &self,
        header: &[u8; HEADER_LEN],
        packet_len: usize,
        ingress: PortId,
    ) -> Option<usize> {
        const DATA: u8 = PROTOCOL_VERSION << 4 | MessageType::Data as u8;
        let [ver_type, _, j0, j1, e0, e1, rank, _, s0, s1, c0, c1, ..] = *header;
        if ver_type != DATA {
            return None;
        }
        // Job id, epoch and count are compared in the packet's byte order; with the count
        // matching, the packet's length tells that the payload holds the count's elements.
        let job_idx = self.jobs.iter().position(|j| j.key == [j0, j1, e0, e1])?;
        let job = self.jobs.get(job_idx)?;
        let slot = u16::from_be_bytes([s0, s1]);
        // (`Job::port_of` spelled out: this form takes fewer instructions here.)
        let rank = u32::from(rank);
        let fits = [c0, c1] == job.count_bytes
            && packet_len == job.packet_len
            && rank < job.workers
            && job.ports[(rank % 32) as usize] == ingress
            && slot.wrapping_sub(job.cfg.slot_base) < job.cfg.slot_count;
        fits.then_some(job_idx)
    }
}

/// The pipeline inside [`Pipeline::burst`]: [`Burst::process`] is [`Pipeline::process`],
/// inlined into the caller's loop.
#[derive(Debug)]
pub struct Burst<'p> {
    pipe: &'p mut Pipeline,
}

impl Burst<'_> {
    /// [`Pipeline::poll_report`].
    #[inline(always)]
    pub fn poll_report(&mut self) -> Option<Report> {
        self.pipe.report.take()
    }

    /// [`Pipeline::process`] of one packet.
    #[inline(always)]
    pub fn process(
        &mut self,
        ingress: PortId,
        packet: &[u8],
        now: Instant,
        out: &mut [u8],
    ) -> Verdict<'_> {
        self.pipe.count_arrival(packet.len());
        kernels::prefetch(packet);
        self.pipe.process_inner::<true>(ingress, packet, now, out)
    }
}

/// Compiles the data path for the CPU features `$features`: `Pipeline::$process`, one packet
/// through [`Pipeline::process_inner`] with the fast path, and `$burst`, [`Pipeline::burst`].
/// Each is `unsafe`: the CPU must support `$features`, their only requirement.
macro_rules! compile_for {
    ($features:literal, $process:ident, $burst:ident) => {
        impl Pipeline {
            #[target_feature(enable = $features)]
            #[allow(unsafe_code)]
            unsafe fn $process(
                &mut self,
                ingress: PortId,
                packet: &[u8],
                now: Instant,
                out: &mut [u8],
            ) -> Verdict<'_> {
                kernels::prefetch(packet);
                self.process_inner::<true>(ingress, packet, now, out)
            }
        }

        #[target_feature(enable = $features)]
        #[allow(unsafe_code)]
        unsafe fn $burst<R>(pipe: &mut Pipeline, f: impl FnOnce(&mut Burst<'_>) -> R) -> R {
            f(&mut Burst { pipe })
        }
    };
}

#[cfg(target_arch = "x86_64")]
compile_for!("avx2", process_inner_avx2, burst_avx2);
// (With byte and word operations, for the byte swaps of 16 elements at a time.)
#[cfg(target_arch = "x86_64")]
compile_for!(
    "avx512f,avx512bw,avx512vl",
    process_inner_avx512,
    burst_avx512
);
