//! `allocview demo --headless` stopped by SIGTERM or SIGINT, through the real binary: the report
//! of what ran so far is printed (JSON or text, marked as interrupted), the agent's socket is
//! removed, and the exit status is 128 + the signal's number.

use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use allocview_tests::cli::{self, headless_demo, json_of_success, wait_for_path};

/// How long the demo may take to open its socket.
const WAIT: Duration = Duration::from_secs(60);

/// `allocview demo --headless --listen unix:SOCK --seconds 300 EXTRA`, started in `dir`.
fn start_demo(dir: &Path, sock: &Path, extra: &[&str]) -> Child {
    headless_demo(env!("CARGO_BIN_EXE_allocview"), dir)
        .args(["--seconds", "300", "--listen"])
        .arg(format!("unix:{}", sock.display()))
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("allocview runs")
}

/// Waits for the socket, sends `signal` (`TERM`, `INT`) and collects the output.
fn interrupt(mut demo: Child, sock: &Path, signal: &str) -> Output {
    if !wait_for_path(sock, WAIT) {
        let _ = demo.kill();
        panic!("the demo opened no socket: {:?}", demo.wait_with_output());
    }
    assert!(cli::signal(demo.id(), signal));
    demo.wait_with_output().expect("the demo ends")
}

#[test]
fn sigterm_prints_the_json_report_marked_interrupted_removes_the_socket_and_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("demo.sock");
    let out = interrupt(start_demo(dir.path(), &sock, &["--json"]), &sock, "TERM");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(report["interrupted"], "SIGTERM", "{report}");
    assert!(report["stats"].as_object().is_some_and(|s| !s.is_empty()));
    assert!(stderr.contains("stopped by SIGTERM"), "{stderr}");
    assert!(!sock.exists(), "the socket was left behind");
}

#[test]
fn sigint_prints_the_text_report_marked_interrupted_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("demo.sock");
    let out = interrupt(start_demo(dir.path(), &sock, &[]), &sock, "INT");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("allocview demo (train") && text.contains("(interrupted by SIGINT)"),
        "{text}"
    );
    assert!(text.contains("memory_stats keys"), "{text}");
    assert!(!sock.exists(), "the socket was left behind");
}

#[test]
fn a_run_that_ends_on_its_own_is_not_marked_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let out = headless_demo(env!("CARGO_BIN_EXE_allocview"), dir.path())
        .args(["--json", "--seconds", "0.3"])
        .output()
        .unwrap();
    let report = json_of_success(&out);
    assert!(report.get("interrupted").is_none(), "{report}");
}
