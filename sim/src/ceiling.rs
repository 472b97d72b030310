//! The ceiling of loss recovery by repair: the goodput a protocol that repairs lost packets
//! can at best expect on a given topology and loss, estimated in closed form for the sending
//! and by a seeded Monte Carlo for the stream's end.
//!
//! The model grants a protocol everything but causality:
//! - every lost packet is found the moment it was due, with no timer, Query or report;
//! - its repair costs exactly its own hop's round trip (the news of the loss goes back over the
//!   hop, the copy comes forward again) and is never lost itself;
//! - no byte is spent on anything but data, and the workers' links stay busy: the repairs of a
//!   worker's lost data lengthen its sending by `p / (1 − p)` of the data's wire time.
//!
//! A use (one packet position of every worker) crosses four hops in a tree: each worker's
//! data to its rack switch, the rack's partial up, the total down to each rack, and the result
//! to each worker; on one switch, the first and the last. A hop that loses any of the use's
//! packets delays whatever waits for it by that hop's round trip: a rack's partial waits for
//! its slowest worker, the total for the slowest partial, and each worker for its rack's total
//! and its own copy. The stream's end is the latest of its last uses, each sent a packet time
//! after the one before; only the uses sent within the longest possible delay of the last can
//! set it, so those are all the model draws.
//!
//! With 1024 workers at 1% loss, almost every use loses some worker's data and some worker's
//! result: the end waits for two round trips of the workers' hop over lossless whatever the
//! protocol does, and that, not the repairs' bytes, is what sets the ceiling.
//!
//! What it does not model: redundancy sent before any loss (copies, codes), which buys back
//! some of the end with bytes. It is an estimate of an expectation, not a bound on every run:
//! a seed that loses less than its share can beat it.

use crate::rng::Rng;
use std::time::Duration;

/// The most random draws one estimate makes (a fifth of a second): with a round trip of
/// many packet times, fewer trials are drawn than asked for.
const DRAW_BUDGET: u64 = 20_000_000;

/// The topology, loss and stream whose ceiling is asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct CeilingModel {
    /// Workers in the job.
    pub workers: u32,
    /// Two levels: racks of this many workers (the last one takes what is left) under rack
    /// switches and one upper switch. `None`: every worker on one switch.
    pub rack_size: Option<u32>,
    /// Loss per packet and direction on the workers' links.
    pub loss: f64,
    /// Loss per packet and direction on the links between the levels.
    pub uplink_loss: f64,
    /// A worker link's round trip: what a repair over it costs.
    pub round_trip: Duration,
    /// A round trip between the levels.
    pub uplink_round_trip: Duration,
    /// One data packet's time on a worker's link (its bytes and framing at the link's rate).
    pub packet_time: Duration,
    /// Data packets each worker sends (one per use).
    pub packets: u64,
}

/// What the model gives: the stream's time beyond lossless and the fraction of lossless
/// goodput it leaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ceiling {
    /// The repairs' share of the sending: the data's wire time times `p / (1 − p)`.
    pub sending: Duration,
    /// The mean delay of the stream's end over the trials.
    pub end_mean: Duration,
    /// The least delay of the end among the trials.
    pub end_min: Duration,
    /// The most delay of the end among the trials.
    pub end_max: Duration,
    /// `lossless / (lossless + sending + end_mean)`: the best fraction of lossless goodput.
    pub fraction: f64,
}

/// Why a ceiling cannot be estimated.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CeilingError {
    #[error("loss must be in [0, 1), not {0}")]
    Loss(f64),
    #[error("a ceiling needs at least one worker, one packet and one trial")]
    Empty,
    #[error("the lossless time must be more than zero")]
    NoLossless,
}

impl CeilingModel {
    /// The ceiling for a stream that takes `lossless` without loss, from `trials` draws of
    /// its end seeded by `seed` (the same arguments give the same answer). About
    /// [`DRAW_BUDGET`] random draws are made at most: where the uses that can set the end are
    /// many (a round trip of hundreds of thousands of packet times), fewer trials are, and
    /// beyond a trial's share of the budget the earliest of those uses are left out.
    pub fn estimate(
        &self,
        lossless: Duration,
        trials: u32,
        seed: u64,
    ) -> Result<Ceiling, CeilingError> {
        for p in [self.loss, self.uplink_loss] {
            if !(0.0..1.0).contains(&p) {
                return Err(CeilingError::Loss(p));
            }
        }
        if self.workers == 0 || self.rack_size == Some(0) || self.packets == 0 || trials == 0 {
            return Err(CeilingError::Empty);
        }
        if lossless.is_zero() {
            return Err(CeilingError::NoLossless);
        }
        let data_time = self.packet_time.as_secs_f64() * self.packets as f64;
        let sending = Duration::try_from_secs_f64(data_time * self.loss / (1.0 - self.loss))
            .unwrap_or(Duration::MAX);
        let (any_lost, uses) = (self.any_lost(), self.uses());
        let draws_per_trial = (2 * any_lost.len() as u64).saturating_mul(uses);
        let trials = trials.min(
            u32::try_from(DRAW_BUDGET / draws_per_trial)
                .unwrap_or(u32::MAX)
                .max(1),
        );
        let mut rng = Rng::new(seed);
        let (mut sum, mut min, mut max) = (0u128, Duration::MAX, Duration::ZERO);
        for _ in 0..trials {
            let end = self.draw_end(&mut rng, &any_lost, uses);
            sum += end.as_nanos();
            min = min.min(end);
            max = max.max(end);
        }
        let end_mean =
            Duration::from_nanos(u64::try_from(sum / u128::from(trials)).unwrap_or(u64::MAX));
        let with_loss = lossless.saturating_add(sending).saturating_add(end_mean);
        let fraction = lossless.as_secs_f64() / with_loss.as_secs_f64();
        Ok(Ceiling {
            sending,
            end_mean,
            end_min: min,
            end_max: max,
            fraction,
        })
    }

    /// The switches whose workers send: the racks, or the one switch.
    fn switches(&self) -> u32 {
        self.workers.div_ceil(self.per_switch())
    }

    fn per_switch(&self) -> u32 {
        self.rack_size.unwrap_or(self.workers).max(1)
    }

    /// The round trips a use can wait for at most: each hop's once.
    fn longest(&self) -> Duration {
        let hops = self.round_trip.saturating_mul(2);
        match self.rack_size {
            Some(_) => hops.saturating_add(self.uplink_round_trip.saturating_mul(2)),
            None => hops,
        }
    }

    /// One data packet's time, at least a nanosecond.
    fn packet(&self) -> Duration {
        self.packet_time.max(Duration::from_nanos(1))
    }

    /// The last uses that can set the stream's end: those sent less than the longest delay
    /// before the last one (at least the last one, and no more than one trial's share of
    /// [`DRAW_BUDGET`]).
    fn uses(&self) -> u64 {
        let uses = self.longest().as_nanos() / self.packet().as_nanos() + 1;
        let affordable = DRAW_BUDGET / (2 * u64::from(self.switches()));
        u64::try_from(uses)
            .unwrap_or(u64::MAX)
            .min(self.packets)
            .min(affordable)
            .max(1)
    }

    /// The chance that a switch's workers lose some packet of a use, for each switch: on the
    /// way up and, independently, on the way down.
    fn any_lost(&self) -> Vec<f64> {
        let per_switch = self.per_switch();
        (0..self.switches())
            .map(|s| {
                let workers = per_switch.min(self.workers - s * per_switch);
                1.0 - (1.0 - self.loss).powi(workers as i32)
            })
            .collect()
    }

    /// One draw of how much later than lossless the stream's last use reaches its last worker,
    /// for the switches' chances `any_lost` ([`Self::any_lost`]) and the last `uses`.
    fn draw_end(&self, rng: &mut Rng, any_lost: &[f64], uses: u64) -> Duration {
        let tree = self.rack_size.is_some();
        let hop = self.round_trip;
        let up_hop = if tree {
            self.uplink_round_trip
        } else {
            Duration::ZERO
        };
        let packet_ns = u64::try_from(self.packet().as_nanos()).unwrap_or(u64::MAX);
        let mut latest = Duration::ZERO;
        for back in 0..uses {
            // This use went out `back` packets before the last one.
            let head_start = Duration::from_nanos(packet_ns.saturating_mul(back));
            let mut total = Duration::ZERO;
            for &any_lost in any_lost {
                let mut partial = Duration::ZERO;
                if rng.chance(any_lost) {
                    partial = partial.saturating_add(hop);
                }
                if tree && rng.chance(self.uplink_loss) {
                    partial = partial.saturating_add(up_hop);
                }
                total = total.max(partial);
            }
            let mut last_worker = Duration::ZERO;
            for &any_lost in any_lost {
                let mut down = Duration::ZERO;
                if tree && rng.chance(self.uplink_loss) {
                    down = down.saturating_add(up_hop);
                }
                if rng.chance(any_lost) {
                    down = down.saturating_add(hop);
                }
                last_worker = last_worker.max(down);
            }
            latest = latest.max(total.saturating_add(last_worker).saturating_sub(head_start));
        }
        latest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `racks` of `per` workers, or `per` workers on one switch when `racks` is 0.
    fn model(racks: u32, per: u32, loss: f64) -> CeilingModel {
        CeilingModel {
            workers: racks.max(1) * per,
            rack_size: (racks > 0).then_some(per),
            loss,
            uplink_loss: loss,
            round_trip: Duration::from_micros(10),
            uplink_round_trip: Duration::from_micros(10),
            packet_time: Duration::from_nanos(83),
            packets: 16_384,
        }
    }

    const LOSSLESS: Duration = Duration::from_micros(1400);

    #[test]
    fn without_loss_the_ceiling_is_lossless() {
        let c = model(32, 32, 0.0).estimate(LOSSLESS, 50, 1).unwrap();
        assert_eq!(c.sending, Duration::ZERO);
        assert_eq!(c.end_max, Duration::ZERO);
        assert_eq!(c.fraction, 1.0);
    }

    #[test]
    fn one_worker_and_one_packet_lose_two_hops_worth_as_the_closed_form_says() {
        // One use on one switch: its end is late by a round trip for the data lost and one for
        // the result lost, each with chance p: 2 p round trips on average.
        let m = CeilingModel {
            packets: 1,
            ..model(0, 1, 0.2)
        };
        let c = m.estimate(LOSSLESS, 200_000, 7).unwrap();
        let mean_us = c.end_mean.as_secs_f64() * 1e6;
        assert!((mean_us - 4.0).abs() < 0.1, "mean end delay {mean_us} µs");
        assert_eq!(c.end_max, Duration::from_micros(20));
    }

    #[test]
    fn more_workers_and_more_levels_lower_the_ceiling() {
        let f = |racks, per| model(racks, per, 0.01).estimate(LOSSLESS, 400, 3).unwrap();
        let (n8, n32, r4x32, r32x32) = (f(0, 8), f(0, 32), f(4, 32), f(32, 32));
        assert!(n8.fraction > n32.fraction, "{n8:?} {n32:?}");
        assert!(n32.fraction > r4x32.fraction, "{n32:?} {r4x32:?}");
        assert!(r4x32.fraction > r32x32.fraction, "{r4x32:?} {r32x32:?}");
        // No end is later than every hop's round trip over the last use.
        assert!(r32x32.end_max <= Duration::from_micros(40));
    }

    #[test]
    fn a_last_rack_that_is_not_full_counts_only_its_workers() {
        // 33 workers in racks of 32: a full rack and a rack of one. Between the full tree of
        // two racks and one rack alone.
        let f = |workers, rack_size| {
            let m = CeilingModel {
                workers,
                rack_size: Some(rack_size),
                ..model(1, 1, 0.05)
            };
            m.estimate(LOSSLESS, 2000, 11).unwrap().end_mean
        };
        let (one_rack, partial, two_racks) = (f(32, 32), f(33, 32), f(64, 32));
        assert!(
            one_rack < partial && partial < two_racks,
            "{one_rack:?} {partial:?} {two_racks:?}"
        );
    }

    #[test]
    fn more_loss_lowers_the_ceiling() {
        let f = |p| model(4, 8, p).estimate(LOSSLESS, 400, 5).unwrap().fraction;
        assert!(f(0.001) > f(0.01));
        assert!(f(0.01) > f(0.1));
    }

    #[test]
    fn the_same_seed_gives_the_same_ceiling() {
        let m = model(4, 32, 0.01);
        assert_eq!(
            m.estimate(LOSSLESS, 100, 9).unwrap(),
            m.estimate(LOSSLESS, 100, 9).unwrap()
        );
    }

    #[test]
    fn bad_inputs_are_errors_not_panics() {
        let m = model(4, 8, 1.0);
        assert_eq!(m.estimate(LOSSLESS, 10, 1), Err(CeilingError::Loss(1.0)));
        let m = model(4, 8, -0.5);
        assert_eq!(m.estimate(LOSSLESS, 10, 1), Err(CeilingError::Loss(-0.5)));
        let m = model(4, 0, 0.01);
        assert_eq!(m.estimate(LOSSLESS, 10, 1), Err(CeilingError::Empty));
        let m = CeilingModel {
            rack_size: Some(0),
            ..model(4, 8, 0.01)
        };
        assert_eq!(m.estimate(LOSSLESS, 10, 1), Err(CeilingError::Empty));
        let m = model(4, 8, 0.01);
        assert_eq!(m.estimate(LOSSLESS, 0, 1), Err(CeilingError::Empty));
        assert_eq!(
            m.estimate(Duration::ZERO, 10, 1),
            Err(CeilingError::NoLossless)
        );
        let m = CeilingModel {
            packet_time: Duration::ZERO,
            ..model(4, 8, 0.01)
        };
        assert!(m.estimate(LOSSLESS, 10, 1).is_ok());
        // Times far beyond any network's neither overflow nor run for long: the trials are cut
        // to the draw budget.
        let m = CeilingModel {
            round_trip: Duration::MAX,
            uplink_round_trip: Duration::MAX,
            packet_time: Duration::from_nanos(1),
            packets: u64::MAX,
            ..model(32, 32, 0.5)
        };
        let c = m.estimate(Duration::MAX, 400, 1).unwrap();
        assert!(c.fraction > 0.0 && c.fraction <= 1.0, "{c:?}");
        let m = CeilingModel {
            packet_time: Duration::MAX,
            ..model(32, 32, 0.5)
        };
        let c = m.estimate(LOSSLESS, 10, 1).unwrap();
        assert!(c.fraction >= 0.0 && c.fraction < 1e-6, "{c:?}");
    }
}
