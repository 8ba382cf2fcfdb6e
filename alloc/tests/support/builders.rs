//! Shared builders and checks for the caching allocator's tests.

#![allow(dead_code)]

use std::sync::Arc;

use allocview_alloc::caching::backend::{DeviceBackend, StreamId};
use allocview_alloc::caching::stats::{DeviceStats, StatArray};
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_alloc::snapshot::{BlockState, Snapshot};

use allocview_alloc::caching::sim::SimBackend;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const S0: StreamId = StreamId(0);
pub const S1: StreamId = StreamId(1);
pub const S2: StreamId = StreamId(2);
pub const S3: StreamId = StreamId(3);

pub type Alloc = CachingAllocator<Arc<SimBackend>>;

/// An allocator over a fresh simulated device of `capacity` bytes, with a handle on the device.
/// Stream work completes only when the test says so (`complete_stream`, `complete_all`).
pub fn allocator_with(capacity: u64, config: &str) -> (Alloc, Arc<SimBackend>) {
    let dev = Arc::new(
        SimBackend::builder()
            .capacity(capacity)
            .auto_complete(false)
            .build(),
    );
    for s in [S1, S2, S3] {
        dev.add_stream(s);
    }
    let cfg = AllocatorConfig::parse(config).expect("test config parses");
    (CachingAllocator::new(dev.clone(), cfg), dev)
}

/// An allocator with default settings on an 8 GiB device.
pub fn allocator() -> (Alloc, Arc<SimBackend>) {
    allocator_with(8 * GIB, "")
}

/// The `all` current value of a stat array.
pub fn cur(a: &allocview_alloc::caching::stats::StatArray) -> i64 {
    a.0[0].current
}

/// Every stat array's current figures (all, small, large) of `mine` equal those of `theirs`
/// (the stats a snapshot implies), the `segment` array aside with `skip_segment`.
pub fn assert_arrays_agree(mine: &DeviceStats, theirs: &DeviceStats, skip_segment: bool) {
    for ((name, m), (_, t)) in mine.arrays().into_iter().zip(theirs.arrays()) {
        if skip_segment && name == "segment" {
            continue;
        }
        let cur = |x: &StatArray| x.0.map(|s| s.current);
        assert_eq!(
            cur(m),
            cur(t),
            "{name} (all, small, large) agrees with the snapshot"
        );
    }
}

/// Checks the snapshot's structure (blocks tile segments, segments do not overlap, per-segment
/// sums match the blocks) and that the allocator's current stats equal those the snapshot
/// implies, on any backend (the behaviour suite runs it on `CudaBackend` too). Expandable segments count in
/// neither `segment` stat (PyTorch counts only device allocations there).
pub fn check_consistent<B: DeviceBackend>(a: &CachingAllocator<B>) -> Snapshot {
    let snap = a.snapshot();
    let mut last_end = 0u64;
    let mut expandable_segments = 0;
    for seg in &snap.segments {
        assert!(
            seg.address >= last_end,
            "segments overlap at {:#x}",
            seg.address
        );
        last_end = seg.address + seg.total_size;
        let mut at = seg.address;
        let (mut alloc, mut active, mut req) = (0, 0, 0);
        for b in &seg.blocks {
            assert_eq!(b.address, at, "blocks tile the segment");
            assert!(b.size > 0 && b.size % 512 == 0);
            at += b.size;
            if b.state == BlockState::ActiveAllocated {
                alloc += b.size;
            }
            if b.state.is_active() {
                active += b.size;
                req += b.requested_size;
            }
        }
        assert_eq!(at, seg.address + seg.total_size, "blocks cover the segment");
        assert_eq!(
            (alloc, active, req),
            (seg.allocated_size, seg.active_size, seg.requested_size),
            "segment sums"
        );
        if seg.is_expandable {
            expandable_segments += 1;
        }
    }
    let mine = a.device_stats();
    let theirs = DeviceStats::from_snapshot(&snap, a.device(), a.config().max_split_size());
    // Expandable segments count in neither `segment` stat (PyTorch counts device allocations).
    let skip_segment = expandable_segments > 0 || a.config().expandable_segments();
    assert_arrays_agree(&mine, &theirs, skip_segment);
    assert_eq!(
        mine.oversize_allocations.current,
        theirs.oversize_allocations.current
    );
    assert_eq!(
        mine.oversize_segments.current,
        theirs.oversize_segments.current
    );
    snap
}
