//! Ctrl-Z suspends the dashboard as it does any terminal program: in a real terminal (tmux)
//! with an interactive shell doing job control, Ctrl-Z gives the terminal back (normal screen,
//! cooked mode, echo, the cursor shown, no mouse tracking) and stops the job; `fg` brings the
//! dashboard back, drawn whole, and it still answers keys and quits cleanly.

use allocview_tests::tmux::{self, Session};

/// The dashboard's tab row (on screen only while it is drawn).
const TABS: &str = " 1 Overview  2 Segments";
/// What the shell prints of the terminal's mode after the job stopped.
const MODE_MARK: &str = "MODE=";

#[test]
fn ctrl_z_gives_the_terminal_back_and_fg_redraws_the_dashboard() {
    if !tmux::available("ctrl_z_gives_the_terminal_back_and_fg_redraws_the_dashboard") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // An interactive shell (job control), as a user's terminal has.
    let s = Session::start_private("PS1='sh> ' bash --norc --noprofile -i", 100, 30);
    s.wait_for(&["sh>"]);
    s.type_text(&format!(
        "cd {} && {} demo --device-memory 8GiB",
        dir.path().display(),
        env!("CARGO_BIN_EXE_allocview")
    ));
    s.send(&["Enter"]);
    s.wait_for(&[TABS, "● live"]);
    assert_eq!(s.display("#{alternate_on}").trim(), "1");

    s.send(&["C-z"]);
    let screen = s.wait_for(&["Stopped"]);
    assert!(!screen.contains(TABS), "the dashboard is gone:\n{screen}");
    let flags = s.display("#{alternate_on} #{cursor_flag} #{mouse_any_flag} #{mouse_button_flag}");
    assert_eq!(
        flags.trim(),
        "0 1 0 0",
        "normal screen, cursor shown, no mouse mode"
    );
    // The shell's terminal is in cooked mode with echo while the job is stopped.
    s.type_text(&format!(
        "echo {MODE_MARK}$(stty -a | tr ' ' '\\n' | grep -x -e icanon -e -icanon -e echo -e -echo | tr '\\n' ,)"
    ));
    s.send(&["Enter"]);
    s.wait_for(&[&format!("\n{MODE_MARK}icanon,echo,")]);

    // `fg`: the dashboard again, drawn whole (its header, tabs and footer), live.
    s.type_text("fg");
    s.send(&["Enter"]);
    let screen = s.wait_for(&[TABS, "● live", " q quit  ? help"]);
    assert!(
        !screen.contains("sh>"),
        "the shell's lines show through:\n{screen}"
    );
    assert_eq!(s.display("#{alternate_on}").trim(), "1");
    // It answers keys, and quits to a normal terminal.
    s.send(&["3"]);
    s.wait_for(&["largest free"]);
    s.send(&["q"]);
    s.type_text(&format!(
        "echo {MODE_MARK}$(stty -a | tr ' ' '\\n' | grep -x -e icanon -e -icanon | tr '\\n' ,)done"
    ));
    s.send(&["Enter"]);
    s.wait_for(&[&format!("\n{MODE_MARK}icanon,done")]);
    assert_eq!(s.display("#{alternate_on}").trim(), "0");
}

#[test]
fn ctrl_z_under_a_program_that_waits_for_the_dashboard_gives_the_prompt_back() {
    // `cargo run -- demo` (the README's command) or a script: the job the shell waits for is
    // the wrapper; stopping the dashboard alone left the shell waiting, the screen blank.
    let test = "ctrl_z_under_a_program_that_waits_for_the_dashboard_gives_the_prompt_back";
    if !tmux::available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Session::start_private("PS1='sh> ' bash --norc --noprofile -i", 100, 30);
    s.wait_for(&["sh>"]);
    s.type_text(&format!(
        "cd {} && sh -c '{} demo --device-memory 8GiB; echo AFTER'",
        dir.path().display(),
        env!("CARGO_BIN_EXE_allocview")
    ));
    s.send(&["Enter"]);
    s.wait_for(&[TABS, "● live"]);
    s.send(&["C-z"]);
    s.wait_for(&["Stopped"]);
    s.type_text(&format!("echo {MODE_MARK}prompt"));
    s.send(&["Enter"]);
    s.wait_for(&[&format!("\n{MODE_MARK}prompt")]);
    s.type_text("fg");
    s.send(&["Enter"]);
    s.wait_for(&[TABS, "● live"]);
    s.send(&["q"]);
    s.wait_for(&["AFTER"]);
}
