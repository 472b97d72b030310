//! The Tofino program: the committed `tna/ina.p4` is what `ina_switch_p4::tna::program` writes,
//! its structure keeps Tofino 1's limits, and its decisions are the Rust pipeline's (the P4
//! tools' checks of it are in `tests/p4c.rs`).

use ina_proto::event::Event;
use ina_proto::pipeline::{JobConfig, PortId};
use ina_switch_p4::tna::{self, TnaJobError};
use ina_wire::MacAddr;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn committed_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tna/ina.p4")
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
    let lines: Vec<&str> = p.lines().map(str::trim).collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.strip_prefix("action ") else {
            continue;
        };
        let name = rest.split('(').next().unwrap_or_default().to_string();
        // The action's text, to the line that closes its braces.
        let mut body = String::new();
        let mut depth = 0i32;
        for l in &lines[i..] {
            body.push_str(l);
            body.push(' ');
            depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
            if depth <= 0 && l.contains('}') {
                break;
            }
        }
        let execs = body
            .split(".execute(")
            .filter_map(|s| s.rsplit([' ', '=']).next())
            .map(str::to_string)
            .collect::<Vec<_>>();
        // Every split piece but the last ends with a register action's name.
        let n = execs.len().saturating_sub(1);
        actions.insert(name, execs.into_iter().take(n).collect());
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
        for r in regs {
            reg_tables
                .entry(r.clone())
                .or_default()
                .push((name.clone(), *stage));
        }
    }
    // A stateful ALU runs at most four RegisterActions (p4c's Tofino back end refuses more).
    let mut actions_of: BTreeMap<&String, usize> = BTreeMap::new();
    for reg in ra.values() {
        *actions_of.entry(reg).or_default() += 1;
    }
    for (reg, n) in &actions_of {
        assert!(*n <= 4, "{reg} has {n} RegisterActions");
    }
    let mut per_stage: BTreeMap<usize, usize> = BTreeMap::new();
    for (reg, ts) in &reg_tables {
        // One table per register (one access per pass), but for a set's bitmap: its own
        // set's table and the other set's, in one stage, which the apply block runs under
        // opposite conditions on the packet's set.
        if ts.len() > 1 {
            let k = reg.strip_prefix("reg_bitmap_").unwrap_or_else(|| {
                panic!("register {reg} is accessed from {ts:?}");
            });
            let mut names: Vec<&str> = ts.iter().map(|(t, _)| t.as_str()).collect();
            names.sort();
            assert_eq!(
                names,
                [format!("bitmap_other_{k}"), format!("bitmap_own_{k}")]
            );
            assert_eq!(ts[0].1, ts[1].1, "{reg}: tables in two stages");
        }
        assert!(p.contains(
            "if (hdr.ina.set == 0) {
            bitmap_own_0.apply();
            bitmap_other_1.apply();
        } else {
            bitmap_own_1.apply();
            bitmap_other_0.apply();
        }"
        ));
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
    for bitmap in ["reg_bitmap_0", "reg_bitmap_1"] {
        assert!(stage_of("reg_seq") < stage_of(bitmap));
        assert!(stage_of("reg_seq_order") < stage_of(bitmap));
        assert!(stage_of(bitmap) < stage_of("reg_value_0"));
    }
    assert!(stage_of("reg_seq") < stage_of("reg_exp"));
    // The ingress registers: control, values and the Missing reports' (`reg_result_gap` is
    // egress's).
    let gap_ingress = ["reg_gap", "reg_result_use", "reg_result_seq"];
    for r in gap_ingress {
        assert!(reg_tables.contains_key(r), "{r}");
    }
    assert_eq!(
        reg_tables.len(),
        tna::CONTROL_REGISTERS.len() + tna::VALUE_REGISTERS + gap_ingress.len()
    );
}

/// No table has two const entries with the same keys (p4c refuses them: "Duplicate entry
/// keys").
#[test]
fn const_entries_are_distinct() {
    let p = tna::program();
    for (name, _, _) in tables(&p) {
        let entries = table_entries(&p, &name);
        for (i, e) in entries.iter().enumerate() {
            assert!(
                !entries[..i].iter().any(|o| o.keys == e.keys),
                "table {name}: two entries with the keys {:?}",
                e.keys
            );
        }
    }
}

#[test]
fn control_registers_are_the_programs() {
    let p = tna::program();
    // Each control register as the program declares it: cell type and index.
    for reg in tna::CONTROL_REGISTERS {
        let cell = if reg.pair { "pair_t" } else { "bit<32>" };
        let index = match reg.cells_per_slot {
            1 => "slot_index_t>(POOL_SLOTS)",
            2 => "cell_index_t>(POOL_CELLS)",
            n => panic!("{}: {n} cells per slot", reg.name),
        };
        let decl = format!("Register<{cell}, {index} {};", reg.name);
        assert!(p.contains(&decl), "{decl}");
    }
    // And no other register indexed by slot.
    let by_slot = p.matches("slot_index_t>(POOL_SLOTS) reg_").count();
    let listed = tna::CONTROL_REGISTERS
        .iter()
        .filter(|r| r.cells_per_slot == 1);
    assert_eq!(by_slot, listed.count());
    assert!(!p.contains("reg_count"));
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
                    || [
                        "values",
                        "gaps",
                        "result_gaps",
                        "partial_gaps",
                        "result_uses",
                        "result_seqs"
                    ]
                    .iter()
                    .any(|r| before.contains(&format!("Twin: Registers::{r}"))),
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
        "action set_switch_addr(bit<1> reports)",
        "table ip_target",
        "hdr.ipv4.dst_addr : exact;",
        "table arp_target",
        "action arp_for_switch(bit<48> mac, bit<32> ip)",
        "table rank_source",
        "table switch_source",
        "action reply_source(bit<48> mac, bit<32> ip)",
        "table l2_forward",
        "hdr.ethernet.dst_addr : exact;",
        "action l2_to_port(PortId_t port)",
        "action l2_flood(bit<16> mgrp)",
        "table ina_job",
        "action set_job(bit<16> epoch, bit<16> slot_base, bit<16> slot_base_neg, bit<16> slot_count, bit<16> elems, bit<8> workers, bit<16> mgrp, bit<1> up, PortId_t up_port)",
        "table uplink_frame",
        "action from_uplink(bit<2> epoch_ok, MirrorId_t report_session)",
        "table uplink_addr",
        "action up_addr(bit<48> mac, bit<32> ip, bit<16> udp_port, bit<16> epoch, bit<8> rank)",
        "table ina_rank",
        "action set_rank(MirrorId_t report_session)",
        "table ina_rank_addr",
        "eg_intr_md.egress_rid : exact;",
        "action rewrite_dst(bit<48> mac, bit<32> ip, bit<16> udp_port)",
        "reg_seq;",
        "reg_bitmap_0;",
        "reg_bitmap_1;",
        "reg_exp;",
        "ina_events;",
        "ina_multicast;",
        "ina_missing;",
        "reg_gap;",
        "reg_result_gap;",
        "reg_result_use;",
        "table gap_block",
        "table ina_report_addr",
        "const bit<4> INA_MISSING = 8;",
        "const bit<16> INA_UDP_PORT = 18766;",
        "const bit<4> INA_PENDING = 6;",
        "const bit<4> INA_RESULT = 2;",
    ] {
        // (Compared with the whitespace of every line break squashed to one space.)
        let squashed = p.split('\n').map(str::trim).collect::<Vec<_>>().join(" ");
        assert!(squashed.contains(name), "missing: {name}");
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
        uplink: None,
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
    // Bit 31 of a bitmap is the use's kind: 31 ranks fit, 32 do not.
    let ports: Vec<u16> = (0..32).collect();
    assert_eq!(tna::check_job(&job(64, &ports[..31])), Ok(()));
    assert_eq!(
        tna::check_job(&job(64, &ports)),
        Err(TnaJobError::Workers { workers: 32 })
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
            && (1..=usize::from(tna::MAX_WORKERS)).contains(&ports.len())
            && count > 0
            && u32::from(base) + u32::from(count) <= tna::POOL_SLOTS
            && ports.iter().all(|p| *p < 512 && p & 0x7f != 68)
            && ports.iter().all(|p| p >> 7 == ports[0] >> 7);
        prop_assert_eq!(tna::check_job(&j).is_ok(), ok);
    }
}

// ---- The program's decision tables against the Rust model ----
//
// `TnaModel` executes the generated program's stage 2-7 tables for accepted Data and Query
// packets: it computes each table's key as the program does, looks the key up in the table's
// const entries as they stand in the generated text (first match wins), and applies the
// register action the matched action names. The register actions' bodies are mirrored by hand.
// Random executions of workers that follow the protocol (self-clocking, retransmissions,
// Queries; the network loses, duplicates and reorders), and of ranks that send a use's packet
// with a payload where the use carries none or the reverse (refused, BadCount), must get the
// same answers from it as from `ina_proto::pipeline::Pipeline`, and leave the same registers.

use ina_proto::pipeline::{DropReason, Pipeline, PipelineConfig, Verdict};
use ina_wire::agg::RejectReason;

/// One const entry: key patterns (value, mask; mask 0 = any) and the action with its arguments.
#[derive(Debug, Clone)]
struct TableEntry {
    keys: Vec<(u64, u64)>,
    action: String,
    args: Vec<u64>,
}

fn parse_number(s: &str) -> u64 {
    let s = s.trim();
    let s = s.split_once('w').map_or(s, |(_, v)| v);
    if s == "true" {
        1
    } else if s == "false" {
        0
    } else if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16).expect("hex")
    } else if let Some(b) = s.strip_prefix("0b") {
        u64::from_str_radix(b, 2).expect("binary")
    } else {
        s.parse().unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }
}

/// The const entries of table `name` in the program text.
fn table_entries(p: &str, name: &str) -> Vec<TableEntry> {
    let start = p
        .find(&format!("table {name} {{"))
        .unwrap_or_else(|| panic!("table {name}"));
    let body = &p[start..];
    let body = &body[..body.find("default_action").expect("end of table")];
    let Some(entries) = body.split("const entries = {").nth(1) else {
        return Vec::new();
    };
    entries
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('('))
        .map(|l| {
            let (keys, action) = l.rsplit_once(") : ").expect("entry");
            let keys = keys
                .trim_start_matches('(')
                .split(", ")
                .map(|k| match k {
                    "_" => (0, 0),
                    k => match k.split_once(" &&& ") {
                        Some((v, m)) => (parse_number(v), parse_number(m)),
                        None => (parse_number(k), u64::MAX),
                    },
                })
                .collect();
            let action = action.trim_end_matches(';');
            let (name, args) = action.split_once('(').expect("action call");
            let args = args
                .trim_end_matches(')')
                .split(", ")
                .filter(|a| !a.is_empty())
                .map(parse_number)
                .collect();
            TableEntry {
                keys,
                action: name.to_string(),
                args,
            }
        })
        .collect()
}

/// The first entry that matches `key`, if any.
fn lookup<'t>(t: &'t [TableEntry], key: &[u64]) -> Option<&'t TableEntry> {
    t.iter().find(|e| {
        assert_eq!(e.keys.len(), key.len());
        e.keys.iter().zip(key).all(|((v, m), k)| k & m == v & m)
    })
}

struct Tables {
    /// `bitmap_own_k` and `bitmap_other_k` for the sets `k`.
    bitmap_own: [Vec<TableEntry>; 2],
    bitmap_other: [Vec<TableEntry>; 2],
    exp: Vec<TableEntry>,
    select: Vec<TableEntry>,
    /// `value_j` for every value register `j`.
    values: Vec<Vec<TableEntry>>,
    seen: Vec<TableEntry>,
    outcome: Vec<TableEntry>,
    reply: Vec<TableEntry>,
    gap_access: Vec<TableEntry>,
    gap_report: Vec<TableEntry>,
    requery: Vec<TableEntry>,
    result_use: Vec<TableEntry>,
    result_seq: Vec<TableEntry>,
    word: Vec<TableEntry>,
    uplink_reply: Vec<TableEntry>,
}

impl Tables {
    fn new(p: &str) -> Tables {
        Tables {
            bitmap_own: [0, 1].map(|k| table_entries(p, &format!("bitmap_own_{k}"))),
            bitmap_other: [0, 1].map(|k| table_entries(p, &format!("bitmap_other_{k}"))),
            exp: table_entries(p, "exp_access"),
            select: table_entries(p, "value_select"),
            values: (0..tna::VALUE_REGISTERS)
                .map(|j| table_entries(p, &format!("value_{j}")))
                .collect(),
            seen: table_entries(p, "seen_check"),
            outcome: table_entries(p, "ina_outcome"),
            reply: table_entries(p, "ina_reply"),
            gap_access: table_entries(p, "gap_access"),
            gap_report: table_entries(p, "gap_report"),
            requery: table_entries(p, "requery_access"),
            result_use: table_entries(p, "result_use_access"),
            result_seq: table_entries(p, "result_seq_access"),
            word: table_entries(p, "word_check"),
            uplink_reply: table_entries(p, "uplink_reply"),
        }
    }
}

const OP_DATA: u64 = 6;
/// Bit 31 of a set's bitmap and exponent in the program: its use began with a header.
const KIND_BIT: u32 = ina_proto::pipeline::HEADER_USE;
const OP_QUERY: u64 = 7;
/// A total from a rack switch's upper switch (`op::TOTAL`).
const OP_TOTAL: u64 = 9;
const OP_PROBE: u64 = 4;
/// The second pass of the upper switch's Missing whose record named a use (`op::UP_REPORTED`).
const OP_UP_REPORTED: u64 = 13;
/// `bridge::MISSING_UP`.
const BRIDGE_MISSING_UP: u8 = 10;
const E: usize = 64;

#[derive(Debug, Clone, Default)]
struct ModelSlot {
    seq: [u32; 2],
    seq_order: [u32; 2],
    bitmap: [u32; 2],
    exp: [u32; 2],
    values: [Vec<i32>; 2],
}

/// What the model sends for one packet.
#[derive(Debug, PartialEq, Eq)]
enum Sent {
    Dropped(Event),
    Absorbed,
    Unicast(To, Vec<u8>),
    Multicast(Vec<u8>),
}

/// Where a unicast goes: back to the sender, up to the upper switch, or to rank 0.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum To {
    Sender,
    Up,
    Rank0,
}

/// A rack switch's upper switch, as the model needs it: this switch's rank and the upper
/// job's epoch there (PROTOCOL.md §9; the job's id and slots are the same there).
#[derive(Debug, Clone, Copy)]
struct UplinkModel {
    rank: u8,
    epoch: u16,
}

struct TnaModel<'t> {
    tables: &'t Tables,
    slots: Vec<ModelSlot>,
    workers: u32,
    /// Whether the switch sends Missing reports (`md.reports`), and whether the job's slots
    /// are one whole block (`gap_block`).
    reports: bool,
    block: bool,
    /// The job's upper switch (PROTOCOL.md §9), if it is a rack switch's.
    uplink: Option<UplinkModel>,
    /// `reg_gap`, `reg_result_gap`, `reg_partial_gap`, `reg_result_use`, `reg_result_seq`
    /// by index.
    reg_gap: Vec<u32>,
    reg_result_gap: Vec<u32>,
    reg_partial_gap: Vec<u32>,
    reg_result_use: Vec<u32>,
    reg_result_seq: Vec<u32>,
    /// What the last packet left for the frames' check.
    last: Option<Last>,
}

/// What the model's last packet did, for [`check_frames`]: the reply action, `md.exp_x`,
/// `md.pend`, the values of its set, `md.stamp`, `md.res_gap` and the report mirrored
/// (the rank's gap cell before the packet, how many counters it skipped).
#[derive(Debug)]
struct Last {
    action: String,
    /// The action's arguments (its entry's).
    args: Vec<u64>,
    /// Stage 3 made the packet's payload valid for the sums it reads (a Query's, an upper
    /// switch's Pending's).
    payload_for_query: bool,
    exp_x: u32,
    pend: u32,
    values: Vec<i32>,
    stamp: u64,
    res_gap: u32,
    report: Option<(u16, u8)>,
    /// A rank's Missing turned into its Query in stage 1: `md.rec`, `md.rec_seq`.
    requery: Option<(u32, u32)>,
    /// The upper switch's Missing, recirculated, turned into its Pending for the recorded use
    /// in stage 1 of the second pass: `md.rec`, `md.rec_seq` (PROTOCOL.md §9).
    up_requery: Option<(u32, u32)>,
}

/// The key of `ina_check`'s columns (`CHECK_KEYS`) for an accepted Data packet of `count`
/// elements and exponent byte `exponent` from a rank on port `ingress` to the switch's MAC.
fn accepted_data_key(count: u64, exponent: u64, ingress: u64, reports: u64) -> Vec<u64> {
    let mut key = vec![0, 0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 0];
    key.extend([count, count ^ E as u64, 0, ingress, exponent, reports, 0]);
    key
}

impl<'t> TnaModel<'t> {
    /// The program's registers, all zero, for a job of `workers` ranks; `(reports, block)`:
    /// the switch sends Missing reports, the job's slots are a whole block.
    fn new(
        tables: &'t Tables,
        workers: u8,
        (reports, block): (bool, bool),
        uplink: Option<UplinkModel>,
    ) -> TnaModel<'t> {
        TnaModel {
            tables,
            slots: vec![
                ModelSlot {
                    values: [vec![0; E], vec![0; E]],
                    ..ModelSlot::default()
                };
                usize::from(POOL)
            ],
            workers: u32::from(workers),
            reports,
            block,
            uplink,
            reg_gap: vec![0; tna::GAP_CELLS as usize],
            reg_result_gap: vec![0; tna::GAP_BLOCKS as usize],
            reg_partial_gap: vec![0; tna::GAP_BLOCKS as usize],
            reg_result_use: vec![0; tna::USE_RECORD_CELLS as usize],
            reg_result_seq: vec![0; tna::USE_RECORD_CELLS as usize],
            last: None,
        }
    }
}

impl TnaModel<'_> {
    /// One accepted Data or Query packet (`pkt`: header and payload).
    fn process(&mut self, pkt: &[u8], ingress: u64) -> Sent {
        if pkt[0] & 0x0f == 8 {
            return self.missing(pkt, ingress);
        }
        let op = if pkt[0] & 0x0f == 1 {
            OP_DATA
        } else {
            OP_QUERY
        };
        self.process_op(pkt, ingress, op, None)
    }

    /// One accepted packet of the check table's operation `op`; `check`: its key of
    /// `ina_check` where it is not a rank's Data.
    fn process_op(&mut self, pkt: &[u8], ingress: u64, op: u64, check: Option<Vec<u64>>) -> Sent {
        let t = self.tables;
        let x = usize::from(pkt[1] & 1);
        let rank = u32::from(pkt[6]);
        let exponent = u32::from(pkt[7]);
        let slot = usize::from(u16::from_be_bytes([pkt[8], pkt[9]]));
        let count = u64::from(u16::from_be_bytes([pkt[10], pkt[11]]));
        let seq = u32::from_be_bytes([pkt[12], pkt[13], pkt[14], pkt[15]]);
        let payload: Vec<i32> = pkt[16..]
            .chunks_exact(4)
            .map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        // (An upper switch's total may carry any rank: rank_bit has 31 entries.)
        let bit = if rank < u32::from(tna::MAX_WORKERS) {
            1u32 << rank
        } else {
            0
        };
        let mask = if self.workers == 32 {
            u32::MAX
        } else {
            (1u32 << self.workers) - 1
        };
        let flags = u64::from(pkt[1]);
        let gap_on = flags >> 1 & 1;
        let block_in_job = self.block;
        let reports = u64::from(self.reports);
        let stamp = reports & u64::from(block_in_job);
        // Stage 2: reg_gap, for accepted Data only (this model sees accepted packets).
        let mut report = None;
        // (A rack switch's total, PROTOCOL.md §9, has its counter in the block's cell of the
        // rank no job has.)
        let total = op == OP_TOTAL;
        if op == OP_DATA || total {
            let mut key = check
                .unwrap_or_else(|| accepted_data_key(count, u64::from(exponent), ingress, reports));
            key.extend([u64::from(block_in_job), gap_on]);
            if let Some(e) = lookup(&t.gap_access, &key) {
                assert_eq!(e.action, "do_gap_note");
                let cell_rank = if total { 31 } else { rank as usize & 31 };
                let cell = (slot >> 6) << 5 | cell_rank;
                // 16-bit cells: the counter in bits 15..10, bit 0 set.
                let gap_in = ((flags >> 2) as u32) << 10 | 1;
                let gap_in1 = gap_in.wrapping_sub(1 << 10) & 0xffff;
                let v = self.reg_gap[cell];
                let gap_old = v;
                if v == 0 || gap_in1.wrapping_sub(v) & 0xffff < 8 << 10 {
                    self.reg_gap[cell] = gap_in;
                }
                // Stages 3 and 4: how far ahead, and the report.
                let ahead = gap_in.wrapping_sub(gap_old) & 0xffff;
                let rkey = [u64::from(gap_old & 1), u64::from(ahead >> 10), 0, op];
                if let Some(r) = lookup(&t.gap_report, &rkey) {
                    let want = if total {
                        "report_total_gap"
                    } else {
                        "report_gap"
                    };
                    assert_eq!(r.action, want);
                    report = Some((gap_old as u16, r.args[0] as u8));
                }
            } else {
                assert!(
                    reports == 0 || !block_in_job || gap_on == 0,
                    "no gap_access row for {key:?}"
                );
            }
        }
        let s = &mut self.slots[slot];
        // Stage 2: reg_seq and reg_seq_order, as their RegisterActions.
        let newer = (seq.wrapping_sub(s.seq[x]) as i32) > 0;
        let same = seq == s.seq[x];
        let other_newer = (s.seq_order[1 - x].wrapping_sub(seq) as i32) > 0;
        let predicate = |lo: bool, hi: bool| 1u64 << (u32::from(lo) + 2 * u32::from(hi));
        let seq_pred = predicate(newer, same);
        let order_pred = predicate(newer, other_newer);
        if op == OP_DATA && newer {
            s.seq[x] = seq;
            s.seq_order[x] = seq;
        }
        // Stage 3. Bit 31 of a set's bitmap and exponent: its use began with a header.
        // The packet's set's bitmap table, and the other set's (the apply block runs the
        // pair of the packet's set).
        let set_key = [op, seq_pred, order_pred];
        let kind = if count == 0 { KIND_BIT } else { 0 };
        let mut bm_old = 0u32;
        if let Some(e) = lookup(&t.bitmap_own[x], &set_key) {
            bm_old = s.bitmap[x];
            match e.action.rsplit_once('_').map(|(a, _)| a) {
                Some("own_new") => s.bitmap[x] = bit | kind,
                Some("own_add") => {
                    if s.bitmap[x].wrapping_sub(kind) as i32 >= 0 {
                        s.bitmap[x] |= bit;
                    }
                }
                Some("own_read") => {}
                other => panic!("bitmap action {other:?}"),
            }
            assert!(e.action.ends_with(&format!("_{x}")), "{}", e.action);
        }
        if let Some(e) = lookup(&t.bitmap_other[1 - x], &set_key) {
            assert_eq!(e.action, format!("other_take_out_{}", 1 - x));
            s.bitmap[1 - x] &= !bit;
        }
        let key = [op, x as u64, seq_pred, order_pred, 0];
        let mut exp_x = 0u32;
        if let Some(e) = lookup(&t.exp, &key) {
            let exp_h = exponent | kind;
            match e.action.as_str() {
                "do_exp_write" => s.exp[x] = exp_h,
                "do_exp_max" => {
                    if s.exp[x].wrapping_sub(kind) as i32 >= 0 && exp_h > s.exp[x] {
                        s.exp[x] = exp_h;
                    }
                }
                "do_exp_read" => {}
                other => panic!("exp action {other:?}"),
            }
            exp_x = s.exp[x];
        }
        let sel = lookup(
            &t.select,
            &[op, seq_pred, order_pred, count, u64::from(exponent), 0],
        );
        let vop_c = match sel {
            Some(e) if e.action == "select_values" => e.args[0],
            Some(e) if e.action == "select_values_for_query" => 3,
            Some(e) => panic!("value_select action {}", e.action),
            None => 0,
        };
        // Stage 4 on: the value registers. The tables of stage 4 see the bitmap; `value_0`
        // records the operation it chose, which the tables of the later stages match.
        let mut vop = 0;
        for (j, table) in t.values.iter().enumerate() {
            let stage = tna::VALUE_FIRST_STAGE + j / tna::ALUS_PER_STAGE;
            let key = if stage == tna::VALUE_FIRST_STAGE {
                vec![vop_c, u64::from(bm_old), u64::from(rank)]
            } else {
                vec![vop]
            };
            let Some(e) = lookup(table, &key) else {
                continue;
            };
            let op = e
                .action
                .strip_suffix(&format!("_{j}"))
                .unwrap_or_else(|| panic!("value_{j} runs {}", e.action));
            let (lo, hi) = (2 * j, 2 * j + 1);
            let cell = &mut s.values[x];
            let code = match op {
                "do_value_write" => {
                    cell[lo] = payload[lo];
                    cell[hi] = payload[hi];
                    1
                }
                "do_value_add" => {
                    cell[lo] = cell[lo].wrapping_add(payload[lo]);
                    cell[hi] = cell[hi].wrapping_add(payload[hi]);
                    5
                }
                "do_value_read_hi" => 3,
                "do_value_read_lo" => 4,
                a => panic!("value_{j} action {a}"),
            };
            if j == 0 {
                vop = code;
            }
        }
        let seen = u64::from(lookup(&t.seen, &[u64::from(bm_old), u64::from(rank)]).is_some());
        // Stage 4: an upper switch's Pending word holds this switch's bit (its rank there).
        let word = payload.first().map_or(0, |w| *w as u32);
        let word_me = u64::from(lookup(&t.word, &[u64::from(word), u64::from(rank)]).is_some());
        let old_x = bm_old ^ mask;
        // As stage 5 computes it (the rank's bit flipped: bm_old | bit where it is not in).
        let new_x = old_x ^ bit;
        // Stage 6.
        let okey = [
            op,
            seq_pred,
            order_pred,
            seen,
            u64::from(old_x),
            u64::from(new_x),
            u64::from(self.workers),
            count,
            u64::from(exponent),
            u64::from(self.uplink.is_some()),
            u64::from(exp_x >> 8 & 1),
            u64::from(rank),
            u64::from(self.reports),
            word_me,
        ];
        let o = lookup(&t.outcome, &okey)
            .unwrap_or_else(|| panic!("no outcome for the accepted packet's key {okey:?}"));
        let (outcome, event, pend) = match o.action.as_str() {
            "outcome" | "outcome_multicast" => (o.args[0], o.args[1], 0),
            "outcome_pending" => (o.args[0], o.args[1], bm_old & !KIND_BIT),
            "outcome_pending_empty" => (5, o.args[0], 0),
            "outcome_reject" => {
                assert_eq!(o.args[0], RejectReason::BadCount as u64, "reject reason");
                (6, o.args[1], 0)
            }
            a => panic!("outcome action {a}"),
        };
        let event = Event::ALL[event as usize];
        // Stage 7.
        let r = lookup(&t.reply, &[op, outcome, 0, count, stamp]);
        let (mut action, mut args) = r.map_or(("drop_frame", Vec::new()), |e| {
            (e.action.as_str(), e.args.clone())
        });
        if action == "NoAction" {
            // Stage 8: a rack switch's own packets (PROTOCOL.md §9).
            let e = lookup(&t.uplink_reply, &[op, outcome, stamp])
                .unwrap_or_else(|| panic!("no uplink_reply row for {op} {outcome}"));
            (action, args) = (e.action.as_str(), e.args.clone());
        }
        if action == "store_total" {
            // The total's second pass stores its payload and exponent byte (bit 8: stored).
            if count != 0 {
                s.values[x].clone_from(&payload);
            }
            s.exp[x] = kind | 1 << 8 | exponent;
        }
        // The second pass of a multicast result: stages 0 and 1 stamp the block's counter
        // if the first pass asked (`hdr.bridge.stamp`) and record the use under it.
        let mut res_gap = 0u32;
        let mut flags_out = x as u8;
        let stamped = match action {
            "multicast_result_harvest" | "send_partial_harvest" => args[3] == 1,
            "store_total" => args[0] == 1,
            _ => false,
        };
        if stamped {
            // Egress on the way: the block's next counter, a result's or (PROTOCOL.md §9) a
            // first partial's; the second pass records the use under it, a partial's in the
            // partials' records.
            let partial = action == "send_partial_harvest";
            let (next, records, bridge_op, kind) = if partial {
                (
                    &mut self.reg_partial_gap,
                    tna::PARTIAL_RECORDS as usize,
                    8,
                    1,
                )
            } else {
                (&mut self.reg_result_gap, 0, 6, 2)
            };
            res_gap = next[slot >> 6];
            next[slot >> 6] += 1;
            let counter = u64::from(res_gap & 63);
            let key = [1, bridge_op, 1, kind, 1];
            let e = lookup(&t.result_use, &key).expect("result_use_access row");
            assert_eq!(e.action, "do_result_use_write");
            let e = lookup(&t.result_seq, &key).expect("result_seq_access row");
            assert_eq!(e.action, "do_result_seq_write");
            let cell = records + ((slot >> 6) << 6 | counter as usize);
            self.reg_result_use[cell] = 1 << 14 | (slot as u32) << 1 | x as u32;
            self.reg_result_seq[cell] = seq;
            flags_out |= (counter as u8) << 2 | 2;
        } else {
            let first = action.starts_with("multicast")
                || action == "store_total"
                || action.starts_with("send_partial") && op == OP_DATA;
            assert!(stamp == 0 || !first, "{action} not stamped");
        }
        let header = |kind: u8, exp: u8, count: u16| {
            let mut h = pkt[..16].to_vec();
            h[0] = 0x10 | kind;
            h[1] = x as u8;
            h[7] = exp;
            h[10..12].copy_from_slice(&count.to_be_bytes());
            h
        };
        let mcast_header = |exp: u8, count: u16| {
            let mut h = header(2, exp, count);
            h[1] = flags_out;
            h
        };
        let with_values = |mut h: Vec<u8>, vals: &[i32]| {
            for v in vals {
                h.extend_from_slice(&v.to_be_bytes());
            }
            h
        };
        let values = s.values[x].clone();
        // What egress writes into a packet to the upper switch: the upper job's epoch and
        // this switch's rank there.
        let up = |mut h: Vec<u8>| {
            let u = self.uplink.expect("a rack switch's");
            h[4..6].copy_from_slice(&u.epoch.to_be_bytes());
            h[6] = u.rank;
            h
        };
        // A packet of this job's own epoch from rank 0's switch.
        let own = |mut h: Vec<u8>| {
            h[4..6].copy_from_slice(&EPOCH.to_be_bytes());
            h[6] = 0;
            h
        };
        self.last = Some(Last {
            action: action.to_string(),
            args: args.clone(),
            payload_for_query: sel.is_some_and(|e| e.action == "select_values_for_query"),
            exp_x,
            pend,
            values: values.clone(),
            stamp,
            res_gap,
            report,
            requery: None,
            up_requery: None,
        });
        match action {
            "drop_frame" => match event {
                Event::DataFirst | Event::DataAdded => Sent::Absorbed,
                e => Sent::Dropped(e),
            },
            "answer_pending" => {
                Sent::Unicast(To::Sender, with_values(header(6, 0, 1), &[pend as i32]))
            }
            "answer_reject" => {
                Sent::Unicast(To::Sender, header(3, RejectReason::BadCount as u8, 0))
            }
            "answer_result" => Sent::Unicast(To::Sender, header(2, exp_x as u8, 0)),
            "answer_result_harvest" => Sent::Unicast(
                To::Sender,
                with_values(header(2, exp_x as u8, E as u16), &values),
            ),
            // Args: the lengths and the count; the one-worker first arrival's payload is the
            // sum.
            "multicast_result" if args[2] == 0 => Sent::Multicast(mcast_header(exp_x as u8, 0)),
            "multicast_result" => {
                Sent::Multicast(with_values(mcast_header(exp_x as u8, E as u16), &payload))
            }
            "multicast_result_harvest" if args[2] == 0 => {
                Sent::Multicast(mcast_header(exp_x as u8, 0))
            }
            "multicast_result_harvest" => {
                Sent::Multicast(with_values(mcast_header(exp_x as u8, E as u16), &values))
            }
            "send_partial_empty" => Sent::Unicast(To::Up, up(header(1, exp_x as u8, 0))),
            // Args: the lengths, the count, and whether egress stamps it.
            "send_partial_harvest" => {
                let mut h = up(header(1, exp_x as u8, args[2] as u16));
                h[1] = flags_out;
                Sent::Unicast(To::Up, with_values(h, &values[..args[2] as usize]))
            }
            // The upper switch's Missing: its second pass is `upper_packet`'s.
            "recirc_missing" => Sent::Absorbed,
            "query_up" => Sent::Unicast(To::Up, up(header(7, args[0] as u8, 0))),
            "pending_to_rank0" => {
                Sent::Unicast(To::Rank0, with_values(own(header(6, 0, 1)), &[pend as i32]))
            }
            "store_total" => {
                let h = own(mcast_header(exponent as u8, count as u16));
                Sent::Multicast(with_values(h, &values[..count as usize]))
            }
            a => panic!("reply action {a}"),
        }
    }
}

impl TnaModel<'_> {
    /// A rank's Missing (`pkt`, of its job and epoch): stage 0 reads the record of the counter
    /// it names, stage 1 turns it into the rank's fetching Query of the recorded use, which
    /// goes on as any Query; otherwise the check table drops it.
    fn missing(&mut self, pkt: &[u8], ingress: u64) -> Sent {
        let t = self.tables;
        let gap_on = u64::from(pkt[1] >> 1 & 1);
        let slot = usize::from(u16::from_be_bytes([pkt[8], pkt[9]]));
        let (mut rec, mut rec_seq) = (0, 0);
        let cell = (slot >> 6) << 6 | usize::from(pkt[1] >> 2);
        if let Some(e) = lookup(&t.result_use, &[0, 0, 0, 8, gap_on]) {
            assert_eq!(e.action, "do_result_use_read");
            rec = self.reg_result_use[cell];
        }
        if let Some(e) = lookup(&t.result_seq, &[0, 0, 0, 8, gap_on]) {
            assert_eq!(e.action, "do_result_seq_read");
            rec_seq = self.reg_result_seq[cell];
        }
        let (reports, block) = (u64::from(self.reports), u64::from(self.block));
        let key = [0, 8, reports, block, 0, u64::from(rec >> 14 & 1)];
        match lookup(&t.requery, &key) {
            Some(e) => {
                assert_eq!(e.action, "requery");
                let mut q = pkt[..16].to_vec();
                q[0] = 0x17;
                q[1] = (rec & 1) as u8;
                q[7] = ina_wire::QueryAsk::Fetch.byte();
                q[8..10].copy_from_slice(&((rec >> 1 & 0x1fff) as u16).to_be_bytes());
                q[10..12].copy_from_slice(&[0, 0]);
                q[12..16].copy_from_slice(&rec_seq.to_be_bytes());
                let sent = self.process(&q, ingress);
                if let Some(last) = self.last.as_mut() {
                    last.requery = Some((rec, rec_seq));
                }
                sent
            }
            None => {
                self.last = Some(Last {
                    action: "drop_frame".into(),
                    args: Vec::new(),
                    payload_for_query: false,
                    exp_x: 0,
                    pend: 0,
                    values: Vec::new(),
                    stamp: 0,
                    res_gap: 0,
                    report: None,
                    requery: None,
                    up_requery: None,
                });
                Sent::Dropped(Event::MissingUnmatched)
            }
        }
    }
}

impl TnaModel<'_> {
    /// A packet of the upper switch (`pkt`, PROTOCOL.md §9), in on its port from its address:
    /// the check table (stage 2) decides its operation, or drops it.
    fn upper_packet(&mut self, env: &CheckEnv, check: &[TableEntry], pkt: &[u8]) -> Sent {
        let up = env.uplink.expect("a rack switch's upper switch");
        let (pkt, first) = self.stage1_requery(pkt);
        let f = wrap_from(&up.at, &pkt);
        let (action, args) = check_action(check, env, up.at.port, &f);
        match action.as_str() {
            "check_upper" => {
                let key = check_key(env, up.at.port, &f);
                let sent = self.process_op(&pkt, u64::from(up.at.port), args[0], Some(key.clone()));
                if self
                    .last
                    .as_ref()
                    .is_some_and(|l| l.action == "recirc_missing")
                {
                    // (recirc_missing writes the Missing's type back.)
                    let mut missing = pkt.clone();
                    missing[0] = missing[0] & 0xf0 | 8;
                    return self.upper_missing_second_pass(env, check, &missing, key, first);
                }
                sent
            }
            "check_drop" => {
                self.last = None;
                Sent::Dropped(Event::ALL[args[0] as usize])
            }
            a => panic!("check action {a} for the upper switch's {:?}", &pkt[..16]),
        }
    }
}

impl TnaModel<'_> {
    /// Stages 0 and 1 of a first pass for a packet of the upper switch, which they cannot tell
    /// from a rank's: a Missing of the job's own epoch (the upper job's is the same) whose
    /// results' record names a use becomes a rank's fetching Query of it. Returns the packet
    /// as stage 2 sees it, and `md.rec`, `md.rec_seq` if it was rewritten.
    fn stage1_requery(&self, pkt: &[u8]) -> (Vec<u8>, Option<(u32, u32)>) {
        let t = self.tables;
        let mut q = pkt.to_vec();
        if pkt[0] & 0x0f != 8 {
            return (q, None);
        }
        let gap_on = u64::from(pkt[1] >> 1 & 1);
        let slot = usize::from(u16::from_be_bytes([pkt[8], pkt[9]]));
        let cell = (slot >> 6) << 6 | usize::from(pkt[1] >> 2);
        let (mut rec, mut rec_seq) = (0, 0);
        if lookup(&t.result_use, &[0, 0, 0, 8, gap_on]).is_some() {
            rec = self.reg_result_use[cell];
        }
        if lookup(&t.result_seq, &[0, 0, 0, 8, gap_on]).is_some() {
            rec_seq = self.reg_result_seq[cell];
        }
        let epoch_x = u64::from(u16::from_be_bytes([pkt[4], pkt[5]]) ^ EPOCH);
        let (reports, block) = (u64::from(self.reports), u64::from(self.block));
        let key = [0, 8, reports, block, epoch_x, u64::from(rec >> 14 & 1)];
        match lookup(&t.requery, &key) {
            Some(e) => {
                assert_eq!(e.action, "requery");
                q[0] = 0x17;
                q[1] = q[1] & !1 | (rec & 1) as u8;
                q[7] = ina_wire::QueryAsk::Fetch.byte();
                q[8..10].copy_from_slice(&((rec >> 1 & 0x1fff) as u16).to_be_bytes());
                q[12..16].copy_from_slice(&rec_seq.to_be_bytes());
                (q, Some((rec, rec_seq)))
            }
            None => (q, None),
        }
    }

    /// The second pass of the upper switch's Missing (`pkt`; `key`: its first pass's key of
    /// `ina_check`), PROTOCOL.md §9: stage 0 takes the record of the partial counter it names,
    /// stage 1 turns it into the upper switch's Pending for the recorded use, which goes on as
    /// op `UP_REPORTED`; otherwise the check table drops it.
    fn upper_missing_second_pass(
        &mut self,
        env: &CheckEnv,
        check: &[TableEntry],
        pkt: &[u8],
        mut key: Vec<u64>,
        first: Option<(u32, u32)>,
    ) -> Sent {
        let t = self.tables;
        let gap_on = u64::from(pkt[1] >> 1 & 1);
        let slot = usize::from(u16::from_be_bytes([pkt[8], pkt[9]]));
        let cell = tna::PARTIAL_RECORDS as usize + ((slot >> 6) << 6 | usize::from(pkt[1] >> 2));
        let rkey = [1, u64::from(BRIDGE_MISSING_UP), 0, 8, gap_on];
        let (mut rec, mut rec_seq) = (0, 0);
        if let Some(e) = lookup(&t.result_use, &rkey) {
            assert_eq!(e.action, "do_result_use_take");
            rec = std::mem::take(&mut self.reg_result_use[cell]);
        }
        if let Some(e) = lookup(&t.result_seq, &rkey) {
            assert_eq!(e.action, "do_result_seq_read");
            rec_seq = self.reg_result_seq[cell];
        }
        let epoch_x = u64::from(u16::from_be_bytes([pkt[4], pkt[5]]) ^ EPOCH);
        let (reports, block) = (u64::from(self.reports), u64::from(self.block));
        let qkey = [1, 8, reports, block, epoch_x, u64::from(rec >> 14 & 1)];
        let mut q = pkt[..16].to_vec();
        if let Some(e) = lookup(&t.requery, &qkey) {
            assert_eq!(e.action, "up_requery");
            q[0] = 0x16;
            q[1] = q[1] & !1 | (rec & 1) as u8;
            q[8..10].copy_from_slice(&((rec >> 1 & 0x1fff) as u16).to_be_bytes());
            q[12..16].copy_from_slice(&rec_seq.to_be_bytes());
        }
        // The check table on the second pass: in on the recirculation port, so from no
        // rank's or upper switch's endpoint.
        key[0] = 1;
        key[10] = u64::from(q[0] & 0x0f);
        key[14] = 0;
        key[24] = 0;
        let e = lookup(check, &key).expect("a check row for every second pass");
        let sent = match e.action.as_str() {
            "check_upper" => {
                assert_eq!(e.args[0], OP_UP_REPORTED);
                let port = u64::from(env.uplink.expect("an upper switch").at.port);
                self.process_op(&q, port, OP_UP_REPORTED, Some(key))
            }
            "check_drop" => {
                self.last = None;
                Sent::Dropped(Event::ALL[e.args[0] as usize])
            }
            a => panic!("check action {a} for the second pass of {:?}", &pkt[..16]),
        };
        if let Some(last) = self.last.as_mut() {
            last.requery = first;
            last.up_requery = Some((rec, rec_seq));
        }
        sent
    }
}

/// The Missing of `rank` naming gap counter `counter` of the block of `slot` (PROTOCOL.md §5,
/// "Lost results").
fn missing_packet(rank: u8, slot: u16, counter: u8) -> Vec<u8> {
    let mut p = vec![0x18, counter << 2 | 2];
    p.extend_from_slice(&JOB.to_be_bytes());
    p.extend_from_slice(&EPOCH.to_be_bytes());
    p.extend_from_slice(&[rank, 0]);
    p.extend_from_slice(&slot.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    p
}

/// A worker of the simulated job: positions from `w` on, lane of `w` slots.

#[derive(Debug, Default)]
struct SimWorker {
    next: u32,
    sent: std::collections::BTreeSet<u32>,
    done: std::collections::BTreeSet<u32>,
    /// First transmissions so far: the gap counter of the next one (modulo 64).
    first_tx: u32,
}

impl SimWorker {
    /// Rank `rank`'s Data of its next position, if self-clocking allows it (the result of the
    /// position `w` before is in), with its gap counter if `gaps`.
    fn next_position(&mut self, rank: u8, w: u32, base: u16, gaps: bool) -> Option<Vec<u8>> {
        let g = self.next;
        if g >= 2 * w && !self.done.contains(&(g - w)) {
            return None;
        }
        self.next += 1;
        self.sent.insert(g);
        let gap = gaps.then_some((self.first_tx % 64) as u8);
        self.first_tx += 1;
        Some(packet(rank, g, w, base, false, gap))
    }
}

const JOB: u16 = 3;
const EPOCH: u16 = 9;
const BASE: u16 = 4;
/// The first slot of a job whose slots are one whole block (Missing reports on).
const GAP_BASE: u16 = 64;
/// The pool of the executions' pipeline: two blocks.
const POOL: u16 = 128;

/// The first slot and the slot count of the executions' job: `BASE` and the lane's `w`
/// slots, or with reports the whole block from `GAP_BASE` (the lanes use its first `w`).
fn job_slots(w: u32, gaps: bool) -> (u16, u16) {
    if gaps {
        (GAP_BASE, 64)
    } else {
        (BASE, w as u16)
    }
}

fn elements(rank: u8, g: u32) -> Vec<i32> {
    (0..E as u32)
        .map(|k| (u32::from(rank) * 7919 + g * 104_729 + k * 31).wrapping_mul(2_654_435_761) as i32)
        .collect()
}

fn count_of(g: u32) -> u16 {
    if g.is_multiple_of(4) {
        0
    } else {
        E as u16
    }
}

/// The packet of `rank` at position `g` of a lane of `w` slots from `base`: Data (with gap
/// counter `gap` if any), or a Query of it.
fn packet(rank: u8, g: u32, w: u32, base: u16, query: bool, gap: Option<u8>) -> Vec<u8> {
    packet_of_count(rank, g, w, base, query, count_of(g), gap)
}

/// As [`packet`], with `count` elements (0 or `E`) whatever the position's own count: a
/// misused rank's packet when they differ.
fn packet_of_count(
    rank: u8,
    g: u32,
    w: u32,
    base: u16,
    query: bool,
    count: u16,
    gap: Option<u8>,
) -> Vec<u8> {
    let slot = base + (g % w) as u16;
    let set = ((g / w) % 2) as u8 | gap.map_or(0, |c| c << 2 | 2);
    let kind = if query { 7 } else { 1 };
    let exponent = if query {
        // Every ask (QueryAsk): bit 0 wants the sums, which only a use with a payload has.
        let ask = ((u32::from(rank) + g) % 4) as u8;
        if count != 0 {
            ask
        } else {
            ask & !1
        }
    } else {
        100 + ((u32::from(rank) + g) % 50) as u8
    };
    let mut p = vec![0x10 | kind, set];
    p.extend_from_slice(&JOB.to_be_bytes());
    p.extend_from_slice(&EPOCH.to_be_bytes());
    p.extend_from_slice(&[rank, exponent]);
    p.extend_from_slice(&slot.to_be_bytes());
    p.extend_from_slice(&if query { 0 } else { count }.to_be_bytes());
    p.extend_from_slice(&g.to_be_bytes());
    if !query && count != 0 {
        for v in elements(rank, g) {
            p.extend_from_slice(&v.to_be_bytes());
        }
    }
    p
}

/// The network loses the packet `b` picks, if any.
fn lose<T>(bag: &mut Vec<T>, b: u16) {
    if !bag.is_empty() {
        bag.swap_remove(usize::from(b) % bag.len());
    }
}

/// The network delivers the packet `b` picks, now and then a copy of it (duplication).
fn deliver_one<T: Clone>(bag: &mut Vec<T>, b: u16) -> Option<T> {
    if bag.is_empty() {
        return None;
    }
    let i = usize::from(b) % bag.len();
    Some(if b.is_multiple_of(5) {
        bag[i].clone()
    } else {
        bag.swap_remove(i)
    })
}

/// The header of the Missing a rank gets for its Data `pkt` whose counter skipped: its cell
/// before the packet (the counter before the first skipped) and how many it skipped.
fn report_header(pkt: &[u8], (cell, skipped): (u16, u8)) -> Vec<u8> {
    let first = ((cell >> 10) as u8 + 1) & 63;
    let mut h = pkt[..16].to_vec();
    h[0] = 0x18;
    h[1] = first << 2 | 2 | (pkt[1] & 1);
    h[7] = skipped;
    h[10..12].copy_from_slice(&[0, 0]);
    h
}

/// Answers reach the workers: a result of an outstanding position completes it. A unicast to
/// the sender (`sender`, if a rank) and each multicast copy is lost now and then (`b`).
fn deliver(sims: &mut [SimWorker], got: &Sent, sender: Option<u8>, b: u16) {
    let complete = |sim: &mut SimWorker, answer: &[u8]| {
        if answer[0] & 0x0f == 2 {
            let g = u32::from_be_bytes([answer[12], answer[13], answer[14], answer[15]]);
            if sim.sent.contains(&g) {
                sim.done.insert(g);
            }
        }
    };
    match got {
        Sent::Unicast(To::Sender, a) if !b.is_multiple_of(7) => {
            if let Some(rank) = sender {
                complete(&mut sims[usize::from(rank)], a);
            }
        }
        Sent::Multicast(a) => {
            for (i, sim) in sims.iter_mut().enumerate() {
                if (usize::from(b) + i) % 7 != 0 {
                    complete(sim, a);
                }
            }
        }
        _ => {}
    }
}

/// The Rust pipeline's registers and the model's of the lane's `w` slots from `base` agree
/// (the Rust model's count has no twin in the program; bit 31 of bitmap and exponent is the
/// use's kind, bit 8 of the exponent a rack switch's total).
fn registers_agree(regs: &ina_proto::pipeline::Registers, model: &TnaModel, base: u16, w: u32) {
    for slot in usize::from(base)..usize::from(base) + w as usize {
        let (rs, ms) = (&regs.slots()[slot], &model.slots[slot]);
        assert_eq!(rs.seq, ms.seq, "seq of slot {slot}");
        assert_eq!(ms.seq_order, ms.seq, "seq order copy of slot {slot}");
        assert_eq!(
            rs.bitmap,
            ms.bitmap.map(|b| b & !KIND_BIT),
            "bitmap of slot {slot}"
        );
        assert_eq!(rs.exp, ms.exp.map(|e| e & 0xff), "exp of slot {slot}");
        for set in 0..2 {
            assert_eq!(regs.values_of(slot, set), &ms.values[set][..], "values");
        }
    }
}

/// Runs the execution `steps` describes, with Missing reports on if `gaps` (the workers' first
/// transmissions then carry gap counters); returns what the switch sent, as kinds of answer.
fn run_execution(
    workers: u8,
    w: u32,
    steps: &[(u8, u16, u16)],
    gaps: bool,
) -> std::collections::BTreeSet<String> {
    let mut kinds = std::collections::BTreeSet::new();
    let program = tna::program();
    let tables = Tables::new(&program);
    let (base, slot_count) = job_slots(w, gaps);
    let mut pipe = Pipeline::new(PipelineConfig {
        pool_slots: POOL,
        max_elems: E as u16,
    });
    pipe.set_gap_reports(gaps);
    pipe.add_job(JobConfig {
        job: JOB,
        epoch: EPOCH,
        slot_base: base,
        slot_count,
        elems_per_packet: E as u16,
        ranks: (0..workers).map(|r| PortId(10 + u16::from(r))).collect(),
        uplink: None,
    })
    .expect("job");
    let mut model = TnaModel::new(&tables, workers, (gaps, gaps), None);
    let mut sw = frame_switch_of(workers, w, gaps);
    let mut frames = Outputs::new();
    let mut sims: Vec<SimWorker> = (0..workers)
        .map(|_| SimWorker {
            next: w,
            ..SimWorker::default()
        })
        .collect();
    // The network: packets in flight, with their rank.
    let mut bag: Vec<(u8, Vec<u8>)> = Vec::new();
    // The position of the latest stamped result that carried each gap counter.
    let mut stamped: BTreeMap<u8, u32> = BTreeMap::new();
    let mut out = vec![0u8; 16 + 4 * E];
    for &(what, a, b) in steps {
        let r = (a % u16::from(workers)) as u8;
        let sim = &mut sims[usize::from(r)];
        match what % 7 {
            // A new position, when self-clocking allows it.
            0 | 1 => {
                if let Some(p) = sim.next_position(r, w, base, gaps) {
                    bag.push((r, p));
                }
            }
            // A retransmission or a Query of an outstanding position.
            2 => {
                let outstanding: Vec<u32> = sim.sent.difference(&sim.done).copied().collect();
                if !outstanding.is_empty() {
                    let g = outstanding[usize::from(b) % outstanding.len()];
                    // With reports, sometimes the Missing of the result's counter instead,
                    // if a stamped result of `g` went out.
                    let counter = stamped.iter().find(|(_, &p)| p == g).map(|(c, _)| *c);
                    match counter.filter(|_| b % 3 == 1) {
                        Some(c) => {
                            let slot = base + (g % w) as u16;
                            bag.push((r, missing_packet(r, slot, c)));
                        }
                        None => bag.push((r, packet(r, g, w, base, b % 2 == 0, None))),
                    }
                }
            }
            // A rank sends an outstanding position with the other count (a payload where the
            // position's use carries none, or the reverse).
            6 => {
                let outstanding: Vec<u32> = sim.sent.difference(&sim.done).copied().collect();
                if !outstanding.is_empty() {
                    let g = outstanding[usize::from(b) % outstanding.len()];
                    let other = if count_of(g) == 0 { E as u16 } else { 0 };
                    bag.push((r, packet_of_count(r, g, w, base, false, other, None)));
                }
            }
            3 => lose(&mut bag, b),
            _ => {
                let Some((rank, pkt)) = deliver_one(&mut bag, b) else {
                    continue;
                };
                let expected = model.process(&pkt, u64::from(endpoint(rank).port));
                let verdict = pipe.process(
                    PortId(10 + u16::from(rank)),
                    &pkt,
                    ina_proto::Instant::ZERO,
                    &mut out,
                );
                let got = match verdict {
                    Verdict::Drop(DropReason::StaleSeq) => Sent::Dropped(Event::StaleSeq),
                    Verdict::Drop(DropReason::Duplicate) => Sent::Dropped(Event::Duplicate),
                    Verdict::Drop(other) => panic!("unexpected drop {other:?}"),
                    Verdict::Absorbed if pkt[0] & 0x0f == 8 => {
                        Sent::Dropped(Event::MissingUnmatched)
                    }
                    Verdict::Absorbed => Sent::Absorbed,
                    Verdict::Unicast { port, len } => {
                        assert_eq!(port, PortId(10 + u16::from(rank)));
                        Sent::Unicast(To::Sender, out[..len].to_vec())
                    }
                    Verdict::Multicast { len, .. } => Sent::Multicast(out[..len].to_vec()),
                };
                assert_eq!(got, expected, "packet {:?}", &pkt[..16]);
                let last = model.last.take().expect("a reply action");
                // The report: the Data's header as a Missing of the counters skipped.
                let report = pipe.poll_report();
                let want = last.report.map(|r| report_header(&pkt, r));
                assert_eq!(
                    report.map(|r| r.header.to_vec()),
                    want,
                    "report of packet {:?}",
                    &pkt[..16]
                );
                if let Sent::Multicast(a) = &got {
                    if a[1] & 2 != 0 {
                        let g = u32::from_be_bytes([a[12], a[13], a[14], a[15]]);
                        stamped.insert(a[1] >> 2, g);
                        kinds.insert(format!(
                            "multicast count {} with a gap counter",
                            u16::from_be_bytes([a[10], a[11]])
                        ));
                    }
                }
                if pkt[0] & 0x0f == 8 {
                    kinds.insert(match &got {
                        Sent::Dropped(_) => "missing unmatched".to_string(),
                        _ => "missing answered".to_string(),
                    });
                }
                if let Some((_, skipped)) = last.report {
                    kinds.insert(format!("missing skipped {skipped}"));
                }
                check_frames(
                    &program,
                    &mut sw,
                    &mut frames,
                    (&endpoint(rank), &UPPER),
                    &pkt,
                    workers,
                    &last,
                );
                kinds.insert(match &got {
                    Sent::Dropped(e) => e.name().to_string(),
                    Sent::Absorbed => "absorbed".to_string(),
                    Sent::Unicast(_, a) | Sent::Multicast(a) => format!(
                        "{} type {} count {}",
                        if matches!(got, Sent::Unicast(..)) {
                            "unicast"
                        } else {
                            "multicast"
                        },
                        a[0] & 0x0f,
                        u16::from_be_bytes([a[10], a[11]])
                    ),
                });
                // Answers reach the workers (results of outstanding positions complete them).
                deliver(&mut sims, &got, Some(rank), b);
                // The registers agree (the Rust model's count has no twin here).
                let regs = pipe.registers();
                registers_agree(regs, &model, base, w);
                for (cell, &v) in model.reg_gap.iter().enumerate() {
                    // The model's cell: the counter plus 64 (0: none yet).
                    let want = if v == 0 { 0 } else { 64 + (v >> 10) };
                    match regs.gaps().get(cell) {
                        Some(&c) => assert_eq!(c, want, "gap cell {cell}"),
                        None => assert_eq!(v, 0, "gap cell {cell} beyond the pool"),
                    }
                }
            }
        }
    }
    kinds
}

// ---- A rack switch under an upper switch (PROTOCOL.md §9) ----

/// The upper job's epoch and this switch's rank there; the upper switch's address.
const UP_EPOCH: u16 = 21;
const UP_RANK: u8 = 1;
const UPPER: UpperEnv = UpperEnv {
    at: Endpoint {
        port: 40,
        mac: MacAddr([0x02, 0, 0, 0, 2, 1]),
        ip: [198, 18, 2, 1],
        udp_port: 6000,
    },
    epoch: UP_EPOCH,
    rank: UP_RANK,
};
/// The pipeline ports of the Rust rack switch's upper switch, and of the upper switch's two
/// racks: the other one (rank 0 there) and this one.
const UP_PORT: PortId = PortId(9);
const OTHER_RACK: PortId = PortId(200);
const THIS_RACK: PortId = PortId(201);

/// Where a packet in the simulated network goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    /// From a rank of this rack to the rack switch.
    FromRank(u8),
    /// From the upper switch to the rack switch.
    FromUpper,
    /// From the rack switch to the upper switch.
    ToUpper,
}

/// A tree's execution: this rack switch (the program's tables, and the Rust pipeline with the
/// same job under an upper switch) with `workers` ranks, and a Rust upper switch whose job
/// has two racks, this one and another whose partials it sends itself. Every hop loses,
/// duplicates and reorders; the rack switch's answers must agree packet for packet, and its
/// registers after each. Missing reports on if `reports`; with `block`, the job's slots are a
/// whole block, whose ranks' Data carry gap counters and whose results (the totals) take them
/// (the Rust rack switch's partials then carry theirs too, which the Tofino program's do not:
/// they are compared without, and the upper switch, which keeps no gap cells, ignores them).
fn run_tree_execution(
    workers: u8,
    w: u32,
    steps: &[(u8, u16, u16)],
    reports: bool,
    block: bool,
    same_epoch: bool,
) -> std::collections::BTreeSet<String> {
    let mut kinds = std::collections::BTreeSet::new();
    let program = tna::program();
    let tables = Tables::new(&program);
    let check = table_entries(&program, "ina_check");
    let block = block && reports;
    let (base, slot_count) = job_slots(w, block);
    // The upper job's epoch: another than the job's, or the same.
    let upper_env = UpperEnv {
        epoch: if same_epoch { EPOCH } else { UP_EPOCH },
        ..UPPER
    };
    let up_epoch = upper_env.epoch;
    let env = CheckEnv {
        workers: u64::from(workers),
        base,
        slots: slot_count,
        reports,
        uplink: Some(upper_env),
    };
    let config = PipelineConfig {
        pool_slots: POOL,
        max_elems: E as u16,
    };
    let mut rack = Pipeline::new(config);
    rack.set_gap_reports(reports);
    rack.add_job(JobConfig {
        job: JOB,
        epoch: EPOCH,
        slot_base: base,
        slot_count,
        elems_per_packet: E as u16,
        ranks: (0..workers).map(|r| PortId(10 + u16::from(r))).collect(),
        uplink: Some(ina_proto::pipeline::Uplink {
            port: UP_PORT,
            job: JOB,
            epoch: up_epoch,
            rank: UP_RANK,
            slot_base: base,
        }),
    })
    .expect("rack job");
    let mut upper = Pipeline::new(config);
    // (With gap cells, its totals carry gap counters.)
    upper.set_gap_reports(block);
    upper
        .add_job(JobConfig {
            job: JOB,
            epoch: up_epoch,
            slot_base: base,
            slot_count,
            elems_per_packet: E as u16,
            ranks: vec![OTHER_RACK, THIS_RACK],
            uplink: None,
        })
        .expect("upper job");
    let mut model = TnaModel::new(
        &tables,
        workers,
        (reports, block),
        Some(UplinkModel {
            rank: UP_RANK,
            epoch: up_epoch,
        }),
    );
    let mut sims: Vec<SimWorker> = (0..workers)
        .map(|_| SimWorker {
            next: w,
            ..SimWorker::default()
        })
        .collect();
    // The other rack: the positions it sent, and the totals the upper switch multicast.
    let (mut other_sent, mut totals) = (
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
    );
    let mut bag: Vec<(Hop, Vec<u8>)> = Vec::new();
    let mut out = vec![0u8; 16 + 4 * E];
    // The frame model of the same rack switch, for the frames the program's actions write.
    let mut sw = frame_switch_under(workers, (base, slot_count), reports, Some(upper_env));
    let mut frames = Outputs::new();
    // The position of the latest stamped total that carried each gap counter.
    let mut stamped: BTreeMap<u8, u32> = BTreeMap::new();
    for &(what, a, b) in steps {
        let r = (a % u16::from(workers)) as u8;
        let sim = &mut sims[usize::from(r)];
        match what % 8 {
            0 | 1 => {
                if let Some(p) = sim.next_position(r, w, base, block) {
                    bag.push((Hop::FromRank(r), p));
                }
            }
            2 => {
                let outstanding: Vec<u32> = sim.sent.difference(&sim.done).copied().collect();
                if !outstanding.is_empty() {
                    let g = outstanding[usize::from(b) % outstanding.len()];
                    // Sometimes the Missing of the counter a stamped total of `g` carried.
                    let counter = stamped.iter().find(|(_, &p)| p == g).map(|(c, _)| *c);
                    let p = match counter.filter(|_| b % 3 == 1) {
                        Some(c) => missing_packet(r, base + (g % w) as u16, c),
                        None => packet(r, g, w, base, b % 2 == 0, None),
                    };
                    bag.push((Hop::FromRank(r), p));
                }
            }
            // The other rack's partial of a position some rank here has begun, once the
            // upper switch's total of the position before on its set is out.
            6 => {
                let begun: Vec<u32> = sims
                    .iter()
                    .flat_map(|s| s.sent.iter().copied())
                    .filter(|g| !other_sent.contains(g))
                    .filter(|g| *g < 2 * w || totals.contains(&(g - w)))
                    .collect();
                if let Some(&g) = begun.get(usize::from(b) % begun.len().max(1)) {
                    other_sent.insert(g);
                    let mut p = packet(0, g, w, base, false, None);
                    p[4..6].copy_from_slice(&up_epoch.to_be_bytes());
                    let verdict = upper.process(OTHER_RACK, &p, ina_proto::Instant::ZERO, &mut out);
                    if let Verdict::Multicast { len, .. } = verdict {
                        totals.insert(g);
                        bag.push((Hop::FromUpper, out[..len].to_vec()));
                    }
                }
            }
            3 => lose(&mut bag, b),
            _ => {
                let Some((hop, pkt)) = deliver_one(&mut bag, b) else {
                    continue;
                };
                if hop == Hop::ToUpper {
                    match upper.process(THIS_RACK, &pkt, ina_proto::Instant::ZERO, &mut out) {
                        Verdict::Unicast { port, len } => {
                            assert_eq!(port, THIS_RACK);
                            bag.push((Hop::FromUpper, out[..len].to_vec()));
                        }
                        Verdict::Multicast { len, .. } => {
                            let a = &out[..len];
                            totals.insert(u32::from_be_bytes([a[12], a[13], a[14], a[15]]));
                            bag.push((Hop::FromUpper, a.to_vec()));
                        }
                        _ => {}
                    }
                    // The upper switch's report of partials lost on the way up (their gap
                    // counters), in its copies.
                    if let Some(r) = upper.poll_report() {
                        assert_eq!(r.port, THIS_RACK);
                        for _ in 0..r.copies {
                            bag.push((Hop::FromUpper, r.header.to_vec()));
                        }
                    }
                    continue;
                }
                let (expected, port) = match hop {
                    Hop::FromRank(rank) => (
                        model.process(&pkt, u64::from(endpoint(rank).port)),
                        PortId(10 + u16::from(rank)),
                    ),
                    _ => (model.upper_packet(&env, &check, &pkt), UP_PORT),
                };
                let verdict = rack.process(port, &pkt, ina_proto::Instant::ZERO, &mut out);
                let got = match verdict {
                    Verdict::Drop(DropReason::StaleSeq) => Sent::Dropped(Event::StaleSeq),
                    Verdict::Drop(DropReason::Duplicate) => Sent::Dropped(Event::Duplicate),
                    // The upper switch's other answers: nothing to do.
                    Verdict::Drop(_) | Verdict::Absorbed if hop == Hop::FromUpper => {
                        Sent::Dropped(Event::UpperAnswer)
                    }
                    Verdict::Drop(other) => panic!("unexpected drop {other:?}"),
                    Verdict::Absorbed => Sent::Absorbed,
                    Verdict::Unicast { port: to, len } => {
                        let to = if to == UP_PORT {
                            To::Up
                        } else if to == port {
                            To::Sender
                        } else {
                            assert_eq!(to, PortId(10), "a unicast to rank 0's port");
                            To::Rank0
                        };
                        Sent::Unicast(to, out[..len].to_vec())
                    }
                    Verdict::Multicast { len, .. } => Sent::Multicast(out[..len].to_vec()),
                };
                assert_eq!(got, expected, "{hop:?} packet {:?}", &pkt[..16]);
                let from = match hop {
                    Hop::FromRank(rank) => endpoint(rank),
                    _ => UPPER.at,
                };
                let last = model.last.take();
                if hop == Hop::FromUpper && last.as_ref().is_some_and(|l| l.requery.is_some()) {
                    // (The upper job's epoch the job's own: stage 1 of the first pass took the
                    // upper switch's Missing for a rank's.)
                    kinds.insert("FromUpper missing taken for a rank's".to_string());
                }
                // A rank's report of lost data: the Data's header as a Missing of the
                // counters skipped.
                // A rank's report of lost data; or this switch's of lost totals, to the upper
                // switch as its rank there (PROTOCOL.md §9).
                let want = last.as_ref().and_then(|l| l.report).map(|r| {
                    let mut h = report_header(&pkt, r);
                    if hop == Hop::FromUpper {
                        h[4..6].copy_from_slice(&up_epoch.to_be_bytes());
                        h[6] = UP_RANK;
                    }
                    h
                });
                let report = rack.poll_report();
                assert_eq!(report.as_ref().map(|r| r.header.to_vec()), want);
                if let Some(r) = report.filter(|_| hop == Hop::FromUpper) {
                    assert_eq!((r.port, r.copies), (UP_PORT, 1));
                    kinds.insert("FromUpper missing up".to_string());
                    bag.push((Hop::ToUpper, r.header.to_vec()));
                }
                if let Sent::Multicast(a) = &got {
                    if a[1] & 2 != 0 {
                        stamped.insert(a[1] >> 2, u32::from_be_bytes([a[12], a[13], a[14], a[15]]));
                        kinds.insert(format!("{hop:?} multicast with a gap counter"));
                    }
                }
                if pkt[0] & 0x0f == 8 {
                    kinds.insert(format!(
                        "{hop:?} missing {}",
                        matches!(got, Sent::Dropped(_))
                    ));
                }
                if let Sent::Unicast(To::Up, a) = &got {
                    if a[0] & 0x0f == 1 && a[1] & 2 != 0 {
                        kinds.insert(format!("{hop:?} partial with a gap counter"));
                    }
                }
                match last {
                    Some(last) => check_frames(
                        &program,
                        &mut sw,
                        &mut frames,
                        (&from, &upper_env),
                        &pkt,
                        workers,
                        &last,
                    ),
                    None => {
                        // Refused by the check table: nothing leaves.
                        let f = wrap_from(&from, &pkt);
                        sw.process(from.port, &f, ina_proto::Instant::ZERO, &mut frames);
                        assert_eq!(frames.iter().count(), 0, "{hop:?} packet {:?}", &pkt[..16]);
                    }
                }
                kinds.insert(match &got {
                    Sent::Dropped(e) => format!("{hop:?} {}", e.name()),
                    Sent::Absorbed => "absorbed".to_string(),
                    Sent::Unicast(to, a) => format!(
                        "{hop:?} unicast {to:?} type {} count {}",
                        a[0] & 0x0f,
                        u16::from_be_bytes([a[10], a[11]])
                    ),
                    Sent::Multicast(a) => format!(
                        "{hop:?} multicast type {} count {}",
                        a[0] & 0x0f,
                        u16::from_be_bytes([a[10], a[11]])
                    ),
                });
                if let Sent::Unicast(To::Up, a) = &got {
                    bag.push((Hop::ToUpper, a.clone()));
                }
                let sender = match hop {
                    Hop::FromRank(rank) => Some(rank),
                    _ => None,
                };
                deliver(&mut sims, &got, sender, b);
                registers_agree(rack.registers(), &model, base, w);
            }
        }
    }
    kinds
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn a_rack_switch_agrees_with_the_rust_pipeline(
        workers in 1u8..=4,
        w in 1u32..=3,
        steps in proptest::collection::vec((0u8..8, 0u16..64, 0u16..1000), 0..400),
        same_epoch: bool,
    ) {
        run_tree_execution(workers, w, &steps, false, false, false);
        run_tree_execution(workers, w, &steps, true, false, false);
        run_tree_execution(workers, w, &steps, true, true, same_epoch);
    }
}

#[test]
fn rack_executions_reach_every_decision() {
    let mut all = std::collections::BTreeSet::new();
    let mut state = 0x9b05_688c_2b3e_6c1fu64;
    for (workers, w) in [(1, 1), (2, 1), (3, 2), (4, 3), (1, 3), (2, 3)] {
        let steps = fixed_steps(&mut state, 8);
        all.extend(run_tree_execution(workers, w, &steps, false, false, false));
        all.extend(run_tree_execution(workers, w, &steps, true, false, false));
        all.extend(run_tree_execution(workers, w, &steps, true, true, false));
        // The upper job's epoch the job's own: the upper switch's Missing is a rank's Query
        // after stage 1.
        all.extend(run_tree_execution(workers, w, &steps, true, true, true));
    }
    for kind in [
        // The partial up (with and without payload), a status and a fetching Query up.
        "FromRank(0) unicast Up type 1 count 64",
        "FromRank(0) unicast Up type 1 count 0",
        "FromRank(0) unicast Up type 7 count 0",
        "FromUpper unicast Up type 7 count 0",
        // The partial again for the upper switch's Pending without this switch's bit.
        "FromUpper unicast Up type 1 count 64",
        // A Pending to rank 0 (another rack is late), and to a waiting rank.
        "FromUpper unicast Rank0 type 6 count 1",
        "FromRank(1) unicast Sender type 6 count 1",
        // The total, stored and multicast; a copy of it; the stored result to a rank.
        "FromUpper multicast type 2 count 64",
        "FromUpper multicast type 2 count 0",
        "FromUpper duplicate",
        "FromUpper upper_answers",
        "FromRank(1) unicast Sender type 2 count 64",
        // With Missing reports on a whole block: the totals' gap counters, and a rank's Missing
        // of one answered with the stored total.
        "FromUpper multicast with a gap counter",
        "FromRank(1) missing false",
        // A total skipped on the way down, reported up.
        "FromUpper missing up",
        // The upper switch's Missing of a partial: the partial again, and its second copy
        // (or a late one) answered with nothing.
        "FromUpper missing false",
        "FromUpper missing true",
        "FromUpper missing taken for a rank's",
    ] {
        assert!(all.contains(kind), "no {kind} in {all:?}");
    }
    // First partials carry their block's gap counter.
    assert!(
        all.iter()
            .any(|k| k.ends_with("partial with a gap counter")),
        "no stamped partial in {all:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn decision_tables_agree_with_the_rust_pipeline(
        workers in 1u8..=4,
        w in 1u32..=3,
        steps in proptest::collection::vec((0u8..7, 0u16..64, 0u16..1000), 0..400),
    ) {
        run_execution(workers, w, &steps, false);
        run_execution(workers, w, &steps, true);
    }
}

/// 4000 steps of an execution from the xorshift generator `state`, of `kinds` kinds.
fn fixed_steps(state: &mut u64, kinds: u64) -> Vec<(u8, u16, u16)> {
    (0..4000)
        .map(|_| {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            (
                (*state % kinds) as u8,
                (*state >> 8) as u16 % 64,
                (*state >> 24) as u16 % 1000,
            )
        })
        .collect()
}

#[test]
fn executions_reach_every_decision() {
    // A long execution from a fixed pseudo-random sequence, per job shape.
    let mut all = std::collections::BTreeSet::new();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for (workers, w) in [(1, 1), (2, 1), (3, 2), (4, 3), (tna::MAX_WORKERS, 2)] {
        let steps = fixed_steps(&mut state, 7);
        all.extend(run_execution(workers, w, &steps, false));
        all.extend(run_execution(workers, w, &steps, true));
    }
    for kind in [
        "stale_seq",
        "duplicate",
        "absorbed",
        "unicast type 2 count 0",
        "unicast type 2 count 64",
        "unicast type 6 count 1",
        "multicast type 2 count 0",
        "multicast type 2 count 64",
        "unicast type 3 count 0",
        "missing skipped 1",
        "missing skipped 2",
        "multicast count 0 with a gap counter",
        "multicast count 64 with a gap counter",
        "missing answered",
    ] {
        assert!(all.contains(kind), "no {kind} in {all:?}");
    }
}

// ---- The check table (stage 2) against the frame model ----
//
// Random frames, from well-formed `ina` datagrams with one field changed to ordinary traffic
// and ARP: the keys of `ina_check` computed as the parser and stages 0 and 1 compute them, the
// const entries of the generated table looked up, and the result compared with the event of
// `ina_proto::l2::FrameSwitch` for the same frame. An accepted Data or Query must be one the
// frame model runs through the decision tables.

use ina_proto::l2::{Endpoint, FrameJob, FrameSwitch, FrameSwitchConfig, Outputs};

const SM: [u8; 6] = [0x02, 0, 0, 0, 0, 0xaa];
const SIP: [u8; 4] = [198, 18, 0, 1];
const L2: [([u8; 6], u16); 3] = [
    ([0x02, 0, 0, 0, 1, 1], 1),
    ([0x02, 0, 0, 0, 1, 2], 2),
    ([0x02, 0, 0, 0, 1, 3], 3),
];

fn endpoint(rank: u8) -> Endpoint {
    Endpoint {
        port: 1 + u16::from(rank),
        mac: MacAddr([0x02, 0, 0, 0, 1, 1 + rank]),
        ip: [198, 18, 1, 1 + rank],
        udp_port: 5000 + u16::from(rank),
    }
}

/// A frame built from the choices in `c` (each byte picks one variant of one field).
fn frame(c: &[u8; 26]) -> (u16, Vec<u8>) {
    let pick = |i: usize, n: u8| c[i] % n;
    let rank = pick(0, 5);
    let ep = endpoint(rank.min(3));
    let ingress = if pick(1, 8) == 0 { 4 } else { ep.port };
    let dst_mac = match pick(2, 6) {
        0 => [0xff; 6],
        1 => L2[0].0,
        2 => [0x02, 0, 0, 0, 9, 9],
        _ => SM,
    };
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&ep.mac.octets());
    match pick(3, 10) {
        0 | 1 => {
            // ARP.
            f.extend_from_slice(&[0x08, 0x06]);
            f.extend_from_slice(&(if pick(4, 6) == 0 { 2u16 } else { 1 }).to_be_bytes());
            f.extend_from_slice(&[0x08, 0x00, 6, 4]);
            f.extend_from_slice(&(if pick(5, 5) == 0 { 2u16 } else { 1 }).to_be_bytes());
            f.extend_from_slice(&ep.mac.octets());
            f.extend_from_slice(&ep.ip);
            f.extend_from_slice(&[0; 6]);
            f.extend_from_slice(if pick(6, 3) == 0 {
                &[198, 18, 0, 9]
            } else {
                &SIP
            });
        }
        2 => f.extend_from_slice(&[0x86, 0xdd, 1, 2, 3, 4]),
        _ => {
            // IPv4 / UDP / ina.
            let version = [1u8, 1, 1, 1, 2, 0][usize::from(pick(7, 6))];
            let kind = [1u8, 1, 1, 7, 7, 4, 2, 3, 5, 6, 0, 9, 8][usize::from(pick(8, 13))];
            let job = if pick(9, 8) == 0 { JOB + 1 } else { JOB };
            let epoch = if pick(10, 8) == 0 { EPOCH + 1 } else { EPOCH };
            let slot = match pick(11, 8) {
                0 => BASE - 1,
                1 => BASE + 3,
                _ => BASE + u16::from(pick(12, 3)),
            };
            let count: u16 = [0, 0, 64, 64, 1, 4, 256][usize::from(pick(13, 7))];
            let mut udp_len = 24 + 4 * count;
            if pick(14, 8) == 0 {
                udp_len += 4;
            }
            if pick(14, 8) == 1 {
                udp_len -= 4;
            }
            let mut ina = vec![version << 4 | kind, pick(15, 2)];
            ina.extend_from_slice(&job.to_be_bytes());
            ina.extend_from_slice(&epoch.to_be_bytes());
            ina.extend_from_slice(&[rank, [100, 1, 2, 3, 0][usize::from(pick(24, 5))]]);
            ina.extend_from_slice(&slot.to_be_bytes());
            ina.extend_from_slice(&count.to_be_bytes());
            ina.extend_from_slice(&u32::from(c[16]).to_be_bytes());
            ina.resize(usize::from(udp_len) - 8, 0x5a);
            let src_ip = if pick(17, 8) == 0 {
                [198, 18, 9, 9]
            } else {
                ep.ip
            };
            let src_port = if pick(18, 8) == 0 { 9999 } else { ep.udp_port };
            let dst_ip = if pick(19, 6) == 0 {
                [198, 18, 1, 1]
            } else {
                SIP
            };
            let dst_port = if pick(20, 8) == 0 { 53 } else { UDP_PORT_INA };
            let proto = if pick(21, 10) == 0 { 6 } else { 17 };
            let flags: u8 = if pick(22, 10) == 0 { 0x20 } else { 0x40 };
            f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
            f.extend_from_slice(&(20 + udp_len).to_be_bytes());
            f.extend_from_slice(&[0, 0, flags, 0, 64, proto, 0, 0]);
            f.extend_from_slice(&src_ip);
            f.extend_from_slice(&dst_ip);
            f.extend_from_slice(&src_port.to_be_bytes());
            f.extend_from_slice(&dst_port.to_be_bytes());
            f.extend_from_slice(&udp_len.to_be_bytes());
            f.extend_from_slice(&[0, 0]);
            f.extend_from_slice(&ina);
            // A frame cut short inside the 64-element payload the parser extracts (shorter
            // frames the ingress pipeline cannot see: docs/P4-RESOURCES.md).
            if (kind == 1 || kind == 2) && version == 1 && udp_len == 280 && pick(23, 6) == 0 {
                f.truncate(f.len() - 8);
            }
        }
    }
    if f.len() < 60 {
        f.resize(60, 0);
    }
    (ingress, f)
}

const UDP_PORT_INA: u16 = 18766;

fn be16(f: &[u8], at: usize) -> u64 {
    u64::from(u16::from_be_bytes([f[at], f[at + 1]]))
}

fn be32(f: &[u8], at: usize) -> u64 {
    u64::from(u32::from_be_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]]))
}

/// The job `check_key` computes the key for: job `JOB` of epoch `EPOCH`, `workers` ranks at
/// `endpoint(r)`, `slots` slots from `base`, 64 elements, and its upper switch if any.
struct CheckEnv {
    workers: u64,
    base: u16,
    slots: u16,
    reports: bool,
    uplink: Option<UpperEnv>,
}

/// A job's upper switch: where it is, the upper job's epoch, this switch's rank there.
#[derive(Clone, Copy)]
struct UpperEnv {
    at: Endpoint,
    epoch: u16,
    rank: u8,
}

impl CheckEnv {
    /// The random frames' job: 3 ranks on slots `BASE..BASE+3`, its upper switch at
    /// `endpoint(3)` (a frame of rank 3 or 4 comes from there) with epoch `EPOCH + 1`.
    /// The random frames' job: Missing reports on if bit 0 of `v` is set; an upper switch
    /// behind port 4, of the job's own epoch if bit 1 is.
    fn random_of(v: u8) -> CheckEnv {
        let epoch = if v & 2 != 0 {
            EPOCH
        } else {
            RANDOM_UPPER.epoch
        };
        CheckEnv {
            workers: 3,
            base: BASE,
            slots: 3,
            reports: v & 1 == 1,
            uplink: Some(UpperEnv {
                epoch,
                ..RANDOM_UPPER
            }),
        }
    }
}

const RANDOM_UPPER: UpperEnv = UpperEnv {
    at: Endpoint {
        port: 4,
        mac: MacAddr([0x02, 0, 0, 0, 1, 4]),
        ip: [198, 18, 1, 4],
        udp_port: 5003,
    },
    epoch: EPOCH + 1,
    rank: 3,
};

/// The key of `ina_check` for `frame` on `ingress`, as the parser and stages 0 and 1 compute
/// it for the job of `env`.
fn check_key(env: &CheckEnv, ingress: u16, f: &[u8]) -> Vec<u64> {
    let reports = env.reports;
    let sip = u64::from(u32::from_be_bytes(SIP));
    let mut perr = 0u64;
    let ethertype = be16(f, 12);
    let arp_valid = ethertype == 0x0806 && f.len() >= 42;
    let arp_req = u64::from(
        arp_valid
            && be16(f, 14) == 1
            && be16(f, 16) == 0x0800
            && f[18] == 6
            && f[19] == 4
            && be16(f, 20) == 1,
    );
    // arp_target's and ip_target's one entry each: the switch's address.
    let arp_mine = u64::from(arp_req == 1 && be32(f, 38) == sip);
    let ipv4 = ethertype == 0x0800;
    let ip_mine = u64::from(ipv4 && be32(f, 30) == sip);
    let udp = ipv4
        && f[14] & 0x0f == 5
        && f[20] & 0x20 == 0
        && (be16(f, 20) & 0x1fff) == 0
        && f[23] == 17;
    let ina_expected = udp && be16(f, 36) == u64::from(UDP_PORT_INA);
    let mut ina_valid = false;
    let (mut version, mut kind, mut count, mut len_x) = (0, 0, 0, 0);
    let (mut job, mut epoch, mut rank, mut slot) = (0, 0, 0, 0);
    if ina_expected {
        if f.len() < 58 {
            perr = 1;
        } else {
            ina_valid = true;
            version = u64::from(f[42] >> 4);
            kind = u64::from(f[42] & 0x0f);
            job = be16(f, 44);
            epoch = be16(f, 46);
            rank = u64::from(f[48]);
            slot = be16(f, 50);
            count = be16(f, 52);
            let udp_len = be16(f, 38);
            let ulen = (udp_len as u16).wrapping_sub(24);
            len_x = u64::from(ulen ^ ((count as u16) << 2));
            let payload = version == 1 && (kind == 1 || kind == 2) && count == 64 && udp_len == 280;
            if payload && f.len() < 58 + 256 {
                perr = 1;
            }
        }
    }
    let job_hit = ina_valid && job == u64::from(JOB);
    let rank_hit = job_hit && rank < env.workers;
    let from = |ep: &Endpoint| {
        ingress == ep.port
            && be32(f, 26) == u64::from(u32::from_be_bytes(ep.ip))
            && be16(f, 34) == u64::from(ep.udp_port)
    };
    // rank_source's entries: each rank's port and source address, and the upper switch's
    // with this switch's rank there.
    let from_upper = job_hit && env.uplink.is_some_and(|u| from(&u.at));
    let src_ok = (rank_hit && from(&endpoint(rank as u8)))
        || (from_upper && env.uplink.is_some_and(|u| rank == u64::from(u.rank)));
    // uplink_frame's two entries: the upper switch's frames, with the upper job's epoch (3)
    // or another (1).
    let from_up = match env.uplink {
        Some(u) if from_upper => {
            if epoch == u64::from(u.epoch) {
                3
            } else {
                1
            }
        }
        _ => 0,
    };
    let epoch_x = epoch ^ u64::from(EPOCH);
    let slot_off = (slot as u16).wrapping_sub(env.base);
    // 16-bit arithmetic, as stage 1's: the sign of slot_off - slot_count, and slot_off's top
    // three bits.
    let room = u64::from(slot_off.wrapping_sub(env.slots) >> 15);
    let off_top = u64::from(slot_off >> 13);
    let count_x = count ^ 64;
    let dst_mac: [u8; 6] = f[..6].try_into().expect("six bytes");
    let (l2_kind, l2_port) = if dst_mac == [0xff; 6] {
        (2, 0)
    } else {
        L2.iter()
            .find(|(m, _)| *m == dst_mac)
            .map_or((0, 0), |(_, p)| (1, *p))
    };
    let l2_port_x = u64::from(l2_port ^ ingress);
    // In the order of CHECK_KEYS.
    vec![
        0,
        arp_req,
        u64::from(arp_valid),
        arp_mine,
        u64::from(ipv4),
        ip_mine,
        u64::from(ina_expected),
        perr,
        u64::from(ina_valid),
        version,
        kind,
        len_x,
        u64::from(job_hit),
        u64::from(rank_hit),
        u64::from(src_ok),
        if job_hit { epoch_x } else { 0 },
        if job_hit { room } else { 0 },
        if job_hit { off_top } else { 0 },
        count,
        if job_hit { count_x } else { 0 },
        l2_kind,
        l2_port_x,
        if ina_valid { u64::from(f[49]) } else { 0 },
        u64::from(reports),
        from_up,
    ]
}

/// The frame model of the random frames' switch, for each [`CheckEnv::random_of`] (`c[25] %
/// 4`): Missing reports off and on (its job keeps no whole block), under an upper switch of
/// another epoch than the job's and of the same.
fn frame_switches() -> [FrameSwitch; 4] {
    [0, 1, 2, 3].map(|v: u8| {
        let env = CheckEnv::random_of(v);
        frame_switch_under(3, (BASE, 3), env.reports, env.uplink)
    })
}

/// `ina_check`'s answer for a frame: the matched action and its arguments.
fn check_action(
    check: &[TableEntry],
    env: &CheckEnv,
    ingress: u16,
    f: &[u8],
) -> (String, Vec<u64>) {
    lookup(check, &check_key(env, ingress, f)).map_or(
        (
            "check_drop".to_string(),
            vec![Event::L2Unknown.index() as u64],
        ),
        |e| (e.action.clone(), e.args.clone()),
    )
}

#[test]
fn random_frames_reach_every_check_row() {
    let program = tna::program();
    let check = table_entries(&program, "ina_check");
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut rows = std::collections::BTreeSet::new();
    for _ in 0..200_000 {
        let mut c = [0u8; 26];
        for b in &mut c {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *b = (state >> 32) as u8;
        }
        let (ingress, f) = frame(&c);
        let key = check_key(&CheckEnv::random_of(c[25]), ingress, &f);
        if let Some(i) = check
            .iter()
            .position(|e| e.keys.iter().zip(&key).all(|((v, m), k)| k & m == v & m))
        {
            rows.insert(i);
        }
    }
    // Every row but the second passes' is reached by some frame.
    let missed: Vec<_> = (0..check.len())
        .filter(|&i| check[i].keys[0].0 != 1 && !rows.contains(&i))
        .collect();
    assert!(missed.is_empty(), "rows never matched: {missed:?}");
}

proptest! {
    #[test]
    fn check_table_agrees_with_the_frame_model(choices in proptest::collection::vec(any::<[u8; 26]>(), 1..40)) {
        let program = tna::program();
        let check = table_entries(&program, "ina_check");
        let mut sws = frame_switches();
        let mut out = Outputs::new();
        for c in &choices {
            let (ingress, f) = frame(c);
            let sw = &mut sws[usize::from(c[25] % 4)];
            let event = sw.process(ingress, &f, ina_proto::Instant::ZERO, &mut out);
            let (action, args) = check_action(&check, &CheckEnv::random_of(c[25]), ingress, &f);
            let decided = [
                Event::DataFirst,
                Event::DataAdded,
                Event::ResultUnicast,
                Event::PendingSent,
                Event::StaleSeq,
                Event::Duplicate,
            ];
            match action.as_str() {
                "check_drop" => prop_assert_eq!(event.index() as u64, args[0], "frame {:02x?}", f),
                "check_reject" => prop_assert_eq!(event.index() as u64, args[1], "frame {:02x?}", f),
                "check_arp" => prop_assert_eq!(event, Event::ArpReplied),
                "check_probe" => prop_assert_eq!(event, Event::ProbeAnswered),
                "check_l2_port" | "check_l2_flood" => prop_assert_eq!(event, Event::L2Forwarded),
                "check_data" | "check_query" => {
                    prop_assert!(decided.contains(&event), "{:?} for an accepted packet", event)
                }
                // The upper switch's total, Pending or Reject (PROTOCOL.md §9).
                "check_upper" => prop_assert!(
                    [Event::TotalReceived, Event::UpperAnswer, Event::Duplicate, Event::StaleSeq]
                        .contains(&event),
                    "{:?} for the upper switch's packet", event
                ),
                a => prop_assert!(false, "action {}", a),
            }
        }
    }
}

// ---- The frames the program sends, against the frame model ----
//
// For every frame whose answer does not depend on the aggregation registers (ARP, Probe,
// Reject, ordinary traffic, drops), the generated program is interpreted: its parser (as
// `check_key` mirrors it), the reply table's action (its statements read from the generated
// text and executed in order), the egress (flood pruning, checksum) and its deparser (the
// header declarations read from the text). The frames and ports must be those
// `ina_proto::l2::FrameSwitch` sends, up to the end of the IPv4 packet (the program keeps the
// bytes it did not parse behind the headers; docs/P4-RESOURCES.md).

/// A parsed packet: each header instance's validity and fields, and the bytes not parsed.
struct Pkt {
    layouts: Vec<(String, Vec<(String, u32)>)>,
    valid: BTreeMap<String, bool>,
    fields: BTreeMap<String, u64>,
    rest: Vec<u8>,
}

/// The header instances of `headers_t` with their fields and widths, from the program text.
fn layouts(p: &str) -> Vec<(String, Vec<(String, u32)>)> {
    let block = |start: &str| -> Vec<(String, String)> {
        let body = &p[p.find(start).unwrap_or_else(|| panic!("{start}")) + start.len()..];
        body[..body.find("\n}").expect("end")]
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("//"))
            .map(|l| {
                let (t, n) = l.trim_end_matches(';').rsplit_once(' ').expect("field");
                (t.to_string(), n.to_string())
            })
            .collect()
    };
    block("struct headers_t {")
        .into_iter()
        .map(|(ty, inst)| {
            let fields = block(&format!("header {ty} {{"))
                .into_iter()
                .map(|(t, n)| {
                    let w = match t.as_str() {
                        "PortId_t" => 9,
                        t => t
                            .trim_start_matches("bit<")
                            .trim_end_matches('>')
                            .parse()
                            .expect("width"),
                    };
                    (n, w)
                })
                .collect();
            (inst, fields)
        })
        .collect()
}

fn read_bits(bytes: &[u8], bit: usize, width: u32) -> u64 {
    (0..width as usize).fold(0u64, |v, i| {
        let b = bit + i;
        v << 1 | u64::from(bytes[b / 8] >> (7 - b % 8) & 1)
    })
}

impl Pkt {
    /// Extracts `inst` at `*at` if the frame holds it.
    fn extract(&mut self, f: &[u8], at: &mut usize, inst: &str) -> bool {
        let fields = self
            .layouts
            .iter()
            .find(|(i, _)| i == inst)
            .map(|(_, f)| f.clone())
            .expect("instance");
        let len: u32 = fields.iter().map(|(_, w)| w).sum();
        let len = len as usize / 8;
        if f.len() < *at + len {
            return false;
        }
        let mut bit = *at * 8;
        for (name, w) in fields {
            self.fields
                .insert(format!("hdr.{inst}.{name}"), read_bits(f, bit, w));
            bit += w as usize;
        }
        self.valid.insert(inst.to_string(), true);
        *at += len;
        true
    }

    /// The program's parser on a frame from a front port.
    fn parse(p: &str, f: &[u8]) -> Pkt {
        Pkt::parse_pass(p, f, false)
    }

    /// The program's parser; `second`: on the second pass of a result (from the recirculation
    /// port, the bridged header taken off already).
    fn parse_pass(p: &str, f: &[u8], second: bool) -> Pkt {
        let mut pkt = Pkt {
            layouts: layouts(p),
            valid: BTreeMap::new(),
            fields: BTreeMap::new(),
            rest: Vec::new(),
        };
        let mut at = 0;
        let get = |pkt: &Pkt, k: &str| pkt.fields.get(k).copied().unwrap_or(0);
        if second {
            for h in ["ethernet", "ipv4", "udp", "ina"] {
                assert!(pkt.extract(f, &mut at, h), "second pass: no {h}");
            }
            if get(&pkt, "hdr.ina.count") == u64::from(tna::ELEMS) {
                assert!(
                    pkt.extract(f, &mut at, "payload"),
                    "second pass: no payload"
                );
            }
        } else if pkt.extract(f, &mut at, "ethernet") {
            match get(&pkt, "hdr.ethernet.ether_type") {
                0x0806 => {
                    pkt.extract(f, &mut at, "arp");
                }
                0x0800 if pkt.extract(f, &mut at, "ipv4") => {
                    let udp = get(&pkt, "hdr.ipv4.ihl") == 5
                        && get(&pkt, "hdr.ipv4.flags") & 1 == 0
                        && get(&pkt, "hdr.ipv4.frag_offset") == 0
                        && get(&pkt, "hdr.ipv4.protocol") == 17;
                    if udp
                        && pkt.extract(f, &mut at, "udp")
                        && get(&pkt, "hdr.udp.dst_port") == u64::from(UDP_PORT_INA)
                        && pkt.extract(f, &mut at, "ina")
                    {
                        let full = get(&pkt, "hdr.ina.version") == 1
                            && matches!(get(&pkt, "hdr.ina.msg_type"), 1 | 2)
                            && get(&pkt, "hdr.ina.count") == 64
                            && get(&pkt, "hdr.udp.length") == 280;
                        if full {
                            pkt.extract(f, &mut at, "payload");
                        } else if get(&pkt, "hdr.udp.length") == 28 {
                            // One word: an upper switch's Pending has its bitmap.
                            pkt.extract(f, &mut at, "word");
                        }
                    }
                }
                _ => {}
            }
        }
        pkt.rest = f[at.min(f.len())..].to_vec();
        pkt
    }

    fn deparse(&self) -> Vec<u8> {
        let mut bits: Vec<u8> = Vec::new();
        for (inst, fields) in &self.layouts {
            if inst == "bridge" || !self.valid.get(inst).copied().unwrap_or(false) {
                continue;
            }
            for (name, w) in fields {
                let v = self
                    .fields
                    .get(&format!("hdr.{inst}.{name}"))
                    .copied()
                    .unwrap_or(0);
                for i in (0..*w).rev() {
                    bits.push((v >> i & 1) as u8);
                }
            }
        }
        let mut out: Vec<u8> = bits
            .chunks(8)
            .map(|c| c.iter().fold(0u8, |b, x| b << 1 | x))
            .collect();
        out.extend_from_slice(&self.rest);
        out
    }
}

/// Where the frame goes after the reply table: unicast port, multicast group, or dropped.
#[derive(Debug, Default)]
struct Tm {
    ucast: Option<u64>,
    mcast: Option<u64>,
    l2_xid: Option<u64>,
    drop: bool,
    bridge_op: u64,
}

/// Executes action `name` of the generated text on `pkt`, with metadata `md`.
fn run_action(p: &str, name: &str, pkt: &mut Pkt, md: &BTreeMap<&str, u64>, ingress: u64) -> Tm {
    let start = p
        .find(&format!("    action {name}("))
        .unwrap_or_else(|| panic!("action {name}"));
    let body = &p[start..];
    let body = &body[body.find('{').expect("body") + 1..body.find("\n    }").expect("end")];
    let mut tm = Tm::default();
    let consts: BTreeMap<&str, u64> = [
        ("IP_PROTO_UDP", 17),
        ("INA_VERSION", u64::from(ina_wire::PROTOCOL_VERSION)),
        ("INA_UDP_PORT", u64::from(UDP_PORT_INA)),
        ("INA_DATA", 1),
        ("INA_RESULT", 2),
        ("INA_REJECT", 3),
        ("INA_PROBE_REPLY", 5),
        ("INA_PENDING", 6),
        ("INA_QUERY", 7),
        ("INA_MISSING", 8),
        ("GAP_STEP", 1 << 10),
    ]
    .into_iter()
    .collect();
    for stmt in body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
    {
        let stmt = stmt.trim_end_matches(';');
        if let Some(h) = stmt.strip_suffix(".setValid()") {
            pkt.valid
                .insert(h.trim_start_matches("hdr.").to_string(), true);
            continue;
        }
        if let Some(h) = stmt.strip_suffix(".setInvalid()") {
            pkt.valid
                .insert(h.trim_start_matches("hdr.").to_string(), false);
            continue;
        }
        let (lhs, rhs) = stmt
            .split_once(" = ")
            .unwrap_or_else(|| panic!("statement {stmt}"));
        // An identity hash of one field is that field.
        let rhs = rhs
            .split_once(".get({")
            .and_then(|(_, r)| r.strip_suffix("})"))
            .filter(|r| !r.contains(','))
            .unwrap_or(rhs);
        // A cast to a width changes no value here: widths are the fields'.
        let rhs = rhs
            .strip_prefix("(bit<")
            .and_then(|r| r.split_once(">)"))
            .map_or(rhs, |(_, r)| r);
        // The one hash of several fields: the record of a use, 1 << 14 | 2 * slot + set.
        let rec_hash = "use_rec_of.get({2w1, hdr.ina.slot[12:0], hdr.ina.set})";
        let field = |k: &str| pkt.fields.get(k).copied().unwrap_or(0);
        let value = if rhs == rec_hash {
            1 << 14 | (field("hdr.ina.slot") & 0x1fff) << 1 | field("hdr.ina.set")
        } else if let Some((a, c)) = rhs
            .split_once(" + ")
            .filter(|(_, c)| consts.contains_key(c))
        {
            field(a) + consts[c]
        } else if let Some(f) = rhs.strip_prefix("md.") {
            let (f, slice) = f.split_once('[').map_or((f, None), |(f, s)| (f, Some(s)));
            // An action parameter or a field an earlier action wrote.
            let v = md
                .get(f)
                .copied()
                .or_else(|| pkt.fields.get(&format!("md.{f}")).copied())
                .unwrap_or_else(|| panic!("md.{f}"));
            match slice.and_then(|s| s.trim_end_matches(']').split_once(':')) {
                Some((hi, lo)) => {
                    let (hi, lo): (u32, u32) = (hi.parse().expect("hi"), lo.parse().expect("lo"));
                    v >> lo & ((1u64 << (hi - lo + 1)) - 1)
                }
                None => v,
            }
        } else if rhs == "ig_intr_md.ingress_port[8:7] ++ RECIRC_PORT_IN_PIPE" {
            ingress >> 7 << 7 | 68
        } else if rhs.starts_with("hdr.") {
            pkt.fields.get(rhs).copied().unwrap_or(0)
        } else if rhs == "ig_intr_md.ingress_port" {
            ingress
        } else if let Some(c) = consts.get(rhs) {
            *c
        } else if let Some(v) = md.get(rhs) {
            // An action parameter.
            *v
        } else {
            parse_number(rhs)
        };
        match lhs {
            "ig_tm_md.ucast_egress_port" => tm.ucast = Some(value),
            "ig_tm_md.mcast_grp_a" => tm.mcast = Some(value),
            "ig_tm_md.level2_exclusion_id" => tm.l2_xid = Some(value),
            "ig_tm_md.bypass_egress" => {}
            "ig_dprsr_md.drop_ctl" => tm.drop = value == 1,
            "hdr.bridge.op" => {
                tm.bridge_op = value;
                pkt.fields.insert(lhs.to_string(), value);
            }
            l => {
                pkt.fields.insert(l.to_string(), value);
            }
        }
    }
    tm
}

/// The names of the parameters of action `name`, in order.
fn action_params(p: &str, name: &str) -> Vec<&'static str> {
    let start = p
        .find(&format!("    action {name}("))
        .unwrap_or_else(|| panic!("action {name}"));
    let list = &p[start + name.len() + 12..];
    let list = &list[..list.find(')').expect("parameters")];
    list.split(',')
        .filter_map(|param| param.split_whitespace().last())
        .map(|n| &*Box::leak(n.to_string().into_boxed_str()))
        .collect()
}

fn ipv4_checksum(pkt: &mut Pkt) {
    let mut header = Pkt {
        layouts: pkt
            .layouts
            .iter()
            .filter(|(i, _)| i == "ipv4")
            .cloned()
            .collect(),
        valid: [("ipv4".to_string(), true)].into_iter().collect(),
        fields: pkt.fields.clone(),
        rest: Vec::new(),
    };
    header.fields.insert("hdr.ipv4.hdr_checksum".into(), 0);
    let bytes = header.deparse();
    let sum = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum::<u32>();
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    pkt.fields
        .insert("hdr.ipv4.hdr_checksum".into(), u64::from(!sum as u16));
}

const FLOOD_MGRP: u64 = 100;

/// The action data of the entries with the switch's addresses (`arp_target`'s,
/// `switch_source`'s default).
fn source_params() -> BTreeMap<&'static str, u64> {
    [
        (
            "mac",
            u64::from_be_bytes([0, 0, SM[0], SM[1], SM[2], SM[3], SM[4], SM[5]]),
        ),
        ("ip", u64::from(u32::from_be_bytes(SIP))),
    ]
    .into_iter()
    .collect()
}

proptest! {
    #[test]
    fn replies_are_the_frame_models(choices in proptest::collection::vec(any::<[u8; 26]>(), 1..30)) {
        let program = tna::program();
        let check = table_entries(&program, "ina_check");
        let reply = table_entries(&program, "ina_reply");
        let mut sws = frame_switches();
        let mut out = Outputs::new();
        for c in &choices {
            let (ingress, f) = frame(c);
            let sw = &mut sws[usize::from(c[25] % 4)];
            let event = sw.process(ingress, &f, ina_proto::Instant::ZERO, &mut out);
            let (action, args) = check_action(&check, &CheckEnv::random_of(c[25]), ingress, &f);
            let op = match action.as_str() {
                "check_data" | "check_query" | "check_upper" => continue,
                "check_drop" => 0,
                "check_l2_port" => 1,
                "check_l2_flood" => 2,
                "check_arp" => 3,
                "check_probe" => 4,
                "check_reject" => 5,
                a => panic!("{a}"),
            };
            let mut pkt = Pkt::parse(&program, &f);
            let dst: [u8; 6] = f[..6].try_into().expect("mac");
            let l2_port = L2.iter().find(|(m, _)| *m == dst).map_or(0, |(_, p)| u64::from(*p));
            let md: BTreeMap<&str, u64> = [
                ("job_epoch", u64::from(EPOCH)),
                ("workers", 3),
                ("elems", E as u64),
                ("slot_base", u64::from(BASE)),
                ("slot_count", 3),
                ("reason", args.first().copied().unwrap_or(0)),
                ("l2_port", l2_port),
                ("l2_mgrp", FLOOD_MGRP),
                ("reports", u64::from(c[25] % 2)),
            ]
            .into_iter()
            .collect();
            let name = lookup(&reply, &[op, 0, 0, pkt.fields.get("hdr.ina.count").copied().unwrap_or(0), 0])
                .map_or("drop_frame".to_string(), |e| e.action.clone());
            if op == 3 {
                // Stage 1: arp_target's entry wrote the reply.
                run_action(&program, "arp_for_switch", &mut pkt, &source_params(), u64::from(ingress));
            }
            let tm = run_action(&program, &name, &mut pkt, &md, u64::from(ingress));
            if op == OP_PROBE {
                // Stage 8: the ProbeReply's gap flag.
                run_action(&program, "probe_gap_flag", &mut pkt, &md, u64::from(ingress));
            }
            // Egress: the copies, the flood's pruning, the checksum of the switch's replies.
            let ports: Vec<u64> = if tm.drop {
                Vec::new()
            } else if let Some(g) = tm.mcast {
                prop_assert_eq!(g, FLOOD_MGRP);
                prop_assert_eq!(tm.l2_xid, Some(u64::from(ingress)));
                (1..=4).filter(|p| *p != u64::from(ingress)).collect()
            } else {
                tm.ucast.into_iter().collect()
            };
            if tm.bridge_op == 3 {
                // Egress: the switch's source and the fixed header fields of a reply.
                run_action(&program, "reply_source", &mut pkt, &source_params(), 0);
                ipv4_checksum(&mut pkt);
            }
            let sent = pkt.deparse();
            let expected: Vec<(u16, Vec<u8>)> = out.iter().map(|(p, b)| (p, b.to_vec())).collect();
            prop_assert_eq!(
                ports.iter().map(|p| *p as u16).collect::<Vec<_>>(),
                expected.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
                "ports for {:?} ({})", event, name
            );
            for (_, bytes) in &expected {
                // The frame model's frame; the program's is as long as the frame that came in
                // (or longer, by the headers it added), its IPv4 packet the same.
                let ip_end = if bytes.len() >= 34 && u16::from_be_bytes([bytes[12], bytes[13]]) == 0x0800 {
                    (14 + usize::from(u16::from_be_bytes([bytes[16], bytes[17]]))).min(bytes.len())
                } else {
                    bytes.len()
                };
                prop_assert_eq!(&sent[..ip_end], &bytes[..ip_end], "{:?} ({})", event, name);
            }
        }
    }
}

/// The frame switch of a job of `workers` ranks at `endpoint(r)` on slots `BASE..BASE+w`.
fn frame_switch_of(workers: u8, w: u32, gaps: bool) -> FrameSwitch {
    frame_switch_on(workers, job_slots(w, gaps), gaps)
}

/// The frame switch of a job of `workers` ranks at `endpoint(r)` on `(base, slot_count)`,
/// with Missing reports if `gaps`.
fn frame_switch_on(workers: u8, slots: (u16, u16), gaps: bool) -> FrameSwitch {
    frame_switch_under(workers, slots, gaps, None)
}

/// [`frame_switch_on`] with the job's upper switch, if any (the same job id and slots there).
fn frame_switch_under(
    workers: u8,
    (base, slot_count): (u16, u16),
    gaps: bool,
    upper: Option<UpperEnv>,
) -> FrameSwitch {
    let mut sw = FrameSwitch::new(FrameSwitchConfig {
        mac: MacAddr(SM),
        ip: SIP,
        // (And the upper switch's port, where it is not one of these.)
        ports: (1..=4)
            .chain(upper.map(|u| u.at.port).filter(|p| *p > 4))
            .collect(),
        l2: L2.iter().map(|&(m, p)| (MacAddr(m), p)).collect(),
        pipeline: PipelineConfig {
            pool_slots: POOL,
            max_elems: E as u16,
        },
        gap_reports: gaps,
    })
    .expect("switch");
    sw.add_job(FrameJob {
        job: JOB,
        epoch: EPOCH,
        slot_base: base,
        slot_count,
        elems_per_packet: E as u16,
        ranks: (0..workers).map(endpoint).collect(),
        uplink: upper.map(|u| ina_proto::l2::FrameUplink {
            switch: u.at,
            job: JOB,
            epoch: u.epoch,
            slot_base: base,
            rank: u.rank,
        }),
    })
    .expect("job");
    sw
}

/// The frame `ep` sends with `ina` as its UDP payload.
fn wrap_from(ep: &Endpoint, ina: &[u8]) -> Vec<u8> {
    let udp_len = 8 + ina.len() as u16;
    let mut f = Vec::new();
    f.extend_from_slice(&SM);
    f.extend_from_slice(&ep.mac.octets());
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
    f.extend_from_slice(&(20 + udp_len).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&ep.ip);
    f.extend_from_slice(&SIP);
    f.extend_from_slice(&ep.udp_port.to_be_bytes());
    f.extend_from_slice(&UDP_PORT_INA.to_be_bytes());
    f.extend_from_slice(&udp_len.to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(ina);
    if f.len() < 60 {
        f.resize(60, 0);
    }
    f
}

const JOB_MGRP: u64 = 7;

/// Sends the frame of `ina` from `rank` through the frame model and through the program's
/// reply action (`last.action`, with the model's `exp_x`, `pend`, register values and gap
/// counter), its egress (the per-rank rewrite of a multicast copy, a report's Missing, the
/// checksum) and deparser; the frames and ports must agree up to the end of the IPv4 packet.
fn check_frames(
    program: &str,
    sw: &mut FrameSwitch,
    out: &mut Outputs,
    (from, upper): (&Endpoint, &UpperEnv),
    ina: &[u8],
    workers: u8,
    last: &Last,
) {
    let (action, values) = (last.action.as_str(), &last.values);
    let f = wrap_from(from, ina);
    let ingress = from.port;
    sw.process(ingress, &f, ina_proto::Instant::ZERO, out);
    let mut pkt = Pkt::parse(program, &f);
    let mac = |m: [u8; 6]| u64::from_be_bytes([0, 0, m[0], m[1], m[2], m[3], m[4], m[5]]);
    let md: BTreeMap<&str, u64> = [
        ("job_epoch", u64::from(EPOCH)),
        ("mgrp", JOB_MGRP),
        ("exp_x", u64::from(last.exp_x)),
        ("pend", u64::from(last.pend)),
        ("up_port", u64::from(upper.at.port)),
        ("stamp", last.stamp),
        ("reports", 1),
        ("res_gap", u64::from(last.res_gap)),
        ("rec", u64::from(last.requery.map_or(0, |r| r.0))),
        ("rec_seq", u64::from(last.requery.map_or(0, |r| r.1))),
        // The only reason the decision tables refuse with (checks refuse before them).
        ("reason", RejectReason::BadCount as u64),
    ]
    .into_iter()
    .collect();
    if last.requery.is_some() {
        // Stage 1: a rank's Missing becomes its fetching Query.
        run_action(program, "requery", &mut pkt, &md, u64::from(ingress));
    }
    let mut ingress_now = u64::from(ingress);
    if let Some((rec, rec_seq)) = last.up_requery {
        // The upper switch's Missing (PROTOCOL.md §9): to the second pass, whose stage 1
        // makes it the upper switch's Pending for the recorded use.
        let tm = run_action(program, "recirc_missing", &mut pkt, &md, ingress_now);
        assert_eq!(tm.ucast, Some(ingress_now >> 7 << 7 | 68));
        assert_eq!(tm.bridge_op, u64::from(BRIDGE_MISSING_UP));
        pkt = Pkt::parse_pass(program, &pkt.deparse(), true);
        // Stage 0 of the second pass takes the record of a Missing only (a rank's requery on
        // the first pass made it a Query).
        assert_eq!(pkt.fields.get("hdr.ina.msg_type"), Some(&8));
        ingress_now = 68;
        let mut md2 = md.clone();
        md2.insert("rec", u64::from(rec));
        md2.insert("rec_seq", u64::from(rec_seq));
        run_action(program, "up_requery", &mut pkt, &md2, ingress_now);
    }
    // The reply action's arguments, by the names of its parameters.
    let mut md = md;
    md.extend(
        action_params(program, action)
            .into_iter()
            .zip(last.args.iter().copied()),
    );
    // Stage 6 wrote a Pending's word.
    pkt.fields
        .insert("hdr.word.bitmap".into(), u64::from(last.pend));
    if last.payload_for_query {
        // Stage 3 gave the packet a payload to fill.
        run_action(
            program,
            "select_values_for_query",
            &mut pkt,
            &md,
            ingress_now,
        );
    }
    let mut tm = run_action(program, action, &mut pkt, &md, ingress_now);
    let mut sent: Vec<(u16, Vec<u8>)> = Vec::new();
    if let Some((cell, skipped)) = last.report {
        // The mirrored copy, as ingress left the packet, through the report session's two
        // copies and egress's rewrite into the Missing to the rank; a rack switch's report of
        // lost totals (PROTOCOL.md §9) once, to the upper switch, as this switch's rank there.
        let up = ina[0] & 0x0f == 2;
        let ep = if up { &upper.at } else { from };
        let mut copy = Pkt {
            layouts: pkt.layouts.clone(),
            valid: pkt.valid.clone(),
            fields: pkt.fields.clone(),
            rest: pkt.rest.clone(),
        };
        copy.fields
            .insert("hdr.report.cell".into(), u64::from(cell));
        copy.fields
            .insert("hdr.report.skipped".into(), u64::from(skipped));
        // Egress parses the headers up to `ina`; what follows stays behind it, truncated.
        copy.valid.insert("word".into(), false);
        copy.valid.insert("probe".into(), false);
        copy.valid.insert("payload".into(), false);
        let params: BTreeMap<&str, u64> = [
            ("mac", mac(ep.mac.octets())),
            ("ip", u64::from(u32::from_be_bytes(ep.ip))),
            ("udp_port", u64::from(ep.udp_port)),
            ("epoch", u64::from(upper.epoch)),
            ("rank", u64::from(upper.rank)),
        ]
        .into_iter()
        .collect();
        run_action(program, "report_next_counter", &mut copy, &params, 0);
        let address = if up { "up_addr" } else { "report_missing" };
        run_action(program, address, &mut copy, &params, 0);
        run_action(program, "missing_fields", &mut copy, &params, 0);
        run_action(program, "mark_gap_on", &mut copy, &params, 0);
        run_action(program, "reply_source", &mut copy, &source_params(), 0);
        ipv4_checksum(&mut copy);
        let frame = copy.deparse();
        let copies = if up {
            1
        } else {
            ina_proto::pipeline::DATA_REPORT_COPIES
        };
        for _ in 0..copies {
            sent.push((ep.port, frame.clone()));
        }
    }
    if action.contains("_harvest") || action == "store_total" {
        // Out of the pipe's recirculation port, and in again: the second pass parses the Result
        // with its payload, which the value registers fill (high halves on the first pass, low
        // halves on this one), and sends it on.
        assert_eq!(
            tm.ucast,
            Some(u64::from(ingress) >> 7 << 7 | 68),
            "{action}"
        );
        let stamped = match action {
            "multicast_result_harvest" | "send_partial_harvest" => last.args[3] == 1,
            "store_total" => last.args[0] == 1,
            _ => false,
        };
        if stamped {
            // Egress on the way to the second pass stamps the block's counter (a result's, or
            // a partial's: the same action, from its own register).
            run_action(program, "stamp_result_gap", &mut pkt, &md, 0);
            run_action(program, "mark_gap_on", &mut pkt, &md, 0);
        }
        let bridge: Vec<(String, u64)> = pkt
            .fields
            .iter()
            .filter(|(k, _)| k.starts_with("hdr.bridge."))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        pkt = Pkt::parse_pass(program, &pkt.deparse(), true);
        let full = pkt.fields.get("hdr.ina.count") == Some(&u64::from(tna::ELEMS));
        assert_eq!(
            pkt.valid.get("payload").copied().unwrap_or(false),
            full,
            "second pass of {action}"
        );
        pkt.fields.extend(bridge);
        for (k, v) in values.iter().enumerate() {
            pkt.fields
                .insert(format!("hdr.payload.e{k}"), u64::from(*v as u32));
        }
        // To the sender, or up (PROTOCOL.md §9), or to every rank.
        let second = match tm.bridge_op {
            5 => {
                md.insert("op", 3);
                "send_harvest_unicast"
            }
            8 => {
                md.insert("op", 7);
                "send_harvest_unicast"
            }
            _ => "send_harvest_multicast",
        };
        tm = run_action(program, second, &mut pkt, &md, 68);
    }
    if !tm.drop {
        if tm.bridge_op == 4 || tm.bridge_op == 6 || tm.bridge_op == 9 {
            // A multicast result's copy to every rank; a Pending to rank 0 keeps only its own
            // (replication id 0).
            let ranks = if tm.bridge_op == 9 { 1 } else { workers };
            for r in 0..ranks {
                let ep = endpoint(r);
                let mut copy = Pkt {
                    layouts: pkt.layouts.clone(),
                    valid: pkt.valid.clone(),
                    fields: pkt.fields.clone(),
                    rest: pkt.rest.clone(),
                };
                let params: BTreeMap<&str, u64> = [
                    ("mac", mac(ep.mac.octets())),
                    ("ip", u64::from(u32::from_be_bytes(ep.ip))),
                    ("udp_port", u64::from(ep.udp_port)),
                ]
                .into_iter()
                .collect();
                run_action(program, "rewrite_dst", &mut copy, &params, 0);
                run_action(program, "reply_source", &mut copy, &source_params(), 0);
                ipv4_checksum(&mut copy);
                sent.push((ep.port, copy.deparse()));
            }
        } else {
            if tm.bridge_op == 7 {
                // To the upper switch: uplink_addr's entry of the job.
                let u = upper;
                let params: BTreeMap<&str, u64> = [
                    ("mac", mac(u.at.mac.octets())),
                    ("ip", u64::from(u32::from_be_bytes(u.at.ip))),
                    ("udp_port", u64::from(u.at.udp_port)),
                    ("epoch", u64::from(u.epoch)),
                    ("rank", u64::from(u.rank)),
                ]
                .into_iter()
                .collect();
                run_action(program, "up_addr", &mut pkt, &params, 0);
            }
            run_action(program, "reply_source", &mut pkt, &source_params(), 0);
            ipv4_checksum(&mut pkt);
            sent.push((tm.ucast.expect("unicast port") as u16, pkt.deparse()));
        }
    }
    let mut expected: Vec<(u16, Vec<u8>)> = out.iter().map(|(p, b)| (p, b.to_vec())).collect();
    sent.sort();
    expected.sort();
    assert_eq!(
        sent.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        expected.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        "ports of {action}"
    );
    for ((_, got), (_, want)) in sent.iter().zip(&expected) {
        let ip_end = (14 + usize::from(u16::from_be_bytes([want[16], want[17]]))).min(want.len());
        assert_eq!(&got[..ip_end], &want[..ip_end], "frame of {action}");
    }
}
