//! `DeviceBlock`: a caching-allocator block that frees itself when dropped.

#[path = "support/builders.rs"]
mod builders;

use std::sync::Arc;

use builders::*;

#[test]
fn a_dropped_block_goes_back_to_the_cache() {
    let (a, dev) = allocator();
    let a = Arc::new(a);
    {
        let block = a.malloc_owned(3 * MIB, S0).unwrap();
        assert_eq!(block.len(), 3 * MIB);
        assert_eq!(block.stream(), S0);
        assert_eq!(a.base_allocation(block.ptr()).unwrap().1, 20 * MIB);
        assert_eq!(cur(&a.device_stats().allocated_bytes), (3 * MIB) as i64);
    }
    assert_eq!(cur(&a.device_stats().allocated_bytes), 0);
    a.empty_cache().unwrap();
    assert_eq!(dev.used(), 0);
    check_consistent(&a);
}

#[test]
fn a_block_used_by_another_stream_is_freed_after_that_streams_work() {
    let (a, dev) = allocator();
    let a = Arc::new(a);
    let block = a.malloc_owned(4096, S0).unwrap();
    block.record_stream(S1).unwrap();
    dev.submit_work(S1);
    drop(block);
    let s = a.device_stats();
    assert_eq!((cur(&s.allocated_bytes), cur(&s.active)), (0, 1), "pending");
    dev.complete_stream(S1);
    a.process_events().unwrap();
    assert_eq!(cur(&a.device_stats().active), 0);
    check_consistent(&a);
}

#[test]
fn into_raw_gives_up_ownership_and_free_reports_errors() {
    let (a, _) = allocator();
    let a = Arc::new(a);
    let block = a.malloc_owned(100, S0).unwrap();
    let p = block.into_raw();
    assert_eq!(cur(&a.device_stats().allocation), 1, "still allocated");
    a.free(p).unwrap();
    let block = a.malloc_owned(100, S0).unwrap();
    block.free().unwrap();
    assert_eq!(cur(&a.device_stats().allocation), 0);
    assert_eq!(
        Arc::strong_count(&a),
        1,
        "blocks gave their allocator handle back"
    );
}

#[test]
fn blocks_move_between_threads() {
    let (a, _) = allocator();
    let a = Arc::new(a);
    let blocks: Vec<_> = (0..8)
        .map(|i| a.malloc_owned((i + 1) * KIB, S0).unwrap())
        .collect();
    std::thread::scope(|s| {
        for b in blocks {
            s.spawn(move || drop(b));
        }
    });
    assert_eq!(cur(&a.device_stats().allocation), 0);
    check_consistent(&a);
}
