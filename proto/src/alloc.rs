//! Slot pools: which job holds which slots of one switch, under a policy, and the order of
//! the data-plane changes that take a switch from one layout to the next without ever giving
//! a slot to two jobs. Pure functions of their inputs: no I/O, no clock.
//!
//! Slots are handed out in whole blocks of [`BLOCK`] (the switch's gap register keeps one cell
//! per block and rank, and a lane must cover whole blocks to use it; PROTOCOL.md §5).

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The unit of allocation, in slots.
pub const BLOCK: u16 = 64;

/// The data plane's job number.
pub type JobId = u16;

/// How a switch's pool is shared when jobs want more than it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Policy {
    /// Jobs keep the range they got; a new job takes the first hole that fits its window (or
    /// failing that the largest hole of at least its minimum), else it queues.
    FirstFit,
    /// Max-min fair: jobs are admitted in arrival order while their minimums fit, and the pool
    /// is filled one block at a time to the job holding the fewest slots that wants more.
    /// Running jobs shrink and grow as others come and go.
    #[default]
    FairShare,
    /// Strict priority: jobs get their minimum, then their window, highest priority first
    /// (arrival order among equals); a job that no longer gets its minimum is preempted and
    /// queues until slots free up.
    Priority,
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::FirstFit => "first-fit",
            Policy::FairShare => "fair-share",
            Policy::Priority => "priority",
        })
    }
}

/// A contiguous range of slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Range {
    pub base: u16,
    pub count: u16,
}

impl Range {
    /// One past the last slot.
    pub fn end(&self) -> u32 {
        u32::from(self.base) + u32::from(self.count)
    }

    /// Whether the two ranges share a slot.
    pub fn overlaps(&self, other: &Range) -> bool {
        u32::from(self.base) < other.end() && u32::from(other.base) < self.end()
    }

    /// Whether `other` lies inside this range.
    pub fn contains(&self, other: &Range) -> bool {
        self.base <= other.base && other.end() <= self.end()
    }
}

/// What one job asks of its switch's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Demand {
    pub job: JobId,
    /// Slots it wants (its window: a few bandwidth-delay products), whole blocks.
    pub want: u16,
    /// Slots it can run with, whole blocks, at most `want`.
    pub min: u16,
    /// Higher first under [`Policy::Priority`].
    pub priority: u8,
    /// Arrival order: lower came first.
    pub arrival: u64,
}

/// Why a demand cannot be placed on a switch at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DemandError {
    #[error("job {job}: a window of {want} slots with a minimum of {min}: both must be whole blocks of {BLOCK} slots, at least one block, and the minimum at most the window")]
    Shape { job: JobId, want: u16, min: u16 },
    #[error("job {job}: a minimum of {min} slots is more than the switch's pool of {pool}")]
    TooLarge { job: JobId, min: u16, pool: u16 },
}

/// Checks that `d` has a shape the allocator can place on a pool of `capacity` slots.
pub fn check(d: &Demand, capacity: u16) -> Result<(), DemandError> {
    let whole = |n: u16| n > 0 && n.is_multiple_of(BLOCK);
    if !whole(d.want) || !whole(d.min) || d.min > d.want {
        return Err(DemandError::Shape {
            job: d.job,
            want: d.want,
            min: d.min,
        });
    }
    let pool = usable(capacity);
    if d.min > pool {
        return Err(DemandError::TooLarge {
            job: d.job,
            min: d.min,
            pool,
        });
    }
    Ok(())
}

/// The window a job needs on links of `gbps` with a round trip of `rtt_us` microseconds:
/// twelve bandwidth-delay products of `elems_per_packet`-element frames, in whole blocks (at
/// most 60 000 slots). Lossless, two would keep the link busy; under loss a use of a slot lasts
/// as long as its repairs, and twelve is where the simulator's goodput stops growing at 1% and
/// 20% loss (docs/experiments/2026-11-loss-recovery-and-scale.md).
pub fn window_for(gbps: f64, rtt_us: f64, elems_per_packet: u16) -> u16 {
    window_of_bdps(12.0, gbps, rtt_us, elems_per_packet)
}

/// `bdps` bandwidth-delay products of `elems_per_packet`-element frames on links of `gbps`
/// with a round trip of `rtt_us` microseconds, in whole blocks (one at least, at most 60 000
/// slots).
pub fn window_of_bdps(bdps: f64, gbps: f64, rtt_us: f64, elems_per_packet: u16) -> u16 {
    let frame_bytes = 4 * usize::from(elems_per_packet)
        + ina_wire::HEADER_LEN
        + ina_wire::frame::FRAME_HEADER_LEN;
    let bdp = gbps.max(0.0) * 1e9 * rtt_us.max(0.0) * 1e-6 / (8.0 * frame_bytes as f64);
    let block = f64::from(BLOCK);
    let blocks = (bdps.max(0.0) * bdp / block)
        .ceil()
        .clamp(1.0, f64::from(60_000 / BLOCK));
    (blocks * block) as u16
}

/// The slots of a pool of `capacity` that whole blocks cover.
pub fn usable(capacity: u16) -> u16 {
    capacity - capacity % BLOCK
}

/// One switch's pool after the policy has run: every placed job's range, and the jobs that wait.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    pub placed: BTreeMap<JobId, Range>,
    /// Waiting for slots, in the order they will be considered.
    pub queued: Vec<JobId>,
}

/// Lays out a switch's pool of `capacity` slots for `demands` under `policy`. `current` is the
/// present layout (first fit never moves a job; the other policies pack the placed jobs in
/// arrival order from slot 0, so a job moves only when one that came before it changes size).
/// Demands that fail [`check`] are queued.
pub fn layout(
    policy: Policy,
    capacity: u16,
    demands: &[Demand],
    current: &BTreeMap<JobId, Range>,
) -> Layout {
    let pool = usable(capacity);
    let mut valid: Vec<Demand> = Vec::with_capacity(demands.len());
    let mut out = Layout::default();
    for d in demands {
        if check(d, capacity).is_ok() {
            valid.push(*d);
        } else {
            out.queued.push(d.job);
        }
    }
    valid.sort_by_key(|d| (d.arrival, d.job));
    match policy {
        Policy::FirstFit => first_fit(pool, &valid, current, &mut out),
        Policy::FairShare => {
            let sizes = fair_sizes(pool, &valid, &mut out.queued);
            pack(&valid, &sizes, &mut out);
        }
        Policy::Priority => {
            let sizes = priority_sizes(pool, &valid, &mut out.queued);
            pack(&valid, &sizes, &mut out);
        }
    }
    out
}

fn first_fit(pool: u16, demands: &[Demand], current: &BTreeMap<JobId, Range>, out: &mut Layout) {
    // Jobs that hold a valid range keep it.
    for d in demands {
        if let Some(r) = current.get(&d.job) {
            let fits = r.count >= d.min && r.count <= d.want && r.end() <= u32::from(pool);
            let free = out.placed.values().all(|o| !o.overlaps(r));
            if fits && free && r.base.is_multiple_of(BLOCK) {
                out.placed.insert(d.job, *r);
            }
        }
    }
    for d in demands {
        if out.placed.contains_key(&d.job) {
            continue;
        }
        let holes = holes(pool, out.placed.values());
        let first = holes.iter().find(|h| h.count >= d.want);
        let largest = holes
            .iter()
            .filter(|h| h.count >= d.min)
            .max_by_key(|h| (h.count, std::cmp::Reverse(h.base)));
        match first.or(largest) {
            Some(h) => {
                out.placed.insert(
                    d.job,
                    Range {
                        base: h.base,
                        count: h.count.min(d.want),
                    },
                );
            }
            None => out.queued.push(d.job),
        }
    }
}

/// The free ranges of a pool, lowest first.
fn holes<'a>(pool: u16, placed: impl Iterator<Item = &'a Range>) -> Vec<Range> {
    let mut taken: Vec<Range> = placed.copied().collect();
    taken.sort_by_key(|r| r.base);
    let mut out = Vec::new();
    let mut at = 0u32;
    for r in taken {
        if u32::from(r.base) > at {
            out.push(Range {
                base: at as u16,
                count: (u32::from(r.base) - at) as u16,
            });
        }
        at = at.max(r.end());
    }
    if at < u32::from(pool) {
        out.push(Range {
            base: at as u16,
            count: (u32::from(pool) - at) as u16,
        });
    }
    out
}

/// Max-min fair sizes, in the order of `demands` (0: queued).
fn fair_sizes(pool: u16, demands: &[Demand], queued: &mut Vec<JobId>) -> Vec<u16> {
    let mut sizes = vec![0u16; demands.len()];
    let mut left = pool;
    for (i, d) in demands.iter().enumerate() {
        if d.min <= left {
            sizes[i] = d.min;
            left -= d.min;
        } else {
            queued.push(d.job);
        }
    }
    // One block at a time to the admitted job with the fewest slots that wants more.
    while left >= BLOCK {
        let next = demands
            .iter()
            .enumerate()
            .filter(|(i, d)| sizes[*i] > 0 && sizes[*i] < d.want)
            .min_by_key(|(i, _)| (sizes[*i], *i));
        let Some((i, _)) = next else { break };
        sizes[i] += BLOCK;
        left -= BLOCK;
    }
    sizes
}

/// Strict-priority sizes, in the order of `demands` (0: queued or preempted).
fn priority_sizes(pool: u16, demands: &[Demand], queued: &mut Vec<JobId>) -> Vec<u16> {
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(demands[i].priority), i));
    let mut sizes = vec![0u16; demands.len()];
    let mut left = pool;
    for &i in &order {
        if demands[i].min <= left {
            sizes[i] = demands[i].min;
            left -= demands[i].min;
        } else {
            queued.push(demands[i].job);
        }
    }
    for &i in &order {
        if sizes[i] > 0 {
            let more = (demands[i].want - sizes[i]).min(left);
            sizes[i] += more;
            left -= more;
        }
    }
    sizes
}

/// Places the jobs with a size one after another from slot 0, in the order of `demands`.
fn pack(demands: &[Demand], sizes: &[u16], out: &mut Layout) {
    let mut at = 0u16;
    for (d, &n) in demands.iter().zip(sizes) {
        if n > 0 {
            out.placed.insert(d.job, Range { base: at, count: n });
            at += n;
        }
    }
}

/// One change to a switch's data plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub enum Step {
    /// The job stops holding slots (removed, preempted, or cleared to let another move).
    Remove(JobId),
    /// The job holds `Range` from now on (installed, shrunk, grown or moved).
    Set(JobId, Range),
}

/// The order of changes that takes a switch from `old` to `new`, such that after every step
/// no two jobs hold a slot in common: removals and shrinks inside the old range first, then
/// every job whose new range is free of the others' present ranges, as long as one is; a
/// cycle of moves (possible only between layouts of different policies) is broken by removing
/// one of its jobs first.
pub fn plan(old: &BTreeMap<JobId, Range>, new: &BTreeMap<JobId, Range>) -> Vec<Step> {
    let mut now = old.clone();
    let mut steps = Vec::new();
    for job in old.keys() {
        if !new.contains_key(job) {
            now.remove(job);
            steps.push(Step::Remove(*job));
        }
    }
    for (job, r) in new {
        if let Some(o) = now.get(job) {
            if o != r && o.contains(r) {
                now.insert(*job, *r);
                steps.push(Step::Set(*job, *r));
            }
        }
    }
    let mut todo: Vec<(JobId, Range)> = new
        .iter()
        .filter(|(job, r)| now.get(job) != Some(r))
        .map(|(j, r)| (*j, *r))
        .collect();
    while !todo.is_empty() {
        let free = todo
            .iter()
            .position(|(job, r)| now.iter().all(|(other, o)| other == job || !o.overlaps(r)));
        match free {
            Some(i) => {
                let (job, r) = todo.remove(i);
                now.insert(job, r);
                steps.push(Step::Set(job, r));
            }
            None => {
                // Every pending job's target overlaps another's present range: clear the
                // present range of a pending job that holds one, so that the others can move.
                // (If none holds one, the blockers are in place for good and `new` overlaps
                // itself: not a layout this module makes; stop rather than loop.)
                let Some(&(job, _)) = todo.iter().find(|(job, _)| now.contains_key(job)) else {
                    break;
                };
                now.remove(&job);
                steps.push(Step::Remove(job));
            }
        }
    }
    steps
}

/// Whether a layout is sound on a pool of `capacity`: no two ranges overlap, every range lies
/// inside the pool and starts on a block.
pub fn is_sound(capacity: u16, placed: &BTreeMap<JobId, Range>) -> bool {
    let pool = u32::from(usable(capacity));
    let ranges: Vec<&Range> = placed.values().collect();
    ranges
        .iter()
        .all(|r| r.count > 0 && r.end() <= pool && r.base.is_multiple_of(BLOCK))
        && ranges
            .iter()
            .enumerate()
            .all(|(i, a)| ranges[i + 1..].iter().all(|b| !a.overlaps(b)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn windows_are_twelve_round_trips_in_whole_blocks() {
        // 100 Gbit/s, 10 µs, 256 elements (1066-byte frames): 117 frames in flight, 12 of those
        // 1407, in blocks 1408 (ina sim's default on one switch).
        assert_eq!(super::window_for(100.0, 10.0, 256), 1408);
        assert_eq!(super::window_for(10.0, 10.0, 256), 192);
        assert_eq!(super::window_for(0.0, 10.0, 256), 64);
        assert_eq!(super::window_for(f64::NAN, 10.0, 256), 64);
        assert_eq!(super::window_for(400.0, 1000.0, 64), 59_968);
    }

    use super::*;

    fn d(job: JobId, want: u16, min: u16, priority: u8) -> Demand {
        Demand {
            job,
            want,
            min,
            priority,
            arrival: u64::from(job),
        }
    }

    #[test]
    fn first_fit_keeps_ranges_and_fills_holes() {
        let none = BTreeMap::new();
        let l = layout(
            Policy::FirstFit,
            512,
            &[d(1, 128, 64, 0), d(2, 256, 64, 0), d(3, 256, 128, 0)],
            &none,
        );
        assert_eq!(
            l.placed[&1],
            Range {
                base: 0,
                count: 128
            }
        );
        assert_eq!(
            l.placed[&2],
            Range {
                base: 128,
                count: 256
            }
        );
        // 128 left: job 3 runs with its minimum.
        assert_eq!(
            l.placed[&3],
            Range {
                base: 384,
                count: 128
            }
        );
        // Job 1 leaves; job 4 takes its hole, the others stay.
        let l2 = layout(
            Policy::FirstFit,
            512,
            &[d(2, 256, 64, 0), d(3, 256, 128, 0), d(4, 128, 128, 0)],
            &l.placed,
        );
        assert_eq!(l2.placed[&2], l.placed[&2]);
        assert_eq!(l2.placed[&3], l.placed[&3]);
        assert_eq!(
            l2.placed[&4],
            Range {
                base: 0,
                count: 128
            }
        );
        let l3 = layout(
            Policy::FirstFit,
            512,
            &[
                d(2, 256, 64, 0),
                d(3, 256, 128, 0),
                d(4, 128, 128, 0),
                d(5, 64, 64, 0),
            ],
            &l2.placed,
        );
        assert_eq!(l3.queued, vec![5]);
    }

    #[test]
    fn fair_share_splits_evenly_and_gives_back() {
        let none = BTreeMap::new();
        let l = layout(
            Policy::FairShare,
            1024,
            &[d(1, 1024, 64, 0), d(2, 1024, 64, 0), d(3, 128, 64, 0)],
            &none,
        );
        assert_eq!(l.placed[&3].count, 128);
        assert_eq!(l.placed[&1].count, 448);
        assert_eq!(l.placed[&2].count, 448);
        assert!(is_sound(1024, &l.placed));
        let l2 = layout(Policy::FairShare, 1024, &[d(1, 1024, 64, 0)], &l.placed);
        assert_eq!(
            l2.placed[&1],
            Range {
                base: 0,
                count: 1024
            }
        );
    }

    #[test]
    fn priority_preempts_the_lower_job() {
        let none = BTreeMap::new();
        let l = layout(
            Policy::Priority,
            512,
            &[d(1, 512, 384, 0), d(2, 256, 256, 5)],
            &none,
        );
        assert_eq!(l.queued, vec![1]);
        assert_eq!(l.placed[&2].count, 256);
        let l2 = layout(Policy::Priority, 512, &[d(1, 512, 384, 0)], &l.placed);
        assert_eq!(l2.placed[&1].count, 512);
    }

    #[test]
    fn bad_shapes_are_refused_and_queued() {
        assert!(check(&d(1, 100, 64, 0), 512).is_err());
        assert!(check(&d(1, 64, 128, 0), 512).is_err());
        assert!(check(&d(1, 0, 0, 0), 512).is_err());
        assert_eq!(
            check(&d(1, 1024, 1024, 0), 600),
            Err(DemandError::TooLarge {
                job: 1,
                min: 1024,
                pool: 576
            })
        );
        let l = layout(
            Policy::FairShare,
            512,
            &[d(1, 100, 64, 0)],
            &BTreeMap::new(),
        );
        assert_eq!(l.queued, vec![1]);
    }

    #[test]
    fn a_swap_of_places_is_broken_by_a_removal() {
        let a = Range { base: 0, count: 64 };
        let b = Range {
            base: 64,
            count: 64,
        };
        let old = BTreeMap::from([(1, a), (2, b)]);
        let new = BTreeMap::from([(1, b), (2, a)]);
        let steps = plan(&old, &new);
        assert_eq!(steps.first(), Some(&Step::Remove(1)));
        assert_eq!(steps.len(), 3);
    }
}
