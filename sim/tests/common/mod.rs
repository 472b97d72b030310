//! Helpers shared by the simulation tests.
#![allow(dead_code)]

use ina_proto::quant;
use ina_sim::rng::Rng;
use ina_sim::{Data, Report, Scenario};

/// Seeds to run each property over; `INA_SIM_SEEDS` raises or lowers the count.
pub fn seeds(default: u64) -> impl Iterator<Item = u64> {
    let n = std::env::var("INA_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    let base = std::env::var("INA_SIM_SEED_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0u64);
    base..base + n
}

/// A float tensor with mixed magnitudes, zero blocks, negative zeros and subnormals.
pub fn float_tensor(rng: &mut Rng, len: usize) -> Vec<f32> {
    let scale = 2f32.powi(rng.below(40) as i32 - 20);
    let zero_run = rng.below(3) == 0;
    (0..len)
        .map(|i| {
            if zero_run && (i / 64) % 3 == 1 {
                return if i % 2 == 0 { 0.0 } else { -0.0 };
            }
            match rng.below(50) {
                0 => 0.0,
                1 => f32::from_bits(rng.next_u64() as u32 & 0x807f_ffff), // subnormal
                _ => (rng.unit() as f32 * 2.0 - 1.0) * scale * (1 + rng.below(8)) as f32,
            }
        })
        .collect()
}

/// Checks every worker of every job finished, got bit-identical results, and each float result
/// lies within the quantizer's bound of the f64 sum of `inputs` (per job, per worker, per tensor).
pub fn assert_correct(report: &Report, inputs: &[Vec<Vec<Data>>], elems: &[u16], seed: u64) {
    for (j, job) in report.jobs.iter().enumerate() {
        let n = job.workers.len();
        for (r, w) in job.workers.iter().enumerate() {
            match &w.outcome {
                Some(Ok(_)) => {}
                other => panic!("seed {seed}: job {} rank {r} ended with {other:?}", job.job),
            }
        }
        let first = &job.workers[0].tensors;
        for w in &job.workers[1..] {
            assert!(
                bit_identical(first, &w.tensors),
                "seed {seed}: job {} results differ between workers",
                job.job
            );
        }
        for (t, result) in first.iter().enumerate() {
            match result {
                Data::F32(out) => {
                    let ins: Vec<&Vec<f32>> = inputs[j]
                        .iter()
                        .map(|w| match &w[t] {
                            Data::F32(v) => v,
                            _ => panic!("mixed types"),
                        })
                        .collect();
                    let e = usize::from(elems[j]);
                    for (i, got) in out.iter().enumerate() {
                        let b = i / e;
                        let range = b * e..((b + 1) * e).min(out.len());
                        let exp = ins
                            .iter()
                            .map(|v| quant::block_exponent(&v[range.clone()]))
                            .max()
                            .unwrap_or(0);
                        let exact: f64 = ins.iter().map(|v| f64::from(v[i])).sum();
                        let bound = quant::error_bound(n as u16, exp, exact);
                        assert!(
                            (f64::from(*got) - exact).abs() <= bound,
                            "seed {seed}: job {} tensor {t} element {i}: got {got}, exact {exact}, bound {bound}",
                            job.job
                        );
                    }
                }
                Data::I32(out) => {
                    for (i, got) in out.iter().enumerate() {
                        let exact = inputs[j].iter().fold(0i32, |acc, w| match &w[t] {
                            Data::I32(v) => acc.wrapping_add(v[i]),
                            _ => panic!("mixed types"),
                        });
                        assert_eq!(*got, exact, "seed {seed}: job {} int element {i}", job.job);
                    }
                }
                Data::Generated(g) => {
                    // Checked against the exact sums as the results came (rank 0 of the job).
                    assert_eq!(
                        (g.violations, g.received),
                        (0, g.len as u64),
                        "seed {seed}: job {} tensor {t}: {g:?}",
                        job.job
                    );
                }
                Data::Sparse(s) => {
                    let g = s.values.inner();
                    assert_eq!(
                        (g.violations, g.received),
                        (0, g.len as u64),
                        "seed {seed}: job {} sparse tensor {t}: {g:?}",
                        job.job
                    );
                }
            }
        }
    }
}

pub fn bit_identical(a: &[Data], b: &[Data]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Data::F32(x), Data::F32(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
            }
            (Data::I32(x), Data::I32(y)) => x == y,
            (Data::Generated(x), Data::Generated(y)) => {
                x.fingerprint == y.fingerprint && x.received == y.received
            }
            _ => false,
        })
}

/// The same scenario on perfect links: the reference results.
pub fn lossless(s: &Scenario) -> Report {
    let mut clean = s.clone();
    clean.link = ina_sim::LinkConfig::default();
    for j in &mut clean.jobs {
        for w in &mut j.workers {
            w.link = None;
        }
    }
    ina_sim::run(&clean)
}
