//! Render tests: every panel survives any size, and whole screens are `insta` snapshots of a
//! `TestBackend` (deterministic data, no clock).

#[path = "support/screen.rs"]
mod screen;
#[path = "support/builders.rs"]
mod support;

use allocview::state::ui::SegmentFilter;
use allocview::state::{Mode, State, UiState, View};
use allocview::view;
use screen::{every_view_and_help, render_every_way, screen, text};

const SIZES: [(u16, u16); 6] = [(0, 0), (1, 1), (80, 24), (200, 60), (13, 3), (79, 7)];

fn states() -> Vec<State> {
    let mut file = support::live_state();
    file.mode = Mode::File {
        name: "oom.pickle".into(),
        event: 5,
        total: 8,
    };
    file.trace_cursor = Some(5);
    vec![
        State::default(),
        support::live_state(),
        file,
        support::many_segments(300),
    ]
}

#[test]
fn every_panel_renders_at_every_size_without_panicking() {
    for state in states() {
        for view in View::ALL {
            for (w, h) in SIZES {
                for help in [false, true] {
                    let ui = UiState {
                        view,
                        help,
                        detail: true,
                        segment_row: 10_000,
                        block: 99,
                        oom: 7,
                        trace_row: Some(12_345),
                        histogram_group: 17,
                        zoom: view == View::Segments,
                        histogram_by: allocview::state::ui::HistogramGrouping::Pool,
                        ..UiState::default()
                    };
                    render_every_way(&state, &ui, w, h);
                }
            }
        }
    }
}

#[test]
fn every_view_has_a_title_and_its_numbers_at_80x24() {
    let state = support::live_state();
    let expect = [
        (
            View::Overview,
            vec![
                "Memory",
                "Counters",
                "allocated",
                "1,204,331",
                "Over time",
                // The memory panel's text shortens rather than being cut beside the counters.
                "device free",
                "largest free block 20.0 MiB",
                "stranded │",
            ],
        ),
        (
            View::Segments,
            vec![
                "Segments (4, by size)",
                "0x7f3a2c000000",
                "200 MiB L s0",
                "Enter detail",
            ],
        ),
        (View::Pools, vec!["Pools", "small", "large", "2.00 MiB"]),
        (View::Streams, vec!["Streams (2)", " s0", " s1"]),
        (
            View::Histograms,
            vec!["size — all", "p50", "lifetime — all"],
        ),
        (
            View::Trace,
            vec!["Trace (8 of 8)", "segment_alloc", "oom", "step 40 forward"],
        ),
        (
            View::Oom,
            vec![
                "OOM #1",
                "tried to allocate 1.50 GiB",
                "FRAGMENTATION",
                "largest free block: 610 MiB",
            ],
        ),
    ];
    for (view, words) in expect {
        let ui = UiState {
            view,
            ..UiState::default()
        };
        let t = screen(&state, &ui, 80, 24);
        let all = text(t.backend().buffer());
        for w in words {
            assert!(all.contains(w), "{view:?} lacks {w:?}:\n{all}");
        }
        assert!(all.contains(" allocview  ● live"), "{all}");
    }
}

#[test]
fn narrow_overviews_drop_the_counters_before_the_numbers() {
    let state = support::live_state();
    let ui = UiState::default();
    let wide = text(screen(&state, &ui, 80, 24).backend().buffer());
    let narrow = text(screen(&state, &ui, view::MIN_WIDTH, 24).backend().buffer());
    assert!(wide.contains("Counters"));
    assert!(!narrow.contains("Counters"));
    for w in ["peak", "342 MiB", "16.0 GiB", "largest free block"] {
        assert!(narrow.contains(w), "{w} missing:\n{narrow}");
    }
}

#[test]
fn segment_filter_and_selection_show_in_the_list() {
    let state = support::live_state();
    let ui = UiState {
        view: View::Segments,
        segment_filter: SegmentFilter::Small,
        ..UiState::default()
    };
    let all = text(screen(&state, &ui, 120, 30).backend().buffer());
    assert!(all.contains("Segments (1, by size)"), "{all}");
    assert!(all.contains("2.00 MiB S s0"));
    assert!(all.contains("requested  100 KiB"), "{all}");
}

#[test]
fn a_zoomed_segment_fills_the_list_with_its_selected_block_highlighted() {
    let state = support::live_state();
    let ui = UiState {
        view: View::Segments,
        zoom: true,
        block: 2,
        ..UiState::default()
    };
    let t = screen(&state, &ui, 120, 36);
    let buf = t.backend().buffer();
    let all = text(buf);
    // The 200 MiB segment alone, one row per slice, with the zoom's own hints.
    assert!(
        all.contains("Segment 0x7f3a2c000000 200 MiB L s0 · zoom"),
        "{all}"
    );
    assert!(all.contains("z/Esc back"), "{all}");
    assert!(
        !all.contains("0x7f3a18000000"),
        "other segments are hidden:\n{all}"
    );
    assert!(all.contains("0x7f3a2c000000 +     0 B"), "{all}");
    // The detail pane shows the selected block (the 80 MiB one at +80 MiB).
    assert!(all.contains("Block 0x7f3a31000000"), "{all}");
    assert!(all.contains("size       80.0 MiB"), "{all}");
    // Its cells, and only its, are reversed, in the allocated colour; a pending free shows.
    let reversed: Vec<(u16, u16)> = (0..36)
        .flat_map(|y| (31..82).map(move |x| (x, y)))
        .filter(|&(x, y)| {
            buf[(x, y)]
                .modifier
                .contains(ratatui::style::Modifier::REVERSED)
        })
        .collect();
    assert!(!reversed.is_empty());
    for &(x, y) in &reversed {
        assert_eq!(buf[(x, y)].fg, view::theme::ALLOCATED, "cell {x},{y}");
    }
    assert!(all.contains(view::theme::PENDING_GLYPH));
    // Every row's label starts with an address: the slices cover the segment in order.
    let rows = all
        .lines()
        .filter(|l| l.contains("0x7f3a") && l.contains(" +"))
        .count();
    assert!(rows >= 20, "{rows} slice rows:\n{all}");
}

#[test]
fn segments_zoomed_screen() {
    let ui = UiState {
        view: View::Segments,
        zoom: true,
        block: 1,
        ..UiState::default()
    };
    let t = screen(&support::live_state(), &ui, 120, 36);
    insta::assert_snapshot!(t.backend());
}

#[test]
fn histograms_per_pool_and_per_stream_list_percentiles_beside_each_group() {
    use allocview::state::HistogramUnit;
    use allocview::state::ui::HistogramGrouping;
    use allocview::units;
    let mut state = support::live_state();
    let streams: Vec<_> = state
        .histograms
        .iter()
        .filter(|h| h.group == "large pool")
        .map(|h| allocview::state::HistogramSummary {
            group: "stream 7".into(),
            ..h.clone()
        })
        .collect();
    state.histograms.extend(streams);
    let value = |unit, v| match unit {
        HistogramUnit::Bytes => units::bytes(v),
        HistogramUnit::Nanos => units::nanos(v),
    };
    for (by, groups, absent) in [
        (
            HistogramGrouping::Pool,
            vec!["small pool", "large pool"],
            "stream 7",
        ),
        (HistogramGrouping::Stream, vec!["stream 7"], "small pool"),
    ] {
        let ui = UiState {
            view: View::Histograms,
            histogram_by: by,
            ..UiState::default()
        };
        let all = text(screen(&state, &ui, 120, 40).backend().buffer());
        assert!(all.contains(by.label()), "{all}");
        // The footer says what p and s do here (not pause and save).
        assert!(all.contains("p per pool  s per stream"), "{all}");
        assert!(!all.contains(absent), "{by:?} shows {absent}:\n{all}");
        for g in groups {
            // The group's rows carry its own p50 / p90 / p99 / max for each metric.
            for h in state.histograms.iter().filter(|h| h.group == g) {
                let row = [h.p50, h.p90, h.p99, h.max]
                    .iter()
                    .map(|&v| view::right(&value(h.unit, v), 10))
                    .collect::<String>();
                assert!(all.contains(&row), "{g} {} lacks {row:?}:\n{all}", h.metric);
            }
        }
    }
    // The pools of a source without streams: a clear line, no panic.
    let ui = UiState {
        view: View::Histograms,
        histogram_by: HistogramGrouping::Stream,
        ..UiState::default()
    };
    let all = text(
        screen(&support::live_state(), &ui, 80, 24)
            .backend()
            .buffer(),
    );
    assert!(all.contains("no groups of this kind"), "{all}");
}

#[test]
fn the_help_overlay_lists_every_key() {
    let state = support::live_state();
    let ui = UiState {
        help: true,
        ..UiState::default()
    };
    let all = text(screen(&state, &ui, 100, 30).backend().buffer());
    for (k, what) in view::help::KEYS {
        assert!(all.contains(k), "help lacks {k}");
        assert!(all.contains(what), "help cuts {what:?}:\n{all}");
    }
}

#[test]
fn drops_and_resyncs_turn_red() {
    let mut state = support::live_state();
    state.source.dropped = 12;
    let t = screen(&state, &UiState::default(), 120, 36);
    let buf = t.backend().buffer();
    let row: String = (0..120).map(|x| buf[(x, 0)].symbol()).collect();
    let x = row[..row.find("dropped 12").unwrap()].chars().count() as u16 + 8;
    assert_eq!(buf[(x, 0)].fg, view::theme::ALERT);
}

macro_rules! snapshot_view {
    ($name:ident, $view:expr) => {
        #[test]
        fn $name() {
            let ui = UiState {
                view: $view,
                ..UiState::default()
            };
            let t = screen(&support::live_state(), &ui, 120, 36);
            insta::assert_snapshot!(t.backend());
        }
    };
}

snapshot_view!(overview_screen, View::Overview);
snapshot_view!(segments_screen, View::Segments);
snapshot_view!(pools_screen, View::Pools);
snapshot_view!(streams_screen, View::Streams);
snapshot_view!(histograms_screen, View::Histograms);
snapshot_view!(trace_screen, View::Trace);
snapshot_view!(oom_screen, View::Oom);

#[test]
fn help_screen() {
    let ui = UiState {
        help: true,
        ..UiState::default()
    };
    let t = screen(&support::live_state(), &ui, 120, 36);
    insta::assert_snapshot!(t.backend());
}

#[test]
fn histograms_per_pool_screen() {
    let ui = UiState {
        view: View::Histograms,
        histogram_by: allocview::state::ui::HistogramGrouping::Pool,
        histogram_group: 1,
        ..UiState::default()
    };
    let t = screen(&support::live_state(), &ui, 120, 36);
    insta::assert_snapshot!(t.backend());
}

/// The rows of a screen with something on them.
fn non_blank_rows(all: &str) -> Vec<&str> {
    all.lines().filter(|l| !l.trim().is_empty()).collect()
}

#[test]
fn a_terminal_below_the_smallest_layout_gets_a_line_saying_so_and_how_to_quit() {
    let (w, h) = (view::MIN_WIDTH, view::MIN_HEIGHT);
    let state = support::live_state();
    for (sw, sh, says) in [
        (40, 12, "terminal too small: 40x12, needs 74x18".to_string()),
        (
            w - 1,
            h,
            format!("terminal too small: {}x{h}, needs at least {w}x{h}", w - 1),
        ),
        (
            w,
            h - 1,
            format!("terminal too small: {w}x{}, needs at least {w}x{h}", h - 1),
        ),
        (26, 5, "too small: 26x5 < 74x18".to_string()),
    ] {
        for ui in every_view_and_help(UiState::default()) {
            let view = ui.view;
            let all = text(screen(&state, &ui, sw, sh).backend().buffer());
            let rows = non_blank_rows(&all);
            // The message, and under it how to leave.
            assert_eq!(rows.len(), 2, "{sw}x{sh} {view:?}:\n{all}");
            assert_eq!(rows[0].trim(), says, "{sw}x{sh} {view:?}:\n{all}");
            assert!(rows[1].contains("q quits"), "{sw}x{sh} {view:?}:\n{all}");
        }
    }
    // At the smallest size every tab is whole, and the overview draws its device panels and
    // its chart's dots.
    let all = text(screen(&state, &UiState::default(), w, h).backend().buffer());
    let tabs = View::ALL
        .map(view::header::tab_label)
        .join(&" ".repeat(view::header::TAB_GAP as usize));
    assert!(all.contains(&format!(" {tabs}")), "{all}");
    for word in ["Memory", "Over time"] {
        assert!(all.contains(word), "lacks {word:?}:\n{all}");
    }
    assert!(
        all.contains('⠒') || all.contains('⣀'),
        "no chart dots:\n{all}"
    );
    assert!(!all.contains("too small"), "{all}");
}

#[test]
fn at_80x24_the_dashboard_draws_normally() {
    let state = support::live_state();
    for view in View::ALL {
        let ui = UiState {
            view,
            ..UiState::default()
        };
        let all = text(screen(&state, &ui, 80, 24).backend().buffer());
        assert!(!all.contains("too small"), "{view:?}:\n{all}");
        assert!(all.contains(" allocview  ● live"), "{all}");
        assert!(all.contains("7 OOM"), "{all}");
        assert!(non_blank_rows(&all).len() > 10, "{view:?}:\n{all}");
    }
}

#[test]
fn a_host_only_process_gets_a_line_in_each_device_view_pointing_to_the_overview() {
    let state = support::host_only_state(30);
    for view in View::ALL {
        let ui = UiState {
            view,
            ..UiState::default()
        };
        let all = text(screen(&state, &ui, 120, 40).backend().buffer());
        if view == View::Overview {
            assert!(all.contains("Host heap over time"), "{all}");
            assert!(!all.contains(view::NO_DEVICE), "{all}");
            continue;
        }
        assert!(
            all.contains("no device allocator in this process"),
            "{view:?}:\n{all}"
        );
        assert!(all.contains(view::NO_DEVICE), "{view:?}:\n{all}");
        assert!(
            all.contains(&format!("┌ {} ", view.title())),
            "{view:?}:\n{all}"
        );
        // No empty tables or boxes in its place.
        for empty in [
            "no segments",
            "no streams",
            "no values recorded",
            "no trace recorded",
            "No OOM so far",
            "pool           segments",
        ] {
            assert!(!all.contains(empty), "{view:?} shows {empty:?}:\n{all}");
        }
    }
    // With a device too, the device views are back.
    let mut both = support::live_state();
    both.host = Some(support::host_heap(30));
    let ui = UiState {
        view: View::Segments,
        ..UiState::default()
    };
    let all = text(screen(&both, &ui, 120, 40).backend().buffer());
    assert!(!all.contains(view::NO_DEVICE), "{all}");
    assert!(all.contains("Segments (4, by size)"), "{all}");
}
