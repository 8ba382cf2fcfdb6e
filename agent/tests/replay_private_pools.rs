//! Replay of recordings that used private pools (CUDA graph captures, `torch.cuda.MemPool`):
//! PyTorch's trace entries do not say which pool an allocation went to, but the final
//! snapshot names each segment's pool (`segment_pool_id`), so an allocation inside a segment of
//! a private pool was routed there, and the replay routes it there too
//! (`begin_allocate_to_pool` around its `malloc`). Without that, the replay gave the capture's
//! allocation a cached block of the default pool that the recording could not use.

#[path = "support/layout.rs"]
mod layout;

use std::sync::Arc;

use allocview_agent::replay::{self, ReplaySettings, RunOptions};
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{
    AllocatorConfig, CachingAllocator, ContextLevel, HistoryOptions, PoolId,
};
use allocview_alloc::snapshot::Snapshot;
use layout::layout;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The graph's pool.
const GRAPH: PoolId = PoolId(1, 0);

/// Turns the allocator's history on.
fn record_history(alloc: &CachingAllocator<Arc<SimBackend>>) {
    alloc.record_history(HistoryOptions {
        enabled: true,
        context: ContextLevel::Never,
        max_entries: 4096,
    });
}

/// `size` allocated in the graph's pool, as inside a capture.
fn captured(alloc: &CachingAllocator<Arc<SimBackend>>, size: u64) -> u64 {
    alloc.begin_allocate_to_pool(GRAPH, |_| true);
    let p = alloc.malloc(size, StreamId::DEFAULT).unwrap();
    alloc.end_allocate_to_pool(GRAPH);
    p
}

/// A training step with a captured graph: an 8 MiB activation is cached in the default pool
/// (a 20 MiB segment), then the capture allocates 4 MiB, which must take a segment of its own
/// although the default pool's cached block fits; frees and allocations follow in both pools.
/// History starts at the beginning, or (`mid_run`) once the graph's segment exists and holds a
/// live block, so that the trace starts with a private segment in its initial state.
fn record(mid_run: bool) -> Snapshot {
    let sim = Arc::new(SimBackend::new(GIB));
    let alloc = CachingAllocator::new(Arc::clone(&sim), AllocatorConfig::default());
    if !mid_run {
        record_history(&alloc);
    }
    let s = StreamId::DEFAULT;
    let act = alloc.malloc(8 * MIB, s).unwrap();
    alloc.free(act).unwrap();
    let g1 = captured(&alloc, 4 * MIB);
    if mid_run {
        record_history(&alloc);
    }
    let g2 = captured(&alloc, 2 * MIB);
    alloc.free(g1).unwrap();
    // The default pool's cached 20 MiB block fits this; the graph's 14 MiB free block too, but
    // it is not the default pool's.
    let act2 = alloc.malloc(6 * MIB, s).unwrap();
    // Back in the graph's pool: its free 4 MiB block, not the default pool's remainder.
    let g3 = captured(&alloc, 3 * MIB);
    alloc.free(act2).unwrap();
    alloc.free(g2).unwrap();
    let _ = g3;
    // A small allocation in each pool (each has a small pool of its own).
    let _small = alloc.malloc(1000, s).unwrap();
    let _small_g = captured(&alloc, 1000);
    alloc.snapshot()
}

/// Replays `snap` (fidelity run): no divergence, every allocation at its recorded address, the
/// recorded final segments.
fn assert_reproduced(snap: &Snapshot) {
    let out = replay::replay(snap, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    let f = &out.report.fidelity;
    assert!(f.first_divergence.is_none(), "{f:?}");
    assert_eq!(f.allocs, f.allocs_at_recorded_address, "{f:?}");
    assert_eq!(f.segment_allocs, f.segment_allocs_of_recorded_size, "{f:?}");
    assert_eq!(f.final_state_matches, Some(true), "{f:?}");
    assert_eq!(layout(&out.replayed), layout(snap));
    // The replayed segments are in the recorded pools.
    let pools = |s: &Snapshot| {
        let mut v: Vec<(u64, (u64, u64))> = s
            .segments
            .iter()
            .map(|x| (x.address, x.segment_pool_id))
            .collect();
        v.sort();
        v
    };
    assert_eq!(pools(&out.replayed), pools(snap));
}

#[test]
fn the_recording_used_the_graphs_pool_and_the_default_pool() {
    let snap = record(false);
    let private = snap
        .segments
        .iter()
        .filter(|s| s.segment_pool_id == (GRAPH.0, GRAPH.1))
        .count();
    // The graph's large and small segments, and the default pool's two.
    assert_eq!(
        (private, snap.segments.len()),
        (2, 4),
        "{:?}",
        layout(&snap)
    );
}

#[test]
fn a_fidelity_replay_routes_captured_allocations_to_the_graphs_pool() {
    assert_reproduced(&record(false));
}

#[test]
fn a_trace_that_starts_with_a_private_segment_installs_it_in_its_pool() {
    assert_reproduced(&record(true));
}

#[test]
fn a_what_if_under_the_recorded_settings_peaks_as_the_recording_did() {
    let snap = record(false);
    let fidelity = replay::engine::run(
        &snap,
        &RunOptions::what_if(AllocatorConfig::default(), "same", None, false),
        &mut |_| {},
    )
    .unwrap();
    // A 20 MiB segment and a 2 MiB small one in each pool, as recorded: a replay that put
    // every allocation in the default pools made 2.
    assert_eq!(fidelity.figures.device_mallocs, 4, "{:?}", fidelity.figures);
}
