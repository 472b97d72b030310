//! Links of a given rate inside one process.
//!
//! On one host with no link limits, in-network aggregation has nothing to save: every worker's
//! traffic crosses loopback at the speed of its CPU. [`PacedPort`] puts a [`Port`] behind a
//! link of its own, holding what it sends and what it receives to the link's rate in each
//! direction, as a token bucket of [`LinkClock::burst`]; [`set_max_pacing_rate`] does the same
//! for a TCP stream (the kernel paces TCP itself). A link counts IP bytes: a datagram plus the
//! [`IP_UDP_HEADERS`] of IPv4 and UDP.
//!
//! A link delays and never reorders. A receive queue longer than [`PacedPort::queue_limit`]
//! drops what arrives, as a router's queue does; a sender is held back instead (the port's
//! `send_batch` waits for the link, as it waits for socket buffer space).

use crate::{Counters, IoError, Port, RecvBatch, SendBatch};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How early a datagram may be handed over before it has crossed the link, so that a receiver
/// wakes once for several datagrams rather than once for each. Arrival times are kept exactly,
/// so the error does not add up.
pub const DELIVERY_GRANULARITY: Duration = Duration::from_micros(200);

/// IPv4 and UDP header bytes a link carries with each datagram.
pub const IP_UDP_HEADERS: usize = 28;

/// When a link is free again: each transmission starts when the previous one ended (or now)
/// and takes its bytes' time at the rate.
#[derive(Debug, Clone)]
pub struct LinkClock {
    rate_bps: u64,
    burst: Duration,
    free_at: Option<Instant>,
}

impl LinkClock {
    /// A link of `rate_bps` bits per second whose sender may run `burst` ahead of it.
    pub fn new(rate_bps: u64, burst: Duration) -> Self {
        Self {
            rate_bps: rate_bps.max(1),
            burst,
            free_at: None,
        }
    }

    /// The rate, bits per second.
    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }

    /// How far ahead of the link a sender may run.
    pub fn burst(&self) -> Duration {
        self.burst
    }

    /// The time `bytes` take on the link.
    pub fn duration_of(&self, bytes: usize) -> Duration {
        let nanos = (bytes as u128 * 8 * 1_000_000_000) / u128::from(self.rate_bps);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Takes the link for `bytes` offered at `now`; returns when they have crossed it.
    pub fn transmit(&mut self, now: Instant, bytes: usize) -> Instant {
        let start = self.free_at.filter(|&f| f > now).unwrap_or(now);
        let end = start + self.duration_of(bytes);
        self.free_at = Some(end);
        end
    }

    /// How long a sender at `now` must wait before it offers more: the link's backlog beyond
    /// the burst.
    pub fn wait(&self, now: Instant) -> Duration {
        self.free_at
            .map_or(Duration::ZERO, |f| f.saturating_duration_since(now))
            .saturating_sub(self.burst)
    }
}

/// A datagram on its way in, and when it has crossed the link.
#[derive(Debug)]
struct Arriving<A> {
    due: Instant,
    addr: A,
    data: Vec<u8>,
    truncated: bool,
}

/// A [`Port`] behind a link of a given rate in each direction.
#[derive(Debug)]
pub struct PacedPort<P: Port> {
    inner: P,
    tx: LinkClock,
    rx: LinkClock,
    scratch_out: SendBatch<P::Addr>,
    scratch_in: Option<RecvBatch<P::Addr>>,
    arriving: VecDeque<Arriving<P::Addr>>,
    arriving_bytes: usize,
    queue_limit: usize,
    spare: Vec<Vec<u8>>,
    dropped: u64,
}

impl<P: Port> PacedPort<P> {
    /// `inner` behind a link of `rate_bps` each way, with a burst of 1 ms (at least 64 KiB
    /// worth, so that one large datagram passes) and a receive queue of 100 ms at the rate.
    pub fn new(inner: P, rate_bps: u64) -> Self {
        let clock = LinkClock::new(rate_bps, Duration::from_millis(1));
        let one_large = clock.duration_of(64 << 10);
        let burst = clock.burst().max(one_large);
        let queue_limit = usize::try_from(rate_bps / 8 / 10)
            .unwrap_or(usize::MAX)
            .max(256 << 10);
        Self {
            inner,
            tx: LinkClock::new(rate_bps, burst),
            rx: LinkClock::new(rate_bps, burst),
            scratch_out: SendBatch::new(),
            scratch_in: None,
            arriving: VecDeque::new(),
            arriving_bytes: 0,
            queue_limit,
            spare: Vec::new(),
            dropped: 0,
        }
    }

    /// The port behind the link.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// Bytes the receive queue holds at most.
    pub fn queue_limit(&self) -> usize {
        self.queue_limit
    }

    /// Datagrams the receive queue dropped because it was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Takes what the inner port has (waiting at most `timeout` for the first) onto the link.
    fn pull(
        &mut self,
        timeout: Option<Duration>,
        like: &RecvBatch<P::Addr>,
    ) -> Result<usize, IoError> {
        let fits = |b: &RecvBatch<P::Addr>| {
            b.capacity() == like.capacity() && b.slot_size() == like.slot_size()
        };
        if !self.scratch_in.as_ref().is_some_and(fits) {
            self.scratch_in = Some(RecvBatch::new(like.capacity(), like.slot_size()));
        }
        let Some(scratch) = self.scratch_in.as_mut() else {
            return Ok(0);
        };
        let n = self.inner.recv_batch(scratch, timeout)?;
        let now = Instant::now();
        for d in scratch.iter() {
            if self.arriving_bytes + d.data.len() > self.queue_limit {
                self.dropped += 1;
                continue;
            }
            let due = self.rx.transmit(now, d.data.len() + IP_UDP_HEADERS);
            let mut data = self.spare.pop().unwrap_or_default();
            data.clear();
            data.extend_from_slice(d.data);
            self.arriving_bytes += data.len();
            self.arriving.push_back(Arriving {
                due,
                addr: d.addr,
                data,
                truncated: d.truncated,
            });
        }
        Ok(n)
    }

    /// Moves every datagram that has crossed the link by `now` (give or take
    /// [`DELIVERY_GRANULARITY`]) into `batch`.
    fn deliver(&mut self, batch: &mut RecvBatch<P::Addr>, now: Instant) {
        let by = now + DELIVERY_GRANULARITY;
        while !batch.is_full() && self.arriving.front().is_some_and(|a| a.due <= by) {
            let Some(a) = self.arriving.pop_front() else {
                break;
            };
            self.arriving_bytes -= a.data.len();
            match batch.free_slot() {
                Some(slot) => {
                    let len = a.data.len().min(slot.len());
                    slot[..len].copy_from_slice(&a.data[..len]);
                    batch.commit(a.addr, len, a.truncated || len < a.data.len());
                }
                None => break,
            }
            self.spare.push(a.data);
        }
    }
}

impl<P: Port> Port for PacedPort<P> {
    type Addr = P::Addr;

    fn local_addr(&self) -> Self::Addr {
        self.inner.local_addr()
    }

    fn recv_batch(
        &mut self,
        batch: &mut RecvBatch<Self::Addr>,
        timeout: Option<Duration>,
    ) -> Result<usize, IoError> {
        batch.clear();
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            self.pull(Some(Duration::ZERO), batch)?;
            let now = Instant::now();
            self.deliver(batch, now);
            if !batch.is_empty() {
                return Ok(batch.len());
            }
            if deadline.is_some_and(|d| d <= now) {
                return Ok(0);
            }
            // Wait for the inner port until the next datagram is due or the caller's deadline.
            let until = match (self.arriving.front().map(|a| a.due), deadline) {
                (Some(due), Some(d)) => Some(due.min(d)),
                (due, d) => due.or(d),
            };
            let wait = until.map(|u| u.saturating_duration_since(now + DELIVERY_GRANULARITY));
            self.pull(wait, batch)?;
        }
    }

    fn send_batch(&mut self, batch: &SendBatch<Self::Addr>) -> Result<usize, IoError> {
        let mut sent = 0;
        let mut first_error = None;
        let mut flush = |this: &mut Self, sent: &mut usize| {
            if this.scratch_out.is_empty() {
                return;
            }
            match this.inner.send_batch(&this.scratch_out) {
                Ok(n) => *sent += n,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
            this.scratch_out.clear();
        };
        for (addr, data) in batch.iter() {
            let wait = self.tx.wait(Instant::now());
            if !wait.is_zero() {
                flush(self, &mut sent);
                // Down to half the burst, so that a sender wakes once per half burst, not once
                // per datagram.
                std::thread::sleep(wait + self.tx.burst() / 2);
            }
            self.tx
                .transmit(Instant::now(), data.len() + IP_UDP_HEADERS);
            self.scratch_out.push(addr, data);
        }
        flush(self, &mut sent);
        match first_error {
            Some(e) if sent == 0 => Err(e),
            _ => Ok(sent),
        }
    }

    fn counters(&self) -> Counters {
        self.inner.counters()
    }

    fn reserve_recv(&mut self, bytes: usize) {
        self.inner.reserve_recv(bytes);
    }
}

/// Holds a TCP stream's sending to `bits_per_s` (`SO_MAX_PACING_RATE`: the kernel paces TCP
/// itself, also on loopback).
#[cfg(target_os = "linux")]
pub fn set_max_pacing_rate(
    stream: &impl std::os::fd::AsFd,
    bits_per_s: u64,
) -> std::io::Result<()> {
    crate::sys::set_max_pacing_rate(stream.as_fd(), (bits_per_s / 8).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemNetwork;

    #[test]
    fn transmissions_queue_behind_each_other_at_the_rate() {
        let mut link = LinkClock::new(8_000_000, Duration::ZERO); // 1 byte per µs
        let t0 = Instant::now();
        assert_eq!(link.transmit(t0, 1000), t0 + Duration::from_micros(1000));
        // Offered before the link is free: it starts when the first ends.
        let second = link.transmit(t0 + Duration::from_micros(10), 500);
        assert_eq!(second, t0 + Duration::from_micros(1500));
        assert_eq!(
            link.wait(t0 + Duration::from_micros(500)),
            Duration::from_micros(1000)
        );
        // Offered after it is free: it starts at once.
        let later = t0 + Duration::from_millis(5);
        assert_eq!(link.transmit(later, 8), later + Duration::from_micros(8));
    }

    #[test]
    fn the_burst_lets_a_sender_run_ahead_before_it_waits() {
        let mut link = LinkClock::new(8_000_000, Duration::from_micros(300));
        let t0 = Instant::now();
        link.transmit(t0, 200);
        assert_eq!(link.wait(t0), Duration::ZERO);
        link.transmit(t0, 200);
        assert_eq!(link.wait(t0), Duration::from_micros(100));
    }

    /// Datagrams cross a paced port whole, in order, and no faster than its link.
    #[test]
    fn a_paced_port_delivers_everything_in_order_at_the_rate() {
        let net = MemNetwork::new();
        let rate = 80_000_000; // 10 bytes per µs
        let mut a = PacedPort::new(net.port("127.0.0.1:1".parse().unwrap()).unwrap(), rate);
        let mut b = PacedPort::new(net.port("127.0.0.1:2".parse().unwrap()).unwrap(), rate);
        let to = b.local_addr();
        let count = 200usize;
        let size = 972; // 1000 bytes on the link with its headers
        let started = Instant::now();
        let mut out = SendBatch::new();
        for i in 0..count {
            out.push(to, &vec![i as u8; size]);
        }
        assert_eq!(a.send_batch(&out).unwrap(), count);
        let mut got = Vec::new();
        let mut batch = RecvBatch::new(16, 2048);
        while got.len() < count && started.elapsed() < Duration::from_secs(10) {
            b.recv_batch(&mut batch, Some(Duration::from_millis(100)))
                .unwrap();
            got.extend(batch.iter().map(|d| (d.data.len(), d.data[0])));
        }
        let elapsed = started.elapsed();
        assert_eq!(got.len(), count);
        for (i, (len, first)) in got.iter().enumerate() {
            assert_eq!((*len, *first), (size, i as u8), "datagram {i}");
        }
        // 200 000 bytes at 10 bytes per µs take 20 ms; the sender's burst (64 KiB worth) is
        // spent again by the receiver's link, so at least 20 ms pass less one burst.
        let least = Duration::from_millis(20) - a.tx.burst();
        assert!(elapsed >= least, "{elapsed:?} < {least:?}");
        assert_eq!(b.dropped(), 0);
    }

    #[test]
    fn a_receive_timeout_with_nothing_on_the_link_returns_nothing() {
        let net = MemNetwork::new();
        let mut p = PacedPort::new(net.port("127.0.0.1:3".parse().unwrap()).unwrap(), 1_000_000);
        let mut batch = RecvBatch::new(4, 64);
        let started = Instant::now();
        assert_eq!(
            p.recv_batch(&mut batch, Some(Duration::from_millis(20)))
                .unwrap(),
            0
        );
        assert!(started.elapsed() >= Duration::from_millis(20));
    }
}
