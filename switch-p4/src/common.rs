//! What the TNA and v1model programs share, written once: the protocol's constants, the
//! headers of a frame as they lie on the wire, the parser states of Ethernet, IPv4 and UDP,
//! and the fields of the IPv4 checksum.

use crate::writer::P4;
use core::fmt::Write as _;
use ina_wire::agg::{MessageType, RejectReason, PROTOCOL_VERSION, UDP_PORT};

/// The message types a program names, with the name of their constant (`INA_<name>`).
const MESSAGE_TYPES: [(&str, MessageType); 8] = [
    ("DATA", MessageType::Data),
    ("RESULT", MessageType::Result),
    ("REJECT", MessageType::Reject),
    ("PROBE", MessageType::Probe),
    ("PROBE_REPLY", MessageType::ProbeReply),
    ("PENDING", MessageType::Pending),
    ("QUERY", MessageType::Query),
    ("MISSING", MessageType::Missing),
];

/// The constants of the frame and of the `ina` header (PROTOCOL.md §2, §7): the message
/// types among `types` (names of [`MESSAGE_TYPES`]), and the Reject reasons if `reasons`.
pub(crate) fn protocol_constants(p: &mut P4, types: &[&str], reasons: bool) {
    p.lines(&format!(
        "const bit<16> ETHERTYPE_IPV4 = 0x0800;
        const bit<16> ETHERTYPE_ARP = 0x0806;
        const bit<8> IP_PROTO_UDP = 17;
        const bit<16> INA_UDP_PORT = {UDP_PORT};
        const bit<4> INA_VERSION = {PROTOCOL_VERSION};"
    ));
    for (name, t) in MESSAGE_TYPES.iter().filter(|(n, _)| types.contains(n)) {
        let _ = writeln!(p, "const bit<4> INA_{name} = {};", *t as u8);
    }
    let all_reasons = [
        ("STALE_EPOCH", RejectReason::StaleEpoch),
        ("SLOT_OUT_OF_RANGE", RejectReason::SlotOutOfRange),
        ("BAD_COUNT", RejectReason::BadCount),
    ];
    for (name, r) in all_reasons.iter().filter(|_| reasons) {
        let _ = writeln!(p, "const bit<8> REJECT_{name} = {};", *r as u8);
    }
}

/// The headers of a frame to or from the switch: Ethernet, ARP, IPv4, UDP, the `ina` header
/// (wire/src/agg.rs) and the payloads of a ProbeReply and a Pending answer.
pub(crate) fn wire_headers(p: &mut P4) {
    p.lines(
        "header ethernet_h {
        bit<48> dst_addr;
        bit<48> src_addr;
        bit<16> ether_type;
        }

        header arp_h {
        bit<16> htype;
        bit<16> ptype;
        bit<8> hlen;
        bit<8> plen;
        bit<16> oper;
        bit<48> sha;
        bit<32> spa;
        bit<48> tha;
        bit<32> tpa;
        }

        header ipv4_h {
        bit<4> version;
        bit<4> ihl;
        bit<8> diffserv;
        bit<16> total_len;
        bit<16> identification;
        bit<3> flags;
        bit<13> frag_offset;
        bit<8> ttl;
        bit<8> protocol;
        bit<16> hdr_checksum;
        bit<32> src_addr;
        bit<32> dst_addr;
        }

        header udp_h {
        bit<16> src_port;
        bit<16> dst_port;
        bit<16> length;
        bit<16> checksum;
        }

        // wire/src/agg.rs, 16 bytes. The flags byte: the gap counter (6 bits), whether the
        // packet carries one, and the shadow set.
        header ina_h {
        bit<4> version;
        bit<4> msg_type;
        bit<6> gap;
        bit<1> gap_on;
        bit<1> set;
        bit<16> job;
        bit<16> epoch;
        bit<8> rank;
        bit<8> exponent;
        bit<16> slot;
        bit<16> count;
        bit<32> seq;
        }

        // ProbeReply payload: workers, elements per packet, first slot, slot count, each a
        // 32-bit number on the wire, declared in the widths the switch's values have (Tofino
        // moves a field only into a container of its own size).
        header ina_probe_h {
        bit<24> workers_hi;
        bit<8> workers;
        bit<16> elems_hi;
        bit<16> elems;
        bit<16> slot_base_hi;
        bit<16> slot_base;
        bit<16> slot_count_hi;
        bit<16> slot_count;
        }

        // Pending payload: the contributor bitmap.
        header ina_bitmap_h {
        bit<32> bitmap;
        }",
    );
}

/// A header `name` of payload elements `first..end`, as they lie on the wire.
pub(crate) fn payload_header(p: &mut P4, name: &str, first: u16, end: u16) {
    let _ = writeln!(
        p,
        "// Payload elements {first}..{end}, as they lie on the wire."
    );
    let _ = writeln!(p, "header {name} {{");
    for k in first..end {
        let _ = writeln!(p, "bit<32> e{k};");
    }
    p.line("}");
}

/// The parser states from Ethernet to the `ina` header: `parse_ethernet`, `parse_ipv4`
/// (IHL 5, neither MF nor a fragment offset, UDP) and `parse_udp` (to the `ina` port), which
/// go on to `parse_arp` and `parse_ina`, each program's own.
pub(crate) fn frame_parser_states(p: &mut P4) {
    l3_parser_states(p);
    p.lines(
        "
        state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
        INA_UDP_PORT : parse_ina;
        default : accept;
        }
        }",
    );
}

/// The parser states of Ethernet and IPv4, up to `parse_udp` (the caller's).
pub(crate) fn l3_parser_states(p: &mut P4) {
    p.lines(
        "state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
        ETHERTYPE_ARP : parse_arp;
        ETHERTYPE_IPV4 : parse_ipv4;
        default : accept;
        }
        }

        state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.flags[0:0], hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
        (5, 0, 0, IP_PROTO_UDP) : parse_udp;
        default : accept;
        }
        }",
    );
}

/// The fields of the IPv4 header checksum, in order, as a P4 list.
pub(crate) const IPV4_CHECKSUM_FIELDS: &str = "{ hdr.ipv4.version, hdr.ipv4.ihl, \
    hdr.ipv4.diffserv, hdr.ipv4.total_len, hdr.ipv4.identification, hdr.ipv4.flags, \
    hdr.ipv4.frag_offset, hdr.ipv4.ttl, hdr.ipv4.protocol, hdr.ipv4.src_addr, \
    hdr.ipv4.dst_addr }";

/// The action that addresses one copy of a multicast Result to its rank (PROTOCOL.md §7).
pub(crate) fn rewrite_dst_action(p: &mut P4) {
    p.lines(
        "action rewrite_dst(bit<48> mac, bit<32> ip, bit<16> udp_port) {
        hdr.ethernet.dst_addr = mac;
        hdr.ipv4.dst_addr = ip;
        hdr.udp.dst_port = udp_port;
        }",
    );
}

/// Statements that write the IPv4 and UDP headers of a reply from the switch (as
/// `wire::frame::emit_headers` writes them) from source address `src_ip`, with lengths
/// `total_len` (IPv4) and `udp_len` (UDP) when given (the Tofino program's egress writes the
/// rest of a reply's headers and its ingress the lengths). The destination addresses are the
/// caller's.
pub(crate) fn reply_headers(p: &mut P4, src_ip: &str, lengths: Option<(&str, &str)>) {
    let (total_len, udp_len) = lengths.map_or((String::new(), String::new()), |(t, u)| {
        (
            format!("hdr.ipv4.total_len = {t};"),
            format!("hdr.udp.length = {u};"),
        )
    });
    p.lines(
        &format!(
            "hdr.ipv4.version = 4;
        hdr.ipv4.ihl = 5;
        hdr.ipv4.diffserv = 0;
        {total_len}
        hdr.ipv4.identification = 0;
        hdr.ipv4.flags = 0b010;
        hdr.ipv4.frag_offset = 0;
        hdr.ipv4.ttl = 64;
        hdr.ipv4.protocol = IP_PROTO_UDP;
        hdr.ipv4.hdr_checksum = 0;
        hdr.ipv4.src_addr = {src_ip};
        hdr.udp.src_port = INA_UDP_PORT;
        {udp_len}
        hdr.udp.checksum = 0;"
        )
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n"),
    );
}

/// The ProbeReply's payload of header `hdr` (an `ina_probe_h`) from the job's `workers`,
/// `elems`, `slot_base` and `slot_count`: each a 32-bit number on the wire, written as its
/// high part (0) and the value.
pub(crate) fn probe_fields(p: &mut P4, hdr: &str, values: [&str; 4]) {
    let fields = ["workers", "elems", "slot_base", "slot_count"];
    for (field, value) in fields.iter().zip(values) {
        let _ = writeln!(p, "{hdr}.{field}_hi = 0;");
        let _ = writeln!(p, "{hdr}.{field} = {value};");
    }
}
