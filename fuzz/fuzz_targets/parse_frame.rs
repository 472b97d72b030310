//! `frame::parse` on arbitrary bytes: never a panic; what parses is a sub-slice of the input, and
//! re-encapsulating its payload with `frame::emit_headers` parses back to the same addresses and
//! payload.
#![no_main]

use ina_wire::frame::{self, FRAME_HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(parsed) = frame::parse(data) else {
        return;
    };
    // The payload lies inside the frame, after at least the minimal headers.
    let start = parsed.payload.as_ptr() as usize - data.as_ptr() as usize;
    assert!(start >= FRAME_HEADER_LEN);
    assert!(start + parsed.payload.len() <= data.len());
    assert_eq!(parsed.addrs.reversed().reversed(), parsed.addrs);

    let mut buf = vec![0u8; FRAME_HEADER_LEN + parsed.payload.len()];
    let len = match frame::emit_headers(&mut buf, &parsed.addrs, parsed.payload.len()) {
        Ok(len) => len,
        // A payload too long for a header-option-free IPv4 packet: nothing to compare.
        Err(_) => return,
    };
    assert_eq!(len, buf.len());
    buf[FRAME_HEADER_LEN..].copy_from_slice(parsed.payload);
    match frame::parse(&buf) {
        Ok(again) => {
            assert_eq!(again.addrs, parsed.addrs);
            assert_eq!(again.payload, parsed.payload);
        }
        Err(e) => panic!("re-emitted frame does not parse: {e}"),
    }
});
