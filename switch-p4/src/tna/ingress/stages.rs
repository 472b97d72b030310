//! Stages 0 to 4 of the ingress: the control plane's tables, the comparisons, the checks and
//! the sequence registers, the set's bitmap and exponent, and whether the rank is new.

use super::super::*;

/// Stage 0: the control plane's tables (switch address, L2, job, rank, rank bit).
pub(super) fn stage0(p: &mut P4) {
    let _ = writeln!(
        p,
        "
    // ---- stage 0: the control plane's tables ----

    // Indices and records composed of header fields go through identity hashes: an action
    // on Tofino combines fields only within containers of one size.
    Hash<bit<14>>(HashAlgorithm_t.IDENTITY) cell_of;
    Hash<bit<12>>(HashAlgorithm_t.IDENTITY) gap_cell_of;
    Hash<bit<16>>(HashAlgorithm_t.IDENTITY) gap_in_of;
    Hash<bit<16>>(HashAlgorithm_t.IDENTITY) use_rec_of;
    Hash<bit<14>>(HashAlgorithm_t.IDENTITY) use_index_of;

    // `reports`: the switch sends Missing reports (PROTOCOL.md section 5). Its addresses are
    // the keys of ip_target and arp_target; egress writes them into its replies.
    action set_switch_addr(bit<1> reports) {{
        md.reports = reports;
        md.cnt4 = hdr.ina.count << 2;
        md.ulen = hdr.udp.length - {hdr_udp};
    }}
    @stage(0)
    table switch_addr {{
        actions = {{
            set_switch_addr;
        }}
        default_action = set_switch_addr(0);
    }}

    // The indices the registers take. Keyless tables whose actions take hash outputs have
    // no action data (the driver programs their miss path only), and a table's actions take
    // at most 32 bits from the hash units.
    action cells() {{
        md.cell = cell_of.get({{hdr.ina.slot[12:0], hdr.ina.set}});
        md.gap_cell = gap_cell_of.get({{hdr.ina.slot[12:6], hdr.ina.rank[4:0]}});
    }}
    @stage(0)
    table prep_cells {{
        actions = {{
            cells;
        }}
        const default_action = cells();
    }}
    action gap_counter() {{
        md.gap_in = gap_in_of.get({{hdr.ina.gap, 9w0, 1w1}});
    }}
    @stage(0)
    table prep_gap_counter {{
        actions = {{
            gap_counter;
        }}
        const default_action = gap_counter();
    }}

    // Frames to the switch's IPv4 address (one entry: the address). In stage 1, as are
    // rank_source and rank_bit: stage 2 is the first to read them, and stage 0's sixteen
    // logical tables (ingress's and egress's together) are taken.
    action to_switch() {{
        md.ip_mine = 1;
    }}
    action not_to_switch() {{
        md.ip_mine = 0;
    }}
    @stage(1)
    table ip_target {{
        key = {{
            hdr.ipv4.dst_addr : exact;
        }}
        actions = {{
            to_switch;
            not_to_switch;
        }}
        default_action = not_to_switch();
        size = 1;
    }}

    // A frame of the upper switch of a job (PROTOCOL.md section 9): of the job's id, from the
    // upper switch's port, IPv4 address and UDP port. Two entries per such job: with the
    // upper job's epoch (md.from_up = 3) and with any other (1). Ternary: stage 1's SRAM is
    // taken. A total's gap counter goes into the block's cell of reg_gap that no rank has,
    // and a report of lost totals to the report session of the upper switch's port.
    Hash<bit<12>>(HashAlgorithm_t.IDENTITY) total_cell_of;
    action from_uplink(bit<2> epoch_ok, MirrorId_t report_session) {{
        md.from_up = epoch_ok;
        md.gap_cell = total_cell_of.get({{hdr.ina.slot[12:6], TOTAL_GAP_RANK}});
        md.mirror_session = report_session;
    }}
    action not_from_uplink() {{
        md.from_up = 0;
    }}
    @stage(1)
    table uplink_frame {{
        key = {{
            hdr.ina.job : ternary;
            ig_intr_md.ingress_port : ternary;
            hdr.ipv4.src_addr : ternary;
            hdr.udp.src_port : ternary;
            hdr.ina.epoch : ternary;
        }}
        actions = {{
            from_uplink;
            not_from_uplink;
        }}
        default_action = not_from_uplink();
        size = 1024;
    }}

    // The blocks of 64 slots wholly inside a job's range, which keep gap cells (a block
    // partly outside could be another job's too).
    action in_gap_block() {{
        md.gap_block = 1;
    }}
    action not_in_gap_block() {{
        md.gap_block = 0;
    }}
    @stage(0)
    table gap_block {{
        key = {{
            hdr.ina.job : exact;
            hdr.ina.slot[12:6] : exact;
        }}
        actions = {{
            in_gap_block;
            not_in_gap_block;
        }}
        default_action = not_in_gap_block();
        size = {gap_blocks};
    }}

    // Per block and gap counter, the use whose multicast result carried the counter (index
    // block * 64 + counter), and on a rack switch the use whose partial sum did
    // (PARTIAL_RECORDS on: md.space): 1 << 14 | 2 * slot + set (0: none). Written on the
    // packet's second pass (egress stamped the counter on its first); a rank's Missing reads
    // a result's, the upper switch's Missing takes a partial's (read and cleared: the
    // report's second copy finds nothing).
    // Twin: Registers::result_uses, then Registers::partial_uses.
    Register<bit<32>, result_use_index_t>(USE_RECORD_CELLS) reg_result_use;
    RegisterAction<bit<32>, result_use_index_t, bit<32>>(reg_result_use) result_use_write = {{
        void apply(inout bit<32> v) {{
            v = (bit<32>)hdr.bridge.rec;
        }}
    }};
    RegisterAction<bit<32>, result_use_index_t, bit<32>>(reg_result_use) result_use_read = {{
        void apply(inout bit<32> v, out bit<32> rv) {{
            rv = v;
        }}
    }};
    RegisterAction<bit<32>, result_use_index_t, bit<32>>(reg_result_use) result_use_take = {{
        void apply(inout bit<32> v, out bit<32> rv) {{
            rv = v;
            v = 0;
        }}
    }};
    // Twin: Registers::result_seqs, then Registers::partial_seqs: the use's sequence number,
    // without which a slot and set name no use.
    Register<bit<32>, result_use_index_t>(USE_RECORD_CELLS) reg_result_seq;
    RegisterAction<bit<32>, result_use_index_t, bit<32>>(reg_result_seq) result_seq_write = {{
        void apply(inout bit<32> v) {{
            v = hdr.ina.seq;
        }}
    }};
    RegisterAction<bit<32>, result_use_index_t, bit<32>>(reg_result_seq) result_seq_read = {{
        void apply(inout bit<32> v, out bit<32> rv) {{
            rv = v;
        }}
    }};
{records}
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

    // `slot_base_neg` is `-slot_base` (mod 2^16): Tofino subtracts no action data. A job
    // under an upper switch (PROTOCOL.md section 9, `up` = 1) has the same id and slots there,
    // and `up_port` is the port the upper switch is behind.
    action set_job(bit<16> epoch, bit<16> slot_base, bit<16> slot_base_neg,
                   bit<16> slot_count, bit<16> elems, bit<8> workers, bit<16> mgrp,
                   bit<1> up, PortId_t up_port) {{
        md.job_hit = 1;
        md.has_up = up;
        md.up_port = up_port;
        md.job_epoch = epoch;
        md.epoch_x = hdr.ina.epoch ^ epoch;
        md.slot_base = slot_base;
        md.slot_off = hdr.ina.slot + slot_base_neg;
        md.slot_count = slot_count;
        md.elems = elems;
        md.count_x = hdr.ina.count ^ elems;
        md.workers = workers;
        md.mgrp = mgrp;
    }}
    action unknown_job() {{
        md.job_hit = 0;
        md.has_up = 0;
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

    action set_rank(MirrorId_t report_session) {{
        md.rank_hit = 1;
        md.mirror_session = report_session;
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

    // The rank's port and source address: the frame comes from where the rank is.
    action rank_source_ok() {{
        md.src_ok = 1;
    }}
    action rank_source_other() {{
        md.src_ok = 0;
    }}
    @stage(1)
    table rank_source {{
        key = {{
            hdr.ina.job : exact;
            hdr.ina.rank : exact;
            ig_intr_md.ingress_port : exact;
            hdr.ipv4.src_addr : exact;
            hdr.udp.src_port : exact;
        }}
        actions = {{
            rank_source_ok;
            rank_source_other;
        }}
        default_action = rank_source_other();
        size = 32768;
    }}

    action set_bit(bit<32> b) {{
        md.rbit = b;
    }}",
        hdr_udp = 8 + HEADER_LEN,
        gap_blocks = GAP_BLOCKS,
        records = result_record_tables(),
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
        Some(1),
        &[("hdr.ina.rank", "exact")],
        &["set_bit"],
        &entries,
        "set_bit(0)",
    );
}

/// Stage 0's tables of the two records of a use (`reg_result_use`: the use, `reg_result_seq`:
/// its sequence number), one table each: an action takes at most one stateful ALU's result.
/// The second pass of a stamped result or partial writes them; a rank's Missing reads a
/// result's; the second pass of the upper switch's Missing takes a partial's (PROTOCOL.md §9).
fn result_record_tables() -> String {
    let mut p = P4::default();
    let index = "use_index_of.get({md.space, hdr.ina.slot[12:6], hdr.ina.gap})";
    let s = |x: u8| x.to_string();
    let missing = mt(MessageType::Missing).to_string();
    for (reg, field, take) in [("use", "rec", "take"), ("seq", "rec_seq", "read")] {
        let (write, read, taken) = (
            format!("do_result_{reg}_write"),
            format!("do_result_{reg}_read"),
            format!("do_result_{reg}_{take}"),
        );
        let _ = writeln!(
            p,
            "action {write}() {{
            result_{reg}_write.execute({index});
            }}
            action {read}() {{
            md.{field} = result_{reg}_read.execute({index});
            }}"
        );
        if take == "take" {
            let _ = writeln!(
                p,
                "action {taken}() {{
                md.{field} = result_{reg}_take.execute({index});
                }}"
            );
        }
        let mut actions = vec![write.as_str(), read.as_str()];
        if take == "take" {
            actions.push(&taken);
        }
        actions.push("NoAction");
        table(
            &mut p,
            &format!("result_{reg}_access"),
            Some(0),
            &[
                ("md.pass2", "exact"),
                ("hdr.bridge.op", "ternary"),
                ("hdr.bridge.stamp", "ternary"),
                ("hdr.ina.msg_type", "ternary"),
                ("hdr.ina.gap_on", "ternary"),
            ],
            &actions,
            &[
                entry(
                    &["1", &s(bridge::HARVEST_MCAST), "1", "_", "_"],
                    format!("{write}()"),
                ),
                entry(
                    &["1", &s(bridge::HARVEST_UP), "1", "_", "_"],
                    format!("{write}()"),
                ),
                entry(&["0", "_", "_", &missing, "1"], format!("{read}()")),
                entry(
                    &["1", &s(bridge::MISSING_UP), "_", &missing, "1"],
                    format!("{taken}()"),
                ),
            ],
            "NoAction()",
        );
    }
    p.finish()
}

/// Stage 1: the comparisons, as differences the check table matches against 0.
pub(super) fn stage1(p: &mut P4) {
    let _ = writeln!(
        p,
        "
    // ---- stage 1: the comparisons, as differences the check table matches against 0 ----

    // An ARP request for the switch's address (one entry: 1 and the address) becomes its
    // reply here; stage 7 sends it back out of its port.
    action arp_for_switch(bit<48> mac, bit<32> ip) {{
        md.arp_mine = 1;
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = mac;
        hdr.arp.oper = 2;
        hdr.arp.tha = hdr.arp.sha;
        hdr.arp.tpa = hdr.arp.spa;
        hdr.arp.sha = mac;
        hdr.arp.spa = ip;
    }}
    action arp_not_for_switch() {{
        md.arp_mine = 0;
    }}
    @stage(1)
    table arp_target {{
        key = {{
            md.arp_req : exact;
            hdr.arp.tpa : exact;
        }}
        actions = {{
            arp_for_switch;
            arp_not_for_switch;
        }}
        default_action = arp_not_for_switch();
        size = 1;
    }}

    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) exp_h_of;
    action compare() {{
        md.len_x = md.ulen ^ md.cnt4;
        // Bit 15 set (and slot_off below 2^13, a pool's size): the slot lies below the end
        // of the job's range.
        md.room = md.slot_off - md.slot_count;
        md.l2_port_x = md.l2_port ^ ig_intr_md.ingress_port;
        // Bit 8 on a second pass: a total stored (PROTOCOL.md section 9).
        md.exp_h = exp_h_of.get({{md.kind[31:31], 22w0, md.pass2, hdr.ina.exponent}});
        md.stamp = md.reports & md.gap_block;
    }}
    @stage(1)
    table prep_compare {{
        actions = {{
            compare;
        }}
        const default_action = compare();
    }}
    // (Apart from compare: a constant this wide is action data.)
    action gap_previous() {{
        md.gap_in1 = md.gap_in - GAP_STEP;
    }}
    @stage(1)
    table prep_gap_previous {{
        actions = {{
            gap_previous;
        }}
        const default_action = gap_previous();
    }}

    // A rank's Missing of a result it lacks (PROTOCOL.md section 5, \"Lost results\"), of its own
    // job's epoch, for a block of its job whose record names a use: from here on it is the
    // rank's fetching Query of that use.
    Hash<bit<14>>(HashAlgorithm_t.IDENTITY) rec_cell_of;
    Hash<bit<16>>(HashAlgorithm_t.IDENTITY) rec_slot_of;
    Hash<bit<1>>(HashAlgorithm_t.IDENTITY) rec_set_of;
    action requery() {{
        md.cell = rec_cell_of.get({{md.rec[13:0]}});
        md.from_missing = 1;
        hdr.ina.version = INA_VERSION;
        hdr.ina.msg_type = INA_QUERY;
        hdr.ina.slot = rec_slot_of.get({{md.rec[13:1]}});
        hdr.ina.set = rec_set_of.get({{md.rec[0:0]}});
        hdr.ina.seq = md.rec_seq;
        hdr.ina.exponent = {fetch};
        // (The flags byte keeps its gap fields, which no table reads for a Query: every
        // reply writes them. The set, from a hash, cannot share the byte's write with
        // constants.)
    }}
    // The second pass of the upper switch's Missing of this switch's partials (PROTOCOL.md
    // section 9), whose record named a use: from here on it is the upper switch's Pending
    // without this switch's bit for that use (slot, set and sequence number), which sends
    // the use's partial again if the use still waits (the check table makes it op
    // UP_REPORTED). (The epoch was the upper job's, checked on the first pass.)
    action up_requery() {{
        md.cell = rec_cell_of.get({{md.rec[13:0]}});
        md.from_missing = 0;
        hdr.ina.msg_type = INA_PENDING;
        hdr.ina.slot = rec_slot_of.get({{md.rec[13:1]}});
        hdr.ina.set = rec_set_of.get({{md.rec[0:0]}});
        hdr.ina.seq = md.rec_seq;
    }}
    action no_requery() {{
        md.from_missing = 0;
    }}
    @stage(1)
    table requery_access {{
        key = {{
            md.pass2 : exact;
            hdr.ina.msg_type : exact;
            md.reports : exact;
            md.gap_block : exact;
            md.epoch_x : ternary;
            md.rec[14:14] : exact;
        }}
        actions = {{
            requery;
            up_requery;
            no_requery;
        }}
        const entries = {{
            (0, {missing}, 1, 1, 0, 1) : requery();
            (1, {missing}, 1, 1, _, 1) : up_requery();
        }}
        size = 2;
        const default_action = no_requery();
    }}

    action set_full_mask(bit<32> mask) {{
        md.full_mask = mask;
    }}",
        fetch = ina_wire::QueryAsk::Fetch.byte(),
        missing = mt(MessageType::Missing),
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
}

/// Stage 2: the checks of §6 and §7, in order, and the sequence registers.
pub(super) fn stage2(p: &mut P4) {
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
    }}
    action check_upper(bit<8> o) {{
        md.op = o;
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
            "check_upper",
        ],
        &check_entries(),
        &format!("check_drop({})", ev(Event::L2Unknown)),
    );
    sequence_registers(p);
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
    gap_register(p);
}

/// Stage 2's third stateful ALU: `reg_gap`, for every accepted Data packet with a gap counter
/// to a block that keeps cells, on a switch that sends reports.
fn gap_register(p: &mut P4) {
    p.push_str(
        "
    // Twin: Registers::gaps. Per block and rank, the latest gap counter (GAP_STEP * counter,
    // bit 0 set; 0: none yet). A first counter, or one 1 to 8 ahead of the cell's (0 to 7
    // skipped), is taken; any other leaves the cell. Returns the cell before the packet.
    Register<bit<16>, gap_index_t>(GAP_CELLS) reg_gap;
    RegisterAction<bit<16>, gap_index_t, bit<16>>(reg_gap) gap_note = {
        void apply(inout bit<16> v, out bit<16> rv) {
            rv = v;
            if (v == 0 || md.gap_in1 - v < GAP_AHEAD) {
                v = md.gap_in;
            }
        }
    };
    action do_gap_note() {
        md.gap_old = gap_note.execute(md.gap_cell);
    }
",
    );
    let mut keys: Vec<(&str, &str)> = CHECK_KEYS.to_vec();
    keys.extend([("md.gap_block", "ternary"), ("hdr.ina.gap_on", "ternary")]);
    // A rank's Data, and the upper switch's total (PROTOCOL.md section 9: its counter in the
    // block's cell of TOTAL_GAP_RANK, which uplink_frame names).
    let totals = from_upper()
        .into_iter()
        .filter(|(o, _)| *o == op::TOTAL)
        .map(|(_, pattern)| (MessageType::Result, pattern));
    let entries: Vec<Entry> = accepted()
        .into_iter()
        .filter(|(t, _)| *t == MessageType::Data)
        .chain(totals)
        .map(|(_, mut pattern)| {
            pattern.push(kv("md.reports", 1));
            let mut keys = check_pattern(&pattern);
            keys.extend(["1".to_string(), "1".to_string()]);
            Entry {
                keys,
                action: "do_gap_note()".into(),
            }
        })
        .collect();
    table(
        p,
        "gap_access",
        Some(2),
        &keys,
        &["do_gap_note", "NoAction"],
        &entries,
        "NoAction()",
    );
}

/// Stage 3: bitmap and exponent of the set, and what the values do.
pub(super) fn stage3(p: &mut P4) {
    p.push_str("\n    // ---- stage 3: bitmap and exponent of the set; what the values do ----\n");
    set_registers(p);
    let data = op::DATA.to_string();
    let query = op::QUERY.to_string();
    let full = ELEMS.to_string();
    // The packets of the upper switch (PROTOCOL.md section 9) read as a Query does.
    let upper = [op::TOTAL, op::UP_PENDING, op::UP_REJECT, op::UP_REPORTED].map(|o| o.to_string());
    let readers: Vec<&String> = [&data, &query].into_iter().chain(&upper).collect();
    let harvest = op::HARVEST.to_string();
    let mut ex = Vec::new();
    ex.push(entry(&[&data, "_", pred::NEW, "_", "_"], "do_exp_write()"));
    ex.push(entry(
        &[&data, "_", pred::SAME, pred::OTHER_OLDER, "_"],
        "do_exp_max()",
    ));
    for t in &readers {
        ex.push(entry(&[t, "_", pred::SAME, "_", "_"], "do_exp_read()"));
    }
    // A total's second pass stores its exponent byte, with bit 8 (md.exp_h).
    ex.push(entry(&[&harvest, "_", "_", "_", "1"], "do_exp_write()"));
    // The set's bitmap in one table, the other set's in another, for each set; the apply
    // block runs the pair of the packet's set. (A table whose two stateful ALUs each take 64
    // bits of input does not fit the input crossbar: one ALU has the table's search bus,
    // the other the hash bus of 51 bits.)
    let set_keys = [
        ("md.op", "exact"),
        ("md.seq_pred", "ternary"),
        ("md.order_pred", "ternary"),
    ];
    for set in 0..2 {
        let mut own = vec![
            entry(&[&data, pred::NEW, "_"], format!("own_new_{set}()")),
            entry(
                &[&data, pred::SAME, pred::OTHER_OLDER],
                format!("own_add_{set}()"),
            ),
        ];
        for t in &readers {
            own.push(entry(&[t, pred::SAME, "_"], format!("own_read_{set}()")));
        }
        let (new, add, read) = (
            format!("own_new_{set}"),
            format!("own_add_{set}"),
            format!("own_read_{set}"),
        );
        table(
            p,
            &format!("bitmap_own_{set}"),
            Some(3),
            &set_keys,
            &[&new, &add, &read, "NoAction"],
            &own,
            "NoAction()",
        );
        let take = format!("other_take_out_{set}");
        let other = vec![
            entry(&[&data, pred::NEW, "_"], format!("{take}()")),
            entry(&[&data, pred::SAME, pred::OTHER_OLDER], format!("{take}()")),
        ];
        table(
            p,
            &format!("bitmap_other_{set}"),
            Some(3),
            &set_keys,
            &[&take, "NoAction"],
            &other,
            "NoAction()",
        );
    }
    let set_keys = [
        ("md.op", "exact"),
        ("hdr.ina.set", "ternary"),
        ("md.seq_pred", "ternary"),
        ("md.order_pred", "ternary"),
        ("hdr.bridge.store", "ternary"),
    ];
    table(
        p,
        "exp_access",
        Some(3),
        &set_keys,
        &["do_exp_write", "do_exp_max", "do_exp_read", "NoAction"],
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
    let vsel = vec![
        // The second pass of a total (PROTOCOL.md section 9) stores it.
        entry(
            &[&harvest, "_", "_", &full, "_", "1"],
            format!("select_values({})", vop::WRITE),
        ),
        // The second pass of a result without payload (it took the pass for its gap counter).
        entry(
            &[&harvest, "_", "_", "0", "_", "_"],
            format!("select_values({})", vop::NONE),
        ),
        entry(
            &[&harvest, "_", "_", "_", "_", "_"],
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
        // A Query with a nonzero byte reads the sums: bit 0 asks for them, and on a rack
        // switch rank 0's asks for the partial (PROTOCOL.md section 9).
        entry(
            &[&query, pred::SAME, "_", "_", "0"],
            format!("select_values({})", vop::NONE),
        ),
        entry(
            &[&query, pred::SAME, "_", "_", "_"],
            "select_values_for_query()",
        ),
        // The upper switch's Pending, and its Missing, may send the partial again.
        entry(
            &[&op::UP_PENDING.to_string(), pred::SAME, "_", "_", "_"],
            "select_values_for_query()",
        ),
        entry(
            &[&op::UP_REPORTED.to_string(), pred::SAME, "_", "_", "_"],
            "select_values_for_query()",
        ),
    ];
    p.push_str(
        "
    // How many counters the packet's is ahead of the cell's, in the top six bits.
    action gap_compare() {
        md.gap_ahead = md.gap_in - md.gap_old;
    }
    @stage(3)
    table prep_gap {
        actions = {
            gap_compare;
        }
        const default_action = gap_compare();
    }
",
    );
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
            ("hdr.bridge.store", "ternary"),
        ],
        &["select_values", "select_values_for_query"],
        &vsel,
        &format!("select_values({})", vop::NONE),
    );
}

/// Stage 4: whether the rank's bit is in the set's bitmap; the completion compares; the
/// Missing report of the counters a Data packet skipped.
pub(super) fn stage4(p: &mut P4) {
    gap_report(p);
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
    // The upper switch's Pending holds this switch's bit (PROTOCOL.md section 9): its rank
    // there is the Pending's.
    p.push_str("    action set_word_me() {\n        md.word_me = 1;\n    }\n");
    let word: Vec<Entry> = (0..MAX_WORKERS)
        .map(|r| {
            entry(
                &[
                    &format!("32w0x{:08x} &&& 32w0x{:08x}", 1u32 << r, 1u32 << r),
                    &r.to_string(),
                ],
                "set_word_me()",
            )
        })
        .collect();
    table(
        p,
        "word_check",
        Some(4),
        &[("hdr.word.bitmap", "ternary"), ("hdr.ina.rank", "exact")],
        &["set_word_me", "NoAction"],
        &word,
        "NoAction()",
    );
    p.push_str(
        "
    action done_compare() {
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
        // The bitmap with the rank's bit, against the mask: for a rank not yet in it (the
        // only rows that read new_x), bm_old | rbit is bm_old ^ rbit.
        md.new_x = md.old_x ^ md.rbit;
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
}

/// Stage 2's stateful ALUs: `reg_seq` and `reg_seq_order`, per set.
pub(super) fn sequence_registers(p: &mut P4) {
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
    action do_order_query_{set}() {{ md.order_pred = order_query_{set}.execute(md.cell[13:1]); }}",
        );
    }
}

/// Stage 3's stateful ALUs: `reg_bitmap_0`, `reg_bitmap_1` and `reg_exp`. A stateful ALU
/// runs at most four `RegisterAction`s: a bitmap per set keeps each register at four (new,
/// add, take out, read), and the use's kind comes in as `md.kind` instead of one action per
/// kind.
pub(super) fn set_registers(p: &mut P4) {
    for set in 0..2 {
        let _ = writeln!(
            p,
            "
    // Set {set}: a new use starts with the rank alone and the packet's kind (md.kind:
    // KIND_BIT if it carries no payload); an arrival to the current use of the use's kind
    // adds the rank (a no-op for a rank already there), one of the other kind changes
    // nothing; an update of the other set takes the rank out. Returns the bitmap before the
    // update.
    RegisterAction<bit<32>, slot_index_t, bit<32>>(reg_bitmap_{set}) bitmap_new_{set} = {{
        void apply(inout bit<32> v, out bit<32> rv) {{
            rv = v;
            // (Not md.rbit | md.kind: a stateful ALU's instruction takes at most one PHV
            // operand.)
            if (md.kind == 0) {{
                v = md.rbit;
            }} else {{
                v = md.rbit | {kind};
            }}
        }}
    }};
    RegisterAction<bit<32>, slot_index_t, bit<32>>(reg_bitmap_{set}) bitmap_add_{set} = {{
        void apply(inout bit<32> v, out bit<32> rv) {{
            rv = v;
            if ((int<32>)(v - md.kind) >= 0) {{
                v = v | md.rbit;
            }}
        }}
    }};
    RegisterAction<bit<32>, slot_index_t, bit<32>>(reg_bitmap_{set}) bitmap_take_out_{set} = {{
        void apply(inout bit<32> v) {{
            v = v & ~md.rbit;
        }}
    }};
    RegisterAction<bit<32>, slot_index_t, bit<32>>(reg_bitmap_{set}) bitmap_read_{set} = {{
        void apply(inout bit<32> v, out bit<32> rv) {{
            rv = v;
        }}
    }};",
            kind = kind_bit(),
        );
    }
    for set in 0..2 {
        let _ = writeln!(
            p,
            "    action own_new_{set}() {{
        md.bm_old = bitmap_new_{set}.execute(md.cell[13:1]);
    }}
    action own_add_{set}() {{
        md.bm_old = bitmap_add_{set}.execute(md.cell[13:1]);
    }}
    action own_read_{set}() {{
        md.bm_old = bitmap_read_{set}.execute(md.cell[13:1]);
    }}
    action other_take_out_{set}() {{
        bitmap_take_out_{set}.execute(md.cell[13:1]);
    }}"
        );
    }
    p.push_str(
        "
    // A new use takes the packet's exponent byte and kind (md.exp_h); an arrival to the
    // current use of the use's kind the larger of the two (unsigned), one of the other kind
    // changes nothing. Returns the cell's low half after the update: the exponent byte and
    // bit 8, set by a total stored (PROTOCOL.md section 9; md.exp_h on its second pass).
    RegisterAction<bit<32>, cell_index_t, bit<16>>(reg_exp) exp_write = {
        void apply(inout bit<32> v, out bit<16> rv) {
            v = md.exp_h;
            rv = (bit<16>)v;
        }
    };
    RegisterAction<bit<32>, cell_index_t, bit<16>>(reg_exp) exp_max = {
        void apply(inout bit<32> v, out bit<16> rv) {
            if ((int<32>)(v - md.kind) >= 0 && md.exp_h > v) {
                v = md.exp_h;
            }
            rv = (bit<16>)v;
        }
    };
    RegisterAction<bit<32>, cell_index_t, bit<16>>(reg_exp) exp_read = {
        void apply(inout bit<32> v, out bit<16> rv) {
            rv = (bit<16>)v;
        }
    };
    action do_exp_write() { md.exp_x = exp_write.execute(md.cell); }
    action do_exp_max() { md.exp_x = exp_max.execute(md.cell); }
    action do_exp_read() { md.exp_x = exp_read.execute(md.cell); }
",
    );
}

/// Stage 4: a Data packet whose counter skipped 1 to 7 past its cell's (a cell that held one,
/// bit 0 set) is mirrored to its rank's report session (`set_rank`'s, one per port): egress makes each copy the
/// Missing of those counters.
fn gap_report(p: &mut P4) {
    p.push_str(
        "
    action report_gap(bit<8> skipped) {
        md.rep_op = REPORT_OP;
        md.rep_skipped = skipped;
        ig_dprsr_md.mirror_type = MIRROR_TYPE_REPORT;
        ina_missing.count((bit<1>)MISSING_SENT);
    }
    // The same for a rack switch's totals (PROTOCOL.md section 9): the report goes up.
    action report_total_gap(bit<8> skipped) {
        md.rep_op = REPORT_UP_OP;
        md.rep_skipped = skipped;
        ig_dprsr_md.mirror_type = MIRROR_TYPE_REPORT;
        ina_missing.count((bit<1>)MISSING_SENT);
    }
    // A rank's Missing answered as its fetching Query. (Here, not in the apply block: a
    // counter is one table's.)
    action missing_answered() {
        ina_missing.count((bit<1>)MISSING_RECEIVED);
    }
",
    );
    let mut entries: Vec<Entry> = Vec::new();
    for (o, action) in [
        (op::TOTAL.to_string(), "report_total_gap"),
        ("_".into(), "report_gap"),
    ] {
        for ahead in 2..=MAX_REPORTED_GAP + 1 {
            entries.push(entry(
                &["1", &ahead.to_string(), "_", &o],
                format!("{action}({})", ahead - 1),
            ));
        }
    }
    // Only Data has a gap cell (gap_old is 0 for a Query), so the rows never overlap.
    entries.push(entry(
        &["_", "_", "1", &op::QUERY.to_string()],
        "missing_answered()",
    ));
    table(
        p,
        "gap_report",
        Some(4),
        &[
            ("md.gap_old[0:0]", "ternary"),
            ("md.gap_ahead[15:10]", "ternary"),
            ("md.from_missing", "ternary"),
            ("md.op", "ternary"),
        ],
        &[
            "report_gap",
            "report_total_gap",
            "missing_answered",
            "NoAction",
        ],
        &entries,
        "NoAction()",
    );
}
