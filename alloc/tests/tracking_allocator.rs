//! `TrackingAllocator` against the worked example of TensorFlow's tracking allocator tests
//! (seed `001_d231bced76141022.txt`), number for number.

// Tests of the crate that holds allocview's unsafe code exercise it directly.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Mutex;

use allocview_alloc::allocator::{AllocError, Allocator};
use allocview_alloc::attributes::AllocationAttributes;
use allocview_alloc::cpu::CpuAllocator;
use allocview_alloc::tracking::TrackingAllocator;

/// TensorFlow's `TestableSizeTrackingAllocator`: tracks sizes itself (allocated = requested).
#[derive(Default)]
struct SizeTrackingAllocator {
    cpu: CpuAllocator,
    sizes: Mutex<HashMap<usize, usize>>,
}

impl Allocator for SizeTrackingAllocator {
    fn name(&self) -> &str {
        "size-tracking"
    }
    fn allocate_raw(
        &self,
        alignment: usize,
        num_bytes: usize,
        attrs: &AllocationAttributes,
    ) -> Result<NonNull<u8>, AllocError> {
        let ptr = self.cpu.allocate_raw(alignment, num_bytes, attrs)?;
        self.sizes
            .lock()
            .unwrap()
            .insert(ptr.as_ptr() as usize, num_bytes);
        Ok(ptr)
    }
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>) {
        self.sizes.lock().unwrap().remove(&(ptr.as_ptr() as usize));
        // SAFETY: the caller hands back a pointer of ours, which came from `self.cpu`.
        unsafe { self.cpu.deallocate_raw(ptr) }
    }
    fn tracks_allocation_sizes(&self) -> bool {
        true
    }
    fn requested_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.sizes
            .lock()
            .unwrap()
            .get(&(ptr.as_ptr() as usize))
            .copied()
    }
    fn allocated_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.requested_size(ptr)
    }
}

/// An allocator that reports a bigger allocated size than asked (rounds to 64).
#[derive(Default)]
struct RoundingAllocator(SizeTrackingAllocator);

impl Allocator for RoundingAllocator {
    fn name(&self) -> &str {
        "rounding"
    }
    fn allocate_raw(
        &self,
        alignment: usize,
        num_bytes: usize,
        attrs: &AllocationAttributes,
    ) -> Result<NonNull<u8>, AllocError> {
        self.0.allocate_raw(alignment, num_bytes, attrs)
    }
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>) {
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.0.deallocate_raw(ptr) }
    }
    fn tracks_allocation_sizes(&self) -> bool {
        true
    }
    fn allocated_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.0.requested_size(ptr).map(|n| n.div_ceil(64) * 64)
    }
}

const ATTRS: AllocationAttributes = AllocationAttributes::new();

/// (total_bytes, high_watermark, currently allocated, last allocation id).
type Figures = (usize, usize, usize, u64);

fn figures<A: Allocator>(ta: &TrackingAllocator<A>) -> Figures {
    (
        ta.total_bytes(),
        ta.high_watermark(),
        ta.current_bytes(),
        ta.last_allocation_id(),
    )
}

fn alloc<A: Allocator>(ta: &TrackingAllocator<A>, n: usize) -> NonNull<u8> {
    ta.allocate_raw(4, n, &ATTRS).unwrap()
}

fn free<A: Allocator>(ta: &TrackingAllocator<A>, p: NonNull<u8>) {
    // SAFETY: every pointer passed here came from `alloc` on `ta` and is freed once.
    unsafe { ta.deallocate_raw(p) }
}

/// Runs the seed's steps in order: each allocates `size` bytes, expects the first figures,
/// frees the block and expects the second.
fn alloc_then_free_each<A: Allocator>(
    ta: &TrackingAllocator<A>,
    steps: &[(usize, Figures, Figures)],
) {
    for &(size, after_alloc, after_free) in steps {
        let p = alloc(ta, size);
        assert_eq!(figures(ta), after_alloc, "after allocating {size} bytes");
        free(ta, p);
        assert_eq!(figures(ta), after_free, "after freeing {size} bytes");
    }
}

#[test]
fn over_an_allocator_that_does_not_track_sizes_the_seed_numbers_hold() {
    let inner = CpuAllocator::new();
    assert!(!inner.tracks_allocation_sizes());
    let ta = TrackingAllocator::new(inner);
    let p1 = alloc(&ta, 4);
    assert_eq!(figures(&ta), (4, 4, 4, 1));
    assert_eq!(ta.requested_size(p1), Some(4));
    assert_eq!(ta.allocated_size(p1), Some(4));
    assert_eq!(ta.allocation_id(p1), Some(1));
    free(&ta, p1);
    assert_eq!(figures(&ta), (4, 4, 0, 1));
    let p2 = alloc(&ta, 12);
    assert_eq!(figures(&ta), (16, 12, 12, 2));
    assert_eq!(ta.allocation_id(p2), Some(2));
    free(&ta, p2);
    assert_eq!(figures(&ta), (16, 12, 0, 2));
    assert_eq!(ta.finish(), (16, 12, 0));
}

#[test]
fn over_a_size_tracking_allocator_the_seed_numbers_hold() {
    let ta = TrackingAllocator::new(SizeTrackingAllocator::default());
    alloc_then_free_each(
        &ta,
        &[
            (4, (4, 4, 4, 1), (4, 4, 0, 1)),
            (12, (16, 12, 12, 2), (16, 12, 0, 2)),
        ],
    );
    let ((total, high, live), inner) = ta.into_parts();
    assert_eq!((total, high, live), (16, 12, 0));
    assert!(inner.sizes.lock().unwrap().is_empty());
}

#[test]
fn large_then_small_allocation_keeps_the_first_as_high_watermark() {
    let ta = TrackingAllocator::new(SizeTrackingAllocator::default());
    alloc_then_free_each(
        &ta,
        &[
            (12, (12, 12, 12, 1), (12, 12, 0, 1)),
            (4, (16, 12, 4, 2), (16, 12, 0, 2)),
        ],
    );
    assert_eq!(ta.finish(), (16, 12, 0));
}

#[test]
fn the_inner_allocators_allocated_size_is_what_gets_counted() {
    let ta = TrackingAllocator::new(RoundingAllocator::default());
    let p = alloc(&ta, 12);
    assert_eq!(ta.requested_size(p), Some(12));
    assert_eq!(ta.allocated_size(p), Some(64));
    assert_eq!(figures(&ta), (64, 64, 64, 1));
    free(&ta, p);
    assert_eq!(ta.finish(), (64, 64, 0));
}

#[test]
fn finish_reports_allocations_still_live_and_they_stay_freeable() {
    let ta = TrackingAllocator::new(std::sync::Arc::new(CpuAllocator::new()));
    let a = alloc(&ta, 100);
    let b = alloc(&ta, 28);
    free(&ta, a);
    assert_eq!(ta.live_allocations(), 1);
    let stats = ta.stats().unwrap();
    assert_eq!(
        (
            stats.num_allocs,
            stats.bytes_in_use,
            stats.peak_bytes_in_use
        ),
        (2, 28, 128)
    );
    let ((total, high, live), inner) = ta.into_parts();
    assert_eq!((total, high, live), (128, 128, 28));
    // SAFETY: `b` came from the inner allocator (through the tracker) and was not freed.
    unsafe { inner.deallocate_raw(b) };
    assert_eq!(inner.stats().unwrap().bytes_in_use, 0);
}

#[test]
fn unknown_pointers_have_no_sizes_or_ids() {
    let ta = TrackingAllocator::new(CpuAllocator::new());
    let other = CpuAllocator::new();
    let p = other.allocate_raw(64, 8, &ATTRS).unwrap();
    assert_eq!(ta.requested_size(p), None);
    assert_eq!(ta.allocated_size(p), None);
    assert_eq!(ta.allocation_id(p), None);
    // SAFETY: `p` came from `other`.
    unsafe { other.deallocate_raw(p) };
}

#[test]
fn failures_of_the_inner_allocator_are_not_recorded() {
    let ta = TrackingAllocator::new(CpuAllocator::with_limit(10));
    assert!(matches!(
        ta.allocate_raw(8, 11, &ATTRS),
        Err(AllocError::LimitExceeded {
            requested: 11,
            limit: 10,
            ..
        })
    ));
    assert_eq!(figures(&ta), (0, 0, 0, 0));
}

mod model {
    //! Random sequences of allocations and frees against a model of what the tracker and the
    //! CPU allocator under it must report.

    use super::*;
    use allocview_alloc::allocator::DEFAULT_ALIGNMENT;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Alloc { size: usize, align_log2: u32 },
        Free { pick: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0usize..5000, 0u32..13).prop_map(|(size, align_log2)| Op::Alloc { size, align_log2 }),
            any::<usize>().prop_map(|pick| Op::Free { pick }),
        ]
    }

    proptest! {
        #[test]
        fn figures_match_a_model_of_the_live_set(ops in proptest::collection::vec(op(), 1..60)) {
            let ta = TrackingAllocator::new(CpuAllocator::new());
            let mut live: Vec<(NonNull<u8>, usize, u64)> = Vec::new();
            let (mut total, mut high, mut current, mut next_id) = (0usize, 0usize, 0usize, 1u64);
            for op in ops {
                match op {
                    Op::Alloc { size, align_log2 } => {
                        let align = 1usize << align_log2;
                        let p = alloc_aligned(&ta, align, size);
                        prop_assert_eq!(p.as_ptr() as usize % align.max(DEFAULT_ALIGNMENT), 0);
                        prop_assert_eq!(ta.allocation_id(p), Some(next_id));
                        // SAFETY: `p` is valid for `size` bytes of writes.
                        unsafe { p.write_bytes(next_id as u8, size) };
                        live.push((p, size, next_id));
                        next_id += 1;
                        total += size;
                        current += size;
                        high = high.max(current);
                    }
                    Op::Free { pick } if !live.is_empty() => {
                        let (p, size, id) = live.swap_remove(pick % live.len());
                        // SAFETY: `p` is live, `size` bytes, written at allocation.
                        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), size) };
                        prop_assert!(bytes.iter().all(|&b| b == id as u8), "no other block overlapped");
                        free(&ta, p);
                        current -= size;
                    }
                    Op::Free { .. } => {}
                }
                prop_assert_eq!(figures(&ta), (total, high, current, next_id - 1));
                prop_assert_eq!(ta.inner().stats().unwrap().bytes_in_use, current as u64);
                for &(p, size, id) in &live {
                    prop_assert_eq!(ta.requested_size(p), Some(size));
                    prop_assert_eq!(ta.allocation_id(p), Some(id));
                }
            }
            for (p, _, _) in live.drain(..) {
                free(&ta, p);
            }
            prop_assert_eq!(ta.inner().stats().unwrap().bytes_in_use, 0);
            prop_assert_eq!(ta.finish(), (total, high, 0));
        }
    }

    fn alloc_aligned<A: Allocator>(
        ta: &TrackingAllocator<A>,
        align: usize,
        n: usize,
    ) -> NonNull<u8> {
        ta.allocate_raw(align, n, &ATTRS).unwrap()
    }
}
