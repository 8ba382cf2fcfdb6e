//! `AllocatorWrapper`: a wrapper that overrides one method forwards all the others.

// Tests of the crate that holds allocview's unsafe code exercise it directly.
#![allow(unsafe_code)]

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use allocview_alloc::allocator::{AllocError, Allocator};
use allocview_alloc::attributes::AllocationAttributes;
use allocview_alloc::cpu::CpuAllocator;
use allocview_alloc::tracking::TrackingAllocator;
use allocview_alloc::wrapper::AllocatorWrapper;

/// Overrides only `allocate_raw`: counts calls, then forwards.
struct CountingWrapper<A> {
    inner: A,
    calls: AtomicUsize,
}

impl<A: Allocator> AllocatorWrapper for CountingWrapper<A> {
    fn wrapped(&self) -> &dyn Allocator {
        &self.inner
    }
    fn allocate_raw(
        &self,
        alignment: usize,
        num_bytes: usize,
        attrs: &AllocationAttributes,
    ) -> Result<NonNull<u8>, AllocError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.allocate_raw(alignment, num_bytes, attrs)
    }
}

#[test]
fn a_wrapper_overriding_one_method_forwards_the_rest() {
    let w = CountingWrapper {
        inner: TrackingAllocator::new(CpuAllocator::new()),
        calls: 0.into(),
    };
    let a: &dyn Allocator = &w;
    let p = a
        .allocate_raw(64, 40, &AllocationAttributes::default())
        .unwrap();
    assert_eq!(w.calls.load(Ordering::Relaxed), 1);
    // Forwarded to the tracking allocator.
    assert_eq!(a.name(), "cpu");
    assert!(a.tracks_allocation_sizes());
    assert_eq!(a.requested_size(p), Some(40));
    assert_eq!(a.allocated_size(p), Some(40));
    assert_eq!(a.allocation_id(p), Some(1));
    assert_eq!(a.stats().unwrap().bytes_in_use, 40);
    // SAFETY: `p` came from `a` and is freed once.
    unsafe { a.deallocate_raw(p) };
    assert_eq!(a.stats().unwrap().bytes_in_use, 0);
    assert_eq!(w.inner.finish(), (40, 40, 0));
}

#[test]
fn a_wrapper_can_be_registered_and_shared_as_an_allocator() {
    let w: std::sync::Arc<dyn Allocator> = std::sync::Arc::new(CountingWrapper {
        inner: CpuAllocator::new(),
        calls: 0.into(),
    });
    let registry = allocview_alloc::registry::AllocatorRegistry::new();
    registry.register("counting", 1, w.clone()).unwrap();
    let got = registry.get().unwrap();
    let p = got
        .allocate_raw(8, 8, &AllocationAttributes::default())
        .unwrap();
    assert!(!got.tracks_allocation_sizes());
    assert_eq!(got.requested_size(p), None);
    assert!(got.clear_stats());
    // SAFETY: `p` came from `got` and is freed once.
    unsafe { got.deallocate_raw(p) };
}
