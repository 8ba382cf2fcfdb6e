//! Fidelity counts every `segment_alloc`/`segment_map` of the recording, as the recorded
//! column's device mallocs do: an expandable segment can map two ranges for one allocation.

use std::sync::Arc;

use allocview_agent::replay::{self, ReplaySettings};
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, HistoryOptions};
use allocview_alloc::snapshot::{Snapshot, TraceAction};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Expandable segments: an unmapped hole, a mapped free block after it, then an allocation
/// that spans the hole, that block and more: the hole and the tail are mapped for it.
fn recording() -> Snapshot {
    let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let alloc = CachingAllocator::new(Arc::new(SimBackend::new(4 * GIB)), config);
    alloc.record_history(HistoryOptions::default());
    let s = StreamId::DEFAULT;
    let _a = alloc.malloc(100 * MIB, s).unwrap();
    let b = alloc.malloc(100 * MIB, s).unwrap();
    let c = alloc.malloc(100 * MIB, s).unwrap();
    alloc.free(b).unwrap();
    alloc.empty_cache().unwrap();
    alloc.free(c).unwrap();
    let _d = alloc.malloc(250 * MIB, s).unwrap();
    alloc.snapshot()
}

#[test]
fn every_recorded_segment_mapping_counts_in_the_fidelity() {
    let snap = recording();
    let trace = &snap.device_traces[0];
    let maps = trace
        .iter()
        .filter(|e| e.action == TraceAction::SegmentMap)
        .count() as u64;
    // Two mappings right before the last allocation.
    let last_alloc = trace
        .iter()
        .rposition(|e| e.action == TraceAction::Alloc)
        .unwrap();
    assert_eq!(
        trace[last_alloc - 2..last_alloc]
            .iter()
            .filter(|e| e.action == TraceAction::SegmentMap)
            .count(),
        2,
        "{trace:#?}"
    );
    let out = replay::replay(&snap, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    let f = &out.report.fidelity;
    assert_eq!(f.segment_allocs, maps, "{f:?}");
    assert_eq!(f.segment_allocs_of_recorded_size, maps, "{f:?}");
    assert_eq!(out.report.runs[0].device_mallocs, maps);
    assert!(f.first_divergence.is_none(), "{f:?}");
}
