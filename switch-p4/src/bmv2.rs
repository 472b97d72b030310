//! Driving bmv2's `simple_switch` with the v1model program: compile it with `p4c-bm2-ss`,
//! start the switch on interfaces (optionally inside a network namespace), configure it with
//! [`crate::runtime::bmv2_commands`] through `simple_switch_CLI`, read its counters, stop it.
//!
//! The tools are looked up on `PATH`, then in `/opt/ina-p4tools/bin` (where the P4 tool bundle
//! installs them).

use crate::runtime::{bmv2_commands, bmv2_counter_commands, ConfigError, P4Job, SwitchDesc};
use ina_io::netns;
use ina_proto::event::{Event, MISSING_COUNTERS};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the P4 tool bundle installs its binaries.
pub const BUNDLE_BIN: &str = "/opt/ina-p4tools/bin";

/// Why bmv2 cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Bmv2Error {
    #[error("{tool} not found on PATH nor in {BUNDLE_BIN}: install p4c and bmv2 (README.md, \"P4 targets\")")]
    NotInstalled { tool: &'static str },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("p4c-bm2-ss failed:\n{0}")]
    Compile(String),
    #[error("simple_switch did not start listening on thrift port {port} within {waited:?}; its output:\n{log}")]
    Start {
        port: u16,
        waited: Duration,
        log: String,
    },
    #[error("simple_switch exited early ({status}); its output:\n{log}")]
    Exited { status: String, log: String },
    #[error("simple_switch_CLI refused a command: {0}")]
    Cli(String),
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("unexpected counter output: {0}")]
    Counter(String),
    #[error("unexpected simple_switch_CLI output: {0}")]
    Output(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Bmv2Error {
    let what = what.into();
    move |source| Bmv2Error::Io { what, source }
}

/// The path of `tool`: on `PATH`, else in the bundle.
pub fn tool(tool: &'static str) -> Result<PathBuf, Bmv2Error> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    });
    on_path
        .or_else(|| Some(Path::new(BUNDLE_BIN).join(tool)).filter(|p| p.is_file()))
        .ok_or(Bmv2Error::NotInstalled { tool })
}

/// Whether the bmv2 tools are installed.
pub fn available() -> bool {
    ["p4c-bm2-ss", "simple_switch", "simple_switch_CLI"]
        .iter()
        .all(|t| tool(t).is_ok())
}

/// Writes the v1model program into `dir` and compiles it; returns the bmv2 JSON's path.
pub fn compile_v1model(dir: &Path) -> Result<PathBuf, Bmv2Error> {
    std::fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
    let src = dir.join("ina.p4");
    std::fs::write(&src, crate::v1model::program())
        .map_err(io_err(format!("writing {}", src.display())))?;
    compile(&src, &dir.join("ina.json"))
}

/// Compiles the v1model program `src` into bmv2's JSON `json`; returns `json`.
pub fn compile(src: &Path, json: &Path) -> Result<PathBuf, Bmv2Error> {
    let out = Command::new(tool("p4c-bm2-ss")?)
        .args([
            "--std", "p4-16", "--target", "bmv2", "--arch", "v1model", "-o",
        ])
        .arg(json)
        .arg(src)
        .output()
        .map_err(io_err("running p4c-bm2-ss"))?;
    if !out.status.success() {
        return Err(Bmv2Error::Compile(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(json.to_path_buf())
}

/// How to start `simple_switch`.
#[derive(Debug, Clone)]
pub struct Bmv2Config {
    /// The compiled program (see [`compile_v1model`]).
    pub program: PathBuf,
    /// `(port number, interface)` of every port.
    pub ports: Vec<(u16, String)>,
    /// The thrift port of the runtime CLI.
    pub thrift_port: u16,
    /// The network namespace to run in (`None`: this one).
    pub netns: Option<String>,
    /// Where simple_switch's output goes. Its notification socket is made next to it (the
    /// default, in /tmp, is shared by every bmv2 on the machine whatever its namespace, so a
    /// second one would not start).
    pub log_file: PathBuf,
    /// Where to log every packet's path through the program, if anywhere (slow).
    pub packet_log: Option<PathBuf>,
}

/// A running `simple_switch`, killed on drop.
#[derive(Debug)]
pub struct Bmv2 {
    child: Child,
    cfg: Bmv2Config,
}

impl Bmv2 {
    /// Starts `simple_switch` and waits until its runtime CLI answers.
    pub fn start(cfg: Bmv2Config) -> Result<Bmv2, Bmv2Error> {
        let log = std::fs::File::create(&cfg.log_file)
            .map_err(io_err(format!("creating {}", cfg.log_file.display())))?;
        let log2 = log
            .try_clone()
            .map_err(io_err("duplicating the log file"))?;
        let mut cmd = netns::command_in(cfg.netns.as_deref(), tool("simple_switch")?);
        for (n, ifname) in &cfg.ports {
            cmd.arg("-i").arg(format!("{n}@{ifname}"));
        }
        let notifications = cfg.log_file.with_extension("notifications.ipc");
        cmd.arg("--notifications-addr")
            .arg(format!("ipc://{}", notifications.display()));
        match &cfg.packet_log {
            Some(path) => cmd.arg("--log-file").arg(path).arg("--log-flush"),
            None => cmd.arg("--log-level").arg("off"),
        };
        cmd.arg("--thrift-port")
            .arg(cfg.thrift_port.to_string())
            .arg(&cfg.program)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let child = cmd.spawn().map_err(io_err("starting simple_switch"))?;
        let mut sw = Bmv2 { child, cfg };
        let waited = Duration::from_secs(30);
        let deadline = Instant::now() + waited;
        loop {
            if let Ok(Some(status)) = sw.child.try_wait() {
                return Err(Bmv2Error::Exited {
                    status: status.to_string(),
                    log: sw.log(),
                });
            }
            if sw.thrift_listening() {
                return Ok(sw);
            }
            if Instant::now() > deadline {
                return Err(Bmv2Error::Start {
                    port: sw.cfg.thrift_port,
                    waited,
                    log: sw.log(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the thrift server accepts connections (from inside the switch's namespace).
    fn thrift_listening(&self) -> bool {
        let port = self.cfg.thrift_port;
        let probe = move || {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        };
        match &self.cfg.netns {
            None => probe(),
            Some(ns) => netns::in_netns(ns, probe).unwrap_or(false),
        }
    }

    /// simple_switch's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.cfg.log_file).unwrap_or_default()
    }

    /// Runs `commands` through `simple_switch_CLI`; returns its output. Fails if the CLI
    /// cannot connect or reports an error for any command.
    pub fn cli(&self, commands: &[String]) -> Result<String, Bmv2Error> {
        self.runtime().run(commands)
    }

    /// The runtime CLI of this switch (from its own namespace).
    pub fn runtime(&self) -> crate::bmv2_cli::Bmv2Cli {
        let mut cli = crate::bmv2_cli::Bmv2Cli::new(std::net::SocketAddr::from((
            [127, 0, 0, 1],
            self.cfg.thrift_port,
        )));
        cli.netns = self.cfg.netns.clone();
        cli
    }

    /// Configures the switch and its jobs ([`bmv2_commands`]).
    pub fn configure(&self, sw: &SwitchDesc, jobs: &[P4Job]) -> Result<(), Bmv2Error> {
        self.cli(&bmv2_commands(sw, jobs)?).map(|_| ())
    }

    /// Every counter of the program.
    pub fn counters(&self) -> Result<Bmv2Counters, Bmv2Error> {
        let text = self.cli(&bmv2_counter_commands())?;
        parse_counters(&text)
    }
}

/// The counters of the v1model program, in packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bmv2Counters {
    /// `ina_events`, by [`Event::index`].
    pub events: [u64; Event::COUNT],
    /// `ina_multicast`: results multicast.
    pub multicast: u64,
    /// `ina_missing`, by [`ina_proto::event::MISSING_SENT`] and
    /// [`ina_proto::event::MISSING_RECEIVED`].
    pub missing: [u64; MISSING_COUNTERS],
}

/// Parses `simple_switch_CLI`'s answers to [`bmv2_counter_commands`]: lines such as
/// `RuntimeCmd: InaIngress.ina_events[4]= (210 bytes, 3 packets)`.
pub fn parse_counters(text: &str) -> Result<Bmv2Counters, Bmv2Error> {
    let mut events = [0; Event::COUNT];
    let mut multicast = 0;
    let mut missing = [0; MISSING_COUNTERS];
    let mut seen = 0;
    for line in text.lines() {
        let Some(end) = line.find(" packets)") else {
            continue;
        };
        let value: u64 = line[..end]
            .rsplit(' ')
            .next()
            .and_then(|d| d.parse().ok())
            .ok_or_else(|| Bmv2Error::Counter(line.to_string()))?;
        let index_after = |name: &str| -> Result<Option<usize>, Bmv2Error> {
            let Some(i) = line.find(name) else {
                return Ok(None);
            };
            line[i + name.len()..]
                .split(']')
                .next()
                .and_then(|d| d.parse().ok())
                .map(Some)
                .ok_or_else(|| Bmv2Error::Counter(line.to_string()))
        };
        if let Some(index) = index_after("ina_events[")? {
            let slot = events
                .get_mut(index)
                .ok_or_else(|| Bmv2Error::Counter(line.to_string()))?;
            *slot = value;
            seen += 1;
        } else if let Some(index) = index_after("ina_missing[")? {
            let slot = missing
                .get_mut(index)
                .ok_or_else(|| Bmv2Error::Counter(line.to_string()))?;
            *slot = value;
            seen += 1;
        } else if line.contains("ina_multicast") {
            multicast = value;
            seen += 1;
        }
    }
    let all = Event::COUNT + 1 + MISSING_COUNTERS;
    if seen != all {
        return Err(Bmv2Error::Counter(format!(
            "read {seen} of {all} counters in:\n{text}"
        )));
    }
    Ok(Bmv2Counters {
        events,
        multicast,
        missing,
    })
}

impl Drop for Bmv2 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_parse_by_index_and_refuse_partial_output() {
        let mut text = String::from("Obtaining JSON from switch...\nDone\n");
        for i in (0..Event::COUNT).rev() {
            text += &format!(
                "RuntimeCmd: InaIngress.ina_events[{i}]= ({} bytes, {} packets)\n",
                i * 100,
                i * 2
            );
        }
        text += "RuntimeCmd: InaIngress.ina_multicast[0]= (840 bytes, 7 packets)\n";
        text += "RuntimeCmd: InaIngress.ina_missing[1]= (16 bytes, 1 packets)\n";
        text += "RuntimeCmd: InaIngress.ina_missing[0]= (48 bytes, 3 packets)\n";
        let c = parse_counters(&text).unwrap();
        assert_eq!((c.multicast, c.missing), (7, [3, 1]));
        for (i, e) in c.events.iter().enumerate() {
            assert_eq!(*e, 2 * i as u64);
        }
        let cut: String = text.lines().skip(3).collect::<Vec<_>>().join("\n");
        assert!(matches!(parse_counters(&cut), Err(Bmv2Error::Counter(_))));
        let bad = text.replace("ina_events[3]", "ina_events[99]");
        assert!(parse_counters(&bad).is_err());
        let bad = text.replace("ina_missing[1]", "ina_missing[2]");
        assert!(parse_counters(&bad).is_err());
    }
}
