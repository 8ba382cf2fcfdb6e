//! The app drawn through a terminal as a user meets it: a terminal too small and then grown, a
//! snapshot file without a trace, `n` in the OOM view, and histograms that read the same live
//! and from a file.

#[path = "support/screen.rs"]
#[allow(dead_code)]
mod screen;
use screen::{drawn, press, screen_of};
#[path = "support/builders.rs"]
mod support;

use allocview::app::App;
use allocview::input::{self, Action, Seek};
use allocview::state::from_agent::{AgentAdapter, LiveInfo};
use allocview::state::histogram::Log2Histogram;
use allocview::state::{Bucket, HistogramUnit, UiState, View};
use allocview::view;
use allocview_agent::state::{AgentState, DeviceState, HistogramSummary};
use allocview_alloc::snapshot::Snapshot;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent};

/// An app over `snap` opened as a file.
fn file_app(snap: &Snapshot) -> (App, tempfile::TempDir) {
    support::file_app("/tmp/run.pickle", snap)
}

#[test]
fn a_tiny_terminal_says_it_is_too_small_and_the_dashboard_comes_back_when_it_grows() {
    let (mut app, _d) = file_app(&support::traced_snapshot(3));
    let mut terminal = Terminal::new(TestBackend::new(40, 12)).unwrap();
    let small = drawn(&mut app, &mut terminal);
    let rows: Vec<&str> = small.lines().filter(|l| !l.trim().is_empty()).collect();
    // The message, and under it how to leave.
    assert_eq!(rows.len(), 2, "{small}");
    assert_eq!(rows[1].trim(), view::TOO_SMALL_HINT_SHORT, "{small}");
    assert!(
        rows[0].contains(&format!(
            "terminal too small: 40x12, needs {}x{}",
            view::MIN_WIDTH,
            view::MIN_HEIGHT
        )),
        "{small}"
    );
    // A click where a tab would be does nothing while only the message is on screen.
    app.apply(Action::Click { x: 14, y: 1 }).unwrap();
    assert_eq!(app.ui.view, View::Overview);
    // The terminal grows: the resize redraws the whole dashboard.
    terminal.backend_mut().resize(80, 24);
    app.apply(Action::Resize).unwrap();
    app.draw(&mut terminal).unwrap();
    let buf = terminal.backend().buffer();
    let grown: String = (0..24)
        .map(|y| (0..80).map(|x| buf[(x, y)].symbol()).collect::<String>() + "\n")
        .collect();
    assert!(!grown.contains("too small"), "{grown}");
    for word in [
        "file run.pickle",
        "1 Overview",
        "7 OOM",
        "Memory",
        "Over time",
    ] {
        assert!(grown.contains(word), "lacks {word:?}:\n{grown}");
    }
    // And clicks select tabs again.
    app.apply(Action::Click { x: 14, y: 1 }).unwrap();
    assert_eq!(app.ui.view, View::Segments);
}

#[test]
fn a_file_without_a_trace_says_why_its_chart_and_trace_are_empty() {
    // A snapshot dumped without `_record_memory_history`: segments, no trace at all, or an
    // empty one for its device.
    for device_traces in [Vec::new(), vec![Vec::new()]] {
        let snap = Snapshot {
            segments: support::segments(),
            device_traces,
            ..Snapshot::default()
        };
        let (mut app, _d) = file_app(&snap);
        let all = screen_of(&mut app, 120, 36);
        assert!(all.contains("Memory"), "{all}");
        let chart = all
            .lines()
            .skip_while(|l| !l.contains("Over time"))
            .collect::<Vec<_>>()
            .join("\n");
        for word in [
            "no trace recorded in this file: usage over time needs a snapshot taken",
            "torch.cuda.memory._record_memory_history() is on",
        ] {
            assert!(chart.contains(word), "chart lacks {word:?}:\n{all}");
        }
        // No empty axes in its place.
        assert!(!chart.contains("│0 "), "{all}");
        app.apply(Action::ShowView(View::Trace)).unwrap();
        let all = screen_of(&mut app, 120, 36);
        assert!(
            all.contains("no trace recorded in this file: PyTorch records one while"),
            "{all}"
        );
    }
    // With a trace, the chart is drawn.
    let (mut app, _d) = file_app(&support::traced_snapshot(3));
    let all = screen_of(&mut app, 120, 36);
    assert!(!all.contains("no trace recorded"), "{all}");
}

#[test]
fn n_in_the_oom_view_scrolls_to_the_oom_it_goes_to() {
    let (mut app, _d) = file_app(&support::traced_snapshot(3));
    app.apply(Action::Seek(Seek::First)).unwrap();
    press(&mut app, KeyCode::Char('7'));
    assert_eq!(app.ui.view, View::Oom);
    // A screen with room for one OOM box and a bit of the next.
    let first_box = |app: &mut App| -> String {
        let all = screen_of(app, 100, 24);
        all.lines()
            .find(|l| l.contains("┌ OOM #"))
            .unwrap_or_else(|| panic!("no OOM box:\n{all}"))
            .to_string()
    };
    for (n, event) in [(1, 8), (2, 27), (3, 46)] {
        press(&mut app, KeyCode::Char('n'));
        assert_eq!(app.state.trace_cursor, Some(event), "OOM {n}");
        assert_eq!(app.ui.oom, n - 1);
        let top = first_box(&mut app);
        assert!(top.contains(&format!("┌ OOM #{n} ")), "OOM {n}: {top}");
        assert!(top.contains(&format!(" {n} of 3 ")), "OOM {n}: {top}");
    }
    // Past the last one: back to the first, and the status line says so.
    press(&mut app, KeyCode::Char('n'));
    assert_eq!(app.state.trace_cursor, Some(8));
    assert_eq!(app.ui.oom, 0);
    assert_eq!(
        app.state.status.as_deref(),
        Some("no OOM after this event: back to the first, at event 8")
    );
    assert!(first_box(&mut app).contains("┌ OOM #1 "));
}

#[test]
fn n_in_a_live_oom_view_selects_the_next_oom() {
    let ui = UiState {
        view: View::Oom,
        ..UiState::default()
    };
    let n = KeyEvent::from(KeyCode::Char('n'));
    assert_eq!(input::key(n, &ui, false), Some(Action::Move(1)));
    // Elsewhere, live, `n` means nothing.
    assert_eq!(input::key(n, &UiState::default(), false), None);
}

/// The agent's form of a histogram: `(upper_bound, count)` of its non-empty log2 buckets.
fn agent_histogram(values: &[u64]) -> HistogramSummary {
    let mut pairs: Vec<(u64, u64)> = Vec::new();
    for &v in values {
        let hi = 1u64
            .checked_shl(u64::BITS - v.leading_zeros())
            .unwrap_or(u64::MAX);
        match pairs.iter_mut().find(|p| p.0 == hi) {
            Some(p) => p.1 += 1,
            None => pairs.push((hi, 1)),
        }
    }
    pairs.sort_unstable();
    HistogramSummary {
        count: values.len() as u64,
        max: values.iter().copied().max().unwrap_or(0),
        buckets: pairs,
        ..HistogramSummary::default()
    }
}

#[test]
fn live_and_file_histograms_show_the_empty_buckets_between_as_zero_rows() {
    // Three values near 1 KiB and one near 5 KiB: the buckets [2 KiB, 4 KiB) and
    // [1 KiB, 2 KiB) between them are empty.
    let values = [1000, 1000, 1000, 5000];
    let mut file = Log2Histogram::new();
    for v in values {
        file.record(v);
    }
    let file = file.summary("size", "all", HistogramUnit::Bytes);

    let mut agent = AgentState::default();
    let mut device = DeviceState::default();
    device.histograms.all.size = agent_histogram(&values);
    agent.devices.push(device);
    let live = AgentAdapter::new().state(&agent, 0, &LiveInfo::default());
    let live = live
        .histograms
        .iter()
        .find(|h| h.metric == "size" && h.group == "all")
        .expect("the live size histogram")
        .clone();

    let expect = [
        (512, 1024, 3),
        (1024, 2048, 0),
        (2048, 4096, 0),
        (4096, 8192, 1),
    ]
    .map(|(lo, hi, count)| Bucket { lo, hi, count });
    assert_eq!(file.buckets, expect);
    assert_eq!(live.buckets, expect);

    // Drawn, both have the same rows, the empty buckets as 0.
    let rows = |h: &allocview::state::HistogramSummary| {
        let state = allocview::state::State {
            histograms: vec![h.clone()],
            ..allocview::state::State::default()
        };
        let ui = UiState {
            view: View::Histograms,
            ..UiState::default()
        };
        let mut t = Terminal::new(TestBackend::new(100, 30)).unwrap();
        t.draw(|f| view::draw(f, &state, &ui)).unwrap();
        let buf = t.backend().buffer();
        (0..30)
            .map(|y| (0..100).map(|x| buf[(x, y)].symbol()).collect::<String>())
            .filter(|l| (l.contains(" B ") || l.contains(" KiB ")) && !l.contains("p50"))
            .collect::<Vec<_>>()
    };
    let (live_rows, file_rows) = (rows(&live), rows(&file));
    assert_eq!(live_rows, file_rows);
    assert_eq!(live_rows.len(), 4, "{live_rows:#?}");
    for (row, (label, count)) in live_rows.iter().zip([
        ("512 B", " 3 │"),
        ("1.00 KiB", " 0 │"),
        ("2.00 KiB", " 0 │"),
        ("4.00 KiB", " 1 │"),
    ]) {
        assert!(row.contains(label), "{row}");
        assert!(row.ends_with(count), "{row}");
    }
}

#[test]
fn a_files_counters_say_what_it_does_not_record() {
    let (mut app, _d) = file_app(&support::traced_snapshot(3));
    let all = screen_of(&mut app, 120, 36);
    let row = |label: &str| {
        all.lines()
            .find_map(|l| {
                l.split_once(&format!(" {label} "))
                    .map(|(_, r)| r.to_string())
            })
            .unwrap_or_else(|| panic!("no {label} row:\n{all}"))
    };
    // From the trace: three rounds, one OOM each.
    assert!(row("OOMs").trim_start().starts_with("3 "), "{all}");
    assert!(
        row("trace entries").trim_start().starts_with("57 "),
        "{all}"
    );
    // A snapshot file records no retries or syncs: not known, not 0.
    assert!(
        row("retries").trim_start().starts_with("not known"),
        "{all}"
    );
    assert!(
        row("stream syncs").trim_start().starts_with("not known"),
        "{all}"
    );
    assert!(!all.contains("dropped events"), "{all}");
}

#[test]
fn pgdn_scrolls_an_oom_box_too_tall_for_the_terminal_and_says_what_is_hidden() {
    let (mut app, _d) = file_app(&support::traced_snapshot(3));
    press(&mut app, KeyCode::Char('7'));
    // What-if lines as the background replays add them: the box no longer fits the shortest
    // terminal the dashboard draws at.
    app.state.ooms[0].what_if = [
        "expandable_segments:True   → fits; no OOM in the trace, peak reserved 7.88 GiB of 8.00 GiB",
        "max_split_size_mb:128      → fits; no OOM in the trace, peak reserved 8.00 GiB of 8.00 GiB",
        "max_split_size_mb:512      → fits; 1 other OOM, first at entry 2203, peak reserved 8.00 GiB",
    ]
    .map(String::from)
    .to_vec();
    let (w, h) = (view::MIN_WIDTH, view::MIN_HEIGHT);
    let first = screen_of(&mut app, w, h);
    assert!(first.contains("more (PgDn)"), "{first}");
    // The what-ifs come last: the file's entry shows, the last what-if is below the fold.
    assert!(first.contains("Enter goes there"), "{first}");
    assert!(!first.contains("max_split_size_mb:512"), "{first}");
    press(&mut app, KeyCode::PageDown);
    let scrolled = screen_of(&mut app, w, h);
    assert!(scrolled.contains("max_split_size_mb:512"), "{scrolled}");
    assert!(scrolled.contains("above (PgUp)"), "{scrolled}");
    // Further PgDn stays at the end; PgUp goes back to the top.
    press(&mut app, KeyCode::PageDown);
    assert_eq!(screen_of(&mut app, w, h), scrolled);
    press(&mut app, KeyCode::PageUp);
    press(&mut app, KeyCode::PageUp);
    assert_eq!(screen_of(&mut app, w, h), first);
    // Selecting another OOM starts at its top.
    press(&mut app, KeyCode::PageDown);
    press(&mut app, KeyCode::Char('j'));
    assert_eq!(app.ui.oom, 1);
    assert_eq!(app.ui.oom_scroll, 0);
    // Tall enough, nothing is hidden and nothing says so.
    let tall = screen_of(&mut app, 120, 60);
    assert!(
        !tall.contains("(PgDn)") && !tall.contains("(PgUp)"),
        "{tall}"
    );
}
