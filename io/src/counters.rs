//! Per-port counters.

/// Counters of one port handle, as returned by
/// [`Port::counters`](crate::Port::counters).
///
/// All counts are cumulative since the handle was opened. System call
/// counts include the waits (`ppoll`) made while blocking; in-memory ports
/// make no system calls and leave them at zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Datagrams delivered to the caller.
    pub rx_datagrams: u64,
    /// Bytes delivered to the caller (after truncation).
    pub rx_bytes: u64,
    /// Datagrams delivered truncated (larger than the receive slot).
    pub rx_truncated: u64,
    /// System calls made on the receive path (receives and waits).
    pub rx_syscalls: u64,
    /// Datagrams received from the kernel but never delivered: the rest of
    /// a coalesced receive whose buffer the batch gave up before they were
    /// read (the batch was refilled by another port in between).
    pub rx_abandoned: u64,
    /// Coalesced GRO buffers received (each held two or more datagrams).
    pub gro_batches: u64,
    /// Datagrams that arrived inside coalesced GRO buffers.
    pub gro_segments: u64,
    /// Datagrams accepted for sending.
    pub tx_datagrams: u64,
    /// Bytes accepted for sending.
    pub tx_bytes: u64,
    /// Datagrams refused (not sent) because of an error.
    pub tx_errors: u64,
    /// System calls made on the send path (sends and waits).
    pub tx_syscalls: u64,
    /// GSO buffers sent (each carried two or more datagrams).
    pub gso_batches: u64,
    /// Datagrams sent inside GSO buffers.
    pub gso_segments: u64,
    /// GSO buffers the kernel refused, whose datagrams were then sent one
    /// by one.
    pub gso_fallbacks: u64,
}

impl Counters {
    /// `self - earlier`, field by field (saturating): the activity between
    /// two snapshots.
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            rx_datagrams: self.rx_datagrams.saturating_sub(earlier.rx_datagrams),
            rx_bytes: self.rx_bytes.saturating_sub(earlier.rx_bytes),
            rx_truncated: self.rx_truncated.saturating_sub(earlier.rx_truncated),
            rx_syscalls: self.rx_syscalls.saturating_sub(earlier.rx_syscalls),
            rx_abandoned: self.rx_abandoned.saturating_sub(earlier.rx_abandoned),
            gro_batches: self.gro_batches.saturating_sub(earlier.gro_batches),
            gro_segments: self.gro_segments.saturating_sub(earlier.gro_segments),
            tx_datagrams: self.tx_datagrams.saturating_sub(earlier.tx_datagrams),
            tx_bytes: self.tx_bytes.saturating_sub(earlier.tx_bytes),
            tx_errors: self.tx_errors.saturating_sub(earlier.tx_errors),
            tx_syscalls: self.tx_syscalls.saturating_sub(earlier.tx_syscalls),
            gso_batches: self.gso_batches.saturating_sub(earlier.gso_batches),
            gso_segments: self.gso_segments.saturating_sub(earlier.gso_segments),
            gso_fallbacks: self.gso_fallbacks.saturating_sub(earlier.gso_fallbacks),
        }
    }

    /// Received datagrams per receive system call (0 if none made).
    pub fn rx_datagrams_per_syscall(&self) -> f64 {
        ratio(self.rx_datagrams, self.rx_syscalls)
    }

    /// Sent datagrams per send system call (0 if none made).
    pub fn tx_datagrams_per_syscall(&self) -> f64 {
        ratio(self.tx_datagrams, self.tx_syscalls)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_subtracts_and_saturates() {
        let a = Counters {
            rx_datagrams: 10,
            rx_syscalls: 2,
            tx_bytes: 5,
            ..Counters::default()
        };
        let b = Counters {
            rx_datagrams: 4,
            tx_bytes: 9,
            ..Counters::default()
        };
        let d = a.since(&b);
        assert_eq!(d.rx_datagrams, 6);
        assert_eq!(d.tx_bytes, 0);
        assert_eq!(d.rx_syscalls, 2);
        assert_eq!(a.rx_datagrams_per_syscall(), 5.0);
        assert_eq!(Counters::default().tx_datagrams_per_syscall(), 0.0);
    }
}
