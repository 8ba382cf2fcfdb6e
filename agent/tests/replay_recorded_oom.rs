//! Replay of an OOM dump recorded with full history: before reporting an OOM the caching
//! allocator releases its cached segments and retries (`release_cached_blocks` in PyTorch's
//! CUDACachingAllocator.cpp; spec "Malloc" 5(d)), so the trace has
//! `segment_free` entries directly before the `oom`. The recording is made here by a
//! `CachingAllocator` on a `SimBackend` with history on; the fidelity replay must release the
//! same segments, end with the recorded segments, and so give `summary` its peaks.

#[path = "support/layout.rs"]
mod layout;

use std::sync::Arc;

use allocview_agent::replay::{self, ReplaySettings, RunOptions};
use allocview_agent::summary::{StatsWindow, summarize};
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::stats::DeviceStats;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, ContextLevel, HistoryOptions};
use allocview_alloc::snapshot::{Snapshot, TraceAction};
use layout::layout;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The block cached before the OOM (its own segment, released by the allocator's retry).
const CACHED: u64 = 100 * MIB;
/// The live block that fills most of the device.
const LIVE: u64 = 800 * MIB;
/// The request that fails even after the cache is released (1 GiB - 800 MiB = 224 MiB free).
const TOO_BIG: u64 = 300 * MIB;
/// An allocation after the OOM: the recording needs a new segment for it (its cache is gone).
const AFTER: u64 = 50 * MIB;

/// Records the workload on a 1 GiB simulated device: cache a 100 MiB segment, hold 800 MiB,
/// ask for 300 MiB (the allocator frees the cached segment, retries, and reports an OOM), then
/// allocate 50 MiB. Returns the OOM dump (segments and full trace) and the allocator's stats.
fn recorded_oom_dump() -> (Snapshot, DeviceStats) {
    record(true)
}

/// The workload of [`recorded_oom_dump`], the 50 MiB allocation after the OOM only when
/// `allocate_after` (without it the dump ends at the OOM, as an OOM observer's dump does).
fn record(allocate_after: bool) -> (Snapshot, DeviceStats) {
    let alloc = CachingAllocator::new(Arc::new(SimBackend::new(GIB)), AllocatorConfig::default());
    alloc.record_history(HistoryOptions {
        enabled: true,
        context: ContextLevel::Never,
        max_entries: 1024,
    });
    let s = StreamId::DEFAULT;
    let cached = alloc.malloc(CACHED, s).unwrap();
    alloc.free(cached).unwrap();
    let _live = alloc.malloc(LIVE, s).unwrap();
    let err = alloc.malloc(TOO_BIG, s).unwrap_err();
    assert!(err.out_of_memory().is_some(), "{err}");
    if allocate_after {
        alloc.malloc(AFTER, s).unwrap();
    }
    alloc.snapshot_with_stats()
}

fn actions(snap: &Snapshot) -> Vec<TraceAction> {
    snap.device_traces[0].iter().map(|e| e.action).collect()
}

#[test]
fn the_recording_frees_its_cached_segment_and_then_records_the_oom() {
    use TraceAction::*;
    let (snap, _) = recorded_oom_dump();
    assert_eq!(
        actions(&snap),
        vec![
            SegmentAlloc,
            Alloc,
            FreeRequested,
            FreeCompleted,
            SegmentAlloc,
            Alloc,
            SegmentFree,
            Oom,
            SegmentAlloc,
            Alloc,
        ]
    );
    let trace = &snap.device_traces[0];
    assert_eq!(trace[6].size, CACHED);
    assert_eq!(trace[7].size, TOO_BIG);
}

#[test]
fn the_fidelity_replay_releases_the_cache_before_a_recorded_oom_and_ends_with_the_recorded_segments()
 {
    let (snap, _) = recorded_oom_dump();
    let out = replay::replay(&snap, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    let f = &out.report.fidelity;
    assert!(f.first_divergence.is_none(), "{f:?}");
    assert_eq!(f.allocs, 3, "{f:?}");
    assert_eq!(f.allocs_at_recorded_address, 3, "{f:?}");
    assert_eq!(f.segment_allocs_of_recorded_size, 3, "{f:?}");
    assert_eq!(f.final_state_matches, Some(true), "{f:?}");
    assert!(f.reproduced());
    assert_eq!(layout(&out.replayed), layout(&snap));
    // The recorded OOM is diagnosed at the state the recording had: the cache released.
    let oom = out.report.runs[0].first_oom.as_ref().unwrap();
    assert_eq!(oom.index, 7);
    assert_eq!(oom.requested, TOO_BIG);
}

#[test]
fn a_dump_that_ends_at_the_oom_replays_to_its_recorded_segments() {
    let (snap, _) = record(false);
    assert_eq!(actions(&snap).last(), Some(&TraceAction::Oom));
    let out = replay::replay(&snap, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    let f = &out.report.fidelity;
    assert!(f.first_divergence.is_none(), "{f:?}");
    assert_eq!(f.final_state_matches, Some(true), "{f:?}");
    assert_eq!(layout(&out.replayed), layout(&snap));
    assert_eq!(
        layout(&snap),
        vec![(snap.segments[0].address, LIVE, vec![(LIVE, true)])]
    );
}

#[test]
fn the_replayed_stats_over_the_trace_equal_the_recording_and_summary_knows_the_peaks() {
    let (snap, recorded) = recorded_oom_dump();
    let opts = RunOptions::fidelity(&snap, None, false).unwrap();
    let run = replay::engine::run(&snap, &opts, &mut |_| {}).unwrap();
    assert!(run.fidelity.reproduced(), "{:?}", run.fidelity);
    assert_eq!(run.stats.reserved_bytes, recorded.reserved_bytes);
    assert_eq!(run.stats.allocated_bytes, recorded.allocated_bytes);
    assert_eq!(run.stats.segment, recorded.segment);
    assert_eq!(run.figures.peak_reserved, CACHED + LIVE);

    let summary = summarize(&snap);
    match &summary.devices[0].window {
        StatsWindow::Trace {
            peak_reserved,
            peak_allocated,
            ..
        } => {
            assert_eq!(*peak_reserved, CACHED + LIVE);
            assert_eq!(*peak_allocated, LIVE + AFTER);
        }
        other => panic!("summary does not know the peaks: {other:?}"),
    }
    // The memory summary's header counts the trace's OOM; a replay cannot tell retries apart.
    let text = &summary.devices[0].memory_summary;
    let counters = text.lines().find(|l| l.contains("CUDA OOMs")).unwrap();
    assert!(
        counters.contains("CUDA OOMs: 1 ") && counters.contains("cudaMalloc retries: not known"),
        "{counters}"
    );
    assert_eq!(
        counters.chars().count(),
        text.lines().next().unwrap().chars().count()
    );
}

#[test]
fn a_what_if_under_the_recorded_settings_meets_the_oom_again_and_ends_the_same() {
    let (snap, _) = recorded_oom_dump();
    let opts = RunOptions::what_if(AllocatorConfig::default(), "defaults", Some(GIB), true);
    let r = replay::engine::run(&snap, &opts, &mut |_| {}).unwrap();
    assert_eq!(r.figures.ooms, 1, "{:?}", r.figures);
    assert_eq!(r.figures.first_oom.as_ref().unwrap().index, 7);
    assert_eq!(r.unmapped_frees, 0);
    assert_eq!(layout(&r.snapshot.unwrap()), layout(&snap));
}
