//! The Tofino program: the committed `tna/ina.p4` is what `ina_switch_p4::tna::program` writes,
//! it passes p4c's front and mid end against TNA, and its structure keeps Tofino 1's limits.

use ina_proto::event::Event;
use ina_proto::pipeline::{JobConfig, PortId};
use ina_switch_p4::tna::{self, TnaJobError};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn committed_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tna/ina.p4")
}

/// Whether a test that needs an external tool must fail instead of skipping.
fn required() -> bool {
    std::env::var("INA_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1")
}

/// The tool on PATH or in the toolchain's default prefix.
fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/opt/ina-p4tools/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn skip_or_fail(reason: &str) {
    assert!(!required(), "INA_REQUIRE_PRIVILEGED=1: {reason}");
    eprintln!("skipped: {reason}");
}

#[test]
fn committed_program_is_current() {
    let generated = tna::program();
    let path = committed_path();
    if std::env::var("INA_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &generated).expect("write tna/ina.p4");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale: regenerate with INA_BLESS=1 cargo test -p ina-switch-p4 --test tna",
        path.display()
    );
}

#[test]
fn passes_tna_check() {
    let Some(tool) = find_tool("p4tools-tna-check") else {
        skip_or_fail("p4tools-tna-check is not installed");
        return;
    };
    let include = Path::new("/opt/ina-p4tools/share/p4c");
    let started = Instant::now();
    let mut cmd = Command::new(&tool);
    cmd.arg(committed_path()).arg("tofino");
    if std::env::var_os("P4TOOLS_TNA_INCLUDE").is_none() && include.is_dir() {
        cmd.env("P4TOOLS_TNA_INCLUDE", include.join("tna-include"));
        cmd.env("P4C_16_INCLUDE_PATH", include.join("p4include"));
    }
    let out = cmd.output().expect("run p4tools-tna-check");
    eprintln!(
        "p4tools-tna-check took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success(),
        "p4tools-tna-check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn builds_with_the_tofino_back_end() {
    let Some(tool) = find_tool("p4tools-tna-build") else {
        // The Tofino back end is not part of the toolchain here: nothing to require.
        eprintln!("skipped: p4tools-tna-build is not installed (no Tofino back end)");
        return;
    };
    for target in ["tofino", "tofino2"] {
        let dir =
            std::env::temp_dir().join(format!("ina-tna-build-{}-{target}", std::process::id()));
        let out = Command::new(&tool)
            .arg(committed_path())
            .arg(&dir)
            .arg(target)
            .output()
            .expect("run p4tools-tna-build");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "p4tools-tna-build {target} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The register every `RegisterAction` of the program belongs to, by action name.
fn register_actions(p: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for line in p.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("RegisterAction<") else {
            continue;
        };
        let reg = rest.split(">(").nth(1).and_then(|r| r.split(')').next());
        let name = rest.split(") ").nth(1).and_then(|r| r.split(' ').next());
        if let (Some(reg), Some(name)) = (reg, name) {
            m.insert(name.to_string(), reg.to_string());
        }
    }
    m
}

/// Each table with its stage pragma and the register actions its actions execute.
fn tables(p: &str) -> Vec<(String, Option<usize>, Vec<String>)> {
    // Action name -> the register actions it executes.
    let mut actions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in p.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("action ") {
            let name = rest.split('(').next().unwrap_or_default().to_string();
            let execs = rest
                .split(".execute(")
                .filter_map(|s| s.rsplit([' ', '=']).next())
                .map(str::to_string)
                .collect::<Vec<_>>();
            // Every split piece but the last ends with a register action's name.
            let n = execs.len().saturating_sub(1);
            actions.insert(name, execs.into_iter().take(n).collect());
        }
    }
    let mut out = Vec::new();
    let mut stage = None;
    let mut current: Option<(String, Option<usize>, Vec<String>)> = None;
    let mut in_actions = false;
    for line in p.lines() {
        let line = line.trim();
        if let Some(s) = line.strip_prefix("@stage(") {
            stage = s.trim_end_matches(')').parse().ok();
        } else if let Some(rest) = line.strip_prefix("table ") {
            let name = rest.trim_end_matches(" {").to_string();
            current = Some((name, stage.take(), Vec::new()));
        } else if line == "actions = {" {
            in_actions = true;
        } else if in_actions && line == "}" {
            in_actions = false;
        } else if in_actions {
            if let Some(t) = current.as_mut() {
                let a = line.trim_end_matches(';');
                t.2.extend(actions.get(a).cloned().unwrap_or_default());
            }
        } else if line.starts_with("const default_action") || line.starts_with("default_action") {
            if let Some(t) = current.take() {
                out.push(t);
            }
        }
    }
    out
}

#[test]
fn registers_keep_tofino_limits() {
    let p = tna::program();
    let ra = register_actions(&p);
    let tables = tables(&p);
    // Which tables reach each register, and in which stage.
    let mut reg_tables: BTreeMap<String, Vec<(String, Option<usize>)>> = BTreeMap::new();
    for (name, stage, execs) in &tables {
        let mut regs: Vec<&String> = execs.iter().filter_map(|a| ra.get(a)).collect();
        regs.sort();
        regs.dedup();
        assert!(
            regs.len() <= 1,
            "table {name} drives several registers: {regs:?}"
        );
        for r in regs {
            reg_tables
                .entry(r.clone())
                .or_default()
                .push((name.clone(), *stage));
        }
    }
    let mut per_stage: BTreeMap<usize, usize> = BTreeMap::new();
    for (reg, ts) in &reg_tables {
        // One table per register: one access per pass.
        assert_eq!(ts.len(), 1, "register {reg} is accessed from {ts:?}");
        let stage = ts[0]
            .1
            .unwrap_or_else(|| panic!("register {reg}: its table has no stage"));
        assert!(stage < tna::INGRESS_STAGES, "{reg} in stage {stage}");
        *per_stage.entry(stage).or_default() += 1;
    }
    for (stage, n) in &per_stage {
        assert!(
            *n <= tna::ALUS_PER_STAGE,
            "stage {stage} has {n} stateful ALUs"
        );
    }
    for j in 0..tna::VALUE_REGISTERS {
        let reg = format!("reg_value_{j}");
        let stage = reg_tables[&reg][0].1;
        assert_eq!(stage, Some(tna::VALUE_FIRST_STAGE + j / 4), "{reg}");
    }
    // The control registers precede the values that depend on them.
    let stage_of = |r: &str| reg_tables[r][0].1.unwrap_or(usize::MAX);
    assert!(stage_of("reg_seq") < stage_of("reg_bitmap"));
    assert!(stage_of("reg_seq_order") < stage_of("reg_bitmap"));
    assert!(stage_of("reg_bitmap") < stage_of("reg_value_0"));
    assert!(stage_of("reg_seq") < stage_of("reg_exp"));
    assert_eq!(reg_tables.len(), 4 + tna::VALUE_REGISTERS);
}

#[test]
fn registers_name_their_rust_twins() {
    let p = tna::program();
    let lines: Vec<&str> = p.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("Register<") {
            let before = lines[i.saturating_sub(3)..i].join("\n");
            assert!(
                before.contains("Twin: SlotRegisters::")
                    || before.contains("Twin: Registers::values"),
                "register without its twin: {line}"
            );
        }
    }
}

#[test]
fn program_uses_the_contract_and_the_wire_constants() {
    let p = tna::program();
    for name in [
        "control InaIngress(",
        "control InaEgress(",
        "table switch_addr",
        "action set_switch_addr(bit<48> mac, bit<32> ip)",
        "table l2_forward",
        "hdr.ethernet.dst_addr : exact;",
        "action l2_to_port(PortId_t port)",
        "action l2_flood(bit<16> mgrp)",
        "table ina_job",
        "action set_job(bit<16> epoch, bit<16> slot_base, bit<16> slot_count, bit<16> elems,\n                   bit<8> workers, bit<16> mgrp)",
        "table ina_rank",
        "action set_rank(PortId_t port, bit<32> ip, bit<16> udp_port)",
        "table ina_rank_addr",
        "eg_intr_md.egress_rid : exact;",
        "action rewrite_dst(bit<48> mac, bit<32> ip, bit<16> udp_port)",
        "reg_seq;",
        "reg_bitmap;",
        "reg_exp;",
        "ina_events;",
        "ina_multicast;",
        "const bit<16> INA_UDP_PORT = 18766;",
        "const bit<4> INA_PENDING = 6;",
        "const bit<4> INA_RESULT = 2;",
    ] {
        assert!(p.contains(name), "missing: {name}");
    }
    for j in 0..tna::VALUE_REGISTERS {
        assert!(p.contains(&format!(" reg_value_{j};")), "reg_value_{j}");
    }
    assert!(!p.contains(&format!(" reg_value_{};", tna::VALUE_REGISTERS)));
    assert!(p.contains(&format!("const bit<32> EVENT_COUNT = {};", Event::COUNT)));
    // Every event the program counts on its own is the Rust event's index.
    for (event, action) in [
        (Event::ArpReplied, "md.event = "),
        (Event::ProbeAnswered, "md.event = "),
    ] {
        assert!(
            p.contains(&format!("{action}{};", event.index())),
            "{event:?}"
        );
    }
    for event in [
        Event::L2Unknown,
        Event::NotIna,
        Event::Malformed,
        Event::UnexpectedType,
        Event::UnknownJob,
        Event::UnknownRank,
        Event::WrongPort,
    ] {
        assert!(
            p.contains(&format!("check_drop({})", event.index())),
            "{event:?}"
        );
    }
    for event in [
        Event::StaleSeq,
        Event::Duplicate,
        Event::DataFirst,
        Event::DataAdded,
        Event::ResultUnicast,
    ] {
        assert!(p.contains(&format!(", {})", event.index())), "{event:?}");
    }
}

fn job(elems: u16, ports: &[u16]) -> JobConfig {
    JobConfig {
        job: 7,
        epoch: 1,
        slot_base: 100,
        slot_count: 64,
        elems_per_packet: elems,
        ranks: ports.iter().map(|&p| PortId(p)).collect(),
    }
}

#[test]
fn control_plane_refuses_what_the_program_cannot_do() {
    assert_eq!(tna::check_job(&job(64, &[0, 4, 8])), Ok(()));
    assert_eq!(
        tna::check_job(&job(256, &[0, 4])),
        Err(TnaJobError::ElemsPerPacket { elems: 256 })
    );
    assert_eq!(
        tna::check_job(&job(64, &[0, 130])),
        Err(TnaJobError::Pipe {
            rank: 1,
            port: 130,
            pipe: 1,
            first: 0
        })
    );
    assert_eq!(
        tna::check_job(&job(64, &[68])),
        Err(TnaJobError::RecirculationPort { rank: 0, port: 68 })
    );
    assert_eq!(
        tna::check_job(&job(64, &[600])),
        Err(TnaJobError::PortNumber { rank: 0, port: 600 })
    );
    assert_eq!(
        tna::check_job(&job(64, &[])),
        Err(TnaJobError::Workers { workers: 0 })
    );
    let mut big = job(64, &[1]);
    big.slot_base = 8190;
    big.slot_count = 3;
    assert_eq!(
        tna::check_job(&big),
        Err(TnaJobError::SlotRange {
            base: 8190,
            end: 8193
        })
    );
}

proptest! {
    #[test]
    fn check_job_accepts_exactly_one_pipe_of_front_ports(
        elems in prop_oneof![Just(64u16), Just(256u16), 1u16..1024],
        ports in proptest::collection::vec(0u16..600, 0..40),
        base in 0u16..9000,
        count in 0u16..200,
    ) {
        let mut j = job(elems, &ports);
        j.slot_base = base;
        j.slot_count = count;
        let ok = elems == 64
            && (1..=32).contains(&ports.len())
            && count > 0
            && u32::from(base) + u32::from(count) <= tna::POOL_SLOTS
            && ports.iter().all(|p| *p < 512 && p & 0x7f != 68)
            && ports.iter().all(|p| p >> 7 == ports[0] >> 7);
        prop_assert_eq!(tna::check_job(&j).is_ok(), ok);
    }
}
