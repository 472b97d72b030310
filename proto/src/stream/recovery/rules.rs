//! The optional loss-recovery rules, each by name (docs/design/RECOVERY.md §4), all on by
//! default; `ina sim --without RULE` leaves one out.

use core::fmt;
use core::str::FromStr;

/// One optional loss-recovery rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Packets whose loss the switch would report wait as long as held uses lag.
    HeldReordering,
    /// In the stream's last window the reordering tolerance is at most 3.
    LastWindowTolerance,
    /// On one switch, mid-stream, a packet found unanswered by order waits a query timeout.
    HoldOffMidStream,
    /// In a tree, after the last packet, ranks other than 0 wait for the results' counters.
    TreeWaitsForCounters,
    /// In a tree, after the last packet, rank 0 asks for the state and the partial.
    Rank0AsksPartial,
    /// After the last packet, a held use is asked about again from the Query, not its answer.
    AskAgainFromQuery,
    /// Data sent again in the last window goes twice.
    TailCopies,
    /// The exponent lookahead's headers go twice.
    LookaheadCopies,
    /// After the last packet, Queries fetch the result at once.
    FetchAtEnd,
    /// After the last packet, unanswered packets' timers become the query or result timeout.
    TailTimers,
    /// After the last packet, the query timeout is the empty path's round trip.
    EmptyPathTimeout,
    /// With reports, an unanswered packet's first retransmission is a Query.
    QueryFirst,
    /// Mid-stream Queries ask for the use's state (a header-only answer when complete).
    StatusQueries,
    /// Results carry their block's gap counter; a skipped counter is reported at once.
    ResultCounters,
    /// With reports, Queries are spaced by an eighth of the time waited (not only the timeout).
    SpacingByWait,
}

impl Rule {
    /// Every rule, in the order of docs/design/RECOVERY.md.
    pub const ALL: [Rule; 15] = [
        Rule::HeldReordering,
        Rule::LastWindowTolerance,
        Rule::HoldOffMidStream,
        Rule::TreeWaitsForCounters,
        Rule::Rank0AsksPartial,
        Rule::AskAgainFromQuery,
        Rule::TailCopies,
        Rule::LookaheadCopies,
        Rule::FetchAtEnd,
        Rule::TailTimers,
        Rule::EmptyPathTimeout,
        Rule::QueryFirst,
        Rule::StatusQueries,
        Rule::ResultCounters,
        Rule::SpacingByWait,
    ];

    /// The rule's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Rule::HeldReordering => "held-reordering",
            Rule::LastWindowTolerance => "last-window-tolerance",
            Rule::HoldOffMidStream => "hold-off-mid-stream",
            Rule::TreeWaitsForCounters => "tree-waits-for-counters",
            Rule::Rank0AsksPartial => "rank0-asks-partial",
            Rule::AskAgainFromQuery => "ask-again-from-query",
            Rule::TailCopies => "tail-copies",
            Rule::LookaheadCopies => "lookahead-copies",
            Rule::FetchAtEnd => "fetch-at-end",
            Rule::TailTimers => "tail-timers",
            Rule::EmptyPathTimeout => "empty-path-timeout",
            Rule::QueryFirst => "query-first",
            Rule::StatusQueries => "status-queries",
            Rule::ResultCounters => "result-counters",
            Rule::SpacingByWait => "spacing-by-wait",
        }
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A rule name that names no rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no loss-recovery rule is named {0:?} (the rules: {names})", names = Rule::ALL.map(Rule::name).join(", "))]
pub struct UnknownRule(pub String);

impl FromStr for Rule {
    type Err = UnknownRule;

    fn from_str(s: &str) -> Result<Rule, UnknownRule> {
        Rule::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| UnknownRule(s.to_owned()))
    }
}

/// The set of rules a stream follows: all of them unless some are left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    off: u32,
}

impl Default for Rules {
    fn default() -> Rules {
        Rules::ALL
    }
}

impl Rules {
    /// Every rule on.
    pub const ALL: Rules = Rules { off: 0 };

    /// These rules with `rule` left out.
    pub fn without(self, rule: Rule) -> Rules {
        Rules {
            off: self.off | rule.bit(),
        }
    }

    /// Whether the stream follows `rule`.
    pub fn has(self, rule: Rule) -> bool {
        self.off & rule.bit() == 0
    }

    /// The rules left out.
    pub fn left_out(self) -> impl Iterator<Item = Rule> {
        Rule::ALL.into_iter().filter(move |r| !self.has(*r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for r in Rule::ALL {
            assert_eq!(r.name().parse::<Rule>(), Ok(r));
        }
        let e = "no-such-rule".parse::<Rule>().unwrap_err();
        assert!(e.to_string().contains("held-reordering"), "{e}");
    }

    #[test]
    fn without_leaves_out_only_that_rule() {
        let rules = Rules::ALL.without(Rule::TailCopies);
        assert!(!rules.has(Rule::TailCopies));
        assert!(rules.has(Rule::LookaheadCopies));
        assert_eq!(rules.left_out().collect::<Vec<_>>(), vec![Rule::TailCopies]);
    }
}
