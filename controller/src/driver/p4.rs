//! What the P4 drivers share: checking a P4 switch's spec, and describing a job for
//! `ina_switch_p4::runtime` from what the controller knows of it.

use super::Install;
use crate::api::{P4Spec, SwitchKind, SwitchSpec};
use ina_switch_p4::runtime::{self, P4Job, RankDesc, TargetLimits, UplinkDesc};
use std::net::SocketAddr;

/// The target limits of a P4 switch kind.
pub(crate) fn target(kind: SwitchKind) -> Option<&'static TargetLimits> {
    match kind {
        SwitchKind::Software => None,
        SwitchKind::Bmv2 => Some(&runtime::V1MODEL),
        SwitchKind::Tofino => Some(&runtime::TOFINO),
    }
}

/// Checks that a switch's spec fits its kind: a P4 switch has a valid data-plane description,
/// a pool and packet size its program holds, and takes ina packets at its own address.
pub fn check_spec(spec: &SwitchSpec) -> Result<(), String> {
    let name = &spec.name;
    let Some(limits) = target(spec.kind) else {
        if spec.p4.is_some() {
            return Err(format!(
                "switch {name:?}: a software switch takes no p4 description"
            ));
        }
        return Ok(());
    };
    let kind = spec.kind;
    let p4 = spec
        .p4
        .as_ref()
        .ok_or_else(|| format!("switch {name:?}: a {kind} switch needs its p4 description (its addresses, ports, L2 table and hosts)"))?;
    runtime::validate_for(limits, &p4.switch, &[]).map_err(|e| format!("switch {name:?}: {e}"))?;
    if u32::from(spec.slots) > limits.pool_slots {
        return Err(format!(
            "switch {name:?}: {} slots, but {} has {}",
            spec.slots, limits.name, limits.pool_slots
        ));
    }
    let most = limits.elems.iter().copied().max().unwrap_or(0);
    if spec.elems_per_slot > most {
        return Err(format!(
            "switch {name:?}: {} elements per slot, but {} aggregates at most {most}",
            spec.elems_per_slot, limits.name
        ));
    }
    let data = SocketAddr::from((p4.switch.ip, ina_wire::agg::UDP_PORT));
    if spec.data != data {
        return Err(format!(
            "switch {name:?}: its data address is {data} (its IPv4 address and ina's UDP port), not {}",
            spec.data
        ));
    }
    for (i, h) in p4.hosts.iter().enumerate() {
        if !p4.switch.l2.iter().any(|e| e.mac == h.mac) {
            return Err(format!(
                "switch {name:?}: host {} has MAC {}, which its L2 table does not hold",
                h.ip, h.mac
            ));
        }
        if p4.hosts[..i].iter().any(|o| o.ip == h.ip) {
            return Err(format!("switch {name:?}: host {} is listed twice", h.ip));
        }
    }
    let _ = kind;
    Ok(())
}

/// Where a worker's address lives behind the switch.
pub(crate) fn rank_of(p4: &P4Spec, addr: SocketAddr) -> Result<RankDesc, String> {
    let SocketAddr::V4(v4) = addr else {
        return Err(format!(
            "worker {addr}: a P4 switch takes IPv4 workers only"
        ));
    };
    let host = p4.hosts.iter().find(|h| h.ip == *v4.ip()).ok_or_else(|| {
        format!(
            "worker {addr}: {} is not one of the switch's hosts",
            v4.ip()
        )
    })?;
    let port = p4
        .switch
        .l2
        .iter()
        .find(|e| e.mac == host.mac)
        .map(|e| e.port)
        .ok_or_else(|| format!("worker {addr}: the L2 table does not hold {}", host.mac))?;
    Ok(RankDesc {
        port,
        mac: host.mac,
        ip: *v4.ip(),
        udp_port: v4.port(),
    })
}

/// A job as the P4 runtime describes it, checked against the target. Its multicast group is
/// its job number.
pub(crate) fn job_desc(
    limits: &TargetLimits,
    p4: &P4Spec,
    job: &Install,
    epoch: u16,
) -> Result<P4Job, String> {
    if job.job == p4.switch.flood_mgrp {
        return Err(format!(
            "job {}: its multicast group would be the switch's flood group {}",
            job.job, p4.switch.flood_mgrp
        ));
    }
    let desc = P4Job {
        id: job.job,
        epoch,
        slot_base: job.slots.base,
        slot_count: job.slots.count,
        elems: job.elems_per_packet,
        mgrp: job.job,
        ranks: job
            .workers
            .iter()
            .map(|a| rank_of(p4, *a))
            .collect::<Result<_, _>>()?,
        uplink: job
            .uplink
            .map(|u| {
                // The upper switch is reached as a host is: by the hosts and L2 tables.
                let at = rank_of(p4, u.addr).map_err(|e| format!("upper switch: {e}"))?;
                Ok::<_, String>(UplinkDesc {
                    port: at.port,
                    mac: at.mac,
                    ip: at.ip,
                    udp_port: at.udp_port,
                    job: u.job.unwrap_or(job.job),
                    epoch: u.epoch,
                    slot_base: u.slot_base.unwrap_or(job.slots.base),
                    rank: u.rank,
                })
            })
            .transpose()?,
    };
    runtime::validate_job_for(limits, &p4.switch, &desc).map_err(|e| e.to_string())?;
    Ok(desc)
}

/// An epoch for a job's next install: never 0, never `previous`, and unlikely to be any
/// earlier one (it mixes the clock in), so that a packet of an earlier install is dropped.
pub(crate) fn next_epoch(job: u16, previous: Option<u16>) -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    ina_proto::pipeline::fresh_epoch(
        nanos ^ (u64::from(job) << 48) ^ u64::from(std::process::id()).rotate_left(20),
        previous,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Range;
    use crate::api::P4Host;
    use ina_switch_p4::runtime::{L2Entry, MacAddr, SwitchDesc};
    use std::net::Ipv4Addr;

    fn spec(kind: SwitchKind) -> SwitchSpec {
        let mac = |i: u8| MacAddr([2, 0, 0, 0, 1, i]);
        SwitchSpec {
            name: "p4".into(),
            kind,
            control: "127.0.0.1:9090".parse().unwrap(),
            data: SocketAddr::from((Ipv4Addr::new(198, 18, 0, 100), ina_wire::agg::UDP_PORT)),
            slots: 1024,
            elems_per_slot: 64,
            place: Default::default(),
            token: None,
            p4: Some(P4Spec {
                switch: SwitchDesc {
                    mac: MacAddr([2, 0, 0, 0, 0, 0x64]),
                    ip: Ipv4Addr::new(198, 18, 0, 100),
                    ports: vec![0, 1],
                    l2: (0..2)
                        .map(|i| L2Entry {
                            mac: mac(i),
                            port: u16::from(i),
                        })
                        .collect(),
                    flood_mgrp: 0xffff,
                    gap_reports: true,
                },
                hosts: (0..2)
                    .map(|i| P4Host {
                        ip: Ipv4Addr::new(198, 18, 1, i + 1),
                        mac: mac(i),
                    })
                    .collect(),
            }),
        }
    }

    #[test]
    fn p4_specs_are_checked_against_their_target() {
        assert_eq!(check_spec(&spec(SwitchKind::Bmv2)), Ok(()));
        assert_eq!(check_spec(&spec(SwitchKind::Tofino)), Ok(()));
        let mut s = spec(SwitchKind::Bmv2);
        s.p4 = None;
        assert!(check_spec(&s)
            .unwrap_err()
            .contains("needs its p4 description"));
        let mut s = spec(SwitchKind::Software);
        assert!(check_spec(&s).unwrap_err().contains("takes no p4"));
        s.p4 = None;
        assert_eq!(check_spec(&s), Ok(()));
        let mut s = spec(SwitchKind::Bmv2);
        s.slots = 4096;
        assert!(check_spec(&s).unwrap_err().contains("1024"));
        let mut s = spec(SwitchKind::Tofino);
        s.elems_per_slot = 256;
        assert!(check_spec(&s).unwrap_err().contains("at most 64"));
        let mut s = spec(SwitchKind::Bmv2);
        s.data.set_port(9000);
        assert!(check_spec(&s).unwrap_err().contains("data address"));
        let mut s = spec(SwitchKind::Bmv2);
        s.p4.as_mut().unwrap().hosts[1].mac = MacAddr([2, 0, 0, 0, 9, 9]);
        assert!(check_spec(&s).unwrap_err().contains("L2 table"));
    }

    #[test]
    fn jobs_are_described_from_the_hosts() {
        let s = spec(SwitchKind::Bmv2);
        let p4 = s.p4.as_ref().unwrap();
        let install = Install {
            job: 3,
            slots: Range {
                base: 64,
                count: 64,
            },
            elems_per_packet: 64,
            workers: vec![
                "198.18.1.2:9000".parse().unwrap(),
                "198.18.1.1:9001".parse().unwrap(),
            ],
            uplink: None,
        };
        let d = job_desc(&runtime::V1MODEL, p4, &install, 7).unwrap();
        assert_eq!(
            (d.id, d.epoch, d.mgrp, d.slot_base, d.slot_count),
            (3, 7, 3, 64, 64)
        );
        assert_eq!(d.ranks[0].port, 1);
        assert_eq!(d.ranks[1].port, 0);
        assert_eq!(d.ranks[1].udp_port, 9001);
        let mut stranger = install.clone();
        stranger.workers[1] = "198.18.1.9:9000".parse().unwrap();
        assert!(job_desc(&runtime::V1MODEL, p4, &stranger, 7)
            .unwrap_err()
            .contains("not one of the switch's hosts"));
        let mut wide = install.clone();
        wide.elems_per_packet = 256;
        assert!(job_desc(&runtime::TOFINO, p4, &wide, 7).is_err());
        let mut flood = install;
        flood.job = 0xffff;
        assert!(job_desc(&runtime::V1MODEL, p4, &flood, 7)
            .unwrap_err()
            .contains("flood group"));
    }

    #[test]
    fn a_rack_switchs_uplink_is_described_from_the_upper_switchs_host() {
        let s = spec(SwitchKind::Bmv2);
        let p4 = s.p4.as_ref().unwrap();
        let mut install = Install {
            job: 3,
            slots: Range {
                base: 128,
                count: 64,
            },
            elems_per_packet: 64,
            workers: vec!["198.18.1.1:9000".parse().unwrap()],
            uplink: Some(ina_switch_api::UplinkSpec {
                addr: "198.18.1.2:18000".parse().unwrap(),
                job: None,
                rank: 2,
                epoch: 77,
                slot_base: None,
            }),
        };
        let up = job_desc(&runtime::V1MODEL, p4, &install, 7)
            .unwrap()
            .uplink
            .unwrap();
        assert_eq!(
            (
                up.port,
                up.udp_port,
                up.job,
                up.epoch,
                up.slot_base,
                up.rank
            ),
            (1, 18000, 3, 77, 128, 2)
        );
        // Not a host of the switch; a rank's endpoint; on Tofino, another job id on the upper
        // switch.
        let mut stranger = install.clone();
        stranger.uplink.as_mut().unwrap().addr = "198.18.7.7:18000".parse().unwrap();
        assert!(job_desc(&runtime::V1MODEL, p4, &stranger, 7)
            .unwrap_err()
            .contains("upper switch: worker 198.18.7.7:18000"));
        install.workers = vec!["198.18.1.2:18000".parse().unwrap()];
        assert!(job_desc(&runtime::V1MODEL, p4, &install, 7)
            .unwrap_err()
            .contains("endpoint"));
        install.workers = vec!["198.18.1.1:9000".parse().unwrap()];
        assert!(job_desc(&runtime::TOFINO, p4, &install, 7).is_ok());
        install.uplink.as_mut().unwrap().job = Some(4);
        assert!(job_desc(&runtime::TOFINO, p4, &install, 7)
            .unwrap_err()
            .contains("keeps a job's id on both levels"));
    }

    #[test]
    fn epochs_are_never_zero_nor_the_previous() {
        for job in 0..200u16 {
            let e = next_epoch(job, None);
            assert_ne!(e, 0);
            assert_ne!(next_epoch(job, Some(e)), e);
        }
    }
}
