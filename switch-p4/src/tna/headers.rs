//! The headers and metadata of the TNA program.

use super::*;

pub(super) fn headers(p: &mut P4) {
    p.push_str(
        "\
// Between the passes and from ingress to egress: what the packet still needs.
header bridge_h {
    bit<8> op;
    // A multicast result's second pass stamps its block's gap counter.
    bit<1> stamp;
    // A total from the upper switch (PROTOCOL.md section 9): its second pass stores it.
    bit<1> store;
    bit<5> _pad;
    PortId_t port;
    bit<16> mgrp;
    // A stamped result's use, for reg_result_use: 1 << 14 | 2 * slot + set.
    bit<16> rec;
}

// Ahead of a report's mirrored copy (REPORT_OP), which also has its bridged header: the
// rank's gap cell as it was (its counter, in the top six bits, is the one before the first
// skipped) and how many counters were skipped.
header report_h {
    bit<8> op;
    bit<16> cell;
    bit<8> skipped;
}

",
    );
    common::wire_headers(p);
    p.blank();
    common::payload_header(p, "ina_payload_h", 0, ELEMS);
    p.push_str(
        "
struct headers_t {
    report_h report;
    bridge_h bridge;
    ethernet_h ethernet;
    arp_h arp;
    ipv4_h ipv4;
    udp_h udp;
    ina_h ina;
    ina_probe_h probe;
    ina_bitmap_h word;
    ina_payload_h payload;
}

struct ingress_md_t {
    bit<1> pass2;
    // The second pass of a rack switch's partial or of its upper switch's Missing: the
    // records it touches are the partials' (PROTOCOL.md section 9).
    bit<1> space;
    bit<1> arp_req;
    bit<1> ina_expected;
    bit<16> cnt4;
    bit<16> ulen;
    cell_index_t cell;
    bit<1> job_hit;
    bit<16> job_epoch;
    bit<16> epoch_x;
    bit<16> slot_base;
    bit<16> slot_off;
    bit<16> slot_count;
    bit<16> elems;
    bit<16> count_x;
    bit<8> workers;
    bit<16> mgrp;
    bit<1> rank_hit;
    // The frame comes from its rank's port and address.
    bit<1> src_ok;
    bit<32> rbit;
    bit<2> l2_kind;
    PortId_t l2_port;
    bit<16> l2_mgrp;
    // To the switch's IPv4 address; an ARP request for it.
    bit<1> ip_mine;
    bit<1> arp_mine;
    bit<16> len_x;
    bit<16> room;
    bit<9> l2_port_x;
    bit<32> full_mask;
    bit<8> op;
    bit<8> event;
    bit<8> reason;
    bit<4> seq_pred;
    bit<4> order_pred;
    bit<32> bm_old;
    bit<32> old_x;
    bit<32> new_x;
    // The set's exp cell's low half: the exponent byte, and bit 8, set once the upper
    // switch's total is stored (PROTOCOL.md section 9).
    bit<16> exp_x;
    bit<1> seen;
    bit<8> vop_c;
    bit<8> vop;
    bit<8> outcome;
    bit<1> mcast_count;
    bit<32> exp_h;
    bit<32> kind;
    bit<1> reports;
    bit<1> gap_block;
    bit<1> stamp;
    gap_index_t gap_cell;
    bit<16> gap_in;
    bit<16> gap_in1;
    bit<16> gap_old;
    bit<16> gap_ahead;
    // The report header's fields: the mirror's field list takes no constant but 0.
    bit<8> rep_op;
    bit<8> rep_skipped;
    MirrorId_t mirror_session;
    bit<32> rec;
    bit<32> rec_seq;
    bit<1> from_missing;
    // The job's upper switch (PROTOCOL.md section 9; has_up = 0: none) and its port.
    bit<1> has_up;
    PortId_t up_port;
    // The frame came in on the job's uplink port: 1, 3 with the upper job's epoch.
    bit<2> from_up;
    // An upper switch's Pending holds this switch's bit.
    bit<1> word_me;
}

struct egress_md_t {
    bit<1> fix_checksum;
    // To the job's upper switch: uplink_addr addresses it.
    bit<1> to_up;
    bit<32> res_gap;
    // A report's cell, one counter on: the first counter skipped.
    bit<16> report_next;
}

",
    );
}
