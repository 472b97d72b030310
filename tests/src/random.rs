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
    let ctx = Context {
        switch: &file.switch,
        jobs: &jobs,
    };
    let Some(job) = jobs.first() else {
        return Err(ScenarioError::Frame("a random scenario needs a job".into()));
    };
    let n = job.ranks.len() as u64;
    let e = job.elems;
    let mut rng = Rng(seed);
    let mut model = ModelTarget::new();
    model
        .configure(&file.switch, &jobs)
        .map_err(|e| ScenarioError::Frame(e.to_string()))?;
    let mut steps = Vec::new();
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
        switch: file.switch.clone(),
        jobs,
        steps,
        counters,
    })
}

#[cfg(test)]
mod tests {
    use ina_proto::event::Event;

    #[test]
    fn random_frames_reach_most_events() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scenarios/random.toml"
        ))
        .unwrap();
        let all = crate::scenario::load("random", &text).unwrap();
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
}
