//! Internet checksums of IPv4 TCP and UDP frames.
//!
//! A host that hands a frame to a virtual link (veth, tap) with checksum offload leaves the
//! TCP or UDP checksum for a NIC to fill in; a switch that forwards such a frame from a raw
//! port fills it in itself, as the NIC would have ([`complete_l4_checksum`]).

use crate::{Error, Result};

const ETHERNET_LEN: usize = 14;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

/// The ones'-complement sum of `bytes` (big-endian 16-bit words, an odd byte padded) added to
/// `sum`, not yet folded.
fn sum_words(bytes: &[u8], mut sum: u64) -> u64 {
    let mut chunks = bytes.chunks_exact(2);
    for w in &mut chunks {
        sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Computes and writes the TCP or UDP checksum of an Ethernet II / IPv4 frame (not a fragment),
/// over the pseudo-header and the segment the IPv4 total length delimits. A UDP checksum that
/// comes out 0 is sent as 0xffff. Other frames are an error and stay as they were.
pub fn complete_l4_checksum(frame: &mut [u8]) -> Result<()> {
    let bad = Error::Frame("not an unfragmented IPv4 TCP or UDP frame");
    let ip = frame.get(ETHERNET_LEN..).ok_or(bad)?;
    if frame.get(12..14) != Some(&[0x08, 0x00]) || ip.len() < 20 || ip[0] >> 4 != 4 {
        return Err(bad);
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let fragmented = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0;
    if ihl < 20 || total < ihl || total > ip.len() || fragmented {
        return Err(bad);
    }
    let proto = ip[9];
    let at = match proto {
        PROTO_TCP => 16,
        PROTO_UDP => 6,
        _ => return Err(bad),
    };
    let seg_len = total - ihl;
    if seg_len < at + 2 {
        return Err(bad);
    }
    let mut pseudo = [0u8; 12];
    pseudo[..8].copy_from_slice(&ip[12..20]);
    pseudo[9] = proto;
    pseudo[10..].copy_from_slice(&(seg_len as u16).to_be_bytes());
    let start = ETHERNET_LEN + ihl;
    let seg = &mut frame[start..start + seg_len];
    seg[at..at + 2].copy_from_slice(&[0, 0]);
    let mut csum = fold(sum_words(seg, sum_words(&pseudo, 0)));
    if proto == PROTO_UDP && csum == 0 {
        csum = 0xffff;
    }
    seg[at..at + 2].copy_from_slice(&csum.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn matches_a_reference_encoder(payload in proptest::collection::vec(any::<u8>(), 0..300),
                                       tcp in any::<bool>(), garbage in any::<u16>()) {
            let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
                .ipv4([198, 18, 0, 1], [198, 18, 0, 2], 64);
            let mut frame = Vec::new();
            let at = if tcp {
                b.tcp(4000, 5000, 77, 1024).write(&mut frame, &payload).unwrap();
                14 + 20 + 16
            } else {
                b.udp(4000, 5000).write(&mut frame, &payload).unwrap();
                14 + 20 + 6
            };
            let reference = frame.clone();
            frame[at..at + 2].copy_from_slice(&garbage.to_be_bytes());
            complete_l4_checksum(&mut frame).unwrap();
            prop_assert_eq!(frame, reference);
        }

        #[test]
        fn never_panics(mut bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
            let _ = complete_l4_checksum(&mut bytes);
        }
    }

    #[test]
    fn refuses_what_it_cannot_sum() {
        let mut arp = vec![0u8; 60];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(complete_l4_checksum(&mut arp).is_err());
        assert!(complete_l4_checksum(&mut [0u8; 10]).is_err());
    }
}
