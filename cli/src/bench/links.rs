//! `ina bench`'s default: every in-process worker behind a link of its own, paced inside the
//! process in both directions (`--link`, default 500 Mbit/s): the ina workers' UDP ports
//! through `ina_io::paced::PacedPort`, the ring's TCP streams with `SO_MAX_PACING_RATE`. This
//! is where in-network aggregation has something to save, as on a rack: a ring moves
//! 2(n−1)/n tensors over each link, ina one. `--link unlimited` runs on bare loopback, where the
//! CPU, not a link, bounds both.

use super::{AlgoResult, Algorithm, BenchReport};
use serde::Serialize;

/// Where the in-process workers' traffic goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkArg {
    /// Each worker behind a link of this many bits per second, each way.
    Rate(u64),
    /// Bare loopback.
    Unlimited,
}

/// The default link of an in-process run, bits per second: well below what this stack's
/// workers reach on one core, so that the links bound both algorithms.
pub const DEFAULT_RATE_BPS: u64 = 500_000_000;

/// Parses `--link`: a rate (`500mbit`, `1gbit`) or `unlimited`.
pub fn parse_link(s: &str) -> Result<LinkArg, String> {
    if s.trim().eq_ignore_ascii_case("unlimited") {
        return Ok(LinkArg::Unlimited);
    }
    crate::cmd_testbed::parse_rate(s)
        .map(LinkArg::Rate)
        .map_err(|e| format!("{e}, or `unlimited`"))
}

/// The in-process links' figures.
#[derive(Debug, Clone, Serialize)]
pub struct LinkReport {
    /// Rate of each worker's link, each direction, bits per second.
    pub rate_bps: u64,
    /// IP bytes an `ina` packet puts on a link per byte of tensor it carries.
    pub ina_framing: f64,
    /// The least time the links allow each algorithm.
    pub ina_bound_s: f64,
    pub ring_bound_s: f64,
    /// Ring time over ina time, and the most it can be here: 2(n−1)/n over ina's framing.
    pub speedup: Option<f64>,
    pub speedup_ceiling: f64,
}

/// IP bytes on a link per tensor byte for `ina` in process: IPv4 and UDP (28) and ina (16)
/// headers on every packet of `elems` elements, and one header-only packet per slot of the
/// window for the exponent lookahead. (The ring's TCP segments on loopback are 64 KiB: their
/// headers add under 0.1%, counted as nothing.)
pub fn ina_framing(elements: usize, elems: u16, window: u16) -> f64 {
    let headers = ina_io::paced::IP_UDP_HEADERS + ina_wire::HEADER_LEN;
    framing_with_headers(elements, elems, window, headers)
}

/// Bytes on a link per tensor byte for `ina` when every packet carries `headers` bytes of
/// headers: `elements` in packets of `elems`, and a lookahead header per slot of `window`.
pub fn framing_with_headers(elements: usize, elems: u16, window: u16, headers: usize) -> f64 {
    let e = usize::from(elems);
    let blocks = elements.div_ceil(e);
    let lookahead = blocks.min(usize::from(window));
    let bytes = blocks * (headers + 4 * e) + lookahead * headers;
    bytes as f64 / (elements * 4) as f64
}

/// Fills in every result's bound and fraction of it; returns the links' report.
pub(crate) fn report(
    rate_bps: u64,
    results: &mut [AlgoResult],
    workers: usize,
    elements: usize,
    elems: u16,
    window: u16,
) -> LinkReport {
    let bits = (elements * 4) as f64 * 8.0;
    let ina_framing = ina_framing(elements, elems, window);
    let ina_bound_s = bits * ina_framing / rate_bps as f64;
    let ring_bound_s = bits * super::ring_factor(workers) / rate_bps as f64;
    let speedup =
        super::testbed::fill_bounds(results, Some(ina_bound_s), Some(ring_bound_s), elems);
    LinkReport {
        rate_bps,
        ina_framing,
        ina_bound_s,
        ring_bound_s,
        speedup,
        speedup_ceiling: super::ring_factor(workers) / ina_framing,
    }
}

/// Prints the links' lines of the report.
pub(crate) fn print(l: &LinkReport, r: &BenchReport) {
    println!(
        "links: each of the {} workers behind its own {} link each way, paced inside this process",
        r.workers,
        crate::cmd_testbed::fmt_rate(l.rate_bps)
    );
    super::testbed::print_algorithms(r, l.speedup, l.speedup_ceiling);
    println!(
        "  the links' bound: ina sends and receives the tensor once ({:.0} ms), the ring 2(n-1)/n = {:.2} times ({:.0} ms)",
        l.ina_bound_s * 1e3,
        super::ring_factor(r.workers),
        l.ring_bound_s * 1e3
    );
    let short: Vec<String> = r
        .results
        .iter()
        .filter(|x| matches!(x.algorithm, Algorithm::Ina | Algorithm::Ring))
        .filter(|x| x.of_bound.is_some_and(|f| f < 0.8))
        .map(|x| format!("{:?}", x.algorithm).to_lowercase())
        .collect();
    if !short.is_empty() {
        println!(
            "  {} ran below 0.8 of the links' bound: this machine's CPU, not the link, limits it (try a lower --link)",
            short.join(" and ")
        );
    }
}

/// The line an unlimited in-process run prints: what it measures.
pub(crate) fn print_unlimited() {
    println!(
        "links: none (--link unlimited): every worker shares this machine's loopback and CPU, so this measures CPU cost, not links; in-network aggregation has no bandwidth to save here"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_rates_and_unlimited_parse() {
        assert_eq!(parse_link("500mbit"), Ok(LinkArg::Rate(500_000_000)));
        assert_eq!(parse_link("Unlimited"), Ok(LinkArg::Unlimited));
        let e = parse_link("fast").unwrap_err();
        assert!(e.contains("unlimited"), "{e}");
    }

    #[test]
    fn ina_framing_counts_headers_and_the_lookahead() {
        // 2 packets of 4 elements (16 bytes each) and 1 lookahead header in a window of 1.
        let f = ina_framing(8, 4, 1);
        assert!((f - (2.0 * 60.0 + 44.0) / 32.0).abs() < 1e-12, "{f}");
        // Large packets cost little.
        assert!(ina_framing(1 << 24, 2048, 32) < 1.006);
    }
}
