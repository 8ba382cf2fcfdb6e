//! A what-if run attempts each recorded OOM's request again; where it succeeds, the run held
//! that block (it is given back at once, since the recorded program never had it), so the
//! run's peaks include it.

use std::sync::Arc;

use allocview_agent::replay::{self, Placement, RunOptions};
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, HistoryOptions};
use allocview_alloc::snapshot::Snapshot;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The live block that fills most of the recording's device.
const LIVE: u64 = 800 * MIB;
/// The request that fails on the recording's 1 GiB device.
const TOO_BIG: u64 = 300 * MIB;
/// An allocation after the OOM.
const AFTER: u64 = 50 * MIB;

/// Records on a 1 GiB device: hold [`LIVE`], fail on [`TOO_BIG`], then allocate [`AFTER`].
fn record() -> Snapshot {
    let alloc = CachingAllocator::new(Arc::new(SimBackend::new(GIB)), AllocatorConfig::default());
    alloc.record_history(HistoryOptions::default());
    let s = StreamId::DEFAULT;
    let _live = alloc.malloc(LIVE, s).unwrap();
    assert!(alloc.malloc(TOO_BIG, s).is_err());
    alloc.malloc(AFTER, s).unwrap();
    alloc.snapshot()
}

#[test]
fn a_what_if_that_rescues_the_recorded_oom_counts_the_rescued_block_in_its_peaks() {
    let snap = record();
    let opts = RunOptions {
        config: AllocatorConfig::default(),
        label: "2 GiB".into(),
        device_memory: Some(2 * GIB),
        placement: Placement::Free,
        keep_history: false,
    };
    let r = replay::engine::run(&snap, &opts, &mut |_| {}).unwrap();
    assert_eq!(r.figures.ooms, 0, "{:?}", r.figures);
    assert_eq!(r.figures.peak_allocated, LIVE + TOO_BIG, "{:?}", r.figures);
    assert_eq!(r.figures.peak_reserved, LIVE + TOO_BIG, "{:?}", r.figures);
    assert_eq!(
        r.figures.peak_allocated,
        r.stats.allocated_bytes.0[0].peak as u64
    );
}
