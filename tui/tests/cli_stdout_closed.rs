//! Every command that prints to stdout ends quietly (status 0, no panic, no message) when the
//! reader has closed the pipe, as `allocview replay FILE --json | head -1` does.

use std::process::{Command, Stdio};

/// A small RMM log (CSV) for `replay`: a few allocations and frees on one stream.
fn rmm_log() -> String {
    let rows: Vec<(&str, u64, u64, u64)> = (0..40u64)
        .flat_map(|i| {
            let (ptr, size) = (0x1000 * (i + 1), (i + 1) << 20);
            [("allocate", ptr, size, 1), ("free", ptr, size, 1)]
        })
        .collect();
    allocview_tests::fixtures::rmm_log(&rows)
}

/// Runs `allocview ARGS` with its stdout a pipe whose reading end is closed before the command
/// writes anything; checks it exits with status 0 and says nothing on stderr about it.
fn runs_quietly_with_stdout_closed(args: &[&str]) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("allocview runs");
    // The reader goes away at once: every write to stdout fails with EPIPE.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("allocview ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("panicked") && !err.contains("Broken pipe"),
        "allocview {args:?} with stdout closed: {:?}\nstderr: {err}",
        out.status
    );
}

#[test]
fn replay_summary_and_the_headless_demo_end_quietly_when_stdout_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("rmm.csv");
    std::fs::write(&log, rmm_log()).unwrap();
    let log = log.to_str().unwrap();
    let pickle = dir.path().join("replayed.pickle");
    // Write a snapshot for `summary` (the message about it goes to stdout, too).
    let made = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(["replay", log, "--out", pickle.to_str().unwrap()])
        .output()
        .expect("allocview runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let pickle = pickle.to_str().unwrap();

    runs_quietly_with_stdout_closed(&["replay", log, "--json"]);
    runs_quietly_with_stdout_closed(&["replay", log]);
    runs_quietly_with_stdout_closed(&["summary", pickle]);
    runs_quietly_with_stdout_closed(&["summary", pickle, "--json"]);
    runs_quietly_with_stdout_closed(&["demo", "--headless", "--seconds", "0", "--json"]);
}

#[test]
fn screenshot_ends_quietly_when_stdout_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    runs_quietly_with_stdout_closed(&[
        "screenshot",
        "--out",
        dir.path().to_str().unwrap(),
        "--width",
        "80",
        "--height",
        "24",
    ]);
}
