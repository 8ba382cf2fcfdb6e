//! The views: pure functions from ([`State`], [`UiState`]) to a ratatui [`Buffer`], one file
//! per panel (the tokio-console / ratatui demo2 layout). Nothing here changes state or does
//! I/O, so every panel is tested by rendering into a buffer.
//!
//! Screen layout: a two-line header (mode, process, device, drops; then the tabs), the view,
//! and a one-line footer (file slider, filter prompt, status, or key hints). The help overlay
//! draws on top. A screen smaller than [`MIN_WIDTH`] x [`MIN_HEIGHT`] (where the tabs or the
//! overview's panels would be cut) gets one line saying so instead, and the dashboard comes
//! back as soon as the terminal is large enough again.
//!
//! A process watched for its host heap only (no device allocator) has its heap on the
//! overview; the device views say so rather than draw empty tables.

pub mod ascii;
pub mod footer;
pub mod header;
pub mod help;
pub mod histograms;
pub mod oom;
pub mod overview;
pub mod pools;
pub mod segments;
pub mod streams;
pub mod theme;
pub mod trace;

use ratatui::Frame;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use crate::state::{State, UiState, View};

/// Rows of the header.
pub const HEADER_ROWS: u16 = 2;
/// Rows of the footer.
pub const FOOTER_ROWS: u16 = 1;
/// The narrowest screen drawn: the tab line, every tab whole and clickable (its width is
/// checked against [`header::tab_label`] in the tests).
pub const MIN_WIDTH: u16 = 74;
/// The lowest screen drawn: the header, the overview (its device panels and a chart with room
/// for its dots) and the footer.
pub const MIN_HEIGHT: u16 = HEADER_ROWS + overview::MIN_ROWS + FOOTER_ROWS;

/// The three regions of the screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Regions {
    /// Header (status line and tabs).
    pub header: Rect,
    /// The view.
    pub body: Rect,
    /// Footer.
    pub footer: Rect,
}

/// Splits the screen.
pub fn regions(area: Rect) -> Regions {
    let [header, body, footer] = Layout::vertical([
        Constraint::Length(HEADER_ROWS),
        Constraint::Min(0),
        Constraint::Length(FOOTER_ROWS),
    ])
    .areas(area);
    Regions {
        header,
        body,
        footer,
    }
}

/// Draws a whole screen into a frame.
pub fn draw(frame: &mut Frame<'_>, state: &State, ui: &UiState) {
    let area = frame.area();
    render(area, frame.buffer_mut(), state, ui);
}

/// Draws a whole screen into `buf` over `area`.
pub fn render(area: Rect, buf: &mut Buffer, state: &State, ui: &UiState) {
    let area = area.intersection(buf.area);
    if area.is_empty() {
        return;
    }
    if too_small(area) {
        render_too_small(area, buf);
    } else {
        let r = regions(area);
        header::render(r.header, buf, state, ui);
        render_view(ui.view, r.body, buf, state, ui);
        footer::render(r.footer, buf, state, ui);
        // A status too long for the footer takes the row above it too, while it shows.
        if let Some(status) = footer::long_status(state, ui, r.footer.width)
            && r.footer.y > r.body.y
        {
            let two = Rect {
                y: r.footer.y - 1,
                height: 2,
                ..r.footer
            };
            footer::render_long_status(two, buf, status);
        }
        if ui.help {
            help::render(area, buf, state, ui.help_scroll);
        }
    }
    // Whatever was drawn, once.
    if ui.no_color {
        theme::strip_colors(buf, area);
    }
    if ui.ascii {
        ascii::to_ascii(buf, area);
    }
}

/// Whether `area` is below [`MIN_WIDTH`] x [`MIN_HEIGHT`], where the screen is one line
/// saying so.
pub fn too_small(area: Rect) -> bool {
    area.width < MIN_WIDTH || area.height < MIN_HEIGHT
}

/// The message of a screen too small to draw: `terminal too small: 80x16, needs at least
/// 74x18`, shorter where that does not fit the width (`terminal too small: 40x12, needs
/// 74x18`, then `too small: 30x9 < 74x18`).
pub fn too_small_message(area: Rect) -> String {
    let (w, h) = (area.width, area.height);
    [
        format!("terminal too small: {w}x{h}, needs at least {MIN_WIDTH}x{MIN_HEIGHT}"),
        format!("terminal too small: {w}x{h}, needs {MIN_WIDTH}x{MIN_HEIGHT}"),
        format!("too small: {w}x{h} < {MIN_WIDTH}x{MIN_HEIGHT}"),
    ]
    .into_iter()
    .find(|m| m.chars().count() <= w as usize)
    .unwrap_or_else(|| format!("{w}x{h} < {MIN_WIDTH}x{MIN_HEIGHT}"))
}

/// Draws the too-small message on the middle row of `area`, centred.
fn render_too_small(area: Rect, buf: &mut Buffer) {
    let msg = too_small_message(area);
    let pad = (area.width as usize).saturating_sub(msg.chars().count()) / 2;
    let line = Line::styled(format!("{}{msg}", " ".repeat(pad)), theme::alert());
    put(buf, area, area.height / 2, &line);
    // The way out, under it where there is a row for it (the footer that says it is not drawn).
    if area.height >= TOO_SMALL_HINT_ROWS {
        let text = if TOO_SMALL_HINT.chars().count() <= area.width as usize {
            TOO_SMALL_HINT
        } else {
            TOO_SMALL_HINT_SHORT
        };
        let pad = (area.width as usize).saturating_sub(text.chars().count()) / 2;
        let hint = Line::styled(format!("{}{text}", " ".repeat(pad)), theme::dim());
        put(buf, area, area.height / 2 + 1, &hint);
    }
}

/// Under the too-small message: how to leave (or get the dashboard back).
pub const TOO_SMALL_HINT: &str = "q quits; a larger window brings the dashboard back";
/// [`TOO_SMALL_HINT`] where it does not fit the width.
pub const TOO_SMALL_HINT_SHORT: &str = "q quits";
/// The fewest rows that show [`TOO_SMALL_HINT`] under the message.
const TOO_SMALL_HINT_ROWS: u16 = 3;

/// What the device views say for a process watched for its host heap only.
pub const NO_DEVICE: &str =
    "no device allocator in this process: its host heap is on the Overview (1)";

/// Draws one view's body; for a host-only process ([`State::is_host_only`]), every view but
/// the overview is a box saying there is no device.
pub fn render_view(view: View, area: Rect, buf: &mut Buffer, state: &State, ui: &UiState) {
    if view != View::Overview && state.is_host_only() {
        render_no_device(view, area, buf);
        return;
    }
    match view {
        View::Overview => overview::render(area, buf, state, ui),
        View::Segments => segments::render(area, buf, state, ui),
        View::Pools => pools::render(area, buf, state, ui),
        View::Streams => streams::render(area, buf, state, ui),
        View::Histograms => histograms::render(area, buf, state, ui),
        View::Trace => trace::render(area, buf, state, ui),
        View::Oom => oom::render(area, buf, state, ui),
    }
}

/// The box of a device view for a host-only process: the view's title and [`NO_DEVICE`].
fn render_no_device(view: View, area: Rect, buf: &mut Buffer) {
    let block =
        Block::bordered().title(Span::styled(format!(" {} ", view.title()), theme::title()));
    let inner = block.inner(area);
    block.render(area, buf);
    put(
        buf,
        inner,
        0,
        &Line::styled(format!(" {NO_DEVICE}"), theme::dim()),
    );
}

/// Writes `line` on row `row` of `area`, clipped to it; rows outside are ignored.
pub fn put(buf: &mut Buffer, area: Rect, row: u16, line: &Line<'_>) {
    let area = area.intersection(buf.area);
    if row < area.height {
        buf.set_line(area.x, area.y + row, line, area.width);
    }
}

/// Splits `text` into lines of at most `width` characters at spaces (never between a size's
/// number and its unit).
pub use allocview_agent::text::wrap;

/// Writes `text` wrapped to `area`'s width (less a margin cell each side) from `first_row`
/// down, each line after a space, in `style`.
pub fn put_wrapped(buf: &mut Buffer, area: Rect, first_row: u16, text: &str, style: Style) {
    for (i, l) in wrap(text, area.width.saturating_sub(2) as usize)
        .iter()
        .enumerate()
    {
        put(
            buf,
            area,
            first_row + i as u16,
            &Line::styled(format!(" {l}"), style),
        );
    }
}

/// Pads or cuts `s` to exactly `width` cells, aligned right.
pub fn right(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n >= width {
        s.chars().take(width).collect()
    } else {
        format!("{}{s}", " ".repeat(width - n))
    }
}

/// Pads or cuts `s` to exactly `width` cells, aligned left.
pub fn left(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n >= width {
        s.chars().take(width).collect()
    } else {
        format!("{s}{}", " ".repeat(width - n))
    }
}

/// The view a click at row `y` of the tab line selects (`None` when the click is elsewhere).
pub fn tab_at(area: Rect, x: u16, y: u16) -> Option<View> {
    if too_small(area) {
        return None;
    }
    let r = regions(area);
    if r.header.height < HEADER_ROWS || y != r.header.y + 1 {
        return None;
    }
    let mut at = r.header.x + 1;
    for v in View::ALL {
        let w = header::tab_label(v).chars().count() as u16;
        if x >= at && x < at + w {
            return Some(v);
        }
        at += w + header::TAB_GAP;
    }
    None
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers for render tests.

    use ratatui::buffer::Buffer;
    use ratatui::layout::Rect;

    /// The text of a buffer, one string per row, trailing spaces kept.
    pub fn rows(buf: &Buffer) -> Vec<String> {
        let a = buf.area;
        (a.y..a.y + a.height)
            .map(|y| (a.x..a.x + a.width).map(|x| buf[(x, y)].symbol()).collect())
            .collect()
    }

    /// A buffer of a size.
    pub fn buffer(w: u16, h: u16) -> Buffer {
        Buffer::empty(Rect::new(0, 0, w, h))
    }

    /// `view` of `state` (the default UI otherwise) drawn `w` x `h`, one line a row.
    pub fn view_text(
        view: crate::state::View,
        state: &crate::state::State,
        w: u16,
        h: u16,
    ) -> String {
        let mut buf = buffer(w, h);
        let ui = crate::state::UiState::default();
        super::render_view(view, buf.area, &mut buf, state, &ui);
        rows(&buf).join("\n")
    }
}
