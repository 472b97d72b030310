//! `ina controller` (the daemon), `ina job ...` and `ina switch add|list|drain` (its clients).

use anyhow::Context;
use ina_controller::alloc::{Policy, BLOCK};
use ina_controller::api::{
    JobRequest, JobState, JobStatus, Place, SwitchInfo, SwitchKind, SwitchSpec,
};
use ina_controller::client::Client;
use ina_controller::server::{self, ServerConfig};
use ina_controller::service::{drivers_with, Controller, LocalDrivers};
use ina_controller::store::Store;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The controller's default address.
const DEFAULT_ADDR: &str = "127.0.0.1:7070";

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PolicyArg {
    /// Jobs keep their range; a new job takes the first hole that fits, or queues.
    FirstFit,
    /// Max-min fair shares; running jobs shrink and grow as others come and go.
    FairShare,
    /// Strict priority; a lower job loses slots (between its streams) or queues.
    Priority,
}

impl From<PolicyArg> for Policy {
    fn from(p: PolicyArg) -> Policy {
        match p {
            PolicyArg::FirstFit => Policy::FirstFit,
            PolicyArg::FairShare => Policy::FairShare,
            PolicyArg::Priority => Policy::Priority,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    /// Address of the HTTP/JSON API. Every request needs the access token; beyond loopback
    /// it must be given (--token).
    #[arg(long, default_value = DEFAULT_ADDR)]
    listen: SocketAddr,
    /// Directory of the state file, kept across restarts.
    #[arg(long, default_value = "ina-controller")]
    state_dir: PathBuf,
    /// How slots are shared when jobs want more than a switch holds.
    #[arg(long, value_enum, default_value = "fair-share")]
    policy: PolicyArg,
    /// Access token every request must carry (Authorization: Bearer TOKEN), 16 to 256
    /// printable characters. Without it, on loopback, the controller uses the one in
    /// STATE_DIR/token, which it makes (readable by its user only) on its first start.
    #[arg(long, env = "INA_CONTROLLER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// How often every switch is brought back to the state (a restarted switch is provisioned
    /// again within this time), milliseconds.
    #[arg(long, default_value_t = 2000)]
    resync_ms: u64,
    /// Serve the controller's counters in Prometheus' text format on this address.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Where the Tofino switches' BfRt documents are written, `NAME.json` for switch NAME
    /// [default: STATE_DIR/tofino].
    #[arg(long)]
    tofino_dir: Option<PathBuf>,
    /// Run bmv2 switch NAME's runtime CLI in network namespace NETNS (`NAME=NETNS`; repeat
    /// for several switches). The API takes no namespace or path: only this command line does.
    #[arg(long, value_parser = parse_netns)]
    bmv2_netns: Vec<(String, String)>,
}

/// Parses `NAME=NETNS`.
fn parse_netns(s: &str) -> Result<(String, String), String> {
    let (name, ns) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: NAME=NETNS"))?;
    let ok = |t: &str| {
        !t.is_empty()
            && t.len() <= 64
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    };
    if !ok(name) || !ok(ns) {
        return Err(format!(
            "`{s}`: a switch name and a namespace of letters, digits, `.`, `_` and `-`"
        ));
    }
    Ok((name.to_string(), ns.to_string()))
}

/// Where the controller is.
#[derive(Debug, clap::Args)]
pub struct Connect {
    /// The controller's API address.
    #[arg(long, env = "INA_CONTROLLER", default_value = DEFAULT_ADDR, global = true)]
    controller: String,
    /// Its access token.
    #[arg(
        long,
        env = "INA_CONTROLLER_TOKEN",
        hide_env_values = true,
        global = true
    )]
    token: Option<String>,
    /// A file holding its access token, without --token (a controller started without
    /// --token keeps its own in STATE_DIR/token) [default: ina-controller/token, for a
    /// controller on loopback].
    #[arg(long, env = "INA_CONTROLLER_TOKEN_FILE", global = true)]
    token_file: Option<PathBuf>,
}

impl Connect {
    fn client(&self) -> anyhow::Result<Client> {
        let token = client_token(
            &self.controller,
            self.token.clone(),
            self.token_file.as_deref(),
        )?;
        Ok(Client::new(&self.controller, token))
    }
}

/// Where a client on the controller's host finds the token of a controller started without
/// --token and its default --state-dir.
const DEFAULT_TOKEN_FILE: &str = "ina-controller/token";

/// The token a client of the controller at `controller` presents: `token`, else the one in
/// `token_file`, else, when the controller is on loopback, the one in `ina-controller/token`
/// if that file exists (if not, the controller's refusal says where the token is).
pub(crate) fn client_token(
    controller: &str,
    token: Option<String>,
    token_file: Option<&std::path::Path>,
) -> anyhow::Result<Option<String>> {
    if token.is_some() {
        return Ok(token);
    }
    if let Some(path) = token_file {
        let t = ina_controller::token::read(path).context("--token-file")?;
        return Ok(Some(t));
    }
    let default = std::path::Path::new(DEFAULT_TOKEN_FILE);
    if !on_loopback(controller) || !default.exists() {
        return Ok(None);
    }
    let t = ina_controller::token::read(default)
        .context("the controller's token, in its default state directory")?;
    Ok(Some(t))
}

/// Whether `controller` (`HOST:PORT`) is on this host's loopback.
fn on_loopback(controller: &str) -> bool {
    match controller.parse::<SocketAddr>() {
        Ok(a) => a.ip().is_loopback(),
        Err(_) => controller
            .rsplit_once(':')
            .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost")),
    }
}

#[derive(Debug, clap::Args)]
pub struct JobArgs {
    #[command(subcommand)]
    command: JobCommand,
    #[command(flatten)]
    connect: Connect,
}

#[derive(Debug, clap::Subcommand)]
enum JobCommand {
    /// Create a job: the controller gives it slots on a switch and installs it there.
    Create {
        name: String,
        /// The workers' UDP addresses, in rank order.
        #[arg(long, value_delimiter = ',', required_unless_present = "size")]
        workers: Vec<SocketAddr>,
        /// Workers in the job, when they join with their addresses (`ina worker --controller
        /// ADDR --job-name NAME`) instead of being listed here. Where the switches are
        /// declared with racks, the job goes where its workers are once all have joined: on
        /// their rack switch, or as a tree over their racks (up to 1024 workers).
        #[arg(long, conflicts_with = "workers")]
        size: Option<u16>,
        /// Elements per packet.
        #[arg(long, default_value_t = 256)]
        elems: u16,
        /// Slots wanted (the window), whole blocks of 64 (default: 256, or twelve
        /// bandwidth-delay products of --link-gbps and --rtt-us).
        #[arg(long, conflicts_with = "link_gbps")]
        window: Option<u16>,
        /// The workers' link speed, Gbit/s: with --rtt-us, sizes the window to twelve
        /// bandwidth-delay products of the round trip to the switch.
        #[arg(long, requires = "rtt_us")]
        link_gbps: Option<f64>,
        /// The round trip between a worker and the switch, microseconds (with --link-gbps).
        #[arg(long, requires = "link_gbps")]
        rtt_us: Option<f64>,
        /// Slots it can run with, whole blocks of 64 (default: one block).
        #[arg(long)]
        min_window: Option<u16>,
        /// Priority (higher first, under --policy priority).
        #[arg(long, default_value_t = 0)]
        priority: u8,
        /// The switch its workers are attached to (default: the first with room).
        #[arg(long)]
        switch: Option<String>,
        /// Workers joined with --job-name send a heartbeat this often, milliseconds; a worker
        /// silent for three periods fails the job (removed from its switch, the others told
        /// which ranks went silent).
        #[arg(long)]
        heartbeat_ms: Option<u32>,
    },
    /// List the jobs.
    List,
    /// Show one job as JSON.
    Show { name: String },
    /// Delete a job: its slots go back to the pool.
    Delete { name: String },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum KindArg {
    Software,
    Bmv2,
    Tofino,
}

impl From<KindArg> for SwitchKind {
    fn from(k: KindArg) -> SwitchKind {
        match k {
            KindArg::Software => SwitchKind::Software,
            KindArg::Bmv2 => SwitchKind::Bmv2,
            KindArg::Tofino => SwitchKind::Tofino,
        }
    }
}

// (Parsed once per run: the size of the enum's largest variant costs nothing.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, clap::Subcommand)]
pub enum SwitchCommand {
    /// Add a switch to the controller: a software switch (its --control endpoint), a bmv2
    /// (its thrift server) or a Tofino (its BfRt entries file), the last two with --p4.
    Add {
        name: String,
        /// What kind of switch.
        #[arg(long, value_enum, default_value_t = KindArg::Software)]
        kind: KindArg,
        /// The switch's control endpoint (bmv2: its thrift server; tofino: its BfRt server).
        #[arg(long)]
        control: SocketAddr,
        /// The switch's UDP address, which its workers send to (a P4 switch: its IPv4 address
        /// and ina's UDP port, the default).
        #[arg(long, required_if_eq("kind", "software"))]
        data: Option<SocketAddr>,
        /// Slots in its pool (the software switch's --pool-slots; a P4 switch: its program's
        /// pool, the default).
        #[arg(long, required_if_eq("kind", "software"))]
        slots: Option<u16>,
        /// Elements per slot (the software switch's --max-elems; the Tofino program: 64).
        #[arg(long)]
        elems: Option<u16>,
        /// bmv2 and tofino: a JSON file describing the switch's data plane (its address,
        /// ports, L2 table and worker hosts; see docs/CONTROLLER.md).
        #[arg(long, required_if_eq_any([("kind", "bmv2"), ("kind", "tofino")]))]
        p4: Option<std::path::PathBuf>,
        /// The switch's control token (its --control-token), if it has one.
        #[arg(long, env = "INA_SWITCH_TOKEN", hide_env_values = true)]
        control_token: Option<String>,
        /// Its place: the switch of rack NAME, with the hosts under it (--hosts).
        #[arg(long, value_name = "NAME", requires = "hosts", conflicts_with_all = ["upper", "aggregator_on"])]
        rack: Option<String>,
        /// The addresses of the hosts under the rack switch, comma-separated.
        #[arg(long, value_delimiter = ',', requires = "rack")]
        hosts: Vec<std::net::IpAddr>,
        /// Its place: an upper switch, which the rack switches under it name with --under.
        #[arg(long, conflicts_with = "aggregator_on")]
        upper: bool,
        /// The upper switch this rack or upper switch is under.
        #[arg(long, value_name = "SWITCH", conflicts_with = "aggregator_on")]
        under: Option<String>,
        /// A rack switch's UDP address as its upper switch sees it, where that is not --data
        /// (one address toward its hosts, another toward its upper switch).
        #[arg(long, value_name = "ADDR", requires = "rack")]
        up_data: Option<SocketAddr>,
        /// Its place: a software switch on the host with address ADDR, an aggregator for jobs
        /// the switches have no room for.
        #[arg(long, value_name = "ADDR")]
        aggregator_on: Option<std::net::IpAddr>,
        #[command(flatten)]
        connect: Connect,
    },
    /// List the controller's switches, as the tree their places make.
    List {
        #[command(flatten)]
        connect: Connect,
    },
    /// Stop placing new jobs on a switch; its jobs run on.
    Drain {
        name: String,
        #[command(flatten)]
        connect: Connect,
    },
}

/// Runs the controller until SIGINT or SIGTERM.
pub fn run_daemon(args: ControllerArgs) -> anyhow::Result<()> {
    let (token, token_file) =
        ina_controller::token::resolve(args.listen, args.token.clone(), &args.state_dir)?;
    let store = Store::open(&args.state_dir)?;
    let local = LocalDrivers {
        tofino_dir: args
            .tofino_dir
            .clone()
            .unwrap_or_else(|| args.state_dir.join("tofino")),
        bmv2_netns: args.bmv2_netns.iter().cloned().collect(),
    };
    std::fs::create_dir_all(&local.tofino_dir)
        .with_context(|| format!("creating {}", local.tofino_dir.display()))?;
    let ctl = Controller::open(args.policy.into(), Some(store), drivers_with(local))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let config = ServerConfig {
        token,
        resync_every: Duration::from_millis(args.resync_ms.max(10)),
        metrics: args.metrics,
        ..ServerConfig::default()
    };
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let addr = listener.local_addr()?;
        println!(
            "{}",
            serde_json::json!({"event": "ready", "api": addr.to_string(), "state_dir": args.state_dir, "token_file": token_file})
        );
        server::serve(listener, ctl, config, shutdown_signal()).await?;
        println!("{}", serde_json::json!({"event": "stopped"}));
        anyhow::Ok(())
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

pub fn run_job(args: JobArgs) -> anyhow::Result<()> {
    let c = args.connect.client()?;
    match args.command {
        JobCommand::Create {
            name,
            workers,
            size,
            elems,
            window,
            link_gbps,
            rtt_us,
            min_window,
            priority,
            switch,
            heartbeat_ms,
        } => {
            let window = match (window, link_gbps, rtt_us) {
                (Some(w), _, _) => w,
                (None, Some(g), Some(r)) => {
                    if !(g.is_finite() && g > 0.0 && r.is_finite() && r > 0.0) {
                        anyhow::bail!("--link-gbps and --rtt-us must be positive numbers");
                    }
                    ina_controller::alloc::window_for(g, r, elems)
                }
                _ => 256,
            };
            let info = c.create_job(&JobRequest {
                name,
                workers,
                size,
                elems_per_packet: elems,
                window,
                min_window: Some(min_window.unwrap_or(BLOCK.min(window))),
                priority,
                switch,
                heartbeat_ms,
            })?;
            print_json(&info)
        }
        JobCommand::List => {
            let jobs = c.jobs()?;
            println!(
                "{:<20} {:>5} {:<16} {:<8} {:>13} {:>7} {:>8} {:>6}",
                "name", "id", "switch", "state", "slots", "window", "workers", "epoch"
            );
            for j in jobs {
                println!("{}", job_line(&j));
            }
            Ok(())
        }
        JobCommand::Show { name } => print_json(&c.job(&name)?),
        JobCommand::Delete { name } => {
            c.delete_job(&name)?;
            println!("{}", serde_json::json!({"deleted": name}));
            Ok(())
        }
    }
}

fn job_line(j: &JobStatus) -> String {
    let slots = j
        .slots
        .map(|r| format!("{}..{}", r.base, r.end()))
        .unwrap_or_else(|| "-".into());
    let state = match j.state {
        JobState::Queued => "queued",
        JobState::Running => "running",
        JobState::Failed => "failed",
    };
    let switch = match j.racks.len() {
        0 if j.switch.is_empty() => "-".to_string(),
        0 => j.switch.clone(),
        n => format!("{} ({n} racks)", j.switch),
    };
    format!(
        "{:<20} {:>5} {:<16} {:<8} {:>13} {:>7} {:>8} {:>6}",
        j.request.name,
        j.id,
        switch,
        state,
        slots,
        j.request.window,
        j.size,
        j.epoch.map(|e| e.to_string()).unwrap_or_else(|| "-".into())
    )
}

pub fn run_switch(cmd: SwitchCommand) -> anyhow::Result<()> {
    match cmd {
        SwitchCommand::Add {
            name,
            kind,
            control,
            data,
            slots,
            elems,
            p4,
            control_token,
            rack,
            hosts,
            upper,
            under,
            up_data,
            aggregator_on,
            connect,
        } => {
            let kind = SwitchKind::from(kind);
            let place = match (rack, upper, aggregator_on) {
                (Some(rack), _, _) => Place::Rack {
                    rack,
                    hosts,
                    under,
                    up_data,
                },
                (None, true, _) => Place::Upper { under },
                (None, false, Some(host)) => Place::Aggregator { host },
                (None, false, None) => {
                    if let Some(u) = under {
                        anyhow::bail!(
                            "--under {u}: only a rack switch (--rack) or an upper switch (--upper) is under another"
                        );
                    }
                    Place::Unplaced
                }
            };
            let p4 = match (&p4, kind) {
                (Some(path), SwitchKind::Bmv2 | SwitchKind::Tofino) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("reading --p4 {}", path.display()))?;
                    Some(
                        serde_json::from_str::<ina_controller::api::P4Spec>(&text)
                            .with_context(|| format!("--p4 {}", path.display()))?,
                    )
                }
                (Some(_), SwitchKind::Software) => {
                    anyhow::bail!(
                        "--p4 describes a bmv2 or tofino switch: add --kind bmv2 or --kind tofino"
                    )
                }
                (None, _) => None,
            };
            let (pool, most) = match kind {
                SwitchKind::Software => (0, 256),
                SwitchKind::Bmv2 => (ina_switch_p4::v1model::POOL_SLOTS, 256),
                SwitchKind::Tofino => (
                    u16::try_from(ina_switch_p4::tna::POOL_SLOTS).unwrap_or(u16::MAX),
                    ina_switch_p4::tna::ELEMS,
                ),
            };
            let data = match (data, &p4) {
                (Some(d), _) => d,
                (None, Some(p4)) => SocketAddr::from((p4.switch.ip, ina_wire::agg::UDP_PORT)),
                (None, None) => anyhow::bail!("--data is required"),
            };
            print_json(&connect.client()?.add_switch(&SwitchSpec {
                name,
                kind,
                control,
                data,
                slots: slots.unwrap_or(pool),
                elems_per_slot: elems.unwrap_or(most),
                token: control_token,
                p4,
                place,
            })?)
        }
        SwitchCommand::List { connect } => {
            let switches = connect.client()?.switches()?;
            println!(
                "{:<22} {:<22} {:<9} {:>6} {:>6} {:>5}  place",
                "name", "control", "state", "slots", "free", "jobs"
            );
            for line in switch_tree(&switches) {
                println!("{line}");
            }
            Ok(())
        }
        SwitchCommand::Drain { name, connect } => {
            print_json(&connect.client()?.drain_switch(&name)?)
        }
    }
}

/// The switches as the tree their places make: each switch followed by those under it,
/// indented; switches under none (or under one not listed) at the left.
fn switch_tree(switches: &[SwitchInfo]) -> Vec<String> {
    let listed = |name: &str| switches.iter().any(|s| s.spec.name == name);
    let mut lines = Vec::new();
    let roots = switches
        .iter()
        .filter(|s| s.spec.place.under().is_none_or(|u| !listed(u)));
    for s in roots {
        tree_lines(switches, s, "", &mut lines, 0);
    }
    lines
}

fn tree_lines(
    switches: &[SwitchInfo],
    s: &SwitchInfo,
    prefix: &str,
    lines: &mut Vec<String>,
    depth: usize,
) {
    lines.push(switch_line(s, prefix));
    // (A listed cycle, which the controller refuses, would stop here.)
    if depth > ina_controller::topology::MAX_LEVELS {
        return;
    }
    let below: Vec<&SwitchInfo> = switches
        .iter()
        .filter(|c| c.spec.place.under() == Some(s.spec.name.as_str()))
        .collect();
    let indent: String = prefix.replace("├─ ", "│  ").replace("└─ ", "   ");
    for (i, c) in below.iter().enumerate() {
        let branch = if i + 1 == below.len() {
            "└─ "
        } else {
            "├─ "
        };
        tree_lines(switches, c, &format!("{indent}{branch}"), lines, depth + 1);
    }
}

fn switch_line(s: &SwitchInfo, prefix: &str) -> String {
    let state = match s.state {
        ina_controller::api::SwitchState::Active => "active",
        ina_controller::api::SwitchState::Draining => "draining",
    };
    let place = match &s.spec.place {
        Place::Unplaced => "-".to_string(),
        Place::Rack { rack, hosts, .. } => match hosts.len() {
            1 => format!("rack {rack} (1 host)"),
            n => format!("rack {rack} ({n} hosts)"),
        },
        Place::Upper { .. } => "upper".to_string(),
        Place::Aggregator { host } => format!("aggregator on {host}"),
    };
    let name = format!("{prefix}{}", s.spec.name);
    format!(
        "{:<22} {:<22} {:<9} {:>6} {:>6} {:>5}  {place}",
        name,
        s.spec.control.to_string(),
        state,
        s.spec.slots,
        s.free_slots,
        s.jobs.len()
    )
}

fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
