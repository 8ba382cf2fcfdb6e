//! The caching allocator's cached path against glibc, and the cost of observing it.
//!
//! - `pair/caching` vs `pair/glibc`: one malloc + free of a cached block, sizes cycling through
//!   512 B .. 24 MiB, against `libc::malloc` + `libc::free` of the same sizes. Each malloc splits
//!   its block off a larger free one and each free merges it back (the worst cached case).
//! - `pair/caching_exact`: the same sizes when every size has a cached block of exactly its
//!   size whose neighbours are allocated (a training loop's steady state): no split, no merge.
//! - `tracker/none` vs `tracker/attached`: the same pair with a trace tracker attached.
//! - `sink/none` vs `sink/counting`: the same pair publishing to a no-op counting event sink.

// The glibc baseline calls `libc::malloc`/`libc::free`.
#![allow(unsafe_code)]

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_alloc::event::{Event, EventSink};
use criterion::{Criterion, criterion_group, criterion_main};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Mixed request sizes, 512 B .. 24 MiB (a power of two of entries, cycled by mask).
const SIZES: [u64; 16] = [
    512,
    1000,
    4 * KIB,
    10 * KIB,
    64 * KIB,
    100 * KIB,
    500 * KIB,
    MIB,
    MIB + 512,
    3 * MIB,
    5 * MIB,
    9 * MIB,
    12 * MIB,
    16 * MIB,
    20 * MIB,
    24 * MIB,
];

type Alloc = CachingAllocator<SimBackend>;

/// An allocator whose cache already holds a block for every size.
fn warm() -> Alloc {
    let a = CachingAllocator::new(SimBackend::new(64 << 30), AllocatorConfig::default());
    let ptrs: Vec<u64> = SIZES
        .iter()
        .map(|&s| a.malloc(s, StreamId::DEFAULT).unwrap())
        .collect();
    for p in ptrs {
        a.free(p).unwrap();
    }
    a
}

fn pair_loop(c: &mut Criterion, group: &str, name: &str, a: &Alloc) {
    let mut g = c.benchmark_group(group);
    let mut i = 0usize;
    g.bench_function(name, |b| {
        b.iter(|| {
            let s = SIZES[i & (SIZES.len() - 1)];
            i = i.wrapping_add(1);
            let p = a.malloc(black_box(s), StreamId::DEFAULT).unwrap();
            a.free(black_box(p)).unwrap();
        })
    });
    g.finish();
}

fn glibc(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair");
    let mut i = 0usize;
    g.bench_function("glibc", |b| {
        b.iter(|| {
            let s = SIZES[i & (SIZES.len() - 1)] as usize;
            i = i.wrapping_add(1);
            // SAFETY: malloc accepts any size; the pointer is freed once, right after, and
            // free accepts the null pointer malloc returns on failure.
            unsafe {
                let p = libc::malloc(black_box(s));
                black_box(p);
                libc::free(p);
            }
        })
    });
    g.finish();
}

/// An allocator whose cache holds an exact-size block for every size, fenced by allocated
/// blocks so that frees never merge.
fn warm_exact() -> (Alloc, Vec<u64>) {
    let a = CachingAllocator::new(SimBackend::new(64 << 30), AllocatorConfig::default());
    let mut fences = Vec::new();
    let mut blocks = Vec::new();
    for &s in &SIZES {
        blocks.push(a.malloc(s, StreamId::DEFAULT).unwrap());
        fences.push(a.malloc(s, StreamId::DEFAULT).unwrap());
    }
    for p in blocks {
        a.free(p).unwrap();
    }
    (a, fences)
}

fn caching(c: &mut Criterion) {
    pair_loop(c, "pair", "caching", &warm());
    let (a, fences) = warm_exact();
    pair_loop(c, "pair", "caching_exact", &a);
    black_box(fences);
}

fn tracker(c: &mut Criterion) {
    pair_loop(c, "tracker", "none", &warm());
    let a = warm();
    let seen = Arc::new(AtomicU64::new(0));
    let s2 = seen.clone();
    // Trackers run under the allocator's lock, one at a time: a plain load and store (no
    // locked read-modify-write) keep the tracker's own cost out of the figure.
    a.attach_trace_tracker(move |t| {
        s2.store(s2.load(Ordering::Relaxed) + t.size, Ordering::Relaxed);
    });
    pair_loop(c, "tracker", "attached", &a);
    black_box(seen.load(Ordering::Relaxed));
}

/// A sink that only counts.
struct Counting(AtomicU64);

impl EventSink for Counting {
    fn publish(&self, e: &Event) {
        black_box(e);
        // Published under the allocator's lock, one at a time (see the tracker above).
        self.0
            .store(self.0.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

fn sink(c: &mut Criterion) {
    pair_loop(c, "sink", "none", &warm());
    let a = warm();
    let counting = Arc::new(Counting(AtomicU64::new(0)));
    a.set_event_sink(Some(counting.clone()));
    pair_loop(c, "sink", "counting", &a);
    black_box(counting.0.load(Ordering::Relaxed));
}

criterion_group!(benches, glibc, caching, tracker, sink);
criterion_main!(benches);
