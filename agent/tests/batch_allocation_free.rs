//! Publishing batches allocates nothing: a batch is built on the stack and moved into a slot
//! allocated with the channel, and a dropped batch only bumps counters, whether the batch
//! channel has room, is full, is latched, the batch holds an OOM, the slice is split or the
//! receiver is gone. (`ingest_allocation_free.rs` folds a warm stream of batches.)
//!
//! Allocations are counted by the alloc crate's `Instrumented` heap (this test binary's
//! `#[global_allocator]`); the binary holds one test, so nothing else runs beside it.

use std::alloc::System;

use allocview_agent::sink;
use allocview_alloc::event::{Event, EventAction, EventPool, EventSink, MAX_BATCH};
use allocview_alloc::global::Instrumented;

#[global_allocator]
static HEAP: Instrumented<System> = Instrumented::new(System);

/// Batches in the bare channel's ring.
const BATCHES: usize = 16;

fn ev(action: EventAction, i: u64) -> Event {
    Event::new(action, 0, EventPool::Large, 0x1000 + i, 512)
}

#[test]
fn publishing_batches_allocates_nothing() {
    // A bare channel, every path of `publish_batch`.
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
}
