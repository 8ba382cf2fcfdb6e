//! [`TrackingAllocator`]: wraps any allocator and records, per live pointer, the requested size,
//! the allocated size and an allocation id, plus the bytes allocated in total, in use now, and
//! at most at once (TensorFlow's `TrackingAllocator` in `tracking_allocator.cc`, which tracks the
//! memory one op uses).
//!
//! When the wrapped allocator tracks sizes itself, its `allocated_size` is what is counted;
//! otherwise the requested size is. Ids count from 1 in allocation order. TensorFlow's
//! `GetSizesAndUnRef` (which drops a reference count) is [`TrackingAllocator::finish`], which
//! consumes the tracker: ownership does the ref count's job.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use crate::addr_map::BuildAddrHasher;
use crate::allocator::{AllocError, Allocator};
use crate::attributes::AllocationAttributes;
use crate::stats::AllocatorStats;

/// What the tracker knows about one live allocation.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    requested: usize,
    allocated: usize,
    id: u64,
}

#[derive(Debug, Default)]
struct State {
    in_use: HashMap<usize, Chunk, BuildAddrHasher>,
    /// Bytes allocated and not yet freed.
    allocated: usize,
    /// Highest `allocated`.
    high_watermark: usize,
    /// Bytes allocated in total.
    total_bytes: usize,
    /// Largest single allocation.
    largest: usize,
    /// Id of the last allocation (0 before the first).
    last_id: u64,
}

/// An allocator that records what passes through it to another one.
///
/// # Examples
///
/// ```
/// use allocview_alloc::allocator::Allocator;
/// use allocview_alloc::attributes::AllocationAttributes;
/// use allocview_alloc::cpu::CpuAllocator;
/// use allocview_alloc::tracking::TrackingAllocator;
///
/// let ta = TrackingAllocator::new(CpuAllocator::new());
/// let attrs = AllocationAttributes::default();
/// let p = ta.allocate_raw(4, 12, &attrs).unwrap();
/// assert_eq!(ta.requested_size(p), Some(12));
/// assert_eq!(ta.allocation_id(p), Some(1));
/// // SAFETY: `p` came from `ta` and is freed once.
/// unsafe { ta.deallocate_raw(p) };
/// assert_eq!(ta.finish(), (12, 12, 0));
/// ```
#[derive(Debug)]
pub struct TrackingAllocator<A: Allocator> {
    inner: A,
    state: Mutex<State>,
}

impl<A: Allocator> TrackingAllocator<A> {
    /// A tracker over `inner`, with nothing recorded yet.
    pub fn new(inner: A) -> TrackingAllocator<A> {
        TrackingAllocator {
            inner,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Updates are done before anything can panic, so a poisoned state is consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The wrapped allocator.
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// Bytes allocated through this tracker in total.
    pub fn total_bytes(&self) -> usize {
        self.state().total_bytes
    }

    /// The most bytes that were allocated through this tracker at once.
    pub fn high_watermark(&self) -> usize {
        self.state().high_watermark
    }

    /// Bytes allocated through this tracker and not yet freed.
    pub fn current_bytes(&self) -> usize {
        self.state().allocated
    }

    /// Id of the last allocation (0 before the first).
    pub fn last_allocation_id(&self) -> u64 {
        self.state().last_id
    }

    /// Number of allocations not yet freed.
    pub fn live_allocations(&self) -> usize {
        self.state().in_use.len()
    }

    /// Ends tracking: `(total_bytes, high_watermark, still_allocated)` (TensorFlow's
    /// `GetSizesAndUnRef`).
    ///
    /// Allocations still live stay valid allocations of the wrapped allocator; to free them
    /// later, keep a handle to it (wrap an `Arc`) or use [`into_parts`](Self::into_parts).
    pub fn finish(self) -> (usize, usize, usize) {
        self.into_parts().0
    }

    /// [`finish`](Self::finish), handing the wrapped allocator back too.
    pub fn into_parts(self) -> ((usize, usize, usize), A) {
        let state = self
            .state
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        (
            (state.total_bytes, state.high_watermark, state.allocated),
            self.inner,
        )
    }

    fn chunk(&self, ptr: NonNull<u8>) -> Option<Chunk> {
        self.state().in_use.get(&(ptr.as_ptr() as usize)).copied()
    }
}

impl<A: Allocator> Allocator for TrackingAllocator<A> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn allocate_raw(
        &self,
        alignment: usize,
        num_bytes: usize,
        attrs: &AllocationAttributes,
    ) -> Result<NonNull<u8>, AllocError> {
        let ptr = self.inner.allocate_raw(alignment, num_bytes, attrs)?;
        let allocated = if self.inner.tracks_allocation_sizes() {
            self.inner
                .allocated_size(ptr)
                .unwrap_or(num_bytes)
                .max(num_bytes)
        } else {
            num_bytes
        };
        let mut state = self.state();
        state.last_id += 1;
        let id = state.last_id;
        state.in_use.insert(
            ptr.as_ptr() as usize,
            Chunk {
                requested: num_bytes,
                allocated,
                id,
            },
        );
        state.allocated += allocated;
        state.high_watermark = state.high_watermark.max(state.allocated);
        state.total_bytes += allocated;
        state.largest = state.largest.max(allocated);
        Ok(ptr)
    }

    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>) {
        {
            let mut state = self.state();
            if let Some(chunk) = state.in_use.remove(&(ptr.as_ptr() as usize)) {
                state.allocated -= chunk.allocated;
            }
        }
        // SAFETY: the caller's contract: `ptr` came from our `allocate_raw`, which returned the
        // inner allocator's pointer unchanged, and is freed once.
        unsafe { self.inner.deallocate_raw(ptr) }
    }

    fn tracks_allocation_sizes(&self) -> bool {
        true
    }

    fn requested_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.chunk(ptr).map(|c| c.requested)
    }

    fn allocated_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.chunk(ptr).map(|c| c.allocated)
    }

    fn allocation_id(&self, ptr: NonNull<u8>) -> Option<u64> {
        self.chunk(ptr).map(|c| c.id)
    }

    /// The tracker's own figures (allocations through it only), with the wrapped allocator's
    /// limit.
    fn stats(&self) -> Option<AllocatorStats> {
        let bytes_limit = self.inner.stats().and_then(|s| s.bytes_limit);
        let state = self.state();
        Some(AllocatorStats {
            num_allocs: state.last_id,
            bytes_in_use: state.allocated as u64,
            peak_bytes_in_use: state.high_watermark as u64,
            largest_alloc_size: state.largest as u64,
            bytes_limit,
        })
    }
}
