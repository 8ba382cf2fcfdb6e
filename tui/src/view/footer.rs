//! The footer: the filter prompt while typing after `/`; in file mode the event slider
//! (`event 12,034 / 19,342  ◀ ▶ step  [ ] ±100  n next OOM  g segment event  Home End`); else
//! the last status message (`saved snapshot to ...`) or the main keys.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};

use super::{put, theme};
use crate::state::{Mode, State, UiState};
use crate::units;

/// Keys of the time-travel slider.
pub const SLIDER_KEYS: &str = "◀ ▶ step  [ ] ±100  n next OOM  g segment event  Home End";
/// Keys shown when nothing else is.
pub const LIVE_KEYS: &str =
    "q quit  ? help  Tab/1-7 views  p pause  r reset peaks  s save  t chart span";
/// Keys shown on the histogram view, where `p` / `s` switch the grouping.
pub const HISTOGRAM_KEYS: &str =
    "q quit  ? help  Tab/1-7 views  p per pool  s per stream  ◀ ▶ group  Space pause";

/// The status line when it does not fit the footer's one row of `width` cells (live: a lost
/// connection and why, a restart, a stall; a file: after the event's position; both: a
/// background thread's panic), to be drawn over two rows with [`render_long_status`] (in a
/// file, over the position too while it shows: the header still says the event).
pub fn long_status<'a>(state: &'a State, ui: &UiState, width: u16) -> Option<&'a str> {
    if ui.filter_input.is_some() {
        return None;
    }
    let status = state.status.as_deref()?;
    let position = match &state.mode {
        Mode::File { event, total, .. } => position(*event, *total).chars().count(),
        _ => 0,
    };
    // A leading space, as the one-row footer writes it.
    (position + status.chars().count() + 1 > width as usize).then_some(status)
}

/// A file's position in the footer (` event 12,034 / 19,342 `).
fn position(event: usize, total: usize) -> String {
    format!(
        " event {} / {} ",
        units::count(event as u64),
        units::count(total as u64)
    )
}

/// Draws a status line too long for one row over the two rows of `area` (the body's last row,
/// its box's bottom border, and the footer), wrapped at spaces; what does not fit the two
/// rows ends in `…`.
pub fn render_long_status(area: Rect, buf: &mut Buffer, status: &str) {
    let width = area.width.saturating_sub(1) as usize;
    let mut lines = super::wrap(status, width.max(1));
    if lines.len() > 2 {
        lines.truncate(2);
        let last = &mut lines[1];
        while last.chars().count() + 1 > width && last.pop().is_some() {}
        last.push('…');
    }
    let style = Style::new().fg(theme::PENDING);
    for row in 0..area.height.min(2) {
        let text = lines.get(row as usize).map_or("", String::as_str);
        let line = Line::styled(format!(" {text:<width$}"), style);
        put(buf, area, row, &line);
    }
}

/// Draws the footer.
pub fn render(area: Rect, buf: &mut Buffer, state: &State, ui: &UiState) {
    if let Some(text) = &ui.filter_input {
        let line = Line::from(vec![
            Span::styled(" / ", theme::title()),
            Span::raw(text.clone()),
            Span::styled("█", Style::new().fg(theme::ACCENT)),
            Span::styled("   Enter apply  Esc cancel  Ctrl-U clear", theme::dim()),
        ]);
        put(buf, area, 0, &line);
        return;
    }
    let mut spans = Vec::new();
    if let Mode::File { event, total, .. } = &state.mode {
        let pos = position(*event, *total);
        spans.push(Span::styled(pos, theme::title()));
        // A slider when there is room beside the keys.
        let room = (area.width as usize).saturating_sub(spans[0].width() + SLIDER_KEYS.len() + 4);
        let slider = room.min(40);
        if slider >= 10 {
            let filled = if *total == 0 {
                slider
            } else {
                (*event * slider).div_ceil(*total).min(slider)
            };
            spans.push(Span::styled(
                "━".repeat(filled),
                Style::new().fg(theme::ACCENT),
            ));
            spans.push(Span::styled("─".repeat(slider - filled), theme::dim()));
            spans.push(Span::raw(" "));
        }
        // A status message (a save, a seek past the end) replaces the keys, which `?` lists.
        match &state.status {
            Some(status) => spans.push(Span::styled(
                format!(" {status}"),
                Style::new().fg(theme::PENDING),
            )),
            None => spans.push(Span::styled(format!(" {SLIDER_KEYS}"), theme::dim())),
        }
        put(buf, area, 0, &Line::from(spans));
        return;
    }
    if let Some(status) = &state.status {
        put(
            buf,
            area,
            0,
            &Line::styled(format!(" {status}"), Style::new().fg(theme::PENDING)),
        );
    } else {
        put(
            buf,
            area,
            0,
            &Line::styled(
                format!(
                    " {}",
                    if ui.view == crate::state::View::Histograms {
                        HISTOGRAM_KEYS
                    } else {
                        LIVE_KEYS
                    }
                ),
                theme::dim(),
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::testing::{buffer, rows};

    const LONG: &str = "connection lost without a goodbye (did the process die?); retrying every \
                        1 s (q quits): cannot connect to unix:/run/user/1000/allocview/4242.sock";

    fn screen(status: &str, w: u16, h: u16) -> Vec<String> {
        let state = State {
            status: Some(status.into()),
            ..State::default()
        };
        let mut buf = buffer(w, h);
        crate::view::render(buf.area, &mut buf, &state, &UiState::default());
        rows(&buf)
    }

    #[test]
    fn a_status_too_long_for_80_columns_is_shown_whole_over_two_rows() {
        let r = screen(LONG, 80, 24);
        let two = format!("{} {}", r[22].trim(), r[23].trim());
        assert_eq!(two, LONG);
        // A short one keeps to the footer, under the body's border.
        let r = screen("resumed", 80, 24);
        assert_eq!(r[23].trim_end(), " resumed");
        assert!(r[22].starts_with('└'), "{}", r[22]);
    }

    #[test]
    fn a_status_longer_than_two_rows_ends_in_an_ellipsis() {
        let long = LONG.repeat(3);
        let r = screen(&long, 80, 24);
        assert!(r[23].trim_end().ends_with('…'), "{}", r[23]);
        assert!(r[23].chars().count() <= 80);
    }
}
