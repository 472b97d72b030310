//! The `ina` software switch: the `proto` pipeline model served over UDP.
//!
//! A [`Switch`] binds one UDP socket per shard to the same address (`SO_REUSEPORT`) and has the
//! kernel steer each datagram to the shard that owns its slot (`(slot / 64) mod shards`, a classic BPF
//! program on the reuseport group). Each shard thread owns a [`Pipeline`] and its registers: no
//! lock is taken on the per-packet path. Jobs are installed through a [`SwitchHandle`], from
//! flags, a config file, or the TCP [`control`] endpoint.
//!
//! What it must not do: decide anything about aggregation itself (that is `ina-proto`'s
//! pipeline, shared with the simulator and mirrored by the P4 programs), or crash on any input.
//!
//! [`Pipeline`]: ina_proto::pipeline::Pipeline

pub mod config;
pub mod control;
mod epoch;
pub mod frames;
mod loss;
pub mod metrics;
mod port;
mod shard;
mod steer;

pub use config::{JobSpec, SwitchConfig, UplinkSpec};
pub use control::{
    ControlBindError, ControlClient, ControlLimits, ControlServer, Request, Response, SwitchHandle,
};
pub use ina_switch_api::{IoStats, ShardStats, SwitchStats};

use ina_io::{Port, UdpPort};
use ina_proto::pipeline::Pipeline;
use port::ShardPort;
use shard::{Command, Shard};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// Why the switch could not start or failed.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: ina_io::IoError,
    },
    #[error("steering datagrams to {shards} shards: {source}")]
    Steer {
        shards: usize,
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("job: {0}")]
    Job(String),
    #[error("shard thread: {0}")]
    Thread(String),
    #[error("control endpoint: {0}")]
    Control(std::io::Error),
}

/// A bound, not yet running switch.
#[derive(Debug)]
pub struct Switch {
    cfg: SwitchConfig,
    ports: Vec<ShardPort>,
    local: SocketAddr,
    handle: SwitchHandle,
    commands: Vec<mpsc::Receiver<Command>>,
    steered: bool,
}

impl Switch {
    /// Binds the shards' sockets and installs the configured jobs.
    pub fn bind(cfg: SwitchConfig) -> Result<Switch, SwitchError> {
        if cfg.shards == 0 || cfg.shards > 64 {
            return Err(SwitchError::Config(format!(
                "shards must be 1..=64, got {}",
                cfg.shards
            )));
        }
        let mut udp = cfg.udp.clone();
        udp.reuse_port = cfg.shards > 1;
        // The shards' sockets share their address through SO_REUSEPORT, which would as well
        // let them join the group of another switch already serving it: a plain socket checks
        // first that the address is free (and, for port 0, picks the port).
        let listen = if udp.reuse_port {
            std::net::UdpSocket::bind(cfg.listen)
                .and_then(|s| s.local_addr())
                .map_err(|e| SwitchError::Bind {
                    addr: cfg.listen,
                    source: ina_io::IoError::Bind {
                        addr: cfg.listen,
                        source: if e.kind() == std::io::ErrorKind::AddrInUse {
                            std::io::Error::new(
                                e.kind(),
                                "address already in use (is another switch serving it?)",
                            )
                        } else {
                            e
                        },
                    },
                })?
        } else {
            cfg.listen
        };
        let first = UdpPort::bind_with(listen, &udp).map_err(|source| SwitchError::Bind {
            addr: listen,
            source,
        })?;
        let local = first.local_addr();
        let mut ports = vec![first];
        for _ in 1..cfg.shards {
            let p = UdpPort::bind_with(local, &udp).map_err(|source| SwitchError::Bind {
                addr: local,
                source,
            })?;
            ports.push(p);
        }
        let steered = if cfg.shards > 1 {
            steer::attach_slot_steering(&ports[0], cfg.shards).map_err(|source| {
                SwitchError::Steer {
                    shards: cfg.shards,
                    source,
                }
            })?;
            true
        } else {
            false
        };
        let ports = ports.into_iter().map(ShardPort::Udp).collect();
        Switch::assemble(cfg, ports, local, steered, None)
    }

    /// One shard on a DPDK port: the switch answers ARP for the port's address and sends
    /// every reply out of its device.
    #[cfg(feature = "dpdk")]
    pub fn with_dpdk(
        mut cfg: SwitchConfig,
        port: ina_io::dpdk::DpdkUdpPort,
    ) -> Result<Switch, SwitchError> {
        cfg.shards = 1;
        let local = port.local_addr();
        cfg.listen = local;
        let mtu = port
            .devices()
            .iter()
            .map(|d| d.max_frame().saturating_sub(14))
            .min()
            .unwrap_or(0);
        Switch::assemble(
            cfg,
            vec![ShardPort::Dpdk(Box::new(port))],
            local,
            false,
            Some(mtu),
        )
    }

    fn assemble(
        cfg: SwitchConfig,
        ports: Vec<ShardPort>,
        local: SocketAddr,
        steered: bool,
        link_mtu: Option<usize>,
    ) -> Result<Switch, SwitchError> {
        let mut senders = Vec::new();
        let mut commands = Vec::new();
        for _ in 0..cfg.shards {
            let (tx, rx) = mpsc::channel();
            senders.push(tx);
            commands.push(rx);
        }
        let mut handle = SwitchHandle::new(cfg.pipeline, senders, local);
        if let Some(mtu) = link_mtu {
            handle = handle.with_link_mtu(mtu);
        }
        for job in &cfg.jobs {
            handle
                .add_job(job.clone())
                .map_err(|e| SwitchError::Job(e.to_string()))?;
        }
        tracing::info!(%local, shards = cfg.shards, steered, pool = cfg.pipeline.pool_slots, "switch bound");
        Ok(Switch {
            cfg,
            ports,
            local,
            handle,
            commands,
            steered,
        })
    }

    /// The address workers send to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// A handle to install jobs and read statistics, usable from any thread.
    pub fn handle(&self) -> SwitchHandle {
        self.handle.clone()
    }

    /// Runs the shards until `shutdown` is set; returns the final statistics.
    pub fn run(self, shutdown: Arc<AtomicBool>) -> Result<SwitchStats, SwitchError> {
        let mut threads: Vec<JoinHandle<ShardStats>> = Vec::new();
        self.handle.set_running(true);
        let shards = self.ports.len();
        let meshes = shard::Mesh::build(shards, self.local);
        // Reinstall requests from the shards (a new worker took a rank), served here so that
        // no shard ever waits for the control plane.
        let (requests, reinstalls) = mpsc::channel::<u16>();
        let supervisor = {
            let handle = self.handle.clone();
            let stop = shutdown.clone();
            std::thread::Builder::new()
                .name("ina-switch-control".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match reinstalls.recv_timeout(std::time::Duration::from_millis(50)) {
                            Ok(job) => {
                                if let Err(e) = handle.reinstall(job) {
                                    tracing::warn!(job, error = %e, "reinstalling the job failed");
                                }
                            }
                            Err(mpsc::RecvTimeoutError::Timeout) => {}
                            Err(mpsc::RecvTimeoutError::Disconnected) => break,
                        }
                    }
                })
                .map_err(|e| SwitchError::Thread(e.to_string()))?
        };
        for (i, ((port, commands), mesh)) in self
            .ports
            .into_iter()
            .zip(self.commands)
            .zip(meshes)
            .enumerate()
        {
            let shard = Shard::new(
                i,
                mesh,
                shard::Joins::new(requests.clone()),
                port,
                {
                    let mut pipe = Pipeline::new(self.cfg.pipeline);
                    // The software switch sends the Missing reports (PROTOCOL.md §5).
                    pipe.set_gap_reports(true);
                    pipe
                },
                commands,
                (self.cfg.loss, self.cfg.seed.wrapping_add(i as u64)),
            );
            let stop = shutdown.clone();
            let t = std::thread::Builder::new()
                .name(format!("ina-shard-{i}"))
                .spawn(move || shard.run(&stop))
                .map_err(|e| SwitchError::Thread(e.to_string()))?;
            threads.push(t);
        }
        let mut stats = Vec::new();
        let mut failed = None;
        for t in threads {
            match t.join() {
                Ok(s) => stats.push(s),
                Err(_) => failed = Some(SwitchError::Thread("a shard panicked".into())),
            }
        }
        self.handle.set_running(false);
        shutdown.store(true, Ordering::SeqCst);
        drop(requests);
        let _ = supervisor.join();
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(SwitchStats::from_shards(stats))
    }

    /// Runs the switch on a thread of its own.
    pub fn spawn(
        self,
        shutdown: Arc<AtomicBool>,
    ) -> std::io::Result<JoinHandle<Result<SwitchStats, SwitchError>>> {
        std::thread::Builder::new()
            .name("ina-switch".into())
            .spawn(move || self.run(shutdown))
    }

    /// Whether the kernel steers datagrams to shards by slot.
    pub fn steered(&self) -> bool {
        self.steered
    }
}
