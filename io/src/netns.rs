//! An emulated rack of network namespaces on one machine: a hub namespace with one veth port
//! per worker (`sw0`, `sw1`, ...) and a namespace per worker (`eth0`, 198.18.1.{r+1}/16, MAC
//! 02:00:00:00:01:{r}); the switch is 198.18.0.100.
//!
//! - **Hub.** With [`Hub::Raw`] the hub's ports carry no address: a switch on raw ports (the L2
//!   software switch, bmv2) serves them. With [`Hub::Bridge`] they are enslaved to a kernel
//!   bridge `br0` holding the switch's address, 198.18.0.100, for a switch on a UDP socket.
//! - **Links.** Each worker link may be rate-limited (`tc tbf` on both ends, so both directions),
//!   may drop frames at random (nftables `numgen random mod 1000 < N` on the netdev ingress hook
//!   of both ends: both directions, one wire frame at a time), and has a configurable MTU
//!   (jumbo frames included).
//! - **Offloads.** Segmentation and checksum offload are off on the workers' links unless asked
//!   for, so that every frame is one wire frame (a veth would otherwise carry GSO super-frames no
//!   wire carries, and one drop would lose many packets) and carries the checksums a real NIC's
//!   wire would deliver.
//!
//! [`Rack::new`] removes leftovers of a crashed run with the same name first; dropping the
//! rack removes it, unless [`Rack::persist`] said to keep it (`ina testbed up`), in which case
//! [`remove_prefix`] removes it later. Needs root, iproute2's `ip` and `tc`, and `nft` for
//! loss.

use std::net::Ipv4Addr;
use std::process::Command;

/// The switch's address on the rack.
pub const SWITCH_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
/// The switch's MAC address on the rack.
pub const SWITCH_MAC: &str = "02:00:00:00:00:64";
/// [`SWITCH_MAC`] as bytes.
pub const SWITCH_MAC_BYTES: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];
/// The bridge's MAC address in a [`Hub::Bridge`] hub (the switch's, as on a raw hub).
const BRIDGE_MAC: &str = SWITCH_MAC;

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
    /// A command failed.
    #[error("{0}")]
    Command(String),
    /// The configuration cannot be built.
    #[error("invalid rack: {0}")]
    Config(String),
}

fn run(program: &str, args: &[&str]) -> Result<String, RackError> {
    let out = Command::new(program).args(args).output().map_err(|e| {
        let hint = match args.get(3).copied().unwrap_or(program) {
            "nft" => " (is nftables installed? apt-get install nftables)",
            "tc" | "ip" => " (is iproute2 installed? apt-get install iproute2)",
            _ => " (is it installed?)",
        };
        RackError::Command(format!("{program} {}: {e}{hint}", args.join(" ")))
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(RackError::Command(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn ip(args: &[&str]) -> Result<(), RackError> {
    run("ip", args).map(|_| ())
}

/// `program args` inside namespace `ns`.
fn run_in(ns: &str, program: &str, args: &[&str]) -> Result<String, RackError> {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    run("ip", &all)
}

/// What sits in the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hub {
    /// Ports without addresses, for a switch on raw ports.
    Raw,
    /// A kernel bridge over the ports, with the switch's address, for a switch on UDP.
    Bridge,
}

/// How to build a rack.
#[derive(Debug, Clone, PartialEq)]
pub struct RackConfig {
    /// Name prefix of every namespace (`{prefix}-hub`, `{prefix}-w0`, ...).
    pub prefix: String,
    /// Worker namespaces (1 to 200).
    pub workers: usize,
    /// What sits in the hub.
    pub hub: Hub,
    /// Rate limit of each link direction, bits per second.
    pub rate_bps: Option<u64>,
    /// Bucket size of the rate limit, bytes (default: 1 ms at the rate, at least two frames
    /// and 16 KiB, or 128 KiB with offloads on).
    pub burst_bytes: Option<u64>,
    /// IP MTU of every link.
    pub mtu: u32,
    /// Probability that a link drops a packet, per direction (in steps of 1/1000).
    pub loss: f64,
    /// Leave segmentation and checksum offload on.
    pub offloads: bool,
}

impl RackConfig {
    /// `workers` workers behind a raw hub, no limits, MTU 1500, named `ina{tag}`.
    pub fn new(tag: &str, workers: usize) -> RackConfig {
        RackConfig {
            prefix: format!("ina{tag}"),
            workers,
            hub: Hub::Raw,
            rate_bps: None,
            burst_bytes: None,
            mtu: 1500,
            loss: 0.0,
            offloads: false,
        }
    }

    /// The loss as nftables' per-mille threshold.
    pub fn loss_per_mille(&self) -> u32 {
        (self.loss * 1000.0).round() as u32
    }

    /// The rate limit's bucket, bytes.
    pub fn burst(&self) -> Option<u64> {
        let rate = self.rate_bps?;
        let frame = u64::from(self.mtu) + 14;
        // With offloads on, a packet may be a 64 KiB GSO super-frame: a smaller bucket makes
        // tbf cut each one up in software, which costs more CPU than the links carry.
        let least = if self.offloads { 128 * 1024 } else { 16 * 1024 };
        Some(
            self.burst_bytes
                .unwrap_or((rate / 8 / 1000).max(2 * frame).max(least))
                .max(frame),
        )
    }

    fn validate(&self) -> Result<(), RackError> {
        let bad = |m: String| Err(RackError::Config(m));
        if self.workers == 0 || self.workers > 200 {
            return bad(format!("{} workers: 1 to 200", self.workers));
        }
        if self.prefix.is_empty()
            || self.prefix.len() > 20
            || !self.prefix.chars().all(|c| c.is_ascii_alphanumeric())
        {
            return bad(format!(
                "name {:?}: 1 to 20 letters and digits",
                self.prefix
            ));
        }
        if !(68..=65_000).contains(&self.mtu) {
            return bad(format!("MTU {}: 68 to 65000", self.mtu));
        }
        if !(0.0..=1.0).contains(&self.loss) {
            return bad(format!("loss {}: a probability", self.loss));
        }
        if self.loss > 0.0 && self.loss_per_mille() == 0 {
            return bad(format!(
                "loss {} rounds to 0 per mille (nftables draws per mille)",
                self.loss
            ));
        }
        if self.rate_bps == Some(0) {
            return bad("a rate of 0".into());
        }
        if self.hub == Hub::Raw && self.offloads {
            return bad(
                "a switch on raw ports needs offloads off (GSO super-frames are not wire frames)"
                    .into(),
            );
        }
        Ok(())
    }
}

/// The rack; see the module documentation.
#[derive(Debug)]
pub struct Rack {
    cfg: RackConfig,
    /// The number of worker namespaces.
    pub workers: usize,
    keep: bool,
}

impl Rack {
    /// Builds a rack of `workers` workers behind a raw hub, named `ina{tag}-...`.
    pub fn new(tag: &str, workers: usize) -> Result<Rack, RackError> {
        Rack::build(RackConfig::new(tag, workers))
    }

    /// Builds a rack as `cfg` says, or says why it cannot (a configuration that cannot work,
    /// not root, a tool missing, a command refused). What it built before a failure is removed.
    pub fn build(cfg: RackConfig) -> Result<Rack, RackError> {
        // A configuration that cannot be built is refused as such, root or not.
        cfg.validate()?;
        // SAFETY: geteuid has no preconditions.
        #[allow(unsafe_code)]
        if unsafe { libc::geteuid() } != 0 {
            return Err(RackError::NotRoot);
        }
        remove_prefix(&cfg.prefix);
        let rack = Rack {
            workers: cfg.workers,
            cfg,
            keep: false,
        };
        rack.set_up()?;
        Ok(rack)
    }

    fn set_up(&self) -> Result<(), RackError> {
        let cfg = &self.cfg;
        let hub = self.hub();
        let mtu = cfg.mtu.to_string();
        ip(&["netns", "add", &hub])?;
        ip(&["-n", &hub, "link", "set", "lo", "up"])?;
        if cfg.hub == Hub::Bridge {
            ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
            ip(&["-n", &hub, "link", "set", "br0", "address", BRIDGE_MAC])?;
            ip(&["-n", &hub, "link", "set", "br0", "mtu", &mtu])?;
            let addr = format!("{SWITCH_IP}/16");
            ip(&["-n", &hub, "addr", "add", &addr, "dev", "br0"])?;
            ip(&["-n", &hub, "link", "set", "br0", "up"])?;
            // Results to a multicast group leave through the bridge.
            ip(&["-n", &hub, "route", "add", "224.0.0.0/4", "dev", "br0"])?;
        }
        for r in 0..cfg.workers {
            let ns = self.worker_ns(r);
            let port = Rack::port(r);
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &port, "netns", &hub, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ])?;
            ip(&["-n", &hub, "link", "set", &port, "mtu", &mtu])?;
            if !cfg.offloads {
                ip(&["-n", &hub, "link", "set", &port, "gso_max_segs", "1"])?;
            }
            if cfg.hub == Hub::Bridge {
                ip(&["-n", &hub, "link", "set", &port, "master", "br0"])?;
            }
            ip(&["-n", &hub, "link", "set", &port, "up"])?;
            ip(&[
                "-n",
                &ns,
                "link",
                "set",
                "eth0",
                "address",
                &Rack::worker_mac(r),
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "mtu", &mtu])?;
            if !cfg.offloads {
                ip(&["-n", &ns, "link", "set", "eth0", "gso_max_segs", "1"])?;
                // Checksums computed by the sender, as on a wire: a switch that forwards frames
                // unchanged (bmv2) cannot complete them for a NIC that is not there.
                for (dev, at) in [("eth0", ns.as_str()), (port.as_str(), hub.as_str())] {
                    in_netns(at, || checksum_and_gro_off(dev))
                        .and_then(|r| r)
                        .map_err(|e| {
                            RackError::Command(format!("offloads off on {dev} in {at}: {e}"))
                        })?;
                }
            }
            let addr = format!("{}/16", Rack::worker_ip(r));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            // Multicast groups are joined and sent on eth0.
            ip(&["-n", &ns, "route", "add", "224.0.0.0/4", "dev", "eth0"])?;
            if let (Some(rate), Some(burst)) = (cfg.rate_bps, cfg.burst()) {
                let rate = format!("{rate}bit");
                let burst = burst.to_string();
                for (dev, at) in [("eth0", ns.as_str()), (port.as_str(), hub.as_str())] {
                    run_in(
                        at,
                        "tc",
                        &[
                            "qdisc", "replace", "dev", dev, "root", "tbf", "rate", &rate, "burst",
                            &burst, "latency", "100ms",
                        ],
                    )?;
                }
            }
            if cfg.loss > 0.0 {
                // Dropped where a frame arrives, as a wire drops it: at the worker's eth0 for
                // the hub's frames, at the hub's port for the worker's (each already one wire
                // frame; a sender's own output hook would see a GSO buffer as one packet, and
                // would tell the sender with EPERM).
                let n = cfg.loss_per_mille();
                for (dev, at) in [("eth0", ns.as_str()), (port.as_str(), hub.as_str())] {
                    let rules = format!(
                        "table netdev inaloss_{dev} {{\n\
                         chain ingress {{ type filter hook ingress device \"{dev}\" priority 0; numgen random mod 1000 < {n} counter drop; }}\n\
                         }}\n"
                    );
                    let file = std::env::temp_dir().join(format!("{at}-{dev}.nft"));
                    std::fs::write(&file, rules).map_err(|e| {
                        RackError::Command(format!("writing {}: {e}", file.display()))
                    })?;
                    let loaded = run_in(at, "nft", &["-f", &file.to_string_lossy()]);
                    let _ = std::fs::remove_file(&file);
                    loaded?;
                }
            }
        }
        Ok(())
    }

    /// How the rack was built.
    pub fn config(&self) -> &RackConfig {
        &self.cfg
    }

    /// Keeps the rack when this value is dropped (remove it with [`remove_prefix`]).
    pub fn persist(mut self) {
        self.keep = true;
    }

    /// The hub's namespace.
    pub fn hub(&self) -> String {
        format!("{}-hub", self.cfg.prefix)
    }

    /// Worker `r`'s namespace.
    pub fn worker_ns(&self, r: usize) -> String {
        format!("{}-w{r}", self.cfg.prefix)
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
        Ipv4Addr::new(198, 18, 1 + (r / 250) as u8, (r % 250) as u8 + 1)
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

    /// Packets the loss rules dropped so far, both directions of every link.
    pub fn dropped(&self) -> u64 {
        let mut all = vec![self.hub()];
        all.extend((0..self.workers).map(|r| self.worker_ns(r)));
        all.iter()
            .filter_map(|ns| run_in(ns, "nft", &["list", "ruleset"]).ok())
            .map(|text| nft_packets(&text))
            .sum()
    }

    /// The TCP congestion control the workers' namespaces use by default (the ring's TCP
    /// streams use it; under random loss, `cubic` backs off far more than `bbr`).
    pub fn tcp_congestion_control(&self) -> Option<String> {
        run_in(
            &self.worker_ns(0),
            "sysctl",
            &["-n", "net.ipv4.tcp_congestion_control"],
        )
        .ok()
        .map(|s| s.trim().to_string())
    }

    /// Packets the links' rate limiters (tbf) dropped so far because their queue was full,
    /// both directions of every link: a sender overrunning the link, not injected loss.
    pub fn queue_drops(&self) -> u64 {
        let mut all = vec![self.hub()];
        all.extend((0..self.workers).map(|r| self.worker_ns(r)));
        all.iter()
            .filter_map(|ns| run_in(ns, "tc", &["-s", "qdisc", "show"]).ok())
            .map(|text| qdisc_drops(&text))
            .sum()
    }
}

/// The `dropped` counts of every qdisc in `tc -s qdisc show`'s listing.
fn qdisc_drops(listing: &str) -> u64 {
    listing
        .split("dropped ")
        .skip(1)
        .filter_map(|rest| {
            let n = rest.split(|c: char| !c.is_ascii_digit()).next()?;
            n.parse::<u64>().ok()
        })
        .sum()
}

/// Moves the calling thread into network namespace `ns` (`/run/netns/NS`, as `ip netns add`
/// makes it), for the rest of its life: a thread that serves a namespace (a switch on its
/// ports) enters it first thing.
pub fn enter_netns(ns: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(format!("/run/netns/{ns}"))?;
    // SAFETY: setns moves only the calling thread, with the namespace file held open for the
    // call.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a thread of its own inside network namespace `ns` ([`enter_netns`]); the
/// caller's thread stays where it is.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(move || enter_netns(ns).map(|()| f()))
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the namespace's thread panicked")))
    })
}

/// A command that runs `program` inside namespace `netns` (`ip netns exec`, which execs the
/// program in place: the child's pid is the program's), or in the caller's namespace for
/// `None`.
pub fn command_in(netns: Option<&str>, program: impl AsRef<std::ffi::OsStr>) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// Turns off transmit checksum offload (and with it segmentation offload, which depends on
/// it) and GRO on `dev` in the calling thread's namespace: `ethtool -K DEV tx off gro off`,
/// as the two SIOCETHTOOL requests it makes.
pub fn checksum_and_gro_off(dev: &str) -> std::io::Result<()> {
    const ETHTOOL_STXCSUM: u32 = 0x17;
    const ETHTOOL_SGRO: u32 = 0x2c;
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    let name = dev.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{dev:?} is not an interface name"),
        ));
    }
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    for cmd in [ETHTOOL_STXCSUM, ETHTOOL_SGRO] {
        let mut value = EthtoolValue { cmd, data: 0 };
        // SAFETY: ifreq is plain data; zeroed is a valid value.
        #[allow(unsafe_code)]
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, &b) in req.ifr_name.iter_mut().zip(name) {
            *d = b as libc::c_char;
        }
        req.ifr_ifru.ifru_data = (&raw mut value).cast();
        use std::os::fd::AsRawFd;
        // SAFETY: SIOCETHTOOL reads the ifreq and the ethtool_value it points to, both live
        // for the call.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The packet counts of every `counter` in nftables' listing.
fn nft_packets(listing: &str) -> u64 {
    listing
        .split("counter packets ")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

impl Drop for Rack {
    fn drop(&mut self) {
        if !self.keep {
            remove_prefix(&self.cfg.prefix);
        }
    }
}

/// The namespaces named `{prefix}-...`.
pub fn namespaces_of(prefix: &str) -> Vec<String> {
    let Ok(list) = run("ip", &["netns", "list"]) else {
        return Vec::new();
    };
    let head = format!("{prefix}-");
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&head))
        .map(str::to_string)
        .collect()
}

/// Removes every namespace named `{prefix}-...` (and with it its links and rules); returns
/// how many there were.
pub fn remove_prefix(prefix: &str) -> usize {
    let found = namespaces_of(prefix);
    for ns in &found {
        let _ = ip(&["netns", "del", ns]);
    }
    found.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_are_checked() {
        let good = RackConfig::new("t", 4);
        assert!(good.validate().is_ok());
        let cases = [
            RackConfig {
                workers: 0,
                ..good.clone()
            },
            RackConfig {
                prefix: "a-b".into(),
                ..good.clone()
            },
            RackConfig {
                mtu: 40,
                ..good.clone()
            },
            RackConfig {
                loss: 0.0001,
                ..good.clone()
            },
            RackConfig {
                loss: 2.0,
                ..good.clone()
            },
            RackConfig {
                rate_bps: Some(0),
                ..good.clone()
            },
            RackConfig {
                offloads: true,
                ..good.clone()
            },
        ];
        for c in cases {
            assert!(matches!(c.validate(), Err(RackError::Config(_))), "{c:?}");
            // Refused before anything is built, with or without root.
            let what = format!("{c:?}");
            assert!(
                matches!(Rack::build(c), Err(RackError::Config(_))),
                "{what}: built, or refused for another reason"
            );
        }
        let limited = RackConfig {
            rate_bps: Some(1_000_000_000),
            mtu: 9000,
            loss: 0.001,
            ..good
        };
        assert_eq!(limited.loss_per_mille(), 1);
        assert_eq!(limited.burst(), Some(125_000));
        assert!(RackConfig::new("t", 4).burst().is_none());
        let offloaded = RackConfig {
            rate_bps: Some(500_000_000),
            hub: Hub::Bridge,
            offloads: true,
            ..RackConfig::new("t", 4)
        };
        assert_eq!(offloaded.burst(), Some(128 * 1024));
    }

    #[test]
    fn nft_counters_are_summed() {
        let listing = "table inet inaloss {\n chain input {\n type filter hook input priority filter; policy accept;\n numgen random mod 1000 < 10 counter packets 7 bytes 700 drop\n }\n chain output {\n numgen random mod 1000 < 10 counter packets 5 bytes 10 drop\n }\n}\n";
        assert_eq!(nft_packets(listing), 12);
        assert_eq!(nft_packets("nothing"), 0);
        let tc = "qdisc tbf 8001: root refcnt 2 rate 1Gbit burst 64Kb lat 100ms\n \
                  Sent 1000 bytes 10 pkt (dropped 7, overlimits 3 requeues 0)\n\
                  qdisc noqueue 0: dev lo root refcnt 2\n Sent 0 bytes 0 pkt (dropped 2, overlimits 0)";
        assert_eq!(qdisc_drops(tc), 9);
    }
}
