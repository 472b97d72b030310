//! The gap counters' rule, shared by the switch and the workers (PROTOCOL.md §5, "Missing
//! reports" and "Lost results"; §9): a cell per block holds the latest counter seen, and a
//! counter that skips a few past it names packets lost on the way.

use ina_wire::agg::GAP_COUNTER;

/// A gap cell's update for `counter` (the cell holds the latest counter plus 64; 0: none
/// yet): the first skipped counter and how many were skipped, if 1 to [`MAX_REPORTED_GAP`].
/// Any other counter (the cell's own, one behind it, or one further ahead) leaves the cell
/// as it is: a packet the network delayed past later ones, whose gap was reported when they
/// came, or behind by more than half the counter's range, which modulo 64 looks like a jump
/// far ahead. Read as a jump ahead, either would report much of the block missing: with 5%
/// of packets reordered by up to 50 µs, Missing reports made the workers send their data
/// twice (behind by 32 or less), then a fifth of it again (behind by 33 to 56).
pub(crate) fn take_counter(latest: &mut u32, counter: u8) -> Option<(u8, u8)> {
    let m = u32::from(GAP_COUNTER);
    let previous = *latest;
    if previous == 0 {
        *latest = m + u32::from(counter);
        return None;
    }
    let skipped = (u32::from(counter) + 2 * m - previous - 1) % m;
    if skipped > MAX_REPORTED_GAP {
        return None;
    }
    *latest = m + u32::from(counter);
    (skipped != 0).then_some((((previous + 1) % m) as u8, skipped as u8))
}

/// The most first transmissions one Missing report names. A counter further ahead of its
/// cell than this many skipped is taken for a late packet, not a burst of losses: losing 8
/// first transmissions in a row to one block happens with probability 0.2^8 = 2.6e-6 at 20%
/// loss, and such a burst is still found by the workers' Queries (PROTOCOL.md §5).
pub const MAX_REPORTED_GAP: u32 = 7;
