//! The `ina` protocol as sans-IO state machines.
//!
//! Everything whose correctness matters lives here: the block floating point [`quant`]izer, the
//! switch's data plane ([`pipeline`], mirroring the P4 programs register for register), the
//! worker's stream [`stream`] with its [`rtt`] estimator, the [`ring`] all-reduce schedule, and
//! the controller's slot allocator ([`alloc`]).
//!
//! What it must not do: touch sockets, threads, clocks, files or an async runtime. Every
//! machine takes the current [`time::Instant`] as an argument and hands packets back to its
//! caller, so the daemons, the simulator and the tests drive the very same code.
// `unsafe` is limited to calling the AVX2 and AVX-512 compilations once the CPU is known to
// have those features (see `kernels`), and allowed only where it is used.
#![deny(unsafe_code)]

pub mod alloc;
pub mod descriptor;
pub mod event;
mod gap;
mod kernels;
pub mod l2;
pub mod pipeline;
pub mod quant;
pub mod ring;
pub mod rtt;
pub mod sparse;
pub mod stream;
pub mod time;
pub mod window;

pub use time::Instant;
