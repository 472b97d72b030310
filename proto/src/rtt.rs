//! Retransmission timeout estimation in the manner of RFC 6298.
//!
//! `SRTT` and `RTTVAR` follow the RFC's smoothing (alpha = 1/8, beta = 1/4); the timeout is
//! `SRTT + max(granularity, 4 * RTTVAR)`, clamped to `[min, max]`. Samples are taken only from
//! packets that were never retransmitted (Karn's rule); a packet's own timer backs off
//! exponentially with each of its retransmissions, bounded by `max`.

use core::time::Duration;

/// Bounds and start value of the retransmission timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtoConfig {
    /// The timeout before the first sample.
    pub initial: Duration,
    /// The smallest timeout.
    pub min: Duration,
    /// The largest timeout, also the cap of the exponential backoff.
    pub max: Duration,
    /// Clock granularity term `G`.
    pub granularity: Duration,
}

impl Default for RtoConfig {
    fn default() -> Self {
        RtoConfig {
            initial: Duration::from_millis(20),
            min: Duration::from_micros(500),
            max: Duration::from_millis(500),
            granularity: Duration::from_micros(100),
        }
    }
}

/// The estimator.
#[derive(Debug, Clone)]
pub struct RttEstimator {
    cfg: RtoConfig,
    srtt: Option<Duration>,
    rttvar: Duration,
    min_rtt: Option<Duration>,
    latest: Option<Duration>,
    samples: u64,
    /// Doublings of the timeout since the last sample (RFC 6298 §5.5-5.7).
    backoff: u32,
}

impl RttEstimator {
    /// A fresh estimator.
    pub fn new(cfg: RtoConfig) -> RttEstimator {
        RttEstimator {
            cfg,
            srtt: None,
            rttvar: Duration::ZERO,
            min_rtt: None,
            latest: None,
            samples: 0,
            backoff: 0,
        }
    }

    /// Feeds one round-trip sample.
    pub fn on_sample(&mut self, rtt: Duration) {
        self.samples += 1;
        self.backoff = 0;
        self.latest = Some(rtt);
        self.min_rtt = Some(self.min_rtt.map_or(rtt, |m| m.min(rtt)));
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                let diff = srtt.abs_diff(rtt);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((srtt * 7 + rtt) / 8);
            }
        }
    }

    /// The timeout for a packet sent for the first time: the estimate, doubled for every
    /// expiry since the last sample ([`Self::on_timeout`]).
    pub fn rto(&self) -> Duration {
        let raw = match self.srtt {
            None => self.cfg.initial,
            Some(srtt) => srtt + self.cfg.granularity.max(self.rttvar * 4),
        };
        raw.saturating_mul(1 << self.backoff)
            .clamp(self.cfg.min, self.cfg.max.max(self.cfg.min))
    }

    /// A retransmission timer expired: until the next sample, every timeout is twice as long
    /// (RFC 6298 §5.5-5.7). Without it, a path slower than the initial timeout (a software
    /// switch such as bmv2 with a window of packets queued) would time out every packet, and
    /// Karn's rule would never let a sample through to correct the estimate.
    pub fn on_timeout(&mut self) {
        self.backoff = (self.backoff + 1).min(16);
    }

    /// The timeout for a packet already retransmitted `retries` times: doubled per retry.
    pub fn backed_off(&self, retries: u32) -> Duration {
        let factor = 1u32 << retries.min(16);
        self.rto()
            .saturating_mul(factor)
            .min(self.cfg.max.max(self.cfg.min))
    }

    /// The bounds it was made with.
    pub fn config(&self) -> &RtoConfig {
        &self.cfg
    }

    /// The smoothed round-trip time, once a sample was taken.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// The round-trip variation.
    pub fn rttvar(&self) -> Duration {
        self.rttvar
    }

    /// The smallest sample seen.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    /// Number of samples taken.
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn expiries_double_the_timeout_until_the_next_sample() {
        let cfg = RtoConfig::default();
        let mut e = RttEstimator::new(cfg);
        e.on_timeout();
        assert_eq!(e.rto(), cfg.initial * 2);
        e.on_timeout();
        assert_eq!(e.rto(), cfg.initial * 4);
        for _ in 0..40 {
            e.on_timeout();
        }
        assert_eq!(e.rto(), cfg.max);
        e.on_sample(Duration::from_millis(4));
        assert_eq!(e.rto(), Duration::from_millis(12));
    }

    #[test]
    fn first_sample_sets_srtt_and_half_variance() {
        let mut e = RttEstimator::new(RtoConfig::default());
        assert_eq!(e.rto(), RtoConfig::default().initial);
        e.on_sample(Duration::from_millis(4));
        assert_eq!(e.srtt(), Some(Duration::from_millis(4)));
        assert_eq!(e.rttvar(), Duration::from_millis(2));
        assert_eq!(e.rto(), Duration::from_millis(12));
        e.on_sample(Duration::from_millis(12));
        // rttvar = (3*2 + 8)/4 = 3.5 ms; srtt = (7*4 + 12)/8 = 5 ms.
        assert_eq!(e.srtt(), Some(Duration::from_millis(5)));
        assert_eq!(e.rttvar(), Duration::from_micros(3500));
        assert_eq!(e.min_rtt(), Some(Duration::from_millis(4)));
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let cfg = RtoConfig {
            initial: Duration::from_millis(10),
            min: Duration::from_millis(1),
            max: Duration::from_millis(70),
            granularity: Duration::from_micros(1),
        };
        let e = RttEstimator::new(cfg);
        assert_eq!(e.backed_off(0), Duration::from_millis(10));
        assert_eq!(e.backed_off(1), Duration::from_millis(20));
        assert_eq!(e.backed_off(2), Duration::from_millis(40));
        assert_eq!(e.backed_off(3), Duration::from_millis(70));
        assert_eq!(e.backed_off(1000), Duration::from_millis(70));
    }

    proptest! {
        #[test]
        fn rto_stays_within_bounds(samples in proptest::collection::vec(0u64..10_000_000, 1..50), retries in 0u32..40) {
            let cfg = RtoConfig::default();
            let mut e = RttEstimator::new(cfg);
            for s in samples {
                e.on_sample(Duration::from_nanos(s));
                prop_assert!(e.rto() >= cfg.min && e.rto() <= cfg.max);
                prop_assert!(e.backed_off(retries) >= e.rto() && e.backed_off(retries) <= cfg.max);
            }
        }
    }
}
