//! Alloc + free pairs of 64 B, 1 KiB and 64 KiB (each alone, and the three in turn) through the
//! system allocator (the baselines: plain `malloc`-aligned and 64-byte aligned `Layout`s, as
//! `CpuAllocator` gives), `CpuAllocator`, and `TrackingAllocator<CpuAllocator>`, in one run.
//!
//! Run: `cargo bench -p allocview-alloc --bench cpu_allocators`

// Benchmarks of the crate that holds allocview's unsafe code call raw allocators directly.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Duration;

use allocview_alloc::allocator::{Allocator, DEFAULT_ALIGNMENT};
use allocview_alloc::attributes::AllocationAttributes;
use allocview_alloc::cpu::CpuAllocator;
use allocview_alloc::tracking::TrackingAllocator;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

/// The sizes measured, alone and mixed.
const SIZES: [(usize, &str); 3] = [(64, "64B"), (1024, "1KiB"), (64 * 1024, "64KiB")];

/// Alignment of a plain `malloc` on 64-bit glibc.
const MALLOC_ALIGNMENT: usize = 16;

fn system_pair(size: usize, alignment: usize) {
    let layout = Layout::from_size_align(size, alignment).expect("valid layout");
    // SAFETY: non-zero size; the pointer is freed once with the same layout.
    unsafe {
        let p = System.alloc(layout);
        black_box(p);
        System.dealloc(p, layout);
    }
}

fn allocator_pair(a: &dyn Allocator, size: usize) {
    let p = a
        .allocate_raw(DEFAULT_ALIGNMENT, size, &AllocationAttributes::default())
        .expect("allocation");
    black_box(p);
    // SAFETY: `p` came from `a` and is freed once.
    unsafe { a.deallocate_raw(p) };
}

fn bench(c: &mut Criterion) {
    let cpu = CpuAllocator::new();
    let tracking = TrackingAllocator::new(CpuAllocator::new());
    let mut cases: Vec<(String, Vec<usize>)> = SIZES
        .iter()
        .map(|&(n, name)| (name.to_string(), vec![n]))
        .collect();
    cases.push(("mixed".to_string(), SIZES.iter().map(|&(n, _)| n).collect()));

    for (name, sizes) in &cases {
        let mut group = c.benchmark_group(format!("alloc_free/{name}"));
        group.bench_function(BenchmarkId::from_parameter("system-malloc"), |b| {
            b.iter(|| sizes.iter().for_each(|&n| system_pair(n, MALLOC_ALIGNMENT)))
        });
        group.bench_function(BenchmarkId::from_parameter("system-aligned64"), |b| {
            b.iter(|| {
                sizes
                    .iter()
                    .for_each(|&n| system_pair(n, DEFAULT_ALIGNMENT))
            })
        });
        group.bench_function(BenchmarkId::from_parameter("cpu"), |b| {
            b.iter(|| sizes.iter().for_each(|&n| allocator_pair(&cpu, n)))
        });
        group.bench_function(BenchmarkId::from_parameter("tracking-cpu"), |b| {
            b.iter(|| sizes.iter().for_each(|&n| allocator_pair(&tracking, n)))
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = bench
}
criterion_main!(benches);
