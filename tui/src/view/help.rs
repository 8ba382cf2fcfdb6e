//! The help overlay (`?`): every key, in a box centred over the current view.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Widget};

use super::{left, put, theme};
use crate::state::State;

/// Every key and what it does; the time-travel keys only apply to files.
pub const KEYS: [(&str, &str); 20] = [
    ("q  Ctrl-C", "quit"),
    ("?", "this help (Esc closes)"),
    ("Tab  Shift-Tab  1-7", "switch view"),
    (
        "↑ ↓  j k  PgUp PgDn",
        "select row / scroll; OOM view: PgUp PgDn scroll",
    ),
    ("← →  h l", "select block (segments), group (histograms)"),
    ("Enter", "detail; trace row: block/OOM; file OOM: its event"),
    ("Esc", "back"),
    ("/", "filter the trace: alloc s1 >1MiB 0x7f... forward"),
    ("f", "segments: all / large / small"),
    ("z", "segments: zoom the selected segment (Esc back)"),
    (
        "p  Space",
        "pause updates (histograms: Space; p per pool / all)",
    ),
    ("r", "reset peak statistics"),
    ("t", "chart span: whole run / last 1 h / 10 min / 1 min"),
    ("s", "save a snapshot; histograms: per stream / all"),
    ("mouse", "wheel scrolls, click selects"),
    ("◀ ▶  , .  < >", "file: previous / next event"),
    ("[ ]", "file: 100 events back / forward"),
    ("n", "next OOM (OOM view; file: its event; wraps)"),
    ("g", "file: next segment event"),
    ("Home End", "first / last row; file: first / last event"),
];

/// Width of the key column.
const KEY_COLUMN: usize = 22;
/// Width of the description column (the longest description fits).
const WHAT_COLUMN: u16 = 56;

/// Draws the overlay over `area`.
pub fn render(area: Rect, buf: &mut Buffer, state: &State) {
    let file = state.is_file();
    let lines: Vec<Line<'_>> = KEYS
        .iter()
        .map(|(k, what)| {
            let applies = file || !what.starts_with("file:");
            let style = if applies {
                ratatui::style::Style::new()
            } else {
                theme::dim()
            };
            Line::from(vec![
                Span::styled(format!(" {}", left(k, KEY_COLUMN)), theme::title()),
                Span::styled(*what, style),
            ])
        })
        .collect();
    let w = (KEY_COLUMN as u16 + WHAT_COLUMN).min(area.width);
    let h = (lines.len() as u16 + 2).min(area.height);
    let rect = Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    );
    Clear.render(rect, buf);
    let block = Block::bordered().title(Span::styled(" Keys ", theme::title()));
    let inner = block.inner(rect);
    block.render(rect, buf);
    for (i, l) in lines.iter().enumerate() {
        put(buf, inner, i as u16, l);
    }
}
