//! [`SnapshotProvider`]: how the agent asks an allocator for its own view, for OOM dumps, for
//! resynchronising after dropped events, and for clients' snapshot and reset requests.
//! [`HostProvider`]: the same for the host (CPU) heap, whose own counters replace the agent's
//! after dropped events.

use allocview_alloc::caching::CachingAllocator;
use allocview_alloc::caching::backend::DeviceBackend;
use allocview_alloc::caching::stats::DeviceStats;
use allocview_alloc::global::{HeapStats, Instrumented};
use allocview_alloc::snapshot::{Frames, Snapshot};

/// An allocator the agent can ask for its state. Implemented for
/// [`CachingAllocator`] in this module; a program
/// may implement it for its own allocators.
///
/// The methods may take the allocator's lock; the agent calls them from its own threads, never
/// from an allocator's hot path.
pub trait SnapshotProvider: Send + Sync {
    /// The device this provider covers.
    fn device(&self) -> i32;

    /// The allocator's snapshot (segments, blocks, trace).
    ///
    /// When [`marks_snapshots`](Self::marks_snapshots) is true, taking it publishes a
    /// `snapshot` event into the sink under the same lock, as
    /// [`CachingAllocator::snapshot`] does: events before that marker are in the snapshot,
    /// events after it are not, which lets the agent resynchronise without counting any event
    /// twice.
    fn snapshot(&self) -> Snapshot;

    /// Whether [`snapshot`](Self::snapshot) publishes the marker event (default true).
    fn marks_snapshots(&self) -> bool {
        true
    }

    /// The allocator's own counters.
    fn device_stats(&self) -> DeviceStats;

    /// [`snapshot`](Self::snapshot) and [`device_stats`](Self::device_stats) of one moment
    /// (taken under one hold of the allocator's lock), when the allocator can give both at
    /// once. Default: `None`; the agent then reads the stats before and after the snapshot and
    /// retries until they agree.
    fn snapshot_with_stats(&self) -> Option<(Snapshot, DeviceStats)> {
        None
    }

    /// Resets the allocator's peak statistics (`torch.cuda.reset_peak_memory_stats`); the
    /// allocator publishes a `reset_peaks` event, which resets the agent's copy too.
    fn reset_peak_stats(&self);

    /// `(total device memory, memory the allocator may use when limited)`, when known.
    fn memory_info(&self) -> Option<(u64, Option<u64>)> {
        None
    }

    /// Publishes the events the allocator gathered and has not sent yet (the caching allocator
    /// sends its block events in batches). [`Agent::flush`](crate::agent::Agent::flush) calls
    /// it, on the caller's thread, before it waits for the aggregator. Default: nothing.
    fn flush_events(&self) {}

    /// Publishes the gathered events of an allocator that went quiet, if that needs no
    /// waiting. The aggregator calls it on its own thread, once a tick, for a device that sent
    /// no event since the previous tick, so a live view does not miss the last calls of an
    /// allocator that stopped calling. It must never block. Default: nothing.
    fn flush_idle_events(&self) {}

    /// The frames behind the context ids of this allocator's events, for those of `ids` it
    /// still knows (see [`CachingAllocator::context_frames`]). The aggregator calls it once a
    /// tick with the ids it has not resolved. Default: none (events then show no frames).
    fn context_frames(&self, ids: &[u32]) -> Vec<(u32, Frames)> {
        let _ = ids;
        Vec::new()
    }
}

impl<B: DeviceBackend> SnapshotProvider for CachingAllocator<B> {
    fn device(&self) -> i32 {
        CachingAllocator::device(self)
    }

    fn snapshot(&self) -> Snapshot {
        CachingAllocator::snapshot(self)
    }

    fn device_stats(&self) -> DeviceStats {
        CachingAllocator::device_stats(self)
    }

    fn snapshot_with_stats(&self) -> Option<(Snapshot, DeviceStats)> {
        Some(CachingAllocator::snapshot_with_stats(self))
    }

    fn reset_peak_stats(&self) {
        CachingAllocator::reset_peak_stats(self)
    }

    fn memory_info(&self) -> Option<(u64, Option<u64>)> {
        let (_, total) = self.backend().mem_get_info().ok()?;
        Some((total, None))
    }

    fn flush_events(&self) {
        CachingAllocator::flush_events(self)
    }

    fn flush_idle_events(&self) {
        self.try_flush_events();
    }

    fn context_frames(&self, ids: &[u32]) -> Vec<(u32, Frames)> {
        CachingAllocator::context_frames(self, ids)
    }
}

/// The host heap the agent may ask for its own counters: the process's instrumented global
/// allocator ([`Instrumented`], which implements it). Register it with
/// [`AgentBuilder::host_provider`](crate::agent::AgentBuilder::host_provider); after dropped
/// events the agent takes the heap's counters in place of those it folded from events (a
/// resync, counted and shown like a device's), and a client's peak reset resets the heap's
/// peak too.
///
/// Called from the agent's threads, never from an allocator's hot path.
pub trait HostProvider: Send + Sync {
    /// The heap's counters now.
    fn heap_stats(&self) -> HeapStats;

    /// Restarts the heap's peak from the bytes in use now.
    fn reset_peak(&self);
}

impl<A: Send + Sync> HostProvider for Instrumented<A> {
    fn heap_stats(&self) -> HeapStats {
        self.stats()
    }

    fn reset_peak(&self) {
        Instrumented::reset_peak(self);
    }
}

/// A global allocator is a `static`: `Arc::new(&HEAP)` registers it.
impl<T: HostProvider + ?Sized> HostProvider for &'static T {
    fn heap_stats(&self) -> HeapStats {
        (**self).heap_stats()
    }

    fn reset_peak(&self) {
        (**self).reset_peak();
    }
}
