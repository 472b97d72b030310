//! One worker's benchmark loop, shared by the in-process bench and `ina worker`.

use crate::data::{fingerprint, Bound, Check, Reference};
use crate::mem::process_cpu_seconds;
use ina_worker::ring::RingComm;
use ina_worker::{Communicator, WorkerError};
use serde::Serialize;
use std::time::Instant;

/// The retransmissions one all-reduce needed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Resends {
    pub total: u64,
    /// Sent on evidence of loss, before a timer expired.
    pub fast: u64,
    /// Sent as stall probes: nothing had come back for about two round trips.
    pub stall_probes: u64,
    /// A sparse all-reduce: the fraction of blocks some worker held.
    pub union_density: Option<f64>,
}

/// An all-reduce under test.
pub trait Reducer {
    /// Sums `data` over all workers in place; returns the retransmissions it needed.
    fn allreduce(&mut self, data: &mut [f32]) -> Result<Resends, RunError>;
    /// Returns once every worker called it.
    fn barrier(&mut self) -> Result<(), RunError>;
    /// How results are bounded.
    fn bound(&self) -> Bound;
}

/// Why a worker's run stopped.
#[derive(Debug, Clone, Serialize, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct RunError {
    /// A stable name: `timeout`, `switch_restarted`, `ring`, ...
    pub kind: String,
    pub message: String,
}

impl From<WorkerError> for RunError {
    fn from(e: WorkerError) -> Self {
        RunError {
            kind: e.kind().to_string(),
            message: e.to_string(),
        }
    }
}

impl From<ina_worker::ring::RingError> for RunError {
    fn from(e: ina_worker::ring::RingError) -> Self {
        RunError {
            kind: "ring".into(),
            message: e.to_string(),
        }
    }
}

/// In-network aggregation through a switch, over a kernel UDP socket or another port.
#[derive(Debug)]
pub struct InaReducer<P: ina_io::Port<Addr = std::net::SocketAddr> = ina_io::UdpPort> {
    pub comm: Communicator<P>,
    /// Where each all-reduce's statistics are added, if anywhere.
    pub totals: Option<std::sync::Arc<std::sync::Mutex<ina_worker::metrics::StreamTotals>>>,
}

impl<P: ina_io::Port<Addr = std::net::SocketAddr>> InaReducer<P> {
    pub fn new(comm: Communicator<P>) -> InaReducer<P> {
        InaReducer { comm, totals: None }
    }
}

impl<P: ina_io::Port<Addr = std::net::SocketAddr>> Reducer for InaReducer<P> {
    fn allreduce(&mut self, data: &mut [f32]) -> Result<Resends, RunError> {
        let s = self.comm.allreduce_f32(data)?;
        if let Some(t) = &self.totals {
            if let Ok(mut t) = t.lock() {
                t.record(&s.stream, self.comm.job().window);
            }
        }
        let support = s.sparse.map(|x| x.support).unwrap_or_default();
        Ok(Resends {
            total: s.stream.retransmissions + support.retransmissions,
            fast: s.stream.fast_retransmissions + support.fast_retransmissions,
            stall_probes: s.stream.stall_probes + support.stall_probes,
            union_density: s.sparse.map(|x| x.union_density),
        })
    }

    fn barrier(&mut self) -> Result<(), RunError> {
        self.comm.allreduce_i32(&mut [1])?;
        Ok(())
    }

    fn bound(&self) -> Bound {
        Bound::Quantized
    }
}

/// The TCP ring: its all-reduce, or with `sparse_block` the sparse all-gather baseline over
/// its connections, in blocks of that many elements.
#[derive(Debug)]
pub struct RingReducer {
    pub comm: RingComm,
    pub sparse_block: Option<usize>,
}

impl Reducer for RingReducer {
    fn allreduce(&mut self, data: &mut [f32]) -> Result<Resends, RunError> {
        match self.sparse_block {
            Some(block) => self.comm.allreduce_sparse_f32(data, block)?,
            None => self.comm.allreduce_f32(data)?,
        }
        Ok(Resends::default())
    }

    fn barrier(&mut self) -> Result<(), RunError> {
        self.comm.allreduce_i32(&mut [1])?;
        Ok(())
    }

    fn bound(&self) -> Bound {
        Bound::Float
    }
}

/// One iteration as one worker saw it.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct IterRecord {
    pub iteration: usize,
    pub warmup: bool,
    pub seconds: f64,
    /// CPU time of the whole process (every thread) while this worker's all-reduce ran.
    #[serde(default)]
    pub process_cpu_seconds: Option<f64>,
    pub retransmissions: u64,
    #[serde(default)]
    pub fast_retransmissions: u64,
    #[serde(default)]
    pub stall_probes: u64,
    /// `None` when not verified.
    pub max_abs_err: Option<f64>,
    pub max_rel_err: Option<f64>,
    pub violations: Option<u64>,
    pub first_violation: Option<usize>,
    pub fingerprint: Option<u64>,
    /// A sparse all-reduce: the fraction of blocks some worker held.
    #[serde(default)]
    pub union_density: Option<f64>,
}

/// Runs `warmup + iterations` all-reduces of a copy of `input` (made in `buf`, which is
/// resized to fit), each after a barrier, checking every result against `reference` when one
/// is given. `on_iter` sees each record as it ends.
pub fn run_iterations(
    reducer: &mut dyn Reducer,
    input: &[f32],
    buf: &mut Vec<f32>,
    reference: Option<&Reference>,
    warmup: usize,
    iterations: usize,
    on_iter: &mut dyn FnMut(&IterRecord),
) -> Result<Vec<IterRecord>, RunError> {
    buf.resize(input.len(), 0.0);
    let mut records = Vec::with_capacity(warmup + iterations);
    for iteration in 0..warmup + iterations {
        buf.copy_from_slice(input);
        reducer.barrier()?;
        let cpu_start = process_cpu_seconds();
        let start = Instant::now();
        let resends = reducer.allreduce(buf)?;
        let seconds = start.elapsed().as_secs_f64();
        let process_cpu_seconds = cpu_start
            .zip(process_cpu_seconds())
            .map(|(a, b)| (b - a).max(0.0));
        // Everyone finishes before anyone checks or refills its tensor, so that no worker's
        // checking runs while another's all-reduce is being timed.
        reducer.barrier()?;
        let check: Option<Check> = reference.map(|r| r.check(buf, reducer.bound()));
        let record = IterRecord {
            iteration,
            warmup: iteration < warmup,
            seconds,
            process_cpu_seconds,
            retransmissions: resends.total,
            fast_retransmissions: resends.fast,
            stall_probes: resends.stall_probes,
            max_abs_err: check.map(|c| c.max_abs_err),
            max_rel_err: check.map(|c| c.max_rel_err),
            violations: check.map(|c| c.violations),
            first_violation: check.and_then(|c| c.first_violation),
            fingerprint: reference.map(|_| fingerprint(buf)),
            union_density: resends.union_density,
        };
        on_iter(&record);
        records.push(record);
    }
    Ok(records)
}
