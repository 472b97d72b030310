//! What the controller's tests share: software switches and controllers running in this
//! process, and the workers of a job with heartbeats.
#![allow(clippy::unwrap_used, dead_code)]

use ina_controller::alloc::Policy;
use ina_controller::api::{JobRequest, SwitchSpec};
use ina_controller::client::Client;
use ina_controller::server::{self, ServeError, ServerConfig};
use ina_controller::service::{drivers, Controller};
use ina_controller::store::Store;
use ina_proto::pipeline::PipelineConfig;
use ina_switch::{ControlClient, ControlServer, Request, Switch, SwitchConfig, SwitchHandle};
use ina_worker::{Communicator, WorkerConfig};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct RunningSwitch {
    pub udp: SocketAddr,
    pub control: SocketAddr,
    pub stop: Arc<AtomicBool>,
    pub threads: Vec<std::thread::JoinHandle<()>>,
}

impl RunningSwitch {
    pub fn start(udp: &str, control: &str, pool_slots: u16) -> RunningSwitch {
        let mut cfg = SwitchConfig::new(udp.parse().unwrap());
        cfg.pipeline = PipelineConfig {
            pool_slots,
            max_elems: 256,
        };
        let sw = Switch::bind(cfg).unwrap();
        let udp = sw.local_addr();
        let handle: SwitchHandle = sw.handle();
        let stop = Arc::new(AtomicBool::new(false));
        let server = ControlServer::bind(control.parse().unwrap(), sw.handle()).unwrap();
        let control = server.local_addr().unwrap();
        let s2 = stop.clone();
        let threads = vec![
            std::thread::spawn(move || {
                sw.run(s2).unwrap();
            }),
            server.spawn(stop.clone()).unwrap(),
        ];
        assert!(
            handle.wait_running(Duration::from_secs(10)),
            "switch did not start"
        );
        RunningSwitch {
            udp,
            control,
            stop,
            threads,
        }
    }

    /// The jobs the switch holds: (job, slot base, slot count).
    pub fn jobs(&self) -> Vec<(u16, u16, u16)> {
        let mut c = ControlClient::connect(self.control).unwrap();
        let mut v: Vec<_> = c
            .call(&Request::Jobs)
            .unwrap()
            .jobs
            .unwrap()
            .into_iter()
            .map(|j| (j.job, j.slot_base, j.slot_count))
            .collect();
        v.sort();
        v
    }
}

impl Drop for RunningSwitch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The access token of the controllers started here.
pub const TOKEN: &str = "controller-test-token-0123456789";

pub struct RunningController {
    pub addr: SocketAddr,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub thread: Option<std::thread::JoinHandle<Result<(), ServeError>>>,
}

impl RunningController {
    /// A controller on `bind` requiring [`TOKEN`].
    pub fn start(dir: Option<&Path>, policy: Policy, bind: &str) -> RunningController {
        RunningController::start_with_metrics(dir, policy, bind, None)
    }

    pub fn start_with_metrics(
        dir: Option<&Path>,
        policy: Policy,
        bind: &str,
        metrics: Option<SocketAddr>,
    ) -> RunningController {
        let store = dir.map(|d| Store::open(d).unwrap());
        let ctl = Controller::open(policy, store, drivers()).unwrap();
        let config = ServerConfig {
            token: TOKEN.to_string(),
            resync_every: Duration::from_millis(100),
            metrics,
            ..ServerConfig::default()
        };
        RunningController::serve(ctl, bind, config)
    }

    /// Serves `ctl` on `bind` as `config` says, on a thread of its own.
    pub fn serve(ctl: Controller, bind: &str, config: ServerConfig) -> RunningController {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let bind: SocketAddr = bind.parse().unwrap();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind(bind).await?;
                let _ = addr_tx.send(listener.local_addr()?);
                server::serve(listener, ctl, config, async {
                    let _ = rx.await;
                })
                .await
            })
        });
        let addr = addr_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        RunningController {
            addr,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    /// A client with the controller's token.
    pub fn client(&self) -> Client {
        self.client_with(Some(TOKEN))
    }

    /// A client presenting `token`, or none.
    pub fn client_with(&self, token: Option<&str>) -> Client {
        Client::new(&self.addr.to_string(), token.map(str::to_string))
    }

    pub fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.thread.take().unwrap().join().unwrap().unwrap();
    }
}

impl Drop for RunningController {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A software switch of 512 slots, and a controller under `policy` holding it.
pub fn switch_and_controller(policy: Policy) -> (RunningSwitch, RunningController) {
    let sw = RunningSwitch::start("127.0.0.1:0", "127.0.0.1:0", 512);
    let ctl = RunningController::start(None, policy, "127.0.0.1:0");
    ctl.client()
        .add_switch(&switch_spec("tor", &sw, 512))
        .unwrap();
    (sw, ctl)
}

/// A software switch of 512 slots, and a fair-share controller holding it that serves its
/// metrics; returns them with the metrics' address.
pub fn switch_and_fair_share_controller_with_metrics(
) -> (RunningSwitch, RunningController, SocketAddr) {
    let sw = RunningSwitch::start("127.0.0.1:0", "127.0.0.1:0", 512);
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let ctl = RunningController::start_with_metrics(
        None,
        Policy::FairShare,
        "127.0.0.1:0",
        Some(metrics),
    );
    ctl.client()
        .add_switch(&switch_spec("tor", &sw, 512))
        .unwrap();
    (sw, ctl, metrics)
}

/// The controller's metrics at `addr` hold every one of `lines`.
pub fn assert_metrics(addr: SocketAddr, lines: &[&str]) {
    let text = ureq::get(&format!("http://{addr}/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    for line in lines {
        assert!(text.lines().any(|l| l == *line), "no {line:?} in\n{text}");
    }
}

pub fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let socks: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    socks.iter().map(|s| s.local_addr().unwrap()).collect()
}

pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ina-controller-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

pub fn switch_spec(name: &str, sw: &RunningSwitch, slots: u16) -> SwitchSpec {
    SwitchSpec::software(name, sw.control, sw.udp, slots, 256)
}

pub fn job(name: &str, workers: Vec<SocketAddr>, window: u16, min: u16) -> JobRequest {
    JobRequest {
        name: name.into(),
        workers,
        size: None,
        elems_per_packet: 64,
        window,
        min_window: Some(min),
        priority: 0,
        switch: None,
        heartbeat_ms: None,
    }
}

pub fn tensor(job: usize, rank: usize, len: usize) -> Vec<i32> {
    (0..len)
        .map(|i| ((i * 31 + rank * 7 + job * 13) % 1001) as i32 - 500)
        .collect()
}

/// The workers of a job with heartbeats, as training processes run them: each a communicator
/// behind a gate, a membership, and `allreduce_i32` in a loop, each sum checked, until
/// `stop_at` operations.
pub struct HeldJob {
    pub name: &'static str,
    pub id: u16,
    pub workers: Vec<SocketAddr>,
    /// Operations each rank finished.
    pub progress: Arc<Vec<std::sync::atomic::AtomicU64>>,
    pub stop_at: Arc<std::sync::atomic::AtomicU64>,
}

impl HeldJob {
    pub fn new(name: &'static str, id: u16, workers: Vec<SocketAddr>, stop_at: u64) -> HeldJob {
        HeldJob {
            name,
            id,
            progress: Arc::new(workers.iter().map(|_| Default::default()).collect()),
            workers,
            stop_at: Arc::new(stop_at.into()),
        }
    }

    /// Operations every rank finished.
    pub fn ops(&self) -> u64 {
        self.progress
            .iter()
            .map(|x| x.load(Ordering::SeqCst))
            .min()
            .unwrap_or(0)
    }

    /// Lets every rank stop a few operations after the furthest one.
    pub fn stop_soon(&self) {
        let last = self.progress.iter().map(|x| x.load(Ordering::SeqCst)).max();
        self.stop_at.store(last.unwrap_or(0) + 5, Ordering::SeqCst);
    }

    /// Starts every rank; each thread returns the slot counts it ran with.
    pub fn start(
        &self,
        ctl: &RunningController,
        sw: &RunningSwitch,
    ) -> Vec<std::thread::JoinHandle<std::collections::BTreeSet<u16>>> {
        let size = self.workers.len();
        (0..size)
            .map(|rank| {
                let (client, switch, addr) = (ctl.client(), sw.udp, self.workers[rank]);
                let (name, id) = (self.name, self.id);
                let (progress, stop_at) = (self.progress.clone(), self.stop_at.clone());
                std::thread::spawn(move || {
                    let gate = Arc::new(ina_worker::Gate::new());
                    let mut comm =
                        Communicator::connect(WorkerConfig::new(switch, addr, id, rank as u8))
                            .unwrap();
                    comm.set_gate(gate.clone());
                    let _member = ina_controller::member::Member::spawn(
                        client,
                        name.into(),
                        rank as u16,
                        Duration::from_millis(100),
                        gate,
                        move |missing| panic!("job {name} failed: missing {missing:?}"),
                    )
                    .unwrap();
                    let mut windows = std::collections::BTreeSet::new();
                    let len = 20_000;
                    let mut i = 0u64;
                    while i < stop_at.load(Ordering::SeqCst) {
                        let seed = i as usize + 100 * usize::from(id);
                        let mut t = tensor(seed, rank, len);
                        comm.allreduce_i32(&mut t)
                            .unwrap_or_else(|e| panic!("{name} rank {rank} op {i}: {e}"));
                        let inputs: Vec<Vec<i32>> =
                            (0..size).map(|r| tensor(seed, r, len)).collect();
                        let want: Vec<i32> = (0..len)
                            .map(|k| inputs.iter().map(|t| t[k]).sum())
                            .collect();
                        assert!(t == want, "{name} rank {rank} op {i}: wrong sum");
                        windows.insert(comm.job().info.slot_count);
                        i += 1;
                        progress[rank].store(i, Ordering::SeqCst);
                    }
                    windows
                })
            })
            .collect()
    }
}

pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "waited 30 s for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
