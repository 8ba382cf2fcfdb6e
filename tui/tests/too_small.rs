//! A terminal smaller than the dashboard needs says so and how to leave: the footer that
//! lists `q quit` is not drawn then, and a first-time user in a 60x20 window saw only
//! "terminal too small".

#[path = "support/screen.rs"]
#[allow(dead_code)]
mod screen;
#[path = "support/builders.rs"]
mod support;

use allocview::state::{UiState, View};
use allocview::view::{TOO_SMALL_HINT, TOO_SMALL_HINT_SHORT};

#[test]
fn a_terminal_too_small_says_how_to_quit_where_a_row_is_free() {
    for (w, h) in [(60, 20), (73, 18), (40, 12), (60, 3)] {
        let t = screen::view_text(
            &support::live_state(),
            View::Overview,
            UiState::default(),
            w,
            h,
        );
        assert!(t.contains("too small"), "{w}x{h}:\n{t}");
        // Whole, or its short form where it does not fit.
        let hint = if w as usize >= TOO_SMALL_HINT.len() {
            TOO_SMALL_HINT
        } else {
            TOO_SMALL_HINT_SHORT
        };
        assert!(t.contains(hint), "{w}x{h}:\n{t}");
    }
    // Two rows: the message alone; one cell: nothing breaks.
    let t = screen::view_text(
        &support::live_state(),
        View::Overview,
        UiState::default(),
        60,
        2,
    );
    assert!(t.contains("too small") && !t.contains("q quits"), "{t}");
    screen::view_text(
        &support::live_state(),
        View::Overview,
        UiState::default(),
        1,
        1,
    );
}
