//! The ingress control, stage by stage (the stage plan is the `tna` module's).

mod outcome;
mod reply;
mod stages;
mod values;

use super::*;

/// The ingress control: its registers, each stage's tables and actions, and the apply block
/// that runs them in stage order.
pub(super) fn ingress(p: &mut P4) {
    control_head(p);
    stages::stage0(p);
    stages::stage1(p);
    stages::stage2(p);
    stages::stage3(p);
    stages::stage4(p);
    values::value_registers(p);
    outcome::outcome(p);
    reply::reply(p);
    apply(p);
}

fn control_head(p: &mut P4) {
    let _ = writeln!(
        p,
        "
// The ina header's job and epoch each in a 16-bit container of its own, apart from the flags
// byte: replies write the flags from constants and the epoch from the job table's.
@pa_container_size(\"ingress\", \"hdr.ina.epoch\", 16)
@pa_container_size(\"ingress\", \"hdr.ina.job\", 16)
// A ProbeReply's body and a payload are never in one packet (answer_probe drops the payload;
// a Probe has none): they may share containers.
@pa_mutually_exclusive(\"ingress\", \"hdr.probe\", \"hdr.payload\")
control InaIngress(inout headers_t hdr, inout ingress_md_t md,
                   in ingress_intrinsic_metadata_t ig_intr_md,
                   in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {{

    // Index = ina_proto::event::Event.
    Counter<bit<64>, bit<8>>(EVENT_COUNT, CounterType_t.PACKETS) ina_events;
    Counter<bit<64>, bit<1>>(1, CounterType_t.PACKETS) ina_multicast;
    // Index = ina_proto::event::MISSING_*: reports of lost data sent (one per report), and
    // ranks' Missing reports answered.
    Counter<bit<64>, bit<1>>(MISSING_COUNTERS, CounterType_t.PACKETS) ina_missing;

    // Twin: SlotRegisters::seq (low half = set 0, high half = set 1), indexed by slot.
    Register<pair_t, slot_index_t>(POOL_SLOTS) reg_seq;
    // Twin: SlotRegisters::seq as well: the same sequence numbers, written by the same packets.
    // One ALU gives two conditions; the decision needs three (newer, same, other set newer).
    Register<pair_t, slot_index_t>(POOL_SLOTS) reg_seq_order;
    // Twin: SlotRegisters::bitmap, set 0 and set 1, indexed by slot: an update of one set
    // takes the rank out of the other, so both are in the stage.
    Register<bit<32>, slot_index_t>(POOL_SLOTS) reg_bitmap_0;
    Register<bit<32>, slot_index_t>(POOL_SLOTS) reg_bitmap_1;
    // Twin: SlotRegisters::exp, indexed by 2 * slot + set.
    Register<bit<32>, cell_index_t>(POOL_CELLS) reg_exp;
    // SlotRegisters::count has no register here (see the header comment).

    // The counters, in the last stage: where they go first, they crowd out the tables that
    // depend on the decision as they do.
    action count_the_event() {{
        ina_events.count(md.event);
    }}
    @stage(11)
    table count_event {{
        actions = {{
            count_the_event;
        }}
        const default_action = count_the_event();
    }}
    action count_the_multicast() {{
        ina_multicast.count(0);
    }}
    @stage(11)
    table count_multicast {{
        actions = {{
            count_the_multicast;
        }}
        const default_action = count_the_multicast();
    }}
"
    );
}

/// The apply block: every stage's tables in order, then the counters.
fn apply(p: &mut P4) {
    p.push_str(
        "
    apply {
        // Stage 0.
        switch_addr.apply();
        prep_cells.apply();
        prep_gap_counter.apply();
        l2_forward.apply();
        ina_job.apply();
        ina_rank.apply();
        gap_block.apply();
        result_use_access.apply();
        result_seq_access.apply();
        // Stage 1 (with the tables whose results stage 2 reads first).
        rank_source.apply();
        ip_target.apply();
        uplink_frame.apply();
        rank_bit.apply();
        prep_compare.apply();
        prep_gap_previous.apply();
        arp_target.apply();
        full_mask.apply();
        requery_access.apply();
        // Stage 2.
        ina_check.apply();
        seq_access.apply();
        seq_order_access.apply();
        gap_access.apply();
        // Stage 3.
        if (hdr.ina.set == 0) {
            bitmap_own_0.apply();
            bitmap_other_1.apply();
        } else {
            bitmap_own_1.apply();
            bitmap_other_0.apply();
        }
        exp_access.apply();
        value_select.apply();
        prep_gap.apply();
        // Stage 4.
        seen_check.apply();
        word_check.apply();
        prep_done.apply();
        gap_report.apply();
",
    );
    for j in 0..VALUE_REGISTERS {
        let stage = VALUE_FIRST_STAGE + j / ALUS_PER_STAGE;
        if j % ALUS_PER_STAGE == 0 && j > 0 {
            let _ = writeln!(p, "        // Stage {stage}.");
            if stage == 5 {
                p.push_str("        prep_last.apply();\n");
            }
            if stage == 6 {
                p.push_str("        ina_outcome.apply();\n");
            }
            if stage == 7 {
                p.push_str("        ina_reply.apply();\n");
            }
            if stage == 8 {
                p.push_str(
                    "        uplink_reply.apply();\n        if (md.op == OP_PROBE) {\n            probe_gap_flag();\n        }\n",
                );
            }
        }
        let _ = writeln!(p, "        value_{j}.apply();");
    }
    p.push_str(
        "        // Counted once per frame, on its first pass.
        if (md.pass2 == 0) {
            count_event.apply();
        }
        if (md.mcast_count == 1) {
            count_multicast.apply();
        }
    }
}

",
    );
}
