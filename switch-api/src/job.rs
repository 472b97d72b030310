//! Jobs as an operator writes them: workers by address, in a config file (serde) or in the
//! `--job` syntax, `id=1;slots=0..64;elems=256;workers=127.0.0.1:9000,127.0.0.1:9001`
//! ([`JobSpec`]'s `FromStr`; [`JobKeys`] reads the keys every switch's syntax shares).

use serde::{Deserialize, Serialize};
use std::net::{AddrParseError, SocketAddr, SocketAddrV4};
use std::num::ParseIntError;
use std::str::FromStr;

/// A job as an operator writes it: workers by address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub job: u16,
    /// The epoch; `None` lets the switch pick a fresh one (different on every install).
    #[serde(default)]
    pub epoch: Option<u16>,
    pub slot_base: u16,
    pub slot_count: u16,
    pub elems_per_packet: u16,
    /// Worker `r`'s UDP address is `workers[r]`.
    pub workers: Vec<SocketAddr>,
    /// A multicast group every worker of the job has joined: each finished result is sent
    /// once, to the group, instead of once to every worker (as a hardware switch's packet
    /// replication does). Answers to retransmissions still go to the one worker that asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<SocketAddrV4>,
    /// This switch is the lower level of an aggregation tree for the job: each finished sum of
    /// `workers` is a partial sum, sent to the upper switch as one rank of its job, and the
    /// total it sends back goes to the workers (PROTOCOL.md §9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uplink: Option<UplinkSpec>,
}

impl JobSpec {
    /// Job `job` on slots `0..slot_count`, `elems_per_packet` elements per packet, its
    /// workers' addresses in rank order; the switch picks its epoch; results go to each
    /// worker; no upper switch.
    pub fn new(
        job: u16,
        slot_count: u16,
        elems_per_packet: u16,
        workers: Vec<SocketAddr>,
    ) -> JobSpec {
        JobSpec {
            job,
            epoch: None,
            slot_base: 0,
            slot_count,
            elems_per_packet,
            workers,
            group: None,
            uplink: None,
        }
    }

    /// Every address the job exchanges packets with: its workers, then its upper switch.
    pub fn addresses(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.workers
            .iter()
            .copied()
            .chain(self.uplink.as_ref().map(|u| u.addr))
    }
}

/// The upper switch of a job, as an operator writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UplinkSpec {
    /// The upper switch's UDP address.
    pub addr: SocketAddr,
    /// The job's id on the upper switch (default: the same id).
    #[serde(default)]
    pub job: Option<u16>,
    /// This switch's rank in the upper switch's job: the upper switch lists this switch's
    /// address as that rank's worker.
    pub rank: u8,
    /// The job's epoch on the upper switch, which must therefore be installed there with this
    /// epoch given (not one the upper switch picks).
    pub epoch: u16,
    /// The first slot of the job on the upper switch (default: the same as here). With
    /// several shards, the two ranges must be a whole number of shard strides (64 slots
    /// times the shards) apart, so that a total reaches the shard that holds its use.
    #[serde(default)]
    pub slot_base: Option<u16>,
}

/// Why a `--job` value was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobParseError {
    #[error("`{0}` is not key=value")]
    NotKeyValue(String),
    #[error("{key}: {source}")]
    Number {
        key: &'static str,
        #[source]
        source: ParseIntError,
    },
    #[error("slots `{0}` is not START..END")]
    SlotsSyntax(String),
    #[error("slots `{0}` is empty")]
    SlotsEmpty(String),
    #[error("unknown key `{0}`")]
    UnknownKey(String),
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("workers: {0}")]
    Worker(#[source] AddrParseError),
    #[error("group: {0}")]
    Group(#[source] AddrParseError),
    #[error("group `{0}` is not a multicast address")]
    GroupNotMulticast(String),
    #[error("uplink `{value}`: {source}")]
    Uplink {
        value: String,
        #[source]
        source: AddrParseError,
    },
    #[error("uplink needs uplink=ADDR, uplink_rank=R and uplink_epoch=E (the epoch the upper switch's job was installed with); {0} is missing")]
    UplinkIncomplete(&'static str),
    #[error("uplink_rank {0}: a job has ranks 0..=31")]
    UplinkRank(u8),
    #[error("`{0}`: uplink keys are read by UplinkKeys::split, not among the job's common keys")]
    UplinkAmongCommonKeys(String),
}

fn number<T: FromStr<Err = ParseIntError>>(
    key: &'static str,
    value: &str,
) -> Result<T, JobParseError> {
    value
        .parse()
        .map_err(|source| JobParseError::Number { key, source })
}

/// The keys of a `--job` value common to the UDP and the raw-port switch; `workers` and
/// `group` are left as text for each to read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JobKeys<'a> {
    pub id: u16,
    pub epoch: Option<u16>,
    /// (first slot, slot count)
    pub slots: (u16, u16),
    /// Elements per packet (256 unless given).
    pub elems: u16,
    pub workers: &'a str,
    pub group: Option<&'a str>,
}

impl<'a> JobKeys<'a> {
    /// Splits `id=1;slots=0..64;elems=256;workers=...` into its keys, checking the common
    /// ones; an `uplink*` key is refused (only the UDP switch's [`JobSpec`] takes them).
    pub fn parse(s: &'a str) -> Result<JobKeys<'a>, JobParseError> {
        let (mut id, mut slots, mut elems, mut workers) = (None, None, None, None);
        let mut keys = JobKeys::default();
        for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| JobParseError::NotKeyValue(part.to_string()))?;
            let value = value.trim();
            match key.trim() {
                "id" | "job" => id = Some(number("id", value)?),
                "epoch" => keys.epoch = Some(number("epoch", value)?),
                "slots" => {
                    let (a, b) = value
                        .split_once("..")
                        .ok_or_else(|| JobParseError::SlotsSyntax(value.to_string()))?;
                    let a: u16 = number("slots start", a)?;
                    let b: u16 = number("slots end", b)?;
                    if b <= a {
                        return Err(JobParseError::SlotsEmpty(value.to_string()));
                    }
                    slots = Some((a, b - a));
                }
                "elems" => elems = Some(number("elems", value)?),
                "workers" => workers = Some(value),
                "group" => keys.group = Some(value),
                k if k.starts_with("uplink") => {
                    return Err(JobParseError::UplinkAmongCommonKeys(k.to_string()))
                }
                other => return Err(JobParseError::UnknownKey(other.to_string())),
            }
        }
        keys.slots = slots.ok_or(JobParseError::Missing("slots=START..END"))?;
        keys.id = id.ok_or(JobParseError::Missing("id="))?;
        keys.elems = elems.unwrap_or(256);
        keys.workers = workers.ok_or(JobParseError::Missing("workers="))?;
        Ok(keys)
    }
}

/// The `--job` syntax of the UDP switch: the common keys ([`JobKeys`]), workers as UDP
/// addresses, an optional multicast `group=ADDR`, and for a rack switch of an aggregation tree
/// `uplink=ADDR;uplink_rank=R;uplink_epoch=E` (and optionally `uplink_job=J`, `uplink_slot=S`:
/// the job's id and first slot on the upper switch, by default the same).
impl FromStr for JobSpec {
    type Err = JobParseError;

    fn from_str(s: &str) -> Result<JobSpec, JobParseError> {
        let (common, up) = UplinkKeys::split(s)?;
        let keys = JobKeys::parse(&common)?;
        let uplink = match up {
            None => None,
            Some(u) => Some(UplinkSpec {
                addr: u.addr.parse().map_err(|source| JobParseError::Uplink {
                    value: u.addr.to_string(),
                    source,
                })?,
                job: u.job,
                rank: u.rank,
                epoch: u.epoch,
                slot_base: u.slot_base,
            }),
        };
        let workers = keys
            .workers
            .split(',')
            .map(|a| a.trim().parse())
            .collect::<Result<Vec<SocketAddr>, _>>()
            .map_err(JobParseError::Worker)?;
        let group = match keys.group {
            None => None,
            Some(value) => {
                let g: SocketAddrV4 = value.parse().map_err(JobParseError::Group)?;
                if !g.ip().is_multicast() {
                    return Err(JobParseError::GroupNotMulticast(value.to_string()));
                }
                Some(g)
            }
        };
        Ok(JobSpec {
            job: keys.id,
            epoch: keys.epoch,
            slot_base: keys.slots.0,
            slot_count: keys.slots.1,
            elems_per_packet: keys.elems,
            workers,
            group,
            uplink,
        })
    }
}

/// The `uplink*` keys of a `--job` value (`uplink=ADDR;uplink_rank=R;uplink_epoch=E`, and
/// optionally `uplink_job=J`, `uplink_slot=S`), with the upper switch's address as written:
/// a UDP address for the UDP switch, `INTERFACE/MAC/IP:UDP_PORT` on raw ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UplinkKeys<'a> {
    pub addr: &'a str,
    pub rank: u8,
    pub epoch: u16,
    pub job: Option<u16>,
    pub slot_base: Option<u16>,
}

impl<'a> UplinkKeys<'a> {
    /// Splits the `uplink*` keys off `s`: the other keys (for [`JobKeys::parse`]) and the
    /// uplink's, `None` without any.
    pub fn split(s: &'a str) -> Result<(String, Option<UplinkKeys<'a>>), JobParseError> {
        let (mut common, mut up) = (Vec::new(), Vec::new());
        for part in s.split(';') {
            match part.trim().split_once('=') {
                Some((k, v)) if k.trim().starts_with("uplink") => up.push((k.trim(), v.trim())),
                _ => common.push(part),
            }
        }
        Ok((common.join(";"), UplinkKeys::from_keys(&up)?))
    }

    fn from_keys(keys: &[(&'a str, &'a str)]) -> Result<Option<UplinkKeys<'a>>, JobParseError> {
        if keys.is_empty() {
            return Ok(None);
        }
        let (mut addr, mut rank, mut epoch, mut job, mut slot) = (None, None, None, None, None);
        for &(k, v) in keys {
            match k {
                "uplink" => addr = Some(v),
                "uplink_rank" => rank = Some(number::<u8>("uplink_rank", v)?),
                "uplink_epoch" => epoch = Some(number("uplink_epoch", v)?),
                "uplink_job" => job = Some(number("uplink_job", v)?),
                "uplink_slot" => slot = Some(number("uplink_slot", v)?),
                other => return Err(JobParseError::UnknownKey(other.to_string())),
            }
        }
        let rank = rank.ok_or(JobParseError::UplinkIncomplete("uplink_rank"))?;
        if rank > ina_wire::agg::MAX_RANK {
            return Err(JobParseError::UplinkRank(rank));
        }
        Ok(Some(UplinkKeys {
            addr: addr.ok_or(JobParseError::UplinkIncomplete("uplink"))?,
            job,
            rank,
            epoch: epoch.ok_or(JobParseError::UplinkIncomplete("uplink_epoch"))?,
            slot_base: slot,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(s: &str) -> Result<JobSpec, JobParseError> {
        s.parse()
    }

    #[test]
    fn a_job_parses() {
        let j = parse("id=3;slots=16..48;elems=64;workers=127.0.0.1:1, 127.0.0.1:2").unwrap();
        assert_eq!(
            (j.job, j.slot_base, j.slot_count, j.elems_per_packet),
            (3, 16, 32, 64)
        );
        assert_eq!(j.workers.len(), 2);
        assert_eq!(j.epoch, None);
        assert_eq!(j.group, None);
        assert_eq!(j.uplink, None);
        let j = parse(" job = 4 ; epoch=7;slots=0..8;workers=[::1]:9;").unwrap();
        assert_eq!((j.job, j.epoch, j.elems_per_packet), (4, Some(7), 256));
        assert_eq!(j.workers, ["[::1]:9".parse::<SocketAddr>().unwrap()]);
        let g = parse("id=3;slots=0..8;workers=127.0.0.1:1;group=239.1.2.3:4000").unwrap();
        assert_eq!(g.group, Some("239.1.2.3:4000".parse().unwrap()));
    }

    #[test]
    fn a_job_takes_an_uplink() {
        let j = parse(
            "id=3;slots=0..64;workers=127.0.0.1:1;uplink=10.0.0.1:5;uplink_rank=2;uplink_epoch=9",
        )
        .unwrap();
        let u = j.uplink.unwrap();
        assert_eq!(u.addr, "10.0.0.1:5".parse().unwrap());
        assert_eq!((u.rank, u.epoch, u.job, u.slot_base), (2, 9, None, None));
        let j = parse("id=3;slots=0..64;workers=127.0.0.1:1;uplink=10.0.0.1:5;uplink_rank=0;uplink_epoch=9;uplink_job=7;uplink_slot=64").unwrap();
        let u = j.uplink.unwrap();
        assert_eq!((u.job, u.slot_base), (Some(7), Some(64)));
    }

    /// A bad job, the error it must give, and words of its message.
    type Case = (String, fn(&JobParseError) -> bool, &'static str);

    /// Each kind of mistake is refused with the error that names it, and its message says
    /// what to write instead.
    #[test]
    fn bad_jobs_are_refused_with_what_is_wrong() {
        use JobParseError as E;
        let w = "workers=127.0.0.1:1";
        let table: Vec<Case> = vec![
            (format!("id=3;slots=16..16;{w}"), |e| matches!(e, E::SlotsEmpty(_)), "slots `16..16` is empty"),
            (format!("id=3;slots=16;{w}"), |e| matches!(e, E::SlotsSyntax(_)), "START..END"),
            (format!("id=3;slots=a..2;{w}"), |e| matches!(e, E::Number { key: "slots start", .. }), "slots start: "),
            (format!("id=3;slots=1..70000;{w}"), |e| matches!(e, E::Number { key: "slots end", .. }), "slots end: "),
            ("id=3;slots=1..2".into(), |e| *e == E::Missing("workers="), "missing workers="),
            (format!("slots=1..2;{w}"), |e| *e == E::Missing("id="), "missing id="),
            (format!("id=3;{w}"), |e| *e == E::Missing("slots=START..END"), "missing slots=START..END"),
            (format!("id=x;slots=1..2;{w}"), |e| matches!(e, E::Number { key: "id", .. }), "id: invalid digit"),
            (format!("id=1;epoch=-1;slots=1..2;{w}"), |e| matches!(e, E::Number { key: "epoch", .. }), "epoch: "),
            (format!("id=1;elems=;slots=1..2;{w}"), |e| matches!(e, E::Number { key: "elems", .. }), "elems: "),
            (format!("id=1;colour=blue;slots=1..2;{w}"), |e| *e == E::UnknownKey("colour".into()), "unknown key `colour`"),
            (format!("id=1;slots=1..2;{w};just-a-word"), |e| matches!(e, E::NotKeyValue(_)), "`just-a-word` is not key=value"),
            ("id=1;slots=1..2;workers=127.0.0.1".into(), |e| matches!(e, E::Worker(_)), "workers: "),
            (format!("id=3;slots=0..8;{w};group=10.1.2.3:4000"), |e| matches!(e, E::GroupNotMulticast(_)), "not a multicast address"),
            (format!("id=3;slots=0..8;{w};group=239.1.2.3"), |e| matches!(e, E::Group(_)), "group: "),
            (format!("id=3;slots=0..64;{w};uplink=10.0.0.1:5;uplink_rank=0"), |e| *e == E::UplinkIncomplete("uplink_epoch"), "uplink_epoch is missing"),
            (format!("id=3;slots=0..64;{w};uplink=10.0.0.1:5;uplink_epoch=1"), |e| *e == E::UplinkIncomplete("uplink_rank"), "uplink_rank is missing"),
            (format!("id=3;slots=0..64;{w};uplink_rank=0;uplink_epoch=1"), |e| *e == E::UplinkIncomplete("uplink"), "uplink is missing"),
            (format!("id=3;slots=0..64;{w};uplink=10.0.0.1:5;uplink_rank=32;uplink_epoch=1"), |e| *e == E::UplinkRank(32), "ranks 0..=31"),
            (format!("id=3;slots=0..64;{w};uplink=nowhere;uplink_rank=0;uplink_epoch=1"), |e| matches!(e, E::Uplink { .. }), "uplink `nowhere`"),
            (format!("id=3;slots=0..64;{w};uplink=10.0.0.1:5;uplink_rank=0;uplink_epoch=1;uplink_x=1"), |e| *e == E::UnknownKey("uplink_x".into()), "unknown key `uplink_x`"),
        ];
        for (bad, kind, words) in table {
            let e = parse(&bad).expect_err(&bad);
            assert!(kind(&e), "{bad}: {e:?}");
            let text = e.to_string();
            assert!(text.contains(words), "{bad}: {text}");
        }
    }

    /// The raw-port switch's keys refuse an uplink, saying which switch takes one.
    #[test]
    fn the_common_keys_refuse_an_uplink() {
        let e = JobKeys::parse("id=3;slots=0..64;workers=x;uplink=10.0.0.1:5").unwrap_err();
        assert_eq!(e, JobParseError::UplinkAmongCommonKeys("uplink".into()));
        assert!(e.to_string().contains("UplinkKeys::split"), "{e}");
        let k = JobKeys::parse("id=3;slots=8..16;workers=p0/a/b;group=g").unwrap();
        assert_eq!(
            (k.id, k.slots, k.elems, k.workers, k.group),
            (3, (8, 8), 256, "p0/a/b", Some("g"))
        );
    }

    /// A job written in the `--job` syntax.
    fn written(j: &JobSpec) -> String {
        let workers: Vec<String> = j.workers.iter().map(ToString::to_string).collect();
        let mut s = format!(
            "id={};slots={}..{};elems={};workers={}",
            j.job,
            j.slot_base,
            u32::from(j.slot_base) + u32::from(j.slot_count),
            j.elems_per_packet,
            workers.join(",")
        );
        if let Some(e) = j.epoch {
            s += &format!(";epoch={e}");
        }
        if let Some(g) = j.group {
            s += &format!(";group={g}");
        }
        if let Some(u) = j.uplink {
            s += &format!(
                ";uplink={};uplink_rank={};uplink_epoch={}",
                u.addr, u.rank, u.epoch
            );
            if let Some(x) = u.job {
                s += &format!(";uplink_job={x}");
            }
            if let Some(x) = u.slot_base {
                s += &format!(";uplink_slot={x}");
            }
        }
        s
    }

    /// A socket address as the syntax writes it (no IPv6 flow label or scope).
    fn addrs() -> impl Strategy<Value = SocketAddr> {
        any::<SocketAddr>().prop_map(|a| match a {
            SocketAddr::V6(v) => {
                SocketAddr::V6(std::net::SocketAddrV6::new(*v.ip(), v.port(), 0, 0))
            }
            v4 => v4,
        })
    }

    prop_compose! {
        fn jobs()(job in any::<u16>(), epoch in any::<Option<u16>>(), slot_base in 0u16..u16::MAX,
                  count in 1u16..=u16::MAX, elems in any::<u16>(),
                  workers in proptest::collection::vec(addrs(), 1..5),
                  group in proptest::option::of((224u8..240, any::<[u8; 3]>(), any::<u16>())),
                  uplink in proptest::option::of((addrs(), 0u8..=31, any::<u16>(),
                                                  any::<Option<u16>>(), any::<Option<u16>>())))
                 -> JobSpec {
            let slot_count = count.min(u16::MAX - slot_base);
            JobSpec {
                job, epoch, slot_base, slot_count, elems_per_packet: elems, workers,
                group: group.map(|(a, b, port)| SocketAddrV4::new([a, b[0], b[1], b[2]].into(), port)),
                uplink: uplink.map(|(addr, rank, epoch, job, slot_base)| UplinkSpec { addr, job, rank, epoch, slot_base }),
            }
        }
    }

    proptest! {
        /// Whatever is written in the syntax reads back as the same job.
        #[test]
        fn a_written_job_reads_back(j in jobs()) {
            prop_assert_eq!(parse(&written(&j)), Ok(j));
        }

        /// Any text is a job or an error, never a panic.
        #[test]
        fn any_text_is_a_job_or_an_error(s in "\\PC{0,80}") {
            let _ = parse(&s);
            let _ = JobKeys::parse(&s);
        }

        /// Text made of the syntax's own pieces, shuffled: a job or an error, never a panic.
        #[test]
        fn pieces_of_the_syntax_are_a_job_or_an_error(
            parts in proptest::collection::vec(prop_oneof![
                Just("id=1"), Just("id="), Just("slots=0..64"), Just("slots=64..0"), Just("slots=.."),
                Just("elems=65535"), Just("workers=127.0.0.1:1"), Just("workers="), Just("workers=,"),
                Just("group=239.0.0.1:1"), Just("uplink=127.0.0.1:2"), Just("uplink_rank=255"),
                Just("uplink_epoch=1"), Just("uplink_slot=x"), Just("="), Just(";"), Just("epoch=0"),
            ], 0..12)
        ) {
            let s = parts.join(";");
            if let Ok(j) = parse(&s) {
                prop_assert!(j.slot_count > 0);
                prop_assert!(!j.workers.is_empty());
                prop_assert!(j.uplink.is_none_or(|u| u.rank <= 31));
            }
        }
    }
}
