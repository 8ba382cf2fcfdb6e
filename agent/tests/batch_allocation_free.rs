//! Publishing batches allocates nothing: a batch is built on the stack and moved into a slot
//! allocated with the channel, and a dropped batch only bumps counters, whether the batch
//! channel has room, is full, is latched, the batch holds an OOM, the slice is split or the
//! receiver is gone. And the aggregator folds a warm stream of batches in without allocating.
//!
//! Allocations are counted by the alloc crate's `Instrumented` heap (this test binary's
//! `#[global_allocator]`); the binary holds one test, so nothing else runs beside it.

use std::alloc::System;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use allocview_agent::agent::Agent;
use allocview_agent::sink;
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_alloc::event::{Event, EventAction, EventPool, EventSink, MAX_BATCH};
use allocview_alloc::global::Instrumented;

#[global_allocator]
static HEAP: Instrumented<System> = Instrumented::new(System);

/// Batches in the bare channel's ring.
const BATCHES: usize = 16;

/// Passes over the warm cycle folded at once.
const PASSES: usize = 20;

/// Allocations one flush may make itself (as in `ingest_allocation_free.rs`).
const FLUSH_ALLOCS_MAX: u64 = 8;

fn ev(action: EventAction, i: u64) -> Event {
    Event::new(action, 0, EventPool::Large, 0x1000 + i, 512)
}

struct Recorder(Mutex<Vec<Event>>);

impl EventSink for Recorder {
    fn publish(&self, e: &Event) {
        self.0.lock().unwrap().push(*e);
    }
}

/// The events that create a cache, and those of a warm cycle served from it.
fn recorded() -> (Vec<Event>, Vec<Event>) {
    let rec = Arc::new(Recorder(Mutex::new(Vec::with_capacity(1 << 14))));
    let alloc = CachingAllocator::new(
        Arc::new(SimBackend::new(8 << 30)),
        AllocatorConfig::default(),
    );
    alloc.set_event_sink(Some(rec.clone()));
    let sizes = [512u64, 4000, 100_000, 1 << 20, 3 << 20];
    let held: Vec<_> = sizes
        .iter()
        .map(|&s| alloc.malloc(s, StreamId(0)).unwrap())
        .collect();
    for p in held {
        alloc.free(p).unwrap();
    }
    alloc.flush_events();
    let warm_up = std::mem::take(&mut *rec.0.lock().unwrap());
    for _ in 0..300 {
        for &s in &sizes {
            let p = alloc.malloc(s, StreamId(0)).unwrap();
            alloc.free(p).unwrap();
        }
    }
    alloc.set_event_sink(None);
    let cycle = std::mem::take(&mut *rec.0.lock().unwrap());
    (warm_up, cycle)
}

#[test]
fn publishing_and_folding_batches_allocates_nothing() {
    // Phase 1: a bare channel, every path of `publish_batch`.
    let (sink, rx) = sink::channel(BATCHES * MAX_BATCH);
    rx.shared().set_consumer(std::thread::current());
    let batch: Vec<Event> = (0..MAX_BATCH as u64)
        .map(|i| ev(EventAction::Alloc, i))
        .collect();
    let oversized: Vec<Event> = (0..3 * MAX_BATCH as u64 + 1)
        .map(|i| ev(EventAction::FreeRequested, i))
        .collect();
    let oom = [ev(EventAction::AllocRetry, 0), ev(EventAction::Oom, 1)];
    sink.publish_batch(&batch); // first use of anything lazily initialised
    let before = HEAP.stats().count;
    for _ in 0..4 * BATCHES {
        sink.publish_batch(&batch); // fits, then full, then latched
    }
    sink.publish_batch(&oversized);
    rx.try_recv_batch();
    sink.publish_batch(&oom); // probes past the latch
    sink.publish_batch(&[]);
    let after = HEAP.stats().count;
    assert_eq!(
        after,
        before,
        "publishing batches allocated {} times",
        after - before
    );
    assert_eq!(rx.batch_len(), BATCHES);
    let dropped = (4 * BATCHES + 1 - BATCHES) * MAX_BATCH + oversized.len();
    assert_eq!(sink.shared().dropped_total(), dropped as u64);
    drop(rx);
    let before = HEAP.stats().count;
    sink.publish_batch(&batch); // disconnected
    assert_eq!(HEAP.stats().count, before);

    // Phase 2: the aggregator folds a warm stream published in batches.
    let (warm_up, cycle) = recorded();
    assert!(
        cycle.iter().all(|e| matches!(
            e.action,
            EventAction::Alloc | EventAction::FreeRequested | EventAction::FreeCompleted
        )),
        "the warm cycle is served from the cache"
    );
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(std::env::temp_dir().join("allocview-batch-alloc-test"))
        .channel_capacity((PASSES + 2) * (cycle.len() + warm_up.len()))
        .tick(Duration::from_secs(3600))
        .spawn()
        .unwrap();
    let sink = agent.sink();
    sink.publish_batch(&warm_up);
    sink.publish_batch(&cycle);
    sink.publish_batch(&cycle);
    agent.flush();
    let before = HEAP.stats().count;
    for _ in 0..PASSES {
        sink.publish_batch(&cycle);
    }
    agent.flush();
    let allocs = HEAP.stats().count - before;
    assert!(
        allocs <= FLUSH_ALLOCS_MAX,
        "{} events in batches and one flush allocated {allocs} times",
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
