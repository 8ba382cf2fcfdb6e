//! The caching allocator's rules, written once for any [`DeviceBackend`].
//!
//! Each rule takes a [`Make`] (an allocator over a fresh device, with a settings string in
//! `PYTORCH_CUDA_ALLOC_CONF` syntax) and checks one part of PyTorch's caching allocator (`c10/cuda/CUDACachingAllocator.cpp`)
//! with numbers worked out by hand. Only what every device shares is used: no capacity, fault
//! injection or stream-work controls (those are `SimBackend`'s, in `caching_rules.rs`), and
//! addresses are compared as offsets within their segment (a real driver places segments
//! anywhere). The device's total memory only enters through `mem_get_info`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use allocview_alloc::caching::backend::{DeviceBackend, DevicePtr, StreamId};
use allocview_alloc::caching::stats::{DeviceStats, StatArray};
use allocview_alloc::caching::{AllocError, CachingAllocator};
use allocview_alloc::snapshot::{BlockState, TraceAction};

use crate::support::check_consistent;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;

/// The rounding unit of every request.
const MIN_BLOCK: u64 = 512;
/// Segment size for small requests (rounded size <= 1 MiB), and the small pool's page.
const SMALL_SEGMENT: u64 = 2 * MIB;
/// Segment size for rounded requests in (1 MiB, 10 MiB), and the large pool's page.
const LARGE_SEGMENT: u64 = 20 * MIB;

/// The default stream.
const S0: StreamId = StreamId::DEFAULT;

/// Makes an allocator over a fresh device with the given settings.
pub type Make<B> = dyn Fn(&str) -> CachingAllocator<B>;

/// The `all` figure of a stat array: (current, peak).
fn all<B: DeviceBackend>(a: &CachingAllocator<B>, pick: fn(&DeviceStats) -> &StatArray) -> i64 {
    pick(&a.device_stats()).0[0].current
}

fn allocated<B: DeviceBackend>(a: &CachingAllocator<B>) -> i64 {
    all(a, |s| &s.allocated_bytes)
}

fn reserved<B: DeviceBackend>(a: &CachingAllocator<B>) -> i64 {
    all(a, |s| &s.reserved_bytes)
}

/// `ptr`'s offset within its segment, and the segment's size.
fn offset<B: DeviceBackend>(a: &CachingAllocator<B>, ptr: DevicePtr) -> (u64, u64) {
    let (base, size) = a
        .base_allocation(ptr)
        .unwrap_or_else(|| panic!("{ptr:#x} lies in no segment"));
    (ptr - base, size)
}

/// The device's free bytes as the backend reports them.
fn device_free<B: DeviceBackend>(a: &CachingAllocator<B>) -> u64 {
    a.backend().mem_get_info().expect("mem_get_info").0
}

/// Rounding: 512 bytes by default; power-of-two divisions through the settings.
pub fn requests_round_up_to_512_bytes_or_to_power_of_two_divisions<B: DeviceBackend>(
    make: &Make<B>,
) {
    let a = make("");
    // (request, rounded): below 512 -> 512; else up to a multiple of 512.
    let mut total = 0;
    for (req, rounded) in [
        (1, 512),
        (512, 512),
        (513, 1024),
        (1000, 1024),
        (MIB + 1, MIB + 512),
    ] {
        a.malloc(req, S0).unwrap();
        total += rounded;
        assert_eq!(allocated(&a), total as i64, "{req} rounds to {rounded}");
    }
    check_consistent(&a);

    let a = make("roundup_power2_divisions:4");
    // 1,200 is not above 512 * 4: plain 512 rounding. 1,300,000: floor_pow2 = 1 MiB, step
    // 1 MiB / 4 = 256 KiB, so 1 MiB + 256 KiB. 4 MiB is a power of two and stays.
    // 5,000,000: floor_pow2 = 4 MiB, step 1 MiB, so 5 MiB.
    let mut total = 0;
    for (req, rounded) in [
        (1200, 1536),
        (1_300_000, MIB + 256 * KIB),
        (4 * MIB, 4 * MIB),
        (5_000_000, 5 * MIB),
    ] {
        a.malloc(req, S0).unwrap();
        total += rounded;
        assert_eq!(
            allocated(&a),
            total as i64,
            "{req} rounds to {rounded} with 4 divisions"
        );
    }
    assert_eq!(
        all(&a, |s| &s.requested_bytes),
        (1200 + 1_300_000 + 4 * MIB + 5_000_000) as i64,
        "requested bytes keep the unrounded sizes"
    );
    check_consistent(&a);
}

/// Pools and segment sizes: <= 1 MiB small (2 MiB segments); below 10 MiB a 20 MiB segment;
/// from 10 MiB the request rounded up to 2 MiB.
pub fn segments_are_2_mib_small_20_mib_large_or_the_request_rounded_to_2_mib<B: DeviceBackend>(
    make: &Make<B>,
) {
    let a = make("");
    let small = a.malloc(MIB, S0).unwrap();
    // 10 MiB exactly: a 10 MiB segment, the whole of it allocated.
    let ten = a.malloc(10 * MIB, S0).unwrap();
    // 11 MiB: a 12 MiB segment; the 1 MiB remainder is not split (large pool: > 1 MiB only).
    let eleven = a.malloc(11 * MIB, S0).unwrap();
    // 1 MiB + 1 rounds to 1 MiB + 512: large pool, nothing cached fits, a 20 MiB segment.
    let mid = a.malloc(MIB + 1, S0).unwrap();
    assert_eq!(offset(&a, small), (0, SMALL_SEGMENT));
    assert_eq!(offset(&a, ten), (0, 10 * MIB));
    assert_eq!(offset(&a, eleven), (0, 12 * MIB));
    assert_eq!(offset(&a, mid), (0, LARGE_SEGMENT));
    let s = a.device_stats();
    let pools = |x: &StatArray| x.0.map(|s| s.current);
    assert_eq!(pools(&s.segment), [4, 1, 3], "segments (all, small, large)");
    assert_eq!(
        pools(&s.reserved_bytes),
        [44 * MIB as i64, 2 * MIB as i64, 42 * MIB as i64]
    );
    // 1 + 10 + 12 (unsplit) + 1 MiB + 512.
    assert_eq!(
        pools(&s.allocated_bytes),
        [(24 * MIB + 512) as i64, MIB as i64, (23 * MIB + 512) as i64]
    );
    assert_eq!(s.num_device_alloc, 4);
    check_consistent(&a);
}

/// Best fit: a freed block serves the next request of its size; the smallest fitting block at
/// the lowest address wins.
pub fn best_fit_reuses_a_freed_block_and_takes_the_smallest_that_fits<B: DeviceBackend>(
    make: &Make<B>,
) {
    let a = make("");
    let p = a.malloc(4 * KIB, S0).unwrap();
    let _fence = a.malloc(4 * KIB, S0).unwrap();
    a.free(p).unwrap();
    assert_eq!(a.malloc(4 * KIB, S0).unwrap(), p, "small pool reuse");
    let big = a.malloc(5 * MIB, S0).unwrap();
    a.free(big).unwrap();
    assert_eq!(a.malloc(5 * MIB, S0).unwrap(), big, "large pool reuse");
    assert_eq!(a.device_stats().num_device_alloc, 2);

    // One 2 MiB segment cut into 64, 16, 64, 16 KiB and the rest; free both 64 KiB pieces.
    let a = make("");
    let p1 = a.malloc(64 * KIB, S0).unwrap();
    let _k1 = a.malloc(16 * KIB, S0).unwrap();
    let p2 = a.malloc(64 * KIB, S0).unwrap();
    let _k2 = a.malloc(16 * KIB, S0).unwrap();
    assert_eq!(offset(&a, p2).0, 80 * KIB);
    a.free(p1).unwrap();
    a.free(p2).unwrap();
    // 40 KiB: both 64 KiB blocks fit better than the tail; the lower address wins.
    let q = a.malloc(40 * KIB, S0).unwrap();
    assert_eq!(offset(&a, q).0, 0);
    // 24 KiB remained at 40 KiB: a 20 KiB request fits it best.
    let r = a.malloc(20 * KIB, S0).unwrap();
    assert_eq!(offset(&a, r).0, 40 * KIB);
    // 60 KiB: only the 64 KiB block at 80 KiB (and the tail) fit; it is the smaller.
    let t = a.malloc(60 * KIB, S0).unwrap();
    assert_eq!(offset(&a, t).0, 80 * KIB);
    check_consistent(&a);

    // Blocks are never shared across streams: a block cached for another stream is not used.
    let a = make("");
    let side = a.backend().create_stream().expect("a second stream");
    let p = a.malloc(1000, side).unwrap();
    a.free(p).unwrap();
    let q = a.malloc(1000, S0).unwrap();
    assert_ne!(a.base_allocation(q), a.base_allocation(p));
    assert_eq!(all(&a, |s| &s.segment), 2);
    assert_eq!(
        a.malloc(1000, side).unwrap(),
        p,
        "the side stream reuses its own block"
    );
    check_consistent(&a);
}

/// Split and merge: the allocated piece is the front; freed neighbours merge; a large block
/// with exactly 1 MiB left over is not split.
pub fn splits_take_the_front_and_frees_merge_with_free_neighbours<B: DeviceBackend>(
    make: &Make<B>,
) {
    let a = make("");
    let x = a.malloc(4 * KIB, S0).unwrap();
    let y = a.malloc(4 * KIB, S0).unwrap();
    let z = a.malloc(4 * KIB, S0).unwrap();
    assert_eq!(
        [x, y, z].map(|p| offset(&a, p).0),
        [0, 4 * KIB, 8 * KIB],
        "each piece is the front of what was free"
    );
    let split = |a: &CachingAllocator<B>| {
        (
            all(a, |s| &s.inactive_split),
            all(a, |s| &s.inactive_split_bytes),
        )
    };
    assert_eq!(split(&a), (1, (2 * MIB - 12 * KIB) as i64));
    a.free(y).unwrap(); // a hole between x and z: two inactive split blocks
    assert_eq!(split(&a), (2, (2 * MIB - 8 * KIB) as i64));
    a.free(z).unwrap(); // z merges with the hole and the tail
    assert_eq!(split(&a), (1, (2 * MIB - 4 * KIB) as i64));
    let snap = check_consistent(&a);
    assert_eq!(snap.segments[0].blocks.len(), 2);
    a.free(x).unwrap(); // one free block covering the segment: not split any more
    assert_eq!(split(&a), (0, 0));
    let snap = check_consistent(&a);
    assert_eq!(snap.segments[0].blocks.len(), 1);
    assert_eq!(snap.segments[0].blocks[0].size, SMALL_SEGMENT);

    // 19 MiB in a 20 MiB segment leaves exactly 1 MiB: not split, the block is 20 MiB.
    let a = make("");
    a.malloc(19 * MIB, S0).unwrap();
    assert_eq!(allocated(&a), 20 * MIB as i64);
    assert_eq!(all(&a, |s| &s.requested_bytes), 19 * MIB as i64);
    assert_eq!(split(&a), (0, 0));
    assert_eq!(check_consistent(&a).segments[0].blocks.len(), 1);
    // 512 bytes less leaves 1 MiB + 512 > 1 MiB: split.
    let a = make("");
    a.malloc(19 * MIB - 512, S0).unwrap();
    assert_eq!(allocated(&a), (19 * MIB - 512) as i64);
    assert_eq!(split(&a), (1, (MIB + 512) as i64));
    check_consistent(&a);
}

/// max_split_size: a request below it never takes an oversize block; one above takes it only
/// within max_non_split_rounding (20 MiB), unsplit.
pub fn oversize_blocks_serve_only_oversize_requests_within_the_rounding_slack<B: DeviceBackend>(
    make: &Make<B>,
) {
    let a = make("max_split_size_mb:20");
    let big = a.malloc(30 * MIB, S0).unwrap();
    let s = a.device_stats();
    assert_eq!(
        (
            s.oversize_segments.current,
            s.oversize_allocations.current,
            s.max_split_size
        ),
        (1, 1, 20 * MIB as i64)
    );
    a.free(big).unwrap();
    // 5 MiB < 20 MiB may not take the cached 30 MiB block: a new 20 MiB segment.
    let p = a.malloc(5 * MIB, S0).unwrap();
    assert_eq!(offset(&a, p), (0, LARGE_SEGMENT));
    assert_eq!(reserved(&a), 50 * MIB as i64);
    // 25 MiB >= 20 MiB may take it (30 < 25 + 20), whole: oversize blocks never split.
    let q = a.malloc(25 * MIB, S0).unwrap();
    assert_eq!(q, big);
    assert_eq!(allocated(&a), (5 + 30) * MIB as i64);
    assert_eq!(a.device_stats().oversize_allocations.current, 1);
    check_consistent(&a);

    let a = make("max_split_size_mb:20");
    let big = a.malloc(44 * MIB, S0).unwrap();
    a.free(big).unwrap();
    // 22 + 20 = 42 <= 44: too wasteful, a new 22 MiB segment.
    let p = a.malloc(22 * MIB, S0).unwrap();
    assert_ne!(p, big);
    assert_eq!(offset(&a, p), (0, 22 * MIB));
    // 26 + 20 = 46 > 44: takes the cached block.
    assert_eq!(a.malloc(26 * MIB, S0).unwrap(), big);
    assert_eq!(allocated(&a), (22 + 44) * MIB as i64);
    assert_eq!(a.device_stats().num_device_alloc, 2);
    check_consistent(&a);
}

/// empty_cache returns every whole free segment (a segment holding a live block stays), and
/// the device sees the memory come back.
pub fn empty_cache_returns_every_whole_free_segment_to_the_device<B: DeviceBackend>(
    make: &Make<B>,
) {
    let a = make("");
    let live = a.malloc(4 * KIB, S0).unwrap();
    let p = a.malloc(8 * KIB, S0).unwrap();
    let mid = a.malloc(3 * MIB, S0).unwrap();
    let big = a.malloc(30 * MIB, S0).unwrap();
    assert_eq!(reserved(&a), (2 + 20 + 30) * MIB as i64);
    a.free(p).unwrap();
    a.free(mid).unwrap();
    a.free(big).unwrap();
    let free_before = device_free(&a);
    a.empty_cache().unwrap();
    let s = a.device_stats();
    // The 20 and 30 MiB segments go; the small one keeps its live block.
    assert_eq!(s.reserved_bytes.0[0].current, 2 * MIB as i64);
    assert_eq!(s.segment.0[0].current, 1);
    assert_eq!(s.num_device_free, 2);
    let free_after = device_free(&a);
    assert!(
        free_after >= free_before + 50 * MIB,
        "the device's free memory rises by the 50 MiB returned: {free_before} -> {free_after}"
    );
    check_consistent(&a);
    a.free(live).unwrap();
    a.empty_cache().unwrap();
    let s = a.device_stats();
    assert_eq!((reserved(&a), s.segment.0[0].current), (0, 0));
    assert_eq!(s.num_device_free, 3);
    assert!(device_free(&a) >= free_after + 2 * MIB);
    assert!(check_consistent(&a).segments.is_empty());
}

/// cache_info: reserved minus allocated, and the largest free block.
pub fn cache_info_reports_cached_bytes_and_the_largest_free_block<B: DeviceBackend>(
    make: &Make<B>,
) {
    let a = make("");
    let p = a.malloc(5 * MIB, S0).unwrap();
    let q = a.malloc(KIB, S0).unwrap();
    let info = a.cache_info();
    // 15 MiB free in the large segment, 2 MiB - 1 KiB in the small one.
    assert_eq!(info.cached_bytes, 17 * MIB - KIB);
    assert_eq!(info.largest_free_block, 15 * MIB);
    a.free(p).unwrap();
    assert_eq!(a.cache_info().largest_free_block, 20 * MIB);
    a.free(q).unwrap();
    assert_eq!(a.cache_info().cached_bytes, 22 * MIB);
}

/// base_allocation finds the segment of any pointer inside it, and nothing outside.
pub fn base_allocation_finds_the_segment_of_any_pointer_inside_it<B: DeviceBackend>(
    make: &Make<B>,
) {
    let a = make("");
    let p = a.malloc(4 * KIB, S0).unwrap();
    let q = a.malloc(4 * KIB, S0).unwrap();
    assert_eq!(a.base_allocation(p), Some((p, SMALL_SEGMENT)));
    assert_eq!(a.base_allocation(q), Some((p, SMALL_SEGMENT)));
    assert_eq!(a.base_allocation(p + 100 * KIB), Some((p, SMALL_SEGMENT)));
    assert_eq!(
        a.base_allocation(p + SMALL_SEGMENT - 1),
        Some((p, SMALL_SEGMENT))
    );
    assert_eq!(a.base_allocation(p + SMALL_SEGMENT), None);
    assert_eq!(a.base_allocation(p - 1), None);
    let big = a.malloc(12 * MIB, S0).unwrap();
    assert_eq!(a.base_allocation(big + 11 * MIB), Some((big, 12 * MIB)));
}

/// memory_stats() after a known sequence, then the two resets.
pub fn memory_stats_follow_a_known_sequence<B: DeviceBackend>(make: &Make<B>) {
    let a = make("");
    let x = a.malloc(1000, S0).unwrap(); // 1 KiB of a new 2 MiB small segment
    let _y = a.malloc(3 * MIB, S0).unwrap(); // 3 MiB of a new 20 MiB large segment
    a.free(x).unwrap(); // the small segment is one free block again
    let m = a.memory_stats();
    let mi = MIB as i64;
    for (key, want) in [
        ("allocation.all.current", 1),
        ("allocation.all.peak", 2),
        ("allocation.all.allocated", 2),
        ("allocation.all.freed", 1),
        ("allocation.small_pool.current", 0),
        ("allocation.large_pool.current", 1),
        ("allocated_bytes.all.current", 3 * mi),
        ("allocated_bytes.all.peak", 3 * mi + 1024),
        ("allocated_bytes.small_pool.peak", 1024),
        ("allocated_bytes.small_pool.freed", 1024),
        ("requested_bytes.all.current", 3 * mi),
        ("requested_bytes.all.peak", 3 * mi + 1000),
        ("reserved_bytes.all.current", 22 * mi),
        ("reserved_bytes.small_pool.current", 2 * mi),
        ("reserved_bytes.large_pool.current", 20 * mi),
        ("segment.all.current", 2),
        ("active.all.current", 1),
        ("active_bytes.all.current", 3 * mi),
        ("active_bytes.all.peak", 3 * mi + 1024),
        // Split: the small segment's tail (then none), the large segment's 17 MiB tail.
        ("inactive_split.all.current", 1),
        ("inactive_split.all.peak", 2),
        ("inactive_split_bytes.all.current", 17 * mi),
        ("inactive_split_bytes.large_pool.current", 17 * mi),
        ("inactive_split_bytes.small_pool.current", 0),
        ("num_device_alloc", 2),
        ("num_device_free", 0),
        ("num_alloc_retries", 0),
        ("num_ooms", 0),
        ("num_sync_all_streams", 0),
        ("max_split_size", -1),
        ("oversize_allocations.current", 0),
    ] {
        assert_eq!(m.get(key), Some(&want), "{key}");
    }
    check_consistent(&a);
    a.reset_peak_stats();
    let m = a.memory_stats();
    assert_eq!(m["allocated_bytes.all.peak"], 3 * mi);
    assert_eq!(m["inactive_split.all.peak"], 1);
    assert_eq!(m["allocation.all.allocated"], 2);
    a.reset_accumulated_stats();
    let m = a.memory_stats();
    assert_eq!(
        (
            m["allocation.all.allocated"],
            m["allocation.all.freed"],
            m["num_device_alloc"]
        ),
        (0, 0, 0)
    );
    assert_eq!(
        m["allocation.all.current"], 1,
        "currents survive the resets"
    );
}

/// record_stream: the free of a block used by another stream waits for that stream; a
/// completed stream's event frees it at the next malloc, and empty_cache synchronizes.
pub fn a_free_after_record_stream_completes_after_the_other_streams_work<B: DeviceBackend>(
    make: &Make<B>,
) {
    let a = make("");
    let side = a.backend().create_stream().expect("a second stream");
    assert_ne!(side, S0);
    let p = a.malloc(4096, S0).unwrap();
    a.record_stream(p, side).unwrap();
    a.free(p).unwrap();
    // Allocated drops at once; active (and requested) when the free completes.
    let s = a.device_stats();
    assert_eq!(
        (
            s.allocation.0[0].current,
            s.allocated_bytes.0[0].current,
            s.active.0[0].current,
            s.active_bytes.0[0].current,
            s.requested_bytes.0[0].current
        ),
        (0, 0, 1, 4096, 4096)
    );
    let snap = check_consistent(&a);
    assert_eq!(
        snap.segments[0].blocks[0].state,
        BlockState::ActivePendingFree
    );
    // Once the side stream's work is done, the next malloc completes the free: the block is
    // free again and serves the same request.
    a.backend().synchronize_device().unwrap();
    let q = a.malloc(4096, S0).unwrap();
    assert_eq!(q, p);
    assert_eq!(all(&a, |s| &s.active), 1);
    check_consistent(&a);

    // Deferred again; empty_cache waits for the event and then returns the segment.
    a.record_stream(q, side).unwrap();
    a.free(q).unwrap();
    assert_eq!(all(&a, |s| &s.active_bytes), 4096);
    a.empty_cache().unwrap();
    let s = a.device_stats();
    assert_eq!(s.num_sync_all_streams, 1);
    assert_eq!(
        (s.active.0[0].current, s.reserved_bytes.0[0].current),
        (0, 0)
    );
    assert_eq!(s.num_device_free, 1);

    // record_stream on the block's own stream is ignored: the free completes at once.
    let r = a.malloc(4096, side).unwrap();
    a.record_stream(r, side).unwrap();
    a.free(r).unwrap();
    assert_eq!(all(&a, |s| &s.active_bytes), 0);
    assert_eq!(
        a.record_stream(r, S0),
        Err(AllocError::InvalidPointer(r)),
        "a freed block"
    );
    check_consistent(&a);
}

/// Expandable segments: one range per (stream, pool) growing in 2 MiB (small) / 20 MiB
/// (large) pages; empty_cache unmaps the free pages.
pub fn expandable_segments_grow_in_pages_and_empty_cache_unmaps_them<B: DeviceBackend>(
    make: &Make<B>,
) {
    let a = make("expandable_segments:True");
    let maps = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&maps);
    a.attach_trace_tracker(move |t| {
        if matches!(
            t.action,
            TraceAction::SegmentMap | TraceAction::SegmentUnmap
        ) {
            seen.lock().unwrap().push((t.action, t.size));
        }
    });
    let free_start = device_free(&a);
    let p = a.malloc(MIB, S0).unwrap(); // one 2 MiB small page
    let q = a.malloc(30 * MIB, S0).unwrap(); // two 20 MiB large pages
    // 10 MiB remain free at the end of the large range: 15 MiB maps one more page and the
    // block starts where the free 10 MiB did.
    let r = a.malloc(15 * MIB, S0).unwrap();
    assert_eq!(r - q, 30 * MIB);
    let s = a.device_stats();
    assert_eq!(s.reserved_bytes.0.map(|x| x.current)[0], 62 * MIB as i64);
    assert_eq!(s.num_device_alloc, 3, "one per mapping");
    assert_eq!(
        s.segment.0[0].current, 0,
        "expandable ranges are not counted as segments"
    );
    assert_eq!(
        *maps.lock().unwrap(),
        [
            (TraceAction::SegmentMap, SMALL_SEGMENT),
            (TraceAction::SegmentMap, 2 * LARGE_SEGMENT),
            (TraceAction::SegmentMap, LARGE_SEGMENT)
        ]
    );
    assert!(free_start >= device_free(&a) + 62 * MIB);
    let snap = check_consistent(&a);
    let sizes: Vec<_> = snap
        .segments
        .iter()
        .map(|g| (g.is_expandable, g.total_size))
        .collect();
    assert!(
        sizes == [(true, 2 * MIB), (true, 60 * MIB)]
            || sizes == [(true, 60 * MIB), (true, 2 * MIB)],
        "{sizes:?}"
    );
    assert_eq!(a.base_allocation(r), Some((q, 60 * MIB)));
    let _ = p;
    // Freeing q leaves [0, 30 MiB) of the large range free; r holds [30, 45 MiB), so only
    // the first 20 MiB page lies wholly inside a free block: empty_cache unmaps just that one.
    a.free(q).unwrap();
    maps.lock().unwrap().clear();
    a.empty_cache().unwrap();
    assert_eq!(reserved(&a), 42 * MIB as i64);
    assert_eq!(
        *maps.lock().unwrap(),
        [(TraceAction::SegmentUnmap, LARGE_SEGMENT)]
    );
    assert_eq!(a.base_allocation(r), Some((q + LARGE_SEGMENT, 40 * MIB)));
    check_consistent(&a);
    a.free(p).unwrap();
    a.free(r).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(reserved(&a), 0);
    assert!(device_free(&a) >= free_start);
    assert!(check_consistent(&a).segments.is_empty());
}

/// A memory fraction refuses a segment that would exceed it without calling the device; the
/// OOM error carries the facts and num_ooms counts it.
pub fn a_memory_fraction_refuses_a_big_request_with_out_of_memory<B: DeviceBackend>(
    make: &Make<B>,
) {
    let a = make("");
    let (_, total) = a.backend().mem_get_info().unwrap();
    let fraction = (64 * MIB) as f64 / total as f64;
    a.set_memory_fraction(fraction).unwrap();
    let allowed = (fraction * total as f64) as u64; // 64 MiB, give or take float rounding
    assert!(allowed.abs_diff(64 * MIB) <= 1, "{allowed}");
    let p = a.malloc(40 * MIB, S0).unwrap();
    // 40 + 30 > 64: refused before the device is asked; nothing is cached, so the flush and
    // retry change nothing.
    let e = a.malloc(30 * MIB - 100, S0).unwrap_err();
    let oom = e.out_of_memory().expect("an out-of-memory error");
    assert_eq!(oom.device, a.device());
    assert_eq!(oom.stream, S0);
    assert_eq!(
        (oom.requested, oom.rounded, oom.segment_size),
        (30 * MIB - 100, 30 * MIB, 30 * MIB)
    );
    assert_eq!(oom.allowed_max, Some(allowed));
    assert_eq!(oom.device_total, total);
    assert!(oom.device_free <= total);
    assert_eq!((oom.allocated, oom.reserved), (40 * MIB, 40 * MIB));
    assert_eq!((oom.reserved_unallocated, oom.largest_free_block), (0, 0));
    assert!(!oom.expandable_segments);
    let s = a.device_stats();
    assert_eq!(
        (s.num_ooms, s.num_alloc_retries, s.num_device_alloc),
        (1, 1, 1)
    );
    // Within the fraction, the same device serves the request.
    a.free(p).unwrap();
    let q = a.malloc(30 * MIB, S0).unwrap();
    assert_eq!(q, p, "the cached 40 MiB block serves it");
    assert!(a.set_memory_fraction(1.5).is_err());
    assert!(a.set_memory_fraction(-0.1).is_err());
    check_consistent(&a);
}

/// Snapshot consistency through a mixed sequence on two streams: after every step the blocks
/// tile the segments and the stats recomputed from the snapshot equal the allocator's.
pub fn snapshots_stay_consistent_with_the_stats_through_a_mixed_sequence<B: DeviceBackend>(
    make: &Make<B>,
) {
    let a = make("max_split_size_mb:40");
    let side = a.backend().create_stream().expect("a second stream");
    let sizes = [
        100,
        700 * KIB,
        3 * MIB,
        512,
        45 * MIB,
        9 * MIB + 3,
        12 * KIB,
        21 * MIB,
    ];
    let mut live = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let stream = if i % 3 == 2 { side } else { S0 };
        live.push(a.malloc(size, stream).unwrap());
        check_consistent(&a);
    }
    // Free every other block, one of them used by the side stream too.
    a.record_stream(live[1], side).unwrap();
    for p in live.iter().step_by(2) {
        a.free(*p).unwrap();
        check_consistent(&a);
    }
    a.free(live[1]).unwrap();
    let snap = check_consistent(&a);
    assert!(
        snap.segments
            .iter()
            .flat_map(|g| &g.blocks)
            .any(|b| b.state == BlockState::ActivePendingFree)
    );
    a.empty_cache().unwrap();
    check_consistent(&a);
    for p in live.iter().skip(3).step_by(2) {
        a.free(*p).unwrap();
    }
    a.empty_cache().unwrap();
    let snap = check_consistent(&a);
    assert!(snap.segments.is_empty());
    assert_eq!(reserved(&a), 0);
}

/// A request beyond the whole device: no cached block fits, the device refuses, the cache is
/// flushed (one retry counted) and the device refuses again: an OOM with the device's facts,
/// counted and reported to the OOM observers.
pub fn a_request_beyond_the_device_fails_with_out_of_memory_after_flushing_the_cache<
    B: DeviceBackend,
>(
    make: &Make<B>,
) {
    let a = make("");
    let (_, total) = a.backend().mem_get_info().unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let observed = Arc::clone(&calls);
    a.attach_oom_observer(move |info| {
        assert_eq!(info.total_or_allowed, total);
        assert!(info.device_free <= total);
        observed.fetch_add(info.size, Ordering::SeqCst);
    });
    // A cached 20 MiB segment, which the flush gives back.
    let cached = a.malloc(5 * MIB, S0).unwrap();
    a.free(cached).unwrap();
    let request = 2 * total + 1;
    let rounded = request.div_ceil(MIN_BLOCK) * MIN_BLOCK;
    let segment = rounded.div_ceil(SMALL_SEGMENT) * SMALL_SEGMENT;
    let e = a.malloc(request, S0).unwrap_err();
    let oom = e.out_of_memory().expect("an out-of-memory error");
    assert_eq!(
        (oom.requested, oom.rounded, oom.segment_size),
        (request, rounded, segment)
    );
    assert_eq!((oom.device_total, oom.allowed_max), (total, None));
    assert_eq!(
        (oom.allocated, oom.reserved),
        (0, 0),
        "the flush released the cache"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        rounded,
        "one observer call, with the rounded size"
    );
    let s = a.device_stats();
    assert_eq!(
        (
            s.num_ooms,
            s.num_alloc_retries,
            s.num_sync_all_streams,
            s.num_device_alloc,
            s.num_device_free
        ),
        (1, 1, 1, 1, 1)
    );
    // The allocator still works.
    let p = a.malloc(5 * MIB, S0).unwrap();
    assert_eq!(offset(&a, p), (0, LARGE_SEGMENT));
    check_consistent(&a);
}

/// Expandable segments at the device's limit: growing a range maps page by page; when the
/// device runs out part-way, the pages this growth mapped are given back (the device's free
/// memory is as before), the request fails with OOM, and the range still grows later.
pub fn an_expandable_segment_that_cannot_grow_gives_back_the_pages_it_mapped<B: DeviceBackend>(
    make: &Make<B>,
) {
    let a = make("expandable_segments:True");
    let (_, total) = a.backend().mem_get_info().unwrap();
    // About half the device, in whole 20 MiB pages.
    let half = total / 2 / LARGE_SEGMENT * LARGE_SEGMENT;
    let first = a.malloc(half, S0).unwrap();
    assert_eq!(reserved(&a), half as i64);
    let free_before = device_free(&a);
    // More than the device has left (total - half), but within the range's reservation
    // (1.125 x total): the growth maps pages until the device refuses one.
    let request = total - half + LARGE_SEGMENT;
    assert!(request > free_before);
    let e = a.malloc(request, S0).unwrap_err();
    let oom = e.out_of_memory().expect("an out-of-memory error");
    assert!(oom.expandable_segments);
    assert_eq!(
        (oom.requested, oom.reserved, oom.allocated),
        (request, half, half)
    );
    assert_eq!(
        device_free(&a),
        free_before,
        "the pages mapped before the device refused were given back"
    );
    let s = a.device_stats();
    assert_eq!(
        (s.num_ooms, s.num_alloc_retries, s.num_device_alloc),
        (1, 1, 1)
    );
    assert_eq!(reserved(&a), half as i64);
    check_consistent(&a);
    // With the first block freed, the range grows past it: the block starts at the range's
    // start and only the pages beyond the first `half` bytes are mapped.
    a.free(first).unwrap();
    let second = a.malloc(request, S0).unwrap();
    assert_eq!(second, first);
    let mapped = request.div_ceil(LARGE_SEGMENT) * LARGE_SEGMENT;
    assert_eq!(reserved(&a), mapped as i64);
    assert_eq!(a.device_stats().num_device_alloc, 2);
    check_consistent(&a);
    a.free(second).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(reserved(&a), 0);
    assert!(device_free(&a) >= free_before + half);
}
