//! Running a scenario: a switch, its jobs' workers, and the links between them.

use crate::link::{Link, LinkConfig, LinkStats};
use crate::rng::Rng;
use ina_proto::pipeline::{Counters, JobConfig, Pipeline, PipelineConfig, PortId, Uplink, Verdict};
use ina_proto::rtt::{RtoConfig, RttEstimator};
use ina_proto::sparse::{self, UnionSource};
use ina_proto::stream::{Lane, Source, Stream, StreamConfig, StreamError, StreamStats, Tensor};
use ina_proto::window::{WindowConfig, WindowControl};
use ina_proto::Instant;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::rc::Rc;
use std::time::Duration;

/// A tensor a worker all-reduces.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I32(Vec<i32>),
    /// Made from a seed block by block, its results checked as they come: no memory per
    /// element (see [`crate::data`]).
    Generated(crate::data::Generated),
    /// A generated tensor all-reduced sparse (PROTOCOL.md §5, "Sparse streams").
    Sparse(Box<SparseData>),
}

/// A sparse all-reduce of a generated tensor: its support stream, then its values stream over
/// the union.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseData {
    /// This rank's support, then (once the support stream ended) the summed supports.
    pub support: Vec<i32>,
    /// The values stream over the tensor.
    pub values: UnionSource<crate::data::Generated>,
}

impl SparseData {
    /// A sparse all-reduce of `data` in blocks of `elems_per_packet`.
    pub fn new(data: crate::data::Generated, elems_per_packet: usize) -> SparseData {
        SparseData {
            support: Vec::new(),
            values: UnionSource::new(data, elems_per_packet, 0.0),
        }
    }

    /// The fraction of blocks some rank held, once the support stream ended.
    pub fn union_density(&self, elems_per_packet: usize) -> f64 {
        let blocks = sparse::blocks(self.values.inner().len, elems_per_packet);
        sparse::density(&sparse::union(&self.support, blocks), blocks)
    }
}

impl Data {
    fn tensor(&mut self) -> Tensor<'_> {
        match self {
            Data::F32(v) => Tensor::F32(v),
            Data::I32(v) => Tensor::I32(v),
            Data::Generated(g) => Tensor::Generated(g),
            // (Its dense all-reduce; a run sends it sparse, see `pump`.)
            Data::Sparse(s) => Tensor::Generated(s.values.inner_mut()),
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
pub struct SimJob {
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

/// Two levels of switches: workers in racks under rack switches, the rack switches under one
/// upper switch (hierarchical aggregation, PROTOCOL.md §9).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Racks {
    /// Workers per rack (1..=32). A job with workers in several racks is installed on each
    /// of their switches, with the upper switch as its uplink, and on the upper switch with
    /// one rank per rack; a job inside one rack finishes its sums there.
    pub per_rack: usize,
    /// The link between each rack switch and the upper switch, in both directions.
    pub uplink: LinkConfig,
    /// Where workers go. Packed: the scenario's workers, job after job, fill the racks in
    /// order. Striped: `racks = ceil(workers / per_rack)`, and each job's ranks are dealt
    /// round-robin over the racks (starting where the previous job stopped), so that every
    /// job crosses the racks' uplinks and shares them with the others.
    pub striped: bool,
}

/// The port of a rack switch that leads to the upper switch (worker ports start at 2).
pub const UPLINK_PORT: PortId = PortId(1);

/// A complete simulation.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub seed: u64,
    pub pipeline: PipelineConfig,
    pub jobs: Vec<SimJob>,
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
    /// The loss-recovery rules the workers follow (all by default).
    pub rules: ina_proto::stream::Rules,
    /// How many full-size packets a worker's NIC holds before the worker stops handing it
    /// more (`None`: no limit, as a deep kernel queue would take them). With a short queue the
    /// worker chooses each packet when the NIC can send it, so a repair or a lagging slot's
    /// next use goes out next instead of behind a window of queued packets: the queue, not the
    /// network, would otherwise set every round trip to the window's serialization time.
    pub nic_queue: Option<u32>,
    /// Racks under an upper switch; `None`: every worker on one switch.
    pub racks: Option<Racks>,
    /// Every worker's streams keep a delay-based AIMD window of packets in flight (see
    /// `ina_proto::window`); `None`: every slot of the lane busy.
    pub window_control: Option<WindowConfig>,
}

impl Scenario {
    /// A scenario with defaults for everything but the seed and jobs.
    pub fn new(seed: u64, jobs: Vec<SimJob>) -> Scenario {
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
            rules: Default::default(),
            nic_queue: Some(DEFAULT_NIC_QUEUE),
            racks: None,
            window_control: None,
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
    /// The counters of every switch, added up.
    pub switch: Counters,
    /// Each switch's counters: the rack switches in order, then the upper switch (one entry
    /// without racks).
    pub switches: Vec<Counters>,
    /// Each rack switch's link to the upper switch (empty without racks).
    pub rack_uplinks: Vec<LinkStats>,
    /// The upper switch's link to each rack switch.
    pub rack_downlinks: Vec<LinkStats>,
    /// Virtual time at which the run ended.
    pub elapsed: Duration,
    /// Events processed.
    pub events: u64,
}

#[derive(Debug)]
enum Event {
    /// A packet reaches a switch on a port.
    ToSwitch {
        switch: usize,
        port: PortId,
        bytes: Rc<[u8]>,
    },
    /// A packet reaches a worker.
    ToWorker { worker: usize, bytes: Rc<[u8]> },
    /// A worker starts or dies.
    Wake { worker: usize },
}

/// The events still to come, in order of time, and of scheduling among equal times (so that
/// a run is the same for the same seed). The heap holds `(time, order, place)`; the events
/// themselves wait in `slab[place]`, whose free places are reused.
struct Queue {
    heap: BinaryHeap<Reverse<(Instant, u64, u32)>>,
    slab: Vec<Option<Event>>,
    free: Vec<u32>,
    next: u64,
}

impl Queue {
    fn new() -> Queue {
        Queue {
            heap: BinaryHeap::new(),
            slab: Vec::new(),
            free: Vec::new(),
            next: 0,
        }
    }
    fn push(&mut self, at: Instant, ev: Event) {
        let place = match self.free.pop() {
            Some(p) => {
                self.slab[p as usize] = Some(ev);
                p
            }
            None => {
                self.slab.push(Some(ev));
                (self.slab.len() - 1) as u32
            }
        };
        self.heap.push(Reverse((at, self.next, place)));
        self.next += 1;
    }
    fn peek_time(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }
    fn pop(&mut self) -> Option<(Instant, Event)> {
        // Every entry's place holds its event until the entry is popped; an entry whose place
        // were empty is skipped rather than taken for the end of the queue.
        while let Some(Reverse((t, _, place))) = self.heap.pop() {
            if let Some(ev) = self.slab.get_mut(place as usize).and_then(Option::take) {
                self.free.push(place);
                return Some((t, ev));
            }
        }
        None
    }
}

struct WorkerState<'a> {
    /// The switch it is attached to, and its port there.
    switch: usize,
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
    /// The window control, carried from stream to stream.
    window: Option<WindowControl>,
    /// The values stream of the sparse all-reduce whose support stream runs.
    values_next: Option<&'a mut UnionSource<crate::data::Generated>>,
}

impl WorkerState<'_> {
    fn alive(&self, now: Instant) -> bool {
        now >= self.start_at && self.dies_at.is_none_or(|d| now < d) && self.outcome.is_none()
    }
}

/// Who is behind a port of a switch.
#[derive(Debug, Clone, Copy)]
enum Peer {
    Worker(usize),
    /// The upper switch (behind a rack switch's [`UPLINK_PORT`]).
    Upper,
    /// Rack switch `r` (behind the upper switch's port `r`).
    Rack(usize),
}

/// The switches of a scenario, what they install, and who is behind each port.
struct Topology {
    /// The jobs each switch installs, with the scenario's epochs.
    installs: Vec<Vec<JobConfig>>,
    /// `peers[switch][port]`.
    peers: Vec<Vec<Option<Peer>>>,
    /// The upper switch's index, with racks.
    upper: Option<usize>,
    /// Per worker (in scenario order): its switch, port, rank there, and ranks there.
    attach: Vec<(usize, PortId, u8, u8)>,
}

impl Topology {
    fn new(scenario: &Scenario) -> Topology {
        let total: usize = scenario.jobs.iter().map(|j| j.workers.len()).sum();
        let per_rack = scenario.racks.map(|r| r.per_rack.clamp(1, 32));
        let racks = per_rack.map_or(0, |k| total.div_ceil(k));
        let switches = if per_rack.is_some() { racks + 1 } else { 1 };
        let upper = per_rack.map(|_| racks);
        let mut installs = vec![Vec::new(); switches];
        let mut peers: Vec<Vec<Option<Peer>>> = vec![Vec::new(); switches];
        let set_peer = |peers: &mut Vec<Vec<Option<Peer>>>, sw: usize, port: PortId, p: Peer| {
            let at = usize::from(port.0);
            if peers[sw].len() <= at {
                peers[sw].resize(at + 1, None);
            }
            peers[sw][at] = Some(p);
        };
        let mut attach = vec![(0usize, PortId(0), 0u8, 0u8); total];
        // The next free worker port of each switch.
        let mut next_port = vec![2u16; switches];
        let striped = scenario.racks.is_some_and(|r| r.striped);
        let mut g = 0usize;
        for job in &scenario.jobs {
            // The job's workers by switch, in rank order.
            let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
            for _ in &job.workers {
                let sw = match per_rack {
                    None => 0,
                    Some(_) if striped => g % racks,
                    Some(k) => g / k,
                };
                match groups.iter_mut().find(|(s, _)| *s == sw) {
                    Some((_, members)) => members.push(g),
                    None => groups.push((sw, vec![g])),
                }
                g += 1;
            }
            groups.sort_by_key(|(sw, _)| *sw);
            let tree = upper.filter(|_| groups.len() > 1);
            for (i, (sw, members)) in groups.iter().enumerate() {
                let ports: Vec<PortId> = members
                    .iter()
                    .map(|_| {
                        next_port[*sw] += 1;
                        PortId(next_port[*sw] - 1)
                    })
                    .collect();
                for (r, (&w, &port)) in members.iter().zip(&ports).enumerate() {
                    set_peer(&mut peers, *sw, port, Peer::Worker(w));
                    attach[w] = (*sw, port, r as u8, members.len() as u8);
                }
                let uplink = tree.map(|_| {
                    set_peer(&mut peers, *sw, UPLINK_PORT, Peer::Upper);
                    Uplink {
                        port: UPLINK_PORT,
                        job: job.job,
                        epoch: job.epoch,
                        rank: i as u8,
                        slot_base: job.slot_base,
                    }
                });
                installs[*sw].push(JobConfig {
                    job: job.job,
                    epoch: job.epoch,
                    slot_base: job.slot_base,
                    slot_count: job.window,
                    elems_per_packet: job.elems_per_packet,
                    ranks: ports,
                    uplink,
                });
            }
            if let Some(up) = tree {
                let ranks: Vec<PortId> = groups.iter().map(|(sw, _)| PortId(*sw as u16)).collect();
                for (sw, _) in &groups {
                    set_peer(&mut peers, up, PortId(*sw as u16), Peer::Rack(*sw));
                }
                installs[up].push(JobConfig {
                    job: job.job,
                    epoch: job.epoch,
                    slot_base: job.slot_base,
                    slot_count: job.window,
                    elems_per_packet: job.elems_per_packet,
                    ranks,
                    uplink: None,
                });
            }
        }
        Topology {
            installs,
            peers,
            upper,
            attach,
        }
    }

    /// The switches with their jobs installed, epochs moved on by `epoch_bump` (a restart).
    fn switches(&self, scenario: &Scenario, epoch_bump: u16) -> Vec<Pipeline> {
        self.installs
            .iter()
            .map(|jobs| {
                let mut pipe = Pipeline::new(scenario.pipeline);
                pipe.set_gap_reports(scenario.gap_reports);
                for job in jobs {
                    let mut cfg = job.clone();
                    cfg.epoch = cfg.epoch.wrapping_add(epoch_bump);
                    if let Some(up) = cfg.uplink.as_mut() {
                        up.epoch = up.epoch.wrapping_add(epoch_bump);
                    }
                    if let Err(e) = pipe.add_job(cfg) {
                        panic!("scenario job {} does not fit the switch: {e}", job.job);
                    }
                }
                pipe
            })
            .collect()
    }

    fn peer(&self, switch: usize, port: PortId) -> Option<Peer> {
        self.peers
            .get(switch)
            .and_then(|p| p.get(usize::from(port.0)))
            .copied()
            .flatten()
    }
}

/// Runs a scenario to completion (every worker finished, failed or dead) or to its time limit.
pub fn run(scenario: &Scenario) -> Report {
    let mut rng = Rng::new(scenario.seed);
    let topo = Topology::new(scenario);
    let mut switches = topo.switches(scenario, 0);
    let racks = topo.upper.unwrap_or(0);
    let uplink_cfg = scenario.racks.map(|r| r.uplink).unwrap_or_default();
    let mut rack_up: Vec<Link> = (0..racks).map(|_| Link::new(uplink_cfg)).collect();
    let mut rack_down: Vec<Link> = (0..racks).map(|_| Link::new(uplink_cfg)).collect();
    let mut tensors: Vec<Vec<Data>> = Vec::new();
    for job in &scenario.jobs {
        for w in &job.workers {
            tensors.push(w.tensors.clone());
        }
    }
    let mut tensor_iters = tensors.iter_mut();
    let mut workers: Vec<WorkerState<'_>> = Vec::new();
    let mut attach = topo.attach.iter();
    for job in &scenario.jobs {
        for w in &job.workers {
            let link = w.link.unwrap_or(scenario.link);
            let lane = Lane::new(job.slot_base, job.window);
            let pending = tensor_iters
                .next()
                .map(|t| t.iter_mut())
                .unwrap_or_default();
            let Some(&(switch, port, rank, ranks)) = attach.next() else {
                unreachable!("the topology attaches every worker");
            };
            workers.push(WorkerState {
                switch,
                port,
                cfg: StreamConfig {
                    job: job.job,
                    epoch: w.epoch.unwrap_or(job.epoch),
                    rank,
                    workers: ranks,
                    total_workers: job.workers.len() as u16,
                    elems_per_packet: job.elems_per_packet,
                    lane,
                    max_retries: scenario.max_retries,
                    give_up: scenario.give_up,
                    gap_reports: scenario.gap_reports,
                    rules: scenario.rules,
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
                window: scenario.window_control.map(WindowControl::new),
                values_next: None,
            });
        }
    }

    let mut q = Queue::new();
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
                switch: 0,
                port: inj.port,
                bytes: Rc::from(inj.bytes.as_slice()),
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
            switches = topo.switches(scenario, 1);
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
                Event::ToSwitch {
                    switch,
                    port,
                    bytes,
                } => {
                    let Some(pipe) = switches.get_mut(switch) else {
                        continue;
                    };
                    let mut net = Net {
                        topo: &topo,
                        workers: &mut workers,
                        rack_up: &mut rack_up,
                        rack_down: &mut rack_down,
                        rng: &mut rng,
                        q: &mut q,
                        now,
                    };
                    match pipe.process(port, &bytes, now, &mut out) {
                        Verdict::Unicast { port, len } => {
                            net.send(switch, port, &out[..len], &mut None)
                        }
                        Verdict::Multicast { ports, len } => {
                            // One buffer for every copy that arrives.
                            let mut shared = None;
                            for p in ports {
                                net.send(switch, *p, &out[..len], &mut shared);
                            }
                        }
                        Verdict::Drop(_) | Verdict::Absorbed => {}
                    }
                    if let Some(report) = pipe.poll_report().filter(|_| scenario.gap_reports) {
                        for _ in 0..report.copies {
                            net.send(switch, report.port, &report.header, &mut None);
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
    let per_switch: Vec<Counters> = switches.iter().map(|p| *p.counters()).collect();
    let mut switch = Counters::default();
    for c in &per_switch {
        switch.add(c);
    }
    Report {
        jobs,
        switch,
        switches: per_switch,
        rack_uplinks: rack_up.iter().map(|l| l.stats).collect(),
        rack_downlinks: rack_down.iter().map(|l| l.stats).collect(),
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

/// Where a switch's output goes: to a worker over its downlink, or to the other level's
/// switch over the rack's link.
struct Net<'n, 'w> {
    topo: &'n Topology,
    workers: &'n mut [WorkerState<'w>],
    rack_up: &'n mut [Link],
    rack_down: &'n mut [Link],
    rng: &'n mut Rng,
    q: &'n mut Queue,
    now: Instant,
}

impl Net<'_, '_> {
    /// Sends `bytes` out of `port` of switch `from`.
    /// `shared` holds the datagram's buffer once a copy of it has arrived anywhere.
    fn send(&mut self, from: usize, port: PortId, bytes: &[u8], shared: &mut Option<Rc<[u8]>>) {
        let (link, to, to_port) = match self.topo.peer(from, port) {
            None => return,
            Some(Peer::Worker(i)) => {
                deliver(
                    &mut self.workers[i],
                    i,
                    self.now,
                    bytes,
                    shared,
                    self.rng,
                    self.q,
                );
                return;
            }
            Some(Peer::Upper) => match (self.rack_up.get_mut(from), self.topo.upper) {
                (Some(link), Some(up)) => (link, up, PortId(from as u16)),
                _ => return,
            },
            Some(Peer::Rack(r)) => match self.rack_down.get_mut(r) {
                Some(link) => (link, r, UPLINK_PORT),
                None => return,
            },
        };
        for at in link.transmit(self.now, bytes.len(), self.rng) {
            self.q.push(
                at,
                Event::ToSwitch {
                    switch: to,
                    port: to_port,
                    bytes: share(bytes, shared),
                },
            );
        }
    }
}

fn deliver(
    w: &mut WorkerState<'_>,
    index: usize,
    now: Instant,
    bytes: &[u8],
    shared: &mut Option<Rc<[u8]>>,
    rng: &mut Rng,
    q: &mut Queue,
) {
    for at in w.down.transmit(now, bytes.len(), rng) {
        q.push(
            at,
            Event::ToWorker {
                worker: index,
                bytes: share(bytes, shared),
            },
        );
    }
}

/// The buffer of a datagram that arrives somewhere, made on its first arrival and shared by
/// the others (a multicast's copies, a duplicate).
fn share(bytes: &[u8], shared: &mut Option<Rc<[u8]>>) -> Rc<[u8]> {
    shared.get_or_insert_with(|| Rc::from(bytes)).clone()
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
            let tensor = if let Some(values) = w.values_next.take() {
                Tensor::Generated(values)
            } else {
                match w.pending.next() {
                    None => {
                        w.outcome = Some(Ok(std::mem::take(&mut w.done)));
                        w.ended_at = Some(now - Instant::ZERO);
                        return;
                    }
                    Some(Data::Sparse(s)) => {
                        let SparseData { support, values } = &mut **s;
                        let e = usize::from(w.cfg.elems_per_packet);
                        *support = sparse::source_support(values.inner_mut(), e, 0.0);
                        w.values_next = Some(values);
                        Tensor::Support(support, true)
                    }
                    Some(data) => data.tensor(),
                }
            };
            let cfg = StreamConfig {
                lane: w.lane,
                ..w.cfg.clone()
            };
            match Stream::new(cfg, tensor, w.rtt.clone()) {
                Ok(mut s) => {
                    s.set_window_control(w.window.clone());
                    w.stream = Some(s)
                }
                Err(e) => {
                    w.outcome = Some(Err(e));
                    w.ended_at = Some(now - Instant::ZERO);
                    return;
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
                    let mut shared = None;
                    for at in arr {
                        q.push(
                            at,
                            Event::ToSwitch {
                                switch: w.switch,
                                port: w.port,
                                bytes: share(&buf[..len], &mut shared),
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
                w.window = stream.window_control().cloned();
                w.done.push(stats);
                if let Some(Tensor::Support(sums, _)) = w.stream.take().map(Stream::into_tensor) {
                    // The support stream ended: the union is known, and with it the values
                    // stream (none for an empty union).
                    if let Some(values) = w.values_next.as_mut() {
                        let e = usize::from(w.cfg.elems_per_packet);
                        let blocks = sparse::blocks(values.inner().len, e);
                        values.set_union(sparse::union(sums, blocks));
                        if values.is_empty() {
                            w.values_next = None;
                        }
                    }
                }
            }
            Some(Err(e)) => {
                w.outcome = Some(Err(e));
                w.ended_at = Some(now - Instant::ZERO);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker_of(ev: Event) -> usize {
        match ev {
            Event::Wake { worker } | Event::ToWorker { worker, .. } => worker,
            Event::ToSwitch { switch, .. } => switch,
        }
    }

    #[test]
    fn the_queue_gives_events_by_time_then_in_the_order_they_were_scheduled() {
        let mut q = Queue::new();
        let t = |ns| Instant::ZERO + Duration::from_nanos(ns);
        q.push(t(20), Event::Wake { worker: 0 });
        q.push(t(10), Event::Wake { worker: 1 });
        q.push(t(20), Event::Wake { worker: 2 });
        q.push(t(10), Event::Wake { worker: 3 });
        assert_eq!(q.peek_time(), Some(t(10)));
        let (at, ev) = q.pop().unwrap();
        assert_eq!((at, worker_of(ev)), (t(10), 1));
        // A place freed is reused, and its new event keeps its own time and order.
        q.push(
            t(20),
            Event::ToWorker {
                worker: 4,
                bytes: Rc::from(&[1u8, 2][..]),
            },
        );
        assert_eq!(q.slab.len(), 4);
        let order: Vec<(Instant, usize)> = std::iter::from_fn(|| q.pop())
            .map(|(at, ev)| (at, worker_of(ev)))
            .collect();
        assert_eq!(order, vec![(t(10), 3), (t(20), 0), (t(20), 2), (t(20), 4)]);
        assert!(q.pop().is_none());
    }
}
