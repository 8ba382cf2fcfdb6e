//! The help overlay (`?`): every key, then what the dashboard's words mean (segment, block,
//! pool, ...: PyTorch's vocabulary, which a first-time user may not know), in a box centred
//! over the current view; a narrow terminal wraps the descriptions, and one too short for all
//! of it scrolls it (↑↓ PgUp PgDn), the box's border saying how much is hidden.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Widget};

use super::{left, put, theme};
use crate::state::State;

/// Every key and what it does; the time-travel keys only apply to files.
pub const KEYS: [(&str, &str); 21] = [
    ("q  Ctrl-C", "quit"),
    (
        "Ctrl-Z",
        "suspend (the shell's fg brings the dashboard back)",
    ),
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

/// What the dashboard's words mean, in PyTorch's caching allocator (shown after the keys).
pub const GLOSSARY: [(&str, &str); 11] = [
    (
        "segment",
        "memory the allocator got from the device (cudaMalloc)",
    ),
    (
        "block",
        "a piece of a segment: a tensor's, or free and cached",
    ),
    (
        "reserved",
        "all segments: what the process holds on the device",
    ),
    ("allocated", "blocks in use by tensors (sizes rounded up)"),
    (
        "active",
        "allocated + freed blocks another stream still uses",
    ),
    (
        "cached unused",
        "reserved - allocated: free blocks kept for reuse",
    ),
    (
        "stranded",
        "free in split segments: cannot go back to the device",
    ),
    (
        "pool",
        "small (requests up to 1 MiB, 2 MiB segments) or large",
    ),
    (
        "stream",
        "a CUDA stream (s0, s1); free blocks are per stream",
    ),
    (
        "█ ▒ ▓ ░",
        "allocated, pending free, rounding waste, free cached",
    ),
    (
        "OOM (7)",
        "the failed request, why, and settings that avoid it",
    ),
];

/// The glossary's heading.
const GLOSSARY_TITLE: &str = "What the words mean";

/// Width of the key column.
const KEY_COLUMN: usize = 22;
/// Width of the description column (the longest description fits).
const WHAT_COLUMN: u16 = 56;
/// The box's two borders.
const BORDERS: u16 = 2;

/// The overlay's rows for a box `inner_width` cells wide inside: the keys (the time-travel
/// ones dimmed outside a file), a blank row, the glossary's heading and its rows; a
/// description too long for the width goes on under itself.
fn lines(inner_width: u16, file: bool) -> Vec<Line<'static>> {
    // One space, then the key column.
    let what_width = (inner_width as usize).saturating_sub(KEY_COLUMN + 1).max(1);
    let mut out = Vec::new();
    for (k, what) in KEYS {
        let applies = file || !what.starts_with("file:");
        let style = if applies { Style::new() } else { theme::dim() };
        push_row(&mut out, k, what, style, what_width);
    }
    out.push(Line::default());
    out.push(Line::styled(format!(" {GLOSSARY_TITLE}"), theme::title()));
    for (word, what) in GLOSSARY {
        push_row(&mut out, word, what, Style::new(), what_width);
    }
    out
}

/// Pushes the row of `key` and `what`, wrapped to `what_width` (the key on the first row).
fn push_row(out: &mut Vec<Line<'static>>, key: &str, what: &str, style: Style, what_width: usize) {
    for (i, part) in super::wrap(what, what_width).into_iter().enumerate() {
        let key = if i == 0 { key } else { "" };
        out.push(Line::from(vec![
            Span::styled(format!(" {}", left(key, KEY_COLUMN)), theme::title()),
            Span::styled(part, style),
        ]));
    }
}

/// The overlay's box over `area` for `rows` rows of text: as wide as its columns and as tall
/// as its text, at most `area`, centred.
fn boxed(area: Rect, rows: usize) -> Rect {
    let w = (KEY_COLUMN as u16 + WHAT_COLUMN).min(area.width);
    let h = (rows as u16).saturating_add(BORDERS).min(area.height);
    Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    )
}

/// The overlay's rows and box over `area`.
fn layout(area: Rect, file: bool) -> (Vec<Line<'static>>, Rect) {
    let width = (KEY_COLUMN as u16 + WHAT_COLUMN).min(area.width);
    let rows = lines(width.saturating_sub(BORDERS), file);
    let rect = boxed(area, rows.len());
    (rows, rect)
}

/// The most rows the overlay scrolls over a screen of `area` (0 where it fits).
pub fn scroll_max(area: Rect) -> usize {
    let (rows, rect) = layout(area, true);
    rows.len()
        .saturating_sub(rect.height.saturating_sub(BORDERS) as usize)
}

/// Draws the overlay over `area`, `scroll` rows down (at most [`scroll_max`]).
pub fn render(area: Rect, buf: &mut Buffer, state: &State, scroll: usize) {
    let (lines, rect) = layout(area, state.is_file());
    Clear.render(rect, buf);
    // As [`scroll_max`] (the rows' count does not depend on the mode, only their style).
    let shown = rect.height.saturating_sub(BORDERS) as usize;
    let scroll = scroll.min(lines.len().saturating_sub(shown));
    let below = lines.len().saturating_sub(scroll + shown);
    let mut block = Block::bordered().title(Span::styled(" Keys ", theme::title()));
    if scroll > 0 {
        block =
            block.title(Line::styled(format!(" ↑ {scroll} more "), theme::dim()).right_aligned());
    }
    if below > 0 {
        block = block.title_bottom(
            Line::styled(format!(" ↓ {below} more (↑↓ PgDn) "), theme::dim()).right_aligned(),
        );
    }
    let inner = block.inner(rect);
    block.render(rect, buf);
    for (i, l) in lines.iter().skip(scroll).take(shown).enumerate() {
        put(buf, inner, i as u16, l);
    }
}
