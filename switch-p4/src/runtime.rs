//! The runtime configuration of the P4 switch: one description of a switch (its addresses,
//! ports and L2 table) and of its jobs drives every target.
//!
//! - [`bmv2_commands`]: the `simple_switch_CLI` commands that configure the v1model program
//!   on a freshly started `simple_switch`.
//! - [`bfrt_entries`]: the Tofino BfRt entries of the same configuration, as JSON.
//! - [`SwitchDesc::frame_switch`] and [`P4Job::frame_job`]: the configuration of the Rust
//!   frame model (`ina_proto::l2`), and through it of `ina_proto::pipeline`.
//!
//! Every description is validated first ([`validate`]); what a target cannot hold comes back
//! as a typed [`ConfigError`].
//!
//! The control-plane names are those of the shared contract of both programs: tables
//! `InaIngress.switch_addr`, `InaIngress.l2_forward`, `InaIngress.ina_job`,
//! `InaIngress.ina_rank`, `InaEgress.ina_rank_addr`; registers `reg_seq`, `reg_bitmap`,
//! `reg_count`, `reg_exp`, `reg_value_j`; counters `ina_events`, `ina_multicast`.

use crate::{tna, v1model};
use ina_proto::l2::{Endpoint, FrameJob, FrameSwitchConfig, FrameUplink};
use ina_proto::pipeline::{JobConfig, PipelineConfig, PortId, Uplink, DATA_REPORT_COPIES};
use ina_wire::agg::{GAP_BLOCK, GAP_COUNTER};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::net::Ipv4Addr;

/// A MAC address, written `02:00:00:00:00:01` in descriptions (`hex` gives the number
/// `simple_switch_CLI` takes).
pub use ina_wire::MacAddr;

/// One entry of the static L2 table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct L2Entry {
    pub mac: MacAddr,
    pub port: u16,
}

fn default_flood_mgrp() -> u16 {
    0xffff
}

/// A switch: its addresses, its ports and its L2 table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchDesc {
    /// The switch's MAC address.
    pub mac: MacAddr,
    /// The switch's IPv4 address.
    pub ip: Ipv4Addr,
    /// Every port (broadcast frames are flooded to all of them but the ingress one).
    pub ports: Vec<u16>,
    /// Destination MAC → port. The broadcast address is always flooded and is not listed.
    #[serde(default)]
    pub l2: Vec<L2Entry>,
    /// The multicast group that floods broadcast frames.
    #[serde(default = "default_flood_mgrp")]
    pub flood_mgrp: u16,
    /// Whether the switch offers Missing reports (PROTOCOL.md §5): the v1model program and
    /// the frame model keep the gap registers and send reports; off, a Missing is an
    /// unexpected type and no counter is stamped. The Tofino program does the same.
    #[serde(default = "default_gap_reports")]
    pub gap_reports: bool,
}

fn default_gap_reports() -> bool {
    true
}

/// Where one rank lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankDesc {
    /// The switch port the rank is behind.
    pub port: u16,
    pub mac: MacAddr,
    pub ip: Ipv4Addr,
    pub udp_port: u16,
}

impl RankDesc {
    /// What the switch knows a rank's packets by: port, IPv4 address, UDP port.
    pub fn endpoint(&self) -> (u16, Ipv4Addr, u16) {
        (self.port, self.ip, self.udp_port)
    }
}

/// A job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct P4Job {
    pub id: u16,
    pub epoch: u16,
    /// First slot of the job's range in the pool.
    pub slot_base: u16,
    /// Slots in the range.
    pub slot_count: u16,
    /// Elements per packet (64 or 256 on the P4 targets).
    pub elems: u16,
    /// The multicast group of the job's results.
    pub mgrp: u16,
    /// The ranks, in rank order.
    pub ranks: Vec<RankDesc>,
    /// The upper switch, for a rack switch of a tree (PROTOCOL.md §9). The frame model and
    /// the L2 software switch and both P4 programs take it (the Tofino program with the job's id
    /// and slots the same on the upper switch, `tna::check_job`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uplink: Option<UplinkDesc>,
}

/// A job's upper switch: where it is, and the job there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UplinkDesc {
    /// The switch port the upper switch is behind.
    pub port: u16,
    pub mac: MacAddr,
    pub ip: Ipv4Addr,
    pub udp_port: u16,
    /// The job's id, epoch and first slot on the upper switch, and this switch's rank there.
    pub job: u16,
    pub epoch: u16,
    pub slot_base: u16,
    pub rank: u8,
}

/// Why a description cannot be installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("port {0} is beyond the ports of the target (0..=510)")]
    PortRange(u16),
    #[error(
        "job {job} has an upper switch: {target} has no aggregation tree yet (PROTOCOL.md §9)"
    )]
    Uplink { job: u16, target: &'static str },
    #[error(
        "job {job}: {elems} elements per packet under an upper switch; {target} has trees of {supported:?}"
    )]
    TreeElems {
        job: u16,
        elems: u16,
        target: &'static str,
        supported: &'static [u16],
    },
    #[error("job {job}: its upper switch has the endpoint (port, IPv4, UDP port) of rank {rank}")]
    UplinkIsRank { job: u16, rank: usize },
    #[error(
        "{ports} ports have Missing reports; the Tofino program has report sessions for {max}"
    )]
    ReportPorts { ports: usize, max: usize },
    #[error("port {0} is listed twice")]
    DuplicatePort(u16),
    #[error("port {port} of {what} is not a port of the switch")]
    UnknownPort { port: u16, what: String },
    #[error("the L2 table holds {0} twice")]
    DuplicateMac(MacAddr),
    #[error("the broadcast address is flooded; it is not an L2 table entry")]
    BroadcastEntry,
    #[error("multicast group {0} is used twice (or is 0, which means none)")]
    Mgrp(u16),
    #[error(
        "multicast group {0} is reserved for the copies of Missing reports (groups {first}..={last})",
        first = v1model::REPORT_MGRP_BASE,
        last = v1model::REPORT_MGRP_BASE + MAX_PORT
    )]
    ReportMgrp(u16),
    #[error("job {0} is described twice")]
    DuplicateJob(u16),
    #[error("job {job}: slots {base}..{end} lie beyond the pool of {pool} slots of {target}")]
    SlotsBeyondPool {
        job: u16,
        base: u16,
        end: u32,
        pool: u32,
        target: &'static str,
    },
    #[error("job {0}: an empty slot range")]
    NoSlots(u16),
    #[error("job {job}: slots overlap job {other}")]
    Overlap { job: u16, other: u16 },
    #[error("job {job}: {elems} elements per packet; {target} supports {supported:?}")]
    Elems {
        job: u16,
        elems: u16,
        target: &'static str,
        supported: &'static [u16],
    },
    #[error("job {job}: {ranks} ranks; a job has 1 to 32")]
    Ranks { job: u16, ranks: usize },
    #[error("job {job}: ranks {first} and {second} have the same endpoint (port, IPv4, UDP port)")]
    DuplicateEndpoint {
        job: u16,
        first: usize,
        second: usize,
    },
    #[error("job {job}: {error}")]
    Tofino { job: u16, error: tna::TnaJobError },
}

/// The largest port number a bmv2 or Tofino port may have here (bmv2 reserves 511 for drop).
pub const MAX_PORT: u16 = 510;

/// What a target's program holds: its pool, the elements per packet it aggregates, and the
/// control registers the control plane zeroes when it installs a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetLimits {
    pub name: &'static str,
    pub pool_slots: u32,
    pub elems: &'static [u16],
    /// The elements per packet of a job that names an upper switch (PROTOCOL.md §9); none: the
    /// target has no aggregation tree.
    pub tree_elems: &'static [u16],
    /// The Tofino program's own limits apply ([`tna::check_job`]: one pipe, the same job id
    /// and slots on the upper switch).
    pub tna_limits: bool,
}

/// The v1model program (`crate::v1model`).
pub const V1MODEL: TargetLimits = TargetLimits {
    name: "the v1model program",
    pool_slots: v1model::POOL_SLOTS as u32,
    elems: &v1model::SUPPORTED_ELEMS,
    // bmv2 grows a frame by 512 bytes at most: a 16-byte answer of the upper switch cannot
    // become a partial of 256 elements.
    tree_elems: &[64],
    tna_limits: false,
};

/// The frame model (`ina_proto::l2`) and the L2 software switch, held to the v1model
/// program's pool and element counts (the scenarios they share), with aggregation trees.
pub const FRAME_MODEL: TargetLimits = TargetLimits {
    name: "the frame model",
    tree_elems: &v1model::SUPPORTED_ELEMS,
    ..V1MODEL
};

/// The Tofino (TNA) program (`crate::tna`): one pass of 64 elements, its pool, and its control
/// registers (the sequence register there has a companion order register and no count
/// register).
pub const TOFINO: TargetLimits = TargetLimits {
    name: "the Tofino program",
    pool_slots: tna::POOL_SLOTS,
    elems: &[tna::ELEMS],
    tree_elems: &[tna::ELEMS],
    tna_limits: true,
};

/// Checks a switch and its jobs for the v1model program.
pub fn validate(sw: &SwitchDesc, jobs: &[P4Job]) -> Result<(), ConfigError> {
    validate_for(&V1MODEL, sw, jobs)
}

/// Checks a switch and its jobs for a target.
pub fn validate_for(
    target: &TargetLimits,
    sw: &SwitchDesc,
    jobs: &[P4Job],
) -> Result<(), ConfigError> {
    for (i, &p) in sw.ports.iter().enumerate() {
        if p > MAX_PORT {
            return Err(ConfigError::PortRange(p));
        }
        if sw.ports[..i].contains(&p) {
            return Err(ConfigError::DuplicatePort(p));
        }
    }
    for (i, e) in sw.l2.iter().enumerate() {
        if e.mac == MacAddr::BROADCAST {
            return Err(ConfigError::BroadcastEntry);
        }
        if sw.l2[..i].iter().any(|o| o.mac == e.mac) {
            return Err(ConfigError::DuplicateMac(e.mac));
        }
        if !sw.ports.contains(&e.port) {
            return Err(ConfigError::UnknownPort {
                port: e.port,
                what: format!("L2 entry {}", e.mac),
            });
        }
    }
    let mut groups = vec![sw.flood_mgrp];
    if sw.flood_mgrp == 0 {
        return Err(ConfigError::Mgrp(0));
    }
    if v1model::is_report_mgrp(sw.flood_mgrp) {
        return Err(ConfigError::ReportMgrp(sw.flood_mgrp));
    }
    for (i, job) in jobs.iter().enumerate() {
        validate_job_for(target, sw, job)?;
        if jobs[..i].iter().any(|o| o.id == job.id) {
            return Err(ConfigError::DuplicateJob(job.id));
        }
        if groups.contains(&job.mgrp) {
            return Err(ConfigError::Mgrp(job.mgrp));
        }
        groups.push(job.mgrp);
        let end = u32::from(job.slot_base) + u32::from(job.slot_count);
        for o in &jobs[..i] {
            let o_end = u32::from(o.slot_base) + u32::from(o.slot_count);
            if u32::from(job.slot_base) < o_end && u32::from(o.slot_base) < end {
                return Err(ConfigError::Overlap {
                    job: job.id,
                    other: o.id,
                });
            }
        }
    }
    Ok(())
}

/// Checks a job's upper switch: the target has trees for its element count, the upper switch
/// is behind a port of the switch, and it is no rank of the job.
fn validate_uplink(
    target: &TargetLimits,
    sw: &SwitchDesc,
    job: &P4Job,
    up: &UplinkDesc,
) -> Result<(), ConfigError> {
    if target.tree_elems.is_empty() {
        return Err(ConfigError::Uplink {
            job: job.id,
            target: target.name,
        });
    }
    if !target.tree_elems.contains(&job.elems) {
        return Err(ConfigError::TreeElems {
            job: job.id,
            elems: job.elems,
            target: target.name,
            supported: target.tree_elems,
        });
    }
    if !sw.ports.contains(&up.port) {
        return Err(ConfigError::UnknownPort {
            port: up.port,
            what: format!("job {}'s upper switch", job.id),
        });
    }
    let upper = (up.port, up.ip, up.udp_port);
    if let Some(rank) = job.ranks.iter().position(|r| r.endpoint() == upper) {
        return Err(ConfigError::UplinkIsRank { job: job.id, rank });
    }
    Ok(())
}

/// Checks one job against the switch, for the v1model program.
pub fn validate_job(sw: &SwitchDesc, job: &P4Job) -> Result<(), ConfigError> {
    validate_job_for(&V1MODEL, sw, job)
}

/// Checks one job against the switch, for a target.
pub fn validate_job_for(
    target: &TargetLimits,
    sw: &SwitchDesc,
    job: &P4Job,
) -> Result<(), ConfigError> {
    if job.slot_count == 0 {
        return Err(ConfigError::NoSlots(job.id));
    }
    if let Some(up) = &job.uplink {
        validate_uplink(target, sw, job, up)?;
    }
    let end = u32::from(job.slot_base) + u32::from(job.slot_count);
    if end > target.pool_slots {
        return Err(ConfigError::SlotsBeyondPool {
            job: job.id,
            base: job.slot_base,
            end,
            pool: target.pool_slots,
            target: target.name,
        });
    }
    if !target.elems.contains(&job.elems) {
        return Err(ConfigError::Elems {
            job: job.id,
            elems: job.elems,
            target: target.name,
            supported: target.elems,
        });
    }
    if job.ranks.is_empty() || job.ranks.len() > 32 {
        return Err(ConfigError::Ranks {
            job: job.id,
            ranks: job.ranks.len(),
        });
    }
    if job.mgrp == 0 {
        return Err(ConfigError::Mgrp(0));
    }
    if v1model::is_report_mgrp(job.mgrp) {
        return Err(ConfigError::ReportMgrp(job.mgrp));
    }
    for (second, r) in job.ranks.iter().enumerate() {
        if !sw.ports.contains(&r.port) {
            return Err(ConfigError::UnknownPort {
                port: r.port,
                what: format!("job {} rank {second}", job.id),
            });
        }
        let same = |o: &RankDesc| o.endpoint() == r.endpoint();
        if let Some(first) = job.ranks[..second].iter().position(same) {
            return Err(ConfigError::DuplicateEndpoint {
                job: job.id,
                first,
                second,
            });
        }
    }
    if target.tna_limits {
        tna::check_job(&job.tofino_job())
            .map_err(|error| ConfigError::Tofino { job: job.id, error })?;
    }
    Ok(())
}

impl SwitchDesc {
    /// A switch whose port `r` leads to the host with MAC `hosts[r]` (its L2 table), flooding
    /// broadcasts on group 0xffff: a rack with one host per port.
    pub fn one_host_per_port(mac: MacAddr, ip: Ipv4Addr, hosts: &[MacAddr]) -> SwitchDesc {
        SwitchDesc {
            mac,
            ip,
            ports: (0..hosts.len() as u16).collect(),
            l2: hosts
                .iter()
                .enumerate()
                .map(|(r, mac)| L2Entry {
                    mac: *mac,
                    port: r as u16,
                })
                .collect(),
            flood_mgrp: default_flood_mgrp(),
            gap_reports: true,
        }
    }

    /// The configuration of the frame model with the v1model program's pool.
    pub fn frame_switch(&self) -> FrameSwitchConfig {
        FrameSwitchConfig {
            mac: self.mac,
            ip: self.ip.octets(),
            ports: self.ports.clone(),
            l2: self.l2.iter().map(|e| (e.mac, e.port)).collect(),
            pipeline: PipelineConfig {
                pool_slots: v1model::POOL_SLOTS,
                max_elems: v1model::MAX_ELEMS,
            },
            gap_reports: self.gap_reports,
        }
    }
}

impl P4Job {
    /// Job `id` whose rank `r` is the host behind port `r` (`hosts[r]`: its MAC and IPv4
    /// address), at UDP port `udp_port`, on slots `0..slot_count`, with results on group 1.
    pub fn one_rank_per_port(
        id: u16,
        epoch: u16,
        slot_count: u16,
        elems: u16,
        hosts: &[(MacAddr, Ipv4Addr)],
        udp_port: u16,
    ) -> P4Job {
        P4Job {
            id,
            epoch,
            slot_base: 0,
            slot_count,
            elems,
            mgrp: 1,
            ranks: hosts
                .iter()
                .enumerate()
                .map(|(r, (mac, ip))| RankDesc {
                    port: r as u16,
                    mac: *mac,
                    ip: *ip,
                    udp_port,
                })
                .collect(),
            uplink: None,
        }
    }

    /// The job of the frame model.
    pub fn frame_job(&self) -> FrameJob {
        FrameJob {
            job: self.id,
            epoch: self.epoch,
            slot_base: self.slot_base,
            slot_count: self.slot_count,
            elems_per_packet: self.elems,
            ranks: self
                .ranks
                .iter()
                .map(|r| Endpoint {
                    port: r.port,
                    mac: r.mac,
                    ip: r.ip.octets(),
                    udp_port: r.udp_port,
                })
                .collect(),
            uplink: self.uplink.map(|u| FrameUplink {
                switch: Endpoint {
                    port: u.port,
                    mac: u.mac,
                    ip: u.ip.octets(),
                    udp_port: u.udp_port,
                },
                job: u.job,
                epoch: u.epoch,
                slot_base: u.slot_base,
                rank: u.rank,
            }),
        }
    }

    /// The job of the pipeline model (rank `r` on `PortId(r)`, as the frame model has it).
    pub fn pipeline_job(&self) -> JobConfig {
        self.frame_job().pipeline_job()
    }

    /// The job as the Tofino program's check takes it ([`tna::check_job`]): its ranks and
    /// upper switch on their switch ports.
    pub fn tofino_job(&self) -> JobConfig {
        JobConfig {
            ranks: self.ranks.iter().map(|r| PortId(r.port)).collect(),
            uplink: self.uplink.map(|u| Uplink {
                port: PortId(u.port),
                job: u.job,
                epoch: u.epoch,
                rank: u.rank,
                slot_base: u.slot_base,
            }),
            ..self.pipeline_job()
        }
    }
}

/// The control registers of a slot, zeroed when a job is installed.
pub const CONTROL_REGISTERS: [&str; 4] = ["reg_seq", "reg_bitmap", "reg_count", "reg_exp"];

/// The registers of the v1model program's Missing reports, with the cells each keeps per block
/// of [`GAP_BLOCK`] slots: `reg_gap` one per rank, `reg_result_gap` one, `reg_result_use` and
/// `reg_result_seq` one per counter; a rack switch's `reg_partial_gap` one, `reg_partial_use`
/// and `reg_partial_seq` one per counter, `reg_total_gap` one.
pub const GAP_REGISTERS: [(&str, u32); 8] = [
    ("reg_gap", v1model::GAP_RANKS),
    ("reg_result_gap", 1),
    ("reg_result_use", GAP_COUNTER as u32),
    ("reg_result_seq", GAP_COUNTER as u32),
    ("reg_partial_gap", 1),
    ("reg_partial_use", GAP_COUNTER as u32),
    ("reg_partial_seq", GAP_COUNTER as u32),
    ("reg_total_gap", 1),
];

/// Every register of the v1model program.
pub fn v1model_registers() -> Vec<String> {
    let mut regs: Vec<String> = CONTROL_REGISTERS.iter().map(|r| r.to_string()).collect();
    regs.extend(GAP_REGISTERS.iter().map(|(r, _)| r.to_string()));
    regs.extend((0..v1model::MAX_ELEMS / 2).map(|j| format!("reg_value_{j}")));
    regs
}

/// The `simple_switch_CLI` commands that configure a freshly started `simple_switch` running
/// the v1model program: every register reset, the switch's address, the L2 table and its
/// flood group, then every job ([`bmv2_job_commands`]). Multicast node handles are counted
/// from 0, as a fresh switch hands them out.
pub fn bmv2_commands(sw: &SwitchDesc, jobs: &[P4Job]) -> Result<Vec<String>, ConfigError> {
    validate(sw, jobs)?;
    let mut out = bmv2_switch_commands(sw)?;
    let mut next_node = bmv2_switch_nodes(sw);
    for job in jobs {
        out.extend(bmv2_job_commands(job, &mut next_node));
    }
    Ok(out)
}

/// The commands that configure a freshly started `simple_switch` for `sw`, before any job:
/// every register reset, the switch's address, the L2 table, and its flood group (multicast
/// node 0, the first a fresh switch hands out).
pub fn bmv2_switch_commands(sw: &SwitchDesc) -> Result<Vec<String>, ConfigError> {
    validate(sw, &[])?;
    let mut out = Vec::new();
    for r in v1model_registers() {
        out.push(format!("register_reset InaIngress.{r}"));
    }
    out.push(format!(
        "table_set_default InaIngress.switch_addr InaIngress.set_switch_addr {} {} {}",
        sw.mac.hex(),
        u32::from(sw.ip),
        u8::from(sw.gap_reports)
    ));
    for e in &sw.l2 {
        out.push(format!(
            "table_add InaIngress.l2_forward InaIngress.l2_to_port {} => {}",
            e.mac.hex(),
            e.port
        ));
    }
    out.push(format!(
        "table_add InaIngress.l2_forward InaIngress.l2_flood {} => {}",
        MacAddr::BROADCAST.hex(),
        sw.flood_mgrp
    ));
    out.push(format!("mc_mgrp_create {}", sw.flood_mgrp));
    let ports: Vec<String> = sw.ports.iter().map(|p| p.to_string()).collect();
    out.push(format!("mc_node_create 0 {}", ports.join(" ")));
    out.push(format!("mc_node_associate {} 0", sw.flood_mgrp));
    if sw.gap_reports {
        // A report of lost data leaves as an ingress-to-egress clone to the session of its
        // port, whose group sends it twice (PROTOCOL.md §5, DATA_REPORT_COPIES).
        let mut node = 1u32;
        for &port in &sw.ports {
            let group = v1model::report_mgrp(port);
            out.push(format!("mc_mgrp_create {group}"));
            for copy in 0..u32::from(DATA_REPORT_COPIES) {
                out.push(format!("mc_node_create {copy} {port}"));
                out.push(format!("mc_node_associate {group} {node}"));
                node += 1;
            }
            out.push(format!(
                "mirroring_add_mc {} {group}",
                v1model::report_session(port)
            ));
            // A rack switch's report of lost totals goes once to its upper switch.
            out.push(format!(
                "mirroring_add {} {port}",
                v1model::uplink_report_session(port)
            ));
        }
    }
    Ok(out)
}

/// The multicast nodes [`bmv2_switch_commands`] creates: the flood node, and with Missing
/// reports, one per copy of a report on every port.
pub fn bmv2_switch_nodes(sw: &SwitchDesc) -> u32 {
    let per_port = if sw.gap_reports {
        u32::from(DATA_REPORT_COPIES)
    } else {
        0
    };
    1 + per_port * sw.ports.len() as u32
}

/// The commands that install one job: its table entries, its multicast group with one node
/// per rank (replication id = rank), and zeros in the control registers of its slots.
/// `next_node` is the handle the switch gives the next node it creates; it is advanced.
pub fn bmv2_job_commands(job: &P4Job, next_node: &mut u32) -> Vec<String> {
    let mut out = bmv2_job_entry_commands(job);
    let nodes: Vec<u32> = (*next_node..*next_node + job.ranks.len() as u32).collect();
    *next_node += job.ranks.len() as u32;
    out.extend(bmv2_job_attach_commands(job, &nodes));
    out
}

/// The first half of installing a job when the node handles are not known in advance (a
/// switch that has held other jobs): its table entries, its multicast group and one node per
/// rank. The switch answers each `mc_node_create` with the node's handle
/// ([`crate::bmv2_cli::parse_created_nodes`]), which the second half takes.
pub fn bmv2_job_entry_commands(job: &P4Job) -> Vec<String> {
    // The upper switch (PROTOCOL.md §9): its port and addresses, the job there, this
    // switch's rank there, whether the two jobs' blocks of 64 slots coincide, rank 0's port.
    let up = match &job.uplink {
        Some(u) => format!(
            "1 {} {} {} {} {} {} {} {} {} {}",
            u.port,
            u.mac.hex(),
            u32::from(u.ip),
            u.udp_port,
            u.job,
            u.epoch,
            u.slot_base,
            u.rank,
            u8::from(u.slot_base.wrapping_sub(job.slot_base) % GAP_BLOCK == 0),
            job.ranks.first().map_or(0, |r| r.port)
        ),
        None => "0 0 0 0 0 0 0 0 0 0 0".to_string(),
    };
    let mut out = vec![format!(
        "table_add InaIngress.ina_job InaIngress.set_job {} => {} {} {} {} {} {} {up}",
        job.id,
        job.epoch,
        job.slot_base,
        job.slot_count,
        job.elems,
        job.ranks.len(),
        job.mgrp
    )];
    if let Some(u) = &job.uplink {
        out.push(format!(
            "table_add InaIngress.ina_uplink InaIngress.from_upper {} {} {} {} => {}",
            u.job,
            u.port,
            u32::from(u.ip),
            u.udp_port,
            job.id
        ));
    }
    out.push(format!("mc_mgrp_create {}", job.mgrp));
    for (rank, r) in job.ranks.iter().enumerate() {
        out.push(format!(
            "table_add InaIngress.ina_rank InaIngress.set_rank {} {rank} => {} {} {}",
            job.id,
            r.port,
            u32::from(r.ip),
            r.udp_port
        ));
        out.push(format!(
            "table_add InaEgress.ina_rank_addr InaEgress.rewrite_dst {} {rank} => {} {} {}",
            job.id,
            r.mac.hex(),
            u32::from(r.ip),
            r.udp_port
        ));
        out.push(format!("mc_node_create {rank} {}", r.port));
    }
    out
}

/// The second half: the rank nodes (handles `nodes`, in rank order) joined to the job's group,
/// and zeros in the control registers of its slots.
pub fn bmv2_job_attach_commands(job: &P4Job, nodes: &[u32]) -> Vec<String> {
    let mut out: Vec<String> = nodes
        .iter()
        .map(|n| format!("mc_node_associate {} {n}", job.mgrp))
        .collect();
    for reg in CONTROL_REGISTERS {
        for slot in job.slot_base..job.slot_base + job.slot_count {
            out.push(format!("register_write InaIngress.{reg} {slot} 0"));
        }
    }
    // The gap cells of the blocks wholly inside the job (only those are used).
    let blocks = whole_blocks(job);
    for (reg, per_block) in GAP_REGISTERS {
        for cell in blocks.start * per_block..blocks.end * per_block {
            out.push(format!("register_write InaIngress.{reg} {cell} 0"));
        }
    }
    out
}

/// The blocks of [`GAP_BLOCK`] slots wholly inside `job`'s slot range: only they keep gap
/// cells (PROTOCOL.md §5).
fn whole_blocks(job: &P4Job) -> core::ops::Range<u32> {
    let b = u32::from(GAP_BLOCK);
    let first = u32::from(job.slot_base).div_ceil(b);
    let end = (u32::from(job.slot_base) + u32::from(job.slot_count)) / b;
    first..end.max(first)
}

/// The `simple_switch_CLI` commands that read every counter: `ina_events` at every index,
/// then `ina_multicast`.
pub fn bmv2_counter_commands() -> Vec<String> {
    let mut out: Vec<String> = (0..ina_proto::event::Event::COUNT)
        .map(|i| format!("counter_read InaIngress.ina_events {i}"))
        .collect();
    out.push("counter_read InaIngress.ina_multicast 0".into());
    out.extend(
        (0..ina_proto::event::MISSING_COUNTERS)
            .map(|i| format!("counter_read InaIngress.ina_missing {i}")),
    );
    out
}

/// Node ids of the Tofino PRE: the flood nodes take the ids from here on, one per port.
pub const TOFINO_FLOOD_NODE_BASE: u32 = 0x10000;

/// Node ids of the Tofino PRE for the copies of Missing reports: port `i` of the switch's list
/// has nodes `TOFINO_REPORT_NODE_BASE + DATA_REPORT_COPIES * i + copy`.
pub const TOFINO_REPORT_NODE_BASE: u32 = 0x20000;

/// The bytes of a report's mirrored copy the Tofino program needs (`$max_pkt_len` of the
/// report sessions): the report's header (3), the bridged header (7) and the Missing's
/// Ethernet, IPv4, UDP and ina headers (58).
pub const TOFINO_REPORT_COPY_LEN: u16 = 3 + 7 + 58;

/// The Tofino BfRt entries of a switch and its jobs, as one JSON document:
/// `{"entries": [{"table", "action"?, "default"?, "key", "data"}, ...]}`.
///
/// Names: the tables of the shared contract under `pipe.` (`pipe.InaIngress.ina_job`, ...),
/// actions as `InaIngress.set_job`; the multicast engine's `$pre.node` (one node per rank,
/// `$MULTICAST_RID` = rank, and one per port for flooding) and `$pre.mgid`; `$pre.prune`
/// maps each port's level-2 exclusion id (the ingress port) to the port, so that a flood
/// never goes back out of its ingress port. The cells of the Tofino program's control
/// registers ([`TOFINO`]) are zeroed as the `lo`/`hi` fields of each register's pair.
/// The description is checked against [`TOFINO`]'s limits (64 elements per packet).
pub fn bfrt_entries(sw: &SwitchDesc, jobs: &[P4Job]) -> Result<Value, ConfigError> {
    validate_for(&TOFINO, sw, jobs)?;
    if sw.gap_reports && sw.ports.len() > tna::REPORT_PORTS {
        return Err(ConfigError::ReportPorts {
            ports: sw.ports.len(),
            max: tna::REPORT_PORTS,
        });
    }
    // A rank's report session, by its port's place in the list (validated above).
    let report_session = |port: u16| {
        let i = sw.ports.iter().position(|&p| p == port).unwrap_or(0);
        tna::REPORT_SESSION_BASE + i as u16
    };
    let mut e = Vec::new();
    e.push(json!({
        "table": "pipe.InaIngress.switch_addr",
        "default": true,
        "action": "InaIngress.set_switch_addr",
        "data": {"reports": u8::from(sw.gap_reports)},
    }));
    // The switch's addresses: frames to its IPv4 address, ARP requests for it (answered in
    // stage 1), and the source of every reply (written in egress).
    e.push(json!({
        "table": "pipe.InaIngress.ip_target",
        "key": {"hdr.ipv4.dst_addr": sw.ip.to_string()},
        "action": "InaIngress.to_switch",
        "data": {},
    }));
    e.push(json!({
        "table": "pipe.InaIngress.arp_target",
        "key": {"md.arp_req": 1, "hdr.arp.tpa": sw.ip.to_string()},
        "action": "InaIngress.arp_for_switch",
        "data": {"mac": sw.mac.to_string(), "ip": sw.ip.to_string()},
    }));
    e.push(json!({
        "table": "pipe.InaEgress.switch_source",
        "default": true,
        "action": "InaEgress.reply_source",
        "data": {"mac": sw.mac.to_string(), "ip": sw.ip.to_string()},
    }));
    for l in &sw.l2 {
        e.push(json!({
            "table": "pipe.InaIngress.l2_forward",
            "key": {"hdr.ethernet.dst_addr": l.mac.to_string()},
            "action": "InaIngress.l2_to_port",
            "data": {"port": l.port},
        }));
    }
    e.push(json!({
        "table": "pipe.InaIngress.l2_forward",
        "key": {"hdr.ethernet.dst_addr": MacAddr::BROADCAST.to_string()},
        "action": "InaIngress.l2_flood",
        "data": {"mgrp": sw.flood_mgrp},
    }));
    let flood_nodes: Vec<u32> = (0..sw.ports.len() as u32)
        .map(|i| TOFINO_FLOOD_NODE_BASE + i)
        .collect();
    for (&node, &port) in flood_nodes.iter().zip(&sw.ports) {
        e.push(json!({
            "table": "$pre.node",
            "key": {"$MULTICAST_NODE_ID": node},
            "data": {"$MULTICAST_RID": 0, "$MULTICAST_LAG_ID": [], "$DEV_PORT": [port]},
        }));
        e.push(json!({
            "table": "$pre.prune",
            "key": {"$MULTICAST_L2_XID": port},
            "data": {"$DEV_PORT": [port]},
        }));
    }
    e.push(mgid_entry(sw.flood_mgrp, &flood_nodes));
    if sw.gap_reports {
        // A report of lost data is mirrored to the session of its rank's port, whose
        // multicast group sends the copy back out of that port twice (PROTOCOL.md §5).
        for (i, &port) in sw.ports.iter().enumerate() {
            let group = v1model::report_mgrp(port);
            let nodes: Vec<u32> = (0..u32::from(DATA_REPORT_COPIES))
                .map(|copy| {
                    TOFINO_REPORT_NODE_BASE + u32::from(DATA_REPORT_COPIES) * i as u32 + copy
                })
                .collect();
            for (copy, &node) in nodes.iter().enumerate() {
                e.push(json!({
                    "table": "$pre.node",
                    "key": {"$MULTICAST_NODE_ID": node},
                    "data": {"$MULTICAST_RID": copy, "$MULTICAST_LAG_ID": [], "$DEV_PORT": [port]},
                }));
            }
            e.push(mgid_entry(group, &nodes));
            e.push(json!({
                "table": "$mirror.cfg",
                "key": {"$sid": report_session(port)},
                "action": "$normal",
                "data": {
                    "$session_enable": true, "$direction": "INGRESS",
                    "$mcast_grp_a": group, "$mcast_grp_a_valid": true,
                    "$max_pkt_len": TOFINO_REPORT_COPY_LEN,
                },
            }));
        }
    }
    let mut next_node = 1u32;
    for job in jobs {
        e.push(json!({
            "table": "pipe.InaIngress.ina_job",
            "key": {"hdr.ina.job": job.id},
            "action": "InaIngress.set_job",
            "data": {
                "epoch": job.epoch, "slot_base": job.slot_base,
                "slot_base_neg": job.slot_base.wrapping_neg(), "slot_count": job.slot_count,
                "elems": job.elems, "workers": job.ranks.len(), "mgrp": job.mgrp,
                "up": u8::from(job.uplink.is_some()),
                "up_port": job.uplink.map_or(0, |u| u.port),
            },
        }));
        if let Some(up) = &job.uplink {
            // Reports of lost totals go to the session of the upper switch's port.
            let session = if sw.gap_reports {
                report_session(up.port)
            } else {
                0
            };
            uplink_entries(&mut e, job.id, up, session);
        }
        let mut nodes = Vec::new();
        for (rank, r) in job.ranks.iter().enumerate() {
            e.push(json!({
                "table": "pipe.InaIngress.ina_rank",
                "key": {"hdr.ina.job": job.id, "hdr.ina.rank": rank},
                "action": "InaIngress.set_rank",
                "data": {"report_session": report_session(r.port)},
            }));
            e.push(rank_source_entry(job.id, rank as u8, r.endpoint()));
            e.push(json!({
                "table": "pipe.InaEgress.ina_rank_addr",
                "key": {"hdr.ina.job": job.id, "eg_intr_md.egress_rid": rank},
                "action": "InaEgress.rewrite_dst",
                "data": {"mac": r.mac.to_string(), "ip": r.ip.to_string(), "udp_port": r.udp_port},
            }));
            if sw.gap_reports {
                e.push(json!({
                    "table": "pipe.InaEgress.ina_report_addr",
                    "key": {"hdr.ina.job": job.id, "hdr.ina.rank": rank},
                    "action": "InaEgress.report_missing",
                    "data": {
                        "mac": r.mac.to_string(), "ip": r.ip.to_string(), "udp_port": r.udp_port,
                    },
                }));
            }
            e.push(json!({
                "table": "$pre.node",
                "key": {"$MULTICAST_NODE_ID": next_node},
                "data": {"$MULTICAST_RID": rank, "$MULTICAST_LAG_ID": [], "$DEV_PORT": [r.port]},
            }));
            nodes.push(next_node);
            next_node += 1;
        }
        e.push(mgid_entry(job.mgrp, &nodes));
        for reg in &tna::CONTROL_REGISTERS {
            let per_slot = reg.cells_per_slot;
            let cells = u32::from(job.slot_base) * per_slot
                ..(u32::from(job.slot_base) + u32::from(job.slot_count)) * per_slot;
            let name = reg.name;
            let data = if reg.pair {
                json!({format!("InaIngress.{name}.lo"): 0, format!("InaIngress.{name}.hi"): 0})
            } else {
                json!({format!("InaIngress.{name}.f1"): 0})
            };
            for cell in cells {
                e.push(json!({
                    "table": format!("pipe.InaIngress.{name}"),
                    "key": {"$REGISTER_INDEX": cell},
                    "data": data,
                }));
            }
        }
        if sw.gap_reports {
            // The blocks wholly inside the job keep gap cells: marked, and their cells zeroed.
            for block in whole_blocks(job) {
                e.push(json!({
                    "table": "pipe.InaIngress.gap_block",
                    "key": {"hdr.ina.job": job.id, "hdr.ina.slot[12:6]": block},
                    "action": "InaIngress.in_gap_block",
                    "data": {},
                }));
                // (The records of a block's results, and of its partials at PARTIAL_RECORDS.)
                let records = tna::RESULT_USE_CELLS / tna::GAP_BLOCKS;
                for (control, reg, per_block, offsets) in [
                    (
                        "InaIngress",
                        "reg_gap",
                        tna::GAP_CELLS / tna::GAP_BLOCKS,
                        &[0][..],
                    ),
                    ("InaEgress", "reg_result_gap", 1, &[0]),
                    ("InaEgress", "reg_partial_gap", 1, &[0]),
                    (
                        "InaIngress",
                        "reg_result_use",
                        records,
                        &[0, tna::PARTIAL_RECORDS],
                    ),
                    (
                        "InaIngress",
                        "reg_result_seq",
                        records,
                        &[0, tna::PARTIAL_RECORDS],
                    ),
                ] {
                    for offset in offsets {
                        for cell in block * per_block..(block + 1) * per_block {
                            e.push(json!({
                                "table": format!("pipe.{control}.{reg}"),
                                "key": {"$REGISTER_INDEX": offset + cell},
                                "data": {format!("{control}.{reg}.f1"): 0},
                            }));
                        }
                    }
                }
            }
        }
    }
    Ok(json!({ "entries": e }))
}

/// The entries of a rack switch's job (PROTOCOL.md §9; the job's id and slots are the same on
/// the upper switch): the upper switch's frames, of the upper job's epoch or another
/// (`uplink_frame`, ternary, the first entry first, with the report session of lost totals);
/// its Pending and Reject to this switch's rank there (`rank_source`); the addresses, epoch
/// and rank of what this switch sends up (`uplink_addr`).
fn uplink_entries(e: &mut Vec<Value>, job: u16, up: &UplinkDesc, session: u16) {
    for (epoch_mask, epoch_ok, priority) in [(0xffffu16, 3u8, 1u32), (0, 1, 2)] {
        e.push(json!({
            "table": "pipe.InaIngress.uplink_frame",
            "key": {
                "hdr.ina.job": {"value": job, "mask": 0xffff},
                "ig_intr_md.ingress_port": {"value": up.port, "mask": 0x1ff},
                "hdr.ipv4.src_addr": {"value": up.ip.to_string(), "mask": "255.255.255.255"},
                "hdr.udp.src_port": {"value": up.udp_port, "mask": 0xffff},
                "hdr.ina.epoch": {"value": up.epoch & epoch_mask, "mask": epoch_mask},
                "$MATCH_PRIORITY": priority,
            },
            "action": "InaIngress.from_uplink",
            "data": {"epoch_ok": epoch_ok, "report_session": session},
        }));
    }
    e.push(rank_source_entry(
        job,
        up.rank,
        (up.port, up.ip, up.udp_port),
    ));
    e.push(json!({
        "table": "pipe.InaEgress.uplink_addr",
        "key": {"hdr.ina.job": job},
        "action": "InaEgress.up_addr",
        "data": {
            "mac": up.mac.to_string(), "ip": up.ip.to_string(), "udp_port": up.udp_port,
            "epoch": up.epoch, "rank": up.rank,
        },
    }));
}

/// `rank_source`'s entry of rank `rank` of job `job` at endpoint `(port, ip, udp_port)`: its
/// frames come from there.
fn rank_source_entry(job: u16, rank: u8, (port, ip, udp_port): (u16, Ipv4Addr, u16)) -> Value {
    json!({
        "table": "pipe.InaIngress.rank_source",
        "key": {
            "hdr.ina.job": job, "hdr.ina.rank": rank,
            "ig_intr_md.ingress_port": port, "hdr.ipv4.src_addr": ip.to_string(),
            "hdr.udp.src_port": udp_port,
        },
        "action": "InaIngress.rank_source_ok",
        "data": {},
    })
}

fn mgid_entry(mgrp: u16, nodes: &[u32]) -> Value {
    json!({
        "table": "$pre.mgid",
        "key": {"$MGID": mgrp},
        "data": {
            "$MULTICAST_NODE_ID": nodes,
            "$MULTICAST_NODE_L1_XID_VALID": vec![false; nodes.len()],
            "$MULTICAST_NODE_L1_XID": vec![0; nodes.len()],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sw() -> SwitchDesc {
        SwitchDesc {
            mac: "02:00:00:00:00:fe".parse().unwrap(),
            ip: Ipv4Addr::new(198, 18, 0, 254),
            ports: vec![0, 1, 2],
            l2: vec![L2Entry {
                mac: "02:00:00:00:09:01".parse().unwrap(),
                port: 1,
            }],
            flood_mgrp: 100,
            gap_reports: true,
        }
    }

    fn job(id: u16, base: u16, ranks: u8) -> P4Job {
        P4Job {
            id,
            epoch: 5,
            slot_base: base,
            slot_count: 4,
            elems: 64,
            mgrp: id,
            ranks: (0..ranks)
                .map(|r| RankDesc {
                    port: u16::from(r % 3),
                    mac: MacAddr([2, 0, 0, 0, 1, r]),
                    ip: Ipv4Addr::new(198, 18, 1, r),
                    udp_port: 9000,
                })
                .collect(),
            uplink: None,
        }
    }

    #[test]
    fn upper_switches_are_checked_per_target() {
        let mut s = sw();
        s.ports.push(3);
        let up = UplinkDesc {
            port: 3,
            mac: "02:00:00:00:0a:03".parse().unwrap(),
            ip: Ipv4Addr::new(198, 19, 0, 1),
            udp_port: 18766,
            job: 20,
            epoch: 5,
            slot_base: 0,
            rank: 1,
        };
        let mut rack = job(1, 0, 2);
        rack.uplink = Some(up);
        assert_eq!(validate(&s, &[rack.clone()]), Ok(()));
        assert_eq!(validate_for(&FRAME_MODEL, &s, &[rack.clone()]), Ok(()));
        // The Tofino program keeps the job's id and slots on the upper switch.
        assert_eq!(
            bfrt_entries(&s, &[rack.clone()]),
            Err(ConfigError::Tofino {
                job: 1,
                error: tna::TnaJobError::UplinkJob { job: 1, upper: 20 }
            })
        );
        let mut same = rack.clone();
        same.uplink = Some(UplinkDesc { job: 1, ..up });
        let entries = bfrt_entries(&s, &[same.clone()]).expect("a Tofino rack switch");
        let tables: Vec<&str> = entries["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["table"].as_str())
            .collect();
        for t in ["pipe.InaIngress.uplink_frame", "pipe.InaEgress.uplink_addr"] {
            assert!(tables.contains(&t), "{t}");
        }
        let mut shifted = same.clone();
        shifted.uplink = Some(UplinkDesc {
            job: 1,
            slot_base: 64,
            ..up
        });
        assert_eq!(
            bfrt_entries(&s, &[shifted]),
            Err(ConfigError::Tofino {
                job: 1,
                error: tna::TnaJobError::UplinkSlots { base: 0, upper: 64 }
            })
        );
        // bmv2 cannot grow an answer into a partial of 256 elements; the frame model can.
        let mut wide = rack.clone();
        wide.elems = 256;
        assert!(matches!(
            validate(&s, &[wide.clone()]),
            Err(ConfigError::TreeElems { elems: 256, .. })
        ));
        assert_eq!(validate_for(&FRAME_MODEL, &s, &[wide]), Ok(()));
        let mut away = rack.clone();
        away.uplink = Some(UplinkDesc { port: 9, ..up });
        assert!(matches!(
            validate(&s, &[away]),
            Err(ConfigError::UnknownPort { port: 9, .. })
        ));
        let mut own = rack.clone();
        own.uplink = Some(UplinkDesc {
            port: own.ranks[1].port,
            ip: own.ranks[1].ip,
            udp_port: own.ranks[1].udp_port,
            ..up
        });
        assert_eq!(
            validate(&s, &[own]),
            Err(ConfigError::UplinkIsRank { job: 1, rank: 1 })
        );
        // The job's entry carries the upper switch; the upper job's frames find the job.
        let commands = bmv2_job_entry_commands(&rack);
        // ... its port, MAC, IPv4 and UDP port, job 20, epoch 5, first slot 0, rank 1, blocks
        // in common, rank 0's port.
        assert!(commands[0].ends_with(&format!(
            "=> 5 0 4 64 2 1 1 3 {} {} 18766 20 5 0 1 1 0",
            up.mac.hex(),
            u32::from(up.ip)
        )));
        assert_eq!(
            commands[1],
            format!(
                "table_add InaIngress.ina_uplink InaIngress.from_upper 20 3 {} 18766 => 1",
                u32::from(up.ip)
            )
        );
        let flat = bmv2_job_entry_commands(&job(1, 0, 2));
        assert!(flat[0].ends_with(" 0 0 0 0 0 0 0 0 0 0 0"));
        assert!(!flat.iter().any(|c| c.contains("ina_uplink")));
    }

    #[test]
    fn validation_errors() {
        let s = sw();
        assert_eq!(validate(&s, &[job(1, 0, 3), job(2, 4, 3)]), Ok(()));
        assert!(matches!(
            validate(&s, &[job(1, 1022, 2)]),
            Err(ConfigError::SlotsBeyondPool { end: 1026, .. })
        ));
        // Tofino's pool is larger; it aggregates 64 elements only.
        assert_eq!(validate_for(&TOFINO, &s, &[job(1, 1022, 2)]), Ok(()));
        let mut wide = job(1, 0, 2);
        wide.elems = 256;
        assert_eq!(validate(&s, &[wide.clone()]), Ok(()));
        assert!(matches!(
            bfrt_entries(&s, &[wide]),
            Err(ConfigError::Elems { elems: 256, .. })
        ));
        // Tofino 2's mirror ids give report sessions to 255 ports.
        let mut many = s.clone();
        many.gap_reports = true;
        many.ports = (0..=255).collect();
        assert!(bfrt_entries(&many, &[job(1, 0, 3)]).is_err_and(|e| e
            == ConfigError::ReportPorts {
                ports: 256,
                max: 255
            }));
        many.ports.pop();
        assert!(bfrt_entries(&many, &[job(1, 0, 3)]).is_ok());
        assert!(matches!(
            validate(&s, &[job(1, 0, 33)]),
            Err(ConfigError::Ranks { ranks: 33, .. })
        ));
        assert!(matches!(
            validate(&s, &[job(1, 0, 0)]),
            Err(ConfigError::Ranks { ranks: 0, .. })
        ));
        let mut dup = job(1, 0, 2);
        dup.ranks[1].ip = dup.ranks[0].ip;
        dup.ranks[1].port = dup.ranks[0].port;
        assert_eq!(
            validate(&s, &[dup]),
            Err(ConfigError::DuplicateEndpoint {
                job: 1,
                first: 0,
                second: 1
            })
        );
        assert_eq!(
            validate(&s, &[job(1, 0, 2), job(2, 3, 2)]),
            Err(ConfigError::Overlap { job: 2, other: 1 })
        );
        assert_eq!(
            validate(&s, &[job(1, 0, 2), job(1, 4, 2)]),
            Err(ConfigError::DuplicateJob(1))
        );
        let mut e = job(1, 0, 2);
        e.elems = 128;
        assert!(matches!(validate(&s, &[e]), Err(ConfigError::Elems { .. })));
        let mut g = job(1, 0, 2);
        g.mgrp = 100;
        assert_eq!(validate(&s, &[g]), Err(ConfigError::Mgrp(100)));
        let mut p = job(1, 0, 2);
        p.ranks[0].port = 7;
        assert!(matches!(
            validate(&s, &[p]),
            Err(ConfigError::UnknownPort { port: 7, .. })
        ));
        let mut b = sw();
        b.l2.push(L2Entry {
            mac: MacAddr::BROADCAST,
            port: 0,
        });
        assert_eq!(validate(&b, &[]), Err(ConfigError::BroadcastEntry));
        let mut r = sw();
        r.ports.push(511);
        assert_eq!(validate(&r, &[]), Err(ConfigError::PortRange(511)));
        assert!("02:00:00:00:00".parse::<MacAddr>().is_err());
        assert!("02:00:00:00:00:0g".parse::<MacAddr>().is_err());
        assert!("02:00:00:00:00:00:00".parse::<MacAddr>().is_err());
    }

    #[test]
    fn job_commands_count_node_handles() {
        let plain = SwitchDesc {
            gap_reports: false,
            ..sw()
        };
        let cmds = bmv2_commands(&plain, &[job(1, 0, 2), job(2, 4, 3)]).unwrap();
        let assoc: Vec<&String> = cmds
            .iter()
            .filter(|c| c.starts_with("mc_node_associate"))
            .collect();
        let want = [
            "mc_node_associate 100 0",
            "mc_node_associate 1 1",
            "mc_node_associate 1 2",
            "mc_node_associate 2 3",
            "mc_node_associate 2 4",
            "mc_node_associate 2 5",
        ];
        assert_eq!(assoc, want.iter().collect::<Vec<_>>());
        assert!(cmds.contains(&"register_write InaIngress.reg_exp 7 0".to_string()));
        assert!(!cmds.contains(&"register_write InaIngress.reg_exp 8 0".to_string()));
        assert!(!cmds.iter().any(|c| c.starts_with("mirroring_add")));
        assert!(!cmds.iter().any(|c| c.contains("reg_gap ")));

        // With reports, every port's group sends a report twice, and the jobs' nodes follow.
        let s = sw();
        let ports = s.ports.len() as u32;
        let cmds = bmv2_commands(&s, &[job(1, 0, 2), job(2, 64, 3)]).unwrap();
        assert_eq!(bmv2_switch_nodes(&s), 1 + 2 * ports);
        let port = s.ports[1];
        let group = v1model::report_mgrp(port);
        for want in [
            format!("mc_mgrp_create {group}"),
            format!("mc_node_create 0 {port}"),
            format!("mc_node_create 1 {port}"),
            format!("mc_node_associate {group} 3"),
            format!("mc_node_associate {group} 4"),
            format!("mirroring_add_mc {} {group}", v1model::report_session(port)),
            format!("mc_node_associate 1 {}", 1 + 2 * ports),
        ] {
            assert!(cmds.contains(&want), "{want} missing from {cmds:#?}");
        }
        // Job 2's slots 64..72 hold no whole block; job 1's 0..8 neither: no gap cells.
        assert!(!cmds.iter().any(|c| c.contains("reg_gap ")));
        let whole = job(3, 128, 2);
        let whole = P4Job {
            slot_count: 128,
            ..whole
        };
        let cmds = bmv2_job_attach_commands(&whole, &[]);
        let gap_cells = |reg: &str| {
            cmds.iter()
                .filter(|c| c.starts_with(&format!("register_write InaIngress.{reg} ")))
                .count()
        };
        assert_eq!(gap_cells("reg_gap"), 2 * 32);
        assert_eq!(gap_cells("reg_result_gap"), 2);
        assert_eq!(gap_cells("reg_result_use"), 2 * 64);
        assert!(cmds.contains(&"register_write InaIngress.reg_gap 127 0".to_string()));
        assert!(!cmds.contains(&"register_write InaIngress.reg_gap 128 0".to_string()));
        assert!(!cmds.contains(&"register_write InaIngress.reg_gap 63 0".to_string()));
        // The reports' groups are not for jobs.
        let taken = P4Job {
            mgrp: v1model::report_mgrp(7),
            ..job(4, 200, 1)
        };
        assert_eq!(
            validate(&s, &[taken]),
            Err(ConfigError::ReportMgrp(v1model::report_mgrp(7)))
        );
    }

    #[test]
    fn descriptions_configure_the_model() {
        let s = sw();
        let j = job(3, 8, 4);
        let mut model = ina_proto::l2::FrameSwitch::new(s.frame_switch()).unwrap();
        model.add_job(j.frame_job()).unwrap();
        assert_eq!(model.jobs()[0].ranks[2].ip, [198, 18, 1, 2]);
        assert_eq!(j.pipeline_job().ranks.len(), 4);
        assert_eq!(model.pipeline().config().pool_slots, v1model::POOL_SLOTS);
    }
}
