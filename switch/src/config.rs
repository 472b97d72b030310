//! Configuration of the switch and of the jobs it serves.

use ina_io::UdpConfig;
use ina_proto::pipeline::PipelineConfig;
use std::net::SocketAddr;

pub use ina_switch_api::{JobSpec, UplinkSpec};

/// The switch daemon's settings.
#[derive(Debug, Clone)]
pub struct SwitchConfig {
    /// The UDP address to serve on.
    pub listen: SocketAddr,
    /// Threads, each owning the blocks of 64 slots `b` with `b mod shards == its index`.
    pub shards: usize,
    pub pipeline: PipelineConfig,
    pub udp: UdpConfig,
    /// Probability of dropping each datagram on the way in, and again on the way out
    /// (fault injection for tests and benchmarks).
    pub loss: f64,
    /// Seed of the loss injection.
    pub seed: u64,
    /// Jobs installed at start.
    pub jobs: Vec<JobSpec>,
}

impl SwitchConfig {
    /// Defaults: one shard, a 4096-slot pool of up to 256 elements, no loss.
    pub fn new(listen: SocketAddr) -> SwitchConfig {
        SwitchConfig {
            listen,
            shards: 1,
            pipeline: PipelineConfig {
                pool_slots: 4096,
                max_elems: 256,
            },
            udp: UdpConfig::default(),
            loss: 0.0,
            seed: 1,
            jobs: Vec::new(),
        }
    }
}
