//! One test per rule of the caching allocator spec, with the numbers worked out by hand.

#[path = "support/builders.rs"]
mod builders;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use allocview_alloc::caching::{AllocError, StreamId};
use builders::*;

#[test]
fn a_small_request_takes_512_bytes_of_a_new_2_mib_small_segment() {
    let (a, dev) = allocator();
    let p = a.malloc(1, S0).unwrap();
    let s = a.device_stats();
    assert_eq!(cur(&s.allocated_bytes), 512);
    assert_eq!(s.allocated_bytes.0[1].current, 512, "small pool");
    assert_eq!(cur(&s.requested_bytes), 1);
    assert_eq!(cur(&s.reserved_bytes), 2 * MIB as i64);
    assert_eq!(s.segment.0[1].current, 1);
    assert_eq!(s.num_device_alloc, 1);
    assert_eq!(dev.used(), 2 * MIB);
    // The allocated piece is the front of the segment; the rest is an inactive split block.
    assert_eq!(a.base_allocation(p), Some((p, 2 * MIB)));
    assert_eq!(cur(&s.inactive_split), 1);
    assert_eq!(cur(&s.inactive_split_bytes), (2 * MIB - 512) as i64);
    check_consistent(&a);
}

#[test]
fn segment_sizes_are_2_mib_20_mib_or_the_request_rounded_to_2_mib() {
    let (a, _) = allocator();
    let small = a.malloc(MIB, S0).unwrap();
    let mid = a.malloc(MIB + 1, S0).unwrap();
    // On another stream, so it cannot fit in the 20 MiB segment's free tail.
    let big = a.malloc(10 * MIB + 1, S1).unwrap();
    assert_eq!(a.base_allocation(small).unwrap().1, 2 * MIB);
    assert_eq!(a.base_allocation(mid).unwrap().1, 20 * MIB);
    assert_eq!(a.base_allocation(big).unwrap().1, 12 * MIB);
    let s = a.device_stats();
    assert_eq!(cur(&s.reserved_bytes), (2 + 20 + 12) * MIB as i64);
    assert_eq!(s.segment.0[2].current, 2, "two large segments");
    check_consistent(&a);
}

#[test]
fn best_fit_takes_the_smallest_block_that_fits_at_the_lowest_address() {
    let (a, _) = allocator();
    // One 2 MiB segment cut into pieces of 64, 16, 64, 16 KiB and the rest.
    let p1 = a.malloc(64 * KIB, S0).unwrap();
    let k1 = a.malloc(16 * KIB, S0).unwrap();
    let p2 = a.malloc(64 * KIB, S0).unwrap();
    let k2 = a.malloc(16 * KIB, S0).unwrap();
    a.free(p1).unwrap();
    a.free(p2).unwrap();
    // Free: 64 KiB at p1, 64 KiB at p2, and the tail (2 MiB - 160 KiB). A 40 KiB request takes
    // the 64 KiB block at the lower address.
    let q = a.malloc(40 * KIB, S0).unwrap();
    assert_eq!(q, p1);
    // 24 KiB remained at p1 + 40 KiB: a 20 KiB request fits it best.
    let r = a.malloc(20 * KIB, S0).unwrap();
    assert_eq!(r, p1 + 40 * KIB);
    let _ = (k1, k2);
    check_consistent(&a);
}

#[test]
fn blocks_are_never_shared_across_streams() {
    let (a, _) = allocator();
    let p = a.malloc(1000, S0).unwrap();
    a.free(p).unwrap();
    let q = a.malloc(1000, S1).unwrap();
    assert_ne!(
        a.base_allocation(q).unwrap().0,
        a.base_allocation(p).unwrap().0
    );
    assert_eq!(a.device_stats().segment.0[0].current, 2);
    let r = a.malloc(1000, S0).unwrap();
    assert_eq!(r, p, "stream 0 reuses its own cached block");
    check_consistent(&a);
}

#[test]
fn a_large_block_with_exactly_1_mib_left_over_is_not_split() {
    let (a, _) = allocator();
    // 19 MiB gets a 20 MiB segment; the remainder of exactly 1 MiB stays inside the block.
    let p = a.malloc(19 * MIB, S0).unwrap();
    let s = a.device_stats();
    assert_eq!(cur(&s.allocated_bytes), 20 * MIB as i64);
    assert_eq!(cur(&s.requested_bytes), 19 * MIB as i64);
    assert_eq!(cur(&s.inactive_split), 0);
    let snap = check_consistent(&a);
    assert_eq!(snap.segments[0].blocks.len(), 1);
    a.free(p).unwrap();
    // 512 bytes less leaves 1 MiB + 512 > 1 MiB: split.
    let (a, _) = allocator();
    a.malloc(19 * MIB - 512, S0).unwrap();
    let s = a.device_stats();
    assert_eq!(cur(&s.allocated_bytes), (19 * MIB - 512) as i64);
    assert_eq!(cur(&s.inactive_split_bytes), (MIB + 512) as i64);
    check_consistent(&a);
}

#[test]
fn small_pool_blocks_split_when_512_bytes_remain() {
    let (a, _) = allocator();
    let p = a.malloc(2 * MIB - 512, S0).unwrap(); // rounded 2 MiB - 512 > 1 MiB: large pool!
    assert_eq!(a.device_stats().segment.0[2].current, 1);
    a.free(p).unwrap();
    // A 1 MiB small request in a 2 MiB small segment leaves exactly 1 MiB, split off.
    let q = a.malloc(MIB, S0).unwrap();
    let s = a.device_stats();
    assert_eq!(s.allocated_bytes.0[1].current, MIB as i64);
    assert_eq!(s.inactive_split_bytes.0[1].current, MIB as i64);
    let _ = q;
    check_consistent(&a);
}

#[test]
fn freeing_merges_with_free_neighbours_and_undoes_inactive_split() {
    let (a, _) = allocator();
    let x = a.malloc(4 * KIB, S0).unwrap();
    let y = a.malloc(4 * KIB, S0).unwrap();
    let z = a.malloc(4 * KIB, S0).unwrap();
    assert_eq!((y - x, z - y), (4 * KIB, 4 * KIB));
    let s = a.device_stats();
    assert_eq!(cur(&s.inactive_split), 1);
    a.free(y).unwrap(); // a hole between x and z: two inactive split blocks
    let s = a.device_stats();
    assert_eq!(cur(&s.inactive_split), 2);
    assert_eq!(cur(&s.inactive_split_bytes), (2 * MIB - 8 * KIB) as i64);
    a.free(z).unwrap(); // z merges with y and the tail: net one block less
    let s = a.device_stats();
    assert_eq!(cur(&s.inactive_split), 1);
    assert_eq!(cur(&s.inactive_split_bytes), (2 * MIB - 4 * KIB) as i64);
    a.free(x).unwrap(); // the whole segment is one free block: not split any more
    let s = a.device_stats();
    assert_eq!(
        (cur(&s.inactive_split), cur(&s.inactive_split_bytes)),
        (0, 0)
    );
    let snap = check_consistent(&a);
    assert_eq!(snap.segments[0].blocks.len(), 1);
    a.empty_cache().unwrap();
    assert_eq!(cur(&a.device_stats().reserved_bytes), 0);
}

#[test]
fn a_request_below_max_split_size_never_takes_an_oversize_block() {
    let (a, _) = allocator_with(8 * GIB, "max_split_size_mb:20");
    let big = a.malloc(30 * MIB, S0).unwrap();
    assert_eq!(a.device_stats().oversize_segments.current, 1);
    assert_eq!(a.device_stats().oversize_allocations.current, 1);
    a.free(big).unwrap();
    // 5 MiB < 20 MiB may not take the cached 30 MiB block: a new 20 MiB segment.
    let p = a.malloc(5 * MIB, S0).unwrap();
    assert_ne!(p, big);
    let s = a.device_stats();
    assert_eq!(cur(&s.reserved_bytes), 50 * MIB as i64);
    // 25 MiB >= 20 MiB may take it: 30 < 25 + 20. Unsplit (oversize blocks never split).
    let q = a.malloc(25 * MIB, S0).unwrap();
    assert_eq!(q, big);
    let s = a.device_stats();
    // 5 MiB split from its 20 MiB segment, plus the whole 30 MiB block.
    assert_eq!(cur(&s.allocated_bytes), (5 + 30) * MIB as i64);
    assert_eq!(s.max_split_size, 20 * MIB as i64);
    check_consistent(&a);
}

#[test]
fn an_oversize_request_takes_a_cached_block_only_within_max_non_split_rounding() {
    let (a, _) = allocator_with(8 * GIB, "max_split_size_mb:20");
    let big = a.malloc(44 * MIB, S0).unwrap();
    a.free(big).unwrap();
    // 22 MiB + 20 MiB = 42 MiB <= 44 MiB: too wasteful, a new segment instead.
    let p = a.malloc(22 * MIB, S0).unwrap();
    assert_ne!(p, big);
    // 24 MiB + 20 MiB = 44 MiB: still not strictly below; 26 MiB: 46 > 44 takes it.
    let q = a.malloc(26 * MIB, S0).unwrap();
    assert_eq!(q, big);
    check_consistent(&a);
}

#[test]
fn with_max_split_size_oversize_cached_blocks_of_the_stream_are_freed_before_the_full_flush() {
    // 100 MiB device: a cached 60 MiB oversize block and a live 30 MiB block.
    let (a, dev) = allocator_with(100 * MIB, "max_split_size_mb:20");
    let big = a.malloc(60 * MIB, S0).unwrap();
    let _live = a.malloc(30 * MIB, S0).unwrap();
    a.free(big).unwrap();
    // 40 MiB does not fit beside (90 MiB used); the cached 60 MiB block is released (step c),
    // and the second attempt succeeds: no retry counted, no sync.
    let p = a.malloc(40 * MIB, S0).unwrap();
    let s = a.device_stats();
    assert_eq!(s.num_alloc_retries, 0);
    assert_eq!(s.num_sync_all_streams, 0);
    assert_eq!(s.num_device_free, 1);
    assert_eq!(dev.used(), 70 * MIB);
    let _ = p;
    check_consistent(&a);
}

#[test]
fn only_the_attempt_after_the_full_flush_counts_as_a_retry() {
    // 40 MiB device; a cached 20 MiB segment blocks a 30 MiB request until it is released.
    let (a, dev) = allocator_with(40 * MIB, "");
    let p = a.malloc(5 * MIB, S0).unwrap();
    a.free(p).unwrap();
    assert_eq!(dev.used(), 20 * MIB);
    let q = a.malloc(30 * MIB, S0).unwrap();
    let s = a.device_stats();
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_sync_all_streams, 1);
    assert_eq!(s.num_device_free, 1);
    assert_eq!(dev.used(), 30 * MIB);
    // An allocation that fits at once counts nothing.
    a.free(q).unwrap();
    a.malloc(30 * MIB, S0).unwrap();
    assert_eq!(a.device_stats().num_alloc_retries, 1);
}

#[test]
fn allocated_drops_at_free_and_active_when_a_stream_deferred_free_completes() {
    let (a, dev) = allocator();
    let p = a.malloc(4096, S0).unwrap();
    a.record_stream(p, S1).unwrap();
    dev.submit_work(S1);
    a.free(p).unwrap();
    let s = a.device_stats();
    assert_eq!(cur(&s.allocated_bytes), 0);
    assert_eq!(cur(&s.allocation), 0);
    assert_eq!(cur(&s.active_bytes), 4096);
    assert_eq!(cur(&s.requested_bytes), 4096);
    let snap = check_consistent(&a);
    assert_eq!(
        snap.segments[0].blocks[0].state,
        allocview_alloc::snapshot::BlockState::ActivePendingFree
    );
    // The block is not reused while stream 1 has not finished.
    let q = a.malloc(4096, S0).unwrap();
    assert_ne!(q, p);
    dev.complete_stream(S1);
    a.free(q).unwrap();
    // The next malloc processes the completed event: the block is free and reused.
    let r = a.malloc(4096, S0).unwrap();
    assert_eq!(r, p);
    let s = a.device_stats();
    assert_eq!(cur(&s.active_bytes), 4096);
    check_consistent(&a);
}

#[test]
fn process_events_completes_finished_deferred_frees_without_a_malloc() {
    let (a, dev) = allocator();
    let p = a.malloc(4096, S0).unwrap();
    let q = a.malloc(4096, S0).unwrap();
    a.record_stream(p, S1).unwrap();
    dev.submit_work(S1);
    a.free(p).unwrap();
    a.record_stream(q, S2).unwrap();
    dev.submit_work(S2);
    a.free(q).unwrap();
    // Nothing has finished: nothing completes.
    a.process_events().unwrap();
    assert_eq!(cur(&a.device_stats().active_bytes), 8192);
    dev.complete_stream(S1);
    a.process_events().unwrap();
    // Only the block stream 1 held is free; stream 2's is still pending.
    let s = a.device_stats();
    assert_eq!(cur(&s.active_bytes), 4096);
    assert_eq!(cur(&s.allocated_bytes), 0);
    let snap = check_consistent(&a);
    let states: Vec<_> = snap.segments[0].blocks.iter().map(|b| b.state).collect();
    use allocview_alloc::snapshot::BlockState::{ActivePendingFree, Inactive};
    assert_eq!(states, [Inactive, ActivePendingFree, Inactive]);
}

#[test]
fn record_stream_on_the_allocation_stream_is_ignored() {
    let (a, dev) = allocator();
    let p = a.malloc(4096, S1).unwrap();
    a.record_stream(p, S1).unwrap();
    dev.submit_work(S1);
    a.free(p).unwrap();
    assert_eq!(cur(&a.device_stats().active_bytes), 0);
}

#[test]
fn deferred_frees_complete_in_fifo_order_per_stream() {
    let (a, dev) = allocator();
    let p = a.malloc(4096, S0).unwrap();
    let q = a.malloc(8192, S0).unwrap();
    a.record_stream(p, S1).unwrap();
    dev.submit_work(S1);
    a.free(p).unwrap();
    a.record_stream(q, S1).unwrap();
    dev.submit_work(S1);
    a.free(q).unwrap();
    assert_eq!(cur(&a.device_stats().active), 2);
    dev.complete_stream(S1);
    a.malloc(512, S2).unwrap();
    assert_eq!(
        cur(&a.device_stats().active),
        1,
        "only the new block is active"
    );
    check_consistent(&a);
}

#[test]
fn empty_cache_waits_for_pending_frees_and_returns_every_whole_segment() {
    let (a, dev) = allocator();
    let p = a.malloc(4096, S0).unwrap();
    let big = a.malloc(30 * MIB, S0).unwrap();
    a.record_stream(p, S1).unwrap();
    dev.submit_work(S1);
    a.free(p).unwrap();
    a.free(big).unwrap();
    a.empty_cache().unwrap();
    let s = a.device_stats();
    assert_eq!(s.num_sync_all_streams, 1);
    assert_eq!(cur(&s.reserved_bytes), 0);
    assert_eq!(cur(&s.segment), 0);
    assert_eq!(cur(&s.active), 0);
    assert_eq!(s.num_device_free, 2);
    assert_eq!(dev.used(), 0);
}

#[test]
fn a_pending_free_survives_a_failed_synchronize_and_completes_at_the_next_empty_cache() {
    let (a, dev) = allocator();
    let p = a.malloc(4096, S0).unwrap();
    let q = a.malloc(8192, S0).unwrap();
    a.record_stream(p, S1).unwrap();
    a.record_stream(q, S2).unwrap();
    dev.submit_work(S1);
    dev.submit_work(S2);
    a.free(p).unwrap();
    a.free(q).unwrap();
    // The wait fails (a device error): the frees stay pending rather than being lost.
    dev.set_events_never_complete(true);
    assert!(a.empty_cache().is_err());
    assert_eq!(cur(&a.device_stats().active), 2, "both frees still pending");
    dev.set_events_never_complete(false);
    a.empty_cache().unwrap();
    let s = a.device_stats();
    assert_eq!(cur(&s.active), 0);
    assert_eq!(cur(&s.reserved_bytes), 0);
    assert_eq!(dev.used(), 0, "the segment went back to the device");
    check_consistent(&a);
    drop(a);
    assert_eq!(
        dev.live_events(),
        0,
        "every event was pooled, and destroyed with the allocator"
    );
}

#[test]
fn a_memory_fraction_refuses_a_segment_without_asking_the_device() {
    let (a, dev) = allocator_with(100 * MIB, "");
    a.set_memory_fraction(0.5).unwrap();
    let p = a.malloc(40 * MIB, S0).unwrap();
    // 40 + 20 > 50: refused; nothing cached to free; OOM with the allowed limit.
    let e = a.malloc(5 * MIB, S0).unwrap_err();
    let oom = e.out_of_memory().expect("an OOM");
    assert_eq!(oom.allowed_max, Some(50 * MIB));
    assert_eq!(oom.rounded, 5 * MIB);
    assert_eq!(dev.used(), 40 * MIB);
    assert_eq!(a.device_stats().num_ooms, 1);
    a.free(p).unwrap();
    assert!(a.set_memory_fraction(1.5).is_err());
    assert!(a.set_memory_fraction(-0.1).is_err());
}

#[test]
fn garbage_collection_frees_old_cached_blocks_above_the_threshold() {
    // allowed = 100 MiB, threshold 0.5: collect when reserved > 50 MiB.
    for (conf, reserved_after, device_frees) in [
        ("garbage_collection_threshold:0.5", 40 * MIB, 2),
        ("", 100 * MIB, 0),
    ] {
        let (a, _) = allocator_with(100 * MIB, conf);
        a.set_memory_fraction(1.0).unwrap();
        let x = a.malloc(30 * MIB, S0).unwrap();
        let y = a.malloc(30 * MIB, S0).unwrap();
        a.free(x).unwrap();
        a.free(y).unwrap();
        // 40 MiB fits no cached block. With GC: reserved 60 > 50, both blocks are of average
        // age, both go; then the 40 MiB segment. Without: 60 + 40 = 100 fits beside them.
        a.malloc(40 * MIB, S0).unwrap();
        let s = a.device_stats();
        assert_eq!(cur(&s.reserved_bytes), reserved_after as i64, "{conf}");
        assert_eq!(s.num_device_free, device_frees, "{conf}");
        assert_eq!(s.num_alloc_retries, 0);
    }
}

#[test]
fn oom_records_an_entry_counts_and_calls_observers_outside_the_lock() {
    let (a, dev) = allocator_with(64 * MIB, "");
    let a = Arc::new(a);
    a.record_history(Default::default());
    let calls = Arc::new(AtomicUsize::new(0));
    // A weak handle: the observer lives inside the allocator, so a strong one would be a cycle.
    let (a2, c2) = (Arc::downgrade(&a), calls.clone());
    a.attach_oom_observer(move |info| {
        // Calling the allocator here would deadlock if observers ran under the lock.
        let a2 = a2.upgrade().expect("the allocator outlives its observers");
        assert_eq!(a2.device_stats().num_ooms, 1);
        assert_eq!(info.size, 100 * MIB);
        assert_eq!(info.segment_size, 100 * MIB);
        assert_eq!(info.total_or_allowed, 64 * MIB);
        assert_eq!(info.device_free, 64 * MIB);
        c2.fetch_add(1, Ordering::SeqCst);
    });
    let e = a.malloc(100 * MIB - 100, S0).unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let AllocError::OutOfMemory(oom) = &e else {
        panic!("{e}")
    };
    assert_eq!(oom.requested, 100 * MIB - 100);
    assert_eq!(oom.device_total, 64 * MIB);
    assert_eq!(dev.used(), 0);
    let msg = e.to_string();
    assert!(
        msg.contains("100.00 MiB") && msg.contains("64.00 MiB"),
        "{msg}"
    );
    let s = a.device_stats();
    assert_eq!((s.num_ooms, s.num_alloc_retries), (1, 1));
    let snap = a.snapshot();
    let oom_entry = snap.device_traces[0]
        .iter()
        .find(|t| t.action == allocview_alloc::snapshot::TraceAction::Oom)
        .expect("an oom entry");
    assert_eq!(
        oom_entry.addr,
        64 * MIB,
        "the address field holds device free"
    );
    assert_eq!(oom_entry.size, 100 * MIB, "the size is the rounded request");
}

#[test]
fn oom_message_names_the_fragmentation_and_the_config_variable() {
    let (a, _) = allocator_with(40 * MIB, "");
    // Two 20 MiB segments, each with a small live block: 38 MiB stranded in split segments.
    let p = a.malloc(2 * MIB, S0).unwrap();
    let _q = a.malloc(18 * MIB, S0).unwrap();
    let r = a.malloc(2 * MIB, S0).unwrap();
    let _t = a.malloc(18 * MIB, S0).unwrap();
    a.free(p).unwrap();
    a.free(r).unwrap();
    let e = a.malloc(3 * MIB, S0).unwrap_err();
    let oom = e.out_of_memory().unwrap();
    assert_eq!(oom.reserved_unallocated, 4 * MIB);
    assert_eq!(oom.stranded_in_split_segments, 4 * MIB);
    assert_eq!(oom.largest_free_block, 2 * MIB);
    assert!(oom.expandable_segments_would_help());
    let msg = e.to_string();
    assert!(
        msg.contains("ALLOCVIEW_ALLOC_CONF=expandable_segments:True"),
        "{msg}"
    );
}

#[test]
fn an_oom_message_names_the_segment_a_small_request_needed() {
    let (a, _) = allocator_with(100 * MIB, "");
    a.set_memory_fraction(0.01).unwrap();
    // 100 bytes round to 512 and need a 2 MiB segment, beyond the 1 MiB the fraction allows:
    // PyTorch says "Tried to allocate 2.00 MiB".
    let msg = a.malloc(100, S0).unwrap_err().to_string();
    assert!(
        msg.contains("could not allocate 512 bytes (100 bytes requested), which needed a new segment of 2.00 MiB"),
        "{msg}"
    );
}

#[test]
fn an_oom_beyond_the_device_says_no_setting_helps_rather_than_blaming_fragmentation() {
    let (a, _) = allocator_with(GIB, "");
    let _p = a.malloc(100, S0).unwrap();
    let e = a.malloc(2 * GIB, S0).unwrap_err();
    let oom = e.out_of_memory().unwrap();
    assert!(!oom.fits_beside_allocated());
    assert!(!oom.reserved_unallocated_is_large());
    let msg = e.to_string();
    assert!(!msg.contains("fragmentation"), "{msg}");
    assert!(
        msg.contains("no allocator setting avoids this OOM"),
        "{msg}"
    );
    assert!(msg.contains("or use a larger device"), "{msg}");
}

#[test]
fn expandable_segments_are_not_promised_to_help_past_the_memory_fraction() {
    let (a, _) = allocator_with(100 * MIB, "");
    // Ten 9 MiB blocks, two per 20 MiB segment; every other one freed: 45 MiB allocated,
    // 55 MiB cached in 11 MiB pieces.
    let ps: Vec<_> = (0..10).map(|_| a.malloc(9 * MIB, S0).unwrap()).collect();
    for p in ps.iter().step_by(2) {
        a.free(*p).unwrap();
    }
    a.set_memory_fraction(0.5).unwrap();
    // 40 MiB would fit in the 55 MiB cached, but not beside the 45 MiB allocated within 50 MiB.
    let e = a.malloc(40 * MIB, S0).unwrap_err();
    let oom = e.out_of_memory().unwrap();
    assert_eq!(oom.reserved_unallocated, 55 * MIB);
    assert!(!oom.expandable_segments_would_help());
    let msg = e.to_string();
    assert!(!msg.contains("would likely have avoided"), "{msg}");
    assert!(msg.contains("or raise the memory fraction"), "{msg}");
    // A request that does fit beside the allocated blocks still gets the hint.
    let oom = a.malloc(3 * MIB, S1).unwrap_err();
    assert!(
        oom.out_of_memory()
            .unwrap()
            .expandable_segments_would_help(),
        "{oom}"
    );
}

#[test]
fn free_memory_callbacks_run_before_a_new_segment() {
    let (a, _) = allocator();
    let runs = Arc::new(AtomicUsize::new(0));
    let r2 = runs.clone();
    a.add_free_memory_callback(move || {
        r2.fetch_add(1, Ordering::SeqCst);
        false
    });
    let p = a.malloc(100, S0).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    a.free(p).unwrap();
    a.malloc(100, S0).unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a cached block needs no callback"
    );
}

#[test]
fn unknown_pointers_and_double_frees_are_invalid_pointer_errors() {
    let (a, _) = allocator();
    let p = a.malloc(100, S0).unwrap();
    assert_eq!(a.free(p + 512), Err(AllocError::InvalidPointer(p + 512)));
    a.free(p).unwrap();
    assert_eq!(a.free(p), Err(AllocError::InvalidPointer(p)));
    assert!(a.record_stream(p, S1).is_err());
    assert!(a.malloc(1 << 61, S0).is_err());
}

#[test]
fn cache_info_reports_cached_bytes_and_the_largest_free_block() {
    let (a, _) = allocator();
    let p = a.malloc(5 * MIB, S0).unwrap();
    let info = a.cache_info();
    assert_eq!(info.cached_bytes, 15 * MIB);
    assert_eq!(info.largest_free_block, 15 * MIB);
    a.free(p).unwrap();
    assert_eq!(a.cache_info().largest_free_block, 20 * MIB);
}

#[test]
fn base_allocation_finds_the_segment_of_any_pointer_inside_it() {
    let (a, _) = allocator();
    let p = a.malloc(4 * KIB, S0).unwrap();
    let q = a.malloc(4 * KIB, S0).unwrap();
    assert_eq!(a.base_allocation(q), Some((p, 2 * MIB)));
    assert_eq!(a.base_allocation(p + 100 * KIB), Some((p, 2 * MIB)));
    assert_eq!(a.base_allocation(1), None);
}

#[test]
fn stats_resets_follow_pytorch() {
    let (a, _) = allocator();
    let p = a.malloc(MIB, S0).unwrap();
    a.free(p).unwrap();
    a.reset_peak_stats();
    let s = a.device_stats();
    assert_eq!(s.allocated_bytes.0[0].peak, 0);
    assert_eq!(s.reserved_bytes.0[0].peak, 2 * MIB as i64);
    a.reset_accumulated_stats();
    let s = a.device_stats();
    assert_eq!(
        (s.allocated_bytes.0[0].allocated, s.num_device_alloc),
        (0, 0)
    );
    let m = a.memory_stats();
    assert_eq!(m["reserved_bytes.all.current"], 2 * MIB as i64);
    assert!(
        a.memory_summary()
            .contains("PyTorch CUDA memory summary, device ID 0")
    );
}

#[test]
fn best_fit_holds_with_hundreds_of_free_blocks_in_a_pool() {
    let (a, _) = allocator();
    // 400 small blocks of growing sizes; free every other one: 200 free blocks of distinct
    // sizes, each fenced by live neighbours.
    let ptrs: Vec<(u64, u64)> = (0..400u64)
        .map(|i| {
            let size = 512 * (1 + i % 50);
            (a.malloc(size, S0).unwrap(), size)
        })
        .collect();
    for (i, &(p, _)) in ptrs.iter().enumerate() {
        if i % 2 == 0 {
            a.free(p).unwrap();
        }
    }
    check_consistent(&a);
    // Each request takes the smallest free block that fits, the lowest address among equals:
    // 512 * 7 bytes exist free at indices 6, 56, 106, ... (sizes repeat every 50).
    let want = ptrs
        .iter()
        .enumerate()
        .filter(|(i, (_, s))| i % 2 == 0 && *s == 512 * 7)
        .map(|(_, (p, _))| *p)
        .min()
        .unwrap();
    assert_eq!(a.malloc(512 * 7 - 100, S0).unwrap(), want);
    // Odd sizes are all live; 512 * 8 free blocks are not (8 - 1 = 7 is even): a 512 * 8
    // request takes the smallest free size above it, 512 * 9 (index 8).
    let want9 = ptrs
        .iter()
        .enumerate()
        .filter(|(i, (_, s))| i % 2 == 0 && *s == 512 * 9)
        .map(|(_, (p, _))| *p)
        .min()
        .unwrap();
    assert_eq!(a.malloc(512 * 8, S0).unwrap(), want9);
    for (i, &(p, _)) in ptrs.iter().enumerate() {
        if i % 2 == 1 {
            a.free(p).unwrap();
        }
    }
    check_consistent(&a);
}

#[test]
fn garbage_collection_frees_only_blocks_at_least_as_old_as_the_average() {
    // allowed 100 MiB, threshold 0.5: collect when reserved > 50 MiB.
    let (a, _) = allocator_with(100 * MIB, "garbage_collection_threshold:0.5");
    a.set_memory_fraction(1.0).unwrap();
    let x = a.malloc(30 * MIB, S0).unwrap(); // large-pool search 1
    let y = a.malloc(30 * MIB, S0).unwrap(); // search 2
    a.free(x).unwrap(); // x cached at clock 2
    // Searches on stream 1 advance the large pool's clock without touching stream 0's blocks;
    // the 20 MiB segment they use is re-cached after each (clock 3, then 4..8).
    for _ in 0..6 {
        let c = a.malloc(2 * MIB, S1).unwrap();
        a.free(c).unwrap();
    }
    a.free(y).unwrap(); // y cached at clock 8
    // 40 MiB (search 9) fits nothing. Reserved 80 > 50: ages x 7, y 1, c 1, average 3: only x
    // goes, which reclaims the 30 MiB excess.
    a.malloc(40 * MIB, S0).unwrap();
    let s = a.device_stats();
    assert_eq!(s.num_device_free, 1);
    assert_eq!(cur(&s.reserved_bytes), (30 + 20 + 40) * MIB as i64);
    let snap = check_consistent(&a);
    assert!(snap.segments.iter().any(|g| g.address == y));
    assert!(
        !snap
            .segments
            .iter()
            .any(|g| g.address == x && g.total_size == 30 * MIB)
    );
}

#[test]
fn with_no_single_oversize_block_large_enough_the_largest_are_freed_until_enough() {
    let (a, dev) = allocator_with(100 * MIB, "max_split_size_mb:20");
    let _live = a.malloc(40 * MIB, S0).unwrap();
    let p = a.malloc(25 * MIB, S0).unwrap();
    let q = a.malloc(30 * MIB, S0).unwrap();
    a.free(p).unwrap();
    a.free(q).unwrap();
    // 50 MiB: 5 MiB free on the device; no cached block >= 50 MiB, so the largest oversize
    // blocks go, 30 then 25 MiB (55 >= 50), and the second attempt succeeds.
    a.malloc(50 * MIB, S0).unwrap();
    let s = a.device_stats();
    assert_eq!((s.num_device_free, s.num_alloc_retries), (2, 0));
    assert_eq!(dev.used(), 90 * MIB);
    check_consistent(&a);
}

#[test]
fn dropping_the_allocator_gives_its_cache_back_to_the_device_and_keeps_live_blocks() {
    for conf in ["", "expandable_segments:True"] {
        let (a, dev) = allocator_with(GIB, conf);
        let cached = a.malloc(5 * MIB, S0).unwrap();
        let pending = a.malloc(100, S0).unwrap();
        a.free(cached).unwrap();
        a.record_stream(pending, S1).unwrap();
        dev.submit_work(S1);
        a.free(pending).unwrap();
        drop(a);
        assert_eq!(dev.used(), 0, "{conf}: cached and pending blocks went back");
        assert_eq!(
            dev.live_reservations(),
            vec![],
            "{conf}: address ranges released"
        );
        assert_eq!(dev.live_events(), 0, "{conf}: events destroyed");

        // A block the program never freed keeps its segment: device work may still use it.
        let (a, dev) = allocator_with(GIB, conf);
        let live = a.malloc(30 * MIB, S0).unwrap();
        let held = a.base_allocation(live).unwrap().1;
        let p = a.malloc(100, S0).unwrap();
        a.free(p).unwrap();
        drop(a);
        assert_eq!(
            dev.used(),
            held,
            "{conf}: only the live block's memory stays"
        );
    }
}

#[test]
fn a_free_that_cannot_record_its_stream_event_says_so_and_leaks_no_event() {
    let (a, dev) = allocator();
    let p = a.malloc(4096, S0).unwrap();
    // A stream the device never created: recording the free's event on it fails.
    a.record_stream(p, StreamId(777)).unwrap();
    let e = a.free(p).unwrap_err();
    assert!(e.to_string().contains("unknown stream s777"), "{e}");
    drop(a);
    assert_eq!(
        dev.live_events(),
        0,
        "the unrecorded event was pooled and destroyed"
    );
}
