//! The app over a live source (a scripted one: each poll brings the next state): Enter where
//! it has nothing to open says so, a new OOM is announced once, and `s` on a process with a
//! host heap only says there is nothing to snapshot.

#[path = "support/builders.rs"]
mod support;

use allocview::app::{self, App};
use allocview::input::Action;
use allocview::state::{State, View};

#[test]
fn enter_in_the_live_oom_view_says_how_to_reach_the_ooms_event() {
    let (mut app, _) = support::live_app(vec![support::live_state_with_ooms(1)]);
    app.apply(Action::ShowView(View::Oom)).unwrap();
    app.apply(Action::Enter).unwrap();
    assert_eq!(app.state.status.as_deref(), Some(app::LIVE_OOM_EVENT));
    assert!(app::LIVE_OOM_EVENT.contains("allocview open"));
}

#[test]
fn enter_in_a_wide_segment_view_says_the_detail_is_already_shown() {
    let (mut app, _) = support::live_app(vec![support::live_state()]);
    app.apply(Action::ShowView(View::Segments)).unwrap();
    app.area = ratatui::layout::Rect::new(0, 0, 120, 36);
    app.apply(Action::Enter).unwrap();
    assert_eq!(app.state.status.as_deref(), Some(app::DETAIL_ALWAYS_SHOWN));
    // Narrow, Enter opens the pane (and says nothing).
    app.state.status = None;
    app.area = ratatui::layout::Rect::new(0, 0, 80, 24);
    app.apply(Action::Enter).unwrap();
    assert!(app.ui.detail);
    assert_eq!(app.state.status, None);
    // Where Enter opens nothing, it says so.
    app.apply(Action::ShowView(View::Pools)).unwrap();
    app.apply(Action::Enter).unwrap();
    let status = app.state.status.clone().unwrap();
    assert!(
        status.contains("Enter opens nothing in the Pools view"),
        "{status}"
    );
}

#[test]
fn a_new_live_oom_is_announced_once_with_its_request() {
    let (mut app, _) = support::live_app(vec![
        support::live_state_with_ooms(1),
        support::live_state_with_ooms(1),
        support::live_state_with_ooms(2),
        support::live_state_with_ooms(2),
    ]);
    // The OOM the process had when the dashboard opened is no news.
    assert_eq!(app.state.status, None);
    app.tick().unwrap();
    assert_eq!(app.state.status, None);
    app.tick().unwrap();
    assert_eq!(
        app.state.status.as_deref(),
        Some(
            "OOM #2: tried to allocate 2.00 GiB — press 7 · snapshot \
             allocview-dumps/oom-0001-pid4242.json"
        )
    );
    // The next poll, with no new OOM, says nothing again (the message stays until it expires).
    app.state.status = None;
    app.tick().unwrap();
    assert_eq!(app.state.status, None);
}

#[test]
fn saving_a_host_heap_only_process_says_there_is_no_device_to_snapshot() {
    let (mut app, saves) = support::live_app(vec![support::host_only_state(4)]);
    app.apply(Action::Save).unwrap();
    assert_eq!(app.state.status.as_deref(), Some(app::NO_DEVICE_TO_SAVE));
    assert_eq!(saves.get(), 0, "no empty snapshot written");
    // A process with a device saves.
    let (mut app, saves) = support::live_app(vec![support::live_state()]);
    app.apply(Action::Save).unwrap();
    assert_eq!(saves.get(), 1);
}

/// The live state whose recent events are allocations at times `from..from + n` µs (each at
/// its own address), as the agent's sliding window of recent events sends them.
fn with_trace(from: u64, n: u64) -> State {
    use allocview_alloc::snapshot::{TraceAction, TraceEntry};
    let mut s = support::live_state();
    let trace: Vec<TraceEntry> = (from..from + n)
        .map(|t| TraceEntry {
            time_us: Some(t as i64),
            ..TraceEntry::new(TraceAction::Alloc, 0x7f00_0000_0000 + t * 512, 512, 0)
        })
        .collect();
    s.trace = trace.into();
    s
}

/// The time of the trace entry on the selected row.
fn selected_time(app: &App) -> Option<i64> {
    let rows = app.state.trace_rows(&app.ui.trace_filter);
    let row = app.ui.trace_row?;
    app.state.trace[rows[row]].time_us
}

#[test]
fn a_selected_live_trace_row_stays_on_its_event_while_new_events_arrive() {
    let (mut app, _) = support::live_app(vec![
        with_trace(0, 100),
        with_trace(10, 100),
        with_trace(200, 100),
    ]);
    app.apply(Action::ShowView(View::Trace)).unwrap();
    // Five rows up from the newest (99): event 94.
    app.apply(Action::Move(-5)).unwrap();
    assert_eq!(selected_time(&app), Some(94));
    // Ten newer events pushed the window along: the row is still on event 94.
    app.tick().unwrap();
    assert_eq!(selected_time(&app), Some(94));
    assert_eq!(app.state.status, None);
    // The event left the window: the trace follows the newest again, and the user is told.
    app.tick().unwrap();
    assert_eq!(app.ui.trace_row, None);
    assert_eq!(app.state.status.as_deref(), Some(app::TRACE_ROW_LEFT));
}

#[test]
fn a_selected_live_trace_event_that_leaves_the_window_is_said_once_not_every_update() {
    // A busy process: every update pushes the window along by 50 events.
    let (mut app, _) = support::live_app((0..6).map(|i| with_trace(i * 50, 100)).collect());
    app.apply(Action::ShowView(View::Trace)).unwrap();
    app.apply(Action::Move(-5)).unwrap();
    assert_eq!(selected_time(&app), Some(94));
    app.tick().unwrap();
    assert_eq!(selected_time(&app), Some(94));
    app.tick().unwrap();
    assert_eq!(app.state.status.as_deref(), Some(app::TRACE_ROW_LEFT));
    // Following the newest: nothing more leaves the selection, nothing is said again.
    for _ in 0..3 {
        app.state.status = None;
        app.tick().unwrap();
        assert_eq!(app.state.status, None);
        assert_eq!(app.ui.trace_row, None);
    }
}

#[test]
fn an_oom_announced_in_the_tick_the_selected_trace_event_leaves_is_not_hidden() {
    let mut first = with_trace(0, 100);
    first.ooms = support::live_state_with_ooms(1).ooms;
    first.ooms_total = 1;
    let mut second = with_trace(200, 100);
    second.ooms = support::live_state_with_ooms(2).ooms;
    second.ooms_total = 2;
    let (mut app, _) = support::live_app(vec![first, second]);
    app.apply(Action::ShowView(View::Trace)).unwrap();
    app.apply(Action::Move(-5)).unwrap();
    app.tick().unwrap();
    let status = app.state.status.clone().unwrap_or_default();
    assert!(status.starts_with("OOM #2: tried to allocate"), "{status}");
    assert_eq!(app.ui.trace_row, None, "the trace follows the newest");
}

#[test]
fn the_first_oom_dump_of_a_restarted_process_is_announced() {
    // The old process had 3 OOMs; the one reached after a reconnect has none yet.
    let mut fresh = support::live_state_with_ooms(0);
    fresh.source.pid = Some(9999);
    let mut pending = support::live_state_with_ooms(1);
    pending.source.pid = Some(9999);
    pending.ooms[0].dump_pending = true;
    pending.ooms[0].dump_path = None;
    let mut landed = support::live_state_with_ooms(1);
    landed.source.pid = Some(9999);
    landed.ooms[0].dump_path = Some("/srv/run/allocview-dumps/oom-0001-pid9999.pickle".into());
    let (mut app, _) = support::live_app(vec![
        support::live_state_with_ooms(3),
        fresh,
        pending,
        landed,
    ]);
    app.tick().unwrap();
    app.tick().unwrap();
    assert_eq!(
        app.state.status.as_deref(),
        Some("OOM #1: tried to allocate 1.00 GiB — press 7")
    );
    app.tick().unwrap();
    assert_eq!(
        app.state.status.as_deref(),
        Some(
            "OOM #1's snapshot: /srv/run/allocview-dumps/oom-0001-pid9999.pickle (allocview \
             open /srv/run/allocview-dumps/oom-0001-pid9999.pickle; 7 shows the OOM)"
        )
    );
}

#[test]
fn the_ooms_a_restarted_process_had_before_the_reconnect_are_not_news() {
    // A restarted service (another pid) that had 2 OOMs of its own when the dashboard reached
    // it: they are on the OOM tab; its next one is announced, and its dump.
    let mut other = support::live_state_with_ooms(2);
    other.source.pid = Some(9999);
    let mut pending = support::live_state_with_ooms(3);
    pending.source.pid = Some(9999);
    pending.ooms[2].dump_pending = true;
    pending.ooms[2].dump_path = None;
    let mut landed = support::live_state_with_ooms(3);
    landed.source.pid = Some(9999);
    landed.ooms[2].dump_path = Some("/d/oom-0003-pid9999.pickle".into());
    let (mut app, _) = support::live_app(vec![
        support::live_state_with_ooms(1),
        other,
        pending,
        landed,
    ]);
    app.tick().unwrap();
    assert_eq!(app.state.status, None);
    app.tick().unwrap();
    assert_eq!(
        app.state.status.as_deref(),
        Some("OOM #3: tried to allocate 3.00 GiB — press 7")
    );
    app.tick().unwrap();
    let status = app.state.status.clone().unwrap_or_default();
    assert!(
        status.starts_with("OOM #3's snapshot: /d/oom-0003-pid9999.pickle"),
        "{status}"
    );
}

#[test]
fn the_last_live_trace_row_follows_the_newest_event() {
    let (mut app, _) = support::live_app(vec![with_trace(0, 100), with_trace(10, 100)]);
    app.apply(Action::ShowView(View::Trace)).unwrap();
    app.apply(Action::Move(-5)).unwrap();
    app.apply(Action::Bottom).unwrap();
    assert_eq!(app.ui.trace_row, None, "End follows the newest");
    app.tick().unwrap();
    let rows = app.state.trace_rows(&app.ui.trace_filter);
    let row = app.state.default_trace_row(&rows);
    assert_eq!(app.state.trace[rows[row]].time_us, Some(109));
}

#[test]
fn the_selected_live_segment_and_block_stay_selected_when_a_bigger_segment_arrives() {
    let (mut app, _) = support::live_app(support::live_states_then_a_bigger_segment());
    app.apply(Action::ShowView(View::Segments)).unwrap();
    // The largest segment (200 MiB at 0x7f3a2c000000), its third block.
    app.apply(Action::Right).unwrap();
    app.apply(Action::Right).unwrap();
    let selected = |app: &App| {
        let seg = &app.state.segments[app.state.selected_segment(&app.ui).unwrap()];
        (seg.address, seg.blocks[app.ui.block].address)
    };
    let before = selected(&app);
    assert_eq!(before.0, 0x7f3a_2c00_0000);
    app.tick().unwrap();
    assert_eq!(app.ui.segment_row, 1);
    assert_eq!(selected(&app), before);
}

#[test]
fn after_a_slow_draw_the_next_ones_wait_so_a_slow_terminal_does_not_hold_the_loop_up() {
    use std::time::{Duration, Instant};
    let (mut app, _) = support::live_app(vec![support::live_state()]);
    let mut term = ratatui::Terminal::new(ratatui::backend::TestBackend::new(80, 24)).unwrap();
    let t0 = Instant::now();
    // A draw that took 400 ms: none for the next 800 ms.
    app.note_draw(Duration::from_millis(400), t0);
    assert!(!app.draw_due(t0 + Duration::from_millis(700)));
    assert!(app.draw_due(t0 + Duration::from_millis(800)));
    // The wait has a ceiling.
    app.note_draw(Duration::from_secs(60), t0);
    assert!(!app.draw_due(t0 + app::MAX_DRAW_WAIT - Duration::from_millis(1)));
    assert!(app.draw_due(t0 + app::MAX_DRAW_WAIT));
    // Waiting, the screen stays dirty for a later draw.
    app.note_draw(Duration::from_secs(60), Instant::now());
    app.dirty = true;
    app.draw(&mut term).unwrap();
    assert!(app.dirty);
    // A quick draw lifts the wait.
    app.note_draw(Duration::from_millis(1), Instant::now());
    app.draw(&mut term).unwrap();
    assert!(!app.dirty);
}

#[test]
fn a_live_ooms_snapshot_written_after_it_is_announced_with_its_path() {
    let mut pending = support::live_state_with_ooms(2);
    pending.ooms[1].dump_pending = true;
    pending.ooms[1].dump_path = None;
    let mut landed = support::live_state_with_ooms(2);
    landed.ooms[1].dump_path = Some("/srv/run/allocview-dumps/oom-0002-pid7.pickle".into());
    let (mut app, _) = support::live_app(vec![
        support::live_state_with_ooms(1),
        pending,
        landed.clone(),
        landed,
    ]);
    app.tick().unwrap();
    assert_eq!(
        app.state.status.as_deref(),
        Some("OOM #2: tried to allocate 2.00 GiB — press 7")
    );
    app.tick().unwrap();
    assert_eq!(
        app.state.status.as_deref(),
        Some(
            "OOM #2's snapshot: /srv/run/allocview-dumps/oom-0002-pid7.pickle (allocview open \
             /srv/run/allocview-dumps/oom-0002-pid7.pickle; 7 shows the OOM)"
        )
    );
    // Said once.
    app.state.status = None;
    app.tick().unwrap();
    assert_eq!(app.state.status, None);
}

#[test]
fn a_time_travel_key_pressed_live_says_where_it_works_instead_of_doing_nothing() {
    use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    let (mut app, _) = support::live_app(vec![support::live_state()]);
    for c in ['[', ']', ',', '.', '<', '>', 'g'] {
        let press = KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE);
        let action = allocview::input::key(press, &app.ui, false);
        assert_eq!(action, Some(Action::FileOnly(c)), "{c}");
        app.state.status = None;
        app.apply(action.unwrap()).unwrap();
        let status = app.state.status.clone().unwrap_or_default();
        assert!(
            status.starts_with(&format!("`{c}` steps through a snapshot file's trace"))
                && status.contains("allocview open FILE"),
            "{status}"
        );
        // Space pauses on every view (`p` groups the histograms).
        assert!(
            status.contains("Space pauses") && !status.contains(" p pauses"),
            "{status}"
        );
    }
    // In a file they step through the trace.
    let press = KeyEvent::new(KeyCode::Char('['), KeyModifiers::NONE);
    assert!(matches!(
        allocview::input::key(press, &app.ui, true),
        Some(Action::Seek(_))
    ));
}

#[test]
fn a_process_restarted_with_the_same_pid_is_told_by_its_start_time() {
    // A container restart keeps pid 1. The new process had 3 OOMs when the dashboard
    // reconnected, one more than the old one: not news (they were before the reconnect); its
    // next one is.
    let old = |n| {
        let mut s = support::live_state_with_ooms(n);
        s.source.pid = Some(1);
        s.source.started_ns = Some(1_000);
        s
    };
    let new = |n| {
        let mut s = old(n);
        s.source.started_ns = Some(2_000);
        s
    };
    let (mut app, _) = support::live_app(vec![old(2), new(3), new(4)]);
    app.state.status = None;
    app.tick().unwrap();
    assert_eq!(
        app.state.status, None,
        "the new process's earlier OOMs are not news"
    );
    app.tick().unwrap();
    let status = app.state.status.clone().unwrap_or_default();
    assert!(status.starts_with("OOM #4"), "{status}");
}
