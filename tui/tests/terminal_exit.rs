//! How the dashboard ends, in a real terminal (tmux, on a private server so no other test's
//! sessions are seen): SIGTERM and SIGHUP give the terminal back (main screen, cursor shown,
//! mouse tracking off, cooked mode), remove the agent's socket and end the process with 128 +
//! the signal's number; `q`
//! after OOMs prints where the demo's dumps went and how to open them; `--attach` to a peer
//! that does not answer says it is connecting meanwhile.

use std::path::Path;
use std::time::{Duration, Instant};

use allocview_tests::tmux;

/// How long a wait for the screen may take.
const WAIT: Duration = Duration::from_secs(30);
/// Poll interval of waits.
const POLL: Duration = Duration::from_millis(100);
/// The terminal's width.
const WIDTH: u16 = 120;
/// The terminal's height.
const HEIGHT: u16 = 36;

/// Runs the demo's dashboard in tmux, listening for attach clients, sends it `signal` once it
/// is live, and checks the terminal afterwards, and that its agent's socket is gone.
fn signal_restores_the_terminal(dir: &Path, signal: &str, number: i32) {
    let bin = env!("CARGO_BIN_EXE_allocview");
    // The shell writes the pid allocview will have (exec), then reports the exit status and
    // whether the terminal is back in cooked mode.
    let cmd = format!(
        "cd {} && sh -c 'echo $$ > pid; exec {bin} demo --device-memory 8GiB --listen unix:demo.sock'; echo EXIT=$?; \
         stty -a | tr ' ' '\\n' | grep -qx icanon && echo MODE=cooked || echo MODE=raw; \
         sleep 600",
        dir.display()
    );
    let t = tmux::Session::start_private(&cmd, WIDTH, HEIGHT);
    t.wait_for(&["● live"]);
    assert_eq!(
        t.display("#{alternate_on}").trim(),
        "1",
        "the dashboard is on"
    );
    let socket = dir.join("demo.sock");
    assert!(socket.exists(), "{signal}: the agent listens");
    let pid = std::fs::read_to_string(dir.join("pid")).unwrap();
    assert!(allocview_tests::cli::signal(
        pid.trim().parse().unwrap(),
        signal
    ));
    let screen = t.wait_for(&["MODE="]);
    assert!(
        screen.contains(&format!("EXIT={}", 128 + number)),
        "{signal}: {screen}"
    );
    assert!(screen.contains("MODE=cooked"), "{signal}: raw mode left on");
    assert_eq!(
        t.display("#{alternate_on} #{cursor_flag} #{mouse_any_flag} #{mouse_sgr_flag}")
            .trim(),
        "0 1 0 0",
        "{signal}: alternate screen, cursor, mouse tracking, SGR mouse"
    );
    assert!(
        !socket.exists(),
        "{signal}: the agent's socket is left behind"
    );
}

#[test]
fn sigterm_and_sighup_restore_the_terminal_and_end_the_dashboard() {
    if !tmux::available("sigterm_and_sighup_restore_the_terminal_and_end_the_dashboard") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    signal_restores_the_terminal(dir.path(), "TERM", 15);
    signal_restores_the_terminal(dir.path(), "HUP", 1);
}

#[test]
fn quitting_the_demo_after_ooms_prints_where_the_dumps_went() {
    if !tmux::available("quitting_the_demo_after_ooms_prints_where_the_dumps_went") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_allocview");
    let cmd = format!(
        "cd {} && ALLOCVIEW_DUMP_DIR=dumps {bin} demo --scenario oom --device-memory 8GiB; \
         echo EXIT=$?; sleep 600",
        dir.path().display()
    );
    let t = tmux::Session::start_private(&cmd, WIDTH, HEIGHT);
    t.wait_for(&["● live"]);
    // The first OOM's dump lands in the dump folder.
    let deadline = Instant::now() + WAIT;
    let dumps = dir.path().join("dumps");
    while !std::fs::read_dir(&dumps).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "pickle"))
    }) {
        assert!(Instant::now() < deadline, "no OOM dump in {WAIT:?}");
        std::thread::sleep(POLL);
    }
    t.send(&["q"]);
    let screen = t.wait_for(&["EXIT="]);
    assert!(screen.contains("EXIT=0"), "{screen}");
    assert_eq!(t.display("#{alternate_on}").trim(), "0");
    assert!(screen.contains("OOM dumps written:"), "{screen}");
    // The relative dump folder was made absolute when the agent started: paths to paste
    // anywhere.
    let dumps = dumps.display();
    assert!(
        screen.contains(&format!("allocview open {dumps}/oom-0001-pid"))
            && screen.contains(&format!("allocview summary {dumps}/oom-0001-pid")),
        "{screen}"
    );
}

#[test]
fn attaching_to_a_silent_peer_says_it_is_connecting_meanwhile() {
    if !tmux::available("attaching_to_a_silent_peer_says_it_is_connecting_meanwhile") {
        return;
    }
    // Accepts connections (the kernel's backlog does) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let bin = env!("CARGO_BIN_EXE_allocview");
    let cmd = format!("{bin} --attach {addr}; echo EXIT=$?; sleep 600");
    let t = tmux::Session::start_private(&cmd, WIDTH, HEIGHT);
    t.wait_for(&[&format!("connecting to {addr}…")]);
    // Then the client's timeout: the note is erased, the error takes its place.
    let screen = t.wait_for(&["EXIT="]);
    assert!(screen.contains("EXIT=1"), "{screen}");
    assert!(!screen.contains("connecting to"), "{screen}");
    assert!(
        screen.contains(&format!("{addr} did not answer")),
        "{screen}"
    );
    drop(silent);
}
