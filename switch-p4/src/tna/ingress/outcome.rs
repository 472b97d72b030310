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
    action outcome_pending(bit<8> o, bit<8> event) {{
        md.outcome = o;
        md.event = event;
        // The Pending's word, written here (the reply makes the header valid).
        hdr.word.bitmap = md.bm_old & {ranks};
    }}
    action outcome_pending_empty(bit<8> event) {{
        md.outcome = {pending};
        md.event = event;
        hdr.word.bitmap = 0;
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
    let rows: Vec<Entry> = tree_rows()
        .into_iter()
        .chain(data_rows())
        .chain(query_rows())
        .collect();
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
            ("md.has_up", "ternary"),
            ("md.exp_x[8:8]", "ternary"),
            ("hdr.ina.rank", "ternary"),
            ("md.reports", "ternary"),
            ("md.word_me", "ternary"),
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

/// The keys of `ina_outcome`.
const OUTCOME_KEYS: usize = 14;

/// `outcome_pending(x, event)`: a Pending with the set's bitmap, to the sender or (`x`
/// `PENDING_RANK0`) to rank 0.
fn pending(x: u8, e: Event) -> String {
    format!("outcome_pending({x}, {})", ev(e))
}

/// The columns of `ina_outcome`, as [`tree_rows`] names them.
const OUTCOME_COLUMNS: [&str; OUTCOME_KEYS] = [
    "op", "seq", "order", "seen", "old_x", "new_x", "workers", "count", "exponent", "has_up",
    "total_in", "rank", "reports", "word_me",
];

/// A row of `ina_outcome` with the columns named (the others `_`).
fn outcome_row(set: &[(&str, &str)], action: String) -> Entry {
    let keys: Vec<String> = OUTCOME_COLUMNS
        .iter()
        .map(|c| {
            set.iter()
                .find(|(name, _)| name == c)
                .map_or("_", |(_, v)| v)
                .to_string()
        })
        .collect();
    Entry { keys, action }
}

/// The rows of a job under an upper switch (PROTOCOL.md §9), before §6's: the last local
/// arrival sends the partial up; a use that waits for its total (every rank's bit, the other
/// set holds no newer use, `reg_exp`'s bit 8 clear) answers its ranks with a Query up (rank 0)
/// or a Pending; and the upper switch's total, Pending and Reject. "0" in the `old_x` and
/// `new_x` columns means every rank's bit, as in §6's rows; a full bitmap of a use that carried
/// payload is `old_x` 0 exactly, of one begun by headers `KIND_BIT` exactly.
fn tree_rows() -> Vec<Entry> {
    let s = |x: u8| x.to_string();
    let (data, query) = (s(op::DATA), s(op::QUERY));
    let (total, up_pending, up_reject) = (s(op::TOTAL), s(op::UP_PENDING), s(op::UP_REJECT));
    let full = ELEMS.to_string();
    let full_payload = "32w0".to_string();
    let full_header = format!("{} &&& 32w0xffffffff", kind_bit());
    let r = outcome_row;
    // A use waiting for its total, and the packet's columns.
    let waiting = |o: &str, more: &[(&'static str, &str)], action: String| {
        let mut set: Vec<(&str, &str)> = vec![
            ("op", o),
            ("seq", pred::SAME),
            ("order", pred::OTHER_OLDER),
            ("old_x", "0"),
            ("has_up", "1"),
            ("total_in", "0"),
        ];
        set.extend_from_slice(more);
        // A later column's value replaces an earlier one's.
        let set: Vec<(&str, &str)> = OUTCOME_COLUMNS
            .iter()
            .filter_map(|c| set.iter().rev().find(|(n, _)| n == c).copied())
            .collect();
        outcome_row(&set, action)
    };
    fn local<'a>(data: &'a str, more: &[(&'static str, &'a str)]) -> Vec<(&'static str, &'a str)> {
        let mut set = vec![("op", data), ("has_up", "1")];
        set.extend_from_slice(more);
        set
    }
    // The partial of a use, by the use's kind: through the second pass with payload, in one
    // without.
    let by_kind = [
        (full_payload.as_str(), full.as_str(), out::PARTIAL_HARVEST),
        (full_header.as_str(), "0", out::PARTIAL),
    ];
    let mut rows = Vec::new();
    // The last local arrival (a one-rank job's first): the partial up, by the packet's count.
    for (_, count, partial) in by_kind {
        rows.push(r(
            &local(
                &data,
                &[("seq", pred::NEW), ("workers", "1"), ("count", count)],
            ),
            o(partial, Event::DataFirst),
        ));
        rows.push(r(
            &local(
                &data,
                &[
                    ("seq", pred::SAME),
                    ("order", pred::OTHER_OLDER),
                    ("seen", "0"),
                    ("new_x", "0"),
                    ("count", count),
                ],
            ),
            o(partial, Event::DataAdded),
        ));
    }
    // Waiting for the total: rank 0's retransmission asks up, another's gets a Pending.
    rows.push(waiting(
        &data,
        &[("seen", "1"), ("rank", "0")],
        o(out::QUERY_UP, Event::SentUp),
    ));
    rows.push(waiting(
        &data,
        &[("seen", "1")],
        pending(out::PENDING, Event::PendingSent),
    ));
    // Rank 0's Query: a status Query asks up; with a nonzero byte and reports on, the partial
    // goes up again.
    rows.push(waiting(
        &query,
        &[("seen", "1"), ("rank", "0"), ("exponent", "0")],
        o(out::QUERY_UP, Event::SentUp),
    ));
    for (old_x, _, partial) in by_kind {
        rows.push(waiting(
            &query,
            &[
                ("seen", "1"),
                ("rank", "0"),
                ("reports", "1"),
                ("old_x", old_x),
            ],
            o(partial, Event::SentUp),
        ));
    }
    rows.push(waiting(
        &query,
        &[("seen", "1"), ("rank", "0")],
        o(out::QUERY_UP, Event::SentUp),
    ));
    rows.push(waiting(
        &query,
        &[("seen", "1")],
        pending(out::PENDING, Event::PendingSent),
    ));
    // The total: of another use, stale; of the waiting use with its element count, stored and
    // multicast; its header alone for a use with payload, fetched; else a copy.
    for seq in [pred::STALE, pred::NEW] {
        rows.push(r(
            &[("op", &total), ("seq", seq)],
            o(out::DROP, Event::StaleSeq),
        ));
    }
    for (old_x, count, _) in by_kind {
        rows.push(waiting(
            &total,
            &[("old_x", old_x), ("count", count)],
            m(out::MCAST_TOTAL, Event::TotalReceived),
        ));
    }
    rows.push(waiting(
        &total,
        &[("old_x", &full_payload), ("count", "0")],
        o(out::FETCH_UP, Event::UpperAnswer),
    ));
    rows.push(r(&[("op", &total)], o(out::DROP, Event::Duplicate)));
    // The upper switch's Pending: without this switch's bit the partial again, with it a
    // Pending to rank 0. Its Reject: a Pending to rank 0. Any other: nothing to do.
    for (old_x, _, partial) in by_kind {
        rows.push(waiting(
            &up_pending,
            &[("old_x", old_x), ("word_me", "0")],
            o(partial, Event::UpperAnswer),
        ));
    }
    rows.push(waiting(
        &up_pending,
        &[("word_me", "1")],
        pending(out::PENDING_RANK0, Event::UpperAnswer),
    ));
    rows.push(waiting(
        &up_reject,
        &[],
        pending(out::PENDING_RANK0, Event::UpperAnswer),
    ));
    // The upper switch's Missing of this switch's partials: to the second pass, which reads
    // its record; there, the recorded use's partial again if the use still waits (the
    // `waiting` columns compare the recorded sequence number with the set's).
    let (up_missing, up_reported) = (s(op::UP_MISSING), s(op::UP_REPORTED));
    rows.push(r(
        &[("op", &up_missing)],
        o(out::RECIRC_MISSING, Event::UpperAnswer),
    ));
    for (old_x, _, partial) in by_kind {
        rows.push(waiting(
            &up_reported,
            &[("old_x", old_x)],
            o(partial, Event::UpperAnswer),
        ));
    }
    for o_up in [&up_pending, &up_reject, &up_reported] {
        rows.push(r(&[("op", o_up)], o(out::DROP, Event::UpperAnswer)));
    }
    rows
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
            pending(out::PENDING, Event::PendingSent),
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
            pending(out::PENDING, Event::PendingSent),
        ),
    ]
}
