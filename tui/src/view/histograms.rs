//! View 5, Histograms: allocation size, lifetime and allocator latency for one group (all,
//! per pool, per stream; ◀ ▶ switch), as log2 bucket bars with p50 / p90 / p99 / max.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use super::{put, right, theme};
use crate::state::{Bucket, HistogramSummary, HistogramUnit, State, UiState};
use crate::units;

/// Width from which the metrics are drawn side by side.
const MIN_WIDTH_SIDE_BY_SIDE: u16 = 120;
/// Width of a bucket label.
const BUCKET_LABEL: usize = 9;

/// The distinct groups, in first-seen order.
pub fn groups(state: &State) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for h in &state.histograms {
        if !out.contains(&h.group) {
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

/// Merges neighbouring buckets pairwise until at most `rows` remain.
fn fit(mut buckets: Vec<Bucket>, rows: usize) -> Vec<Bucket> {
    while buckets.len() > rows.max(1) {
        buckets = buckets
            .chunks(2)
            .map(|c| Bucket {
                lo: c[0].lo,
                hi: c[c.len() - 1].hi,
                count: c.iter().map(|b| b.count).sum(),
            })
            .collect();
    }
    buckets
}

fn render_one(area: Rect, buf: &mut Buffer, h: &HistogramSummary) {
    let block = Block::bordered().title(Span::styled(
        format!(" {} — {} ", h.metric, h.group),
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
    let buckets = fit(h.buckets.clone(), rows);
    let most = buckets.iter().map(|b| b.count).max().unwrap_or(0).max(1);
    let count_width = units::count(most).len();
    let bar_width = (inner.width as usize).saturating_sub(BUCKET_LABEL + count_width + 4);
    for (i, b) in buckets.iter().enumerate() {
        let n = (b.count as f64 / most as f64 * bar_width as f64).round() as usize;
        let n = if b.count > 0 { n.max(1) } else { 0 }.min(bar_width);
        let line = Line::from(vec![
            Span::styled(
                format!(" {} ", right(&value(h.unit, b.lo), BUCKET_LABEL)),
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

/// Draws the histograms of the selected group.
pub fn render(area: Rect, buf: &mut Buffer, state: &State, ui: &UiState) {
    let groups = groups(state);
    if groups.is_empty() {
        let block = Block::bordered().title(Span::styled(" Histograms ", theme::title()));
        let inner = block.inner(area);
        block.render(area, buf);
        put(
            buf,
            inner,
            0,
            &Line::styled(" no histograms from this source", theme::dim()),
        );
        return;
    }
    let group = &groups[ui.histogram_group % groups.len()];
    let [tabs, body] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    let mut spans = vec![Span::styled(" group ◀ ▶ ", theme::dim())];
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
        let f = fit(b, 4);
        assert_eq!(f.len(), 3);
        assert_eq!(f.iter().map(|b| b.count).sum::<u64>(), 10);
        assert_eq!(f[0].lo, 1);
    }
}
