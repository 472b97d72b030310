//! One shard: a socket of the reuseport group, a pipeline and its registers, one thread.

use crate::loss::Loss;
use crate::port::ShardPort;
use ina_io::{Port, RecvBatch, SendBatch};
use ina_proto::pipeline::{Burst, JobConfig, Pipeline, PortId, Report, Verdict};
use ina_proto::Instant;
use ina_switch_api::{IoStats, ShardStats};
use ina_wire::agg::{ProbeGroup, ProbeInfo, GAP_BLOCK};
use ina_wire::{AggPacket, AggRepr, MessageType, HEADER_LEN};
use std::collections::HashMap;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// The port id of a source address no job lists.
pub(crate) const UNKNOWN_PORT: PortId = PortId(u16::MAX);

/// Control-plane messages to a shard, applied between batches.
#[derive(Debug)]
pub(crate) enum Command {
    AddJob {
        cfg: JobConfig,
        addrs: Vec<(PortId, SocketAddr)>,
        group: Option<SocketAddrV4>,
        reply: mpsc::Sender<Result<(), String>>,
    },
    RemoveJob {
        job: u16,
        /// Addresses no remaining job lists, with their ids: both are forgotten, and an id may
        /// come back with another address, an address with another id.
        forget: Vec<(PortId, SocketAddr)>,
        reply: mpsc::Sender<Result<(), String>>,
    },
    Stats(mpsc::Sender<ShardStats>),
}

/// A shard's socket counters, from its port's.
fn io_stats(c: &ina_io::Counters) -> IoStats {
    IoStats {
        rx_datagrams: c.rx_datagrams,
        rx_bytes: c.rx_bytes,
        rx_truncated: c.rx_truncated,
        rx_syscalls: c.rx_syscalls,
        tx_datagrams: c.tx_datagrams,
        tx_bytes: c.tx_bytes,
        tx_errors: c.tx_errors,
        tx_syscalls: c.tx_syscalls,
    }
}

/// A cheap total order on addresses, for grouping replies by destination.
fn addr_key(a: &SocketAddr) -> (u128, u16) {
    let ip = match a {
        SocketAddr::V4(v) => u128::from(u32::from(*v.ip())),
        SocketAddr::V6(v) => u128::from(*v.ip()),
    };
    (ip, a.port())
}

/// Hashes socket addresses for the per-datagram port lookup: foldhash's fast hash, much
/// cheaper than the standard library's SipHash, with per-table random seeds. The table only
/// holds addresses the control endpoint installed, so crafted source addresses cannot grow it.
pub(crate) type BuildAddrHasher = foldhash::fast::RandomState;

pub(crate) struct Shard {
    index: usize,
    port: ShardPort,
    pipe: Pipeline,
    commands: mpsc::Receiver<Command>,
    /// Worker address -> port, looked up for every datagram.
    by_addr: HashMap<SocketAddr, PortId, BuildAddrHasher>,
    /// Port -> worker address, indexed by the port number.
    addr_of: Vec<Option<SocketAddr>>,
    /// Jobs whose results go to a multicast group, with the group.
    groups: Vec<(u16, SocketAddrV4)>,
    loss_in: Loss,
    loss_out: Loss,
    stats: ShardStats,
    origin: std::time::Instant,
    mesh: Mesh,
    joins: Joins,
}

/// Which worker instance holds each rank of each job, by the nonce of its probes.
///
/// Workers start every stream at the same positions, so a new set of worker processes on an
/// installed job would send the very sequence numbers the previous run completed, and the
/// switch would answer them with the previous run's sums. A probe carries a nonce that stays
/// the same for the life of a worker's communicator: a probe for a rank with a new nonce means
/// a new worker took the rank, and the job is reinstalled under a new epoch before any of the
/// new workers gets an answer, so no packet of the new run can match an old use.
///
/// A probe's source address is its only credential (PROTOCOL.md §3), so anyone who can send
/// from a worker's address can also ask for a reinstall: a job is reinstalled at most once per
/// [`MIN_REINSTALL_INTERVAL`], which bounds what spoofed probes can cost a job.
///
/// A rack switch's job of a tree (one with an uplink) is not reinstalled here: its upper
/// switch would keep the previous run's sums, which the new run's partials would meet (the
/// same positions) and be answered with. A new worker on such a job is held, unanswered, until
/// the tree is installed afresh from the top (the controller does so when a new run's workers
/// join), and the switch says so once.
#[derive(Debug)]
pub(crate) struct Joins {
    nonces: HashMap<(u16, u8), u32>,
    /// When each job was last reinstalled for a new worker.
    reinstalled: HashMap<u16, std::time::Instant>,
    /// Jobs waiting for their reinstall: their probes go unanswered until it is done.
    pending: std::collections::HashSet<u16>,
    /// Where reinstall requests go (the switch's control plane).
    requests: mpsc::Sender<u16>,
    /// Jobs with an uplink (rack switches' jobs of a tree).
    trees: std::collections::HashSet<u16>,
    /// Tree jobs whose new workers were held, said once until the job is installed again.
    told: std::collections::HashSet<u16>,
}

impl Joins {
    pub(crate) fn new(requests: mpsc::Sender<u16>) -> Joins {
        Joins {
            nonces: HashMap::new(),
            reinstalled: HashMap::new(),
            pending: std::collections::HashSet::new(),
            requests,
            trees: std::collections::HashSet::new(),
            told: std::collections::HashSet::new(),
        }
    }

    /// Whether a valid probe received at `now` may be answered now.
    fn admit(&mut self, job: u16, rank: u8, nonce: u32, now: std::time::Instant) -> Admit {
        if self.pending.contains(&job) {
            return Admit::Held;
        }
        match self.nonces.entry((job, rank)) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(nonce);
                Admit::Answer
            }
            std::collections::hash_map::Entry::Occupied(o) if *o.get() == nonce => Admit::Answer,
            std::collections::hash_map::Entry::Occupied(_) if self.trees.contains(&job) => {
                if self.told.insert(job) {
                    tracing::warn!(
                        job,
                        rank,
                        "a new worker took a rank of a tree job: its probes go unanswered until the whole tree is installed afresh, from the upper switch down (the controller does so when the new run's workers join; by hand, install the upper switch's job under a new epoch, then this switch's with that uplink_epoch)"
                    );
                }
                Admit::Held
            }
            std::collections::hash_map::Entry::Occupied(_) => {
                let recent = self
                    .reinstalled
                    .get(&job)
                    .is_some_and(|&t| now.saturating_duration_since(t) < MIN_REINSTALL_INTERVAL);
                if recent {
                    return Admit::Deferred;
                }
                tracing::info!(
                    job,
                    rank,
                    "a new worker took the rank: reinstalling the job"
                );
                self.reinstalled.insert(job, now);
                self.pending.insert(job);
                let _ = self.requests.send(job);
                Admit::Held
            }
        }
    }

    /// The job was installed (as a tree's rack switch's job if `tree`) or removed: every
    /// rank is free again.
    fn reset(&mut self, job: u16, tree: bool) {
        self.nonces.retain(|(j, _), _| *j != job);
        self.pending.remove(&job);
        self.told.remove(&job);
        if tree {
            self.trees.insert(job);
        } else {
            self.trees.remove(&job);
        }
    }
}

/// The least time between two reinstalls of a job for new workers.
pub const MIN_REINSTALL_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// What becomes of a valid probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    /// Answered.
    Answer,
    /// Held while the job is reinstalled.
    Held,
    /// A new worker's, held because the job was reinstalled too recently.
    Deferred,
}

/// Datagrams a shard received for slots another shard owns, with their sources.
/// Stored back to back in one buffer: one allocation per batch, not per datagram.
pub(crate) type ForwardBatch = SendBatch<SocketAddr>;

/// How the shards hand each other datagrams. The kernel steers every datagram by its slot,
/// but a GSO buffer (several datagrams sent in one call on the same host) is steered as a
/// whole by its first datagram: its other datagrams may belong to other shards, which get
/// them through here, followed by a wake-up datagram sent to the switch's own address with
/// the owner's slot, so the owner does not sleep on its socket meanwhile.
///
/// Each shard's inbox holds at most [`MESH_CAPACITY`] batches: a batch for a shard that is
/// that far behind is dropped and counted ([`ShardStats::forward_dropped`]), as its socket
/// would drop datagrams it has no room for, instead of growing without bound.
#[derive(Debug)]
pub(crate) struct Mesh {
    pub(crate) shards: usize,
    pub(crate) peers: Vec<mpsc::SyncSender<ForwardBatch>>,
    pub(crate) inbox: mpsc::Receiver<ForwardBatch>,
    /// The switch's address, as seen in the source of its own wake-up datagrams.
    pub(crate) local: SocketAddr,
}

/// The batches (of at most one receive batch each) a shard's inbox holds.
pub(crate) const MESH_CAPACITY: usize = 64;

impl Mesh {
    /// One mesh per shard, all connected.
    pub(crate) fn build(shards: usize, local: SocketAddr) -> Vec<Mesh> {
        Mesh::build_with(shards, local, MESH_CAPACITY)
    }

    /// [`build`](Self::build) with inboxes of `capacity` batches.
    fn build_with(shards: usize, local: SocketAddr, capacity: usize) -> Vec<Mesh> {
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..shards).map(|_| mpsc::sync_channel(capacity)).unzip();
        receivers
            .into_iter()
            .map(|inbox| Mesh {
                shards,
                peers: senders.clone(),
                inbox,
                local,
            })
            .collect()
    }

    /// Hands `batch` to shard `owner` without waiting; returns whether it was taken. A batch
    /// its inbox has no room for is dropped, and its datagrams counted in `stats`.
    fn hand_over(&self, owner: usize, batch: ForwardBatch, stats: &mut ShardStats) -> bool {
        let datagrams = batch.len() as u64;
        match self.peers.get(owner).map(|peer| peer.try_send(batch)) {
            Some(Ok(())) => {
                stats.forwarded_out += datagrams;
                true
            }
            _ => {
                stats.forward_dropped += datagrams;
                false
            }
        }
    }

    /// Where wake-up datagrams go.
    fn wake_addr(&self) -> SocketAddr {
        if self.local.ip().is_unspecified() {
            SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), self.local.port())
        } else {
            self.local
        }
    }

    /// Whether a datagram came from the switch itself (a wake-up).
    fn is_own(&self, from: SocketAddr) -> bool {
        from.port() == self.local.port()
            && (from.ip() == self.local.ip()
                || (self.local.ip().is_unspecified() && from.ip().is_loopback()))
    }

    /// The shard owning the slot of a datagram, as the steering program computes it.
    fn owner(&self, data: &[u8]) -> Option<usize> {
        let slot = data.get(8..10)?;
        Some(usize::from(u16::from_be_bytes([slot[0], slot[1]]) / GAP_BLOCK) % self.shards)
    }
}

/// What a shard needs besides its pipeline to handle a datagram: borrowed apart from the
/// pipeline, which a receive batch runs through as one [`Pipeline::burst`].
struct Egress<'s> {
    by_addr: &'s HashMap<SocketAddr, PortId, BuildAddrHasher>,
    addr_of: &'s [Option<SocketAddr>],
    groups: &'s [(u16, SocketAddrV4)],
    loss_out: &'s mut Loss,
    joins: &'s mut Joins,
    stats: &'s mut ShardStats,
    /// The destinations of the reply at hand (kept between datagrams: no allocation each).
    ports: &'s mut Vec<PortId>,
    /// The room for one reply in the send batch.
    max_reply: usize,
}

/// A ProbeReply for a job whose results go to a multicast group names the group (PROTOCOL.md
/// §3): a worker that has not joined it would get every result only as the answer to a
/// retransmission. Returns the reply's new length (`len` for any other reply).
fn name_group(groups: &[(u16, SocketAddrV4)], buf: &mut [u8], len: usize) -> usize {
    if groups.is_empty() || len != HEADER_LEN + 4 * usize::from(ProbeInfo::COUNT) {
        return len;
    }
    let Some(Ok(pkt)) = buf.get(..len).map(AggPacket::new_checked) else {
        return len;
    };
    if pkt.msg_type_raw() != MessageType::ProbeReply as u8 {
        return len;
    }
    let job = pkt.job();
    let Some(&(_, group)) = groups.iter().find(|(j, _)| *j == job) else {
        return len;
    };
    let Some(tail) = buf.get_mut(len..) else {
        return len;
    };
    if (ProbeGroup { group }).emit(tail).is_err() {
        return len;
    }
    let longer = len + 4 * usize::from(ProbeGroup::COUNT);
    match buf.get_mut(..longer) {
        Some(reply) => {
            AggPacket::new_unchecked(reply).set_count(ProbeInfo::COUNT_WITH_GROUP);
            longer
        }
        None => len,
    }
}

impl Egress<'_> {
    /// Runs one datagram through the pipeline and queues its reply, if any.
    #[inline(always)]
    fn handle(
        &mut self,
        pipe: &mut Burst<'_>,
        from: SocketAddr,
        data: &[u8],
        now: Instant,
        tx: &mut SendBatch,
    ) {
        let ingress = match self.by_addr.get(&from) {
            Some(p) => *p,
            None => {
                self.stats.unknown_source += 1;
                UNKNOWN_PORT
            }
        };
        // The reply is written once, straight into the send batch, and carried by one
        // datagram per destination without further copies.
        let ports = &mut *self.ports;
        ports.clear();
        let groups = self.groups;
        let mut multicast = false;
        // The job of a multicast result (a total from an upper switch carries another job's
        // id than the packet that brought it).
        let mut result_job = 0u16;
        // (Inlined, like `write_in_place`, so that the pipeline's fast path is compiled into
        // the burst's loop.)
        let reply = tx.write_in_place(
            self.max_reply,
            #[inline(always)]
            |buf| match pipe.process(ingress, data, now, buf) {
                Verdict::Unicast { port, len } => {
                    ports.push(port);
                    name_group(groups, buf, len)
                }
                Verdict::Multicast { ports: to, len } => {
                    multicast = true;
                    ports.extend_from_slice(to);
                    if let Some(&[a, b]) = buf.get(2..4) {
                        result_job = u16::from_be_bytes([a, b]);
                    }
                    len
                }
                Verdict::Drop(_) | Verdict::Absorbed => 0,
            },
        );
        if let Some(report) = pipe.poll_report() {
            for _ in 0..report.copies {
                send_report(self.addr_of, self.loss_out, self.stats, report, tx);
            }
        }
        let Some(reply) = reply else { return };
        if multicast && !self.groups.is_empty() {
            if let Some(&(_, group)) = self.groups.iter().find(|(j, _)| *j == result_job) {
                // One datagram for every worker of the job.
                if self.loss_out.drop_now() {
                    self.stats.injected_drops_out += 1;
                } else {
                    tx.push_extent(SocketAddr::V4(group), reply);
                    self.stats.results_to_group += 1;
                }
                return;
            }
        }
        // (A result is never the answer to a probe.)
        if !multicast {
            if let Ok((h, _)) = AggRepr::parse_bytes(data) {
                if h.kind == MessageType::Probe {
                    // Unanswered until the job is reinstalled; the worker probes again.
                    match self
                        .joins
                        .admit(h.job, h.rank, h.seq, std::time::Instant::now())
                    {
                        Admit::Answer => {}
                        Admit::Held => {
                            self.stats.probes_held += 1;
                            return;
                        }
                        Admit::Deferred => {
                            self.stats.reinstalls_deferred += 1;
                            return;
                        }
                    }
                }
            }
        }
        for p in ports.iter() {
            if self.loss_out.drop_now() {
                self.stats.injected_drops_out += 1;
            } else if let Some(Some(addr)) = self.addr_of.get(usize::from(p.0)) {
                tx.push_extent(*addr, reply);
                if multicast {
                    self.stats.results_to_workers += 1;
                }
            }
        }
    }
}

/// Sends a Missing report of the pipeline to the worker it names.
#[cold]
fn send_report(
    addr_of: &[Option<SocketAddr>],
    loss_out: &mut Loss,
    stats: &mut ShardStats,
    report: Report,
    tx: &mut SendBatch,
) {
    let Some(Some(addr)) = addr_of.get(usize::from(report.port.0)) else {
        return;
    };
    if loss_out.drop_now() {
        stats.injected_drops_out += 1;
        return;
    }
    let written = tx.write_in_place(report.header.len(), |buf| {
        match buf.get_mut(..report.header.len()) {
            Some(b) => {
                b.copy_from_slice(&report.header);
                b.len()
            }
            None => 0,
        }
    });
    if let Some(extent) = written {
        tx.push_extent(*addr, extent);
    }
}

impl Shard {
    pub(crate) fn new(
        index: usize,
        mesh: Mesh,
        joins: Joins,
        port: ShardPort,
        pipe: Pipeline,
        commands: mpsc::Receiver<Command>,
        (loss, seed): (f64, u64),
    ) -> Shard {
        Shard {
            index,
            port,
            pipe,
            commands,
            by_addr: HashMap::default(),
            addr_of: Vec::new(),
            groups: Vec::new(),
            loss_in: Loss::new(loss, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
            loss_out: Loss::new(loss, seed.wrapping_mul(0xc2b2_ae3d_27d4_eb4f) | 3),
            stats: ShardStats {
                shard: index,
                ..ShardStats::default()
            },
            origin: std::time::Instant::now(),
            mesh,
            joins,
        }
    }

    /// Grows the socket's receive buffer to hold every installed job's full window twice
    /// over: all workers may send their whole window at once, and a datagram that finds the
    /// buffer full is lost and must be recovered by the workers.
    fn size_recv_buffer(&self) {
        let in_flight: usize = self
            .pipe
            .jobs()
            .map(|j| {
                j.ranks.len()
                    * usize::from(j.slot_count)
                    * (ina_wire::HEADER_LEN + 4 * usize::from(j.elems_per_packet))
            })
            .sum();
        // The kernel charges about twice the payload; leave as much again for bursts.
        let want = in_flight.saturating_mul(4);
        match self.port.grow_recv_buffer(want) {
            Ok(got) if got < want => tracing::warn!(
                shard = self.index,
                want,
                got,
                "receive buffer smaller than the installed jobs' windows: bursts may be dropped (raise net.core.rmem_max or run with CAP_NET_ADMIN)"
            ),
            Ok(got) => tracing::debug!(shard = self.index, bytes = got, "receive buffer"),
            Err(e) => tracing::warn!(shard = self.index, error = %e, "cannot size the receive buffer"),
        }
    }

    fn snapshot(&self) -> ShardStats {
        let mut s = self.stats;
        s.pipeline = *self.pipe.counters();
        s.io = io_stats(&self.port.counters());
        s.busy_slots = self.pipe.busy_slots();
        s
    }

    fn apply(&mut self, cmd: Command) {
        match cmd {
            Command::AddJob {
                cfg,
                addrs,
                group,
                reply,
            } => {
                let (job, tree) = (cfg.job, cfg.uplink.is_some());
                let result = self.pipe.add_job(cfg).map_err(|e| e.to_string());
                self.joins.reset(job, tree && result.is_ok());
                if result.is_ok() {
                    for (p, a) in addrs {
                        self.by_addr.insert(a, p);
                        let i = usize::from(p.0);
                        if self.addr_of.len() <= i {
                            self.addr_of.resize(i + 1, None);
                        }
                        self.addr_of[i] = Some(a);
                    }
                    tracing::debug!(shard = self.index, job, "job installed");
                    self.size_recv_buffer();
                    self.groups.retain(|(j, _)| *j != job);
                    if let Some(g) = group {
                        self.groups.push((job, g));
                        // Out of the interface the switch listens on (the kernel's choice
                        // when it listens on every address).
                        if let Err(e) = self.port.set_multicast_interface() {
                            tracing::warn!(shard = self.index, job, error = %e, "cannot send to multicast groups");
                        }
                    }
                }
                let _ = reply.send(result);
            }
            Command::RemoveJob { job, forget, reply } => {
                self.joins.reset(job, false);
                self.groups.retain(|(j, _)| *j != job);
                let result = self
                    .pipe
                    .remove_job(job)
                    .map(|_| ())
                    .map_err(|e| e.to_string());
                for (p, a) in forget {
                    if self.by_addr.get(&a) == Some(&p) {
                        self.by_addr.remove(&a);
                    }
                    if let Some(slot) = self.addr_of.get_mut(usize::from(p.0)) {
                        if *slot == Some(a) {
                            *slot = None;
                        }
                    }
                }
                let _ = reply.send(result);
            }
            Command::Stats(reply) => {
                let _ = reply.send(self.snapshot());
            }
        }
    }

    pub(crate) fn run(mut self, stop: &AtomicBool) -> ShardStats {
        let span = tracing::info_span!("shard", index = self.index);
        let _enter = span.enter();
        // A receive slot holds the largest packet a job may use, plus one byte so that a
        // larger datagram shows up as truncated rather than fitting exactly.
        let max_packet = ina_wire::HEADER_LEN + 4 * usize::from(self.pipe.config().max_elems);
        let mut rx = RecvBatch::new(64, max_packet.max(2048) + 1);
        let max_reply = max_packet.max(2048);
        let mut tx = SendBatch::with_capacity(256, 64 * max_reply);
        let mut ports: Vec<PortId> = Vec::with_capacity(32);
        let mut outgoing: Vec<ForwardBatch> =
            (0..self.mesh.shards).map(|_| SendBatch::new()).collect();
        let mut wake = SendBatch::with_capacity(1, ina_wire::HEADER_LEN);
        while !stop.load(Ordering::Relaxed) {
            while let Ok(cmd) = self.commands.try_recv() {
                self.apply(cmd);
            }
            match self
                .port
                .recv_batch(&mut rx, Some(Duration::from_millis(10)))
            {
                Ok(0) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "receive failed");
                    continue;
                }
            }
            let now = Instant::from_nanos(self.origin.elapsed().as_nanos() as u64);
            tx.clear();
            let Shard {
                index,
                pipe,
                by_addr,
                addr_of,
                groups,
                loss_in,
                loss_out,
                stats,
                mesh,
                joins,
                ..
            } = &mut self;
            let mut egress = Egress {
                by_addr,
                addr_of,
                groups,
                loss_out,
                joins,
                stats,
                ports: &mut ports,
                max_reply,
            };
            // The whole batch as one burst of the pipeline: its fast path runs inside this
            // loop, compiled for the CPU's widest vectors.
            pipe.burst(
                #[inline(always)]
                |pipe| {
                    // Datagrams other shards received for this one's slots, first: they are
                    // older.
                    while let Ok(batch) = mesh.inbox.try_recv() {
                        for (from, bytes) in batch.iter() {
                            egress.stats.forwarded_in += 1;
                            egress.handle(pipe, from, bytes, now, &mut tx);
                        }
                    }
                    for d in rx.iter() {
                        if mesh.is_own(d.addr) {
                            // A wake-up from another shard; its datagrams came through the
                            // inbox.
                            continue;
                        }
                        if loss_in.drop_now() {
                            egress.stats.injected_drops_in += 1;
                            continue;
                        }
                        if d.truncated {
                            egress.stats.truncated += 1;
                            continue;
                        }
                        match mesh.owner(d.data) {
                            Some(owner) if owner != *index => {
                                if let Some(out) = outgoing.get_mut(owner) {
                                    out.push(d.addr, d.data);
                                }
                            }
                            _ => egress.handle(pipe, d.addr, d.data, now, &mut tx),
                        }
                    }
                },
            );
            for (owner, out) in outgoing.iter_mut().enumerate() {
                if out.is_empty() {
                    continue;
                }
                let batch = std::mem::take(out);
                if self.mesh.hand_over(owner, batch, &mut self.stats) {
                    let mut wake_packet = [0u8; ina_wire::HEADER_LEN];
                    wake_packet[8..10].copy_from_slice(&(owner as u16).to_be_bytes());
                    wake.clear();
                    wake.push(self.mesh.wake_addr(), &wake_packet);
                    if let Err(e) = self.port.send_batch(&wake) {
                        tracing::debug!(error = %e, "wake-up failed");
                    }
                }
            }
            // Grouped by destination, the replies to one worker lie back to back and leave as
            // single GSO buffers.
            tx.sort_by_destination(addr_key);
            if !tx.is_empty() {
                if let Err(e) = self.port.send_batch(&tx) {
                    tracing::debug!(error = %e, "send failed");
                }
            }
        }
        while let Ok(cmd) = self.commands.try_recv() {
            self.apply(cmd);
        }
        let s = self.snapshot();
        tracing::info!(
            packets = s.pipeline.packets_in,
            results = s.pipeline.results_multicast,
            results_to_workers = s.results_to_workers,
            results_to_group = s.results_to_group,
            drops = s.pipeline.drops_total(),
            "shard stopped"
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};

    /// A new nonce for a rank reinstalls its job once; spoofed probes with ever new nonces
    /// cannot reinstall it again before the interval has passed.
    #[test]
    fn reinstalls_of_a_job_are_rate_limited() {
        let (tx, rx) = mpsc::channel();
        let mut joins = Joins::new(tx);
        let t0 = std::time::Instant::now();
        assert_eq!(joins.admit(1, 0, 100, t0), Admit::Answer);
        assert_eq!(joins.admit(1, 0, 100, t0), Admit::Answer);
        // A new worker on rank 0: reinstall, probes held until it is done.
        assert_eq!(joins.admit(1, 0, 200, t0), Admit::Held);
        assert_eq!(joins.admit(1, 1, 300, t0), Admit::Held);
        assert_eq!(rx.try_recv(), Ok(1));
        joins.reset(1, false);
        assert_eq!(joins.admit(1, 0, 200, t0), Admit::Answer);
        // Another new nonce right after: deferred, no second reinstall asked for.
        for k in 0..100 {
            let at = t0 + std::time::Duration::from_millis(10 * k);
            assert_eq!(joins.admit(1, 0, 1000 + k as u32, at), Admit::Deferred);
        }
        assert!(rx.try_recv().is_err());
        // Other jobs are not held back.
        assert_eq!(joins.admit(2, 0, 5, t0), Admit::Answer);
        // Once the interval has passed, a new worker is taken again.
        let later = t0 + MIN_REINSTALL_INTERVAL;
        assert_eq!(joins.admit(1, 0, 7, later), Admit::Held);
        assert_eq!(rx.try_recv(), Ok(1));
    }

    /// A tree job's new worker is held without a reinstall (its upper switch would keep the
    /// run before's sums) until the job is installed again.
    #[test]
    fn a_new_worker_on_a_tree_job_is_held_until_it_is_installed_again() {
        let (tx, rx) = mpsc::channel();
        let mut joins = Joins::new(tx);
        let t0 = std::time::Instant::now();
        joins.reset(1, true);
        assert_eq!(joins.admit(1, 0, 100, t0), Admit::Answer);
        let later = t0 + 2 * MIN_REINSTALL_INTERVAL;
        for k in 0..3 {
            assert_eq!(joins.admit(1, 0, 200 + k, later), Admit::Held);
        }
        assert!(rx.try_recv().is_err(), "no reinstall asked for");
        // Installed afresh (the tree from the top): the new worker is answered.
        joins.reset(1, true);
        assert_eq!(joins.admit(1, 0, 200, later), Admit::Answer);
        // The same job without an uplink is reinstalled for a new worker as any job.
        joins.reset(1, false);
        assert_eq!(joins.admit(1, 0, 300, later), Admit::Answer);
        assert_eq!(joins.admit(1, 0, 400, later), Admit::Held);
        assert_eq!(rx.try_recv(), Ok(1));
    }

    /// A shard's inbox holds its capacity of batches; more are dropped and counted, not
    /// queued, and there is room again once the shard takes some.
    #[test]
    fn a_full_inbox_drops_and_counts_instead_of_growing() {
        let meshes = Mesh::build_with(2, SocketAddr::from(([127, 0, 0, 1], 18766)), 4);
        let from = SocketAddr::from(([127, 0, 0, 1], 5000));
        let batch = || {
            let mut b = ForwardBatch::new();
            b.push(from, &[0u8; HEADER_LEN]);
            b.push(from, &[1u8; HEADER_LEN]);
            b
        };
        let mut stats = ShardStats::default();
        for _ in 0..4 {
            assert!(meshes[0].hand_over(1, batch(), &mut stats));
        }
        for _ in 0..10 {
            assert!(!meshes[0].hand_over(1, batch(), &mut stats));
        }
        assert_eq!((stats.forwarded_out, stats.forward_dropped), (8, 20));
        assert_eq!(meshes[1].inbox.try_iter().count(), 4, "the inbox grew");
        assert!(meshes[0].hand_over(1, batch(), &mut stats));
        assert_eq!(stats.forwarded_out, 10);
    }

    fn addrs() -> Vec<SocketAddr> {
        let mut v = Vec::new();
        for host in 0..64u32 {
            for port in [18766u16, 18767, 40000] {
                v.push(SocketAddr::from((Ipv4Addr::from(0xc612_0000 + host), port)));
                v.push(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(0x2001_0db8_u128 << 96 | u128::from(host)),
                    port,
                    0,
                    0,
                )));
            }
        }
        v
    }

    #[test]
    fn address_table_finds_every_installed_address_and_nothing_else() {
        let all = addrs();
        let mut table: HashMap<SocketAddr, PortId, BuildAddrHasher> = HashMap::default();
        for (i, a) in all.iter().enumerate().step_by(2) {
            table.insert(*a, PortId(i as u16));
        }
        for (i, a) in all.iter().enumerate() {
            let want = (i % 2 == 0).then_some(PortId(i as u16));
            assert_eq!(table.get(a).copied(), want, "{a}");
        }
        // The hash spreads these addresses in the low bits a table uses as a random function
        // would: averaged over 16 fixed seeds (the table's own seed is random), the buckets
        // they fill are within 10% of a random function's expected count.
        let buckets = |seed: u64| {
            use std::hash::BuildHasher;
            let hasher = foldhash::fast::FixedState::with_seed(seed);
            all.iter()
                .map(|a| hasher.hash_one(a) & 0x3ff)
                .collect::<std::collections::HashSet<_>>()
                .len()
        };
        let mean = (0..16).map(buckets).sum::<usize>() as f64 / 16.0;
        let random = 1024.0 * (1.0 - (-(all.len() as f64) / 1024.0).exp());
        assert!(
            mean > 0.9 * random,
            "{mean} buckets, a random function fills {random:.0}"
        );
    }

    #[test]
    fn address_key_orders_like_the_addresses_within_a_family() {
        let mut all = addrs();
        all.retain(SocketAddr::is_ipv4);
        let mut by_key = all.clone();
        by_key.sort_by_key(addr_key);
        all.sort();
        assert_eq!(by_key, all);
        let keys: std::collections::HashSet<_> = all.iter().map(addr_key).collect();
        assert_eq!(keys.len(), all.len(), "distinct addresses, distinct keys");
    }
}
