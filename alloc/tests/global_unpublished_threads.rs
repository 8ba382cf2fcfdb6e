//! `Instrumented<System>` as the `#[global_allocator]` with a sink: threads whose OS name
//! starts with `UNPUBLISHED_THREAD_PREFIX`, and the unnamed threads they start (which inherit
//! that name on Linux), publish nothing, while their allocations are still counted; other
//! threads publish as before.

use std::alloc::System;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use allocview_alloc::event::{Event, EventAction, EventSink};
use allocview_alloc::global::{Instrumented, UNPUBLISHED_THREAD_PREFIX};

#[global_allocator]
static HEAP: Instrumented<System> = Instrumented::new(System);

/// Counts the allocations of [`WATCHED_SIZE`] it is told of.
struct WatchingSink {
    watched: AtomicU64,
}

impl EventSink for WatchingSink {
    fn publish(&self, event: &Event) {
        if event.action == EventAction::Alloc && event.size == WATCHED_SIZE {
            self.watched.fetch_add(1, Relaxed);
        }
    }
}

/// An allocation size nothing else in this test makes.
const WATCHED_SIZE: u64 = 5 * 1024 * 1024 + 24;

static SINK: WatchingSink = WatchingSink {
    watched: AtomicU64::new(0),
};

/// Allocates and frees one block of the watched size.
fn allocate_watched() {
    black_box(vec![0u8; WATCHED_SIZE as usize]);
}

/// Events of the watched size published while `f` runs on a thread named `name` (`None`:
/// unnamed), and the allocations the heap counted meanwhile.
fn watched_on(name: Option<String>, f: fn()) -> (u64, u64) {
    let before = (SINK.watched.load(Relaxed), HEAP.stats().count);
    let mut b = std::thread::Builder::new();
    if let Some(n) = name {
        b = b.name(n);
    }
    b.spawn(f).unwrap().join().unwrap();
    (
        SINK.watched.load(Relaxed) - before.0,
        HEAP.stats().count - before.1,
    )
}

#[test]
fn threads_named_for_the_agent_and_the_threads_they_start_publish_nothing_but_still_count() {
    HEAP.set_sink(Some(&SINK));
    let (published, counted) = watched_on(Some("worker".into()), allocate_watched);
    assert_eq!(published, 1, "another thread publishes");
    assert!(counted >= 1);

    let agent_name = format!("{UNPUBLISHED_THREAD_PREFIX}test");
    let (published, counted) = watched_on(Some(agent_name.clone()), allocate_watched);
    let expected = if cfg!(target_os = "linux") { 0 } else { 1 };
    assert_eq!(published, expected, "a thread named {agent_name}");
    assert!(counted >= 1, "its allocations are still counted");

    // An unnamed thread started by such a thread (as a library's would be) inherits its name.
    let (published, _) = watched_on(Some(agent_name), || {
        std::thread::spawn(allocate_watched).join().unwrap();
    });
    assert_eq!(published, expected, "a thread it started");

    // An unnamed thread of the test's own: published.
    let (published, _) = watched_on(None, allocate_watched);
    assert_eq!(published, 1);
    // A name like a program's (`allocview-svc`, which a program's unnamed threads inherit)
    // does not match: only the prefix with its `:` does.
    let (published, _) = watched_on(Some("allocview-svc".into()), allocate_watched);
    assert_eq!(published, 1, "a thread named like a program");
    HEAP.set_sink(None);
}
