//! The bmv2 (v1model) program of the `ina` switch, generated as P4-16 text.
//!
//! [`program`] writes the whole program: the frame handling of PROTOCOL.md §7 (ARP for the
//! switch's address, frames to the switch, L2 forwarding and flooding, reply addressing,
//! multicast with a per-rank rewrite in the egress), the checks and both decision tables of
//! §6, the Missing reports of §5 (the gap register, the results' counters, a rank's report
//! of lost results; reports leave as clones), and the rack switch of a tree (§9: the partial
//! up, the total down, the upper switch's answers, the partials' and totals' gap counters),
//! with the registers of `proto::pipeline` under
//! the names of the shared contract (`reg_seq`, `reg_bitmap`, `reg_count`, `reg_exp`,
//! `reg_value_0..`, `reg_gap`, `reg_result_gap`, `reg_result_use`, `reg_result_seq`). The per-element parts
//! (payload headers, value registers, the actions that write, add and read them) are unrolled
//! here by loops; the protocol's constants come from `ina_wire` and the counter indices from
//! `ina_proto::event::Event`, so the program cannot drift from the Rust model's numbers.
//!
//! The committed copy is `switch-p4/v1model/ina.p4`; a test fails when it is stale
//! (`INA_BLESS=1 cargo test -p ina-switch-p4` rewrites it).
//!
//! # Layout
//! - The payload is parsed as fixed-width headers when the count and the UDP length say a full
//!   payload of 64 or 256 elements follows: `elems_lo` (elements 0..64) and `elems_hi`
//!   (64..256). Other payloads are not parsed: no reply of the switch carries them.
//! - Control registers hold a 64-bit cell per slot: the low 32 bits are set 0, the high 32 bits
//!   set 1. Value register `reg_value_j` holds, at `2*slot + set`, element `2j` in its low half
//!   and `2j+1` in its high half.
//! - Replies are truncated to their length in the egress, so bytes a frame carried after its
//!   UDP datagram never leave with a reply.
//!
//! # Where bmv2 differs from PROTOCOL.md
//! `simple_switch` gives a frame room to grow by 512 bytes: the Result of a 256-element use
//! cannot be built from a 16-byte Query. Such a Query (a complete use the sender contributed
//! to, exponent byte not 0) is answered with a Pending answer whose bitmap is the use's
//! without the sender's bit (counted `pending_sent`): the worker then sends its data again
//! (PROTOCOL.md §6, a worker whose bit is clear resends), and that retransmission, a
//! full-size frame, is answered with the stored Result.
//!
//! For the same reason a job under an upper switch has 64 elements (`runtime::V1MODEL`'s
//! `tree_elems`): a 16-byte answer of the upper switch cannot become a partial of 256. And
//! the program offers Missing reports only to jobs of 64 elements: the
//! ProbeReply of a 256-element job leaves the gap flag clear, so its workers recover without
//! reports. (With reports, the workers' recovery leans on fetching Queries, and a 256-element
//! job on bmv2 then failed 3 of 5 runs of the controller's bmv2 test: a worker gave up after
//! dozens of data retransmissions that each drew a Pending without its bit.) Every other
//! answer is the protocol's.

use crate::common;
use crate::writer::P4;
use core::fmt::Write as _;
use ina_proto::event::Event;
use ina_proto::event::{MISSING_COUNTERS, MISSING_RECEIVED, MISSING_SENT};
use ina_proto::pipeline::MAX_REPORTED_GAP;
use ina_proto::pipeline::{AWAITING_TOTAL, AWAITING_TOTAL_HEADER, HEADER_USE, UPLINK_TIMER_RANK};
use ina_wire::agg::{QueryAsk, GAP_BLOCK, GAP_COUNTER, HEADER_LEN, MAX_RANK};

/// Slots of the v1model program's pool (its control registers have this many cells, its value
/// registers twice as many).
pub const POOL_SLOTS: u16 = 1024;

/// The elements per packet the program supports.
pub const SUPPORTED_ELEMS: [u16; 2] = [64, 256];

/// The largest of [`SUPPORTED_ELEMS`]: the program has `MAX_ELEMS / 2` value registers.
pub const MAX_ELEMS: u16 = 256;

/// Elements in the `elems_lo` header (a 64-element payload is exactly this header).
const LO_ELEMS: u16 = 64;

/// Capacity of the job table.
pub const JOB_TABLE_SIZE: u32 = 256;
/// Capacity of the rank tables.
pub const RANK_TABLE_SIZE: u32 = 8192;
/// Capacity of the L2 table.
pub const L2_TABLE_SIZE: u32 = 1024;

/// Gap cells per block of `GAP_BLOCK` slots in `reg_gap`: one per rank.
pub const GAP_RANKS: u32 = MAX_RANK as u32 + 1;

/// The first mirror session of the Missing reports: a report of lost data that came in on
/// port `p` is cloned to session `REPORT_SESSION_BASE + p` ([`report_session`]).
pub const REPORT_SESSION_BASE: u32 = 1;

/// The first multicast group of the Missing reports: session [`report_session`]`(p)` sends to
/// group `REPORT_MGRP_BASE + p`, which holds port `p` once per copy (PROTOCOL.md §5,
/// `DATA_REPORT_COPIES`). Jobs and floods may not use these groups.
pub const REPORT_MGRP_BASE: u16 = 0xf000;

/// The first mirror session of a rack switch's reports of lost totals (PROTOCOL.md §9): one
/// copy to port `p`, on session `UPLINK_REPORT_SESSION_BASE + p` ([`uplink_report_session`]).
pub const UPLINK_REPORT_SESSION_BASE: u32 = 1024;

/// The mirror session of a report of lost totals to the upper switch behind port `port`.
pub fn uplink_report_session(port: u16) -> u32 {
    UPLINK_REPORT_SESSION_BASE + u32::from(port)
}

/// The mirror session of the reports to port `port`.
pub fn report_session(port: u16) -> u32 {
    REPORT_SESSION_BASE + u32::from(port)
}

/// The multicast group of the reports to port `port`.
pub fn report_mgrp(port: u16) -> u16 {
    REPORT_MGRP_BASE + port
}

/// Whether `group` is one of the reports' groups (for any port up to `runtime::MAX_PORT`).
pub fn is_report_mgrp(group: u16) -> bool {
    (REPORT_MGRP_BASE..=REPORT_MGRP_BASE + crate::runtime::MAX_PORT).contains(&group)
}

/// `log2` of `GAP_BLOCK` and of [`GAP_RANKS`]: the gap register's index is
/// `(slot >> GAP_BLOCK_SHIFT) << GAP_RANKS_SHIFT | rank`.
const GAP_BLOCK_SHIFT: u32 = 6;
const GAP_RANKS_SHIFT: u32 = 5;

/// The field list a report's clone keeps (`@field_list` of the metadata).
const FL_REPORT: u8 = 1;

/// Blocks of `GAP_BLOCK` slots in the pool.
fn gap_blocks() -> u32 {
    u32::from(POOL_SLOTS).div_ceil(u32::from(GAP_BLOCK))
}

/// The name of the file the program is committed as, relative to the crate.
pub const COMMITTED_PATH: &str = "v1model/ina.p4";

/// The elements of a payload header: `(first, end)`.
fn part_range(hi: bool) -> (u16, u16) {
    if hi {
        (LO_ELEMS, MAX_ELEMS)
    } else {
        (0, LO_ELEMS)
    }
}

fn part_name(hi: bool) -> &'static str {
    if hi {
        "elems_hi"
    } else {
        "elems_lo"
    }
}

/// The program text.
pub fn program() -> String {
    let mut p = P4::default();
    header_comment(&mut p);
    constants(&mut p);
    headers(&mut p);
    parser(&mut p);
    ingress(&mut p);
    egress(&mut p);
    checksums_and_deparser(&mut p);
    p.finish()
}

fn header_comment(p: &mut P4) {
    p.lines(
        "// ina: in-network aggregation, the bmv2 (v1model) data plane.
        // Generated by switch-p4/src/v1model.rs; do not edit (INA_BLESS=1 cargo test -p ina-switch-p4).
        // Implements docs/PROTOCOL.md sections 6 and 7; registers and counters as in proto::pipeline
        // and proto::event.",
    );
    p.line("");
    p.line("#include <core.p4>");
    p.line("#include <v1model.p4>");
    p.line("");
}

fn constants(p: &mut P4) {
    let types = [
        "DATA",
        "RESULT",
        "REJECT",
        "PROBE",
        "PROBE_REPLY",
        "PENDING",
        "QUERY",
        "MISSING",
    ];
    common::protocol_constants(p, &types, true);
    let mut c = String::new();
    let _ = writeln!(c, "const bit<16> INA_HEADER_LEN = {HEADER_LEN};");
    let _ = writeln!(
        c,
        "// Indices of the counter ina_events (proto::event::Event)."
    );
    for e in Event::ALL {
        let _ = writeln!(
            c,
            "const bit<32> EV_{} = {};",
            e.name().to_uppercase(),
            e.index()
        );
    }
    let _ = writeln!(c, "const bit<32> EVENT_COUNT = {};", Event::COUNT);
    let _ = writeln!(c, "const bit<32> POOL_SLOTS = {POOL_SLOTS};");
    let _ = writeln!(c, "const bit<16> MAX_ELEMS = {MAX_ELEMS};");
    let _ = writeln!(c, "const bit<32> HEADER_USE = 0x{HEADER_USE:08x};");
    // Missing reports (PROTOCOL.md §5): blocks of 64 slots, a 6-bit counter, cells per rank.
    const _: () = assert!(GAP_BLOCK == 1 << GAP_BLOCK_SHIFT && GAP_COUNTER == 64);
    const _: () = assert!(GAP_RANKS == 1 << GAP_RANKS_SHIFT);
    let _ = writeln!(c, "const bit<8> GAP_BLOCK_SHIFT = {GAP_BLOCK_SHIFT};");
    let _ = writeln!(c, "const bit<8> GAP_RANKS_SHIFT = {GAP_RANKS_SHIFT};");
    let _ = writeln!(c, "const bit<32> GAP_BLOCK = {GAP_BLOCK};");
    let _ = writeln!(c, "const bit<32> GAP_COUNTER = {GAP_COUNTER};");
    let _ = writeln!(c, "const bit<32> MAX_REPORTED_GAP = {MAX_REPORTED_GAP};");
    let _ = writeln!(c, "const bit<32> GAP_CELLS = {};", gap_blocks() * GAP_RANKS);
    let _ = writeln!(c, "const bit<32> GAP_BLOCKS = {};", gap_blocks());
    let _ = writeln!(
        c,
        "const bit<32> RESULT_USE_CELLS = {};",
        gap_blocks() * u32::from(GAP_COUNTER)
    );
    let _ = writeln!(
        c,
        "const bit<32> REPORT_SESSION_BASE = {REPORT_SESSION_BASE};"
    );
    let _ = writeln!(
        c,
        "const bit<32> UPLINK_REPORT_SESSION_BASE = {UPLINK_REPORT_SESSION_BASE};"
    );
    let _ = writeln!(c, "const bit<8> FL_REPORT = {FL_REPORT};");
    // A use that waits for its upper switch's total (PROTOCOL.md §9), in reg_count.
    let _ = writeln!(c, "const bit<32> AWAITING_TOTAL = 0x{AWAITING_TOTAL:x};");
    let _ = writeln!(
        c,
        "const bit<32> AWAITING_TOTAL_HEADER = 0x{AWAITING_TOTAL_HEADER:x};"
    );
    let _ = writeln!(c, "const bit<8> UPLINK_TIMER_RANK = {UPLINK_TIMER_RANK};");
    let _ = writeln!(
        c,
        "const bit<8> QUERY_STATUS = {};",
        QueryAsk::Status.byte()
    );
    let _ = writeln!(c, "const bit<8> QUERY_FETCH = {};", QueryAsk::Fetch.byte());
    let _ = writeln!(c, "const bit<32> MISSING_SENT = {MISSING_SENT};");
    let _ = writeln!(c, "const bit<32> MISSING_RECEIVED = {MISSING_RECEIVED};");
    let _ = writeln!(c, "const bit<32> MISSING_COUNTERS = {MISSING_COUNTERS};");
    let _ = writeln!(c, "const bit<32> INSTANCE_INGRESS_CLONE = 1;");
    // What the egress does with a frame.
    let _ = writeln!(c, "const bit<2> OUT_DROP = 0;");
    let _ = writeln!(c, "const bit<2> OUT_PORT = 1;");
    let _ = writeln!(c, "const bit<2> OUT_GROUP = 2;");
    p.lines(&c);
    p.line("");
}

fn headers(p: &mut P4) {
    common::wire_headers(p);
    for hi in [false, true] {
        let (first, end) = part_range(hi);
        p.blank();
        common::payload_header(p, &format!("{}_h", part_name(hi)), first, end);
    }
    p.line("");
    p.lines(
        "struct headers_t {
        ethernet_h ethernet;
        arp_h arp;
        ipv4_h ipv4;
        udp_h udp;
        ina_h ina;
        ina_bitmap_h ina_bitmap;
        ina_probe_h ina_probe;
        elems_lo_h elems_lo;
        elems_hi_h elems_hi;
        }

        struct metadata_t {
        // The switch's addresses (table switch_addr), kept for a report's clone.
        @field_list(FL_REPORT) bit<48> sw_mac;
        @field_list(FL_REPORT) bit<32> sw_ip;
        // Whether the switch offers Missing reports (table switch_addr).
        bit<1> reports;
        // A report of lost data: the first gap counter skipped and how many were.
        @field_list(FL_REPORT) bit<8> rep_first;
        @field_list(FL_REPORT) bit<8> rep_skipped;
        // The report's rank: the sender's, or this switch's in the upper job.
        @field_list(FL_REPORT) bit<8> rep_rank;
        // The event this frame counts (EV_*).
        bit<32> event;
        // What leaves: OUT_DROP, OUT_PORT (egress_port), OUT_GROUP (mgrp).
        bit<2> out_kind;
        bit<9> out_port;
        bit<16> out_group;
        // A flooded frame: no copy goes back out of its ingress port.
        bit<1> flood;
        // A multicast Result, or a reply to rank 0 of the job: the egress addresses each copy
        // to its rank (the replication id; 0 for a unicast).
        bit<1> mcast_result;
        // A reply built here: its IPv4 checksum is computed and it is cut to reply_len bytes.
        bit<1> reply;
        bit<32> reply_len;
        // The job (table ina_job).
        bit<1> job_hit;
        bit<16> job_epoch;
        bit<16> job_slot_base;
        bit<16> job_slot_count;
        bit<16> job_elems;
        bit<8> job_workers;
        bit<16> job_mgrp;
        // The job's upper switch (PROTOCOL.md §9; up = 0: none): its port and addresses, the
        // job's id, epoch and first slot there, this switch's rank there; whether this job's
        // blocks of 64 slots are the upper job's too; the port of rank 0, whose asking the
        // upper switch's answers are passed on to.
        bit<1> up;
        bit<9> up_port;
        bit<48> up_mac;
        bit<32> up_ip;
        bit<16> up_udp_port;
        bit<16> up_job;
        bit<16> up_epoch;
        bit<16> up_slot_base;
        bit<8> up_rank;
        bit<1> up_blocks;
        bit<9> rank0_port;
        // The key of ina_job: the packet's job, or for a frame of an upper switch (table
        // ina_uplink, from_upper = 1) the job here whose upper job it names.
        bit<16> job_key;
        bit<1> from_upper;
        // The rank (table ina_rank).
        bit<1> rank_hit;
        bit<9> rank_port;
        bit<32> rank_ip;
        bit<16> rank_udp_port;
        // The L2 table.
        bit<2> l2_kind;
        bit<9> l2_port;
        bit<16> l2_mgrp;
        // Register indices: the slot, and 2*slot + set.
        bit<32> slot_index;
        bit<32> value_index;
        }",
    );
    p.line("");
}

fn parser(p: &mut P4) {
    let lo_len = 8 + HEADER_LEN as u32 + 4 * u32::from(LO_ELEMS);
    let all_len = 8 + HEADER_LEN as u32 + 4 * u32::from(MAX_ELEMS);
    let bitmap_len = 8 + HEADER_LEN as u32 + 4;
    p.lines(
        "parser InaParser(packet_in pkt, out headers_t hdr, inout metadata_t meta,
        inout standard_metadata_t sm) {
        state start {
        transition parse_ethernet;
        }
        state parse_arp {
        pkt.extract(hdr.arp);
        transition accept;
        }",
    );
    common::frame_parser_states(p);
    p.lines(&format!(
        "state parse_ina {{
        pkt.extract(hdr.ina);
        // A full payload of {LO_ELEMS} or {MAX_ELEMS} elements, by the count and the UDP length.
        transition select(hdr.ina.count, hdr.udp.length) {{
        (1, {bitmap_len}): parse_bitmap;
        ({LO_ELEMS}, {lo_len}): parse_elems_lo;
        ({MAX_ELEMS}, {all_len}): parse_elems_all;
        default: accept;
        }}
        }}
        // One word: a Pending's bitmap (an upper switch's answer, PROTOCOL.md §9).
        state parse_bitmap {{
        pkt.extract(hdr.ina_bitmap);
        transition accept;
        }}
        state parse_elems_lo {{
        pkt.extract(hdr.elems_lo);
        transition accept;
        }}
        state parse_elems_all {{
        pkt.extract(hdr.elems_lo);
        pkt.extract(hdr.elems_hi);
        transition accept;
        }}
        }}"
    ));
    p.line("");
    p.lines(
        "control InaVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
        apply { }
        }",
    );
    p.line("");
}

/// The actions over the value registers of one payload header: write the payload (first
/// arrival), add it (later arrival; the header then holds the sums), read the sums into it.
fn value_actions(p: &mut P4, hi: bool) {
    let (first, end) = part_range(hi);
    let part = part_name(hi);
    p.line(&format!("action values_write_{part}() {{"));
    for j in first / 2..end / 2 {
        let (a, b) = (2 * j, 2 * j + 1);
        p.line(&format!(
            "reg_value_{j}.write(meta.value_index, hdr.{part}.e{b} ++ hdr.{part}.e{a});"
        ));
    }
    p.line("}");
    p.line(&format!("action values_add_{part}() {{"));
    p.line("bit<64> cell;");
    for j in first / 2..end / 2 {
        let (a, b) = (2 * j, 2 * j + 1);
        p.line(&format!("reg_value_{j}.read(cell, meta.value_index);"));
        p.line(&format!("hdr.{part}.e{a} = hdr.{part}.e{a} + cell[31:0];"));
        p.line(&format!("hdr.{part}.e{b} = hdr.{part}.e{b} + cell[63:32];"));
        p.line(&format!(
            "reg_value_{j}.write(meta.value_index, hdr.{part}.e{b} ++ hdr.{part}.e{a});"
        ));
    }
    p.line("}");
    p.line(&format!("action values_read_{part}() {{"));
    p.line(&format!("hdr.{part}.setValid();"));
    p.line("bit<64> cell;");
    for j in first / 2..end / 2 {
        let (a, b) = (2 * j, 2 * j + 1);
        p.line(&format!("reg_value_{j}.read(cell, meta.value_index);"));
        p.line(&format!("hdr.{part}.e{a} = cell[31:0];"));
        p.line(&format!("hdr.{part}.e{b} = cell[63:32];"));
    }
    p.line("}");
}

fn ingress(p: &mut P4) {
    p.lines(
        "control InaIngress(inout headers_t hdr, inout metadata_t meta,
        inout standard_metadata_t sm) {
        // One count per frame, at the index of its event.
        counter(EVENT_COUNT, CounterType.packets) ina_events;
        // One count per Result multicast.
        counter(1, CounterType.packets) ina_multicast;

        // Per slot: low half = set 0, high half = set 1.
        register<bit<64>>(POOL_SLOTS) reg_seq;
        register<bit<64>>(POOL_SLOTS) reg_bitmap;
        // reg_count: the arrivals still pending, with HEADER_USE set while a use begun by a
        // header (no payload) collects.
        register<bit<64>>(POOL_SLOTS) reg_count;
        register<bit<64>>(POOL_SLOTS) reg_exp;
        // Missing reports (PROTOCOL.md §5), per block of 64 slots: the latest gap counter of
        // each rank plus 64 (0: none yet); the counter the block's next multicast Result
        // carries; and, per counter, 2*slot + set + 1 of the use whose Result carried it and
        // the use's sequence number.
        register<bit<32>>(GAP_CELLS) reg_gap;
        register<bit<8>>(GAP_BLOCKS) reg_result_gap;
        register<bit<32>>(RESULT_USE_CELLS) reg_result_use;
        register<bit<32>>(RESULT_USE_CELLS) reg_result_seq;
        // A rack switch's gap counters (PROTOCOL.md §9), per block: the counter the block's
        // next partial carries, and per counter 2*slot + set + 1 of the use whose partial
        // carried it and the use's sequence number; the latest total's counter plus 64
        // (0: none yet).
        register<bit<8>>(GAP_BLOCKS) reg_partial_gap;
        register<bit<32>>(RESULT_USE_CELLS) reg_partial_use;
        register<bit<32>>(RESULT_USE_CELLS) reg_partial_seq;
        register<bit<32>>(GAP_BLOCKS) reg_total_gap;
        // Reports of lost data sent, and Missing reports answered.
        counter(MISSING_COUNTERS, CounterType.packets) ina_missing;
        // Per (slot, set) at 2*slot + set: elements 2j (low half) and 2j+1 (high half).",
    );
    for j in 0..MAX_ELEMS / 2 {
        p.line(&format!("register<bit<64>>(2 * POOL_SLOTS) reg_value_{j};"));
    }
    p.line("");
    p.lines(&format!(
        "action set_switch_addr(bit<48> mac, bit<32> ip, bit<1> reports) {{
        meta.sw_mac = mac;
        meta.sw_ip = ip;
        meta.reports = reports;
        }}
        table switch_addr {{
        actions = {{ set_switch_addr; }}
        default_action = set_switch_addr(0, 0, 0);
        }}

        action l2_to_port(bit<9> port) {{
        meta.l2_kind = 1;
        meta.l2_port = port;
        }}
        action l2_flood(bit<16> mgrp) {{
        meta.l2_kind = 2;
        meta.l2_mgrp = mgrp;
        }}
        action l2_unknown() {{
        meta.l2_kind = 0;
        }}
        table l2_forward {{
        key = {{ hdr.ethernet.dst_addr: exact; }}
        actions = {{ l2_to_port; l2_flood; l2_unknown; }}
        default_action = l2_unknown();
        size = {L2_TABLE_SIZE};
        }}

        action set_job(bit<16> epoch, bit<16> slot_base, bit<16> slot_count, bit<16> elems,
        bit<8> workers, bit<16> mgrp, bit<1> up, bit<9> up_port, bit<48> up_mac,
        bit<32> up_ip, bit<16> up_udp_port, bit<16> up_job, bit<16> up_epoch,
        bit<16> up_slot_base, bit<8> up_rank, bit<1> up_blocks, bit<9> rank0_port) {{
        meta.job_hit = 1;
        meta.up = up;
        meta.up_port = up_port;
        meta.up_mac = up_mac;
        meta.up_ip = up_ip;
        meta.up_udp_port = up_udp_port;
        meta.up_job = up_job;
        meta.up_epoch = up_epoch;
        meta.up_slot_base = up_slot_base;
        meta.up_rank = up_rank;
        meta.up_blocks = up_blocks;
        meta.rank0_port = rank0_port;
        meta.job_epoch = epoch;
        meta.job_slot_base = slot_base;
        meta.job_slot_count = slot_count;
        meta.job_elems = elems;
        meta.job_workers = workers;
        meta.job_mgrp = mgrp;
        }}
        action unknown_job() {{
        meta.job_hit = 0;
        }}
        table ina_job {{
        key = {{ meta.job_key: exact; }}
        actions = {{ set_job; unknown_job; }}
        default_action = unknown_job();
        size = {JOB_TABLE_SIZE};
        }}

        // A frame of the upper switch of job `job` here (PROTOCOL.md §9): by the upper job it
        // names, and the port, IPv4 address and UDP port it came from.
        action from_upper(bit<16> job) {{
        meta.from_upper = 1;
        meta.job_key = job;
        }}
        table ina_uplink {{
        key = {{
        hdr.ina.job: exact;
        sm.ingress_port: exact;
        hdr.ipv4.src_addr: exact;
        hdr.udp.src_port: exact;
        }}
        actions = {{ from_upper; NoAction; }}
        default_action = NoAction();
        size = {JOB_TABLE_SIZE};
        }}

        action set_rank(bit<9> port, bit<32> ip, bit<16> udp_port) {{
        meta.rank_hit = 1;
        meta.rank_port = port;
        meta.rank_ip = ip;
        meta.rank_udp_port = udp_port;
        }}
        action unknown_rank() {{
        meta.rank_hit = 0;
        }}
        table ina_rank {{
        key = {{ hdr.ina.job: exact; hdr.ina.rank: exact; }}
        actions = {{ set_rank; unknown_rank; }}
        default_action = unknown_rank();
        size = {RANK_TABLE_SIZE};
        }}
        "
    ));
    for hi in [false, true] {
        value_actions(p, hi);
        p.line("");
    }
    p.lines(
        "// The Ethernet, IPv4 and UDP headers of a reply whose ina packet is ina_len bytes long,
        // from the switch to the frame's sender (wire::frame::emit_headers).
        action reply_headers(bit<16> ina_len) {
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = meta.sw_mac;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.udp.dst_port = hdr.udp.src_port;",
    );
    common::reply_headers(p, "meta.sw_ip", Some(("28 + ina_len", "8 + ina_len")));
    p.lines(
        "hdr.ina.gap = 0;
        hdr.ina.gap_on = 0;
        meta.reply = 1;
        meta.reply_len = 42 + (bit<32>)ina_len;
        }

        // A reply back out of the ingress port.
        action unicast(bit<32> event) {
        meta.event = event;
        meta.out_kind = OUT_PORT;
        meta.out_port = sm.ingress_port;
        }

        action no_payload() {
        hdr.elems_lo.setInvalid();
        hdr.elems_hi.setInvalid();
        hdr.ina_bitmap.setInvalid();
        hdr.ina_probe.setInvalid();
        }

        action reject(bit<8> reason, bit<32> event) {
        no_payload();
        hdr.ina.msg_type = INA_REJECT;
        hdr.ina.epoch = meta.job_epoch;
        hdr.ina.exponent = reason;
        hdr.ina.count = 0;
        reply_headers(INA_HEADER_LEN);
        unicast(event);
        }

        action pending(bit<32> bitmap) {
        no_payload();
        hdr.ina_bitmap.setValid();
        hdr.ina_bitmap.bitmap = bitmap;
        hdr.ina.msg_type = INA_PENDING;
        hdr.ina.epoch = meta.job_epoch;
        hdr.ina.exponent = 0;
        hdr.ina.count = 1;
        reply_headers(INA_HEADER_LEN + 4);
        unicast(EV_PENDING_SENT);
        }

        action probe_reply() {
        no_payload();
        hdr.ina_probe.setValid();",
    );
    common::probe_fields(
        p,
        "hdr.ina_probe",
        [
            "meta.job_workers",
            "meta.job_elems",
            "meta.job_slot_base",
            "meta.job_slot_count",
        ],
    );
    p.lines(
        "        hdr.ina.msg_type = INA_PROBE_REPLY;
        hdr.ina.epoch = meta.job_epoch;
        hdr.ina.count = 4;
        reply_headers(INA_HEADER_LEN + 16);
        // The gap flag: this switch sends Missing reports.
        hdr.ina.gap_on = meta.reports;
        unicast(EV_PROBES_ANSWERED);
        }

        // The header of a Result of `count` elements (the payload headers hold the sums).
        action result_header(bit<32> exp, bit<16> count) {
        hdr.ina_bitmap.setInvalid();
        hdr.ina_probe.setInvalid();
        hdr.ina.msg_type = INA_RESULT;
        hdr.ina.exponent = exp[7:0];
        hdr.ina.count = count;
        reply_headers(INA_HEADER_LEN + (count << 2));
        }

        action drop_event(bit<32> event) {
        meta.event = event;
        meta.out_kind = OUT_DROP;
        }

        // The Result in the header to every rank of the job.
        action multicast_result() {
        meta.out_kind = OUT_GROUP;
        meta.out_group = meta.job_mgrp;
        meta.mcast_result = 1;
        ina_multicast.count(0);
        }",
    );
    stamp_action(
        p,
        "// The block's next result counter, and the use it numbers (PROTOCOL.md §5, \"Lost
        // results\"), into the Result in the header.",
        "result",
        Some("reg_result_seq"),
    );
    stamp_action(
        p,
        "// The block's next partial counter, and the use it numbers (PROTOCOL.md §9), into the
        // partial in the header.",
        "partial",
        Some("reg_partial_seq"),
    );
    uplink_actions(p);
    p.line("");
    ingress_apply(p);
    p.line("}");
    p.line("");
}

/// Action `stamp_WHAT`: the next counter of the slot's block from `reg_WHAT_gap`, the use it
/// numbers (`2 * slot + set + 1`) into `reg_WHAT_use` and, if given, its sequence number into
/// `seq_reg`, and the counter into the header's gap field.
fn stamp_action(p: &mut P4, comment: &str, what: &str, seq_reg: Option<&str>) {
    p.line("");
    p.lines(comment);
    p.lines(&format!(
        "action stamp_{what}() {{
        bit<32> block = meta.slot_index >> GAP_BLOCK_SHIFT;
        bit<8> next;
        reg_{what}_gap.read(next, block);
        reg_{what}_gap.write(block, (next + 1) & (bit<8>)(GAP_COUNTER - 1));
        reg_{what}_use.write(block * GAP_COUNTER + (bit<32>)next, meta.value_index + 1);"
    ));
    if let Some(reg) = seq_reg {
        p.line(&format!(
            "{reg}.write(block * GAP_COUNTER + (bit<32>)next, hdr.ina.seq);"
        ));
    }
    p.lines(
        "hdr.ina.gap = next[5:0];
        hdr.ina.gap_on = 1;
        }",
    );
}

/// The actions of a rack switch (PROTOCOL.md §9): what it sends up, and the Pending it passes
/// on to rank 0.
fn uplink_actions(p: &mut P4) {
    p.lines(
        "
        // The Ethernet, IPv4 and UDP headers of a frame to the job's upper switch whose ina
        // packet is ina_len bytes long, out of the uplink's port.
        action up_headers(bit<16> ina_len) {
        hdr.ethernet.dst_addr = meta.up_mac;
        hdr.ethernet.src_addr = meta.sw_mac;
        hdr.ipv4.dst_addr = meta.up_ip;
        hdr.udp.dst_port = meta.up_udp_port;",
    );
    common::reply_headers(p, "meta.sw_ip", Some(("28 + ina_len", "8 + ina_len")));
    p.lines(
        "hdr.ina.gap = 0;
        hdr.ina.gap_on = 0;
        hdr.ina.job = meta.up_job;
        hdr.ina.epoch = meta.up_epoch;
        hdr.ina.rank = meta.up_rank;
        meta.reply = 1;
        meta.reply_len = 42 + (bit<32>)ina_len;
        meta.out_kind = OUT_PORT;
        meta.out_port = meta.up_port;
        }

        // Slot `slot` here in the upper job.
        action slot_up(bit<16> slot) {
        hdr.ina.slot = slot - meta.job_slot_base + meta.up_slot_base;
        }

        // The partial sum (the payload headers hold it) of a use of slot `slot` here, with
        // exponent byte exp and `count` elements, as this switch's Data in the upper job.
        action partial(bit<32> exp, bit<16> slot, bit<16> count) {
        hdr.ina_bitmap.setInvalid();
        hdr.ina_probe.setInvalid();
        hdr.ina.msg_type = INA_DATA;
        hdr.ina.exponent = exp[7:0];
        hdr.ina.count = count;
        slot_up(slot);
        up_headers(INA_HEADER_LEN + (count << 2));
        }

        // This switch's Query, asking `ask`, of the use of slot `slot` here in the upper job.
        action query_up(bit<16> slot, bit<8> ask) {
        no_payload();
        hdr.ina.msg_type = INA_QUERY;
        hdr.ina.exponent = ask;
        hdr.ina.count = 0;
        slot_up(slot);
        up_headers(INA_HEADER_LEN);
        }

        // A Pending with `bitmap` of the use of slot `slot` here to rank 0, whose asking the
        // upper switch answered (the egress addresses it to rank 0).
        action pending_to_rank0(bit<16> slot, bit<32> bitmap) {
        pending(bitmap);
        hdr.ina.job = meta.job_key;
        hdr.ina.rank = UPLINK_TIMER_RANK;
        hdr.ina.slot = slot;
        meta.out_port = meta.rank0_port;
        meta.mcast_result = 1;
        meta.event = EV_UPPER_ANSWERS;
        }",
    );
}

/// The ingress apply block: §7's classification, §6's checks and both decision tables.
fn ingress_apply(p: &mut P4) {
    p.line("apply {");
    frame_and_checks(p);
    read_slot(p);
    query_table(p);
    data_table(p);
    write_back_and_forward(p);
    p.line("}");
}

/// §7's classification of a frame and §6's checks, in order, up to an accepted Data or Query.
fn frame_and_checks(p: &mut P4) {
    p.lines(
        "switch_addr.apply();
        meta.event = EV_MALFORMED;
        meta.out_kind = OUT_DROP;
        if (!hdr.ethernet.isValid()) {
        meta.event = EV_MALFORMED;
        } else if (hdr.arp.isValid() && hdr.arp.htype == 1 && hdr.arp.ptype == ETHERTYPE_IPV4
        && hdr.arp.hlen == 6 && hdr.arp.plen == 4 && hdr.arp.oper == 1
        && hdr.arp.tpa == meta.sw_ip) {
        // Section 7, rule 1: the ARP reply, in the request's frame.
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = meta.sw_mac;
        hdr.arp.oper = 2;
        hdr.arp.tha = hdr.arp.sha;
        hdr.arp.tpa = hdr.arp.spa;
        hdr.arp.sha = meta.sw_mac;
        hdr.arp.spa = meta.sw_ip;
        unicast(EV_ARP_REPLIED);
        } else if (hdr.ipv4.isValid() && hdr.ipv4.dst_addr == meta.sw_ip) {
        // Section 7, rule 2: to the switch.
        if (hdr.ipv4.ihl != 5 || hdr.ipv4.flags[0:0] != 0 || hdr.ipv4.frag_offset != 0
        || hdr.ipv4.protocol != IP_PROTO_UDP) {
        meta.event = EV_NOT_INA;
        } else if (!hdr.udp.isValid()) {
        meta.event = EV_MALFORMED;
        } else if (hdr.udp.dst_port != INA_UDP_PORT) {
        meta.event = EV_NOT_INA;
        } else if (hdr.udp.length < 8 + INA_HEADER_LEN
        || (bit<32>)hdr.udp.length + 34 > sm.packet_length || !hdr.ina.isValid()) {
        meta.event = EV_MALFORMED;
        } else if (hdr.ina.version != INA_VERSION
        || (bit<32>)(hdr.udp.length - 8 - INA_HEADER_LEN) != ((bit<32>)hdr.ina.count << 2)
        || hdr.ina.msg_type == 0 || hdr.ina.msg_type > INA_MISSING
        || (hdr.ina.msg_type == INA_REJECT
        && (hdr.ina.exponent == 0 || hdr.ina.exponent > REJECT_BAD_COUNT))) {
        // Check 1: length, version, known type (and a known reject reason).
        meta.event = EV_MALFORMED;
        } else {
        meta.job_key = hdr.ina.job;
        if (hdr.ina.msg_type == INA_RESULT || hdr.ina.msg_type == INA_PENDING
        || hdr.ina.msg_type == INA_REJECT || hdr.ina.msg_type == INA_MISSING) {
        // Check 2 lets an upper switch's answers through (PROTOCOL.md §9).
        ina_uplink.apply();
        }
        if (meta.from_upper == 0 && hdr.ina.msg_type != INA_DATA
        && hdr.ina.msg_type != INA_QUERY && hdr.ina.msg_type != INA_PROBE
        && (hdr.ina.msg_type != INA_MISSING || meta.reports == 0)) {
        meta.event = EV_UNEXPECTED_TYPE;
        } else {
        ina_job.apply();
        if (meta.job_hit == 0) {
        meta.event = EV_UNKNOWN_JOB;
        } else if (meta.from_upper == 1) {",
    );
    from_upper(p);
    p.lines(
        "} else {
        ina_rank.apply();
        if (meta.rank_hit == 0) {
        meta.event = EV_UNKNOWN_RANK;
        } else if (sm.ingress_port != meta.rank_port || hdr.ipv4.src_addr != meta.rank_ip
        || hdr.udp.src_port != meta.rank_udp_port) {
        meta.event = EV_WRONG_PORT;
        } else if (hdr.ina.msg_type == INA_PROBE) {
        probe_reply();
        if (meta.job_elems == MAX_ELEMS) {
        // No reports offered to a job of 256 elements: its Queries of complete uses get a
        // Pending answer instead of the Result (see the module's documentation).
        hdr.ina.gap_on = 0;
        }
        } else {
        // A Missing report of results the rank lacks (PROTOCOL.md §5, \"Lost results\"):
        // answered as the rank's fetching Query of the use its counter numbered.
        if (hdr.ina.msg_type == INA_MISSING) {
        if (hdr.ina.epoch == meta.job_epoch && hdr.ina.gap_on == 1
        && hdr.ina.slot >= meta.job_slot_base
        && (bit<32>)hdr.ina.slot < (bit<32>)meta.job_slot_base + (bit<32>)meta.job_slot_count) {
        bit<32> block = (bit<32>)hdr.ina.slot >> GAP_BLOCK_SHIFT;
        bit<32> recorded;
        reg_result_use.read(recorded, block * GAP_COUNTER + (bit<32>)hdr.ina.gap);
        bit<32> named = recorded - 1;
        if (recorded != 0 && (named >> (GAP_BLOCK_SHIFT + 1)) == block) {
        no_payload();
        hdr.ina.msg_type = INA_QUERY;
        hdr.ina.slot = (bit<16>)(named >> 1);
        hdr.ina.set = named[0:0];
        reg_result_seq.read(hdr.ina.seq, block * GAP_COUNTER + (bit<32>)hdr.ina.gap);
        hdr.ina.exponent = QUERY_FETCH;
        hdr.ina.count = 0;
        ina_missing.count(MISSING_RECEIVED);
        }
        }
        }
        if (hdr.ina.msg_type == INA_MISSING) {
        // No use recorded under its counter (a matched report is a Query by now).
        drop_event(EV_MISSING_UNMATCHED);
        } else if (hdr.ina.epoch != meta.job_epoch) {
        reject(REJECT_STALE_EPOCH, EV_STALE_EPOCH);
        } else if (hdr.ina.slot < meta.job_slot_base
        || (bit<32>)hdr.ina.slot >= (bit<32>)meta.job_slot_base + (bit<32>)meta.job_slot_count) {
        reject(REJECT_SLOT_OUT_OF_RANGE, EV_SLOT_OUT_OF_RANGE);
        } else if ((hdr.ina.msg_type == INA_DATA && hdr.ina.count != 0
        && hdr.ina.count != meta.job_elems)
        || (hdr.ina.msg_type == INA_QUERY && hdr.ina.count != 0)) {
        reject(REJECT_BAD_COUNT, EV_BAD_COUNT);
        } else {",
    );
}

/// The cells of set X (`hdr.ina.set`) and of the other set of slot `meta.slot_index`, and what
/// both the ranks' and the upper switch's packets read of them: whether the use waits for its
/// total, its partial's element count, whether its block keeps gap cells.
fn slot_cells(p: &mut P4) {
    p.lines(
        "bit<1> x = hdr.ina.set;
        meta.value_index = (meta.slot_index << 1) | (bit<32>)x;
        bit<64> c_seq;
        bit<64> c_bitmap;
        bit<64> c_count;
        bit<64> c_exp;
        reg_seq.read(c_seq, meta.slot_index);
        reg_bitmap.read(c_bitmap, meta.slot_index);
        reg_count.read(c_count, meta.slot_index);
        reg_exp.read(c_exp, meta.slot_index);
        bit<32> seq_x = c_seq[31:0];
        bit<32> seq_o = c_seq[63:32];
        bit<32> bitmap_x = c_bitmap[31:0];
        bit<32> bitmap_o = c_bitmap[63:32];
        bit<32> count_x = c_count[31:0];
        bit<32> count_o = c_count[63:32];
        bit<32> exp_x = c_exp[31:0];
        bit<32> exp_o = c_exp[63:32];
        if (x == 1) {
        seq_x = c_seq[63:32];
        seq_o = c_seq[31:0];
        bitmap_x = c_bitmap[63:32];
        bitmap_o = c_bitmap[31:0];
        count_x = c_count[63:32];
        count_o = c_count[31:0];
        exp_x = c_exp[63:32];
        exp_o = c_exp[31:0];
        }
        // A use every rank here contributed to, waiting for its upper switch's total (§9),
        // and the element count of its partial sum.
        bool awaiting = count_x == AWAITING_TOTAL || count_x == AWAITING_TOTAL_HEADER;
        bit<16> partial_count = 0;
        if (count_x == AWAITING_TOTAL) {
        partial_count = meta.job_elems;
        }
        // Whether the slot's block of 64 lies wholly in the job (only such blocks keep gap
        // cells, PROTOCOL.md §5).
        bit<32> block_start = meta.slot_index & ~(GAP_BLOCK - 1);
        bool block_in_job = block_start >= (bit<32>)meta.job_slot_base
        && block_start + GAP_BLOCK <= (bit<32>)meta.job_slot_base + (bit<32>)meta.job_slot_count;",
    );
}

/// The registers of set X written back (after an arrival or a total).
fn write_slot(p: &mut P4) {
    p.lines(
        "if (x == 1) {
        reg_seq.write(meta.slot_index, seq_x ++ seq_o);
        reg_bitmap.write(meta.slot_index, bitmap_x ++ bitmap_o);
        reg_count.write(meta.slot_index, count_x ++ count_o);
        reg_exp.write(meta.slot_index, exp_x ++ exp_o);
        } else {
        reg_seq.write(meta.slot_index, seq_o ++ seq_x);
        reg_bitmap.write(meta.slot_index, bitmap_o ++ bitmap_x);
        reg_count.write(meta.slot_index, count_o ++ count_x);
        reg_exp.write(meta.slot_index, exp_o ++ exp_x);
        }",
    );
}

/// The gap register's step for the counter `counter` of cell `index` of register `reg`
/// (`proto::gap::take_counter`): a counter 1 to MAX_REPORTED_GAP + 1 ahead of the cell's
/// own is taken, and if it skipped any, `then` runs with `skipped` and `latest` in scope.
fn take_counter(p: &mut P4, reg: &str, index: &str, counter: &str, then: &str) {
    p.lines(&format!(
        "bit<32> latest;
        {reg}.read(latest, {index});
        bit<32> skipped = ({counter} + 2 * GAP_COUNTER - latest - 1) & (GAP_COUNTER - 1);
        if (latest == 0) {{
        {reg}.write({index}, GAP_COUNTER + {counter});
        }} else if (skipped <= MAX_REPORTED_GAP) {{
        {reg}.write({index}, GAP_COUNTER + {counter});
        if (skipped != 0) {{
        meta.rep_first = (bit<8>)((latest + 1) & (GAP_COUNTER - 1));
        meta.rep_skipped = (bit<8>)skipped;
        {then}
        }}
        }}"
    ));
}

/// A frame of a job's upper switch (PROTOCOL.md §9's rows for packets in on the uplink port):
/// a total, or an answer to this switch's Query or partial. Counted `upper_answers` unless it
/// is a total stored (`totals_received`), a copy of one (`duplicate`) or of another use
/// (`stale_seq`).
fn from_upper(p: &mut P4) {
    p.lines(
        "meta.event = EV_UPPER_ANSWERS;
        meta.out_kind = OUT_DROP;
        // The slot here, and whether the job has it.
        bit<16> up_i = hdr.ina.slot - meta.up_slot_base;
        bit<16> here = meta.job_slot_base + up_i;
        bool in_range = up_i < meta.job_slot_count;
        bool to_me = hdr.ina.rank == meta.up_rank;
        if (hdr.ina.msg_type == INA_MISSING) {
        // A report of lost partials: the use whose partial carried the first counter it
        // names (slot, set and sequence number), read and cleared (the report's second copy
        // finds nothing).
        bool named = false;
        if (to_me && hdr.ina.epoch == meta.up_epoch && in_range && hdr.ina.gap_on == 1) {
        bit<32> block = (bit<32>)here >> GAP_BLOCK_SHIFT;
        bit<32> cell = block * GAP_COUNTER + (bit<32>)hdr.ina.gap;
        bit<32> recorded;
        reg_partial_use.read(recorded, cell);
        bit<32> named_use = recorded - 1;
        if (recorded != 0 && (named_use >> (GAP_BLOCK_SHIFT + 1)) == block) {
        reg_partial_use.write(cell, 0);
        reg_partial_seq.read(hdr.ina.seq, cell);
        here = (bit<16>)(named_use >> 1);
        hdr.ina.set = named_use[0:0];
        named = true;
        }
        }
        in_range = named;
        }
        if (in_range) {
        meta.slot_index = (bit<32>)here;",
    );
    slot_cells(p);
    p.lines(
        "bool waiting = to_me && hdr.ina.seq == seq_x && awaiting;
        if (hdr.ina.msg_type == INA_RESULT) {
        if (hdr.ina.epoch == meta.up_epoch
        && (hdr.ina.count == 0 || hdr.ina.count == meta.job_elems)) {
        if (meta.reports == 1 && hdr.ina.gap_on == 1 && meta.up_blocks == 1 && block_in_job) {
        // The total's counter: totals skipped are reported up, once.
        bit<32> total_index = meta.slot_index >> GAP_BLOCK_SHIFT;
        bit<32> total_gap = (bit<32>)hdr.ina.gap;",
    );
    take_counter(
        p,
        "reg_total_gap",
        "total_index",
        "total_gap",
        "meta.rep_rank = meta.up_rank;
        clone_preserving_field_list(CloneType.I2E,
        UPLINK_REPORT_SESSION_BASE + (bit<32>)sm.ingress_port, FL_REPORT);",
    );
    p.lines(
        "}
        if (hdr.ina.seq != seq_x) {
        drop_event(EV_STALE_SEQ);
        } else if (awaiting && hdr.ina.count == partial_count) {
        // The total: stored as the use's result and multicast to every rank.
        exp_x = (bit<32>)hdr.ina.exponent;
        count_x = 0;
        if (hdr.elems_lo.isValid()) {
        values_write_elems_lo();
        }
        if (hdr.elems_hi.isValid()) {
        values_write_elems_hi();
        }",
    );
    write_slot(p);
    p.lines(
        "result_header(exp_x, hdr.ina.count);
        hdr.ina.job = meta.job_key;
        hdr.ina.epoch = meta.job_epoch;
        hdr.ina.rank = 0;
        hdr.ina.slot = here;
        if (meta.reports == 1 && block_in_job) {
        stamp_result();
        }
        multicast_result();
        meta.event = EV_TOTALS_RECEIVED;
        } else if (awaiting && partial_count != 0 && hdr.ina.count == 0) {
        // The total's header alone answers a status Query: the total was lost on the way
        // down, and a fetching Query brings it.
        query_up(here, QUERY_FETCH);
        } else {
        drop_event(EV_DUPLICATE);
        }
        }
        } else if (hdr.ina.msg_type == INA_PENDING) {
        if (waiting && hdr.ina.epoch == meta.up_epoch && hdr.ina_bitmap.isValid()) {
        if ((hdr.ina_bitmap.bitmap & ((bit<32>)1 << meta.up_rank[4:0])) == 0) {
        // Without this switch's bit: the partial was lost on the way up.
        if (partial_count != 0) {
        values_read_elems_lo();
        }
        partial(exp_x, here, partial_count);
        } else {
        // With it: another rack is late; rank 0 waits.
        pending_to_rank0(here, bitmap_x);
        }
        }
        } else if (hdr.ina.msg_type == INA_REJECT) {
        // Any epoch: a wrong one is what most Rejects say. Rank 0 learns that every rank
        // here contributed.
        if (waiting) {
        pending_to_rank0(here, bitmap_x);
        }
        } else if (waiting) {
        // The Missing's use: its partial again.
        if (partial_count != 0) {
        values_read_elems_lo();
        }
        partial(exp_x, here, partial_count);
        }
        }",
    );
}

/// The slot's registers: the cells of set X and of the other set; the use's `delta` and `seen`.
fn read_slot(p: &mut P4) {
    p.line("// The slot's registers: the cells of set X and of the other set.");
    p.line("meta.slot_index = (bit<32>)hdr.ina.slot;");
    slot_cells(p);
    p.lines(
        "// What the gap register needs, read before the tables rewrite the header.
        bool is_data = hdr.ina.msg_type == INA_DATA;
        bit<32> gap_in = (bit<32>)hdr.ina.gap;
        bit<8> rank_in = hdr.ina.rank;
        bit<1> gap_on_in = hdr.ina.gap_on;
        bit<32> rank_bit = (bit<32>)1 << hdr.ina.rank[4:0];
        bit<32> delta = hdr.ina.seq - seq_x;
        bool seen = (bitmap_x & rank_bit) != 0;
        bool arrival = false;
        if (delta[31:31] == 1) {
        // An older use: stale.
        drop_event(EV_STALE_SEQ);",
    );
}

/// A rank's retransmission or Query of a use waiting for its total (PROTOCOL.md §9): rank 0's
/// asks the upper switch with a status Query; any other rank gets a Pending with every rank's
/// bit; a rank that did not contribute sent a late copy.
fn answer_waiting(p: &mut P4) {
    p.lines(
        "if (!seen) {
        drop_event(EV_DUPLICATE);
        } else if (hdr.ina.rank != UPLINK_TIMER_RANK) {
        pending(bitmap_x);
        } else {
        query_up(hdr.ina.slot, QUERY_STATUS);
        meta.event = EV_SENT_UP;
        }",
    );
}

/// §6's decision table for an accepted Query (after the stale row).
fn query_table(p: &mut P4) {
    p.lines(
        "} else if (hdr.ina.msg_type == INA_QUERY) {
        if (delta != 0) {
        pending(0);
        } else if (awaiting && seen && hdr.ina.rank == UPLINK_TIMER_RANK
        && hdr.ina.exponent != QUERY_STATUS && meta.reports == 1) {
        // Rank 0 asks for the partial of a use waiting for its total (PROTOCOL.md §9): it
        // goes up again.
        if (count_x == AWAITING_TOTAL) {
        values_read_elems_lo();
        }
        partial(exp_x, hdr.ina.slot, partial_count);
        meta.event = EV_SENT_UP;
        } else if (awaiting) {",
    );
    answer_waiting(p);
    p.lines(
        "} else if (count_x != 0) {
        pending(bitmap_x);
        } else if (seen && hdr.ina.exponent[0:0] == 1 && meta.job_elems == MAX_ELEMS) {
        // bmv2 adds at most 512 bytes to a frame: the Result of 256 elements cannot be made
        // from a Query. A Pending answer without the sender's bit makes the sender send its
        // data again, and that full-size retransmission gets the stored Result.
        pending(bitmap_x & ~rank_bit);
        } else if (seen) {
        // The stored Result: E elements if bit 0 of the Query's exponent byte asks for the
        // sums, else the header alone.
        if (hdr.ina.exponent[0:0] == 1) {
        hdr.ina.count = meta.job_elems;
        values_read_elems_lo();
        if (meta.job_elems == MAX_ELEMS) {
        values_read_elems_hi();
        }
        }
        result_header(exp_x, hdr.ina.count);
        unicast(EV_RESULTS_UNICAST);
        } else {
        drop_event(EV_DUPLICATE);
        }",
    );
}

/// §6's decision table for an accepted Data packet.
fn data_table(p: &mut P4) {
    p.lines("} else if (delta == 0 && awaiting) {");
    answer_waiting(p);
    p.lines(
        "} else if (delta != 0) {
        // First arrival of a new use.
        seq_x = hdr.ina.seq;
        bitmap_x = rank_bit;
        bitmap_o = bitmap_o & ~rank_bit;
        exp_x = (bit<32>)hdr.ina.exponent;
        count_x = (bit<32>)meta.job_workers - 1;
        if (hdr.ina.count == 0 && count_x != 0) {
        // A use begun by a header: its later arrivals must be headers too.
        count_x = count_x | HEADER_USE;
        }
        if (hdr.elems_lo.isValid()) {
        values_write_elems_lo();
        }
        if (hdr.elems_hi.isValid()) {
        values_write_elems_hi();
        }
        meta.event = EV_DATA_FIRST;
        arrival = true;
        } else if (seen && count_x == 0) {
        // Retransmission to a complete use: the stored Result.
        if (hdr.elems_lo.isValid()) {
        values_read_elems_lo();
        }
        if (hdr.elems_hi.isValid()) {
        values_read_elems_hi();
        }
        result_header(exp_x, hdr.ina.count);
        unicast(EV_RESULTS_UNICAST);
        } else if (seen) {
        // Retransmission to an incomplete use.
        pending(bitmap_x);
        } else if (count_x == 0) {
        // A late copy of a complete use.
        drop_event(EV_DUPLICATE);
        } else if ((count_x[31:31] == 1 && hdr.ina.count != 0)
        || (count_x[31:31] == 0 && hdr.ina.count == 0)) {
        // A payload to a use begun by a header, or the reverse: refused, and the set's
        // registers stay as they are. Its rank has moved on to this use all the same and
        // leaves the other set, unless that set holds a newer use (as on Tofino).
        reject(REJECT_BAD_COUNT, EV_BAD_COUNT);
        if ((int<32>)(seq_o - hdr.ina.seq) <= 0) {
        bitmap_o = bitmap_o & ~rank_bit;",
    );
    write_slot(p);
    p.lines(
        "}
        } else {
        // A later arrival.
        bitmap_x = bitmap_x | rank_bit;
        bitmap_o = bitmap_o & ~rank_bit;
        if ((bit<32>)hdr.ina.exponent > exp_x) {
        exp_x = (bit<32>)hdr.ina.exponent;
        }
        count_x = count_x - 1;
        if (count_x == HEADER_USE) {
        count_x = 0;
        }
        if (hdr.elems_lo.isValid()) {
        values_add_elems_lo();
        }
        if (hdr.elems_hi.isValid()) {
        values_add_elems_hi();
        }
        meta.event = EV_DATA_ADDED;
        arrival = true;
        }",
    );
}

/// An arrival's registers written back and the last arrival's Result multicast; §7 rule 3 (ordinary traffic); where the frame leaves.
fn write_back_and_forward(p: &mut P4) {
    p.lines(
        "if (arrival) {
        bool last = count_x == 0;
        if (last && meta.up == 1) {
        // Every rank here contributed: the use waits for the upper switch's total.
        count_x = AWAITING_TOTAL;
        if (hdr.ina.count == 0) {
        count_x = AWAITING_TOTAL_HEADER;
        }
        }",
    );
    write_slot(p);
    p.lines(
        "if (last && meta.up == 1) {
        // The partial sum up, with the block's next partial counter if the block is one of
        // the upper job's too (PROTOCOL.md §9).
        partial(exp_x, hdr.ina.slot, hdr.ina.count);
        if (meta.reports == 1 && meta.up_blocks == 1 && block_in_job) {
        stamp_partial();
        }
        } else if (last) {
        // The last arrival: the Result to every rank.
        result_header(exp_x, hdr.ina.count);
        if (meta.reports == 1 && block_in_job) {
        stamp_result();
        }
        multicast_result();
        }
        }
        if (is_data && meta.reports == 1 && gap_on_in == 1 && block_in_job) {
        // The gap register (PROTOCOL.md §5, \"Missing reports\"): the cell of the block and
        // rank takes a counter 1 to MAX_REPORTED_GAP + 1 ahead of its own, and the counters
        // skipped are reported to the sender by a clone of this packet.
        bit<32> gap_index = ((meta.slot_index >> GAP_BLOCK_SHIFT) << GAP_RANKS_SHIFT)
        | (bit<32>)rank_in[4:0];",
    );
    take_counter(
        p,
        "reg_gap",
        "gap_index",
        "gap_in",
        "meta.rep_rank = rank_in;
        clone_preserving_field_list(CloneType.I2E,
        REPORT_SESSION_BASE + (bit<32>)sm.ingress_port, FL_REPORT);
        ina_missing.count(MISSING_SENT);",
    );
    p.lines(
        "}
        }
        }
        }
        }
        }
        } else {
        // Section 7, rule 3: ordinary traffic.
        l2_forward.apply();
        if (meta.l2_kind == 1 && meta.l2_port != sm.ingress_port) {
        meta.event = EV_L2_FORWARDED;
        meta.out_kind = OUT_PORT;
        meta.out_port = meta.l2_port;
        } else if (meta.l2_kind == 2) {
        meta.event = EV_L2_FORWARDED;
        meta.out_kind = OUT_GROUP;
        meta.out_group = meta.l2_mgrp;
        meta.flood = 1;
        } else {
        meta.event = EV_L2_UNKNOWN;
        }
        }
        ina_events.count(meta.event);
        if (meta.out_kind == OUT_PORT) {
        sm.egress_spec = meta.out_port;
        } else if (meta.out_kind == OUT_GROUP) {
        sm.mcast_grp = meta.out_group;
        } else {
        mark_to_drop(sm);
        }",
    );
}

fn egress(p: &mut P4) {
    p.lines(
        "control InaEgress(inout headers_t hdr, inout metadata_t meta,
        inout standard_metadata_t sm) {",
    );
    common::rewrite_dst_action(p);
    p.lines(&format!(
        "        // The addresses of each rank, by job and replication id (= rank).
        table ina_rank_addr {{
        key = {{ hdr.ina.job: exact; sm.egress_rid: exact; }}
        actions = {{ rewrite_dst; NoAction; }}
        default_action = NoAction();
        size = {RANK_TABLE_SIZE};
        }}
        // A report of lost data (PROTOCOL.md §5): the clone of the Data packet that showed the
        // gap becomes a header-only Missing to its sender, naming the counters skipped. (A
        // rack switch's report of lost totals is the clone of the total, to the upper switch,
        // with this switch's rank there.)
        action report() {{
        hdr.elems_lo.setInvalid();
        hdr.elems_hi.setInvalid();
        hdr.ina_bitmap.setInvalid();
        hdr.ina_probe.setInvalid();
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = meta.sw_mac;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.udp.dst_port = hdr.udp.src_port;
        {report_headers}
        hdr.ina.msg_type = INA_MISSING;
        hdr.ina.rank = meta.rep_rank;
        hdr.ina.gap = meta.rep_first[5:0];
        hdr.ina.gap_on = 1;
        hdr.ina.exponent = meta.rep_skipped;
        hdr.ina.count = 0;
        meta.reply = 1;
        meta.reply_len = 42 + (bit<32>)INA_HEADER_LEN;
        }}
        apply {{
        if (sm.instance_type == INSTANCE_INGRESS_CLONE) {{
        report();
        }}
        if (meta.flood == 1 && sm.egress_port == sm.ingress_port) {{
        mark_to_drop(sm);
        }} else {{
        if (meta.mcast_result == 1) {{
        ina_rank_addr.apply();
        }}
        if (meta.reply == 1) {{
        // Nothing the frame carried after its datagram leaves with a reply.
        truncate(meta.reply_len);
        }}
        }}
        }}
        }}",
        report_headers = report_headers()
    ));
    p.line("");
}

/// The IPv4 and UDP headers of a Missing report (a header-only reply from the switch).
fn report_headers() -> String {
    let mut p = P4::default();
    common::reply_headers(
        &mut p,
        "meta.sw_ip",
        Some(("28 + INA_HEADER_LEN", "8 + INA_HEADER_LEN")),
    );
    p.finish()
}

fn checksums_and_deparser(p: &mut P4) {
    p.lines(
        &"control InaComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
        apply {
        update_checksum(meta.reply == 1,
        IPV4_CHECKSUM_FIELDS,
        hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
        }
        }

        control InaDeparser(packet_out pkt, in headers_t hdr) {
        apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.arp);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.ina);
        pkt.emit(hdr.ina_bitmap);
        pkt.emit(hdr.ina_probe);
        pkt.emit(hdr.elems_lo);
        pkt.emit(hdr.elems_hi);
        }
        }

        V1Switch(InaParser(), InaVerifyChecksum(), InaIngress(), InaEgress(),
        InaComputeChecksum(), InaDeparser()) main;"
            .replace("IPV4_CHECKSUM_FIELDS", common::IPV4_CHECKSUM_FIELDS),
    );
}
