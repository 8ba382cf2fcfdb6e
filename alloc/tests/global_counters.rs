//! `Instrumented<System>` as this test binary's `#[global_allocator]`: the counters move as the
//! program allocates, frees, grows, and allocates on another thread.
//!
//! One test only: the counters are process-wide, and a second test running alongside would
//! move them too.

use std::alloc::System;
use std::hint::black_box;
use std::sync::mpsc;

use allocview_alloc::global::Instrumented;

#[global_allocator]
static HEAP: Instrumented<System> = Instrumented::new(System);

const MIB: u64 = 1 << 20;

#[test]
fn the_counters_follow_what_the_program_does() {
    // A 1 MiB vector raises current, total and count; dropping it lowers current again.
    let before = HEAP.stats();
    let v = black_box(vec![1u8; MIB as usize]);
    let with = HEAP.stats();
    assert!(
        with.current_bytes >= before.current_bytes + MIB,
        "{before} -> {with}"
    );
    assert!(with.total_bytes >= before.total_bytes + MIB);
    assert!(with.count > before.count);
    assert!(with.peak_bytes >= with.current_bytes);
    drop(v);
    let after = HEAP.stats();
    assert!(
        after.current_bytes + MIB <= with.current_bytes,
        "{with} -> {after}"
    );
    assert!(after.frees > with.frees);
    assert!(
        after.peak_bytes >= before.current_bytes + MIB,
        "the peak remembers the vector"
    );

    // Growing a vector reallocates.
    let mut grow: Vec<u64> = Vec::with_capacity(16);
    grow.extend(0..100_000u64);
    black_box(&grow);
    let grown = HEAP.stats();
    assert!(grown.reallocs > after.reallocs);
    assert!(grown.current_bytes >= after.current_bytes + 800_000);
    drop(grow);

    // A second thread's allocations count too, while it holds them and after it ends.
    let before = HEAP.stats();
    let (held_tx, held_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        let data = black_box(vec![7u8; 4 * MIB as usize]);
        let boxes: Vec<Box<u64>> = (0..1000).map(Box::new).collect();
        held_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        drop((data, boxes));
    });
    held_rx.recv().unwrap();
    let during = HEAP.stats();
    assert!(
        during.current_bytes >= before.current_bytes + 4 * MIB,
        "{before} -> {during}"
    );
    assert!(during.count >= before.count + 1001);
    go_tx.send(()).unwrap();
    worker.join().unwrap();
    let after = HEAP.stats();
    assert!(
        after.current_bytes + 4 * MIB <= during.current_bytes,
        "{during} -> {after}"
    );
    assert!(after.total_bytes >= before.total_bytes + 4 * MIB + 8000);

    // Disabled: nothing moves.
    HEAP.set_enabled(false);
    let off = HEAP.stats();
    let v = black_box(vec![0u8; MIB as usize]);
    drop(v);
    assert_eq!(HEAP.stats().count, off.count);
    assert_eq!(HEAP.stats().total_bytes, off.total_bytes);
    HEAP.set_enabled(true);
}
