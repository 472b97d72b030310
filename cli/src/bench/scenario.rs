//! `ina bench --scenario FILE.toml`: a benchmark described in a file (the files of `benches/`
//! reproduce the published tables). The file's settings replace the flags'; a scenario runs
//! on the testbed unless it says `testbed = false`.
//!
//! ```toml
//! workers = 4
//! size = "64MiB"
//! elems = 256
//! algorithms = ["ina", "ring"]
//! hub = "bridge"       # bridge | l2 | bmv2
//! rate = "1gbit"
//! mtu = 1500
//! link_loss = 0.001
//! ```

use super::{parse_size, Algorithm, BenchArgs};
use crate::cmd_testbed::{parse_rate, HubKind};
use anyhow::Context;
use serde::Deserialize;
use std::path::Path;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    /// What the scenario is for (printed, not used).
    #[serde(default)]
    description: Option<String>,
    workers: Option<usize>,
    size: Option<String>,
    elems: Option<u16>,
    slots: Option<u16>,
    window: Option<u16>,
    adaptive_window: Option<bool>,
    target_queueing_us: Option<f64>,
    algorithms: Option<Vec<String>>,
    iterations: Option<usize>,
    warmup: Option<usize>,
    rounds: Option<usize>,
    warmup_rounds: Option<usize>,
    unicast: Option<bool>,
    testbed: Option<bool>,
    hub: Option<HubKind>,
    rate: Option<String>,
    burst: Option<u64>,
    mtu: Option<u32>,
    link_loss: Option<f64>,
    offloads: Option<bool>,
    give_up_ms: Option<u64>,
    ring_congestion: Option<String>,
    density: Option<f64>,
    shape: Option<crate::data::Shape>,
    sweep_density: Option<Vec<f64>>,
}

fn algorithm(name: &str) -> anyhow::Result<Algorithm> {
    Ok(match name {
        "ina" => Algorithm::Ina,
        "ring" => Algorithm::Ring,
        "ina-sparse" => Algorithm::InaSparse,
        "agsparse" => Algorithm::Agsparse,
        "switch" => Algorithm::Switch,
        "reflector" => Algorithm::Reflector,
        other => anyhow::bail!(
            "unknown algorithm `{other}` (ina, ring, ina-sparse, agsparse, switch, reflector)"
        ),
    })
}

/// Reads and parses the TOML file `path`; errors name the file.
pub(crate) fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Applies the scenario in `path` to `args`; returns its description.
pub(crate) fn apply(path: &Path, args: &mut BenchArgs) -> anyhow::Result<Option<String>> {
    let s: Scenario = read_toml(path)?;
    macro_rules! set {
        ($($field:ident),*) => { $( if let Some(v) = s.$field { args.$field = v; } )* };
    }
    set!(
        workers,
        iterations,
        warmup,
        rounds,
        warmup_rounds,
        unicast,
        give_up_ms,
        elems,
        slots,
        adaptive_window,
        target_queueing_us
    );
    if s.target_queueing_us.is_some() && !args.adaptive_window {
        anyhow::bail!("target_queueing_us needs adaptive_window = true");
    }
    if let Some(cc) = &s.ring_congestion {
        args.ring_congestion = Some(cc.clone());
    }
    if let Some(v) = s.window {
        args.window = Some(v);
    }
    if let Some(d) = s.density {
        args.density = Some(d);
    }
    if let Some(shape) = s.shape {
        args.shape = shape;
    }
    if let Some(list) = &s.sweep_density {
        args.sweep_density = list.clone();
    }
    if let Some(size) = &s.size {
        args.size = parse_size(size).map_err(anyhow::Error::msg)?;
    }
    if let Some(list) = &s.algorithms {
        args.algorithms = list
            .iter()
            .map(|a| algorithm(a))
            .collect::<anyhow::Result<_>>()?;
    }
    args.testbed = s.testbed.unwrap_or(true);
    if let Some(h) = s.hub {
        args.hub = h;
    }
    if let Some(r) = &s.rate {
        args.links.rate = Some(parse_rate(r).map_err(anyhow::Error::msg)?);
    }
    if let Some(b) = s.burst {
        args.links.burst = Some(b);
    }
    if let Some(m) = s.mtu {
        args.links.mtu = m;
    }
    if let Some(l) = s.link_loss {
        args.links.link_loss = l;
    }
    if let Some(o) = s.offloads {
        args.links.offloads = o;
    }
    Ok(s.description)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    #[test]
    fn every_scenario_of_benches_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).expect("benches/") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "toml") {
                let mut args = Cli::parse_from(["bench"]).args;
                apply(&path, &mut args).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
                assert!(args.testbed, "{}", path.display());
                n += 1;
            }
        }
        assert!(n >= 4, "only {n} scenarios in benches/");
    }

    #[test]
    fn a_scenario_replaces_the_flags_and_refuses_nonsense() {
        let dir = std::env::temp_dir().join(format!("ina-scenario-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let good = dir.join("good.toml");
        std::fs::write(
            &good,
            "workers = 8\nsize = \"16MiB\"\nrate = \"500mbit\"\nmtu = 9000\nhub = \"l2\"\nalgorithms = [\"ina\"]\nadaptive_window = true\ntarget_queueing_us = 500.0\n",
        )
        .expect("write");
        let mut args = Cli::parse_from(["bench"]).args;
        apply(&good, &mut args).expect("applies");
        assert_eq!((args.workers, args.size), (8, 16 << 20));
        assert_eq!((args.links.rate, args.links.mtu), (Some(500_000_000), 9000));
        assert!(args.adaptive_window);
        assert_eq!(args.target_queueing_us, 500.0);
        assert_eq!(
            (args.hub, args.algorithms.clone()),
            (HubKind::L2, vec![Algorithm::Ina])
        );
        for (name, text) in [
            ("unknown.toml", "colour = 1\n"),
            ("algo.toml", "algorithms = [\"tree\"]\n"),
            ("rate.toml", "rate = \"fast\"\n"),
            ("target.toml", "target_queueing_us = 500.0\n"),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, text).expect("write");
            let mut args = Cli::parse_from(["bench"]).args;
            assert!(apply(&p, &mut args).is_err(), "{name}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
