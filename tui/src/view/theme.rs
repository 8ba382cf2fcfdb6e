//! One colour language everywhere (TUI.md): allocated green `█`, pending free yellow `▒`,
//! rounding waste dark green `▓`, free grey `░`, unmapped blank; OOMs, errors and dropped
//! events red.

use std::ffi::OsStr;

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};

use allocview_alloc::snapshot::BlockState;

/// Glyph of allocated memory.
pub const ALLOCATED_GLYPH: &str = "█";
/// Glyph of pending-free memory.
pub const PENDING_GLYPH: &str = "▒";
/// Glyph of rounding waste inside an allocated block.
pub const WASTE_GLYPH: &str = "▓";
/// Glyph of free cached memory.
pub const FREE_GLYPH: &str = "░";
/// First cell of a block that directly follows a block of the same look (zoomed segments):
/// a half-cell gap in the block's own colour.
pub const BOUNDARY_GLYPH: &str = "▐";
/// Glyph of unmapped address space.
pub const UNMAPPED_GLYPH: &str = " ";

/// Allocated (active) memory.
pub const ALLOCATED: Color = Color::LightGreen;
/// Freed, waiting on another stream.
pub const PENDING: Color = Color::Yellow;
/// Rounding waste.
pub const WASTE: Color = Color::Green;
/// Free, cached.
pub const FREE: Color = Color::DarkGray;
/// Errors, OOMs, drops.
pub const ALERT: Color = Color::LightRed;
/// Reserved memory in charts.
pub const RESERVED: Color = Color::LightBlue;
/// Active memory in charts.
pub const ACTIVE: Color = Color::LightMagenta;
/// Panel titles and highlights.
pub const ACCENT: Color = Color::Cyan;

/// Style of panel titles.
pub fn title() -> Style {
    Style::new().fg(ACCENT).add_modifier(Modifier::BOLD)
}

/// Style of labels and secondary text: the terminal's own text colour, faint. A fixed grey
/// (ANSI 7, light grey) vanished on a light background (the tabs, `? help`, `not known`);
/// faint text is lighter than the text on a dark background and on a light one.
pub fn dim() -> Style {
    Style::new().add_modifier(Modifier::DIM)
}

/// Style of the selected row or tab.
pub fn selected() -> Style {
    Style::new().add_modifier(Modifier::REVERSED)
}

/// Style of alerts.
pub fn alert() -> Style {
    Style::new().fg(ALERT).add_modifier(Modifier::BOLD)
}

/// Style of a count that must turn red when not zero (drops, resyncs, OOMs).
pub fn alert_if(nonzero: bool) -> Style {
    if nonzero { alert() } else { Style::new() }
}

/// The environment variable that asks for no colours (<https://no-color.org>).
pub const NO_COLOR_VAR: &str = "NO_COLOR";

/// Whether a `NO_COLOR` value asks for no colours: set and not empty, whatever its value.
pub fn no_color_requested(value: Option<&OsStr>) -> bool {
    value.is_some_and(|v| !v.is_empty())
}

/// Removes every colour from `area` of `buf`, keeping the modifiers, and turns the red of
/// alerts into bold underlined text, so that OOMs and drops still stand out.
///
/// A colour-free screen must carry no colour at all: the terminal backend writes a colour
/// change as an SGR sequence, and under `NO_COLOR` crossterm writes it empty (`ESC [ m`),
/// which resets the modifiers drawn before it (the current tab's reverse video was lost).
pub fn strip_colors(buf: &mut Buffer, area: Rect) {
    let area = area.intersection(buf.area);
    for y in area.top()..area.bottom() {
        for x in area.left()..area.right() {
            let cell = &mut buf[(x, y)];
            if cell.fg == ALERT {
                cell.modifier |= Modifier::BOLD | Modifier::UNDERLINED;
            }
            cell.fg = Color::Reset;
            cell.bg = Color::Reset;
        }
    }
}

/// Glyph and colour of a block state.
pub fn block(state: BlockState) -> (&'static str, Color) {
    match state {
        BlockState::ActiveAllocated => (ALLOCATED_GLYPH, ALLOCATED),
        BlockState::ActivePendingFree => (PENDING_GLYPH, PENDING),
        BlockState::Inactive => (FREE_GLYPH, FREE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{OomReport, Sample, State, UiState, View};
    use crate::view::testing::{buffer, rows};

    /// A live state with usage over time and an OOM.
    fn with_oom() -> State {
        let mut state = State {
            ooms: vec![OomReport::example(16)],
            ..State::default()
        };
        for i in 0..40u64 {
            state.timeline.push(Sample {
                x: i as f64,
                reserved: (40 + i) << 20,
                allocated: (10 + i % 7) << 20,
                active: (20 + i % 5) << 20,
            });
        }
        state.timeline.ooms.push(30.0);
        state
    }

    fn screen(state: &State, ui: &UiState) -> Buffer {
        let mut buf = buffer(100, 30);
        crate::view::render(buf.area, &mut buf, state, ui);
        buf
    }

    /// The cells of the tab line under `label`.
    fn tab_cells<'a>(buf: &'a Buffer, label: &str) -> Vec<&'a ratatui::buffer::Cell> {
        let tabs = &rows(buf)[1];
        let at = tabs.find(label).expect("tab shown");
        let x0 = tabs[..at].chars().count() as u16;
        (x0..x0 + label.chars().count() as u16)
            .map(|x| &buf[(x, 1)])
            .collect()
    }

    #[test]
    fn no_color_is_asked_for_by_any_value_but_the_empty_one() {
        assert!(!no_color_requested(None));
        assert!(!no_color_requested(Some(OsStr::new(""))));
        assert!(no_color_requested(Some(OsStr::new("1"))));
        assert!(no_color_requested(Some(OsStr::new("0"))));
    }

    #[test]
    fn without_colours_the_screen_has_none_and_keeps_the_current_tab_and_oom_cues() {
        let state = with_oom();
        let ui = UiState {
            view: View::Overview,
            no_color: true,
            ..UiState::default()
        };
        let buf = screen(&state, &ui);
        for cell in buf.content() {
            assert_eq!((cell.fg, cell.bg), (Color::Reset, Color::Reset), "{cell:?}");
        }
        for cell in tab_cells(&buf, "1 Overview") {
            assert!(cell.modifier.contains(Modifier::REVERSED | Modifier::BOLD));
        }
        for cell in tab_cells(&buf, "7 OOM") {
            assert!(
                cell.modifier
                    .contains(Modifier::BOLD | Modifier::UNDERLINED)
            );
            assert!(!cell.modifier.contains(Modifier::REVERSED));
        }
        // The other tabs: faint, a modifier, no colour.
        for cell in tab_cells(&buf, "2 Segments") {
            assert_eq!(cell.modifier, Modifier::DIM);
        }
    }

    #[test]
    fn without_colours_the_chart_series_and_ooms_have_symbols_of_their_own() {
        let state = with_oom();
        let plain = UiState {
            no_color: true,
            ..UiState::default()
        };
        let text = rows(&screen(&state, &plain)).join("\n");
        for key in ["• allocated", "+ active", "! OOM"] {
            assert!(text.contains(key), "legend {key}:\n{text}");
        }
        let chart: String = text.lines().skip(12).collect();
        for marker in ['•', '+', '!'] {
            assert!(chart.contains(marker), "marker {marker}:\n{text}");
        }
        // In colour the series are told apart by colour and all keep the braille line.
        let coloured = rows(&screen(&state, &UiState::default())).join("\n");
        assert!(!coloured.lines().skip(12).collect::<String>().contains('•'));
    }
}
