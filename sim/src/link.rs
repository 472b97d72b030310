//! One direction of a simulated link: latency, bandwidth, loss, duplication and reordering.

use crate::rng::Rng;
use ina_proto::Instant;
use std::time::Duration;

/// The behaviour of a link direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    /// Propagation delay.
    pub latency: Duration,
    /// Bits per second; `None` for an infinitely fast link.
    pub bandwidth_bps: Option<u64>,
    /// Probability that a packet is lost.
    pub loss: f64,
    /// Probability that a packet is delivered twice.
    pub duplicate: f64,
    /// Probability that a packet is held back by up to `reorder_delay` (and so overtaken).
    pub reorder: f64,
    /// The largest extra delay of a held-back packet.
    pub reorder_delay: Duration,
    /// Bytes the sending port's queue holds (with a finite `bandwidth_bps`): a packet that
    /// finds the queue fuller than this is dropped at its tail, as a switch port's buffer
    /// drops it. `None`: the queue never drops.
    pub buffer_bytes: Option<u64>,
    /// Bytes each packet takes on the wire beyond the datagram given to the link: headers
    /// below it and the line's own framing (66 for UDP over IPv4 on Ethernet: UDP 8, IPv4
    /// 20, Ethernet 18, preamble and inter-frame gap 20). 0: the datagram alone.
    pub framing_bytes: u32,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            latency: Duration::from_micros(5),
            bandwidth_bps: Some(100_000_000_000),
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(50),
            buffer_bytes: None,
            framing_bytes: 0,
        }
    }
}

impl LinkConfig {
    /// A lossless link with the given latency and no bandwidth limit.
    pub fn perfect(latency: Duration) -> LinkConfig {
        LinkConfig {
            latency,
            bandwidth_bps: None,
            ..LinkConfig::default()
        }
    }
}

/// Counters of one link direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub sent: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub bytes: u64,
    /// Packets dropped because the queue was full (not counted in `lost`).
    pub queue_drops: u64,
    /// The longest queue a packet found, in bytes.
    pub max_queue_bytes: u64,
    /// Bytes that found a queue ahead of them, times the bytes of that queue: divided by
    /// `bytes` it is the mean queue a byte found.
    pub queue_byte_bytes: u128,
}

/// A link direction with its transmit queue.
#[derive(Debug, Clone)]
pub struct Link {
    pub cfg: LinkConfig,
    busy_until: Instant,
    pub stats: LinkStats,
}

impl Link {
    /// An idle link.
    pub fn new(cfg: LinkConfig) -> Link {
        Link {
            cfg,
            busy_until: Instant::ZERO,
            stats: LinkStats::default(),
        }
    }

    /// How long the link stays busy with what it already holds, from `now`.
    pub fn backlog(&self, now: Instant) -> Duration {
        self.busy_until.saturating_duration_since(now)
    }

    /// Puts a datagram of `datagram` bytes on the link at `now` (it takes
    /// [`LinkConfig::framing_bytes`] more on the wire, which the link's byte counts and queue
    /// include); returns the arrival times of the copies that make it (none when lost, two
    /// when duplicated).
    pub fn transmit(&mut self, now: Instant, datagram: usize, rng: &mut Rng) -> Arrivals {
        let len = datagram + self.cfg.framing_bytes as usize;
        self.stats.sent += 1;
        let start = now.max(self.busy_until);
        let (serialization, queued) = match self.cfg.bandwidth_bps {
            Some(bps) if bps > 0 => (
                Duration::from_nanos((len as u64 * 8).saturating_mul(1_000_000_000) / bps),
                (self.backlog(now).as_nanos() as u64).saturating_mul(bps) / 8_000_000_000,
            ),
            _ => (Duration::ZERO, 0),
        };
        if self
            .cfg
            .buffer_bytes
            .is_some_and(|b| queued + len as u64 > b)
        {
            self.stats.queue_drops += 1;
            return Arrivals::NONE;
        }
        self.stats.bytes += len as u64;
        self.stats.max_queue_bytes = self.stats.max_queue_bytes.max(queued);
        self.stats.queue_byte_bytes += u128::from(queued) * len as u128;
        let done = start + serialization;
        self.busy_until = done;
        if rng.chance(self.cfg.loss) {
            self.stats.lost += 1;
            return Arrivals::NONE;
        }
        let copies = if rng.chance(self.cfg.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        let mut arrivals = Arrivals::NONE;
        for _ in 0..copies {
            let mut at = done + self.cfg.latency;
            if rng.chance(self.cfg.reorder) {
                self.stats.reordered += 1;
                let max = self.cfg.reorder_delay.as_nanos() as u64;
                at = at + Duration::from_nanos(rng.below(max + 1));
            }
            arrivals.at[arrivals.len] = at;
            arrivals.len += 1;
        }
        arrivals
    }
}

/// When the copies of one datagram arrive: none (lost or dropped), one, or two (duplicated).
/// A value, not a `Vec`: the simulator puts tens of millions of datagrams on links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrivals {
    at: [Instant; 2],
    len: usize,
}

impl Arrivals {
    const NONE: Arrivals = Arrivals {
        at: [Instant::ZERO; 2],
        len: 0,
    };
}

impl std::ops::Deref for Arrivals {
    type Target = [Instant];
    fn deref(&self) -> &[Instant] {
        &self.at[..self.len]
    }
}

impl IntoIterator for Arrivals {
    type Item = Instant;
    type IntoIter = std::iter::Take<std::array::IntoIter<Instant, 2>>;
    fn into_iter(self) -> Self::IntoIter {
        self.at.into_iter().take(self.len)
    }
}

impl PartialEq<Vec<Instant>> for Arrivals {
    fn eq(&self, other: &Vec<Instant>) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialization_and_latency_add_up() {
        let mut rng = Rng::new(1);
        let mut link = Link::new(LinkConfig {
            latency: Duration::from_micros(10),
            bandwidth_bps: Some(8_000_000_000), // 1 byte per ns
            ..LinkConfig::default()
        });
        let t = Instant::ZERO;
        assert_eq!(
            link.transmit(t, 1000, &mut rng),
            vec![t + Duration::from_nanos(11_000)]
        );
        // Queued behind the first packet.
        assert_eq!(
            link.transmit(t, 1000, &mut rng),
            vec![t + Duration::from_nanos(12_000)]
        );
    }

    #[test]
    fn framing_takes_time_and_room_on_the_wire() {
        let mut rng = Rng::new(1);
        let mut link = Link::new(LinkConfig {
            latency: Duration::ZERO,
            bandwidth_bps: Some(8_000_000_000), // 1 byte per ns
            buffer_bytes: Some(200),
            framing_bytes: 66,
            ..LinkConfig::default()
        });
        let t = Instant::ZERO;
        // A 16-byte datagram takes 82 ns, and the next one queues behind all of it.
        assert_eq!(
            link.transmit(t, 16, &mut rng),
            vec![t + Duration::from_nanos(82)]
        );
        assert_eq!(
            link.transmit(t, 16, &mut rng),
            vec![t + Duration::from_nanos(164)]
        );
        // 164 bytes queued: a third 82-byte frame does not fit in 200.
        assert!(link.transmit(t, 16, &mut rng).is_empty());
        assert_eq!(link.stats.queue_drops, 1);
        assert_eq!(link.stats.bytes, 164);
    }

    #[test]
    fn a_full_buffer_drops_at_the_tail() {
        let mut rng = Rng::new(1);
        let mut link = Link::new(LinkConfig {
            bandwidth_bps: Some(8_000_000_000), // 1 byte per ns
            buffer_bytes: Some(2500),
            ..LinkConfig::default()
        });
        let t = Instant::ZERO;
        // With 0 and 1000 bytes queued ahead two pass; with 2000 the third does not fit.
        assert_eq!(link.transmit(t, 1000, &mut rng).len(), 1);
        assert_eq!(link.transmit(t, 1000, &mut rng).len(), 1);
        assert!(link.transmit(t, 1000, &mut rng).is_empty());
        assert_eq!(link.stats.queue_drops, 1);
        assert_eq!(link.stats.max_queue_bytes, 1000);
        // Once the queue drained, packets pass again.
        let later = t + Duration::from_nanos(1500);
        assert_eq!(link.transmit(later, 1000, &mut rng).len(), 1);
        assert_eq!(link.stats.bytes, 3000);
    }

    #[test]
    fn loss_and_duplication_rates() {
        let mut rng = Rng::new(7);
        let mut link = Link::new(LinkConfig {
            loss: 0.1,
            duplicate: 0.05,
            ..LinkConfig::perfect(Duration::from_micros(1))
        });
        let delivered: usize = (0..20_000)
            .map(|_| link.transmit(Instant::ZERO, 100, &mut rng).len())
            .sum();
        assert!(
            (1_700..2_300).contains(&link.stats.lost),
            "{:?}",
            link.stats
        );
        assert!(
            (700..1_100).contains(&link.stats.duplicated),
            "{:?}",
            link.stats
        );
        assert_eq!(
            delivered as u64,
            20_000 - link.stats.lost + link.stats.duplicated
        );
    }
}
