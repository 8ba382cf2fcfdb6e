//! Runs the heap service briefly, without a listener, and checks that the heap's figures and
//! the agent's (folded from the published events) both show the service's work.

use std::process::Command;

#[test]
fn the_heap_service_reports_its_heap_through_the_agent() {
    let out = Command::new(env!("CARGO_BIN_EXE_heap-service"))
        .args(["--seconds", "1", "--no-listen"])
        .output()
        .expect("run heap-service");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let reports: Vec<&str> = stdout.lines().filter(|l| l.starts_with("t=")).collect();
    assert!(!reports.is_empty(), "{stdout}");
    let last = reports.last().unwrap();
    assert!(
        !last.contains(" 0 events"),
        "the agent received events: {last}"
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("done: heap in use")),
        "{stdout}"
    );
}

#[test]
fn bad_arguments_are_reported_not_panicked_on() {
    let out = Command::new(env!("CARGO_BIN_EXE_heap-service"))
        .args(["--seconds", "soon"])
        .output()
        .expect("run heap-service");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--seconds: \"soon\" is not a number"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
