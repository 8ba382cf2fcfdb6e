//! A dashboard whose terminal goes away without a SIGHUP ends as if it got one: with no
//! controlling terminal (`setsid`), closing the window sends no SIGHUP, reads of the hung-up
//! terminal return nothing at once, and the input library read in a loop that never returned:
//! the dashboard spun at a full core forever, with no terminal to quit from.

use std::path::Path;
use std::time::{Duration, Instant};

use allocview_tests::tmux::{self, Session};

/// How long the process may take to notice (the watch looks every 250 ms).
const NOTICE: Duration = Duration::from_secs(10);

/// Kills the process on drop if it is still there (the old code's spinning dashboard).
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if Path::new(&format!("/proc/{}", self.0)).exists() {
            let _ = std::process::Command::new("kill")
                .args(["-9", &self.0.to_string()])
                .status();
        }
    }
}

#[test]
fn a_dashboard_without_a_controlling_terminal_ends_when_its_window_closes() {
    if !tmux::available("a_dashboard_without_a_controlling_terminal_ends_when_its_window_closes") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let cmd = format!(
        "cd {} && setsid -w sh -c 'echo $$ > {}; exec {} demo --device-memory 8GiB'",
        dir.path().display(),
        pidfile.display(),
        env!("CARGO_BIN_EXE_allocview")
    );
    let s = Session::start_private(&cmd, 100, 30);
    s.wait_for(&[" 1 Overview  2 Segments", "● live"]);
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _guard = KillOnDrop(pid);
    let proc_dir = format!("/proc/{pid}");
    assert!(Path::new(&proc_dir).exists());
    // The window (and its terminal) goes: the tmux server with it.
    drop(s);
    let deadline = Instant::now() + NOTICE;
    while Path::new(&proc_dir).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let state = std::fs::read_to_string(format!("{proc_dir}/stat")).unwrap_or_default();
    // Gone, or a zombie its parent (setsid, gone too) left to init for a moment.
    assert!(
        state.is_empty() || state.contains(") Z "),
        "the dashboard still runs {} s after its terminal closed: {state}",
        NOTICE.as_secs()
    );
}
