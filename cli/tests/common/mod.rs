//! Harness for tests that run `ina switch` and `ina worker` as OS processes over loopback.
//!
//! A [`Proc`] is a child whose stdout JSON lines arrive on a channel stamped with the moment
//! they were read, whose stderr is kept for diagnostics, and which is killed (SIGKILL) and
//! reaped when dropped, so that no test leaves a process behind on any path. Every wait takes
//! a deadline.

use ina_switch::{ControlClient, JobSpec, Request, Response, SwitchStats};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The `ina` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_ina");

/// How long a process may take to print its first line (a debug build on a loaded machine).
pub const START: Duration = Duration::from_secs(20);

/// The tests share two cores with others: they run one at a time, so that the timing they
/// assert measures the product and not the other tests.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `now + d`.
pub fn after(d: Duration) -> Instant {
    Instant::now() + d
}

/// One stdout line of a child: its JSON (a JSON string if the line was not JSON), and when
/// the harness read it.
#[derive(Debug, Clone)]
pub struct Line {
    pub at: Instant,
    pub value: Value,
}

impl Line {
    /// The `event` field.
    pub fn event(&self) -> &str {
        self.value
            .get("event")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// A string field parsed as a socket address.
    pub fn addr(&self, key: &str) -> SocketAddr {
        let s = self
            .value
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no `{key}` in {}", self.value));
        s.parse()
            .unwrap_or_else(|e| panic!("`{key}` of {} is no address: {e}", self.value))
    }
}

/// What the next line wait gave.
#[derive(Debug)]
pub enum Next {
    Line(Line),
    Timeout,
    /// Stdout closed: the process exited (or closed it).
    Eof,
}

/// A child process of the test.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Line>,
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
    status: Option<ExitStatus>,
}

impl Proc {
    /// Starts `ina ARGS...` with piped stdin, stdout and stderr.
    pub fn spawn<S: AsRef<str>>(name: &str, args: &[S]) -> Proc {
        Proc::spawn_in(None, name, args)
    }

    /// [`Proc::spawn`] inside network namespace `netns` (with `ip netns exec`, which execs
    /// `ina` in place: the child is `ina` itself).
    pub fn spawn_in<S: AsRef<str>>(netns: Option<&str>, name: &str, args: &[S]) -> Proc {
        let mut cmd = ina_io::netns::command_in(netns, BIN);
        let mut child = cmd
            .args(args.iter().map(AsRef::as_ref))
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({BIN}): {e}"));
        let stdout = child.stdout.take().expect("child stdout");
        let mut err = child.stderr.take().expect("child stderr");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let at = Instant::now();
                let value = serde_json::from_str::<Value>(&line).unwrap_or(Value::String(line));
                if tx.send(Line { at, value }).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let sink = stderr.clone();
        let stderr_reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match err.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => sink
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend_from_slice(&buf[..n]),
                }
            }
        });
        Proc {
            name: name.to_string(),
            child,
            stdin,
            lines,
            stderr,
            stderr_reader: Some(stderr_reader),
            status: None,
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child's resident set size in KiB (Linux `/proc`).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .unwrap_or_else(|e| panic!("reading the status of {}: {e}", self.name));
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmRSS for {}", self.name))
    }

    /// Everything the child wrote to stderr so far.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    /// The last few lines of stderr, for failure messages.
    pub fn stderr_tail(&self) -> String {
        let text = self.stderr_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// The next stdout line, waiting until `deadline`.
    pub fn next(&mut self, deadline: Instant) -> Next {
        match self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(l) => Next::Line(l),
            Err(mpsc::RecvTimeoutError::Timeout) => Next::Timeout,
            Err(mpsc::RecvTimeoutError::Disconnected) => Next::Eof,
        }
    }

    /// Skips lines until one with `event`; panics on an `error` event, on exit or at
    /// `deadline`.
    pub fn expect(&mut self, event: &str, deadline: Instant) -> Line {
        loop {
            match self.next(deadline) {
                Next::Line(l) if l.event() == event => return l,
                Next::Line(l) if l.event() == "error" => {
                    panic!(
                        "{}: error while waiting for `{event}`: {}",
                        self.name, l.value
                    )
                }
                Next::Line(_) => {}
                Next::Timeout => panic!(
                    "{}: no `{event}` line in time; stderr:\n{}",
                    self.name,
                    self.stderr_tail()
                ),
                Next::Eof => panic!(
                    "{}: exited ({:?}) before a `{event}` line; stderr:\n{}",
                    self.name,
                    self.child.try_wait(),
                    self.stderr_tail()
                ),
            }
        }
    }

    /// Writes one line to the child's stdin.
    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin of the child");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("writing to {}: {e}", self.name));
    }

    /// Sends a signal to the child.
    pub fn signal(&self, sig: libc::c_int) {
        if self.status.is_some() {
            return;
        }
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet (`status`
        // is unset), so the pid cannot have been reused; no memory is involved.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {sig}): {}",
            std::io::Error::last_os_error()
        );
    }

    /// SIGKILLs the child and reaps it.
    pub fn kill(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
    }

    /// Waits for the child to exit, until `deadline`.
    pub fn wait(&mut self, deadline: Instant) -> ExitStatus {
        loop {
            if let Some(s) = self.status {
                return s;
            }
            match self.child.try_wait() {
                Ok(Some(s)) => {
                    self.status = Some(s);
                    // The pipe closed with the process: all of stderr is in.
                    if let Some(t) = self.stderr_reader.take() {
                        let _ = t.join();
                    }
                }
                Ok(None) if Instant::now() >= deadline => panic!(
                    "{} did not exit in time; stderr:\n{}",
                    self.name,
                    self.stderr_tail()
                ),
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => panic!("waiting for {}: {e}", self.name),
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running `ina switch` with its addresses.
#[derive(Debug)]
pub struct SwitchProc {
    pub proc: Proc,
    pub udp: SocketAddr,
    pub control: SocketAddr,
    pub ready: Line,
}

impl SwitchProc {
    /// Starts `ina switch ARGS...` (plus `--control 127.0.0.1:0` unless ARGS has a
    /// `--control` or a `--config`, and `--listen 127.0.0.1:0` unless it has a `--listen` or
    /// a `--config`) and waits for its ready line.
    pub fn start(args: &[&str]) -> SwitchProc {
        let mut all = vec!["switch".to_string()];
        if !args
            .iter()
            .any(|a| a.starts_with("--listen") || a.starts_with("--config"))
        {
            all.push("--listen=127.0.0.1:0".into());
        }
        if !args
            .iter()
            .any(|a| a.starts_with("--config") || a.starts_with("--control"))
        {
            all.push("--control=127.0.0.1:0".into());
        }
        all.extend(args.iter().map(|a| a.to_string()));
        let mut proc = Proc::spawn("switch", &all);
        let ready = proc.expect("ready", after(START));
        let udp = ready.addr("udp");
        let control = ready.addr("control");
        SwitchProc {
            proc,
            udp,
            control,
            ready,
        }
    }

    /// A new connection to the control endpoint.
    pub fn client(&self) -> ControlClient {
        ControlClient::connect(self.control)
            .unwrap_or_else(|e| panic!("connecting to control {}: {e}", self.control))
    }

    /// One control request on a fresh connection.
    pub fn call(&self, req: &Request) -> Response {
        self.client()
            .call(req)
            .unwrap_or_else(|e| panic!("control request {req:?}: {e}"))
    }

    /// Installs a job; returns it with the epoch the switch chose.
    pub fn add_job(&self, job: JobSpec) -> JobSpec {
        let resp = self.call(&Request::AddJob { job });
        assert!(resp.ok, "add_job refused: {:?}", resp.error);
        resp.job.expect("add_job answer without the job")
    }

    /// The statistics, through the control endpoint.
    pub fn stats(&self) -> SwitchStats {
        let resp = self.call(&Request::Stats);
        assert!(resp.ok, "stats refused: {:?}", resp.error);
        resp.stats.expect("stats answer without stats")
    }

    /// SIGTERMs the switch and returns its `stopped` line after checking it exited with 0.
    pub fn terminate(&mut self) -> Line {
        self.proc.signal(libc::SIGTERM);
        let stopped = self.proc.expect("stopped", after(Duration::from_secs(10)));
        let status = self.proc.wait(after(Duration::from_secs(10)));
        assert!(
            status.success(),
            "switch exited with {status} after SIGTERM; stderr:\n{}",
            self.proc.stderr_tail()
        );
        stopped
    }
}

/// A job on slots 0..64 with 256 elements per packet.
pub fn job_spec(id: u16, workers: Vec<SocketAddr>) -> JobSpec {
    JobSpec {
        job: id,
        epoch: None,
        slot_base: 0,
        slot_count: 64,
        elems_per_packet: 256,
        workers,
        group: None,
        uplink: None,
    }
}

/// The shape of a worker run.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub job: u16,
    pub workers: usize,
    pub elements: usize,
    pub iterations: usize,
    pub warmup: usize,
    pub give_up_ms: u64,
    pub seed: u64,
}

impl Run {
    /// Job 1 of `workers` workers, one warmup, a 5 s give-up time, seed 7.
    pub fn new(workers: usize, elements: usize, iterations: usize) -> Run {
        Run {
            job: 1,
            workers,
            elements,
            iterations,
            warmup: 1,
            give_up_ms: 5000,
            seed: 7,
        }
    }

    pub fn total(&self) -> usize {
        self.iterations + self.warmup
    }

    pub fn common(&self, rank: usize) -> Vec<String> {
        vec![
            "worker".into(),
            format!("--job={}", self.job),
            format!("--rank={rank}"),
            format!("--workers={}", self.workers),
            format!("--elements={}", self.elements),
            format!("--iterations={}", self.iterations),
            format!("--warmup={}", self.warmup),
            format!("--give-up-ms={}", self.give_up_ms),
            format!("--seed={}", self.seed),
        ]
    }

    /// Starts an `ina` worker of rank `rank` bound to `bind`.
    pub fn ina_worker(&self, switch: SocketAddr, rank: usize, bind: SocketAddr) -> Proc {
        let mut args = self.common(rank);
        args.push("--algorithm=ina".into());
        args.push(format!("--switch={switch}"));
        args.push(format!("--bind={bind}"));
        Proc::spawn(&format!("worker {rank}"), &args)
    }

    /// Starts one ina worker in each worker namespace of `rack`, bound to its address and UDP
    /// port 9000 (as the switch's job lists it), talking to the switch at `switch`.
    pub fn ina_workers_on(&self, rack: &ina_io::netns::Rack, switch: SocketAddr) -> Vec<Proc> {
        (0..self.workers)
            .map(|r| {
                let mut args = self.common(r);
                args.push("--algorithm=ina".into());
                args.push(format!("--switch={switch}"));
                args.push(format!("--bind={}:9000", ina_io::netns::Rack::worker_ip(r)));
                Proc::spawn_in(Some(&rack.worker_ns(r)), &format!("worker {r}"), &args)
            })
            .collect()
    }

    /// Starts all ina workers on ephemeral ports and returns them with their bound addresses.
    pub fn ina_workers(&self, switch: SocketAddr) -> (Vec<Proc>, Vec<SocketAddr>) {
        let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
        let mut procs: Vec<Proc> = (0..self.workers)
            .map(|r| self.ina_worker(switch, r, any))
            .collect();
        let addrs = procs
            .iter_mut()
            .map(|p| p.expect("bound", after(START)).addr("udp"))
            .collect();
        (procs, addrs)
    }

    /// Starts a ring worker that reads its peers from stdin.
    pub fn ring_worker(&self, rank: usize) -> Proc {
        let mut args = self.common(rank);
        args.push("--algorithm=ring".into());
        args.push("--peers=-".into());
        Proc::spawn(&format!("ring worker {rank}"), &args)
    }
}

/// How a worker's run ended.
#[derive(Debug)]
pub enum End {
    Done(Line),
    Error(Line),
    /// Stdout closed without a final event.
    Eof,
    /// Nothing final before the deadline.
    Timeout,
}

/// Everything a worker reported.
#[derive(Debug)]
pub struct Outcome {
    pub name: String,
    pub iterations: Vec<Line>,
    pub end: End,
    /// The exit status, if it exited before the deadline.
    pub status: Option<ExitStatus>,
    pub stderr: String,
}

impl Outcome {
    /// Reads a worker's lines until done, error, exit or `deadline`, then its exit status.
    pub fn collect(p: &mut Proc, deadline: Instant) -> Outcome {
        let mut iterations = Vec::new();
        let end = loop {
            match p.next(deadline) {
                Next::Line(l) => match l.event() {
                    "iteration" => iterations.push(l),
                    "done" => break End::Done(l),
                    "error" => break End::Error(l),
                    _ => {}
                },
                Next::Timeout => break End::Timeout,
                Next::Eof => break End::Eof,
            }
        };
        let status = match end {
            End::Timeout => None,
            _ => {
                // It printed its last line or closed stdout: it exits promptly.
                Some(p.wait(after(Duration::from_secs(10))))
            }
        };
        Outcome {
            name: p.name.clone(),
            iterations,
            end,
            status,
            stderr: p.stderr_tail(),
        }
    }

    /// The violations of every iteration (each must report a number).
    pub fn violations(&self) -> Vec<u64> {
        self.iterations
            .iter()
            .map(|l| {
                l.value
                    .get("violations")
                    .and_then(Value::as_u64)
                    .unwrap_or_else(|| {
                        panic!("{}: iteration without violations: {}", self.name, l.value)
                    })
            })
            .collect()
    }

    /// The fingerprint of every iteration's result.
    pub fn fingerprints(&self) -> Vec<u64> {
        self.iterations
            .iter()
            .map(|l| {
                l.value
                    .get("fingerprint")
                    .and_then(Value::as_u64)
                    .unwrap_or_else(|| {
                        panic!("{}: iteration without fingerprint: {}", self.name, l.value)
                    })
            })
            .collect()
    }

    /// Asserts the run completed and verified: every iteration, no violation, `done` with
    /// `verified: true`, exit status 0.
    pub fn assert_verified(&self, total: usize) {
        let End::Done(done) = &self.end else {
            panic!(
                "{}: ended with {:?}; stderr:\n{}",
                self.name, self.end, self.stderr
            );
        };
        assert_eq!(
            done.value.get("verified"),
            Some(&Value::Bool(true)),
            "{}: {}",
            self.name,
            done.value
        );
        assert_eq!(self.iterations.len(), total, "{}: iterations", self.name);
        for (i, l) in self.iterations.iter().enumerate() {
            assert_eq!(
                l.value.get("iteration").and_then(Value::as_u64),
                Some(i as u64)
            );
        }
        assert!(
            self.violations().iter().all(|&v| v == 0),
            "{}: violations {:?}",
            self.name,
            self.violations()
        );
        let status = self.status.expect("exit status");
        assert_eq!(status.code(), Some(0), "{}: exit status", self.name);
    }

    /// The error event's `kind`, if the run ended with one.
    pub fn error_kind(&self) -> Option<&str> {
        match &self.end {
            End::Error(l) => l.value.get("kind").and_then(Value::as_str),
            _ => None,
        }
    }
}

/// Collects every worker's outcome; all share one deadline.
pub fn collect_all(procs: &mut [Proc], deadline: Instant) -> Vec<Outcome> {
    procs
        .iter_mut()
        .map(|p| Outcome::collect(p, deadline))
        .collect()
}

/// Free loopback UDP addresses (bound and released; the kernel does not hand them out again
/// right away).
pub fn free_udp_addrs(n: usize) -> Vec<SocketAddr> {
    let socks: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0").expect("binding a probe socket"))
        .collect();
    socks
        .iter()
        .map(|s| s.local_addr().expect("local address"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// An independent model of the expected result, written from docs/PROTOCOL.md §4 (not from the
// code under test): the workers' generated tensors, quantized per block with the agreed
// exponent, summed as int32 and turned back into float32. The switch path is deterministic, so
// every worker's result must be exactly this, bit for bit.
// ---------------------------------------------------------------------------------------------

/// splitmix64, as the workers' tensor generator uses it.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Worker `rank`'s tensor, as `ina worker --seed` generates it.
pub fn generate(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    let key = mix(seed ^ ((rank as u64) << 40));
    (0..len)
        .map(|i| {
            let r = mix(key ^ i as u64);
            let unit = ((r >> 40) as f32) * (1.0 / 8_388_608.0) - 1.0;
            let scale = 1.0 / (1u32 << ((i / 4096) % 8)) as f32;
            unit * scale
        })
        .collect()
}

/// The exponent byte of a block: the biased exponent of its largest magnitude.
fn exponent_byte(block: &[f32]) -> u8 {
    let max = block
        .iter()
        .map(|x| x.to_bits() & 0x7fff_ffff)
        .max()
        .unwrap_or(0);
    match max {
        0 => 0,
        b if b >= 0x7f80_0000 => 255,
        b => ((b >> 23) as u8).max(1),
    }
}

/// The all-reduce result through the switch, per PROTOCOL.md §4.
pub fn expected_ina_sum(
    seed: u64,
    workers: usize,
    len: usize,
    elems_per_packet: usize,
) -> Vec<f32> {
    let tensors: Vec<Vec<f32>> = (0..workers).map(|r| generate(seed, r, len)).collect();
    let c = match workers {
        0 | 1 => 0,
        n => 32 - ((n as u32) - 1).leading_zeros() as i32,
    };
    let mut out = vec![0f32; len];
    for start in (0..len).step_by(elems_per_packet) {
        let end = (start + elems_per_packet).min(len);
        let b = tensors
            .iter()
            .map(|t| exponent_byte(&t[start..end]))
            .max()
            .unwrap_or(0);
        assert!(b != 255, "generated tensors are finite");
        if b == 0 {
            continue;
        }
        let e = i32::from(b) - 126;
        let s = 31 - c - e;
        for i in start..end {
            let q: i32 = tensors
                .iter()
                .map(|t| (f64::from(t[i]) * 2f64.powi(s)).round_ties_even() as i32)
                .fold(0i32, i32::wrapping_add);
            out[i] = (f64::from(q) * 2f64.powi(-s)) as f32;
        }
    }
    out
}

/// The fingerprint workers report of a result.
pub fn fingerprint(v: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in v {
        h ^= u64::from(x.to_bits());
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Asserts that every worker finished all `iterations` (warm-up included) with every element
/// within its bound, and that all of them hold the same bits in every iteration. `context`
/// (the switch's counters, say) is printed with a failure.
pub fn assert_all_exact(outcomes: &[Outcome], iterations: usize, context: &dyn std::fmt::Display) {
    let mut prints = Vec::new();
    for o in outcomes {
        assert!(
            matches!(o.end, End::Done(_)),
            "{}: {:?}\n{}\n{context}",
            o.name,
            o.end,
            o.stderr
        );
        assert_eq!(o.violations(), vec![0; iterations], "{}", o.name);
        prints.push(
            o.iterations
                .iter()
                .map(|l| l.value["fingerprint"].clone())
                .collect::<Vec<_>>(),
        );
    }
    assert!(prints.windows(2).all(|w| w[0] == w[1]), "{prints:?}");
}

/// The switch and job descriptions of an emulated rack: port `r` leads to worker `r`, which is
/// rank `r` of job 1 (epoch 3, slots `0..64`: one whole block of gap cells, so the switch
/// sends Missing reports; `elems` per packet, UDP port 9000).
pub fn rack_descriptions(
    workers: usize,
    elems: u16,
) -> (
    ina_switch_p4::runtime::SwitchDesc,
    ina_switch_p4::runtime::P4Job,
) {
    use ina_io::netns::{Rack, SWITCH_IP, SWITCH_MAC_BYTES};
    use ina_switch_p4::runtime::{MacAddr, P4Job, SwitchDesc};
    let hosts: Vec<(MacAddr, std::net::Ipv4Addr)> = (0..workers)
        .map(|r| (MacAddr(Rack::worker_mac_bytes(r)), Rack::worker_ip(r)))
        .collect();
    let macs: Vec<MacAddr> = hosts.iter().map(|h| h.0).collect();
    (
        SwitchDesc::one_host_per_port(MacAddr(SWITCH_MAC_BYTES), SWITCH_IP, &macs),
        P4Job::one_rank_per_port(1, 3, 64, elems, &hosts, 9000),
    )
}

/// `simple_switch` running the v1model program (compiled into `dir`) on the hub's ports of
/// `rack`, with its runtime CLI on `thrift_port`.
pub fn start_bmv2(
    rack: &ina_io::netns::Rack,
    program: &std::path::Path,
    dir: &std::path::Path,
    thrift_port: u16,
) -> ina_switch_p4::bmv2::Bmv2 {
    use ina_switch_p4::bmv2::{Bmv2, Bmv2Config};
    Bmv2::start(Bmv2Config {
        program: program.to_path_buf(),
        ports: (0..rack.config().workers)
            .map(|r| (r as u16, ina_io::netns::Rack::port(r)))
            .collect(),
        thrift_port,
        netns: Some(rack.hub()),
        log_file: dir.join("simple_switch.log"),
        packet_log: None,
    })
    .expect("starting simple_switch")
}

/// Calls `check` every 10 ms until it returns `Some`, and returns that; panics naming `what`
/// was awaited if `deadline` passes first. For a condition a test waits for, in place of a
/// sleep that guesses how long it takes.
pub fn wait_until<T>(what: &str, deadline: Instant, mut check: impl FnMut() -> Option<T>) -> T {
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The workers of a tree of racks of `per_rack` workers (PROTOCOL.md §9): worker `g` is rank
/// `g` of `run`'s job and rank `g % per_rack` on the switch of rack `g / per_rack`;
/// `place(rack, rank)` says where it runs, the rack switch's address and its own bind address:
/// `(namespace, switch, bind)`.
pub fn tree_workers(
    run: &Run,
    racks: usize,
    per_rack: usize,
    place: impl Fn(usize, usize) -> (String, String, String),
) -> Vec<Proc> {
    (0..racks * per_rack)
        .map(|g| {
            let (i, r) = (g / per_rack, g % per_rack);
            let (ns, switch, bind) = place(i, r);
            let mut args = run.common(g);
            args.extend([
                format!("--switch={switch}"),
                format!("--bind={bind}"),
                format!("--switch-rank={r}"),
            ]);
            Proc::spawn_in(Some(&ns), "worker", &args)
        })
        .collect()
}

/// Links interface `up` of namespace `upper` to interface `uplink` of namespace `hub` by a
/// veth pair, with checksum offload and GRO off on both ends (raw-port switches compute no
/// checksums); both ends are left down and without addresses.
pub fn uplink_veth(upper: &str, up: &str, hub: &str) {
    ip_in(
        None,
        &[
            "link", "add", up, "netns", upper, "type", "veth", "peer", "name", "uplink", "netns",
            hub,
        ],
    );
    for (ns, dev) in [(upper, up), (hub, "uplink")] {
        ina_io::netns::in_netns(ns, || ina_io::netns::checksum_and_gro_off(dev))
            .and_then(|r| r)
            .unwrap_or_else(|e| panic!("offloads off on {dev} in {ns}: {e}"));
    }
}

/// Runs `ip ARGS` (in `ns` if given) and fails the test if it fails.
pub fn ip_in(ns: Option<&str>, args: &[&str]) {
    let ok = ina_io::netns::command_in(ns, "ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "ip {args:?} in {ns:?}");
}

/// The namespace of an upper switch (PROTOCOL.md §9) linked to the hub of each of `racks`:
/// rack `i`'s hub gets the interface `uplink`, the namespace its peer `up{i}` with
/// [`UpperNs::mac`]`(i)` and [`UpperNs::ip`]`(i)`, and a route to the rack switch's address
/// [`UpperNs::rack_switch_ip`]`(i)`. Offloads are off on both ends (raw-port switches compute
/// no checksums). Deleted when dropped.
pub struct UpperNs {
    pub name: String,
}

impl UpperNs {
    pub fn link(name: &str, racks: &[ina_io::netns::Rack]) -> UpperNs {
        UpperNs::link_lossy(name, racks, 0)
    }

    /// [`UpperNs::link`], where each uplink drops `per_mille` of the frames that arrive at
    /// either end (nftables on the netdev ingress hook, as the racks' links do).
    pub fn link_lossy(name: &str, racks: &[ina_io::netns::Rack], per_mille: u32) -> UpperNs {
        use ina_io::netns;
        let _ = netns::command_in(None, "ip")
            .args(["netns", "del", name])
            .stderr(Stdio::null())
            .status();
        ip_in(None, &["netns", "add", name]);
        let upper = UpperNs {
            name: name.to_string(),
        };
        ip_in(Some(name), &["link", "set", "lo", "up"]);
        for (i, rack) in racks.iter().enumerate() {
            let up = format!("up{i}");
            let hub = rack.hub();
            uplink_veth(name, &up, &hub);
            let addr = format!("{}/24", UpperNs::ip(i));
            let route = format!("{}/32", UpperNs::rack_switch_ip(i));
            ip_in(
                Some(name),
                &["link", "set", &up, "address", &UpperNs::mac(i)],
            );
            ip_in(Some(name), &["addr", "add", &addr, "dev", &up]);
            ip_in(Some(name), &["link", "set", &up, "up"]);
            ip_in(Some(name), &["route", "add", &route, "dev", &up]);
            ip_in(Some(&hub), &["link", "set", "uplink", "up"]);
            for (ns, dev) in [(name, up.as_str()), (hub.as_str(), "uplink")] {
                if per_mille > 0 {
                    let rules = format!(
                        "table netdev inaloss_{dev} {{\n chain ingress {{ type filter hook ingress \
                         device \"{dev}\" priority 0; numgen random mod 1000 < {per_mille} \
                         counter drop; }}\n}}\n"
                    );
                    let ok = netns::command_in(Some(ns), "nft")
                        .args(["-e", &rules])
                        .status()
                        .is_ok_and(|s| s.success());
                    assert!(ok, "loss on {dev} in {ns}");
                }
            }
        }
        upper
    }

    /// The MAC address of the upper switch's interface towards rack `i`.
    pub fn mac(i: usize) -> String {
        format!("02:00:00:00:19:{i:02x}")
    }

    /// The upper switch's address towards rack `i`.
    pub fn ip(i: usize) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(198, 19, i as u8, 1)
    }

    /// Rack `i`'s switch's address.
    pub fn rack_switch_ip(i: usize) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(198, 18, 0, 100 + i as u8)
    }
}

impl Drop for UpperNs {
    fn drop(&mut self) {
        let _ = ina_io::netns::command_in(None, "ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
