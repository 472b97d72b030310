//! The L2 software switch: the frame switch of PROTOCOL.md §7 (`proto::l2::FrameSwitch`)
//! served over raw Ethernet ports, the way a P4 switch sits on the wire.
//!
//! Port `i` of the frame switch is the `i`-th interface given. One thread serves every port:
//! it waits until a receive ring holds frames, runs each frame through the frame switch, and
//! queues the frames that come out on their egress ports' transmit rings, which it flushes once
//! per round. Workers keep kernel UDP: to them this switch is an address on the LAN, as bmv2 or
//! a Tofino would be.

mod job;

pub use job::{parse_frame_job, port_index, FrameJobError};

use ina_io::packet::{RawConfig, RawCounters, RawError, RawPort};
use ina_proto::event::Event;
use ina_proto::l2::{FrameJob, FrameSwitch, FrameSwitchConfig, L2Error, Outputs};
use ina_proto::Instant;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Frames taken from one port's ring before the next port's turn.
const BURST: usize = 64;

/// Why the L2 switch cannot start.
#[derive(Debug, thiserror::Error)]
pub enum FramesError {
    #[error("port {ifname}: {source}")]
    Port {
        ifname: String,
        #[source]
        source: RawError,
    },
    #[error("configuration: {0}")]
    Config(#[from] L2Error),
    #[error("an L2 switch needs at least one port")]
    NoPorts,
    #[error("at most {max} ports, got {got}")]
    TooManyPorts { max: usize, got: usize },
    #[error("waiting for frames: {0}")]
    Wait(#[source] RawError),
}

/// What an L2 switch has done.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FramesStats {
    /// Every event of PROTOCOL.md §7, by name, with its count (zeros included).
    pub events: Vec<(&'static str, u64)>,
    /// Results multicast (each counted once, whatever the number of ports it left on).
    pub results_multicast: u64,
    /// Per port: its interface and its ring counters.
    pub ports: Vec<PortStats>,
}

/// One port's counters.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PortStats {
    pub ifname: String,
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub rx_truncated: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub tx_dropped: u64,
}

impl PortStats {
    fn new(ifname: &str, c: RawCounters) -> PortStats {
        PortStats {
            ifname: ifname.to_string(),
            rx_frames: c.rx_frames,
            rx_bytes: c.rx_bytes,
            rx_truncated: c.rx_truncated,
            tx_frames: c.tx_frames,
            tx_bytes: c.tx_bytes,
            tx_dropped: c.tx_dropped,
        }
    }
}

impl FramesStats {
    /// The count of one event.
    pub fn event(&self, event: Event) -> u64 {
        self.events
            .iter()
            .find(|(name, _)| *name == event.name())
            .map_or(0, |(_, n)| *n)
    }
}

/// Frames to send, copied out of the frame switch's outputs until the round's end.
#[derive(Debug, Default)]
struct TxQueue {
    bytes: Vec<u8>,
    frames: Vec<(u16, usize, usize)>,
}

impl TxQueue {
    /// Queues every frame of `out`; with `complete_checksums`, fills in the TCP or UDP
    /// checksum of each (a forwarded frame whose sender left it to a NIC).
    fn push_all(&mut self, out: &Outputs, complete_checksums: bool) {
        for (port, frame) in out.iter() {
            let start = self.bytes.len();
            self.bytes.extend_from_slice(frame);
            self.frames.push((port, start, frame.len()));
            if complete_checksums {
                if let Some(copy) = self.bytes.get_mut(start..) {
                    // A frame that is not TCP or UDP over IPv4 has no such checksum to fill.
                    let _ = ina_wire::checksum::complete_l4_checksum(copy);
                }
            }
        }
    }
}

/// A running L2 switch's state: its ports and the frame switch.
#[derive(Debug)]
pub struct FramesSwitch {
    ports: Vec<RawPort>,
    /// Per port: whether an oversized frame was reported (once per port).
    oversize_reported: Vec<bool>,
    switch: FrameSwitch,
    origin: std::time::Instant,
    /// The statistics as of the last publication (see [`Self::published`]).
    published: Arc<Mutex<Option<FramesStats>>>,
}

impl FramesSwitch {
    /// Opens every interface of `ifnames` (port `i` is the `i`-th) and installs `jobs`.
    /// `cfg.ports` is set to the ports opened.
    pub fn open(
        ifnames: &[String],
        mut cfg: FrameSwitchConfig,
        jobs: Vec<FrameJob>,
        raw: RawConfig,
    ) -> Result<FramesSwitch, FramesError> {
        if ifnames.is_empty() {
            return Err(FramesError::NoPorts);
        }
        if ifnames.len() > usize::from(u16::MAX) {
            return Err(FramesError::TooManyPorts {
                max: usize::from(u16::MAX),
                got: ifnames.len(),
            });
        }
        cfg.ports = (0..ifnames.len() as u16).collect();
        let mut switch = FrameSwitch::new(cfg)?;
        for job in jobs {
            switch.add_job(job)?;
        }
        let ports = ifnames
            .iter()
            .map(|name| {
                RawPort::open(name, raw).map_err(|source| FramesError::Port {
                    ifname: name.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let opened = FramesSwitch {
            oversize_reported: vec![false; ports.len()],
            ports,
            switch,
            origin: std::time::Instant::now(),
            published: Arc::new(Mutex::new(None)),
        };
        opened.publish();
        Ok(opened)
    }

    /// Refreshes the copy of the statistics that [`Self::published`] hands out.
    fn publish(&self) {
        let s = self.stats();
        if let Ok(mut slot) = self.published.lock() {
            *slot = Some(s);
        }
    }

    /// The frame switch (jobs, registers, counters).
    pub fn frame_switch(&self) -> &FrameSwitch {
        &self.switch
    }

    /// Statistics so far.
    pub fn stats(&self) -> FramesStats {
        FramesStats {
            events: Event::ALL
                .iter()
                .map(|e| (e.name(), self.switch.event_count(*e)))
                .collect(),
            results_multicast: self.switch.results_multicast(),
            ports: self
                .ports
                .iter()
                .map(|p| PortStats::new(p.ifname(), p.counters()))
                .collect(),
        }
    }

    /// A copy of the statistics that [`Self::run`] refreshes about every 200 ms, for readers
    /// on other threads (a metrics endpoint); published first when the switch opens, so a
    /// reader never finds it empty.
    pub fn published(&self) -> Arc<Mutex<Option<FramesStats>>> {
        self.published.clone()
    }

    /// Serves frames until `shutdown` is set (checked at least every 100 ms), logging the
    /// counters every `stats_every` if given.
    pub fn run(
        &mut self,
        shutdown: &AtomicBool,
        stats_every: Option<Duration>,
    ) -> Result<(), FramesError> {
        let _span = tracing::info_span!("l2_switch", ports = self.ports.len()).entered();
        let mut out = Outputs::new();
        let mut tx = TxQueue::default();
        let mut logged = std::time::Instant::now();
        // (`open` published the counters already: the next refresh is due in 200 ms.)
        let mut published = std::time::Instant::now();
        while !shutdown.load(Ordering::Relaxed) {
            if published.elapsed() >= Duration::from_millis(200) {
                published = std::time::Instant::now();
                self.publish();
            }
            if stats_every.is_some_and(|every| logged.elapsed() >= every) {
                logged = std::time::Instant::now();
                let s = self.stats();
                let rx: u64 = s.ports.iter().map(|p| p.rx_frames).sum();
                let tx: u64 = s.ports.iter().map(|p| p.tx_frames).sum();
                let dropped: u64 = s.ports.iter().map(|p| p.tx_dropped).sum();
                tracing::info!(
                    rx_frames = rx,
                    tx_frames = tx,
                    tx_dropped = dropped,
                    results_multicast = s.results_multicast,
                    data_first = s.event(Event::DataFirst),
                    pending_sent = s.event(Event::PendingSent),
                    malformed = s.event(Event::Malformed),
                    "stats"
                );
            }
            let ready = RawPort::wait(&self.ports, Some(Duration::from_millis(100)))
                .map_err(FramesError::Wait)?;
            if !ready {
                continue;
            }
            self.round(&mut out, &mut tx);
        }
        Ok(())
    }

    /// One round: up to [`BURST`] frames from every port, then every frame they produced.
    /// Returns the number of frames received.
    fn round(&mut self, out: &mut Outputs, tx: &mut TxQueue) -> usize {
        let mut received = 0;
        let now = Instant::from_nanos(self.origin.elapsed().as_nanos() as u64);
        let FramesSwitch {
            ports,
            switch,
            oversize_reported,
            ..
        } = self;
        for (i, port) in ports.iter_mut().enumerate() {
            received += port.recv(BURST, |frame, meta| {
                let event = switch.process(i as u16, frame, now, out);
                tx.push_all(out, meta.checksum_partial && event == Event::L2Forwarded);
            });
            let cut = port.counters().rx_truncated;
            if cut > 0 && !oversize_reported[i] {
                oversize_reported[i] = true;
                tracing::warn!(
                    port = port.ifname(),
                    max_frame = port.config().max_frame(),
                    "dropped a frame larger than the port's slots: if the peer is a veth or tap \
                     device, its host sends GSO/TSO super-frames that no wire would carry; turn \
                     segmentation offload off on the peer (`ip link set dev IF gso_max_segs 1`) \
                     or raise --mtu"
                );
            }
        }
        for &(port, start, len) in &tx.frames {
            if let (Some(p), Some(frame)) = (
                ports.get_mut(usize::from(port)),
                tx.bytes.get(start..start + len),
            ) {
                if !p.send(frame) {
                    tracing::debug!(port = p.ifname(), "transmit ring full: frame dropped");
                }
            }
        }
        tx.bytes.clear();
        tx.frames.clear();
        for p in ports.iter_mut() {
            if let Err(e) = p.flush() {
                tracing::warn!(port = p.ifname(), "{e}");
            }
        }
        received
    }
}
