//! The instrumented heap against the system allocator, in one run: (a) a mixed workload
//! (strings pushed and removed, maps built and dropped) through the global allocator, (b) a
//! tight 64-byte alloc/free loop, (c) that loop on 2 threads.
//!
//! Contenders: `System` (the baseline), `Instrumented<System>` (enabled, no sink), and other
//! instrumented heaps: `stats_alloc` (shared atomic counters), `dhat` (profiler running in
//! testing mode), `tracking-allocator` (a tracker counting with atomics; loops only: it puts a
//! header in front of each block, so it cannot share the global heap with the others).
//!
//! For (a) this binary's global allocator switches between contenders at run time (all but
//! tracking-allocator hand out plain `System` blocks, so a block may be freed under another
//! contender than the one that made it); the switch costs every contender the same branch.
//! For (b) and (c) each contender's `GlobalAlloc` methods are called directly on an instance.
//!
//! Run: `cargo bench -p allocview-alloc --bench instrumented_heap`

// Benchmarks of the crate that holds allocview's unsafe code call raw allocators directly.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use allocview_alloc::global::Instrumented;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use stats_alloc::StatsAlloc;
use tracking_allocator::{AllocationGroupId, AllocationRegistry, AllocationTracker};

/// Global-allocator contenders, by `MODE` value.
const SYSTEM: u8 = 0;
const INSTRUMENTED: u8 = 1;
const STATS_ALLOC: u8 = 2;
const DHAT: u8 = 3;

static MODE: AtomicU8 = AtomicU8::new(SYSTEM);
static INSTRUMENTED_HEAP: Instrumented<System> = Instrumented::new(System);
static STATS_HEAP: StatsAlloc<System> = StatsAlloc::system();
static TRACKING_HEAP: tracking_allocator::Allocator<System> =
    tracking_allocator::Allocator::system();

/// Dispatches to the contender `MODE` names.
struct Switch;

#[global_allocator]
static GLOBAL: Switch = Switch;

// SAFETY: every contender is a correct `GlobalAlloc` handing out `System` blocks, so forwarding
// each call (even to a different contender than the one that allocated) keeps the contract.
unsafe impl GlobalAlloc for Switch {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        unsafe {
            match MODE.load(Relaxed) {
                INSTRUMENTED => INSTRUMENTED_HEAP.alloc(layout),
                STATS_ALLOC => STATS_HEAP.alloc(layout),
                DHAT => dhat::Alloc.alloc(layout),
                _ => System.alloc(layout),
            }
        }
    }
    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe {
            match MODE.load(Relaxed) {
                INSTRUMENTED => INSTRUMENTED_HEAP.dealloc(ptr, layout),
                STATS_ALLOC => STATS_HEAP.dealloc(ptr, layout),
                DHAT => dhat::Alloc.dealloc(ptr, layout),
                _ => System.dealloc(ptr, layout),
            }
        }
    }
    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        unsafe {
            match MODE.load(Relaxed) {
                INSTRUMENTED => INSTRUMENTED_HEAP.realloc(ptr, layout, new_size),
                STATS_ALLOC => STATS_HEAP.realloc(ptr, layout, new_size),
                DHAT => dhat::Alloc.realloc(ptr, layout, new_size),
                _ => System.realloc(ptr, layout, new_size),
            }
        }
    }
}

/// A tracker like tracking-allocator's examples: counts with relaxed atomics.
struct CountingTracker {
    allocated: AtomicU64,
    freed: AtomicU64,
}

impl AllocationTracker for CountingTracker {
    fn allocated(&self, _addr: usize, object_size: usize, _wrapped: usize, _g: AllocationGroupId) {
        self.allocated.fetch_add(object_size as u64, Relaxed);
    }
    fn deallocated(
        &self,
        _addr: usize,
        object_size: usize,
        _wrapped: usize,
        _source: AllocationGroupId,
        _current: AllocationGroupId,
    ) {
        self.freed.fetch_add(object_size as u64, Relaxed);
    }
}

/// Workload (a): strings pushed and removed, maps built and dropped.
fn mixed_workload(round: u64) {
    let mut strings: Vec<String> = Vec::new();
    for i in 0..64u64 {
        strings.push(format!(
            "entry {i} of round {round}: {}",
            "x".repeat((i % 17) as usize)
        ));
    }
    while strings.len() > 16 {
        let i = (round as usize + strings.len()) % strings.len();
        black_box(strings.swap_remove(i));
    }
    let map: HashMap<u64, String> = (0..32).map(|i| (i, format!("value {i}"))).collect();
    black_box(&map);
    drop(map);
    black_box(strings);
}

/// The tight loop's block.
const BOX_LAYOUT: Layout = match Layout::from_size_align(64, 8) {
    Ok(l) => l,
    Err(_) => panic!("64-byte layout"),
};

#[inline(always)]
fn pair<A: GlobalAlloc>(a: &A) {
    // SAFETY: non-zero size; freed once with the same layout.
    unsafe {
        let p = a.alloc(BOX_LAYOUT);
        black_box(p);
        a.dealloc(p, BOX_LAYOUT);
    }
}

fn two_threads<A: GlobalAlloc + Sync>(a: &A, iters: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| (0..iters).for_each(|_| pair(a)));
        }
    });
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    AllocationRegistry::set_global_tracker(CountingTracker {
        allocated: AtomicU64::new(0),
        freed: AtomicU64::new(0),
    })
    .expect("first tracker");
    AllocationRegistry::enable_tracking();
    let _profiler = dhat::Profiler::builder().testing().build();

    let mut group = c.benchmark_group("mixed");
    for (name, mode) in [
        ("system", SYSTEM),
        ("instrumented", INSTRUMENTED),
        ("stats_alloc", STATS_ALLOC),
        ("dhat", DHAT),
    ] {
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            let mut round = 0u64;
            MODE.store(mode, Relaxed);
            b.iter(|| {
                round += 1;
                mixed_workload(round)
            });
            MODE.store(SYSTEM, Relaxed);
        });
    }
    group.finish();

    let mut group = c.benchmark_group("tight_loop_64B");
    group.bench_function("system", |b| b.iter(|| pair(&System)));
    group.bench_function("instrumented", |b| b.iter(|| pair(&INSTRUMENTED_HEAP)));
    group.bench_function("stats_alloc", |b| b.iter(|| pair(&STATS_HEAP)));
    group.bench_function("tracking_allocator", |b| b.iter(|| pair(&TRACKING_HEAP)));
    group.bench_function("dhat", |b| b.iter(|| pair(&dhat::Alloc)));
    group.finish();

    let mut group = c.benchmark_group("tight_loop_64B_2_threads");
    group.bench_function("system", |b| b.iter_custom(|n| two_threads(&System, n)));
    group.bench_function("instrumented", |b| {
        b.iter_custom(|n| two_threads(&INSTRUMENTED_HEAP, n))
    });
    group.bench_function("stats_alloc", |b| {
        b.iter_custom(|n| two_threads(&STATS_HEAP, n))
    });
    group.bench_function("tracking_allocator", |b| {
        b.iter_custom(|n| two_threads(&TRACKING_HEAP, n))
    });
    group.bench_function("dhat", |b| b.iter_custom(|n| two_threads(&dhat::Alloc, n)));
    group.finish();

    // The counters were really kept (and nothing is left over from the loops).
    let s = INSTRUMENTED_HEAP.stats();
    assert!(s.count > 0 && s.frees > 0);
    eprintln!("instrumented heap after the run: {s}");
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = bench
}
criterion_main!(benches);
