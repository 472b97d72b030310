//! Tables with const entries, and the entries of the check and sequence tables.

use super::*;

/// One const entry of a ternary table: key expressions in the table's key order.
pub(super) struct Entry {
    pub(super) keys: Vec<String>,
    pub(super) action: String,
}

/// Writes a table with const entries. `keys` are (expression, match kind).
pub(super) fn table(
    p: &mut P4,
    name: &str,
    stage: Option<usize>,
    keys: &[(&str, &str)],
    actions: &[&str],
    entries: &[Entry],
    default: &str,
) {
    // A table that writes fields no path reads before it: where no entry matches, its default
    // writes them 0 (so the fields live from this stage on, not from the parser).
    let miss = MISS_ZERO
        .iter()
        .find(|(t, _)| *t == name && default == "NoAction()")
        .map(|(_, fields)| *fields);
    let miss_action = format!("{name}_miss");
    let default = match miss {
        Some(fields) => {
            let _ = writeln!(p, "    action {miss_action}() {{");
            for f in fields {
                let _ = writeln!(p, "        md.{f} = 0;");
            }
            let _ = writeln!(p, "    }}");
            format!("{miss_action}()")
        }
        _ => default.to_string(),
    };
    let default = default.as_str();
    if let Some(s) = stage {
        let _ = writeln!(p, "    @stage({s})");
    }
    let _ = writeln!(p, "    table {name} {{");
    if !keys.is_empty() {
        let _ = writeln!(p, "        key = {{");
        for (k, kind) in keys {
            let _ = writeln!(p, "            {k} : {kind};");
        }
        let _ = writeln!(p, "        }}");
    }
    let _ = writeln!(p, "        actions = {{");
    for a in actions
        .iter()
        .filter(|a| **a != "NoAction" || miss.is_none())
    {
        let _ = writeln!(p, "            {a};");
    }
    if miss.is_some() {
        let _ = writeln!(p, "            {miss_action};");
    }
    if default == "NoAction()" && !actions.contains(&"NoAction") {
        let _ = writeln!(p, "            NoAction;");
    }
    let _ = writeln!(p, "        }}");
    if !entries.is_empty() {
        let _ = writeln!(p, "        const entries = {{");
        for e in entries {
            // An entry written without the last keys matches any value of them.
            let mut k = e.keys.clone();
            k.resize(keys.len().max(k.len()), "_".into());
            let _ = writeln!(p, "            ({}) : {};", k.join(", "), e.action);
        }
        let _ = writeln!(p, "        }}");
        let _ = writeln!(p, "        size = {};", entries.len().max(1));
    }
    let _ = writeln!(p, "        const default_action = {default};");
    let _ = writeln!(p, "    }}");
}

/// Tables whose default action zeroes the fields they write (see [`table`]).
const MISS_ZERO: [(&str, &[&str]); 10] = [
    // The use's record is read by stage 1's `requery_access` key.
    ("result_use_access", &["rec"]),
    ("seq_access", &["seq_pred"]),
    ("seq_order_access", &["order_pred"]),
    ("gap_access", &["gap_old"]),
    ("bitmap_own_0", &["bm_old"]),
    ("bitmap_own_1", &["bm_old"]),
    ("exp_access", &["exp_x"]),
    ("seen_check", &["seen"]),
    ("word_check", &["word_me"]),
    ("ina_outcome", &["outcome", "mcast_count"]),
];

/// The key of `ina_check`, `seq_access` and `seq_order_access` (stage 2).
pub(super) const CHECK_KEYS: [(&str, &str); 25] = [
    ("md.pass2", "ternary"),
    ("md.arp_req", "ternary"),
    ("hdr.arp.isValid()", "ternary"),
    ("md.arp_mine", "ternary"),
    ("hdr.ipv4.isValid()", "ternary"),
    ("md.ip_mine", "ternary"),
    ("md.ina_expected", "ternary"),
    ("ig_prsr_md.parser_err", "ternary"),
    ("hdr.ina.isValid()", "ternary"),
    ("hdr.ina.version", "ternary"),
    ("hdr.ina.msg_type", "ternary"),
    ("md.len_x", "ternary"),
    ("md.job_hit", "ternary"),
    ("md.rank_hit", "ternary"),
    ("md.src_ok", "ternary"),
    ("md.epoch_x", "ternary"),
    ("md.room[15:15]", "ternary"),
    ("md.slot_off[15:13]", "ternary"),
    ("hdr.ina.count", "ternary"),
    ("md.count_x", "ternary"),
    ("md.l2_kind", "ternary"),
    ("md.l2_port_x", "ternary"),
    ("hdr.ina.exponent", "ternary"),
    ("md.reports", "ternary"),
    ("md.from_up", "ternary"),
];

/// A key pattern of [`CHECK_KEYS`]: every position `_` but those named.
pub(super) fn check_pattern(set: &[(&str, String)]) -> Vec<String> {
    CHECK_KEYS
        .iter()
        .map(|(k, _)| {
            // A later pattern of a key refines an earlier one.
            set.iter()
                .rfind(|(name, _)| name == k)
                .map_or_else(|| "_".to_string(), |(_, v)| v.clone())
        })
        .collect()
}

pub(super) fn kv(k: &'static str, v: impl ToString) -> (&'static str, String) {
    (k, v.to_string())
}

/// Checks 1 (parse) passed on a frame to the switch's address: an `ina` packet of version 1
/// whose UDP length is its header and payload.
pub(super) fn parsed_ina() -> Vec<(&'static str, String)> {
    vec![
        kv("md.pass2", 0),
        kv("hdr.ipv4.isValid()", "true"),
        kv("md.ip_mine", 1),
        kv("md.ina_expected", 1),
        kv("ig_prsr_md.parser_err", 0),
        kv("hdr.ina.isValid()", "true"),
        kv("hdr.ina.version", PROTOCOL_VERSION),
        kv("md.len_x", 0),
        // The length compare is 16 bits wide (`cnt4 = count << 2`): exact for counts below
        // 2^13, which no frame can carry anyway (4 * 2^13 bytes).
        kv("hdr.ina.count", "0 &&& 0xe000"),
    ]
}

/// Checks 1 to 5 passed with message type `t`.
pub(super) fn authenticated(t: MessageType) -> Vec<(&'static str, String)> {
    let mut v = parsed_ina();
    v.extend([
        kv("hdr.ina.msg_type", mt(t)),
        kv("md.job_hit", 1),
        kv("md.rank_hit", 1),
        kv("md.src_ok", 1),
        kv("md.from_up", 0),
    ]);
    v
}

/// `md.from_up` of a frame in on a job's uplink port, whatever its epoch.
const FROM_UPLINK: &str = "1 &&& 1";

/// The patterns of the upper switch's packets this switch takes (PROTOCOL.md §9), in on the
/// uplink port of their job: a total (of the upper job's epoch, E or no elements), and the
/// Pending (of that epoch, one word) and Reject (any epoch) addressed to this switch's rank
/// there (`rank_source` has that rank with the upper switch's endpoint). Each with its `md.op`.
pub(super) fn from_upper() -> Vec<(u8, Vec<(&'static str, String)>)> {
    let upper = |t: MessageType| {
        let mut v = parsed_ina();
        v.extend([
            kv("hdr.ina.msg_type", mt(t)),
            kv("md.job_hit", 1),
            kv("md.from_up", FROM_UPLINK),
            kv("md.room[15:15]", 1),
            kv("md.slot_off[15:13]", 0),
        ]);
        v
    };
    let upper_epoch = kv("md.from_up", 3);
    let mut total_empty = upper(MessageType::Result);
    total_empty.extend([upper_epoch.clone(), kv("hdr.ina.count", 0)]);
    let mut total_full = upper(MessageType::Result);
    total_full.extend([
        upper_epoch.clone(),
        kv("hdr.ina.count", ELEMS),
        kv("md.count_x", 0),
    ]);
    let mut pending = upper(MessageType::Pending);
    pending.extend([kv("md.src_ok", 1), upper_epoch, kv("hdr.ina.count", 1)]);
    let mut v = vec![
        (op::TOTAL, total_empty),
        (op::TOTAL, total_full),
        (op::UP_PENDING, pending),
    ];
    // A Reject parses only with a known reason (`wire::AggRepr::parse_header`).
    for reason in [
        RejectReason::StaleEpoch,
        RejectReason::SlotOutOfRange,
        RejectReason::BadCount,
    ] {
        let mut reject = upper(MessageType::Reject);
        reject.extend([kv("md.src_ok", 1), kv("hdr.ina.exponent", reason as u8)]);
        v.push((op::UP_REJECT, reject));
    }
    v
}

/// The upper switch's Missing of this switch's partials (PROTOCOL.md §9), in on the uplink
/// port, of the upper job's epoch, to this switch's rank there, on a switch that sends
/// reports: recirculated (`op::UP_MISSING`), for the second pass to take the record of the
/// counter it names. Where the upper job's epoch is the job's own, stage 1 has already made
/// it a rank's Query (it cannot tell the upper switch's frames yet): a Query from the upper
/// switch, which sends none, is that Missing, and goes the same way.
pub(super) fn upper_missing() -> Vec<Vec<(&'static str, String)>> {
    [MessageType::Missing, MessageType::Query]
        .into_iter()
        .map(|t| {
            let mut v = parsed_ina();
            v.extend([
                kv("hdr.ina.msg_type", mt(t)),
                kv("md.job_hit", 1),
                kv("md.from_up", 3),
                kv("md.src_ok", 1),
                kv("md.room[15:15]", 1),
                kv("md.slot_off[15:13]", 0),
                kv("hdr.ina.count", 0),
                kv("md.reports", 1),
            ]);
            if t == MessageType::Query {
                v.push(kv("md.epoch_x", 0));
            }
            v
        })
        .collect()
}

/// The second pass of the upper switch's Missing whose record named a use: stage 1 made it
/// the upper switch's Pending for that use (`op::UP_REPORTED`).
pub(super) fn up_reported() -> Vec<(&'static str, String)> {
    vec![
        kv("md.pass2", 1),
        kv("hdr.ina.msg_type", mt(MessageType::Pending)),
        kv("md.job_hit", 1),
    ]
}

/// Checks 1 to 8 passed with message type `t` (epoch and slot range).
pub(super) fn in_range(t: MessageType) -> Vec<(&'static str, String)> {
    let mut v = authenticated(t);
    v.extend([
        kv("md.epoch_x", 0),
        kv("md.room[15:15]", 1),
        kv("md.slot_off[15:13]", 0),
    ]);
    v
}

/// Every check of §6 passed: the patterns of accepted Data and Query packets, with the type.
pub(super) fn accepted() -> Vec<(MessageType, Vec<(&'static str, String)>)> {
    let mut data_empty = in_range(MessageType::Data);
    data_empty.push(kv("hdr.ina.count", 0));
    let mut data_full = in_range(MessageType::Data);
    data_full.extend([kv("hdr.ina.count", ELEMS), kv("md.count_x", 0)]);
    let mut query = in_range(MessageType::Query);
    query.push(kv("hdr.ina.count", 0));
    vec![
        (MessageType::Data, data_empty),
        (MessageType::Data, data_full),
        (MessageType::Query, query),
    ]
}

pub(super) fn check_entries() -> Vec<Entry> {
    let mut e = Vec::new();
    let mut push = |set: Vec<(&'static str, String)>, action: String| {
        e.push(Entry {
            keys: check_pattern(&set),
            action,
        })
    };
    let drop = |event: Event| format!("check_drop({})", ev(event));
    let reject =
        |r: RejectReason, event: Event| format!("check_reject({}, {})", r as u8, ev(event));
    // Second passes: of the upper switch's Missing (its record found, or not), and of the
    // switch's own results and partials.
    push(up_reported(), format!("check_upper({})", op::UP_REPORTED));
    push(
        vec![
            kv("md.pass2", 1),
            kv("hdr.ina.msg_type", mt(MessageType::Missing)),
        ],
        drop(Event::UpperAnswer),
    );
    push(vec![kv("md.pass2", 1)], "check_harvest()".into());
    push(
        vec![
            kv("md.pass2", 0),
            kv("md.arp_req", 1),
            kv("hdr.arp.isValid()", "true"),
            kv("md.arp_mine", 1),
        ],
        "check_arp()".into(),
    );
    // The upper switch's packets first: a frame in on the uplink port is never a rank's.
    for (o, pattern) in from_upper() {
        push(pattern, format!("check_upper({o})"));
    }
    for pattern in upper_missing() {
        push(pattern, format!("check_upper({})", op::UP_MISSING));
    }
    // Any other packet of the protocol from the upper switch: nothing to do (a type the
    // wire does not know is malformed, below).
    for t in (1..=u8::MAX).map_while(|v| MessageType::try_from(v).ok()) {
        let reasons: &[Option<u8>] = if t == MessageType::Reject {
            &[
                Some(RejectReason::StaleEpoch as u8),
                Some(RejectReason::SlotOutOfRange as u8),
                Some(RejectReason::BadCount as u8),
            ]
        } else {
            &[None]
        };
        for reason in reasons {
            let mut upper = parsed_ina();
            upper.extend([
                kv("hdr.ina.msg_type", mt(t)),
                kv("md.job_hit", 1),
                kv("md.from_up", FROM_UPLINK),
            ]);
            if let Some(r) = reason {
                upper.push(kv("hdr.ina.exponent", r));
            }
            push(upper, drop(Event::UpperAnswer));
        }
    }
    for (t, pattern) in accepted() {
        let a = if t == MessageType::Data {
            "check_data()"
        } else {
            "check_query()"
        };
        push(pattern, a.into());
    }
    for t in [MessageType::Data, MessageType::Query] {
        push(in_range(t), reject(RejectReason::BadCount, Event::BadCount));
        let mut slot = authenticated(t);
        slot.push(kv("md.epoch_x", 0));
        push(
            slot,
            reject(RejectReason::SlotOutOfRange, Event::SlotOutOfRange),
        );
        push(
            authenticated(t),
            reject(RejectReason::StaleEpoch, Event::StaleEpoch),
        );
    }
    push(authenticated(MessageType::Probe), "check_probe()".into());
    for t in [MessageType::Data, MessageType::Query, MessageType::Probe] {
        for (pattern, event) in sender_refused(t, &[]) {
            push(pattern, drop(event));
        }
    }
    // A rank's Missing that stage 1 did not turn into its Query (PROTOCOL.md section 5, "Lost
    // results"): it names no recorded use of its job and epoch. Without reports, a type the
    // switch does not take.
    let mut missing = authenticated(MessageType::Missing);
    missing.push(kv("md.reports", 1));
    push(missing, drop(Event::MissingUnmatched));
    for (pattern, event) in sender_refused(MessageType::Missing, &[kv("md.reports", 1)]) {
        push(pattern, drop(event));
    }
    for t in [
        MessageType::Result,
        MessageType::ProbeReply,
        MessageType::Pending,
        MessageType::Missing,
    ] {
        let mut v = parsed_ina();
        v.push(kv("hdr.ina.msg_type", mt(t)));
        push(v, drop(Event::UnexpectedType));
    }
    // A Reject parses only with a known reason (`wire::AggRepr::parse_header`).
    for reason in [
        RejectReason::StaleEpoch,
        RejectReason::SlotOutOfRange,
        RejectReason::BadCount,
    ] {
        let mut v = parsed_ina();
        v.extend([
            kv("hdr.ina.msg_type", mt(MessageType::Reject)),
            kv("hdr.ina.exponent", reason as u8),
        ]);
        push(v, drop(Event::UnexpectedType));
    }
    let to_switch = |extra: (&'static str, String)| {
        vec![
            kv("md.pass2", 0),
            kv("hdr.ipv4.isValid()", "true"),
            kv("md.ip_mine", 1),
            extra,
        ]
    };
    push(to_switch(kv("md.ina_expected", 1)), drop(Event::Malformed));
    push(to_switch(kv("md.ina_expected", 0)), drop(Event::NotIna));
    push(
        vec![
            kv("md.pass2", 0),
            kv("md.l2_kind", 1),
            kv("md.l2_port_x", 0),
        ],
        drop(Event::L2Unknown),
    );
    push(
        vec![kv("md.pass2", 0), kv("md.l2_kind", 1)],
        "check_l2_port()".into(),
    );
    push(
        vec![kv("md.pass2", 0), kv("md.l2_kind", 2)],
        "check_l2_flood()".into(),
    );
    e
}

/// The patterns of a packet of type `t` (and `extra`) whose sender checks 3 to 5 refuse, in
/// order, with their events: the wrong port for its rank, a rank the job does not have, a job
/// the switch does not have.
fn sender_refused(
    t: MessageType,
    extra: &[(&'static str, String)],
) -> Vec<(Vec<(&'static str, String)>, Event)> {
    let hits: [(&[(&'static str, u8)], Event); 3] = [
        (&[("md.job_hit", 1), ("md.rank_hit", 1)], Event::WrongPort),
        (&[("md.job_hit", 1)], Event::UnknownRank),
        (&[], Event::UnknownJob),
    ];
    hits.iter()
        .map(|(hit, event)| {
            let mut v = parsed_ina();
            v.push(kv("hdr.ina.msg_type", mt(t)));
            v.extend(extra.iter().cloned());
            v.extend(hit.iter().map(|&(k, x)| kv(k, x)));
            (v, *event)
        })
        .collect()
}

/// The accepted patterns of [`CHECK_KEYS`] plus the set, with the register action per set
/// (the upper switch's packets read as a Query does).
pub(super) fn seq_entries(data_action: &str, query_action: &str) -> Vec<Entry> {
    let mut e = Vec::new();
    let upper = from_upper()
        .into_iter()
        .map(|(_, pattern)| pattern)
        .chain([up_reported()])
        .map(|pattern| (MessageType::Query, pattern));
    for (t, pattern) in accepted().into_iter().chain(upper) {
        for set in 0..2 {
            let mut keys = check_pattern(&pattern);
            keys.push(set.to_string());
            let a = if t == MessageType::Data {
                data_action
            } else {
                query_action
            };
            e.push(Entry {
                keys,
                action: format!("{a}_{set}()"),
            });
        }
    }
    e
}

pub(super) fn entry(keys: &[&str], action: impl Into<String>) -> Entry {
    Entry {
        keys: keys.iter().map(|k| k.to_string()).collect(),
        action: action.into(),
    }
}
