//! Expandable segments and private (graph capture) pools.

#[path = "support/builders.rs"]
mod builders;

use allocview_alloc::caching::{HistoryOptions, PoolId};
use allocview_alloc::snapshot::{BlockState, TraceAction};
use builders::*;

const EXPANDABLE: &str = "expandable_segments:True";

#[test]
fn expandable_segments_map_pages_and_count_no_segment() {
    let (a, dev) = allocator_with(GIB, EXPANDABLE);
    a.record_history(HistoryOptions::default());
    let s1 = a.malloc(1000, S0).unwrap();
    let s = a.device_stats();
    assert_eq!(
        cur(&s.reserved_bytes),
        2 * MIB as i64,
        "one 2 MiB small page"
    );
    assert_eq!(cur(&s.segment), 0);
    assert_eq!(s.num_device_alloc, 1);
    assert_eq!(dev.used(), 2 * MIB);
    let p = a.malloc(5 * MIB, S0).unwrap();
    let s = a.device_stats();
    assert_eq!(
        cur(&s.reserved_bytes),
        22 * MIB as i64,
        "plus one 20 MiB large page"
    );
    let snap = check_consistent(&a);
    assert_eq!(snap.segments.len(), 2);
    assert!(snap.segments.iter().all(|s| s.is_expandable));
    let t = &snap.device_traces[0];
    assert_eq!(t[0].action, TraceAction::SegmentMap);
    assert_eq!((t[0].addr, t[0].size), (s1, 2 * MIB));
    let _ = p;
}

#[test]
fn an_expandable_segment_grows_in_place_and_blocks_tile_it() {
    let (a, _) = allocator_with(GIB, EXPANDABLE);
    let p = a.malloc(5 * MIB, S0).unwrap();
    // 18 MiB does not fit the 15 MiB free tail, but the tail plus one more 20 MiB page does:
    // the block starts right after p and the segment grows to 40 MiB.
    let q = a.malloc(18 * MIB, S0).unwrap();
    assert_eq!(q, p + 5 * MIB);
    let s = a.device_stats();
    assert_eq!(cur(&s.reserved_bytes), 40 * MIB as i64);
    assert_eq!(s.num_device_alloc, 2);
    assert_eq!(
        cur(&s.inactive_split),
        0,
        "expandable segments never count as split"
    );
    let snap = check_consistent(&a);
    assert_eq!(snap.segments.len(), 1);
    let sizes: Vec<u64> = snap.segments[0].blocks.iter().map(|b| b.size).collect();
    assert_eq!(sizes, [5 * MIB, 18 * MIB, 17 * MIB]);
    assert_eq!(a.base_allocation(q), Some((p, 40 * MIB)));
}

#[test]
fn expandable_segments_split_large_blocks_when_512_bytes_remain() {
    let (a, _) = allocator_with(GIB, EXPANDABLE);
    a.malloc(19 * MIB, S0).unwrap();
    // The 1 MiB remainder of the 20 MiB page is split off (the small-pool rule).
    assert_eq!(cur(&a.device_stats().allocated_bytes), 19 * MIB as i64);
    check_consistent(&a);
}

#[test]
fn empty_cache_unmaps_whole_free_pages_of_expandable_segments() {
    let (a, dev) = allocator_with(GIB, EXPANDABLE);
    a.record_history(HistoryOptions::default());
    let p = a.malloc(5 * MIB, S0).unwrap();
    let q = a.malloc(18 * MIB, S0).unwrap();
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    // Free [5, 40) MiB: only the page [20, 40) is whole; [5, 20) stays mapped.
    let s = a.device_stats();
    assert_eq!(cur(&s.reserved_bytes), 20 * MIB as i64);
    assert_eq!(s.num_device_free, 1);
    assert_eq!(dev.used(), 20 * MIB);
    let snap = check_consistent(&a);
    let unmap = snap.device_traces[0]
        .iter()
        .find(|t| t.action == TraceAction::SegmentUnmap)
        .unwrap();
    assert_eq!((unmap.addr, unmap.size), (p + 20 * MIB, 20 * MIB));
    assert_eq!(snap.segments[0].total_size, 20 * MIB);
    // Freeing the rest returns everything.
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(cur(&a.device_stats().reserved_bytes), 0);
    assert_eq!(dev.used(), 0);
    assert!(a.snapshot().segments.is_empty());
}

#[test]
fn expandable_segments_run_out_of_memory_cleanly_and_recover() {
    let (a, dev) = allocator_with(60 * MIB, EXPANDABLE);
    let p = a.malloc(30 * MIB, S0).unwrap(); // two 20 MiB pages
    // The 10 MiB free tail plus 25 MiB needs two more pages; only one fits.
    assert!(a.malloc(35 * MIB, S0).is_err());
    assert_eq!(dev.used(), 40 * MIB);
    check_consistent(&a);
    a.free(p).unwrap();
    let q = a.malloc(50 * MIB, S0).unwrap();
    assert_eq!(q, p, "the segment grows from its start again");
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(dev.used(), 0);
}

#[test]
fn allocations_on_a_capturing_stream_go_to_the_private_pool() {
    let (a, _) = allocator();
    let id = PoolId(7, 1);
    a.begin_allocate_to_pool(id, |s| s == S1);
    let p = a.malloc(4096, S1).unwrap();
    let q = a.malloc(4096, S0).unwrap();
    a.end_allocate_to_pool(id);
    let snap = check_consistent(&a);
    let pool_of = |ptr: u64| {
        snap.segments
            .iter()
            .find(|s| s.address <= ptr && ptr < s.address + s.total_size)
            .unwrap()
            .segment_pool_id
    };
    assert_eq!(pool_of(p), (7, 1));
    assert_eq!(pool_of(q), (0, 0));
    // After the capture, stream 1 allocates from the default pool again.
    let r = a.malloc(4096, S1).unwrap();
    assert_eq!(check_consistent(&a).segments.len(), 3);
    let _ = r;
}

#[test]
fn a_private_pool_is_returned_by_empty_cache_only_after_release_pool() {
    let (a, dev) = allocator();
    let id = PoolId(1, 0);
    a.begin_allocate_to_pool(id, |_| true);
    let p = a.malloc(3 * MIB, S0).unwrap();
    a.end_allocate_to_pool(id);
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(dev.used(), 20 * MIB, "the pool still has a user");
    a.release_pool(id);
    a.empty_cache().unwrap();
    assert_eq!(dev.used(), 0);
    assert_eq!(cur(&a.device_stats().reserved_bytes), 0);
    // The id can be used again.
    a.begin_allocate_to_pool(id, |_| true);
    a.malloc(512, S0).unwrap();
    a.end_allocate_to_pool(id);
    assert_eq!(a.snapshot().segments[0].segment_pool_id, (1, 0));
}

#[test]
fn during_a_capture_frees_with_stream_uses_wait_and_no_full_flush_happens() {
    let (a, dev) = allocator_with(40 * MIB, "");
    // A cached default-pool segment.
    let c = a.malloc(5 * MIB, S0).unwrap();
    a.free(c).unwrap();
    let id = PoolId(2, 0);
    a.begin_allocate_to_pool(id, |s| s == S1);
    let p = a.malloc(4096, S1).unwrap();
    a.record_stream(p, S2).unwrap();
    dev.submit_work(S2);
    a.free(p).unwrap();
    assert_eq!(
        cur(&a.device_stats().active),
        1,
        "deferred until the capture ends"
    );
    assert!(
        a.empty_cache().is_err(),
        "no synchronizing during a capture"
    );
    // 30 MiB does not fit beside the cached 20 MiB: no full flush while capturing -> OOM.
    assert!(a.malloc(30 * MIB, S1).is_err());
    let s = a.device_stats();
    assert_eq!((s.num_alloc_retries, s.num_ooms), (0, 1));
    a.end_allocate_to_pool(id);
    // Stream 2 was recorded during the capture, so it needs no event: the next malloc frees.
    a.malloc(512, S0).unwrap();
    let snap = check_consistent(&a);
    assert!(
        snap.segments
            .iter()
            .flat_map(|s| &s.blocks)
            .all(|b| b.state != BlockState::ActivePendingFree)
    );
}

#[test]
fn a_snapshot_shows_one_segment_per_contiguous_mapped_range() {
    let (a, _) = allocator_with(GIB, EXPANDABLE);
    let x = a.malloc(30 * MIB, S0).unwrap(); // pages 0-1, [0, 30) used
    let y = a.malloc(30 * MIB, S0).unwrap(); // [30, 60): page 2
    let z = a.malloc(20 * MIB, S0).unwrap(); // [60, 80): page 3
    assert_eq!((y - x, z - x), (30 * MIB, 60 * MIB));
    a.free(y).unwrap();
    a.empty_cache().unwrap();
    // Only page 2, [40, 60), lies wholly inside the free [30, 60): a hole in the middle.
    let snap = check_consistent(&a);
    let ranges: Vec<(u64, u64)> = snap
        .segments
        .iter()
        .map(|s| (s.address - x, s.total_size))
        .collect();
    assert_eq!(ranges, [(0, 40 * MIB), (60 * MIB, 20 * MIB)]);
    assert_eq!(cur(&a.device_stats().reserved_bytes), 60 * MIB as i64);
    // 15 MiB does not fit the 10 MiB free block before the hole, but with the hole mapped
    // again it does, at the lowest address: the segment is whole again.
    let w = a.malloc(15 * MIB, S0).unwrap();
    assert_eq!(w, x + 30 * MIB);
    let snap = check_consistent(&a);
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].total_size, 80 * MIB);
}

#[test]
fn an_oom_during_a_capture_names_the_private_pool_and_promises_no_setting() {
    let (a, _) = allocator_with(100 * MIB, "");
    // 60 MiB cached in the default large pool; a capture cannot use it, nor free it for a retry.
    let big = a.malloc(60 * MIB, S0).unwrap();
    a.free(big).unwrap();
    a.begin_allocate_to_pool(PoolId(1, 0), |s| s == S1);
    let e = a.malloc(50 * MIB, S1).unwrap_err();
    let oom = e.out_of_memory().unwrap();
    assert_eq!(oom.private_pool, Some(PoolId(1, 0)));
    assert!(oom.during_capture);
    assert!(!oom.expandable_segments_would_help());
    let msg = e.to_string();
    assert!(msg.contains("stream 1 in private pool (1, 0)"), "{msg}");
    assert!(
        msg.contains("Call empty_cache() before the capture"),
        "{msg}"
    );
    assert!(!msg.contains("expandable"), "{msg}");
    a.end_allocate_to_pool(PoolId(1, 0));
    // After the capture the same request frees the cache and succeeds.
    a.release_pool(PoolId(1, 0));
    assert!(a.malloc(50 * MIB, S0).is_ok());
}
