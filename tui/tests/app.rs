//! The app driven by intents over a file source: time travel keys, view switching, the trace
//! filter, jumping from the trace to a block, saving.

#[path = "support/builders.rs"]
mod support;

use allocview::app::App;
use allocview::input::{Action, Seek};
use allocview::source::file::FileSource;
use allocview::state::timetravel::CHECKPOINT_EVERY;
use allocview::state::timetravel::is_segment_event;
use allocview::state::{Mode, View};
use allocview_alloc::snapshot::{BlockState, DeviceMeta, DumpedOom, Snapshot, TraceAction};

fn app(rounds: u64) -> (App, tempfile::TempDir) {
    app_of(&support::traced_snapshot(rounds))
}

fn app_of(snap: &Snapshot) -> (App, tempfile::TempDir) {
    support::file_app("/tmp/run.json", snap)
}

fn event(app: &App) -> usize {
    match app.state.mode {
        Mode::File { event, .. } => event,
        _ => panic!("not a file"),
    }
}

#[test]
fn a_file_opens_at_its_last_event() {
    let (app, _d) = app(3);
    assert!(app.file_mode());
    assert_eq!(event(&app), 57);
    assert!(app.state.segments.is_empty());
    assert_eq!(app.state.ooms.len(), 3);
}

#[test]
fn checkpointed_seeks_equal_a_full_replay() {
    let snap = support::traced_snapshot(100);
    let src = FileSource::new("run.json", &snap);
    let tt = src.post_mortem().time_travel();
    assert!(tt.len() > 3 * CHECKPOINT_EVERY);
    for i in [
        0,
        1,
        5,
        511,
        512,
        513,
        1000,
        1024,
        1500,
        tt.len() - 1,
        tt.len(),
    ] {
        assert_eq!(tt.at(i), tt.at_by_full_replay(i), "event {i}");
    }
}

#[test]
fn time_travel_keys_move_through_the_trace() {
    let (mut app, _d) = app(10);
    app.apply(Action::Seek(Seek::First)).unwrap();
    assert_eq!(event(&app), 0);
    app.apply(Action::Seek(Seek::By(1))).unwrap();
    assert_eq!(event(&app), 1);
    assert_eq!(app.state.segments.len(), 1);
    app.apply(Action::Seek(Seek::By(-5))).unwrap();
    assert_eq!(event(&app), 0);
    app.apply(Action::Seek(Seek::By(-1))).unwrap();
    assert_eq!(app.state.status.as_deref(), Some("at the first event"));
    app.apply(Action::Seek(Seek::NextOom)).unwrap();
    assert_eq!(event(&app), 8);
    assert_eq!(app.state.trace[7].action, TraceAction::Oom);
    // At the OOM: the 2 MiB block is allocated, the 4 MiB one freed, a small segment lives.
    let seg = &app.state.segments[0];
    assert_eq!(seg.blocks[1].state, BlockState::ActiveAllocated);
    assert_eq!(seg.blocks[0].state, BlockState::Inactive);
    app.apply(Action::Seek(Seek::NextSegmentEvent)).unwrap();
    assert_eq!(event(&app), 9);
    app.apply(Action::Seek(Seek::By(100))).unwrap();
    assert_eq!(event(&app), 109);
    app.apply(Action::Seek(Seek::Last)).unwrap();
    assert_eq!(event(&app), 190);
    // From the end, `n` wraps round to the first OOM, and says so.
    app.apply(Action::Seek(Seek::NextOom)).unwrap();
    assert_eq!(event(&app), 8);
    assert_eq!(
        app.state.status.as_deref(),
        Some("no OOM after this event: back to the first, at event 8")
    );
    assert_eq!(app.ui.oom, 0, "the first OOM is selected");
    app.apply(Action::Seek(Seek::Last)).unwrap();
    app.apply(Action::Seek(Seek::NextSegmentEvent)).unwrap();
    assert_eq!(
        event(&app),
        app.state.trace.iter().position(is_segment_event).unwrap() + 1
    );
}

#[test]
fn n_in_a_trace_without_ooms_says_there_are_none() {
    let mut snap = support::traced_snapshot(2);
    snap.device_traces[0].retain(|e| e.action != TraceAction::Oom);
    let (mut app, _d) = app_of(&snap);
    let at = event(&app);
    app.apply(Action::Seek(Seek::NextOom)).unwrap();
    assert_eq!(event(&app), at);
    assert_eq!(app.state.status.as_deref(), Some("the trace holds no OOM"));
}

#[test]
fn an_oom_dump_without_a_trace_shows_the_agents_record_of_its_oom() {
    let mut snap = support::traced_snapshot(1);
    snap.device_traces = vec![Vec::new()];
    let mib = 1u64 << 20;
    snap.devices = vec![DeviceMeta {
        device: 0,
        total_memory: Some(64 * mib),
        trace_overflow: 0,
        oom: Some(DumpedOom {
            index: 4,
            time_us: 1_700_000_000_000_000,
            stream: 2,
            requested: 30 * mib,
            rounded: 30 * mib,
            device_free: 10 * mib,
            allocated: 50 * mib,
            reserved: 54 * mib,
            largest_free_block: 4 * mib,
            inactive_split_bytes: 4 * mib,
            event_lost: false,
        }),
    }];
    let (mut app, _d) = app_of(&snap);
    let [o] = app.state.ooms.as_slice() else {
        panic!("{:?}", app.state.ooms)
    };
    assert_eq!((o.number, o.stream, o.requested), (4, 2, 30 * mib));
    assert_eq!((o.allocated, o.reserved), (50 * mib, 54 * mib));
    assert_eq!(o.device_total, Some(64 * mib));
    assert_eq!(o.trace_index, None);
    assert_eq!(o.dump_path.as_deref(), Some("/tmp/run.json"));
    assert!(o.what_if.is_empty(), "no trace to replay: {:?}", o.what_if);
    assert_eq!(o.diagnosis_label(), "EXHAUSTION");
    app.apply(Action::Seek(Seek::NextOom)).unwrap();
    let status = app.state.status.as_deref().unwrap();
    assert!(status.contains("the OOM view (7)"), "{status}");
}

#[test]
fn enter_in_the_trace_jumps_to_the_block() {
    let (mut app, _d) = app(2);
    app.apply(Action::Seek(Seek::To(5))).unwrap();
    app.apply(Action::ShowView(View::Trace)).unwrap();
    // The default row is the last entry applied: the small allocation at event 5.
    app.apply(Action::Enter).unwrap();
    assert_eq!(app.ui.view, View::Segments);
    assert!(app.ui.detail);
    let order = app.state.segment_order(app.ui.segment_filter);
    let seg = &app.state.segments[order[app.ui.segment_row]];
    assert_eq!(seg.total_size, 2 << 20);
    assert_eq!(seg.blocks[app.ui.block].requested_size, 1000);
}

#[test]
fn enter_on_an_oom_trace_row_shows_that_oom() {
    let (mut app, _d) = app(3);
    // Just after the second OOM (entry 26): the trace view's default row is that entry.
    app.apply(Action::Seek(Seek::To(27))).unwrap();
    app.apply(Action::ShowView(View::Trace)).unwrap();
    assert_eq!(app.state.trace[26].action, TraceAction::Oom);
    app.apply(Action::Enter).unwrap();
    assert_eq!(app.ui.view, View::Oom);
    assert_eq!(app.ui.oom, 1);
    assert_eq!(event(&app), 27);
}

#[test]
fn enter_on_an_earlier_trace_row_in_a_file_travels_to_its_event() {
    // At the end every segment is gone; the rows still list the whole trace.
    let (mut app, _d) = app(3);
    assert!(app.state.segments.is_empty());
    app.apply(Action::ShowView(View::Trace)).unwrap();
    let rows = app.state.trace_rows(&app.ui.trace_filter);
    let alloc = rows
        .iter()
        .position(|&i| app.state.trace[i].action == TraceAction::Alloc && i > 3)
        .unwrap();
    app.ui.trace_row = Some(alloc);
    app.apply(Action::Enter).unwrap();
    // Just after the allocation: its block is selected in the segment view.
    let i = rows[alloc];
    assert_eq!(event(&app), i + 1);
    assert_eq!(app.ui.view, View::Segments);
    let seg = &app.state.segments[app.state.selected_segment(&app.ui).unwrap()];
    let block = &seg.blocks[app.ui.block];
    assert_eq!(block.address, app.state.trace[i].addr);
    assert_eq!(block.state, BlockState::ActiveAllocated);
    // A free_completed row goes to just before it, while the block is still there.
    app.apply(Action::ShowView(View::Trace)).unwrap();
    let free = rows
        .iter()
        .position(|&j| app.state.trace[j].action == TraceAction::FreeCompleted)
        .unwrap();
    app.ui.trace_row = Some(free);
    app.apply(Action::Enter).unwrap();
    let j = rows[free];
    assert_eq!(event(&app), j);
    assert_eq!(app.ui.view, View::Segments);
    let seg = &app.state.segments[app.state.selected_segment(&app.ui).unwrap()];
    assert_eq!(seg.blocks[app.ui.block].address, app.state.trace[j].addr);
    assert!(seg.blocks[app.ui.block].state.is_active());
}

#[test]
fn the_trace_filter_is_typed_applied_and_cleared() {
    let (mut app, _d) = app(2);
    app.apply(Action::StartFilter).unwrap();
    assert_eq!(app.ui.view, View::Trace);
    for c in "oom".chars() {
        app.apply(Action::FilterChar(c)).unwrap();
    }
    app.apply(Action::FilterApply).unwrap();
    assert_eq!(app.state.trace_rows(&app.ui.trace_filter).len(), 2);
    app.apply(Action::StartFilter).unwrap();
    app.apply(Action::FilterChar(' ')).unwrap();
    app.apply(Action::FilterChar('~')).unwrap();
    app.apply(Action::FilterApply).unwrap();
    assert!(
        app.state
            .status
            .as_deref()
            .unwrap()
            .contains("bad filter term \"~\"")
    );
    app.apply(Action::Back).unwrap();
    app.apply(Action::Back).unwrap();
    assert!(app.ui.trace_filter.is_empty());
    // Ctrl-W deletes the last word, Ctrl-U the whole line.
    app.apply(Action::StartFilter).unwrap();
    for c in "alloc s0 ".chars() {
        app.apply(Action::FilterChar(c)).unwrap();
    }
    app.apply(Action::FilterDeleteWord).unwrap();
    assert_eq!(app.ui.filter_input.as_deref(), Some("alloc "));
    app.apply(Action::FilterClear).unwrap();
    assert_eq!(app.ui.filter_input.as_deref(), Some(""));
}

#[test]
fn views_switch_by_number_tab_and_click() {
    let (mut app, _d) = app(1);
    app.apply(Action::ShowView(View::Pools)).unwrap();
    assert_eq!(app.ui.view, View::Pools);
    app.apply(Action::NextView).unwrap();
    assert_eq!(app.ui.view, View::Streams);
    app.area = ratatui::layout::Rect::new(0, 0, 120, 36);
    // " 1 Overview  2 Segments": column 13 is in "2 Segments".
    app.apply(Action::Click { x: 13, y: 1 }).unwrap();
    assert_eq!(app.ui.view, View::Segments);
    app.apply(Action::ToggleHelp).unwrap();
    assert!(app.ui.help);
    app.apply(Action::Back).unwrap();
    assert!(!app.ui.help);
}

#[test]
fn saving_writes_the_state_at_the_event() {
    let mut snap = support::traced_snapshot(2);
    snap.devices = vec![DeviceMeta {
        device: 0,
        total_memory: Some(8 << 30),
        trace_overflow: 5,
        oom: None,
    }];
    let (mut app, dir) = app_of(&snap);
    app.apply(Action::Seek(Seek::To(3))).unwrap();
    app.apply(Action::Save).unwrap();
    let status = app.state.status.clone().unwrap();
    assert!(status.starts_with("saved snapshot to "), "{status}");
    let path = dir.path().join("allocview-event-3.json");
    let saved = allocview_agent::snapshot_file::load(&path).unwrap();
    assert_eq!(saved.device_traces[0].len(), 3);
    // The device's size and the ring's overflow travel with the saved state.
    let meta = &saved.devices[0];
    assert_eq!((meta.total_memory, meta.trace_overflow), (Some(8 << 30), 5));
}

#[test]
fn a_message_gives_the_footer_back_after_a_while() {
    let (mut app, _d) = app(2);
    app.apply(Action::Save).unwrap();
    assert!(
        app.state
            .status
            .as_deref()
            .is_some_and(|s| s.starts_with("saved snapshot to"))
    );
    let now = std::time::Instant::now();
    app.expire_notice(now);
    assert!(app.state.status.is_some(), "shown for a while");
    app.expire_notice(now + allocview::app::NOTICE_SHOWN);
    assert_eq!(app.state.status, None);
}

#[test]
fn quitting_sets_the_flag() {
    let (mut app, _d) = app(1);
    app.apply(Action::Quit).unwrap();
    assert!(app.ui.quit);
}

#[test]
fn enter_on_an_oom_in_a_file_goes_to_its_event() {
    let (mut app, _d) = app(3);
    app.apply(Action::ShowView(View::Oom)).unwrap();
    app.apply(Action::Move(1)).unwrap();
    app.apply(Action::Enter).unwrap();
    assert_eq!(app.ui.view, View::Segments);
    // The second round's OOM is entry 19 + 7: event 27 shows it applied.
    assert_eq!(event(&app), 27);
    assert_eq!(app.state.trace[26].action, TraceAction::Oom);
}

#[test]
fn a_saved_json_snapshot_reopens_with_the_same_segments() {
    let (mut app, dir) = app(2);
    app.apply(Action::Seek(Seek::To(9))).unwrap();
    let before = app.state.segments.clone();
    app.apply(Action::Save).unwrap();
    let path = dir.path().join("allocview-event-9.json");
    let snap = allocview_agent::snapshot_file::load(&path).unwrap();
    let src = FileSource::new(&path.display().to_string(), &snap);
    let reopened = App::new(Box::new(src), dir.path().to_path_buf()).unwrap();
    assert_eq!(event(&reopened), 9);
    assert_eq!(reopened.state.segments, before);
}

#[test]
fn z_zooms_into_the_selected_segment_arrows_still_pick_blocks_and_esc_goes_back() {
    let (mut app, _d) = app(2);
    // Event 5: a 20 MiB segment with blocks, and a small one.
    app.apply(Action::Seek(Seek::To(5))).unwrap();
    app.apply(Action::ShowView(View::Segments)).unwrap();
    app.apply(Action::ToggleZoom).unwrap();
    assert!(app.ui.zoom);
    let order = app.state.segment_order(app.ui.segment_filter);
    let blocks = app.state.segments[order[app.ui.segment_row]].blocks.len();
    assert!(blocks >= 2, "{blocks} blocks");
    app.apply(Action::Right).unwrap();
    assert_eq!(app.ui.block, 1);
    app.apply(Action::Left).unwrap();
    assert_eq!(app.ui.block, 0);
    // A click on the picture selects the block drawn there. At 120x36 the list's inside
    // starts at (1, 3) and its bars after a 30-cell label: (31, 3) is the first slice's
    // first cell, where the first block starts.
    app.area = ratatui::layout::Rect::new(0, 0, 120, 36);
    app.ui.block = blocks - 1;
    app.apply(Action::Click { x: 5, y: 3 }).unwrap();
    assert_eq!(
        app.ui.block,
        blocks - 1,
        "a click on the label selects nothing"
    );
    app.apply(Action::Click { x: 31, y: 3 }).unwrap();
    assert_eq!(app.ui.block, 0);
    assert!(app.ui.zoom, "a click keeps the zoom");
    // Esc leaves the zoom first, then the detail pane as before.
    app.ui.detail = true;
    app.apply(Action::Back).unwrap();
    assert!(!app.ui.zoom);
    assert!(app.ui.detail);
    app.apply(Action::ToggleZoom).unwrap();
    app.apply(Action::ToggleZoom).unwrap();
    assert!(!app.ui.zoom, "z toggles back");
}

#[test]
fn p_and_s_switch_the_histograms_between_pools_and_streams() {
    use allocview::state::ui::HistogramGrouping;
    use allocview::view::histograms::groups;
    let (mut app, _d) = app(3);
    app.apply(Action::ShowView(View::Histograms)).unwrap();
    app.apply(Action::HistogramsBy(HistogramGrouping::Pool))
        .unwrap();
    assert_eq!(app.ui.histogram_by, HistogramGrouping::Pool);
    assert_eq!(
        groups(&app.state, app.ui.histogram_by),
        ["small pool", "large pool"]
    );
    // ◀ ▶ move among the pools only, wrapping.
    app.apply(Action::Right).unwrap();
    assert_eq!(app.ui.histogram_group, 1);
    app.apply(Action::Right).unwrap();
    assert_eq!(app.ui.histogram_group, 0);
    // A file's trace gives a group per stream too.
    app.apply(Action::HistogramsBy(HistogramGrouping::Stream))
        .unwrap();
    let streams = groups(&app.state, app.ui.histogram_by);
    assert!(!streams.is_empty() && streams.iter().all(|g| g.starts_with("stream ")));
    // The same key again goes back to every group.
    app.apply(Action::HistogramsBy(HistogramGrouping::Stream))
        .unwrap();
    assert_eq!(app.ui.histogram_by, HistogramGrouping::Every);
    assert!(groups(&app.state, app.ui.histogram_by).len() > streams.len() + 2);
}
