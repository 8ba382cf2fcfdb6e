//! A small recording with one OOM: a live block fills most of a 1 GiB device, a request too
//! large for the rest fails, and a later one succeeds.

use std::sync::Arc;

use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, HistoryOptions};
use allocview_alloc::snapshot::Snapshot;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
/// The live block that fills most of the recording's 1 GiB device.
pub const LIVE: u64 = 800 * MIB;
/// The request that fails on the recording's device.
pub const TOO_BIG: u64 = 300 * MIB;
/// An allocation after the OOM.
pub const AFTER: u64 = 50 * MIB;

/// Records on a 1 GiB device: hold [`LIVE`], fail on [`TOO_BIG`], then allocate [`AFTER`].
pub fn record() -> Snapshot {
    let alloc = CachingAllocator::new(Arc::new(SimBackend::new(GIB)), AllocatorConfig::default());
    alloc.record_history(HistoryOptions::default());
    let s = StreamId::DEFAULT;
    let _live = alloc.malloc(LIVE, s).unwrap();
    assert!(alloc.malloc(TOO_BIG, s).is_err());
    alloc.malloc(AFTER, s).unwrap();
    alloc.snapshot()
}
