//! Fault injection: drops datagrams with a fixed probability.

/// A seeded Bernoulli dropper (xorshift64*).
#[derive(Debug, Clone)]
pub(crate) struct Loss {
    threshold: u64,
    state: u64,
}

impl Loss {
    pub(crate) fn new(p: f64, seed: u64) -> Loss {
        let p = if p.is_finite() {
            p.clamp(0.0, 1.0)
        } else {
            0.0
        };
        Loss {
            threshold: (p * u64::MAX as f64) as u64,
            state: seed | 1,
        }
    }

    /// True if this datagram is to be dropped.
    pub(crate) fn drop_now(&mut self) -> bool {
        if self.threshold == 0 {
            return false;
        }
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d) < self.threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_is_close_to_p() {
        let mut l = Loss::new(0.01, 9);
        let drops = (0..200_000).filter(|_| l.drop_now()).count();
        assert!((1_600..2_400).contains(&drops), "{drops}");
        let mut none = Loss::new(0.0, 9);
        assert!((0..1000).all(|_| !none.drop_now()));
        let mut all = Loss::new(1.0, 9);
        assert!((0..1000).all(|_| all.drop_now()));
    }
}
