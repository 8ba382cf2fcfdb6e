//! The agent's sink never allocates to publish, so it may sit behind `#[global_allocator]`.
//!
//! crossbeam's bounded channel is the array flavour: `try_send` reserves a slot of a ring
//! allocated once, writes the event and notifies receivers only when one is blocked (the
//! aggregator never blocks in `recv`; it drains with `try_recv`). This test counts this
//! thread's allocations around many publishes, into a channel with room and into a full one
//! (the drop path), with a counting global allocator of its own.

// A counting `GlobalAlloc` is an `unsafe impl`; nothing else here is unsafe.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use allocview_agent::sink;
use allocview_alloc::event::{CPU_DEVICE, Event, EventAction, EventPool, EventSink};

thread_local! {
    /// Allocations made by this thread (const, no destructor: safe inside the allocator).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

// SAFETY: forwards every call to `System` unchanged; the counter is a thread-local `Cell`.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

const CAPACITY: usize = 1024;

#[test]
fn publishing_host_events_allocates_nothing_even_when_the_channel_is_full() {
    let (sink, rx) = sink::channel(CAPACITY);
    rx.shared().set_consumer(std::thread::current());
    let event = Event::new(EventAction::Alloc, CPU_DEVICE, EventPool::Host, 0x1000, 64);
    sink.publish(&event); // first use of anything lazily initialised
    let before = ALLOCS.with(Cell::get);
    for _ in 0..(4 * CAPACITY) {
        sink.publish(&event);
    }
    let after = ALLOCS.with(Cell::get);
    assert_eq!(
        after,
        before,
        "publishing allocated {} times",
        after - before
    );
    assert_eq!(rx.len(), CAPACITY);
    assert_eq!(rx.shared().dropped_total(), 3 * CAPACITY as u64 + 1);
}
