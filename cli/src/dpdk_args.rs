//! `--port dpdk`: the flags that put a worker or the switch on a DPDK device instead of a
//! kernel UDP socket, shared by `ina worker` and `ina switch`.

use anyhow::bail;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// What moves the datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PortKind {
    /// A kernel UDP socket.
    Udp,
    /// A DPDK device (`--dpdk` gives the EAL its arguments).
    Dpdk,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DpdkArgs {
    /// What moves the datagrams: a kernel UDP socket, or a DPDK device (NIC or virtual
    /// device; this ina must be built with the `dpdk` feature).
    #[arg(long, value_enum, default_value = "udp")]
    pub port: PortKind,
    /// With --port dpdk: the DPDK EAL arguments as one string, e.g. "--no-huge --no-pci
    /// --vdev=net_memif0,role=client,socket=/run/ina.sock" (a NIC: "-a 0000:3b:00.0").
    #[arg(long, allow_hyphen_values = true)]
    pub dpdk: Option<String>,
    /// With --port dpdk: the devices, by DPDK name, comma-separated (default: every --vdev of
    /// --dpdk). A worker uses one; the switch takes one link per device, all with its address.
    #[arg(long, value_delimiter = ',')]
    pub dpdk_device: Vec<String>,
    /// With --port dpdk: neighbours known in advance, IP=MAC, comma-separated (others are
    /// asked for with ARP).
    #[arg(long, value_delimiter = ',')]
    pub dpdk_neighbour: Vec<String>,
}

/// The DPDK flags, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub eal: Vec<String>,
    pub devices: Vec<String>,
    pub neighbours: Vec<(Ipv4Addr, [u8; 6])>,
}

impl DpdkArgs {
    /// The EAL arguments, the device names and the neighbours, checked.
    pub fn parsed(&self) -> anyhow::Result<Parsed> {
        let Some(eal) = &self.dpdk else {
            bail!("--port dpdk needs --dpdk \"EAL ARGUMENTS\" (e.g. \"--no-huge --no-pci --vdev=net_memif0,role=client\")");
        };
        let args: Vec<String> = eal.split_whitespace().map(str::to_string).collect();
        let devices: Vec<String> = if self.dpdk_device.is_empty() {
            args.iter()
                .filter_map(|a| a.strip_prefix("--vdev="))
                .map(|v| v.split(',').next().unwrap_or(v).to_string())
                .collect()
        } else {
            self.dpdk_device.clone()
        };
        if devices.is_empty() {
            bail!("--port dpdk: name the device with --dpdk-device (there is no --vdev=NAME,... in --dpdk)");
        }
        let mut neighbours = Vec::new();
        for n in &self.dpdk_neighbour {
            let (ip, mac) = n
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--dpdk-neighbour {n:?}: expected IP=MAC"))?;
            let ip: Ipv4Addr = ip.parse().map_err(|_| {
                anyhow::anyhow!("--dpdk-neighbour {n:?}: {ip:?} is not an IPv4 address")
            })?;
            neighbours.push((
                ip,
                mac.parse::<ina_wire::MacAddr>()
                    .map_err(|e| anyhow::anyhow!("--dpdk-neighbour {n:?}: {e}"))?
                    .octets(),
            ));
        }
        Ok(Parsed {
            eal: args,
            devices,
            neighbours,
        })
    }

    /// The local address of a DPDK port: a specific IPv4 address and port.
    pub fn local(addr: SocketAddr, flag: &str) -> anyhow::Result<SocketAddrV4> {
        match addr {
            SocketAddr::V4(a) if !a.ip().is_unspecified() && a.port() != 0 => Ok(a),
            _ => bail!("{flag} {addr}: a DPDK port owns one IPv4 address and UDP port: give both (e.g. 198.18.1.1:9000)"),
        }
    }

    /// Opens the DPDK port: the EAL, the device, UDP on `local` receiving `groups` too.
    #[cfg(feature = "dpdk")]
    pub fn open(
        &self,
        local: SocketAddrV4,
        groups: Vec<SocketAddrV4>,
    ) -> anyhow::Result<ina_io::dpdk::DpdkUdpPort> {
        use ina_io::dpdk::{Device, DeviceConfig, DpdkUdpConfig, DpdkUdpPort, Eal};
        let Parsed {
            eal: args,
            devices,
            neighbours,
        } = self.parsed()?;
        let eal = Eal::init(&args)?;
        let mut devs = Vec::new();
        for name in &devices {
            let dev = Device::open(&eal, name, DeviceConfig::default())?;
            tracing::info!(device = name, mac = ?dev.mac(), %local, version = Eal::version(), "DPDK device");
            devs.push(dev);
        }
        Ok(DpdkUdpPort::on_devices(
            devs,
            &DpdkUdpConfig {
                local,
                neighbours,
                groups,
            },
        ))
    }

    /// Without the `dpdk` feature: what is wrong with the flags, or else how to build with
    /// DPDK.
    #[cfg(not(feature = "dpdk"))]
    pub fn unavailable(&self) -> anyhow::Error {
        match self.parsed() {
            Err(e) => e,
            Ok(_) => anyhow::anyhow!("--port dpdk: this ina was built without DPDK (build it with `cargo build --release --features dpdk`, with DPDK's development package installed: apt-get install libdpdk-dev)"),
        }
    }
}
