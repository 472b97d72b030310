//! The runtime configuration of an example switch, as bmv2 commands and as BfRt entries,
//! against the committed expectations in `tests/golden/` (`INA_BLESS=1` rewrites them).

use ina_switch_p4::runtime::{
    bfrt_entries, bmv2_commands, L2Entry, MacAddr, P4Job, RankDesc, SwitchDesc, UplinkDesc,
};
use std::net::Ipv4Addr;
use std::path::Path;

fn example() -> (SwitchDesc, Vec<P4Job>) {
    let sw = SwitchDesc {
        mac: MacAddr([2, 0, 0, 0, 0, 0xfe]),
        ip: Ipv4Addr::new(198, 18, 0, 254),
        ports: vec![0, 1, 2, 3],
        l2: vec![
            L2Entry {
                mac: MacAddr([2, 0, 0, 0, 9, 1]),
                port: 1,
            },
            L2Entry {
                mac: MacAddr([2, 0, 0, 0, 9, 3]),
                port: 3,
            },
        ],
        flood_mgrp: 1000,
        gap_reports: true,
    };
    let rank = |r: u8, port: u16| RankDesc {
        port,
        mac: MacAddr([2, 0, 0, 0, 1, r]),
        ip: Ipv4Addr::new(198, 18, 1, r),
        udp_port: 9000 + u16::from(r),
    };
    let jobs = vec![
        P4Job {
            id: 1,
            epoch: 7,
            slot_base: 0,
            slot_count: 2,
            elems: 64,
            mgrp: 1,
            ranks: vec![rank(0, 0), rank(1, 1), rank(2, 2)],
            uplink: None,
        },
        P4Job {
            id: 2,
            epoch: 9,
            slot_base: 2,
            slot_count: 1,
            elems: 256,
            mgrp: 2,
            ranks: vec![rank(3, 3), rank(4, 3)],
            uplink: None,
        },
    ];
    (sw, jobs)
}

fn check(name: &str, text: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("INA_BLESS").is_some() {
        std::fs::write(&path, text).expect("write golden file");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    if want != text {
        let first = want
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(text.lines().count()));
        panic!(
            "{} differs from the generated configuration at line {}:\n  expected: {:?}\n  got:      {:?}\n(INA_BLESS=1 cargo test -p ina-switch-p4 rewrites it)",
            path.display(),
            first + 1,
            want.lines().nth(first),
            text.lines().nth(first)
        );
    }
}

#[test]
fn bmv2_commands_are_golden() {
    let (sw, jobs) = example();
    let cmds = bmv2_commands(&sw, &jobs).expect("valid example");
    check("example.bmv2.txt", &(cmds.join("\n") + "\n"));
}

/// The example for the Tofino program: its second job with 64 elements per packet, as a rack
/// switch's under an upper switch behind port 2 (the same job id and slots there).
fn tofino_example() -> (SwitchDesc, Vec<P4Job>) {
    let (sw, mut jobs) = example();
    // The Tofino program aggregates 64 elements per packet.
    assert!(bfrt_entries(&sw, &jobs).is_err());
    jobs[1].elems = 64;
    jobs[1].uplink = Some(UplinkDesc {
        port: 2,
        mac: MacAddr([2, 0, 0, 0, 0x0a, 1]),
        ip: Ipv4Addr::new(198, 18, 2, 1),
        udp_port: 18766,
        job: 2,
        epoch: 11,
        slot_base: 2,
        rank: 4,
    });
    (sw, jobs)
}

#[test]
fn bfrt_entries_are_golden() {
    let (sw, jobs) = tofino_example();
    let v = bfrt_entries(&sw, &jobs).expect("valid example");
    let text = serde_json::to_string_pretty(&v).expect("json") + "\n";
    check("example.bfrt.json", &text);
}

#[test]
fn invalid_descriptions_produce_no_commands() {
    let (sw, mut jobs) = example();
    jobs[1].slot_base = 1;
    assert!(bmv2_commands(&sw, &jobs).is_err());
    assert!(bfrt_entries(&sw, &jobs).is_err());
}

#[test]
fn descriptions_read_from_toml() {
    let text = r#"
        mac = "02:00:00:00:00:fe"
        ip = "198.18.0.254"
        ports = [0, 1]
        l2 = [{ mac = "02:00:00:00:09:01", port = 1 }]
    "#;
    let sw: SwitchDesc = toml::from_str(text).expect("parses");
    assert_eq!(sw.flood_mgrp, 0xffff);
    assert_eq!(sw.l2[0].mac, MacAddr([2, 0, 0, 0, 9, 1]));
    assert!(toml::from_str::<SwitchDesc>(&text.replace("09:01", "09")).is_err());
}

/// The parameters of `action name(...)` in a program's text, if it has that action.
fn action_params(program: &str, name: &str) -> Option<Vec<String>> {
    let at = program.find(&format!("action {name}("))?;
    let rest = &program[at + name.len() + 8..];
    let params = &rest[..rest.find(')')?];
    Some(
        params
            .split(',')
            .filter_map(|p| p.split_whitespace().last().map(str::to_string))
            .collect(),
    )
}

/// Every table, action, action parameter and register the BfRt entries name exists in the
/// Tofino program (and the register pairs have the `lo`/`hi` fields named).
#[test]
fn bfrt_entries_name_what_the_tofino_program_has() {
    let (sw, jobs) = tofino_example();
    let v = bfrt_entries(&sw, &jobs).expect("valid example");
    let program = ina_switch_p4::tna::program();
    assert!(program.contains("bit<32> lo;") && program.contains("bit<32> hi;"));
    let entries = v["entries"].as_array().expect("entries");
    for e in entries {
        let table = e["table"].as_str().expect("table");
        if table.starts_with("$pre.") || table.starts_with("$mirror.") {
            continue;
        }
        let name = table
            .strip_prefix("pipe.")
            .and_then(|t| t.split('.').nth(1))
            .expect("pipe.<control>.<name>");
        if name.starts_with("reg_") {
            assert!(
                program.contains(&format!(") {name};")),
                "register {name} is not in the Tofino program"
            );
            continue;
        }
        let at = program
            .find(&format!("table {name} {{"))
            .unwrap_or_else(|| panic!("table {name} is not in the Tofino program"));
        let body = &program[at..];
        let body = &body[..body.find("actions = {").unwrap_or(0)];
        for key in e["key"].as_object().into_iter().flat_map(|k| k.keys()) {
            assert!(
                key.starts_with('$') || body.contains(&format!("{key} : ")),
                "table {name} has no key {key}"
            );
        }
        let action = e["action"].as_str().expect("action");
        let short = action.split('.').nth(1).expect("<control>.<action>");
        let params = action_params(&program, short)
            .unwrap_or_else(|| panic!("action {short} is not in the Tofino program"));
        for field in e["data"].as_object().expect("data").keys() {
            assert!(
                params.contains(field),
                "{short} has no parameter {field}: {params:?}"
            );
        }
    }
}

/// The same for the bmv2 commands and the v1model program.
#[test]
fn bmv2_commands_name_what_the_v1model_program_has() {
    let (sw, jobs) = example();
    let program = ina_switch_p4::v1model::program();
    for c in bmv2_commands(&sw, &jobs).expect("valid example") {
        let words: Vec<&str> = c.split_whitespace().collect();
        match words.first().copied() {
            Some("table_add") | Some("table_set_default") => {
                let table = words[1].split('.').nth(1).expect("control.table");
                let action = words[2].split('.').nth(1).expect("control.action");
                assert!(program.contains(&format!("table {table} {{")), "{c}");
                assert!(action_params(&program, action).is_some(), "{c}");
            }
            Some("register_reset") | Some("register_write") => {
                let reg = words[1].split('.').nth(1).expect("control.register");
                assert!(program.contains(&format!(") {reg};")), "{c}");
            }
            _ => {}
        }
    }
}

/// A job with a whole block of 64 slots keeps gap cells: installing it zeroes the block's
/// cells of every Missing register, the results' records and the partials' (PROTOCOL.md §9),
/// and nothing outside the block.
#[test]
fn bfrt_entries_zero_a_whole_blocks_records() {
    let (sw, mut jobs) = tofino_example();
    jobs.truncate(1);
    jobs[0].slot_base = 64;
    jobs[0].slot_count = 64;
    let v = bfrt_entries(&sw, &jobs).expect("valid job");
    let zeroed = |reg: &str| -> Vec<u64> {
        v["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|e| {
                e["table"]
                    .as_str()
                    .is_some_and(|t| t.ends_with(&format!(".{reg}")))
            })
            .map(|e| e["key"]["$REGISTER_INDEX"].as_u64().expect("index"))
            .collect()
    };
    let records =
        ina_switch_p4::tna::RESULT_USE_CELLS as u64 / ina_switch_p4::tna::GAP_BLOCKS as u64;
    let partials = u64::from(ina_switch_p4::tna::PARTIAL_RECORDS);
    for reg in ["reg_result_use", "reg_result_seq"] {
        let want: Vec<u64> = (records..2 * records)
            .chain(partials + records..partials + 2 * records)
            .collect();
        assert_eq!(zeroed(reg), want, "{reg}");
    }
    for reg in ["reg_result_gap", "reg_partial_gap"] {
        assert_eq!(zeroed(reg), [1], "{reg}");
    }
    assert_eq!(zeroed("reg_gap"), (32..64).collect::<Vec<u64>>());
}
