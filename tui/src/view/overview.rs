//! View 1, Overview: allocated / active / reserved gauges with peaks, the limit, the
//! fragmentation figures, the counters (allocations, device mallocs and frees, retries, OOMs,
//! syncs, dropped events), and usage over time as a braille chart with OOMs marked in red.
//!
//! When the process's global allocator publishes its host heap, a "Host heap" box shows bytes
//! in use against their peak, allocations, frees and the total allocated. A process with no
//! device data (a Rust service whose only instrumented allocator is the host heap) gets the
//! host box in place of the device panels, and the host heap over time as its chart when there
//! are samples for it. A snapshot file without a trace has nothing over time: its chart box
//! says why.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType, Widget};

use allocview_alloc::caching::stats::{Stat, StatType};

use super::trace::{NO_TRACE, RECORD_HISTORY};
use super::{put, right, theme};
use crate::state::{HostHeap, Sample, State, Timeline, UiState};
use crate::units;

/// Width of the counters panel.
pub const COUNTERS_WIDTH: u16 = 28;
/// Below this width the counters panel is dropped (the gauges keep their numbers).
pub const MIN_WIDTH_WITH_COUNTERS: u16 = 80;
/// Rows of the top panels (7 rows of figures and the borders).
pub const TOP_ROWS: u16 = 9;
/// Width of a gauge's label column.
const LABEL: usize = 11;
/// Width of a figure column (`12.1 GiB`).
const FIGURE: usize = 9;
/// Rows of the host heap box (3 rows of figures and the borders).
pub const HOST_ROWS: u16 = 5;
/// Rows the usage chart needs to show anything: its borders, the x axis and its labels, and
/// two rows of dots.
pub const MIN_CHART_ROWS: u16 = 6;
/// Rows the overview needs: the device panels and a chart (a host heap box beside a device
/// takes its rows from the chart).
pub const MIN_ROWS: u16 = TOP_ROWS + MIN_CHART_ROWS;

fn gauge(label: &str, stat: &Stat, scale: u64, width: usize, color: Color) -> Line<'static> {
    let value = stat.current.max(0) as u64;
    let peak = stat.peak.max(0) as u64;
    let tail = format!(
        " {}  peak {}",
        right(&units::bytes(value), FIGURE),
        right(&units::bytes(peak), FIGURE)
    );
    let bar = width.saturating_sub(LABEL + tail.len() + 1);
    let filled = if scale == 0 {
        0
    } else {
        ((value as f64 / scale as f64) * bar as f64).round() as usize
    }
    .min(bar);
    Line::from(vec![
        Span::raw(format!(" {:<w$}", label, w = LABEL - 1)),
        Span::styled(
            theme::ALLOCATED_GLYPH.repeat(filled),
            Style::new().fg(color),
        ),
        Span::styled(
            theme::FREE_GLYPH.repeat(bar - filled),
            Style::new().fg(theme::FREE),
        ),
        Span::raw(tail),
    ])
}

/// The scale of the gauges: device memory when known, else the peak reserved.
pub fn gauge_scale(state: &State) -> u64 {
    let reserved = state.stats.reserved_bytes.get(StatType::All);
    state
        .source
        .total_memory
        .unwrap_or_else(|| reserved.peak.max(reserved.current).max(0) as u64)
}

fn memory_lines(state: &State, width: usize) -> Vec<Line<'static>> {
    let st = &state.stats;
    let scale = gauge_scale(state);
    let mut lines = vec![
        gauge(
            "allocated",
            st.allocated_bytes.get(StatType::All),
            scale,
            width,
            theme::ALLOCATED,
        ),
        gauge(
            "active",
            st.active_bytes.get(StatType::All),
            scale,
            width,
            theme::ACTIVE,
        ),
        gauge(
            "reserved",
            st.reserved_bytes.get(StatType::All),
            scale,
            width,
            theme::RESERVED,
        ),
    ];
    // Each text line in words where it fits, else in short (the side panel beside it leaves
    // 50 columns at 80).
    let fit = |long: String, short: String| {
        Line::raw(if long.chars().count() <= width {
            long
        } else {
            short
        })
    };
    let src = &state.source;
    let limit = match src.total_memory {
        Some(total) => {
            let fraction = src.memory_fraction.unwrap_or(1.0);
            let limit = units::bytes((total as f64 * fraction) as u64);
            let free = src.device_free.map(units::bytes);
            let (long_free, short_free) =
                free.as_ref().map_or((String::new(), String::new()), |f| {
                    (format!("   device free {f}"), format!(" · device free {f}"))
                });
            // Short, a fraction of the device is said in words where one is set (a bare
            // `×1.00` read as a figure without a name); the whole device needs no word.
            let short = if fraction < 1.0 {
                let free = free.map(|f| format!(" · free {f}")).unwrap_or_default();
                format!(" limit {limit} (fraction {fraction:.2}){free}")
            } else {
                format!(" limit {limit}{short_free}")
            };
            fit(
                format!(" limit     {limit} (fraction {fraction:.2}){long_free}"),
                short,
            )
        }
        None => Line::raw(" limit     device size not recorded"),
    };
    lines.push(limit);
    let f = state.fragmentation();
    let reserved = st.reserved_bytes.get(StatType::All).current.max(0) as u64;
    let (cached, share) = (
        units::bytes(f.cached_free),
        units::percent(f.cached_free, reserved),
    );
    lines.push(fit(
        format!(" fragmentation: {cached} cached but unallocated ({share}),"),
        format!(" fragmentation: {cached} cached unused ({share})"),
    ));
    let (largest, stranded) = (units::bytes(f.largest_free), units::bytes(f.stranded));
    lines.push(fit(
        format!("   largest free block {largest}, {stranded} stranded in split segments"),
        format!("   largest free block {largest}, {stranded} stranded"),
    ));
    lines
}

/// What a counter shows where its figure is not known (a file records no retries or syncs, and
/// without a trace no counts at all).
const NOT_KNOWN: &str = "not known";

/// The counters: label, figure (`None`: not known) and whether a figure above zero is an alert.
fn counters(state: &State) -> [(&'static str, Option<u64>, bool); 7] {
    let st = &state.stats;
    let file = state.is_file();
    // A file's counts come from its trace (none without one); it never records retries or
    // syncs, and nothing was dropped on the way: the last row counts its trace entries.
    let from_trace = |n: i64| (!file || !state.trace.is_empty()).then_some(n.max(0) as u64);
    let live = |n: i64| (!file).then_some(n.max(0) as u64);
    let ooms = match from_trace(st.num_ooms) {
        None if !state.ooms.is_empty() => Some(state.ooms.len() as u64),
        n => n,
    };
    let last = if file {
        ("trace entries", Some(state.trace.len() as u64), false)
    } else {
        ("dropped events", Some(state.source.dropped), true)
    };
    [
        (
            "allocations",
            from_trace(st.allocation.get(StatType::All).allocated),
            false,
        ),
        ("device mallocs", from_trace(st.num_device_alloc), false),
        ("device frees", from_trace(st.num_device_free), false),
        ("retries", live(st.num_alloc_retries), false),
        ("OOMs", ooms, true),
        ("stream syncs", live(st.num_sync_all_streams), false),
        last,
    ]
}

/// The counters that stay where the counters panel does not fit (below
/// [`MIN_WIDTH_WITH_COUNTERS`]): on one line in the memory panel.
const KEPT_COUNTERS: [&str; 3] = ["OOMs", "retries", "dropped events"];

/// [`KEPT_COUNTERS`] on one line: ` OOMs 2 · retries 5 · dropped events 0`.
fn kept_counters_line(state: &State) -> Line<'static> {
    let all = counters(state);
    let mut spans = vec![Span::raw(" ")];
    for &(label, n, alert) in KEPT_COUNTERS
        .iter()
        .filter_map(|k| all.iter().find(|(label, _, _)| label == k))
    {
        if spans.len() > 1 {
            spans.push(Span::styled(" · ", theme::dim()));
        }
        spans.push(Span::raw(format!("{label} ")));
        spans.push(match n {
            Some(n) => Span::styled(units::count(n), theme::alert_if(alert && n > 0)),
            None => Span::styled(NOT_KNOWN, theme::dim()),
        });
    }
    Line::from(spans)
}

fn counter_lines(state: &State, width: usize) -> Vec<Line<'static>> {
    counters(state)
        .iter()
        .map(|&(label, n, alert)| {
            let value = n.map_or_else(|| NOT_KNOWN.to_string(), units::count);
            let pad = width.saturating_sub(label.len() + value.len() + 2);
            let style = match n {
                Some(n) => theme::alert_if(alert && n > 0),
                None => theme::dim(),
            };
            Line::from(vec![
                Span::raw(format!(" {label}{}", " ".repeat(pad))),
                Span::styled(value, style),
            ])
        })
        .collect()
}

/// Braille dots per cell across: the chart is cut into one column per dot it can draw, so each
/// dot column shows the maximum over its time.
const COLUMNS_PER_CELL: usize = 2;
/// Below this box width the x axis gets its two end labels only, not the middle one.
const MIN_WIDTH_FOR_MIDDLE_LABEL: u16 = 40;
/// The label of `x` on the usage chart's axis: event numbers where x counts events; live,
/// how long before the newest sample's end (`-10m`, `now`); in a file, the time since its
/// first event (`5m 12s`).
fn x_label(t: &Timeline, x: f64, file: bool) -> String {
    if t.x_is_events {
        units::count(x.max(0.0).round() as u64)
    } else if file {
        units::axis_time(x)
    } else {
        let before = t.end - x;
        // Within half a tenth of a second of the end is the present.
        if before < 0.05 {
            "now".to_string()
        } else {
            format!("-{}", units::axis_time(before))
        }
    }
}

/// Draws the usage chart into `area` (with its border); for a file without a trace, why there
/// is none. The chart spans `ui`'s [`chart span`](UiState::chart_span) (named in the title)
/// and draws [`Timeline::columns`]: each braille dot column the maximum over the time it
/// covers, whatever the samples' resolution, placed by time.
pub fn render_chart(area: Rect, buf: &mut Buffer, state: &State, ui: &UiState) {
    let no_color = ui.no_color;
    let t = &state.timeline;
    let file = state.is_file();
    let span = ui.chart_span(file);
    let key = |s: Series| {
        let glyph = match series_marker(s, no_color) {
            Marker::Custom(c) => c.to_string(),
            _ if s == Series::Oom => "│".to_string(),
            _ => "──".to_string(),
        };
        Span::styled(format!("{glyph} {} ", s.name()), Style::new().fg(s.color()))
    };
    // A span longer than the data shows all of it: the title says how much that is.
    let (x0, x1) = t.x_range();
    let short_label = span.label(t.x_is_events, file);
    let mut label = short_label.clone();
    if !t.samples.is_empty() && span.width(t.x_is_events).is_some_and(|w| w >= x1 - x0) {
        let all = if t.x_is_events {
            format!("{} events", units::count((x1 - x0).max(0.0) as u64))
        } else {
            units::axis_time(x1 - x0)
        };
        label = if file {
            format!("whole trace: {all}")
        } else {
            format!("{label}: all {all} so far")
        };
    }
    let (lo, hi) = t.window(span.width(t.x_is_events));
    let in_view = |x: &f64| (lo..=hi).contains(x);
    let mut keys = vec![
        key(Series::Reserved),
        key(Series::Allocated),
        key(Series::Active),
    ];
    if t.ooms.iter().any(in_view) {
        keys.push(key(Series::Oom));
    }
    // The legend whole (it says what the colours and the OOM mark are): where the title does
    // not fit inside the borders, the span's label loses its `all ... so far`, then goes.
    let titled = |label: Option<&str>| {
        let mut spans = vec![Span::styled(" Over time ", theme::title())];
        if let Some(label) = label {
            spans.push(Span::styled(format!("({label}) "), theme::dim()));
        }
        spans.extend(keys.iter().cloned());
        Line::from(spans)
    };
    let room = area.width.saturating_sub(2) as usize;
    let title = [Some(label.as_str()), Some(short_label.as_str())]
        .into_iter()
        .map(titled)
        .find(|l| l.width() <= room)
        .unwrap_or_else(|| titled(None));
    let block = Block::bordered().title(title);
    if area.height < 3 || area.width < 10 {
        block.render(area, buf);
        return;
    }
    if file && state.trace.is_empty() {
        // A snapshot without a trace has one point in time: nothing to draw over time.
        let inner = block.inner(area);
        block.render(area, buf);
        let text = format!(
            "{NO_TRACE} in this file: usage over time needs a snapshot taken while \
             {RECORD_HISTORY} is on"
        );
        super::put_wrapped(buf, inner, 0, &text, theme::dim());
        return;
    }
    // The scale: the maximum over the whole window (one column).
    let Some(top) = t.columns(lo, hi, 1)[0] else {
        let inner = block.inner(area);
        block.render(area, buf);
        put(
            buf,
            inner,
            0,
            &Line::styled(" no samples yet", theme::dim()),
        );
        return;
    };
    let max_y = (top.max_y().max(1) as f64) * 1.05;
    let labels: Vec<String> = if area.width >= MIN_WIDTH_FOR_MIDDLE_LABEL {
        vec![lo, (lo + hi) / 2.0, hi]
    } else {
        vec![lo, hi]
    }
    .into_iter()
    .map(|x| x_label(t, x, file))
    .collect();
    // One column per braille dot across, centred on the dot: dot k stands for x = lo + k * dot
    // and shows the maximum over the half dot either side.
    let dots = plot_dots(area, &bytes_labels(max_y), labels[0].chars().count()).max(2);
    let dot = (hi - lo) / (dots - 1) as f64;
    let columns: Vec<(f64, Sample)> = t
        .columns(lo - dot / 2.0, hi + dot / 2.0, dots)
        .into_iter()
        .enumerate()
        .filter_map(|(k, c)| c.map(|c| (lo + k as f64 * dot, c)))
        .collect();
    let series = |f: fn(&Sample) -> u64| -> Vec<(f64, f64)> {
        columns.iter().map(|(x, c)| (*x, f(c) as f64)).collect()
    };
    let reserved = series(|s| s.reserved);
    let allocated = series(|s| s.allocated);
    let active = series(|s| s.active);
    let oom_lines: Vec<[(f64, f64); 2]> = t
        .ooms
        .iter()
        .filter(|x| in_view(x))
        .map(|&x| [(x, 0.0), (x, max_y)])
        .collect();
    let cursor = t.cursor.filter(in_view).map(|x| [(x, 0.0), (x, max_y)]);
    let series_dataset =
        |data, s: Series| line_dataset(data, s.color()).marker(series_marker(s, no_color));
    let mut datasets = vec![
        series_dataset(&reserved, Series::Reserved),
        series_dataset(&active, Series::Active),
        series_dataset(&allocated, Series::Allocated),
    ];
    for l in &oom_lines {
        datasets.push(series_dataset(l, Series::Oom));
    }
    if let Some(c) = &cursor {
        datasets.push(series_dataset(c, Series::Cursor));
    }
    let chart = Chart::new(datasets)
        .block(block)
        .x_axis(
            Axis::default()
                .bounds([lo, hi])
                .style(theme::dim())
                .labels(labels),
        )
        .y_axis(bytes_axis(max_y));
    chart.render(area, buf);
}

fn host_lines(h: &HostHeap, width: usize) -> Vec<Line<'static>> {
    vec![
        gauge("in use", &h.bytes, h.peak(), width, theme::ALLOCATED),
        Line::raw(format!(
            " allocations {}   frees {}   live {}",
            units::count(h.allocs()),
            units::count(h.frees()),
            units::count(h.live())
        )),
        Line::raw(format!(
            " total allocated {}   freed {}",
            units::bytes(h.total()),
            units::bytes(h.bytes.freed.max(0) as u64)
        )),
    ]
}

/// Draws the host heap box into `area` (with its border).
pub fn render_host(area: Rect, buf: &mut Buffer, h: &HostHeap) {
    let block = Block::bordered().title(Span::styled(" Host heap ", theme::title()));
    let inner = block.inner(area);
    block.render(area, buf);
    for (i, l) in host_lines(h, inner.width as usize).iter().enumerate() {
        put(buf, inner, i as u16, l);
    }
}

/// Draws the host heap's bytes in use over time into `area` (with its border); nothing when
/// there are no samples.
pub fn render_host_chart(area: Rect, buf: &mut Buffer, h: &HostHeap) {
    if h.samples.is_empty() {
        return;
    }
    // The agent keeps no history of the host heap: the samples are those taken while this
    // dashboard watched, which the title says, and the axis counts back from now as the
    // device chart's does.
    let title = Line::from(vec![
        Span::styled(" Host heap over time ", theme::title()),
        Span::styled("(while watched) ", theme::dim()),
        Span::styled("── in use ", Style::new().fg(theme::ALLOCATED)),
    ]);
    let block = Block::bordered().title(title);
    if area.height < 3 || area.width < 10 {
        block.render(area, buf);
        return;
    }
    let x0 = h.samples[0].x;
    let mut x1 = h.samples[h.samples.len() - 1].x;
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let max_y = (h.max_sample().max(1) as f64) * 1.05;
    let points: Vec<(f64, f64)> = h.samples.iter().map(|s| (s.x, s.bytes as f64)).collect();
    let datasets = vec![line_dataset(&points, theme::ALLOCATED)];
    Chart::new(datasets)
        .block(block)
        .x_axis(
            Axis::default()
                .bounds([x0, x1])
                .style(theme::dim())
                .labels([format!("-{}", units::axis_time(x1 - x0)), "now".to_string()]),
        )
        .y_axis(bytes_axis(max_y))
        .render(area, buf);
}

/// Draws the overview.
pub fn render(area: Rect, buf: &mut Buffer, state: &State, ui: &UiState) {
    if let Some(h) = state.host.as_ref().filter(|_| state.is_host_only()) {
        let [top, chart] =
            Layout::vertical([Constraint::Length(HOST_ROWS), Constraint::Min(0)]).areas(area);
        render_host(top, buf, h);
        render_host_chart(chart, buf, h);
        return;
    }
    let host_rows = if state.host.is_some() { HOST_ROWS } else { 0 };
    let [top, host, chart] = Layout::vertical([
        Constraint::Length(TOP_ROWS),
        Constraint::Length(host_rows),
        Constraint::Min(0),
    ])
    .areas(area);
    if let Some(h) = &state.host {
        render_host(host, buf, h);
    }
    let with_counters = area.width >= MIN_WIDTH_WITH_COUNTERS;
    let [memory, counters] = Layout::horizontal([
        Constraint::Min(0),
        Constraint::Length(if with_counters { COUNTERS_WIDTH } else { 0 }),
    ])
    .areas(top);
    let block = Block::bordered().title(Span::styled(" Memory ", theme::title()));
    let inner = block.inner(memory);
    block.render(memory, buf);
    let mut lines = memory_lines(state, inner.width as usize);
    if !with_counters {
        // No room for the counters panel: its alerts stay, on the memory panel's last row.
        lines.push(kept_counters_line(state));
    }
    for (i, l) in lines.iter().enumerate() {
        put(buf, inner, i as u16, l);
    }
    if with_counters {
        let block = Block::bordered().title(Span::styled(" Counters ", theme::title()));
        let inner = block.inner(counters);
        block.render(counters, buf);
        for (i, l) in counter_lines(state, inner.width as usize)
            .iter()
            .enumerate()
        {
            put(buf, inner, i as u16, l);
        }
    }
    render_chart(chart, buf, state, ui);
}

/// The lines of the usage chart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Series {
    Reserved,
    Allocated,
    Active,
    Oom,
    Cursor,
}

impl Series {
    fn name(self) -> &'static str {
        match self {
            Series::Reserved => "reserved",
            Series::Allocated => "allocated",
            Series::Active => "active",
            Series::Oom => "OOM",
            Series::Cursor => "now",
        }
    }

    fn color(self) -> Color {
        match self {
            Series::Reserved => theme::RESERVED,
            Series::Allocated => theme::ALLOCATED,
            Series::Active => theme::ACTIVE,
            Series::Oom => theme::ALERT,
            // The terminal's text colour: white vanished on a light background.
            Series::Cursor => Color::Reset,
        }
    }
}

/// Marker of allocated memory without colours.
const ALLOCATED_MARKER: char = '•';
/// Marker of active memory without colours.
const ACTIVE_MARKER: char = '+';
/// Marker of an OOM without colours.
const OOM_MARKER: char = '!';
/// Marker of the time-travel cursor without colours.
const CURSOR_MARKER: char = '¦';

/// How a series is drawn: braille dots in colour; without colours ([`UiState::no_color`]),
/// only reserved memory keeps the braille line and the others get a symbol of their own.
fn series_marker(s: Series, no_color: bool) -> Marker {
    match (s, no_color) {
        (_, false) | (Series::Reserved, true) => Marker::Braille,
        (Series::Allocated, true) => Marker::Custom(ALLOCATED_MARKER),
        (Series::Active, true) => Marker::Custom(ACTIVE_MARKER),
        (Series::Oom, true) => Marker::Custom(OOM_MARKER),
        (Series::Cursor, true) => Marker::Custom(CURSOR_MARKER),
    }
}

/// One line of a chart, in braille dots.
fn line_dataset(data: &[(f64, f64)], color: Color) -> Dataset<'_> {
    Dataset::default()
        .marker(Marker::Braille)
        .graph_type(GraphType::Line)
        .style(Style::new().fg(color))
        .data(data)
}

/// A chart's byte axis from 0 to `max_y`, labelled at 0, the middle and the top.
fn bytes_axis(max_y: f64) -> Axis<'static> {
    Axis::default()
        .bounds([0.0, max_y])
        .style(theme::dim())
        .labels(bytes_labels(max_y))
}

/// The byte axis's labels: 0, the middle and the top.
fn bytes_labels(max_y: f64) -> [String; 3] {
    [
        "0".to_string(),
        units::bytes((max_y / 2.0) as u64),
        units::bytes(max_y as u64),
    ]
}

/// Braille dots across the plot of a chart drawn into `area` with a border, y labels
/// `y_labels` and x labels starting with one `first_x_label` wide: the layout ratatui's
/// `Chart` gives it (the labels left of the y axis take at most a third of the width, the axis
/// one column).
fn plot_dots(area: Rect, y_labels: &[String], first_x_label: usize) -> usize {
    let inner = area.width.saturating_sub(2) as usize;
    let y_label = y_labels
        .iter()
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0);
    let left = y_label.max(first_x_label.saturating_sub(1)).min(inner / 3);
    COLUMNS_PER_CELL * inner.saturating_sub(left + 1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::View;
    use crate::view::testing::view_text;

    #[test]
    fn the_oom_and_retry_counts_stay_on_screen_where_the_counters_panel_does_not_fit() {
        let mut state = State::default();
        state.stats.num_ooms = 3;
        state.stats.num_alloc_retries = 5;
        // 74x18 and 80x24 screens: the view gets the rows between header and footer.
        for (w, h) in [(74u16, 15u16), (79, 21), (80, 21)] {
            let text = view_text(View::Overview, &state, w, h);
            let top: String = text.lines().take(TOP_ROWS as usize).collect();
            assert!(
                top.contains("OOMs") && top.contains('3'),
                "{w}x{h}:\n{text}"
            );
            assert!(
                top.contains("retries") && top.contains('5'),
                "{w}x{h}:\n{text}"
            );
        }
        let narrow = view_text(View::Overview, &state, 74, 15);
        assert!(narrow.contains("OOMs 3 · retries 5"), "{narrow}");
    }
}
