//! Replay of a recording made with expandable segments (`expandable_segments:True`).
//!
//! An expandable segment is one reserved virtual range whose front grows by `segment_map` and
//! whose free pages go back by `segment_unmap` (PyTorch's CUDACachingAllocator.cpp,
//! `ExpandableSegment`; spec "Expandable segments"); a snapshot reports each mapped run of it
//! as one segment with `is_expandable`. A trace that starts from an empty allocator maps every
//! byte the final segments hold, so the state at its first entry is empty, and the fidelity
//! replay must follow the recording allocation by allocation.

#[path = "support/layout.rs"]
mod layout;

use std::sync::Arc;

use allocview_agent::replay::{self, InitialState, ReplaySettings};
use allocview_agent::summary::{StatsWindow, summarize};
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, HistoryOptions};
use allocview_alloc::snapshot::{Snapshot, TraceAction};
use layout::layout;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The recording's settings.
const EXPANDABLE: &str = "expandable_segments:True";
/// Blocks allocated in the first phase (each maps more of the segment).
const GROW: [u64; 4] = [100 * MIB, 150 * MIB, 60 * MIB, 200 * MIB];
/// The request that fails on the 1 GiB device.
const TOO_BIG: u64 = 900 * MIB;

/// Records on a 1 GiB simulated device with expandable segments: grow the segment, free two
/// blocks, shrink it with `empty_cache`, grow again, allocate small blocks (the small pool's
/// own expandable segment), ask for more than the device has, and finally unmap a hole in
/// the middle of the segment.
fn record() -> Snapshot {
    let alloc = CachingAllocator::new(
        Arc::new(SimBackend::new(GIB)),
        AllocatorConfig::parse(EXPANDABLE).unwrap(),
    );
    alloc.record_history(HistoryOptions::default());
    let s = StreamId::DEFAULT;
    let ps: Vec<_> = GROW.iter().map(|&n| alloc.malloc(n, s).unwrap()).collect();
    alloc.free(ps[1]).unwrap();
    alloc.free(ps[3]).unwrap();
    alloc.empty_cache().unwrap();
    let a = alloc.malloc(120 * MIB, s).unwrap();
    let _b = alloc.malloc(300 * MIB, s).unwrap();
    let small: Vec<_> = (0..5)
        .map(|i| alloc.malloc(1000 + i * 4096, s).unwrap())
        .collect();
    alloc.free(small[2]).unwrap();
    let err = alloc.malloc(TOO_BIG, s).unwrap_err();
    assert!(err.out_of_memory().is_some(), "{err}");
    let after = alloc.malloc(30 * MIB, s).unwrap();
    // A hole in the middle: the mapped run after it starts inside an earlier mapping.
    alloc.free(a).unwrap();
    alloc.free(after).unwrap();
    alloc.empty_cache().unwrap();
    alloc.snapshot()
}

fn count(snap: &Snapshot, action: TraceAction) -> usize {
    snap.device_traces[0]
        .iter()
        .filter(|e| e.action == action)
        .count()
}

#[test]
fn the_recording_maps_and_unmaps_and_reports_expandable_segments() {
    let snap = record();
    assert!(count(&snap, TraceAction::SegmentMap) >= 4);
    assert!(count(&snap, TraceAction::SegmentUnmap) >= 1);
    assert_eq!(count(&snap, TraceAction::Oom), 1);
    assert!(snap.segments.iter().all(|s| s.is_expandable));
    // A final mapped run that starts at no recorded mapping's address.
    let mapped_at: Vec<u64> = snap.device_traces[0]
        .iter()
        .filter(|e| e.action == TraceAction::SegmentMap)
        .map(|e| e.addr)
        .collect();
    assert!(
        snap.segments
            .iter()
            .any(|s| !mapped_at.contains(&s.address)),
        "{:?}",
        layout(&snap)
    );
}

#[test]
fn a_trace_recorded_from_an_empty_expandable_allocator_starts_from_an_empty_state() {
    let snap = record();
    let config = AllocatorConfig::parse(EXPANDABLE).unwrap();
    let s = InitialState::reconstruct(&snap, 0, 0, &|n| config.round_size(n));
    assert!(s.segments.is_empty(), "{s:?}");
    assert!(s.warnings.is_empty(), "{s:?}");
}

#[test]
fn the_fidelity_replay_of_an_expandable_recording_follows_every_recorded_address() {
    let snap = record();
    let out = replay::replay(&snap, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    let r = &out.report;
    assert_eq!(r.initial.segments, 0, "{:?}", r.initial);
    assert_eq!(r.initial.reserved, 0, "{:?}", r.initial);
    let f = &r.fidelity;
    assert!(f.allocs > 0);
    assert_eq!(f.allocs_at_recorded_address, f.allocs, "{f:?}");
    assert_eq!(f.final_state_matches, Some(true), "{f:?}");
    assert!(f.reproduced(), "{f:?}");
    assert_eq!(layout(&out.replayed), layout(&snap));
}

#[test]
fn summary_of_an_expandable_recording_knows_the_trace_window() {
    let snap = record();
    let summary = summarize(&snap);
    assert!(
        matches!(summary.devices[0].window, StatsWindow::Trace { .. }),
        "{:?}",
        summary.devices[0].window
    );
}

#[test]
fn a_what_if_under_the_recorded_expandable_settings_maps_as_often_as_the_recording() {
    let snap = record();
    let settings = ReplaySettings {
        configs: vec![EXPANDABLE.into()],
        ..ReplaySettings::default()
    };
    let out = replay::replay(&snap, &settings, &mut |_, _| {}).unwrap();
    let runs = &out.report.runs;
    assert_eq!(
        runs[0].device_mallocs,
        count(&snap, TraceAction::SegmentMap) as u64
    );
    assert_eq!(runs[1].device_mallocs, runs[0].device_mallocs, "{runs:?}");
    assert_eq!(runs[1].ooms, runs[0].ooms, "{runs:?}");
    assert_eq!(runs[1].peak_reserved, runs[0].peak_reserved, "{runs:?}");
}
