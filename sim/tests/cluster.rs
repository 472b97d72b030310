//! The slot-sharing model: completion times that can be computed by hand, and the orderings
//! between schemes that hold whatever the seed.

use ina_proto::alloc::Policy;
use ina_sim::cluster::{self, ClusterConfig, ClusterJob, Scheme};

const CFG: ClusterConfig = ClusterConfig {
    pool: 1024,
    link_gbps: 100.0,
    host_gbps: 25.0,
};

fn job(arrival: f64, seconds: f64, window: u16) -> ClusterJob {
    ClusterJob {
        arrival,
        bits: seconds * 100e9,
        window,
        min: 64,
    }
}

#[test]
fn a_lone_job_streams_at_its_link_rate() {
    for scheme in [
        Scheme::Controller(Policy::FairShare),
        Scheme::StaticPartitions(1),
        Scheme::BestEffortHash,
        Scheme::LeastAttained,
    ] {
        let r = cluster::run(&CFG, &[job(1.0, 10.0, 512)], scheme);
        assert!((r.jct[0] - 10.0).abs() < 1e-9, "{scheme}: {:?}", r.jct);
        assert!((r.makespan - 11.0).abs() < 1e-9);
    }
}

#[test]
fn schemes_share_the_pool_as_they_say() {
    // Two jobs that each want the whole pool, arriving together.
    let jobs = [job(0.0, 10.0, 1024), job(0.0, 10.0, 1024)];
    // Fair share: half the pool each, both at half rate: 20 s.
    let r = cluster::run(&CFG, &jobs, Scheme::Controller(Policy::FairShare));
    assert!(
        (r.jct[0] - 20.0).abs() < 1e-6 && (r.jct[1] - 20.0).abs() < 1e-6,
        "{r:?}"
    );
    // First fit: the first takes it all (10 s); the second runs with the minimum it found
    // nothing for and waits: 20 s.
    let r = cluster::run(&CFG, &jobs, Scheme::Controller(Policy::FirstFit));
    assert!(
        (r.jct[0] - 10.0).abs() < 1e-6 && (r.jct[1] - 20.0).abs() < 1e-6,
        "{r:?}"
    );
    // Best effort: the same hashed range, the second's packets all go to the host (25 Gbit/s)
    // until the first ends at 10 s, then at line rate: 10 + (1000 - 250) Gbit / 100 = 17.5 s.
    let r = cluster::run(&CFG, &jobs, Scheme::BestEffortHash);
    assert!((r.jct[0] - 10.0).abs() < 1e-6, "{r:?}");
    assert!((r.jct[1] - 17.5).abs() < 1e-6, "{r:?}");
    // Least attained service: they take turns as each moves ahead (in doubling steps of
    // attained service), so neither ends as early as the first does under first fit, and the
    // pool never idles: the last ends at 20 s.
    let r = cluster::run(&CFG, &jobs, Scheme::LeastAttained);
    assert!(r.jct.iter().all(|t| *t > 12.0), "{r:?}");
    assert!((r.makespan - 20.0).abs() < 1e-6, "{r:?}");
}

#[test]
fn least_attained_service_lets_a_short_job_overtake_a_long_one() {
    let jobs = [job(0.0, 100.0, 1024), job(5.0, 1.0, 1024)];
    let fifo = cluster::run(&CFG, &jobs, Scheme::Controller(Policy::Priority));
    let las = cluster::run(&CFG, &jobs, Scheme::LeastAttained);
    // Arrival order: the short job gets only the minimum the long one leaves: 64 of 1024.
    assert!(fifo.jct[1] > 10.0, "{fifo:?}");
    // Least attained: it preempts the long job and finishes in about its own length.
    assert!(las.jct[1] < 1.5, "{las:?}");
    assert!(las.mean() < fifo.mean());
}

#[test]
fn finish_time_fairness_serves_the_job_that_fell_furthest_behind() {
    // A long job holds the pool; a short one arrives and, in arrival order, runs with the
    // minimum the long one leaves. Its finish time falls behind its length at once, so
    // finish-time fairness gives it the pool.
    let jobs = [job(0.0, 100.0, 1024), job(5.0, 1.0, 1024)];
    let fifo = cluster::run(&CFG, &jobs, Scheme::Controller(Policy::Priority));
    let ftf = cluster::run(&CFG, &jobs, Scheme::FinishTimeFairness);
    assert!(ftf.jct[1] < 3.0, "{ftf:?}");
    assert!(ftf.jct[1] < fifo.jct[1]);
    // The long job gives up little: about the short one's length.
    assert!(ftf.jct[0] < fifo.jct[0] + 2.0, "{ftf:?} against {fifo:?}");
}

#[test]
fn under_load_sharing_beats_static_partitions_on_every_seed() {
    let cfg = ClusterConfig { pool: 8192, ..CFG };
    for seed in 1..=4 {
        let jobs = cluster::workload(seed, 150, 0.8, &cfg);
        let fixed = cluster::run(&cfg, &jobs, Scheme::StaticPartitions(4)).mean();
        let fair = cluster::run(&cfg, &jobs, Scheme::Controller(Policy::FairShare)).mean();
        assert!(
            fair < fixed,
            "seed {seed}: fair share {fair} against static {fixed}"
        );
        assert!(jobs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
    }
}

#[test]
fn spilling_sends_a_job_to_a_host_while_its_slots_would_be_slower() {
    // First fit with a job that took the whole pool: the second would wait 10 s; spilled, it
    // streams on a host at 25 Gbit/s and moves to the switch when the first ends:
    // 10 + (1000 - 250) Gbit / 100 = 17.5 s, as best effort's collision does.
    let jobs = [job(0.0, 10.0, 1024), job(0.0, 10.0, 1024)];
    let r = cluster::run(&CFG, &jobs, Scheme::Spilling(Policy::FirstFit));
    assert!((r.jct[0] - 10.0).abs() < 1e-6, "{r:?}");
    assert!((r.jct[1] - 17.5).abs() < 1e-6, "{r:?}");
    // Fair share gives each half the pool, 50 Gbit/s, faster than a host: nobody spills.
    let shared = cluster::run(&CFG, &jobs, Scheme::Controller(Policy::FairShare));
    let spilled = cluster::run(&CFG, &jobs, Scheme::Spilling(Policy::FairShare));
    assert_eq!(shared.jct, spilled.jct);
    // Eight jobs under fair share: an eighth of the pool each is 12.5 Gbit/s, slower than a
    // host, so the latest go to hosts one by one until the rest beat a host: four on hosts
    // at 25 Gbit/s, four sharing the pool at 25 Gbit/s each; all end at 40 s instead of 80 s.
    let jobs: Vec<ClusterJob> = (0..8).map(|_| job(0.0, 10.0, 1024)).collect();
    let shared = cluster::run(&CFG, &jobs, Scheme::Controller(Policy::FairShare));
    let spilled = cluster::run(&CFG, &jobs, Scheme::Spilling(Policy::FairShare));
    assert!(
        shared.jct.iter().all(|t| (t - 80.0).abs() < 1e-6),
        "{shared:?}"
    );
    assert!(
        spilled.jct.iter().all(|t| (t - 40.0).abs() < 1e-6),
        "{spilled:?}"
    );
}
