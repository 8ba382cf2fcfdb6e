//! Replay of the real PyTorch recordings in `../shared/fixtures/pytorch-snapshots`: with the
//! recorded (default) settings, every allocation lands at the recorded address, every segment
//! allocation has the recorded size, and the final segments equal the snapshot's.

use allocview_agent::replay::{self, ReplaySettings};
use allocview_agent::snapshot_file;
use allocview_alloc::snapshot::TraceAction;
use allocview_tests::fixtures;

/// The fixtures with a trace, and the number of `alloc` entries in each.
const TRACED: [(&str, u64); 4] = [
    ("cs336-ctx256-forward-mixed.pickle", 2702),
    ("cs336-newest-format.pickle", 1721),
    ("small-97-events.pickle", 36),
    ("legacy-2.0-history-format.pickle", 0),
];

#[test]
fn every_traced_fixture_replays_at_the_recorded_addresses_and_segment_sizes() {
    let Some(dir) = fixtures::dir() else { return };
    for (name, allocs) in TRACED {
        let snap = snapshot_file::load(&dir.join(name)).unwrap();
        let out = replay::replay(&snap, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
        let f = &out.report.fidelity;
        let segment_allocs = snap.device_traces[0]
            .iter()
            .filter(|e| e.action == TraceAction::SegmentAlloc)
            .count() as u64;
        assert_eq!(f.allocs, allocs, "{name}: {f:?}");
        assert_eq!(f.allocs_at_recorded_address, allocs, "{name}: {f:?}");
        assert_eq!(f.segment_allocs, segment_allocs, "{name}: {f:?}");
        assert_eq!(
            f.segment_allocs_of_recorded_size, segment_allocs,
            "{name}: {f:?}"
        );
        assert!(f.first_divergence.is_none(), "{name}: {f:?}");
        assert_eq!(f.final_state_matches, Some(true), "{name}: {f:?}");
        assert!(
            out.report.initial.warnings.is_empty(),
            "{name}: {:?}",
            out.report.initial
        );
        println!(
            "{name}: {}",
            out.report.to_text().lines().nth(2).unwrap_or("")
        );
    }
}

#[test]
fn the_replayed_run_round_trips_through_a_pytorch_pickle() {
    let Some(dir) = fixtures::dir() else { return };
    let snap = snapshot_file::load(&dir.join("small-97-events.pickle")).unwrap();
    let settings = ReplaySettings {
        keep_history: true,
        ..ReplaySettings::default()
    };
    let out = replay::replay(&snap, &settings, &mut |_, _| {}).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("replayed.pickle");
    snapshot_file::save(&path, &out.replayed, snapshot_file::FileFormat::Pickle).unwrap();
    let back = snapshot_file::load(&path).unwrap();
    let addrs = |s: &allocview_alloc::snapshot::Snapshot| -> Vec<(TraceAction, u64, u64)> {
        s.device_traces[0]
            .iter()
            .filter(|e| matches!(e.action, TraceAction::Alloc | TraceAction::SegmentAlloc))
            .map(|e| (e.action, e.addr, e.size))
            .collect()
    };
    // The replay's own trace has the recording's allocations and segment allocations.
    assert_eq!(addrs(&back), addrs(&snap));
    assert_eq!(back.segments.len(), snap.segments.len());
}
