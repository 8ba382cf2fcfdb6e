//! `--device-memory` against a file that records its device size: the recorded column keeps
//! describing the recording (its device, its OOMs, its peaks), and the other size is a what-if
//! column of its own, labelled with the size, under the recorded settings.

#[path = "support/oom_recording.rs"]
mod oom_recording;

use allocview_agent::diagnosis::DiagnosisKind;
use allocview_agent::replay::{self, RECORDED_LABEL, ReplaySettings, resized_label};
use allocview_agent::summary::{StatsWindow, summarize};
use allocview_alloc::snapshot::Snapshot;
use oom_recording::*;

/// A device far larger than the recording's.
const LARGE_DEVICE: u64 = 80 * GIB;
/// A device smaller than the live block.
const SMALL_DEVICE: u64 = 600 * MIB;

fn replay_on(
    snap: &Snapshot,
    device_memory: Option<u64>,
    configs: &[&str],
) -> replay::ReplayReport {
    let settings = ReplaySettings {
        configs: configs.iter().map(|c| c.to_string()).collect(),
        device_memory,
        keep_history: false,
    };
    replay::replay(snap, &settings, &mut |_, _| {})
        .unwrap()
        .report
}

#[test]
fn a_larger_device_leaves_the_recorded_column_as_recorded_and_adds_a_labelled_column() {
    let snap = record();
    assert_eq!(snap.devices[0].total_memory, Some(GIB));
    let plain = replay_on(&snap, None, &[]);
    let r = replay_on(&snap, Some(LARGE_DEVICE), &[]);
    assert_eq!(r.runs[0], plain.runs[0]);
    assert_eq!(r.runs[0].label, RECORDED_LABEL);
    assert_eq!(r.runs[0].ooms, 1);
    let oom = r.runs[0].first_oom.as_ref().unwrap();
    assert_ne!(
        oom.diagnosis.kind,
        DiagnosisKind::OutsideAllocator,
        "{oom:?}"
    );
    assert_eq!(r.recorded_device_memory, Some(GIB));
    assert_eq!(r.device_memory, Some(LARGE_DEVICE));
    assert_eq!(r.runs.len(), 2);
    assert_eq!(r.runs[1].label, resized_label(LARGE_DEVICE));
    assert_eq!(r.runs[1].label, "recorded settings, 80.0 GiB device");
    assert_eq!(r.runs[1].ooms, 0, "{:?}", r.runs[1]);
    assert_eq!(r.runs[1].peak_allocated, LIVE + TOO_BIG);
    let text = r.to_text();
    assert!(
        text.contains("the recorded column on the recording's device of 1.00 GiB")
            && text.contains("80.0 GiB"),
        "{text}"
    );
}

#[test]
fn a_smaller_device_fails_in_its_own_column_and_the_what_ifs_follow_it() {
    let snap = record();
    let plain = replay_on(&snap, None, &[]);
    let r = replay_on(&snap, Some(SMALL_DEVICE), &["expandable_segments:True"]);
    assert_eq!(r.runs[0], plain.runs[0]);
    assert_eq!(r.runs[0].ooms, 1);
    assert_eq!(r.runs[0].peak_reserved, plain.runs[0].peak_reserved);
    let labels: Vec<&str> = r.runs.iter().map(|run| run.label.as_str()).collect();
    assert_eq!(
        labels,
        vec![
            RECORDED_LABEL,
            "recorded settings, 600 MiB device",
            "expandable_segments:True"
        ]
    );
    // The live block itself does not fit there (the recorded OOM's request then does).
    assert_eq!(r.runs[1].ooms, 1, "{:?}", r.runs[1]);
    assert_eq!(r.runs[1].first_oom.as_ref().unwrap().requested, LIVE);
    assert!(r.runs[1].peak_reserved <= SMALL_DEVICE, "{:?}", r.runs[1]);
    assert!(r.runs[2].peak_reserved <= SMALL_DEVICE, "{:?}", r.runs[2]);
}

#[test]
fn the_recording_s_own_size_adds_no_column_and_summary_replays_at_it() {
    let snap = record();
    let r = replay_on(&snap, Some(GIB), &[]);
    assert_eq!(r.runs.len(), 1);
    assert_eq!(r.recorded_device_memory, r.device_memory);
    assert!(r.to_text().starts_with("replayed "), "{}", r.to_text());
    match &summarize(&snap).devices[0].window {
        StatsWindow::Trace { peak_reserved, .. } => {
            assert_eq!(*peak_reserved, r.runs[0].peak_reserved);
        }
        other => panic!("summary did not replay the trace: {other:?}"),
    }
}

#[test]
fn a_trace_that_ends_at_its_oom_says_a_cured_run_cannot_speak_for_what_came_next() {
    let snap = record();
    // The recording allocates after its OOM: the trace goes on.
    let r = replay_on(&snap, Some(LARGE_DEVICE), &[]);
    assert!(!r.ends_at_oom);
    assert!(!r.to_text().contains("the trace ends at its OOM"));
    // Cut at the OOM, as a dump taken there is: the larger device fits the request, but what
    // the program asked next is not in the trace.
    let mut cut = snap.clone();
    let trace = &mut cut.device_traces[0];
    let oom = trace
        .iter()
        .position(|e| e.action == allocview_alloc::snapshot::TraceAction::Oom)
        .unwrap();
    trace.truncate(oom + 1);
    let r = replay_on(&cut, Some(LARGE_DEVICE), &[]);
    assert!(r.ends_at_oom);
    assert_eq!(r.runs[1].ooms, 0);
    assert!(
        r.to_text()
            .contains("the trace ends at its OOM: a run without an OOM fitted that request"),
        "{}",
        r.to_text()
    );
}

#[test]
fn a_file_without_a_device_size_keeps_its_recorded_column_and_gets_a_column_for_the_size() {
    let mut snap = record();
    snap.devices[0].total_memory = None;
    let r = replay_on(&snap, Some(SMALL_DEVICE), &[]);
    // The recording: its one OOM, on an unlimited device (the file says no more).
    assert_eq!(r.runs[0].label, RECORDED_LABEL);
    assert_eq!(r.runs[0].ooms, 1, "{:?}", r.runs[0]);
    assert_eq!(r.recorded_device_memory, None);
    assert_eq!(r.device_memory, Some(SMALL_DEVICE));
    let labels: Vec<&str> = r.runs.iter().map(|run| run.label.as_str()).collect();
    assert_eq!(
        labels,
        vec![RECORDED_LABEL, resized_label(SMALL_DEVICE).as_str()]
    );
    assert_eq!(r.runs[1].first_oom.as_ref().unwrap().requested, LIVE);
    // The report wraps its sentences: compare word by word.
    let text = r.to_text().split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        text.contains(
            "the recorded column on an unlimited device (the file records no device size)"
        ),
        "{text}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["recorded_device_memory"].is_null(), "{json}");
}

#[test]
fn the_replayed_run_written_under_the_recorded_settings_keeps_the_recorded_ooms() {
    use allocview_alloc::snapshot::{DumpedOom, TraceAction};
    let mut snap = record();
    let header = DumpedOom {
        index: 1,
        requested: TOO_BIG,
        rounded: TOO_BIG,
        ..DumpedOom::default()
    };
    snap.devices[0].oom = Some(header.clone());
    let out = replay::replay(
        &snap,
        &ReplaySettings {
            configs: Vec::new(),
            device_memory: None,
            keep_history: true,
        },
        &mut |_, _| {},
    )
    .unwrap();
    let trace = &out.replayed.device_traces[0];
    let actions: Vec<(TraceAction, u64)> = trace
        .iter()
        .filter(|e| matches!(e.action, TraceAction::Alloc | TraceAction::Oom))
        .map(|e| (e.action, e.size))
        .collect();
    assert_eq!(
        actions,
        vec![
            (TraceAction::Alloc, LIVE),
            (TraceAction::Oom, TOO_BIG),
            (TraceAction::Alloc, AFTER)
        ],
        "{trace:#?}"
    );
    assert_eq!(out.replayed.devices[0].oom, Some(header));
    assert_eq!(out.report.runs[0].ooms, 1);
}
