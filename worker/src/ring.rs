//! Ring all-reduce over TCP: the honest, bandwidth-optimal baseline `ina` is compared against.
//!
//! # Algorithm
//!
//! [`RingComm`] drives the schedule of [`ina_proto::ring`]: rank `r` keeps one TCP connection
//! to its right neighbour `r + 1 (mod n)`, which it only writes to, and one from its left
//! neighbour `r - 1 (mod n)`, which it only reads from. The tensor is cut into `n` segments; a
//! reduce-scatter of `n - 1` steps (receive a segment, add it in, pass it on) leaves each rank
//! with one fully reduced segment, and an all-gather of `n - 1` steps circulates the finished
//! segments. Each element's final value is computed once, on one rank, and then copied byte for
//! byte, so all ranks end bit-identical even for `f32`.
//!
//! # Cost
//!
//! For a tensor of `S` bytes each rank sends and receives `2 (n - 1) / n * S` bytes (plus a
//! 24-byte header per call), the minimum for an all-reduce whatever `n`, in `2 (n - 1)` steps.
//!
//! # Pipelining without deadlock
//!
//! Segments are split into chunks of [`RingOptions::chunk_bytes`] (default 256 KiB). A
//! dedicated sender thread per communicator owns the writes to the right neighbour and is fed
//! chunk buffers through a channel, while the calling thread reads from the left neighbour and
//! reduces. Sending and receiving therefore always overlap: the calling thread only ever blocks
//! on a read from the left (and, at the very end of a call, on the sender finishing), the sender
//! only on a write to the right, and a ring of such ranks cannot deadlock however large the
//! chunks and however full the TCP buffers. Small chunks (up to 64 KiB) found with the sender
//! idle are written by the calling thread itself, without blocking (whatever does not fit goes
//! to the sender), which saves a thread hand-off per step on latency-bound tensors.
//!
//! # Copies
//!
//! A chunk is read from the socket into a receive buffer, reduced there in one pass
//! (`buffer = local + buffer`, with the local tensor only written on the step that finishes the
//! rank's own segment, since the other partial sums are overwritten by the all-gather anyway),
//! and that same buffer is then handed to the sender thread as the next step's outgoing chunk:
//! what arrives at step `t` leaves at step `t + 1`. In the all-gather the received bytes are
//! copied into the tensor and forwarded unchanged. The only other pass over the data is the
//! little-endian encoding of the rank's own segment at step 0. Buffers are pooled and reused
//! across calls; because the byte stream is step-major, about one segment (`S / n` bytes) of
//! chunk buffers is alive during a call.
//!
//! # Failure
//!
//! Every read and write is bounded by [`RingOptions::io_timeout`]. On any error the
//! communicator shuts both of its connections down, so its neighbours fail at once instead of
//! waiting for their own timeouts, and the error spreads around the ring; the communicator then
//! refuses further calls with [`RingError::Broken`].

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ina_proto::ring::{RecvOp, RingPlanError, RingSchedule};

/// Default size of one pipelined chunk on the wire.
pub const DEFAULT_CHUNK_BYTES: usize = 256 * 1024;

/// Bytes of the per-call header that precedes the tensor data on every link.
pub const CALL_HEADER_LEN: usize = 24;

const HANDSHAKE_MAGIC: [u8; 8] = *b"INARING\0";
const HANDSHAKE_VERSION: u32 = 1;
const HANDSHAKE_LEN: usize = 40;
const KIND_HELLO: u32 = 1;
const KIND_ACCEPT: u32 = 2;
const KIND_REJECT: u32 = 3;
const CALL_MAGIC: u32 = 0x5249_4e41; // "ANIR" little-endian: "INAR" on the wire.
/// The element type code of an all-gather's call header.
const ALLGATHER_TYPE: u32 = 0x100;

/// The largest contribution of one rank to [`RingComm::allgather`].
pub const MAX_GATHER_BYTES: u64 = 1 << 34;

/// Step-0 chunks encoded ahead of the chunk being received.
const STEP0_LOOKAHEAD: usize = 2;

/// Buffers up to this size are written by the calling thread when the sender thread is idle.
const DIRECT_WRITE_MAX: usize = 64 * 1024;

/// Configuration of a [`RingComm`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingOptions {
    /// Identifies the job: every rank of a ring must use the same value.
    pub job_id: u64,
    /// Upper bound on the bytes of one pipelined chunk (rounded down to whole elements, at least
    /// one). Ranks may use different values: the byte stream does not depend on it.
    pub chunk_bytes: usize,
    /// How long [`RingComm::connect`] keeps retrying and waiting for its neighbours.
    pub connect_timeout: Duration,
    /// Bound on every blocking read or write once connected (`None`: wait forever).
    pub io_timeout: Option<Duration>,
    /// Set `TCP_NODELAY` on both connections.
    pub nodelay: bool,
    /// The TCP congestion control of both connections (`TCP_CONGESTION`, e.g. `cubic` or
    /// `bbr`); `None` keeps the system's default.
    pub congestion: Option<String>,
    /// The most bits per second either connection sends (`SO_MAX_PACING_RATE`: the kernel
    /// paces TCP to it, loopback included), as a link of that rate would; `None`: unpaced.
    pub max_pacing_rate: Option<u64>,
}

impl Default for RingOptions {
    fn default() -> Self {
        Self {
            job_id: 0,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            connect_timeout: Duration::from_secs(30),
            io_timeout: Some(Duration::from_secs(30)),
            nodelay: true,
            congestion: None,
            max_pacing_rate: None,
        }
    }
}

impl RingOptions {
    /// Sets [`RingOptions::job_id`].
    pub fn with_job_id(mut self, job_id: u64) -> Self {
        self.job_id = job_id;
        self
    }

    /// Sets [`RingOptions::chunk_bytes`].
    pub fn with_chunk_bytes(mut self, chunk_bytes: usize) -> Self {
        self.chunk_bytes = chunk_bytes;
        self
    }

    /// Sets [`RingOptions::connect_timeout`].
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`RingOptions::congestion`].
    pub fn with_congestion(mut self, name: Option<String>) -> Self {
        self.congestion = name;
        self
    }

    /// Sets [`RingOptions::max_pacing_rate`].
    pub fn with_max_pacing_rate(mut self, bits_per_s: Option<u64>) -> Self {
        self.max_pacing_rate = bits_per_s;
        self
    }

    /// Sets [`RingOptions::io_timeout`].
    pub fn with_io_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.io_timeout = timeout;
        self
    }
}

/// Which neighbour an error concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Neighbour {
    /// The rank we receive from, `rank - 1 (mod n)`.
    Left,
    /// The rank we send to, `rank + 1 (mod n)`.
    Right,
}

/// Errors of the ring communicator.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The peer list is empty.
    #[error("a ring needs at least one peer address")]
    NoPeers,
    /// The rank does not index the peer list.
    #[error("rank {rank} is out of range for a ring of {world} peers")]
    InvalidRank {
        /// The offending rank.
        rank: usize,
        /// Number of peers.
        world: usize,
    },
    /// The schedule could not be planned.
    #[error(transparent)]
    Plan(#[from] RingPlanError),
    /// Binding this rank's listener failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address of this rank.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The right neighbour did not accept a connection before the deadline.
    #[error(
        "gave up connecting to rank {peer} at {addr} after {waited:?} and {attempts} attempts: \
         {last_error}"
    )]
    ConnectTimeout {
        /// The right neighbour's rank.
        peer: usize,
        /// Its address.
        addr: SocketAddr,
        /// Time spent trying.
        waited: Duration,
        /// Connection attempts made.
        attempts: u32,
        /// The error of the last attempt.
        #[source]
        last_error: io::Error,
    },
    /// The left neighbour did not connect before the deadline.
    #[error("rank {peer} did not connect within {waited:?}")]
    AcceptTimeout {
        /// The left neighbour's rank.
        peer: usize,
        /// Time spent waiting.
        waited: Duration,
    },
    /// A neighbour belongs to another job, ring size or position, or speaks another protocol.
    #[error("handshake with rank {peer} failed: {reason}")]
    HandshakeMismatch {
        /// The neighbour's expected rank.
        peer: usize,
        /// What did not match.
        reason: String,
    },
    /// A neighbour called the all-reduce with another length, element type or call count.
    #[error("rank {peer} is in a different all-reduce call: {reason}")]
    CallMismatch {
        /// The left neighbour's rank.
        peer: usize,
        /// What did not match.
        reason: String,
    },
    /// A neighbour closed or reset its connection.
    #[error("rank {peer} ({side:?} neighbour) closed the connection")]
    PeerClosed {
        /// The neighbour's rank.
        peer: usize,
        /// Which neighbour.
        side: Neighbour,
    },
    /// A read or write did not progress within the I/O timeout.
    #[error("no progress with rank {peer} ({side:?} neighbour) within {after:?}")]
    Timeout {
        /// The neighbour's rank.
        peer: usize,
        /// Which neighbour.
        side: Neighbour,
        /// The timeout that expired.
        after: Duration,
    },
    /// Any other socket error.
    #[error("I/O error with rank {peer} ({side:?} neighbour): {source}")]
    Io {
        /// The neighbour's rank.
        peer: usize,
        /// Which neighbour.
        side: Neighbour,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The sender thread could not be started.
    #[error("cannot start the ring sender thread: {0}")]
    Spawn(#[source] io::Error),
    /// An earlier error left the connections in an unknown state; the communicator is unusable.
    #[error("the ring communicator is broken by an earlier error")]
    Broken,
}

/// Traffic counters of a [`RingComm`], for all calls so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Completed all-reduce calls.
    pub allreduces: u64,
    /// Bytes written to the right neighbour (tensor data and call headers).
    pub bytes_sent: u64,
    /// Bytes read from the left neighbour (tensor data and call headers).
    pub bytes_received: u64,
    /// Tensor bytes written to the right neighbour.
    pub payload_bytes_sent: u64,
    /// Tensor bytes read from the left neighbour.
    pub payload_bytes_received: u64,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for i32 {}
}

/// An element type the ring can all-reduce: 4 bytes, little-endian on the wire.
pub trait RingElement: Copy + Send + sealed::Sealed + 'static {
    /// Type code carried in the per-call header.
    const TYPE_CODE: u32;
    /// Decodes one little-endian element.
    fn from_le(bytes: [u8; 4]) -> Self;
    /// Encodes one element little-endian.
    fn to_le(self) -> [u8; 4];
    /// The reduction: `f32` addition, `i32` wrapping addition.
    fn combine(self, other: Self) -> Self;
}

impl RingElement for f32 {
    const TYPE_CODE: u32 = 1;
    #[inline(always)]
    fn from_le(bytes: [u8; 4]) -> Self {
        f32::from_le_bytes(bytes)
    }
    #[inline(always)]
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
    #[inline(always)]
    fn combine(self, other: Self) -> Self {
        self + other
    }
}

impl RingElement for i32 {
    const TYPE_CODE: u32 = 2;
    #[inline(always)]
    fn from_le(bytes: [u8; 4]) -> Self {
        i32::from_le_bytes(bytes)
    }
    #[inline(always)]
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
    #[inline(always)]
    fn combine(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
}

/// A member of a TCP ring that all-reduces tensors with its peers.
///
/// Every rank must issue the same sequence of calls with the same lengths and element types.
pub struct RingComm {
    rank: usize,
    world: usize,
    chunk_elems: usize,
    opts: RingOptions,
    link: Option<Link>,
    stats: RingStats,
    calls: u64,
    broken: bool,
}

impl fmt::Debug for RingComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingComm")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("chunk_elems", &self.chunk_elems)
            .field("opts", &self.opts)
            .field("stats", &self.stats)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl RingComm {
    /// Joins the ring as `rank`, listening on `peers[rank]`, connecting to
    /// `peers[rank + 1 mod n]` and accepting `rank - 1 mod n`.
    pub fn connect(
        rank: usize,
        peers: &[SocketAddr],
        opts: RingOptions,
    ) -> Result<Self, RingError> {
        check_rank(rank, peers)?;
        if peers.len() == 1 {
            return Ok(Self::new(rank, 1, opts, None));
        }
        let addr = peers[rank];
        let listener =
            TcpListener::bind(addr).map_err(|source| RingError::Bind { addr, source })?;
        Self::connect_with_listener(rank, listener, peers, opts)
    }

    /// Like [`RingComm::connect`] with an already bound listener (for instance on port 0);
    /// `peers[rank]` is then only informational.
    pub fn connect_with_listener(
        rank: usize,
        listener: TcpListener,
        peers: &[SocketAddr],
        opts: RingOptions,
    ) -> Result<Self, RingError> {
        check_rank(rank, peers)?;
        let world = peers.len();
        if world == 1 {
            return Ok(Self::new(rank, 1, opts, None));
        }
        let started = Instant::now();
        let deadline = started + opts.connect_timeout;
        let right_rank = (rank + 1) % world;
        let left_rank = (rank + world - 1) % world;
        let hello = Handshake {
            kind: KIND_HELLO,
            job_id: opts.job_id,
            world: world as u64,
            from: rank as u64,
            to: right_rank as u64,
        };

        // Connect and greet first, then accept: a connect only needs the neighbour's listener
        // to exist, so no rank waits on another's progress and the ring cannot deadlock here.
        let mut right = connect_retry(peers[right_rank], right_rank, started, deadline)?;
        configure(&right, &opts, right_rank, Neighbour::Right)?;
        set_timeouts(&right, deadline, right_rank, Neighbour::Right)?;
        right
            .write_all(&hello.encode())
            .map_err(|e| io_error(e, right_rank, Neighbour::Right, None))?;

        let mut left = accept_deadline(&listener, left_rank, started, deadline)?;
        drop(listener);
        configure(&left, &opts, left_rank, Neighbour::Left)?;
        set_timeouts(&left, deadline, left_rank, Neighbour::Left)?;
        let mut buf = [0u8; HANDSHAKE_LEN];
        left.read_exact(&mut buf)
            .map_err(|e| io_error(e, left_rank, Neighbour::Left, None))?;
        let expected = Handshake {
            kind: KIND_HELLO,
            job_id: opts.job_id,
            world: world as u64,
            from: left_rank as u64,
            to: rank as u64,
        };
        let verdict = Handshake::decode(&buf).and_then(|got| expected.compare(&got));
        let mut reply = Handshake {
            kind: KIND_ACCEPT,
            job_id: opts.job_id,
            world: world as u64,
            from: rank as u64,
            to: left_rank as u64,
        };
        if let Err(reason) = verdict {
            reply.kind = KIND_REJECT;
            // Best effort: tell the neighbour why before giving up.
            let _ = left.write_all(&reply.encode());
            tracing::warn!(rank, peer = left_rank, %reason, "ring handshake rejected");
            return Err(RingError::HandshakeMismatch {
                peer: left_rank,
                reason,
            });
        }
        left.write_all(&reply.encode())
            .map_err(|e| io_error(e, left_rank, Neighbour::Left, None))?;

        right
            .read_exact(&mut buf)
            .map_err(|e| io_error(e, right_rank, Neighbour::Right, None))?;
        let expected = Handshake {
            kind: KIND_ACCEPT,
            job_id: opts.job_id,
            world: world as u64,
            from: right_rank as u64,
            to: rank as u64,
        };
        Handshake::decode(&buf)
            .and_then(|got| match expected.compare(&got) {
                Ok(()) => Ok(()),
                Err(reason) if got.kind == KIND_REJECT => {
                    Err(format!("rejected by the peer: {reason}"))
                }
                Err(reason) => Err(reason),
            })
            .map_err(|reason| RingError::HandshakeMismatch {
                peer: right_rank,
                reason,
            })?;

        // Connected: from now on reads and writes are bounded by the I/O timeout.
        let io = |e| io_error(e, left_rank, Neighbour::Left, None);
        left.set_read_timeout(opts.io_timeout).map_err(io)?;
        left.set_write_timeout(opts.io_timeout).map_err(io)?;
        let io = |e| io_error(e, right_rank, Neighbour::Right, None);
        right.set_read_timeout(opts.io_timeout).map_err(io)?;
        right.set_write_timeout(opts.io_timeout).map_err(io)?;

        let link = Link::start(rank, left, right, left_rank, right_rank)?;
        tracing::debug!(
            rank,
            world,
            job_id = opts.job_id,
            elapsed = ?started.elapsed(),
            "ring connected"
        );
        Ok(Self::new(rank, world, opts, Some(link)))
    }

    fn new(rank: usize, world: usize, opts: RingOptions, link: Option<Link>) -> Self {
        Self {
            rank,
            world,
            chunk_elems: (opts.chunk_bytes / 4).max(1),
            opts,
            link,
            stats: RingStats::default(),
            calls: 0,
            broken: false,
        }
    }

    /// This communicator's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks on the ring.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The options it was created with.
    pub fn options(&self) -> &RingOptions {
        &self.opts
    }

    /// Traffic counters so far.
    pub fn stats(&self) -> RingStats {
        self.stats
    }

    /// Whether an earlier error made the communicator unusable.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Frees the pooled chunk buffers (about one segment of the largest tensor so far).
    pub fn release_buffers(&mut self) {
        if let Some(link) = &mut self.link {
            link.pool = Vec::new();
        }
    }

    /// Sums `data` elementwise over all ranks, in place; every rank ends with identical bits.
    pub fn allreduce_f32(&mut self, data: &mut [f32]) -> Result<(), RingError> {
        self.allreduce(data)
    }

    /// Sums `data` elementwise over all ranks with wrapping addition, in place.
    pub fn allreduce_i32(&mut self, data: &mut [i32]) -> Result<(), RingError> {
        self.allreduce(data)
    }

    /// Sums `data` elementwise over all ranks ([`RingElement::combine`]), in place.
    pub fn allreduce<T: RingElement>(&mut self, data: &mut [T]) -> Result<(), RingError> {
        if self.broken {
            return Err(RingError::Broken);
        }
        let Some(link) = self.link.as_mut() else {
            self.stats.allreduces += 1;
            return Ok(());
        };
        self.calls += 1;
        let schedule = RingSchedule::new(self.world, self.rank, data.len(), self.chunk_elems)?;
        let call = Call {
            seq: self.calls,
            type_code: T::TYPE_CODE,
            len: data.len() as u64,
        };
        match link.run(&schedule, call, data, self.opts.io_timeout, &mut self.stats) {
            Ok(()) => {
                self.stats.allreduces += 1;
                Ok(())
            }
            Err(e) => {
                tracing::warn!(rank = self.rank, error = %e, "ring all-reduce failed");
                self.broken = true;
                link.shutdown();
                Err(e)
            }
        }
    }
}

impl RingComm {
    /// Every rank's `mine`, indexed by rank (an all-gather of contributions of any length).
    /// Each contribution travels around the ring once: every rank sends and receives the
    /// other ranks' bytes, `n - 1` messages, each with an 8-byte length.
    pub fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, RingError> {
        if self.broken {
            return Err(RingError::Broken);
        }
        let Some(link) = self.link.as_mut() else {
            return Ok(vec![mine.to_vec()]);
        };
        self.calls += 1;
        let call = Call {
            seq: self.calls,
            type_code: ALLGATHER_TYPE,
            len: 0,
        };
        let (rank, world) = (self.rank, self.world);
        match link.allgather(
            rank,
            world,
            call,
            mine,
            self.opts.io_timeout,
            &mut self.stats,
        ) {
            Ok(out) => Ok(out),
            Err(e) => {
                tracing::warn!(rank, error = %e, "ring all-gather failed");
                self.broken = true;
                link.shutdown();
                Err(e)
            }
        }
    }
}

impl Drop for RingComm {
    fn drop(&mut self) {
        if let Some(link) = &mut self.link {
            link.shutdown();
            link.to_sender = None;
            if let Some(handle) = link.sender.take() {
                let _ = handle.join();
            }
        }
    }
}

fn check_rank(rank: usize, peers: &[SocketAddr]) -> Result<(), RingError> {
    if peers.is_empty() {
        return Err(RingError::NoPeers);
    }
    if rank >= peers.len() {
        return Err(RingError::InvalidRank {
            rank,
            world: peers.len(),
        });
    }
    Ok(())
}

/// Maps a socket error to the typed error of the neighbour it concerns.
fn io_error(e: io::Error, peer: usize, side: Neighbour, timeout: Option<Duration>) -> RingError {
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::WriteZero
        | io::ErrorKind::NotConnected => RingError::PeerClosed { peer, side },
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => RingError::Timeout {
            peer,
            side,
            after: timeout.unwrap_or_default(),
        },
        _ => RingError::Io {
            peer,
            side,
            source: e,
        },
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn configure(
    stream: &TcpStream,
    opts: &RingOptions,
    peer: usize,
    side: Neighbour,
) -> Result<(), RingError> {
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_nodelay(opts.nodelay))
        .map_err(|e| io_error(e, peer, side, None))?;
    if let Some(cc) = &opts.congestion {
        socket2::SockRef::from(stream)
            .set_tcp_congestion(cc.as_bytes())
            .map_err(|e| {
                let why = std::io::Error::new(
                    e.kind(),
                    format!("TCP congestion control `{cc}` (see /proc/sys/net/ipv4/tcp_available_congestion_control): {e}"),
                );
                io_error(why, peer, side, None)
            })?;
    }
    if let Some(rate) = opts.max_pacing_rate {
        ina_io::paced::set_max_pacing_rate(stream, rate).map_err(|e| {
            let why =
                std::io::Error::new(e.kind(), format!("SO_MAX_PACING_RATE {rate} bit/s: {e}"));
            io_error(why, peer, side, None)
        })?;
    }
    Ok(())
}

fn set_timeouts(
    stream: &TcpStream,
    deadline: Instant,
    peer: usize,
    side: Neighbour,
) -> Result<(), RingError> {
    let left = remaining(deadline);
    stream
        .set_read_timeout(Some(left))
        .and_then(|()| stream.set_write_timeout(Some(left)))
        .map_err(|e| io_error(e, peer, side, Some(left)))
}

fn connect_retry(
    addr: SocketAddr,
    peer: usize,
    started: Instant,
    deadline: Instant,
) -> Result<TcpStream, RingError> {
    let mut backoff = Duration::from_millis(5);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let attempt = remaining(deadline).min(Duration::from_secs(5));
        match TcpStream::connect_timeout(&addr, attempt) {
            Ok(stream) => return Ok(stream),
            Err(last_error) => {
                if Instant::now() + backoff >= deadline {
                    return Err(RingError::ConnectTimeout {
                        peer,
                        addr,
                        waited: started.elapsed(),
                        attempts,
                        last_error,
                    });
                }
                tracing::trace!(%addr, attempts, error = %last_error, "ring connect retry");
                thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
        }
    }
}

fn accept_deadline(
    listener: &TcpListener,
    peer: usize,
    started: Instant,
    deadline: Instant,
) -> Result<TcpStream, RingError> {
    let io = |e| io_error(e, peer, Neighbour::Left, None);
    listener.set_nonblocking(true).map_err(io)?;
    loop {
        match listener.accept() {
            Ok((stream, _)) => return Ok(stream),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => return Err(io(e)),
        }
        if Instant::now() >= deadline {
            return Err(RingError::AcceptTimeout {
                peer,
                waited: started.elapsed(),
            });
        }
        thread::sleep(remaining(deadline).min(Duration::from_millis(1)));
    }
}

/// The connection greeting, sent by the connecting side (`HELLO`) and answered by the accepting
/// side (`ACCEPT` or `REJECT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Handshake {
    kind: u32,
    job_id: u64,
    world: u64,
    from: u64,
    to: u64,
}

impl Handshake {
    fn encode(&self) -> [u8; HANDSHAKE_LEN] {
        let mut b = [0u8; HANDSHAKE_LEN];
        b[0..8].copy_from_slice(&HANDSHAKE_MAGIC);
        b[8..12].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.kind.to_le_bytes());
        b[16..24].copy_from_slice(&self.job_id.to_le_bytes());
        b[24..28].copy_from_slice(&(self.world as u32).to_le_bytes());
        b[28..32].copy_from_slice(&(self.from as u32).to_le_bytes());
        b[32..36].copy_from_slice(&(self.to as u32).to_le_bytes());
        b
    }

    fn decode(b: &[u8; HANDSHAKE_LEN]) -> Result<Self, String> {
        if b[0..8] != HANDSHAKE_MAGIC {
            return Err("not an ina ring peer (bad magic)".into());
        }
        let version = le_u32(&b[8..12]);
        if version != HANDSHAKE_VERSION {
            return Err(format!(
                "protocol version {version}, expected {HANDSHAKE_VERSION}"
            ));
        }
        Ok(Self {
            kind: le_u32(&b[12..16]),
            job_id: le_u64(&b[16..24]),
            world: u64::from(le_u32(&b[24..28])),
            from: u64::from(le_u32(&b[28..32])),
            to: u64::from(le_u32(&b[32..36])),
        })
    }

    /// `Ok` if `got` matches `self`, except that a `REJECT` answering a `ACCEPT` is reported.
    fn compare(&self, got: &Self) -> Result<(), String> {
        let mut diffs = Vec::new();
        if got.job_id != self.job_id {
            diffs.push(format!("job id {} != {}", got.job_id, self.job_id));
        }
        if got.world != self.world {
            diffs.push(format!("world size {} != {}", got.world, self.world));
        }
        if got.from != self.from || got.to != self.to {
            diffs.push(format!(
                "link {} -> {} != {} -> {}",
                got.from, got.to, self.from, self.to
            ));
        }
        if got.kind != self.kind && !(got.kind == KIND_REJECT && self.kind == KIND_ACCEPT) {
            diffs.push(format!("message kind {} != {}", got.kind, self.kind));
        }
        if got.kind == KIND_REJECT && diffs.is_empty() {
            diffs.push("our greeting did not match its expectations".into());
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(diffs.join(", "))
        }
    }
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Identity of one all-reduce call, sent ahead of its data so that ranks issuing different
/// calls fail instead of exchanging garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Call {
    seq: u64,
    type_code: u32,
    len: u64,
}

impl Call {
    fn encode(&self) -> [u8; CALL_HEADER_LEN] {
        let mut b = [0u8; CALL_HEADER_LEN];
        b[0..4].copy_from_slice(&CALL_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.type_code.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    fn check(&self, b: &[u8; CALL_HEADER_LEN]) -> Result<(), String> {
        if le_u32(&b[0..4]) != CALL_MAGIC {
            return Err("stream out of sync (bad call header)".into());
        }
        let (type_code, seq, len) = (le_u32(&b[4..8]), le_u64(&b[8..16]), le_u64(&b[16..24]));
        let mut diffs = Vec::new();
        if seq != self.seq {
            diffs.push(format!("call #{seq} != #{}", self.seq));
        }
        if type_code != self.type_code {
            diffs.push(format!("element type {type_code} != {}", self.type_code));
        }
        if len != self.len {
            diffs.push(format!("length {len} != {}", self.len));
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(diffs.join(", "))
        }
    }
}

/// A buffer for the sender thread, of which `offset` bytes were already written.
struct SendJob {
    buf: Vec<u8>,
    offset: usize,
}

/// What the sender thread reports back.
enum SendEvent {
    /// The buffer was fully written; it can be reused.
    Done(Vec<u8>),
    /// Writing failed; the thread has shut both connections down and exited.
    Failed(io::Error),
}

/// The two connections of a rank and its sender thread.
struct Link {
    left_rank: usize,
    right_rank: usize,
    /// Read side: the connection from the left neighbour.
    left: TcpStream,
    /// A handle on the connection to the right neighbour, kept to shut it down.
    right: TcpStream,
    to_sender: Option<mpsc::Sender<SendJob>>,
    from_sender: mpsc::Receiver<SendEvent>,
    sender: Option<JoinHandle<()>>,
    /// Reusable chunk buffers.
    pool: Vec<Vec<u8>>,
    /// Buffers handed to the sender and not yet returned.
    in_flight: usize,
}

impl Link {
    fn start(
        rank: usize,
        left: TcpStream,
        right: TcpStream,
        left_rank: usize,
        right_rank: usize,
    ) -> Result<Self, RingError> {
        let writer = right
            .try_clone()
            .map_err(|e| io_error(e, right_rank, Neighbour::Right, None))?;
        let reader_handle = left
            .try_clone()
            .map_err(|e| io_error(e, left_rank, Neighbour::Left, None))?;
        let (to_sender, jobs) = mpsc::channel::<SendJob>();
        let (events, from_sender) = mpsc::channel::<SendEvent>();
        let sender = thread::Builder::new()
            .name(format!("ina-ring-tx-{rank}"))
            .spawn(move || sender_loop(writer, reader_handle, jobs, events))
            .map_err(RingError::Spawn)?;
        Ok(Self {
            left_rank,
            right_rank,
            left,
            right,
            to_sender: Some(to_sender),
            from_sender,
            sender: Some(sender),
            pool: Vec::new(),
            in_flight: 0,
        })
    }

    /// Shuts both connections down; wakes up a blocked sender thread and makes the neighbours
    /// fail fast.
    fn shutdown(&mut self) {
        let _ = self.left.shutdown(Shutdown::Both);
        let _ = self.right.shutdown(Shutdown::Both);
    }

    fn left_err(&self, e: io::Error, timeout: Option<Duration>) -> RingError {
        io_error(e, self.left_rank, Neighbour::Left, timeout)
    }

    fn right_err(&self, e: io::Error, timeout: Option<Duration>) -> RingError {
        io_error(e, self.right_rank, Neighbour::Right, timeout)
    }

    fn sender_gone(&self) -> RingError {
        RingError::PeerClosed {
            peer: self.right_rank,
            side: Neighbour::Right,
        }
    }

    fn on_event(
        &mut self,
        event: SendEvent,
        stats: &mut RingStats,
        timeout: Option<Duration>,
    ) -> Result<(), RingError> {
        match event {
            SendEvent::Done(buf) => {
                self.in_flight = self.in_flight.saturating_sub(1);
                stats.bytes_sent += buf.len() as u64;
                self.pool.push(buf);
                Ok(())
            }
            SendEvent::Failed(e) => Err(self.right_err(e, timeout)),
        }
    }

    /// Collects buffers the sender has finished with; reports its failure if it failed.
    fn reap(&mut self, stats: &mut RingStats, timeout: Option<Duration>) -> Result<(), RingError> {
        loop {
            match self.from_sender.try_recv() {
                Ok(event) => self.on_event(event, stats, timeout)?,
                Err(mpsc::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::TryRecvError::Disconnected) => {
                    return if self.in_flight > 0 {
                        Err(self.sender_gone())
                    } else {
                        Ok(())
                    };
                }
            }
        }
    }

    /// A buffer of exactly `len` bytes (contents unspecified).
    fn take_buf(
        &mut self,
        len: usize,
        stats: &mut RingStats,
        timeout: Option<Duration>,
    ) -> Result<Vec<u8>, RingError> {
        self.reap(stats, timeout)?;
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.resize(len, 0);
        Ok(buf)
    }

    /// Sends `buf` to the right neighbour: queues it for the sender thread, or, if it is small
    /// and the sender is idle, writes what fits into the socket right away (saving a thread
    /// hand-off per step, which dominates the latency of small tensors).
    fn send(&mut self, buf: Vec<u8>, stats: &mut RingStats) -> Result<(), RingError> {
        let mut offset = 0;
        if buf.len() <= DIRECT_WRITE_MAX {
            self.reap(stats, None)?;
            if self.in_flight == 0 {
                offset = self.write_now(&buf).map_err(|e| self.right_err(e, None))?;
                if offset == buf.len() {
                    stats.bytes_sent += buf.len() as u64;
                    self.pool.push(buf);
                    return Ok(());
                }
            }
        }
        let Some(tx) = &self.to_sender else {
            return Err(self.sender_gone());
        };
        if tx.send(SendJob { buf, offset }).is_err() {
            // The thread has exited: it must have reported why.
            self.reap(stats, None)?;
            return Err(self.sender_gone());
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Writes as much of `buf` as the socket takes without blocking. Only called while the
    /// sender thread is idle (nothing in flight), so toggling the shared non-blocking flag
    /// cannot disturb it, and the byte order on the stream is preserved.
    fn write_now(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.right.set_nonblocking(true)?;
        let mut written = 0;
        let result = loop {
            if written == buf.len() {
                break Ok(written);
            }
            match (&self.right).write(&buf[written..]) {
                Ok(0) => break Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(written),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        let restored = self.right.set_nonblocking(false);
        result.and_then(|n| restored.map(|()| n))
    }

    /// Reads exactly `buf.len()` bytes from the left neighbour. If that fails because our own
    /// sender failed (and shut the connection down), reports the sender's error instead.
    fn recv(
        &mut self,
        buf: &mut [u8],
        stats: &mut RingStats,
        timeout: Option<Duration>,
    ) -> Result<(), RingError> {
        match self.left.read_exact(buf) {
            Ok(()) => {
                stats.bytes_received += buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.reap(stats, timeout)?;
                Err(self.left_err(e, timeout))
            }
        }
    }

    /// Waits until the sender has written every queued buffer.
    fn drain(&mut self, stats: &mut RingStats, timeout: Option<Duration>) -> Result<(), RingError> {
        while self.in_flight > 0 {
            let event = match timeout {
                // The sender's writes are themselves bounded by the timeout; the margin only
                // guards against a sender thread that is wedged for another reason.
                Some(t) => match self.from_sender.recv_timeout(t + Duration::from_secs(1)) {
                    Ok(event) => event,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        return Err(RingError::Timeout {
                            peer: self.right_rank,
                            side: Neighbour::Right,
                            after: t,
                        })
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => return Err(self.sender_gone()),
                },
                None => self.from_sender.recv().map_err(|_| self.sender_gone())?,
            };
            self.on_event(event, stats, timeout)?;
        }
        Ok(())
    }

    /// One all-reduce: walks the schedule's transfers in wire order.
    fn run<T: RingElement>(
        &mut self,
        schedule: &RingSchedule,
        call: Call,
        data: &mut [T],
        timeout: Option<Duration>,
        stats: &mut RingStats,
    ) -> Result<(), RingError> {
        let chunks = schedule.chunks_per_segment();
        // Step-0 chunks are encoded from the tensor a little ahead of the receives; buffers
        // received (and reduced) meanwhile wait in `pending` so that the stream stays
        // step-major.
        let mut next0 = 0usize;
        let mut pending: VecDeque<Vec<u8>> = VecDeque::new();
        self.queue_step0(schedule, data, call, &mut next0, STEP0_LOOKAHEAD, stats)?;

        self.recv_call(call, stats, timeout)?;

        for tr in schedule.transfers() {
            if tr.step == 0 {
                self.queue_step0(
                    schedule,
                    data,
                    call,
                    &mut next0,
                    tr.chunk + 1 + STEP0_LOOKAHEAD,
                    stats,
                )?;
            }
            if next0 == chunks {
                while let Some(buf) = pending.pop_front() {
                    stats.payload_bytes_sent += buf.len() as u64;
                    self.send(buf, stats)?;
                }
            }
            if tr.recv.is_empty() {
                continue;
            }
            let nbytes = tr.recv.len() * 4;
            let mut buf = self.take_buf(nbytes, stats, timeout)?;
            self.recv(&mut buf, stats, timeout)?;
            stats.payload_bytes_received += nbytes as u64;
            // In bounds: the schedule was planned for `data.len()` elements.
            let local = &mut data[tr.recv.clone()];
            match (tr.op, tr.recv_is_final) {
                (RecvOp::Reduce, false) => reduce_into_buf(local, &mut buf),
                (RecvOp::Reduce, true) => reduce_into_both(local, &mut buf),
                (RecvOp::Copy, _) => decode(&buf, local),
            }
            if !tr.recv_is_forwarded {
                self.pool.push(buf);
            } else if next0 < chunks {
                pending.push_back(buf);
            } else {
                stats.payload_bytes_sent += nbytes as u64;
                self.send(buf, stats)?;
            }
        }
        debug_assert!(pending.is_empty());
        self.drain(stats, timeout)
    }

    /// Reads the left neighbour's call header and checks that it is `call`.
    fn recv_call(
        &mut self,
        call: Call,
        stats: &mut RingStats,
        timeout: Option<Duration>,
    ) -> Result<(), RingError> {
        let mut header = [0u8; CALL_HEADER_LEN];
        self.recv(&mut header, stats, timeout)?;
        call.check(&header)
            .map_err(|reason| RingError::CallMismatch {
                peer: self.left_rank,
                reason,
            })
    }

    /// One all-gather (see [`RingComm::allgather`]): this rank's contribution goes right;
    /// at step `t` the contribution of rank `rank - 1 - t` comes from the left and, but for
    /// the last, goes on to the right.
    fn allgather(
        &mut self,
        rank: usize,
        world: usize,
        call: Call,
        mine: &[u8],
        timeout: Option<Duration>,
        stats: &mut RingStats,
    ) -> Result<Vec<Vec<u8>>, RingError> {
        let mut first = self.take_buf(CALL_HEADER_LEN + 8 + mine.len(), stats, timeout)?;
        first[..CALL_HEADER_LEN].copy_from_slice(&call.encode());
        first[CALL_HEADER_LEN..CALL_HEADER_LEN + 8]
            .copy_from_slice(&(mine.len() as u64).to_le_bytes());
        first[CALL_HEADER_LEN + 8..].copy_from_slice(mine);
        stats.payload_bytes_sent += mine.len() as u64;
        self.send(first, stats)?;
        self.recv_call(call, stats, timeout)?;
        let mut out = vec![Vec::new(); world];
        out[rank] = mine.to_vec();
        for t in 0..world - 1 {
            let mut len = [0u8; 8];
            self.recv(&mut len, stats, timeout)?;
            let n = u64::from_le_bytes(len);
            if n > MAX_GATHER_BYTES {
                return Err(RingError::CallMismatch {
                    peer: self.left_rank,
                    reason: format!("a contribution of {n} bytes, above {MAX_GATHER_BYTES}"),
                });
            }
            let mut buf = self.take_buf(8 + n as usize, stats, timeout)?;
            buf[..8].copy_from_slice(&len);
            self.recv(&mut buf[8..], stats, timeout)?;
            stats.payload_bytes_received += n;
            out[(rank + world - 1 - t) % world] = buf[8..].to_vec();
            if t + 2 < world {
                stats.payload_bytes_sent += n;
                self.send(buf, stats)?;
            } else {
                self.pool.push(buf);
            }
        }
        self.drain(stats, timeout)?;
        Ok(out)
    }

    /// Encodes and queues step-0 chunks `next0 ..= upto` (bounded by the chunk count). The
    /// first one carries the call header.
    fn queue_step0<T: RingElement>(
        &mut self,
        schedule: &RingSchedule,
        data: &[T],
        call: Call,
        next0: &mut usize,
        upto: usize,
        stats: &mut RingStats,
    ) -> Result<(), RingError> {
        while *next0 < schedule.chunks_per_segment() && *next0 <= upto {
            let k = *next0;
            *next0 += 1;
            let Some(tr) = schedule.transfer(0, k) else {
                break;
            };
            let head = if k == 0 { CALL_HEADER_LEN } else { 0 };
            if tr.send.is_empty() && head == 0 {
                continue;
            }
            let src = &data[tr.send.clone()];
            let mut buf = self.take_buf(head + src.len() * 4, stats, None)?;
            if head > 0 {
                buf[..head].copy_from_slice(&call.encode());
            }
            encode(src, &mut buf[head..]);
            stats.payload_bytes_sent += (src.len() * 4) as u64;
            self.send(buf, stats)?;
        }
        Ok(())
    }
}

fn sender_loop(
    mut right: TcpStream,
    left: TcpStream,
    jobs: mpsc::Receiver<SendJob>,
    events: mpsc::Sender<SendEvent>,
) {
    while let Ok(SendJob { buf, offset }) = jobs.recv() {
        match right.write_all(buf.get(offset..).unwrap_or_default()) {
            Ok(()) => {
                if events.send(SendEvent::Done(buf)).is_err() {
                    return;
                }
            }
            Err(e) => {
                // Fail the whole communicator at once: the receiving thread wakes up from its
                // read, and both neighbours see the connections go down.
                let _ = right.shutdown(Shutdown::Both);
                let _ = left.shutdown(Shutdown::Both);
                let _ = events.send(SendEvent::Failed(e));
                return;
            }
        }
    }
}

#[inline(always)]
fn word(b: &[u8]) -> [u8; 4] {
    [b[0], b[1], b[2], b[3]]
}

/// `out = little-endian(src)`.
fn encode<T: RingElement>(src: &[T], out: &mut [u8]) {
    for (o, &x) in out.chunks_exact_mut(4).zip(src) {
        o.copy_from_slice(&x.to_le());
    }
}

/// `local = decode(buf)`.
fn decode<T: RingElement>(buf: &[u8], local: &mut [T]) {
    for (x, b) in local.iter_mut().zip(buf.chunks_exact(4)) {
        *x = T::from_le(word(b));
    }
}

/// `buf = local + buf`: an intermediate partial sum, only forwarded.
fn reduce_into_buf<T: RingElement>(local: &[T], buf: &mut [u8]) {
    for (b, &x) in buf.chunks_exact_mut(4).zip(local) {
        let v = x.combine(T::from_le(word(b)));
        b.copy_from_slice(&v.to_le());
    }
}

/// `local = buf = local + buf`: the final sum of this rank's own segment, kept and forwarded.
fn reduce_into_both<T: RingElement>(local: &mut [T], buf: &mut [u8]) {
    for (b, x) in buf.chunks_exact_mut(4).zip(local.iter_mut()) {
        let v = x.combine(T::from_le(word(b)));
        *x = v;
        b.copy_from_slice(&v.to_le());
    }
}
