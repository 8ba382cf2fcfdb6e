//! Replay of the allocator's release of cached segments under memory pressure.
//!
//! When a `malloc` cannot get a new segment, PyTorch's CUDACachingAllocator first calls
//! `release_available_cached_blocks` (with `max_split_size` set, it frees cached oversize
//! blocks: the smallest single one at least as large as the request, else oversize ones from
//! the largest down until enough is freed), and only when that is not enough
//! `release_cached_blocks` (the whole cache); each freed segment leaves a `segment_free` entry
//! before the retry's `segment_alloc` (spec "Malloc" 5). A recording made on a device that other
//! users share (another process, the CUDA context: `SimBackend::set_external_usage` here) runs
//! out before the replay's device, which holds the allocator alone; the replay must still free
//! exactly the segments the recording freed, no more.

#[path = "support/layout.rs"]
mod layout;

use std::sync::Arc;

use allocview_agent::replay::{self, ReplaySettings, RunOptions};
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, ContextLevel, HistoryOptions};
use allocview_alloc::snapshot::{Snapshot, TraceAction};
use layout::layout;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The recording's `max_split_size`: blocks of at least this many MiB are oversize.
const MAX_SPLIT_CONF: &str = "max_split_size_mb:64";
/// A cached oversize segment that stays cached when a request needs only the larger one.
const OVERSIZE_SMALLER: u64 = 200 * MIB;
/// The cached oversize segment `release_available_cached_blocks` frees for [`REQUEST`].
const OVERSIZE_LARGER: u64 = 300 * MIB;
/// A cached segment below `max_split_size`: only emptying the whole cache frees it.
const ORDINARY: u64 = 40 * MIB;
/// Everything the allocator caches before the request.
const CACHED: u64 = OVERSIZE_SMALLER + OVERSIZE_LARGER + ORDINARY;
/// Memory other users hold on the recording's 1 GiB device: 100 MiB stays free.
const EXTERNAL: u64 = GIB - CACHED - 100 * MIB;
/// A request that needs a new segment: releasing the 300 MiB oversize segment is enough.
const REQUEST: u64 = 250 * MIB;
/// A request that releasing every oversize segment (500 MiB) does not satisfy: the whole cache
/// goes.
const LARGE_REQUEST: u64 = 620 * MIB;
/// An allocation after the release, served by the recording's cached 40 MiB segment.
const AFTER: u64 = 30 * MIB;
/// An allocation after the whole cache went: a new segment in the 20 MiB the device has left.
const AFTER_LARGE: u64 = 10 * MIB;

/// Records, on a 1 GiB simulated device under `conf`: three segments cached (200 and 300 MiB,
/// oversize under [`MAX_SPLIT_CONF`], and 40 MiB), other users taking [`EXTERNAL`], then
/// `request` and `after`.
fn record(conf: &str, request: u64, after: u64) -> Snapshot {
    let sim = Arc::new(SimBackend::new(GIB));
    let alloc = CachingAllocator::new(Arc::clone(&sim), AllocatorConfig::parse(conf).unwrap());
    alloc.record_history(HistoryOptions {
        enabled: true,
        context: ContextLevel::Never,
        max_entries: 1024,
    });
    let s = StreamId::DEFAULT;
    let cached: Vec<_> = [OVERSIZE_SMALLER, OVERSIZE_LARGER, ORDINARY]
        .iter()
        .map(|&size| alloc.malloc(size, s).unwrap())
        .collect();
    for p in cached {
        alloc.free(p).unwrap();
    }
    sim.set_external_usage(EXTERNAL);
    alloc.malloc(request, s).unwrap();
    alloc.malloc(after, s).unwrap();
    alloc.snapshot()
}

/// The recorded `segment_free` sizes, in order.
fn released(snap: &Snapshot) -> Vec<u64> {
    snap.device_traces[0]
        .iter()
        .filter(|e| e.action == TraceAction::SegmentFree)
        .map(|e| e.size)
        .collect()
}

/// Replays `snap` (fidelity run) with `device_memory` and checks it reproduces the recording:
/// no divergence, every allocation at its recorded address, and the recorded final segments.
fn assert_reproduced(snap: &Snapshot, device_memory: Option<u64>) {
    let settings = ReplaySettings {
        device_memory,
        ..ReplaySettings::default()
    };
    let out = replay::replay(snap, &settings, &mut |_, _| {}).unwrap();
    let f = &out.report.fidelity;
    assert!(f.first_divergence.is_none(), "{f:?}");
    assert_eq!(f.allocs, f.allocs_at_recorded_address, "{f:?}");
    assert_eq!(f.segment_allocs, f.segment_allocs_of_recorded_size, "{f:?}");
    assert_eq!(f.final_state_matches, Some(true), "{f:?}");
    assert!(f.reproduced(), "{f:?}");
    assert_eq!(layout(&out.replayed), layout(snap));
    assert_eq!(out.report.runs[0].ooms, 0);
}

#[test]
fn the_recording_releases_only_the_oversize_segment_the_request_needs() {
    let snap = record(MAX_SPLIT_CONF, REQUEST, AFTER);
    assert_eq!(released(&snap), vec![OVERSIZE_LARGER]);
    // The 200 MiB oversize segment and the 40 MiB one stay cached; the 30 MiB request after
    // splits the 40 MiB one.
    let sizes: Vec<u64> = layout(&snap).iter().map(|s| s.1).collect();
    let mut expected = vec![OVERSIZE_SMALLER, ORDINARY, REQUEST];
    expected.sort();
    let mut got = sizes.clone();
    got.sort();
    assert_eq!(got, expected);
}

#[test]
fn a_fidelity_replay_of_a_partial_oversize_release_frees_only_the_released_segment() {
    let snap = record(MAX_SPLIT_CONF, REQUEST, AFTER);
    assert_reproduced(&snap, None);
}

#[test]
fn a_partial_oversize_release_replays_exactly_on_a_device_larger_than_the_recordings() {
    let snap = record(MAX_SPLIT_CONF, REQUEST, AFTER);
    assert_reproduced(&snap, Some(4 * GIB));
}

#[test]
fn a_partial_oversize_release_replays_exactly_when_the_file_names_no_device_size() {
    let mut snap = record(MAX_SPLIT_CONF, REQUEST, AFTER);
    for d in &mut snap.devices {
        d.total_memory = None;
    }
    assert_reproduced(&snap, None);
}

#[test]
fn a_what_if_under_the_recorded_settings_releases_the_same_oversize_segment() {
    let snap = record(MAX_SPLIT_CONF, REQUEST, AFTER);
    let opts = RunOptions::what_if(
        AllocatorConfig::parse(MAX_SPLIT_CONF).unwrap(),
        MAX_SPLIT_CONF,
        Some(GIB),
        true,
    );
    let r = replay::engine::run(&snap, &opts, &mut |_| {}).unwrap();
    assert_eq!(r.figures.ooms, 0, "{:?}", r.figures);
    let replayed = r.snapshot.unwrap();
    assert_eq!(released(&replayed), released(&snap));
    assert_eq!(layout(&replayed), layout(&snap));
}

#[test]
fn when_releasing_the_oversize_segments_is_not_enough_the_recording_empties_the_whole_cache() {
    let snap = record(MAX_SPLIT_CONF, LARGE_REQUEST, AFTER_LARGE);
    assert_eq!(
        released(&snap),
        vec![OVERSIZE_LARGER, OVERSIZE_SMALLER, ORDINARY]
    );
}

#[test]
fn a_whole_cache_release_after_an_insufficient_oversize_release_replays_exactly() {
    let snap = record(MAX_SPLIT_CONF, LARGE_REQUEST, AFTER_LARGE);
    assert_reproduced(&snap, None);
    assert_reproduced(&snap, Some(4 * GIB));
}

#[test]
fn a_default_settings_recording_that_empties_its_cache_under_pressure_replays_exactly() {
    // No max_split_size: no cached block is oversize, and a request larger than every cached
    // block gets its segment only after the whole cache is released.
    let snap = record("", 350 * MIB, AFTER_LARGE);
    let mut expected = vec![OVERSIZE_SMALLER, OVERSIZE_LARGER, ORDINARY];
    let mut got = released(&snap);
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
    assert_reproduced(&snap, None);
    assert_reproduced(&snap, Some(4 * GIB));
}
