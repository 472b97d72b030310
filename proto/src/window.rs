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
//!   shares 20-40% apart (`ina sim`, docs/experiments/2026-11-loss-recovery-and-scale.md, "Sharing an uplink"); growing by a quarter, none was lost.
//! * **Additive increase.** After that, a round whose smallest round trip is below the target
//!   adds `additive` packets.
//! * **Multiplicative decrease.** A round whose smallest round trip is above the target
//!   multiplies `cwnd` by `1 - gain * (rtt - target) / rtt`, never below `1 - max_decrease`:
//!   the further above the target, the larger the cut.
//!
//! A round is a smoothed round trip of results, and the window changes at its end, on the
//! round's smallest sample: a queue delays every packet, while a busy host delays some (a
//! worker or switch process that waited for a core), so the smallest sample sees the queue
//! and not the noise.
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
    /// When the current round began, and its smallest round trip and samples so far.
    round_start: Option<Instant>,
    round_min: Option<Duration>,
    round_samples: u64,
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
            round_start: None,
            round_min: None,
            round_samples: 0,
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
    /// trip `srtt` setting the length of a round; `slots` bounds the window.
    ///
    /// The window changes once per round, on the smallest round trip of the round: a queue
    /// delays every packet, while a host that was slow to run the worker (or the switch)
    /// delays some, so the smallest of a round's samples sees the queue and not the noise.
    pub fn on_rtt(&mut self, now: Instant, rtt: Duration, srtt: Duration, slots: u16) {
        let base = self.base.map_or(rtt, |b| b.min(rtt));
        self.base = Some(base);
        let start = *self.round_start.get_or_insert(now);
        if now.saturating_duration_since(start) >= srtt {
            // This sample begins the next round: the one before it ends here.
            if let Some(min) = self.round_min.take() {
                let samples = std::mem::take(&mut self.round_samples) as f64;
                self.end_round(base, min, samples, slots);
            }
            self.round_start = Some(now);
        }
        self.round_min = Some(self.round_min.map_or(rtt, |m| m.min(rtt)));
        self.round_samples += 1;
    }

    /// A round of `samples` results whose smallest round trip was `rtt`.
    fn end_round(&mut self, base: Duration, rtt: Duration, samples: f64, slots: u16) {
        let target = base + self.cfg.target_queueing;
        if self.slow_start && rtt > base + self.cfg.target_queueing / 2 {
            // The queue is building: stop growing fast before it reaches the target, since
            // the growth of the round in flight still arrives at the queue.
            self.slow_start = false;
        }
        if rtt <= target {
            self.cwnd += if self.slow_start {
                self.cfg.slow_start_gain * samples
            } else {
                self.cfg.additive
            };
        } else {
            let excess = (rtt - target).as_secs_f64() / rtt.as_secs_f64();
            let factor = (1.0 - self.cfg.gain * excess).max(1.0 - self.cfg.max_decrease);
            self.cwnd *= factor;
            self.slow_start = false;
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

    /// Feeds `n` samples of `rtt`, spread over one round of `srtt` from `*now` on.
    fn round(w: &mut WindowControl, now: &mut Instant, n: u64, rtt: Duration, srtt: Duration) {
        for k in 0..n {
            w.on_rtt(*now + srtt.mul_f64(k as f64 / n as f64), rtt, srtt, 512);
        }
        *now = *now + srtt;
    }

    #[test]
    fn grows_per_round_until_the_first_cut_then_by_one() {
        let mut w = WindowControl::new(WindowConfig {
            initial: 10.0,
            slow_start_gain: 1.0,
            ..WindowConfig::default()
        });
        let mut now = Instant::ZERO;
        // A round ends when the next one's first sample comes. Slow start: a round of 10
        // results below the target doubles the window.
        round(&mut w, &mut now, 10, us(20), us(20));
        round(&mut w, &mut now, 10, us(50), us(20));
        assert_eq!(w.cwnd(), 20.0);
        // A round above the target: cut (excess 20/50, by 32%), slow start over.
        round(&mut w, &mut now, 10, us(20), us(20));
        assert!((w.cwnd() - 20.0 * 0.68).abs() < 1e-9, "{}", w.cwnd());
        // Then one packet more per round below the target.
        round(&mut w, &mut now, 10, us(20), us(20));
        assert!(
            (w.cwnd() - (20.0 * 0.68 + 1.0)).abs() < 1e-9,
            "{}",
            w.cwnd()
        );
        assert_eq!(w.allowed(4), 4);
        assert_eq!(w.decreases, 1);
    }

    #[test]
    fn one_fast_sample_in_a_round_shows_there_is_no_queue() {
        // A round of samples a busy host delayed, but one that came back at the base round
        // trip: no queue, no cut.
        let mut w = WindowControl::new(WindowConfig {
            initial: 50.0,
            ..WindowConfig::default()
        });
        let mut now = Instant::ZERO;
        round(&mut w, &mut now, 1, us(20), us(20));
        for k in 0..50u64 {
            let rtt = if k == 7 { us(20) } else { us(200) };
            w.on_rtt(now + us(k * 20 / 50), rtt, us(20), 512);
        }
        now = now + us(20);
        round(&mut w, &mut now, 1, us(20), us(20));
        assert_eq!(w.decreases, 0, "{w:?}");
        assert!(w.cwnd() >= 50.0);
    }

    #[test]
    fn cuts_in_proportion_to_the_excess_at_most_by_half() {
        let mut w = WindowControl::new(WindowConfig {
            initial: 100.0,
            ..WindowConfig::default()
        });
        let mut now = Instant::ZERO;
        round(&mut w, &mut now, 1, us(20), us(30));
        round(&mut w, &mut now, 30, us(40), us(30));
        // (The first round, at the base round trip, added a quarter packet.)
        assert_eq!(w.cwnd(), 100.25);
        // The round at 40 µs against a target of 30: excess 10/40, cut by 0.8 * 0.25 = 20%.
        round(&mut w, &mut now, 30, us(1000), us(30));
        assert!((w.cwnd() - 100.25 * 0.8).abs() < 1e-9, "{}", w.cwnd());
        // A far larger delay cuts by half at most, and never below one packet.
        round(&mut w, &mut now, 1, us(1000), us(30));
        assert!((w.cwnd() - 100.25 * 0.4).abs() < 1e-9, "{}", w.cwnd());
        for _ in 0..50 {
            round(&mut w, &mut now, 3, us(1000), us(30));
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
