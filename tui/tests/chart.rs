//! The overview's usage-over-time chart through the public interface: a long live run goes
//! through the agent's round-robin tiers (1 s, 10 s, 1 min windows, each keeping its maximum)
//! and the dashboard's adapter, a file through its time travel; the chart is drawn into a
//! `TestBackend` and read back as text (no colours, so each series has its own symbol:
//! allocated `•`, the file cursor `¦`).

#[allow(dead_code)] // The render-every-way pass is for the render tests.
#[path = "support/screen.rs"]
mod screen;
#[path = "support/builders.rs"]
mod support;

use allocview::app::App;
use allocview::input::{Action, Seek, key};
use allocview::state::from_agent::{AgentAdapter, LiveInfo};
use allocview::state::ui::ChartSpan;
use allocview::state::{State, UiState, View};
use allocview_agent::state::{AgentState, DeviceState, UsageSample};
use allocview_agent::timeline::Timeline as AgentTimeline;
use allocview_alloc::snapshot::Snapshot;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use screen::screen;
use support::GIB;

const NS_PER_S: u64 = 1_000_000_000;
/// The synthetic run's length: two hours, read once a second.
const RUN_S: u64 = 2 * 3600;
/// When the one spike happens: 30 minutes before the end, long gone from the agent's 1 s tier
/// (it keeps 10 minutes), so only the 10 s and 1 min windows hold it.
const SPIKE_S: u64 = RUN_S - 1800;
/// Chart size.
const W: u16 = 120;
const H: u16 = 36;

/// Allocated (and active) at second `i`: 2 GiB, 6 GiB one second in four, 16 GiB at the spike.
fn allocated_at(i: u64) -> u64 {
    match i {
        SPIKE_S => 16 * GIB,
        i if i % 4 == 0 => 6 * GIB,
        _ => 2 * GIB,
    }
}

/// A two-hour live run as the dashboard sees it: read into the agent's tiered timeline, sent
/// as its samples (coarse windows, then the last 10 minutes second by second) and mapped by
/// the adapter.
fn long_run() -> State {
    let t0 = 1_000 * NS_PER_S;
    let mut tl = AgentTimeline::default();
    for i in 0..=RUN_S {
        let v = allocated_at(i);
        tl.record(UsageSample {
            time_ns: t0 + i * NS_PER_S,
            allocated: v,
            reserved: v.max(14 * GIB),
            active: v,
        });
    }
    let samples = tl.samples();
    assert!(
        samples
            .windows(2)
            .any(|w| w[1].time_ns - w[0].time_ns == 10 * NS_PER_S)
            && samples
                .windows(2)
                .any(|w| w[1].time_ns - w[0].time_ns == NS_PER_S),
        "the run mixes tiers"
    );
    let spike = samples
        .iter()
        .position(|s| s.allocated == 16 * GIB)
        .expect("the spike is kept");
    assert_eq!(
        samples[spike + 1].time_ns - samples[spike].time_ns,
        10 * NS_PER_S,
        "only a 10 s window holds the spike"
    );
    let mut a = AgentState::default();
    a.process.started_ns = t0;
    a.time_ns = t0 + RUN_S * NS_PER_S;
    a.devices.push(DeviceState {
        timeline: samples,
        ..DeviceState::default()
    });
    AgentAdapter::new().state(&a, 0, &LiveInfo::default())
}

fn ui(span: Option<ChartSpan>) -> UiState {
    UiState {
        view: View::Overview,
        chart_span: span,
        no_color: true,
        ..UiState::default()
    }
}

/// The chart as drawn on a whole screen.
struct Chart {
    /// The title row.
    title: String,
    /// The plot's rows, top first, from the first column right of the y axis.
    plot: Vec<Vec<char>>,
    /// The x axis labels row.
    labels: String,
    /// The y axis's top label.
    top_label: String,
}

impl Chart {
    fn of(state: &State, ui: &UiState) -> Chart {
        let t = screen(state, ui, W, H);
        let text = format!("{}", t.backend());
        let rows: Vec<String> = text
            .lines()
            .map(|l| l.trim_matches('"').to_string())
            .collect();
        let top = rows
            .iter()
            .position(|r| r.contains("Over time"))
            .expect("a chart");
        let axis = top
            + rows[top..]
                .iter()
                .position(|r| r.contains('└') && r.contains("──"))
                .expect("an x axis");
        // The y axis is the `│` after the labels (the second on each row).
        let y_axis = |r: &str| {
            r.char_indices()
                .filter(|&(_, c)| c == '│')
                .nth(1)
                .map(|(i, _)| i)
        };
        let plot = rows[top + 1..axis]
            .iter()
            .map(|r| {
                let at = y_axis(r).expect("a y axis");
                let mut cells: Vec<char> = r[at..].chars().skip(1).collect();
                cells.pop(); // The box's right border.
                cells
            })
            .collect();
        let top_label = rows[top + 1]
            .trim_start_matches('│')
            .split('│')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        Chart {
            title: rows[top].clone(),
            plot,
            labels: rows[axis + 1].trim_matches('│').to_string(),
            top_label,
        }
    }

    fn width(&self) -> usize {
        self.plot[0].len()
    }

    /// The rows holding `c`, top first, with the columns where it is.
    fn where_is(&self, c: char) -> Vec<(usize, Vec<usize>)> {
        self.plot
            .iter()
            .enumerate()
            .filter_map(|(y, row)| {
                let xs: Vec<usize> = (0..row.len()).filter(|&x| row[x] == c).collect();
                (!xs.is_empty()).then_some((y, xs))
            })
            .collect()
    }

    /// The x axis labels, left to right.
    fn label_words(&self) -> Vec<String> {
        self.labels
            .split("  ")
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    }
}

/// The allocated line's top row and the columns there (relative to the plot's width).
fn allocated_peak(chart: &Chart) -> (usize, Vec<f64>) {
    let rows = chart.where_is('•');
    let (y, xs) = rows.first().expect("an allocated line").clone();
    let w = chart.width() as f64;
    (y, xs.iter().map(|&x| x as f64 / w).collect())
}

#[test]
fn a_peak_only_a_coarse_tier_holds_shows_where_it_happened() {
    let state = long_run();
    for (span, at) in [
        // Whole run: 1h 30m into 2 h.
        (ChartSpan::Whole, 0.75),
        // Last hour: 30 minutes ago, mid-chart.
        (ChartSpan::Hour, 0.5),
    ] {
        let chart = Chart::of(&state, &ui(Some(span)));
        let (y, xs) = allocated_peak(&chart);
        assert!(y <= 1, "{span:?}: the spike sets the scale: row {y}");
        assert!(
            xs.iter().all(|x| (x - at).abs() < 0.02),
            "{span:?}: the spike at {at} of the width, drawn at {xs:?}"
        );
        assert!(chart.top_label.contains("16.8 GiB"), "{}", chart.top_label);
    }
}

#[test]
fn coarse_and_fine_samples_draw_the_same_line() {
    // Every column of the whole run covers half a minute: each holds a 6 GiB second, in the
    // coarse windows and in the last 10 minutes' 1 s samples alike, so allocated is one flat
    // line at 6 GiB (the spike aside) from the first column to the last.
    let state = long_run();
    let chart = Chart::of(&state, &ui(Some(ChartSpan::Whole)));
    let rows = chart.where_is('•');
    let (flat, xs) = rows
        .iter()
        .max_by_key(|(_, xs)| xs.len())
        .expect("an allocated line");
    assert!(
        xs.len() + 2 >= chart.width(),
        "flat across the width: {} of {}",
        xs.len(),
        chart.width()
    );
    // Nothing below the line: the 2 GiB seconds never make a column's maximum.
    assert!(
        rows.iter().all(|(y, _)| y <= flat),
        "allocated dips below its flat line: rows {:?}",
        rows.iter().map(|(y, xs)| (y, xs.len())).collect::<Vec<_>>()
    );
}

#[test]
fn switching_span_changes_the_axis_labels_and_the_data_shown() {
    let state = long_run();
    let mut ui = ui(None);
    // Live, the chart starts on the last 10 minutes.
    let chart = Chart::of(&state, &ui);
    assert!(
        chart.title.contains("Over time (last 10 min)"),
        "{}",
        chart.title
    );
    assert_eq!(chart.label_words(), ["-10m", "-5m", "now"]);
    let t = KeyEvent::new(KeyCode::Char('t'), KeyModifiers::NONE);
    let mut seen = Vec::new();
    for _ in 0..4 {
        assert_eq!(key(t, &ui, false), Some(Action::CycleChartSpan));
        ui.cycle_chart_span(false);
        let chart = Chart::of(&state, &ui);
        seen.push((chart.title.clone(), chart.label_words(), chart.top_label));
    }
    let titles: Vec<bool> = ["last 1 min", "whole run", "last 1 h", "last 10 min"]
        .iter()
        .zip(&seen)
        .map(|(want, (title, _, _))| title.contains(&format!("({want})")))
        .collect();
    assert_eq!(titles, [true; 4], "{seen:?}");
    let labels: Vec<&Vec<String>> = seen.iter().map(|(_, l, _)| l).collect();
    assert_eq!(labels[0], &["-1m", "-30s", "now"]);
    assert_eq!(labels[1], &["-2h", "-1h", "now"]);
    assert_eq!(labels[2], &["-1h", "-30m", "now"]);
    // The spike sets the scale only where it is in view; the last minutes' scale is the
    // reserved 14 GiB.
    let tops: Vec<&str> = seen.iter().map(|(_, _, t)| t.as_str()).collect();
    assert_eq!(tops, ["14.7 GiB", "16.8 GiB", "16.8 GiB", "14.7 GiB"]);
}

#[test]
fn the_last_minute_shows_each_second() {
    // One second in four at 6 GiB: the last minute, both ends included (the newest sample is
    // at the right edge), has 16 of them, each its own bump.
    let state = long_run();
    let chart = Chart::of(&state, &ui(Some(ChartSpan::Minute)));
    let (y, _) = allocated_peak(&chart);
    let row = &chart.plot[y];
    let bumps = row
        .iter()
        .zip(row.iter().skip(1))
        .filter(|&(a, b)| *a != '•' && *b == '•')
        .count()
        + usize::from(row[0] == '•');
    assert_eq!(bumps, 16, "{}", row.iter().collect::<String>());
}

/// A trace of `rounds` rounds, one event a second (`timed`), else without times.
fn slow_trace(rounds: u64, timed: bool) -> Snapshot {
    let mut snap = support::traced_snapshot(rounds);
    let t0 = snap.device_traces[0][0].time_us.unwrap_or(0);
    for (i, e) in snap.device_traces[0].iter_mut().enumerate() {
        e.time_us = timed.then_some(t0 + i as i64 * 1_000_000);
    }
    snap
}

fn file_app(snap: &Snapshot) -> (App, tempfile::TempDir) {
    let (mut app, dir) = support::file_app("/tmp/run.json", snap);
    app.ui.no_color = true;
    (app, dir)
}

#[test]
fn in_a_file_the_span_keeps_the_cursor_in_view_and_labels_count_from_the_first_event() {
    // 40 rounds of 19 events, one a second: 12m 39s.
    let (mut app, _d) = file_app(&slow_trace(40, true));
    let cursor = |c: &Chart| {
        let at = c.where_is('¦');
        assert!(!at.is_empty(), "the cursor is drawn: {}", c.labels);
        at[0].1[0] as f64 / c.width() as f64
    };
    // A file starts on its whole trace, at its last event.
    let chart = Chart::of(&app.state, &app.ui);
    assert!(chart.title.contains("(whole trace)"), "{}", chart.title);
    assert_eq!(chart.label_words(), ["0s", "6m 20s", "12m 39s"]);
    assert!(cursor(&chart) > 0.98);
    // `t`: 1 hour is more than the trace: all of it still.
    app.apply(Action::CycleChartSpan).unwrap();
    let chart = Chart::of(&app.state, &app.ui);
    assert!(
        chart.title.contains("(whole trace: 12m 39s)"),
        "{}",
        chart.title
    );
    assert_eq!(chart.label_words(), ["0s", "6m 20s", "12m 39s"]);
    // 10 minutes, ending at the last event where the cursor is.
    app.apply(Action::CycleChartSpan).unwrap();
    let chart = Chart::of(&app.state, &app.ui);
    assert_eq!(chart.label_words(), ["2m 39s", "7m 39s", "12m 39s"]);
    assert!(cursor(&chart) > 0.98);
    // 1 minute around the cursor wherever it goes.
    app.apply(Action::CycleChartSpan).unwrap();
    app.apply(Action::Seek(Seek::First)).unwrap();
    let chart = Chart::of(&app.state, &app.ui);
    assert!(
        chart.title.contains("(1 min around the cursor)"),
        "{}",
        chart.title
    );
    assert_eq!(chart.label_words(), ["0s", "30s", "1m"]);
    assert!(cursor(&chart) < 0.02);
    // Event 400 is the trace's 400th entry, at 6m 39s.
    app.apply(Action::Seek(Seek::By(400))).unwrap();
    let chart = Chart::of(&app.state, &app.ui);
    assert_eq!(chart.label_words(), ["6m 09s", "6m 39s", "7m 09s"]);
    assert!((cursor(&chart) - 0.5).abs() < 0.02);
    // And round to the whole trace.
    app.apply(Action::CycleChartSpan).unwrap();
    let chart = Chart::of(&app.state, &app.ui);
    assert_eq!(chart.label_words(), ["0s", "6m 20s", "12m 39s"]);
}

#[test]
fn a_trace_without_times_keeps_event_numbers_and_spans_events() {
    let (mut app, _d) = file_app(&slow_trace(40, false));
    let chart = Chart::of(&app.state, &app.ui);
    assert_eq!(chart.label_words(), ["0", "380", "760"]);
    app.ui.chart_span = Some(ChartSpan::Minute);
    app.apply(Action::Seek(Seek::By(-300))).unwrap();
    let chart = Chart::of(&app.state, &app.ui);
    assert!(
        chart.title.contains("(100 events around the cursor)"),
        "{}",
        chart.title
    );
    assert_eq!(chart.label_words(), ["410", "460", "510"]);
}

#[test]
fn long_run_last_hour_screen() {
    let t = screen(&long_run(), &ui(Some(ChartSpan::Hour)), W, H);
    insta::assert_snapshot!(t.backend());
}

#[test]
fn file_one_minute_around_the_cursor_screen() {
    let (mut app, _d) = file_app(&slow_trace(40, true));
    app.ui.chart_span = Some(ChartSpan::Minute);
    app.apply(Action::Seek(Seek::To(300))).unwrap();
    let t = screen(&app.state, &app.ui, W, H);
    insta::assert_snapshot!(t.backend());
}
