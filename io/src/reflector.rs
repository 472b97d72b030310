//! A datagram reflector: the I/O-bound upper limit for the switch.
//!
//! [`Reflector`] receives batches on a port and sends every datagram
//! straight back to its source with the same batched I/O, doing no other
//! work. The switch does the same I/O plus aggregation, so the reflector's
//! packet rate bounds the switch's from above on the same machine.
//!
//! ```no_run
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::sync::Arc;
//! use ina_io::reflector::Reflector;
//!
//! let reflector = Reflector::bind("127.0.0.1:0".parse().unwrap()).unwrap();
//! let addr = reflector.local_addr();
//! let stop = Arc::new(AtomicBool::new(false));
//! let handle = reflector.spawn(Arc::clone(&stop)).unwrap();
//! // ... send datagrams to `addr`, they come back ...
//! stop.store(true, Ordering::Relaxed);
//! let report = handle.join().unwrap().unwrap();
//! println!("echoed {} datagrams", report.echoed);
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::{Counters, IoError, Port, RecvBatch, SendBatch, UdpConfig, UdpPort};

/// Options of a [`Reflector`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReflectorConfig {
    /// Datagrams per receive batch. Default: 64.
    pub batch: usize,
    /// Receive slot size. A datagram larger than this cannot be echoed
    /// faithfully; it is dropped and counted in
    /// [`ReflectorReport::dropped_truncated`]. Default: 2048 (ina packets
    /// fit an Ethernet MTU).
    pub slot_size: usize,
    /// How long one receive waits before the stop signal is checked again.
    /// Default: 20 ms.
    pub poll_interval: Duration,
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        Self {
            batch: 64,
            slot_size: 2048,
            poll_interval: Duration::from_millis(20),
        }
    }
}

/// What a [`Reflector`] did, returned when it stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReflectorReport {
    /// Datagrams sent back.
    pub echoed: u64,
    /// Bytes sent back.
    pub echoed_bytes: u64,
    /// Datagrams not echoed because they were larger than a slot.
    pub dropped_truncated: u64,
    /// Non-empty receive batches processed.
    pub batches: u64,
    /// The port's counters at the end.
    pub port: Counters,
}

/// Echoes every datagram back to its source; see the [module](self) docs.
pub struct Reflector<P: Port = UdpPort> {
    port: P,
    config: ReflectorConfig,
    recv: RecvBatch<P::Addr>,
    send: SendBatch<P::Addr>,
}

impl<P: Port> fmt::Debug for Reflector<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reflector")
            .field("local_addr", &self.port.local_addr())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Reflector<UdpPort> {
    /// A reflector on a new [`UdpPort`] bound to `addr` (default options).
    pub fn bind(addr: SocketAddr) -> Result<Self, IoError> {
        Ok(Self::new(UdpConfig::default().bind(addr)?))
    }
}

impl<P: Port> Reflector<P> {
    /// A reflector on `port` with default options.
    pub fn new(port: P) -> Self {
        Self::with_config(port, ReflectorConfig::default())
    }

    /// A reflector on `port` with `config`.
    pub fn with_config(port: P, config: ReflectorConfig) -> Self {
        let recv = RecvBatch::new(config.batch, config.slot_size);
        let send = SendBatch::with_capacity(recv.capacity(), recv.capacity() * recv.slot_size());
        Self {
            port,
            config,
            recv,
            send,
        }
    }

    /// The address datagrams should be sent to.
    pub fn local_addr(&self) -> P::Addr {
        self.port.local_addr()
    }

    /// The port.
    pub fn port(&self) -> &P {
        &self.port
    }

    /// Gives the port back.
    pub fn into_port(self) -> P {
        self.port
    }

    /// Echoes until `stop` is set (checked at least every
    /// [`poll_interval`](ReflectorConfig::poll_interval)).
    pub fn run(&mut self, stop: &AtomicBool) -> Result<ReflectorReport, IoError> {
        self.run_until(|| stop.load(Ordering::Relaxed))
    }

    /// Echoes until `stop()` returns `true` (called between batches).
    pub fn run_until<F: FnMut() -> bool>(
        &mut self,
        mut stop: F,
    ) -> Result<ReflectorReport, IoError> {
        let mut report = ReflectorReport::default();
        while !stop() {
            let n = self
                .port
                .recv_batch(&mut self.recv, Some(self.config.poll_interval))?;
            if n == 0 {
                continue;
            }
            report.batches += 1;
            self.send.clear();
            for d in &self.recv {
                if d.truncated {
                    report.dropped_truncated += 1;
                } else {
                    self.send.push(d.addr, d.data);
                }
            }
            if self.send.is_empty() {
                continue;
            }
            let before = self.port.counters();
            match self.port.send_batch(&self.send) {
                Ok(_) => {}
                // Every datagram refused (e.g. unreachable sources): keep going.
                Err(IoError::Send { sent: 0, .. })
                    if self.port.counters().tx_errors > before.tx_errors => {}
                Err(e) => return Err(e),
            }
            let after = self.port.counters().since(&before);
            report.echoed += after.tx_datagrams;
            report.echoed_bytes += after.tx_bytes;
        }
        report.port = self.port.counters();
        Ok(report)
    }
}

impl<P: Port + 'static> Reflector<P> {
    /// Runs the reflector on a new thread until `stop` is set; the thread
    /// returns the report.
    pub fn spawn(
        mut self,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<JoinHandle<Result<ReflectorReport, IoError>>> {
        thread::Builder::new()
            .name("ina-reflector".into())
            .spawn(move || self.run(&stop))
    }
}
