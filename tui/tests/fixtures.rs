//! `allocview open` over every real PyTorch snapshot in the shared fixtures: segments show, and
//! where there is a trace, time travel lands exactly on the file's final segments and the
//! checkpointed seeks equal a full replay.

#[path = "support/screen.rs"]
#[allow(dead_code)]
mod screen;

use std::path::PathBuf;

use allocview::source::file::FileSource;
use allocview::state::filter::TraceFilter;
use allocview::state::from_snapshot::main_device;
use allocview::state::{UiState, View};
use allocview_agent::snapshot_file;
use allocview_alloc::snapshot::{BlockState, Frame, SegmentInfo};

fn fixtures() -> Option<Vec<PathBuf>> {
    let dir = allocview_tests::fixtures::dir()?;
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
        .collect();
    v.sort();
    Some(v)
}

/// What must agree between the reconstruction and the file: each segment's address, size and
/// stream, and each block's address, size and state (plus the requested size of live blocks).
type BlockShape = (u64, u64, BlockState, u64);
type SegmentShape = (u64, u64, u64, Vec<BlockShape>);

fn shape(segs: &[SegmentInfo]) -> Vec<SegmentShape> {
    segs.iter()
        .map(|s| {
            (
                s.address,
                s.total_size,
                s.stream,
                s.blocks
                    .iter()
                    .map(|b| {
                        let req = if b.state == BlockState::Inactive {
                            0
                        } else {
                            b.requested_size
                        };
                        (b.address, b.size, b.state, req)
                    })
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn every_fixture_opens_with_its_segments_and_time_travel_ends_on_the_file() {
    let Some(files) = fixtures() else { return };
    assert!(!files.is_empty());
    for path in files {
        let snap = snapshot_file::load(&path).unwrap();
        let device = main_device(&snap);
        let src = FileSource::new(&path.display().to_string(), &snap);
        let pm = src.post_mortem();
        let tt = pm.time_travel();
        let file_segments: Vec<SegmentInfo> = snap
            .segments
            .iter()
            .filter(|s| s.device == device)
            .cloned()
            .collect();
        // The state at the last event equals the file's own segments.
        let end = pm.state_at(pm.len());
        assert_eq!(
            shape(&end.segments),
            shape(&file_segments),
            "{}: end state differs",
            path.display()
        );
        assert!(!end.segments.is_empty(), "{}", path.display());
        let (_, totals) = tt.at(tt.len());
        assert_eq!(
            totals.mismatches,
            0,
            "{}: trace does not fit",
            path.display()
        );
        // The state at event 0 replayed forward matches the checkpointed seeks.
        let n = tt.len();
        for i in [0, 1, n / 3, n / 2, n.saturating_sub(1), n] {
            assert_eq!(
                tt.at(i),
                tt.at_by_full_replay(i),
                "{} event {i}",
                path.display()
            );
        }
        // The segment view shows them.
        let text = screen::view_text(&end, View::Segments, UiState::default(), 120, 36);
        assert!(
            text.contains(&format!("Segments ({}", file_segments.len())),
            "{}",
            path.display()
        );
        // The streams view gives each stream its peak over the trace (the file's whole-device
        // peak when there is one stream), and says what window that peak covers.
        let text = screen::view_text(&end, View::Streams, UiState::default(), 140, 36);
        let rows = end.stream_rows();
        for r in &rows {
            let peak = r.peak.expect("a file's streams have peaks");
            assert!(peak >= r.allocated, "{}", path.display());
            let row = text
                .lines()
                .find(|l| l.contains(&format!(" s{} ", r.stream)))
                .unwrap_or_else(|| panic!("no row for s{} in\n{text}", r.stream));
            assert!(
                row.contains(&allocview::units::bytes(peak)),
                "{}: {row}",
                path.display()
            );
        }
        if let [only] = rows.as_slice() {
            assert_eq!(only.peak, Some(totals.peak_allocated), "{}", path.display());
        }
        assert!(
            text.contains("peak: highest allocated from the start of the recorded trace"),
            "{text}"
        );
        println!(
            "{}: {} segments, {} events",
            path.display(),
            file_segments.len(),
            n
        );
    }
}

#[test]
fn the_trace_context_column_shows_the_users_frame_not_the_allocators() {
    let Some(files) = fixtures() else { return };
    let mut checked = 0;
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !["small-97-events.pickle", "cs336-newest-format.pickle"].contains(&name.as_str()) {
            continue;
        }
        let snap = snapshot_file::load(&path).unwrap();
        let src = FileSource::new(&path.display().to_string(), &snap);
        let state = src.post_mortem().state_at(3);
        let ui = UiState {
            trace_row: Some(0),
            ..UiState::default()
        };
        let text = screen::view_text(&state, View::Trace, ui, 200, 20);
        // Every alloc row names a Python file of the user's (`.py:`), never the unwinder.
        let alloc_rows: Vec<&str> = text.lines().filter(|l| l.contains(" alloc ")).collect();
        assert!(!alloc_rows.is_empty(), "{name}:\n{text}");
        for row in alloc_rows {
            assert!(row.contains(".py:"), "{name}: no user frame in {row:?}");
            assert!(!row.contains("unwind"), "{name}: {row:?}");
        }
        checked += 1;
    }
    assert_eq!(checked, 2, "both traced fixtures were checked");
}

#[test]
fn the_trace_filter_finds_entries_by_their_stack_frames() {
    let Some(files) = fixtures() else { return };
    let path = files
        .iter()
        .find(|p| p.ends_with("small-97-events.pickle"))
        .expect("small-97-events.pickle is among the fixtures");
    let snap = snapshot_file::load(path).unwrap();
    let state = FileSource::new(&path.display().to_string(), &snap)
        .post_mortem()
        .state_at(0);
    // A function's name (any case), and a file and line.
    for (text, hit) in [
        (
            "AUTOGRAD",
            &(|f: &Frame| f.name.to_lowercase().contains("autograd")) as &dyn Fn(&Frame) -> bool,
        ),
        ("ceval.c:578", &|f: &Frame| {
            f.filename.contains("ceval.c") && f.line == 578
        }),
    ] {
        let rows = state.trace_rows(&TraceFilter::parse(text).unwrap());
        assert!(
            !rows.is_empty() && rows.len() < state.trace.len(),
            "{text}: {} of {}",
            rows.len(),
            state.trace.len()
        );
        for (i, e) in state.trace.iter().enumerate() {
            assert_eq!(
                rows.contains(&i),
                e.frames.iter().any(hit),
                "{text}: entry {i}"
            );
        }
        println!("{text}: {} of {} entries", rows.len(), state.trace.len());
    }
}
