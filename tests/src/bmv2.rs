//! bmv2's `simple_switch` running the generated v1model program, as a target.
//!
//! [`Bmv2Target::new`] compiles `ina_switch_p4::v1model::program()` with `p4c-bm2-ss` into a
//! temporary directory, creates a network namespace `inap4-<pid>-<n>` with one veth pair per
//! port (`swP` for the switch, `hP` for the test), and opens an AF_PACKET socket on every `hP`
//! inside the namespace. Each [`Target::configure`] starts a fresh `simple_switch` (no logging)
//! and pipes the runtime module's commands into `simple_switch_CLI`; counters are read with
//! `counter_read`. Dropping the target stops the switch it started and deletes the namespace.

use crate::scenario::Counts;
use crate::{Target, TargetError};
use ina_proto::event::Event;
use ina_switch_p4::runtime::{bmv2_commands, bmv2_counter_commands, JobDesc, SwitchDesc};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
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
fn tool(name: &str) -> Option<PathBuf> {
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

/// The tools, if this machine can run the target (root, `ip`, and the P4 tools); else why not.
pub fn environment() -> Result<Tools, String> {
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err("not root (network namespaces and raw sockets need it)".into());
    }
    if tool("ip").is_none() {
        return Err("the `ip` command (iproute2) is missing".into());
    }
    let find = |n: &str| tool(n).ok_or(format!("{n} not found (see README.md: P4 toolchain)"));
    Ok(Tools {
        p4c: find("p4c-bm2-ss")?,
        simple_switch: find("simple_switch")?,
        cli: find("simple_switch_CLI")?,
    })
}

fn run(cmd: &mut Command) -> Result<String, TargetError> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(TargetError::Setup(format!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `f` on a thread inside the network namespace `ns`.
fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> Result<T, TargetError> + Send + 'static,
) -> Result<T, TargetError> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = File::open(&path)?;
        // SAFETY: setns on a namespace file descriptor that stays open during the call; it
        // only moves this (short-lived) thread.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        f()
    })
    .join()
    .map_err(|_| TargetError::Setup("namespace thread panicked".into()))?
}

/// An AF_PACKET socket bound to interface `ifname` (of the calling thread's namespace).
#[allow(unsafe_code)]
fn packet_socket(ifname: &str) -> Result<OwnedFd, TargetError> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket creation; the descriptor is owned right after.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            i32::from(proto),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = CString::new(ifname).map_err(|_| TargetError::Setup("interface name".into()))?;
    // SAFETY: name is a valid C string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = index as i32;
    // SAFETY: sll is a valid sockaddr_ll of the size passed.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let size: libc::c_int = 4 << 20;
    // SAFETY: a c_int option value of the size passed.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    Ok(fd)
}

/// One frame received on `fd`, skipping the frames this socket itself sent; `None` when
/// nothing is waiting.
#[allow(unsafe_code)]
fn receive(fd: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
    loop {
        // SAFETY: plain data, zero is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: buf and sll are valid for the sizes passed.
        let n = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&mut sll as *mut libc::sockaddr_ll).cast(),
                &mut len,
            )
        };
        if n < 0 {
            return None;
        }
        if sll.sll_pkttype == libc::PACKET_OUTGOING {
            continue;
        }
        return Some(n as usize);
    }
}

static INSTANCE: AtomicU32 = AtomicU32::new(0);

/// bmv2 in a network namespace of its own.
#[derive(Debug)]
pub struct Bmv2Target {
    ns: String,
    dir: PathBuf,
    json: PathBuf,
    tools: Tools,
    socks: BTreeMap<u16, OwnedFd>,
    child: Option<Child>,
    /// How long `collect` waits for frames beyond the expected ones.
    quiet: Duration,
    /// Time spent starting switches and configuring them.
    pub setup_time: Duration,
}

impl Bmv2Target {
    /// Compiles the program and sets up the namespace with ports `0..ports`.
    pub fn new(tools: Tools, ports: u16) -> Result<Bmv2Target, TargetError> {
        let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let ns = format!("inap4-{}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(&ns);
        std::fs::create_dir_all(&dir)?;
        let quiet_ms = std::env::var("INA_BMV2_QUIET_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(40);
        // From here on, Drop cleans up whatever was made.
        let mut t = Bmv2Target {
            ns: ns.clone(),
            json: dir.join("ina.json"),
            dir,
            tools,
            socks: BTreeMap::new(),
            child: None,
            quiet: Duration::from_millis(quiet_ms),
            setup_time: Duration::ZERO,
        };
        let src = t.dir.join("ina.p4");
        std::fs::write(&src, ina_switch_p4::v1model::program())?;
        run(Command::new(&t.tools.p4c)
            .args([
                "--std", "p4-16", "--target", "bmv2", "--arch", "v1model", "-o",
            ])
            .arg(&t.json)
            .arg(&src))?;
        run(Command::new("ip").args(["netns", "add", &ns]))?;
        let ip_ns = |args: &[&str]| -> Result<String, TargetError> {
            run(Command::new("ip").args(["-n", ns.as_str()]).args(args))
        };
        ip_ns(&["link", "set", "lo", "up"])?;
        run(Command::new("ip").args([
            "netns",
            "exec",
            &ns,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        ]))?;
        for p in 0..ports {
            let (sw, host) = (format!("sw{p}"), format!("h{p}"));
            ip_ns(&["link", "add", &sw, "type", "veth", "peer", "name", &host])?;
            ip_ns(&["link", "set", &sw, "up"])?;
            ip_ns(&["link", "set", &host, "up"])?;
        }
        let socks = in_netns(&ns, move || {
            let mut socks = BTreeMap::new();
            for p in 0..ports {
                socks.insert(p, packet_socket(&format!("h{p}"))?);
            }
            Ok(socks)
        })?;
        t.socks = socks;
        Ok(t)
    }

    /// Sets how long `collect` waits for frames beyond the expected ones.
    pub fn set_quiet(&mut self, quiet: Duration) {
        self.quiet = quiet;
    }

    fn stop_switch(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn cli(&self, commands: &[String]) -> Result<String, TargetError> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
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

    fn drain(&mut self) {
        let mut buf = vec![0u8; 16384];
        for fd in self.socks.values() {
            while receive(fd, &mut buf).is_some() {}
        }
    }
}

impl Drop for Bmv2Target {
    fn drop(&mut self) {
        self.stop_switch();
        self.socks.clear();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.ns])
            .stderr(Stdio::null())
            .status();
        if std::env::var_os("INA_BMV2_LOG").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
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
        cmd.args(["netns", "exec", &self.ns])
            .arg(&self.tools.simple_switch);
        for p in &switch.ports {
            if !self.socks.contains_key(p) {
                return Err(TargetError::Setup(format!("port {p} has no veth pair")));
            }
            cmd.args(["-i", &format!("{p}@sw{p}")]);
        }
        // (The notification socket's default path in /tmp is shared by every bmv2 on the
        // machine, whatever its namespace.)
        let notifications = format!("ipc://{}", self.dir.join("notifications.ipc").display());
        cmd.args(["--notifications-addr", &notifications]);
        if std::env::var_os("INA_BMV2_LOG").is_some() {
            cmd.arg("--log-file")
                .arg(self.dir.join("packets"))
                .arg("--log-flush");
        }
        let log = File::create(self.dir.join("simple_switch.log"))?;
        cmd.args(["--thrift-port", &THRIFT_PORT.to_string()])
            .arg(&self.json)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.child = Some(cmd.spawn()?);
        // Wait for the thrift server.
        let ns = self.ns.clone();
        let log_path = self.dir.join("simple_switch.log");
        in_netns(&ns, move || {
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
        self.drain();
        self.setup_time += started.elapsed();
        Ok(())
    }

    fn send(&mut self, port: u16, frame: &[u8]) -> Result<(), TargetError> {
        let fd = self
            .socks
            .get(&port)
            .ok_or_else(|| TargetError::Setup(format!("no port {port}")))?;
        // SAFETY: frame is valid for its length.
        #[allow(unsafe_code)]
        let n = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(())
    }

    fn collect(
        &mut self,
        expected: usize,
        timeout: Duration,
    ) -> Result<Vec<(u16, Vec<u8>)>, TargetError> {
        let start = Instant::now();
        let mut reached: Option<Instant> = (expected == 0).then_some(start);
        let mut out = Vec::new();
        let mut buf = vec![0u8; 16384];
        let mut fds: Vec<libc::pollfd> = self
            .socks
            .values()
            .map(|f| libc::pollfd {
                fd: f.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ports: Vec<u16> = self.socks.keys().copied().collect();
        loop {
            let now = Instant::now();
            let until = match reached {
                Some(t) => t + self.quiet,
                None => start + timeout,
            };
            if now >= until {
                break;
            }
            let wait = (until - now).as_millis().clamp(1, 1000) as libc::c_int;
            // SAFETY: fds is a valid array of pollfd of the length passed.
            #[allow(unsafe_code)]
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) };
            if n < 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            for (i, p) in fds.iter().enumerate() {
                if p.revents & libc::POLLIN == 0 {
                    continue;
                }
                let (Some(&port), Some(fd)) = (ports.get(i), self.socks.get(&ports[i])) else {
                    continue;
                };
                while let Some(len) = receive(fd, &mut buf) {
                    out.push((port, buf[..len].to_vec()));
                }
            }
            if reached.is_none() && out.len() >= expected {
                reached = Some(Instant::now());
            }
        }
        Ok(out)
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
