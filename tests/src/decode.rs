//! Frames decoded into readable lines, for the diffs of failed steps.

use crate::frames::ipv4_checksum;
use ina_wire::ether::{ArpPacket, EthernetFrame, Ipv4Header, UdpHeader};
use ina_wire::{AggPacket, HEADER_LEN, UDP_PORT};

fn mac(m: [u8; 6]) -> String {
    ina_wire::MacAddr(m).to_string()
}

fn ip(a: [u8; 4]) -> String {
    format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])
}

/// The payload elements, shortened: a ramp is shown as `base + step*i`, else the first
/// elements.
fn elements(payload: &[u8]) -> String {
    let v: Vec<i32> = payload
        .chunks_exact(4)
        .map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if v.len() >= 3 {
        let step = v[1].wrapping_sub(v[0]);
        if v.windows(2).all(|w| w[1].wrapping_sub(w[0]) == step) {
            return format!("{} elements: {} + {}*i", v.len(), v[0], step);
        }
    }
    let head: Vec<String> = v.iter().take(6).map(|x| x.to_string()).collect();
    let more = if v.len() > 6 { ", ..." } else { "" };
    format!("{} elements: [{}{more}]", v.len(), head.join(", "))
}

/// A frame as readable lines: Ethernet, then ARP or IPv4/UDP/ina as far as they parse.
pub fn describe(frame: &[u8]) -> Vec<String> {
    let mut out = vec![format!("{} bytes", frame.len())];
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        out.push(format!("raw {}", hex(frame)));
        return out;
    };
    out.push(format!(
        "eth {} -> {} type {:#06x}",
        mac(eth.src()),
        mac(eth.dst()),
        eth.ethertype()
    ));
    let rest = eth.payload();
    match eth.ethertype() {
        0x0806 => match ArpPacket::new_checked(rest) {
            Ok(a) => out.push(format!(
                "arp htype {} ptype {:#06x} hlen {} plen {} oper {} sender {} {} target {} {}",
                a.htype(),
                a.ptype(),
                a.hlen(),
                a.plen(),
                a.oper(),
                mac(a.sha()),
                ip(a.spa()),
                mac(a.tha()),
                ip(a.tpa())
            )),
            Err(_) => out.push(format!("arp (short) {}", hex(rest))),
        },
        0x0800 => {
            let Ok(h) = Ipv4Header::new_checked(rest) else {
                out.push(format!("ipv4 (short) {}", hex(rest)));
                return out;
            };
            let csum = u16::from_be_bytes([rest[10], rest[11]]);
            let good = ipv4_checksum(&rest[..20]) == csum;
            out.push(format!(
                "ipv4 {} -> {} ver {} ihl {} tos {:#04x} len {} id {} flags/frag {:#06x} ttl {} proto {} csum {:#06x} ({})",
                ip(h.src()),
                ip(h.dst()),
                h.version(),
                h.ihl(),
                rest[1],
                u16::from_be_bytes([rest[2], rest[3]]),
                u16::from_be_bytes([rest[4], rest[5]]),
                h.flags_fragment(),
                rest[8],
                h.protocol(),
                csum,
                if good { "ok" } else { "WRONG" }
            ));
            let Some(Ok(u)) = rest.get(20..).map(UdpHeader::new_checked) else {
                return out;
            };
            let udp = &rest[20..];
            out.push(format!(
                "udp {} -> {} len {} csum {:#06x}",
                u.src_port(),
                u.dst_port(),
                u.length(),
                u16::from_be_bytes([udp[6], udp[7]])
            ));
            let ina = &udp[8..];
            if (u.dst_port() == UDP_PORT || u.src_port() == UDP_PORT) && ina.len() >= HEADER_LEN {
                let p = AggPacket::new_unchecked(ina);
                out.push(format!(
                    "ina ver {} type {} flags {:#04x} job {} epoch {} rank {} exp {} slot {} count {} seq {}",
                    p.version(),
                    p.msg_type_raw(),
                    ina[1],
                    p.job(),
                    p.epoch(),
                    p.rank(),
                    p.exponent(),
                    p.slot(),
                    p.count(),
                    p.seq()
                ));
                out.push(format!("payload {}", elements(&ina[HEADER_LEN..])));
            } else {
                out.push(format!("udp payload {}", hex(ina)));
            }
        }
        _ => out.push(format!("payload {}", hex(rest))),
    }
    out
}

/// Hex of the first 64 bytes.
pub fn hex(b: &[u8]) -> String {
    let mut s: String = b.iter().take(64).map(|x| format!("{x:02x}")).collect();
    if b.len() > 64 {
        s.push_str("...");
    }
    s
}

/// The lines of two frames side by side, the differing ones marked.
pub fn diff(expected: &[u8], got: &[u8]) -> String {
    let (a, b) = (describe(expected), describe(got));
    let mut out = String::new();
    for k in 0..a.len().max(b.len()) {
        let x = a.get(k).map_or("", |s| s.as_str());
        let y = b.get(k).map_or("", |s| s.as_str());
        if x == y {
            out.push_str(&format!("      {x}\n"));
        } else {
            out.push_str(&format!("    - {x}\n    + {y}\n"));
        }
    }
    if a == b && expected != got {
        let at = expected
            .iter()
            .zip(got)
            .position(|(x, y)| x != y)
            .unwrap_or(expected.len().min(got.len()));
        out.push_str(&format!(
            "    bytes differ from offset {at}: expected {} got {}\n",
            hex(expected.get(at..).unwrap_or_default()),
            hex(got.get(at..).unwrap_or_default())
        ));
    }
    out
}
