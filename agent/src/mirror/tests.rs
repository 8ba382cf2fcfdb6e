//! Hand-built event sequences against PyTorch's rules.

use super::*;
use allocview_alloc::caching::stats::StatType;

const MIB: u64 = 1 << 20;
const SEG: u64 = 0x7f00_0000_0000;

fn ev(action: EventAction, pool: EventPool, addr: u64, size: u64) -> Event {
    Event::new(action, 0, pool, addr, size)
}

fn alloc(pool: EventPool, addr: u64, size: u64, requested: u64) -> Event {
    Event {
        requested,
        time_ns: 10,
        ..ev(EventAction::Alloc, pool, addr, size)
    }
}

fn free(m: &mut DeviceMirror, pool: EventPool, addr: u64, size: u64) -> Applied {
    m.apply(&ev(EventAction::FreeRequested, pool, addr, size))
        .unwrap();
    m.apply(&Event {
        time_ns: 110,
        ..ev(EventAction::FreeCompleted, pool, addr, size)
    })
    .unwrap()
}

/// Applies one plain event, which must fit.
fn step(m: &mut DeviceMirror, action: EventAction, pool: EventPool, addr: u64, size: u64) {
    m.apply(&ev(action, pool, addr, size)).unwrap();
}

/// A mirror holding one segment of `size` bytes at [`SEG`] in `pool`.
fn with_segment(max_split_size: Option<u64>, pool: EventPool, size: u64) -> DeviceMirror {
    let mut m = DeviceMirror::new(0, max_split_size);
    step(&mut m, EventAction::SegmentAlloc, pool, SEG, size);
    m
}

fn snapshot_of(m: &DeviceMirror) -> Snapshot {
    Snapshot {
        segments: m.segments(),
        ..Snapshot::default()
    }
}

/// The mirror's current figures equal those its own segments imply.
fn assert_consistent(m: &DeviceMirror) {
    let implied = DeviceStats::from_snapshot(&snapshot_of(m), 0, m.max_split_size);
    assert_eq!(m.stats().currents(), implied.currents());
}

fn cur(a: &allocview_alloc::caching::stats::StatArray, t: StatType) -> i64 {
    a.get(t).current
}

#[test]
fn splitting_an_unsplit_block_counts_one_inactive_split_with_the_remainder() {
    let mut m = with_segment(None, EventPool::Large, 20 * MIB);
    m.apply(&alloc(EventPool::Large, SEG, 4 * MIB, 4 * MIB - 100))
        .unwrap();
    let s = m.stats();
    assert_eq!(cur(&s.inactive_split, StatType::LargePool), 1);
    assert_eq!(cur(&s.inactive_split_bytes, StatType::All), 16 * MIB as i64);
    assert_eq!(cur(&s.allocated_bytes, StatType::All), 4 * MIB as i64);
    assert_eq!(
        cur(&s.requested_bytes, StatType::All),
        (4 * MIB - 100) as i64
    );
    assert_eq!(s.num_device_alloc, 1);
    assert_consistent(&m);

    // Splitting the split remainder: bytes drop by the allocated size, count unchanged.
    m.apply(&alloc(EventPool::Large, SEG + 4 * MIB, 2 * MIB, 2 * MIB))
        .unwrap();
    let s = m.stats();
    assert_eq!(cur(&s.inactive_split, StatType::All), 1);
    assert_eq!(cur(&s.inactive_split_bytes, StatType::All), 14 * MIB as i64);
    assert_consistent(&m);

    // Taking the whole remaining split block: -1 and its size.
    m.apply(&alloc(EventPool::Large, SEG + 6 * MIB, 14 * MIB, 14 * MIB))
        .unwrap();
    let s = m.stats();
    assert_eq!(cur(&s.inactive_split, StatType::All), 0);
    assert_eq!(cur(&s.inactive_split_bytes, StatType::All), 0);
    assert_eq!(s.inactive_split.get(StatType::All).peak, 1);
    assert_consistent(&m);
}

#[test]
fn freeing_merges_with_free_neighbours_and_adjusts_by_the_net_change() {
    let mut m = with_segment(None, EventPool::Small, 2 * MIB);
    for i in 0..4 {
        m.apply(&alloc(EventPool::Small, SEG + i * 512, 512, 100))
            .unwrap();
    }
    assert_eq!(m.segments()[0].blocks.len(), 5);
    // Free blocks 1 and 2: after the second they merge into one.
    free(&mut m, EventPool::Small, SEG + 512, 512);
    assert_eq!(cur(&m.stats().inactive_split, StatType::SmallPool), 2);
    let applied = free(&mut m, EventPool::Small, SEG + 1024, 512);
    assert_eq!(applied.lifetime_ns, Some(100));
    assert_eq!(cur(&m.stats().inactive_split, StatType::SmallPool), 2);
    assert_eq!(m.segments()[0].blocks.len(), 4);
    assert_consistent(&m);
    // Free the rest: everything merges into one unsplit block, nothing inactive split.
    free(&mut m, EventPool::Small, SEG, 512);
    free(&mut m, EventPool::Small, SEG + 1536, 512);
    let s = m.stats();
    assert_eq!(m.segments()[0].blocks.len(), 1);
    assert_eq!(cur(&s.inactive_split, StatType::All), 0);
    assert_eq!(cur(&s.inactive_split_bytes, StatType::All), 0);
    assert_eq!(cur(&s.active, StatType::All), 0);
    assert_eq!(cur(&s.requested_bytes, StatType::All), 0);
    assert_eq!(s.allocation.get(StatType::All).allocated, 4);
    assert_eq!(s.allocation.get(StatType::All).freed, 4);
    assert_consistent(&m);
    step(
        &mut m,
        EventAction::SegmentFree,
        EventPool::Small,
        SEG,
        2 * MIB,
    );
    let s = m.stats();
    assert_eq!(cur(&s.reserved_bytes, StatType::All), 0);
    assert_eq!(
        s.reserved_bytes.get(StatType::SmallPool).peak,
        2 * MIB as i64
    );
    assert_eq!((s.num_device_alloc, s.num_device_free), (1, 1));
    assert!(m.segments().is_empty());
}

#[test]
fn allocated_drops_at_the_free_request_and_active_at_completion() {
    let mut m = with_segment(None, EventPool::Large, 20 * MIB);
    m.apply(&alloc(EventPool::Large, SEG, 20 * MIB, 19 * MIB))
        .unwrap();
    step(
        &mut m,
        EventAction::FreeRequested,
        EventPool::Large,
        SEG,
        20 * MIB,
    );
    let s = m.stats();
    assert_eq!(cur(&s.allocated_bytes, StatType::All), 0);
    assert_eq!(cur(&s.active_bytes, StatType::All), 20 * MIB as i64);
    assert_eq!(cur(&s.requested_bytes, StatType::All), 19 * MIB as i64);
    assert_eq!(
        m.segments()[0].blocks[0].state,
        BlockState::ActivePendingFree
    );
    assert_consistent(&m);
    step(
        &mut m,
        EventAction::FreeCompleted,
        EventPool::Large,
        SEG,
        20 * MIB,
    );
    assert_eq!(cur(&m.stats().active_bytes, StatType::All), 0);
    assert_consistent(&m);
}

#[test]
fn oversize_blocks_and_segments_count_from_the_flag() {
    let mut m = DeviceMirror::new(0, None);
    let seg = Event {
        flags: FLAG_OVERSIZE,
        ..ev(EventAction::SegmentAlloc, EventPool::Large, SEG, 40 * MIB)
    };
    m.apply(&seg).unwrap();
    m.apply(&Event {
        flags: FLAG_OVERSIZE,
        ..alloc(EventPool::Large, SEG, 40 * MIB, 39 * MIB)
    })
    .unwrap();
    assert_eq!(m.stats().oversize_allocations.current, 1);
    assert_eq!(m.stats().oversize_segments.current, 1);
    free(&mut m, EventPool::Large, SEG, 40 * MIB);
    assert_eq!(m.stats().oversize_allocations.current, 0);
    step(
        &mut m,
        EventAction::SegmentFree,
        EventPool::Large,
        SEG,
        40 * MIB,
    );
    assert_eq!(m.stats().oversize_segments.current, 0);
    assert_eq!(m.stats().oversize_segments.peak, 1);
}

#[test]
fn expandable_segments_grow_shrink_and_split_on_map_and_unmap() {
    let mut m = DeviceMirror::new(0, None);
    let map = |addr, size| Event {
        flags: FLAG_EXPANDABLE,
        ..ev(EventAction::SegmentMap, EventPool::Large, addr, size)
    };
    m.apply(&map(SEG, 20 * MIB)).unwrap();
    m.apply(&alloc(EventPool::Large, SEG, 12 * MIB, 12 * MIB))
        .unwrap();
    // Growth joins the segment and merges with the free tail.
    m.apply(&map(SEG + 20 * MIB, 20 * MIB)).unwrap();
    let segs = m.segments();
    assert_eq!(segs.len(), 1);
    assert!(segs[0].is_expandable);
    assert_eq!(segs[0].total_size, 40 * MIB);
    assert_eq!(segs[0].blocks.len(), 2);
    assert_eq!(segs[0].blocks[1].size, 28 * MIB);
    let s = m.stats();
    assert_eq!(cur(&s.reserved_bytes, StatType::LargePool), 40 * MIB as i64);
    assert_eq!(cur(&s.segment, StatType::All), 0);
    assert_eq!(cur(&s.inactive_split, StatType::All), 0);
    assert_eq!(s.num_device_alloc, 2);
    m.apply(&alloc(EventPool::Large, SEG + 12 * MIB, 8 * MIB, 8 * MIB))
        .unwrap();
    free(&mut m, EventPool::Large, SEG, 12 * MIB);
    // Unmapping the first page splits the segment in two mapped ranges.
    m.apply(&Event {
        flags: FLAG_EXPANDABLE,
        ..ev(EventAction::SegmentUnmap, EventPool::Large, SEG, 12 * MIB)
    })
    .unwrap();
    let segs = m.segments();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].address, SEG + 12 * MIB);
    assert_eq!(segs[0].total_size, 28 * MIB);
    m.apply(&Event {
        flags: FLAG_EXPANDABLE,
        ..ev(
            EventAction::SegmentUnmap,
            EventPool::Large,
            SEG + 20 * MIB,
            20 * MIB,
        )
    })
    .unwrap();
    let segs = m.segments();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].total_size, 8 * MIB);
    assert_eq!(
        cur(&m.stats().reserved_bytes, StatType::All),
        8 * MIB as i64
    );
    assert_eq!(m.stats().num_device_free, 2);
}

#[test]
fn a_free_event_is_a_request_and_a_completion_at_once() {
    let mut two = with_segment(None, EventPool::Large, 20 * MIB);
    let mut one = with_segment(None, EventPool::Large, 20 * MIB);
    for m in [&mut two, &mut one] {
        for i in 0..3 {
            m.apply(&alloc(
                EventPool::Large,
                SEG + i * 4 * MIB,
                4 * MIB,
                3 * MIB,
            ))
            .unwrap();
        }
    }
    // The middle block, then the first (merging with it).
    for addr in [SEG + 4 * MIB, SEG] {
        let by_two = free(&mut two, EventPool::Large, addr, 4 * MIB);
        let by_one = one
            .apply(&Event {
                time_ns: 110,
                requested: 3 * MIB,
                ..ev(EventAction::Free, EventPool::Large, addr, 4 * MIB)
            })
            .unwrap();
        assert_eq!(by_one.lifetime_ns, Some(100));
        assert_eq!(by_one.lifetime_ns, by_two.lifetime_ns);
        assert_eq!(one.stats(), two.stats());
        assert_eq!(one.segments(), two.segments());
        assert_consistent(&one);
    }
    assert_eq!(
        cur(&one.stats().active_bytes, StatType::All),
        4 * MIB as i64
    );
    assert_eq!(
        cur(&one.stats().allocated_bytes, StatType::All),
        4 * MIB as i64
    );
}

#[test]
fn an_event_that_does_not_fit_is_refused_and_changes_nothing() {
    let mut m = with_segment(None, EventPool::Large, 20 * MIB);
    m.apply(&alloc(EventPool::Large, SEG, 4 * MIB, 4 * MIB))
        .unwrap();
    let before = m.stats().clone();
    let version = m.version();
    let bad = [
        alloc(EventPool::Large, SEG, 512, 512),
        alloc(EventPool::Large, SEG + 100 * MIB, 512, 512),
        ev(EventAction::FreeCompleted, EventPool::Large, SEG, 4 * MIB),
        ev(EventAction::Free, EventPool::Large, SEG, 512),
        ev(EventAction::Free, EventPool::Large, SEG + 4 * MIB, 512),
        ev(
            EventAction::FreeRequested,
            EventPool::Large,
            SEG + 4 * MIB,
            512,
        ),
        ev(EventAction::SegmentFree, EventPool::Large, SEG, 20 * MIB),
        ev(
            EventAction::SegmentAlloc,
            EventPool::Large,
            SEG + MIB,
            20 * MIB,
        ),
    ];
    for e in bad {
        assert!(m.apply(&e).is_err(), "{e:?} should be refused");
    }
    assert_eq!(m.stats(), &before);
    assert_eq!(m.version(), version);
}

#[test]
fn counters_and_resets_follow_their_events() {
    let mut m = with_segment(Some(20 * MIB), EventPool::Large, 20 * MIB);
    assert_eq!(m.stats().oversize_segments.current, 1);
    for a in [
        EventAction::Oom,
        EventAction::AllocRetry,
        EventAction::SyncAllStreams,
    ] {
        step(&mut m, a, EventPool::Large, 0, 0);
    }
    let s = m.stats();
    assert_eq!(
        (s.num_ooms, s.num_alloc_retries, s.num_sync_all_streams),
        (1, 1, 1)
    );
    assert_eq!(s.max_split_size, 20 * MIB as i64);
    m.apply(&alloc(EventPool::Large, SEG, 20 * MIB, 20 * MIB))
        .unwrap();
    free(&mut m, EventPool::Large, SEG, 20 * MIB);
    step(&mut m, EventAction::ResetPeaks, EventPool::Large, 0, 0);
    assert_eq!(m.stats().allocated_bytes.get(StatType::All).peak, 0);
    assert_eq!(m.streams()[0].peak_allocated, 0);
    step(
        &mut m,
        EventAction::ResetAccumulated,
        EventPool::Large,
        0,
        0,
    );
    let s = m.stats();
    assert_eq!(s.allocation.get(StatType::All).allocated, 0);
    assert_eq!((s.num_ooms, s.num_device_alloc), (0, 0));
}

#[test]
fn resync_takes_the_allocators_segments_and_stats() {
    let mut truth = with_segment(None, EventPool::Large, 20 * MIB);
    truth
        .apply(&Event {
            stream: 3,
            ..alloc(EventPool::Large, SEG, 2 * MIB, 2 * MIB)
        })
        .unwrap();
    let mut m = DeviceMirror::new(0, None);
    m.resync(&snapshot_of(&truth), truth.stats().clone());
    assert_eq!(m.stats(), truth.stats());
    assert_eq!(m.segments(), truth.segments());
    assert_eq!(m.pools(), truth.pools());
    // Events after the resync apply on top.
    free(&mut m, EventPool::Large, SEG, 2 * MIB);
    assert_eq!(cur(&m.stats().allocated_bytes, StatType::All), 0);
    assert_consistent(&m);
}

#[test]
fn pools_and_streams_sum_the_mirror() {
    let mut m = DeviceMirror::new(0, None);
    m.apply(&Event {
        stream: 7,
        ..ev(EventAction::SegmentAlloc, EventPool::Small, SEG, 2 * MIB)
    })
    .unwrap();
    m.apply(&Event {
        stream: 7,
        ..alloc(EventPool::Small, SEG, 512, 512)
    })
    .unwrap();
    m.apply(&Event {
        flags: FLAG_PRIVATE_POOL,
        pool_id: 4,
        ..ev(
            EventAction::SegmentAlloc,
            EventPool::Large,
            SEG + 2 * MIB,
            20 * MIB,
        )
    })
    .unwrap();
    let pools = m.pools();
    assert_eq!(
        pools.iter().map(|p| p.pool).collect::<Vec<_>>(),
        [PoolKey::Small, PoolKey::Large, PoolKey::Private(4)]
    );
    assert_eq!(pools[0].allocated, 512);
    assert_eq!(pools[0].inactive_split, 1);
    assert_eq!(pools[0].largest_free, 2 * MIB - 512);
    assert_eq!(pools[2].reserved, 20 * MIB);
    assert_eq!(m.largest_free_block(), 20 * MIB);
    let streams = m.streams();
    assert_eq!(streams[0].stream, 0);
    assert_eq!(streams[1].stream, 7);
    assert_eq!(streams[1].allocated, 512);
    assert_eq!(streams[1].reserved, 2 * MIB);
    assert_eq!(m.segments()[1].segment_pool_id, (4, 0));
}
