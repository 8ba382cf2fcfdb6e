//! For a recording that ran out of memory on a device of known size, replay and summary say
//! how large a device the trace needed under the recorded settings, found by bisection.

#[path = "support/oom_recording.rs"]
mod oom_recording;

use allocview_agent::replay::{
    self, ReplaySettings, SmallestDevice, smallest_device::granularity, smallest_device_without_oom,
};
use allocview_agent::summary::summarize;
use allocview_alloc::caching::AllocatorConfig;
use oom_recording::*;

#[test]
fn the_smallest_device_without_the_oom_is_found_by_bisection_and_shown() {
    let snap = record();
    let out = replay::replay(&snap, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    let s = out
        .report
        .smallest_device
        .clone()
        .expect("an OOM on a 1 GiB device");
    // The live block and the failed request together need 1100 MiB: the answer is at least
    // that, and within the bisection's granularity of it.
    assert_eq!(s.from, GIB);
    assert!(s.bytes >= LIVE + TOO_BIG, "{s:?}");
    assert!(
        s.bytes <= LIVE + TOO_BIG + AFTER + granularity(GIB),
        "{s:?}"
    );
    assert_eq!(s.shortfall, s.bytes - GIB);
    assert!(s.runs <= replay::smallest_device::MAX_RUNS);
    // A device of that size replays without an OOM; one a granule smaller does not.
    let at = |m: u64| {
        replay::replay(
            &snap,
            &ReplaySettings {
                device_memory: Some(m),
                ..ReplaySettings::default()
            },
            &mut |_, _| {},
        )
        .unwrap()
        .report
        .runs[1]
            .ooms
    };
    assert_eq!(at(s.bytes), 0);
    assert!(at(s.bytes - granularity(GIB)) > 0);
    let text = out.report.to_text();
    assert!(
        text.contains("smallest device without an OOM under the recorded settings: ~"),
        "{text}"
    );
    let json = serde_json::to_value(&out.report).unwrap();
    assert_eq!(json["smallest_device"]["bytes"], s.bytes);
    // Summary says the same.
    let summary = summarize(&snap);
    assert_eq!(summary.devices[0].smallest_device.as_ref(), Some(&s));
    assert!(
        summary
            .to_string()
            .contains("smallest device without an OOM under the recorded settings"),
        "{summary}"
    );
}

#[test]
fn no_smallest_device_without_an_oom_or_for_a_request_beyond_any_nearby_device() {
    let snap = record();
    // From a device a tenth of the live block, eight times larger is still too small.
    assert_eq!(
        smallest_device_without_oom(&snap, &AllocatorConfig::default(), LIVE / 10),
        None
    );
}

/// Records on a 1 GiB device of which another user holds 700 MiB: 100 MiB live, then a
/// [`TOO_BIG`] request that fails.
fn beside_another_user() -> allocview_alloc::snapshot::Snapshot {
    let sim = std::sync::Arc::new(allocview_alloc::caching::sim::SimBackend::new(GIB));
    sim.set_external_usage(700 * MIB);
    let alloc =
        allocview_alloc::caching::CachingAllocator::new(sim.clone(), AllocatorConfig::default());
    alloc.record_history(allocview_alloc::caching::HistoryOptions::default());
    let s = allocview_alloc::caching::backend::StreamId::DEFAULT;
    let _live = alloc.malloc(100 * MIB, s).unwrap();
    assert!(alloc.malloc(TOO_BIG, s).is_err());
    alloc.snapshot()
}

#[test]
fn an_oom_caused_by_memory_outside_the_allocator_names_no_device_size() {
    // A 1 GiB device of which another user holds 700 MiB: 100 MiB live and a 300 MiB request
    // would fit the device alone. The replay has no such user, so no size it finds would mean
    // anything: it names none.
    let snap = beside_another_user();
    let out = replay::replay(&snap, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    assert_eq!(out.report.runs[0].ooms, 1);
    assert_eq!(out.report.smallest_device, None, "{}", out.report.to_text());
    assert_eq!(summarize(&snap).devices[0].smallest_device, None);
}

/// A recording's file without its device's size (as PyTorch's own snapshots are).
fn without_device_size(
    mut snap: allocview_alloc::snapshot::Snapshot,
) -> allocview_alloc::snapshot::Snapshot {
    for d in &mut snap.devices {
        d.total_memory = None;
    }
    snap
}

#[test]
fn without_the_device_size_the_bisection_starts_from_what_the_allocator_could_reach() {
    // On a 1 GiB device with nobody else on it, the allocator could reach the whole device at
    // the OOM (800 MiB reserved + 224 MiB free): the same answer as with the size recorded,
    // worded as reachable memory.
    let known = replay::replay(&record(), &ReplaySettings::default(), &mut |_, _| {})
        .unwrap()
        .report
        .smallest_device
        .unwrap();
    let snap = without_device_size(record());
    let out = replay::replay(&snap, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    let s = out
        .report
        .smallest_device
        .clone()
        .expect("an OOM in the trace");
    assert_eq!(
        s,
        SmallestDevice {
            from_recorded_device: false,
            ..known
        }
    );
    assert_eq!(summarize(&snap).devices[0].smallest_device, Some(s.clone()));
    let text = out.report.to_text().replace("\n    ", " ");
    assert!(
        text.contains("smallest memory the allocator can reach without an OOM")
            && text.contains("the file does not record the device's size")
            && text.contains("plus what its other users held"),
        "{text}"
    );
    let json = serde_json::to_value(&out.report).unwrap();
    assert_eq!(json["smallest_device"]["from_recorded_device"], false);
}

#[test]
fn without_the_device_size_memory_outside_the_allocator_does_not_count() {
    // Another user holds 700 MiB of a 1 GiB device: the allocator could reach 324 MiB (100
    // MiB reserved, 224 MiB free) when the 300 MiB request failed, and needed 400 MiB.
    let snap = without_device_size(beside_another_user());
    let out = replay::replay(&snap, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    let s = out.report.smallest_device.expect("an OOM in the trace");
    assert_eq!(s.from, 324 * MIB, "{s:?}");
    assert!(!s.from_recorded_device);
    assert!(
        s.bytes >= 400 * MIB && s.bytes <= 400 * MIB + granularity(s.from),
        "{s:?}"
    );
}
