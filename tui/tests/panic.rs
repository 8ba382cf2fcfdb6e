//! A panicking dashboard gives the terminal back: in a real terminal (tmux), a dashboard made
//! to panic after its first frame (an environment variable only the tests set) leaves the
//! alternate screen, turns raw mode off, shows the cursor and prints the panic message.

#[path = "support/builders.rs"]
mod support;
use std::path::PathBuf;

use allocview::app::PANIC_AFTER_FIRST_FRAME_ENV;
use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_tests::tmux::{self, Session};

/// What `stty` prints for canonical (cooked) mode; raw mode prints `-icanon`.
const COOKED: &str = "TTY=icanon";

/// A small recorded run saved as `run.json` in a fresh folder, or `None` (with a skip line)
/// without tmux.
fn saved_run(test: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    if !tmux::available(test) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.json");
    snapshot_file::save(&file, &support::traced_snapshot(2), FileFormat::Json).unwrap();
    Some((dir, file))
}

#[test]
fn a_panic_restores_the_terminal_and_prints_the_message() {
    let Some((_dir, file)) = saved_run("a_panic_restores_the_terminal_and_prints_the_message")
    else {
        return;
    };
    // After the program: the terminal's mode (icanon or -icanon) and the program's status.
    let cmd = format!(
        "RUST_BACKTRACE=0 {PANIC_AFTER_FIRST_FRAME_ENV}=1 {} open {} 2>&1; rc=$?; \
         echo TTY=$(stty -a | tr ' ' '\\n' | grep -x -e icanon -e -icanon); (exit $rc)",
        env!("CARGO_BIN_EXE_allocview"),
        file.display()
    );
    let s = Session::start(&cmd, 120, 36);
    let screen = s.wait_for(&[tmux::EXIT_MARK]);
    assert!(
        screen.contains("panicking after the first frame"),
        "no panic message:\n{screen}"
    );
    assert!(screen.contains(COOKED), "raw mode is still on:\n{screen}");
    // The message was printed after the restore: on the normal screen (the alternate one is
    // gone, with anything printed there), in cooked mode (each line starts at column 0; raw
    // mode would carry on from the previous line's end).
    for start in [PANIC_AFTER_FIRST_FRAME_ENV, "note: "] {
        assert!(
            screen.lines().any(|l| l.starts_with(start)),
            "no line starts with {start:?}:\n{screen}"
        );
    }
    assert!(
        screen.contains(&format!("{}101", tmux::EXIT_MARK)),
        "a panic exits with 101:\n{screen}"
    );
    // The dashboard was on the alternate screen: it is gone, the message is on the normal one.
    assert!(!screen.contains(" 1 Overview  2 Segments"), "{screen}");
    // Nothing wrote over the message afterwards (a second exit from the alternate screen
    // would put the cursor back above it): the status line comes after it.
    let line_of = |text: &str| screen.lines().position(|l| l.contains(text));
    assert!(
        line_of("panicking after the first frame") < line_of(tmux::EXIT_MARK),
        "the message was overwritten:\n{screen}"
    );
    // The cursor is shown and the mouse released.
    let flags = s.display("#{cursor_flag} #{mouse_any_flag} #{mouse_button_flag} #{alternate_on}");
    assert_eq!(
        flags.trim(),
        "1 0 0 0",
        "cursor shown, no mouse mode, normal screen"
    );
}

#[test]
fn without_the_variable_the_same_dashboard_runs_and_quits_cleanly() {
    let Some((_dir, file)) =
        saved_run("without_the_variable_the_same_dashboard_runs_and_quits_cleanly")
    else {
        return;
    };
    let cmd = format!(
        "{} open {}",
        env!("CARGO_BIN_EXE_allocview"),
        file.display()
    );
    let s = Session::start(&cmd, 120, 36);
    s.wait_for(&[" 1 Overview  2 Segments", "run.json"]);
    s.quit_cleanly();
}
