//! The Wireshark dissector `tools/wireshark/ina.lua` as tshark runs it: on frames this test
//! writes to a pcap file (every message type, every reject reason, malformed packets) and on a
//! capture of a real run of `ina worker`s through the L2 software switch on a rack of network
//! namespaces. Every field the dissector defines is asserted from tshark's output.
//!
//! Needs tshark (both tests) and root (the rack); skips otherwise, fails under
//! INA_REQUIRE_PRIVILEGED=1.
#![allow(clippy::unwrap_used)]

// (Each test binary uses part of the shared harness.)
#[allow(dead_code)]
mod common;

use common::*;
use ina_io::netns::{self, Rack, SWITCH_IP, SWITCH_MAC, SWITCH_MAC_BYTES};
use ina_wire::agg::{ProbeGroup, ProbeInfo};
use ina_wire::frame::{emit_headers, FrameAddrs, FRAME_HEADER_LEN};
use ina_wire::{AggRepr, MessageType, QueryAsk, HEADER_LEN, UDP_PORT};
use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The dissector, as a user copies it.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/wireshark/ina.lua")
}

/// tshark's version line, or why it cannot run.
fn tshark_version() -> Result<String, String> {
    match Command::new("tshark").arg("--version").output() {
        Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string()),
        Ok(out) => Err(format!(
            "tshark --version failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("tshark: {e} (install the tshark package)")),
    }
}

/// A directory of this test's files, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ina-dissector-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {dir:?}: {e}"));
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding with tshark
// ---------------------------------------------------------------------------------------------

/// The fields every decode asks for, in this order.
const FIELDS: &[&str] = &[
    "frame.number",
    "ip.src",
    "ip.dst",
    "udp.srcport",
    "udp.dstport",
    "ina.version",
    "ina.type",
    "ina.flags",
    "ina.set",
    "ina.gap",
    "ina.gap_counter",
    "ina.reserved",
    "ina.missing",
    "ina.job",
    "ina.epoch",
    "ina.rank",
    "ina.exponent",
    "ina.reject_reason",
    "ina.query.wants_elements",
    "ina.query.pushes_partial",
    "ina.slot",
    "ina.count",
    "ina.seq",
    "ina.payload",
    "ina.elements",
    "ina.value",
    "ina.probe.workers",
    "ina.probe.elems",
    "ina.probe.slot_base",
    "ina.probe.slot_count",
    "ina.probe.group",
    "ina.probe.group_port",
    "ina.bitmap",
    "ina.pending.ranks",
    "ina.pending.rank",
    "_ws.expert.message",
];

/// One frame as tshark decoded it: every occurrence of every field of [`FIELDS`], and the
/// Info column.
#[derive(Debug)]
struct Decoded {
    fields: HashMap<&'static str, Vec<String>>,
    info: String,
}

impl Decoded {
    /// Every occurrence of `field`, joined with `;` (empty when absent).
    fn get(&self, field: &str) -> String {
        self.fields
            .get(field)
            .map(|v| v.join(";"))
            .unwrap_or_default()
    }

    /// The single value of `field` as a number.
    fn num(&self, field: &str) -> i64 {
        let v = self.get(field);
        v.parse()
            .unwrap_or_else(|e| panic!("{field} = `{v}` is no number ({e}): {self:?}"))
    }

    fn expect(&self, field: &str, want: impl std::fmt::Display) {
        assert_eq!(self.get(field), want.to_string(), "{field} of {self:#?}");
    }
}

fn tshark(args: &[&str]) -> String {
    let out = Command::new("tshark")
        .arg("-n")
        .arg(format!("-Xlua_script:{}", script().display()))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running tshark: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tshark {args:?} failed ({}): {stderr}",
        out.status
    );
    // A script that fails to load or a dissector that throws is reported, not fatal, to tshark.
    assert!(!stderr.contains("Lua"), "tshark {args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// Decodes every frame of `pcap` (the Info column through a one-column layout, which every
/// tshark version understands).
fn decode(pcap: &Path) -> Vec<Decoded> {
    let file = pcap.to_str().unwrap();
    let mut args = vec![
        "-r",
        file,
        "-T",
        "fields",
        "-E",
        "separator=/t",
        "-E",
        "occurrence=a",
        "-E",
        "aggregator=;",
        "-E",
        "quote=n",
    ];
    for f in FIELDS {
        args.push("-e");
        args.push(f);
    }
    let rows = tshark(&args);
    let infos = tshark(&["-r", file, "-o", "gui.column.format:\"Info\",\"%i\""]);
    let infos: Vec<&str> = infos.lines().collect();
    let rows: Vec<&str> = rows.lines().collect();
    assert_eq!(rows.len(), infos.len(), "{rows:?}\n{infos:?}");
    let verbose = tshark(&["-r", file, "-V"]);
    assert!(!verbose.contains("Lua Error"), "{verbose}");
    rows.iter()
        .zip(infos)
        .map(|(row, info)| {
            let cells: Vec<&str> = row.split('\t').collect();
            assert_eq!(cells.len(), FIELDS.len(), "{row}");
            let fields = FIELDS
                .iter()
                .zip(cells)
                .filter(|(_, c)| !c.is_empty())
                .map(|(f, c)| (*f, c.split(';').map(str::to_string).collect()))
                .collect();
            Decoded {
                fields,
                info: info.trim().to_string(),
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Frames written by hand
// ---------------------------------------------------------------------------------------------

/// A pcap file (microsecond timestamps, Ethernet link type) of `frames`, one a second.
fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend(0xa1b2_c3d4u32.to_le_bytes()); // magic
    out.extend(2u16.to_le_bytes()); // version 2.4
    out.extend(4u16.to_le_bytes());
    out.extend(0i32.to_le_bytes()); // GMT offset
    out.extend(0u32.to_le_bytes()); // timestamp accuracy
    out.extend(65_535u32.to_le_bytes()); // snapshot length
    out.extend(1u32.to_le_bytes()); // LINKTYPE_ETHERNET
    for (i, f) in frames.iter().enumerate() {
        let len = u32::try_from(f.len()).unwrap();
        out.extend(u32::try_from(i).unwrap().to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend(len.to_le_bytes()); // captured
        out.extend(len.to_le_bytes()); // on the wire
        out.extend(f);
    }
    out
}

/// The worker's UDP port in the frames written here.
const WORKER_PORT: u16 = 9000;

/// Who sends a frame.
#[derive(Clone, Copy)]
enum Sender {
    Worker,
    Switch,
}

/// An Ethernet/IPv4/UDP frame between worker 0 of the rack and the switch carrying `udp`.
fn frame(from: Sender, udp: &[u8]) -> Vec<u8> {
    let up = FrameAddrs {
        src_mac: ina_wire::MacAddr(Rack::worker_mac_bytes(0)),
        dst_mac: ina_wire::MacAddr(SWITCH_MAC_BYTES),
        src_ip: Rack::worker_ip(0).octets(),
        dst_ip: SWITCH_IP.octets(),
        src_port: WORKER_PORT,
        dst_port: UDP_PORT,
    };
    let addrs = match from {
        Sender::Worker => up,
        Sender::Switch => up.reversed(),
    };
    let mut buf = vec![0u8; FRAME_HEADER_LEN + udp.len()];
    let len = emit_headers(&mut buf, &addrs, udp.len()).unwrap();
    assert_eq!(len, buf.len());
    buf[FRAME_HEADER_LEN..].copy_from_slice(udp);
    buf
}

/// The ina packet of `repr` followed by `values` (whatever `repr.count` says: a malformed
/// packet announces another count).
fn packet(repr: &AggRepr, values: &[i32]) -> Vec<u8> {
    let len = HEADER_LEN + 4 * values.len();
    let mut buf = vec![0u8; len.max(repr.buffer_len())];
    repr.emit_into(&mut buf).unwrap();
    for (chunk, v) in buf[HEADER_LEN..].chunks_exact_mut(4).zip(values) {
        chunk.copy_from_slice(&v.to_be_bytes());
    }
    buf.truncate(len);
    buf
}

/// A header of job 258 (0x0102), epoch 48879 (0xbeef) and the given type, set, rank,
/// exponent, slot, count and seq.
#[allow(clippy::too_many_arguments)]
fn repr(
    kind: MessageType,
    set: u8,
    rank: u8,
    exponent: u8,
    slot: u16,
    count: u16,
    seq: u32,
) -> AggRepr {
    AggRepr {
        kind,
        set,
        gap: None,
        job: 258,
        epoch: 48_879,
        rank,
        exponent,
        slot,
        count,
        seq,
    }
}

/// Asserts every header field of `d` against `r` (version 1, no reserved bit).
fn assert_header(d: &Decoded, r: &AggRepr) {
    d.expect("ina.version", 1);
    d.expect("ina.type", r.kind as u8);
    d.expect("ina.flags", format!("0x{:02x}", r.set));
    d.expect("ina.set", r.set);
    d.expect("ina.reserved", "0x00");
    d.expect("ina.job", r.job);
    d.expect("ina.epoch", r.epoch);
    d.expect("ina.rank", r.rank);
    d.expect("ina.exponent", r.exponent);
    d.expect("ina.slot", r.slot);
    d.expect("ina.count", r.count);
    d.expect("ina.seq", r.seq);
    let name = format!("{:?} ", r.kind);
    assert!(d.info.starts_with(&name), "{name}: {d:#?}");
    assert!(
        d.info.contains(&format!(
            "job={} epoch={} rank={} slot={} set={} seq={} count={}",
            r.job, r.epoch, r.rank, r.slot, r.set, r.seq, r.count
        )),
        "{d:#?}"
    );
}

/// The payload of a ProbeReply as the switch writes it (`wire::agg`), as elements: the job's
/// configuration, and the multicast group when there is one (6 elements instead of 4).
fn probe_payload(info: &ProbeInfo, group: Option<ProbeGroup>) -> Vec<i32> {
    let mut bytes = vec![0u8; 24];
    info.emit(&mut bytes[..16]).unwrap();
    match group {
        Some(g) => g.emit(&mut bytes[16..]).unwrap(),
        None => bytes.truncate(16),
    }
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn hex(values: &[i32]) -> String {
    values
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn joined<T: ToString>(values: &[T]) -> String {
    values
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(";")
}

fn every_message_type_and_malformed_packet_decodes_field_by_field() {
    let version = match tshark_version() {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    };
    let started = Instant::now();
    let scratch = Scratch::new("crafted");

    use MessageType::*;
    let data_values = [-5, 7, i32::MIN, i32::MAX, 0, 1, -1, 123_456, 42, -42];
    let data = repr(Data, 1, 3, 130, 17, 10, 0x0102_0304);
    let result = repr(Result, 0, 1, 127, 16, 2, 4_000_000_000);
    let rejects = [1u8, 2, 3].map(|reason| repr(Reject, 1, 4, reason, 40, 0, 77));
    let probe = repr(Probe, 0, 2, 0, 0, 0, 0);
    let probe_reply = repr(ProbeReply, 0, 2, 0, 0, 4, 0);
    let pending = repr(Pending, 1, 0, 0, 19, 1, 99);
    let pending_none = repr(Pending, 0, 5, 0, 20, 1, 100);
    let query_header = repr(Query, 0, 6, 2, 21, 0, 101);
    let query_full = repr(Query, 1, 7, 1, 22, 0, 102);
    // Announces 4 elements, carries 3.
    let short = repr(Data, 0, 1, 126, 23, 4, 103);
    let mut bad_bits = packet(&repr(Data, 1, 0, 0, 24, 0, 104), &[]);
    bad_bits[0] = 0x29; // version 2, type 9
    bad_bits[1] = 0x81; // set 1, and bit 7 without the gap flag
    let unknown_reason = repr(Reject, 0, 0, 9, 25, 0, 105);
    // A well-formed length, but three elements where a ProbeReply has four (or six).
    let short_reply = repr(ProbeReply, 0, 0, 0, 0, 3, 0);
    // A ProbeReply that names the job's multicast group (PROTOCOL.md §3): six elements.
    let group_reply = repr(ProbeReply, 0, 3, 0, 0, 6, 0);
    let group_info = ProbeInfo {
        workers: 4,
        elems_per_packet: 64,
        slot_base: 128,
        slot_count: 64,
    };
    let group = ProbeGroup {
        group: "239.1.0.1:18800".parse().unwrap(),
    };
    // Six elements whose group is no multicast address and whose port is out of range.
    let bad_group_reply = repr(ProbeReply, 0, 3, 0, 0, 6, 0);
    let mut bad_group = probe_payload(&group_info, Some(group));
    bad_group[4] = i32::from_be_bytes([10, 1, 2, 3]);
    bad_group[5] = 70_000;
    // Queries by rank 0, whose nonzero byte asks a rack switch for the partial (PROTOCOL.md
    // §2 and §9): a fetch (1), a status and partial (2), and a plain status (0).
    let query_fetch_0 = repr(Query, 1, 0, QueryAsk::Fetch.byte(), 26, 0, 106);
    let query_partial_0 = repr(
        Query,
        0,
        0,
        QueryAsk::StatusPushingPartial.byte(),
        27,
        0,
        107,
    );
    let query_status_0 = repr(Query, 1, 0, QueryAsk::Status.byte(), 28, 0, 108);
    // Missing reports, each way: the gap counter names the first skipped transmission and the
    // exponent byte how many.
    let missing = AggRepr {
        gap: Some(5),
        ..repr(Missing, 1, 2, 3, 64, 0, 200)
    };

    let frames = vec![
        frame(Sender::Worker, &packet(&data, &data_values)),
        frame(Sender::Switch, &packet(&result, &[10, -20])),
        frame(Sender::Switch, &packet(&rejects[0], &[])),
        frame(Sender::Switch, &packet(&rejects[1], &[])),
        frame(Sender::Switch, &packet(&rejects[2], &[])),
        frame(Sender::Worker, &packet(&probe, &[])),
        frame(Sender::Switch, &packet(&probe_reply, &[5, 256, 16, 48])),
        frame(Sender::Switch, &packet(&pending, &[0x8000_0005_u32 as i32])),
        frame(Sender::Switch, &packet(&pending_none, &[0])),
        frame(Sender::Worker, &packet(&query_header, &[])),
        frame(Sender::Worker, &packet(&query_full, &[])),
        frame(Sender::Worker, &packet(&short, &[1, 2, 3])),
        frame(Sender::Worker, &bad_bits),
        frame(Sender::Switch, &packet(&unknown_reason, &[])),
        frame(
            Sender::Worker,
            &[0x11, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00],
        ),
        frame(Sender::Switch, &packet(&short_reply, &[5, 256, 16])),
        // Not ina: UDP between two other ports.
        {
            let mut f = frame(Sender::Worker, &packet(&probe, &[]));
            f[FRAME_HEADER_LEN - 6..FRAME_HEADER_LEN - 4].copy_from_slice(&9001u16.to_be_bytes());
            f
        },
        frame(
            Sender::Switch,
            &packet(&group_reply, &probe_payload(&group_info, Some(group))),
        ),
        frame(Sender::Switch, &packet(&bad_group_reply, &bad_group)),
        frame(Sender::Worker, &packet(&query_fetch_0, &[])),
        frame(Sender::Worker, &packet(&query_partial_0, &[])),
        frame(Sender::Worker, &packet(&query_status_0, &[])),
        frame(Sender::Switch, &packet(&missing, &[])),
    ];
    let file = scratch.path("crafted.pcap");
    std::fs::write(&file, pcap(&frames)).unwrap();
    let d = decode(&file);
    assert_eq!(d.len(), frames.len());

    // Data from the worker: every header field, the payload, its first eight values.
    assert_header(&d[0], &data);
    d[0].expect("udp.dstport", UDP_PORT);
    d[0].expect("ina.payload", hex(&data_values));
    d[0].expect("ina.elements", 10);
    d[0].expect("ina.value", joined(&data_values[..8]));
    d[0].expect("_ws.expert.message", "");
    d[0].expect("ina.reject_reason", "");

    // A Result from the switch's port to the worker's.
    assert_header(&d[1], &result);
    d[1].expect("udp.srcport", UDP_PORT);
    d[1].expect("udp.dstport", WORKER_PORT);
    d[1].expect("ina.value", "10;-20");
    d[1].expect("ina.elements", 2);

    // Rejects: the exponent byte as the reason, by number and by name.
    for (i, (r, name)) in rejects
        .iter()
        .zip(["StaleEpoch", "SlotOutOfRange", "BadCount"])
        .enumerate()
    {
        let dr = &d[2 + i];
        assert_header(dr, r);
        dr.expect("ina.reject_reason", i + 1);
        assert!(dr.info.ends_with(&format!("reason={name}")), "{dr:#?}");
        dr.expect("ina.payload", "");
        dr.expect("_ws.expert.message", "");
    }

    assert_header(&d[5], &probe);
    d[5].expect("ina.payload", "");

    // ProbeReply: the job's configuration, field by field.
    assert_header(&d[6], &probe_reply);
    d[6].expect("ina.probe.workers", 5);
    d[6].expect("ina.probe.elems", 256);
    d[6].expect("ina.probe.slot_base", 16);
    d[6].expect("ina.probe.slot_count", 48);
    d[6].expect("ina.elements", 4);
    d[6].expect("ina.value", "");
    assert!(
        d[6].info.ends_with("workers=5 elems=256 slots=16..64"),
        "{:#?}",
        d[6]
    );

    // Pending: the bitmap and the ranks it names.
    assert_header(&d[7], &pending);
    d[7].expect("ina.bitmap", "0x80000005");
    d[7].expect("ina.pending.ranks", "0,2,31");
    d[7].expect("ina.pending.rank", "0;2;31");
    assert!(d[7].info.ends_with("ranks=[0,2,31]"), "{:#?}", d[7]);
    assert_header(&d[8], &pending_none);
    d[8].expect("ina.bitmap", "0x00000000");
    d[8].expect("ina.pending.rank", "");
    assert!(d[8].info.ends_with("ranks=[]"), "{:#?}", d[8]);

    // Query: bit 0 of the exponent byte says whether the Result wanted has E elements or
    // none; a nonzero byte asks a rack switch for the partial only in rank 0's Query
    // (QueryAsk): another rank's byte 2 or 1 asks for nothing more.
    assert_header(&d[9], &query_header);
    d[9].expect("ina.query.wants_elements", 0);
    d[9].expect("ina.query.pushes_partial", 0);
    assert!(d[9].info.ends_with("wants=0"), "{:#?}", d[9]);
    assert_header(&d[10], &query_full);
    d[10].expect("ina.query.wants_elements", 1);
    d[10].expect("ina.query.pushes_partial", 0);
    assert!(d[10].info.ends_with("wants=E"), "{:#?}", d[10]);
    d[0].expect("ina.query.wants_elements", "");
    d[0].expect("ina.query.pushes_partial", "");
    // Rank 0: a fetch (byte 1) and a status Query with byte 2 both ask for the partial; byte
    // 0 does not.
    assert_header(&d[19], &query_fetch_0);
    d[19].expect("ina.query.wants_elements", 1);
    d[19].expect("ina.query.pushes_partial", 1);
    assert!(d[19].info.ends_with("wants=E +partial"), "{:#?}", d[19]);
    assert_header(&d[20], &query_partial_0);
    d[20].expect("ina.query.wants_elements", 0);
    d[20].expect("ina.query.pushes_partial", 1);
    assert!(d[20].info.ends_with("wants=0 +partial"), "{:#?}", d[20]);
    assert_header(&d[21], &query_status_0);
    d[21].expect("ina.query.wants_elements", 0);
    d[21].expect("ina.query.pushes_partial", 0);
    assert!(d[21].info.ends_with("wants=0"), "{:#?}", d[21]);
    for q in &d[19..22] {
        q.expect("_ws.expert.message", "");
    }

    // Malformed: a length that disagrees with the count; unknown version, type and reserved
    // bits; an unknown reject reason; less than a header.
    assert_header(&d[11], &short);
    d[11].expect("_ws.expert.message", "Length 28 is not 16 + 4 * count = 32");
    d[11].expect("ina.elements", 3);
    d[11].expect("ina.value", "1;2;3");
    d[12].expect("ina.version", 2);
    d[12].expect("ina.type", 9);
    d[12].expect("ina.flags", "0x81");
    d[12].expect("ina.set", 1);
    d[12].expect("ina.reserved", "0x80");
    d[12].expect(
        "_ws.expert.message",
        "Unknown protocol version 2 (1 expected);Unknown message type 9;\
         Reserved flag bits set: 0x80 (sent as 0)",
    );
    assert!(d[12].info.starts_with("Unknown type 9 "), "{:#?}", d[12]);
    assert_eq!(d[13].num("ina.reject_reason"), 9);
    d[13].expect("_ws.expert.message", "Unknown reject reason 9");
    d[14].expect("ina.type", "");
    d[14].expect(
        "_ws.expert.message",
        "Shorter than the 16-byte header: 9 bytes",
    );
    assert_header(&d[15], &short_reply);
    d[15].expect(
        "_ws.expert.message",
        "ProbeReply carries 3 elements, 4 or 6 expected",
    );
    d[15].expect("ina.probe.workers", "");
    d[15].expect("ina.value", "5;256;16");
    d[16].expect("ina.type", "");
    d[16].expect("_ws.expert.message", "");
    assert!(!d[16].info.contains("job="), "{:#?}", d[16]);

    // A ProbeReply of six elements: the configuration and the job's multicast group, not
    // malformed.
    assert_header(&d[17], &group_reply);
    d[17].expect("ina.elements", 6);
    d[17].expect("ina.probe.workers", 4);
    d[17].expect("ina.probe.elems", 64);
    d[17].expect("ina.probe.slot_base", 128);
    d[17].expect("ina.probe.slot_count", 64);
    d[17].expect("ina.probe.group", "239.1.0.1");
    d[17].expect("ina.probe.group_port", 18800);
    d[17].expect("ina.value", "");
    d[17].expect("_ws.expert.message", "");
    assert!(
        d[17]
            .info
            .ends_with("workers=4 elems=64 slots=128..192 group=239.1.0.1:18800"),
        "{:#?}",
        d[17]
    );
    // The four-element form names no group.
    d[6].expect("ina.probe.group", "");
    d[6].expect("ina.probe.group_port", "");
    // A group that is no multicast address, on a port beyond 65535: decoded, and flagged as
    // wire::agg::ProbeGroup refuses it.
    assert_header(&d[18], &bad_group_reply);
    d[18].expect("ina.probe.group", "10.1.2.3");
    d[18].expect("ina.probe.group_port", 70_000);
    d[18].expect(
        "_ws.expert.message",
        "Group 10.1.2.3 is not an IPv4 multicast address;Group port 70000 is not 1..65535",
    );

    // Missing (switch to worker here): the gap counter is the first skipped transmission,
    // the exponent byte how many.
    d[22].expect("ina.type", 8);
    d[22].expect("ina.flags", format!("0x{:02x}", 1 | 2 | (5 << 2)));
    d[22].expect("ina.set", 1);
    d[22].expect("ina.gap", 1);
    d[22].expect("ina.gap_counter", 5);
    d[22].expect("ina.reserved", "0x00");
    d[22].expect("ina.missing", 3);
    d[22].expect("ina.rank", 2);
    d[22].expect("ina.slot", 64);
    d[22].expect("ina.seq", 200);
    d[22].expect("_ws.expert.message", "");
    assert!(
        d[22]
            .info
            .starts_with("Missing job=258 epoch=48879 rank=2 slot=64 set=1 seq=200 count=0"),
        "{:#?}",
        d[22]
    );
    assert!(d[22].info.ends_with("missing=3 gap=5"), "{:#?}", d[22]);
    d[0].expect("ina.gap", 0);
    d[0].expect("ina.gap_counter", "");

    // Installed by copying the one file into the personal plugins folder, no option needed.
    let home = scratch.path("home");
    let plugins = home.join(".local/lib/wireshark/plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(script(), plugins.join("ina.lua")).unwrap();
    let out = Command::new("tshark")
        .env("HOME", &home)
        .env_remove("XDG_CONFIG_HOME")
        .args(["-n", "-r", file.to_str().unwrap(), "-Y", "ina.bitmap"])
        .args(["-T", "fields", "-e", "ina.pending.ranks"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "0,2,31\n\n",
        "{out:?}"
    );

    // The expert summary counts the warnings.
    let experts = tshark(&["-r", file.to_str().unwrap(), "-q", "-z", "expert,warn"]);
    for m in [
        "Length 28 is not 16 + 4 * count = 32",
        "Unknown message type 9",
    ] {
        assert!(experts.contains(m), "{m}: {experts}");
    }
    eprintln!(
        "{version}: {} frames decoded in {:.2?}",
        frames.len(),
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// A captured run
// ---------------------------------------------------------------------------------------------

/// tshark capturing on hub ports into a file; stopped (SIGINT, then SIGKILL) on drop.
struct Capture {
    child: Child,
    stderr: mpsc::Receiver<String>,
    log: Vec<String>,
}

impl Capture {
    fn start(netns: &str, ports: &[String], file: &Path) -> Capture {
        let mut cmd = netns::command_in(Some(netns), "tshark");
        cmd.arg("-n").arg("-q");
        for p in ports {
            cmd.args(["-i", p]);
        }
        let mut child = cmd
            .arg("-w")
            .arg(file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting tshark in {netns}: {e}"));
        let err = child.stderr.take().unwrap();
        let (tx, stderr) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut capture = Capture {
            child,
            stderr,
            log: Vec::new(),
        };
        // tshark says "Capturing on" before its capture process has opened the ports; the
        // file's name arrives once it has (tshark 4.0 says "Capture started" then). Versions
        // that keep quiet about it get a few seconds instead.
        let mut deadline = after(START);
        let mut capturing = false;
        loop {
            match capture
                .stderr
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    let started = line.contains("Capture started") || line.contains("File:");
                    if line.contains("Capturing on") {
                        capturing = true;
                        deadline = after(Duration::from_secs(3));
                    }
                    capture.log.push(line);
                    if started {
                        return capture;
                    }
                }
                Err(_) if capturing => return capture,
                Err(e) => panic!("tshark did not start capturing ({e}): {:?}", capture.log),
            }
        }
    }

    /// Stops the capture and returns tshark's messages.
    fn stop(&mut self) -> Vec<String> {
        // The capture reads the kernel's ring in blocks that are handed over when full or
        // after a timeout; a capture stopped right away loses the last, partly filled one.
        std::thread::sleep(Duration::from_secs(2));
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on our own child, not reaped yet; no memory is involved.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::kill(pid, libc::SIGINT) };
        assert_eq!(rc, 0, "SIGINT to tshark");
        let deadline = after(Duration::from_secs(20));
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "tshark did not stop");
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader thread ends with the pipe; what it had read is in the channel.
        std::thread::sleep(Duration::from_millis(100));
        self.log.extend(self.stderr.try_iter());
        assert!(
            status.success(),
            "tshark exited with {status}: {:?}",
            self.log
        );
        self.log.clone()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        // SIGTERM first: tshark then stops its capture process too.
        let deadline = after(Duration::from_secs(5));
        let mut termed = false;
        while let Ok(None) = self.child.try_wait() {
            if !termed {
                if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
                    // SAFETY: kill(2) on our own child, not reaped yet; no memory is involved.
                    #[allow(unsafe_code)]
                    unsafe {
                        libc::kill(pid, libc::SIGTERM);
                    }
                }
                termed = true;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The identity of one use of a slot as a Data packet and its Result both carry.
type Use = (i64, i64, i64, i64); // slot, set, seq, count

fn use_of(d: &Decoded) -> Use {
    (
        d.num("ina.slot"),
        d.num("ina.set"),
        d.num("ina.seq"),
        d.num("ina.count"),
    )
}

fn a_run_through_the_l2_switch_captured_on_the_hub_decodes() {
    let _guard = serial();
    let version = match tshark_version() {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    };
    let rack = match Rack::new("wsd", 2) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    let started = Instant::now();
    let scratch = Scratch::new("run");
    let file = scratch.path("run.pcapng");
    let ports: Vec<String> = (0..2).map(Rack::port).collect();
    let mut capture = Capture::start(&rack.hub(), &ports, &file);

    const JOB: u16 = 300;
    const EPOCH: u16 = 4660;
    const ELEMS: i64 = 64;
    let workers: Vec<String> = (0..2)
        .map(|r| {
            format!(
                "{}/{}/{}:{WORKER_PORT}",
                Rack::port(r),
                Rack::worker_mac(r),
                Rack::worker_ip(r)
            )
        })
        .collect();
    let mut sw = Proc::spawn_in(
        Some(&rack.hub()),
        "l2 switch",
        &[
            "switch".to_string(),
            format!("--ports={}", rack.ports()),
            format!("--mac={SWITCH_MAC}"),
            format!("--ip={SWITCH_IP}"),
            format!(
                "--job=id={JOB};epoch={EPOCH};slots=16..48;elems={ELEMS};workers={}",
                workers.join(",")
            ),
        ],
    );
    sw.expect("ready", after(START));
    let mut run = Run::new(2, 1000, 1);
    run.job = JOB;
    let mut procs: Vec<Proc> = (0..2)
        .map(|r| {
            let mut args = run.common(r);
            args.push("--algorithm=ina".into());
            args.push(format!("--switch={SWITCH_IP}:{UDP_PORT}"));
            args.push(format!("--bind={}:{WORKER_PORT}", Rack::worker_ip(r)));
            Proc::spawn_in(Some(&rack.worker_ns(r)), &format!("worker {r}"), &args)
        })
        .collect();
    let joined: Vec<Line> = procs
        .iter_mut()
        .map(|p| p.expect("joined", after(START)))
        .collect();
    let outcomes: Vec<Outcome> = procs
        .iter_mut()
        .map(|p| Outcome::collect(p, after(Duration::from_secs(60))))
        .collect();
    sw.signal(libc::SIGINT);
    let stopped = sw.expect("stopped", after(Duration::from_secs(10)));
    assert_all_exact(&outcomes, run.total(), &stopped.value);
    let log = capture.stop();
    let window = joined[0].value["window"].as_i64().unwrap();
    for j in &joined {
        assert_eq!(j.value["epoch"], EPOCH, "{}", j.value);
        assert_eq!(j.value["window"], window, "{}", j.value);
    }

    let decoded = decode(&file);
    let ina: Vec<&Decoded> = decoded
        .iter()
        .filter(|d| d.fields.contains_key("ina.type"))
        .collect();
    let of = |t: MessageType| -> Vec<&Decoded> {
        ina.iter()
            .copied()
            .filter(|d| d.num("ina.type") == t as i64)
            .collect()
    };
    let worker_ips: Vec<String> = (0..2).map(|r| Rack::worker_ip(r).to_string()).collect();

    // Nothing malformed, nothing of another job, every header of version 1 without reserved
    // bits.
    for d in &ina {
        d.expect("_ws.expert.message", "");
        d.expect("ina.version", 1);
        d.expect("ina.reserved", "0x00");
        d.expect("ina.job", JOB);
        // The flags: the set, and on first transmissions of Data (and on ProbeReply, which
        // offers the Missing reports) the gap flag and counter.
        let gap = d.get("ina.gap_counter");
        let flags = match gap.as_str() {
            "" => d.num("ina.set"),
            _ => d.num("ina.set") | 2 | d.num("ina.gap_counter") << 2,
        };
        assert_eq!(d.get("ina.flags"), format!("0x{flags:02x}"), "{d:#?}");
        let name = match d.num("ina.type") {
            1 => "Data ",
            2 => "Result ",
            4 => "Probe ",
            5 => "ProbeReply ",
            6 => "Pending ",
            7 => "Query ",
            other => panic!("type {other} in a lossless run: {d:#?}"),
        };
        assert!(d.info.starts_with(name), "{d:#?}");
        let to_switch = matches!(name, "Data " | "Probe " | "Query ");
        let (from, to) = if to_switch {
            (WORKER_PORT, UDP_PORT)
        } else {
            (UDP_PORT, WORKER_PORT)
        };
        d.expect("udp.srcport", from);
        d.expect("udp.dstport", to);
    }

    // Each worker probed and was told the job's configuration.
    let probes = of(MessageType::Probe);
    let ranks: BTreeSet<i64> = probes.iter().map(|d| d.num("ina.rank")).collect();
    assert_eq!(ranks, BTreeSet::from([0, 1]), "{probes:#?}");
    for d in &probes {
        d.expect("ina.count", 0);
        assert!(worker_ips.contains(&d.get("ip.src")), "{d:#?}");
    }
    let replies = of(MessageType::ProbeReply);
    assert!(replies.len() >= 2, "{replies:#?}");
    for d in &replies {
        d.expect("ina.epoch", EPOCH);
        d.expect("ina.count", 4);
        d.expect("ina.elements", 4);
        d.expect("ina.probe.workers", 2);
        d.expect("ina.probe.elems", ELEMS);
        d.expect("ina.probe.slot_base", 16);
        d.expect("ina.probe.slot_count", 32);
        d.expect("ip.src", SWITCH_IP);
    }

    // Data of both ranks, the same uses from each, with 0 or E elements and the first eight
    // values of a full packet listed.
    let data = of(MessageType::Data);
    let mut uses: [BTreeSet<Use>; 2] = [BTreeSet::new(), BTreeSet::new()];
    for d in &data {
        d.expect("ina.epoch", EPOCH);
        let rank = d.num("ina.rank");
        assert!((0..2).contains(&rank), "{d:#?}");
        d.expect("ip.src", &worker_ips[rank as usize]);
        let count = d.num("ina.count");
        assert!(count == 0 || count == ELEMS, "{d:#?}");
        d.expect("ina.elements", if count == 0 { "" } else { "64" });
        let values = d.fields.get("ina.value").map_or(0, Vec::len);
        assert_eq!(values, if count == 0 { 0 } else { 8 }, "{d:#?}");
        assert_eq!(
            d.get("ina.payload").len() as i64,
            8 * count,
            "hex digits of the payload: {d:#?}"
        );
        uses[rank as usize].insert(use_of(d));
    }
    // Per worker: B blocks plus the lookahead's min(W, B) headers per iteration (and the
    // int32 blocks of the run's own check of the results).
    let blocks = (1000 + ELEMS - 1) / ELEMS;
    let per_worker = run.total() as i64 * (blocks + blocks.min(window));
    assert!(uses[0].len() as i64 >= per_worker, "{:?}", uses[0]);
    assert_eq!(uses[0], uses[1]);
    assert!(uses[0].iter().any(|u| u.3 == 0) && uses[0].iter().any(|u| u.3 == ELEMS));

    // Positions: slot = lane base + seq mod W and set = (seq / W) mod 2, for one lane base
    // inside the job's slots.
    let bases: BTreeSet<i64> = uses[0]
        .iter()
        .map(|&(slot, set, seq, _)| {
            assert_eq!(set, (seq / window) % 2, "set of seq {seq}");
            slot - seq % window
        })
        .collect();
    assert_eq!(bases.len(), 1, "{bases:?}");
    let base = *bases.first().unwrap();
    assert!(base >= 16 && base + window <= 48, "lane {base}+{window}");

    // Every use has its Result, on each worker's port, with the count of its Data; no Result
    // of a use that was not sent.
    let results = of(MessageType::Result);
    let mut result_uses: [BTreeSet<Use>; 2] = [BTreeSet::new(), BTreeSet::new()];
    for d in &results {
        d.expect("ina.epoch", EPOCH);
        let rank = worker_ips
            .iter()
            .position(|ip| *ip == d.get("ip.dst"))
            .unwrap_or_else(|| panic!("a Result to no worker: {d:#?}"));
        let values = d.fields.get("ina.value").map_or(0, Vec::len);
        let count = d.num("ina.count");
        assert_eq!(values as i64, count.min(8), "{d:#?}");
        let u = use_of(d);
        assert!(uses[0].contains(&u), "a Result of no use: {d:#?}");
        result_uses[rank].insert(u);
    }
    assert_eq!(result_uses[0], uses[0]);
    assert_eq!(result_uses[1], uses[0]);
    assert!(results.len() >= 2 * uses[0].len(), "{}", results.len());

    eprintln!(
        "{version}: {} frames captured, {} ina ({} Data, {} Result), in {:.2?}; tshark: {log:?}",
        decoded.len(),
        ina.len(),
        data.len(),
        results.len(),
        started.elapsed()
    );
}

fn main() -> std::process::ExitCode {
    ina_testkit::Suite::new()
        .test(
            "every_message_type_and_malformed_packet_decodes_field_by_field",
            &[ina_testkit::TSHARK],
            every_message_type_and_malformed_packet_decodes_field_by_field,
        )
        .test(
            "a_run_through_the_l2_switch_captured_on_the_hub_decodes",
            &[
                ina_testkit::Need::Root,
                ina_testkit::Need::NetNamespaces,
                ina_testkit::IP,
                ina_testkit::TC,
                ina_testkit::TSHARK,
            ],
            a_run_through_the_l2_switch_captured_on_the_hub_decodes,
        )
        .run()
}
