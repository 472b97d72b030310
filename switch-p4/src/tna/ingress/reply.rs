//! Stage 7: the frame that leaves, for every decision, and how a reply is addressed.

use super::super::*;

/// Stage 7: the frame that leaves, for every decision.
pub(super) fn reply(p: &mut P4) {
    p.push_str("\n    // ---- stage 7: the frame that leaves ----\n\n");
    forwarding_actions(p);
    answer_actions(p);
    multicast_actions(p);
    uplink_actions(p);
    reply_table(p);
}

/// Frames that are not the switch's business, and ARP for its address (§7).
fn forwarding_actions(p: &mut P4) {
    p.push_str("    action drop_frame() {\n        ig_dprsr_md.drop_ctl = 1;\n");
    // A report's mirrored copy keeps the bridged header of every frame.
    to_egress(p, bridge::NONE);
    p.push_str("    }\n");

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

    // (arp_target, stage 1, wrote the reply.)
    p.push_str("    action answer_arp() {\n");
    to_egress(p, bridge::PLAIN);
    p.push_str(
        "        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;
    }
",
    );
}

/// The answers to one sender: ProbeReply, Reject, Pending, and a stored Result.
fn answer_actions(p: &mut P4) {
    // The ProbeReply's gap flag says whether this switch sends Missing reports (PROTOCOL.md
    // section 5). Apart from answer_probe: on Tofino an action writes a container from a
    // constant or one field, and itself.
    p.push_str(
        "    action probe_gap_flag() {
        hdr.ina.gap_on = md.reports;
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
        // (The gap flag is probe_gap_flag's.)
        hdr.probe.setValid();"
    );
    common::probe_fields(
        p,
        "hdr.probe",
        ["md.workers", "md.elems", "md.slot_base", "md.slot_count"],
    );
    p.push_str(
        "        hdr.payload.setInvalid();
    }
",
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
        // (The word is ina_outcome's.)
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
    recirculate(p, bridge::HARVEST_UNICAST, false);
    p.push_str("    }\n");
}

/// A completed use's Result to every rank, and the second pass of one with a payload.
fn multicast_actions(p: &mut P4) {
    p.push_str(
        "    // A Result of `count` elements (0 or E; its IPv4 and UDP lengths `total_len` and
    // `udp_len`) to every rank of the job (addresses per rank in egress).
    action multicast_result(bit<16> total_len, bit<16> udp_len, bit<16> count) {
",
    );
    to_egress(p, bridge::MCAST);
    reply_lengths(p);
    p.push_str(
        "        hdr.ina.msg_type = INA_RESULT;
        hdr.ina.exponent = md.exp_x[7:0];
        ig_tm_md.mcast_grp_a = md.mgrp;
    }
",
    );
    p.push_str(
        "    // The last arrival of a use: the high halves (if any) are in; the second pass reads
    // the low halves and multicasts. Through egress (`stamp` 1, `bypass` 0), which stamps the
    // block's gap counter on the way (with payload, or without: such a result takes the pass
    // for its counter).
    action multicast_result_harvest(bit<16> total_len, bit<16> udp_len, bit<16> count,
                                    bit<1> stamp, bit<1> bypass) {
",
    );
    reply_lengths(p);
    p.push_str(
        "        hdr.ina.msg_type = INA_RESULT;
        hdr.ina.exponent = md.exp_x[7:0];
",
    );
    recirculate_with(
        p,
        bridge::HARVEST_MCAST,
        ("stamp", "bypass", "0"),
        "ig_intr_md.ingress_port",
    );
    p.push_str("    }\n");

    let _ = writeln!(
        p,
        "    // Second pass: the result is complete; to the port the first pass named, as `op`.
    action send_harvest_unicast(bit<8> op) {{
        hdr.bridge.op = op;
        ig_tm_md.ucast_egress_port = hdr.bridge.port;
        ig_tm_md.bypass_egress = 0;
    }}
    action send_harvest_multicast() {{
        hdr.bridge.op = {mcast};
        ig_tm_md.mcast_grp_a = hdr.bridge.mgrp;
        ig_tm_md.bypass_egress = 0;
    }}",
        mcast = bridge::MCAST,
    );
}

/// What a rack switch sends (PROTOCOL.md §9): the partial sum and Queries up, a Pending to
/// rank 0, and the total to the ranks. Egress writes the upper switch's addresses, the upper
/// job's epoch and this switch's rank there (`uplink_addr`), or keeps a Pending's copy for rank
/// 0 and addresses it as a result's (`ina_rank_addr`).
fn uplink_actions(p: &mut P4) {
    p.push_str("    // The partial sum up, without payload.\n    action send_partial_empty() {\n");
    to_egress(p, bridge::UP);
    reply_headers(p, 0);
    p.push_str(
        "        hdr.ina.msg_type = INA_DATA;
        hdr.ina.exponent = md.exp_x[7:0];
        hdr.word.setInvalid();
        hdr.payload.setInvalid();
        ig_tm_md.ucast_egress_port = md.up_port;
    }
",
    );
    p.push_str(
        "    // The partial sum up through the second pass, which reads the low halves of one with
    // payload. A first transmission in a block with gap cells goes through egress (`stamp`
    // 1, `bypass` 0), which stamps the block's partial counter, and its second pass records
    // the use under it (PROTOCOL.md section 9); so does one without payload.
    action send_partial_harvest(bit<16> total_len, bit<16> udp_len, bit<16> count,
                                bit<1> stamp, bit<1> bypass) {
",
    );
    reply_lengths(p);
    p.push_str(
        "        hdr.ina.msg_type = INA_DATA;
        hdr.ina.exponent = md.exp_x[7:0];
        hdr.word.setInvalid();
",
    );
    recirculate_with(
        p,
        bridge::HARVEST_UP,
        ("stamp", "bypass", "0"),
        "md.up_port",
    );
    p.push_str(
        "    }
    // The upper switch's Missing of this switch's partials, to the second pass, which takes
    // the record of the counter it names. (Stage 1 made it a Query if the two jobs' epochs
    // are the same: its type again.)
    action recirc_missing() {
        hdr.ina.msg_type = INA_MISSING;
",
    );
    recirculate_with(
        p,
        bridge::MISSING_UP,
        ("0", "1", "0"),
        "ig_intr_md.ingress_port",
    );
    p.push_str(
        "    }
    // This switch's Query up, asking `ask`.
    action query_up(bit<8> ask) {
",
    );
    to_egress(p, bridge::UP);
    reply_headers(p, 0);
    p.push_str(
        "        hdr.ina.msg_type = INA_QUERY;
        hdr.ina.exponent = ask;
        hdr.word.setInvalid();
        hdr.payload.setInvalid();
        ig_tm_md.ucast_egress_port = md.up_port;
    }
    // A Pending with the set's bitmap to rank 0, whose asking the upper switch answered:
    // to the job's group, whose egress keeps rank 0's copy (replication id 0) alone.
    action pending_to_rank0() {
",
    );
    to_egress(p, bridge::RANK0);
    reply_headers(p, 1);
    p.push_str(
        "        hdr.ina.msg_type = INA_PENDING;
        hdr.ina.epoch = md.job_epoch;
        hdr.ina.rank = 0;
        hdr.ina.exponent = 0;
        hdr.word.setValid();
        // (The word is ina_outcome's.)
        hdr.payload.setInvalid();
        ig_tm_md.mcast_grp_a = md.mgrp;
    }
    // The total (its lengths and count are the upper switch's): the second pass stores it
    // and multicasts it, through egress if `stamp` (see multicast_result_harvest).
    action store_total(bit<1> stamp, bit<1> bypass) {
        hdr.ina.gap = 0;
        hdr.ina.gap_on = 0;
        hdr.ina.epoch = md.job_epoch;
        hdr.ina.rank = 0;
",
    );
    recirculate_with(
        p,
        bridge::HARVEST_MCAST,
        ("stamp", "bypass", "1"),
        "ig_intr_md.ingress_port",
    );
    p.push_str("    }\n");
}

/// A reply's length arguments for `elems` elements: `total_len, udp_len, count`.
fn length_args(elems: u16) -> String {
    let udp = 8 + HEADER_LEN + 4 * usize::from(elems);
    format!("{}, {udp}, {elems}", 20 + udp)
}

/// The arguments of a packet through the second pass: `stamp, bypass` (through egress, which
/// stamps the block's gap counter, if `stamp`).
fn stamp_args(stamp: bool) -> String {
    format!("{}, {}", u8::from(stamp), u8::from(!stamp))
}

/// `send_partial_harvest(total_len, udp_len, count, stamp, bypass)`: the partial sum of
/// `elems` elements up through the second pass, through egress for its gap counter if
/// `stamp`.
fn partial_harvest(elems: u16, stamp: bool) -> String {
    format!(
        "send_partial_harvest({}, {})",
        length_args(elems),
        stamp_args(stamp)
    )
}

/// `multicast_result(total_len, udp_len, count)` or, through the second pass,
/// `multicast_result_harvest(.., stamp, bypass)`: the multicast of a Result of `elems` elements.
fn multicast(elems: u16, harvest: Option<bool>) -> String {
    let lengths = length_args(elems);
    match harvest {
        None => format!("multicast_result({lengths})"),
        Some(stamp) => format!("multicast_result_harvest({lengths}, {})", stamp_args(stamp)),
    }
}

/// The tables that pick the frame's action from the decision (`md.op`, `md.outcome`):
/// `ina_reply` (stage 7), and for a rack switch's own packets (PROTOCOL.md §9)
/// `uplink_reply` (stage 8; a stage's instruction memory holds 32 actions, and the value
/// tables take 16).
fn reply_table(p: &mut P4) {
    let s = |x: u8| x.to_string();
    let full = ELEMS.to_string();
    let mut rows = vec![
        entry(
            &[&s(op::HARVEST), "_", &s(bridge::HARVEST_UNICAST), "_"],
            format!("send_harvest_unicast({})", bridge::REPLY),
        ),
        entry(
            &[&s(op::HARVEST), "_", &s(bridge::HARVEST_UP), "_"],
            format!("send_harvest_unicast({})", bridge::UP),
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
        // A multicast result that takes its block's gap counter goes through a second pass.
        entry(
            &[&s(op::DATA), &s(out::MCAST), "_", "0", "1"],
            multicast(0, Some(true)),
        ),
        entry(
            &[&s(op::DATA), &s(out::MCAST), "_", &full, "1"],
            multicast(ELEMS, Some(true)),
        ),
        entry(
            &[&s(op::DATA), &s(out::MCAST_HARVEST), "_", "_", "1"],
            multicast(ELEMS, Some(true)),
        ),
        entry(
            &[&s(op::DATA), &s(out::MCAST), "_", "0"],
            multicast(0, None),
        ),
        entry(
            &[&s(op::DATA), &s(out::MCAST), "_", &full],
            multicast(ELEMS, None),
        ),
        entry(
            &[&s(op::DATA), &s(out::MCAST_HARVEST), "_", "_"],
            multicast(ELEMS, Some(false)),
        ),
    ];
    // The rack switch's own packets: uplink_reply's.
    let mut uplink = Vec::new();
    // A first partial (op DATA) takes its block's counter where the block keeps cells.
    uplink.push(entry(
        &[&s(op::DATA), &s(out::PARTIAL), "1"],
        partial_harvest(0, true),
    ));
    uplink.push(entry(
        &[&s(op::DATA), &s(out::PARTIAL_HARVEST), "1"],
        partial_harvest(ELEMS, true),
    ));
    for o in [op::DATA, op::QUERY, op::UP_PENDING, op::UP_REPORTED] {
        uplink.push(entry(&[&s(o), &s(out::PARTIAL)], "send_partial_empty()"));
        uplink.push(entry(
            &[&s(o), &s(out::PARTIAL_HARVEST)],
            partial_harvest(ELEMS, false),
        ));
    }
    uplink.push(entry(
        &[&s(op::UP_MISSING), &s(out::RECIRC_MISSING)],
        "recirc_missing()",
    ));
    for o in [op::DATA, op::QUERY] {
        uplink.push(entry(&[&s(o), &s(out::QUERY_UP)], "query_up(0)"));
    }
    uplink.push(entry(
        &[&s(op::TOTAL), &s(out::FETCH_UP)],
        format!("query_up({})", ina_wire::QueryAsk::Fetch.byte()),
    ));
    for o in [op::UP_PENDING, op::UP_REJECT] {
        uplink.push(entry(
            &[&s(o), &s(out::PENDING_RANK0)],
            "pending_to_rank0()",
        ));
    }
    for stamp in [0, 1] {
        uplink.push(entry(
            &[&s(op::TOTAL), &s(out::MCAST_TOTAL), &stamp.to_string()],
            format!("store_total({stamp}, {})", 1 - stamp),
        ));
    }
    let mut mine: Vec<(&str, &str)> = uplink
        .iter()
        .map(|e| (e.keys[0].as_str(), e.keys[1].as_str()))
        .collect();
    mine.sort();
    mine.dedup();
    for (o, outcome) in mine {
        rows.push(entry(&[o, outcome], "NoAction()"));
    }
    table(
        p,
        "ina_reply",
        Some(7),
        &[
            ("md.op", "exact"),
            ("md.outcome", "ternary"),
            ("hdr.bridge.op", "ternary"),
            ("hdr.ina.count", "ternary"),
            ("md.stamp", "ternary"),
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
            "multicast_result",
            "multicast_result_harvest",
            "send_harvest_unicast",
            "send_harvest_multicast",
            "NoAction",
        ],
        &rows,
        "drop_frame()",
    );
    table(
        p,
        "uplink_reply",
        Some(8),
        &[
            ("md.op", "exact"),
            ("md.outcome", "exact"),
            ("md.stamp", "ternary"),
        ],
        &[
            "send_partial_empty",
            "send_partial_harvest",
            "recirc_missing",
            "query_up",
            "pending_to_rank0",
            "store_total",
            "NoAction",
        ],
        &uplink,
        "NoAction()",
    );
}

/// Statements that address a reply to the sender of the frame (§7 Replies), with an `ina`
/// payload of `elems` elements.
pub(super) fn unicast_addressing(p: &mut P4, elems: u16) {
    p.push_str(
        "        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.udp.dst_port = hdr.udp.src_port;
",
    );
    reply_headers(p, elems);
    p.push_str("        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;\n");
}

/// The lengths of a reply from the switch with an `ina` payload of `elems` elements. Egress
/// writes the rest of its IPv4 and UDP headers and its source (`reply_source`).
pub(super) fn reply_headers(p: &mut P4, elems: u16) {
    let udp = 8 + HEADER_LEN + 4 * usize::from(elems);
    let _ = writeln!(
        p,
        "        hdr.ipv4.total_len = {total_len};
        hdr.udp.length = {udp};
        hdr.ina.gap = 0;
        hdr.ina.gap_on = 0;
        hdr.ina.count = {elems};",
        total_len = 20 + udp,
    );
}

/// The lengths and count of a reply from action data (`total_len`, `udp_len`, `count`).
fn reply_lengths(p: &mut P4) {
    p.push_str(
        "        hdr.ipv4.total_len = total_len;
        hdr.udp.length = udp_len;
        hdr.ina.gap = 0;
        hdr.ina.gap_on = 0;
        hdr.ina.count = count;
",
    );
}

/// Statements that send the frame through the pipe's recirculation port for its second pass,
/// with bridged instruction `op`; `stamp`: through egress, which stamps the block's gap
/// counter, and its use recorded on the second pass.
pub(super) fn recirculate(p: &mut P4, op: u8, stamp: bool) {
    let (stamp, bypass) = (u8::from(stamp).to_string(), u8::from(!stamp).to_string());
    recirculate_with(p, op, (&stamp, &bypass, "0"), "ig_intr_md.ingress_port");
}

/// [`recirculate`] with the bridged `stamp`, egress `bypass` and `store` as expressions (a
/// total's second pass stores its payload and exponent as the use's, PROTOCOL.md §9), and the
/// port a unicast leaves by after the second pass.
pub(super) fn recirculate_with(
    p: &mut P4,
    op: u8,
    (stamp, bypass, store): (&str, &str, &str),
    port: &str,
) {
    let _ = writeln!(
        p,
        "        hdr.bridge.setValid();
        hdr.bridge.op = {op};
        hdr.bridge.stamp = {stamp};
        hdr.bridge.store = {store};
        hdr.bridge._pad = 0;
        hdr.bridge.rec = use_rec_of.get({{2w1, hdr.ina.slot[12:0], hdr.ina.set}});
        hdr.bridge.port = {port};
        hdr.bridge.mgrp = md.mgrp;
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port[8:7] ++ RECIRC_PORT_IN_PIPE;
        ig_tm_md.bypass_egress = {bypass};"
    );
}

pub(super) fn to_egress(p: &mut P4, op: u8) {
    let _ = writeln!(
        p,
        "        hdr.bridge.setValid();
        hdr.bridge.op = {op};
        hdr.bridge.stamp = 0;
        hdr.bridge.store = 0;
        hdr.bridge._pad = 0;
        hdr.bridge.rec = 0;
        hdr.bridge.port = ig_intr_md.ingress_port;
        hdr.bridge.mgrp = 0;"
    );
}
