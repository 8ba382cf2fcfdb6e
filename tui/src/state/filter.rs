//! The trace filter typed after `/`: space-separated terms. Terms of one kind are
//! alternatives (`alloc free_requested`: either action; `s0 s1`: either stream), terms of
//! different kinds must all match (`alloc s1 >1MiB`), and size bounds narrow each other
//! (`>1MiB <4MiB`).
//!
//! | term | matches |
//! |---|---|
//! | `alloc`, `free`, `segment`, `oom`, any action name or prefix | entries whose action starts with it |
//! | `s7`, `stream:7` | entries on stream 7 |
//! | `>1MiB`, `<4KiB`, `1MiB..4MiB` | entries whose size is in range |
//! | `512`, `2MiB` | entries of exactly that size |
//! | `0x7f3a2c400000`, `0x7f3a2c` | entries at that address, or whose address starts with those digits |
//! | `forward`, `model.py`, `@alloc` | entries with a stack frame whose function or file contains the text (any case; `@` for text that would be another term) |
//! | `model.py:120` | entries with a frame at that line of a file whose name contains `model.py` |

use allocview_alloc::snapshot::{Frame, TraceAction, TraceEntry};

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
    /// Addresses whose hex digits (without leading zeros) start with the `digits` digits of
    /// `value` (all of an address's digits: that address).
    Address {
        /// The digits typed, as a number.
        value: u64,
        /// How many digits were typed (leading zeros dropped; at least 1).
        digits: u32,
    },
    /// Entries with a stack frame that matches.
    Frame(FrameNeedle),
}

/// What a [`Term::Frame`] looks for in each frame, ASCII case ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameNeedle {
    /// Text the function's name or the file's name contains.
    pub text: String,
    /// The frame's line, for `file:line` (then `text` is sought in the file's name only).
    pub line: Option<i64>,
}

impl FrameNeedle {
    /// The needle typed as `text` (`file.py:120` names a line).
    fn parse(text: &str) -> FrameNeedle {
        match text.rsplit_once(':') {
            Some((file, line)) if !file.is_empty() => match line.parse() {
                Ok(line) => FrameNeedle {
                    text: file.to_string(),
                    line: Some(line),
                },
                Err(_) => FrameNeedle {
                    text: text.to_string(),
                    line: None,
                },
            },
            _ => FrameNeedle {
                text: text.to_string(),
                line: None,
            },
        }
    }

    /// Whether some frame of `frames` matches.
    fn matches(&self, frames: &[Frame]) -> bool {
        frames.iter().any(|f| match self.line {
            Some(line) => f.line == line && contains_ignore_case(&f.filename, &self.text),
            None => {
                contains_ignore_case(&f.name, &self.text)
                    || contains_ignore_case(&f.filename, &self.text)
            }
        })
    }
}

/// Whether `hay` contains `needle`, ASCII case ignored (no allocation: the filter runs over
/// every frame of every entry).
fn contains_ignore_case(hay: &str, needle: &str) -> bool {
    let (hay, needle) = (hay.as_bytes(), needle.as_bytes());
    needle.is_empty()
        || hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
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

/// Whether the hex digits of `addr` (without leading zeros) start with the `digits` digits
/// of `value`.
fn hex_prefix(addr: u64, value: u64, digits: u32) -> bool {
    let len = (u64::BITS - addr.leading_zeros()).div_ceil(4).max(1);
    len >= digits && addr >> (4 * (len - digits)) == value
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
            let term = if let Some(text) = t.strip_prefix('@') {
                if text.is_empty() {
                    return Err(FilterError {
                        term: t.to_string(),
                        why: "expected the text of a stack frame after @".into(),
                    });
                }
                Term::Frame(FrameNeedle::parse(text))
            } else if let Some(hex) = lower.strip_prefix("0x") {
                if hex.is_empty() || hex.len() > 16 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(FilterError {
                        term: t.to_string(),
                        why: "not a hex address (or its first digits)".into(),
                    });
                }
                let digits = hex.trim_start_matches('0');
                Term::Address {
                    // At most 16 hex digits: always a u64.
                    value: u64::from_str_radix(hex, 16).unwrap_or(0),
                    digits: digits.len().max(1) as u32,
                }
            } else if let Some(n) = lower.strip_prefix("stream:").or_else(|| {
                lower
                    .strip_prefix('s')
                    .filter(|r| r.chars().all(|c| c.is_ascii_digit()) && !r.is_empty())
            }) {
                Term::Stream(n.parse().map_err(|_| FilterError {
                    term: t.to_string(),
                    why: "not a stream number".into(),
                })?)
            } else if let Some(r) = lower.strip_prefix(">=") {
                Term::Size(size(t, r)?, u64::MAX)
            } else if let Some(r) = lower.strip_prefix('>') {
                Term::Size(size(t, r)?.saturating_add(1), u64::MAX)
            } else if let Some(r) = lower.strip_prefix("<=") {
                Term::Size(0, size(t, r)?)
            } else if let Some(r) = lower.strip_prefix('<') {
                // `<0` matches nothing (an empty range).
                match size(t, r)?.checked_sub(1) {
                    Some(hi) => Term::Size(0, hi),
                    None => Term::Size(1, 0),
                }
            } else if let Some((a, b)) = lower.split_once("..") {
                Term::Size(size(t, a)?, size(t, b)?)
            } else if lower.starts_with(|c: char| c.is_ascii_digit())
                && let Ok(n) = units::parse_size(&lower)
            {
                Term::Size(n, n)
            } else if TraceAction::ALL
                .iter()
                .any(|a| a.as_str().starts_with(&lower))
            {
                Term::Action(lower)
            } else if t.contains(|c: char| c.is_alphanumeric()) {
                Term::Frame(FrameNeedle::parse(t))
            } else {
                return Err(FilterError {
                    term: t.to_string(),
                    why: "expected an action (alloc, free, segment, oom...), sN, SIZE, >SIZE, \
                          <SIZE, A..B, 0xADDR or the text of a stack frame"
                        .into(),
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

    /// Whether an entry passes: some term of each kind present matches (every size bound).
    pub fn matches(&self, e: &TraceEntry) -> bool {
        // Per kind (action, stream, address, frame): whether the filter has a term of it,
        // and whether one of them matched.
        let mut seen = [false; 4];
        let mut hit = [false; 4];
        for t in &self.terms {
            let (kind, matched) = match t {
                Term::Size(lo, hi) if !(*lo..=*hi).contains(&e.size) => return false,
                Term::Size(..) => continue,
                Term::Action(p) => (0, e.action.as_str().starts_with(p.as_str())),
                Term::Stream(s) => (1, e.stream == *s),
                Term::Address { value, digits } => (2, hex_prefix(e.addr, *value, *digits)),
                // A frame term that already matched need not search again.
                Term::Frame(_) if hit[3] => continue,
                Term::Frame(n) => (3, n.matches(&e.frames)),
            };
            seen[kind] = true;
            hit[kind] |= matched;
        }
        seen.iter().zip(hit).all(|(&s, h)| !s || h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    /// An allocation of 512 bytes made in `frames` (function, file, line).
    fn made_in(frames: &[(&str, &str, i64)]) -> TraceEntry {
        TraceEntry {
            frames: Arc::from(
                frames
                    .iter()
                    .map(|&(n, f, l)| Frame::new(n, f, l))
                    .collect::<Vec<_>>(),
            ),
            ..TraceEntry::new(TraceAction::Alloc, 0x1000, 512, 0)
        }
    }

    #[test]
    fn words_that_are_no_other_term_search_the_stack_frames() {
        let attn = made_in(&[
            ("forward", "/src/model/attention.py", 120),
            ("train_step", "/src/train.py", 40),
        ]);
        let mlp = made_in(&[("forward", "/src/model/mlp.py", 88)]);
        let bare = TraceEntry::new(TraceAction::Alloc, 0x1000, 512, 0);
        let hits = |text: &str| {
            let f = TraceFilter::parse(text).unwrap();
            [&attn, &mlp, &bare].map(|e| f.matches(e))
        };
        // A function's name or a file's, any case.
        assert_eq!(hits("forward"), [true, true, false]);
        assert_eq!(hits("Attention"), [true, false, false]);
        assert_eq!(hits("TRAIN_STEP"), [true, false, false]);
        // A file and line.
        assert_eq!(hits("attention.py:120"), [true, false, false]);
        assert_eq!(hits("attention.py:121"), [false, false, false]);
        // Frame terms are alternatives, and combine with the others.
        assert_eq!(hits("mlp.py attention"), [true, true, false]);
        assert_eq!(hits("mlp alloc >256"), [false, true, false]);
        assert_eq!(hits("mlp free"), [false, false, false]);
        // A bare size is an exact size, not a frame's text.
        assert_eq!(hits("512"), [true, true, true]);
        assert_eq!(hits("0.5KiB mlp"), [false, true, false]);
        assert_eq!(hits("513"), [false, false, false]);
        // `@` searches frames for a word that is another term (`alloc` is an action).
        let allocs = made_in(&[("alloc_cache", "/src/kv.py", 7)]);
        assert!(TraceFilter::parse("@alloc").unwrap().matches(&allocs));
        assert!(!TraceFilter::parse("@alloc").unwrap().matches(&attn));
        assert!(TraceFilter::parse("alloc").unwrap().matches(&attn));
    }

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
    fn terms_of_one_kind_are_alternatives_and_addresses_match_by_their_first_digits() {
        let at = |action, addr, size, stream| TraceEntry::new(action, addr, size, stream);
        let f = TraceFilter::parse("alloc free_requested s0 s1").unwrap();
        assert!(f.matches(&at(TraceAction::Alloc, 0, 512, 1)));
        assert!(f.matches(&at(TraceAction::FreeRequested, 0, 512, 0)));
        assert!(!f.matches(&at(TraceAction::FreeCompleted, 0, 512, 0)));
        assert!(!f.matches(&at(TraceAction::Alloc, 0, 512, 2)));
        // `>` and `<` are strict, `>=` and `<=` are not.
        let kib = at(TraceAction::Alloc, 0, 1024, 0);
        for (text, hit) in [
            (">1KiB", false),
            (">=1KiB", true),
            ("<1KiB", false),
            ("<=1KiB", true),
        ] {
            assert_eq!(
                TraceFilter::parse(text).unwrap().matches(&kib),
                hit,
                "{text}"
            );
        }
        // Size bounds narrow each other.
        let f = TraceFilter::parse(">1KiB <4KiB").unwrap();
        assert!(f.matches(&at(TraceAction::Alloc, 0, 2048, 0)));
        assert!(!f.matches(&at(TraceAction::Alloc, 0, 8192, 0)));
        // The first digits of an address, or all of them.
        let block = at(TraceAction::Alloc, 0x7fe6_0e20_0000, 512, 0);
        for hit in ["0x7fe60e", "0x7FE60E200000", "0x7", "0x00007fe6"] {
            assert!(TraceFilter::parse(hit).unwrap().matches(&block), "{hit}");
        }
        for miss in ["0x7fe60f", "0x7fe60e2000001", "0x8"] {
            assert!(!TraceFilter::parse(miss).unwrap().matches(&block), "{miss}");
        }
        assert!(
            TraceFilter::parse("0x0")
                .unwrap()
                .matches(&at(TraceAction::Oom, 0, 0, 0))
        );
        assert!(TraceFilter::parse("0x").is_err());
        assert!(TraceFilter::parse("0x12345678901234567").is_err());
    }

    #[test]
    fn bad_terms_are_named() {
        let e = TraceFilter::parse("alloc @").unwrap_err();
        assert_eq!(e.term, "@");
        assert!(TraceFilter::parse("s1x").is_ok(), "a frame's text");
        assert!(TraceFilter::parse("stream:x").is_err());
        assert_eq!(TraceFilter::parse("~").unwrap_err().term, "~");
        assert!(TraceFilter::parse(">lots").is_err());
        assert!(TraceFilter::parse("0xzz").is_err());
    }
}
