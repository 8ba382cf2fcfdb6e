//! A program watching its own heap: `Instrumented<System>` is the global allocator, and the
//! program prints the counters as it builds and drops data, then publishes a few events to a
//! sink of its own.
//!
//! Run: `cargo run -p allocview-alloc --example 01-cpu-tracking`

use std::alloc::System;
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use allocview_alloc::event::{Event, EventAction, EventSink};
use allocview_alloc::global::Instrumented;

#[global_allocator]
static HEAP: Instrumented<System> = Instrumented::new(System);

/// A sink that only counts (a sink runs inside the allocator: no locks, no allocation).
struct CountingSink {
    allocs: AtomicU64,
    frees: AtomicU64,
    bytes: AtomicU64,
}

impl EventSink for CountingSink {
    fn publish(&self, event: &Event) {
        match event.action {
            EventAction::Alloc => {
                self.allocs.fetch_add(1, Relaxed);
                self.bytes.fetch_add(event.size, Relaxed);
            }
            EventAction::FreeCompleted => {
                self.frees.fetch_add(1, Relaxed);
            }
            _ => {}
        }
    }
}

static SINK: CountingSink = CountingSink {
    allocs: AtomicU64::new(0),
    frees: AtomicU64::new(0),
    bytes: AtomicU64::new(0),
};

fn report(step: &str) {
    println!("{step:<38} {}", HEAP.stats());
}

fn main() {
    report("start");

    let big = black_box(vec![0u8; 16 << 20]);
    report("16 MiB vector allocated");

    let mut words: Vec<String> = Vec::new();
    for i in 0..100_000 {
        words.push(format!("word number {i}"));
    }
    report("100 000 strings pushed");

    let index: HashMap<&str, usize> = words
        .iter()
        .enumerate()
        .map(|(i, w)| (w.as_str(), i))
        .collect();
    report("map over the strings built");

    drop(index);
    report("map dropped");
    drop(big);
    report("16 MiB vector dropped");

    let handles: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let chunks: Vec<Vec<u8>> = (0..256).map(|_| vec![t as u8; 4096]).collect();
                black_box(chunks.len())
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread");
    }
    report("4 threads allocated 1 MiB each, ended");

    drop(words);
    report("strings dropped");

    HEAP.set_sink(Some(&SINK));
    let boxes: Vec<Box<[u8; 64]>> = (0..1000).map(|_| Box::new([0u8; 64])).collect();
    drop(boxes);
    HEAP.set_sink(None);
    println!(
        "sink saw {} allocations ({} bytes) and {} frees while set",
        SINK.allocs.load(Relaxed),
        SINK.bytes.load(Relaxed),
        SINK.frees.load(Relaxed)
    );
    report("end");
}
