//! How many packets a stream keeps in flight when jobs share links: a delay-based AIMD rule.
//!
//! A stream's lane has `window` slots, and without this control every slot holds a packet
//! whenever it can. Jobs whose workers share a link (a rack switch's uplink) then fill its
//! queue with their windows: the queue, not the link, sets every round trip, and a finite
//! buffer drops packets of whichever job arrives at the wrong moment, so the jobs' shares
//! drift apart. [`WindowControl`] keeps `cwnd <= window` packets in flight instead:
//!
//! * **Target.** `base + target_queueing`, with `base` the smallest round trip of a result
//!   the stream has seen (the path without queues) and `target_queueing` the queueing delay
//!   the jobs may add together.
//! * **Slow start.** Until the first round trip above half the target's queueing, each
//!   result adds `slow_start_gain` packets: the window grows by that fraction every round
//!   trip, from `initial` to the link's share in a few dozen round trips instead of hundreds.
//!   It stops at half the target because the growth already in flight still reaches the
//!   queue. The default gain is a quarter, not TCP's doubling: four jobs doubling together on
//!   one 100 Gbit/s uplink overshot a 512 KiB buffer by the round trip of feedback and lost
//!   1500 to 6000 packets, whose repairs, by round-trip timers of 100 µs, left the jobs'
//!   shares 20-40% apart (`ina sim` in BENCHMARKS.md); growing by a quarter, none was lost.
//! * **Additive increase.** After that, a result whose round trip is below the target adds
//!   `additive / cwnd`: `additive` packets per round trip.
//! * **Multiplicative decrease.** A result above the target multiplies `cwnd` by
//!   `1 - gain * (rtt - target) / rtt`, at most once per smoothed round trip and never below
//!   `1 - max_decrease`: the further above the target, the larger the cut.
//!
//! Why delay and not loss: a data-center link loses packets at random too, and a loss is
//! repaired for one round trip's cost (PROTOCOL.md §5); halving on every loss would cost 1%
//! random loss half the throughput. A queue shows as delay long before it drops, and every job
//! on a link sees the same queue, so all of them back off together: with the same target,
//! additive increase and multiplicative decrease, the windows converge to equal shares
//! (Chiu and Jain's argument; Swift and TIMELY do the same in data centers).
//!
//! A job's result returns when the last worker's data is in, so its round trip includes the
//! wait for the slowest worker; every worker of the job sees that same wait, and the windows
//! of one job stay together.
//!
//! What it must not do: read a clock (the caller passes `now`) or decide anything but how
//! many packets may be in flight.

use crate::Instant;
use std::time::Duration;

/// The constants of [`WindowControl`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowConfig {
    /// Queueing delay allowed above the smallest round trip.
    pub target_queueing: Duration,
    /// Packets added per round trip below the target.
    pub additive: f64,
    /// How hard a round trip above the target cuts (the fraction of the excess delay).
    pub gain: f64,
    /// The largest cut of one decrease (0.5: never below half).
    pub max_decrease: f64,
    /// The window the stream starts with, in packets (at least 1).
    pub initial: f64,
    /// Packets each result adds during slow start (1: the window doubles per round trip;
    /// 0.25, the default: it grows by a quarter).
    pub slow_start_gain: f64,
    /// The round trip of the path without queues, if known (from the topology). `None`
    /// learns it as the smallest round trip seen: right for a stream that starts on an idle
    /// path, too high for one that starts behind a standing queue, which would then keep
    /// that queue as its own and take more than its share.
    pub base_rtt: Option<Duration>,
}

impl Default for WindowConfig {
    /// 10 µs of queueing (125 KB at 100 Gbit/s, below a switch port's buffer), a quarter
    /// more per round trip in slow start, then one packet more per round trip, cuts of up to
    /// half.
    fn default() -> Self {
        WindowConfig {
            target_queueing: Duration::from_micros(10),
            additive: 1.0,
            gain: 0.8,
            max_decrease: 0.5,
            initial: 16.0,
            slow_start_gain: 0.25,
            base_rtt: None,
        }
    }
}

/// The delay-based AIMD window of one worker (carried from one stream to the next).
#[derive(Debug, Clone, PartialEq)]
pub struct WindowControl {
    cfg: WindowConfig,
    cwnd: f64,
    base: Option<Duration>,
    last_decrease: Option<Instant>,
    /// No round trip above the target yet: the window doubles per round trip.
    slow_start: bool,
    /// Decreases so far.
    pub decreases: u64,
}

impl WindowControl {
    pub fn new(cfg: WindowConfig) -> WindowControl {
        WindowControl {
            cwnd: cfg.initial.max(1.0),
            base: cfg.base_rtt,
            cfg,
            last_decrease: None,
            slow_start: true,
            decreases: 0,
        }
    }

    /// The window, in packets (at least 1).
    pub fn cwnd(&self) -> f64 {
        self.cwnd
    }

    /// The smallest round trip seen.
    pub fn base_rtt(&self) -> Option<Duration> {
        self.base
    }

    /// Packets that may be in flight on a lane of `slots` slots.
    pub fn allowed(&self, slots: u16) -> u64 {
        (self.cwnd as u64).clamp(1, u64::from(slots.max(1)))
    }

    /// A result's round trip `rtt` (an unambiguous sample), with the stream's smoothed round
    /// trip `srtt` spacing the decreases; `slots` bounds the window.
    pub fn on_rtt(&mut self, now: Instant, rtt: Duration, srtt: Duration, slots: u16) {
        let base = self.base.map_or(rtt, |b| b.min(rtt));
        self.base = Some(base);
        let target = base + self.cfg.target_queueing;
        if self.slow_start && rtt > base + self.cfg.target_queueing / 2 {
            // The queue is building: stop doubling before it reaches the target, since the
            // doubling of the round trip in flight still arrives at the queue.
            self.slow_start = false;
        }
        if rtt <= target {
            self.cwnd += if self.slow_start {
                self.cfg.slow_start_gain
            } else {
                self.cfg.additive / self.cwnd
            };
        } else if self
            .last_decrease
            .is_none_or(|t| now.saturating_duration_since(t) >= srtt)
        {
            let excess = (rtt - target).as_secs_f64() / rtt.as_secs_f64();
            let factor = (1.0 - self.cfg.gain * excess).max(1.0 - self.cfg.max_decrease);
            self.cwnd *= factor;
            self.slow_start = false;
            self.last_decrease = Some(now);
            self.decreases += 1;
        }
        self.cwnd = self.cwnd.clamp(1.0, f64::from(slots.max(1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn doubles_per_round_trip_until_the_first_cut_then_grows_by_one() {
        let mut w = WindowControl::new(WindowConfig {
            initial: 10.0,
            slow_start_gain: 1.0,
            ..WindowConfig::default()
        });
        let now = Instant::ZERO;
        // Slow start: a round trip's worth of results doubles the window.
        for _ in 0..10 {
            w.on_rtt(now, us(20), us(20), 512);
        }
        assert_eq!(w.cwnd(), 20.0);
        // One result above the target: cut (excess 20/50, by 32%), slow start over.
        w.on_rtt(now, us(50), us(20), 512);
        let mut w = WindowControl { cwnd: 10.0, ..w };
        // One round trip's worth of results at the base delay: about one packet more.
        for _ in 0..10 {
            w.on_rtt(now, us(20), us(20), 512);
        }
        assert!((w.cwnd() - 11.0).abs() < 0.05, "{}", w.cwnd());
        assert_eq!(w.allowed(512), 10);
        assert_eq!(w.allowed(4), 4);
    }

    #[test]
    fn cuts_in_proportion_to_the_excess_once_per_round_trip() {
        let mut w = WindowControl::new(WindowConfig {
            initial: 100.0,
            ..WindowConfig::default()
        });
        let t0 = Instant::ZERO;
        w.on_rtt(t0, us(20), us(20), 512);
        // 40 µs against a target of 30: excess 10/40, cut by 0.8 * 0.25 = 20%.
        let before = w.cwnd();
        w.on_rtt(t0 + us(1), us(40), us(30), 512);
        assert!((w.cwnd() - before * 0.8).abs() < 1e-9, "{}", w.cwnd());
        // Within the same round trip: no second cut.
        let after = w.cwnd();
        w.on_rtt(t0 + us(10), us(40), us(30), 512);
        assert_eq!(w.cwnd(), after);
        // A round trip later, a far larger delay cuts by half at most.
        w.on_rtt(t0 + us(40), us(1000), us(30), 512);
        assert!((w.cwnd() - after * 0.5).abs() < 1e-9);
        assert_eq!(w.decreases, 2);
        // Never below one packet.
        for k in 0..50 {
            w.on_rtt(t0 + us(100 + 100 * k), us(1000), us(30), 512);
        }
        assert_eq!(w.cwnd(), 1.0);
    }

    #[test]
    fn two_windows_on_one_queue_converge_to_equal_shares() {
        // A toy link of capacity C packets per round trip with a base delay of 20 µs: the
        // queueing delay grows with the packets in flight beyond C. Two windows that know the
        // base round trip, one starting at 8 and one at 400 (a standing queue of 3 round
        // trips), end with equal shares and a short queue.
        let (c, base) = (100.0, 20.0);
        let cfg = WindowConfig {
            base_rtt: Some(us(20)),
            ..WindowConfig::default()
        };
        let mut a = WindowControl::new(WindowConfig {
            initial: 8.0,
            ..cfg
        });
        let mut b = WindowControl::new(WindowConfig {
            initial: 400.0,
            ..cfg
        });
        let mut now = Instant::ZERO;
        for _ in 0..3000 {
            let flight = a.cwnd() + b.cwnd();
            let rtt = base * (flight / c).max(1.0);
            let d = Duration::from_secs_f64(rtt * 1e-6);
            // Each window's packets come back over the round trip, interleaved.
            let (na, nb) = (a.cwnd() as usize, b.cwnd() as usize);
            for k in 0..na.max(nb) {
                let at = now + d.mul_f64(k as f64 / na.max(nb) as f64);
                if k < na {
                    a.on_rtt(at, d, d, 1024);
                }
                if k < nb {
                    b.on_rtt(at, d, d, 1024);
                }
            }
            now = now + d;
        }
        let (x, y) = (a.cwnd(), b.cwnd());
        let jain = (x + y).powi(2) / (2.0 * (x * x + y * y));
        assert!(jain > 0.99, "windows {x:.1} and {y:.1}");
        assert!(
            x + y < c * 1.6,
            "the queue stays short: {:.1} in flight",
            x + y
        );
    }
}
