//! `--config` against a recording's own settings: each string changes the recorded settings
//! (the keys it gives), `defaults` starts from PyTorch's defaults, the recorded settings are
//! shown, a what-if equal to them is marked, the OOM view's what-ifs leave them out, and the
//! diagnosis never recommends a setting the recording already had.

use std::sync::Arc;

use allocview_agent::replay::{self, ReplaySettings, what_if_avoided};
use allocview_agent::summary::summarize;
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, HistoryOptions};
use allocview_alloc::snapshot::Snapshot;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A recording under `conf` on a 1 GiB device: blocks freed between live ones, then a request
/// too large for what is left (an OOM).
fn record(conf: &str) -> Snapshot {
    let config = AllocatorConfig::parse(conf).unwrap();
    let alloc = CachingAllocator::new(Arc::new(SimBackend::new(GIB)), config);
    alloc.record_history(HistoryOptions::default());
    let s = StreamId::DEFAULT;
    let mut live = Vec::new();
    for _ in 0..8 {
        live.push(alloc.malloc(100 * MIB, s).unwrap());
    }
    for p in live.iter().step_by(2) {
        alloc.free(*p).unwrap();
    }
    assert!(alloc.malloc(700 * MIB, s).is_err());
    alloc.snapshot()
}

fn replay_with(snap: &Snapshot, configs: &[&str]) -> replay::ReplayReport {
    let settings = ReplaySettings {
        configs: configs.iter().map(|c| c.to_string()).collect(),
        device_memory: None,
        keep_history: false,
    };
    replay::replay(snap, &settings, &mut |_, _| {})
        .unwrap()
        .report
}

#[test]
fn a_config_changes_only_the_keys_it_gives_and_defaults_starts_from_pytorch_s() {
    let snap = record("expandable_segments:True");
    let r = replay_with(
        &snap,
        &[
            "max_split_size_mb:128",
            "expandable_segments:True",
            "defaults",
            "defaults,max_split_size_mb:128",
        ],
    );
    assert_eq!(r.recorded_settings, "expandable_segments:True");
    // Expandable segments stay on: only max_split_size changed.
    assert_eq!(
        r.runs[1].config,
        "max_split_size_mb:128,expandable_segments:True"
    );
    assert_eq!(r.runs[1].label, "max_split_size_mb:128");
    assert_eq!(r.runs[2].label, "expandable_segments:True (as recorded)");
    assert_eq!(r.runs[2].ooms, r.runs[0].ooms);
    assert_eq!(r.runs[3].label, "defaults");
    assert_eq!(r.runs[3].config, "");
    assert_eq!(r.runs[4].config, "max_split_size_mb:128");
    let text = r.to_text();
    assert!(
        text.contains("recorded settings: expandable_segments:True\n"),
        "{text}"
    );
    assert!(
        text.contains("each --config column: the recorded settings with the keys given changed"),
        "{text}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["recorded_settings"], "expandable_segments:True");
}

#[test]
fn the_recorded_settings_are_shown_for_defaults_and_for_files_without_them() {
    let snap = record("");
    assert_eq!(
        replay_with(&snap, &[]).recorded_settings,
        "PyTorch defaults"
    );
    assert_eq!(summarize(&snap).recorded_settings, "PyTorch defaults");
    let mut bare = snap.clone();
    bare.allocator_settings = None;
    let text = replay_with(&bare, &[]).to_text();
    assert!(text.contains("recorded settings: not recorded"), "{text}");
    let expandable = record("expandable_segments:True");
    let s = summarize(&expandable);
    assert_eq!(s.recorded_settings, "expandable_segments:True");
    assert!(
        s.to_string()
            .contains("Recorded allocator settings: expandable_segments:True\n"),
        "{s}"
    );
}

#[test]
fn the_oom_what_ifs_do_not_offer_the_recorded_settings_and_keep_them_under_the_others() {
    let snap = record("expandable_segments:True");
    let outcomes = what_if_avoided(&snap, GIB);
    let labels: Vec<&str> = outcomes.iter().map(|o| o.config.as_str()).collect();
    assert!(!labels.contains(&"expandable_segments:True"), "{labels:?}");
    assert!(labels.contains(&"max_split_size_mb:128"), "{labels:?}");
    // Under the defaults every candidate changes something: all are tried.
    let plain = what_if_avoided(&record(""), GIB);
    assert_eq!(plain.len(), 1 + replay::what_if::CANDIDATE_CONFIGS.len());
}

#[test]
fn no_diagnosis_recommends_expandable_segments_to_a_recording_that_had_them() {
    let snap = record("expandable_segments:True");
    let r = replay_with(&snap, &["max_split_size_mb:128", "max_split_size_mb:512"]);
    for run in &r.runs {
        if let Some(oom) = &run.first_oom {
            assert!(
                !oom.diagnosis
                    .explanation
                    .contains("expandable_segments:True would"),
                "{}: {}",
                run.label,
                oom.diagnosis.explanation
            );
        }
    }
    for oom in &summarize(&snap).devices[0].ooms {
        if let Some(d) = &oom.diagnosis {
            assert!(
                !d.explanation.contains("expandable_segments:True would"),
                "{d:?}"
            );
        }
    }
}

#[test]
fn a_divisions_list_whose_last_bucket_the_greater_than_overrides_is_warned_of() {
    let snap = record("");
    let r = replay_with(
        &snap,
        &["roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"],
    );
    assert_eq!(r.config_warnings.len(), 1, "{:?}", r.config_warnings);
    assert!(
        r.config_warnings[0].contains("last named bucket (1024 MB) to 8"),
        "{:?}",
        r.config_warnings
    );
    assert!(
        r.to_text()
            .contains("  warning: --config roundup_power2_divisions")
    );
    let none = replay_with(&snap, &["roundup_power2_divisions:[256:1,>:8]"]);
    assert_eq!(none.config_warnings.len(), 1);
    let plain = replay_with(&snap, &["roundup_power2_divisions:4"]);
    assert!(plain.config_warnings.is_empty());
}

#[test]
fn garbage_collection_without_a_memory_fraction_is_noted_as_without_effect() {
    let snap = record("");
    let text = replay_with(&snap, &["garbage_collection_threshold:0.6"]).to_text();
    assert!(
        text.contains("note: garbage_collection_threshold has no effect in this replay"),
        "{text}"
    );
    assert!(
        !replay_with(&snap, &["max_split_size_mb:128"])
            .to_text()
            .contains("garbage_collection_threshold")
    );
}
