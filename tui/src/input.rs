//! Keys and mouse to intents: input returns an [`Action`]; the app loop applies it (the
//! tokio-console / ratatui demo2 split, so key handling is tested without a terminal).

use ratatui::crossterm::event::{
    Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};

use crate::state::ui::HistogramGrouping;
use crate::state::{UiState, View};

/// Events stepped by `[` and `]`.
pub const BIG_STEP: i64 = 100;
/// Rows moved by PgUp / PgDn.
pub const PAGE: i64 = 20;

/// Where to move in a file's trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seek {
    /// By this many events (negative: back).
    By(i64),
    /// To the next OOM.
    NextOom,
    /// To the next segment event.
    NextSegmentEvent,
    /// Before the first event.
    First,
    /// After the last event.
    Last,
    /// To this event number.
    To(usize),
}

/// An intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Leave.
    Quit,
    /// Ctrl-Z: give the terminal back and stop until `fg` (the loop does it: it needs the
    /// terminal, see [`crate::terminal::suspend`]).
    Suspend,
    /// A key that steps through a file's trace (`[ ] , . < > g`), pressed live: said, not
    /// silently ignored.
    FileOnly(char),
    /// Open or close the help overlay.
    ToggleHelp,
    /// Next view (Tab).
    NextView,
    /// Previous view (Shift-Tab).
    PrevView,
    /// A given view (`1`-`7`, a click on a tab).
    ShowView(View),
    /// Move the selection by this many rows (negative: up).
    Move(i64),
    /// Move to the first row.
    Top,
    /// Move to the last row.
    Bottom,
    /// Previous block / group.
    Left,
    /// Next block / group.
    Right,
    /// Detail, or jump to the block (trace).
    Enter,
    /// Close what is open.
    Back,
    /// Start typing a trace filter.
    StartFilter,
    /// A character of the filter being typed.
    FilterChar(char),
    /// Delete the last character of the filter.
    FilterBackspace,
    /// Ctrl-U while typing a filter: clears the line.
    FilterClear,
    /// Ctrl-W while typing a filter: deletes the last word.
    FilterDeleteWord,
    /// Apply the typed filter.
    FilterApply,
    /// Cycle the segment list's pool filter.
    CycleSegmentFilter,
    /// Zoom into the selected segment, or back out (`z`, segments).
    ToggleZoom,
    /// Histograms per pool / per stream, or back to every group (`p` / `s`, histograms).
    HistogramsBy(HistogramGrouping),
    /// The usage chart's next span (`t`): whole run, last hour, 10 minutes, minute.
    CycleChartSpan,
    /// Pause or resume updates.
    TogglePause,
    /// Reset peak statistics.
    ResetPeaks,
    /// Save a snapshot file.
    Save,
    /// Move through a file's trace.
    Seek(Seek),
    /// Scroll the selected OOM's box by this many pages (PgUp / PgDn in the OOM view).
    ScrollOom(i64),
    /// A left click at a screen cell.
    Click {
        /// Column.
        x: u16,
        /// Row.
        y: u16,
    },
    /// The terminal changed size (redraw).
    Resize,
}

/// The action for a key, given what is on screen; `None` ignores the key.
pub fn key(k: KeyEvent, ui: &UiState, file_mode: bool) -> Option<Action> {
    if k.kind == KeyEventKind::Release {
        return None;
    }
    let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && matches!(k.code, KeyCode::Char('c')) {
        return Some(Action::Quit);
    }
    if ctrl && matches!(k.code, KeyCode::Char('z')) {
        return Some(Action::Suspend);
    }
    if ui.filter_input.is_some() {
        return match k.code {
            KeyCode::Enter => Some(Action::FilterApply),
            KeyCode::Esc => Some(Action::Back),
            KeyCode::Backspace => Some(Action::FilterBackspace),
            KeyCode::Char('u') if ctrl => Some(Action::FilterClear),
            KeyCode::Char('w') if ctrl => Some(Action::FilterDeleteWord),
            KeyCode::Char(_) if ctrl => None,
            KeyCode::Char(c) => Some(Action::FilterChar(c)),
            _ => None,
        };
    }
    if ui.help {
        return match k.code {
            KeyCode::Char('q') => Some(Action::Quit),
            KeyCode::Char('?') | KeyCode::Esc | KeyCode::Enter => Some(Action::ToggleHelp),
            // A terminal too short for the whole overlay scrolls it.
            KeyCode::Up | KeyCode::Char('k') => Some(Action::Move(-1)),
            KeyCode::Down | KeyCode::Char('j') => Some(Action::Move(1)),
            KeyCode::PageUp => Some(Action::Move(-PAGE)),
            KeyCode::PageDown => Some(Action::Move(PAGE)),
            KeyCode::Home => Some(Action::Top),
            KeyCode::End => Some(Action::Bottom),
            _ => None,
        };
    }
    // In a file, ← → step through the trace except where they select (blocks, groups).
    let arrows_select = matches!(ui.view, View::Segments | View::Histograms);
    let action = match k.code {
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Char('?') => Action::ToggleHelp,
        KeyCode::Tab => Action::NextView,
        KeyCode::BackTab => Action::PrevView,
        KeyCode::Char(c @ '1'..='7') => {
            Action::ShowView(View::from_index(c as usize - '1' as usize))
        }
        KeyCode::Up | KeyCode::Char('k') => Action::Move(-1),
        KeyCode::Down | KeyCode::Char('j') => Action::Move(1),
        KeyCode::PageUp if ui.view == View::Oom => Action::ScrollOom(-1),
        KeyCode::PageDown if ui.view == View::Oom => Action::ScrollOom(1),
        KeyCode::PageUp => Action::Move(-PAGE),
        KeyCode::PageDown => Action::Move(PAGE),
        KeyCode::Char('h') => Action::Left,
        KeyCode::Char('l') => Action::Right,
        KeyCode::Left if file_mode && !arrows_select => Action::Seek(Seek::By(-1)),
        KeyCode::Right if file_mode && !arrows_select => Action::Seek(Seek::By(1)),
        KeyCode::Left => Action::Left,
        KeyCode::Right => Action::Right,
        KeyCode::Char(',') | KeyCode::Char('<') if file_mode => Action::Seek(Seek::By(-1)),
        KeyCode::Char('.') | KeyCode::Char('>') if file_mode => Action::Seek(Seek::By(1)),
        KeyCode::Char('[') if file_mode => Action::Seek(Seek::By(-BIG_STEP)),
        KeyCode::Char(']') if file_mode => Action::Seek(Seek::By(BIG_STEP)),
        KeyCode::Char('n') if file_mode => Action::Seek(Seek::NextOom),
        // Live, the OOM view's `n` selects the next OOM listed.
        KeyCode::Char('n') if ui.view == View::Oom => Action::Move(1),
        KeyCode::Char('g') if file_mode => Action::Seek(Seek::NextSegmentEvent),
        KeyCode::Char(c @ ('[' | ']' | ',' | '.' | '<' | '>' | 'g')) => Action::FileOnly(c),
        KeyCode::Home if file_mode => Action::Seek(Seek::First),
        KeyCode::End if file_mode => Action::Seek(Seek::Last),
        KeyCode::Home => Action::Top,
        KeyCode::End => Action::Bottom,
        KeyCode::Enter => Action::Enter,
        KeyCode::Esc => Action::Back,
        KeyCode::Char('/') => Action::StartFilter,
        KeyCode::Char('f') => Action::CycleSegmentFilter,
        KeyCode::Char('z') if ui.view == View::Segments => Action::ToggleZoom,
        // TUI.md: in the histogram view `p` / `s` switch the grouping (pause and save are on
        // every other view; Space pauses on every view).
        KeyCode::Char('p') if ui.view == View::Histograms => {
            Action::HistogramsBy(HistogramGrouping::Pool)
        }
        KeyCode::Char('s') if ui.view == View::Histograms => {
            Action::HistogramsBy(HistogramGrouping::Stream)
        }
        KeyCode::Char('p') | KeyCode::Char(' ') => Action::TogglePause,
        KeyCode::Char('r') => Action::ResetPeaks,
        KeyCode::Char('t') => Action::CycleChartSpan,
        KeyCode::Char('s') => Action::Save,
        _ => return None,
    };
    Some(action)
}

/// The action for a mouse event: the wheel scrolls, a left click selects.
pub fn mouse(m: MouseEvent) -> Option<Action> {
    match m.kind {
        MouseEventKind::ScrollUp => Some(Action::Move(-1)),
        MouseEventKind::ScrollDown => Some(Action::Move(1)),
        MouseEventKind::Down(MouseButton::Left) => Some(Action::Click {
            x: m.column,
            y: m.row,
        }),
        _ => None,
    }
}

/// The action for any terminal event.
pub fn event(e: &Event, ui: &UiState, file_mode: bool) -> Option<Action> {
    match e {
        Event::Key(k) => key(*k, ui, file_mode),
        Event::Mouse(m) => mouse(*m),
        Event::Resize(..) => Some(Action::Resize),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn keys_map_to_intents() {
        let ui = UiState::default();
        assert_eq!(
            key(press(KeyCode::Char('q')), &ui, false),
            Some(Action::Quit)
        );
        assert_eq!(
            key(press(KeyCode::Char('3')), &ui, false),
            Some(Action::ShowView(View::Pools))
        );
        assert_eq!(
            key(press(KeyCode::Char('j')), &ui, false),
            Some(Action::Move(1))
        );
        assert_eq!(
            key(
                KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL),
                &ui,
                false
            ),
            Some(Action::Quit)
        );
        assert_eq!(
            key(
                KeyEvent::new(KeyCode::Char('z'), KeyModifiers::CONTROL),
                &ui,
                false
            ),
            Some(Action::Suspend)
        );
        // Time-travel keys only in files.
        assert_eq!(key(press(KeyCode::Char('n')), &ui, false), None);
        assert_eq!(
            key(press(KeyCode::Char(']')), &ui, true),
            Some(Action::Seek(Seek::By(BIG_STEP)))
        );
        assert_eq!(
            key(press(KeyCode::Right), &ui, true),
            Some(Action::Seek(Seek::By(1)))
        );
        let seg = UiState {
            view: View::Segments,
            ..UiState::default()
        };
        assert_eq!(key(press(KeyCode::Right), &seg, true), Some(Action::Right));
        assert_eq!(
            key(press(KeyCode::Char('z')), &seg, false),
            Some(Action::ToggleZoom)
        );
        assert_eq!(key(press(KeyCode::Char('z')), &ui, false), None);
        let hist = UiState {
            view: View::Histograms,
            ..UiState::default()
        };
        assert_eq!(
            key(press(KeyCode::Char('p')), &hist, false),
            Some(Action::HistogramsBy(HistogramGrouping::Pool))
        );
        assert_eq!(
            key(press(KeyCode::Char('s')), &hist, true),
            Some(Action::HistogramsBy(HistogramGrouping::Stream))
        );
        assert_eq!(
            key(press(KeyCode::Char('p')), &ui, false),
            Some(Action::TogglePause)
        );
        // Space pauses and resumes everywhere, the histogram view included.
        for ui in [&ui, &hist] {
            assert_eq!(
                key(press(KeyCode::Char(' ')), ui, false),
                Some(Action::TogglePause)
            );
        }
        assert_eq!(key(press(KeyCode::End), &ui, false), Some(Action::Bottom));
        // The chart's span, live and in files.
        for file in [false, true] {
            assert_eq!(
                key(press(KeyCode::Char('t')), &ui, file),
                Some(Action::CycleChartSpan)
            );
        }
    }

    #[test]
    fn typing_a_filter_captures_letters() {
        let ui = UiState {
            filter_input: Some(String::new()),
            ..UiState::default()
        };
        assert_eq!(
            key(press(KeyCode::Char('q')), &ui, false),
            Some(Action::FilterChar('q'))
        );
        assert_eq!(
            key(press(KeyCode::Enter), &ui, false),
            Some(Action::FilterApply)
        );
        assert_eq!(key(press(KeyCode::Esc), &ui, false), Some(Action::Back));
        let ctrl = |c| KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL);
        assert_eq!(key(ctrl('u'), &ui, false), Some(Action::FilterClear));
        assert_eq!(key(ctrl('w'), &ui, false), Some(Action::FilterDeleteWord));
        // Other control keys type nothing.
        assert_eq!(key(ctrl('x'), &ui, false), None);
    }

    #[test]
    fn the_wheel_scrolls_and_clicks_select() {
        let m = MouseEvent {
            kind: MouseEventKind::Down(MouseButton::Left),
            column: 4,
            row: 1,
            modifiers: KeyModifiers::NONE,
        };
        assert_eq!(mouse(m), Some(Action::Click { x: 4, y: 1 }));
    }
}
