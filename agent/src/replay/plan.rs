//! What replay needs to know about a trace before it starts: which frees another stream held
//! up, and which runs of `segment_free` the program asked for.
//!
//! - A `free_requested` whose `free_completed` is not the very next entry was deferred: another
//!   stream used the block (`record_stream`), and the allocator completed the free later, when
//!   it found that stream's event done (spec "Free"). Replay emulates it with a helper stream
//!   whose work finishes at the recorded `free_completed`.
//! - A run of `segment_free` entries is the program's `empty_cache`, or the allocator's own
//!   release under pressure (spec "Malloc" 5: `release_available_cached_blocks`, then
//!   `release_cached_blocks`). A run directly followed by a `segment_alloc`, a `segment_map` or
//!   an `oom` is taken for a retry: the allocation after it failed on the device first. Not
//!   so when a segment the run released could have served that allocation (same stream and
//!   pool, large enough, and allowed by `max_split_size`: spec "Malloc" 2): the allocator looks
//!   in its cache before it asks the device, so it did not release that segment for this
//!   allocation; the program emptied the cache, and the allocation then needed a segment.

use std::collections::HashMap;

use allocview_alloc::caching::AllocatorConfig;
use allocview_alloc::snapshot::{TraceAction, TraceEntry};

use crate::replay::initial::{SMALL_BUFFER, SMALL_SIZE};

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
    /// For the first `segment_free` of each run: what the run was, and the index of the
    /// first entry after it.
    runs: HashMap<usize, (FreeRun, usize)>,
    /// Distinct stream ids the trace names, in first-seen order.
    pub streams: Vec<u64>,
}

impl TracePlan {
    /// Analyses a trace recorded under `recorded` (the allocator settings the recording was
    /// made with: they decide which cached segment could serve an allocation).
    pub fn new(entries: &[TraceEntry], recorded: &AllocatorConfig) -> TracePlan {
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
                        let len = entries[i..]
                            .iter()
                            .take_while(|n| is_release(n.action))
                            .count();
                        let run = &entries[i..i + len];
                        let kind = match entries.get(i + len).map(|n| n.action) {
                            Some(TraceAction::SegmentAlloc | TraceAction::SegmentMap)
                                if !released_one_that_fits(
                                    run,
                                    next_alloc(&entries[i + len..]),
                                    recorded,
                                ) =>
                            {
                                FreeRun::Retry
                            }
                            Some(TraceAction::Oom) => FreeRun::Retry,
                            _ => FreeRun::EmptyCache,
                        };
                        runs.insert(i, (kind, i + len));
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
        self.free_run_span(index).map(|(kind, _)| kind)
    }

    /// The kind of the `segment_free` run that starts at `index`, if one does, and the index of
    /// the first entry after the run (the trace's length when the run ends it).
    pub fn free_run_span(&self, index: usize) -> Option<(FreeRun, usize)> {
        self.runs.get(&index).copied()
    }
}

/// The allocation a `segment_alloc` (or `segment_map`) at the start of `rest` was for: the
/// first `alloc` after it.
fn next_alloc(rest: &[TraceEntry]) -> Option<&TraceEntry> {
    rest.iter().find(|n| n.action == TraceAction::Alloc)
}

/// Whether a whole cached segment `run` released (or, for expandable segments, a range it
/// unmapped) could have served `alloc` under `config`
/// (PyTorch's `get_free_block`: the same stream and pool, at least the rounded size, and not
/// an oversize block for a request below `max_split_size`, nor one `max_non_split_rounding`
/// or more beyond a request at or above it).
fn released_one_that_fits(
    run: &[TraceEntry],
    alloc: Option<&TraceEntry>,
    config: &AllocatorConfig,
) -> bool {
    let Some(alloc) = alloc else {
        return false;
    };
    let size = config.round_size(alloc.size);
    let small = size <= SMALL_SIZE;
    let max_split = config.max_split_size_or_max();
    // Expandable segments: an unmapped range lay inside one free block at least as large, so
    // a range of the rounded size means a cached block served the allocation. (A small-pool
    // range cannot be told from a large-pool one by its size: only large requests count.)
    let unmapped_fits = run.iter().any(|seg| {
        seg.action == TraceAction::SegmentUnmap
            && seg.stream == alloc.stream
            && !small
            && seg.size >= size
    });
    unmapped_fits
        || run
            .iter()
            .filter(|seg| seg.action == TraceAction::SegmentFree && seg.stream == alloc.stream)
            .any(|seg| {
                // Small-pool segments are all of kSmallBuffer; large-pool ones are larger.
                (seg.size <= SMALL_BUFFER) == small
                    && seg.size >= size
                    && !(size < max_split && seg.size >= max_split)
                    && !(size >= max_split
                        && seg.size >= size.saturating_add(config.max_non_split_rounding()))
            })
}

/// Whether `a` gives memory back to the device: `segment_free` (a whole segment) or
/// `segment_unmap` (pages of an expandable segment).
pub fn is_release(a: TraceAction) -> bool {
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
        let p = TracePlan::new(&t, &AllocatorConfig::default());
        assert!(!p.is_deferred(1));
        assert!(p.is_deferred(4));
        assert_eq!(p.streams, vec![0, 7]);
    }

    const MIB: u64 = 1 << 20;

    fn sized(action: TraceAction, addr: u64, size: u64) -> TraceEntry {
        TraceEntry::new(action, addr, size, 0)
    }

    #[test]
    fn a_segment_free_run_before_a_segment_alloc_is_a_retry_else_empty_cache() {
        use TraceAction::*;
        let t = [
            sized(SegmentFree, 1, 2 * MIB),
            sized(SegmentFree, 2, 20 * MIB),
            sized(Alloc, 3, 512),
            // A small-pool segment cannot serve a large request.
            sized(SegmentFree, 4, 2 * MIB),
            sized(SegmentAlloc, 5, 20 * MIB),
            sized(Alloc, 5, 5 * MIB),
            sized(SegmentFree, 6, 20 * MIB),
            sized(Oom, 0, 40 * MIB),
        ];
        let p = TracePlan::new(&t, &AllocatorConfig::default());
        assert_eq!(p.free_run(0), Some(FreeRun::EmptyCache));
        assert_eq!(p.free_run(1), None);
        assert_eq!(p.free_run(3), Some(FreeRun::Retry));
        assert_eq!(p.free_run(6), Some(FreeRun::Retry));
    }

    #[test]
    fn a_run_that_released_a_segment_the_next_allocation_fits_is_the_programs_empty_cache() {
        use TraceAction::*;
        let t = [
            sized(SegmentFree, 1, 10 * MIB),
            sized(SegmentAlloc, 2, 10 * MIB),
            sized(Alloc, 2, 10 * MIB),
        ];
        let p = TracePlan::new(&t, &AllocatorConfig::default());
        assert_eq!(p.free_run(0), Some(FreeRun::EmptyCache));
    }

    #[test]
    fn an_oversize_segment_does_not_fit_a_request_below_max_split_size() {
        use TraceAction::*;
        let t = [
            sized(SegmentFree, 1, 200 * MIB),
            sized(SegmentAlloc, 2, 30 * MIB),
            sized(Alloc, 2, 30 * MIB),
        ];
        let max_split = AllocatorConfig::parse("max_split_size_mb:64").unwrap();
        assert_eq!(
            TracePlan::new(&t, &max_split).free_run(0),
            Some(FreeRun::Retry)
        );
        assert_eq!(
            TracePlan::new(&t, &AllocatorConfig::default()).free_run(0),
            Some(FreeRun::EmptyCache)
        );
    }
}
