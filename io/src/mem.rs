//! An in-memory network: [`MemNetwork`] and its [`MemPort`]s.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::{Counters, IoError, Port, RecvBatch, SendBatch};

/// Options of a [`MemNetwork`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemConfig {
    /// Datagrams a port's receive queue holds before further arrivals are
    /// dropped. Default: 1024.
    pub queue_datagrams: usize,
    /// Payload bytes a port's receive queue holds before further arrivals
    /// are dropped. Default: 4 MiB.
    pub queue_bytes: usize,
    /// Largest datagram a port accepts for sending (larger ones are refused
    /// like an oversize UDP datagram). Default: 65 507.
    pub max_datagram: usize,
}

impl Default for MemConfig {
    fn default() -> Self {
        Self {
            queue_datagrams: 1024,
            queue_bytes: 4 << 20,
            max_datagram: 65_507,
        }
    }
}

/// Counters of a [`MemNetwork`] as a whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemNetStats {
    /// Datagrams placed in a receive queue.
    pub delivered: u64,
    /// Datagrams dropped because no port has their destination address.
    pub dropped_unknown: u64,
    /// Datagrams dropped because the destination's queue was full.
    pub dropped_full: u64,
}

/// A set of connected in-memory ports, for testing the daemons without
/// sockets.
///
/// Every port has a bounded receive queue; a datagram sent to an address
/// no port holds, or to a full queue, is dropped and counted (see
/// [`stats`](Self::stats)), as a real network would drop it. Cloning the
/// network gives another handle on the same network. Thread-safe.
///
/// Sending copies bytes into the destination's queue (one ring buffer of
/// bytes per port), receiving copies them out into the caller's
/// [`RecvBatch`]: no allocation per datagram once the queues have grown.
#[derive(Clone, Default)]
pub struct MemNetwork {
    inner: Arc<Net>,
}

#[derive(Default)]
struct Net {
    config: MemConfig,
    ports: RwLock<HashMap<SocketAddr, Arc<Queue>>>,
    next_ephemeral: Mutex<u16>,
    delivered: AtomicU64,
    dropped_unknown: AtomicU64,
    dropped_full: AtomicU64,
}

struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    /// Source and length of each queued datagram.
    heads: VecDeque<(SocketAddr, usize)>,
    /// Their bytes, back to back.
    bytes: VecDeque<u8>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; recover anyway.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl fmt::Debug for MemNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ports = self.inner.ports.read().map(|p| p.len()).unwrap_or(0);
        f.debug_struct("MemNetwork")
            .field("config", &self.inner.config)
            .field("ports", &ports)
            .field("stats", &self.stats())
            .finish()
    }
}

impl MemNetwork {
    /// A network with default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// A network with `config`.
    pub fn with_config(config: MemConfig) -> Self {
        Self {
            inner: Arc::new(Net {
                config,
                ..Net::default()
            }),
        }
    }

    /// The network's options.
    pub fn config(&self) -> MemConfig {
        self.inner.config
    }

    /// Attaches a port at `addr`. Port number 0 picks a free port number
    /// (from 49152 up) for that IP. Fails with [`IoError::AddrInUse`] if a
    /// port already holds the address. Dropping the port frees it.
    pub fn port(&self, addr: SocketAddr) -> Result<MemPort, IoError> {
        let mut ports = self
            .inner
            .ports
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let addr = if addr.port() == 0 {
            let mut next = lock(&self.inner.next_ephemeral);
            let mut found = None;
            for _ in 0..=16_384 {
                let candidate = 49_152 + (*next % 16_384);
                *next = next.wrapping_add(1);
                let a = SocketAddr::new(addr.ip(), candidate);
                if !ports.contains_key(&a) {
                    found = Some(a);
                    break;
                }
            }
            found.ok_or(IoError::AddrInUse(addr))?
        } else {
            addr
        };
        if ports.contains_key(&addr) {
            return Err(IoError::AddrInUse(addr));
        }
        let queue = Arc::new(Queue {
            state: Mutex::new(QueueState::default()),
            ready: Condvar::new(),
        });
        ports.insert(addr, Arc::clone(&queue));
        Ok(MemPort {
            net: Arc::clone(&self.inner),
            addr,
            queue,
            counters: Counters::default(),
        })
    }

    /// Network-wide delivery and drop counts.
    pub fn stats(&self) -> MemNetStats {
        MemNetStats {
            delivered: self.inner.delivered.load(Ordering::Relaxed),
            dropped_unknown: self.inner.dropped_unknown.load(Ordering::Relaxed),
            dropped_full: self.inner.dropped_full.load(Ordering::Relaxed),
        }
    }
}

/// A port of a [`MemNetwork`]; see there.
pub struct MemPort {
    net: Arc<Net>,
    addr: SocketAddr,
    queue: Arc<Queue>,
    counters: Counters,
}

impl fmt::Debug for MemPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemPort")
            .field("addr", &self.addr)
            .field("queued", &self.queued())
            .field("counters", &self.counters)
            .finish()
    }
}

impl MemPort {
    /// Datagrams waiting in this port's receive queue.
    pub fn queued(&self) -> usize {
        lock(&self.queue.state).heads.len()
    }
}

impl Drop for MemPort {
    fn drop(&mut self) {
        let mut ports = self
            .net
            .ports
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if ports
            .get(&self.addr)
            .is_some_and(|q| Arc::ptr_eq(q, &self.queue))
        {
            ports.remove(&self.addr);
        }
    }
}

impl Port for MemPort {
    type Addr = SocketAddr;

    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn recv_batch(
        &mut self,
        batch: &mut RecvBatch,
        timeout: Option<Duration>,
    ) -> Result<usize, IoError> {
        batch.clear();
        let mut st = lock(&self.queue.state);
        if st.heads.is_empty() {
            match timeout {
                Some(t) if t.is_zero() => return Ok(0),
                None => {
                    while st.heads.is_empty() {
                        st = self
                            .queue
                            .ready
                            .wait(st)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                }
                Some(t) => {
                    let start = Instant::now();
                    let end = start.checked_add(t);
                    while st.heads.is_empty() {
                        let left = match end {
                            Some(end) => end.saturating_duration_since(Instant::now()),
                            None => t,
                        };
                        if left.is_zero() {
                            return Ok(0);
                        }
                        st = self
                            .queue
                            .ready
                            .wait_timeout(st, left)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                    }
                }
            }
        }
        let slot = batch.slot_size();
        while !batch.is_full() {
            let Some((src, len)) = st.heads.pop_front() else {
                break;
            };
            let len = len.min(st.bytes.len());
            let (a, b) = st.bytes.as_slices();
            let (first, second) = if len <= a.len() {
                (&a[..len], &b[..0])
            } else {
                (a, &b[..len - a.len()])
            };
            batch.push_parts(src, first, second, false);
            st.bytes.drain(..len);
            self.counters.rx_datagrams += 1;
            self.counters.rx_bytes += len.min(slot) as u64;
            self.counters.rx_truncated += u64::from(len > slot);
        }
        Ok(batch.len())
    }

    fn send_batch(&mut self, batch: &SendBatch) -> Result<usize, IoError> {
        let cfg = self.net.config;
        let ports = self
            .net
            .ports
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let mut sent = 0;
        let mut i = 0;
        while i < batch.len() {
            let Some(dest) = batch.addr(i) else { break };
            // Deliver the run of datagrams to the same destination under
            // one lock and one wake-up.
            let mut end = i + 1;
            while batch.addr(end) == Some(dest) {
                end += 1;
            }
            let queue = ports.get(&dest);
            let mut st = queue.map(|q| lock(&q.state));
            let mut delivered = 0u64;
            for j in i..end {
                let Some((_, data)) = batch.get(j) else { break };
                if data.len() > cfg.max_datagram {
                    self.counters.tx_errors += 1;
                    continue;
                }
                sent += 1;
                self.counters.tx_datagrams += 1;
                self.counters.tx_bytes += data.len() as u64;
                match st.as_mut() {
                    None => {
                        self.net.dropped_unknown.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(st) => {
                        if st.heads.len() >= cfg.queue_datagrams
                            || st.bytes.len() + data.len() > cfg.queue_bytes
                        {
                            self.net.dropped_full.fetch_add(1, Ordering::Relaxed);
                        } else {
                            st.heads.push_back((self.addr, data.len()));
                            st.bytes.extend(data);
                            delivered += 1;
                        }
                    }
                }
            }
            drop(st);
            if delivered > 0 {
                self.net.delivered.fetch_add(delivered, Ordering::Relaxed);
                if let Some(q) = queue {
                    q.ready.notify_all();
                }
            }
            i = end;
        }
        if sent == 0 && !batch.is_empty() {
            return Err(IoError::Send {
                sent,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("datagrams larger than {} bytes", cfg.max_datagram),
                ),
            });
        }
        Ok(sent)
    }

    fn counters(&self) -> Counters {
        self.counters
    }
}
