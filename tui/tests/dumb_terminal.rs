//! `TERM=dumb` (Emacs' shell buffer, some IDE consoles and CI log viewers) cannot draw a
//! dashboard: the escape codes would land there as text. In a real terminal (tmux) with
//! `TERM=dumb`, `allocview demo` says so with what to run instead, exits 1 and leaves the
//! terminal as it was; the same run with a capable `TERM` opens the dashboard.

use allocview_tests::tmux::{self, Session};

#[test]
fn term_dumb_gets_a_clear_message_instead_of_a_garbled_screen() {
    if !tmux::available("term_dumb_gets_a_clear_message_instead_of_a_garbled_screen") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cmd = format!(
        "cd {} && TERM=dumb {} demo --device-memory 8GiB",
        dir.path().display(),
        env!("CARGO_BIN_EXE_allocview")
    );
    let s = Session::start_private(&cmd, 120, 30);
    let screen = s.wait_for(&[&format!("{}1", tmux::EXIT_MARK)]);
    let flat = screen.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains(
            "allocview: the terminal is a dumb one (TERM=dumb): it cannot draw a dashboard"
        ),
        "{screen}"
    );
    assert!(
        flat.contains("allocview demo --headless"),
        "what to run instead:\n{screen}"
    );
    assert!(!screen.contains(" 1 Overview  2 Segments"), "{screen}");
    assert_eq!(s.display("#{alternate_on}").trim(), "0");
}

#[test]
fn a_capable_term_opens_the_dashboard() {
    if !tmux::available("a_capable_term_opens_the_dashboard") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cmd = format!(
        "cd {} && TERM=xterm {} demo --device-memory 8GiB",
        dir.path().display(),
        env!("CARGO_BIN_EXE_allocview")
    );
    let s = Session::start_private(&cmd, 120, 30);
    s.wait_for(&[" 1 Overview  2 Segments", "● live"]);
    s.quit_cleanly();
}
