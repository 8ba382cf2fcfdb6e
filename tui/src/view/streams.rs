//! View 4, Streams: one row per stream (allocated, active with pending frees, reserved, peak,
//! allocations per second, a bar), and a warning for streams holding cached memory that other
//! streams cannot use.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use super::{left, put, right, theme};
use crate::state::{State, UiState};
use crate::units;

/// Width of the figure columns before the bar.
const FIGURES_WIDTH: usize = 8 + 10 + 22 + 10 + 10 + 10;

/// The key of the bar column.
const BAR_KEY: &str = "allocated █ pending ▒ cached ░";
/// What the `peak` column is, live.
pub const PEAK_KEY_LIVE: &str = " peak: the most allocated on the stream at once";
/// What the `peak` column is in a file.
pub const PEAK_KEY_FILE: &str =
    " peak: highest allocated from the start of the recorded trace to this event";

/// Draws the stream table.
pub fn render(area: Rect, buf: &mut Buffer, state: &State, ui: &UiState) {
    let rows = state.stream_rows();
    let block = Block::bordered().title(Span::styled(
        format!(" Streams ({}) ", rows.len()),
        theme::title(),
    ));
    let inner = block.inner(area);
    block.render(area, buf);
    // The bar's key heads its column where it fits; else the column is headed `bar` and the
    // key goes below the table (never cut mid-word).
    let key_fits = FIGURES_WIDTH + 2 + BAR_KEY.chars().count() <= inner.width as usize;
    let head = format!(
        "{}{}{}{}{}{}  {}",
        left(" stream", 8),
        right("allocated", 10),
        right("active (pending free)", 22),
        right("reserved", 10),
        right("peak", 10),
        right("allocs/s", 10),
        if key_fits { BAR_KEY } else { "bar" }
    );
    put(buf, inner, 0, &Line::styled(head, theme::title()));
    let scale = rows.iter().map(|r| r.reserved).max().unwrap_or(0);
    let bar_width = (inner.width as usize).saturating_sub(FIGURES_WIDTH + 3);
    let mut y = 1u16;
    for (i, r) in rows.iter().enumerate() {
        let figures = format!(
            "{}{}{}{}{}{}  ",
            left(&format!(" s{}", r.stream), 8),
            right(&units::bytes(r.allocated), 10),
            right(
                &format!(
                    "{} ({})",
                    units::bytes(r.active),
                    units::bytes(r.pending_free)
                ),
                22
            ),
            right(&units::bytes(r.reserved), 10),
            right(&r.peak.map_or_else(|| "-".into(), units::bytes), 10),
            right(
                &r.allocs_per_s
                    .map_or_else(|| "-".into(), |v| format!("{v:.0}")),
                10
            ),
        );
        let cell = |b: u64| {
            if scale == 0 {
                0
            } else {
                (b as f64 / scale as f64 * bar_width as f64).round() as usize
            }
        };
        let a = cell(r.allocated).min(bar_width);
        let p = cell(r.pending_free).min(bar_width - a);
        let c = cell(r.reserved).clamp(a + p, bar_width) - a - p;
        let style = if ui.stream_row == i {
            theme::selected()
        } else {
            Style::new()
        };
        let line = Line::from(vec![
            Span::styled(figures, style),
            Span::styled(
                theme::ALLOCATED_GLYPH.repeat(a),
                Style::new().fg(theme::ALLOCATED),
            ),
            Span::styled(
                theme::PENDING_GLYPH.repeat(p),
                Style::new().fg(theme::PENDING),
            ),
            Span::styled(theme::FREE_GLYPH.repeat(c), Style::new().fg(theme::FREE)),
        ]);
        put(buf, inner, y, &line);
        y += 1;
    }
    if rows.is_empty() {
        put(buf, inner, 1, &Line::styled(" no streams", theme::dim()));
        y += 1;
    }
    y += 1;
    if !key_fits && !rows.is_empty() {
        put(
            buf,
            inner,
            y,
            &Line::styled(format!(" bar: {BAR_KEY}"), theme::dim()),
        );
        y += 1;
    }
    if !rows.is_empty() && rows.iter().any(|r| r.peak.is_some()) {
        // Beside `reserved`, a bare `peak` read as the most reserved. A file's trace is a
        // window: its peaks cannot see what came before it.
        let key = if state.is_file() {
            PEAK_KEY_FILE
        } else {
            PEAK_KEY_LIVE
        };
        put(buf, inner, y, &Line::styled(key, theme::dim()));
        y += 1;
    }
    for r in &rows {
        if let Some(note) = r.stranded_note(rows.len()) {
            put(
                buf,
                inner,
                y,
                &Line::styled(
                    format!(" ⚠ {note}: other streams cannot use it"),
                    Style::new().fg(theme::PENDING),
                ),
            );
            y += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::View;
    use crate::state::streams::StreamRow;
    use crate::view::testing::view_text;

    fn one_stream() -> State {
        State {
            streams: vec![StreamRow {
                stream: 0,
                allocated: 3 << 20,
                active: 4 << 20,
                pending_free: 1 << 20,
                reserved: 8 << 20,
                peak: None,
                allocs_per_s: None,
                idle_s: None,
            }],
            ..State::default()
        }
    }

    #[test]
    fn the_bar_key_heads_its_column_where_it_fits_and_goes_below_whole_where_not() {
        let wide = view_text(View::Streams, &one_stream(), 120, 10);
        assert!(wide.lines().nth(1).unwrap().contains(BAR_KEY), "{wide}");
        let narrow = view_text(View::Streams, &one_stream(), 80, 10);
        let head = narrow.lines().nth(1).unwrap();
        assert!(
            head.trim_end_matches(['│', ' ']).ends_with("  bar"),
            "{narrow}"
        );
        assert!(narrow.contains(&format!("bar: {BAR_KEY}")), "{narrow}");
    }
}
