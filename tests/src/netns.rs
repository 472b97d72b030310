//! A network namespace of veth pairs for the targets that see frames on ports: port `P` of the
//! switch is the interface `swP`, and the test sends and captures on its peer `hP` through an
//! AF_PACKET socket. Dropping a [`TestNet`] deletes the namespace.

use crate::TargetError;
pub use ina_io::netns::{enter_netns, in_netns};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Runs a command; its stdout, or an error with its output.
pub fn run(cmd: &mut Command) -> Result<String, TargetError> {
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

/// A namespace `inap4-<pid>-<n>` with veth pairs `swP`/`hP` and a socket on every `hP`.
#[derive(Debug)]
pub struct TestNet {
    ns: String,
    dir: PathBuf,
    socks: BTreeMap<u16, OwnedFd>,
    /// How long `collect` waits for frames beyond the expected ones.
    quiet: Duration,
    keep_dir: bool,
}

impl TestNet {
    /// The namespace with ports `0..ports`, and a scratch directory of the same name.
    pub fn new(ports: u16, quiet: Duration) -> Result<TestNet, TargetError> {
        let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let ns = format!("inap4-{}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(&ns);
        std::fs::create_dir_all(&dir)?;
        run(Command::new("ip").args(["netns", "add", &ns]))?;
        // From here on, Drop deletes the namespace.
        let mut net = TestNet {
            ns: ns.clone(),
            dir,
            socks: BTreeMap::new(),
            quiet,
            keep_dir: false,
        };
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
        net.socks = in_netns(&ns, move || {
            let mut socks = BTreeMap::new();
            for p in 0..ports {
                socks.insert(p, packet_socket(&format!("h{p}"))?);
            }
            Ok::<_, TargetError>(socks)
        })??;
        Ok(net)
    }

    /// The namespace's name.
    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// The scratch directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Keeps the scratch directory when dropped (for logs).
    pub fn keep_dir(&mut self) {
        self.keep_dir = true;
    }

    /// Whether the switch side of port `p` exists.
    pub fn has_port(&self, p: u16) -> bool {
        self.socks.contains_key(&p)
    }

    /// Sets how long `collect` waits for frames beyond the expected ones.
    pub fn set_quiet(&mut self, quiet: Duration) {
        self.quiet = quiet;
    }

    /// Discards every frame waiting on the sockets.
    pub fn drain(&mut self) {
        let mut buf = vec![0u8; 16384];
        for fd in self.socks.values() {
            while receive(fd, &mut buf).is_some() {}
        }
    }

    /// Sends `frame` into the switch's port `port`.
    pub fn send(&mut self, port: u16, frame: &[u8]) -> Result<(), TargetError> {
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

    /// The frames the switch sent, by port: waits until `expected` came or `timeout` passed,
    /// then for the quiet period.
    pub fn collect(
        &mut self,
        expected: usize,
        timeout: Duration,
    ) -> Result<Vec<(u16, Vec<u8>)>, TargetError> {
        let start = Instant::now();
        let mut reached: Option<Instant> = (expected == 0).then_some(start);
        let mut out = Vec::new();
        let mut buf = vec![0u8; 16384];
        let ports: Vec<(u16, &OwnedFd)> = self.socks.iter().map(|(p, f)| (*p, f)).collect();
        let mut fds: Vec<libc::pollfd> = ports
            .iter()
            .map(|(_, f)| libc::pollfd {
                fd: f.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
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
            for (p, (port, fd)) in fds.iter().zip(&ports) {
                if p.revents & libc::POLLIN == 0 {
                    continue;
                }
                while let Some(len) = receive(fd, &mut buf) {
                    out.push((*port, buf[..len].to_vec()));
                }
            }
            if reached.is_none() && out.len() >= expected {
                reached = Some(Instant::now());
            }
        }
        Ok(out)
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        self.socks.clear();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.ns])
            .stderr(Stdio::null())
            .status();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
