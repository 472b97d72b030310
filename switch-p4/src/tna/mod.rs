//! The Tofino 1 program (TNA) of `ina`'s data plane, generated: [`program`] writes the whole
//! P4-16 text, `switch-p4/tna/ina.p4` is its committed copy, and [`check_job`] is the
//! control-plane check of a job against what the program can do.
//!
//! The program is PROTOCOL.md §6 and §7 written the way Tofino 1 forces it: every register is
//! read and written at most once per pass by one `RegisterAction`, a stage holds at most four
//! stateful ALUs, an ALU returns 32 of its 64 bits, and ingress has twelve stages. Its stage plan,
//! which p4c-barefoot keeps (docs/P4-RESOURCES.md has its resource report):
//!
//! | stage | tables | stateful ALUs |
//! |------:|--------|---------------|
//! | 0 | `switch_addr`, `prep_cells`, `prep_gap_counter`, `l2_forward`, `ina_job`, `ina_rank`, `gap_block`, `result_use_access`, `result_seq_access` | `reg_result_use`, `reg_result_seq` |
//! | 1 | `rank_source`, `ip_target`, `uplink_frame`, `rank_bit`, `prep_compare`, `prep_gap_previous`, `arp_target`, `full_mask`, `requery_access` | - |
//! | 2 | `ina_check`, `seq_access`, `seq_order_access`, `gap_access` | `reg_seq`, `reg_seq_order`, `reg_gap` |
//! | 3 | `bitmap_own_0/1`, `bitmap_other_0/1`, `exp_access`, `value_select`, `prep_gap` | `reg_bitmap_0`, `reg_bitmap_1`, `reg_exp` |
//! | 4 | `value_0..3`, `seen_check`, `word_check`, `prep_done`, `gap_report` | `reg_value_0..3` |
//! | 5..11 | `value_4..31`, `prep_last` (5), `ina_outcome` (6), `ina_reply` (7), `uplink_reply` (8), `count_event`, `count_multicast` (11) | `reg_value_4..31` |
//!
//! Egress writes every reply's source addresses and fixed IPv4 and UDP fields
//! (`switch_source`), addresses multicast copies (`ina_rank_addr`), reports
//! (`ina_report_addr`) and what a rack switch sends up (`uplink_addr`), and stamps results' gap
//! counters (`reg_result_gap`).
//!
//! A result with a payload needs both halves of every value cell and an ALU returns one: the
//! pass that completes a use (or reads a complete one) returns the high halves into the payload
//! and recirculates the packet once through its own pipe's recirculation port; the second pass
//! reads the low halves and sends the result. Everything else takes one pass, but for a
//! multicast result that takes its block's gap counter: it takes the second pass too.
//!
//! Missing reports (PROTOCOL.md §5): `reg_gap` notes the gap counter of every accepted Data
//! packet to a block wholly inside its job (`gap_block`, filled by the control plane), and a
//! counter that skips 1 to 7 past the cell's is reported by an ingress mirror of the packet to
//! a session of its ingress port, whose multicast group sends the copy twice; egress rewrites
//! each copy into the header-only Missing to the rank (`ina_report_addr`). A multicast result
//! of such a block takes the block's next counter (`reg_result_gap`) on its way to the second
//! pass, which records the use under it (`reg_result_use`, `reg_result_seq`).
//!
//! A rack switch of a tree (PROTOCOL.md §9), with the job's id and slots the same on the upper
//! switch ([`check_job`]): `uplink_frame` marks the upper switch's frames; a use waits for its
//! total while its bitmap is full, the other set holds no newer use and bit 8 of its `reg_exp`
//! cell is clear; the partial leaves as a Result does, to the uplink's port; a total is read on
//! its first pass, stored on its second (which sets bit 8) and multicast; the Queries up and a
//! Pending to rank 0 are rewrites of the packet at hand. A total's gap counter is noted in the
//! block's `reg_gap` cell of rank 31 (no job's) and a skip reported up; a partial carries no
//! gap counter (docs/P4-RESOURCES.md, "Hierarchical aggregation").

use crate::common;
use crate::writer::P4;
use core::fmt::Write as _;
use ina_proto::event::Event;
use ina_proto::event::{MISSING_COUNTERS, MISSING_RECEIVED, MISSING_SENT};
use ina_proto::pipeline::{JobConfig, Uplink};
use ina_proto::pipeline::{HEADER_USE, MAX_REPORTED_GAP};
use ina_wire::agg::{MessageType, ProbeInfo, RejectReason, GAP_BLOCK, GAP_COUNTER, HEADER_LEN};
use ina_wire::PROTOCOL_VERSION;

/// One gap counter in a `reg_gap` cell (16 bits), whose top six bits hold the counter.
const GAP_STEP: u16 = 1 << 10;

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
/// Bit 31 of a set's `reg_bitmap_*` and `reg_exp` cells: its use began with a header, no payload
/// (the Rust model keeps the same bit, `HEADER_USE`, in its count register, which this program
/// does not have). An arrival of the other kind to a use that collects changes neither
/// register and is refused with `BadCount`.
const KIND_BIT: u32 = HEADER_USE;

/// A register the control plane zeroes for a job's slots when it installs the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlRegister {
    /// Its name in `InaIngress`.
    pub name: &'static str,
    /// Its cells per slot: 1 (indexed by slot) or 2 (by `2 * slot + set`).
    pub cells_per_slot: u32,
    /// Whether a cell is a pair (`lo` for set 0, `hi` for set 1) rather than one word.
    pub pair: bool,
}

/// The control registers of the program. (`reg_seq_order` holds the same sequence numbers as
/// `reg_seq`; the program keeps no `reg_count`, see docs/P4-RESOURCES.md.)
pub const CONTROL_REGISTERS: [ControlRegister; 5] = [
    ControlRegister {
        name: "reg_seq",
        cells_per_slot: 1,
        pair: true,
    },
    ControlRegister {
        name: "reg_seq_order",
        cells_per_slot: 1,
        pair: true,
    },
    ControlRegister {
        name: "reg_bitmap_0",
        cells_per_slot: 1,
        pair: false,
    },
    ControlRegister {
        name: "reg_bitmap_1",
        cells_per_slot: 1,
        pair: false,
    },
    ControlRegister {
        name: "reg_exp",
        cells_per_slot: 2,
        pair: false,
    },
];

/// Blocks of [`GAP_BLOCK`] slots in the pool: `reg_result_gap` has a cell per block,
/// `reg_gap` one per block and rank, `reg_result_use` one per block and gap counter.
pub const GAP_BLOCKS: u32 = POOL_SLOTS / GAP_BLOCK as u32;
/// Cells of `reg_gap`: 32 per block (one per rank of the wire's 5-bit rank field).
pub const GAP_CELLS: u32 = GAP_BLOCKS * 32;
/// Records of multicast results in `reg_result_use` and `reg_result_seq`: one per block and
/// gap counter, at `block * 64 + counter`.
pub const RESULT_USE_CELLS: u32 = GAP_BLOCKS * GAP_COUNTER as u32;
/// Where a rack switch's records of its partial sums (PROTOCOL.md §9) begin in the same two
/// registers: `PARTIAL_RECORDS + block * 64 + counter`.
pub const PARTIAL_RECORDS: u32 = RESULT_USE_CELLS;
/// Cells of `reg_result_use` and `reg_result_seq`: the results' records and the partials'.
pub const USE_RECORD_CELLS: u32 = 2 * RESULT_USE_CELLS;
/// The registers of Missing reports, indexed by block (`reg_result_gap` and `reg_partial_gap`,
/// in egress), by block and rank (`reg_gap`) and by block and counter (`reg_result_use`,
/// `reg_result_seq`), which the control plane zeroes for the blocks of a job when it
/// installs the job.
pub const GAP_REGISTERS: [&str; 5] = [
    "reg_gap",
    "reg_result_gap",
    "reg_partial_gap",
    "reg_result_use",
    "reg_result_seq",
];
/// The first mirror session of the Missing reports: a report of Data from a rank on the `i`th
/// port of the switch's list is mirrored to session `REPORT_SESSION_BASE + i` (the rank's
/// `set_rank` entry names it), whose multicast group holds that port once per copy
/// (`DATA_REPORT_COPIES`).
pub const REPORT_SESSION_BASE: u16 = 1;
/// The ports that can have a report session: Tofino 2's mirror ids are 8 bits wide and 0 is
/// no session, so sessions 1 to 255.
pub const REPORT_PORTS: usize = 255;
/// The mirror type of a report's copy (`ig_dprsr_md.mirror_type`).
const MIRROR_TYPE_REPORT: u8 = 1;
/// The first byte ahead of a report's mirrored copy, where other packets have their bridged
/// header's `op`: egress tells them apart by it.
const REPORT_OP: u8 = 0x80;
/// The same for a rack switch's report of lost totals to its upper switch (PROTOCOL.md §9).
const REPORT_UP_OP: u8 = 0x81;
/// The cell of `reg_gap` a block keeps for the totals of its upper switch: the rank no job
/// has ([`MAX_WORKERS`] ranks, 0 to 30).
const TOTAL_GAP_RANK: u8 = MAX_WORKERS;

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
    #[error(
        "job {job} is job {upper} on its upper switch: the Tofino program keeps a job's id on \
         both levels of a tree"
    )]
    UplinkJob { job: u16, upper: u16 },
    #[error(
        "the job's slots begin at {base}, its upper job's at {upper}: the Tofino program keeps \
         a job's slots on both levels of a tree"
    )]
    UplinkSlots { base: u16, upper: u16 },
    #[error(
        "the upper switch's port {port} is not a front port of the pipe of the job's ranks \
         (pipe {pipe}): its totals must reach the registers of the job"
    )]
    UplinkPort { port: u16, pipe: u16 },
    #[error(
        "rank {rank} in the upper job: the Tofino program finds this switch's bit in an upper \
         switch's Pending for ranks 0 to {max}",
        max = MAX_WORKERS - 1
    )]
    UplinkRank { rank: u8 },
}

/// Checks that the Tofino program can serve `job`: 64 elements per packet, 1 to 31 ranks, a slot
/// range inside the pool, every rank on a front port of one pipe (each pipe has its own
/// registers, so a use must be aggregated in one), and an upper switch as [`check_uplink`]
/// takes it.
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
    if let Some(up) = job.uplink {
        check_uplink(job, up, first_pipe.unwrap_or(0))?;
    }
    Ok(())
}

/// The Tofino program's limits on a rack switch's job (PROTOCOL.md §9): the same id and slots
/// on the upper switch, the upper switch behind a front port of the job's pipe, and this
/// switch's rank there one of the ranks a Pending's bits are looked up for.
fn check_uplink(job: &JobConfig, up: Uplink, pipe: u16) -> Result<(), TnaJobError> {
    if up.job != job.job {
        return Err(TnaJobError::UplinkJob {
            job: job.job,
            upper: up.job,
        });
    }
    if up.slot_base != job.slot_base {
        return Err(TnaJobError::UplinkSlots {
            base: job.slot_base,
            upper: up.slot_base,
        });
    }
    let port = up.port.0;
    if port >= 512 || port >> 7 != pipe || port & 0x7f == RECIRC_PORT_IN_PIPE {
        return Err(TnaJobError::UplinkPort { port, pipe });
    }
    if up.rank >= MAX_WORKERS {
        return Err(TnaJobError::UplinkRank { rank: up.rank });
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
    /// A Result in on the uplink port (PROTOCOL.md §9): a total.
    pub const TOTAL: u8 = 9;
    /// The upper switch's Pending to this switch.
    pub const UP_PENDING: u8 = 10;
    /// The upper switch's Reject to this switch.
    pub const UP_REJECT: u8 = 11;
    /// The upper switch's Missing of this switch's partials: recirculated, for its record.
    pub const UP_MISSING: u8 = 12;
    /// Its second pass, the record found (stage 1 wrote the recorded use into the header):
    /// that use's partial again if it still waits.
    pub const UP_REPORTED: u8 = 13;
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
    /// The partial sum up (PROTOCOL.md §9) of a use without payload, in one pass.
    pub const PARTIAL: u8 = 7;
    /// The partial sum up, through the second pass (the high halves are in).
    pub const PARTIAL_HARVEST: u8 = 8;
    /// A status Query up.
    pub const QUERY_UP: u8 = 9;
    /// A fetching Query up.
    pub const FETCH_UP: u8 = 10;
    /// A Pending with every rank's bit to rank 0.
    pub const PENDING_RANK0: u8 = 11;
    /// The total, stored on its second pass and multicast to the ranks.
    pub const MCAST_TOTAL: u8 = 12;
    /// The upper switch's Missing, to the second pass (which reads its record).
    pub const RECIRC_MISSING: u8 = 13;
}

/// The bridged header's instruction to egress or to the second pass (`hdr.bridge.op`).
mod bridge {
    pub const PLAIN: u8 = 1;
    pub const FLOOD: u8 = 2;
    pub const REPLY: u8 = 3;
    pub const MCAST: u8 = 4;
    pub const HARVEST_UNICAST: u8 = 5;
    pub const HARVEST_MCAST: u8 = 6;
    /// To the job's upper switch (egress writes its addresses and the upper job's epoch and
    /// this switch's rank there).
    pub const UP: u8 = 7;
    /// The second pass of a partial with payload, then `UP`.
    pub const HARVEST_UP: u8 = 8;
    /// To rank 0 of the job (egress writes its addresses).
    pub const RANK0: u8 = 9;
    /// The second pass of the upper switch's Missing (PROTOCOL.md §9).
    pub const MISSING_UP: u8 = 10;
    /// A frame dropped in ingress (its bridged header only keeps a report's mirrored copy's
    /// layout the same as every other's).
    pub const NONE: u8 = 0;
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
pub(super) fn kind_bit() -> String {
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

mod egress;
mod headers;
mod ingress;
mod parsers;
mod tables;

use egress::{egress, egress_deparser, egress_parser};
use headers::headers;
use ingress::ingress;
use parsers::{ingress_deparser, ingress_parser};
use tables::*;

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
// ina: the data plane for Tofino 1 (TNA). GENERATED by switch-p4/src/tna/; do not edit.
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
//      stage 3: reg_bitmap_0 and reg_bitmap_1 (contributors of each set) and reg_exp (max
//               exponent of each set); bit 31 of both marks a use begun by a header (no
//               payload), whose later arrivals must carry none either: one of the other kind
//               changes neither and is refused with BadCount (the Rust model's HEADER_USE),
//               but takes its rank out of the other set, as any arrival to the current use
//               does. A stateful ALU runs at most four RegisterActions. A job has at most 31
//               ranks;
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
//  - A rack switch of a tree (PROTOCOL.md section 9) keeps the job's id and slots on the upper
//    switch. A use waits for its total while its bitmap is full, the other set holds no newer
//    use and bit 8 of its reg_exp cell is clear; its partial leaves as a Result does, to the
//    uplink's port (egress writes the upper job's epoch and this switch's rank there); a
//    total is read on its first pass and stored on its second (which sets bit 8), then
//    multicast. A total's gap counter is noted in its block's reg_gap cell of rank 31 (no
//    job's) and a skip reported up. A first partial takes its block's counter in egress on
//    the way to a second pass, which records the use and its sequence number; the upper
//    switch's Missing takes that record on a second pass of its own.
//  - Integer add, max, compare and bit operations only; payloads stay big-endian.
//
// Counters: ina_events (index = ina_proto::event::Event), one event per frame on its first
// pass; ina_multicast counts multicast results."
    );
}

fn constants(p: &mut P4) {
    p.lines("\n#include <core.p4>\n#include <tna.p4>\n");
    let types = [
        "DATA",
        "RESULT",
        "REJECT",
        "PROBE_REPLY",
        "PENDING",
        "QUERY",
        "MISSING",
    ];
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

// Missing reports (PROTOCOL.md section 5), per block of 64 slots.
typedef bit<7> block_index_t;
typedef bit<12> gap_index_t;
typedef bit<14> result_use_index_t;
const bit<32> GAP_BLOCKS = {gap_blocks};
const bit<32> GAP_CELLS = {gap_cells};
// The records of results, then a rack switch's of its partials (PROTOCOL.md section 9).
const bit<32> USE_RECORD_CELLS = {use_record_cells};
// A gap cell holds its counter in the top six bits and bit 0 set (0: none yet); one counter
// is GAP_STEP, and a counter 1 to 8 ahead of the cell's (0 to 7 skipped) is taken.
const bit<16> GAP_STEP = 0x{gap_step:04x};
const bit<16> GAP_AHEAD = 0x{gap_ahead:04x};
const bit<32> MISSING_COUNTERS = {missing_counters};
const bit<32> MISSING_SENT = {missing_sent};
const bit<32> MISSING_RECEIVED = {missing_received};
const bit<8> OP_QUERY = {op_query};
const bit<8> OP_PROBE = {op_probe};
const MirrorType_t MIRROR_TYPE_REPORT = {mirror_type_report};
const bit<8> REPORT_OP = 0x{report_op:02x};
const bit<8> REPORT_UP_OP = 0x{report_up_op:02x};
const bit<5> TOTAL_GAP_RANK = {total_gap_rank};

struct pair_t {{
    bit<32> lo;
    bit<32> hi;
}}
",
        cells = 2 * POOL_SLOTS,
        events = Event::COUNT,
        gap_blocks = GAP_BLOCKS,
        gap_cells = GAP_CELLS,
        use_record_cells = USE_RECORD_CELLS,
        gap_step = GAP_STEP,
        gap_ahead = u32::from(GAP_STEP) * (MAX_REPORTED_GAP + 1),
        missing_counters = MISSING_COUNTERS,
        missing_sent = MISSING_SENT,
        missing_received = MISSING_RECEIVED,
        op_query = op::QUERY,
        op_probe = op::PROBE,
        mirror_type_report = MIRROR_TYPE_REPORT,
        report_op = REPORT_OP,
        report_up_op = REPORT_UP_OP,
        total_gap_rank = TOTAL_GAP_RANK,
    );
}
