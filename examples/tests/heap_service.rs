//! Runs the heap service briefly, without a listener, and checks that the heap's figures and
//! the agent's (folded from the published events) both show the service's work.

use std::process::{Command, Output};

use allocview_tests::cli;

/// `heap-service ARGS` run with `env` set, to its end.
fn heap_service(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_heap-service"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run heap-service")
}

#[test]
fn the_heap_service_reports_its_heap_through_the_agent() {
    let out = heap_service(&["--seconds", "1", "--no-listen"], &[]);
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
    let out = heap_service(&["--seconds", "soon"], &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--seconds: \"soon\" is not a number"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn help_prints_the_options_and_exits_0() {
    for flag in ["--help", "-h"] {
        let out = heap_service(&[flag], &[]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{flag}: {out:?}");
        for option in [
            "--seconds",
            "--listen",
            "--no-listen",
            "--metrics",
            "--help",
        ] {
            assert!(stdout.contains(option), "{flag}: {stdout}");
        }
    }
}

#[test]
fn a_bad_argument_is_one_line_with_exit_code_2_and_no_backtrace() {
    for args in [&["--frobnicate"][..], &["--seconds", "soon"], &["--listen"]] {
        let out = heap_service(args, &[("RUST_BACKTRACE", "1")]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("heap-service: "), "{stderr}");
        assert!(!stderr.contains("Stack backtrace"), "{stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn the_listening_line_gives_a_pasteable_address_and_command_and_metrics_take_a_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let sock = format!("unix:{}", dir.path().join("hs.sock").display());
    let out = heap_service(
        &[
            "--seconds",
            "0",
            "--listen",
            &sock,
            "--metrics",
            "localhost:0",
        ],
        &[("ALLOCVIEW_TOKEN", "")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let expected = format!("agent listening at {sock}; attach with: allocview --attach {sock}");
    assert!(stdout.lines().any(|l| l == expected), "{stdout}");
    assert!(stdout.contains("metrics at http://"), "{stdout}");
}

#[test]
fn with_a_token_the_listening_line_says_the_attach_needs_it_without_showing_it() {
    let dir = tempfile::tempdir().unwrap();
    let sock = format!("unix:{}", dir.path().join("hs.sock").display());
    let out = heap_service(
        &["--seconds", "0", "--listen", &sock],
        &[("ALLOCVIEW_TOKEN", "s3cret-token")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let expected = format!(
        "agent listening at {sock}; attach with: allocview --attach {sock} (with \
         ALLOCVIEW_TOKEN set to this service's token)"
    );
    assert!(stdout.lines().any(|l| l == expected), "{stdout}");
    assert!(!stdout.contains("s3cret-token"), "{stdout}");
}

#[test]
fn a_listener_that_cannot_bind_is_one_line_that_says_its_os_error_once() {
    let dir = tempfile::tempdir().unwrap();
    let sock = format!("unix:{}", dir.path().join("x/nodir/x.sock").display());
    let out = heap_service(&["--seconds", "0", "--listen", &sock], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert_eq!(stderr.matches("(os error").count(), 1, "{stderr}");
}

#[test]
fn sigterm_and_sigint_stop_the_service_cleanly_and_remove_its_socket() {
    for (signal, name) in [("TERM", "SIGTERM"), ("INT", "SIGINT")] {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("hs.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_heap-service"))
            .args(["--seconds", "300", "--listen"])
            .arg(format!("unix:{}", sock.display()))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run heap-service");
        assert!(
            cli::wait_for_path(&sock, std::time::Duration::from_secs(60)),
            "no socket"
        );
        assert!(cli::signal(child.id(), signal));
        let out = child.wait_with_output().expect("heap-service ends");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stdout}\n{stderr}");
        assert!(stdout.contains(&format!("stopping: {name}")), "{stdout}");
        assert!(stdout.contains("done: heap in use"), "{stdout}");
        assert!(!sock.exists(), "{name}: the socket was left behind");
    }
}
