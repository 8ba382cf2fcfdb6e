//! View 5, Histograms: allocation size, lifetime and allocator latency for one group (all,
//! per pool, per stream; ◀ ▶ switch), as log2 bucket bars with p50 / p90 / p99 / max.
//!
//! `p` / `s` show the pools / the streams only (again: every group): a table then lists each
//! pool's or stream's count, p50, p90, p99 and max per metric, side by side, above the
//! selected one's bars.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use super::{put, right, theme};
use crate::state::ui::HistogramGrouping;
use crate::state::{Bucket, HistogramSummary, HistogramUnit, State, UiState};
use crate::units;

/// Width from which the metrics are drawn side by side.
const MIN_WIDTH_SIDE_BY_SIDE: u16 = 120;
/// Width of a bucket label.
const BUCKET_LABEL: usize = 9;
/// Before each bucket label: a row counts the values from its label up to the next row's.
const BUCKET_FROM: &str = "≥";

/// Width of the group column of the comparison table.
const GROUP_COLUMN: usize = 16;
/// Width of the metric column of the comparison table.
const METRIC_COLUMN: usize = 9;
/// Width of a count or value column of the comparison table.
const VALUE_COLUMN: usize = 10;

/// The distinct groups of a grouping, in first-seen order.
pub fn groups(state: &State, by: HistogramGrouping) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for h in &state.histograms {
        if by.includes(&h.group) && !out.contains(&h.group) {
            out.push(h.group.clone());
        }
    }
    out
}

fn value(unit: HistogramUnit, v: u64) -> String {
    match unit {
        HistogramUnit::Bytes => units::bytes(v),
        HistogramUnit::Nanos => units::nanos(v),
    }
}

/// Merges runs of neighbouring buckets, each run as long as the others (the last one maybe
/// shorter), so that at most `rows` remain. Each row is labelled with its lower bound and
/// ends where the next begins, so the rows still read as one axis.
fn fit(buckets: Vec<Bucket>, rows: usize) -> Vec<Bucket> {
    let run = buckets.len().div_ceil(rows.max(1)).max(1);
    if run == 1 {
        return buckets;
    }
    buckets
        .chunks(run)
        .map(|c| Bucket {
            lo: c[0].lo,
            hi: c[c.len() - 1].hi,
            count: c.iter().map(|b| b.count).sum(),
        })
        .collect()
}

/// Bar rows below which a histogram's buckets are not drawn: one bar of every value would
/// read as a single bucket at its lower bound.
const MIN_BAR_ROWS: usize = 2;

fn render_one(area: Rect, buf: &mut Buffer, h: &HistogramSummary) {
    // The caching allocator measures its latency on a random sample of calls (one in 16 by
    // default), so that histogram counts calls measured, not calls made.
    let label = if h.metric == "latency" {
        "latency (sampled)"
    } else {
        h.metric.as_str()
    };
    let block = Block::bordered().title(Span::styled(
        format!(" {label} — {} ", h.group),
        theme::title(),
    ));
    let inner = block.inner(area);
    block.render(area, buf);
    if h.count == 0 {
        put(
            buf,
            inner,
            0,
            &Line::styled(" no values recorded", theme::dim()),
        );
        return;
    }
    let head = format!(
        " n {}  p50 {}  p90 {}",
        units::count(h.count),
        value(h.unit, h.p50),
        value(h.unit, h.p90)
    );
    let tail = format!(
        "  p99 {}  max {}",
        value(h.unit, h.p99),
        value(h.unit, h.max)
    );
    // One line when it fits, else two: the percentiles are never cut off.
    let stat_rows = if head.chars().count() + tail.chars().count() <= inner.width as usize {
        put(buf, inner, 0, &Line::raw(format!("{head}{tail}")));
        1
    } else {
        put(buf, inner, 0, &Line::raw(head));
        put(buf, inner, 1, &Line::raw(format!(" {}", tail.trim_start())));
        2
    };
    let rows = inner.height.saturating_sub(stat_rows) as usize;
    if rows < MIN_BAR_ROWS && h.buckets.len() > 1 {
        if rows == 1 {
            put(
                buf,
                inner,
                stat_rows,
                &Line::styled(" (a taller window shows the buckets)", theme::dim()),
            );
        }
        return;
    }
    let buckets = fit(h.buckets.clone(), rows);
    let most = buckets.iter().map(|b| b.count).max().unwrap_or(0).max(1);
    let count_width = units::count(most).len();
    let bar_width = (inner.width as usize)
        .saturating_sub(BUCKET_FROM.chars().count() + BUCKET_LABEL + count_width + 4);
    for (i, b) in buckets.iter().enumerate() {
        let n = (b.count as f64 / most as f64 * bar_width as f64).round() as usize;
        let n = if b.count > 0 { n.max(1) } else { 0 }.min(bar_width);
        let line = Line::from(vec![
            Span::styled(
                format!(
                    " {} ",
                    right(
                        &format!("{BUCKET_FROM}{}", value(h.unit, b.lo)),
                        BUCKET_FROM.chars().count() + BUCKET_LABEL
                    )
                ),
                theme::dim(),
            ),
            Span::styled(
                theme::ALLOCATED_GLYPH.repeat(n),
                Style::new().fg(theme::ACCENT),
            ),
            Span::raw(format!(
                "{} {}",
                " ".repeat(bar_width - n),
                right(&units::count(b.count), count_width)
            )),
        ]);
        put(buf, inner, i as u16 + stat_rows, &line);
    }
}

/// One table row: `group  metric  n  p50  p90  p99  max`.
fn table_row(cells: [&str; 7], style: Style) -> Line<'static> {
    let [g, m, rest @ ..] = cells;
    let mut text = format!(
        " {}{}",
        super::left(g, GROUP_COLUMN),
        super::left(m, METRIC_COLUMN)
    );
    for c in rest {
        text.push_str(&right(c, VALUE_COLUMN));
    }
    Line::styled(text, style)
}

/// The comparison table of every group in `groups`: one row per group and metric.
fn table_lines(state: &State, groups: &[String], selected: &str) -> Vec<Line<'static>> {
    let mut lines = vec![table_row(
        ["group", "metric", "n", "p50", "p90", "p99", "max"],
        theme::title(),
    )];
    for g in groups {
        for (i, h) in state
            .histograms
            .iter()
            .filter(|h| &h.group == g)
            .enumerate()
        {
            let style = if g == selected {
                theme::selected()
            } else {
                Style::new()
            };
            let v = |x: u64| value(h.unit, x);
            lines.push(table_row(
                [
                    if i == 0 { g.as_str() } else { "" },
                    h.metric.as_str(),
                    &units::count(h.count),
                    &v(h.p50),
                    &v(h.p90),
                    &v(h.p99),
                    &v(h.max),
                ],
                style,
            ));
        }
    }
    lines
}

/// Draws the histograms of the selected group.
pub fn render(area: Rect, buf: &mut Buffer, state: &State, ui: &UiState) {
    let groups = groups(state, ui.histogram_by);
    let [tabs, body] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    let mut spans = vec![Span::styled(
        format!(" {}  p pool  s stream  ◀ ▶ ", ui.histogram_by.label()),
        theme::dim(),
    )];
    if groups.is_empty() {
        let block = Block::bordered().title(Span::styled(" Histograms ", theme::title()));
        let (msg, target) = if state.histograms.is_empty() {
            (" no histograms from this source", area)
        } else {
            put(buf, tabs, 0, &Line::from(spans));
            (" no groups of this kind (p / s: back to every group)", body)
        };
        let inner = block.inner(target);
        block.render(target, buf);
        put(buf, inner, 0, &Line::styled(msg, theme::dim()));
        return;
    }
    let group = &groups[ui.histogram_group % groups.len()];
    for g in &groups {
        let style = if g == group {
            theme::selected()
        } else {
            theme::dim()
        };
        spans.push(Span::styled(format!(" {g} "), style));
        spans.push(Span::raw(" "));
    }
    put(buf, tabs, 0, &Line::from(spans));
    let body = if ui.histogram_by == HistogramGrouping::Every {
        body
    } else {
        // The table, as tall as it needs up to half the body; the bars below.
        let lines = table_lines(state, &groups, group);
        let want = lines.len() as u16 + 2;
        let [table, rest] = Layout::vertical([
            Constraint::Length(want.min(body.height / 2)),
            Constraint::Min(0),
        ])
        .areas(body);
        let block = Block::bordered().title(Span::styled(
            format!(" {} ", ui.histogram_by.label()),
            theme::title(),
        ));
        let inner = block.inner(table);
        block.render(table, buf);
        for (i, l) in lines.iter().enumerate() {
            put(buf, inner, i as u16, l);
        }
        rest
    };
    let shown: Vec<&HistogramSummary> = state
        .histograms
        .iter()
        .filter(|h| &h.group == group)
        .collect();
    let n = shown.len().max(1) as u32;
    let constraints = vec![Constraint::Ratio(1, n); shown.len()];
    let panels = if area.width >= MIN_WIDTH_SIDE_BY_SIDE {
        Layout::horizontal(constraints).split(body)
    } else {
        Layout::vertical(constraints).split(body)
    };
    for (h, rect) in shown.iter().zip(panels.iter()) {
        render_one(*rect, buf, h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_merge_to_fit_the_rows() {
        let b: Vec<Bucket> = (0..10)
            .map(|i| Bucket {
                lo: 1 << i,
                hi: 2 << i,
                count: 1,
            })
            .collect();
        let f = fit(b.clone(), 4);
        // Runs of 3: [1, 8), [8, 64), [64, 512), [512, 1024).
        let bounds: Vec<(u64, u64, u64)> = f.iter().map(|b| (b.lo, b.hi, b.count)).collect();
        assert_eq!(
            bounds,
            [(1, 8, 3), (8, 64, 3), (64, 512, 3), (512, 1024, 1)]
        );
        assert_eq!(fit(b.clone(), 10).len(), 10);
        assert_eq!(fit(b, 2).len(), 2);
    }

    /// A size histogram of ten log2 buckets from 1 KiB, one value each.
    fn sizes() -> HistogramSummary {
        HistogramSummary {
            metric: "size".into(),
            group: "all".into(),
            unit: HistogramUnit::Bytes,
            buckets: (10..20)
                .map(|i| Bucket {
                    lo: 1 << i,
                    hi: 2 << i,
                    count: 1,
                })
                .collect(),
            count: 10,
            p50: 1 << 15,
            p90: 1 << 19,
            p99: 1 << 19,
            max: 1 << 19,
        }
    }

    /// The panel drawn `height` rows tall (80 wide), as text.
    fn panel(height: u16) -> String {
        let mut buf = crate::view::testing::buffer(80, height);
        render_one(buf.area, &mut buf, &sizes());
        crate::view::testing::rows(&buf).join("\n")
    }

    #[test]
    fn a_panel_too_short_for_two_bars_draws_no_bar_of_every_value() {
        // Borders and the percentile line leave one row: a single bar labelled 1 KiB would
        // read as "every value is about 1 KiB".
        let text = panel(4);
        assert!(text.contains("a taller window shows the buckets"), "{text}");
        assert!(!text.contains(theme::ALLOCATED_GLYPH), "{text}");
        // Four rows: runs of three buckets, labelled by their lower bounds.
        let text = panel(7);
        let bars: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(theme::ALLOCATED_GLYPH))
            .collect();
        assert_eq!(bars.len(), 4, "{text}");
        for (bar, label) in bars
            .iter()
            .zip(["1.00 KiB", "8.00 KiB", "64.0 KiB", "512 KiB"])
        {
            // Each row says it counts from its label up (to the next row's label).
            assert!(
                bar.contains(&format!("{BUCKET_FROM}{label}")),
                "{bar} starts at {label}"
            );
        }
    }
}
