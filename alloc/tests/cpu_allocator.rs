//! `CpuAllocator`: alignment for every power of two up to 4096 over sizes up to 1 MiB, zero-byte
//! requests, typed helpers, switchable stats and the byte limit.

// Tests of the crate that holds allocview's unsafe code exercise it directly.
#![allow(unsafe_code)]

use std::ptr::NonNull;

use allocview_alloc::allocator::{AllocError, Allocator, AllocatorExt, DEFAULT_ALIGNMENT};
use allocview_alloc::attributes::AllocationAttributes;
use allocview_alloc::cpu::CpuAllocator;

const ATTRS: AllocationAttributes = AllocationAttributes::new();

/// Largest alignment the sweep asks for.
const MAX_SWEEP_ALIGNMENT: usize = 4096;
/// Sizes up to this are all tried (sampled under valgrind).
const DENSE_SIZES: usize = 4096;
/// Largest size tried.
const MAX_SIZE: usize = 1 << 20;

fn under_valgrind() -> bool {
    std::env::var_os("ALLOCVIEW_VALGRIND").is_some()
}

/// Every size in 0..=4096 (every 61st under valgrind), then powers of two and their neighbours
/// up to 1 MiB.
fn sweep_sizes() -> Vec<usize> {
    let step = if under_valgrind() { 61 } else { 1 };
    let mut sizes: Vec<usize> = (0..=DENSE_SIZES).step_by(step).collect();
    let mut p = DENSE_SIZES * 2;
    while p <= MAX_SIZE {
        sizes.extend([p - 1, p, p + 1]);
        p *= 2;
    }
    sizes.retain(|&s| s <= MAX_SIZE);
    sizes
}

fn free(a: &CpuAllocator, p: NonNull<u8>) {
    // SAFETY: every pointer passed here came from `a` and is freed once.
    unsafe { a.deallocate_raw(p) }
}

#[test]
fn every_pointer_meets_every_power_of_two_alignment_up_to_4096() {
    let a = CpuAllocator::new();
    let sizes = sweep_sizes();
    let mut alignment = 1;
    while alignment <= MAX_SWEEP_ALIGNMENT {
        for &size in &sizes {
            let p = a.allocate_raw(alignment, size, &ATTRS).unwrap();
            let addr = p.as_ptr() as usize;
            assert_eq!(addr % alignment, 0, "size {size} alignment {alignment}");
            assert_eq!(
                addr % DEFAULT_ALIGNMENT,
                0,
                "size {size} alignment {alignment}"
            );
            if size > 0 {
                // SAFETY: `p` is valid for `size` bytes; touch both ends.
                unsafe {
                    p.write(0xA5);
                    p.add(size - 1).write(0x5A);
                }
            }
            free(&a, p);
        }
        alignment *= 2;
    }
    let stats = a.stats().unwrap();
    assert_eq!(stats.bytes_in_use, 0);
    assert_eq!(stats.largest_alloc_size, MAX_SIZE as u64);
}

#[test]
fn alignments_beyond_a_page_are_honoured() {
    let a = CpuAllocator::new();
    for alignment in [8192, 1 << 16, 1 << 20] {
        let p = a.allocate_raw(alignment, 100, &ATTRS).unwrap();
        assert_eq!(p.as_ptr() as usize % alignment, 0);
        free(&a, p);
    }
}

#[test]
fn an_alignment_that_is_not_a_power_of_two_is_an_error() {
    let a = CpuAllocator::new();
    for bad in [0, 3, 48, 100] {
        assert_eq!(
            a.allocate_raw(bad, 8, &ATTRS),
            Err(AllocError::InvalidAlignment(bad))
        );
    }
    assert_eq!(a.stats().unwrap().num_allocs, 0);
}

#[test]
fn zero_byte_requests_return_distinct_aligned_pointers_that_free() {
    let a = CpuAllocator::new();
    let p = a.allocate_raw(1, 0, &ATTRS).unwrap();
    let q = a.allocate_raw(256, 0, &ATTRS).unwrap();
    assert_ne!(p, q);
    assert_eq!(p.as_ptr() as usize % DEFAULT_ALIGNMENT, 0);
    assert_eq!(q.as_ptr() as usize % 256, 0);
    let stats = a.stats().unwrap();
    assert_eq!((stats.num_allocs, stats.bytes_in_use), (2, 0));
    free(&a, p);
    free(&a, q);
}

#[test]
fn sizes_that_overflow_the_address_space_are_errors() {
    let a = CpuAllocator::new();
    assert!(matches!(
        a.allocate_raw(64, usize::MAX, &ATTRS),
        Err(AllocError::SizeOverflow { .. })
    ));
    assert!(matches!(
        a.allocate_raw(64, isize::MAX as usize, &ATTRS),
        Err(AllocError::SizeOverflow { .. })
    ));
    assert_eq!(
        a.allocate::<u64>(usize::MAX / 4),
        Err(AllocError::SizeOverflow {
            count: usize::MAX / 4,
            elem_size: 8
        })
    );
    assert_eq!(a.stats().unwrap().bytes_in_use, 0);
}

#[test]
fn typed_allocations_hold_their_elements_and_count_their_bytes() {
    let a = CpuAllocator::new();
    let n = 1000;
    let p = a.allocate::<f64>(n).unwrap();
    assert_eq!(p.as_ptr() as usize % DEFAULT_ALIGNMENT, 0);
    // SAFETY: `p` has room for `n` f64s; written before read.
    let sum: f64 = unsafe {
        for i in 0..n {
            p.add(i).write(i as f64);
        }
        std::slice::from_raw_parts(p.as_ptr(), n).iter().sum()
    };
    assert_eq!(sum, (n * (n - 1) / 2) as f64);
    assert_eq!(a.stats().unwrap().bytes_in_use, (n * 8) as u64);
    // SAFETY: allocated above with the same count.
    unsafe { a.deallocate(p, n) };
    assert_eq!(a.stats().unwrap().bytes_in_use, 0);
}

#[test]
fn the_allocator_is_usable_as_a_trait_object() {
    let a: Box<dyn Allocator> = Box::new(CpuAllocator::new());
    let p = a.allocate::<u32>(16).unwrap();
    assert_eq!(a.name(), "cpu");
    // SAFETY: allocated above with the same count.
    unsafe { a.deallocate(p, 16) };
}

#[test]
fn stats_count_allocations_peak_and_largest() {
    let a = CpuAllocator::new();
    let p = a.allocate_raw(64, 1000, &ATTRS).unwrap();
    let q = a.allocate_raw(64, 24, &ATTRS).unwrap();
    free(&a, p);
    let r = a.allocate_raw(64, 10, &ATTRS).unwrap();
    let s = a.stats().unwrap();
    assert_eq!(s.num_allocs, 3);
    assert_eq!(s.bytes_in_use, 34);
    assert_eq!(s.peak_bytes_in_use, 1024);
    assert_eq!(s.largest_alloc_size, 1000);
    assert_eq!(s.bytes_limit, None);
    assert!(a.clear_stats());
    let s = a.stats().unwrap();
    assert_eq!(
        (
            s.num_allocs,
            s.bytes_in_use,
            s.peak_bytes_in_use,
            s.largest_alloc_size
        ),
        (0, 34, 34, 0)
    );
    free(&a, q);
    free(&a, r);
    assert_eq!(a.stats().unwrap().bytes_in_use, 0);
}

#[test]
fn stats_switched_off_are_not_reported_and_frees_still_balance() {
    let a = CpuAllocator::new();
    let counted = a.allocate_raw(64, 100, &ATTRS).unwrap();
    a.set_collect_stats(false);
    assert!(!a.collects_stats());
    assert_eq!(a.stats(), None);
    let uncounted = a.allocate_raw(64, 500, &ATTRS).unwrap();
    free(&a, counted);
    a.set_collect_stats(true);
    free(&a, uncounted);
    let s = a.stats().unwrap();
    assert_eq!(s.bytes_in_use, 0, "the uncounted free must not subtract");
    assert_eq!(s.num_allocs, 1);
}

#[test]
fn the_limit_refuses_allocations_that_would_pass_it() {
    let a = CpuAllocator::with_limit(1000);
    assert_eq!(a.limit(), Some(1000));
    let p = a.allocate_raw(64, 600, &ATTRS).unwrap();
    let q = a.allocate_raw(64, 400, &ATTRS).unwrap(); // exactly at the limit
    assert_eq!(
        a.allocate_raw(64, 1, &ATTRS),
        Err(AllocError::LimitExceeded {
            requested: 1,
            in_use: 1000,
            limit: 1000
        })
    );
    free(&a, p);
    let r = a.allocate_raw(64, 600, &ATTRS).unwrap();
    let s = a.stats().unwrap();
    assert_eq!(
        (s.num_allocs, s.bytes_in_use, s.bytes_limit),
        (3, 1000, Some(1000))
    );
    assert!(s.to_string().contains("limit: 1000 B"));
    free(&a, q);
    free(&a, r);
}

#[test]
fn the_limit_holds_while_stats_are_off() {
    let a = CpuAllocator::with_limit(100);
    a.set_collect_stats(false);
    let p = a.allocate_raw(64, 100, &ATTRS).unwrap();
    assert!(matches!(
        a.allocate_raw(64, 1, &ATTRS),
        Err(AllocError::LimitExceeded { .. })
    ));
    free(&a, p);
    let p = a.allocate_raw(64, 100, &ATTRS).unwrap();
    free(&a, p);
}

#[test]
fn the_limit_holds_under_concurrent_allocation() {
    const LIMIT: usize = 64 * 100;
    let a = CpuAllocator::with_limit(LIMIT);
    let held = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..50 {
                    if let Ok(p) = a.allocate_raw(64, 64, &ATTRS) {
                        held.lock().unwrap().push(p.as_ptr() as usize);
                    }
                }
            });
        }
    });
    let held = held.into_inner().unwrap();
    assert_eq!(held.len(), 100, "exactly the limit's worth succeeded");
    assert_eq!(a.stats().unwrap().peak_bytes_in_use, LIMIT as u64);
    for p in held {
        free(&a, NonNull::new(p as *mut u8).unwrap());
    }
    assert_eq!(a.stats().unwrap().bytes_in_use, 0);
}
