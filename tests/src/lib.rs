//! The conformance suite of `ina`'s switch targets.
//!
//! Scenarios (`tests/scenarios/*.toml`, see [`scenario`]) describe a switch, its jobs, frames
//! sent on ports and the frames expected out of each port, then the counters expected at the
//! end. One runner ([`run_scenario`]) replays every scenario against any [`Target`]: the Rust
//! frame model ([`model::ModelTarget`], `ina_proto::l2`), bmv2 running the generated v1model
//! program ([`bmv2::Bmv2Target`]) and the L2 software switch on raw ports
//! ([`l2switch::L2SwitchTarget`]). The targets on ports share [`netns::TestNet`], a network
//! namespace of veth pairs; another target implements the trait's five methods.

pub mod bmv2;
pub mod decode;
pub mod frames;
pub mod l2switch;
pub mod model;
pub mod netns;
pub mod random;
pub mod scenario;
pub mod sparse;

use ina_switch_p4::runtime::{P4Job, SwitchDesc};
use scenario::{Counts, Scenario};
use std::path::Path;
use std::time::Duration;

/// Why a target could not do what the runner asked.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A switch the scenarios run against.
pub trait Target {
    /// A short name for reports.
    fn name(&self) -> String;
    /// Starts from a clean switch (no jobs, zero registers and counters) and installs the
    /// switch's configuration and the jobs.
    fn configure(&mut self, switch: &SwitchDesc, jobs: &[P4Job]) -> Result<(), TargetError>;
    /// Sends one frame in on `port`.
    fn send(&mut self, port: u16, frame: &[u8]) -> Result<(), TargetError>;
    /// The frames that came out since the last call, with their egress ports: waits until at
    /// least `expected` have come or `timeout` has passed, and a target whose frames travel
    /// through queues waits a moment more for frames beyond those.
    fn collect(
        &mut self,
        expected: usize,
        timeout: Duration,
    ) -> Result<Vec<(u16, Vec<u8>)>, TargetError>;
    /// Every counter.
    fn counters(&mut self) -> Result<Counts, TargetError>;
}

/// The frame model's counts of `ina_missing`'s entries.
pub fn missing_counts(
    c: &ina_proto::pipeline::Counters,
) -> [u64; ina_proto::event::MISSING_COUNTERS] {
    use ina_proto::event::{MISSING_RECEIVED, MISSING_SENT};
    let mut out = [0; ina_proto::event::MISSING_COUNTERS];
    out[MISSING_SENT] = c.missing_sent;
    out[MISSING_RECEIVED] = c.missing_received;
    out
}

/// How long a step waits for its expected frames.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(3);

/// Every scenario of `tests/scenarios`, expanded, in file order.
pub fn all_scenarios() -> Result<Vec<Scenario>, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let name = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        out.extend(scenario::load(&name, &text).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    Ok(out)
}

/// Replays one scenario; `Err` holds a readable report of every difference.
pub fn run_scenario(target: &mut dyn Target, s: &Scenario) -> Result<(), String> {
    target
        .configure(&s.switch, &s.jobs)
        .map_err(|e| format!("configure: {e}"))?;
    let mut report = String::new();
    for (k, step) in s.steps.iter().enumerate() {
        target
            .send(step.port, &step.frame)
            .map_err(|e| format!("step {}: send: {e}", k + 1))?;
        let got = target
            .collect(step.expect.len(), STEP_TIMEOUT)
            .map_err(|e| format!("step {}: collect: {e}", k + 1))?;
        if let Some(d) = compare(&step.expect, got) {
            report.push_str(&format!(
                "step {} ({}): sent on port {}:\n{}{d}",
                k + 1,
                step.note,
                step.port,
                decode::describe(&step.frame)
                    .iter()
                    .map(|l| format!("      {l}\n"))
                    .collect::<String>()
            ));
            // The registers now differ from the scenario's: later steps would only repeat it.
            break;
        }
    }
    if report.is_empty() {
        let got = target.counters().map_err(|e| format!("counters: {e}"))?;
        let d = s.counters.diff(&got);
        if !d.is_empty() {
            report.push_str(&format!("counters differ:\n    {}\n", d.join("\n    ")));
        }
    }
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}

/// `None` when the frames out are the expected ones (per port, in any order), else the
/// differences.
fn compare(expected: &[(u16, Vec<u8>)], mut got: Vec<(u16, Vec<u8>)>) -> Option<String> {
    let mut missing = Vec::new();
    for e in expected {
        match got.iter().position(|g| g == e) {
            Some(i) => {
                got.swap_remove(i);
            }
            None => missing.push(e.clone()),
        }
    }
    if missing.is_empty() && got.is_empty() {
        return None;
    }
    let mut out = format!(
        "  expected {} frames; {} of them missing, {} unexpected\n",
        expected.len(),
        missing.len(),
        got.len()
    );
    got.sort();
    for (port, frame) in &missing {
        // The closest unexpected frame on the same port, if any, as a diff.
        match got.iter().position(|(p, _)| p == port) {
            Some(i) => {
                let (_, other) = got.remove(i);
                out.push_str(&format!("  port {port}: expected (-) / got (+):\n"));
                out.push_str(&decode::diff(frame, &other));
            }
            None => {
                out.push_str(&format!("  port {port}: missing:\n"));
                for l in decode::describe(frame) {
                    out.push_str(&format!("      {l}\n"));
                }
            }
        }
    }
    for (port, frame) in &got {
        out.push_str(&format!("  port {port}: unexpected:\n"));
        for l in decode::describe(frame) {
            out.push_str(&format!("      {l}\n"));
        }
    }
    Some(out)
}

/// Runs every scenario; returns the reports of those that failed.
pub fn run_all(target: &mut dyn Target, scenarios: &[Scenario]) -> Vec<(String, String)> {
    let mut failed = Vec::new();
    let name = target.name();
    for s in scenarios {
        if s.skip.iter().any(|t| name.starts_with(t.as_str())) {
            eprintln!("{}: skipped on {name}: {}", s.name, s.skip_reason);
            continue;
        }
        if !s.only.is_empty() && !s.only.iter().any(|t| name.starts_with(t.as_str())) {
            continue;
        }
        if let Err(r) = run_scenario(target, s) {
            failed.push((s.name.clone(), r));
        }
    }
    failed
}
