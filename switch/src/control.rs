//! The control plane: installing and removing jobs, reading statistics; in process through a
//! [`SwitchHandle`], or over TCP through a [`ControlServer`] speaking one JSON line per request
//! and per answer:
//!
//! ```text
//! > {"op":"add_job","job":{"job":1,"slot_base":0,"slot_count":64,"elems_per_packet":256,"workers":["127.0.0.1:5000"]}}
//! < {"ok":true,"job":{"job":1,"epoch":40321,...}}
//! > {"op":"remove_job","job":1}
//! > {"op":"jobs"}
//! > {"op":"stats"}
//! ```
//!
//! An endpoint bound beyond loopback requires an access token: the first line of every
//! connection is then `{"op":"auth","token":"..."}`, and any other request before it is
//! refused (and the connection closed). Connections are bounded ([`ControlLimits`]): one past
//! the limit is told so and closed, and a connection that sends no complete request for the
//! idle time is closed.

use crate::config::JobSpec;
use crate::shard::Command;
use ina_proto::pipeline::{JobConfig, Pipeline, PipelineConfig, PortId, Uplink};
pub use ina_switch_api::control::{tokens_match, ControlClient, Request, Response};
use ina_switch_api::{ShardStats, SwitchStats};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Why a control request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("{0}")]
    Job(String),
    #[error("the switch has more worker addresses than it can number")]
    Ports,
    #[error("the switch is not running")]
    NotRunning,
    #[error(
        "a shard did not confirm the change within {0:?}: it was taken back, and may be retried"
    )]
    Unconfirmed(Duration),
    #[error("bad request: {0}")]
    BadRequest(String),
}

#[derive(Debug)]
struct State {
    /// Validates jobs exactly as the shards will, before they see them.
    scratch: Pipeline,
    shards: Vec<mpsc::Sender<Command>>,
    jobs: Vec<JobSpec>,
    ports: HashMap<SocketAddr, PortId>,
    last_epoch: HashMap<u16, u16>,
    epoch_seed: u64,
    installs: u64,
}

/// How long the shards have to confirm a change.
const CONFIRM_WITHIN: Duration = Duration::from_secs(2);

impl State {
    /// Sends a command made by `command` to every shard; returns the receivers of their
    /// replies.
    fn send_all(
        &self,
        command: impl Fn(mpsc::Sender<Result<(), String>>) -> Command,
    ) -> Vec<mpsc::Receiver<Result<(), String>>> {
        self.shards
            .iter()
            .map(|shard| {
                let (reply, rx) = mpsc::channel();
                let _ = shard.send(command(reply));
                rx
            })
            .collect()
    }

    /// Takes job `job` out of the control state (addresses no remaining job lists are
    /// forgotten, and their ids free for new ones) and sends its removal to every shard;
    /// returns the receivers of their replies.
    fn withdraw(
        &mut self,
        job: u16,
    ) -> Result<Vec<mpsc::Receiver<Result<(), String>>>, ControlError> {
        self.scratch
            .remove_job(job)
            .map_err(|e| ControlError::Job(e.to_string()))?;
        self.jobs.retain(|j| j.job != job);
        let listed: HashSet<SocketAddr> = self.jobs.iter().flat_map(JobSpec::addresses).collect();
        let mut forget = Vec::new();
        self.ports.retain(|a, p| {
            let keep = listed.contains(a);
            if !keep {
                forget.push((*p, *a));
            }
            keep
        });
        Ok(self.send_all(|reply| Command::RemoveJob {
            job,
            forget: forget.clone(),
            reply,
        }))
    }
}

/// A handle on a switch's control plane; cheap to clone, usable from any thread.
#[derive(Debug, Clone)]
pub struct SwitchHandle {
    state: Arc<Mutex<State>>,
    running: Arc<AtomicBool>,
    local: SocketAddr,
    /// The MTU of every path, when the switch's port fixes it (a DPDK device) rather than the
    /// kernel's routes.
    link_mtu: Option<usize>,
}

impl SwitchHandle {
    /// Every path's MTU is `mtu` (the switch's port fixes it).
    pub(crate) fn with_link_mtu(mut self, mtu: usize) -> SwitchHandle {
        self.link_mtu = Some(mtu);
        self
    }

    pub(crate) fn new(
        pipeline: PipelineConfig,
        shards: Vec<mpsc::Sender<Command>>,
        local: SocketAddr,
    ) -> SwitchHandle {
        SwitchHandle {
            state: Arc::new(Mutex::new(State {
                scratch: Pipeline::new(pipeline),
                shards,
                jobs: Vec::new(),
                ports: HashMap::new(),
                last_epoch: HashMap::new(),
                epoch_seed: crate::epoch::boot_entropy(),
                installs: 0,
            })),
            running: Arc::new(AtomicBool::new(false)),
            local,
            link_mtu: None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    pub(crate) fn set_running(&self, on: bool) {
        self.running.store(on, Ordering::SeqCst);
    }

    /// Waits until the switch runs (its shards answer), up to `within`; returns whether it
    /// does. A request sent before is refused with "not running".
    pub fn wait_running(&self, within: Duration) -> bool {
        let start = std::time::Instant::now();
        while self.stats().is_err() {
            if start.elapsed() >= within {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    /// The switch's data address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Installs a job on every shard; returns it with its epoch. A job that not every shard
    /// confirms is taken back out, so that the same request can be made again.
    pub fn add_job(&self, mut spec: JobSpec) -> Result<JobSpec, ControlError> {
        let mut st = self.lock();
        let epoch = match spec.epoch {
            Some(e) => e,
            None => {
                st.installs += 1;
                ina_proto::pipeline::fresh_epoch(
                    st.epoch_seed ^ st.installs.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    st.last_epoch.get(&spec.job).copied(),
                )
            }
        };
        let max_elems = st.scratch.config().max_elems;
        if spec.elems_per_packet > max_elems {
            return Err(ControlError::Job(format!(
                "job {}: {} elements per packet is more than the switch's max_elems of {max_elems} (start it with --max-elems {} or more)",
                spec.job, spec.elems_per_packet, spec.elems_per_packet
            )));
        }
        self.check_mtu(&spec)?;
        spec.epoch = Some(epoch);
        let mut new_ports = Vec::new();
        let mut ranks = Vec::new();
        // A new address gets the lowest id no installed job's address holds.
        let mut taken: HashSet<PortId> = st.ports.values().copied().collect();
        let mut next = 0u16;
        for a in spec.addresses() {
            let p = match st.ports.get(&a) {
                Some(p) => *p,
                None => match new_ports.iter().find(|(_, x)| *x == a) {
                    Some((p, _)) => *p,
                    None => {
                        while taken.contains(&PortId(next)) {
                            next = next.checked_add(1).ok_or(ControlError::Ports)?;
                        }
                        let p = PortId(next);
                        if p == crate::shard::UNKNOWN_PORT {
                            return Err(ControlError::Ports);
                        }
                        taken.insert(p);
                        new_ports.push((p, a));
                        p
                    }
                },
            };
            ranks.push(p);
        }
        // The upper switch's address was numbered last.
        let uplink = match spec.uplink {
            None => None,
            Some(u) => {
                let port = ranks.pop().ok_or(ControlError::Ports)?;
                let slot_base = u.slot_base.unwrap_or(spec.slot_base);
                let stride = i32::from(ina_wire::agg::GAP_BLOCK) * st.shards.len() as i32;
                if (i32::from(slot_base) - i32::from(spec.slot_base)) % stride != 0 {
                    return Err(ControlError::Job(format!(
                        "job {}: slots {} here and {slot_base} on the upper switch are not a multiple of {stride} apart ({} shards of 64-slot blocks): a total would reach a shard that does not hold its use",
                        spec.job, spec.slot_base, st.shards.len()
                    )));
                }
                Some(Uplink {
                    port,
                    job: u.job.unwrap_or(spec.job),
                    epoch: u.epoch,
                    rank: u.rank,
                    slot_base,
                })
            }
        };
        let cfg = JobConfig {
            job: spec.job,
            epoch,
            slot_base: spec.slot_base,
            slot_count: spec.slot_count,
            elems_per_packet: spec.elems_per_packet,
            ranks,
            uplink,
        };
        st.scratch
            .add_job(cfg.clone())
            .map_err(|e| ControlError::Job(e.to_string()))?;
        for (p, a) in &new_ports {
            st.ports.insert(*a, *p);
        }
        let addrs: Vec<(PortId, SocketAddr)> = spec
            .addresses()
            .filter_map(|a| st.ports.get(&a).map(|p| (*p, a)))
            .collect();
        let replies = st.send_all(|reply| Command::AddJob {
            cfg: cfg.clone(),
            addrs: addrs.clone(),
            group: spec.group,
            reply,
        });
        st.last_epoch.insert(spec.job, epoch);
        st.jobs.push(spec.clone());
        drop(st);
        if let Err(e) = self.await_replies(replies) {
            self.take_back(&spec);
            return Err(e);
        }
        tracing::info!(job = spec.job, epoch, slots = ?(spec.slot_base..spec.slot_base + spec.slot_count), workers = spec.workers.len(), "job added");
        Ok(spec)
    }

    /// Refuses a job whose packets do not fit the path MTU to one of its workers (or its
    /// group): every datagram would be fragmented. A path the kernel cannot tell is not
    /// checked.
    fn check_mtu(&self, spec: &JobSpec) -> Result<(), ControlError> {
        let to = spec
            .workers
            .iter()
            .copied()
            .enumerate()
            .map(|(r, a)| (format!("rank {r} at {a}"), a))
            .chain(
                spec.group
                    .map(|g| (format!("group {g}"), SocketAddr::V4(g))),
            )
            .chain(
                spec.uplink
                    .map(|u| (format!("the upper switch at {}", u.addr), u.addr)),
            );
        for (who, addr) in to {
            let path = match self.link_mtu {
                Some(m) => Ok(m),
                None => ina_io::mtu::path_mtu(self.local.ip(), addr),
            };
            let mtu = match path {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(job = spec.job, %addr, error = %e, "cannot find the path MTU; not checked");
                    continue;
                }
            };
            let ipv6 = addr.is_ipv6();
            let packet = ina_wire::agg::ip_packet_len(spec.elems_per_packet, ipv6);
            if packet > mtu {
                return Err(ControlError::Job(format!(
                    "job {}: {} elements per packet make {packet}-byte IP packets, but the path MTU to {who} is {mtu} bytes, which fits at most {} elements: every datagram would be fragmented (use elems={} or fewer, or raise the links' MTU)",
                    spec.job,
                    spec.elems_per_packet,
                    ina_wire::agg::max_elems_for_mtu(mtu, ipv6),
                    ina_wire::agg::max_elems_for_mtu(mtu, ipv6),
                )));
            }
        }
        Ok(())
    }

    /// Waits for the shards to apply a command, if they are running.
    fn await_replies(
        &self,
        replies: Vec<mpsc::Receiver<Result<(), String>>>,
    ) -> Result<(), ControlError> {
        if !self.running.load(Ordering::SeqCst) {
            return Ok(());
        }
        let deadline = std::time::Instant::now() + CONFIRM_WITHIN;
        for rx in replies {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(ControlError::Job(e)),
                Err(_) => return Err(ControlError::Unconfirmed(CONFIRM_WITHIN)),
            }
        }
        Ok(())
    }

    /// Takes back a job that was added but not confirmed by every shard. The shards that
    /// applied it remove it; a late one removes it right after applying it, as a shard
    /// applies its commands in order. (Not awaited: a shard that did not answer the one
    /// may not answer the other either.)
    fn take_back(&self, spec: &JobSpec) {
        let mut st = self.lock();
        if st.jobs.iter().any(|j| j == spec) {
            let _ = st.withdraw(spec.job);
            tracing::warn!(
                job = spec.job,
                "job not confirmed by every shard: taken back"
            );
        }
    }

    /// Removes a job from every shard.
    pub fn remove_job(&self, job: u16) -> Result<(), ControlError> {
        let replies = self.lock().withdraw(job)?;
        self.await_replies(replies)?;
        tracing::info!(job, "job removed");
        Ok(())
    }

    /// Installs a job again under a new epoch (same slots and workers): every slot of the job
    /// starts empty and packets of the old epoch are refused as stale.
    pub fn reinstall(&self, job: u16) -> Result<JobSpec, ControlError> {
        let spec = self
            .jobs()
            .into_iter()
            .find(|j| j.job == job)
            .ok_or_else(|| ControlError::Job(format!("job {job} is not installed")))?;
        self.remove_job(job)?;
        self.add_job(JobSpec {
            epoch: None,
            ..spec
        })
    }

    /// The installed jobs.
    pub fn jobs(&self) -> Vec<JobSpec> {
        self.lock().jobs.clone()
    }

    /// Statistics of every shard.
    pub fn stats(&self) -> Result<SwitchStats, ControlError> {
        if !self.running.load(Ordering::SeqCst) {
            return Err(ControlError::NotRunning);
        }
        let st = self.lock();
        let mut rxs = Vec::new();
        for shard in &st.shards {
            let (tx, rx) = mpsc::channel();
            let _ = shard.send(Command::Stats(tx));
            rxs.push(rx);
        }
        drop(st);
        let mut shards: Vec<ShardStats> = Vec::new();
        for rx in rxs {
            shards.push(
                rx.recv_timeout(Duration::from_secs(2))
                    .map_err(|_| ControlError::NotRunning)?,
            );
        }
        Ok(SwitchStats::from_shards(shards))
    }
}

/// Serves one request.
pub fn serve(handle: &SwitchHandle, req: Request) -> Response {
    match req {
        Request::AddJob { job } => match handle.add_job(job) {
            Ok(j) => Response {
                job: Some(j),
                ..Response::ok()
            },
            Err(e) => Response::err(e),
        },
        Request::RemoveJob { job } => match handle.remove_job(job) {
            Ok(()) => Response::ok(),
            Err(e) => Response::err(e),
        },
        Request::Jobs => Response {
            jobs: Some(handle.jobs()),
            ..Response::ok()
        },
        Request::Stats => match handle.stats() {
            Ok(s) => Response {
                stats: Some(s),
                ..Response::ok()
            },
            Err(e) => Response::err(e),
        },
        Request::Ping => Response::ok(),
        // (Handled by the connection; a token presented where none is needed is accepted.)
        Request::Auth { .. } => Response::ok(),
    }
}

/// The longest request line accepted, without its newline.
const MAX_LINE: usize = 1 << 20;

/// Bounds on the control endpoint's connections and who may use it.
#[derive(Debug, Clone)]
pub struct ControlLimits {
    /// Required as the first request of every connection when set.
    pub token: Option<String>,
    /// Connections served at once; one more is told so and closed.
    pub max_connections: usize,
    /// A connection that sends no complete request for this long is closed.
    pub idle: Duration,
    /// Connections that have not sent their first request yet (their token, where one is
    /// required), counted apart from [`max_connections`](Self::max_connections), so that
    /// clients that never authenticate cannot take the places of the operator's.
    pub max_unadmitted: usize,
    /// How long a new connection has to send its first request.
    pub first_request: Duration,
}

impl Default for ControlLimits {
    fn default() -> ControlLimits {
        ControlLimits {
            token: None,
            max_connections: 32,
            idle: Duration::from_secs(60),
            max_unadmitted: 8,
            first_request: Duration::from_secs(5),
        }
    }
}

/// A connection's place in one of the endpoint's two counts, given back when it ends.
struct Place(Arc<std::sync::atomic::AtomicUsize>);

impl Place {
    /// A place among `count`'s at most `max`, if one is free.
    fn take(count: &Arc<std::sync::atomic::AtomicUsize>, max: usize) -> Option<Place> {
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Place(count.clone()))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why the control endpoint was not started.
#[derive(Debug, thiserror::Error)]
pub enum ControlBindError {
    #[error("the control endpoint {addr} is beyond loopback: it needs an access token (--control-token or INA_SWITCH_TOKEN), or bind it to 127.0.0.1")]
    TokenRequired { addr: SocketAddr },
    #[error("the control endpoint's access token must be 16 to 256 printable ASCII characters without spaces")]
    BadToken,
    #[error("binding the control endpoint {addr}: {source}")]
    Io {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The TCP control endpoint.
#[derive(Debug)]
pub struct ControlServer {
    listener: TcpListener,
    handle: SwitchHandle,
    limits: ControlLimits,
    /// Connections admitted (authenticated, or past their first request).
    open: Arc<std::sync::atomic::AtomicUsize>,
    /// Connections not admitted yet.
    unadmitted: Arc<std::sync::atomic::AtomicUsize>,
}

impl ControlServer {
    /// Binds the endpoint on loopback with the default limits and no token. (An address
    /// beyond loopback needs [`bind_with`](Self::bind_with) and a token.)
    pub fn bind(addr: SocketAddr, handle: SwitchHandle) -> std::io::Result<ControlServer> {
        ControlServer::bind_with(addr, handle, ControlLimits::default()).map_err(|e| match e {
            ControlBindError::Io { source, .. } => source,
            other => std::io::Error::new(std::io::ErrorKind::PermissionDenied, other.to_string()),
        })
    }

    /// Binds the endpoint with `limits`; refuses an address beyond loopback without a token.
    pub fn bind_with(
        addr: SocketAddr,
        handle: SwitchHandle,
        limits: ControlLimits,
    ) -> Result<ControlServer, ControlBindError> {
        match &limits.token {
            Some(t)
                if !((16..=256).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_graphic())) =>
            {
                return Err(ControlBindError::BadToken)
            }
            None if !addr.ip().is_loopback() => {
                return Err(ControlBindError::TokenRequired { addr })
            }
            _ => {}
        }
        let io = |source| ControlBindError::Io { addr, source };
        let listener = TcpListener::bind(addr).map_err(io)?;
        listener.set_nonblocking(true).map_err(io)?;
        Ok(ControlServer {
            listener,
            handle,
            limits,
            open: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            unadmitted: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        })
    }

    /// The endpoint's address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts connections until `shutdown` is set; each connection gets a thread, up to
    /// [`ControlLimits::max_connections`] at once.
    pub fn run(self, shutdown: Arc<AtomicBool>) {
        while !shutdown.load(Ordering::Relaxed) {
            match self.listener.accept() {
                Ok((mut stream, peer)) => {
                    let Some(place) = Place::take(&self.unadmitted, self.limits.max_unadmitted)
                    else {
                        tracing::warn!(%peer, limit = self.limits.max_unadmitted, "control connection refused: too many awaiting their first request");
                        refuse(
                            &mut stream,
                            &format!(
                                "too many control connections awaiting their first request (limit {})",
                                self.limits.max_unadmitted
                            ),
                        );
                        continue;
                    };
                    let handle = self.handle.clone();
                    let stop = shutdown.clone();
                    let limits = self.limits.clone();
                    let open = self.open.clone();
                    let spawned = std::thread::Builder::new()
                        .name("ina-control".into())
                        .spawn(move || {
                            let admit = Admission {
                                waiting: Some(place),
                                open: &open,
                            };
                            if let Err(e) = connection(stream, &handle, &stop, &limits, admit) {
                                tracing::debug!(%peer, error = %e, "control connection ended");
                            }
                        });
                    if let Err(e) = spawned {
                        tracing::warn!(error = %e, "control connection dropped: no thread");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "control accept failed");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// Runs the endpoint on a thread of its own.
    pub fn spawn(self, shutdown: Arc<AtomicBool>) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("ina-control-accept".into())
            .spawn(move || self.run(shutdown))
    }
}

/// Tells a connection it is not served, and closes it.
fn refuse(stream: &mut TcpStream, why: &str) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
    let _ = writeln!(stream, "{}", to_line(&Response::err(why)));
}

/// A connection's place: among those awaiting their first request until it is admitted, then
/// among the admitted.
struct Admission<'a> {
    waiting: Option<Place>,
    open: &'a Arc<std::sync::atomic::AtomicUsize>,
}

impl Admission<'_> {
    fn admitted(&self) -> bool {
        self.waiting.is_none()
    }

    /// Moves the connection to the admitted ones; `None` if they are all taken.
    fn admit(&mut self, max: usize) -> Option<Place> {
        let place = Place::take(self.open, max)?;
        self.waiting = None;
        Some(place)
    }
}

fn connection(
    stream: TcpStream,
    handle: &SwitchHandle,
    stop: &AtomicBool,
    limits: &ControlLimits,
    mut admission: Admission<'_>,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    let mut authorized = limits.token.is_none();
    let mut _admitted_place = None;
    let accepted = std::time::Instant::now();
    let mut last_request = accepted;
    while !stop.load(Ordering::Relaxed) {
        if !admission.admitted() && accepted.elapsed() >= limits.first_request {
            writeln!(
                writer,
                "{}",
                to_line(&Response::err("no request in time: closed"))
            )?;
            return Ok(());
        }
        if last_request.elapsed() >= limits.idle {
            writeln!(
                writer,
                "{}",
                to_line(&Response::err("idle too long: closed"))
            )?;
            return Ok(());
        }
        // At most one byte past the longest accepted line is ever buffered: a request line
        // streaming in without a newline is cut off there rather than growing the switch.
        let room = (MAX_LINE + 1).saturating_sub(line.len()) as u64;
        match (&mut reader).take(room).read_until(b'\n', &mut line) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => return Err(e),
        }
        if line.len() > MAX_LINE && !line.ends_with(b"\n") {
            writeln!(
                writer,
                "{}",
                to_line(&Response::err("request line too long"))
            )?;
            return Ok(());
        }
        if !line.ends_with(b"\n") {
            continue;
        }
        last_request = std::time::Instant::now();
        let req = serde_json::from_slice::<Request>(&line);
        line.clear();
        // The first request admits the connection (with a token required, only the right
        // token does: anything else closes it below).
        let admits = match &req {
            Ok(Request::Auth { token }) => limits
                .token
                .as_ref()
                .is_none_or(|t| tokens_match(token.as_bytes(), t.as_bytes())),
            _ => authorized,
        };
        if admits && !admission.admitted() {
            match admission.admit(limits.max_connections) {
                Some(place) => _admitted_place = Some(place),
                None => {
                    writeln!(
                        writer,
                        "{}",
                        to_line(&Response::err(format!(
                            "too many control connections (limit {})",
                            limits.max_connections
                        )))
                    )?;
                    return Ok(());
                }
            }
        }
        let resp = match req {
            Ok(Request::Auth { token }) => match &limits.token {
                Some(t) if !tokens_match(token.as_bytes(), t.as_bytes()) => {
                    writeln!(writer, "{}", to_line(&Response::err("wrong access token")))?;
                    return Ok(());
                }
                _ => {
                    authorized = true;
                    Response::ok()
                }
            },
            Ok(_) if !authorized => {
                writeln!(
                    writer,
                    "{}",
                    to_line(&Response::err(
                        "this endpoint needs an access token: send {\"op\":\"auth\",\"token\":...} first"
                    ))
                )?;
                return Ok(());
            }
            Ok(req) => serve(handle, req),
            Err(e) => Response::err(ControlError::BadRequest(e.to_string())),
        };
        writeln!(writer, "{}", to_line(&resp))?;
    }
    Ok(())
}

fn to_line(r: &Response) -> String {
    serde_json::to_string(r).unwrap_or_else(|_| "{\"ok\":false}".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            job: 3,
            epoch: None,
            slot_base: 0,
            slot_count: 64,
            elems_per_packet: 64,
            workers: vec![SocketAddr::from(([127, 0, 0, 1], 5000))],
            group: None,
            uplink: None,
        }
    }

    /// A job the shard does not confirm in time is taken back: the same request made again
    /// is taken, not refused as a job that exists.
    #[test]
    fn a_job_the_shards_do_not_confirm_is_taken_back_and_can_be_added_again() {
        let (tx, shard) = mpsc::channel();
        let config = PipelineConfig {
            pool_slots: 256,
            max_elems: 256,
        };
        let handle = SwitchHandle::new(config, vec![tx], SocketAddr::from(([127, 0, 0, 1], 18766)));
        handle.set_running(true);
        // The shard does not answer.
        let e = handle.add_job(spec());
        assert_eq!(e, Err(ControlError::Unconfirmed(CONFIRM_WITHIN)));
        assert!(handle.jobs().is_empty());
        // It got the job and then its removal, so it ends without it whenever it catches up.
        let got: Vec<Command> = shard.try_iter().collect();
        assert!(
            matches!(
                got.as_slice(),
                [Command::AddJob { .. }, Command::RemoveJob { job: 3, .. }]
            ),
            "{got:?}"
        );
        // Now the shard answers: the same request is taken.
        let answering = std::thread::spawn(move || {
            let mut seen = 0;
            for cmd in shard {
                seen += 1;
                match cmd {
                    Command::AddJob { reply, .. } | Command::RemoveJob { reply, .. } => {
                        let _ = reply.send(Ok(()));
                    }
                    Command::Stats(_) => {}
                }
            }
            seen
        });
        let added = handle.add_job(spec()).map_err(|e| e.to_string());
        let added = added.as_ref().map(|j| (j.job, j.epoch.is_some()));
        assert_eq!(added, Ok((3, true)));
        assert_eq!(handle.jobs().len(), 1);
        drop(handle);
        assert_eq!(answering.join().ok(), Some(1));
    }
}
