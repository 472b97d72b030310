//! Property tests of the slot allocator: random arrivals, departures and resizes under each
//! policy; the layouts never overlap, never leak, respect every job's bounds, and the fair
//! share holds its bound; the change plans never give a slot to two jobs on the way.

use ina_proto::alloc::{self, Demand, JobId, Policy, Range, Step, BLOCK};
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
enum Event {
    Arrive { want: u16, min: u16, priority: u8 },
    Depart(usize),
    Resize(usize, u16, u16),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => (1u16..=8, 1u16..=8, 0u8..3).prop_map(|(a, b, priority)| Event::Arrive {
            want: a.max(b) * BLOCK,
            min: a.min(b) * BLOCK,
            priority
        }),
        1 => any::<usize>().prop_map(Event::Depart),
        1 => (any::<usize>(), 1u16..=8, 1u16..=8)
            .prop_map(|(i, a, b)| Event::Resize(i, a.max(b) * BLOCK, a.min(b) * BLOCK)),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::FirstFit),
        Just(Policy::FairShare),
        Just(Policy::Priority)
    ]
}

/// Applies `steps` to `from`, checking after each that no two jobs share a slot.
fn apply(capacity: u16, from: &BTreeMap<JobId, Range>, steps: &[Step]) -> BTreeMap<JobId, Range> {
    let mut now = from.clone();
    for s in steps {
        match *s {
            Step::Remove(j) => {
                now.remove(&j);
            }
            Step::Set(j, r) => {
                now.insert(j, r);
            }
        }
        assert!(
            alloc::is_sound(capacity, &now),
            "overlap after {s:?}: {now:?}"
        );
    }
    now
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn layouts_are_sound_fair_and_leak_free(
        policy in policy(),
        blocks in 1u16..=16,
        events in proptest::collection::vec(event(), 1..40),
    ) {
        let capacity = blocks * BLOCK + 17; // a ragged pool: only whole blocks are used
        let mut demands: Vec<Demand> = Vec::new();
        let mut current: BTreeMap<JobId, Range> = BTreeMap::new();
        let mut next_job: JobId = 1;
        for (t, e) in events.into_iter().enumerate() {
            match e {
                Event::Arrive { want, min, priority } => {
                    demands.push(Demand { job: next_job, want, min, priority, arrival: t as u64 });
                    next_job += 1;
                }
                Event::Depart(i) if !demands.is_empty() => {
                    demands.remove(i % demands.len());
                }
                Event::Resize(i, want, min) if !demands.is_empty() => {
                    let n = demands.len();
                    let d = &mut demands[i % n];
                    d.want = want;
                    d.min = min;
                }
                _ => {}
            }
            let l = alloc::layout(policy, capacity, &demands, &current);
            // Sound: no overlap, inside the pool, on blocks.
            prop_assert!(alloc::is_sound(capacity, &l.placed));
            // No leak: every demand is placed or queued, once; nothing else is placed.
            for d in &demands {
                let placed = l.placed.contains_key(&d.job);
                let queued = l.queued.iter().filter(|j| **j == d.job).count();
                prop_assert!(placed as usize + queued == 1, "job {} placed {placed} queued {queued}", d.job);
            }
            prop_assert_eq!(l.placed.len() + l.queued.len(), demands.len());
            // Bounds: between the minimum and the window.
            for d in &demands {
                if let Some(r) = l.placed.get(&d.job) {
                    prop_assert!(r.count >= d.min && r.count <= d.want);
                }
            }
            let used: u32 = l.placed.values().map(|r| u32::from(r.count)).sum();
            let pool = u32::from(alloc::usable(capacity));
            if policy != Policy::FirstFit {
                // Work-conserving: a job short of its window means the pool is full.
                let short = demands.iter().any(|d| l.placed.get(&d.job).is_some_and(|r| r.count < d.want));
                prop_assert!(!short || pool - used < u32::from(BLOCK));
            }
            if policy == Policy::FairShare {
                // Max-min: a job short of its window has at most one block less than any other,
                // unless the other's minimum holds it higher.
                for a in &demands {
                    let Some(ra) = l.placed.get(&a.job) else { continue };
                    if ra.count >= a.want { continue; }
                    for b in &demands {
                        let Some(rb) = l.placed.get(&b.job) else { continue };
                        prop_assert!(rb.count <= (ra.count + BLOCK).max(b.min),
                            "job {} has {} while job {} short of its window has {}", b.job, rb.count, a.job, ra.count);
                    }
                }
                // Admission in arrival order: a queued job's minimum did not fit after the
                // minimums of the jobs that came before it.
                for q in l.queued.iter().filter_map(|j| demands.iter().find(|d| d.job == *j)) {
                    let before: u32 = demands.iter()
                        .filter(|d| d.arrival < q.arrival && l.placed.contains_key(&d.job))
                        .map(|d| u32::from(d.min)).sum();
                    prop_assert!(before + u32::from(q.min) > pool || alloc::check(q, capacity).is_err());
                }
            }
            // The plan from the present layout to the new one never overlaps on the way.
            let steps = alloc::plan(&current, &l.placed);
            let reached = apply(capacity, &current, &steps);
            prop_assert_eq!(&reached, &l.placed);
            current = l.placed;
        }
    }

    #[test]
    fn plans_between_any_sound_layouts_never_overlap(
        old in proptest::collection::btree_map(1u16..8, 0u16..8, 0..6),
        new in proptest::collection::btree_map(1u16..8, 0u16..8, 0..6),
    ) {
        // Block-sized ranges at distinct positions: keep the first job per position.
        let dedup = |m: BTreeMap<u16, u16>| {
            let mut seen = std::collections::BTreeSet::new();
            m.into_iter()
                .filter(|(_, p)| seen.insert(*p))
                .map(|(j, p)| (j, Range { base: p * BLOCK, count: BLOCK }))
                .collect::<BTreeMap<_, _>>()
        };
        let (old, new) = (dedup(old), dedup(new));
        let steps = alloc::plan(&old, &new);
        let reached = apply(8 * BLOCK, &old, &steps);
        prop_assert_eq!(reached, new);
    }
}
