//! The aggregator folds a warm stream of `alloc` / `free` events in without allocating, whether
//! they come one by one or in batches: the mirror's maps keep their capacity, the histograms
//! have grown to the values' range, the recent-events ring is full, so an event costs no heap
//! traffic however many arrive.
//!
//! The process's allocations are counted by the alloc crate's `Instrumented` heap (this test
//! binary's `#[global_allocator]`) around many passes over the stream and one flush, which
//! allocates a little of its own.

#[path = "support/publish.rs"]
mod publish;
#[path = "support/toy.rs"]
mod toy;

use std::alloc::System;
use std::sync::{Arc, Mutex};

use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_alloc::event::{Event, EventAction, EventSink, now_ns};
use allocview_alloc::global::Instrumented;
use publish::Publish;

#[global_allocator]
static HEAP: Instrumented<System> = Instrumented::new(System);

/// Request sizes of the warm cycle: small and large pool, split and whole blocks.
const SIZES: [u64; 6] = [512, 4000, 100_000, 1 << 20, 3 << 20, 12 << 20];

/// Passes over the warm stream measured at once.
const PASSES: usize = 50;

/// Allocations one flush may make itself: its reply channel (two), a block of the command
/// queue, and the waker registration of its blocking receive when it has to wait (a few).
const FLUSH_ALLOCS_MAX: u64 = 8;

struct Recorder(Mutex<Vec<Event>>);

impl EventSink for Recorder {
    fn publish(&self, e: &Event) {
        self.0.lock().unwrap().push(*e);
    }
}

/// The events that create the cache, and those of one warm cycle that leaves the allocator
/// as it found it (each block freed right after its allocation).
fn recorded() -> (Vec<Event>, Vec<Event>) {
    let rec = Arc::new(Recorder(Mutex::new(Vec::with_capacity(1 << 16))));
    let dev = Arc::new(SimBackend::new(8 << 30));
    dev.add_stream(StreamId(1));
    let alloc = CachingAllocator::new(dev, AllocatorConfig::default());
    alloc.set_event_sink(Some(rec.clone()));
    let held: Vec<_> = SIZES
        .iter()
        .flat_map(|&s| [alloc.malloc(s, StreamId(0)), alloc.malloc(s, StreamId(1))])
        .map(Result::unwrap)
        .collect();
    for p in held {
        alloc.free(p).unwrap();
    }
    alloc.flush_events();
    let warm_up = std::mem::take(&mut *rec.0.lock().unwrap());
    for _ in 0..100 {
        for &s in &SIZES {
            for stream in [StreamId(0), StreamId(1)] {
                let p = alloc.malloc(s, stream).unwrap();
                alloc.free(p).unwrap();
            }
        }
    }
    alloc.set_event_sink(None);
    let cycle = std::mem::take(&mut *rec.0.lock().unwrap());
    // Fixed times: every pass records the same lifetimes into the histograms.
    let t = now_ns();
    let fix = |v: Vec<Event>| -> Vec<Event> {
        v.into_iter().map(|e| Event { time_ns: t, ..e }).collect()
    };
    (fix(warm_up), fix(cycle))
}

/// Folds the warm-up and two cycles, then counts the allocations of `PASSES` more cycles and
/// one flush.
fn fold_warm_stream(warm_up: &[Event], cycle: &[Event], publish: Publish) {
    let agent = toy::quiet_agent(
        &std::env::temp_dir().join("allocview-ingest-alloc-test"),
        (PASSES + 2) * (cycle.len() + warm_up.len()),
    )
    .spawn()
    .unwrap();
    let sink = agent.sink();
    publish.send(&*sink, warm_up);
    publish.send(&*sink, cycle);
    publish.send(&*sink, cycle);
    agent.flush();

    let before = HEAP.stats().count;
    for _ in 0..PASSES {
        publish.send(&*sink, cycle);
    }
    agent.flush();
    let allocs = HEAP.stats().count - before;
    assert!(
        allocs <= FLUSH_ALLOCS_MAX,
        "{} events published {publish:?} and one flush allocated {allocs} times",
        PASSES * cycle.len()
    );

    let p = agent.state().pipeline;
    assert_eq!(p.inconsistencies, 0);
    assert_eq!(p.dropped_total, 0);
    assert_eq!(
        p.events_ingested,
        (warm_up.len() + (2 + PASSES) * cycle.len()) as u64
    );
}

// One test, so that nothing else allocates in this binary while it counts.
#[test]
fn ingesting_a_warm_alloc_free_stream_allocates_nothing() {
    let (warm_up, cycle) = recorded();
    assert!(
        cycle.iter().all(|e| matches!(
            e.action,
            EventAction::Alloc
                | EventAction::Free
                | EventAction::FreeRequested
                | EventAction::FreeCompleted
        )),
        "the warm cycle is served from the cache"
    );
    assert!(cycle.len() >= 2 * allocview_agent::aggregator::DEFAULT_RECENT_EVENTS);
    fold_warm_stream(&warm_up, &cycle, Publish::OneByOne);
    fold_warm_stream(&warm_up, &cycle, Publish::Batch);
}
