//! A cluster of jobs sharing one switch's slot pool over time: which job gets how many slots
//! under each sharing scheme, and the job completion times that follow. The controller's own
//! allocator ([`ina_proto::alloc`]) decides for its policies; the baselines are modelled here.
//!
//! The model is a fluid one, one level above the packet simulator: between two events (an
//! arrival, a completion) every job streams at a constant rate given by its slots. By Little's
//! law a job's rate is its window over its round trip, up to its link: `rate = link ×
//! min(1, slots / full)`, where `full` is the window that fills the link (a job asks for
//! that much, [`ClusterJob::window`]). Jobs without switch slots aggregate on a host at
//! [`ClusterConfig::host_gbps`] when the scheme falls back (ATP, the controller spilling to
//! hosts), or wait (the controller's other schemes, static partitions).

use crate::rng::Rng;
use ina_proto::alloc::{self, Demand, JobId, Policy, Range, BLOCK};
use std::collections::BTreeMap;

/// One job of the stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClusterJob {
    /// Seconds from the start.
    pub arrival: f64,
    /// Bits it all-reduces over its life, per worker link.
    pub bits: f64,
    /// Slots that fill its link (its window), whole blocks.
    pub window: u16,
    /// Slots it can run with, whole blocks.
    pub min: u16,
}

/// The shared resources.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClusterConfig {
    /// Slots of the switch's pool.
    pub pool: u16,
    /// Each job's link, Gbit/s.
    pub link_gbps: f64,
    /// Aggregation on a host (the fallback of best effort), Gbit/s per job.
    pub host_gbps: f64,
}

/// How the pool is shared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scheme {
    /// The controller with one of its policies (the job's priority is 0 for all).
    Controller(Policy),
    /// The controller's priority policy with Tiresias' least attained service: the fewer bits
    /// a job has moved, the higher its priority (in 2× steps from 1 Gbit on), so short jobs
    /// overtake long ones and a long job is preempted between its streams.
    LeastAttained,
    /// The controller's priority policy with Themis' finish-time fairness: the further a job's
    /// finish time would fall behind the time it would take alone (`ρ = (elapsed + remaining
    /// alone) / length alone`), the higher its priority (in steps of 1/16 of ρ), re-ranked at
    /// least every [`FAIRNESS_STEP`] seconds.
    FinishTimeFairness,
    /// The pool cut into this many equal partitions; a job takes a free one (first come,
    /// first served) or waits.
    StaticPartitions(u16),
    /// ATP-like best effort: every job hashes its window to a range of the pool; where ranges
    /// of running jobs overlap, the later arrival's packets go to a host aggregator instead.
    BestEffortHash,
    /// The controller with one of its policies, where a job the policy leaves without slots
    /// runs on a host aggregator (a software switch on a host, BytePS's spare capacity) at
    /// [`ClusterConfig::host_gbps`] instead of queueing, until the policy gives it slots.
    Spilling(Policy),
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scheme::Controller(p) => write!(f, "controller, {p}"),
            Scheme::LeastAttained => write!(f, "controller, least attained service"),
            Scheme::FinishTimeFairness => write!(f, "controller, finish-time fairness"),
            Scheme::StaticPartitions(n) => write!(f, "static partitions ({n})"),
            Scheme::BestEffortHash => write!(f, "best effort, hashed (ATP-like)"),
            Scheme::Spilling(p) => write!(f, "controller, {p}, spilling to hosts"),
        }
    }
}

/// How often finish-time fairness re-ranks the jobs, seconds.
pub const FAIRNESS_STEP: f64 = 0.5;

/// When each job finished.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterReport {
    /// Completion time of each job (finish − arrival), seconds, in the jobs' order.
    pub jct: Vec<f64>,
    /// The time the last job finished.
    pub makespan: f64,
}

impl ClusterReport {
    pub fn mean(&self) -> f64 {
        self.jct.iter().sum::<f64>() / self.jct.len().max(1) as f64
    }

    /// The `q` quantile (0..=1) of the completion times.
    pub fn quantile(&self, q: f64) -> f64 {
        let mut v = self.jct.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return 0.0;
        }
        let i = ((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        v[i]
    }
}

/// A stream of `n` jobs shaped like published cluster traces: many small jobs and a few
/// large ones (sizes log-uniform over four decades, so that a tenth of the jobs carries most
/// of the bits), Poisson arrivals at `load` times the rate the pool can serve at full
/// windows, windows of 1 to 8 blocks' worth of bandwidth-delay products.
pub fn workload(seed: u64, n: usize, load: f64, cfg: &ClusterConfig) -> Vec<ClusterJob> {
    let mut rng = Rng::new(seed);
    let link = cfg.link_gbps * 1e9;
    let mut jobs = Vec::with_capacity(n);
    let mut sizes = Vec::with_capacity(n);
    let mut windows = Vec::with_capacity(n);
    for _ in 0..n {
        // 0.1 s to 1000 s of streaming at full rate.
        let seconds = 10f64.powf(-1.0 + 4.0 * rng.unit());
        sizes.push(seconds * link);
        let blocks = 8u16 << (rng.below(3) as u16); // 512, 1024 or 2048 slots
        windows.push(blocks * BLOCK);
    }
    // Mean service demand in slot-seconds, against the pool's slots: the arrival rate that
    // keeps the pool `load` busy.
    let demand: f64 = sizes
        .iter()
        .zip(&windows)
        .map(|(b, w)| b / link * f64::from(*w))
        .sum::<f64>()
        / n as f64;
    let rate = load * f64::from(alloc::usable(cfg.pool)) / demand;
    let mut t = 0.0;
    for (bits, window) in sizes.into_iter().zip(windows) {
        t += -rng.unit().max(1e-12).ln() / rate;
        jobs.push(ClusterJob {
            arrival: t,
            bits,
            window,
            min: BLOCK,
        });
    }
    jobs
}

/// Runs the stream under `scheme`.
pub fn run(cfg: &ClusterConfig, jobs: &[ClusterJob], scheme: Scheme) -> ClusterReport {
    let link = cfg.link_gbps * 1e9;
    let n = jobs.len();
    let mut left: Vec<f64> = jobs.iter().map(|j| j.bits).collect();
    let mut done_at: Vec<Option<f64>> = vec![None; n];
    let mut arrived = 0usize;
    let mut placed: BTreeMap<JobId, Range> = BTreeMap::new();
    let mut partitions: BTreeMap<usize, u16> = BTreeMap::new(); // job -> partition
    let mut hashed: BTreeMap<usize, Range> = BTreeMap::new();
    let mut now = 0.0f64;
    let id = |i: usize| (i + 1) as JobId;
    loop {
        // Who runs, and at what rate.
        let active: Vec<usize> = (0..arrived).filter(|&i| done_at[i].is_none()).collect();
        let rates: Vec<(usize, f64)> = match scheme {
            Scheme::Controller(_)
            | Scheme::Spilling(_)
            | Scheme::LeastAttained
            | Scheme::FinishTimeFairness => {
                let policy = match scheme {
                    Scheme::Controller(p) | Scheme::Spilling(p) => p,
                    _ => Policy::Priority,
                };
                let host = match scheme {
                    Scheme::Spilling(_) => (cfg.host_gbps * 1e9).min(link),
                    _ => 0.0,
                };
                let demands: Vec<Demand> = active
                    .iter()
                    .map(|&i| Demand {
                        job: id(i),
                        want: jobs[i].window,
                        min: jobs[i].min,
                        priority: match scheme {
                            Scheme::LeastAttained => las_priority(jobs[i].bits - left[i]),
                            Scheme::FinishTimeFairness => {
                                let alone = jobs[i].bits / link;
                                let rho = (now - jobs[i].arrival + left[i] / link) / alone;
                                (rho * 16.0).clamp(0.0, 255.0) as u8
                            }
                            _ => 0,
                        },
                        arrival: i as u64,
                    })
                    .collect();
                // Spilling: while some job's slots would stream slower than a host aggregator,
                // the latest of those jobs goes to a host, and the policy lays the others out
                // again without it (their shares only grow).
                let mut demands = demands;
                let mut spilled: Vec<usize> = Vec::new();
                loop {
                    placed = alloc::layout(policy, cfg.pool, &demands, &placed).placed;
                    let slower = demands.iter().rposition(|d| {
                        let i = (d.job - 1) as usize;
                        let slots = placed.get(&d.job).map_or(0, |r| r.count);
                        link * slot_share(slots, jobs[i].window) < host
                    });
                    let Some(k) = slower else {
                        break;
                    };
                    let d = demands.remove(k);
                    spilled.push((d.job - 1) as usize);
                    placed.remove(&d.job);
                }
                active
                    .iter()
                    .map(|&i| {
                        if spilled.contains(&i) {
                            return (i, host);
                        }
                        let slots = placed.get(&id(i)).map_or(0, |r| r.count);
                        (i, link * slot_share(slots, jobs[i].window))
                    })
                    .collect()
            }
            Scheme::StaticPartitions(parts) => {
                let size = alloc::usable(cfg.pool) / parts.max(1) / BLOCK * BLOCK;
                partitions.retain(|i, _| done_at[*i].is_none());
                for &i in &active {
                    if partitions.contains_key(&i) {
                        continue;
                    }
                    let free = (0..parts).find(|p| !partitions.values().any(|q| q == p));
                    match free {
                        Some(p) => {
                            partitions.insert(i, p);
                        }
                        None => break, // first come, first served
                    }
                }
                active
                    .iter()
                    .map(|&i| {
                        let slots = if partitions.contains_key(&i) {
                            size.min(jobs[i].window)
                        } else {
                            0
                        };
                        (i, link * slot_share(slots, jobs[i].window))
                    })
                    .collect()
            }
            Scheme::BestEffortHash => {
                hashed.retain(|i, _| done_at[*i].is_none());
                let pool = alloc::usable(cfg.pool);
                for &i in &active {
                    hashed.entry(i).or_insert_with(|| {
                        let w = jobs[i].window.min(pool);
                        let span = u64::from(pool - w) / u64::from(BLOCK) + 1;
                        let h = splitmix(i as u64) % span;
                        Range {
                            base: (h as u16) * BLOCK,
                            count: w,
                        }
                    });
                }
                active
                    .iter()
                    .map(|&i| {
                        let r = hashed[&i];
                        // Slots an earlier running job holds are collisions: their share of
                        // the job's packets goes to the host.
                        let taken: u32 = (r.base..r.base + r.count)
                            .filter(|s| {
                                hashed
                                    .iter()
                                    .any(|(&j, o)| j < i && o.base <= *s && u32::from(*s) < o.end())
                            })
                            .count() as u32;
                        let c = f64::from(taken) / f64::from(r.count.max(1));
                        (i, (1.0 - c) * link + c * (cfg.host_gbps * 1e9).min(link))
                    })
                    .collect()
            }
        };
        // The next event: an arrival or a completion.
        let next_arrival = jobs.get(arrived).map(|j| j.arrival);
        let next_done = rates
            .iter()
            .filter(|(_, r)| *r > 0.0)
            .map(|&(i, r)| now + left[i] / r)
            .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.min(t))));
        // Least attained service re-ranks jobs as they move bits: step at least that often.
        let las_step = match scheme {
            Scheme::LeastAttained => rates
                .iter()
                .filter(|(_, r)| *r > 0.0)
                .map(|&(i, r)| {
                    let moved = jobs[i].bits - left[i];
                    let next = las_threshold(moved);
                    now + (next - moved).max(1.0) / r
                })
                .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.min(t)))),
            Scheme::FinishTimeFairness if !rates.is_empty() => Some(now + FAIRNESS_STEP),
            _ => None,
        };
        let t = [next_arrival, next_done, las_step]
            .into_iter()
            .flatten()
            .fold(f64::INFINITY, f64::min);
        if !t.is_finite() {
            break;
        }
        let dt = (t - now).max(0.0);
        for &(i, r) in &rates {
            // Done when its end falls at or before `t` (compared as times, not as bits left:
            // `now + left / r` may round to `now` late in a long run).
            if r > 0.0 && now + left[i] / r <= t {
                left[i] = 0.0;
                done_at[i] = Some(t);
                placed.remove(&id(i));
            } else {
                left[i] -= r * dt;
            }
        }
        now = t;
        if next_arrival.is_some_and(|a| a <= now) {
            arrived += 1;
        }
        if arrived == n && done_at.iter().all(Option::is_some) {
            break;
        }
    }
    let jct: Vec<f64> = jobs
        .iter()
        .zip(&done_at)
        .map(|(j, d)| d.unwrap_or(f64::INFINITY) - j.arrival)
        .collect();
    ClusterReport {
        makespan: done_at.iter().flatten().fold(0.0, |a: f64, b| a.max(*b)),
        jct,
    }
}

/// The share of its link a job fills with `slots` of the `window` that fills it.
fn slot_share(slots: u16, window: u16) -> f64 {
    (f64::from(slots) / f64::from(window.max(1))).min(1.0)
}

/// Tiresias' discretised attained service: priority 255 below 1 Gbit moved, one less for
/// every doubling beyond.
fn las_priority(moved_bits: f64) -> u8 {
    if moved_bits < 1e9 {
        return 255;
    }
    let steps = (moved_bits / 1e9).log2().floor() as i64 + 1;
    (255 - steps.clamp(0, 255)) as u8
}

/// The attained service at which a job's priority next drops.
fn las_threshold(moved_bits: f64) -> f64 {
    if moved_bits < 1e9 {
        return 1e9;
    }
    let steps = (moved_bits / 1e9).log2().floor() + 1.0;
    1e9 * 2f64.powf(steps)
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
