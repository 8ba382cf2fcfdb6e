//! Running the `allocview` binary from tests: the headless demo as the CLI tests start it, and
//! the JSON a successful command printed.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `allocview demo --headless` (the binary at `bin`) in `dir`, its OOM dumps going there too,
/// with no allocator settings from the environment and no stdin: add `--json`, `--seconds`
/// and the rest.
pub fn headless_demo(bin: &str, dir: &Path) -> Command {
    let mut c = Command::new(bin);
    c.current_dir(dir)
        .args(["demo", "--headless"])
        .env("ALLOCVIEW_DUMP_DIR", dir)
        .env_remove("ALLOCVIEW_ALLOC_CONF")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .stdin(Stdio::null());
    c
}

/// How long [`listening_demo`] waits for the demo's socket.
pub const LISTEN_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A headless demo ([`headless_demo`]) in `dir` for `seconds`, serving attach clients on
/// `dir/demo.sock`, with `extra` arguments too; returned (killed when dropped) once the socket
/// is there, with the address to attach to.
///
/// # Panics
/// The demo does not start, or opens no socket within [`LISTEN_WAIT`].
pub fn listening_demo(
    bin: &str,
    dir: &Path,
    seconds: &str,
    extra: &[&str],
) -> (crate::tmux::Child, String) {
    let sock = dir.join("demo.sock");
    let addr = format!("unix:{}", sock.display());
    let child = headless_demo(bin, dir)
        .args(["--seconds", seconds, "--listen", &addr])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the demo");
    let child = crate::tmux::Child(child);
    assert!(
        wait_for_path(&sock, LISTEN_WAIT),
        "the demo opened no socket"
    );
    (child, addr)
}

/// `allocview --attach ADDR --headless --json` (the binary at `bin`): the NDJSON stream on its
/// stdout, piped; stderr discarded.
///
/// # Panics
/// The binary does not start.
pub fn headless_json_stream(bin: &str, addr: &str) -> std::process::Child {
    Command::new(bin)
        .args(["--attach", addr, "--headless", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the headless stream")
}

/// The JSON document `out` printed on stdout, after checking that the command succeeded (its
/// stderr, or stdout that does not parse, is the failure's message).
pub fn json_of_success(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// Waits until `path` exists, polling; whether it did within `timeout` (an agent's socket once
/// it listens).
pub fn wait_for_path(path: &Path, timeout: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while !path.exists() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    true
}

/// Sends signal `name` (`TERM`, `INT`, `KILL`, `STOP`, ...) to process `pid` with `kill`;
/// whether it was delivered.
pub fn signal(pid: u32, name: &str) -> bool {
    Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}
