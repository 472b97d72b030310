//! The harness the worker library's tests share: free loopback addresses, and the software
//! switch running on a thread of the test.

use ina_switch::{JobSpec, Switch, SwitchConfig, SwitchHandle, SwitchStats};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `n` distinct free UDP addresses on loopback (bound and released: the OS hands them out).
pub fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let socks: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    socks.iter().map(|s| s.local_addr().unwrap()).collect()
}

/// A software switch serving on loopback until [`Running::stop`].
pub struct Running {
    pub addr: SocketAddr,
    pub handle: SwitchHandle,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<SwitchStats, ina_switch::SwitchError>>>,
}

impl Running {
    /// Stops the switch; returns its final statistics.
    pub fn stop(mut self) -> SwitchStats {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap().unwrap()
    }
}

/// Starts a switch of `shards` shards with `jobs` installed.
pub fn switch(shards: usize, jobs: Vec<JobSpec>) -> Running {
    let mut cfg = SwitchConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.shards = shards;
    cfg.jobs = jobs;
    start(cfg)
}

/// Starts a switch configured by `cfg`.
pub fn start(cfg: SwitchConfig) -> Running {
    let sw = Switch::bind(cfg).unwrap();
    let addr = sw.local_addr();
    let handle = sw.handle();
    let stop = Arc::new(AtomicBool::new(false));
    let thread = Some(sw.spawn(stop.clone()).unwrap());
    Running {
        addr,
        handle,
        stop,
        thread,
    }
}
