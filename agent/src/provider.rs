//! [`SnapshotProvider`]: how the agent asks an allocator for its own view, for OOM dumps, for
//! resynchronising after dropped events, and for clients' snapshot and reset requests.

use allocview_alloc::caching::stats::DeviceStats;
use allocview_alloc::snapshot::Snapshot;

/// An allocator the agent can ask for its state. Implemented for
/// [`CachingAllocator`](allocview_alloc::caching::CachingAllocator) in this module; a program
/// may implement it for its own allocators.
///
/// The methods may take the allocator's lock; the agent calls them from its own threads, never
/// from an allocator's hot path.
pub trait SnapshotProvider: Send + Sync {
    /// The device this provider covers.
    fn device(&self) -> i32;

    /// The allocator's snapshot (segments, blocks, trace).
    fn snapshot(&self) -> Snapshot;

    /// The allocator's own counters.
    fn device_stats(&self) -> DeviceStats;

    /// Resets the allocator's peak statistics (`torch.cuda.reset_peak_memory_stats`); the
    /// allocator publishes a `reset_peaks` event, which resets the agent's copy too.
    fn reset_peak_stats(&self);

    /// `(total device memory, memory the allocator may use when limited)`, when known.
    fn memory_info(&self) -> Option<(u64, Option<u64>)> {
        None
    }
}
