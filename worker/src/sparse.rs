//! Sparse all-reduce on a [`Communicator`] (PROTOCOL.md §5, "Sparse streams"): the support
//! stream, then the values stream over the union, as two tensors of the communicator's
//! sequence. The mode of each tensor comes from the caller or, with [`Mode::Auto`], from the
//! union density the previous all-reduce of its shape measured, which every rank saw alike.

use crate::comm::{Communicator, OpStats, WorkerError};
use ina_io::Port;
use ina_proto::sparse::{self, Element, Mode};
use ina_proto::stream::{StreamStats, Tensor};
use std::net::SocketAddr;

/// What the sparse part of an all-reduce did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SparseStats {
    /// The fraction of blocks this rank held.
    pub own_density: f64,
    /// The fraction of blocks some rank held (the union's).
    pub union_density: f64,
    /// The support stream.
    pub support: StreamStats,
}

impl<P: Port<Addr = SocketAddr>> Communicator<P> {
    /// Sums `data` over all workers of the job, in place, dense or sparse as `mode` says
    /// (every rank must pass the same mode for the same tensor). [`OpStats::sparse`] says
    /// which was used.
    pub fn allreduce_f32_with(
        &mut self,
        data: &mut [f32],
        mode: Mode,
    ) -> Result<OpStats, WorkerError> {
        self.allreduce_with(data, true, mode, |d| Tensor::F32(d))
    }

    /// [`Self::allreduce_f32_with`] for int32 (the sums wrap around).
    pub fn allreduce_i32_with(
        &mut self,
        data: &mut [i32],
        mode: Mode,
    ) -> Result<OpStats, WorkerError> {
        self.allreduce_with(data, false, mode, |d| Tensor::I32(d))
    }

    fn allreduce_with<T: Element>(
        &mut self,
        data: &mut [T],
        float: bool,
        mode: Mode,
        tensor: for<'x> fn(&'x mut [T]) -> Tensor<'x>,
    ) -> Result<OpStats, WorkerError> {
        let e = usize::from(self.job().info.elems_per_packet);
        if !self.chooser.sparse(mode, data.len(), float) {
            let stats = self.allreduce_one(tensor(data))?;
            if mode == Mode::Auto {
                let density = sparse::result_density(data, e);
                self.chooser.record(data.len(), float, density);
            }
            return Ok(stats);
        }
        let started = std::time::Instant::now();
        let threshold = self.cfg.sparse_threshold;
        let blocks = sparse::blocks(data.len(), e);
        let (mut support, unclean) = sparse::scan(data, e, threshold);
        // The values stream reads and writes the union's blocks in place, and leaves the
        // others alone: a block this rank does not hold must read as zeros and end as +0.0.
        for b in unclean {
            let end = ((b + 1) * e).min(data.len());
            data[b * e..end].fill(T::default());
        }
        let held = support.iter().filter(|&&c| c != 0).count();
        let scanned = started.elapsed();
        let support_stats = self.allreduce_one(Tensor::Support(&mut support, float))?;
        let supported = started.elapsed();
        let union = sparse::union(&support, blocks);
        let values_stats = if union.is_empty() {
            OpStats::default()
        } else {
            let of = Box::new(tensor(&mut *data));
            self.allreduce_one(Tensor::Blocks {
                of,
                blocks: union.clone(),
                elems_per_block: e,
            })?
        };
        tracing::debug!(
            ?scanned,
            ?supported,
            reduced = ?started.elapsed(),
            union = union.len(),
            "sparse all-reduce"
        );
        let union_density = sparse::density(&union, blocks);
        self.chooser.record(data.len(), float, union_density);
        Ok(OpStats {
            elements: data.len(),
            stream: values_stats.stream,
            elapsed: started.elapsed(),
            sparse: Some(SparseStats {
                own_density: if blocks == 0 {
                    0.0
                } else {
                    held as f64 / blocks as f64
                },
                union_density,
                support: support_stats.stream,
            }),
        })
    }

    /// One tensor through [`Self::allreduce_many`].
    pub(crate) fn allreduce_one(&mut self, tensor: Tensor<'_>) -> Result<OpStats, WorkerError> {
        let mut r = self.allreduce_many(&mut [tensor]);
        r.pop().unwrap_or(Err(WorkerError::Disconnected))
    }
}
