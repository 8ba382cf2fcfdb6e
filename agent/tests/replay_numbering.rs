//! One numbering for trace entries: the text says "trace entry N" from 1 (JSON keeps the index
//! from 0), a what-if's OOM names its entry in the file `--out` writes where that differs, and
//! a line that quotes the request and the allocator's rounded size says "rounded to".

use std::sync::Arc;

use allocview_agent::replay::{self, ReplaySettings};
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, HistoryOptions};
use allocview_alloc::snapshot::{Snapshot, TraceAction};
use allocview_alloc::stats::human_bytes;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Not a multiple of the rounding: the allocator asks for more.
const ODD: u64 = 300 * MIB + 1000;

/// On a 1 GiB device: a snapshot entry, a live 800 MiB block, a request that does not fit.
fn recording() -> Snapshot {
    let alloc = CachingAllocator::new(Arc::new(SimBackend::new(GIB)), AllocatorConfig::default());
    alloc.record_history(HistoryOptions::default());
    let s = StreamId::DEFAULT;
    let _ = alloc.snapshot();
    let _live = alloc.malloc(800 * MIB, s).unwrap();
    assert!(alloc.malloc(ODD, s).is_err());
    alloc.snapshot()
}

#[test]
fn a_what_if_oom_names_its_entry_in_the_written_file_and_the_rounded_size() {
    let snap = recording();
    let trace = &snap.device_traces[0];
    let oom_index = trace
        .iter()
        .position(|e| e.action == TraceAction::Oom)
        .unwrap();
    let out = replay::replay(
        &snap,
        &ReplaySettings {
            configs: vec!["roundup_power2_divisions:4".into()],
            device_memory: None,
            keep_history: true,
        },
        &mut |_, _| {},
    )
    .unwrap();
    let oom = out.report.runs[1].first_oom.clone().unwrap();
    assert_eq!(oom.index, oom_index);
    let written = oom.written_index.expect("kept with --out");
    let file = &out.what_ifs[0].device_traces[0];
    assert_eq!(file[written].action, TraceAction::Oom, "{file:#?}");
    assert_eq!(file[written].size, oom.diagnosis.requested);
    assert!(oom.diagnosis.requested > ODD);
    // The report wraps its sentences: the line with its continuation lines, words joined.
    let text = out.report.to_text();
    let start = text
        .find("roundup_power2_divisions:4: first OOM")
        .unwrap_or_else(|| panic!("{text}"));
    let line = text[start..]
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        line.starts_with(&format!(
            "roundup_power2_divisions:4: first OOM at trace entry {} (entry {} of the replayed \
             trace --out writes) ({} requested, rounded to {}): ",
            oom_index + 1,
            written + 1,
            human_bytes(ODD),
            human_bytes(oom.diagnosis.requested)
        )),
        "{line}"
    );
    assert!(text.starts_with("replayed 3 trace entries") || text.contains(" trace entries"));
    // The recorded column's entry in the file written under the recorded settings.
    let rec = out.report.runs[0].first_oom.clone().unwrap();
    assert_eq!(rec.written_index, None, "--out writes the what-if here");
    let alone = replay::replay(
        &snap,
        &ReplaySettings {
            keep_history: true,
            ..ReplaySettings::default()
        },
        &mut |_, _| {},
    )
    .unwrap();
    let rec = alone.report.runs[0].first_oom.clone().unwrap();
    let file = &alone.replayed.device_traces[0];
    let w = rec.written_index.unwrap();
    assert_eq!(file[w].action, TraceAction::Oom);
    // JSON keeps the index from 0.
    let json = serde_json::to_value(&alone.report).unwrap();
    assert_eq!(json["runs"][0]["first_oom"]["index"], oom_index);
}
