//! End to end: a Rust service whose global allocator is `Instrumented` (the
//! `allocview-examples` package's `heap-service`) serves its agent on a socket, and
//! `allocview --attach unix:... --headless --once` shows its host heap, as JSON and as text.
//!
//! The service's binary belongs to another package, so it is built here with cargo (into this
//! test's own target folder) before it runs. Every wait is bounded; the service is killed when
//! the test ends, passing or failing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long the service may take to open its socket, and the agent to fold its first events.
const WAIT: Duration = Duration::from_secs(60);
/// Poll interval of the waits.
const POLL: Duration = Duration::from_millis(100);
/// How long the service runs unless killed first (longer than any wait here).
const SERVICE_SECONDS: &str = "300";

/// The `heap-service` binary of this workspace, built (or brought up to date) first.
fn heap_service() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target folder")
        .to_path_buf();
    let target = dir.parent().expect("target root").to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "-p", "allocview-examples", "--bin", "heap-service"])
        .env("CARGO_TARGET_DIR", &target);
    if dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build");
    assert!(status.success(), "cargo build -p allocview-examples failed");
    let bin = dir.join("heap-service");
    assert!(bin.exists(), "{} not found", bin.display());
    bin
}

/// The service, killed on drop.
struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn attach(addr: &str, json: bool) -> Output {
    let mut args = vec!["--attach", addr, "--headless", "--once"];
    if json {
        args.push("--json");
    }
    Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .expect("run allocview")
}

fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(POLL);
    }
}

#[test]
fn attaching_to_a_service_with_an_instrumented_heap_shows_its_host_heap() {
    let bin = heap_service();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("heap-service.sock");
    let addr = format!("unix:{}", sock.display());
    let mut service = Service(
        Command::new(bin)
            .args(["--seconds", SERVICE_SECONDS, "--listen", &addr])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start heap-service"),
    );
    wait_until("the service's socket", || {
        if let Ok(Some(status)) = service.0.try_wait() {
            panic!("heap-service exited early: {status}");
        }
        sock.exists().then_some(())
    });

    // JSON: the agent's state with the host heap folded from the allocator's events.
    let host = wait_until("host heap figures over --json", || {
        let out = attach(&addr, true);
        if !out.status.success() {
            return None;
        }
        let state: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let host = state.get("host").filter(|h| !h.is_null())?.clone();
        (host["allocations"]["freed"].as_i64()? > 0).then_some(host)
    });
    assert!(
        host["allocations"]["allocated"].as_i64().unwrap() > 0,
        "{host}"
    );
    assert!(host["bytes"]["allocated"].as_i64().unwrap() > 0, "{host}");
    assert!(host["bytes"]["peak"].as_i64().unwrap() > 0, "{host}");

    // Text: the host heap's line, in place of "no device events yet".
    let out = attach(&addr, false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.contains("heap-service host heap: in use"))
        .unwrap_or_else(|| panic!("no host heap line:\n{text}"));
    for word in ["peak", "allocations", "frees", "live", "total allocated"] {
        assert!(line.contains(word), "{word:?} missing: {line}");
    }
    assert!(!text.contains("no device events yet"), "{text}");
}
