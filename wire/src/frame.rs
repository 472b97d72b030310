//! Ethernet II / IPv4 / UDP encapsulation of `ina` packets, for ports that see whole frames
//! (the L2 software switch's raw Ethernet ports, DPDK ports, and the P4 switches).
//!
//! Parsing goes through `etherparse`, which checks every length. The UDP checksum is sent as 0
//! (allowed for IPv4 and what a switch that rewrites payloads can afford); the IPv4 header
//! checksum is always filled in.

use crate::{Error, MacAddr, Result};
use etherparse::{
    EtherType, Ethernet2Header, IpNumber, Ipv4Header, LinkSlice, NetSlice, SlicedPacket,
    TransportSlice, UdpHeader,
};

/// Bytes of Ethernet II + IPv4 (no options) + UDP headers in front of the `ina` packet.
pub const FRAME_HEADER_LEN: usize = Ethernet2Header::LEN + Ipv4Header::MIN_LEN + UdpHeader::LEN;

/// The addresses of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameAddrs {
    pub src_mac: MacAddr,
    pub dst_mac: MacAddr,
    pub src_ip: [u8; 4],
    pub dst_ip: [u8; 4],
    pub src_port: u16,
    pub dst_port: u16,
}

impl FrameAddrs {
    /// The addresses of a reply: source and destination swapped.
    pub fn reversed(&self) -> FrameAddrs {
        FrameAddrs {
            src_mac: self.dst_mac,
            dst_mac: self.src_mac,
            src_ip: self.dst_ip,
            dst_ip: self.src_ip,
            src_port: self.dst_port,
            dst_port: self.src_port,
        }
    }
}

/// A parsed Ethernet/IPv4/UDP frame: its addresses and the UDP payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpFrame<'a> {
    pub addrs: FrameAddrs,
    pub payload: &'a [u8],
}

/// Parses an Ethernet II frame carrying unfragmented IPv4 and UDP.
///
/// The payload is cut to the UDP length, so Ethernet padding of short frames is not part of it.
pub fn parse(frame: &[u8]) -> Result<UdpFrame<'_>> {
    let sliced =
        SlicedPacket::from_ethernet(frame).map_err(|_| Error::Frame("malformed headers"))?;
    let Some(LinkSlice::Ethernet2(eth)) = &sliced.link else {
        return Err(Error::Frame("not Ethernet II"));
    };
    if !sliced.link_exts.is_empty() {
        return Err(Error::Frame("VLAN or MACsec tags are not supported"));
    }
    let Some(NetSlice::Ipv4(ip)) = &sliced.net else {
        return Err(Error::Frame("not IPv4"));
    };
    if ip.is_payload_fragmented() {
        return Err(Error::Frame("fragmented IPv4"));
    }
    let Some(TransportSlice::Udp(udp)) = &sliced.transport else {
        return Err(Error::Frame("not UDP"));
    };
    let header = ip.header();
    Ok(UdpFrame {
        addrs: FrameAddrs {
            src_mac: MacAddr(eth.source()),
            dst_mac: MacAddr(eth.destination()),
            src_ip: header.source(),
            dst_ip: header.destination(),
            src_port: udp.source_port(),
            dst_port: udp.destination_port(),
        },
        payload: udp.payload(),
    })
}

/// Writes the Ethernet/IPv4/UDP headers for a UDP payload of `payload_len` bytes into the
/// first [`FRAME_HEADER_LEN`] bytes of `buf` (which need not hold the payload: it may be
/// written, or already be, right after them). Returns the length of the whole frame.
pub fn emit_headers(buf: &mut [u8], addrs: &FrameAddrs, payload_len: usize) -> Result<usize> {
    let total = FRAME_HEADER_LEN + payload_len;
    if buf.len() < FRAME_HEADER_LEN {
        return Err(Error::BufferTooSmall {
            need: FRAME_HEADER_LEN,
            have: buf.len(),
        });
    }
    let udp = UdpHeader::without_ipv4_checksum(addrs.src_port, addrs.dst_port, payload_len)
        .map_err(|_| Error::Frame("payload too long for UDP"))?;
    let ip_payload = u16::try_from(UdpHeader::LEN + payload_len)
        .map_err(|_| Error::Frame("payload too long for IPv4"))?;
    let mut ip = Ipv4Header::new(ip_payload, 64, IpNumber::UDP, addrs.src_ip, addrs.dst_ip)
        .map_err(|_| Error::Frame("payload too long for IPv4"))?;
    ip.header_checksum = ip.calc_header_checksum();
    let eth = Ethernet2Header {
        source: addrs.src_mac.0,
        destination: addrs.dst_mac.0,
        ether_type: EtherType::IPV4,
    };
    let rest = eth
        .write_to_slice(buf)
        .map_err(|_| Error::Frame("no space for Ethernet header"))?;
    let ip_bytes = ip.to_bytes();
    let (ip_dst, rest) = rest.split_at_mut(ip_bytes.len());
    ip_dst.copy_from_slice(&ip_bytes);
    rest[..UdpHeader::LEN].copy_from_slice(&udp.to_bytes());
    Ok(total)
}

/// The headers of every frame between one pair of addresses, built once: [`write`] copies
/// them and fills in what the payload changes (the IPv4 and UDP lengths, the IPv4 checksum),
/// for ports that send many frames to few destinations.
///
/// [`write`]: FrameTemplate::write
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameTemplate {
    bytes: [u8; FRAME_HEADER_LEN],
}

/// Offsets in the frame of the fields a payload changes.
const IP_TOTAL_LEN: usize = 14 + 2;
const IP_CHECKSUM: usize = 14 + 10;
const UDP_LEN: usize = 14 + 20 + 4;

impl FrameTemplate {
    pub fn new(addrs: &FrameAddrs) -> Result<FrameTemplate> {
        let mut bytes = [0u8; FRAME_HEADER_LEN];
        emit_headers(&mut bytes, addrs, 0)?;
        Ok(FrameTemplate { bytes })
    }

    /// Writes the headers for a UDP payload of `payload_len` bytes into the first
    /// [`FRAME_HEADER_LEN`] bytes of `buf`; returns the length of the whole frame. The same
    /// bytes as [`emit_headers`] writes.
    pub fn write(&self, buf: &mut [u8], payload_len: usize) -> Result<usize> {
        let header = buf
            .get_mut(..FRAME_HEADER_LEN)
            .ok_or(Error::BufferTooSmall {
                need: FRAME_HEADER_LEN,
                have: 0,
            })?;
        let ip_len = u16::try_from(20 + 8 + payload_len)
            .map_err(|_| Error::Frame("payload too long for IPv4"))?;
        header.copy_from_slice(&self.bytes);
        header[IP_TOTAL_LEN..IP_TOTAL_LEN + 2].copy_from_slice(&ip_len.to_be_bytes());
        header[UDP_LEN..UDP_LEN + 2].copy_from_slice(&(ip_len - 20).to_be_bytes());
        header[IP_CHECKSUM..IP_CHECKSUM + 2].copy_from_slice(&[0, 0]);
        let mut sum: u32 = 0;
        for pair in header[14..34].chunks_exact(2) {
            sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        header[IP_CHECKSUM..IP_CHECKSUM + 2].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        Ok(FRAME_HEADER_LEN + payload_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    prop_compose! {
        fn addrs()(src_mac in any::<[u8; 6]>(), dst_mac in any::<[u8; 6]>(),
                   src_ip in any::<[u8; 4]>(), dst_ip in any::<[u8; 4]>(),
                   src_port in any::<u16>(), dst_port in any::<u16>()) -> FrameAddrs {
            FrameAddrs { src_mac: MacAddr(src_mac), dst_mac: MacAddr(dst_mac), src_ip, dst_ip, src_port, dst_port }
        }
    }

    proptest! {
        #[test]
        fn emit_parse_round_trip(a in addrs(), payload in proptest::collection::vec(any::<u8>(), 0..1500), pad in 0usize..20) {
            let mut buf = vec![0u8; FRAME_HEADER_LEN + payload.len() + pad];
            let len = emit_headers(&mut buf, &a, payload.len()).unwrap();
            buf[FRAME_HEADER_LEN..len].copy_from_slice(&payload);
            // Trailing bytes (Ethernet padding) are not part of the UDP payload.
            let parsed = parse(&buf).unwrap();
            prop_assert_eq!(parsed.addrs, a);
            prop_assert_eq!(parsed.payload, &payload[..]);
            prop_assert_eq!(parsed.addrs.reversed().reversed(), a);
        }

        #[test]
        fn a_template_writes_what_emit_headers_writes(a in addrs(), payload_len in 0usize..9000) {
            let mut want = vec![0u8; FRAME_HEADER_LEN];
            let mut got = vec![0u8; FRAME_HEADER_LEN];
            let n = emit_headers(&mut want, &a, payload_len).unwrap();
            let t = FrameTemplate::new(&a).unwrap();
            prop_assert_eq!(t.write(&mut got, payload_len).unwrap(), n);
            prop_assert_eq!(got, want);
            prop_assert!(t.write(&mut [0u8; FRAME_HEADER_LEN - 1], 0).is_err());
            prop_assert!(t.write(&mut [0u8; FRAME_HEADER_LEN], 70_000).is_err());
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
            let _ = parse(&bytes);
        }
    }

    #[test]
    fn rejects_non_udp_and_short_buffers() {
        let a = FrameAddrs {
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            src_ip: [198, 18, 0, 1],
            dst_ip: [198, 18, 0, 2],
            src_port: 1,
            dst_port: crate::UDP_PORT,
        };
        let mut buf = [0u8; FRAME_HEADER_LEN + 4];
        assert!(matches!(
            emit_headers(&mut buf[..40], &a, 4),
            Err(Error::BufferTooSmall { .. })
        ));
        emit_headers(&mut buf, &a, 4).unwrap();
        // Protocol byte of IPv4 set to TCP: no longer a UDP frame.
        let mut tcp = buf;
        tcp[14 + 9] = 6;
        assert!(parse(&tcp).is_err());
        // Truncated frame.
        assert!(parse(&buf[..30]).is_err());
        // EtherType ARP.
        let mut arp = buf;
        arp[12] = 0x08;
        arp[13] = 0x06;
        assert!(parse(&arp).is_err());
    }
}
