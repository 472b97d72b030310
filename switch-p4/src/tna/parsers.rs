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
        transition select(hdr.bridge.op) {{
            {harvest_up} : partial_records;
            {missing_up} : partial_records;
            default : parse_bridge_frame;
        }}
    }}

    // A rack switch's partial, or its upper switch's Missing (PROTOCOL.md section 9).
    state partial_records {{
        md.space = 1;
        transition parse_bridge_frame;
    }}

    state parse_bridge_frame {{
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        pkt.extract(hdr.ina);
        transition select(hdr.ina.count) {{
            INA_ELEMS : parse_bridge_payload;
            // (A total's header alone: its second pass stores its kind.)
            0 : header_kind;
            default : accept;
        }}
    }}

    state parse_bridge_payload {{
        pkt.extract(hdr.payload);
        transition accept;
    }}

    // (A parser state matches at most 32 bits on Tofino: the hardware and protocol types
    // first, then the lengths and the operation.)
    state parse_arp {{
        transition select(pkt.lookahead<bit<32>>()) {{
            16w1 ++ ETHERTYPE_IPV4 : parse_arp_ipv4;
            default : parse_arp_other;
        }}
    }}

    state parse_arp_ipv4 {{
        pkt.extract(hdr.arp);
        transition select(hdr.arp.hlen, hdr.arp.plen, hdr.arp.oper) {{
            (6, 4, 1) : arp_request;
            default : accept;
        }}
    }}

    state parse_arp_other {{
        pkt.extract(hdr.arp);
        transition accept;
    }}

    state arp_request {{
        md.arp_req = 1;
        transition accept;
    }}
",
        harvest_up = bridge::HARVEST_UP,
        missing_up = bridge::MISSING_UP,
        init = INIT_ZERO
            .iter()
            .map(|f| format!("        md.{f} = 0;\n"))
            .collect::<String>(),
    );
    common::l3_parser_states(p);
    let _ = writeln!(
        p,
        "
    // The payload is parsed for {ELEMS}-element Data and Result packets whose UDP length says
    // so; every other ina packet is a header (anything after it stays behind as payload).
    // (A parser state matches at most 32 bits on Tofino: the UDP length is matched where
    // the UDP header is.)
    state parse_udp {{
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dst_port, hdr.udp.length) {{
            (INA_UDP_PORT, {full_len}) : parse_ina_full;
            (INA_UDP_PORT, {word_len}) : parse_ina_word;
            (INA_UDP_PORT, _) : parse_ina;
            default : accept;
        }}
    }}

    state parse_ina_full {{
        md.ina_expected = 1;
        pkt.extract(hdr.ina);
        transition select(hdr.ina.version, hdr.ina.msg_type, hdr.ina.count) {{
            (INA_VERSION, INA_DATA, INA_ELEMS) : parse_payload;
            (INA_VERSION, INA_RESULT, INA_ELEMS) : parse_payload;
            (_, _, 0) : header_kind;
            default : accept;
        }}
    }}

    // A packet of one word: an upper switch's Pending (PROTOCOL.md section 9) has its bitmap.
    state parse_ina_word {{
        md.ina_expected = 1;
        pkt.extract(hdr.ina);
        pkt.extract(hdr.word);
        transition accept;
    }}

    state parse_ina {{
        md.ina_expected = 1;
        pkt.extract(hdr.ina);
        transition select(hdr.ina.count) {{
            0 : header_kind;
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
        word_len = 8 + HEADER_LEN + 4,
        kind = kind_bit(),
    );
}

/// The metadata fields some path reads before a table writes them, zeroed by the parser. The
/// others are written by their tables' default actions (`tables::MISS_ZERO` and the tables of
/// stages 0 and 1), so that they take containers only from their own stage on.
pub(super) const INIT_ZERO: [&str; 7] = [
    "kind",
    "pass2",
    "space",
    "arp_req",
    "ina_expected",
    "vop",
    "reason",
];

pub(super) fn ingress_deparser(p: &mut P4) {
    p.push_str(
        "control InaIngressDeparser(packet_out pkt, inout headers_t hdr, in ingress_md_t md,
                           in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    Mirror() mirror;
    apply {
        // A Missing report: a copy of the packet, with the counters skipped ahead of it.
        if (ig_dprsr_md.mirror_type == MIRROR_TYPE_REPORT) {
            mirror.emit<report_h>(md.mirror_session, {md.rep_op, md.gap_old, md.rep_skipped});
        }
        pkt.emit(hdr);
    }
}

",
    );
}
