//! Seeded random scenarios whose expectations are the frame model's answers: frames of every
//! kind (contributions, retransmissions, Queries and Probes of valid and invalid senders, Rejects,
//! frames with one byte corrupted, ARP, ordinary traffic) for a differential check of the other
//! targets against `proto::l2`.

use crate::frames::{Context, InaSpec, Kind};
use crate::model::ModelTarget;
use crate::scenario::{
    ConcreteStep, Counts, FrameSpec, Scenario, ScenarioError, ScenarioFile, Send,
};
use crate::Target;
use ina_switch_p4::runtime::SwitchDesc;
use std::time::Duration;

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The scenario of `file` (a switch and one job) with `frames` random frames.
pub fn scenario(
    name: &str,
    file: &ScenarioFile,
    seed: u64,
    frames: u32,
) -> Result<Scenario, ScenarioError> {
    let jobs: Vec<_> = file.jobs.iter().map(|j| j.desc(&file.switch)).collect();
    let Some(job) = jobs.first() else {
        return Err(ScenarioError::Frame("a random scenario needs a job".into()));
    };
    // bmv2 offers no Missing reports to a 256-element job (see v1model.rs): the switch of such
    // a scenario sends none, so that every target agrees on its ProbeReply.
    let switch = SwitchDesc {
        gap_reports: file.switch.gap_reports && job.elems <= 64,
        ..file.switch.clone()
    };
    let ctx = Context {
        switch: &switch,
        jobs: &jobs,
    };
    let n = job.ranks.len() as u64;
    let e = job.elems;
    let mut rng = Rng(seed);
    let mut model = ModelTarget::new();
    model
        .configure(&switch, &jobs)
        .map_err(|e| ScenarioError::Frame(e.to_string()))?;
    let mut steps = Vec::new();
    // With whole blocks, first transmissions carry gap counters: per rank, mostly the next,
    // sometimes a skip of 1 to 9, the same again, or one behind.
    let gaps = job.slot_count >= 64 && job.slot_base % 64 == 0;
    let mut counters = vec![0u8; n as usize];
    for k in 0..frames {
        let rank = rng.below(n) as u8;
        let mut spec = InaSpec {
            job: job.id,
            rank,
            kind: Kind::Name("data".into()),
            set: rng.below(2) as u8,
            slot: job.slot_base + rng.below(u64::from(job.slot_count).min(3)) as u16,
            seq: 1 + rng.below(4) as u32,
            exp: rng.below(256) as u8,
            count: Some(e),
            ramp: Some([
                rng.below(1 << 32) as i64 - (1 << 31),
                rng.below(1000) as i64,
            ]),
            ..InaSpec::default()
        };
        let roll = rng.below(100);
        let mut note = "data";
        let mut corrupt = false;
        match roll {
            0..=49 => {
                if rng.chance(20) {
                    spec.count = Some(0);
                    note = "data, header only";
                }
                if gaps && rng.chance(70) {
                    let c = &mut counters[usize::from(rank)];
                    *c = match rng.below(10) {
                        0 => c.wrapping_add(1 + rng.below(9) as u8),
                        1 => *c,
                        2 => c.wrapping_sub(1),
                        _ => c.wrapping_add(1),
                    } % 64;
                    spec.gap = Some(*c);
                    note = if spec.count == Some(0) {
                        "data, header only, with a gap counter"
                    } else {
                        "data with a gap counter"
                    };
                }
            }
            50..=61 => {
                note = "query";
                spec.kind = Kind::Name("query".into());
                spec.count = Some(0);
                // bmv2 cannot grow a Query into a 256-element Result (see v1model.rs).
                if e > 64 || rng.chance(30) {
                    spec.exp = 0;
                }
            }
            62..=65 if gaps && rng.chance(50) => {
                note = "a report of lost results";
                spec.kind = Kind::Name("missing".into());
                spec.count = Some(0);
                spec.gap = rng.chance(90).then(|| rng.below(8) as u8);
            }
            62..=65 => {
                note = "probe";
                spec.kind = Kind::Name("probe".into());
                spec.count = Some(0);
            }
            66..=71 => {
                note = "refused: epoch, slot or count";
                match rng.below(3) {
                    0 => spec.epoch = Some(job.epoch.wrapping_add(1)),
                    1 => spec.slot = job.slot_base + job.slot_count,
                    _ => spec.count = Some(3),
                }
            }
            72..=77 => {
                note = "wrong sender";
                match rng.below(3) {
                    0 => spec.src_udp = Some(1),
                    1 => spec.from = Some([job.id, u16::from((rank + 1) % n as u8)]),
                    _ => spec.rank = 31,
                }
            }
            _ => {
                note = "one byte corrupted";
                corrupt = true;
            }
        }
        let send = Send {
            port: None,
            frame: FrameSpec {
                ina: Some(spec),
                ..FrameSpec::default()
            },
        };
        let (port, mut frame) = ctx.sent(&send).map_err(ScenarioError::Frame)?;
        if corrupt {
            let at = rng.below(58.min(frame.len() as u64)) as usize;
            let bit = 1u8 << rng.below(8);
            if let Some(b) = frame.get_mut(at) {
                *b ^= bit;
            }
        }
        model
            .send(port, &frame)
            .map_err(|e| ScenarioError::Frame(e.to_string()))?;
        let expect = model
            .collect(0, Duration::ZERO)
            .map_err(|e| ScenarioError::Frame(e.to_string()))?;
        steps.push(ConcreteStep {
            note: format!("random frame {}: {note}", k + 1),
            port,
            frame,
            expect,
        });
    }
    let counters: Counts = model
        .counters()
        .map_err(|e| ScenarioError::Frame(e.to_string()))?;
    Ok(Scenario {
        name: name.to_string(),
        skip: Vec::new(),
        skip_reason: String::new(),
        only: Vec::new(),
        switch,
        jobs,
        steps,
        counters,
    })
}

#[cfg(test)]
mod tests {
    use ina_proto::event::Event;

    /// The scenarios of `scenarios/random.toml`.
    fn random_scenarios() -> Vec<crate::scenario::Scenario> {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scenarios/random.toml"
        ))
        .unwrap();
        crate::scenario::load("random", &text).unwrap()
    }

    #[test]
    fn random_frames_reach_most_events() {
        let all = random_scenarios();
        let mut seen = [0u64; Event::COUNT];
        for s in &all {
            for (i, c) in s.counters.events.iter().enumerate() {
                seen[i] += c;
            }
        }
        let names: Vec<&str> = Event::ALL
            .iter()
            .filter(|e| seen[e.index()] > 0)
            .map(|e| e.name())
            .collect();
        eprintln!("events reached: {names:?}");
        for e in [
            Event::DataFirst,
            Event::DataAdded,
            Event::ResultUnicast,
            Event::PendingSent,
            Event::ProbeAnswered,
            Event::StaleEpoch,
            Event::BadCount,
            Event::SlotOutOfRange,
            Event::WrongPort,
            Event::UnknownRank,
            Event::Malformed,
            Event::L2Unknown,
        ] {
            assert!(seen[e.index()] > 0, "{} never reached: {names:?}", e.name());
        }
        assert!(all.iter().all(|s| s.counters.multicast > 0));
    }

    #[test]
    fn random_frames_on_whole_blocks_reach_the_reports() {
        use ina_proto::event::{MISSING_RECEIVED, MISSING_SENT};
        let all = random_scenarios();
        let s = all
            .iter()
            .find(|s| s.jobs[0].slot_count >= 64)
            .expect("a random scenario on whole blocks");
        // The ina header follows 42 bytes of Ethernet, IPv4 and UDP headers.
        let kind = |f: &[u8]| f.get(42).map(|b| b & 0x0f);
        let gap_on = |f: &[u8]| f.get(43).is_some_and(|b| b & 0x02 != 0);
        let out = || {
            s.steps
                .iter()
                .flat_map(|st| st.expect.iter().map(|(_, f)| f))
        };
        let reports_out = out().filter(|f| kind(f) == Some(8)).count();
        let results_counted = out().filter(|f| kind(f) == Some(2) && gap_on(f)).count();
        let missing_in = s
            .steps
            .iter()
            .filter(|st| kind(&st.frame) == Some(8))
            .count();
        eprintln!(
            "{}: {} reports out, {results_counted} results with a counter, {missing_in} Missing in, counters {:?}",
            s.name, reports_out, s.counters.missing
        );
        assert!(reports_out > 0 && results_counted > 0 && missing_in > 0);
        assert_eq!(reports_out as u64, 2 * s.counters.missing[MISSING_SENT]);
        assert!(s.counters.missing[MISSING_RECEIVED] > 0);
        assert!(s.counters.events[Event::MissingUnmatched.index()] > 0);
    }
}
