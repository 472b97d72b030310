//! The Tofino 1 program (TNA) of `ina`'s data plane, generated: [`program`] writes the whole
//! P4-16 text, `switch-p4/tna/ina.p4` is its committed copy, and [`check_job`] is the
//! control-plane check of a job against what the program can do.
//!
//! The program is PROTOCOL.md §6 and §7 written the way Tofino 1 forces it: every register is
//! read and written at most once per pass by one `RegisterAction`, a stage holds at most four
//! stateful ALUs, an ALU returns 32 of its 64 bits, and ingress has twelve stages. Its stage plan
//! (also in docs/P4-RESOURCES.md):
//!
//! | stage | tables | stateful ALUs |
//! |------:|--------|---------------|
//! | 0 | `switch_addr`, `l2_forward`, `ina_job`, `ina_rank`, `rank_bit` | |
//! | 1 | `prep_compare`, `full_mask` | |
//! | 2 | `ina_check`, `seq_access`, `seq_order_access` | `reg_seq`, `reg_seq_order` |
//! | 3 | `bitmap_access`, `exp_access`, `value_select` | `reg_bitmap`, `reg_exp` |
//! | 4 | `value_0..3`, `seen_check`, `prep_done` | `reg_value_0..3` |
//! | 5..11 | `value_4..31`, `prep_last` (5), `ina_outcome` (6), `ina_reply` (7) | `reg_value_4..31` |
//!
//! A result with a payload needs both halves of every value cell and an ALU returns one: the
//! pass that completes a use (or reads a complete one) returns the high halves into the payload
//! and recirculates the packet once through its own pipe's recirculation port; the second pass
//! reads the low halves and sends the result. Everything else takes one pass.

use crate::common;
use crate::writer::P4;
use core::fmt::Write as _;
use ina_proto::event::Event;
use ina_proto::pipeline::JobConfig;
use ina_proto::pipeline::HEADER_USE;
use ina_wire::agg::{MessageType, ProbeInfo, RejectReason, HEADER_LEN};
use ina_wire::PROTOCOL_VERSION;

/// The exponent byte of a Query that wants a complete use's header alone: bit 0 clear
/// ([`ina_wire::QueryAsk::wants_sums`]).
const QUERY_WITHOUT_SUMS: &str = "8w0 &&& 8w1";

/// Elements per packet the program aggregates: 32 value registers of 2x32-bit cells.
pub const ELEMS: u16 = 64;
/// Value registers (`reg_value_0` .. `reg_value_31`), each holding elements `2j` and `2j+1`.
pub const VALUE_REGISTERS: usize = ELEMS as usize / 2;
/// Slots of the pool: the control registers have one cell per slot, the value registers one per
/// `(slot, set)`, 16384 cells of 64 bits (eight SRAM blocks of one stage each).
pub const POOL_SLOTS: u32 = 8192;
/// The recirculation port of every pipe (its low seven bits; the pipe is the top two).
pub const RECIRC_PORT_IN_PIPE: u16 = 68;
/// The first stage of the value registers; stage `VALUE_FIRST_STAGE + j / 4` holds
/// `reg_value_j`.
pub const VALUE_FIRST_STAGE: usize = 4;
/// Ingress stages of Tofino 1.
pub const INGRESS_STAGES: usize = 12;
/// Stateful ALUs per stage on Tofino 1.
pub const ALUS_PER_STAGE: usize = 4;
/// Ranks of a job, at most: a set's 32-bit bitmap holds one bit per rank and, in bit 31, the
/// kind of its use (`KIND_BIT`), one rank fewer than the wire's 32.
pub const MAX_WORKERS: u8 = 31;
/// Bit 31 of a set's `reg_bitmap` and `reg_exp` cells: its use began with a header, no payload
/// (the Rust model keeps the same bit, `HEADER_USE`, in its count register, which this program
/// does not have). An arrival of the other kind to a use that collects changes neither
/// register and is refused with `BadCount`.
const KIND_BIT: u32 = HEADER_USE;

/// The control registers of the program, indexed by slot, which the control plane zeroes for
/// a job's slots when it installs the job. (`reg_seq_order` holds the same sequence numbers as
/// `reg_seq`; the program keeps no `reg_count`, see docs/P4-RESOURCES.md.)
pub const CONTROL_REGISTERS: [&str; 4] = ["reg_seq", "reg_seq_order", "reg_bitmap", "reg_exp"];

/// Why the Tofino program cannot serve a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TnaJobError {
    #[error(
        "{elems} elements per packet: the Tofino program aggregates {ELEMS} per packet (256 \
         would have to be folded over passes through the recirculation port, which would carry \
         about twice the job's traffic; see docs/P4-RESOURCES.md)"
    )]
    ElemsPerPacket { elems: u16 },
    #[error(
        "{workers} workers: a job has 1 to {MAX_WORKERS} ranks on Tofino (bit 31 of the \
         bitmap marks a use begun by a header)"
    )]
    Workers { workers: usize },
    #[error("slots {base}..{end} are not inside the pool of {POOL_SLOTS} slots")]
    SlotRange { base: u16, end: u32 },
    #[error("rank {rank}: port {port} is not a Tofino 1 port number (9 bits)")]
    PortNumber { rank: usize, port: u16 },
    #[error("rank {rank}: port {port} is a recirculation port")]
    RecirculationPort { rank: usize, port: u16 },
    #[error(
        "rank {rank}: port {port} is in pipe {pipe}, rank 0 in pipe {first}: the registers of a \
         job live in one pipe, so all its ranks must sit there"
    )]
    Pipe {
        rank: usize,
        port: u16,
        pipe: u16,
        first: u16,
    },
}

/// Checks that the Tofino program can serve `job`: 64 elements per packet, 1 to 32 ranks, a slot
/// range inside the pool, and every rank on a front port of one pipe (each pipe has its own
/// registers, so a use must be aggregated in one).
pub fn check_job(job: &JobConfig) -> Result<(), TnaJobError> {
    if job.elems_per_packet != ELEMS {
        return Err(TnaJobError::ElemsPerPacket {
            elems: job.elems_per_packet,
        });
    }
    let workers = job.ranks.len();
    if workers == 0 || workers > usize::from(MAX_WORKERS) {
        return Err(TnaJobError::Workers { workers });
    }
    let end = u32::from(job.slot_base) + u32::from(job.slot_count);
    if job.slot_count == 0 || end > POOL_SLOTS {
        return Err(TnaJobError::SlotRange {
            base: job.slot_base,
            end,
        });
    }
    let mut first_pipe = None;
    for (rank, port) in job.ranks.iter().enumerate() {
        let port = port.0;
        if port >= 512 {
            return Err(TnaJobError::PortNumber { rank, port });
        }
        if port & 0x7f == RECIRC_PORT_IN_PIPE {
            return Err(TnaJobError::RecirculationPort { rank, port });
        }
        let pipe = port >> 7;
        match first_pipe {
            None => first_pipe = Some(pipe),
            Some(first) if first != pipe => {
                return Err(TnaJobError::Pipe {
                    rank,
                    port,
                    pipe,
                    first,
                })
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// What the check table decides for a frame (`md.op`).
mod op {
    pub const DROP: u8 = 0;
    pub const L2_PORT: u8 = 1;
    pub const L2_FLOOD: u8 = 2;
    pub const ARP: u8 = 3;
    pub const PROBE: u8 = 4;
    pub const REJECT: u8 = 5;
    pub const DATA: u8 = 6;
    pub const QUERY: u8 = 7;
    pub const HARVEST: u8 = 8;
}

/// What the outcome table decides for an accepted Data or Query (`md.outcome`).
mod out {
    pub const DROP: u8 = 0;
    pub const MCAST: u8 = 1;
    pub const MCAST_HARVEST: u8 = 2;
    pub const RESULT: u8 = 3;
    pub const RESULT_HARVEST: u8 = 4;
    pub const PENDING: u8 = 5;
    pub const REJECT: u8 = 6;
}

/// The bridged header's instruction to egress or to the second pass (`hdr.bridge.op`).
mod bridge {
    pub const PLAIN: u8 = 1;
    pub const FLOOD: u8 = 2;
    pub const REPLY: u8 = 3;
    pub const MCAST: u8 = 4;
    pub const HARVEST_UNICAST: u8 = 5;
    pub const HARVEST_MCAST: u8 = 6;
}

/// What the value registers do in this pass (`md.vop_c` before the bitmap is known, `md.vop`
/// after).
mod vop {
    pub const NONE: u8 = 0;
    pub const WRITE: u8 = 1;
    pub const ADD_IF_UNSEEN: u8 = 2;
    pub const READ_HI: u8 = 3;
    pub const READ_LO: u8 = 4;
    pub const ADD: u8 = 5;
}

/// The 4-bit predicate of a stateful ALU: one bit for each combination of its two conditions,
/// bit `cmplo + 2 * cmphi`.
mod pred {
    /// `reg_seq`: neither newer nor equal (the packet's use is older).
    pub const STALE: &str = "4w0b0001";
    /// `reg_seq`: newer (a new use).
    pub const NEW: &str = "4w0b0010";
    /// `reg_seq`: equal (the current use).
    pub const SAME: &str = "4w0b0100";
    /// `reg_seq_order` for a packet of the set's current use (its cmplo, newer, is false): the
    /// other set holds a newer use.
    pub const OTHER_NEWER: &str = "4w0b0100";
    /// `reg_seq_order` for a packet of the set's current use: the other set holds no newer use.
    pub const OTHER_OLDER: &str = "4w0b0001";
}

/// [`KIND_BIT`] as a P4 literal.
fn kind_bit() -> String {
    format!("32w0x{KIND_BIT:08x}")
}

/// The bits of a bitmap that are ranks (all but [`KIND_BIT`]), as a P4 literal.
fn rank_bits() -> String {
    format!("32w0x{:08x}", !KIND_BIT)
}

fn ev(e: Event) -> String {
    format!("{}", e.index())
}

fn mt(t: MessageType) -> u8 {
    t as u8
}

/// One const entry of a ternary table: key expressions in the table's key order.
struct Entry {
    keys: Vec<String>,
    action: String,
}

/// Writes a table with const entries. `keys` are (expression, match kind).
fn table(
    p: &mut P4,
    name: &str,
    stage: Option<usize>,
    keys: &[(&str, &str)],
    actions: &[&str],
    entries: &[Entry],
    default: &str,
) {
    if let Some(s) = stage {
        let _ = writeln!(p, "    @stage({s})");
    }
    let _ = writeln!(p, "    table {name} {{");
    if !keys.is_empty() {
        let _ = writeln!(p, "        key = {{");
        for (k, kind) in keys {
            let _ = writeln!(p, "            {k} : {kind};");
        }
        let _ = writeln!(p, "        }}");
    }
    let _ = writeln!(p, "        actions = {{");
    for a in actions {
        let _ = writeln!(p, "            {a};");
    }
    if default == "NoAction()" && !actions.contains(&"NoAction") {
        let _ = writeln!(p, "            NoAction;");
    }
    let _ = writeln!(p, "        }}");
    if !entries.is_empty() {
        let _ = writeln!(p, "        const entries = {{");
        for e in entries {
            let _ = writeln!(p, "            ({}) : {};", e.keys.join(", "), e.action);
        }
        let _ = writeln!(p, "        }}");
        let _ = writeln!(p, "        size = {};", entries.len().max(1));
    }
    let _ = writeln!(p, "        const default_action = {default};");
    let _ = writeln!(p, "    }}");
}

/// The key of `ina_check`, `seq_access` and `seq_order_access` (stage 2).
const CHECK_KEYS: [(&str, &str); 24] = [
    ("md.pass2", "ternary"),
    ("md.arp_req", "ternary"),
    ("hdr.arp.isValid()", "ternary"),
    ("md.arp_x", "ternary"),
    ("hdr.ipv4.isValid()", "ternary"),
    ("md.dst_x", "ternary"),
    ("md.ina_expected", "ternary"),
    ("ig_prsr_md.parser_err", "ternary"),
    ("hdr.ina.isValid()", "ternary"),
    ("hdr.ina.version", "ternary"),
    ("hdr.ina.msg_type", "ternary"),
    ("md.len_x", "ternary"),
    ("md.job_hit", "ternary"),
    ("md.rank_hit", "ternary"),
    ("md.port_x", "ternary"),
    ("md.ip_x", "ternary"),
    ("md.udp_x", "ternary"),
    ("md.epoch_x", "ternary"),
    ("md.room[16:16]", "ternary"),
    ("hdr.ina.count", "ternary"),
    ("md.count_x", "ternary"),
    ("md.l2_kind", "ternary"),
    ("md.l2_port_x", "ternary"),
    ("hdr.ina.exponent", "ternary"),
];

/// A key pattern of [`CHECK_KEYS`]: every position `_` but those named.
fn check_pattern(set: &[(&str, String)]) -> Vec<String> {
    CHECK_KEYS
        .iter()
        .map(|(k, _)| {
            set.iter()
                .find(|(name, _)| name == k)
                .map_or_else(|| "_".to_string(), |(_, v)| v.clone())
        })
        .collect()
}

fn kv(k: &'static str, v: impl ToString) -> (&'static str, String) {
    (k, v.to_string())
}

/// Checks 1 (parse) passed on a frame to the switch's address: an `ina` packet of version 1
/// whose UDP length is its header and payload.
fn parsed_ina() -> Vec<(&'static str, String)> {
    vec![
        kv("md.pass2", 0),
        kv("hdr.ipv4.isValid()", "true"),
        kv("md.dst_x", 0),
        kv("md.ina_expected", 1),
        kv("ig_prsr_md.parser_err", 0),
        kv("hdr.ina.isValid()", "true"),
        kv("hdr.ina.version", PROTOCOL_VERSION),
        kv("md.len_x", 0),
    ]
}

/// Checks 1 to 5 passed with message type `t`.
fn authenticated(t: MessageType) -> Vec<(&'static str, String)> {
    let mut v = parsed_ina();
    v.extend([
        kv("hdr.ina.msg_type", mt(t)),
        kv("md.job_hit", 1),
        kv("md.rank_hit", 1),
        kv("md.port_x", 0),
        kv("md.ip_x", 0),
        kv("md.udp_x", 0),
    ]);
    v
}

/// Checks 1 to 8 passed with message type `t` (epoch and slot range).
fn in_range(t: MessageType) -> Vec<(&'static str, String)> {
    let mut v = authenticated(t);
    v.extend([kv("md.epoch_x", 0), kv("md.room[16:16]", 1)]);
    v
}

/// Every check of §6 passed: the patterns of accepted Data and Query packets, with the type.
fn accepted() -> Vec<(MessageType, Vec<(&'static str, String)>)> {
    let mut data_empty = in_range(MessageType::Data);
    data_empty.push(kv("hdr.ina.count", 0));
    let mut data_full = in_range(MessageType::Data);
    data_full.extend([kv("hdr.ina.count", ELEMS), kv("md.count_x", 0)]);
    let mut query = in_range(MessageType::Query);
    query.push(kv("hdr.ina.count", 0));
    vec![
        (MessageType::Data, data_empty),
        (MessageType::Data, data_full),
        (MessageType::Query, query),
    ]
}

fn check_entries() -> Vec<Entry> {
    let mut e = Vec::new();
    let mut push = |set: Vec<(&'static str, String)>, action: String| {
        e.push(Entry {
            keys: check_pattern(&set),
            action,
        })
    };
    let drop = |event: Event| format!("check_drop({})", ev(event));
    let reject =
        |r: RejectReason, event: Event| format!("check_reject({}, {})", r as u8, ev(event));
    push(vec![kv("md.pass2", 1)], "check_harvest()".into());
    push(
        vec![
            kv("md.pass2", 0),
            kv("md.arp_req", 1),
            kv("hdr.arp.isValid()", "true"),
            kv("md.arp_x", 0),
        ],
        "check_arp()".into(),
    );
    for (t, pattern) in accepted() {
        let a = if t == MessageType::Data {
            "check_data()"
        } else {
            "check_query()"
        };
        push(pattern, a.into());
    }
    for t in [MessageType::Data, MessageType::Query] {
        push(in_range(t), reject(RejectReason::BadCount, Event::BadCount));
        let mut slot = authenticated(t);
        slot.push(kv("md.epoch_x", 0));
        push(
            slot,
            reject(RejectReason::SlotOutOfRange, Event::SlotOutOfRange),
        );
        push(
            authenticated(t),
            reject(RejectReason::StaleEpoch, Event::StaleEpoch),
        );
    }
    push(authenticated(MessageType::Probe), "check_probe()".into());
    for t in [MessageType::Data, MessageType::Query, MessageType::Probe] {
        let mut v = parsed_ina();
        v.extend([
            kv("hdr.ina.msg_type", mt(t)),
            kv("md.job_hit", 1),
            kv("md.rank_hit", 1),
        ]);
        push(v, drop(Event::WrongPort));
        let mut v = parsed_ina();
        v.extend([kv("hdr.ina.msg_type", mt(t)), kv("md.job_hit", 1)]);
        push(v, drop(Event::UnknownRank));
        let mut v = parsed_ina();
        v.push(kv("hdr.ina.msg_type", mt(t)));
        push(v, drop(Event::UnknownJob));
    }
    for t in [
        MessageType::Result,
        MessageType::ProbeReply,
        MessageType::Pending,
    ] {
        let mut v = parsed_ina();
        v.push(kv("hdr.ina.msg_type", mt(t)));
        push(v, drop(Event::UnexpectedType));
    }
    // A Reject parses only with a known reason (`wire::AggRepr::parse_header`).
    for reason in [
        RejectReason::StaleEpoch,
        RejectReason::SlotOutOfRange,
        RejectReason::BadCount,
    ] {
        let mut v = parsed_ina();
        v.extend([
            kv("hdr.ina.msg_type", mt(MessageType::Reject)),
            kv("hdr.ina.exponent", reason as u8),
        ]);
        push(v, drop(Event::UnexpectedType));
    }
    let to_switch = |extra: (&'static str, String)| {
        vec![
            kv("md.pass2", 0),
            kv("hdr.ipv4.isValid()", "true"),
            kv("md.dst_x", 0),
            extra,
        ]
    };
    push(to_switch(kv("md.ina_expected", 1)), drop(Event::Malformed));
    push(to_switch(kv("md.ina_expected", 0)), drop(Event::NotIna));
    push(
        vec![
            kv("md.pass2", 0),
            kv("md.l2_kind", 1),
            kv("md.l2_port_x", 0),
        ],
        drop(Event::L2Unknown),
    );
    push(
        vec![kv("md.pass2", 0), kv("md.l2_kind", 1)],
        "check_l2_port()".into(),
    );
    push(
        vec![kv("md.pass2", 0), kv("md.l2_kind", 2)],
        "check_l2_flood()".into(),
    );
    e
}

/// The accepted patterns of [`CHECK_KEYS`] plus the set, with the register action per set.
fn seq_entries(data_action: &str, query_action: &str) -> Vec<Entry> {
    let mut e = Vec::new();
    for (t, pattern) in accepted() {
        for set in 0..2 {
            let mut keys = check_pattern(&pattern);
            keys.push(set.to_string());
            let a = if t == MessageType::Data {
                data_action
            } else {
                query_action
            };
            e.push(Entry {
                keys,
                action: format!("{a}_{set}()"),
            });
        }
    }
    e
}

fn entry(keys: &[&str], action: impl Into<String>) -> Entry {
    Entry {
        keys: keys.iter().map(|k| k.to_string()).collect(),
        action: action.into(),
    }
}

/// Writes the whole program.
pub fn program() -> String {
    let mut p = P4::default();
    header_comment(&mut p);
    constants(&mut p);
    headers(&mut p);
    ingress_parser(&mut p);
    ingress(&mut p);
    ingress_deparser(&mut p);
    egress_parser(&mut p);
    egress(&mut p);
    egress_deparser(&mut p);
    let _ = writeln!(
        p,
        "Pipeline(InaIngressParser(), InaIngress(), InaIngressDeparser(),\n         \
         InaEgressParser(), InaEgress(), InaEgressDeparser()) pipe;\n\nSwitch(pipe) main;"
    );
    p.finish()
}

fn header_comment(p: &mut P4) {
    let _ = writeln!(
        p,
        "\
// ina: the data plane for Tofino 1 (TNA). GENERATED by switch-p4/src/tna.rs; do not edit.
// Regenerate with: INA_BLESS=1 cargo test -p ina-switch-p4 --test tna
//
// PROTOCOL.md section 6 (the switch's checks and decision tables) and section 7 (frames, ARP,
// L2 forwarding, reply addresses), within Tofino 1's limits:
//  - {ELEMS} elements per packet: {VALUE_REGISTERS} value registers reg_value_j of 2x32-bit cells
//    (elements 2j, 2j+1), indexed by 2*slot+set, four per stage in stages {VALUE_FIRST_STAGE}..11.
//  - Each register is accessed at most once per pass, by one RegisterAction of several.
//  - A stateful ALU returns 32 of its 64 bits. The pass that completes a use, or reads a
//    complete one for a retransmission or a Query, returns the high halves (elements 2j+1) into
//    the payload and recirculates the packet once through the recirculation port ({RECIRC_PORT_IN_PIPE}) of
//    its own pipe; the second pass reads the low halves (elements 2j) and sends the result.
//    Results without payload (count 0) and every other packet take one pass.
//  - The registers of a job live in one pipe: the control plane puts all its ranks there.
//  - Control registers, in the order the hardware needs them:
//      stage 2: reg_seq (sequence of each set; new use, same use or stale) and reg_seq_order
//               (the same sequence numbers; says whether the other set holds a newer use);
//      stage 3: reg_bitmap (contributors of each set) and reg_exp (max exponent of each set);
//               bit 31 of both marks a use begun by a header (no payload), whose later
//               arrivals must carry none either: one of the other kind changes neither and is
//               refused with BadCount (the Rust model's HEADER_USE). A job has at most 31 ranks;
//      stage 4 on: the value registers, which add only when the bitmap says the rank is new.
//    The arrivals still missing in a use (the Rust model's count register) are not stored:
//    a stage's four ALUs and twelve stages hold seq, its order copy, bitmap, exp and 32 value
//    registers and no more, and the count follows from the others. While the slot's other set
//    holds no newer use, no worker has moved on from this use, its bitmap lists exactly the
//    contributors, and the use is complete when the bitmap holds every rank below the worker
//    count. Once the other set holds a newer use, a worker has received this use's result, so
//    the use is complete. Both hold for every arrival order of packets of workers that follow
//    the protocol's self-clocking (section 5); see docs/P4-RESOURCES.md.
//  - 256 elements per packet are refused by the control plane (ina_switch_p4::tna::check_job):
//    64 elements fill the twelve stages of a pipe. Folding 256 over four passes through the
//    pipe's recirculation port would be exact (its queue keeps the chunks in order) but would
//    carry 1.9 to 2.7 times the job's ingress traffic through that one port, so a pipe would
//    aggregate 38 to 53 Gb/s in all; folding through front-panel loopback ports takes ports
//    from the workers and needs a completion count per chunk. See docs/P4-RESOURCES.md.
//  - Integer add, max, compare and bit operations only; payloads stay big-endian.
//
// Counters: ina_events (index = ina_proto::event::Event), one event per frame on its first
// pass; ina_multicast counts multicast results."
    );
}

fn constants(p: &mut P4) {
    p.lines("\n#include <core.p4>\n#include <tna.p4>\n");
    let types = ["DATA", "RESULT", "REJECT", "PROBE_REPLY", "PENDING"];
    common::protocol_constants(p, &types, false);
    let _ = writeln!(
        p,
        "const bit<16> INA_ELEMS = {ELEMS};
const bit<7> RECIRC_PORT_IN_PIPE = {RECIRC_PORT_IN_PIPE};
const bit<32> POOL_SLOTS = {POOL_SLOTS};
const bit<32> POOL_CELLS = {cells};
const bit<32> EVENT_COUNT = {events};

typedef bit<13> slot_index_t;
typedef bit<14> cell_index_t;

struct pair_t {{
    bit<32> lo;
    bit<32> hi;
}}
",
        cells = 2 * POOL_SLOTS,
        events = Event::COUNT,
    );
}

fn headers(p: &mut P4) {
    p.push_str(
        "\
// Between the passes and from ingress to egress: what the packet still needs.
header bridge_h {
    bit<8> op;
    bit<7> _pad;
    PortId_t port;
    bit<16> mgrp;
}

",
    );
    common::wire_headers(p);
    p.blank();
    common::payload_header(p, "ina_payload_h", 0, ELEMS);
    p.push_str(
        "
struct headers_t {
    bridge_h bridge;
    ethernet_h ethernet;
    arp_h arp;
    ipv4_h ipv4;
    udp_h udp;
    ina_h ina;
    ina_probe_h probe;
    ina_bitmap_h word;
    ina_payload_h payload;
}

struct ingress_md_t {
    bit<1> pass2;
    bit<1> arp_req;
    bit<1> ina_expected;
    bit<48> sm;
    bit<32> sip;
    bit<32> cnt4;
    bit<32> ulen;
    cell_index_t cell;
    bit<1> job_hit;
    bit<16> job_epoch;
    bit<16> epoch_x;
    bit<16> slot_base;
    bit<16> slot_off;
    bit<16> slot_count;
    bit<16> elems;
    bit<16> count_x;
    bit<8> workers;
    bit<16> mgrp;
    bit<1> rank_hit;
    bit<9> port_x;
    bit<32> ip_x;
    bit<16> udp_x;
    bit<32> rbit;
    bit<2> l2_kind;
    PortId_t l2_port;
    bit<16> l2_mgrp;
    bit<32> dst_x;
    bit<32> arp_x;
    bit<32> len_x;
    bit<17> room;
    bit<9> l2_port_x;
    bit<32> full_mask;
    bit<8> op;
    bit<8> event;
    bit<8> reason;
    bit<4> seq_pred;
    bit<4> order_pred;
    bit<32> bm_old;
    bit<32> bm_new;
    bit<32> old_x;
    bit<32> new_x;
    bit<32> exp_x;
    bit<1> seen;
    bit<8> vop_c;
    bit<8> vop;
    bit<8> outcome;
    bit<32> pend;
    bit<1> mcast_count;
    bit<32> exp_h;
}

struct egress_md_t {
    bit<1> fix_checksum;
}

",
    );
}

fn ingress_parser(p: &mut P4) {
    let _ = writeln!(
        p,
        "\
parser InaIngressParser(packet_in pkt, out headers_t hdr, out ingress_md_t md,
                        out ingress_intrinsic_metadata_t ig_intr_md) {{
    state start {{
{init}        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        transition select(ig_intr_md.ingress_port[6:0]) {{
            RECIRC_PORT_IN_PIPE : parse_bridge;
            default : parse_ethernet;
        }}
    }}

    // The second pass of a result: the bridged header the first pass put in front, then the
    // Result the first pass wrote, already addressed (so not necessarily to the ina port).
    state parse_bridge {{
        pkt.extract(hdr.bridge);
        md.pass2 = 1;
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        pkt.extract(hdr.ina);
        pkt.extract(hdr.payload);
        transition accept;
    }}

    state parse_arp {{
        pkt.extract(hdr.arp);
        transition select(hdr.arp.htype, hdr.arp.ptype, hdr.arp.hlen, hdr.arp.plen,
                          hdr.arp.oper) {{
            (1, ETHERTYPE_IPV4, 6, 4, 1) : arp_request;
            default : accept;
        }}
    }}

    state arp_request {{
        md.arp_req = 1;
        transition accept;
    }}
",
        init = INIT_ZERO
            .iter()
            .map(|f| format!("        md.{f} = 0;\n"))
            .collect::<String>(),
    );
    common::frame_parser_states(p);
    let _ = writeln!(
        p,
        "
    // The payload is parsed for {ELEMS}-element Data and Result packets whose UDP length says
    // so; every other ina packet is a header (anything after it stays behind as payload).
    state parse_ina {{
        md.ina_expected = 1;
        pkt.extract(hdr.ina);
        transition select(hdr.ina.version, hdr.ina.msg_type, hdr.ina.count, hdr.udp.length) {{
            (INA_VERSION, INA_DATA, INA_ELEMS, {full_len}) : parse_payload;
            (INA_VERSION, INA_RESULT, INA_ELEMS, {full_len}) : parse_payload;
            default : accept;
        }}
    }}

    state parse_payload {{
        pkt.extract(hdr.payload);
        transition accept;
    }}
}}
",
        full_len = 8 + HEADER_LEN + 4 * usize::from(ELEMS),
    );
}

/// The metadata fields some path reads before it writes them, zeroed by the parser.
const INIT_ZERO: [&str; 20] = [
    "pass2",
    "arp_req",
    "ina_expected",
    "job_hit",
    "rank_hit",
    "l2_kind",
    "seq_pred",
    "order_pred",
    "bm_old",
    "exp_x",
    "seen",
    "vop_c",
    "vop",
    "outcome",
    "pend",
    "mcast_count",
    "event",
    "reason",
    "op",
    "rbit",
];

/// Statements that address a reply to the sender of the frame (§7 Replies), with an `ina`
/// payload of `elems` elements.
fn unicast_addressing(p: &mut P4, elems: u16) {
    p.push_str(
        "        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = md.sm;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.udp.dst_port = hdr.udp.src_port;
",
    );
    reply_headers(p, elems);
    p.push_str("        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;\n");
}

/// The IPv4 and UDP headers of a reply from the switch (as `wire::frame::emit_headers` writes
/// them), with an `ina` payload of `elems` elements.
fn reply_headers(p: &mut P4, elems: u16) {
    let udp = 8 + HEADER_LEN + 4 * usize::from(elems);
    let (total_len, udp_len) = ((20 + udp).to_string(), udp.to_string());
    common::reply_headers(p, "md.sip", &total_len, &udp_len);
    let _ = writeln!(
        p,
        "hdr.ina.gap = 0;
        hdr.ina.gap_on = 0;
        hdr.ina.count = {elems};"
    );
}

fn recirculate(p: &mut P4, op: u8) {
    let _ = writeln!(
        p,
        "        hdr.bridge.setValid();
        hdr.bridge.op = {op};
        hdr.bridge._pad = 0;
        hdr.bridge.port = ig_intr_md.ingress_port;
        hdr.bridge.mgrp = md.mgrp;
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port[8:7] ++ RECIRC_PORT_IN_PIPE;
        ig_tm_md.bypass_egress = 1;"
    );
}

fn to_egress(p: &mut P4, op: u8) {
    let _ = writeln!(
        p,
        "        hdr.bridge.setValid();
        hdr.bridge.op = {op};
        hdr.bridge._pad = 0;
        hdr.bridge.port = ig_intr_md.ingress_port;
        hdr.bridge.mgrp = 0;"
    );
}

fn value_registers(p: &mut P4) {
    for j in 0..VALUE_REGISTERS {
        let (lo, hi) = (2 * j, 2 * j + 1);
        let _ = writeln!(
            p,
            "
    // Twin: Registers::values, elements {lo} and {hi} of (slot, set) at index 2*slot+set.
    Register<pair_t, cell_index_t>(POOL_CELLS) reg_value_{j};
    RegisterAction<pair_t, cell_index_t, bit<32>>(reg_value_{j}) value_write_{j} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            v.lo = hdr.payload.e{lo};
            v.hi = hdr.payload.e{hi};
            rv = v.hi;
        }}
    }};
    RegisterAction<pair_t, cell_index_t, bit<32>>(reg_value_{j}) value_add_{j} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            v.lo = v.lo + hdr.payload.e{lo};
            v.hi = v.hi + hdr.payload.e{hi};
            rv = v.hi;
        }}
    }};
    RegisterAction<pair_t, cell_index_t, bit<32>>(reg_value_{j}) value_read_hi_{j} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            rv = v.hi;
        }}
    }};
    RegisterAction<pair_t, cell_index_t, bit<32>>(reg_value_{j}) value_read_lo_{j} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            rv = v.lo;
        }}
    }};"
        );
        // The first table of stage 4 also records the operation it chose for the later stages.
        let record = |op: u8| {
            if j == 0 {
                format!(" md.vop = {op};")
            } else {
                String::new()
            }
        };
        let _ = writeln!(
            p,
            "    action do_value_write_{j}() {{ hdr.payload.e{hi} = value_write_{j}.execute(md.cell);{} }}
    action do_value_add_{j}() {{ hdr.payload.e{hi} = value_add_{j}.execute(md.cell);{} }}
    action do_value_read_hi_{j}() {{ hdr.payload.e{hi} = value_read_hi_{j}.execute(md.cell);{} }}
    action do_value_read_lo_{j}() {{ hdr.payload.e{lo} = value_read_lo_{j}.execute(md.cell);{} }}",
            record(vop::WRITE),
            record(vop::ADD),
            record(vop::READ_HI),
            record(vop::READ_LO),
        );
        let actions = [
            format!("do_value_write_{j}"),
            format!("do_value_add_{j}"),
            format!("do_value_read_hi_{j}"),
            format!("do_value_read_lo_{j}"),
        ];
        let actions: Vec<&str> = actions.iter().map(String::as_str).collect();
        let stage = VALUE_FIRST_STAGE + j / ALUS_PER_STAGE;
        if stage == VALUE_FIRST_STAGE {
            // Stage 4 sees the bitmap of stage 3 as it came out of its ALU: a rank whose bit is
            // set already contributed, and its packet only reads.
            let mut entries = vec![
                entry(
                    &[&vop::WRITE.to_string(), "_", "_"],
                    format!("do_value_write_{j}()"),
                ),
                entry(
                    &[&vop::READ_HI.to_string(), "_", "_"],
                    format!("do_value_read_hi_{j}()"),
                ),
                entry(
                    &[&vop::READ_LO.to_string(), "_", "_"],
                    format!("do_value_read_lo_{j}()"),
                ),
            ];
            for r in 0..MAX_WORKERS {
                let bit = format!("32w0x{:08x} &&& 32w0x{:08x}", 1u32 << r, 1u32 << r);
                entries.push(entry(
                    &[&vop::ADD_IF_UNSEEN.to_string(), &bit, &r.to_string()],
                    format!("do_value_read_hi_{j}()"),
                ));
            }
            // A payload to a use begun by a header (refused): nothing is added.
            entries.push(entry(
                &[
                    &vop::ADD_IF_UNSEEN.to_string(),
                    &format!("{} &&& {}", kind_bit(), kind_bit()),
                    "_",
                ],
                format!("do_value_read_hi_{j}()"),
            ));
            entries.push(entry(
                &[&vop::ADD_IF_UNSEEN.to_string(), "_", "_"],
                format!("do_value_add_{j}()"),
            ));
            table(
                p,
                &format!("value_{j}"),
                Some(stage),
                &[
                    ("md.vop_c", "ternary"),
                    ("md.bm_old", "ternary"),
                    ("hdr.ina.rank", "ternary"),
                ],
                &actions,
                &entries,
                "NoAction()",
            );
        } else {
            let entries = vec![
                entry(&[&vop::WRITE.to_string()], format!("do_value_write_{j}()")),
                entry(&[&vop::ADD.to_string()], format!("do_value_add_{j}()")),
                entry(
                    &[&vop::READ_HI.to_string()],
                    format!("do_value_read_hi_{j}()"),
                ),
                entry(
                    &[&vop::READ_LO.to_string()],
                    format!("do_value_read_lo_{j}()"),
                ),
            ];
            table(
                p,
                &format!("value_{j}"),
                Some(stage),
                &[("md.vop", "exact")],
                &actions,
                &entries,
                "NoAction()",
            );
        }
    }
}

fn control_registers(p: &mut P4) {
    for set in 0..2 {
        let (x, o) = if set == 0 { ("lo", "hi") } else { ("hi", "lo") };
        let _ = writeln!(
            p,
            "
    // Set {set}: cmplo = the packet's use is newer than the set's (serial-number arithmetic),
    // cmphi = it is the set's current use. A Data packet of a newer use takes the set.
    RegisterAction<pair_t, slot_index_t, bit<4>>(reg_seq) seq_data_{set} = {{
        void apply(inout pair_t v, out bit<4> rv) {{
            bool newer = (int<32>)(hdr.ina.seq - v.{x}) > 0;
            bool same = hdr.ina.seq == v.{x};
            rv = this.predicate(newer, same);
            if (newer) {{
                v.{x} = hdr.ina.seq;
            }}
        }}
    }};
    RegisterAction<pair_t, slot_index_t, bit<4>>(reg_seq) seq_query_{set} = {{
        void apply(inout pair_t v, out bit<4> rv) {{
            bool newer = (int<32>)(hdr.ina.seq - v.{x}) > 0;
            bool same = hdr.ina.seq == v.{x};
            rv = this.predicate(newer, same);
        }}
    }};
    action do_seq_data_{set}() {{ md.seq_pred = seq_data_{set}.execute(md.cell[13:1]); }}
    action do_seq_query_{set}() {{ md.seq_pred = seq_query_{set}.execute(md.cell[13:1]); }}

    // Set {set}: cmplo as reg_seq's (and the same write), cmphi = the other set holds a use
    // newer than this packet's.
    RegisterAction<pair_t, slot_index_t, bit<4>>(reg_seq_order) order_data_{set} = {{
        void apply(inout pair_t v, out bit<4> rv) {{
            bool newer = (int<32>)(hdr.ina.seq - v.{x}) > 0;
            bool other_newer = (int<32>)(v.{o} - hdr.ina.seq) > 0;
            rv = this.predicate(newer, other_newer);
            if (newer) {{
                v.{x} = hdr.ina.seq;
            }}
        }}
    }};
    RegisterAction<pair_t, slot_index_t, bit<4>>(reg_seq_order) order_query_{set} = {{
        void apply(inout pair_t v, out bit<4> rv) {{
            bool newer = (int<32>)(hdr.ina.seq - v.{x}) > 0;
            bool other_newer = (int<32>)(v.{o} - hdr.ina.seq) > 0;
            rv = this.predicate(newer, other_newer);
        }}
    }};
    action do_order_data_{set}() {{ md.order_pred = order_data_{set}.execute(md.cell[13:1]); }}
    action do_order_query_{set}() {{ md.order_pred = order_query_{set}.execute(md.cell[13:1]); }}

    // Set {set}: a new use starts with the rank alone, and KIND_BIT if the packet carries no
    // payload; an arrival to the current use of the use's kind adds the rank (a no-op for a
    // rank already there), one of the other kind changes nothing; both updates take the rank
    // out of the other set. Returns the set's bitmap before the update.
    RegisterAction<pair_t, slot_index_t, bit<32>>(reg_bitmap) bitmap_new_payload_{set} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            rv = v.{x};
            v.{x} = md.rbit;
            v.{o} = v.{o} & ~md.rbit;
        }}
    }};
    RegisterAction<pair_t, slot_index_t, bit<32>>(reg_bitmap) bitmap_new_header_{set} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            rv = v.{x};
            v.{x} = md.rbit | {kind};
            v.{o} = v.{o} & ~md.rbit;
        }}
    }};
    RegisterAction<pair_t, slot_index_t, bit<32>>(reg_bitmap) bitmap_add_payload_{set} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            rv = v.{x};
            if ((int<32>)v.{x} >= 0) {{
                v.{x} = v.{x} | md.rbit;
                v.{o} = v.{o} & ~md.rbit;
            }}
        }}
    }};
    RegisterAction<pair_t, slot_index_t, bit<32>>(reg_bitmap) bitmap_add_header_{set} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            rv = v.{x};
            if ((int<32>)v.{x} < 0) {{
                v.{x} = v.{x} | md.rbit;
                v.{o} = v.{o} & ~md.rbit;
            }}
        }}
    }};
    RegisterAction<pair_t, slot_index_t, bit<32>>(reg_bitmap) bitmap_read_{set} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            rv = v.{x};
        }}
    }};
    action do_bitmap_new_payload_{set}() {{ md.bm_old = bitmap_new_payload_{set}.execute(md.cell[13:1]); }}
    action do_bitmap_new_header_{set}() {{ md.bm_old = bitmap_new_header_{set}.execute(md.cell[13:1]); }}
    action do_bitmap_add_payload_{set}() {{ md.bm_old = bitmap_add_payload_{set}.execute(md.cell[13:1]); }}
    action do_bitmap_add_header_{set}() {{ md.bm_old = bitmap_add_header_{set}.execute(md.cell[13:1]); }}
    action do_bitmap_read_{set}() {{ md.bm_old = bitmap_read_{set}.execute(md.cell[13:1]); }}

    // Set {set}: a new use takes the packet's exponent byte, and KIND_BIT if the packet carries
    // no payload; an arrival to the current use of the use's kind the larger of the two
    // (unsigned), one of the other kind changes nothing. Returns the set's cell after the
    // update (the exponent in its low byte).
    RegisterAction<pair_t, slot_index_t, bit<32>>(reg_exp) exp_write_payload_{set} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            v.{x} = (bit<32>)hdr.ina.exponent;
            rv = v.{x};
        }}
    }};
    RegisterAction<pair_t, slot_index_t, bit<32>>(reg_exp) exp_write_header_{set} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            v.{x} = md.exp_h;
            rv = v.{x};
        }}
    }};
    RegisterAction<pair_t, slot_index_t, bit<32>>(reg_exp) exp_max_payload_{set} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            if ((int<32>)v.{x} >= 0 && (bit<32>)hdr.ina.exponent > v.{x}) {{
                v.{x} = (bit<32>)hdr.ina.exponent;
            }}
            rv = v.{x};
        }}
    }};
    RegisterAction<pair_t, slot_index_t, bit<32>>(reg_exp) exp_max_header_{set} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            if ((int<32>)v.{x} < 0 && md.exp_h > v.{x}) {{
                v.{x} = md.exp_h;
            }}
            rv = v.{x};
        }}
    }};
    RegisterAction<pair_t, slot_index_t, bit<32>>(reg_exp) exp_read_{set} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            rv = v.{x};
        }}
    }};
    action do_exp_write_payload_{set}() {{ md.exp_x = exp_write_payload_{set}.execute(md.cell[13:1]); }}
    action do_exp_write_header_{set}() {{ md.exp_x = exp_write_header_{set}.execute(md.cell[13:1]); }}
    action do_exp_max_payload_{set}() {{ md.exp_x = exp_max_payload_{set}.execute(md.cell[13:1]); }}
    action do_exp_max_header_{set}() {{ md.exp_x = exp_max_header_{set}.execute(md.cell[13:1]); }}
    action do_exp_read_{set}() {{ md.exp_x = exp_read_{set}.execute(md.cell[13:1]); }}",
            kind = kind_bit(),
        );
    }
}

fn ingress(p: &mut P4) {
    let _ = writeln!(
        p,
        "
control InaIngress(inout headers_t hdr, inout ingress_md_t md,
                   in ingress_intrinsic_metadata_t ig_intr_md,
                   in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {{

    // Index = ina_proto::event::Event.
    Counter<bit<64>, bit<8>>(EVENT_COUNT, CounterType_t.PACKETS) ina_events;
    Counter<bit<64>, bit<1>>(1, CounterType_t.PACKETS) ina_multicast;

    // Twin: SlotRegisters::seq (low half = set 0, high half = set 1), indexed by slot.
    Register<pair_t, slot_index_t>(POOL_SLOTS) reg_seq;
    // Twin: SlotRegisters::seq as well: the same sequence numbers, written by the same packets.
    // One ALU gives two conditions; the decision needs three (newer, same, other set newer).
    Register<pair_t, slot_index_t>(POOL_SLOTS) reg_seq_order;
    // Twin: SlotRegisters::bitmap.
    Register<pair_t, slot_index_t>(POOL_SLOTS) reg_bitmap;
    // Twin: SlotRegisters::exp.
    Register<pair_t, slot_index_t>(POOL_SLOTS) reg_exp;
    // SlotRegisters::count has no register here (see the header comment).

    // ---- stage 0: the control plane's tables ----

    action set_switch_addr(bit<48> mac, bit<32> ip) {{
        md.sm = mac;
        md.sip = ip;
        md.cnt4 = ((bit<32>)hdr.ina.count) << 2;
        md.ulen = ((bit<32>)hdr.udp.length) - {hdr_udp};
        md.cell = hdr.ina.slot[12:0] ++ hdr.ina.set;
    }}
    @stage(0)
    table switch_addr {{
        actions = {{
            set_switch_addr;
        }}
        default_action = set_switch_addr(0, 0);
    }}

    action l2_to_port(PortId_t port) {{
        md.l2_kind = 1;
        md.l2_port = port;
    }}
    action l2_flood(bit<16> mgrp) {{
        md.l2_kind = 2;
        md.l2_mgrp = mgrp;
    }}
    action l2_unknown() {{
        md.l2_kind = 0;
    }}
    @stage(0)
    table l2_forward {{
        key = {{
            hdr.ethernet.dst_addr : exact;
        }}
        actions = {{
            l2_to_port;
            l2_flood;
            l2_unknown;
        }}
        default_action = l2_unknown();
        size = 4096;
    }}

    action set_job(bit<16> epoch, bit<16> slot_base, bit<16> slot_count, bit<16> elems,
                   bit<8> workers, bit<16> mgrp) {{
        md.job_hit = 1;
        md.job_epoch = epoch;
        md.epoch_x = hdr.ina.epoch ^ epoch;
        md.slot_base = slot_base;
        md.slot_off = hdr.ina.slot - slot_base;
        md.slot_count = slot_count;
        md.elems = elems;
        md.count_x = hdr.ina.count ^ elems;
        md.workers = workers;
        md.mgrp = mgrp;
    }}
    action unknown_job() {{
        md.job_hit = 0;
    }}
    @stage(0)
    table ina_job {{
        key = {{
            hdr.ina.job : exact;
        }}
        actions = {{
            set_job;
            unknown_job;
        }}
        default_action = unknown_job();
        size = 1024;
    }}

    action set_rank(PortId_t port, bit<32> ip, bit<16> udp_port) {{
        md.rank_hit = 1;
        md.port_x = ig_intr_md.ingress_port ^ port;
        md.ip_x = hdr.ipv4.src_addr ^ ip;
        md.udp_x = hdr.udp.src_port ^ udp_port;
    }}
    action unknown_rank() {{
        md.rank_hit = 0;
    }}
    @stage(0)
    table ina_rank {{
        key = {{
            hdr.ina.job : exact;
            hdr.ina.rank : exact;
        }}
        actions = {{
            set_rank;
            unknown_rank;
        }}
        default_action = unknown_rank();
        size = 32768;
    }}

    action set_bit(bit<32> b) {{
        md.rbit = b;
    }}",
        hdr_udp = 8 + HEADER_LEN,
    );
    let entries: Vec<Entry> = (0..MAX_WORKERS)
        .map(|r| {
            entry(
                &[&r.to_string()],
                format!("set_bit(32w0x{:08x})", 1u32 << r),
            )
        })
        .collect();
    table(
        p,
        "rank_bit",
        Some(0),
        &[("hdr.ina.rank", "exact")],
        &["set_bit"],
        &entries,
        "set_bit(0)",
    );
    let _ = writeln!(
        p,
        "
    // ---- stage 1: the comparisons, as differences the check table matches against 0 ----

    action compare() {{
        md.dst_x = hdr.ipv4.dst_addr ^ md.sip;
        md.arp_x = hdr.arp.tpa ^ md.sip;
        md.len_x = md.ulen ^ md.cnt4;
        // Bit 16 set: the slot lies below the end of the job's range.
        md.room = ((bit<17>)md.slot_off) - ((bit<17>)md.slot_count);
        md.l2_port_x = md.l2_port ^ ig_intr_md.ingress_port;
        md.exp_h = {kind} | (bit<32>)hdr.ina.exponent;
    }}
    @stage(1)
    table prep_compare {{
        actions = {{
            compare;
        }}
        const default_action = compare();
    }}

    action set_full_mask(bit<32> mask) {{
        md.full_mask = mask;
    }}",
        kind = kind_bit(),
    );
    let entries: Vec<Entry> = (1..=u32::from(MAX_WORKERS))
        .map(|n| {
            let mask = (1u32 << n) - 1;
            entry(&[&n.to_string()], format!("set_full_mask(32w0x{mask:08x})"))
        })
        .collect();
    table(
        p,
        "full_mask",
        Some(1),
        &[("md.workers", "exact")],
        &["set_full_mask"],
        &entries,
        "set_full_mask(0)",
    );

    // ---- stage 2 ----
    let _ = writeln!(
        p,
        "
    // ---- stage 2: the checks of section 6 and section 7, in order, and the sequence ----

    action check_drop(bit<8> event) {{
        md.op = {drop};
        md.event = event;
    }}
    action check_harvest() {{
        md.op = {harvest};
    }}
    action check_arp() {{
        md.op = {arp};
        md.event = {arp_ev};
    }}
    action check_l2_port() {{
        md.op = {l2p};
        md.event = {l2f};
    }}
    action check_l2_flood() {{
        md.op = {l2f_op};
        md.event = {l2f};
    }}
    action check_probe() {{
        md.op = {probe};
        md.event = {probe_ev};
    }}
    action check_reject(bit<8> reason, bit<8> event) {{
        md.op = {reject};
        md.reason = reason;
        md.event = event;
    }}
    action check_data() {{
        md.op = {data};
    }}
    action check_query() {{
        md.op = {query};
    }}",
        drop = op::DROP,
        harvest = op::HARVEST,
        arp = op::ARP,
        arp_ev = ev(Event::ArpReplied),
        l2p = op::L2_PORT,
        l2f_op = op::L2_FLOOD,
        l2f = ev(Event::L2Forwarded),
        probe = op::PROBE,
        probe_ev = ev(Event::ProbeAnswered),
        reject = op::REJECT,
        data = op::DATA,
        query = op::QUERY,
    );
    table(
        p,
        "ina_check",
        Some(2),
        &CHECK_KEYS,
        &[
            "check_drop",
            "check_harvest",
            "check_arp",
            "check_l2_port",
            "check_l2_flood",
            "check_probe",
            "check_reject",
            "check_data",
            "check_query",
        ],
        &check_entries(),
        &format!("check_drop({})", ev(Event::L2Unknown)),
    );
    control_registers(p);
    let mut seq_keys: Vec<(&str, &str)> = CHECK_KEYS.to_vec();
    seq_keys.push(("hdr.ina.set", "ternary"));
    table(
        p,
        "seq_access",
        Some(2),
        &seq_keys,
        &[
            "do_seq_data_0",
            "do_seq_data_1",
            "do_seq_query_0",
            "do_seq_query_1",
            "NoAction",
        ],
        &seq_entries("do_seq_data", "do_seq_query"),
        "NoAction()",
    );
    table(
        p,
        "seq_order_access",
        Some(2),
        &seq_keys,
        &[
            "do_order_data_0",
            "do_order_data_1",
            "do_order_query_0",
            "do_order_query_1",
            "NoAction",
        ],
        &seq_entries("do_order_data", "do_order_query"),
        "NoAction()",
    );

    // ---- stage 3 ----
    p.push_str("\n    // ---- stage 3: bitmap and exponent of the set; what the values do ----\n");
    let set_keys = [
        ("md.op", "exact"),
        ("hdr.ina.set", "exact"),
        ("md.seq_pred", "ternary"),
        ("md.order_pred", "ternary"),
        ("hdr.ina.count", "ternary"),
    ];
    let data = op::DATA.to_string();
    let query = op::QUERY.to_string();
    let full = ELEMS.to_string();
    let mut bm = Vec::new();
    let mut ex = Vec::new();
    for set in 0..2 {
        let s = set.to_string();
        // Accepted Data carries 0 or ELEMS elements (check 9).
        for (kind, count) in [("header", "0"), ("payload", full.as_str())] {
            bm.push(entry(
                &[&data, &s, pred::NEW, "_", count],
                format!("do_bitmap_new_{kind}_{set}()"),
            ));
            bm.push(entry(
                &[&data, &s, pred::SAME, pred::OTHER_OLDER, count],
                format!("do_bitmap_add_{kind}_{set}()"),
            ));
            ex.push(entry(
                &[&data, &s, pred::NEW, "_", count],
                format!("do_exp_write_{kind}_{set}()"),
            ));
            ex.push(entry(
                &[&data, &s, pred::SAME, pred::OTHER_OLDER, count],
                format!("do_exp_max_{kind}_{set}()"),
            ));
        }
        for t in [&data, &query] {
            bm.push(entry(
                &[t, &s, pred::SAME, "_", "_"],
                format!("do_bitmap_read_{set}()"),
            ));
            ex.push(entry(
                &[t, &s, pred::SAME, "_", "_"],
                format!("do_exp_read_{set}()"),
            ));
        }
    }
    let actions = |register: &str, ops: &[&str]| -> Vec<String> {
        (0..2)
            .flat_map(|set| {
                ops.iter()
                    .map(move |op| format!("do_{register}_{op}_{set}"))
            })
            .chain(["NoAction".to_string()])
            .collect()
    };
    let bm_actions = actions(
        "bitmap",
        &[
            "new_payload",
            "new_header",
            "add_payload",
            "add_header",
            "read",
        ],
    );
    let ex_actions = actions(
        "exp",
        &[
            "write_payload",
            "write_header",
            "max_payload",
            "max_header",
            "read",
        ],
    );
    table(
        p,
        "bitmap_access",
        Some(3),
        &set_keys,
        &bm_actions.iter().map(String::as_str).collect::<Vec<_>>(),
        &bm,
        "NoAction()",
    );
    table(
        p,
        "exp_access",
        Some(3),
        &set_keys,
        &ex_actions.iter().map(String::as_str).collect::<Vec<_>>(),
        &ex,
        "NoAction()",
    );
    let _ = writeln!(
        p,
        "
    action select_values(bit<8> v) {{
        md.vop_c = v;
    }}
    // A Query answered with a full Result (bit 0 of its exponent byte set) gets a payload
    // to fill.
    action select_values_for_query() {{
        md.vop_c = {read_hi};
        hdr.payload.setValid();
    }}",
        read_hi = vop::READ_HI,
    );
    let harvest = op::HARVEST.to_string();
    let vsel = vec![
        entry(
            &[&harvest, "_", "_", "_", "_"],
            format!("select_values({})", vop::READ_LO),
        ),
        entry(
            &[&data, pred::NEW, "_", &full, "_"],
            format!("select_values({})", vop::WRITE),
        ),
        entry(
            &[&data, pred::SAME, pred::OTHER_OLDER, &full, "_"],
            format!("select_values({})", vop::ADD_IF_UNSEEN),
        ),
        entry(
            &[&data, pred::SAME, "_", &full, "_"],
            format!("select_values({})", vop::READ_HI),
        ),
        entry(
            &[&query, pred::SAME, "_", "_", QUERY_WITHOUT_SUMS],
            format!("select_values({})", vop::NONE),
        ),
        entry(
            &[&query, pred::SAME, "_", "_", "_"],
            "select_values_for_query()",
        ),
    ];
    table(
        p,
        "value_select",
        Some(3),
        &[
            ("md.op", "exact"),
            ("md.seq_pred", "ternary"),
            ("md.order_pred", "ternary"),
            ("hdr.ina.count", "ternary"),
            ("hdr.ina.exponent", "ternary"),
        ],
        &["select_values", "select_values_for_query"],
        &vsel,
        &format!("select_values({})", vop::NONE),
    );

    // ---- stage 4 on: the values ----
    p.push_str(
        "\n    // ---- stages 4 to 11: the value registers, four per stage ----\n\
         \n    // Stage 4: whether the rank's bit is in the set's bitmap.\n    action set_seen() {\n        md.seen = 1;\n    }\n",
    );
    let seen: Vec<Entry> = (0..MAX_WORKERS)
        .map(|r| {
            entry(
                &[
                    &format!("32w0x{:08x} &&& 32w0x{:08x}", 1u32 << r, 1u32 << r),
                    &r.to_string(),
                ],
                "set_seen()",
            )
        })
        .collect();
    table(
        p,
        "seen_check",
        Some(4),
        &[("md.bm_old", "ternary"), ("hdr.ina.rank", "exact")],
        &["set_seen", "NoAction"],
        &seen,
        "NoAction()",
    );
    p.push_str(
        "
    action done_compare() {
        md.bm_new = md.bm_old | md.rbit;
        md.old_x = md.bm_old ^ md.full_mask;
    }
    @stage(4)
    table prep_done {
        actions = {
            done_compare;
        }
        const default_action = done_compare();
    }

    action last_compare() {
        md.new_x = md.bm_new ^ md.full_mask;
    }
    @stage(5)
    table prep_last {
        actions = {
            last_compare;
        }
        const default_action = last_compare();
    }
",
    );
    value_registers(p);
    outcome(p);
    reply(p);

    p.push_str(
        "
    apply {
        // Stage 0.
        switch_addr.apply();
        l2_forward.apply();
        ina_job.apply();
        ina_rank.apply();
        rank_bit.apply();
        // Stage 1.
        prep_compare.apply();
        full_mask.apply();
        // Stage 2.
        ina_check.apply();
        seq_access.apply();
        seq_order_access.apply();
        // Stage 3.
        bitmap_access.apply();
        exp_access.apply();
        value_select.apply();
        // Stage 4.
        seen_check.apply();
        prep_done.apply();
",
    );
    for j in 0..VALUE_REGISTERS {
        let stage = VALUE_FIRST_STAGE + j / ALUS_PER_STAGE;
        if j % ALUS_PER_STAGE == 0 && j > 0 {
            let _ = writeln!(p, "        // Stage {stage}.");
            if stage == 5 {
                p.push_str("        prep_last.apply();\n");
            }
            if stage == 6 {
                p.push_str("        ina_outcome.apply();\n");
            }
            if stage == 7 {
                p.push_str("        ina_reply.apply();\n");
            }
        }
        let _ = writeln!(p, "        value_{j}.apply();");
    }
    p.push_str(
        "        // Counted once per frame, on its first pass.
        if (md.pass2 == 0) {
            ina_events.count(md.event);
        }
        if (md.mcast_count == 1) {
            ina_multicast.count(0);
        }
    }
}

",
    );
}

/// Stage 6: the decision tables of §6 for accepted Data and Query packets.
fn outcome(p: &mut P4) {
    let _ = writeln!(
        p,
        "
    // ---- stage 6: the decision tables of section 6 ----

    action outcome(bit<8> o, bit<8> event) {{
        md.outcome = o;
        md.event = event;
    }}
    action outcome_multicast(bit<8> o, bit<8> event) {{
        md.outcome = o;
        md.event = event;
        md.mcast_count = 1;
    }}
    action outcome_pending(bit<8> event) {{
        md.outcome = {pending};
        md.event = event;
        md.pend = md.bm_old & {ranks};
    }}
    action outcome_pending_empty(bit<8> event) {{
        md.outcome = {pending};
        md.event = event;
        md.pend = 0;
    }}
    action outcome_reject(bit<8> reason, bit<8> event) {{
        md.outcome = {reject};
        md.reason = reason;
        md.event = event;
    }}",
        pending = out::PENDING,
        reject = out::REJECT,
        ranks = rank_bits(),
    );
    let data = op::DATA.to_string();
    let query = op::QUERY.to_string();
    let full = ELEMS.to_string();
    let o = |x: u8, e: Event| format!("outcome({x}, {})", ev(e));
    let m = |x: u8, e: Event| format!("outcome_multicast({x}, {})", ev(e));
    // Key: op, seq_pred, order_pred, seen, old_x, new_x, workers, count, exponent.
    // A new rank's arrival to a collecting use, of the other kind than the use's (bit 31 of
    // old_x is the use's KIND_BIT): refused; stage 3 left the registers as they were.
    let kind = format!("{} &&& {}", kind_bit(), kind_bit());
    let payload_kind = format!("32w0 &&& {}", kind_bit());
    let bad_count = format!(
        "outcome_reject({}, {})",
        RejectReason::BadCount as u8,
        ev(Event::BadCount)
    );
    let mismatched =
        [(kind.as_str(), full.as_str()), (payload_kind.as_str(), "0")].map(|(old_x, count)| {
            entry(
                &[
                    &data,
                    pred::SAME,
                    pred::OTHER_OLDER,
                    "0",
                    old_x,
                    "_",
                    "_",
                    count,
                    "_",
                ],
                bad_count.clone(),
            )
        });
    let rows: Vec<Entry> = vec![
        // Data.
        entry(
            &[&data, pred::STALE, "_", "_", "_", "_", "_", "_", "_"],
            o(out::DROP, Event::StaleSeq),
        ),
        entry(
            &[&data, pred::NEW, "_", "_", "_", "_", "1", "_", "_"],
            m(out::MCAST, Event::DataFirst),
        ),
        entry(
            &[&data, pred::NEW, "_", "_", "_", "_", "_", "_", "_"],
            o(out::DROP, Event::DataFirst),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_NEWER,
                "1",
                "_",
                "_",
                "_",
                "0",
                "_",
            ],
            o(out::RESULT, Event::ResultUnicast),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_NEWER,
                "1",
                "_",
                "_",
                "_",
                &full,
                "_",
            ],
            o(out::RESULT_HARVEST, Event::ResultUnicast),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_NEWER,
                "0",
                "_",
                "_",
                "_",
                "_",
                "_",
            ],
            o(out::DROP, Event::Duplicate),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_OLDER,
                "1",
                "0",
                "_",
                "_",
                "0",
                "_",
            ],
            o(out::RESULT, Event::ResultUnicast),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_OLDER,
                "1",
                "0",
                "_",
                "_",
                &full,
                "_",
            ],
            o(out::RESULT_HARVEST, Event::ResultUnicast),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_OLDER,
                "1",
                "_",
                "_",
                "_",
                "_",
                "_",
            ],
            format!("outcome_pending({})", ev(Event::PendingSent)),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_OLDER,
                "0",
                "_",
                "0",
                "_",
                "0",
                "_",
            ],
            m(out::MCAST, Event::DataAdded),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_OLDER,
                "0",
                "_",
                "0",
                "_",
                &full,
                "_",
            ],
            m(out::MCAST_HARVEST, Event::DataAdded),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_OLDER,
                "0",
                "_",
                "_",
                "_",
                "_",
                "_",
            ],
            o(out::DROP, Event::DataAdded),
        ),
        // Query.
        entry(
            &[&query, pred::STALE, "_", "_", "_", "_", "_", "_", "_"],
            o(out::DROP, Event::StaleSeq),
        ),
        entry(
            &[&query, pred::NEW, "_", "_", "_", "_", "_", "_", "_"],
            format!("outcome_pending_empty({})", ev(Event::PendingSent)),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_NEWER,
                "1",
                "_",
                "_",
                "_",
                "_",
                QUERY_WITHOUT_SUMS,
            ],
            o(out::RESULT, Event::ResultUnicast),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_NEWER,
                "1",
                "_",
                "_",
                "_",
                "_",
                "_",
            ],
            o(out::RESULT_HARVEST, Event::ResultUnicast),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_NEWER,
                "0",
                "_",
                "_",
                "_",
                "_",
                "_",
            ],
            o(out::DROP, Event::Duplicate),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_OLDER,
                "1",
                "0",
                "_",
                "_",
                "_",
                QUERY_WITHOUT_SUMS,
            ],
            o(out::RESULT, Event::ResultUnicast),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_OLDER,
                "1",
                "0",
                "_",
                "_",
                "_",
                "_",
            ],
            o(out::RESULT_HARVEST, Event::ResultUnicast),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_OLDER,
                "0",
                "0",
                "_",
                "_",
                "_",
                "_",
            ],
            o(out::DROP, Event::Duplicate),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_OLDER,
                "_",
                "_",
                "_",
                "_",
                "_",
                "_",
            ],
            format!("outcome_pending({})", ev(Event::PendingSent)),
        ),
    ];
    // old_x and new_x compare a bitmap with the mask of the job's ranks: a complete use is one
    // whose rank bits all match, whatever its KIND_BIT.
    let all_ranks = format!("32w0 &&& {}", rank_bits());
    let rows: Vec<Entry> = mismatched
        .into_iter()
        .chain(rows.into_iter().map(|mut e| {
            for k in &mut e.keys[4..6] {
                if k == "0" {
                    k.clone_from(&all_ranks);
                }
            }
            e
        }))
        .collect();
    table(
        p,
        "ina_outcome",
        Some(6),
        &[
            ("md.op", "exact"),
            ("md.seq_pred", "ternary"),
            ("md.order_pred", "ternary"),
            ("md.seen", "ternary"),
            ("md.old_x", "ternary"),
            ("md.new_x", "ternary"),
            ("md.workers", "ternary"),
            ("hdr.ina.count", "ternary"),
            ("hdr.ina.exponent", "ternary"),
        ],
        &[
            "outcome",
            "outcome_multicast",
            "outcome_pending",
            "outcome_pending_empty",
            "outcome_reject",
            "NoAction",
        ],
        &rows,
        "NoAction()",
    );
}

/// Stage 7: the frame that leaves, for every decision.
fn reply(p: &mut P4) {
    p.push_str("\n    // ---- stage 7: the frame that leaves ----\n\n");
    p.push_str("    action drop_frame() {\n        ig_dprsr_md.drop_ctl = 1;\n    }\n");

    p.push_str("    action forward_port() {\n");
    to_egress(p, bridge::PLAIN);
    p.push_str("        ig_tm_md.ucast_egress_port = md.l2_port;\n    }\n");

    p.push_str(
        "    // To every port of the flood group but the ingress one: the replication engine prunes\n    \
         // the port whose level-2 exclusion id is the ingress port, and egress drops a copy to\n    \
         // it if any is left.\n",
    );
    p.push_str("    action forward_flood() {\n");
    to_egress(p, bridge::FLOOD);
    p.push_str(
        "        ig_tm_md.mcast_grp_a = md.l2_mgrp;\n        \
         ig_tm_md.level2_exclusion_id = ig_intr_md.ingress_port;\n    }\n",
    );

    p.push_str("    action answer_arp() {\n");
    to_egress(p, bridge::PLAIN);
    p.push_str(
        "        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = md.sm;
        hdr.arp.oper = 2;
        hdr.arp.tha = hdr.arp.sha;
        hdr.arp.tpa = hdr.arp.spa;
        hdr.arp.sha = md.sm;
        hdr.arp.spa = md.sip;
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;
    }
",
    );

    p.push_str("    action answer_probe() {\n");
    to_egress(p, bridge::REPLY);
    unicast_addressing(p, ProbeInfo::COUNT);
    let _ = writeln!(
        p,
        "        hdr.ina.msg_type = INA_PROBE_REPLY;
        hdr.ina.epoch = md.job_epoch;
        hdr.probe.setValid();
        hdr.probe.workers = (bit<32>)md.workers;
        hdr.probe.elems = (bit<32>)md.elems;
        hdr.probe.slot_base = (bit<32>)md.slot_base;
        hdr.probe.slot_count = (bit<32>)md.slot_count;
        hdr.payload.setInvalid();
    }}"
    );

    p.push_str("    action answer_reject() {\n");
    to_egress(p, bridge::REPLY);
    unicast_addressing(p, 0);
    p.push_str(
        "        hdr.ina.msg_type = INA_REJECT;
        hdr.ina.epoch = md.job_epoch;
        hdr.ina.exponent = md.reason;
        hdr.payload.setInvalid();
    }
",
    );

    p.push_str("    action answer_pending() {\n");
    to_egress(p, bridge::REPLY);
    unicast_addressing(p, 1);
    p.push_str(
        "        hdr.ina.msg_type = INA_PENDING;
        hdr.ina.epoch = md.job_epoch;
        hdr.ina.exponent = 0;
        hdr.word.setValid();
        hdr.word.bitmap = md.pend;
        hdr.payload.setInvalid();
    }
",
    );

    p.push_str("    // A Result without payload (count 0), to the sender.\n");
    p.push_str("    action answer_result() {\n");
    to_egress(p, bridge::REPLY);
    unicast_addressing(p, 0);
    p.push_str(
        "        hdr.ina.msg_type = INA_RESULT;
        hdr.ina.exponent = md.exp_x[7:0];
        hdr.payload.setInvalid();
    }
",
    );

    p.push_str(
        "    // A Result with payload, to the sender: the high halves are in; the second pass\n    // reads the low halves.\n",
    );
    p.push_str("    action answer_result_harvest() {\n");
    unicast_addressing(p, ELEMS);
    p.push_str(
        "        hdr.ina.msg_type = INA_RESULT;
        hdr.ina.exponent = md.exp_x[7:0];
",
    );
    recirculate(p, bridge::HARVEST_UNICAST);
    p.push_str("    }\n");

    for (name, elems) in [("multicast_result_empty", 0), ("multicast_result", ELEMS)] {
        let _ = writeln!(
            p,
            "    // A Result to every rank of the job (addresses per rank in egress), count {elems}."
        );
        let _ = writeln!(p, "    action {name}() {{");
        to_egress(p, bridge::MCAST);
        p.push_str("        hdr.ethernet.src_addr = md.sm;\n");
        reply_headers(p, elems);
        p.push_str(
            "        hdr.ina.msg_type = INA_RESULT;
        hdr.ina.exponent = md.exp_x[7:0];
        ig_tm_md.mcast_grp_a = md.mgrp;
    }
",
        );
    }

    p.push_str(
        "    // The last arrival of a use with payload: the high halves are in; the second pass\n    // reads the low halves and multicasts.\n",
    );
    p.push_str("    action multicast_result_harvest() {\n");
    p.push_str("        hdr.ethernet.src_addr = md.sm;\n");
    reply_headers(p, ELEMS);
    p.push_str(
        "        hdr.ina.msg_type = INA_RESULT;
        hdr.ina.exponent = md.exp_x[7:0];
",
    );
    recirculate(p, bridge::HARVEST_MCAST);
    p.push_str("    }\n");

    let _ = writeln!(
        p,
        "    // Second pass: the result is complete.
    action send_harvest_unicast() {{
        hdr.bridge.op = {reply};
        ig_tm_md.ucast_egress_port = hdr.bridge.port;
        ig_tm_md.bypass_egress = 0;
    }}
    action send_harvest_multicast() {{
        hdr.bridge.op = {mcast};
        ig_tm_md.mcast_grp_a = hdr.bridge.mgrp;
        ig_tm_md.bypass_egress = 0;
    }}",
        reply = bridge::REPLY,
        mcast = bridge::MCAST,
    );

    let s = |x: u8| x.to_string();
    let rows = vec![
        entry(
            &[&s(op::HARVEST), "_", &s(bridge::HARVEST_UNICAST), "_"],
            "send_harvest_unicast()",
        ),
        entry(
            &[&s(op::HARVEST), "_", &s(bridge::HARVEST_MCAST), "_"],
            "send_harvest_multicast()",
        ),
        entry(&[&s(op::L2_PORT), "_", "_", "_"], "forward_port()"),
        entry(&[&s(op::L2_FLOOD), "_", "_", "_"], "forward_flood()"),
        entry(&[&s(op::ARP), "_", "_", "_"], "answer_arp()"),
        entry(&[&s(op::PROBE), "_", "_", "_"], "answer_probe()"),
        entry(&[&s(op::REJECT), "_", "_", "_"], "answer_reject()"),
        entry(
            &[&s(op::DATA), &s(out::PENDING), "_", "_"],
            "answer_pending()",
        ),
        entry(
            &[&s(op::DATA), &s(out::REJECT), "_", "_"],
            "answer_reject()",
        ),
        entry(
            &[&s(op::QUERY), &s(out::PENDING), "_", "_"],
            "answer_pending()",
        ),
        entry(
            &[&s(op::DATA), &s(out::RESULT), "_", "_"],
            "answer_result()",
        ),
        entry(
            &[&s(op::QUERY), &s(out::RESULT), "_", "_"],
            "answer_result()",
        ),
        entry(
            &[&s(op::DATA), &s(out::RESULT_HARVEST), "_", "_"],
            "answer_result_harvest()",
        ),
        entry(
            &[&s(op::QUERY), &s(out::RESULT_HARVEST), "_", "_"],
            "answer_result_harvest()",
        ),
        entry(
            &[&s(op::DATA), &s(out::MCAST), "_", "0"],
            "multicast_result_empty()",
        ),
        entry(
            &[&s(op::DATA), &s(out::MCAST), "_", &ELEMS.to_string()],
            "multicast_result()",
        ),
        entry(
            &[&s(op::DATA), &s(out::MCAST_HARVEST), "_", "_"],
            "multicast_result_harvest()",
        ),
    ];
    table(
        p,
        "ina_reply",
        Some(7),
        &[
            ("md.op", "exact"),
            ("md.outcome", "ternary"),
            ("hdr.bridge.op", "ternary"),
            ("hdr.ina.count", "ternary"),
        ],
        &[
            "drop_frame",
            "forward_port",
            "forward_flood",
            "answer_arp",
            "answer_probe",
            "answer_reject",
            "answer_pending",
            "answer_result",
            "answer_result_harvest",
            "multicast_result_empty",
            "multicast_result",
            "multicast_result_harvest",
            "send_harvest_unicast",
            "send_harvest_multicast",
        ],
        &rows,
        "drop_frame()",
    );
}

fn ingress_deparser(p: &mut P4) {
    p.push_str(
        "control InaIngressDeparser(packet_out pkt, inout headers_t hdr, in ingress_md_t md,
                           in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        pkt.emit(hdr);
    }
}

",
    );
}

fn egress_parser(p: &mut P4) {
    let _ = writeln!(
        p,
        "parser InaEgressParser(packet_in pkt, out headers_t hdr, out egress_md_t md,
                       out egress_intrinsic_metadata_t eg_intr_md) {{
    state start {{
        md.fix_checksum = 0;
        pkt.extract(eg_intr_md);
        pkt.extract(hdr.bridge);
        transition select(hdr.bridge.op) {{
            {reply} : parse_reply;
            {mcast} : parse_reply;
            default : accept;
        }}
    }}

    // A reply of the switch: Ethernet, IPv4, UDP, ina (the payload stays behind).
    state parse_reply {{
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        pkt.extract(hdr.ina);
        transition accept;
    }}
}}
",
        reply = bridge::REPLY,
        mcast = bridge::MCAST,
    );
}

fn egress(p: &mut P4) {
    let _ = writeln!(
        p,
        "control InaEgress(inout headers_t hdr, inout egress_md_t md,
                  in egress_intrinsic_metadata_t eg_intr_md,
                  in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                  inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                  inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {{
"
    );
    common::rewrite_dst_action(p);
    let _ = writeln!(
        p,
        "action drop_copy() {{
        eg_dprsr_md.drop_ctl = 1;
    }}
    // The copy of a multicast result for one rank: the replication id is the rank.
    table ina_rank_addr {{
        key = {{
            hdr.ina.job : exact;
            eg_intr_md.egress_rid : exact;
        }}
        actions = {{
            rewrite_dst;
            drop_copy;
        }}
        default_action = drop_copy();
        size = 32768;
    }}

    apply {{
        if (hdr.bridge.op == {flood} && eg_intr_md.egress_port == hdr.bridge.port) {{
            drop_copy();
        }}
        if (hdr.bridge.op == {mcast}) {{
            ina_rank_addr.apply();
        }}
        if (hdr.bridge.op == {reply} || hdr.bridge.op == {mcast}) {{
            md.fix_checksum = 1;
        }}
        hdr.bridge.setInvalid();
    }}
}}
",
        flood = bridge::FLOOD,
        mcast = bridge::MCAST,
        reply = bridge::REPLY,
    );
}

fn egress_deparser(p: &mut P4) {
    p.push_str(
        &"control InaEgressDeparser(packet_out pkt, inout headers_t hdr, in egress_md_t md,
                          in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_checksum;
    apply {
        if (md.fix_checksum == 1) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update(IPV4_CHECKSUM_FIELDS);
        }
        pkt.emit(hdr);
    }
}

"
        .replace("IPV4_CHECKSUM_FIELDS", common::IPV4_CHECKSUM_FIELDS),
    );
}
