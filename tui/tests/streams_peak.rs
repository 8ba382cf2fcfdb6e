//! The Streams view's `peak` column, beside `reserved`, read as the most reserved; live, a
//! key under the table now says it is the most allocated (a file already said so for its
//! trace window).

#[path = "support/screen.rs"]
#[allow(dead_code)]
mod screen;
#[path = "support/builders.rs"]
mod support;

use allocview::state::streams::StreamRow;
use allocview::state::{State, UiState, View};
use allocview::view::streams::{PEAK_KEY_FILE, PEAK_KEY_LIVE};

/// The live state with per-stream peaks (as a live source gives them).
fn live_with_peaks() -> State {
    let mut state = support::live_state();
    state.streams = state
        .stream_rows()
        .into_iter()
        .map(|r| StreamRow {
            peak: Some(r.reserved),
            ..r
        })
        .collect();
    state
}

fn streams_text(state: &State, w: u16, h: u16) -> String {
    screen::view_text(state, View::Streams, UiState::default(), w, h)
}

#[test]
fn the_peak_column_says_what_it_is_live_and_in_a_file() {
    for (w, h) in [(120, 36), (80, 24)] {
        let live = streams_text(&live_with_peaks(), w, h);
        assert!(live.contains(PEAK_KEY_LIVE.trim()), "{live}");
    }
    assert!(PEAK_KEY_LIVE.contains("allocated"));
    let (app, _d) = support::file_app("/tmp/run.pickle", &support::traced_snapshot(3));
    let file = streams_text(&app.state, 120, 36);
    assert!(file.contains(PEAK_KEY_FILE.trim()), "{file}");
    // Without peaks (the column shows `-`), no key.
    let none = streams_text(&support::live_state(), 120, 36);
    assert!(!none.contains("peak: "), "{none}");
}
