//! The cached malloc/free path allocates nothing on the heap once the allocator has warmed up,
//! with and without an event sink and a trace tracker attached. A counting global allocator
//! (this binary's only test, so no other thread allocates meanwhile) checks it.

// A `GlobalAlloc` implementation is unsafe by definition.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_alloc::event::{Event, EventSink};

/// Counts heap allocations of the whole process.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call forwards to the system allocator with the caller's arguments, so the
// `GlobalAlloc` contract holds exactly as it does for `System`; counting has no side effect on
// the memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const MIB: u64 = 1 << 20;
const SIZES: [u64; 8] = [512, 1000, 4096, 100_000, MIB, MIB + 512, 5 * MIB, 24 * MIB];
const PAIRS: usize = 10_000;

struct Sink(AtomicU64);

impl EventSink for Sink {
    fn publish(&self, _e: &Event) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn pairs(a: &CachingAllocator<SimBackend>) {
    for i in 0..PAIRS {
        let p = a.malloc(SIZES[i % SIZES.len()], StreamId::DEFAULT).unwrap();
        a.free(p).unwrap();
    }
}

#[test]
fn the_cached_path_allocates_nothing_once_warm() {
    let a = CachingAllocator::new(SimBackend::new(1 << 34), AllocatorConfig::default());
    pairs(&a); // warm: segments, slab slots, map capacity
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    pairs(&a);
    assert_eq!(ALLOCATIONS.load(Ordering::Relaxed) - before, 0, "plain");

    let sink = Arc::new(Sink(AtomicU64::new(0)));
    a.set_event_sink(Some(sink.clone()));
    let seen = Arc::new(AtomicU64::new(0));
    let s2 = seen.clone();
    a.attach_trace_tracker(move |t| {
        s2.fetch_add(t.size, Ordering::Relaxed);
    });
    pairs(&a);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    pairs(&a);
    assert_eq!(
        ALLOCATIONS.load(Ordering::Relaxed) - before,
        0,
        "with a sink and a tracker"
    );
    // Two runs of PAIRS cached pairs: an alloc and a free event each (the last batch is
    // published by `flush_events`).
    a.flush_events();
    assert_eq!(sink.0.load(Ordering::Relaxed), 2 * 2 * PAIRS as u64);
    assert!(seen.load(Ordering::Relaxed) > 0);
}
