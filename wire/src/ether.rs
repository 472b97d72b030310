//! Checked views of the Ethernet II, ARP, IPv4 and UDP headers of a frame, read field by field
//! at fixed offsets, for switches that classify whole frames (PROTOCOL.md §7).
//!
//! Unlike [`crate::frame::parse`], these views do not judge a frame as a whole: each one only
//! proves that its header's bytes are there, and the caller decides what a frame is from the
//! fields. Every view is made by `new_checked`, after which no accessor panics.

use crate::{Error, Result};

/// Bytes of an Ethernet II header.
pub const ETHERNET_LEN: usize = 14;
/// Bytes of an IPv4 header without options.
pub const IPV4_LEN: usize = 20;
/// Bytes of a UDP header.
pub const UDP_LEN: usize = 8;
/// Bytes of an ARP packet for IPv4 over Ethernet.
pub const ARP_LEN: usize = 28;

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// IPv4 protocol number of UDP.
pub const IP_PROTO_UDP: u8 = 17;
/// ARP operation: request.
pub const ARP_REQUEST: u16 = 1;
/// ARP operation: reply.
pub const ARP_REPLY: u16 = 2;
/// The Ethernet broadcast address.
pub const BROADCAST: [u8; 6] = [0xff; 6];

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn array_at<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}

fn check(b: &[u8], need: usize) -> Result<()> {
    if b.len() < need {
        return Err(Error::BufferTooSmall {
            need,
            have: b.len(),
        });
    }
    Ok(())
}

/// An Ethernet II header and what follows it.
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<'a>(&'a [u8]);

impl<'a> EthernetFrame<'a> {
    /// A view of `frame`, which must hold at least the 14 header bytes.
    pub fn new_checked(frame: &'a [u8]) -> Result<Self> {
        check(frame, ETHERNET_LEN)?;
        Ok(EthernetFrame(frame))
    }
    /// Destination MAC address.
    pub fn dst(&self) -> [u8; 6] {
        array_at(self.0, 0)
    }
    /// Source MAC address.
    pub fn src(&self) -> [u8; 6] {
        array_at(self.0, 6)
    }
    /// The EtherType.
    pub fn ethertype(&self) -> u16 {
        u16_at(self.0, 12)
    }
    /// The bytes after the header.
    pub fn payload(&self) -> &'a [u8] {
        &self.0[ETHERNET_LEN..]
    }
}

/// An ARP packet (the fixed 28 bytes of IPv4 over Ethernet; the hardware and protocol types
/// and lengths are fields to check, not assumed).
#[derive(Debug, Clone, Copy)]
pub struct ArpPacket<'a>(&'a [u8]);

impl<'a> ArpPacket<'a> {
    /// A view of `bytes`, which must hold at least 28 bytes.
    pub fn new_checked(bytes: &'a [u8]) -> Result<Self> {
        check(bytes, ARP_LEN)?;
        Ok(ArpPacket(bytes))
    }
    /// Hardware type (1: Ethernet).
    pub fn htype(&self) -> u16 {
        u16_at(self.0, 0)
    }
    /// Protocol type (0x0800: IPv4).
    pub fn ptype(&self) -> u16 {
        u16_at(self.0, 2)
    }
    /// Hardware address length.
    pub fn hlen(&self) -> u8 {
        self.0[4]
    }
    /// Protocol address length.
    pub fn plen(&self) -> u8 {
        self.0[5]
    }
    /// Operation (1 request, 2 reply).
    pub fn oper(&self) -> u16 {
        u16_at(self.0, 6)
    }
    /// Sender hardware address.
    pub fn sha(&self) -> [u8; 6] {
        array_at(self.0, 8)
    }
    /// Sender protocol address.
    pub fn spa(&self) -> [u8; 4] {
        array_at(self.0, 14)
    }
    /// Target hardware address.
    pub fn tha(&self) -> [u8; 6] {
        array_at(self.0, 18)
    }
    /// Target protocol address.
    pub fn tpa(&self) -> [u8; 4] {
        array_at(self.0, 24)
    }
    /// Whether this is an IPv4-over-Ethernet request (htype 1, ptype 0x0800, hlen 6, plen 4,
    /// oper 1).
    pub fn is_ipv4_request(&self) -> bool {
        self.htype() == 1
            && self.ptype() == ETHERTYPE_IPV4
            && self.hlen() == 6
            && self.plen() == 4
            && self.oper() == ARP_REQUEST
    }
}

/// Turns the ARP request frame in `frame` (Ethernet header, then the ARP packet) into the reply
/// of the host (`mac`, `ip`), in place: Ethernet destination = the request's source, source =
/// `mac`, operation 2, sender = (`mac`, `ip`), target = the request's sender. Bytes after the
/// ARP packet (padding) stay as they are.
pub fn arp_reply_in_place(frame: &mut [u8], mac: [u8; 6], ip: [u8; 4]) -> Result<()> {
    check(frame, ETHERNET_LEN + ARP_LEN)?;
    let (sha, spa) = {
        let arp = ArpPacket::new_checked(&frame[ETHERNET_LEN..])?;
        (arp.sha(), arp.spa())
    };
    let eth_src: [u8; 6] = array_at(frame, 6);
    frame[0..6].copy_from_slice(&eth_src);
    frame[6..12].copy_from_slice(&mac);
    let arp = &mut frame[ETHERNET_LEN..ETHERNET_LEN + ARP_LEN];
    arp[6..8].copy_from_slice(&ARP_REPLY.to_be_bytes());
    arp[8..14].copy_from_slice(&mac);
    arp[14..18].copy_from_slice(&ip);
    arp[18..24].copy_from_slice(&sha);
    arp[24..28].copy_from_slice(&spa);
    Ok(())
}

/// Bytes of an ARP request frame (Ethernet header and ARP packet, no padding).
pub const ARP_FRAME_LEN: usize = ETHERNET_LEN + ARP_LEN;

/// Writes into `buf` the broadcast ARP request of the host (`mac`, `ip`) for `target`; returns
/// its length ([`ARP_FRAME_LEN`]).
pub fn emit_arp_request(
    buf: &mut [u8],
    mac: [u8; 6],
    ip: [u8; 4],
    target: [u8; 4],
) -> Result<usize> {
    check(buf, ARP_FRAME_LEN)?;
    buf[0..6].copy_from_slice(&BROADCAST);
    buf[6..12].copy_from_slice(&mac);
    buf[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    let arp = &mut buf[ETHERNET_LEN..ARP_FRAME_LEN];
    arp[0..2].copy_from_slice(&1u16.to_be_bytes());
    arp[2..4].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    arp[4] = 6;
    arp[5] = 4;
    arp[6..8].copy_from_slice(&ARP_REQUEST.to_be_bytes());
    arp[8..14].copy_from_slice(&mac);
    arp[14..18].copy_from_slice(&ip);
    arp[18..24].copy_from_slice(&[0; 6]);
    arp[24..28].copy_from_slice(&target);
    Ok(ARP_FRAME_LEN)
}

/// The fixed 20 bytes of an IPv4 header (options, if any, are not part of the view).
#[derive(Debug, Clone, Copy)]
pub struct Ipv4Header<'a>(&'a [u8]);

impl<'a> Ipv4Header<'a> {
    /// A view of `bytes`, which must hold at least 20 bytes.
    pub fn new_checked(bytes: &'a [u8]) -> Result<Self> {
        check(bytes, IPV4_LEN)?;
        Ok(Ipv4Header(bytes))
    }
    /// The version nibble.
    pub fn version(&self) -> u8 {
        self.0[0] >> 4
    }
    /// The header length in 32-bit words.
    pub fn ihl(&self) -> u8 {
        self.0[0] & 0x0f
    }
    /// The flags (3 bits) and fragment offset (13 bits).
    pub fn flags_fragment(&self) -> u16 {
        u16_at(self.0, 6)
    }
    /// Whether the datagram is a fragment: MF set or a fragment offset.
    pub fn is_fragment(&self) -> bool {
        self.flags_fragment() & 0x3fff != 0
    }
    /// The protocol number.
    pub fn protocol(&self) -> u8 {
        self.0[9]
    }
    /// Source address.
    pub fn src(&self) -> [u8; 4] {
        array_at(self.0, 12)
    }
    /// Destination address.
    pub fn dst(&self) -> [u8; 4] {
        array_at(self.0, 16)
    }
}

/// A UDP header.
#[derive(Debug, Clone, Copy)]
pub struct UdpHeader<'a>(&'a [u8]);

impl<'a> UdpHeader<'a> {
    /// A view of `bytes`, which must hold at least 8 bytes.
    pub fn new_checked(bytes: &'a [u8]) -> Result<Self> {
        check(bytes, UDP_LEN)?;
        Ok(UdpHeader(bytes))
    }
    /// Source port.
    pub fn src_port(&self) -> u16 {
        u16_at(self.0, 0)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        u16_at(self.0, 2)
    }
    /// Length of header and payload, as the header says.
    pub fn length(&self) -> u16 {
        u16_at(self.0, 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request(sha: [u8; 6], spa: [u8; 4], tpa: [u8; 4], pad: usize) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&BROADCAST);
        f.extend_from_slice(&sha);
        f.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
        f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&sha);
        f.extend_from_slice(&spa);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&tpa);
        f.resize(f.len() + pad, 0xee);
        f
    }

    proptest! {
        #[test]
        fn views_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(e) = EthernetFrame::new_checked(&bytes) {
                let _ = (e.dst(), e.src(), e.ethertype());
                if let Ok(a) = ArpPacket::new_checked(e.payload()) {
                    let _ = (a.is_ipv4_request(), a.sha(), a.spa(), a.tha(), a.tpa());
                }
                if let Ok(ip) = Ipv4Header::new_checked(e.payload()) {
                    let _ = (ip.version(), ip.ihl(), ip.is_fragment(), ip.protocol(), ip.src(), ip.dst());
                    if let Some(rest) = e.payload().get(IPV4_LEN..) {
                        if let Ok(u) = UdpHeader::new_checked(rest) {
                            let _ = (u.src_port(), u.dst_port(), u.length());
                        }
                    }
                }
            }
            let mut copy = bytes.clone();
            let _ = arp_reply_in_place(&mut copy, [1; 6], [2; 4]);
        }

        #[test]
        fn arp_reply_swaps_sender_and_target(sha in any::<[u8; 6]>(), spa in any::<[u8; 4]>(),
                                             tpa in any::<[u8; 4]>(), mac in any::<[u8; 6]>(), pad in 0usize..20) {
            let mut f = request(sha, spa, tpa, pad);
            let len = f.len();
            prop_assert!(ArpPacket::new_checked(&f[ETHERNET_LEN..]).unwrap().is_ipv4_request());
            arp_reply_in_place(&mut f, mac, tpa).unwrap();
            prop_assert_eq!(f.len(), len);
            let e = EthernetFrame::new_checked(&f).unwrap();
            prop_assert_eq!(e.dst(), sha);
            prop_assert_eq!(e.src(), mac);
            prop_assert_eq!(e.ethertype(), ETHERTYPE_ARP);
            let a = ArpPacket::new_checked(e.payload()).unwrap();
            prop_assert_eq!(a.oper(), ARP_REPLY);
            prop_assert_eq!((a.sha(), a.spa(), a.tha(), a.tpa()), (mac, tpa, sha, spa));
            prop_assert!(f[ETHERNET_LEN + ARP_LEN..].iter().all(|&b| b == 0xee));
        }
    }

    proptest! {
        #[test]
        fn an_emitted_arp_request_reads_back(mac in any::<[u8; 6]>(), ip in any::<[u8; 4]>(),
                                             target in any::<[u8; 4]>()) {
            let mut buf = [0u8; 64];
            let n = emit_arp_request(&mut buf, mac, ip, target).unwrap();
            prop_assert_eq!(&buf[..n], &request(mac, ip, target, 0)[..]);
            let e = EthernetFrame::new_checked(&buf[..n]).unwrap();
            let a = ArpPacket::new_checked(e.payload()).unwrap();
            prop_assert!(a.is_ipv4_request());
            prop_assert_eq!((a.sha(), a.spa(), a.tpa()), (mac, ip, target));
        }
    }

    #[test]
    fn short_buffers_are_refused() {
        assert!(emit_arp_request(&mut [0; 41], [0; 6], [0; 4], [0; 4]).is_err());
        assert!(EthernetFrame::new_checked(&[0; 13]).is_err());
        assert!(ArpPacket::new_checked(&[0; 27]).is_err());
        assert!(Ipv4Header::new_checked(&[0; 19]).is_err());
        assert!(UdpHeader::new_checked(&[0; 7]).is_err());
        assert!(arp_reply_in_place(&mut [0; 41], [0; 6], [0; 4]).is_err());
    }

    #[test]
    fn ipv4_fragment_bits() {
        let mut h = [0u8; 20];
        h[0] = 0x45;
        let ip = Ipv4Header::new_checked(&h).unwrap();
        assert_eq!((ip.version(), ip.ihl(), ip.is_fragment()), (4, 5, false));
        h[6] = 0x40; // DF alone is not a fragment
        assert!(!Ipv4Header::new_checked(&h).unwrap().is_fragment());
        h[6] = 0x20; // MF
        assert!(Ipv4Header::new_checked(&h).unwrap().is_fragment());
        h[6] = 0x40;
        h[7] = 1; // offset
        assert!(Ipv4Header::new_checked(&h).unwrap().is_fragment());
    }
}
