//! In-network all-reduce through an `ina` switch over a batched [`Port`].

use ina_io::{IoError, Port, RecvBatch, SendBatch, UdpConfig, UdpPort};
use ina_proto::rtt::{RtoConfig, RttEstimator};
use ina_proto::stream::{Lane, Stream, StreamConfig, StreamError, StreamStats, Tensor};
use ina_proto::Instant;
use ina_wire::agg::{ProbeGroup, ProbeInfo, GAP_BLOCK};
use ina_wire::{AggPacket, AggRepr, MessageType, HEADER_LEN};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How a worker reaches its switch and paces its streams. Every worker of a job must use the
/// same `lanes` and `window`: they decide which slots each tensor uses.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The switch's UDP address.
    pub switch: SocketAddr,
    /// The local address to bind (the address the switch lists for this rank).
    pub bind: SocketAddr,
    pub job: u16,
    pub rank: u8,
    /// Tensors in flight at once in [`Communicator::allreduce_many`] and the async form: the
    /// job's slots are split into this many lanes.
    pub lanes: u16,
    /// Slots per lane (the window); `None` uses the job's slots divided by `lanes`.
    pub window: Option<u16>,
    pub rto: RtoConfig,
    /// Retransmissions of one packet before giving up.
    pub max_retries: u32,
    /// How long one packet may go unanswered before giving up (a worker or the switch is gone).
    pub give_up: Duration,
    /// How long to wait for the switch to answer the job probe.
    pub probe_timeout: Duration,
    /// If set, the number of workers the job must have.
    pub expect_workers: Option<u8>,
    /// The number of workers whose data every result sums, when the switch is the lower level
    /// of an aggregation tree (PROTOCOL.md §9): the whole tree's. `None`: the job's workers on
    /// the switch. Every worker of the job must give the same.
    pub total_workers: Option<u16>,
    /// Keep a delay-based AIMD window of packets in flight instead of filling every slot
    /// (`ina_proto::window`): for jobs that share links. Each stream starts from the window
    /// the previous one left.
    pub window_control: Option<ina_proto::window::WindowConfig>,
    /// Socket settings.
    pub udp: UdpConfig,
    /// The multicast group the switch sends this job's results to, if it does (the job's
    /// `group`): [`Communicator::connect`] joins it on the interface of `bind`. With `None`,
    /// [`Communicator::connect`] joins the group the switch names in its probe reply, if any;
    /// a group that differs from the switch's, or one for a job without a group, fails the
    /// connection with [`WorkerError::JobMismatch`]. For [`Communicator::with_port`] it says
    /// which group the port joined.
    pub group: Option<SocketAddrV4>,
    /// The MTU of the path to the switch. `None` asks the kernel (the MTU of the route from
    /// `bind` to `switch`). A job whose packets do not fit fails the connection with
    /// [`WorkerError::PathMtu`] instead of having every datagram fragmented.
    pub mtu: Option<usize>,
    /// How [`Communicator::allreduce_f32`] and [`Communicator::allreduce_i32`] send a tensor:
    /// dense (the default), sparse, or as the previous all-reduce of its shape suggests.
    pub mode: ina_proto::sparse::Mode,
    /// A sparse all-reduce treats a float32 block whose largest magnitude is below this as
    /// zero, dropping this rank's values of it (lossy; 0, the default, drops nothing).
    pub sparse_threshold: f32,
}

impl WorkerConfig {
    /// Defaults for a worker of `job` with `rank`, talking to `switch` from `bind`.
    pub fn new(switch: SocketAddr, bind: SocketAddr, job: u16, rank: u8) -> WorkerConfig {
        WorkerConfig {
            switch,
            bind,
            job,
            rank,
            lanes: 1,
            window: None,
            // Losses are mostly repaired by fast retransmission; the timer covers the rest and
            // must not fire because a busy host did not schedule some worker for a few
            // milliseconds.
            rto: RtoConfig {
                min: Duration::from_millis(10),
                ..RtoConfig::default()
            },
            max_retries: 30,
            give_up: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(5),
            expect_workers: None,
            total_workers: None,
            window_control: None,
            udp: UdpConfig::default(),
            group: None,
            mtu: None,
            mode: ina_proto::sparse::Mode::Dense,
            sparse_threshold: 0.0,
        }
    }
}

/// Why an all-reduce, or setting up the communicator, failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkerError {
    #[error("socket: {0}")]
    Io(String),
    #[error("no answer from the switch at {switch} for job {job} rank {rank} within {waited:?}: the switch is down, the job is not installed, or it lists another address for this rank")]
    SwitchUnreachable {
        switch: SocketAddr,
        job: u16,
        rank: u8,
        waited: Duration,
    },
    #[error("job mismatch: {0}")]
    JobMismatch(String),
    #[error("job {job} sends {elems} elements per packet, {packet}-byte IP packets, but the path MTU to the switch at {switch} is {mtu} bytes, which fits at most {fits} elements: every datagram would be fragmented. Install the job with elems={fits} or fewer, or raise the links' MTU")]
    PathMtu {
        job: u16,
        switch: SocketAddr,
        elems: u16,
        packet: usize,
        mtu: usize,
        fits: usize,
    },
    #[error("timed out: {0}")]
    Timeout(StreamError),
    #[error("the switch restarted or reinstalled the job (epoch {ours} -> {switch}): the in-flight sums are lost; the next call starts afresh")]
    SwitchRestarted { ours: u16, switch: u16 },
    #[error("the switch refused a packet: {0}")]
    Rejected(StreamError),
    #[error("NaN or infinity in the tensor: {0}")]
    NonFinite(StreamError),
    #[error("{0}")]
    Mismatch(StreamError),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(
        "an earlier all-reduce failed ({0}); the job's slots are out of step, reinstall the job"
    )]
    Broken(Box<WorkerError>),
    #[error("the communicator thread is gone")]
    Disconnected,
}

impl WorkerError {
    /// A stable name for the kind of error, for logs and machine-readable reports.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkerError::Io(_) => "io",
            WorkerError::SwitchUnreachable { .. } => "switch_unreachable",
            WorkerError::JobMismatch(_) => "job_mismatch",
            WorkerError::PathMtu { .. } => "path_mtu",
            WorkerError::Timeout(_) => "timeout",
            WorkerError::SwitchRestarted { .. } => "switch_restarted",
            WorkerError::Rejected(_) => "rejected",
            WorkerError::NonFinite(_) => "non_finite",
            WorkerError::Mismatch(_) => "mismatch",
            WorkerError::Config(_) => "config",
            WorkerError::Broken(_) => "broken",
            WorkerError::Disconnected => "disconnected",
        }
    }
}

impl From<IoError> for WorkerError {
    fn from(e: IoError) -> Self {
        WorkerError::Io(e.to_string())
    }
}

impl From<StreamError> for WorkerError {
    fn from(e: StreamError) -> Self {
        match e {
            StreamError::GaveUp { .. } => WorkerError::Timeout(e),
            StreamError::SwitchRestarted { ours, switch } => {
                WorkerError::SwitchRestarted { ours, switch }
            }
            StreamError::Rejected(_) => WorkerError::Rejected(e),
            StreamError::NonFinite(_) => WorkerError::NonFinite(e),
            StreamError::Mismatch(_) => WorkerError::Mismatch(e),
            StreamError::Config(c) => WorkerError::Config(c.to_string()),
            StreamError::BufferTooSmall { .. } => WorkerError::Config(e.to_string()),
        }
    }
}

/// What one all-reduce did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpStats {
    pub elements: usize,
    /// The stream of the values (of the union's blocks, for a sparse all-reduce).
    pub stream: StreamStats,
    pub elapsed: Duration,
    /// Set when the all-reduce went sparse (PROTOCOL.md §5, "Sparse streams").
    pub sparse: Option<crate::sparse::SparseStats>,
}

/// The job as the switch reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbedJob {
    pub epoch: u16,
    pub info: ProbeInfo,
    /// The multicast group the switch sends the job's results to (joined by this worker).
    pub group: Option<SocketAddrV4>,
    pub window: u16,
    pub lanes: u16,
    /// The switch answers skipped positions with Missing reports (its ProbeReply said so).
    pub gap_reports: bool,
}

/// Counters of the communicator, over its lifetime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommCounters {
    pub operations: u64,
    pub packets_sent: u64,
    /// Packets sent again to repair a loss (see [`StreamStats::retransmissions`]).
    pub retransmissions: u64,
    /// Packets sent again as stall probes, on no evidence of loss (see
    /// [`StreamStats::stall_probes`]).
    pub stall_probes: u64,
    /// Queries asking again about a use that holds this worker's data (see
    /// [`StreamStats::rechecks`]).
    pub rechecks: u64,
    pub datagrams_received: u64,
    /// Datagrams that were not from the switch, or not `ina` packets of this job.
    pub foreign: u64,
}

/// The window of a lane when the job's slots are split evenly: `even`, or rounded down to whole
/// blocks of [`GAP_BLOCK`] slots when the switch sends Missing reports, the job's slots start on
/// a block, and the rounding gives up at most an eighth of the window. Only a lane of whole
/// blocks asks for reports (PROTOCOL.md §5).
fn whole_blocks(slot_base: u16, even: u16, gap_reports: bool) -> u16 {
    let rounded = even - even % GAP_BLOCK;
    if gap_reports
        && slot_base.is_multiple_of(GAP_BLOCK)
        && rounded > 0
        && even % GAP_BLOCK <= even / 8
    {
        rounded
    } else {
        even
    }
}

/// A tensor handed to [`Communicator::allreduce_many`].
pub type TensorRef<'a> = Tensor<'a>;

/// In-network all-reduce for one worker.
#[derive(Debug)]
pub struct Communicator<P: Port<Addr = SocketAddr> = UdpPort> {
    port: P,
    pub(crate) cfg: WorkerConfig,
    job: ProbedJob,
    lanes: Vec<Lane>,
    next_lane: usize,
    rtt: RttEstimator,
    /// The window control carried from stream to stream (with `cfg.window_control`).
    window: Option<ina_proto::window::WindowControl>,
    origin: std::time::Instant,
    send: SendBatch<SocketAddr>,
    recv: RecvBatch<SocketAddr>,
    scratch: Vec<u8>,
    broken: Option<WorkerError>,
    counters: CommCounters,
    /// Identifies this communicator to the switch in its probes: a rank probing with a new
    /// nonce is a new worker, and the switch gives the job a new epoch before answering it.
    nonce: u32,
    /// The multicast group the port receives.
    joined: Option<SocketAddrV4>,
    /// Joins the port to a group the switch names: set for UDP ports.
    join: Option<JoinGroup<P>>,
    /// Held by the controller's agent while the job's slots move (see [`crate::gate`]).
    gate: Option<std::sync::Arc<crate::gate::Gate>>,
    /// The job moved (new slots, new epoch): ask the switch before the next operation.
    moved: bool,
    /// [`Mode::Auto`](ina_proto::sparse::Mode::Auto)'s memory of union densities.
    pub(crate) chooser: ina_proto::sparse::ModeChooser,
}

/// How a communicator joins its port to a multicast group.
type JoinGroup<P> = fn(&mut P, SocketAddrV4) -> Result<(), IoError>;

impl Communicator<UdpPort> {
    /// Binds the UDP socket and asks the switch for the job.
    pub fn connect(cfg: WorkerConfig) -> Result<Self, WorkerError> {
        let port = UdpPort::bind_with(cfg.bind, &cfg.udp)?;
        Communicator::with_port(port, cfg)
    }
}

/// Joins a [`UdpPort`] (the only port type [`Communicator::with_port`] hands this to) to a
/// multicast group.
fn join_udp<P: 'static>(port: &mut P, group: SocketAddrV4) -> Result<(), IoError> {
    match (port as &mut dyn std::any::Any).downcast_mut::<UdpPort>() {
        Some(udp) => udp.join_group(group),
        None => Ok(()),
    }
}

impl<P: Port<Addr = SocketAddr>> Communicator<P> {
    /// Uses an open port and asks the switch for the job.
    ///
    /// A [`UdpPort`] joins `cfg.group` if set, and otherwise the group the switch names for
    /// the job, if any (a port that joined a group already is taken as is). Any other port
    /// must already receive the job's group, and `cfg.group` name it. A switch that names
    /// another group than the port's, or none while the port has one, fails the connection
    /// with [`WorkerError::JobMismatch`].
    pub fn with_port(mut port: P, cfg: WorkerConfig) -> Result<Self, WorkerError>
    where
        P: 'static,
    {
        let mut join = None;
        let mut joined = cfg.group;
        if let Some(udp) = (&mut port as &mut dyn std::any::Any).downcast_mut::<UdpPort>() {
            if let Some(group) = cfg.group.filter(|g| udp.group() != Some(*g)) {
                udp.join_group(group)?;
            }
            joined = udp.group();
            join = Some(join_udp::<P> as JoinGroup<P>);
        }
        Communicator::start(port, cfg, joined, join)
    }

    fn start(
        port: P,
        cfg: WorkerConfig,
        joined: Option<SocketAddrV4>,
        join: Option<JoinGroup<P>>,
    ) -> Result<Self, WorkerError> {
        if cfg.lanes == 0 {
            return Err(WorkerError::Config("lanes must be at least 1".into()));
        }
        let mut comm = Communicator {
            port,
            job: ProbedJob {
                epoch: 0,
                info: ProbeInfo {
                    workers: 0,
                    elems_per_packet: 0,
                    slot_base: 0,
                    slot_count: 0,
                },
                group: None,
                window: 0,
                lanes: 0,
                gap_reports: false,
            },
            lanes: Vec::new(),
            next_lane: 0,
            rtt: RttEstimator::new(cfg.rto),
            window: cfg
                .window_control
                .map(ina_proto::window::WindowControl::new),
            origin: std::time::Instant::now(),
            send: SendBatch::with_capacity(64, 64 * 1100),
            recv: RecvBatch::new(64, 9216),
            scratch: Vec::new(),
            broken: None,
            counters: CommCounters::default(),
            nonce: fresh_nonce(),
            joined,
            join,
            gate: None,
            moved: false,
            chooser: Default::default(),
            cfg,
        };
        comm.probe()?;
        Ok(comm)
    }

    /// The job as the switch reported it.
    pub fn job(&self) -> ProbedJob {
        self.job
    }

    /// The local address.
    pub fn local_addr(&self) -> SocketAddr {
        self.port.local_addr()
    }

    /// Lifetime counters.
    pub fn counters(&self) -> CommCounters {
        self.counters
    }

    /// The port's I/O counters.
    pub fn io_counters(&self) -> ina_io::Counters {
        self.port.counters()
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(self.origin.elapsed().as_nanos() as u64)
    }

    /// Asks the switch for the job's configuration and epoch, and resets the lanes.
    fn probe(&mut self) -> Result<(), WorkerError> {
        let probe = AggRepr {
            kind: MessageType::Probe,
            set: 0,
            gap: None,
            job: self.cfg.job,
            epoch: 0,
            rank: self.cfg.rank,
            exponent: 0,
            slot: 0,
            count: 0,
            seq: self.nonce,
        };
        let mut bytes = [0u8; HEADER_LEN];
        probe
            .emit_into(&mut bytes)
            .map_err(|e| WorkerError::Config(e.to_string()))?;
        let start = std::time::Instant::now();
        let mut interval = Duration::from_millis(20);
        loop {
            self.send.clear();
            self.send.push(self.cfg.switch, &bytes);
            self.port.send_batch(&self.send)?;
            let wait_until = std::time::Instant::now() + interval;
            while std::time::Instant::now() < wait_until {
                let left = wait_until.saturating_duration_since(std::time::Instant::now());
                self.port.recv_batch(&mut self.recv, Some(left))?;
                for d in self.recv.iter() {
                    if d.addr != self.cfg.switch {
                        continue;
                    }
                    let Ok((h, payload)) = AggRepr::parse_bytes(d.data) else {
                        continue;
                    };
                    // The switch echoes the probe's nonce: a late reply to an earlier
                    // communicator on the same address (an older epoch) is not this one's.
                    if h.kind != MessageType::ProbeReply
                        || h.job != self.cfg.job
                        || h.rank != self.cfg.rank
                        || h.seq != self.nonce
                    {
                        continue;
                    }
                    let (Ok(info), Ok(group)) =
                        (ProbeInfo::parse(payload), ProbeGroup::parse(payload))
                    else {
                        continue;
                    };
                    return self.adopt(h.epoch, info, group.map(|g| g.group), h.gap.is_some());
                }
            }
            if start.elapsed() >= self.cfg.probe_timeout {
                return Err(WorkerError::SwitchUnreachable {
                    switch: self.cfg.switch,
                    job: self.cfg.job,
                    rank: self.cfg.rank,
                    waited: start.elapsed(),
                });
            }
            interval = (interval * 2).min(Duration::from_millis(500));
        }
    }

    /// Makes the port receive the multicast group the switch sends the job's results to
    /// (`group`, from the probe reply), or fails: a worker outside the job's group would get
    /// every result only as the answer to a retransmission, and a worker in a group the job
    /// does not use was configured for another job.
    fn follow_group(&mut self, group: Option<SocketAddrV4>) -> Result<(), WorkerError> {
        let job = self.cfg.job;
        match (group, self.joined) {
            (None, None) => Ok(()),
            (Some(want), Some(have)) if want == have => Ok(()),
            (Some(want), None) => match self.join {
                Some(join) => {
                    join(&mut self.port, want).map_err(|e| {
                        WorkerError::Io(format!(
                            "joining multicast group {want}, to which the switch sends job {job}'s results: {e}"
                        ))
                    })?;
                    tracing::info!(job, group = %want, "joined the job's multicast group, as the switch named it");
                    self.joined = Some(want);
                    Ok(())
                }
                None => Err(WorkerError::JobMismatch(format!(
                    "the switch sends job {job}'s results to multicast group {want}, which this worker did not join (set the group: --group {want})"
                ))),
            },
            (Some(want), Some(have)) => Err(WorkerError::JobMismatch(format!(
                "this worker joined multicast group {have}, but the switch sends job {job}'s results to group {want} (set the group: --group {want})"
            ))),
            (None, Some(have)) => Err(WorkerError::JobMismatch(format!(
                "this worker joined multicast group {have}, but the switch sends job {job}'s results to each worker's own address (the job has no group: drop --group)"
            ))),
        }
    }

    /// Fails if the job's packets do not fit the path to the switch.
    fn check_mtu(&self, elems: u16) -> Result<(), WorkerError> {
        let switch = self.cfg.switch;
        let mtu = match self.cfg.mtu {
            Some(m) => m,
            None => match ina_io::mtu::path_mtu(self.cfg.bind.ip(), switch) {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(%switch, error = %e, "cannot find the path MTU to the switch; not checked");
                    return Ok(());
                }
            },
        };
        let ipv6 = switch.is_ipv6();
        let packet = ina_wire::agg::ip_packet_len(elems, ipv6);
        if packet <= mtu {
            return Ok(());
        }
        Err(WorkerError::PathMtu {
            job: self.cfg.job,
            switch,
            elems,
            packet,
            mtu,
            fits: ina_wire::agg::max_elems_for_mtu(mtu, ipv6),
        })
    }

    fn adopt(
        &mut self,
        epoch: u16,
        info: ProbeInfo,
        group: Option<SocketAddrV4>,
        gap_reports: bool,
    ) -> Result<(), WorkerError> {
        if let Some(n) = self.cfg.expect_workers {
            if n != info.workers {
                return Err(WorkerError::JobMismatch(format!(
                    "the switch has {} workers in job {}, this worker expects {n}",
                    info.workers, self.cfg.job
                )));
            }
        }
        if let Some(total) = self.cfg.total_workers {
            if total < u16::from(info.workers) {
                return Err(WorkerError::JobMismatch(format!(
                    "{total} workers in total, but the switch has {} in job {}",
                    info.workers, self.cfg.job
                )));
            }
        }
        if self.cfg.rank >= info.workers {
            return Err(WorkerError::JobMismatch(format!(
                "rank {} but the job has {} workers",
                self.cfg.rank, info.workers
            )));
        }
        let lanes = self.cfg.lanes;
        let window = match self.cfg.window {
            Some(w) => w,
            None => whole_blocks(info.slot_base, info.slot_count / lanes, gap_reports),
        };
        if window == 0 || u32::from(window) * u32::from(lanes) > u32::from(info.slot_count) {
            return Err(WorkerError::JobMismatch(format!(
                "{lanes} lanes of {window} slots do not fit the job's {} slots",
                info.slot_count
            )));
        }
        self.check_mtu(info.elems_per_packet)?;
        self.follow_group(group)?;
        self.job = ProbedJob {
            epoch,
            info,
            group,
            window,
            lanes,
            gap_reports,
        };
        self.lanes = (0..lanes)
            .map(|l| Lane::new(info.slot_base + l * window, window))
            .collect();
        self.next_lane = 0;
        let max_packet = HEADER_LEN + 4 * usize::from(info.elems_per_packet);
        // Every result of every lane may arrive before this thread reads any.
        self.port
            .reserve_recv(usize::from(window) * usize::from(lanes) * max_packet * 2);
        self.scratch = vec![0u8; max_packet];
        if self.recv.slot_size() <= max_packet {
            self.recv = RecvBatch::new(64, max_packet + 1);
        }
        self.broken = None;
        tracing::debug!(
            job = self.cfg.job,
            rank = self.cfg.rank,
            epoch,
            ?info,
            window,
            lanes,
            "joined job"
        );
        Ok(())
    }

    /// Before an operation: a failed earlier operation leaves the lanes out of step with the
    /// other workers; if the switch has since reinstalled the job (new epoch), start afresh.
    fn ready(&mut self) -> Result<(), WorkerError> {
        if std::mem::take(&mut self.moved) {
            // Between operations on every worker (the gate saw to it): start afresh on the
            // job's new slots and epoch.
            self.probe()?;
        }
        let Some(err) = self.broken.clone() else {
            return Ok(());
        };
        let before = self.job.epoch;
        self.probe()?;
        if self.job.epoch == before {
            self.broken = Some(err.clone());
            return Err(WorkerError::Broken(Box::new(err)));
        }
        Ok(())
    }

    fn stream_config(&self, lane: Lane) -> StreamConfig {
        StreamConfig {
            job: self.cfg.job,
            epoch: self.job.epoch,
            rank: self.cfg.rank,
            workers: self.job.info.workers,
            total_workers: self
                .cfg
                .total_workers
                .unwrap_or(self.job.info.workers.into()),
            elems_per_packet: self.job.info.elems_per_packet,
            lane,
            max_retries: self.cfg.max_retries,
            give_up: self.cfg.give_up,
            gap_reports: self.job.gap_reports,
            rules: Default::default(),
        }
    }

    /// Puts this communicator behind `gate`: each call of `allreduce_*` waits while the gate
    /// is held, and asks the switch for the job again after the gate was released.
    pub fn set_gate(&mut self, gate: std::sync::Arc<crate::gate::Gate>) {
        self.gate = Some(gate);
    }

    /// Sums `data` over all workers of the job, in place, in the configured mode
    /// ([`WorkerConfig::mode`]).
    pub fn allreduce_f32(&mut self, data: &mut [f32]) -> Result<OpStats, WorkerError> {
        self.allreduce_f32_with(data, self.cfg.mode)
    }

    /// Sums `data` over all workers of the job, in place, with wrap-around, in the configured
    /// mode.
    pub fn allreduce_i32(&mut self, data: &mut [i32]) -> Result<OpStats, WorkerError> {
        self.allreduce_i32_with(data, self.cfg.mode)
    }

    /// All-reduces several tensors with up to `lanes` of them in flight at once. Tensor `k` of
    /// the communicator's lifetime goes to lane `k mod lanes`, so every worker must submit the
    /// same tensors in the same order.
    pub fn allreduce_many(
        &mut self,
        tensors: &mut [Tensor<'_>],
    ) -> Vec<Result<OpStats, WorkerError>> {
        let count = tensors.len();
        let mut queue: VecDeque<(usize, Tensor<'_>)> = tensors
            .iter_mut()
            .enumerate()
            .map(|(i, t)| (i, reborrow(t)))
            .collect();
        let mut results: Vec<Option<Result<OpStats, WorkerError>>> =
            (0..count).map(|_| None).collect();
        let mut next = || queue.pop_front();
        self.run(&mut next, &mut |token, result, _tensor| {
            results[token] = Some(result);
        });
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(WorkerError::Disconnected)))
            .collect()
    }

    /// The engine: keeps every lane busy with the tensors `source` hands out (in order), and
    /// reports each one to `done` when it finished or failed. Returns when `source` is empty and
    /// every stream ended.
    fn run<'t>(
        &mut self,
        source: &mut dyn FnMut() -> Option<(usize, Tensor<'t>)>,
        done: &mut dyn FnMut(usize, Result<OpStats, WorkerError>, Tensor<'t>),
    ) {
        self.run_open(source, done);
        if let Some(g) = &self.gate {
            g.idle();
        }
    }

    fn run_open<'t>(
        &mut self,
        source: &mut dyn FnMut() -> Option<(usize, Tensor<'t>)>,
        done: &mut dyn FnMut(usize, Result<OpStats, WorkerError>, Tensor<'t>),
    ) {
        struct Active<'t> {
            token: usize,
            stream: Stream<'t>,
            started: std::time::Instant,
            elements: usize,
        }
        let lanes = self.lanes.len();
        let mut active: Vec<Option<Active<'t>>> = (0..lanes).map(|_| None).collect();
        // A tensor taken from the source whose lane is still busy, and whether the gate let
        // it through already (the gate counts each tensor once).
        let mut waiting: Option<(usize, Tensor<'t>, bool)> = None;
        let mut exhausted = false;
        loop {
            // Start streams on free lanes, in submission order.
            loop {
                if waiting.is_none() && !exhausted {
                    waiting = source().map(|(token, tensor)| (token, tensor, false));
                    exhausted = waiting.is_none();
                }
                let Some((token, tensor, admitted)) = waiting.take() else {
                    break;
                };
                // Held by the controller's agent: start nothing more; once nothing is in
                // flight, wait for the release (see `crate::gate`).
                if let (Some(g), false) = (&self.gate, admitted) {
                    let go = match g.try_start() {
                        Some(moved) => Some(moved),
                        None if active.iter().all(Option::is_none) => Some(g.wait_start()),
                        None => None,
                    };
                    match go {
                        Some(moved) => self.moved |= moved,
                        None => {
                            waiting = Some((token, tensor, false));
                            break;
                        }
                    }
                }
                if let Err(e) = self.ready() {
                    done(token, Err(e), tensor);
                    continue;
                }
                let lane_idx = self.next_lane % lanes;
                if active[lane_idx].is_some() {
                    waiting = Some((token, tensor, true));
                    break;
                }
                let elements = tensor.len();
                let cfg = self.stream_config(self.lanes[lane_idx]);
                if let Err(e) = cfg.validate() {
                    // Detected before any packet: the lane is untouched, the others go on.
                    done(token, Err(e.into()), tensor);
                    continue;
                }
                match Stream::new(cfg, tensor, self.rtt.clone()) {
                    Ok(mut stream) => {
                        stream.set_window_control(self.window.clone());
                        self.next_lane += 1;
                        self.lanes[lane_idx] = stream.lane_after();
                        self.counters.operations += 1;
                        active[lane_idx] = Some(Active {
                            token,
                            stream,
                            started: std::time::Instant::now(),
                            elements,
                        });
                    }
                    Err(e) => {
                        // Unreachable after validate(); the tensor went with the error.
                        done(token, Err(e.into()), Tensor::F32Owned(Vec::new()));
                    }
                }
            }
            if active.iter().all(Option::is_none) && waiting.is_none() && exhausted {
                return;
            }
            // Transmit everything due, in one batch per round.
            let now = self.now();
            self.send.clear();
            for slot in active.iter_mut().flatten() {
                let max_packet = self.scratch.len();
                loop {
                    // Serialized straight into the send batch: no copy of the packet.
                    let len =
                        self.send.push_in_place(self.cfg.switch, max_packet, |buf| {
                            match slot.stream.poll_transmit(now, buf) {
                                Ok(Some(len)) => len,
                                Ok(None) | Err(_) => 0,
                            }
                        });
                    if len == 0 {
                        break;
                    }
                    if self.send.len() >= 64 {
                        self.flush();
                        self.send.clear();
                    }
                }
            }
            self.flush();
            // Collect finished streams.
            for lane in active.iter_mut() {
                let finished = lane
                    .as_ref()
                    .and_then(|a| a.stream.poll_outcome())
                    .is_some();
                if !finished {
                    continue;
                }
                let Some(a) = lane.take() else { continue };
                let outcome = a
                    .stream
                    .poll_outcome()
                    .unwrap_or(Ok(StreamStats::default()));
                self.rtt = a.stream.rtt().clone();
                if let Some(w) = a.stream.window_control() {
                    self.window = Some(w.clone());
                }
                let stats = a.stream.stats();
                self.counters.packets_sent += stats.packets_sent;
                self.counters.retransmissions += stats.retransmissions;
                self.counters.stall_probes += stats.stall_probes;
                self.counters.rechecks += stats.rechecks;
                let result = match outcome {
                    Ok(stream) => Ok(OpStats {
                        elements: a.elements,
                        stream,
                        elapsed: a.started.elapsed(),
                        sparse: None,
                    }),
                    Err(e) => {
                        let e = WorkerError::from(e);
                        if !matches!(e, WorkerError::NonFinite(_)) {
                            self.broken = Some(e.clone());
                        }
                        Err(e)
                    }
                };
                done(a.token, result, a.stream.into_tensor());
            }
            if active.iter().all(Option::is_none) {
                continue;
            }
            // Wait for results, at most until the earliest retransmission timer.
            let now = self.now();
            let deadline = active
                .iter_mut()
                .flatten()
                .filter_map(|a| a.stream.poll_timeout())
                .min();
            let wait = match deadline {
                Some(d) if d <= now => Duration::ZERO,
                Some(d) => (d - now).min(Duration::from_millis(50)),
                None => Duration::from_millis(50),
            };
            // Drain what has arrived before looking at timers: a result waiting in the socket
            // must not be taken for a loss just because this thread was not running.
            let base = self.job.info.slot_base;
            let window = self.job.window;
            let mut wait = Some(wait);
            for _ in 0..64 {
                if let Err(e) = self
                    .port
                    .recv_batch(&mut self.recv, wait.take().or(Some(Duration::ZERO)))
                {
                    tracing::warn!(error = %e, "receive failed");
                    break;
                }
                let now = self.now();
                for d in self.recv.iter() {
                    self.counters.datagrams_received += 1;
                    if d.addr != self.cfg.switch || d.truncated {
                        self.counters.foreign += 1;
                        continue;
                    }
                    let Ok(pkt) = AggPacket::new_checked(d.data) else {
                        self.counters.foreign += 1;
                        continue;
                    };
                    let lane = pkt
                        .slot()
                        .checked_sub(base)
                        .map(|off| usize::from(off / window));
                    match lane
                        .and_then(|l| active.get_mut(l))
                        .and_then(Option::as_mut)
                    {
                        Some(a) => a.stream.handle_datagram(now, d.data),
                        None => self.counters.foreign += 1,
                    }
                }
                if !self.recv.is_full() {
                    break;
                }
            }
            let now = self.now();
            for a in active.iter_mut().flatten() {
                a.stream.handle_timeout(now);
            }
        }
    }

    fn flush(&mut self) {
        if self.send.is_empty() {
            return;
        }
        if let Err(e) = self.port.send_batch(&self.send) {
            // A send failure is a loss: the retransmission timers repair it.
            tracing::debug!(error = %e, "send failed");
        }
    }
}

/// A nonce no other communicator is likely to pick: the standard library's per-instance
/// random hash keys, mixed with the time and process id.
fn fresh_nonce() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    (h.finish() as u32).max(1)
}

fn reborrow<'s>(t: &'s mut Tensor<'_>) -> Tensor<'s> {
    match t {
        Tensor::F32(x) => Tensor::F32(x),
        Tensor::I32(x) => Tensor::I32(x),
        Tensor::F32Owned(x) => Tensor::F32(x),
        Tensor::I32Owned(x) => Tensor::I32(x),
        Tensor::Generated(g) => Tensor::Generated(&mut **g),
        Tensor::Support(x, float) => Tensor::Support(x, *float),
        Tensor::Blocks {
            of,
            blocks,
            elems_per_block,
        } => Tensor::Blocks {
            of: Box::new(reborrow(of)),
            blocks: blocks.clone(),
            elems_per_block: *elems_per_block,
        },
    }
}

enum Request {
    Reduce {
        tensor: Tensor<'static>,
        mode: ina_proto::sparse::Mode,
        reply: mpsc::Sender<(Result<OpStats, WorkerError>, Tensor<'static>)>,
    },
}

/// A request of an [`AsyncCommunicator`], resolved when its all-reduce ends.
#[derive(Debug)]
pub struct Pending {
    rx: mpsc::Receiver<(Result<OpStats, WorkerError>, Tensor<'static>)>,
}

/// The result of an owned float tensor's all-reduce: the tensor comes back either way.
pub type Completed = (Result<OpStats, WorkerError>, Tensor<'static>);

impl Pending {
    /// Blocks until the all-reduce ended; returns its outcome and the tensor (the result).
    pub fn wait(self) -> Completed {
        self.rx
            .recv()
            .unwrap_or((Err(WorkerError::Disconnected), Tensor::F32Owned(Vec::new())))
    }

    /// The outcome if it has ended.
    pub fn try_wait(&self) -> Option<Completed> {
        self.rx.try_recv().ok()
    }
}

/// A [`Communicator`] on its own thread: submit owned tensors, keep computing, collect the
/// results. Requests run in submission order, up to `lanes` at once.
#[derive(Debug)]
pub struct AsyncCommunicator {
    tx: Option<mpsc::Sender<Request>>,
    thread: Option<JoinHandle<()>>,
    job: ProbedJob,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Request")
    }
}

impl AsyncCommunicator {
    /// Connects (on the calling thread, so errors come back here) and starts the thread.
    pub fn connect(cfg: WorkerConfig) -> Result<AsyncCommunicator, WorkerError> {
        Self::start(Communicator::connect(cfg)?)
    }

    /// Starts the thread around a connected communicator.
    pub fn start<P: Port<Addr = SocketAddr> + 'static>(
        mut comm: Communicator<P>,
    ) -> Result<AsyncCommunicator, WorkerError> {
        let job = comm.job();
        let (tx, rx) = mpsc::channel::<Request>();
        let thread = std::thread::Builder::new()
            .name("ina-worker".into())
            .spawn(move || {
                // Reply channels of the current burst, by token; shared by the source (which
                // adds them) and the completion callback (which answers each as it ends).
                let replies: RefCell<Vec<Option<mpsc::Sender<Completed>>>> =
                    RefCell::new(Vec::new());
                // A request that is not dense, taken from the channel while a burst ran: it
                // runs alone, once the burst's streams ended.
                let mut held: Option<Request> = None;
                loop {
                    // Block for the first request of a burst; take the rest as they come.
                    let first = match held.take() {
                        Some(r) => r,
                        None => match rx.recv() {
                            Ok(r) => r,
                            Err(_) => return,
                        },
                    };
                    let Request::Reduce {
                        mut tensor,
                        mode,
                        reply,
                    } = first;
                    if mode != ina_proto::sparse::Mode::Dense {
                        // Two streams, the second from the first's result: one at a time.
                        let result = match &mut tensor {
                            Tensor::F32Owned(v) => comm.allreduce_f32_with(v, mode),
                            Tensor::F32(v) => comm.allreduce_f32_with(v, mode),
                            Tensor::I32Owned(v) => comm.allreduce_i32_with(v, mode),
                            Tensor::I32(v) => comm.allreduce_i32_with(v, mode),
                            t => comm.allreduce_one(reborrow(t)),
                        };
                        let _ = reply.send((result, tensor));
                        continue;
                    }
                    let mut first = Some((tensor, reply));
                    let mut source = || {
                        let (tensor, reply) = match first.take() {
                            Some(f) => f,
                            None => match rx.try_recv().ok()? {
                                Request::Reduce {
                                    tensor,
                                    mode: ina_proto::sparse::Mode::Dense,
                                    reply,
                                } => (tensor, reply),
                                other => {
                                    held = Some(other);
                                    return None;
                                }
                            },
                        };
                        let mut r = replies.borrow_mut();
                        r.push(Some(reply));
                        Some((r.len() - 1, tensor))
                    };
                    comm.run(&mut source, &mut |token, result, tensor| {
                        let reply = replies.borrow_mut().get_mut(token).and_then(Option::take);
                        if let Some(reply) = reply {
                            let _ = reply.send((result, tensor));
                        }
                    });
                    replies.borrow_mut().clear();
                }
            })
            .map_err(|e| WorkerError::Io(e.to_string()))?;
        Ok(AsyncCommunicator {
            tx: Some(tx),
            thread: Some(thread),
            job,
        })
    }

    /// The job as the switch reported it.
    pub fn job(&self) -> ProbedJob {
        self.job
    }

    /// Submits an owned tensor (`Tensor::F32Owned` or `Tensor::I32Owned`), dense.
    pub fn submit(&self, tensor: Tensor<'static>) -> Pending {
        self.submit_with(tensor, ina_proto::sparse::Mode::Dense)
    }

    /// Submits an owned tensor, dense or sparse as `mode` says (every rank must give the same
    /// mode for the same tensor). A tensor that is not dense runs alone, after the tensors
    /// submitted before it ended.
    pub fn submit_with(&self, tensor: Tensor<'static>, mode: ina_proto::sparse::Mode) -> Pending {
        let (reply, rx) = mpsc::channel();
        if let Some(tx) = &self.tx {
            if let Err(mpsc::SendError(Request::Reduce { tensor, reply, .. })) =
                tx.send(Request::Reduce {
                    tensor,
                    mode,
                    reply,
                })
            {
                let _ = reply.send((Err(WorkerError::Disconnected), tensor));
            }
        }
        Pending { rx }
    }

    /// Submits a float tensor.
    pub fn submit_f32(&self, data: Vec<f32>) -> Pending {
        self.submit(Tensor::F32Owned(data))
    }
}

impl Drop for AsyncCommunicator {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
