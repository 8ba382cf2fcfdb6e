//! The simulated device's segment calls, against the ordered-map work they cannot avoid.
//!
//! - `hinted`: replay's pattern: a hinted malloc at a recorded address and its free, with
//!   10,000 other segments live, next to a bare `BTreeMap` insert + remove of the same key
//!   (the baseline: the least any range map must do).
//! - `first_fit`: a malloc and free placed by first fit with 10,000 live segments 2 MiB apart
//!   (10,000 holes of 2 MiB, 100 of 6 MiB): one that fits the first hole, and the worst case,
//!   one that fits no hole and is placed above them all after scanning every one.

use std::collections::BTreeMap;
use std::hint::black_box;

use allocview_alloc::caching::backend::DeviceBackend;
use allocview_alloc::caching::sim::SimBackend;
use criterion::{Criterion, criterion_group, criterion_main};

const MIB: u64 = 1 << 20;
const LIVE_SEGMENTS: u64 = 10_000;
const RECORDED_BASE: u64 = 139_777_059_848_192;

fn populated() -> (SimBackend, BTreeMap<u64, u64>) {
    let dev = SimBackend::builder()
        .capacity(1 << 50)
        .base_address(RECORDED_BASE)
        .build();
    let mut map = BTreeMap::new();
    for i in 0..LIVE_SEGMENTS {
        let addr = RECORDED_BASE + i * 4 * MIB;
        dev.hint_next_segment(addr);
        dev.malloc(2 * MIB).unwrap();
        map.insert(addr, addr + 2 * MIB);
    }
    (dev, map)
}

fn bench(c: &mut Criterion) {
    let (dev, mut map) = populated();
    let mut group = c.benchmark_group("sim_backend/hinted");
    let target = RECORDED_BASE + 5_000 * 4 * MIB + 2 * MIB;
    group.bench_function("btreemap_insert_remove (baseline)", |b| {
        b.iter(|| {
            map.insert(black_box(target), target + 2 * MIB);
            black_box(map.remove(&target));
        })
    });
    group.bench_function("sim_hinted_malloc_free", |b| {
        b.iter(|| {
            dev.hint_next_segment(black_box(target));
            let p = dev.malloc(2 * MIB).unwrap();
            dev.free(black_box(p)).unwrap();
        })
    });
    group.finish();

    // First fit: free every 100th segment, making 100 holes of 6 MiB among the 2 MiB ones.
    let (dev, mut map) = populated();
    for i in (0..LIVE_SEGMENTS).step_by(100) {
        dev.free(RECORDED_BASE + i * 4 * MIB).unwrap();
    }
    let mut group = c.benchmark_group("sim_backend/first_fit");
    group.bench_function("btreemap_insert_remove (baseline)", |b| {
        b.iter(|| {
            map.insert(black_box(target), target + 2 * MIB);
            black_box(map.remove(&target));
        })
    });
    group.bench_function("sim_first_fit_malloc_free_first_hole", |b| {
        b.iter(|| {
            let p = dev.malloc(black_box(2 * MIB)).unwrap();
            dev.free(p).unwrap();
        })
    });
    group.bench_function("sim_first_fit_malloc_free_past_every_hole", |b| {
        b.iter(|| {
            let p = dev.malloc(black_box(8 * MIB)).unwrap();
            dev.free(p).unwrap();
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
