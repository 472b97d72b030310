//! The native half of the `ina` Python package (`ina._native`): the worker library's
//! communicator, for the Python layer in `ina/__init__.py` to drive.
//!
//! The Python layer resolves a tensor to its memory (address, element count, element type)
//! through the buffer protocol and keeps the exporting object alive until the all-reduce has
//! ended; this module sums that memory in place on the communicator's thread with the GIL
//! released. It must not decide protocol matters (the worker library does) nor read any
//! Python object's memory after its [`Handle`] has ended.

use ina_controller_client::client::Client;
use ina_controller_client::member::Member;
use ina_io::UdpConfig;
use ina_proto::stream::{StreamError, Tensor};
use ina_worker::{
    AsyncCommunicator, Communicator, Gate, OpStats, Pending, WorkerConfig, WorkerError,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

create_exception!(
    ina,
    Error,
    PyRuntimeError,
    "An all-reduce through the switch, or setting up the communicator, failed."
);
create_exception!(
    ina,
    Timeout,
    Error,
    "No result within give_up: a rank, the switch or the way back is gone. `missing_ranks` names \
     the ranks whose data the switch lacked, when it said."
);
create_exception!(
    ina,
    SwitchRestarted,
    Error,
    "The switch restarted or reinstalled the job: the in-flight sums are lost."
);
create_exception!(
    ina,
    Rejected,
    Error,
    "The switch refused a packet: the job's configuration differs from this worker's."
);
create_exception!(
    ina,
    NonFinite,
    Error,
    "The tensor holds a NaN or an infinity, which the switch's integer sums cannot carry."
);
create_exception!(
    ina,
    Mismatch,
    Error,
    "The ranks do not all-reduce the same thing (element type, length or worker count)."
);
create_exception!(
    ina,
    ConfigError,
    Error,
    "The communicator's configuration is invalid, or the switch or controller cannot be \
     reached to set it up."
);

/// The Python exception for a worker error. A timeout carries the missing ranks, when known.
fn to_py(py: Python<'_>, e: &WorkerError, note: Option<&str>) -> PyErr {
    let message = match note {
        Some(n) => format!("{e} ({n})"),
        None => e.to_string(),
    };
    let inner = match e {
        WorkerError::Broken(inner) => inner.as_ref(),
        other => other,
    };
    let err = match inner {
        WorkerError::Timeout(_) | WorkerError::SwitchUnreachable { .. } => {
            Timeout::new_err(message)
        }
        WorkerError::SwitchRestarted { .. } => SwitchRestarted::new_err(message),
        WorkerError::Rejected(_) => Rejected::new_err(message),
        WorkerError::NonFinite(_) => NonFinite::new_err(message),
        WorkerError::Mismatch(_) => Mismatch::new_err(message),
        WorkerError::Config(_) | WorkerError::JobMismatch(_) | WorkerError::PathMtu { .. } => {
            ConfigError::new_err(message)
        }
        WorkerError::Io(_) | WorkerError::Broken(_) | WorkerError::Disconnected => {
            Error::new_err(message)
        }
    };
    if let WorkerError::Timeout(StreamError::GaveUp { missing, .. }) = inner {
        let value = err.value(py);
        let ranks: Option<Vec<u32>> = missing
            .as_ref()
            .map(|m| m.iter().map(|&r| u32::from(r)).collect());
        let _ = value.setattr("missing_ranks", ranks);
    }
    err
}

fn config_err(message: impl std::fmt::Display) -> PyErr {
    ConfigError::new_err(message.to_string())
}

fn seconds(name: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err(format!("{name}={s}: a positive number of seconds")))
}

fn resolve(name: &str, addr: &str) -> PyResult<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|e| config_err(format_args!("{name}={addr:?}: {e}")))?
        .next()
        .ok_or_else(|| config_err(format_args!("{name}={addr:?}: no address")))
}

/// What every worker of a job must agree on, and the timeouts.
struct Tuning {
    lanes: u16,
    give_up: Duration,
    probe_timeout: Duration,
    total_workers: Option<u16>,
}

impl Tuning {
    fn apply(&self, cfg: &mut WorkerConfig, world_size: u8) {
        cfg.lanes = self.lanes;
        // `give_up` is the one bound this API documents: a switch that answers but cannot yet
        // take a packet (its host busy with the ranks' training, its socket full) gets the
        // whole of it, not a count of retransmissions that its answers use up in milliseconds.
        cfg.max_retries = u32::MAX;
        cfg.give_up = self.give_up;
        cfg.probe_timeout = self.probe_timeout;
        match self.total_workers {
            Some(n) => cfg.total_workers = Some(n),
            None => cfg.expect_workers = Some(world_size),
        }
    }
}

/// The native communicator: one per process and job.
#[pyclass(module = "ina._native")]
struct NativeCommunicator {
    comm: Mutex<Option<AsyncCommunicator>>,
    /// Heartbeats to the controller, for a job joined by name that asked for them.
    member: Mutex<Option<Member>>,
    /// The ranks the controller reported gone, if it declared the job failed.
    failed: Arc<Mutex<Option<Vec<u16>>>>,
    #[pyo3(get)]
    rank: u16,
    #[pyo3(get)]
    world_size: u16,
    #[pyo3(get)]
    job: u16,
    #[pyo3(get)]
    switch: String,
    #[pyo3(get)]
    local_addr: String,
    #[pyo3(get)]
    elems_per_packet: u16,
}

impl NativeCommunicator {
    #[allow(clippy::too_many_arguments)]
    fn start(
        py: Python<'_>,
        comm: Communicator,
        rank: u16,
        job_id: u16,
        world_size: u16,
        switch: SocketAddr,
        member: Option<Member>,
        failed: Arc<Mutex<Option<Vec<u16>>>>,
    ) -> PyResult<NativeCommunicator> {
        let job = comm.job();
        let local_addr = comm.local_addr();
        let comm = AsyncCommunicator::start(comm).map_err(|e| to_py(py, &e, None))?;
        Ok(NativeCommunicator {
            comm: Mutex::new(Some(comm)),
            member: Mutex::new(member),
            failed,
            rank,
            world_size,
            job: job_id,
            switch: switch.to_string(),
            local_addr: local_addr.to_string(),
            elems_per_packet: job.info.elems_per_packet,
        })
    }
}

#[pymethods]
impl NativeCommunicator {
    /// Connects to the switch at `switch` as `rank` of `job`, from `bind`.
    #[new]
    #[pyo3(signature = (switch, bind, rank, world_size, job, lanes=1, give_up=5.0, probe_timeout=5.0, total_workers=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        switch: &str,
        bind: &str,
        rank: u8,
        world_size: u8,
        job: u16,
        lanes: u16,
        give_up: f64,
        probe_timeout: f64,
        total_workers: Option<u16>,
    ) -> PyResult<NativeCommunicator> {
        if world_size == 0 || rank >= world_size {
            return Err(PyValueError::new_err(format!(
                "rank {rank} of world_size {world_size}: the rank must be below the world size"
            )));
        }
        let switch = resolve("switch", switch)?;
        let bind = resolve("bind", bind)?;
        let tuning = Tuning {
            lanes,
            give_up: seconds("give_up", give_up)?,
            probe_timeout: seconds("probe_timeout", probe_timeout)?,
            total_workers,
        };
        let mut cfg = WorkerConfig::new(switch, bind, job, rank);
        tuning.apply(&mut cfg, world_size);
        let comm = py
            .detach(|| Communicator::connect(cfg))
            .map_err(|e| to_py(py, &e, None))?;
        Self::start(
            py,
            comm,
            u16::from(rank),
            job,
            u16::from(world_size),
            switch,
            None,
            Arc::default(),
        )
    }

    /// Joins job `job_name` through the controller at `controller`, binding `bind` (this
    /// host's address on the switch's network; port 0 for any). The controller gives the
    /// switch, the job's number, this worker's rank (`rank`, or the lowest free one) and the
    /// world size; the call returns once every worker joined and the job is installed.
    #[staticmethod]
    #[pyo3(signature = (controller, job_name, bind, rank=None, token=None, timeout=60.0, lanes=1, give_up=5.0, probe_timeout=5.0))]
    #[allow(clippy::too_many_arguments)]
    fn join(
        py: Python<'_>,
        controller: &str,
        job_name: &str,
        bind: &str,
        rank: Option<u16>,
        token: Option<String>,
        timeout: f64,
        lanes: u16,
        give_up: f64,
        probe_timeout: f64,
    ) -> PyResult<NativeCommunicator> {
        let bind = resolve("bind", bind)?;
        let timeout = seconds("timeout", timeout)?;
        let tuning = Tuning {
            lanes,
            give_up: seconds("give_up", give_up)?,
            probe_timeout: seconds("probe_timeout", probe_timeout)?,
            total_workers: None,
        };
        let client = Client::new(controller, token);
        let joined = py
            .detach(|| {
                ina_controller_client::join::join(
                    &client,
                    job_name,
                    rank,
                    bind,
                    &UdpConfig::default(),
                    timeout,
                )
            })
            .map_err(config_err)?;
        let heartbeat = joined.heartbeat();
        let ina_controller_client::join::JoinedJob { port, joined, .. } = joined;
        let mut cfg = WorkerConfig::new(joined.switch, bind, joined.job, joined.switch_rank);
        // A tree's worker quantizes for every worker of the tree; a switch holds at most 32.
        let mut tuning = tuning;
        if joined.tree {
            tuning.total_workers = Some(joined.workers);
        }
        tuning.apply(&mut cfg, u8::try_from(joined.workers).unwrap_or(u8::MAX));
        let failed: Arc<Mutex<Option<Vec<u16>>>> = Arc::default();
        let gate = Arc::new(Gate::new());
        let member = match heartbeat {
            Some(period) => {
                let failed = failed.clone();
                Some(
                    Member::spawn(
                        client,
                        job_name.to_string(),
                        joined.rank,
                        period,
                        gate.clone(),
                        move |missing| {
                            *failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(missing);
                        },
                    )
                    .map_err(|e| Error::new_err(format!("starting the heartbeat thread: {e}")))?,
                )
            }
            None => None,
        };
        let mut comm = py
            .detach(|| Communicator::with_port(port, cfg))
            .map_err(|e| to_py(py, &e, None))?;
        comm.set_gate(gate);
        Self::start(
            py,
            comm,
            joined.rank,
            joined.job,
            joined.workers,
            joined.switch,
            member,
            failed,
        )
    }

    /// Starts the all-reduce of `len` elements of `dtype` ("float32" or "int32") at address
    /// `addr`, in place.
    ///
    /// # Safety (of the caller, the Python layer)
    /// The memory must be writable, aligned for the type, hold `len` elements, and stay
    /// exported (alive and unmoved) until the returned handle's `wait()` has returned or its
    /// `done()` has returned True. Nothing else may use it meanwhile.
    #[pyo3(signature = (addr, len, dtype, mode="dense"))]
    fn _submit(&self, addr: usize, len: usize, dtype: &str, mode: &str) -> PyResult<Handle> {
        let mode: ina_worker::Mode = mode.parse().map_err(PyValueError::new_err)?;
        if addr == 0 && len > 0 {
            return Err(PyValueError::new_err("null address"));
        }
        if !addr.is_multiple_of(4) {
            return Err(PyValueError::new_err(format!(
                "the tensor's memory at {addr:#x} is not aligned to its 4-byte elements"
            )));
        }
        let tensor: Tensor<'static> = match dtype {
            // SAFETY: the caller's contract above: `len` writable, aligned elements, exported
            // and not used by anything else until the handle has ended (the handle's last use
            // of the memory is on the communicator's thread, before it answers the handle).
            "float32" => Tensor::F32(unsafe { raw_slice::<f32>(addr, len) }),
            "int32" => Tensor::I32(unsafe { raw_slice::<i32>(addr, len) }),
            other => {
                return Err(PyValueError::new_err(format!(
                    "dtype {other:?}: ina sums float32 and int32"
                )))
            }
        };
        let guard = self.comm.lock().unwrap_or_else(PoisonError::into_inner);
        let comm = guard
            .as_ref()
            .ok_or_else(|| Error::new_err("the communicator is closed"))?;
        Ok(Handle {
            state: Mutex::new(HandleState::Running(comm.submit_with(tensor, mode))),
            failed: self.failed.clone(),
        })
    }

    /// Stops the communicator's thread and heartbeats; later all-reduces raise.
    fn close(&self, py: Python<'_>) {
        let comm = self
            .comm
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let member = self
            .member
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        py.detach(move || {
            drop(comm);
            drop(member);
        });
    }
}

/// # Safety
/// `addr` points to `len` writable, aligned `T`s that nothing else uses for `'static` as far
/// as the returned slice's users go (see [`NativeCommunicator::_submit`]).
unsafe fn raw_slice<T>(addr: usize, len: usize) -> &'static mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: forwarded to the caller.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut T, len) }
}

enum HandleState {
    Running(Pending),
    /// A thread waits for it (without the GIL).
    Waiting,
    Ended(Box<Result<OpStats, WorkerError>>),
}

/// One all-reduce in flight.
#[pyclass(module = "ina._native")]
struct Handle {
    state: Mutex<HandleState>,
    failed: Arc<Mutex<Option<Vec<u16>>>>,
}

impl Handle {
    fn lock(&self) -> std::sync::MutexGuard<'_, HandleState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn outcome(&self, py: Python<'_>, r: &Result<OpStats, WorkerError>) -> PyResult<Stats> {
        match r {
            Ok(s) => Ok(Stats::from(*s)),
            Err(e) => {
                let failed = self
                    .failed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                let note = failed.map(|ranks| {
                    format!("the controller declared the job failed: ranks {ranks:?} stopped sending heartbeats")
                });
                Err(to_py(py, e, note.as_deref()))
            }
        }
    }
}

#[pymethods]
impl Handle {
    /// Blocks (without the GIL) until the all-reduce ended; returns its statistics or raises.
    fn wait(&self, py: Python<'_>) -> PyResult<Stats> {
        // The lock is never held while this thread waits without the GIL: a `done()` on
        // another thread takes the lock with the GIL held.
        let taken = std::mem::replace(&mut *self.lock(), HandleState::Waiting);
        let result = match taken {
            HandleState::Running(pending) => Box::new(py.detach(move || pending.wait().0)),
            HandleState::Ended(r) => r,
            HandleState::Waiting => {
                return Err(Error::new_err(
                    "another thread waits for this all-reduce already",
                ))
            }
        };
        let out = self.outcome(py, &result);
        *self.lock() = HandleState::Ended(result);
        out
    }

    /// Whether the all-reduce has ended (then `wait()` returns at once).
    fn done(&self) -> bool {
        let mut state = self.lock();
        match &*state {
            HandleState::Ended(_) => true,
            HandleState::Waiting => false,
            HandleState::Running(pending) => match pending.try_wait() {
                Some((result, _)) => {
                    *state = HandleState::Ended(Box::new(result));
                    true
                }
                None => false,
            },
        }
    }
}

/// What one all-reduce did.
#[pyclass(module = "ina._native", get_all, frozen)]
#[derive(Debug, Clone, Copy)]
struct Stats {
    /// Wall time of the all-reduce, in seconds.
    seconds: f64,
    /// Packets sent, and of those retransmitted.
    packets_sent: u64,
    retransmissions: u64,
    /// Whether the all-reduce went sparse, and the fractions of blocks this rank and some
    /// rank held (0 when it went dense).
    sparse: bool,
    own_density: f64,
    union_density: f64,
}

impl From<OpStats> for Stats {
    fn from(s: OpStats) -> Stats {
        Stats {
            seconds: s.elapsed.as_secs_f64(),
            packets_sent: s.stream.packets_sent + s.sparse.map_or(0, |x| x.support.packets_sent),
            retransmissions: s.stream.retransmissions
                + s.sparse.map_or(0, |x| x.support.retransmissions),
            sparse: s.sparse.is_some(),
            own_density: s.sparse.map_or(0.0, |x| x.own_density),
            union_density: s.sparse.map_or(0.0, |x| x.union_density),
        }
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<NativeCommunicator>()?;
    m.add_class::<Handle>()?;
    m.add_class::<Stats>()?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("SwitchRestarted", py.get_type::<SwitchRestarted>())?;
    m.add("Rejected", py.get_type::<Rejected>())?;
    m.add("NonFinite", py.get_type::<NonFinite>())?;
    m.add("Mismatch", py.get_type::<Mismatch>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    Ok(())
}
