//! Jobs of the L2 switch as an operator writes them:
//! `id=1;slots=0..64;elems=64;workers=IF/MAC/IP:UDP,...` (rank r is the r-th worker), with an
//! optional `epoch=`: the keys of the UDP switch's `--job` ([`JobKeys`]), workers by the port
//! they are behind and their addresses. A rack switch of a tree (PROTOCOL.md §9) adds the
//! UDP switch's uplink keys ([`UplinkKeys`]) with the upper switch written as a worker is:
//! `uplink=IF/MAC/IP:UDP;uplink_rank=R;uplink_epoch=E`.

use ina_proto::l2::{Endpoint, FrameJob, FrameUplink};
use ina_switch_api::{JobKeys, JobParseError, UplinkKeys};
use ina_wire::{MacAddr, MacParseError};
use std::net::{AddrParseError, SocketAddrV4};

/// Why a job of the L2 switch was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameJobError {
    #[error(transparent)]
    Keys(#[from] JobParseError),
    #[error("group= is for the UDP switch: on raw ports every result leaves once per rank's port")]
    Group,
    #[error("`{0}` is not INTERFACE/MAC/IP:UDP_PORT")]
    WorkerSyntax(String),
    #[error("worker `{worker}`: address: {source}")]
    WorkerAddr {
        worker: String,
        #[source]
        source: AddrParseError,
    },
    #[error("`{name}` is not one of --ports ({ports})")]
    UnknownPort { name: String, ports: String },
    #[error(transparent)]
    Mac(#[from] MacParseError),
}

/// The index of port `name` among `ports` (the switch's port `i` is the `i`-th interface).
pub fn port_index(ports: &[String], name: &str) -> Result<u16, FrameJobError> {
    ports
        .iter()
        .position(|p| p == name)
        .and_then(|i| u16::try_from(i).ok())
        .ok_or_else(|| FrameJobError::UnknownPort {
            name: name.to_string(),
            ports: ports.join(","),
        })
}

/// Parses a job of the L2 switch on `ports`. Without `epoch=`, the job gets one that differs
/// on every start, as on the UDP switch.
pub fn parse_frame_job(s: &str, ports: &[String]) -> Result<FrameJob, FrameJobError> {
    let (common, up) = UplinkKeys::split(s)?;
    let keys = JobKeys::parse(&common)?;
    if keys.group.is_some() {
        return Err(FrameJobError::Group);
    }
    let ranks = keys
        .workers
        .split(',')
        .map(|w| endpoint(w.trim(), ports))
        .collect::<Result<Vec<_>, _>>()?;
    let uplink = match up {
        None => None,
        Some(u) => Some(FrameUplink {
            switch: endpoint(u.addr, ports)?,
            job: u.job.unwrap_or(keys.id),
            epoch: u.epoch,
            slot_base: u.slot_base.unwrap_or(keys.slots.0),
            rank: u.rank,
        }),
    };
    Ok(FrameJob {
        job: keys.id,
        epoch: keys
            .epoch
            .unwrap_or_else(|| crate::epoch::boot_epoch(keys.id)),
        slot_base: keys.slots.0,
        slot_count: keys.slots.1,
        elems_per_packet: keys.elems,
        ranks,
        uplink,
    })
}

/// A worker, or an upper switch, as `INTERFACE/MAC/IP:UDP_PORT`.
fn endpoint(w: &str, ports: &[String]) -> Result<Endpoint, FrameJobError> {
    let [ifname, mac, addr] = w.split('/').collect::<Vec<_>>()[..] else {
        return Err(FrameJobError::WorkerSyntax(w.to_string()));
    };
    let addr: SocketAddrV4 = addr.parse().map_err(|source| FrameJobError::WorkerAddr {
        worker: w.to_string(),
        source,
    })?;
    Ok(Endpoint {
        port: port_index(ports, ifname)?,
        mac: mac.parse::<MacAddr>()?,
        ip: addr.ip().octets(),
        udp_port: addr.port(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ports() -> Vec<String> {
        vec!["p0".to_string(), "p1".to_string()]
    }

    #[test]
    fn frame_jobs_parse() {
        let j = parse_frame_job(
            "id=2;epoch=9;slots=8..16;elems=64;workers=p1/02:00:00:00:00:0a/198.18.0.1:9000, p0/02:00:00:00:00:0B/198.18.0.2:9001",
            &ports(),
        )
        .unwrap();
        assert_eq!((j.job, j.epoch, j.slot_base, j.slot_count), (2, 9, 8, 8));
        assert_eq!(j.elems_per_packet, 64);
        assert_eq!(j.ranks[0].port, 1);
        assert_eq!(j.ranks[0].ip, [198, 18, 0, 1]);
        assert_eq!(j.ranks[1].mac, MacAddr([2, 0, 0, 0, 0, 0x0b]));
        assert_eq!(j.ranks[1].udp_port, 9001);
        // Without an epoch, one picked at start (never 0).
        let j = parse_frame_job(
            "id=2;slots=8..16;workers=p0/02:00:00:00:00:0a/198.18.0.1:9000",
            &ports(),
        )
        .unwrap();
        assert_ne!(j.epoch, 0);
        assert_eq!(j.uplink, None);
        // A rack switch of a tree: the upper switch as a worker is written.
        let j = parse_frame_job(
            "id=2;slots=64..128;elems=64;workers=p0/02:00:00:00:00:0a/198.18.0.1:9000;\
             uplink=p1/02:00:00:00:00:ff/198.18.0.9:18766;uplink_rank=3;uplink_epoch=11;uplink_slot=0",
            &ports(),
        )
        .unwrap();
        let up = j.uplink.expect("uplink");
        assert_eq!(
            (up.switch.port, up.switch.ip, up.switch.udp_port),
            (1, [198, 18, 0, 9], 18766)
        );
        assert_eq!(up.switch.mac, MacAddr([2, 0, 0, 0, 0, 0xff]));
        assert_eq!((up.job, up.epoch, up.rank, up.slot_base), (2, 11, 3, 0));
    }

    #[test]
    fn bad_frame_jobs_are_refused_with_what_is_wrong() {
        let w = "02:00:00:00:00:0a/198.18.0.1:9000";
        let cases: [(String, &str); 8] = [
            (
                format!("id=2;slots=8..16;workers=p9/{w}"),
                "`p9` is not one of --ports (p0,p1)",
            ),
            (
                "id=2;slots=8..16;workers=p0/02:00:00:00:0a/198.18.0.1:9000".into(),
                "is not a MAC address",
            ),
            (
                "id=2;slots=8..16;workers=p0/198.18.0.1:9000".into(),
                "is not INTERFACE/MAC/IP:UDP_PORT",
            ),
            (
                "id=2;slots=8..16;workers=p0/02:00:00:00:00:0a/198.18.0.1".into(),
                "address: ",
            ),
            (
                format!("id=2;slots=8..8;workers=p0/{w}"),
                "slots `8..8` is empty",
            ),
            (format!("id=2;workers=p0/{w}"), "missing slots=START..END"),
            (
                format!("id=2;slots=0..8;workers=p0/{w};group=239.1.1.1:5000"),
                "group= is for the UDP switch",
            ),
            (
                format!(
                    "id=2;slots=0..8;workers=p0/{w};uplink=10.0.0.1:5;uplink_rank=0;uplink_epoch=3"
                ),
                "`10.0.0.1:5` is not INTERFACE/MAC/IP:UDP_PORT",
            ),
        ];
        for (bad, words) in cases {
            let e = parse_frame_job(&bad, &ports()).expect_err(&bad).to_string();
            assert!(e.contains(words), "{bad}: {e}");
        }
        assert!(matches!(
            parse_frame_job(
                &format!("id=2;slots=0..8;workers=p0/{w};colour=x"),
                &ports()
            ),
            Err(FrameJobError::Keys(JobParseError::UnknownKey(_)))
        ));
        assert_eq!(port_index(&ports(), "p1"), Ok(1));
    }

    proptest! {
        /// Any text is a job or an error, never a panic; a job's ranks are on given ports.
        #[test]
        fn any_text_is_a_frame_job_or_an_error(s in "(id=1;slots=0\\.\\.8;)?\\PC{0,60}") {
            if let Ok(j) = parse_frame_job(&s, &ports()) {
                prop_assert!(j.ranks.iter().all(|r| r.port < 2));
            }
        }
    }
}
