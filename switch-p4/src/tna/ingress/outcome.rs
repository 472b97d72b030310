//! Stage 6: the decision tables of PROTOCOL.md §6 for accepted Data and Query packets.

use super::super::*;

/// Stage 6: the decision tables of §6 for accepted Data and Query packets.
pub(super) fn outcome(p: &mut P4) {
    let _ = writeln!(
        p,
        "
    // ---- stage 6: the decision tables of section 6 ----

    action outcome(bit<8> o, bit<8> event) {{
        md.outcome = o;
        md.event = event;
    }}
    action outcome_multicast(bit<8> o, bit<8> event) {{
        md.outcome = o;
        md.event = event;
        md.mcast_count = 1;
    }}
    action outcome_pending(bit<8> event) {{
        md.outcome = {pending};
        md.event = event;
        md.pend = md.bm_old & {ranks};
    }}
    action outcome_pending_empty(bit<8> event) {{
        md.outcome = {pending};
        md.event = event;
        md.pend = 0;
    }}
    action outcome_reject(bit<8> reason, bit<8> event) {{
        md.outcome = {reject};
        md.reason = reason;
        md.event = event;
    }}",
        pending = out::PENDING,
        reject = out::REJECT,
        ranks = rank_bits(),
    );
    let rows: Vec<Entry> = data_rows().into_iter().chain(query_rows()).collect();
    // old_x and new_x compare a bitmap with the mask of the job's ranks: a complete use is one
    // whose rank bits all match, whatever its KIND_BIT.
    let all_ranks = format!("32w0 &&& {}", rank_bits());
    let rows: Vec<Entry> = mismatched_kind()
        .into_iter()
        .chain(rows.into_iter().map(|mut e| {
            for k in &mut e.keys[4..6] {
                if k == "0" {
                    k.clone_from(&all_ranks);
                }
            }
            e
        }))
        .collect();
    table(
        p,
        "ina_outcome",
        Some(6),
        &[
            ("md.op", "exact"),
            ("md.seq_pred", "ternary"),
            ("md.order_pred", "ternary"),
            ("md.seen", "ternary"),
            ("md.old_x", "ternary"),
            ("md.new_x", "ternary"),
            ("md.workers", "ternary"),
            ("hdr.ina.count", "ternary"),
            ("hdr.ina.exponent", "ternary"),
        ],
        &[
            "outcome",
            "outcome_multicast",
            "outcome_pending",
            "outcome_pending_empty",
            "outcome_reject",
            "NoAction",
        ],
        &rows,
        "NoAction()",
    );
}

/// `outcome(x, event)`: the action of a row whose answer leaves one way.
fn o(x: u8, e: Event) -> String {
    format!("outcome({x}, {})", ev(e))
}

/// `outcome_multicast(x, event)`: the action of a row that completes a use.
fn m(x: u8, e: Event) -> String {
    format!("outcome_multicast({x}, {})", ev(e))
}

/// The rows of a new rank's arrival to a collecting use of the other kind than the use's:
/// refused (the table's first rows, before the accepted Data's).
fn mismatched_kind() -> [Entry; 2] {
    let data = op::DATA.to_string();
    let full = ELEMS.to_string();
    // Key: op, seq_pred, order_pred, seen, old_x, new_x, workers, count, exponent.
    // A new rank's arrival to a collecting use, of the other kind than the use's (bit 31 of
    // old_x is the use's KIND_BIT): refused; stage 3 left the registers as they were.
    let kind = format!("{} &&& {}", kind_bit(), kind_bit());
    let payload_kind = format!("32w0 &&& {}", kind_bit());
    let bad_count = format!(
        "outcome_reject({}, {})",
        RejectReason::BadCount as u8,
        ev(Event::BadCount)
    );
    [(kind.as_str(), full.as_str()), (payload_kind.as_str(), "0")].map(|(old_x, count)| {
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_OLDER,
                "0",
                old_x,
                "_",
                "_",
                count,
                "_",
            ],
            bad_count.clone(),
        )
    })
}

/// The rows of §6's decision table for an accepted Data packet.
fn data_rows() -> Vec<Entry> {
    let data = op::DATA.to_string();
    let full = ELEMS.to_string();
    vec![
        entry(
            &[&data, pred::STALE, "_", "_", "_", "_", "_", "_", "_"],
            o(out::DROP, Event::StaleSeq),
        ),
        entry(
            &[&data, pred::NEW, "_", "_", "_", "_", "1", "_", "_"],
            m(out::MCAST, Event::DataFirst),
        ),
        entry(
            &[&data, pred::NEW, "_", "_", "_", "_", "_", "_", "_"],
            o(out::DROP, Event::DataFirst),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_NEWER,
                "1",
                "_",
                "_",
                "_",
                "0",
                "_",
            ],
            o(out::RESULT, Event::ResultUnicast),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_NEWER,
                "1",
                "_",
                "_",
                "_",
                &full,
                "_",
            ],
            o(out::RESULT_HARVEST, Event::ResultUnicast),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_NEWER,
                "0",
                "_",
                "_",
                "_",
                "_",
                "_",
            ],
            o(out::DROP, Event::Duplicate),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_OLDER,
                "1",
                "0",
                "_",
                "_",
                "0",
                "_",
            ],
            o(out::RESULT, Event::ResultUnicast),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_OLDER,
                "1",
                "0",
                "_",
                "_",
                &full,
                "_",
            ],
            o(out::RESULT_HARVEST, Event::ResultUnicast),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_OLDER,
                "1",
                "_",
                "_",
                "_",
                "_",
                "_",
            ],
            format!("outcome_pending({})", ev(Event::PendingSent)),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_OLDER,
                "0",
                "_",
                "0",
                "_",
                "0",
                "_",
            ],
            m(out::MCAST, Event::DataAdded),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_OLDER,
                "0",
                "_",
                "0",
                "_",
                &full,
                "_",
            ],
            m(out::MCAST_HARVEST, Event::DataAdded),
        ),
        entry(
            &[
                &data,
                pred::SAME,
                pred::OTHER_OLDER,
                "0",
                "_",
                "_",
                "_",
                "_",
                "_",
            ],
            o(out::DROP, Event::DataAdded),
        ),
    ]
}

/// The rows of §6's decision table for an accepted Query.
fn query_rows() -> Vec<Entry> {
    let query = op::QUERY.to_string();
    vec![
        entry(
            &[&query, pred::STALE, "_", "_", "_", "_", "_", "_", "_"],
            o(out::DROP, Event::StaleSeq),
        ),
        entry(
            &[&query, pred::NEW, "_", "_", "_", "_", "_", "_", "_"],
            format!("outcome_pending_empty({})", ev(Event::PendingSent)),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_NEWER,
                "1",
                "_",
                "_",
                "_",
                "_",
                QUERY_WITHOUT_SUMS,
            ],
            o(out::RESULT, Event::ResultUnicast),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_NEWER,
                "1",
                "_",
                "_",
                "_",
                "_",
                "_",
            ],
            o(out::RESULT_HARVEST, Event::ResultUnicast),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_NEWER,
                "0",
                "_",
                "_",
                "_",
                "_",
                "_",
            ],
            o(out::DROP, Event::Duplicate),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_OLDER,
                "1",
                "0",
                "_",
                "_",
                "_",
                QUERY_WITHOUT_SUMS,
            ],
            o(out::RESULT, Event::ResultUnicast),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_OLDER,
                "1",
                "0",
                "_",
                "_",
                "_",
                "_",
            ],
            o(out::RESULT_HARVEST, Event::ResultUnicast),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_OLDER,
                "0",
                "0",
                "_",
                "_",
                "_",
                "_",
            ],
            o(out::DROP, Event::Duplicate),
        ),
        entry(
            &[
                &query,
                pred::SAME,
                pred::OTHER_OLDER,
                "_",
                "_",
                "_",
                "_",
                "_",
                "_",
            ],
            format!("outcome_pending({})", ev(Event::PendingSent)),
        ),
    ]
}
