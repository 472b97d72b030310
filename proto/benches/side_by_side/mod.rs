//! Ratios of two loops timed in alternation, for the benchmarks' targets.
//!
//! Criterion times one case after the other, seconds apart; on a shared machine the load of
//! the other tenants changes in between, and the ratio of two cases moves with it. Here the two
//! loops run in alternation, one pass of each at a time, many times over, and the ratio is taken
//! of their fastest passes: the passes that ran undisturbed. The median of the per-pair ratios
//! is printed next to it.
//!
//! The pairs run for at least [`MIN_TIME`]: a virtual CPU shares its core with another
//! tenant's for tens of milliseconds at a time, which slows a loop bound by instruction
//! throughput (the pipeline) by up to half and a loop bound by memory bandwidth (memcpy) hardly
//! at all; a run shorter than that can hold no undisturbed pass of the first.
//!
//! The ratios run after criterion's groups, unless criterion was asked only to list or test the
//! benchmarks, or given a name filter that no ratio's name contains.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// How two loops compared.
#[derive(Debug, Clone, Copy)]
pub struct Ratio {
    /// The fastest pass of the baseline.
    pub base: Duration,
    /// The fastest pass of the measured loop.
    pub case: Duration,
    /// The median over the alternated pairs of `base / case`.
    pub median: f64,
}

impl Ratio {
    /// Throughput of the measured loop relative to the baseline's (higher is better): the
    /// ratio of the fastest passes.
    pub fn best(&self) -> f64 {
        self.base.as_secs_f64() / self.case.as_secs_f64()
    }
}

/// How long the alternated passes run at least.
pub const MIN_TIME: Duration = Duration::from_secs(3);

/// Times passes of `base` and of `case` in alternation (after a few untimed ones): `pairs` of
/// each, or more, until [`MIN_TIME`] has passed.
pub fn alternate(pairs: usize, mut base: impl FnMut(), mut case: impl FnMut()) -> Ratio {
    for _ in 0..pairs.div_ceil(10) {
        base();
        case();
    }
    let mut best_base = Duration::MAX;
    let mut best_case = Duration::MAX;
    let mut ratios = Vec::with_capacity(pairs);
    let start = Instant::now();
    let mut i = 0;
    while i < pairs || start.elapsed() < MIN_TIME {
        i += 1;
        // Which goes first alternates too, so that neither always finds the other's data in
        // the caches.
        let (b, c) = if i % 2 == 0 {
            let b = time(&mut base);
            (b, time(&mut case))
        } else {
            let c = time(&mut case);
            (time(&mut base), c)
        };
        best_base = best_base.min(b);
        best_case = best_case.min(c);
        ratios.push(b.as_secs_f64() / c.as_secs_f64().max(1e-12));
    }
    ratios.sort_by(f64::total_cmp);
    Ratio {
        base: best_base,
        case: best_case,
        median: ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN),
    }
}

fn time(f: &mut impl FnMut()) -> Duration {
    let t = Instant::now();
    f();
    black_box(t.elapsed())
}

/// Prints one ratio as a line of the report.
pub fn report(name: &str, base_name: &str, r: &Ratio) {
    println!(
        "ratio {name}: {:.2} x {base_name} (fastest passes {:.1} us vs {:.1} us; median of pairs {:.2})",
        r.best(),
        r.case.as_secs_f64() * 1e6,
        r.base.as_secs_f64() * 1e6,
        r.median,
    );
}

/// Whether the command line asks for the ratio `name`: not when criterion only lists or tests
/// the benchmarks or profiles one, nor when name filters were given and none matches.
pub fn wanted(name: &str) -> bool {
    // Criterion's options that take a value, whose values are not name filters.
    const WITH_VALUE: &[&str] = &[
        "--save-baseline",
        "--baseline",
        "--baseline-lenient",
        "--load-baseline",
        "--sample-size",
        "--warm-up-time",
        "--measurement-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--plotting-backend",
        "--output-format",
        "--color",
        "--format",
        "--logfile",
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args
        .iter()
        .any(|a| a == "--list" || a == "--test" || a == "--profile-time")
    {
        return false;
    }
    let mut filters = Vec::new();
    let mut skip_value = false;
    for a in &args {
        if skip_value {
            skip_value = false;
        } else if a.starts_with('-') {
            skip_value = WITH_VALUE.contains(&a.as_str());
        } else {
            filters.push(a.as_str());
        }
    }
    let line = format!("ratio {name}");
    filters.is_empty() || filters.iter().any(|f| line.contains(f))
}
