//! The `ina` worker library: what a training job links to all-reduce its gradients.
//!
//! * [`Communicator`]: in-network all-reduce through an `ina` switch, blocking
//!   ([`Communicator::allreduce_f32`], [`Communicator::allreduce_i32`]) or with several tensors
//!   in flight at once ([`Communicator::allreduce_many`]); [`AsyncCommunicator`] runs one on its
//!   own thread and takes owned tensors, returning a [`Pending`] per request.
//! * [`ring`]: the ring all-reduce over TCP, the baseline the benchmark compares against.
//!
//! The protocol itself (quantization, the window, retransmissions) lives in `ina-proto`; this
//! crate only moves its packets over a [`Port`](ina_io::Port) and keeps time. It must not
//! implement protocol decisions of its own.

pub mod agsparse;
pub mod comm;
/// DPDK ports (feature `dpdk`): a [`Communicator`] on a DPDK device is
/// `Communicator::with_port(DpdkUdpPort::new(device, &config), worker_config)`.
#[cfg(feature = "dpdk")]
pub use ina_io::dpdk;
pub mod gate;
pub mod metrics;
pub mod ring;
pub mod sparse;

pub use comm::{AsyncCommunicator, Communicator, OpStats, Pending, WorkerConfig, WorkerError};
pub use gate::Gate;
pub use ina_proto::sparse::Mode;
pub use sparse::SparseStats;
