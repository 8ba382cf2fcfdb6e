//! `Instrumented<System>` as the `#[global_allocator]` with a sink that allocates on every
//! event: the reentrancy guard keeps the sink from recursing into itself, and the events of
//! the program's own allocations still arrive.

use std::alloc::System;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use allocview_alloc::event::{Event, EventAction, EventSink};
use allocview_alloc::global::Instrumented;

#[global_allocator]
static HEAP: Instrumented<System> = Instrumented::new(System);

/// Allocates (a `String` and a `Vec`) for every event it receives.
struct AllocatingSink {
    events: AtomicU64,
    watched_addr: AtomicU64,
    watched_alloc_seen: AtomicU64,
    watched_free_seen: AtomicU64,
}

impl EventSink for AllocatingSink {
    fn publish(&self, event: &Event) {
        let text = format!(
            "{:?} {} bytes at {:#x}",
            event.action, event.size, event.addr
        );
        let copies: Vec<String> = vec![text.clone(), text];
        black_box(copies);
        self.events.fetch_add(1, Relaxed);
        if event.size == WATCHED_SIZE {
            match event.action {
                EventAction::Alloc => {
                    self.watched_addr.store(event.addr, Relaxed);
                    self.watched_alloc_seen.fetch_add(1, Relaxed);
                }
                EventAction::FreeCompleted if event.addr == self.watched_addr.load(Relaxed) => {
                    self.watched_free_seen.fetch_add(1, Relaxed);
                }
                _ => {}
            }
        }
    }
}

/// An allocation size nothing else in this test makes.
const WATCHED_SIZE: u64 = 3 * 1024 * 1024 + 8;

static SINK: AllocatingSink = AllocatingSink {
    events: AtomicU64::new(0),
    watched_addr: AtomicU64::new(0),
    watched_alloc_seen: AtomicU64::new(0),
    watched_free_seen: AtomicU64::new(0),
};

#[test]
fn a_sink_that_allocates_sees_the_programs_events_without_recursing() {
    HEAP.set_sink(Some(&SINK));
    let before = HEAP.stats();
    let v = black_box(vec![0u8; WATCHED_SIZE as usize]);
    let addr = v.as_ptr() as u64;
    drop(v);
    let after = HEAP.stats();
    HEAP.set_sink(None);

    assert_eq!(SINK.watched_alloc_seen.load(Relaxed), 1);
    assert_eq!(SINK.watched_addr.load(Relaxed), addr);
    assert_eq!(SINK.watched_free_seen.load(Relaxed), 1);
    // Each published event made the sink allocate (two strings, a vector) and free again:
    // those allocations are counted but were not published (else this would never end).
    let published = SINK.events.load(Relaxed);
    assert!(published >= 2);
    assert!(
        after.count - before.count > 3 * published,
        "{before} -> {after}"
    );
    assert!(after.frees - before.frees > 3 * published);

    let quiet = SINK.events.load(Relaxed);
    black_box(vec![1u8; 100]);
    assert_eq!(SINK.events.load(Relaxed), quiet, "no sink, no events");
}
