//! Readable on a light background: no text or mark is drawn in the fixed light greys or white
//! that vanish on white (ANSI 7 and 15: the tabs, `? help`, `not known` and the chart's
//! time-travel cursor were). Secondary text is faint instead, which terminals draw lighter
//! than their text colour on any background; a screenshot draws it halfway to the background.

#[path = "support/screen.rs"]
#[allow(dead_code)]
mod screen;
#[path = "support/builders.rs"]
mod support;

use allocview::screenshot;
use allocview::state::{State, UiState};
use ratatui::style::{Color, Modifier};

/// Colours a light background swallows.
const INVISIBLE_ON_WHITE: [Color; 2] = [Color::Gray, Color::White];

fn check(state: &State, what: &str) {
    for ui in screen::every_view_and_help(UiState::default()) {
        let t = screen::screen(state, &ui, 120, 36);
        let buf = t.backend().buffer();
        for (i, cell) in buf.content().iter().enumerate() {
            assert!(
                !INVISIBLE_ON_WHITE.contains(&cell.fg),
                "{what} {:?} help {}: {:?} in {:?} at {i}:\n{}",
                ui.view,
                ui.help,
                cell.symbol(),
                cell.fg,
                screen::text(buf)
            );
        }
    }
}

#[test]
fn no_view_draws_in_colours_that_vanish_on_white() {
    check(&support::live_state(), "live");
    let (app, _d) = support::file_app("/tmp/run.pickle", &support::traced_snapshot(3));
    check(&app.state, "file");
}

#[test]
fn the_tabs_not_shown_are_faint_and_a_screenshot_draws_faint_text_lighter() {
    let t = screen::screen(&support::live_state(), &UiState::default(), 120, 36);
    let buf = t.backend().buffer();
    let row: String = (0..120).map(|x| buf[(x, 1)].symbol()).collect();
    let x = row.find("2 Segments").unwrap() as u16;
    let cell = &buf[(x, 1)];
    assert!(cell.modifier.contains(Modifier::DIM), "{cell:?}");
    let faint = screenshot::look(cell);
    let mut plain_cell = cell.clone();
    plain_cell.modifier.remove(Modifier::DIM);
    let plain = screenshot::look(&plain_cell);
    assert_ne!(faint.fg, plain.fg);
    // Between the text and the background.
    for i in 0..3 {
        let (lo, hi) = (plain.fg[i].min(plain.bg[i]), plain.fg[i].max(plain.bg[i]));
        assert!((lo..=hi).contains(&faint.fg[i]), "{faint:?} {plain:?}");
    }
}
