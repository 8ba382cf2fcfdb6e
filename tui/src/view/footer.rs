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
        let pos = format!(
            " event {} / {} ",
            units::count(*event as u64),
            units::count(*total as u64)
        );
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
