//! Driving bmv2's `simple_switch` with the v1model program: compile it with `p4c-bm2-ss`,
//! start the switch on interfaces (optionally inside a network namespace), configure it with
//! [`crate::runtime::bmv2_commands`] through `simple_switch_CLI`, read its counters, stop it.
//!
//! The tools are looked up on `PATH`, then in `/opt/ina-p4tools/bin` (where the P4 tool bundle
//! installs them).

use crate::runtime::{bmv2_commands, bmv2_counter_commands, ConfigError, JobDesc, SwitchDesc};
use ina_proto::event::Event;
use std::io::Write;
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
    let json = dir.join("ina.json");
    let out = Command::new(tool("p4c-bm2-ss")?)
        .args([
            "--std", "p4-16", "--target", "bmv2", "--arch", "v1model", "-o",
        ])
        .arg(&json)
        .arg(&src)
        .output()
        .map_err(io_err("running p4c-bm2-ss"))?;
    if !out.status.success() {
        return Err(Bmv2Error::Compile(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(json)
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
    /// Where simple_switch's output goes.
    pub log_file: PathBuf,
}

/// A running `simple_switch`, killed on drop.
#[derive(Debug)]
pub struct Bmv2 {
    child: Child,
    cfg: Bmv2Config,
}

fn in_netns(netns: Option<&str>, program: &Path) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

impl Bmv2 {
    /// Starts `simple_switch` and waits until its runtime CLI answers.
    pub fn start(cfg: Bmv2Config) -> Result<Bmv2, Bmv2Error> {
        let log = std::fs::File::create(&cfg.log_file)
            .map_err(io_err(format!("creating {}", cfg.log_file.display())))?;
        let log2 = log
            .try_clone()
            .map_err(io_err("duplicating the log file"))?;
        let mut cmd = in_netns(cfg.netns.as_deref(), &tool("simple_switch")?);
        for (n, ifname) in &cfg.ports {
            cmd.arg("-i").arg(format!("{n}@{ifname}"));
        }
        cmd.arg("--thrift-port")
            .arg(cfg.thrift_port.to_string())
            .arg("--log-level")
            .arg("off")
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
            if sw.cli(&["show_ports".to_string()]).is_ok() {
                return Ok(sw);
            }
            if Instant::now() > deadline {
                return Err(Bmv2Error::Start {
                    port: sw.cfg.thrift_port,
                    waited,
                    log: sw.log(),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// simple_switch's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.cfg.log_file).unwrap_or_default()
    }

    /// Runs `commands` through `simple_switch_CLI`; returns its output. Fails if the CLI
    /// cannot connect or reports an error for any command.
    pub fn cli(&self, commands: &[String]) -> Result<String, Bmv2Error> {
        let mut child = in_netns(self.cfg.netns.as_deref(), &tool("simple_switch_CLI")?)
            .arg("--thrift-port")
            .arg(self.cfg.thrift_port.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io_err("starting simple_switch_CLI"))?;
        if let Some(mut stdin) = child.stdin.take() {
            let text = commands.join("\n") + "\n";
            stdin
                .write_all(text.as_bytes())
                .map_err(io_err("writing to simple_switch_CLI"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(io_err("running simple_switch_CLI"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let failed = !out.status.success()
            || text.lines().any(|l| {
                let l = l.trim_start_matches("RuntimeCmd: ");
                l.starts_with("Error")
                    || l.contains("Invalid")
                    || l.contains("Could not connect")
                    || l.contains("Traceback")
            });
        if failed {
            return Err(Bmv2Error::Cli(text));
        }
        Ok(text)
    }

    /// Configures the switch and its jobs ([`bmv2_commands`]).
    pub fn configure(&self, sw: &SwitchDesc, jobs: &[JobDesc]) -> Result<(), Bmv2Error> {
        self.cli(&bmv2_commands(sw, jobs)?).map(|_| ())
    }

    /// Every event counter (packets), by [`Event::index`], and the multicast results.
    pub fn counters(&self) -> Result<([u64; Event::COUNT], u64), Bmv2Error> {
        let text = self.cli(&bmv2_counter_commands())?;
        let packets: Vec<u64> = text
            .lines()
            .filter_map(|l| {
                // `RuntimeCmd: InaIngress.ina_events[4]= (210 bytes, 3 packets)`
                let head = &l[..l.find(" packets)")?];
                head.rsplit(' ').next()?.parse().ok()
            })
            .collect();
        if packets.len() != Event::COUNT + 1 {
            return Err(Bmv2Error::Counter(text));
        }
        let mut events = [0; Event::COUNT];
        events.copy_from_slice(&packets[..Event::COUNT]);
        Ok((events, packets[Event::COUNT]))
    }
}

impl Drop for Bmv2 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
