//! The simulated device: capacity, addresses, hints, frees, streams and events, virtual memory,
//! fault injection and counters, all through the public `DeviceBackend` interface.

use std::sync::Arc;

use proptest::prelude::*;

use allocview_alloc::caching::backend::{DeviceBackend, DeviceError, EventId, StreamId};
use allocview_alloc::caching::sim::{
    DEFAULT_BASE_ADDRESS, NEVER_COMPLETE_ERROR_CODE, SEGMENT_ALIGNMENT, SimBackend,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn is_oom(result: Result<u64, DeviceError>, expected_size: u64) -> bool {
    matches!(result, Err(DeviceError::OutOfMemory { size }) if size == expected_size)
}

// ---- capacity and out-of-memory ----

#[test]
fn mallocs_up_to_capacity_succeed_and_one_byte_more_fails_with_out_of_memory() {
    let dev = SimBackend::new(100 * MIB);
    let a = dev.malloc(60 * MIB).unwrap();
    let _b = dev.malloc(40 * MIB).unwrap();
    assert_eq!(dev.used(), 100 * MIB);
    assert!(is_oom(dev.malloc(1), 1));
    dev.free(a).unwrap();
    assert_eq!(dev.used(), 40 * MIB);
    assert!(dev.malloc(60 * MIB).is_ok());
    assert!(is_oom(dev.malloc(512), 512));
}

#[test]
fn a_failed_malloc_changes_nothing() {
    let dev = SimBackend::new(10 * MIB);
    assert!(is_oom(dev.malloc(11 * MIB), 11 * MIB));
    assert_eq!(dev.used(), 0);
    assert!(dev.live_segments().is_empty());
    assert!(dev.malloc(10 * MIB).is_ok());
}

#[test]
fn a_zero_byte_malloc_is_invalid() {
    let dev = SimBackend::new(GIB);
    assert!(matches!(dev.malloc(0), Err(DeviceError::Invalid(_))));
}

#[test]
fn external_usage_counts_toward_capacity() {
    let dev = SimBackend::new(100 * MIB);
    dev.set_external_usage(70 * MIB);
    assert_eq!(dev.used(), 70 * MIB);
    assert!(is_oom(dev.malloc(40 * MIB), 40 * MIB));
    assert!(dev.malloc(30 * MIB).is_ok());
    dev.set_external_usage(0);
    assert_eq!(dev.used(), 30 * MIB);
}

#[test]
fn capacity_can_be_lowered_below_what_is_in_use() {
    let dev = SimBackend::new(100 * MIB);
    dev.malloc(50 * MIB).unwrap();
    dev.set_capacity(40 * MIB);
    assert_eq!(dev.capacity(), 40 * MIB);
    assert_eq!(dev.mem_get_info().unwrap(), (0, 40 * MIB));
    assert!(is_oom(dev.malloc(512), 512));
}

#[test]
fn absurd_sizes_and_addresses_are_errors_not_panics() {
    let dev = SimBackend::new(u64::MAX);
    assert!(is_oom(dev.malloc(u64::MAX), u64::MAX));
    dev.hint_next_segment(u64::MAX - 511);
    let p = dev.malloc(4096).unwrap();
    assert!(p < u64::MAX - 511);
    let g = dev.vm_granularity();
    let huge = u64::MAX / g * g;
    assert!(matches!(
        dev.vm_reserve(huge),
        Err(DeviceError::OutOfMemory { .. })
    ));
    let va = dev.vm_reserve(4 * g).unwrap();
    assert!(matches!(dev.vm_map(va, huge), Err(DeviceError::Invalid(_))));
    assert!(matches!(
        dev.vm_unmap(huge, huge),
        Err(DeviceError::Invalid(_))
    ));
    assert!(matches!(
        dev.vm_release(u64::MAX, u64::MAX),
        Err(DeviceError::Invalid(_))
    ));
}

// ---- mem_get_info ----

#[test]
fn mem_get_info_reports_capacity_minus_used_and_capacity() {
    let dev = SimBackend::new(GIB);
    assert_eq!(dev.mem_get_info().unwrap(), (GIB, GIB));
    let p = dev.malloc(100 * MIB).unwrap();
    dev.set_external_usage(24 * MIB);
    assert_eq!(dev.mem_get_info().unwrap(), (GIB - 124 * MIB, GIB));
    dev.free(p).unwrap();
    assert_eq!(dev.mem_get_info().unwrap(), (GIB - 24 * MIB, GIB));
}

#[test]
fn mem_get_info_never_underflows_when_external_usage_exceeds_capacity() {
    let dev = SimBackend::new(GIB);
    dev.set_external_usage(2 * GIB);
    assert_eq!(dev.mem_get_info().unwrap(), (0, GIB));
    assert!(is_oom(dev.malloc(512), 512));
}

// ---- deterministic addresses ----

#[test]
fn segments_are_placed_first_fit_from_the_base_address_aligned_to_two_mebibytes() {
    let dev = SimBackend::new(GIB);
    let a = dev.malloc(20 * MIB).unwrap();
    let b = dev.malloc(512).unwrap();
    let c = dev.malloc(2 * MIB).unwrap();
    assert_eq!(a, DEFAULT_BASE_ADDRESS);
    assert_eq!(b, a + 20 * MIB);
    assert_eq!(c, b + SEGMENT_ALIGNMENT);
    // Freeing a makes its hole the first fit for anything up to 20 MiB.
    dev.free(a).unwrap();
    assert_eq!(dev.malloc(4 * MIB).unwrap(), a);
    assert_eq!(dev.malloc(16 * MIB).unwrap(), a + 4 * MIB);
    // Too big for any hole: goes above everything.
    assert_eq!(dev.malloc(8 * MIB).unwrap(), c + 2 * MIB);
}

#[test]
fn the_same_calls_give_the_same_addresses() {
    fn run() -> Vec<u64> {
        let dev = SimBackend::new(4 * GIB);
        let mut out = Vec::new();
        let mut live = Vec::new();
        for i in 0..200u64 {
            let size = ((i * 7919) % 13 + 1) * MIB + (i % 3) * 512;
            let p = dev.malloc(size).unwrap();
            out.push(p);
            live.push(p);
            if i % 4 == 3 {
                dev.free(live.remove((i as usize * 31) % live.len()))
                    .unwrap();
            }
        }
        out
    }
    assert_eq!(run(), run());
}

#[test]
fn segments_never_overlap() {
    let dev = SimBackend::new(8 * GIB);
    let mut live = Vec::new();
    for i in 0..300u64 {
        let size = ((i * 104_729) % 37 + 1) * 512 * 1000;
        live.push(dev.malloc(size).unwrap());
        if i % 3 == 0 {
            dev.free(live.swap_remove((i as usize * 17) % live.len()))
                .unwrap();
        }
    }
    let segments = dev.live_segments();
    assert_eq!(segments.len(), live.len());
    for pair in segments.windows(2) {
        assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{pair:x?} overlap");
    }
    assert!(segments.iter().all(|&(a, _)| a % SEGMENT_ALIGNMENT == 0));
}

#[test]
fn the_builder_sets_device_base_address_and_granularity() {
    let dev = SimBackend::builder()
        .capacity(GIB)
        .device(3)
        .base_address(0x1234_5678)
        .granularity(4 * MIB)
        .build();
    assert_eq!(dev.device(), 3);
    assert_eq!(dev.capacity(), GIB);
    assert_eq!(dev.vm_granularity(), 4 * MIB);
    // The base rounds up to the placement alignment (the granularity here).
    let expected_base = 0x1234_5678_u64.next_multiple_of(4 * MIB);
    assert_eq!(dev.base_address(), expected_base);
    assert_eq!(dev.malloc(MIB).unwrap(), expected_base);
}

#[test]
fn the_builder_rounds_an_odd_granularity_up_to_a_power_of_two() {
    let dev = SimBackend::builder().granularity(3 * MIB).build();
    assert_eq!(dev.vm_granularity(), 4 * MIB);
    let dev = SimBackend::builder().granularity(0).build();
    assert_eq!(dev.vm_granularity(), 512);
}

// ---- placement hints ----

#[test]
fn a_hint_places_the_next_segment_exactly_at_a_recorded_address() {
    let dev = SimBackend::new(64 * GIB);
    // Addresses from a PyTorch recording: 512-aligned, arbitrary, placed out of order.
    let recorded = [
        (139_777_059_848_192_u64, 2 * MIB),
        (139_777_038_876_672, 20 * MIB),
        (139_777_061_945_344, 512 * 1024),
    ];
    for &(addr, size) in &recorded {
        dev.hint_next_segment(addr);
        assert_eq!(dev.malloc(size).unwrap(), addr);
    }
    let c = dev.counters();
    assert_eq!((c.hints_honoured, c.hints_ignored), (3, 0));
    let mut expected = recorded.to_vec();
    expected.sort_unstable();
    assert_eq!(dev.live_segments(), expected);
}

#[test]
fn a_hint_below_the_base_address_is_honoured() {
    let dev = SimBackend::new(GIB);
    dev.hint_next_segment(0x1000_0200);
    assert_eq!(dev.malloc(1000).unwrap(), 0x1000_0200);
}

#[test]
fn a_hint_over_a_live_segment_is_ignored_counted_and_falls_back_to_first_fit() {
    let dev = SimBackend::new(GIB);
    let a = dev.malloc(20 * MIB).unwrap();
    dev.hint_next_segment(a + 10 * MIB);
    let b = dev.malloc(2 * MIB).unwrap();
    assert_eq!(b, a + 20 * MIB);
    let c = dev.counters();
    assert_eq!((c.hints_honoured, c.hints_ignored), (0, 1));
    // Used up: the next malloc has no hint.
    assert_eq!(dev.malloc(2 * MIB).unwrap(), b + 2 * MIB);
    assert_eq!(dev.counters().hints_ignored, 1);
}

#[test]
fn a_hint_whose_range_would_run_into_a_segment_is_ignored() {
    let dev = SimBackend::new(GIB);
    let a = dev.malloc(2 * MIB).unwrap();
    let hint = a - 2 * MIB;
    dev.hint_next_segment(hint);
    // 4 MiB from `hint` would cover `a`.
    assert_ne!(dev.malloc(4 * MIB).unwrap(), hint);
    assert_eq!(dev.counters().hints_ignored, 1);
}

#[test]
fn a_misaligned_hint_is_ignored() {
    let dev = SimBackend::new(GIB);
    dev.hint_next_segment(0x1000_0100);
    assert_eq!(dev.malloc(MIB).unwrap(), DEFAULT_BASE_ADDRESS);
    assert_eq!(dev.counters().hints_ignored, 1);
}

#[test]
fn a_malloc_that_fails_for_lack_of_memory_leaves_the_hint_for_the_retry() {
    let dev = SimBackend::new(10 * MIB);
    let blocker = dev.malloc(8 * MIB).unwrap();
    dev.hint_next_segment(0x5000_0000);
    assert!(is_oom(dev.malloc(4 * MIB), 4 * MIB));
    dev.free(blocker).unwrap();
    assert_eq!(dev.malloc(4 * MIB).unwrap(), 0x5000_0000);
    assert_eq!(dev.counters().hints_honoured, 1);
}

#[test]
fn a_hint_also_places_the_next_reservation() {
    let dev = SimBackend::new(GIB);
    dev.hint_next_segment(0x6000_0000);
    assert_eq!(dev.vm_reserve(64 * MIB).unwrap(), 0x6000_0000);
    // A reservation hint must be granularity-aligned.
    dev.hint_next_segment(0x7000_0200);
    assert_ne!(dev.vm_reserve(2 * MIB).unwrap(), 0x7000_0200);
    let c = dev.counters();
    assert_eq!((c.hints_honoured, c.hints_ignored), (1, 1));
}

#[test]
fn a_segment_is_not_placed_inside_a_reservation_even_when_hinted() {
    let dev = SimBackend::new(GIB);
    let va = dev.vm_reserve(64 * MIB).unwrap();
    dev.hint_next_segment(va + 4 * MIB);
    let p = dev.malloc(2 * MIB).unwrap();
    assert!(p >= va + 64 * MIB || p + 2 * MIB <= va);
    assert_eq!(dev.counters().hints_ignored, 1);
}

#[test]
fn many_hinted_segments_in_reverse_order_place_exactly() {
    let dev = SimBackend::new(1 << 50);
    let base = 139_000_000_000_000_u64 / 512 * 512;
    for i in (0..5_000u64).rev() {
        dev.hint_next_segment(base + i * 3 * MIB);
        assert_eq!(dev.malloc(2 * MIB + 512).unwrap(), base + i * 3 * MIB);
    }
    assert_eq!(dev.counters().hints_honoured, 5_000);
    assert_eq!(dev.live_segments().len(), 5_000);
}

// ---- frees ----

#[test]
fn freeing_an_unknown_pointer_is_invalid() {
    let dev = SimBackend::new(GIB);
    assert!(matches!(dev.free(0x1234), Err(DeviceError::Invalid(_))));
    let p = dev.malloc(4 * MIB).unwrap();
    // An interior pointer is not a segment either.
    assert!(matches!(dev.free(p + 512), Err(DeviceError::Invalid(_))));
    assert_eq!(dev.used(), 4 * MIB);
}

#[test]
fn a_double_free_is_invalid_and_leaves_the_accounting_alone() {
    let dev = SimBackend::new(GIB);
    let p = dev.malloc(4 * MIB).unwrap();
    let q = dev.malloc(4 * MIB).unwrap();
    dev.free(p).unwrap();
    let err = dev.free(p).unwrap_err();
    assert!(matches!(&err, DeviceError::Invalid(msg) if msg.contains("double free")));
    assert_eq!(dev.used(), 4 * MIB);
    assert_eq!(dev.live_segments(), vec![(q, 4 * MIB)]);
    assert_eq!(dev.counters().free, 2);
}

#[test]
fn freeing_a_reservation_with_free_is_invalid() {
    let dev = SimBackend::new(GIB);
    let va = dev.vm_reserve(8 * MIB).unwrap();
    let err = dev.free(va).unwrap_err();
    assert!(matches!(&err, DeviceError::Invalid(msg) if msg.contains("vm_release")));
}

// ---- streams and events ----

#[test]
fn streams_get_increasing_ids_and_the_default_stream_always_exists() {
    let dev = SimBackend::new(GIB);
    assert_eq!(dev.create_stream().unwrap(), StreamId(1));
    assert_eq!(dev.create_stream().unwrap(), StreamId(2));
    assert_eq!(dev.streams(), vec![StreamId(0), StreamId(1), StreamId(2)]);
    let ev = dev.create_event().unwrap();
    dev.record_event(ev, StreamId::DEFAULT).unwrap();
}

#[test]
fn with_auto_complete_every_recorded_event_is_complete_at_once() {
    let dev = SimBackend::new(GIB);
    let s = dev.create_stream().unwrap();
    dev.submit_work(s);
    let ev = dev.create_event().unwrap();
    dev.record_event(ev, s).unwrap();
    assert!(dev.query_event(ev).unwrap());
    assert_eq!(dev.pending_work(s), Some(0));
}

#[test]
fn without_auto_complete_an_event_waits_for_the_work_before_it() {
    let dev = SimBackend::builder().auto_complete(false).build();
    let s = dev.create_stream().unwrap();
    let ev = dev.create_event().unwrap();
    // Nothing queued: complete at once.
    dev.record_event(ev, s).unwrap();
    assert!(dev.query_event(ev).unwrap());
    dev.submit_work(s);
    dev.record_event(ev, s).unwrap();
    assert!(!dev.query_event(ev).unwrap());
    assert_eq!(dev.pending_work(s), Some(1));
    dev.complete_stream(s);
    assert!(dev.query_event(ev).unwrap());
}

#[test]
fn work_submitted_after_an_event_does_not_delay_it() {
    let dev = SimBackend::new(GIB);
    dev.set_auto_complete(false);
    let s = dev.create_stream().unwrap();
    dev.submit_work(s);
    let first = dev.create_event().unwrap();
    dev.record_event(first, s).unwrap();
    dev.submit_work(s);
    let second = dev.create_event().unwrap();
    dev.record_event(second, s).unwrap();
    // Waiting on the first completes only the work before it.
    dev.synchronize_event(first).unwrap();
    assert!(dev.query_event(first).unwrap());
    assert!(!dev.query_event(second).unwrap());
    assert_eq!(dev.pending_work(s), Some(1));
}

#[test]
fn completing_one_stream_leaves_the_others_pending() {
    let dev = SimBackend::builder().auto_complete(false).build();
    let s1 = dev.create_stream().unwrap();
    let s2 = dev.create_stream().unwrap();
    let (e1, e2) = (dev.create_event().unwrap(), dev.create_event().unwrap());
    dev.submit_work(s1);
    dev.submit_work(s2);
    dev.record_event(e1, s1).unwrap();
    dev.record_event(e2, s2).unwrap();
    dev.complete_stream(s1);
    assert!(dev.query_event(e1).unwrap());
    assert!(!dev.query_event(e2).unwrap());
    dev.complete_all();
    assert!(dev.query_event(e2).unwrap());
}

#[test]
fn synchronize_device_completes_all_work() {
    let dev = SimBackend::builder().auto_complete(false).build();
    let s = dev.create_stream().unwrap();
    let ev = dev.create_event().unwrap();
    dev.submit_work(s);
    dev.submit_work(StreamId::DEFAULT);
    dev.record_event(ev, s).unwrap();
    dev.synchronize_device().unwrap();
    assert!(dev.query_event(ev).unwrap());
    assert_eq!(dev.pending_work(StreamId::DEFAULT), Some(0));
}

#[test]
fn turning_auto_complete_on_finishes_pending_work() {
    let dev = SimBackend::builder().auto_complete(false).build();
    let ev = dev.create_event().unwrap();
    dev.submit_work(StreamId::DEFAULT);
    dev.record_event(ev, StreamId::DEFAULT).unwrap();
    assert!(!dev.query_event(ev).unwrap());
    dev.set_auto_complete(true);
    assert!(dev.query_event(ev).unwrap());
}

#[test]
fn with_events_never_complete_queries_stay_false_and_waits_fail_instead_of_hanging() {
    let dev = SimBackend::new(GIB);
    dev.set_events_never_complete(true);
    let ev = dev.create_event().unwrap();
    // Never recorded: trivially complete, as cudaEventQuery says.
    assert!(dev.query_event(ev).unwrap());
    dev.synchronize_event(ev).unwrap();
    dev.record_event(ev, StreamId::DEFAULT).unwrap();
    assert!(!dev.query_event(ev).unwrap());
    dev.complete_all();
    assert!(!dev.query_event(ev).unwrap());
    let never = |r: Result<(), DeviceError>| matches!(r, Err(DeviceError::Driver { code, .. }) if code == NEVER_COMPLETE_ERROR_CODE);
    assert!(never(dev.synchronize_event(ev)));
    assert!(never(dev.synchronize_device()));
    dev.set_events_never_complete(false);
    assert!(dev.query_event(ev).unwrap());
    dev.synchronize_device().unwrap();
}

#[test]
fn unknown_streams_and_events_are_invalid() {
    let dev = SimBackend::new(GIB);
    let ev = dev.create_event().unwrap();
    let invalid = |r: Result<(), DeviceError>| matches!(r, Err(DeviceError::Invalid(_)));
    assert!(invalid(dev.record_event(ev, StreamId(42))));
    assert!(invalid(dev.record_event(EventId(999), StreamId::DEFAULT)));
    assert!(matches!(
        dev.query_event(EventId(999)),
        Err(DeviceError::Invalid(_))
    ));
    assert!(invalid(dev.synchronize_event(EventId(999))));
    assert!(invalid(dev.destroy_event(EventId(999))));
    dev.destroy_event(ev).unwrap();
    assert!(invalid(dev.destroy_event(ev)));
    assert!(matches!(dev.query_event(ev), Err(DeviceError::Invalid(_))));
    assert_eq!(dev.live_events(), 0);
}

#[test]
fn a_stream_added_by_id_accepts_events() {
    let dev = SimBackend::new(GIB);
    let recorded = StreamId(94_433_227_406_752);
    assert!(dev.add_stream(recorded));
    assert!(!dev.add_stream(recorded));
    let ev = dev.create_event().unwrap();
    dev.record_event(ev, recorded).unwrap();
    assert!(dev.query_event(ev).unwrap());
}

#[test]
fn test_controls_on_unknown_streams_do_nothing_and_are_counted() {
    let dev = SimBackend::new(GIB);
    dev.submit_work(StreamId(77));
    dev.complete_stream(StreamId(78));
    assert_eq!(dev.counters().ignored_controls, 2);
    assert_eq!(dev.pending_work(StreamId(77)), None);
}

// ---- virtual memory ----

#[test]
fn reserving_address_space_uses_no_memory_and_mapping_does() {
    let dev = SimBackend::new(100 * MIB);
    let g = dev.vm_granularity();
    assert_eq!(g, 2 * MIB);
    let va = dev.vm_reserve(GIB).unwrap();
    assert_eq!(va % g, 0);
    assert_eq!(dev.used(), 0);
    dev.vm_map(va, 20 * MIB).unwrap();
    dev.vm_map(va + 20 * MIB, 20 * MIB).unwrap();
    assert_eq!(dev.used(), 40 * MIB);
    assert_eq!(dev.mapped_bytes(), 40 * MIB);
    assert_eq!(dev.mapped_ranges(), vec![(va, 40 * MIB)]);
    assert_eq!(dev.mem_get_info().unwrap(), (60 * MIB, 100 * MIB));
    // Unmap a page in the middle, then the rest.
    dev.vm_unmap(va + 10 * MIB, 2 * MIB).unwrap();
    assert_eq!(
        dev.mapped_ranges(),
        vec![(va, 10 * MIB), (va + 12 * MIB, 28 * MIB)]
    );
    dev.vm_unmap(va, 10 * MIB).unwrap();
    dev.vm_unmap(va + 12 * MIB, 28 * MIB).unwrap();
    assert_eq!(dev.used(), 0);
    dev.vm_release(va, GIB).unwrap();
    assert!(dev.live_reservations().is_empty());
}

#[test]
fn mapping_beyond_capacity_fails_with_out_of_memory() {
    let dev = SimBackend::new(10 * MIB);
    let va = dev.vm_reserve(64 * MIB).unwrap();
    dev.vm_map(va, 8 * MIB).unwrap();
    assert_eq!(
        dev.vm_map(va + 8 * MIB, 4 * MIB),
        Err(DeviceError::OutOfMemory { size: 4 * MIB })
    );
    assert_eq!(dev.used(), 8 * MIB);
    assert_eq!(dev.counters().failed_maps, 1);
}

#[test]
fn reservations_and_segments_never_overlap() {
    let dev = SimBackend::new(GIB);
    let a = dev.malloc(2 * MIB).unwrap();
    let va = dev.vm_reserve(64 * MIB).unwrap();
    let b = dev.malloc(2 * MIB).unwrap();
    assert_eq!(va, a + 2 * MIB);
    assert_eq!(b, va + 64 * MIB);
    dev.vm_release(va, 64 * MIB).unwrap();
    assert_eq!(dev.malloc(64 * MIB).unwrap(), va);
}

#[test]
fn misusing_virtual_memory_is_invalid_with_a_message() {
    let dev = SimBackend::new(GIB);
    let g = dev.vm_granularity();
    let invalid = |r: Result<(), DeviceError>, needle: &str| match r {
        Err(DeviceError::Invalid(msg)) => assert!(msg.contains(needle), "{msg:?} lacks {needle:?}"),
        other => panic!("expected Invalid containing {needle:?}, got {other:?}"),
    };
    assert!(matches!(dev.vm_reserve(0), Err(DeviceError::Invalid(_))));
    assert!(matches!(
        dev.vm_reserve(g + 512),
        Err(DeviceError::Invalid(_))
    ));
    let va = dev.vm_reserve(16 * g).unwrap();
    invalid(dev.vm_map(va + 512, g), "granularity");
    invalid(dev.vm_map(va, g + 512), "granularity");
    invalid(
        dev.vm_map(va + 15 * g, 2 * g),
        "not inside one reserved range",
    );
    invalid(dev.vm_map(0x4000_0000, g), "not inside one reserved range");
    dev.vm_map(va, 4 * g).unwrap();
    invalid(dev.vm_map(va + 3 * g, 2 * g), "overlaps");
    invalid(dev.vm_unmap(va + 3 * g, 2 * g), "not entirely mapped");
    invalid(dev.vm_unmap(va + 8 * g, g), "not entirely mapped");
    invalid(dev.vm_release(va, 16 * g), "still mapped");
    invalid(dev.vm_release(va, 8 * g), "release it whole");
    invalid(dev.vm_release(va + g, 15 * g), "no reservation starts");
    dev.vm_unmap(va, 4 * g).unwrap();
    dev.vm_release(va, 16 * g).unwrap();
    invalid(dev.vm_release(va, 16 * g), "no reservation starts");
    invalid(dev.vm_map(va, g), "not inside one reserved range");
    assert_eq!(dev.used(), 0);
}

#[test]
fn mapping_adjacent_reservations_in_one_call_is_invalid() {
    let dev = SimBackend::new(GIB);
    let a = dev.vm_reserve(4 * MIB).unwrap();
    let b = dev.vm_reserve(4 * MIB).unwrap();
    assert_eq!(b, a + 4 * MIB);
    assert!(matches!(
        dev.vm_map(a + 2 * MIB, 4 * MIB),
        Err(DeviceError::Invalid(_))
    ));
}

// ---- fault injection ----

#[test]
fn the_nth_malloc_from_now_fails_and_only_that_one() {
    let dev = SimBackend::new(GIB);
    dev.fail_nth_malloc(3);
    assert!(dev.malloc(MIB).is_ok());
    assert!(dev.malloc(MIB).is_ok());
    assert!(is_oom(dev.malloc(MIB), MIB));
    assert!(dev.malloc(MIB).is_ok());
    assert_eq!(dev.counters().failed_mallocs, 1);
    dev.fail_nth_malloc(1);
    assert!(is_oom(dev.malloc(MIB), MIB));
    // Zero cancels.
    dev.fail_nth_malloc(1);
    dev.fail_nth_malloc(0);
    assert!(dev.malloc(MIB).is_ok());
}

#[test]
fn mallocs_and_maps_above_a_size_fail_until_the_limit_is_lifted() {
    let dev = SimBackend::new(GIB);
    dev.fail_malloc_above(Some(10 * MIB));
    assert!(dev.malloc(10 * MIB).is_ok());
    assert!(is_oom(dev.malloc(10 * MIB + 512), 10 * MIB + 512));
    let va = dev.vm_reserve(64 * MIB).unwrap();
    dev.vm_map(va, 10 * MIB).unwrap();
    assert_eq!(
        dev.vm_map(va + 10 * MIB, 12 * MIB),
        Err(DeviceError::OutOfMemory { size: 12 * MIB })
    );
    dev.fail_malloc_above(None);
    assert!(dev.malloc(20 * MIB).is_ok());
    dev.vm_map(va + 10 * MIB, 12 * MIB).unwrap();
}

// ---- counters ----

#[test]
fn every_call_is_counted_whether_it_succeeds_or_not() {
    let dev = SimBackend::new(10 * MIB);
    let p = dev.malloc(MIB).unwrap();
    let _ = dev.malloc(20 * MIB);
    dev.free(p).unwrap();
    let _ = dev.free(p);
    dev.mem_get_info().unwrap();
    let s = dev.create_stream().unwrap();
    let ev = dev.create_event().unwrap();
    dev.record_event(ev, s).unwrap();
    dev.query_event(ev).unwrap();
    dev.synchronize_event(ev).unwrap();
    dev.synchronize_device().unwrap();
    dev.destroy_event(ev).unwrap();
    let va = dev.vm_reserve(4 * MIB).unwrap();
    dev.vm_map(va, 2 * MIB).unwrap();
    let _ = dev.vm_map(va, 2 * MIB);
    dev.vm_unmap(va, 2 * MIB).unwrap();
    dev.vm_release(va, 4 * MIB).unwrap();
    let c = dev.counters();
    assert_eq!((c.malloc, c.failed_mallocs, c.free), (2, 1, 2));
    assert_eq!(c.mem_get_info, 1);
    assert_eq!(
        (c.create_stream, c.create_event, c.destroy_event),
        (1, 1, 1)
    );
    assert_eq!((c.record_event, c.query_event), (1, 1));
    assert_eq!((c.synchronize_event, c.synchronize_device), (1, 1));
    assert_eq!((c.vm_reserve, c.vm_map, c.failed_maps), (1, 2, 1));
    assert_eq!((c.vm_unmap, c.vm_release), (1, 1));
}

// ---- sharing ----

#[test]
fn a_shared_device_is_usable_from_many_threads() {
    let dev = Arc::new(SimBackend::new(64 * GIB));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let dev = Arc::clone(&dev);
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..500u64 {
                    mine.push(dev.malloc((i % 7 + 1) * MIB).unwrap());
                    if i % 2 == 1 {
                        dev.free(mine.pop().unwrap()).unwrap();
                    }
                }
                for p in mine {
                    dev.free(p).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(dev.used(), 0);
    assert!(dev.live_segments().is_empty());
    assert_eq!(dev.counters().malloc, 2000);
    // The Arc is a backend too.
    assert_eq!(DeviceBackend::device(&dev), 0);
}

// ---- model check ----

mod model {
    //! A naive model of the simulated device's address space: a sorted list of occupied ranges
    //! scanned from the bottom. The real one must place everything where this one does.

    use super::{MIB, SEGMENT_ALIGNMENT};

    #[derive(Debug, Default)]
    pub struct NaiveSpace {
        /// (start, end, is_reservation), unsorted.
        pub ranges: Vec<(u64, u64, bool)>,
    }

    impl NaiveSpace {
        pub fn is_free(&self, start: u64, size: u64) -> bool {
            start >= 512
                && self
                    .ranges
                    .iter()
                    .all(|&(s, e, _)| start + size <= s || start >= e)
        }

        pub fn first_fit(&self, base: u64, size: u64) -> u64 {
            let mut sorted = self.ranges.clone();
            sorted.sort_unstable();
            let mut cursor = base.next_multiple_of(SEGMENT_ALIGNMENT);
            for (s, e, _) in sorted {
                if e <= cursor {
                    continue;
                }
                if s >= cursor + size {
                    break;
                }
                cursor = e.next_multiple_of(SEGMENT_ALIGNMENT);
            }
            cursor
        }
    }

    /// Operations on the device.
    #[derive(Debug, Clone)]
    pub enum Op {
        /// malloc(pages * 2 MiB + extra * 512)
        Malloc { pages: u64, extra: u64 },
        /// hint (base + offset * 512), then malloc
        HintedMalloc { offset: u64, pages: u64 },
        /// free the i-th live segment (modulo)
        Free { index: usize },
        /// vm_reserve(pages * 2 MiB)
        Reserve { pages: u64 },
        /// release the i-th reservation (modulo)
        Release { index: usize },
    }

    pub const HINT_WINDOW: u64 = 64 * MIB;
}

proptest! {
    #[test]
    fn placement_matches_a_naive_first_fit_model(
        ops in proptest::collection::vec(
            prop_oneof![
                (1u64..12, 0u64..4).prop_map(|(pages, extra)| model::Op::Malloc { pages, extra }),
                (0u64..model::HINT_WINDOW / 512, 1u64..4)
                    .prop_map(|(offset, pages)| model::Op::HintedMalloc { offset, pages }),
                (0usize..64).prop_map(|index| model::Op::Free { index }),
                (1u64..8).prop_map(|pages| model::Op::Reserve { pages }),
                (0usize..16).prop_map(|index| model::Op::Release { index }),
            ],
            1..120,
        )
    ) {
        let dev = SimBackend::new(1 << 50);
        let base = dev.base_address();
        let mut naive = model::NaiveSpace::default();
        let mut honoured = 0;
        for op in ops {
            match op {
                model::Op::Malloc { pages, extra } => {
                    let size = pages * 2 * MIB + extra * 512;
                    let expected = naive.first_fit(base, size);
                    prop_assert_eq!(dev.malloc(size).unwrap(), expected);
                    naive.ranges.push((expected, expected + size, false));
                }
                model::Op::HintedMalloc { offset, pages } => {
                    let size = pages * 2 * MIB;
                    let hint = base + offset * 512;
                    let expected = if naive.is_free(hint, size) {
                        honoured += 1;
                        hint
                    } else {
                        naive.first_fit(base, size)
                    };
                    dev.hint_next_segment(hint);
                    prop_assert_eq!(dev.malloc(size).unwrap(), expected);
                    naive.ranges.push((expected, expected + size, false));
                }
                model::Op::Free { index } => {
                    let segments: Vec<usize> = (0..naive.ranges.len())
                        .filter(|&i| !naive.ranges[i].2)
                        .collect();
                    if segments.is_empty() {
                        continue;
                    }
                    let i = segments[index % segments.len()];
                    let (start, _, _) = naive.ranges.swap_remove(i);
                    dev.free(start).unwrap();
                }
                model::Op::Reserve { pages } => {
                    let size = pages * 2 * MIB;
                    let expected = naive.first_fit(base, size);
                    prop_assert_eq!(dev.vm_reserve(size).unwrap(), expected);
                    naive.ranges.push((expected, expected + size, true));
                }
                model::Op::Release { index } => {
                    let reservations: Vec<usize> = (0..naive.ranges.len())
                        .filter(|&i| naive.ranges[i].2)
                        .collect();
                    if reservations.is_empty() {
                        continue;
                    }
                    let i = reservations[index % reservations.len()];
                    let (start, end, _) = naive.ranges.swap_remove(i);
                    dev.vm_release(start, end - start).unwrap();
                }
            }
        }
        let mut expected_segments: Vec<(u64, u64)> = naive
            .ranges
            .iter()
            .filter(|r| !r.2)
            .map(|&(s, e, _)| (s, e - s))
            .collect();
        expected_segments.sort_unstable();
        prop_assert_eq!(dev.live_segments(), expected_segments);
        prop_assert_eq!(dev.counters().hints_honoured, honoured);
        let used: u64 = naive.ranges.iter().filter(|r| !r.2).map(|&(s, e, _)| e - s).sum();
        prop_assert_eq!(dev.used(), used);
    }
}
