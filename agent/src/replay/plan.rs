//! What replay needs to know about a trace before it starts: which frees another stream held
//! up, and which runs of `segment_free` the program asked for.
//!
//! - A `free_requested` whose `free_completed` is not the very next entry was deferred: another
//!   stream used the block (`record_stream`), and the allocator completed the free later, when
//!   it found that stream's event done (spec "Free"). Replay emulates it with a helper stream
//!   whose work finishes at the recorded `free_completed`.
//! - A run of `segment_free` entries is an `empty_cache` (the program's call, or the allocator's
//!   own last-chance retry, spec "Malloc" 5(d)). A run directly followed by a `segment_alloc` or
//!   an `oom` is taken for a retry: the allocation after it failed on the device first.

use std::collections::HashMap;

use allocview_alloc::snapshot::{TraceAction, TraceEntry};

/// How replay treats a run of `segment_free` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeRun {
    /// The program called `empty_cache`.
    EmptyCache,
    /// The allocator's own retry (the allocation after the run needed the memory).
    Retry,
}

/// Facts about each entry of a trace, computed in one pass.
#[derive(Debug, Clone, Default)]
pub struct TracePlan {
    /// For each `free_requested`: whether its completion was deferred (not the next entry).
    deferred: Vec<bool>,
    /// For the first `segment_free` of each run: what the run was.
    runs: HashMap<usize, FreeRun>,
    /// Distinct stream ids the trace names, in first-seen order.
    pub streams: Vec<u64>,
}

impl TracePlan {
    /// Analyses a trace.
    pub fn new(entries: &[TraceEntry]) -> TracePlan {
        let mut deferred = vec![false; entries.len()];
        let mut runs = HashMap::new();
        let mut streams = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if !streams.contains(&e.stream) {
                streams.push(e.stream);
            }
            match e.action {
                TraceAction::FreeRequested => {
                    let next_completes = entries.get(i + 1).is_some_and(|n| {
                        n.action == TraceAction::FreeCompleted && n.addr == e.addr
                    });
                    deferred[i] = !next_completes;
                }
                TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                    let first = i == 0 || !is_release(entries[i - 1].action);
                    if first {
                        let after = entries[i..]
                            .iter()
                            .find(|n| !is_release(n.action))
                            .map(|n| n.action);
                        let kind = match after {
                            Some(
                                TraceAction::SegmentAlloc
                                | TraceAction::SegmentMap
                                | TraceAction::Oom,
                            ) => FreeRun::Retry,
                            _ => FreeRun::EmptyCache,
                        };
                        runs.insert(i, kind);
                    }
                }
                _ => {}
            }
        }
        TracePlan {
            deferred,
            runs,
            streams,
        }
    }

    /// Whether the `free_requested` at `index` completed later than at once.
    pub fn is_deferred(&self, index: usize) -> bool {
        self.deferred.get(index).copied().unwrap_or(false)
    }

    /// The kind of the `segment_free` run that starts at `index`, if one does.
    pub fn free_run(&self, index: usize) -> Option<FreeRun> {
        self.runs.get(&index).copied()
    }
}

fn is_release(a: TraceAction) -> bool {
    matches!(a, TraceAction::SegmentFree | TraceAction::SegmentUnmap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(action: TraceAction, addr: u64, stream: u64) -> TraceEntry {
        TraceEntry::new(action, addr, 512, stream)
    }

    #[test]
    fn a_free_completed_later_than_the_next_entry_is_deferred() {
        use TraceAction::*;
        let t = [
            e(Alloc, 1, 0),
            e(FreeRequested, 1, 0),
            e(FreeCompleted, 1, 0),
            e(Alloc, 2, 7),
            e(FreeRequested, 2, 7),
            e(Alloc, 3, 7),
            e(FreeCompleted, 2, 7),
        ];
        let p = TracePlan::new(&t);
        assert!(!p.is_deferred(1));
        assert!(p.is_deferred(4));
        assert_eq!(p.streams, vec![0, 7]);
    }

    #[test]
    fn a_segment_free_run_before_a_segment_alloc_is_a_retry_else_empty_cache() {
        use TraceAction::*;
        let t = [
            e(SegmentFree, 1, 0),
            e(SegmentFree, 2, 0),
            e(Alloc, 3, 0),
            e(SegmentFree, 4, 0),
            e(SegmentAlloc, 5, 0),
            e(Alloc, 5, 0),
            e(SegmentFree, 6, 0),
            e(Oom, 0, 0),
        ];
        let p = TracePlan::new(&t);
        assert_eq!(p.free_run(0), Some(FreeRun::EmptyCache));
        assert_eq!(p.free_run(1), None);
        assert_eq!(p.free_run(3), Some(FreeRun::Retry));
        assert_eq!(p.free_run(6), Some(FreeRun::Retry));
    }
}
