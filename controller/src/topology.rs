//! The cluster's topology as its switches declare it ([`Place`]): rack switches with the hosts
//! under them, upper switches above them, software switches on hosts as aggregators. Each
//! switch names the switch it is under; [`check`] holds the whole to a forest of at most
//! [`MAX_LEVELS`] levels in which every host is under one rack. Pure: no I/O.

use crate::api::{valid_name, Place, MAX_NAME};
use crate::state::SwitchRecord;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Levels of a tree: rack switches, middle switches, a top switch (PROTOCOL.md §9, "A third
/// level").
pub const MAX_LEVELS: usize = 3;

/// Most hosts under one rack switch.
pub const MAX_HOSTS: usize = 1024;

/// Checks the topology the switches declare; the error names what is wrong and where.
pub fn check(switches: &BTreeMap<String, SwitchRecord>) -> Result<(), String> {
    let mut rack_of_host: BTreeMap<IpAddr, (&str, &str)> = BTreeMap::new();
    let mut switch_of_rack: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, s) in switches {
        if let Place::Rack { rack, hosts, .. } = &s.spec.place {
            if !valid_name(rack) {
                return Err(format!(
                    "switch {name:?}: rack name {rack:?}: 1 to {MAX_NAME} characters of letters, digits, '.', '_' and '-'"
                ));
            }
            if hosts.is_empty() || hosts.len() > MAX_HOSTS {
                return Err(format!(
                    "switch {name:?}: rack {rack:?} lists {} hosts; a rack has 1 to {MAX_HOSTS}",
                    hosts.len()
                ));
            }
            if let Some(other) = switch_of_rack.insert(rack, name) {
                return Err(format!(
                    "rack {rack:?} has two switches: {other:?} and {name:?}"
                ));
            }
            for host in hosts {
                if let Some((other_rack, other)) = rack_of_host.insert(*host, (rack, name)) {
                    return Err(if other == name {
                        format!("switch {name:?}: host {host} is listed twice in rack {rack:?}")
                    } else {
                        format!(
                            "host {host} is under two racks: {other_rack:?} (switch {other:?}) and {rack:?} (switch {name:?})"
                        )
                    });
                }
            }
        }
        if let Some(under) = s.spec.place.under() {
            match switches.get(under).map(|u| &u.spec.place) {
                None => {
                    return Err(format!(
                        "switch {name:?} is under {under:?}, which is not declared"
                    ))
                }
                Some(Place::Upper { .. }) => {}
                Some(_) => {
                    return Err(format!(
                        "switch {name:?} is under {under:?}, which is not an upper switch (add it with --upper)"
                    ))
                }
            }
        }
    }
    for name in switches.keys() {
        let chain = chain_up(switches, name)?;
        if chain.len() > MAX_LEVELS {
            return Err(format!(
                "switches {} make {} levels; a tree has at most {MAX_LEVELS}",
                chain.join(" under "),
                chain.len()
            ));
        }
    }
    Ok(())
}

/// `name` and the switches above it, bottom up; an error if the chain comes back on itself.
fn chain_up<'a>(
    switches: &'a BTreeMap<String, SwitchRecord>,
    name: &'a str,
) -> Result<Vec<&'a str>, String> {
    let mut chain = vec![name];
    let mut at = name;
    while let Some(up) = switches.get(at).and_then(|s| s.spec.place.under()) {
        if let Some(i) = chain.iter().position(|&n| n == up) {
            let mut cycle: Vec<&str> = chain[i..].to_vec();
            cycle.push(up);
            return Err(format!(
                "switches {} form a cycle",
                cycle
                    .iter()
                    .map(|n| format!("{n:?}"))
                    .collect::<Vec<_>>()
                    .join(" under ")
            ));
        }
        chain.push(up);
        at = up;
    }
    Ok(chain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SwitchSpec;
    use std::net::{Ipv4Addr, SocketAddr};

    fn record(name: &str, n: u16, place: Place) -> (String, SwitchRecord) {
        let addr = |p: u16| SocketAddr::from((Ipv4Addr::LOCALHOST, p));
        let mut spec = SwitchSpec::software(name, addr(7000 + n), addr(8000 + n), 1024, 256);
        spec.place = place;
        (
            name.to_string(),
            SwitchRecord {
                spec,
                draining: false,
                token: None,
            },
        )
    }

    fn host(i: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(198, 18, 1, i))
    }

    fn rack(name: &str, hosts: &[u8], under: Option<&str>) -> Place {
        Place::Rack {
            rack: name.to_string(),
            hosts: hosts.iter().map(|&i| host(i)).collect(),
            under: under.map(str::to_string),
            up_data: None,
        }
    }

    fn upper(under: Option<&str>) -> Place {
        Place::Upper {
            under: under.map(str::to_string),
        }
    }

    #[test]
    fn a_forest_of_racks_uppers_and_aggregators_passes() {
        let switches: BTreeMap<_, _> = [
            record("top", 0, upper(None)),
            record("r1", 1, rack("a", &[1, 2], Some("top"))),
            record("r2", 2, rack("b", &[3, 4], Some("top"))),
            record("alone", 3, rack("c", &[5], None)),
            record("agg", 4, Place::Aggregator { host: host(1) }),
            record("old", 5, Place::Unplaced),
        ]
        .into();
        assert_eq!(check(&switches), Ok(()));
    }

    #[test]
    fn bad_topologies_are_refused_by_name() {
        let refused = |records: Vec<(String, SwitchRecord)>| {
            check(&records.into_iter().collect()).expect_err("a bad topology")
        };
        let e = refused(vec![
            record("r1", 1, rack("a", &[1, 2], None)),
            record("r2", 2, rack("b", &[2, 3], None)),
        ]);
        assert!(e.contains("host 198.18.1.2 is under two racks"), "{e}");
        assert!(e.contains("\"r1\"") && e.contains("\"r2\""), "{e}");
        let e = refused(vec![record("r1", 1, rack("a", &[1, 1], None))]);
        assert!(e.contains("listed twice"), "{e}");
        let e = refused(vec![
            record("r1", 1, rack("a", &[1], None)),
            record("r2", 2, rack("a", &[2], None)),
        ]);
        assert!(e.contains("rack \"a\" has two switches"), "{e}");
        let e = refused(vec![record("r1", 1, rack("a", &[1], Some("top")))]);
        assert!(e.contains("under \"top\", which is not declared"), "{e}");
        let e = refused(vec![
            record("r1", 1, rack("a", &[1], None)),
            record("r2", 2, rack("b", &[2], Some("r1"))),
        ]);
        assert!(e.contains("which is not an upper switch"), "{e}");
        let e = refused(vec![
            record("x", 1, upper(Some("y"))),
            record("y", 2, upper(Some("z"))),
            record("z", 3, upper(Some("x"))),
        ]);
        assert!(e.contains("form a cycle"), "{e}");
        assert!(
            e.contains("\"x\"") && e.contains("\"y\"") && e.contains("\"z\""),
            "{e}"
        );
        let e = refused(vec![
            record("t", 0, upper(None)),
            record("m1", 1, upper(Some("t"))),
            record("m2", 2, upper(Some("m1"))),
            record("r", 3, rack("a", &[1], Some("m2"))),
        ]);
        assert!(e.contains("4 levels"), "{e}");
        let e = refused(vec![record("r", 1, rack("a", &[], None))]);
        assert!(e.contains("lists 0 hosts"), "{e}");
        let e = refused(vec![record("r", 1, rack("no space", &[1], None))]);
        assert!(e.contains("rack name"), "{e}");
    }
}
