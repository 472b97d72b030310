//! The sparse all-gather baseline (OmniReduce's AGsparse): every rank sends the blocks it
//! holds, as (index, block) pairs, to every other rank over the ring's connections
//! ([`RingComm::allgather`]), and each rank adds them all up in rank order, so that every rank
//! ends with the same bits. Each rank sends and receives the other ranks' pairs: about
//! `(n - 1) d S` bytes for a density `d` of a tensor of `S` bytes, against the ring
//! all-reduce's `2 (n - 1) / n S`.

use crate::ring::{RingComm, RingError};

/// Bytes of a pair's block index.
const INDEX_LEN: usize = 4;

impl RingComm {
    /// Sums `data` over all ranks, in place, by gathering every rank's non-zero blocks of
    /// `block` elements (a block is non-zero when one of its elements is not +0.0 or -0.0).
    pub fn allreduce_sparse_f32(
        &mut self,
        data: &mut [f32],
        block: usize,
    ) -> Result<(), RingError> {
        let e = block.max(1);
        let mine = encode(data, e);
        let all = self.allgather(&mine)?;
        data.fill(0.0);
        for (rank, bytes) in all.iter().enumerate() {
            add_pairs(data, e, bytes)
                .map_err(|reason| RingError::CallMismatch { peer: rank, reason })?;
        }
        Ok(())
    }
}

/// The (index, block) pairs of `data`'s non-zero blocks: a little-endian u32 index, then the
/// block's elements.
fn encode(data: &[f32], e: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for (b, block) in data.chunks(e).enumerate() {
        if block.iter().all(|x| *x == 0.0) {
            continue;
        }
        out.extend_from_slice(&(b as u32).to_le_bytes());
        for x in block {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    out
}

/// Adds the pairs of `bytes` into `data`; refuses a block index out of range or a pair cut
/// short.
fn add_pairs(data: &mut [f32], e: usize, mut bytes: &[u8]) -> Result<(), String> {
    while !bytes.is_empty() {
        let (index, rest) = bytes
            .split_first_chunk::<INDEX_LEN>()
            .ok_or("a sparse contribution cut inside a block index")?;
        let b = u32::from_le_bytes(*index) as usize;
        let start = b
            .checked_mul(e)
            .filter(|s| *s < data.len())
            .ok_or_else(|| format!("block {b} is beyond the tensor"))?;
        let end = (start + e).min(data.len());
        let target = &mut data[start..end];
        let len = target.len() * 4;
        if rest.len() < len {
            return Err(format!("block {b} cut short"));
        }
        for (t, x) in target.iter_mut().zip(rest[..len].chunks_exact(4)) {
            *t += f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        }
        bytes = &rest[len..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_and_bad_ones_are_refused() {
        let data = [0.0, 0.0, 1.5, -0.0, 0.0, 0.0, 2.0];
        let bytes = encode(&data, 2);
        // Blocks 1 ([1.5, -0.0]) and 3 ([2.0]): two indices and three elements.
        assert_eq!(bytes.len(), 2 * 4 + 3 * 4);
        let mut sum = [1.0f32; 7];
        add_pairs(&mut sum, 2, &bytes).unwrap();
        assert_eq!(sum, [1.0, 1.0, 2.5, 1.0, 1.0, 1.0, 3.0]);
        assert!(add_pairs(&mut sum, 2, &bytes[..bytes.len() - 1]).is_err());
        assert!(add_pairs(&mut sum, 2, &[9, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(add_pairs(&mut sum, 2, &[0, 0]).is_err());
    }
}
