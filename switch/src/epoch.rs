//! The epochs a switch picks itself: different on every start, so that a restarted switch
//! refuses the packets of the run before instead of adding them into cleared registers.

/// Entropy that differs on every start of a switch: the clock at the call and the process id.
pub(crate) fn boot_entropy() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}

/// An epoch for job `job` installed at start (never 0).
pub(crate) fn boot_epoch(job: u16) -> u16 {
    ina_proto::pipeline::fresh_epoch(
        boot_entropy() ^ u64::from(job).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Epochs picked at start are never 0 and differ between jobs and between starts.
    #[test]
    fn boot_epochs_are_never_zero_and_vary() {
        let epochs: std::collections::HashSet<u16> = (0..64u16)
            .map(|j| {
                std::thread::sleep(std::time::Duration::from_micros(50));
                boot_epoch(j % 4)
            })
            .collect();
        assert!(!epochs.contains(&0));
        assert!(epochs.len() > 48, "{} distinct epochs of 64", epochs.len());
    }
}
