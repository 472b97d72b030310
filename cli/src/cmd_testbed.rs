//! `ina testbed up | down | status`: an emulated rack on this machine (network namespaces,
//! veth links with rate limits and loss; `ina_io::netns`), kept until `down`.

use anyhow::{bail, Context};
use ina_io::netns::{self, Hub, Rack, RackConfig, SWITCH_IP};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The default name prefix of a testbed's namespaces.
pub const DEFAULT_NAME: &str = "inatb";

/// What sits in the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HubKind {
    /// A kernel bridge, with the UDP software switch on the switch's address.
    Bridge,
    /// The L2 software switch on the hub's raw ports.
    L2,
    /// bmv2's simple_switch running the v1model program on the hub's raw ports.
    Bmv2,
}

impl HubKind {
    fn hub(self) -> Hub {
        match self {
            HubKind::Bridge => Hub::Bridge,
            HubKind::L2 | HubKind::Bmv2 => Hub::Raw,
        }
    }
}

/// The links of a testbed.
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkArgs {
    /// Rate limit of every link direction: `1gbit`, `500mbit`, `200mbit`, `10kbit`, or bits
    /// per second [default: none; `ina bench --testbed`: 1gbit].
    #[arg(long, value_parser = parse_rate)]
    #[serde(default, deserialize_with = "rate_from_text")]
    pub rate: Option<u64>,
    /// Bucket of the rate limit, bytes (default: 1 ms at the rate, at least two frames).
    #[arg(long)]
    #[serde(default)]
    pub burst: Option<u64>,
    /// IP MTU of every link (9000 for jumbo frames).
    #[arg(long, default_value_t = 1500)]
    #[serde(default = "default_mtu")]
    pub mtu: u32,
    /// Probability that a link drops a packet, each direction (steps of 0.001).
    #[arg(long, default_value_t = 0.0)]
    #[serde(default)]
    pub link_loss: f64,
    /// Leave segmentation and checksum offload on (the bridge hub only: then one drop may
    /// lose several packets, and a switch on raw ports would see super-frames).
    #[arg(long)]
    #[serde(default)]
    pub offloads: bool,
}

fn default_mtu() -> u32 {
    1500
}

fn rate_from_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    text.map(|t| parse_rate(&t).map_err(serde::de::Error::custom))
        .transpose()
}

/// Parses `1gbit`, `500mbit`, `20kbit`, `1.5gbit` or plain bits per second.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = if let Some(n) = t.strip_suffix("gbit") {
        (n, 1e9)
    } else if let Some(n) = t.strip_suffix("mbit") {
        (n, 1e6)
    } else if let Some(n) = t.strip_suffix("kbit") {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix("bit") {
        (n, 1.0)
    } else {
        (t.as_str(), 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("rate `{s}`: a number with gbit, mbit or kbit"))?;
    let bps = v * mult;
    if !(bps.is_finite() && bps >= 1000.0) {
        return Err(format!("rate `{s}`: at least 1kbit"));
    }
    Ok(bps as u64)
}

/// Formats bits per second as tc would read them.
pub fn fmt_rate(bps: u64) -> String {
    if bps.is_multiple_of(1_000_000_000) {
        format!("{}gbit", bps / 1_000_000_000)
    } else if bps.is_multiple_of(1_000_000) {
        format!("{}mbit", bps / 1_000_000)
    } else {
        format!("{bps}bit")
    }
}

impl LinkArgs {
    /// The rack these links make.
    pub fn rack_config(&self, name: &str, workers: usize, hub: HubKind) -> RackConfig {
        RackConfig {
            prefix: name.to_string(),
            workers,
            hub: hub.hub(),
            rate_bps: self.rate,
            burst_bytes: self.burst,
            mtu: self.mtu,
            loss: self.link_loss,
            offloads: self.offloads,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct TestbedArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Build a testbed and keep it (root).
    Up(UpArgs),
    /// Remove a testbed: every namespace of its name, also leftovers of a crashed run.
    Down {
        /// Name prefix of the testbed's namespaces.
        #[arg(long, default_value = DEFAULT_NAME)]
        name: String,
    },
    /// Show a testbed: its configuration, namespaces, and every link's counters.
    Status {
        #[arg(long, default_value = DEFAULT_NAME)]
        name: String,
    },
}

#[derive(Debug, clap::Args)]
struct UpArgs {
    /// Name prefix of the testbed's namespaces (letters and digits).
    #[arg(long, default_value = DEFAULT_NAME)]
    name: String,
    /// Worker namespaces.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// What sits in the hub.
    #[arg(long, value_enum, default_value = "bridge")]
    hub: HubKind,
    #[command(flatten)]
    links: LinkArgs,
}

/// What `up` records for `status`.
#[derive(Debug, Serialize, Deserialize)]
struct Recorded {
    name: String,
    workers: usize,
    hub: HubKind,
    links: LinkArgs,
}

fn state_file(name: &str) -> PathBuf {
    PathBuf::from("/run/ina-testbed").join(format!("{name}.json"))
}

pub fn run(args: TestbedArgs) -> anyhow::Result<()> {
    match args.action {
        Action::Up(up) => {
            let cfg = up.links.rack_config(&up.name, up.workers, up.hub);
            let rack = Rack::build(cfg).context("building the testbed")?;
            let recorded = Recorded {
                name: up.name.clone(),
                workers: up.workers,
                hub: up.hub,
                links: up.links.clone(),
            };
            let path = state_file(&up.name);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&path, serde_json::to_string_pretty(&recorded)? + "\n")
                .with_context(|| format!("writing {}", path.display()))?;
            println!(
                "testbed {}: hub {} and {} workers ({}), links {}{}MTU {}",
                up.name,
                rack.hub(),
                up.workers,
                (0..up.workers.min(3))
                    .map(|r| format!("{} {}", rack.worker_ns(r), Rack::worker_ip(r)))
                    .collect::<Vec<_>>()
                    .join(", ")
                    + if up.workers > 3 { ", ..." } else { "" },
                up.links.rate.map_or("unlimited, ".into(), |r| format!(
                    "{} each way, ",
                    fmt_rate(r)
                )),
                if up.links.link_loss > 0.0 {
                    format!("{} loss each way, ", up.links.link_loss)
                } else {
                    String::new()
                },
                up.links.mtu
            );
            match up.hub {
                HubKind::Bridge => println!(
                    "start the switch: ip netns exec {} ina switch --listen {SWITCH_IP}:18766 --job ...",
                    rack.hub()
                ),
                HubKind::L2 => println!(
                    "start the switch: ip netns exec {} ina switch --ports {} --ip {SWITCH_IP} --mac {} --job ...",
                    rack.hub(),
                    rack.ports(),
                    netns::SWITCH_MAC
                ),
                HubKind::Bmv2 => println!(
                    "start bmv2 in {} on ports {} (ina bench --testbed --hub bmv2 does it)",
                    rack.hub(),
                    rack.ports()
                ),
            }
            println!("remove it: ina testbed down --name {}", up.name);
            rack.persist();
            Ok(())
        }
        Action::Down { name } => {
            let removed = netns::remove_prefix(&name);
            let _ = std::fs::remove_file(state_file(&name));
            println!("testbed {name}: removed {removed} namespaces");
            Ok(())
        }
        Action::Status { name } => status(&name),
    }
}

fn status(name: &str) -> anyhow::Result<()> {
    let mut namespaces = netns::namespaces_of(name);
    // The hub first, then the workers by rank.
    namespaces.sort_by_key(|ns| {
        ns.rsplit("-w")
            .next()
            .and_then(|r| r.parse::<usize>().ok())
            .map_or(0, |r| r + 1)
    });
    if namespaces.is_empty() {
        bail!("no testbed named {name} (no namespace {name}-...)");
    }
    match std::fs::read_to_string(state_file(name)) {
        Ok(text) => println!("{}", text.trim()),
        Err(_) => println!("testbed {name}: no record of how it was built"),
    }
    for ns in &namespaces {
        let dev = if ns.ends_with("-hub") {
            None
        } else {
            Some("eth0")
        };
        let out = netns::command_in(Some(ns), "ip")
            .args(["-br", "addr"])
            .output()?;
        println!("{ns}:");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            println!("  {line}");
        }
        if let Some(dev) = dev {
            let q = netns::command_in(Some(ns), "tc")
                .args(["-s", "qdisc", "show", "dev", dev])
                .output()?;
            for line in String::from_utf8_lossy(&q.stdout).lines() {
                println!("  {}", line.trim());
            }
        }
        let n = netns::command_in(Some(ns), "nft")
            .args(["list", "ruleset"])
            .output();
        if let Some(n) = n.ok().filter(|n| n.status.success()) {
            for line in String::from_utf8_lossy(&n.stdout)
                .lines()
                .filter(|l| l.contains("counter"))
            {
                println!("  loss rule: {}", line.trim());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("1gbit").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("500Mbit").unwrap(), 500_000_000);
        assert_eq!(parse_rate("1.5gbit").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate("20000").unwrap(), 20_000);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("0mbit").is_err());
        assert_eq!(fmt_rate(500_000_000), "500mbit");
        assert_eq!(fmt_rate(1_000_000_000), "1gbit");
    }

    #[test]
    fn link_settings_read_from_toml() {
        let l: LinkArgs =
            toml::from_str("rate = \"200mbit\"\nmtu = 9000\nlink_loss = 0.01\n").unwrap();
        assert_eq!(
            (l.rate, l.mtu, l.link_loss),
            (Some(200_000_000), 9000, 0.01)
        );
        assert!(toml::from_str::<LinkArgs>("rate = \"fast\"").is_err());
        assert!(toml::from_str::<LinkArgs>("speed = 1").is_err());
    }
}
