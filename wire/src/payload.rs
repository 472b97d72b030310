//! The payload: `count` two's-complement 32-bit integers in network byte order (big-endian).
//!
//! These helpers convert between payload bytes and native integers in bulk. They take slices
//! whose lengths the caller has already checked against each other (via a checked
//! [`AggPacket`](crate::AggPacket)), and process `min(bytes.len() / 4, values.len())` elements,
//! so a mismatch can never index out of bounds.

/// Bytes per payload element.
pub const ELEM_BYTES: usize = 4;

/// Decodes big-endian elements of `bytes` into `out`; returns how many were decoded.
pub fn decode_into(bytes: &[u8], out: &mut [i32]) -> usize {
    let mut n = 0;
    for (dst, src) in out.iter_mut().zip(bytes.chunks_exact(ELEM_BYTES)) {
        *dst = i32::from_be_bytes([src[0], src[1], src[2], src[3]]);
        n += 1;
    }
    n
}

/// Encodes `values` as big-endian elements into `bytes`; returns how many were encoded.
pub fn encode_from(values: &[i32], bytes: &mut [u8]) -> usize {
    let mut n = 0;
    for (src, dst) in values.iter().zip(bytes.chunks_exact_mut(ELEM_BYTES)) {
        dst.copy_from_slice(&src.to_be_bytes());
        n += 1;
    }
    n
}

/// Adds big-endian elements of `bytes` to `acc` with wrap-around arithmetic (the switch's
/// register add); returns how many were added.
pub fn accumulate(bytes: &[u8], acc: &mut [i32]) -> usize {
    let mut n = 0;
    for (dst, src) in acc.iter_mut().zip(bytes.chunks_exact(ELEM_BYTES)) {
        *dst = dst.wrapping_add(i32::from_be_bytes([src[0], src[1], src[2], src[3]]));
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn encode_decode_round_trip(values in proptest::collection::vec(any::<i32>(), 0..300)) {
            let mut bytes = vec![0u8; values.len() * ELEM_BYTES];
            prop_assert_eq!(encode_from(&values, &mut bytes), values.len());
            let mut back = vec![0i32; values.len()];
            prop_assert_eq!(decode_into(&bytes, &mut back), values.len());
            prop_assert_eq!(&back, &values);
            // Network byte order: the most significant byte comes first.
            if let Some(first) = values.first() {
                prop_assert_eq!(bytes[0], (*first as u32 >> 24) as u8);
            }
        }

        #[test]
        fn accumulate_wraps(a in proptest::collection::vec(any::<i32>(), 0..64), b in any::<i32>()) {
            let mut bytes = vec![0u8; a.len() * ELEM_BYTES];
            encode_from(&a, &mut bytes);
            let mut acc = vec![b; a.len()];
            accumulate(&bytes, &mut acc);
            for (x, y) in a.iter().zip(&acc) {
                prop_assert_eq!(*y, x.wrapping_add(b));
            }
        }
    }

    #[test]
    fn mismatched_lengths_process_the_shorter() {
        let mut out = [0i32; 4];
        assert_eq!(decode_into(&[0, 0, 0, 7, 0, 0], &mut out), 1);
        assert_eq!(out[0], 7);
        let mut bytes = [0u8; 3];
        assert_eq!(encode_from(&[1, 2], &mut bytes), 0);
    }
}
