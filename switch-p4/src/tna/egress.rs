//! The egress: its parser, the per-rank rewrite of a multicast Result, and the deparser that
//! completes the IPv4 checksum.

use super::*;

pub(super) fn egress_parser(p: &mut P4) {
    let _ = writeln!(
        p,
        "parser InaEgressParser(packet_in pkt, out headers_t hdr, out egress_md_t md,
                       out egress_intrinsic_metadata_t eg_intr_md) {{
    state start {{
        md.fix_checksum = 0;
        md.to_up = 0;
        pkt.extract(eg_intr_md);
        transition select(pkt.lookahead<bit<8>>()) {{
            REPORT_OP : parse_report;
            REPORT_UP_OP : parse_report;
            default : parse_bridge;
        }}
    }}

    // A report's mirrored copy: the report, then the packet as ingress left it.
    state parse_report {{
        pkt.extract(hdr.report);
        pkt.extract(hdr.bridge);
        transition parse_reply;
    }}

    state parse_bridge {{
        pkt.extract(hdr.bridge);
        transition select(hdr.bridge.op) {{
            {reply} : parse_reply;
            {mcast} : parse_reply;
            {harvest_mcast} : parse_reply;
            {harvest_up} : parse_reply;
            {up} : parse_reply;
            {rank0} : parse_reply;
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
        harvest_mcast = bridge::HARVEST_MCAST,
        harvest_up = bridge::HARVEST_UP,
        up = bridge::UP,
        rank0 = bridge::RANK0,
    );
}

pub(super) fn egress(p: &mut P4) {
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

    // A rack switch's packet to the upper switch of its job (PROTOCOL.md section 9): its
    // addresses, the upper job's epoch and this switch's rank there.
    action up_addr(bit<48> mac, bit<32> ip, bit<16> udp_port, bit<16> epoch, bit<8> rank) {{
        hdr.ethernet.dst_addr = mac;
        hdr.ipv4.dst_addr = ip;
        hdr.udp.dst_port = udp_port;
        hdr.ina.epoch = epoch;
        hdr.ina.rank = rank;
    }}
    table uplink_addr {{
        key = {{
            hdr.ina.job : exact;
        }}
        actions = {{
            up_addr;
            drop_copy;
        }}
        default_action = drop_copy();
        size = 1024;
    }}

{report}
{source}
{counters}    action stamp_result_gap() {{
        hdr.ina.gap = md.res_gap[5:0];
    }}
    // Apart from the counter: an action writes a container from one field and itself, or
    // from a constant and itself.
    action mark_gap_on() {{
        hdr.ina.gap_on = 1;
    }}
    action report_next_counter() {{
        md.report_next = hdr.report.cell + GAP_STEP;
    }}

    apply {{
        if (hdr.report.isValid()) {{
            report_next_counter();
            if (hdr.report.op != REPORT_UP_OP) {{
                ina_report_addr.apply();
            }} else if (eg_intr_md.egress_rid == 0) {{
                // Lost totals, reported to the upper switch once (the session's other copy
                // is dropped), as this switch's rank there.
                md.to_up = 1;
            }} else {{
                drop_copy();
            }}
            missing_fields();
            mark_gap_on();
            hdr.bridge.setInvalid();
        }} else if (hdr.bridge.op == {harvest_mcast} || hdr.bridge.op == {harvest_up}) {{
            // On its way to the second pass, which reads the bridged header and records the
            // use under the counter.
            if (hdr.bridge.op == {harvest_mcast}) {{
                take_result_gap();
            }} else {{
                take_partial_gap();
            }}
            stamp_result_gap();
            mark_gap_on();
        }} else {{
            if (hdr.bridge.op == {flood} && eg_intr_md.egress_port == hdr.bridge.port) {{
                drop_copy();
            }}
            // (A Pending to rank 0: its copy alone, addressed as a result's.)
            if (hdr.bridge.op == {mcast}
                || (hdr.bridge.op == {rank0} && eg_intr_md.egress_rid == 0)) {{
                ina_rank_addr.apply();
            }} else if (hdr.bridge.op == {rank0}) {{
                drop_copy();
            }} else if (hdr.bridge.op == {up}) {{
                md.to_up = 1;
            }}
            if (hdr.bridge.op == {reply} || hdr.bridge.op == {mcast} || hdr.bridge.op == {up}
                || hdr.bridge.op == {rank0}) {{
                md.fix_checksum = 1;
            }}
            hdr.bridge.setInvalid();
        }}
        hdr.report.setInvalid();
        // To the upper switch (a table applies in one place only).
        if (md.to_up == 1) {{
            uplink_addr.apply();
        }}
        // Every reply and report: the switch's source and the fixed header fields.
        if (md.fix_checksum == 1) {{
            switch_source.apply();
        }}
    }}
}}
",
        flood = bridge::FLOOD,
        mcast = bridge::MCAST,
        reply = bridge::REPLY,
        harvest_mcast = bridge::HARVEST_MCAST,
        harvest_up = bridge::HARVEST_UP,
        up = bridge::UP,
        rank0 = bridge::RANK0,
        report = report_rewrite(),
        source = reply_source(),
        counters = block_counters(),
    );
}

/// Egress's registers of the blocks' next gap counters, each stamped on its packet on the way
/// to the second pass, which records the use under it: a multicast result's, and a rack
/// switch's first partial's (PROTOCOL.md section 9). The recirculation port's queue keeps the
/// order, so a block's results reach the ranks in counter order.
fn block_counters() -> String {
    let mut p = String::from(
        "    // The blocks' next gap counters (their low six bits), stamped on the way to the second
    // pass: the recirculation port's queue keeps the order, so a block's results reach the
    // ranks in counter order.
",
    );
    for (what, twin, doc) in [
        ("result", "result_gaps", "multicast result"),
        ("partial", "partial_gaps", "first partial of a rack switch"),
    ] {
        let _ = write!(
            p,
            "    // Twin: Registers::{twin}: per block, the counter of the next {doc}.
    Register<bit<32>, block_index_t>(GAP_BLOCKS) reg_{what}_gap;
    RegisterAction<bit<32>, block_index_t, bit<32>>(reg_{what}_gap) {what}_gap_next = {{
        void apply(inout bit<32> v, out bit<32> rv) {{
            rv = v;
            v = v + 1;
        }}
    }};
    action take_{what}_gap() {{
        md.res_gap = {what}_gap_next.execute(hdr.ina.slot[12:6]);
    }}
"
        );
    }
    p
}

/// The rewrite of a report's copy into the header-only Missing to the rank whose Data showed
/// the gap (PROTOCOL.md section 5): the Data's header, type Missing, the first counter skipped in
/// the gap field (the report's cell one counter on), how many in the exponent byte. The
/// destination is the rank's, as the control plane installed it; `switch_source` writes the
/// source.
fn report_rewrite() -> String {
    let mut p = P4::default();
    p.push_str(
        "    action report_missing(bit<48> mac, bit<32> ip, bit<16> udp_port) {
        hdr.ethernet.dst_addr = mac;
        hdr.ipv4.dst_addr = ip;
        hdr.udp.dst_port = udp_port;
    }
    // A report's copy becomes the Missing: the first counter skipped and how many.
    action missing_fields() {
",
    );
    let _ = writeln!(
        p,
        "        hdr.ipv4.total_len = {total};
        hdr.udp.length = {udp};",
        udp = 8 + HEADER_LEN,
        total = 28 + HEADER_LEN,
    );
    p.push_str(
        "        hdr.ina.msg_type = INA_MISSING;
        // (gap_on is set by mark_gap_on, apart.)
        hdr.ina.gap = md.report_next[15:10];
        hdr.ina.exponent = hdr.report.skipped;
        hdr.ina.count = 0;
        md.fix_checksum = 1;
    }
    // The report of a rank of a job: keyed as the rank's Data is. (reply_source writes the
    // rest of its IPv4 and UDP headers and its source.)
    table ina_report_addr {
        key = {
            hdr.ina.job : exact;
            hdr.ina.rank : exact;
        }
        actions = {
            report_missing;
            drop_copy;
        }
        default_action = drop_copy();
        size = 32768;
    }
",
    );
    p.finish()
}

/// The switch's source addresses and the fixed fields of the IPv4 and UDP headers of every
/// reply (as `wire::frame::emit_headers` writes them): written here, where the egress-only
/// containers have room, rather than by each reply action of the ingress.
fn reply_source() -> String {
    let mut p = P4::default();
    p.push_str(
        "    action reply_source(bit<48> mac, bit<32> ip) {
        hdr.ethernet.src_addr = mac;
",
    );
    common::reply_headers(&mut p, "ip", None);
    p.push_str(
        "    }
    // One default entry: the switch's MAC and IPv4 addresses.
    table switch_source {
        actions = {
            reply_source;
        }
        default_action = reply_source(0, 0);
    }
",
    );
    p.finish()
}

pub(super) fn egress_deparser(p: &mut P4) {
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
