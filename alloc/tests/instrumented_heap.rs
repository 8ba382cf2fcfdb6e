//! `Instrumented` called directly (not installed as the global allocator): exact counts,
//! realloc rules, the enable flag, many threads (more than there are slots), the peak bound,
//! events, and a sink that allocates through the heap it observes.

// Tests of the crate that holds allocview's unsafe code exercise it directly.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};

use allocview_alloc::event::{CPU_DEVICE, Event, EventAction, EventPool, EventSink};
use allocview_alloc::global::{
    HeapStats, Instrumented, MAX_THREAD_SLOTS, PEAK_STEP_BYTES, unpublished,
};

const MIB: usize = 1 << 20;

fn layout(size: usize) -> Layout {
    Layout::from_size_align(size, 8).unwrap()
}

fn alloc(heap: &Instrumented<System>, size: usize) -> *mut u8 {
    // SAFETY: non-zero size.
    let p = unsafe { heap.alloc(layout(size)) };
    assert!(!p.is_null());
    p
}

fn free(heap: &Instrumented<System>, p: *mut u8, size: usize) {
    // SAFETY: `p` came from `alloc(heap, size)` and is freed once.
    unsafe { heap.dealloc(p, layout(size)) }
}

fn figures(s: HeapStats) -> (u64, u64, u64, u64, u64) {
    (s.current_bytes, s.total_bytes, s.count, s.frees, s.reallocs)
}

#[test]
fn one_thread_counts_exactly() {
    static HEAP: Instrumented<System> = Instrumented::new(System);
    let a = alloc(&HEAP, 100);
    let b = alloc(&HEAP, 200);
    free(&HEAP, a, 100);
    assert_eq!(figures(HEAP.stats()), (200, 300, 2, 1, 0));
    free(&HEAP, b, 200);
    let s = HEAP.stats();
    assert_eq!(figures(s), (0, 300, 2, 2, 0));
    assert!(s.peak_bytes >= 200 && s.peak_bytes <= 300 + PEAK_STEP_BYTES);
}

#[test]
fn a_realloc_counts_as_an_allocation_and_a_free() {
    static HEAP: Instrumented<System> = Instrumented::new(System);
    let p = alloc(&HEAP, 100);
    // SAFETY: `p` is a live 100-byte allocation of HEAP with this layout.
    let q = unsafe { HEAP.realloc(p, layout(100), 1000) };
    assert!(!q.is_null());
    assert_eq!(figures(HEAP.stats()), (1000, 1100, 2, 1, 1));
    // SAFETY: `q` is a live 1000-byte allocation; shrink it.
    let r = unsafe { HEAP.realloc(q, layout(1000), 10) };
    assert_eq!(figures(HEAP.stats()), (10, 1110, 3, 2, 2));
    free(&HEAP, r, 10);
    // SAFETY: non-zero size.
    let z = unsafe { HEAP.alloc_zeroed(layout(64)) };
    // SAFETY: `z` holds 64 zeroed bytes.
    let bytes = unsafe { std::slice::from_raw_parts(z, 64) };
    assert!(bytes.iter().all(|&b| b == 0));
    free(&HEAP, z, 64);
    assert_eq!(figures(HEAP.stats()), (0, 1174, 4, 4, 2));
}

#[test]
fn nothing_is_counted_while_disabled() {
    static HEAP: Instrumented<System> = Instrumented::new(System);
    HEAP.set_enabled(false);
    assert!(!HEAP.is_enabled());
    let p = alloc(&HEAP, 4096);
    free(&HEAP, p, 4096);
    assert_eq!(HEAP.stats(), HeapStats::default());
    HEAP.set_enabled(true);
    let p = alloc(&HEAP, 10);
    assert_eq!(HEAP.stats().count, 1);
    free(&HEAP, p, 10);
}

#[test]
fn large_allocations_reach_the_peak_at_once() {
    static HEAP: Instrumented<System> = Instrumented::new(System);
    let big = alloc(&HEAP, 10 * MIB);
    free(&HEAP, big, 10 * MIB);
    let small = alloc(&HEAP, MIB);
    let s = HEAP.stats();
    assert_eq!(s.current_bytes, MIB as u64);
    assert!(s.peak_bytes >= 10 * MIB as u64, "{s}");
    assert!(s.peak_bytes <= 10 * MIB as u64 + PEAK_STEP_BYTES, "{s}");
    HEAP.reset_peak();
    assert!(HEAP.stats().peak_bytes < 2 * MIB as u64);
    free(&HEAP, small, MIB);
}

#[test]
fn many_small_allocations_reach_the_peak_within_one_step() {
    static HEAP: Instrumented<System> = Instrumented::new(System);
    let blocks: Vec<*mut u8> = (0..1000).map(|_| alloc(&HEAP, 1000)).collect();
    for &b in &blocks {
        free(&HEAP, b, 1000);
    }
    let s = HEAP.stats();
    assert_eq!(s.current_bytes, 0);
    assert!(s.peak_bytes + PEAK_STEP_BYTES >= 1_000_000, "{s}");
    assert!(s.peak_bytes <= 1_000_000, "{s}");
}

#[test]
fn more_threads_than_slots_are_all_counted() {
    static HEAP: Instrumented<System> = Instrumented::new(System);
    const THREADS: usize = MAX_THREAD_SLOTS + 16;
    const HELD: usize = 1000;
    let rounds = if std::env::var_os("ALLOCVIEW_VALGRIND").is_some() {
        10
    } else {
        200
    };
    let held = Barrier::new(THREADS + 1);
    let release = Barrier::new(THREADS + 1);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (held, release) = (&held, &release);
            s.spawn(move || {
                for _ in 0..rounds {
                    let p = alloc(&HEAP, 64 + t);
                    free(&HEAP, p, 64 + t);
                }
                let keep = alloc(&HEAP, HELD);
                held.wait();
                release.wait();
                free(&HEAP, keep, HELD);
            });
        }
        held.wait();
        let s = HEAP.stats();
        assert_eq!(s.current_bytes, (THREADS * HELD) as u64);
        assert_eq!(s.count, (THREADS * (rounds + 1)) as u64);
        release.wait();
    });
    let s = HEAP.stats();
    let per_thread_bytes: usize = (0..THREADS).map(|t| rounds * (64 + t) + HELD).sum();
    assert_eq!(s.current_bytes, 0);
    assert_eq!(s.total_bytes, per_thread_bytes as u64);
    assert_eq!(s.frees, s.count);
}

#[test]
fn memory_freed_by_another_thread_balances() {
    static HEAP: Instrumented<System> = Instrumented::new(System);
    let p = alloc(&HEAP, 5000) as usize;
    std::thread::spawn(move || free(&HEAP, p as *mut u8, 5000))
        .join()
        .unwrap();
    assert_eq!(figures(HEAP.stats()), (0, 5000, 1, 1, 0));
}

#[test]
fn threads_holding_large_blocks_at_once_set_the_peak() {
    static HEAP: Instrumented<System> = Instrumented::new(System);
    const THREADS: usize = 4;
    let held = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            let held = &held;
            s.spawn(move || {
                let p = alloc(&HEAP, MIB);
                held.wait();
                free(&HEAP, p, MIB);
            });
        }
    });
    let s = HEAP.stats();
    assert_eq!(s.current_bytes, 0);
    assert!(s.peak_bytes >= (THREADS * MIB) as u64, "{s}");
}

/// Records events into a fixed list.
struct Recorder(Mutex<Vec<Event>>);

impl EventSink for Recorder {
    fn publish(&self, event: &Event) {
        self.0.lock().unwrap().push(*event);
    }
}

#[test]
fn every_operation_is_published_to_the_sink_until_it_is_removed() {
    static HEAP: Instrumented<System> = Instrumented::new(System);
    static SINK: Recorder = Recorder(Mutex::new(Vec::new()));
    HEAP.set_sink(Some(&SINK));
    assert!(HEAP.has_sink());
    let p = alloc(&HEAP, 48);
    // SAFETY: `p` is a live 48-byte allocation.
    let q = unsafe { HEAP.realloc(p, layout(48), 4096) };
    free(&HEAP, q, 4096);
    HEAP.set_sink(None);
    let r = alloc(&HEAP, 8);
    free(&HEAP, r, 8);
    let events = SINK.0.lock().unwrap().clone();
    let got: Vec<(EventAction, u64, u64, u64)> = events
        .iter()
        .map(|e| (e.action, e.addr, e.size, e.requested))
        .collect();
    let (p, q) = (p as u64, q as u64);
    assert_eq!(
        got,
        [
            (EventAction::Alloc, p, 48, 48),
            (EventAction::FreeCompleted, p, 48, 0),
            (EventAction::Alloc, q, 4096, 4096),
            (EventAction::FreeCompleted, q, 4096, 0),
        ]
    );
    for e in &events {
        assert_eq!((e.device, e.pool), (CPU_DEVICE, EventPool::Host));
        assert!(e.time_ns > 0);
    }
    assert!(events.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
}

/// A sink that allocates through the very heap that publishes to it, as a sink behind
/// `#[global_allocator]` does whenever it allocates.
struct AllocatingSink {
    heap: &'static Instrumented<System>,
    published: AtomicU64,
}

impl EventSink for AllocatingSink {
    fn publish(&self, _event: &Event) {
        self.published.fetch_add(1, Ordering::Relaxed);
        let p = alloc(self.heap, 32);
        free(self.heap, p, 32);
    }
}

#[test]
fn a_sink_that_allocates_does_not_recurse_and_its_allocations_are_counted() {
    static HEAP: Instrumented<System> = Instrumented::new(System);
    static SINK: AllocatingSink = AllocatingSink {
        heap: &HEAP,
        published: AtomicU64::new(0),
    };
    HEAP.set_sink(Some(&SINK));
    for _ in 0..10 {
        let p = alloc(&HEAP, 100);
        free(&HEAP, p, 100);
    }
    HEAP.set_sink(None);
    // 20 outer operations published; each publish allocated and freed once more, unpublished.
    assert_eq!(SINK.published.load(Ordering::Relaxed), 20);
    let s = HEAP.stats();
    assert_eq!((s.current_bytes, s.count, s.frees), (0, 30, 30));
    assert_eq!(s.total_bytes, 10 * 100 + 20 * 32);
}

#[test]
fn a_dropped_heap_frees_its_sink_cells() {
    static SINK: Recorder = Recorder(Mutex::new(Vec::new()));
    let heap = Box::new(Instrumented::new(System));
    heap.set_sink(Some(&SINK));
    heap.set_sink(None);
    heap.set_sink(Some(&SINK));
    let p = alloc(&heap, 16);
    free(&heap, p, 16);
    assert_eq!(SINK.0.lock().unwrap().len(), 2);
    drop(heap);
}

#[test]
fn stats_read_in_human_units() {
    let s = HeapStats {
        current_bytes: 1536,
        peak_bytes: 2 * MIB as u64,
        total_bytes: 10,
        count: 3,
        frees: 2,
        reallocs: 1,
    };
    assert_eq!(
        s.to_string(),
        "in use: 1.50 KiB, peak: 2.00 MiB, total: 10 B, allocs: 3, frees: 2, reallocs: 1"
    );
}

#[test]
fn allocations_inside_unpublished_are_counted_but_not_published() {
    static HEAP: Instrumented<System> = Instrumented::new(System);
    static SINK: Recorder = Recorder(Mutex::new(Vec::new()));
    HEAP.set_sink(Some(&SINK));
    let quiet = unpublished(|| {
        let p = alloc(&HEAP, 100);
        let nested = unpublished(|| alloc(&HEAP, 200));
        free(&HEAP, nested, 200);
        p
    });
    let loud = alloc(&HEAP, 300);
    free(&HEAP, quiet, 100);
    free(&HEAP, loud, 300);
    HEAP.set_sink(None);
    let sizes: Vec<u64> = SINK.0.lock().unwrap().iter().map(|e| e.size).collect();
    assert_eq!(
        sizes,
        [300, 100, 300],
        "only what ran outside `unpublished` was published"
    );
    assert_eq!(figures(HEAP.stats()), (0, 600, 3, 3, 0));
}
