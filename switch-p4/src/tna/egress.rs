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
