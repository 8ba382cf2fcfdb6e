//! One figure reads the same everywhere: a recording whose OOM asks for 1000 MiB (which each
//! view once wrote its own way: `1000.0 MiB`, `1000.00 MiB`, `0.98 GiB`) shows that request
//! as `0.98 GiB` in `allocview summary`'s text, in the OOM diagnosis, and on the dashboard's
//! OOM screen.

#[path = "support/screen.rs"]
#[allow(dead_code)]
mod screen;

use std::sync::Arc;

use allocview::source::file::FileSource;
use allocview::state::{UiState, View};
use allocview::units::{GIB, MIB};
use allocview_agent::summary;
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, HistoryOptions};
use allocview_alloc::snapshot::Snapshot;
use allocview_alloc::stats::human_bytes;

/// The request that fails: 1000 MiB, a figure at the MiB/GiB boundary.
const REQUEST: u64 = 1000 * MIB;
/// A live block that leaves too little of the device for [`REQUEST`].
const HELD: u64 = 300 * MIB;
/// How [`REQUEST`] reads in every view.
const REQUEST_TEXT: &str = "0.98 GiB";

/// Records on a 1 GiB device: [`HELD`] live, then the OOM of [`REQUEST`].
fn recording() -> Snapshot {
    let alloc = CachingAllocator::new(Arc::new(SimBackend::new(GIB)), AllocatorConfig::default());
    alloc.record_history(HistoryOptions::default());
    let s = StreamId::DEFAULT;
    let _held = alloc.malloc(HELD, s).unwrap();
    assert!(alloc.malloc(REQUEST, s).is_err());
    alloc.snapshot()
}

#[test]
fn the_summary_the_diagnosis_and_the_dashboard_write_a_size_the_same_way() {
    let snap = recording();
    assert_eq!(human_bytes(REQUEST), REQUEST_TEXT);

    // `allocview summary`: the OOM table's requested column and the first OOM's diagnosis.
    let s = summary::summarize(&snap);
    let oom = &s.devices[0].ooms[0];
    assert_eq!(oom.requested, REQUEST);
    let text = s.to_string();
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with('#'))
        .unwrap_or_else(|| panic!("no OOM row in\n{text}"));
    assert!(row.contains(REQUEST_TEXT), "{row}");
    let free = human_bytes(oom.device_free);
    assert!(row.contains(&free), "{free} not in {row}");
    let diagnosis = oom.diagnosis.as_ref().expect("the OOM is diagnosed");
    assert!(
        diagnosis.explanation.contains(REQUEST_TEXT),
        "{}",
        diagnosis.explanation
    );
    // The text wraps long sentences: compare word by word.
    let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat(&text).contains(&flat(&format!("first OOM — {}", diagnosis.explanation))),
        "{text}"
    );

    // The dashboard: the OOM screen of the same file, its request and its diagnosis.
    let src = FileSource::new("sizes.pickle", &snap);
    let pm = src.post_mortem();
    let state = pm.state_at(pm.len());
    assert_eq!(state.ooms[0].requested, REQUEST);
    let screen = screen::view_text(&state, View::Oom, UiState::default(), 160, 30);
    assert!(
        screen.contains(&format!("tried to allocate {REQUEST_TEXT}")),
        "{screen}"
    );
    assert!(screen.contains(&format!("{free} free")), "{screen}");
    let words = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
    let on_screen: String = screen
        .lines()
        .map(|l| l.trim_matches(|c: char| c == '│' || c.is_whitespace()))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        words(&on_screen).contains(&words(&diagnosis.explanation)),
        "{}\nnot in\n{screen}",
        diagnosis.explanation
    );

    // No view writes the figure another way.
    for other in ["1000.0 MiB", "1000.00 MiB", "1000 MiB", "0.98 KiB"] {
        assert!(!text.contains(other), "{other} in\n{text}");
        assert!(!screen.contains(other), "{other} in\n{screen}");
    }
}
