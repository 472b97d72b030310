//! Scenarios: a switch with its jobs, then steps (a frame in on a port, the frames expected out
//! on each port), then the counters expected at the end.
//!
//! Files in `tests/scenarios/*.toml` describe frames symbolically (an `ina` header with its
//! payload, an ARP packet, an Ethernet frame, or raw hex) and are expanded here into bytes
//! ([`Scenario::expand`]). A file may also hold `[[generate]]` entries: compact descriptions
//! that [`generated`] turns into whole scenarios (aggregation for many worker counts, many
//! rounds of shadow-set alternation).

use crate::frames::{self, ArpSpec, EthSpec, InaSpec};
use ina_proto::event::{Event, MISSING_COUNTERS, MISSING_RECEIVED, MISSING_SENT};
use ina_switch_p4::runtime::{L2Entry, MacAddr, P4Job, RankDesc, SwitchDesc, UplinkDesc};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// A scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    #[serde(default)]
    pub description: String,
    #[serde(default = "default_switch")]
    pub switch: SwitchDesc,
    #[serde(default)]
    pub jobs: Vec<ScenarioJob>,
    #[serde(default)]
    pub steps: Vec<Step>,
    /// Expected counters at the end, by event name (`multicast` for `ina_multicast`);
    /// unlisted counters are expected to be 0.
    #[serde(default)]
    pub counters: BTreeMap<String, u64>,
    /// Scenarios generated from compact descriptions.
    #[serde(default)]
    pub generate: Vec<Generate>,
    /// Targets (by the start of their name) this scenario does not apply to, and why.
    #[serde(default)]
    pub skip: Vec<String>,
    #[serde(default)]
    pub skip_reason: String,
    /// When not empty, the only targets (by the start of their name) this scenario applies to.
    #[serde(default)]
    pub only: Vec<String>,
}

/// The switch of every scenario that does not describe its own: four ports, an L2 entry
/// `02:00:00:00:0a:0P` per port `P`.
pub fn default_switch() -> SwitchDesc {
    SwitchDesc {
        mac: MacAddr([2, 0, 0, 0, 0, 0xfe]),
        ip: Ipv4Addr::new(198, 18, 0, 254),
        ports: vec![0, 1, 2, 3],
        l2: (0..4u8)
            .map(|p| L2Entry {
                mac: MacAddr([2, 0, 0, 0, 0x0a, p]),
                port: u16::from(p),
            })
            .collect(),
        flood_mgrp: 1000,
        gap_reports: true,
    }
}

/// A job of a scenario: its ranks are listed, or `workers` ranks are made by
/// [`default_rank`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioJob {
    pub id: u16,
    pub epoch: u16,
    #[serde(default)]
    pub slot_base: u16,
    #[serde(default = "default_slot_count")]
    pub slot_count: u16,
    pub elems: u16,
    /// Default: the job id.
    pub mgrp: Option<u16>,
    pub workers: Option<u8>,
    pub ranks: Option<Vec<RankDesc>>,
    /// The upper switch of a rack switch's job (PROTOCOL.md §9).
    pub uplink: Option<UplinkDesc>,
}

fn default_slot_count() -> u16 {
    8
}

/// Rank `r` of job `job` on a switch of `ports` ports: port `r mod ports`, MAC
/// `02:00:00:01:JJ:RR`, IPv4 `198.18.J.(R+1)`, UDP port `9000 + R`.
pub fn default_rank(job: u16, r: u8, ports: &[u16]) -> RankDesc {
    let port = ports
        .get(usize::from(r) % ports.len().max(1))
        .copied()
        .unwrap_or(0);
    RankDesc {
        port,
        mac: MacAddr([2, 0, 0, 1, job as u8, r]),
        ip: Ipv4Addr::new(198, 18, job as u8, r.wrapping_add(1)),
        udp_port: 9000 + u16::from(r),
    }
}

impl ScenarioJob {
    /// The runtime description of the job.
    pub fn desc(&self, sw: &SwitchDesc) -> P4Job {
        let ranks = match (&self.ranks, self.workers) {
            (Some(r), _) => r.clone(),
            (None, Some(n)) => (0..n)
                .map(|r| default_rank(self.id, r, &sw.ports))
                .collect(),
            (None, None) => Vec::new(),
        };
        P4Job {
            id: self.id,
            epoch: self.epoch,
            slot_base: self.slot_base,
            slot_count: self.slot_count,
            elems: self.elems,
            mgrp: self.mgrp.unwrap_or(self.id),
            ranks,
            uplink: self.uplink,
        }
    }
}

/// One frame in, and what comes out.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// A note shown when the step fails.
    #[serde(default)]
    pub note: String,
    pub send: Send,
    #[serde(default)]
    pub expect: Vec<Expect>,
}

/// The frame sent, and its ingress port (default: the port of the `ina` frame's sender).
#[derive(Debug, Clone, Deserialize)]
pub struct Send {
    pub port: Option<u16>,
    #[serde(flatten)]
    pub frame: FrameSpec,
}

/// A frame expected out: on `port`, or, with `all_ranks = JOB`, one copy per rank of the job,
/// on the rank's port and addressed to it.
#[derive(Debug, Clone, Deserialize)]
pub struct Expect {
    pub port: Option<u16>,
    /// The sent frame, unchanged (forwarded traffic).
    #[serde(default)]
    pub same: bool,
    pub all_ranks: Option<u16>,
    #[serde(flatten)]
    pub frame: FrameSpec,
}

/// A frame, described one of four ways.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FrameSpec {
    pub ina: Option<InaSpec>,
    pub arp: Option<ArpSpec>,
    pub eth: Option<EthSpec>,
    pub hex: Option<String>,
}

/// A compact description of generated scenarios.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generate {
    /// `aggregation`, `rounds`, `random` or `sparse`.
    pub kind: String,
    pub workers: Vec<u8>,
    pub elems: Vec<u16>,
    /// `rounds`: the number of uses of every slot.
    #[serde(default)]
    pub rounds: u32,
    /// `rounds` and `sparse`: the slots of the lane; `random`: the job's slots from 0 (whole
    /// blocks: the frames then carry gap counters and Missing reports).
    #[serde(default)]
    pub window: u16,
    /// `random`: the seed and the number of frames.
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub frames: u32,
    /// `sparse`: the all-reduce recorded.
    pub sparse: Option<crate::sparse::SparseSpec>,
}

/// A scenario with every frame in bytes.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    /// Targets (by the start of their name) this scenario does not apply to, and why.
    pub skip: Vec<String>,
    pub skip_reason: String,
    /// When not empty, the only targets this scenario applies to.
    pub only: Vec<String>,
    pub switch: SwitchDesc,
    pub jobs: Vec<P4Job>,
    pub steps: Vec<ConcreteStep>,
    pub counters: Counts,
}

/// A step in bytes.
#[derive(Debug, Clone)]
pub struct ConcreteStep {
    pub note: String,
    pub port: u16,
    pub frame: Vec<u8>,
    pub expect: Vec<(u16, Vec<u8>)>,
}

/// Every counter a target keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub events: [u64; Event::COUNT],
    pub multicast: u64,
    /// `ina_missing`: reports of lost data sent, and Missing reports answered.
    pub missing: [u64; MISSING_COUNTERS],
}

/// The names of `ina_missing`'s entries in a scenario's counters.
const MISSING_NAMES: [(&str, usize); MISSING_COUNTERS] = [
    ("missing_sent", MISSING_SENT),
    ("missing_received", MISSING_RECEIVED),
];

impl Counts {
    /// The counters that differ, as lines `name: expected X, got Y`.
    pub fn diff(&self, got: &Counts) -> Vec<String> {
        let mut out = Vec::new();
        for e in Event::ALL {
            let (a, b) = (self.events[e.index()], got.events[e.index()]);
            if a != b {
                out.push(format!("{}: expected {a}, got {b}", e.name()));
            }
        }
        if self.multicast != got.multicast {
            out.push(format!(
                "multicast: expected {}, got {}",
                self.multicast, got.multicast
            ));
        }
        for (name, i) in MISSING_NAMES {
            if self.missing[i] != got.missing[i] {
                out.push(format!(
                    "{name}: expected {}, got {}",
                    self.missing[i], got.missing[i]
                ));
            }
        }
        out
    }
}

/// Why a scenario cannot be expanded.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    #[error("{0}")]
    Frame(String),
    #[error("unknown counter {0:?}")]
    Counter(String),
}

impl ScenarioFile {
    /// The scenarios of this file: its own (if it has steps) and the generated ones.
    pub fn expand(&self, name: &str) -> Result<Vec<Scenario>, ScenarioError> {
        let mut out = Vec::new();
        if !self.steps.is_empty() || self.generate.is_empty() {
            out.push(self.expand_own(name)?);
        }
        for g in &self.generate {
            out.extend(generated(name, g, &self.switch)?);
        }
        Ok(out)
    }

    fn expand_own(&self, name: &str) -> Result<Scenario, ScenarioError> {
        let jobs: Vec<P4Job> = self.jobs.iter().map(|j| j.desc(&self.switch)).collect();
        let ctx = frames::Context {
            switch: &self.switch,
            jobs: &jobs,
        };
        let mut steps = Vec::new();
        for (i, s) in self.steps.iter().enumerate() {
            let err = |e: String| ScenarioError::Frame(format!("step {}: {e}", i + 1));
            let (port, frame) = ctx.sent(&s.send).map_err(err)?;
            let mut expect = Vec::new();
            for x in &s.expect {
                if x.same {
                    let p = x.port.ok_or_else(|| err("`same` needs a port".into()))?;
                    expect.push((p, frame.clone()));
                } else {
                    expect.extend(ctx.expected(x).map_err(err)?);
                }
            }
            steps.push(ConcreteStep {
                note: s.note.clone(),
                port,
                frame,
                expect,
            });
        }
        let mut counters = Counts::default();
        for (k, v) in &self.counters {
            if k == "multicast" {
                counters.multicast = *v;
                continue;
            }
            if let Some((_, i)) = MISSING_NAMES.iter().find(|(n, _)| n == k) {
                counters.missing[*i] = *v;
                continue;
            }
            let e = Event::ALL
                .iter()
                .find(|e| e.name() == k)
                .ok_or_else(|| ScenarioError::Counter(k.clone()))?;
            counters.events[e.index()] = *v;
        }
        Ok(Scenario {
            name: name.to_string(),
            skip: self.skip.clone(),
            skip_reason: self.skip_reason.clone(),
            only: self.only.clone(),
            switch: self.switch.clone(),
            jobs,
            steps,
            counters,
        })
    }
}

/// Parses and expands one scenario file.
pub fn load(name: &str, text: &str) -> Result<Vec<Scenario>, ScenarioError> {
    let file: ScenarioFile = toml::from_str(text)?;
    file.expand(name)
}

/// The payload of rank `r` in generated scenarios: element `i` is `base_r + step_r * i` with
/// values that wrap around int32 when summed.
fn ramp_of(r: u8, round: u32) -> [i64; 2] {
    let base = i64::from(i32::MAX / 3) + i64::from(r) * 1_000_003 + i64::from(round);
    [base, i64::from(r) + 1]
}

/// The element-wise int32 sum of ramps.
fn ramp_sum(ramps: impl Iterator<Item = [i64; 2]>) -> [i64; 2] {
    let (mut a, mut b) = (0i32, 0i32);
    for [x, y] in ramps {
        a = a.wrapping_add(x as i32);
        b = b.wrapping_add(y as i32);
    }
    [i64::from(a), i64::from(b)]
}

/// The exponent byte rank `r` sends in generated aggregation scenarios.
fn exp_of(r: u8) -> u8 {
    100 + ((u32::from(r) * 37) % 50) as u8
}

fn data_spec(job: u16, rank: u8, slot: u16, set: u8, seq: u32, exp: u8, count: u16) -> InaSpec {
    InaSpec {
        job,
        rank,
        kind: frames::Kind::Name("data".into()),
        slot,
        set,
        seq,
        exp,
        count: Some(count),
        ..InaSpec::default()
    }
}

/// The scenarios of one `[[generate]]` entry.
pub fn generated(
    file: &str,
    g: &Generate,
    sw: &SwitchDesc,
) -> Result<Vec<Scenario>, ScenarioError> {
    let mut out = Vec::new();
    for &n in &g.workers {
        for &e in &g.elems {
            // A random scenario with a window covers whole blocks of 64 slots from slot 0, so
            // that its gap counters and Missing reports have cells.
            let (slot_base, slot_count) = match (g.kind.as_str(), g.window) {
                ("random", w) if w > 0 => (0, w),
                _ => (16, 16),
            };
            let job = ScenarioJob {
                id: 1,
                epoch: 77,
                slot_base,
                slot_count,
                elems: e,
                mgrp: None,
                workers: Some(n),
                ranks: None,
                uplink: None,
            };
            let mut f = ScenarioFile {
                description: String::new(),
                switch: sw.clone(),
                jobs: vec![job],
                steps: Vec::new(),
                counters: BTreeMap::new(),
                generate: Vec::new(),
                skip: Vec::new(),
                skip_reason: String::new(),
                only: Vec::new(),
            };
            let name = match g.kind.as_str() {
                "aggregation" => {
                    aggregation_steps(&mut f, n, e);
                    format!("{file}/aggregation-n{n}-e{e}")
                }
                "rounds" => {
                    rounds_steps(&mut f, n, e, g.window.max(1), g.rounds);
                    format!("{file}/rounds-n{n}-e{e}-w{}-r{}", g.window, g.rounds)
                }
                "random" => {
                    let name = format!("{file}/random-n{n}-e{e}-seed{}", g.seed);
                    out.push(crate::random::scenario(&name, &f, g.seed, g.frames)?);
                    continue;
                }
                "sparse" => {
                    let spec = g.sparse.as_ref().ok_or_else(|| {
                        ScenarioError::Frame("a sparse generator needs a [generate.sparse]".into())
                    })?;
                    let name = format!("{file}/{}-n{n}-e{e}", spec.name);
                    out.push(crate::sparse::scenario(&name, &f, g.window.max(1), spec)?);
                    continue;
                }
                other => {
                    return Err(ScenarioError::Frame(format!(
                        "unknown generator kind {other:?}"
                    )))
                }
            };
            out.push(f.expand_own(&name)?);
        }
    }
    Ok(out)
}

fn step(note: String, send: InaSpec, expect: Vec<Expect>) -> Step {
    Step {
        note,
        send: Send {
            port: None,
            frame: FrameSpec {
                ina: Some(send),
                ..FrameSpec::default()
            },
        },
        expect,
    }
}

fn result_to_all(job: u16, spec: InaSpec) -> Expect {
    Expect {
        port: None,
        same: false,
        all_ranks: Some(job),
        frame: FrameSpec {
            ina: Some(spec),
            ..FrameSpec::default()
        },
    }
}

fn result_to(spec: InaSpec) -> Expect {
    Expect {
        port: None,
        same: false,
        all_ranks: None,
        frame: FrameSpec {
            ina: Some(spec),
            ..FrameSpec::default()
        },
    }
}

/// Every rank sends its data to one slot; the last arrival multicasts the wrapped sum with
/// the largest exponent; a retransmission of rank 0 gets the stored result back alone; a
/// second use on the other set completes as well.
fn aggregation_steps(f: &mut ScenarioFile, n: u8, e: u16) {
    let slot = 17;
    for (set, seq) in [(0u8, 1u32), (1, 2)] {
        for r in 0..n {
            let mut d = data_spec(1, r, slot, set, seq, exp_of(r), e);
            d.ramp = Some(ramp_of(r, seq));
            let expect = if r + 1 == n {
                let mut res = data_spec(1, r, slot, set, seq, 0, e);
                res.kind = frames::Kind::Name("result".into());
                res.exp = (0..n).map(exp_of).max().unwrap_or(0);
                res.ramp = Some(ramp_sum((0..n).map(|r| ramp_of(r, seq))));
                vec![result_to_all(1, res)]
            } else {
                Vec::new()
            };
            f.steps
                .push(step(format!("use {seq}: data of rank {r}"), d, expect));
        }
        if seq == 1 {
            // Rank 0 has not moved on: its retransmission gets the stored result alone.
            let mut again = data_spec(1, 0, slot, 0, 1, 100, e);
            again.ramp = Some(ramp_of(0, 1));
            let mut res = data_spec(1, 0, slot, 0, 1, 0, e);
            res.kind = frames::Kind::Name("result".into());
            res.exp = (0..n).map(exp_of).max().unwrap_or(0);
            res.ramp = Some(ramp_sum((0..n).map(|r| ramp_of(r, 1))));
            f.steps.push(step(
                "retransmission to the complete use".into(),
                again,
                vec![result_to(res)],
            ));
        }
    }
    let c = &mut f.counters;
    c.insert("data_first".into(), 2);
    c.insert("data_added".into(), 2 * u64::from(n - 1));
    c.insert("results_unicast".into(), 1);
    c.insert("multicast".into(), 2);
}

/// A lane of `w` slots used for `rounds` rounds by every rank, as the worker's schedule has
/// it (position g: slot g mod w, set (g / w) mod 2, seq g); after every round, a stale copy
/// of a use two rounds back and a late copy of the last round.
fn rounds_steps(f: &mut ScenarioFile, n: u8, e: u16, w: u16, rounds: u32) {
    let base = 16;
    let (mut first, mut added, mut stale, mut dup) = (0u64, 0u64, 0u64, 0u64);
    let wu = u32::from(w);
    for round in 0..rounds {
        for k in 0..wu {
            let g = wu + round * wu + k;
            let slot = base + (g % wu) as u16;
            let set = ((g / wu) % 2) as u8;
            for r in 0..n {
                let mut d = data_spec(1, r, slot, set, g, 120, e);
                d.ramp = Some(ramp_of(r, g));
                let expect = if r + 1 == n {
                    let mut res = data_spec(1, r, slot, set, g, 120, e);
                    res.kind = frames::Kind::Name("result".into());
                    res.ramp = Some(ramp_sum((0..n).map(|r| ramp_of(r, g))));
                    vec![result_to_all(1, res)]
                } else {
                    Vec::new()
                };
                f.steps
                    .push(step(format!("position {g}: rank {r}"), d, expect));
            }
            first += 1;
            added += u64::from(n - 1);
            if round >= 2 {
                // The same slot and set two uses back: an older sequence number.
                let old = g - 2 * wu;
                let mut d = data_spec(1, 0, slot, set, old, 120, e);
                d.ramp = Some(ramp_of(0, old));
                f.steps
                    .push(step(format!("position {old} again: stale"), d, Vec::new()));
                stale += 1;
            }
            if round >= 1 && n > 1 {
                // Rank n-1 moved on to position g in the other set, so its copy of the
                // previous use (position g - w) has its bit cleared: a late copy.
                let prev = g - wu;
                let mut d = data_spec(1, n - 1, slot, 1 - set, prev, 120, e);
                d.ramp = Some(ramp_of(n - 1, prev));
                f.steps.push(step(
                    format!("position {prev} again: late copy"),
                    d,
                    Vec::new(),
                ));
                dup += 1;
            }
        }
    }
    let c = &mut f.counters;
    c.insert("data_first".into(), first);
    c.insert("data_added".into(), added);
    c.insert("stale_seq".into(), stale);
    c.insert("duplicate".into(), dup);
    c.insert("multicast".into(), first);
}
