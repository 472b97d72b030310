//! An emulated rack of network namespaces on one machine: a hub namespace with one veth port
//! per worker (`sw0`, `sw1`, ...) and a namespace per worker (`eth0`, 198.18.0.{r+1}/24, MAC
//! 02:00:00:00:01:{r}), for switches that sit on raw ports (the L2 software switch, bmv2) and
//! workers that speak kernel UDP to them. Segmentation offload is off on the workers' links, so
//! that every frame is one wire frame (a veth would otherwise carry GSO super-frames that no
//! wire carries), and so is checksum offload (the sender computes every checksum, as a host
//! behind a real NIC's wire would deliver it). Everything is removed on drop, and leftovers of
//! a crashed run with the same name on creation. Needs root, iproute2's `ip` and `ethtool`.

use std::net::Ipv4Addr;
use std::process::Command;

/// The switch's address on the rack.
pub const SWITCH_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
/// The switch's MAC address on the rack.
pub const SWITCH_MAC: &str = "02:00:00:00:00:64";
/// [`SWITCH_MAC`] as bytes.
pub const SWITCH_MAC_BYTES: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];

/// Whether tests that need root must run (CI sets `INA_REQUIRE_PRIVILEGED=1`) rather than
/// skip.
pub fn privileged_required() -> bool {
    std::env::var_os("INA_REQUIRE_PRIVILEGED").is_some_and(|v| v == "1")
}

/// Why a rack cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum RackError {
    /// Not root.
    #[error("network namespaces need root")]
    NotRoot,
    /// An `ip` command failed.
    #[error("{0}")]
    Ip(String),
}

fn ip(args: &[&str]) -> Result<(), RackError> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        RackError::Ip(format!(
            "ip {}: {e} (is iproute2 installed?)",
            args.join(" ")
        ))
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(RackError::Ip(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The rack; see the module documentation.
#[derive(Debug)]
pub struct Rack {
    prefix: String,
    /// The number of worker namespaces.
    pub workers: usize,
}

impl Rack {
    /// Builds a rack of `workers` worker namespaces named `ina{tag}-...`, or says why it
    /// cannot (not root, no `ip`).
    pub fn new(tag: &str, workers: usize) -> Result<Rack, RackError> {
        // SAFETY: geteuid has no preconditions.
        #[allow(unsafe_code)]
        if unsafe { libc::geteuid() } != 0 {
            return Err(RackError::NotRoot);
        }
        let rack = Rack {
            prefix: format!("ina{tag}"),
            workers,
        };
        rack.remove();
        ip(&["netns", "add", &rack.hub()])?;
        ip(&["-n", &rack.hub(), "link", "set", "lo", "up"])?;
        for r in 0..workers {
            let ns = rack.worker_ns(r);
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link",
                "add",
                &Rack::port(r),
                "netns",
                &rack.hub(),
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &ns,
            ])?;
            ip(&["-n", &rack.hub(), "link", "set", &Rack::port(r), "up"])?;
            ip(&[
                "-n",
                &ns,
                "link",
                "set",
                "eth0",
                "address",
                &Rack::worker_mac(r),
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "gso_max_segs", "1"])?;
            // Checksums computed by the sender, as on a wire: a switch that forwards frames
            // unchanged (bmv2) cannot complete them for a NIC that is not there.
            let out = Rack::command_in(&ns, "ethtool")
                .args(["-K", "eth0", "tx", "off"])
                .output()
                .map_err(|e| {
                    RackError::Ip(format!("ethtool: {e} (install the ethtool package)"))
                })?;
            if !out.status.success() {
                return Err(RackError::Ip(format!(
                    "ethtool -K eth0 tx off: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            let addr = format!("{}/24", Rack::worker_ip(r));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(rack)
    }

    /// The hub's namespace.
    pub fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    /// Worker `r`'s namespace.
    pub fn worker_ns(&self, r: usize) -> String {
        format!("{}-w{r}", self.prefix)
    }

    /// The hub's port towards worker `r`.
    pub fn port(r: usize) -> String {
        format!("sw{r}")
    }

    /// Every hub port, comma-separated.
    pub fn ports(&self) -> String {
        (0..self.workers)
            .map(Rack::port)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Worker `r`'s address.
    pub fn worker_ip(r: usize) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 0, r as u8 + 1)
    }

    /// Worker `r`'s MAC address.
    pub fn worker_mac_bytes(r: usize) -> [u8; 6] {
        [0x02, 0, 0, 0, 0x01, r as u8]
    }

    /// Worker `r`'s MAC address, as text.
    pub fn worker_mac(r: usize) -> String {
        let m = Rack::worker_mac_bytes(r);
        format!(
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }

    /// A command that runs `program` inside namespace `netns` (`ip netns exec`, which execs
    /// the program in place: the child's pid is the program's).
    pub fn command_in(netns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", netns]).arg(program);
        c
    }

    fn remove(&self) {
        let _ = ip(&["netns", "del", &self.hub()]);
        for r in 0..self.workers.max(32) {
            let _ = ip(&["netns", "del", &self.worker_ns(r)]);
        }
    }
}

impl Drop for Rack {
    fn drop(&mut self) {
        self.remove();
    }
}
