//! Running a scenario: a switch, its jobs' workers, and the links between them.

use crate::link::{Link, LinkConfig, LinkStats};
use crate::rng::Rng;
use ina_proto::pipeline::{Counters, JobConfig, Pipeline, PipelineConfig, PortId, Verdict};
use ina_proto::rtt::{RtoConfig, RttEstimator};
use ina_proto::session::{Lane, Stream, StreamConfig, StreamError, StreamStats, Tensor};
use ina_proto::Instant;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// A tensor a worker all-reduces.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I32(Vec<i32>),
    /// Made from a seed block by block, its results checked as they come: no memory per
    /// element (see [`crate::data`]).
    Generated(crate::data::Generated),
}

impl Data {
    fn tensor(&mut self) -> Tensor<'_> {
        match self {
            Data::F32(v) => Tensor::F32(v),
            Data::I32(v) => Tensor::I32(v),
            Data::Generated(g) => Tensor::Generated(g),
        }
    }
}

/// One worker of a job.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// The tensors it all-reduces, one after the other on the same lane.
    pub tensors: Vec<Data>,
    /// When it starts (a slow worker starts late).
    pub start_at: Duration,
    /// When it dies: from then on it neither sends nor receives.
    pub dies_at: Option<Duration>,
    /// Its link in both directions, if not the scenario's.
    pub link: Option<LinkConfig>,
    /// The epoch it believes the job has, if not the job's.
    pub epoch: Option<u16>,
}

impl WorkerSpec {
    /// A worker that starts at once, never dies, and reduces `tensors`.
    pub fn new(tensors: Vec<Data>) -> WorkerSpec {
        WorkerSpec {
            tensors,
            start_at: Duration::ZERO,
            dies_at: None,
            link: None,
            epoch: None,
        }
    }
}

/// One job on the switch.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub job: u16,
    pub epoch: u16,
    pub slot_base: u16,
    /// Slots of the job: the workers' window.
    pub window: u16,
    pub elems_per_packet: u16,
    pub workers: Vec<WorkerSpec>,
}

/// Raw bytes injected into a switch port at a given time.
#[derive(Debug, Clone)]
pub struct Injection {
    pub at: Duration,
    pub port: PortId,
    pub bytes: Vec<u8>,
}

/// The default [`Scenario::nic_queue`]: a few packets, as a driver that polls its transmit
/// ring (DPDK, AF_XDP) keeps it.
pub const DEFAULT_NIC_QUEUE: u32 = 4;

/// A complete simulation.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub seed: u64,
    pub pipeline: PipelineConfig,
    pub jobs: Vec<JobSpec>,
    /// Every worker's link in both directions unless the worker says otherwise.
    pub link: LinkConfig,
    pub rto: RtoConfig,
    pub max_retries: u32,
    pub give_up: Duration,
    /// The run stops here even if workers have not finished.
    pub time_limit: Duration,
    pub injections: Vec<Injection>,
    /// At this time the switch loses all state and comes back with the jobs reinstalled under
    /// new epochs (old epoch + 1).
    pub switch_restart_at: Option<Duration>,
    /// Whether the switch sends its Missing reports (and the workers ask for them).
    pub gap_reports: bool,
    /// How many full-size packets a worker's NIC holds before the worker stops handing it
    /// more (`None`: no limit, as a deep kernel queue would take them). With a short queue the
    /// worker chooses each packet when the NIC can send it, so a repair or a lagging slot's
    /// next use goes out next instead of behind a window of queued packets: the queue, not the
    /// network, would otherwise set every round trip to the window's serialization time.
    pub nic_queue: Option<u32>,
}

impl Scenario {
    /// A scenario with defaults for everything but the seed and jobs.
    pub fn new(seed: u64, jobs: Vec<JobSpec>) -> Scenario {
        Scenario {
            seed,
            pipeline: PipelineConfig {
                pool_slots: 1024,
                max_elems: 256,
            },
            jobs,
            link: LinkConfig::default(),
            rto: RtoConfig {
                initial: Duration::from_millis(1),
                min: Duration::from_micros(200),
                max: Duration::from_millis(50),
                granularity: Duration::from_micros(10),
            },
            max_retries: 40,
            give_up: Duration::from_secs(2),
            time_limit: Duration::from_secs(120),
            injections: Vec::new(),
            switch_restart_at: None,
            gap_reports: true,
            nic_queue: Some(DEFAULT_NIC_QUEUE),
        }
    }
}

/// How one worker ended.
#[derive(Debug, Clone)]
pub struct WorkerReport {
    /// `None` if it neither finished nor failed before the time limit (or died).
    pub outcome: Option<Result<Vec<StreamStats>, StreamError>>,
    /// When it finished or failed.
    pub ended_at: Option<Duration>,
    /// The tensors after the run (the results, where streams finished).
    pub tensors: Vec<Data>,
    pub uplink: LinkStats,
    pub downlink: LinkStats,
}

/// How one job ended.
#[derive(Debug, Clone)]
pub struct JobReport {
    pub job: u16,
    pub workers: Vec<WorkerReport>,
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct Report {
    pub jobs: Vec<JobReport>,
    pub switch: Counters,
    /// Virtual time at which the run ended.
    pub elapsed: Duration,
    /// Events processed.
    pub events: u64,
}

#[derive(Debug)]
enum Event {
    /// A packet reaches the switch on a port.
    ToSwitch { port: PortId, bytes: Vec<u8> },
    /// A packet reaches a worker.
    ToWorker { worker: usize, bytes: Vec<u8> },
    /// A worker starts or dies.
    Wake { worker: usize },
}

struct Queue {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    events: std::collections::HashMap<u64, Event>,
    next: u64,
}

impl Queue {
    fn push(&mut self, at: Instant, ev: Event) {
        self.heap.push(Reverse((at, self.next)));
        self.events.insert(self.next, ev);
        self.next += 1;
    }
    fn peek_time(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }
    fn pop(&mut self) -> Option<(Instant, Event)> {
        let Reverse((t, id)) = self.heap.pop()?;
        self.events.remove(&id).map(|e| (t, e))
    }
}

struct WorkerState<'a> {
    port: PortId,
    cfg: StreamConfig,
    start_at: Instant,
    dies_at: Option<Instant>,
    pending: std::slice::IterMut<'a, Data>,
    stream: Option<Stream<'a>>,
    lane: Lane,
    rtt: RttEstimator,
    done: Vec<StreamStats>,
    outcome: Option<Result<Vec<StreamStats>, StreamError>>,
    ended_at: Option<Duration>,
    up: Link,
    down: Link,
    /// The NIC's room, as the time its queue of `Scenario::nic_queue` full-size packets takes
    /// to drain at the uplink's rate; `None` for no limit.
    nic_room: Option<Duration>,
    /// A wake-up is queued for when the NIC has room again.
    nic_wake: bool,
}

impl WorkerState<'_> {
    fn alive(&self, now: Instant) -> bool {
        now >= self.start_at && self.dies_at.is_none_or(|d| now < d) && self.outcome.is_none()
    }
}

/// Runs a scenario to completion (every worker finished, failed or dead) or to its time limit.
pub fn run(scenario: &Scenario) -> Report {
    let mut rng = Rng::new(scenario.seed);
    let mut pipe = Pipeline::new(scenario.pipeline);
    pipe.set_gap_reports(scenario.gap_reports);
    let mut tensors: Vec<Vec<Data>> = Vec::new();
    let mut port = 1u16;
    let mut job_ports = Vec::new();
    for job in &scenario.jobs {
        let ports: Vec<PortId> = job
            .workers
            .iter()
            .map(|_| {
                port += 1;
                PortId(port)
            })
            .collect();
        install(&mut pipe, job, job.epoch, &ports);
        job_ports.push(ports);
        for w in &job.workers {
            tensors.push(w.tensors.clone());
        }
    }
    let mut tensor_iters = tensors.iter_mut();
    let mut workers: Vec<WorkerState<'_>> = Vec::new();
    for (j, job) in scenario.jobs.iter().enumerate() {
        for (r, w) in job.workers.iter().enumerate() {
            let link = w.link.unwrap_or(scenario.link);
            let lane = Lane::new(job.slot_base, job.window);
            let pending = tensor_iters
                .next()
                .map(|t| t.iter_mut())
                .unwrap_or_default();
            workers.push(WorkerState {
                port: job_ports[j][r],
                cfg: StreamConfig {
                    job: job.job,
                    epoch: w.epoch.unwrap_or(job.epoch),
                    rank: r as u8,
                    workers: job.workers.len() as u8,
                    total_workers: job.workers.len() as u16,
                    elems_per_packet: job.elems_per_packet,
                    lane,
                    max_retries: scenario.max_retries,
                    give_up: scenario.give_up,
                    gap_reports: scenario.gap_reports,
                },
                start_at: Instant::ZERO + w.start_at,
                dies_at: w.dies_at.map(|d| Instant::ZERO + d),
                pending,
                stream: None,
                lane,
                rtt: RttEstimator::new(scenario.rto),
                done: Vec::new(),
                outcome: None,
                ended_at: None,
                up: Link::new(link),
                down: Link::new(link),
                nic_room: nic_room(scenario, &link),
                nic_wake: false,
            });
        }
    }
    // Ports are numbered from 2 up: a table finds a port's worker at once.
    let mut port_index: Vec<Option<usize>> = Vec::new();
    for (i, p) in job_ports.iter().flatten().enumerate() {
        let at = usize::from(p.0);
        if port_index.len() <= at {
            port_index.resize(at + 1, None);
        }
        port_index[at] = Some(i);
    }
    let port_to_worker = |p: PortId| port_index.get(usize::from(p.0)).copied().flatten();

    let mut q = Queue {
        heap: BinaryHeap::new(),
        events: std::collections::HashMap::new(),
        next: 0,
    };
    for (i, w) in workers.iter().enumerate() {
        q.push(w.start_at, Event::Wake { worker: i });
        if let Some(d) = w.dies_at {
            q.push(d, Event::Wake { worker: i });
        }
    }
    for inj in &scenario.injections {
        q.push(
            Instant::ZERO + inj.at,
            Event::ToSwitch {
                port: inj.port,
                bytes: inj.bytes.clone(),
            },
        );
    }
    let mut restart_at = scenario.switch_restart_at.map(|d| Instant::ZERO + d);
    let limit = Instant::ZERO + scenario.time_limit;
    let mut buf = vec![0u8; 16 + 4 * usize::from(scenario.pipeline.max_elems).max(4)];
    let mut out = vec![0u8; buf.len()];
    let mut now = Instant::ZERO;
    let mut events = 0u64;

    // Only the workers something happened to run: those that got a datagram, whose timer
    // expired, or that started or died. Each live worker's next timer sits in `timers`; an entry
    // that no longer matches `armed` is stale and skipped.
    let n = workers.len();
    let mut dirty: Vec<usize> = (0..n).collect();
    let mut is_dirty = vec![true; n];
    let mut timers: BinaryHeap<Reverse<(Instant, usize)>> = BinaryHeap::new();
    let mut armed: Vec<Option<Instant>> = vec![None; n];
    let mark = |i: usize, dirty: &mut Vec<usize>, is_dirty: &mut [bool]| {
        if !is_dirty[i] {
            is_dirty[i] = true;
            dirty.push(i);
        }
    };

    loop {
        // Let the workers something happened to send what they can and pick up finished
        // streams, in rank order (as a switch port would see a burst).
        dirty.sort_unstable();
        for i in dirty.drain(..) {
            is_dirty[i] = false;
            let w = &mut workers[i];
            pump(w, i, now, &mut buf, &mut rng, &mut q);
            let t = if w.alive(now) {
                w.stream.as_mut().and_then(|s| s.poll_timeout())
            } else {
                None
            };
            if t != armed[i] {
                armed[i] = t;
                if let Some(t) = t {
                    timers.push(Reverse((t, i)));
                }
            }
        }
        // Done when every worker ended and nothing is left in flight (late copies and injected
        // packets still reach the switch and its counters).
        if q.peek_time().is_none()
            && workers
                .iter()
                .all(|w| w.outcome.is_some() || w.dies_at.is_some_and(|d| now >= d))
        {
            break;
        }
        // The next thing to happen: an event or a worker timer.
        while let Some(&Reverse((t, i))) = timers.peek() {
            if armed[i] == Some(t) {
                break;
            }
            timers.pop();
        }
        let timer = timers.peek().map(|Reverse((t, _))| *t);
        let next = match (q.peek_time(), timer) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => break,
        };
        let next = match restart_at {
            Some(r) if r <= next => r,
            _ => next,
        };
        if next > limit {
            now = limit;
            break;
        }
        now = now.max(next);
        if restart_at.is_some_and(|r| r <= now) {
            restart_at = None;
            pipe = Pipeline::new(scenario.pipeline);
            pipe.set_gap_reports(scenario.gap_reports);
            for (j, job) in scenario.jobs.iter().enumerate() {
                install(&mut pipe, job, job.epoch.wrapping_add(1), &job_ports[j]);
            }
        }
        // Deliver everything due now.
        while q.peek_time().is_some_and(|t| t <= now) {
            let Some((_, ev)) = q.pop() else { break };
            events += 1;
            match ev {
                Event::Wake { worker } => {
                    workers[worker].nic_wake = false;
                    mark(worker, &mut dirty, &mut is_dirty)
                }
                Event::ToWorker { worker, bytes } => {
                    let w = &mut workers[worker];
                    if w.alive(now) {
                        if let Some(s) = w.stream.as_mut() {
                            s.handle_datagram(now, &bytes);
                            mark(worker, &mut dirty, &mut is_dirty);
                        }
                    }
                }
                Event::ToSwitch { port, bytes } => {
                    match pipe.process(port, &bytes, now, &mut out) {
                        Verdict::Unicast { port, len } => {
                            if let Some(i) = port_to_worker(port) {
                                deliver(&mut workers[i], i, now, &out[..len], &mut rng, &mut q);
                            }
                        }
                        Verdict::Multicast { ports, len } => {
                            for p in ports {
                                if let Some(i) = port_to_worker(*p) {
                                    deliver(&mut workers[i], i, now, &out[..len], &mut rng, &mut q);
                                }
                            }
                        }
                        Verdict::Drop(_) | Verdict::Absorbed => {}
                    }
                    if let Some(report) = pipe.poll_report().filter(|_| scenario.gap_reports) {
                        if let Some(i) = port_to_worker(report.port) {
                            deliver(&mut workers[i], i, now, &report.header, &mut rng, &mut q);
                        }
                    }
                }
            }
        }
        // Timers due now.
        while let Some(&Reverse((t, i))) = timers.peek() {
            if t > now {
                break;
            }
            timers.pop();
            if armed[i] != Some(t) {
                continue;
            }
            armed[i] = None;
            let w = &mut workers[i];
            if w.alive(now) {
                if let Some(s) = w.stream.as_mut() {
                    s.handle_timeout(now);
                }
            }
            mark(i, &mut dirty, &mut is_dirty);
        }
    }

    let elapsed = now - Instant::ZERO;
    let mut reports: Vec<WorkerReport> = workers
        .into_iter()
        .map(|w| WorkerReport {
            outcome: w.outcome,
            ended_at: w.ended_at,
            tensors: Vec::new(),
            uplink: w.up.stats,
            downlink: w.down.stats,
        })
        .collect();
    for (r, t) in reports.iter_mut().zip(tensors) {
        r.tensors = t;
    }
    let mut it = reports.into_iter();
    let jobs = scenario
        .jobs
        .iter()
        .map(|j| JobReport {
            job: j.job,
            workers: it.by_ref().take(j.workers.len()).collect(),
        })
        .collect();
    Report {
        jobs,
        switch: *pipe.counters(),
        elapsed,
        events,
    }
}

/// The time a NIC queue of `scenario.nic_queue` full-size packets takes to drain on `link`.
fn nic_room(scenario: &Scenario, link: &LinkConfig) -> Option<Duration> {
    let packets = u64::from(scenario.nic_queue?);
    let bps = link.bandwidth_bps.filter(|b| *b > 0)?;
    let full_packet = 16 + 4 * u64::from(scenario.pipeline.max_elems.max(4));
    let bits = (full_packet * 8).saturating_mul(packets);
    Some(Duration::from_nanos(
        bits.saturating_mul(1_000_000_000) / bps,
    ))
}

fn install(pipe: &mut Pipeline, job: &JobSpec, epoch: u16, ports: &[PortId]) {
    let result = pipe.add_job(JobConfig {
        job: job.job,
        epoch,
        slot_base: job.slot_base,
        slot_count: job.window,
        elems_per_packet: job.elems_per_packet,
        ranks: ports.to_vec(),
        uplink: None,
    });
    if let Err(e) = result {
        panic!("scenario job {} does not fit the switch: {e}", job.job);
    }
}

fn deliver(
    w: &mut WorkerState<'_>,
    index: usize,
    now: Instant,
    bytes: &[u8],
    rng: &mut Rng,
    q: &mut Queue,
) {
    for at in w.down.transmit(now, bytes.len(), rng) {
        q.push(
            at,
            Event::ToWorker {
                worker: index,
                bytes: bytes.to_vec(),
            },
        );
    }
}

/// Starts the next stream when due, sends what the stream has, and records outcomes.
fn pump(
    w: &mut WorkerState<'_>,
    index: usize,
    now: Instant,
    buf: &mut [u8],
    rng: &mut Rng,
    q: &mut Queue,
) {
    loop {
        if !w.alive(now) {
            return;
        }
        if w.stream.is_none() {
            match w.pending.next() {
                None => {
                    w.outcome = Some(Ok(std::mem::take(&mut w.done)));
                    w.ended_at = Some(now - Instant::ZERO);
                    return;
                }
                Some(data) => {
                    let cfg = StreamConfig {
                        lane: w.lane,
                        ..w.cfg.clone()
                    };
                    match Stream::new(cfg, data.tensor(), w.rtt.clone()) {
                        Ok(s) => w.stream = Some(s),
                        Err(e) => {
                            w.outcome = Some(Err(e));
                            w.ended_at = Some(now - Instant::ZERO);
                            return;
                        }
                    }
                }
            }
        }
        let Some(stream) = w.stream.as_mut() else {
            return;
        };
        loop {
            if let Some(room) = w.nic_room {
                // The NIC is full: the worker picks its next packet when there is room.
                let backlog = w.up.backlog(now);
                if backlog >= room {
                    if !w.nic_wake {
                        w.nic_wake = true;
                        let at = now + (backlog - room) + Duration::from_nanos(1);
                        q.push(at, Event::Wake { worker: index });
                    }
                    break;
                }
            }
            match stream.poll_transmit(now, buf) {
                Ok(Some(len)) => {
                    let arr = w.up.transmit(now, len, rng);
                    for at in arr {
                        q.push(
                            at,
                            Event::ToSwitch {
                                port: w.port,
                                bytes: buf[..len].to_vec(),
                            },
                        );
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    w.outcome = Some(Err(e));
                    w.ended_at = Some(now - Instant::ZERO);
                    return;
                }
            }
        }
        match stream.poll_outcome() {
            None => return,
            Some(Ok(stats)) => {
                w.lane = stream.lane_after();
                w.rtt = stream.rtt().clone();
                w.done.push(stats);
                w.stream = None;
            }
            Some(Err(e)) => {
                w.outcome = Some(Err(e));
                w.ended_at = Some(now - Instant::ZERO);
                return;
            }
        }
    }
}
