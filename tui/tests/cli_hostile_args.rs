//! Arguments at the edges of what they take, through the real binary: never a panic.

use std::process::Stdio;
use std::time::Duration;

use allocview_tests::cli::{self, headless_demo, wait_for_path};

/// How long the demo may take to open its socket.
const WAIT: Duration = Duration::from_secs(60);

#[test]
fn a_headless_demo_of_1e30_seconds_runs_until_interrupted_instead_of_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("demo.sock");
    let mut demo = headless_demo(env!("CARGO_BIN_EXE_allocview"), dir.path())
        .args(["--seconds", "1e30", "--json", "--listen"])
        .arg(format!("unix:{}", sock.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("allocview runs");
    if !wait_for_path(&sock, WAIT) {
        let _ = demo.kill();
        panic!("the demo opened no socket: {:?}", demo.wait_with_output());
    }
    // Running (a panic would have ended it with status 101 by the time the socket showed).
    std::thread::sleep(Duration::from_millis(300));
    assert!(cli::signal(demo.id(), "INT"));
    let out = demo.wait_with_output().expect("the demo ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(130), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["interrupted"], "SIGINT", "{report}");
}
