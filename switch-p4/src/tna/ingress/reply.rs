//! Stage 7: the frame that leaves, for every decision, and how a reply is addressed.

use super::super::*;

/// Stage 7: the frame that leaves, for every decision.
pub(super) fn reply(p: &mut P4) {
    p.push_str("\n    // ---- stage 7: the frame that leaves ----\n\n");
    forwarding_actions(p);
    answer_actions(p);
    multicast_actions(p);
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
        hdr.ina.exponent = md.exp_x;
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
        hdr.ina.exponent = md.exp_x;
",
    );
    recirculate(p, bridge::HARVEST_UNICAST, false);
    p.push_str("    }\n");
}

/// A completed use's Result to every rank, and the second pass of one with a payload.
fn multicast_actions(p: &mut P4) {
    for (name, elems) in [("multicast_result_empty", 0), ("multicast_result", ELEMS)] {
        let _ = writeln!(
            p,
            "    // A Result to every rank of the job (addresses per rank in egress), count {elems}."
        );
        let _ = writeln!(p, "    action {name}() {{");
        to_egress(p, bridge::MCAST);
        reply_headers(p, elems);
        p.push_str(
            "        hdr.ina.msg_type = INA_RESULT;
        hdr.ina.exponent = md.exp_x;
        ig_tm_md.mcast_grp_a = md.mgrp;
    }
",
        );
    }

    p.push_str(
        "    // The last arrival of a use with payload: the high halves are in; the second pass\n    // reads the low halves and multicasts.\n",
    );
    p.push_str(
        "    // The same through egress, which stamps the block's gap counter on the way to the\n    // second pass (with payload, or without: such a result takes the pass for its counter).\n",
    );
    for (name, elems, stamp) in [
        ("multicast_result_harvest", ELEMS, false),
        ("multicast_result_harvest_stamped", ELEMS, true),
        ("multicast_result_empty_harvest", 0, true),
    ] {
        let _ = writeln!(p, "    action {name}() {{");
        reply_headers(p, elems);
        p.push_str(
            "        hdr.ina.msg_type = INA_RESULT;
        hdr.ina.exponent = md.exp_x;
",
        );
        recirculate(p, bridge::HARVEST_MCAST, stamp);
        p.push_str("    }\n");
    }

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
}

/// The table that picks the frame's action from the decision (`md.op`, `md.outcome`).
fn reply_table(p: &mut P4) {
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
        // A multicast result that takes its block's gap counter goes through a second pass.
        entry(
            &[&s(op::DATA), &s(out::MCAST), "_", "0", "1"],
            "multicast_result_empty_harvest()",
        ),
        entry(
            &[&s(op::DATA), &s(out::MCAST), "_", &ELEMS.to_string(), "1"],
            "multicast_result_harvest_stamped()",
        ),
        entry(
            &[&s(op::DATA), &s(out::MCAST_HARVEST), "_", "_", "1"],
            "multicast_result_harvest_stamped()",
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
    // Rows written without the last keys match any value of them.
    let rows: Vec<Entry> = rows
        .into_iter()
        .map(|mut e| {
            e.keys.resize(5, "_".into());
            e
        })
        .collect();
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
            "multicast_result_empty",
            "multicast_result",
            "multicast_result_harvest",
            "multicast_result_harvest_stamped",
            "multicast_result_empty_harvest",
            "send_harvest_unicast",
            "send_harvest_multicast",
        ],
        &rows,
        "drop_frame()",
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

/// Statements that send the frame through the pipe's recirculation port for its second pass,
/// with bridged instruction `op`; `stamp`: through egress, which stamps the block's gap
/// counter, and its use recorded on the second pass.
pub(super) fn recirculate(p: &mut P4, op: u8, stamp: bool) {
    let (stamp, bypass) = (u8::from(stamp), u8::from(!stamp));
    let _ = writeln!(
        p,
        "        hdr.bridge.setValid();
        hdr.bridge.op = {op};
        hdr.bridge.stamp = {stamp};
        hdr.bridge._pad = 0;
        hdr.bridge.rec = use_rec_of.get({{2w1, hdr.ina.slot[12:0], hdr.ina.set}});
        hdr.bridge.port = ig_intr_md.ingress_port;
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
        hdr.bridge._pad = 0;
        hdr.bridge.rec = 0;
        hdr.bridge.port = ig_intr_md.ingress_port;
        hdr.bridge.mgrp = 0;"
    );
}
