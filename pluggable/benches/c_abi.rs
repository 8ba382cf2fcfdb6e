//! What the C entry points cost over the caching allocator they wrap, on the simulated device:
//! a 4 KiB malloc + free pair (served from the cache after the first) three ways, in one run:
//!
//! - `caching_allocator (baseline)`: `CachingAllocator<SimBackend>` called directly, no sink;
//! - `caching_allocator + agent sink`: the same, publishing every event to a running agent;
//! - `allocview_malloc/free (C ABI)`: through the exported functions (process-wide runtime,
//!   device lookup, `catch_unwind`, agent sink).
//!
//! Run with `ALLOCVIEW_BACKEND=sim cargo bench -p allocview-pluggable --bench c_abi`; without
//! it the C ABI case is skipped (it would try the CUDA backend).

// The C entry point `allocview_free` is an `unsafe extern "C" fn`; nothing else is unsafe.
#![allow(unsafe_code)]

use std::hint::black_box;
use std::ptr;

use allocview_agent::agent::Agent;
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_pluggable::ffi::{allocview_free, allocview_malloc};
use criterion::{Criterion, criterion_group, criterion_main};

const SIZE: u64 = 4096;
const CAPACITY: u64 = 16 << 30;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("malloc_free_4KiB");
    let bare = CachingAllocator::new(SimBackend::new(CAPACITY), AllocatorConfig::default());
    group.bench_function("caching_allocator (baseline)", |b| {
        b.iter(|| {
            let p = bare.malloc(black_box(SIZE), StreamId::DEFAULT).unwrap();
            bare.free(black_box(p)).unwrap();
        })
    });

    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dir.path())
        .spawn()
        .unwrap();
    let sunk = CachingAllocator::new(SimBackend::new(CAPACITY), AllocatorConfig::default());
    sunk.set_event_sink(Some(agent.sink()));
    group.bench_function("caching_allocator + agent sink", |b| {
        b.iter(|| {
            let p = sunk.malloc(black_box(SIZE), StreamId::DEFAULT).unwrap();
            sunk.free(black_box(p)).unwrap();
        })
    });

    if std::env::var("ALLOCVIEW_BACKEND").is_ok_and(|v| v == "sim") {
        group.bench_function("allocview_malloc/free (C ABI)", |b| {
            b.iter(|| {
                let p = allocview_malloc(black_box(SIZE as isize), 0, ptr::null_mut());
                assert!(!p.is_null());
                // SAFETY: `p` came from `allocview_malloc` on device 0 and is freed once; nothing
                // uses it.
                unsafe { allocview_free(black_box(p), SIZE as isize, 0, ptr::null_mut()) };
            })
        });
    } else {
        eprintln!("skipped: allocview_malloc/free (C ABI) needs ALLOCVIEW_BACKEND=sim");
    }
    group.finish();
    let dropped = agent.channel_sink().shared().dropped_total();
    eprintln!("agent sink: {dropped} events dropped (channel full) during the run");
    agent.shutdown();
}

criterion_group!(benches, bench);
criterion_main!(benches);
