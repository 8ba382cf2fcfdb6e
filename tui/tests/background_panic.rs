//! A panic on a background thread while the dashboard holds the terminal leaves the screen
//! intact: in a real terminal (tmux), `allocview open` of a file with OOMs whose what-if
//! replays are made to panic (an environment variable only the tests set) keeps drawing the
//! dashboard, with no raw panic text over it, says the error in its status line, and prints
//! the panic's message once the terminal is restored.

#[path = "support/builders.rs"]
mod support;
use std::path::PathBuf;

use allocview::source::what_if::PANIC_IN_WHAT_IF_ENV;
use allocview::units::GIB;
use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_alloc::snapshot::DeviceMeta;
use allocview_tests::tmux::{self, Session};

/// What `stty` prints for canonical (cooked) mode; raw mode prints `-icanon`.
const COOKED: &str = "TTY=icanon";
/// The panic's own message (see [`allocview::source::what_if::panic_if_asked`]).
const PANIC_TEXT: &str = "the what-if replays panic";

/// A recorded run with OOMs on a 1 GiB device (so that its what-if replays run on their
/// thread) saved as `run.json` in a fresh folder, or `None` (with a skip line) without tmux.
fn saved_run_with_ooms(test: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    if !tmux::available(test) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.json");
    let mut snap = support::traced_snapshot(2);
    snap.devices = vec![DeviceMeta {
        device: 0,
        total_memory: Some(GIB),
        trace_overflow: 0,
        oom: None,
    }];
    snapshot_file::save(&file, &snap, FileFormat::Json).unwrap();
    Some((dir, file))
}

#[test]
fn a_panicking_what_if_thread_leaves_the_screen_intact_and_its_message_follows_the_exit() {
    let test =
        "a_panicking_what_if_thread_leaves_the_screen_intact_and_its_message_follows_the_exit";
    let Some((_dir, file)) = saved_run_with_ooms(test) else {
        return;
    };
    let cmd = format!(
        "RUST_BACKTRACE=0 {PANIC_IN_WHAT_IF_ENV}=1 {} open {}; rc=$?; \
         echo TTY=$(stty -a | tr ' ' '\\n' | grep -x -e icanon -e -icanon); (exit $rc)",
        env!("CARGO_BIN_EXE_allocview"),
        file.display()
    );
    let s = Session::start_private(&cmd, 120, 36);
    // The dashboard says the error in its status line (over two rows: it is long).
    let screen = s.wait_for(&[
        " 1 Overview  2 Segments",
        "error: thread 'allocview-what-if'",
    ]);
    let flat = screen.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains(PANIC_TEXT), "the status says why:\n{screen}");
    // Nothing raw landed on the screen: std's panic text ("note: run with `RUST_BACKTRACE`")
    // and its "thread ... panicked" at the start of a line are not there, and the header and
    // the box borders are whole.
    assert!(!screen.contains("note: run with"), "raw stderr:\n{screen}");
    assert!(
        !screen.lines().any(|l| l.starts_with("thread ")),
        "raw stderr:\n{screen}"
    );
    assert!(
        screen
            .lines()
            .next()
            .unwrap_or("")
            .starts_with(" allocview "),
        "the header row was written over:\n{screen}"
    );
    // The OOM view says the replays stopped, and why, and the dashboard keeps working.
    s.send(&["7"]);
    let screen = s.wait_for(&["OOM #1", "the what-if replays stopped without a result"]);
    let flat = screen.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains(&format!(
            "stopped without a result: {PANIC_IN_WHAT_IF_ENV} is set"
        )),
        "the OOM view says why:\n{screen}"
    );
    let flags = s.display("#{alternate_on}");
    assert_eq!(flags.trim(), "1", "still on the dashboard's screen");
    // On exit: the terminal restored, then the message on the normal screen.
    s.send(&["q"]);
    let screen = s.wait_for(&[&format!("{}0", tmux::EXIT_MARK)]);
    assert!(screen.contains(COOKED), "raw mode is still on:\n{screen}");
    // The message wraps at the terminal's width: read the screen as one text.
    let flat: String = screen.lines().collect();
    let said = flat
        .find("allocview: while the dashboard ran, thread 'allocview-what-if' panicked at ")
        .unwrap_or_else(|| panic!("the message follows the exit:\n{screen}"));
    assert!(flat[said..].contains(PANIC_TEXT), "{screen}");
    let line_of = |text: &str| screen.lines().position(|l| l.contains(text));
    assert!(
        line_of("allocview: while the dashboard ran") < line_of(COOKED),
        "printed after the restore, before the shell goes on:\n{screen}"
    );
    assert!(!screen.contains(" 1 Overview  2 Segments"), "{screen}");
}

#[test]
fn a_kept_panic_that_cannot_be_printed_on_exit_does_not_hang_the_exit() {
    // Stderr on a full disk: printing the kept message fails. The failure is ignored (it
    // panicked inside the restore, whose panic hook then waited for the lock the restore held:
    // a hang on `q`).
    let test = "a_kept_panic_that_cannot_be_printed_on_exit_does_not_hang_the_exit";
    let Some((_dir, file)) = saved_run_with_ooms(test) else {
        return;
    };
    if !std::path::Path::new("/dev/full").exists() {
        println!("skipped: no /dev/full");
        return;
    }
    let cmd = format!(
        "RUST_BACKTRACE=0 {PANIC_IN_WHAT_IF_ENV}=1 {} open {} 2>/dev/full",
        env!("CARGO_BIN_EXE_allocview"),
        file.display()
    );
    let s = Session::start_private(&cmd, 120, 36);
    s.wait_for(&["error: thread 'allocview-what-if'"]);
    s.send(&["q"]);
    s.wait_for(&[&format!("{}0", tmux::EXIT_MARK)]);
}
