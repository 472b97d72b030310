//! Frames of scenarios, from their symbolic descriptions to bytes.

use crate::scenario::{Expect, FrameSpec, Send};
use ina_switch_p4::runtime::{MacAddr, P4Job, RankDesc, SwitchDesc};
use ina_wire::frame::{emit_headers, FrameAddrs, FRAME_HEADER_LEN};
use ina_wire::{AggRepr, MessageType, HEADER_LEN, UDP_PORT};
use serde::Deserialize;
use std::net::Ipv4Addr;

/// A message type, by name (`data`, `result`, `reject`, `probe`, `probe_reply`, `pending`,
/// `query`) or by code (any 4-bit value, for malformed packets).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Kind {
    Name(String),
    Code(u8),
}

impl Default for Kind {
    fn default() -> Kind {
        Kind::Name("data".into())
    }
}

impl Kind {
    fn code(&self) -> Result<u8, String> {
        Ok(match self {
            Kind::Code(c) => *c,
            Kind::Name(n) => match n.as_str() {
                "data" => MessageType::Data as u8,
                "result" => MessageType::Result as u8,
                "reject" => MessageType::Reject as u8,
                "probe" => MessageType::Probe as u8,
                "probe_reply" => MessageType::ProbeReply as u8,
                "pending" => MessageType::Pending as u8,
                "query" => MessageType::Query as u8,
                "missing" => MessageType::Missing as u8,
                other => return Err(format!("unknown message type {other:?}")),
            },
        })
    }
}

/// An `ina` datagram in a frame. Sent frames go from the endpoint of (`job`, `rank`) (or of
/// `from`) to the switch; expected frames from the switch to that endpoint. Every field of
/// the headers around it can be overridden, to make malformed frames.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InaSpec {
    pub job: u16,
    pub rank: u8,
    #[serde(rename = "type", default)]
    pub kind: Kind,
    #[serde(default)]
    pub set: u8,
    /// Default: the job's epoch.
    pub epoch: Option<u16>,
    #[serde(default)]
    pub exp: u8,
    #[serde(default)]
    pub slot: u16,
    #[serde(default)]
    pub seq: u32,
    /// The header's count. Default: the number of `values`, else 0.
    pub count: Option<u16>,
    /// Payload elements, repeated cyclically up to the element count.
    pub values: Option<Vec<i64>>,
    /// Payload `[base, step]`: element i is `base + step * i` (wrapping int32).
    pub ramp: Option<[i64; 2]>,
    /// Elements actually in the payload, when it should disagree with `count`.
    pub elements: Option<u16>,
    /// The version nibble (default 1).
    pub version: Option<u8>,
    /// The whole flags byte (default: the set, and the gap counter if `gap` is given).
    pub flags: Option<u8>,
    /// The gap counter (flag bit 1 set, the counter in bits 2-7).
    pub gap: Option<u8>,
    /// The endpoint `[job, rank]` the frame comes from (sent) or goes to (expected).
    pub from: Option<[u16; 2]>,
    /// The frame comes from (sent) or goes to (expected) the upper switch of job `upper`
    /// (PROTOCOL.md §9); its epoch defaults to the upper job's.
    pub upper: Option<u16>,
    pub src_mac: Option<MacAddr>,
    pub src_ip: Option<Ipv4Addr>,
    pub src_udp: Option<u16>,
    pub dst_mac: Option<MacAddr>,
    pub dst_ip: Option<Ipv4Addr>,
    pub dst_udp: Option<u16>,
    /// IPv4 header length (header words).
    pub ihl: Option<u8>,
    /// IPv4 flags and fragment offset (16 bits).
    pub frag: Option<u16>,
    /// IPv4 protocol.
    pub proto: Option<u8>,
    /// UDP length field.
    pub udp_len: Option<u16>,
    /// Bytes appended after the datagram.
    pub pad: Option<usize>,
    /// The frame cut to this many bytes.
    pub truncate: Option<usize>,
}

/// An ARP packet in an Ethernet frame (padded to `len`, default 60 bytes).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArpSpec {
    /// Default: broadcast for a request, else `tha`.
    pub eth_dst: Option<MacAddr>,
    /// Default: `sha`.
    pub eth_src: Option<MacAddr>,
    #[serde(default = "one")]
    pub oper: u16,
    pub sha: MacAddr,
    pub spa: Ipv4Addr,
    pub tha: Option<MacAddr>,
    pub tpa: Ipv4Addr,
    #[serde(default = "one")]
    pub htype: u16,
    #[serde(default = "ipv4_type")]
    pub ptype: u16,
    #[serde(default = "six")]
    pub hlen: u8,
    #[serde(default = "four")]
    pub plen: u8,
    pub len: Option<usize>,
}

fn one() -> u16 {
    1
}
fn ipv4_type() -> u16 {
    0x0800
}
fn six() -> u8 {
    6
}
fn four() -> u8 {
    4
}

/// An Ethernet frame with a payload in hex, padded with zeros to `len` (default 60).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EthSpec {
    pub dst: MacAddr,
    pub src: MacAddr,
    pub ethertype: u16,
    #[serde(default)]
    pub payload: String,
    pub len: Option<usize>,
}

/// Bytes from hex, whitespace ignored.
pub fn from_hex(s: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits in {s:?}"));
    }
    digits
        .chunks(2)
        .map(|c| {
            std::str::from_utf8(c)
                .ok()
                .and_then(|t| u8::from_str_radix(t, 16).ok())
                .ok_or_else(|| format!("not hex: {s:?}"))
        })
        .collect()
}

/// The IPv4 header checksum of a 20-byte header (with its checksum field as it is).
pub fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum = 0u32;
    for (i, c) in h.chunks(2).enumerate() {
        if i == 5 {
            continue;
        }
        let hi = u32::from(c.first().copied().unwrap_or(0));
        let lo = u32::from(c.get(1).copied().unwrap_or(0));
        sum += hi << 8 | lo;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// What frames are built against: the switch and the jobs.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub switch: &'a SwitchDesc,
    pub jobs: &'a [P4Job],
}

impl Context<'_> {
    /// The endpoint of a rank; for a rank no job has, an address no job uses.
    fn endpoint(&self, job: u16, rank: u16) -> RankDesc {
        self.jobs
            .iter()
            .find(|j| j.id == job)
            .and_then(|j| j.ranks.get(usize::from(rank)).copied())
            .unwrap_or(RankDesc {
                port: self.switch.ports.first().copied().unwrap_or(0),
                mac: MacAddr([2, 0, 0, 0, 0xff, 0xff]),
                ip: Ipv4Addr::new(198, 19, 255, 1),
                udp_port: 9999,
            })
    }

    /// The frame of a step and its ingress port.
    pub fn sent(&self, s: &Send) -> Result<(u16, Vec<u8>), String> {
        let (frame, port) = self.build(&s.frame, true, None)?;
        let port = s
            .port
            .or(port)
            .ok_or("a sent frame needs a port (or an ina frame)")?;
        Ok((port, frame))
    }

    /// The frames one expectation stands for, with their egress ports.
    pub fn expected(&self, x: &Expect) -> Result<Vec<(u16, Vec<u8>)>, String> {
        if let Some(job) = x.all_ranks {
            let j = self
                .jobs
                .iter()
                .find(|j| j.id == job)
                .ok_or(format!("all_ranks: no job {job}"))?;
            let mut out = Vec::new();
            for (r, ep) in j.ranks.iter().enumerate() {
                let (frame, _) = self.build(&x.frame, false, Some((job, r as u16)))?;
                out.push((ep.port, frame));
            }
            return Ok(out);
        }
        let (frame, port) = self.build(&x.frame, false, None)?;
        let port = x
            .port
            .or(port)
            .ok_or("an expected frame needs a port (or an ina frame)")?;
        Ok(vec![(port, frame)])
    }

    /// A frame and, for `ina` frames, the port of its endpoint.
    fn build(
        &self,
        f: &FrameSpec,
        inbound: bool,
        to: Option<(u16, u16)>,
    ) -> Result<(Vec<u8>, Option<u16>), String> {
        let given = [
            f.ina.is_some(),
            f.arp.is_some(),
            f.eth.is_some(),
            f.hex.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err("a frame is exactly one of ina, arp, eth, hex".into());
        }
        if let Some(i) = &f.ina {
            if let Some(job) = i.upper {
                let up = self
                    .jobs
                    .iter()
                    .find(|j| j.id == job)
                    .and_then(|j| j.uplink)
                    .ok_or(format!("upper: job {job} has no upper switch"))?;
                let ep = RankDesc {
                    port: up.port,
                    mac: up.mac,
                    ip: up.ip,
                    udp_port: up.udp_port,
                };
                let mut i = i.clone();
                i.epoch = i.epoch.or(Some(up.epoch));
                return Ok((self.ina(&i, inbound, &ep)?, Some(ep.port)));
            }
            let ep_of = to
                .or(i.from.map(|[j, r]| (j, r)))
                .unwrap_or((i.job, u16::from(i.rank)));
            let ep = self.endpoint(ep_of.0, ep_of.1);
            return Ok((self.ina(i, inbound, &ep)?, Some(ep.port)));
        }
        if let Some(a) = &f.arp {
            return Ok((arp(a), None));
        }
        if let Some(e) = &f.eth {
            let mut out = Vec::new();
            out.extend_from_slice(&e.dst.0);
            out.extend_from_slice(&e.src.0);
            out.extend_from_slice(&e.ethertype.to_be_bytes());
            out.extend(from_hex(&e.payload)?);
            let len = e.len.unwrap_or(out.len().max(60));
            out.resize(len, 0);
            return Ok((out, None));
        }
        let hex = f.hex.as_deref().unwrap_or_default();
        Ok((from_hex(hex)?, None))
    }

    fn ina(&self, i: &InaSpec, inbound: bool, ep: &RankDesc) -> Result<Vec<u8>, String> {
        let epoch = i.epoch.unwrap_or_else(|| {
            self.jobs
                .iter()
                .find(|j| j.id == i.job)
                .map_or(0, |j| j.epoch)
        });
        let count = i
            .count
            .unwrap_or_else(|| i.values.as_ref().map_or(0, |v| v.len() as u16));
        let elements = usize::from(i.elements.unwrap_or(count));
        let payload: Vec<i32> = (0..elements)
            .map(|k| match (&i.values, &i.ramp) {
                (Some(v), _) if !v.is_empty() => v[k % v.len()] as i32,
                (_, Some([base, step])) => {
                    (*base as i32).wrapping_add((*step as i32).wrapping_mul(k as i32))
                }
                _ => 0,
            })
            .collect();
        let sw = (self.switch.mac, self.switch.ip, UDP_PORT);
        let worker = (ep.mac, ep.ip, ep.udp_port);
        let (src, dst) = if inbound { (worker, sw) } else { (sw, worker) };
        let addrs = FrameAddrs {
            src_mac: i.src_mac.unwrap_or(src.0),
            dst_mac: i.dst_mac.unwrap_or(dst.0),
            src_ip: i.src_ip.unwrap_or(src.1).octets(),
            dst_ip: i.dst_ip.unwrap_or(dst.1).octets(),
            src_port: i.src_udp.unwrap_or(src.2),
            dst_port: i.dst_udp.unwrap_or(dst.2),
        };
        let ina_len = HEADER_LEN + 4 * elements;
        let mut frame = vec![0u8; FRAME_HEADER_LEN + ina_len];
        emit_headers(&mut frame, &addrs, ina_len).map_err(|e| e.to_string())?;
        let body = &mut frame[FRAME_HEADER_LEN..];
        let kind = i.kind.code()?;
        body[0] = (i.version.unwrap_or(1) << 4) | (kind & 0x0f);
        let gap = i.gap.map_or(0, |g| 0x02 | (g % 64) << 2);
        body[1] = i.flags.unwrap_or(i.set & 1 | gap);
        // The remaining header fields through the wire crate's view.
        let repr = AggRepr {
            kind: MessageType::Data,
            set: 0,
            gap: None,
            job: i.job,
            epoch,
            rank: i.rank,
            exponent: i.exp,
            slot: i.slot,
            count,
            seq: i.seq,
        };
        let mut view = ina_wire::AggPacket::new_unchecked(&mut body[..]);
        view.set_job(repr.job);
        view.set_epoch(repr.epoch);
        view.set_rank(repr.rank);
        view.set_exponent(repr.exponent);
        view.set_slot(repr.slot);
        view.set_count(repr.count);
        view.set_seq(repr.seq);
        ina_wire::payload::encode_from(&payload, &mut body[HEADER_LEN..]);
        let mut touched_ip = false;
        if let Some(ihl) = i.ihl {
            frame[14] = 0x40 | (ihl & 0x0f);
            touched_ip = true;
        }
        if let Some(fr) = i.frag {
            frame[20..22].copy_from_slice(&fr.to_be_bytes());
            touched_ip = true;
        }
        if let Some(p) = i.proto {
            frame[23] = p;
            touched_ip = true;
        }
        if touched_ip {
            let c = ipv4_checksum(&frame[14..34]);
            frame[24..26].copy_from_slice(&c.to_be_bytes());
        }
        if let Some(l) = i.udp_len {
            frame[38..40].copy_from_slice(&l.to_be_bytes());
        }
        if let Some(p) = i.pad {
            frame.resize(frame.len() + p, 0);
        }
        if let Some(t) = i.truncate {
            frame.truncate(t);
        }
        Ok(frame)
    }
}

fn arp(a: &ArpSpec) -> Vec<u8> {
    let tha = a.tha.unwrap_or(MacAddr([0; 6]));
    let eth_dst = a
        .eth_dst
        .unwrap_or(if a.oper == 1 { MacAddr::BROADCAST } else { tha });
    let mut f = Vec::new();
    f.extend_from_slice(&eth_dst.0);
    f.extend_from_slice(&a.eth_src.unwrap_or(a.sha).0);
    f.extend_from_slice(&0x0806u16.to_be_bytes());
    f.extend_from_slice(&a.htype.to_be_bytes());
    f.extend_from_slice(&a.ptype.to_be_bytes());
    f.push(a.hlen);
    f.push(a.plen);
    f.extend_from_slice(&a.oper.to_be_bytes());
    f.extend_from_slice(&a.sha.0);
    f.extend_from_slice(&a.spa.octets());
    f.extend_from_slice(&tha.0);
    f.extend_from_slice(&a.tpa.octets());
    let len = a.len.unwrap_or(60);
    f.resize(len, 0);
    f
}
