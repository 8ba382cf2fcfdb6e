//! Replay and what-if through the public API, on a synthetic multi-stream trace that fragments
//! the device: built here as a `Snapshot` with a trace whose addresses follow the allocator's
//! rules, so the fidelity run must reproduce every one of them.

#[path = "support/snapshot_fixtures.rs"]
mod support;

use allocview_agent::diagnosis::{DiagnosisKind, what_if_avoided};
use allocview_agent::replay::{self, RECORDED_LABEL, ReplaySettings, RunOptions, RunStart};
use allocview_alloc::caching::AllocatorConfig;
use allocview_alloc::snapshot::{BlockState, Snapshot, TraceAction, TraceEntry};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Where the recording's first segment sat.
const BASE: u64 = 0x7f00_0000_0000;
/// Where the recording placed the second stream's segment (it had a larger device).
const OTHER: u64 = 0x7f80_0000_0000;
/// The compute stream and a side stream, as PyTorch writes stream handles.
const S1: u64 = 0x5555_0001;
const S2: u64 = 0x5555_0002;

/// Stream 1 caches an 800 MiB segment, then pins it with a small block in the middle, leaving
/// 798 MiB free but split; a block freed while stream 2 still used it completes later; then
/// stream 2 asks for 400 MiB. On a 1 GiB device that needs the stranded memory: the default
/// allocator cannot release the split segment (OOM), expandable segments can unmap its free
/// pages.
fn fragmenting_trace() -> Snapshot {
    use TraceAction::*;
    let mut t = Vec::new();
    let free = |t: &mut Vec<TraceEntry>, addr, size, stream| {
        t.push(TraceEntry::new(FreeRequested, addr, size, stream));
        t.push(TraceEntry::new(FreeCompleted, addr, size, stream));
    };
    t.push(TraceEntry::new(SegmentAlloc, BASE, 800 * MIB, S1));
    t.push(TraceEntry::new(Alloc, BASE, 800 * MIB, S1));
    free(&mut t, BASE, 800 * MIB, S1);
    t.push(TraceEntry::new(Alloc, BASE, 100 * MIB, S1));
    t.push(TraceEntry::new(Alloc, BASE + 100 * MIB, 100 * MIB, S1));
    t.push(TraceEntry::new(Alloc, BASE + 200 * MIB, 2 * MIB, S1));
    free(&mut t, BASE, 100 * MIB, S1);
    free(&mut t, BASE + 100 * MIB, 100 * MIB, S1);
    // A block freed on stream 1 while stream 2 used it: the next allocation cannot take it.
    // Best fit takes the front of the 200 MiB free block.
    t.push(TraceEntry::new(Alloc, BASE, 10 * MIB, S1));
    t.push(TraceEntry::new(FreeRequested, BASE, 10 * MIB, S1));
    t.push(TraceEntry::new(Alloc, BASE + 10 * MIB, 10 * MIB, S1));
    t.push(TraceEntry::new(FreeCompleted, BASE, 10 * MIB, S1));
    t.push(TraceEntry::new(Alloc, BASE, 10 * MIB, S1));
    free(&mut t, BASE, 10 * MIB, S1);
    free(&mut t, BASE + 10 * MIB, 10 * MIB, S1);
    // Stream 2 needs 400 MiB.
    t.push(TraceEntry::new(SegmentAlloc, OTHER, 400 * MIB, S2));
    t.push(TraceEntry::new(Alloc, OTHER, 400 * MIB, S2));
    free(&mut t, OTHER, 400 * MIB, S2);
    allocview_alloc::snapshot::Snapshot {
        device_traces: vec![t],
        ..Default::default()
    }
}

#[test]
fn the_fidelity_run_reproduces_every_address_of_a_multi_stream_trace() {
    let snap = fragmenting_trace();
    let out = replay::replay(&snap, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    let f = &out.report.fidelity;
    assert_eq!(f.allocs, 8, "{f:?}");
    assert_eq!(f.allocs_at_recorded_address, 8, "{f:?}");
    assert_eq!(f.segment_allocs, 2, "{f:?}");
    assert_eq!(f.segment_allocs_of_recorded_size, 2, "{f:?}");
    assert!(f.first_divergence.is_none(), "{f:?}");
    assert_eq!(out.report.runs[0].label, RECORDED_LABEL);
    assert_eq!(out.report.runs[0].ooms, 0);
    assert_eq!(out.report.runs[0].peak_reserved, 1200 * MIB);
}

#[test]
fn a_fragmenting_trace_ooms_at_default_settings_and_expandable_segments_avoid_it() {
    let snap = fragmenting_trace();
    let settings = ReplaySettings {
        configs: vec!["expandable_segments:True".into()],
        device_memory: Some(GIB),
        keep_history: false,
    };
    let out = replay::replay(&snap, &settings, &mut |_, _| {}).unwrap();
    // The file records no device size: the recording ran without an OOM, and the recorded
    // settings on 1 GiB are a column of their own.
    let [as_recorded, recorded, expandable] = &out.report.runs[..] else {
        panic!("three runs expected: {:?}", out.report.runs)
    };
    assert_eq!(as_recorded.ooms, 0, "{as_recorded:?}");
    assert_eq!(recorded.label, replay::resized_label(GIB));
    assert_eq!(recorded.ooms, 1, "{recorded:?}");
    let oom = recorded.first_oom.as_ref().unwrap();
    assert_eq!(oom.requested, 400 * MIB);
    assert_eq!(oom.diagnosis.kind, DiagnosisKind::Fragmentation, "{oom:?}");
    assert_eq!(expandable.ooms, 0, "{expandable:?}");
    assert!(expandable.peak_reserved <= GIB);

    let outcomes = what_if_avoided(&snap, GIB);
    assert_eq!(outcomes[0].ooms, 1, "{outcomes:?}");
    let exp = outcomes
        .iter()
        .find(|o| o.config == "expandable_segments:True")
        .unwrap();
    assert!(exp.avoided, "{outcomes:?}");
}

#[test]
fn a_what_if_run_at_ample_memory_has_no_oom_and_counts_its_device_mallocs() {
    let snap = fragmenting_trace();
    let opts = RunOptions::what_if(
        AllocatorConfig::default(),
        "defaults",
        Some(16 * GIB),
        false,
    );
    let r = replay::engine::run(&snap, &opts, &mut |_| {}).unwrap();
    assert_eq!(r.figures.ooms, 0);
    assert_eq!(r.figures.device_mallocs, 2);
    assert_eq!(r.figures.peak_reserved, 1200 * MIB);
    assert_eq!(r.unmapped_frees, 0);
}

#[test]
fn the_replayed_run_keeps_its_own_trace_when_asked() {
    let snap = fragmenting_trace();
    let settings = ReplaySettings {
        keep_history: true,
        ..ReplaySettings::default()
    };
    let out = replay::replay(&snap, &settings, &mut |_, _| {}).unwrap();
    let trace = &out.replayed.device_traces[0];
    let allocs: Vec<u64> = trace
        .iter()
        .filter(|e| e.action == TraceAction::Alloc)
        .map(|e| e.addr)
        .collect();
    let recorded: Vec<u64> = snap.device_traces[0]
        .iter()
        .filter(|e| e.action == TraceAction::Alloc)
        .map(|e| e.addr)
        .collect();
    assert_eq!(allocs, recorded);
    // At the end two segments are cached and only the pinning block is live.
    assert_eq!(out.replayed.segments.len(), 2);
    let active: Vec<(u64, u64)> = out
        .replayed
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state != BlockState::Inactive)
        .map(|b| (b.address, b.size))
        .collect();
    assert_eq!(active, vec![(BASE + 200 * MIB, 2 * MIB)]);
}

#[test]
fn a_bad_config_string_is_an_error_naming_it() {
    let settings = ReplaySettings {
        configs: vec!["max_split_size_mb:nope".into()],
        ..ReplaySettings::default()
    };
    let err = replay::replay(&fragmenting_trace(), &settings, &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("max_split_size_mb:nope"), "{err}");
}

#[test]
fn a_file_without_a_trace_is_an_error() {
    let err = replay::replay(
        &Snapshot::default(),
        &ReplaySettings::default(),
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("no allocation trace"), "{err}");
    assert!(what_if_avoided(&Snapshot::default(), GIB).is_empty());
}

/// Every real fixture with a trace, replayed with a what-if run under the file's own recorded
/// settings: that column must equal the recorded one figure for figure (the same quantity,
/// measured the same way, from the same starting state).
#[test]
fn a_what_if_under_the_recorded_settings_equals_the_recorded_column_for_every_fixture() {
    let mut replayed = 0;
    for name in support::FIXTURES {
        let Some(bytes) = support::fixture_bytes(name) else {
            return;
        };
        let snap = allocview_agent::snapshot_file::from_bytes(&bytes).unwrap();
        let own = replay::recorded_config(&snap).unwrap().to_conf_string();
        let settings = ReplaySettings {
            configs: vec![own.clone()],
            ..ReplaySettings::default()
        };
        let out = match replay::replay(&snap, &settings, &mut |_, _| {}) {
            Ok(out) => out,
            Err(replay::ReplayError::NoTrace) => continue,
            Err(e) => panic!("{name}: {e}"),
        };
        let [recorded, what_if] = &out.report.runs[..] else {
            panic!("{name}: two runs expected: {:?}", out.report.runs)
        };
        assert_eq!(what_if.start, RunStart::RecordedState, "{name}");
        let figures = |r: &replay::RunFigures| {
            (
                r.peak_reserved,
                r.peak_allocated,
                r.peak_fragmentation,
                r.device_mallocs,
                r.ooms,
            )
        };
        assert_eq!(
            figures(what_if),
            figures(recorded),
            "{name} under `{own}`: {:?} vs {:?}",
            what_if,
            recorded
        );
        replayed += 1;
    }
    assert!(replayed >= 4, "only {replayed} fixtures had a trace");
}

/// Settings that cannot hold the recorded segments start from the live blocks alone, and the
/// report says so instead of printing peaks that look comparable.
#[test]
fn a_what_if_that_cannot_hold_the_recorded_cache_is_marked_in_the_report() {
    let Some(bytes) = support::fixture_bytes("legacy-2.0-history-format.pickle") else {
        return;
    };
    let snap = allocview_agent::snapshot_file::from_bytes(&bytes).unwrap();
    let settings = ReplaySettings {
        configs: vec!["expandable_segments:True".into(), String::new()],
        ..ReplaySettings::default()
    };
    let out = replay::replay(&snap, &settings, &mut |_, _| {}).unwrap();
    let runs = &out.report.runs;
    assert_eq!(runs[1].start, RunStart::LiveBlocksOnly);
    // An empty string changes nothing: the recorded settings again.
    assert_eq!(runs[2].label, replay::UNCHANGED_LABEL);
    assert_eq!(runs[2].peak_reserved, runs[0].peak_reserved);
    let text = out.report.to_text();
    assert!(
        text.contains("expandable_segments:True: the recorded segments cannot exist"),
        "{text}"
    );
    assert!(!text.lines().next().unwrap_or("").is_empty());
}

#[test]
fn with_history_each_what_if_run_is_kept_under_its_own_settings() {
    let snap = fragmenting_trace();
    let settings = ReplaySettings {
        configs: vec!["expandable_segments:True".into()],
        device_memory: Some(16 * GIB),
        keep_history: true,
    };
    let out = replay::replay(&snap, &settings, &mut |_, _| {}).unwrap();
    let [run] = &out.what_ifs[..] else {
        panic!("one what-if snapshot expected")
    };
    let cfg = replay::recorded_config(run).unwrap();
    assert!(cfg.expandable_segments());
    assert!(
        run.segments.iter().all(|s| s.is_expandable),
        "{:?}",
        run.segments
    );
    let maps = run.device_traces[0]
        .iter()
        .filter(|e| e.action == TraceAction::SegmentMap)
        .count();
    assert!(maps > 0);
    assert!(
        !run.device_traces[0]
            .iter()
            .any(|e| e.action == TraceAction::SegmentAlloc)
    );
}
