//! `AggRepr::parse_bytes`, `AggRepr::parse_header`, `ProbeInfo::parse` and
//! `ProbeGroup::parse` on arbitrary bytes: never a panic, whatever parses emits back to the same bytes (up to the reserved flag bits,
//! which are sent as 0), and the header alone parses as the whole packet does.
#![no_main]

use ina_wire::agg::{ProbeGroup, ProbeInfo};
use ina_wire::{AggPacket, AggRepr, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((repr, payload)) = AggRepr::parse_bytes(data) {
        assert_eq!(repr.buffer_len(), data.len());
        assert_eq!(payload.len(), data.len() - HEADER_LEN);
        assert_eq!(payload, &data[HEADER_LEN..]);

        // The view agrees with the representation.
        let Ok(view) = AggPacket::new_checked(data) else {
            panic!("parse_bytes accepted what new_checked refuses");
        };
        assert_eq!(view.count(), repr.count);
        assert_eq!(view.seq(), repr.seq);
        assert_eq!(view.slot(), repr.slot);
        assert_eq!(view.payload(), payload);

        // Emit it again: identical bytes but for the reserved bits of the flags byte.
        let mut buf = vec![0xA5u8; repr.buffer_len() + 3];
        let len = match repr.emit_into(&mut buf) {
            Ok(mut pkt) => {
                pkt.payload_mut().copy_from_slice(payload);
                pkt.into_inner().len()
            }
            Err(e) => panic!("emit of a parsed header failed: {e}"),
        };
        assert_eq!(len, data.len());
        let mut want = data.to_vec();
        // (Bits 2-7 are the gap counter when bit 1 is set, and reserved otherwise.)
        if want[1] & 2 == 0 {
            want[1] &= 1;
        }
        assert_eq!(&buf[..len], &want[..]);
        assert!(
            buf[len..].iter().all(|b| *b == 0xA5),
            "emit wrote past the packet"
        );

        // And it parses to the same thing.
        match AggRepr::parse_bytes(&buf[..len]) {
            Ok((again, p)) => {
                assert_eq!(again, repr);
                assert_eq!(p, payload);
            }
            Err(e) => panic!("re-emitted packet does not parse: {e}"),
        }
        let _ = repr.reject_reason();
        let _ = ProbeInfo::parse(payload);
    }

    // The header alone parses as the whole packet does whenever the whole packet parses, and
    // a header that does not parse alone makes no packet parse.
    if let Some(header) = data.first_chunk::<HEADER_LEN>() {
        match (AggRepr::parse_header(header), AggRepr::parse_bytes(data)) {
            (Ok(h), Ok((whole, _))) => assert_eq!(h, whole),
            (Err(_), Ok(_)) => panic!("a packet parsed whose header alone does not"),
            _ => {}
        }
    }

    if let Ok(info) = ProbeInfo::parse(data) {
        let mut buf = [0u8; 16];
        if let Err(e) = info.emit(&mut buf) {
            panic!("emit of a parsed probe info failed: {e}");
        }
        // The first four elements; a 24-byte payload also names the job's multicast group.
        assert_eq!(&buf[..], &data[..16]);
        match ProbeGroup::parse(data) {
            Ok(Some(g)) => {
                let mut tail = [0u8; 8];
                g.emit(&mut tail).expect("emit of a parsed group");
                assert_eq!(&tail[..], &data[16..24]);
            }
            Ok(None) => assert_eq!(data.len(), 16),
            Err(_) => {}
        }
    }
});
