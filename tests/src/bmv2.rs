//! bmv2's `simple_switch` running the generated v1model program, as a target.
//!
//! [`Bmv2Target::new`] compiles the committed `switch-p4/v1model/ina.p4` with `p4c-bm2-ss`
//! into a temporary directory and sets up a [`TestNet`] (a network namespace with a veth pair per
//! port). Each [`Target::configure`] starts a fresh `simple_switch` on the `swP` interfaces
//! (no logging; `INA_BMV2_LOG=1` keeps a packet log in the scratch directory) and pipes the
//! runtime module's commands into `simple_switch_CLI`; counters are read with
//! `counter_read`. Dropping the target stops the switch it started and deletes the namespace.

use crate::netns::{in_netns, run, TestNet};
use crate::scenario::Counts;
use crate::{Target, TargetError};
use ina_proto::event::Event;
use ina_switch_p4::runtime::{bmv2_commands, bmv2_counter_commands, JobDesc, SwitchDesc};
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The thrift port of `simple_switch` inside the namespace.
const THRIFT_PORT: u16 = 9090;

/// The P4 tools the target needs.
#[derive(Debug, Clone)]
pub struct Tools {
    pub p4c: PathBuf,
    pub simple_switch: PathBuf,
    pub cli: PathBuf,
}

/// Where a tool is: on the `PATH`, else in the toolchain bundle's default prefix.
pub fn tool(name: &str) -> Option<PathBuf> {
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let c = dir.join(name);
            if c.is_file() {
                return Some(c);
            }
        }
    }
    let bundled = Path::new("/opt/ina-p4tools/bin").join(name);
    bundled.is_file().then_some(bundled)
}

/// Whether this machine can make network namespaces (root and `ip`); else why not.
pub fn namespaces() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err("not root (network namespaces and raw sockets need it)".into());
    }
    if tool("ip").is_none() {
        return Err("the `ip` command (iproute2) is missing".into());
    }
    Ok(())
}

/// The tools, if this machine can run the target (root, `ip`, and the P4 tools); else why not.
pub fn environment() -> Result<Tools, String> {
    namespaces()?;
    let find = |n: &str| tool(n).ok_or(format!("{n} not found (see README.md: P4 toolchain)"));
    Ok(Tools {
        p4c: find("p4c-bm2-ss")?,
        simple_switch: find("simple_switch")?,
        cli: find("simple_switch_CLI")?,
    })
}

/// bmv2 in a network namespace of its own.
#[derive(Debug)]
pub struct Bmv2Target {
    // (Dropped after the switch: see Drop.)
    net: TestNet,
    json: PathBuf,
    tools: Tools,
    child: Option<Child>,
    /// Time spent starting switches and configuring them.
    pub setup_time: Duration,
}

impl Bmv2Target {
    /// Compiles the program and sets up the namespace with ports `0..ports`.
    pub fn new(tools: Tools, ports: u16) -> Result<Bmv2Target, TargetError> {
        let quiet_ms = std::env::var("INA_BMV2_QUIET_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(40);
        let mut net = TestNet::new(ports, Duration::from_millis(quiet_ms))?;
        if std::env::var_os("INA_BMV2_LOG").is_some() {
            net.keep_dir();
        }
        let json = net.dir().join("ina.json");
        // The committed program (the v1model crate's tests keep it equal to the generated one).
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../switch-p4")
            .join(ina_switch_p4::v1model::COMMITTED_PATH);
        run(Command::new(&tools.p4c)
            .args([
                "--std", "p4-16", "--target", "bmv2", "--arch", "v1model", "-o",
            ])
            .arg(&json)
            .arg(&src))?;
        Ok(Bmv2Target {
            net,
            json,
            tools,
            child: None,
            setup_time: Duration::ZERO,
        })
    }

    /// Sets how long `collect` waits for frames beyond the expected ones.
    pub fn set_quiet(&mut self, quiet: Duration) {
        self.net.set_quiet(quiet);
    }

    fn stop_switch(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn cli(&self, commands: &[String]) -> Result<String, TargetError> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", self.net.ns()])
            .arg(&self.tools.cli)
            .args(["--thrift-port", &THRIFT_PORT.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all((commands.join("\n") + "\n").as_bytes())?;
        }
        let out = child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(TargetError::Setup(format!(
                "simple_switch_CLI failed: {text}"
            )));
        }
        Ok(text)
    }
}

impl Drop for Bmv2Target {
    fn drop(&mut self) {
        // The switch goes before its namespace.
        self.stop_switch();
    }
}

/// Errors `simple_switch_CLI` reports in its output (it exits 0 after most of them).
fn cli_errors(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| {
            l.contains("Error")
                || l.contains("Invalid")
                || l.contains("Traceback")
                || l.contains("error:")
        })
        .collect()
}

impl Target for Bmv2Target {
    fn name(&self) -> String {
        "bmv2 (simple_switch, v1model/ina.p4)".into()
    }

    fn configure(&mut self, switch: &SwitchDesc, jobs: &[JobDesc]) -> Result<(), TargetError> {
        let started = Instant::now();
        let commands =
            bmv2_commands(switch, jobs).map_err(|e| TargetError::Setup(e.to_string()))?;
        self.stop_switch();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.net.ns()])
            .arg(&self.tools.simple_switch);
        for p in &switch.ports {
            if !self.net.has_port(*p) {
                return Err(TargetError::Setup(format!("port {p} has no veth pair")));
            }
            cmd.args(["-i", &format!("{p}@sw{p}")]);
        }
        // (The notification socket's default path in /tmp is shared by every bmv2 on the
        // machine, whatever its namespace.)
        let notifications = format!(
            "ipc://{}",
            self.net.dir().join("notifications.ipc").display()
        );
        cmd.args(["--notifications-addr", &notifications]);
        if std::env::var_os("INA_BMV2_LOG").is_some() {
            cmd.arg("--log-file")
                .arg(self.net.dir().join("packets"))
                .arg("--log-flush");
        }
        let log_path = self.net.dir().join("simple_switch.log");
        let log = File::create(&log_path)?;
        cmd.args(["--thrift-port", &THRIFT_PORT.to_string()])
            .arg(&self.json)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.child = Some(cmd.spawn()?);
        // Wait for the thrift server.
        in_netns(self.net.ns(), move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], THRIFT_PORT));
                if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                    return Err(TargetError::Setup(format!(
                        "simple_switch did not start; its output:\n{log}"
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })?;
        let text = self.cli(&commands)?;
        let errors = cli_errors(&text);
        if !errors.is_empty() {
            return Err(TargetError::Setup(format!(
                "simple_switch_CLI reported: {}",
                errors.join("; ")
            )));
        }
        self.net.drain();
        self.setup_time += started.elapsed();
        Ok(())
    }

    fn send(&mut self, port: u16, frame: &[u8]) -> Result<(), TargetError> {
        self.net.send(port, frame)
    }

    fn collect(
        &mut self,
        expected: usize,
        timeout: Duration,
    ) -> Result<Vec<(u16, Vec<u8>)>, TargetError> {
        self.net.collect(expected, timeout)
    }

    fn counters(&mut self) -> Result<Counts, TargetError> {
        let text = self.cli(&bmv2_counter_commands())?;
        let mut c = Counts::default();
        let mut seen = 0;
        for line in text.lines() {
            // `InaIngress.ina_events[3]= (120 bytes, 2 packets)`
            let Some(end) = line.find(" packets)") else {
                continue;
            };
            let head = &line[..end];
            let digits = head.rsplit(' ').next().unwrap_or_default();
            let value: u64 = digits
                .parse()
                .map_err(|_| TargetError::Setup(format!("counter line {line:?}")))?;
            if let Some(i) = line.find("ina_events[") {
                let idx: String = line[i + 11..]
                    .chars()
                    .take_while(|c| c.is_ascii_digit())
                    .collect();
                let idx: usize = idx
                    .parse()
                    .map_err(|_| TargetError::Setup(format!("counter line {line:?}")))?;
                if let Some(slot) = c.events.get_mut(idx) {
                    *slot = value;
                    seen += 1;
                }
            } else if line.contains("ina_multicast") {
                c.multicast = value;
                seen += 1;
            }
        }
        if seen != Event::COUNT + 1 {
            return Err(TargetError::Setup(format!(
                "read {seen} counters of {}: {text}",
                Event::COUNT + 1
            )));
        }
        Ok(c)
    }
}
