//! Stages 0 to 4 of the ingress: the control plane's tables, the comparisons, the checks and
//! the sequence registers, the set's bitmap and exponent, and whether the rank is new.

use super::super::*;

/// Stage 0: the control plane's tables (switch address, L2, job, rank, rank bit).
pub(super) fn stage0(p: &mut P4) {
    let _ = writeln!(
        p,
        "
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
}

/// Stage 1: the comparisons, as differences the check table matches against 0.
pub(super) fn stage1(p: &mut P4) {
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
}

/// Stage 3: bitmap and exponent of the set, and what the values do.
pub(super) fn stage3(p: &mut P4) {
    p.push_str("\n    // ---- stage 3: bitmap and exponent of the set; what the values do ----\n");
    set_registers(p);
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
}

/// Stage 4: whether the rank's bit is in the set's bitmap; the completion compares.
pub(super) fn stage4(p: &mut P4) {
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

/// Stage 3's stateful ALUs: `reg_bitmap` and `reg_exp`, per set.
pub(super) fn set_registers(p: &mut P4) {
    for set in 0..2 {
        let (x, o) = if set == 0 { ("lo", "hi") } else { ("hi", "lo") };
        let _ = writeln!(
            p,
            "
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
