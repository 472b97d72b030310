//! bmv2's `simple_switch` running the generated v1model program, as a target.
//!
//! [`Bmv2Target::new`] compiles the committed `switch-p4/v1model/ina.p4` with `p4c-bm2-ss`
//! into a temporary directory and sets up a [`TestNet`] (a network namespace with a veth pair per
//! port). Each [`Target::configure`] starts a fresh `simple_switch` on the `swP` interfaces
//! (no logging; `INA_BMV2_LOG=1` keeps a packet log in the scratch directory) and pipes the
//! runtime module's commands into `simple_switch_CLI`; counters are read with
//! `counter_read`. Dropping the target stops the switch it started and deletes the namespace.

use crate::netns::TestNet;
use crate::scenario::Counts;
use crate::{Target, TargetError};
use ina_switch_p4::bmv2::{self, Bmv2, Bmv2Config};
use ina_switch_p4::runtime::{P4Job, SwitchDesc};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The thrift port of `simple_switch` inside the namespace.
const THRIFT_PORT: u16 = 9090;

/// Whether this machine can make network namespaces (root and `ip`); else why not.
pub fn namespaces() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err("not root (network namespaces and raw sockets need it)".into());
    }
    let has_ip = std::process::Command::new("ip")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_ip {
        return Err("the `ip` command (iproute2) is missing".into());
    }
    Ok(())
}

/// Whether this machine can run the target (root, `ip`, and the P4 tools); else why not.
pub fn environment() -> Result<(), String> {
    namespaces()?;
    if !bmv2::available() {
        return Err("p4c-bm2-ss, simple_switch or simple_switch_CLI not found (see README.md: P4 toolchain)".into());
    }
    Ok(())
}

/// bmv2 in a network namespace of its own.
#[derive(Debug)]
pub struct Bmv2Target {
    // (Dropped after the switch: see Drop.)
    net: TestNet,
    json: PathBuf,
    switch: Option<Bmv2>,
    /// Time spent starting switches and configuring them.
    pub setup_time: Duration,
}

impl Bmv2Target {
    /// Compiles the program and sets up the namespace with ports `0..ports`.
    pub fn new(ports: u16) -> Result<Bmv2Target, TargetError> {
        let quiet_ms = std::env::var("INA_BMV2_QUIET_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(40);
        let mut net = TestNet::new(ports, Duration::from_millis(quiet_ms))?;
        if std::env::var_os("INA_BMV2_LOG").is_some() {
            net.keep_dir();
        }
        // The committed program (the v1model crate's tests keep it equal to the generated one).
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../switch-p4")
            .join(ina_switch_p4::v1model::COMMITTED_PATH);
        let json = bmv2::compile(&src, &net.dir().join("ina.json"))
            .map_err(|e| TargetError::Setup(e.to_string()))?;
        Ok(Bmv2Target {
            net,
            json,
            switch: None,
            setup_time: Duration::ZERO,
        })
    }

    /// Sets how long `collect` waits for frames beyond the expected ones.
    pub fn set_quiet(&mut self, quiet: Duration) {
        self.net.set_quiet(quiet);
    }
}

impl Drop for Bmv2Target {
    fn drop(&mut self) {
        // The switch goes before its namespace.
        self.switch = None;
    }
}

impl Target for Bmv2Target {
    fn name(&self) -> String {
        "bmv2 (simple_switch, v1model/ina.p4)".into()
    }

    fn configure(&mut self, switch: &SwitchDesc, jobs: &[P4Job]) -> Result<(), TargetError> {
        let started = Instant::now();
        // A fresh switch per configuration: the commands count multicast nodes from 0.
        self.switch = None;
        if let Some(p) = switch.ports.iter().find(|p| !self.net.has_port(**p)) {
            return Err(TargetError::Setup(format!("port {p} has no veth pair")));
        }
        let setup = |e: bmv2::Bmv2Error| TargetError::Setup(e.to_string());
        let sw = Bmv2::start(Bmv2Config {
            program: self.json.clone(),
            ports: switch
                .ports
                .iter()
                .map(|p| (*p, format!("sw{p}")))
                .collect(),
            thrift_port: THRIFT_PORT,
            netns: Some(self.net.ns().to_string()),
            log_file: self.net.dir().join("simple_switch.log"),
            packet_log: std::env::var_os("INA_BMV2_LOG").map(|_| self.net.dir().join("packets")),
        })
        .map_err(setup)?;
        sw.configure(switch, jobs).map_err(setup)?;
        self.switch = Some(sw);
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
        let sw = self
            .switch
            .as_ref()
            .ok_or_else(|| TargetError::Setup("not running".into()))?;
        let c = sw
            .counters()
            .map_err(|e| TargetError::Setup(e.to_string()))?;
        Ok(Counts {
            events: c.events,
            multicast: c.multicast,
            missing: c.missing,
        })
    }
}
