//! A terminal whose locale is not UTF-8 (`LANG=C`) gets the dashboard in ASCII: before, the
//! box drawing, block glyphs and braille went out as UTF-8 bytes such a terminal shows as
//! several garbage cells each, and the layout fell apart. Every view (and the help) is drawn
//! with one ASCII character a cell, borders as `+-|`, blocks as `#%=.`; in a real terminal
//! (tmux), `LANG=C allocview demo` draws so, and a UTF-8 locale keeps the Unicode screen.

#[path = "support/screen.rs"]
#[allow(dead_code)]
mod screen;
#[path = "support/builders.rs"]
mod support;

use allocview::state::{UiState, View};
use allocview_tests::tmux::{self, Session};

#[test]
fn every_view_in_ascii_has_one_ascii_character_a_cell() {
    let (app, _d) = support::file_app("/tmp/run.pickle", &support::traced_snapshot(3));
    for (state, what) in [(support::live_state(), "live"), (app.state.clone(), "file")] {
        let ascii = UiState {
            ascii: true,
            ..UiState::default()
        };
        for ui in screen::every_view_and_help(ascii) {
            let t = screen::screen(&state, &ui, 120, 36);
            let text = screen::text(t.backend().buffer());
            let (view, help) = (ui.view, ui.help);
            assert!(text.is_ascii(), "{what} {view:?} help {help}:\n{text}");
            // Still 36 rows of 120 cells: nothing was widened or dropped.
            assert!(text.lines().all(|l| l.len() == 120), "{text}");
            assert!(text.lines().any(|l| l.starts_with('+')), "{text}");
        }
    }
    // The blocks keep their roles.
    let ui = UiState {
        view: View::Segments,
        ascii: true,
        ..UiState::default()
    };
    let text = screen::text(
        screen::screen(&support::live_state(), &ui, 120, 36)
            .backend()
            .buffer(),
    );
    assert!(text.contains("###") && text.contains("..."), "{text}");
}

#[test]
fn lang_c_draws_the_demo_in_ascii_and_a_utf8_locale_does_not() {
    if !tmux::available("lang_c_draws_the_demo_in_ascii_and_a_utf8_locale_does_not") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_allocview");
    let start = |locale: &str| {
        let cmd = format!(
            "cd {} && env -u LC_ALL -u LC_CTYPE LANG={locale} {bin} demo --device-memory 8GiB",
            dir.path().display()
        );
        Session::start_private(&cmd, 120, 36)
    };
    let s = start("C");
    let screen = s.wait_for(&["+ Memory -", " 1 Overview  2 Segments", "* live"]);
    assert!(screen.is_ascii(), "{screen}");
    s.quit_cleanly();
    let s = start("C.UTF-8");
    s.wait_for(&["┌ Memory ─", "● live"]);
    s.quit_cleanly();
}
