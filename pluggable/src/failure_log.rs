//! [`FailureLog`]: each kind of failure is logged once (to stderr and through `tracing`), and
//! every occurrence is counted.
//!
//! A C caller cannot receive a Rust error: `allocview_malloc` can only return null. The reason
//! must still reach the user, but an allocator called thousands of times a second must not
//! flood the terminal with the same line, so the first failure of each kind is printed, with a
//! note that later ones are only counted ([`FailureLog::count`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The library could not start (settings, backend, agent).
    Start,
    /// A device could not be opened, or an unknown device was named.
    Device,
    /// An allocation ran out of device memory.
    OutOfMemory,
    /// An allocation failed for another reason (bad size, device error).
    Malloc,
    /// A free failed (unknown pointer, device error).
    Free,
    /// Emptying the cache failed.
    EmptyCache,
    /// Statistics could not be produced.
    Stats,
    /// A panic was caught at the C boundary.
    Panic,
}

impl Failure {
    /// Number of kinds.
    pub const COUNT: usize = 8;

    fn label(self) -> &'static str {
        match self {
            Failure::Start => "startup failed",
            Failure::Device => "device unavailable",
            Failure::OutOfMemory => "out of memory",
            Failure::Malloc => "allocation failed",
            Failure::Free => "free failed",
            Failure::EmptyCache => "empty_cache failed",
            Failure::Stats => "memory stats failed",
            Failure::Panic => "internal panic caught at the C boundary",
        }
    }
}

/// Counts failures per kind and logs the first of each.
#[derive(Debug)]
pub struct FailureLog {
    counts: [AtomicU64; Failure::COUNT],
}

impl Default for FailureLog {
    fn default() -> Self {
        Self::new()
    }
}

impl FailureLog {
    /// Nothing counted yet.
    pub const fn new() -> FailureLog {
        FailureLog {
            counts: [const { AtomicU64::new(0) }; Failure::COUNT],
        }
    }

    /// Counts one failure of `kind`; the first of its kind is logged with `reason`. Returns
    /// whether this call logged.
    pub fn report(&self, kind: Failure, reason: &dyn fmt::Display) -> bool {
        let first = self.counts[kind as usize].fetch_add(1, Relaxed) == 0;
        if first {
            let line = format!(
                "allocview: {}: {reason} (further failures of this kind are counted, not logged)",
                kind.label()
            );
            eprintln!("{line}");
            tracing::error!(target: "allocview", "{line}");
        }
        first
    }

    /// Failures of `kind` so far.
    pub fn count(&self, kind: Failure) -> u64 {
        self.counts[kind as usize].load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_failure_of_a_kind_is_logged_but_all_are_counted() {
        let log = FailureLog::new();
        assert!(log.report(Failure::OutOfMemory, &"no room"));
        assert!(!log.report(Failure::OutOfMemory, &"no room"));
        assert!(log.report(Failure::Free, &"bad pointer"));
        assert_eq!(log.count(Failure::OutOfMemory), 2);
        assert_eq!(log.count(Failure::Free), 1);
        assert_eq!(log.count(Failure::Panic), 0);
    }
}
