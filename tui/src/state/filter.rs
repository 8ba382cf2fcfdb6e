//! The trace filter typed after `/`: space-separated terms, all of which must match.
//!
//! | term | matches |
//! |---|---|
//! | `alloc`, `free`, `segment`, `oom`, any action name or prefix | entries whose action starts with it |
//! | `s7`, `stream:7` | entries on stream 7 |
//! | `>1MiB`, `<4KiB`, `1MiB..4MiB` | entries whose size is in range |
//! | `0x7f3a2c400000` | entries at that address |

use allocview_alloc::snapshot::{TraceAction, TraceEntry};

use crate::units;

/// One term of a filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    /// Actions whose name starts with the prefix.
    Action(String),
    /// One stream.
    Stream(u64),
    /// Sizes in `[lo, hi]`.
    Size(u64, u64),
    /// One address.
    Address(u64),
}

/// A parsed filter; empty matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceFilter {
    /// The text as typed.
    pub text: String,
    /// Its terms.
    pub terms: Vec<Term>,
}

/// Why a filter did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad filter term {term:?}: {why}")]
pub struct FilterError {
    /// The term.
    pub term: String,
    /// What is wrong.
    pub why: String,
}

fn size(term: &str, s: &str) -> Result<u64, FilterError> {
    units::parse_size(s).map_err(|e| FilterError {
        term: term.to_string(),
        why: e.to_string(),
    })
}

impl TraceFilter {
    /// Parses a filter.
    ///
    /// # Errors
    /// [`FilterError`] naming the term that does not parse.
    pub fn parse(text: &str) -> Result<TraceFilter, FilterError> {
        let mut terms = Vec::new();
        for t in text.split_whitespace() {
            let lower = t.to_ascii_lowercase();
            let term = if let Some(hex) = lower.strip_prefix("0x") {
                Term::Address(u64::from_str_radix(hex, 16).map_err(|_| FilterError {
                    term: t.to_string(),
                    why: "not a hex address".into(),
                })?)
            } else if let Some(n) = lower.strip_prefix("stream:").or_else(|| {
                lower
                    .strip_prefix('s')
                    .filter(|r| r.chars().all(|c| c.is_ascii_digit()) && !r.is_empty())
            }) {
                Term::Stream(n.parse().map_err(|_| FilterError {
                    term: t.to_string(),
                    why: "not a stream number".into(),
                })?)
            } else if let Some(r) = lower.strip_prefix(">=").or_else(|| lower.strip_prefix('>')) {
                Term::Size(size(t, r)?, u64::MAX)
            } else if let Some(r) = lower.strip_prefix("<=").or_else(|| lower.strip_prefix('<')) {
                Term::Size(0, size(t, r)?)
            } else if let Some((a, b)) = lower.split_once("..") {
                Term::Size(size(t, a)?, size(t, b)?)
            } else if TraceAction::ALL
                .iter()
                .any(|a| a.as_str().starts_with(&lower))
            {
                Term::Action(lower)
            } else {
                return Err(FilterError {
                    term: t.to_string(),
                    why: "expected an action (alloc, free, segment, oom...), sN, >SIZE, <SIZE, A..B or 0xADDR".into(),
                });
            };
            terms.push(term);
        }
        Ok(TraceFilter {
            text: text.trim().to_string(),
            terms,
        })
    }

    /// Whether the filter is empty.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Whether an entry passes.
    pub fn matches(&self, e: &TraceEntry) -> bool {
        self.terms.iter().all(|t| match t {
            Term::Action(p) => e.action.as_str().starts_with(p.as_str()),
            Term::Stream(s) => e.stream == *s,
            Term::Size(lo, hi) => (*lo..=*hi).contains(&e.size),
            Term::Address(a) => e.addr == *a,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_combine_with_and() {
        let f = TraceFilter::parse("alloc s1 >1MiB").unwrap();
        assert!(f.matches(&TraceEntry::new(TraceAction::Alloc, 0, 2 << 20, 1)));
        assert!(!f.matches(&TraceEntry::new(TraceAction::Alloc, 0, 2 << 20, 0)));
        assert!(!f.matches(&TraceEntry::new(TraceAction::Alloc, 0, 1 << 19, 1)));
        assert!(!f.matches(&TraceEntry::new(TraceAction::FreeRequested, 0, 2 << 20, 1)));
        let f = TraceFilter::parse("free 0x10 512..1KiB").unwrap();
        assert!(f.matches(&TraceEntry::new(TraceAction::FreeCompleted, 0x10, 600, 0)));
        assert!(TraceFilter::parse("").unwrap().matches(&TraceEntry::new(
            TraceAction::Oom,
            0,
            0,
            0
        )));
    }

    #[test]
    fn bad_terms_are_named() {
        let e = TraceFilter::parse("alloc banana").unwrap_err();
        assert_eq!(e.term, "banana");
        assert!(TraceFilter::parse(">lots").is_err());
        assert!(TraceFilter::parse("0xzz").is_err());
    }
}
