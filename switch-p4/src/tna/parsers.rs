//! The ingress parser and deparser.

use super::*;

pub(super) fn ingress_parser(p: &mut P4) {
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
        transition select(hdr.ina.count) {{
            INA_ELEMS : parse_bridge_payload;
            default : accept;
        }}
    }}

    state parse_bridge_payload {{
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
            (_, _, 0, _) : header_kind;
            default : accept;
        }}
    }}

    // A packet without elements: a Data packet of this kind begins a use of its kind
    // (KIND_BIT in md.kind, which the set's registers compare).
    state header_kind {{
        md.kind = {kind};
        transition accept;
    }}

    state parse_payload {{
        pkt.extract(hdr.payload);
        transition accept;
    }}
}}
",
        full_len = 8 + HEADER_LEN + 4 * usize::from(ELEMS),
        kind = kind_bit(),
    );
}

/// The metadata fields some path reads before it writes them, zeroed by the parser.
pub(super) const INIT_ZERO: [&str; 25] = [
    "kind",
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
    "gap_block",
    "gap_old",
    "rec",
    "from_missing",
];

pub(super) fn ingress_deparser(p: &mut P4) {
    p.push_str(
        "control InaIngressDeparser(packet_out pkt, inout headers_t hdr, in ingress_md_t md,
                           in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    Mirror() mirror;
    apply {
        // A Missing report: a copy of the packet, with the counters skipped ahead of it.
        if (ig_dprsr_md.mirror_type == MIRROR_TYPE_REPORT) {
            mirror.emit<report_h>(md.mirror_session, {md.rep_op, 0, md.rep_first, md.rep_skipped});
        }
        pkt.emit(hdr);
    }
}

",
    );
}
