//! The live dashboard (`allocview --attach ADDR`, in tmux at 80x24) over a headless demo's
//! agent, through trouble: `r` is confirmed once the agent reset the peaks; the process
//! stopped (SIGSTOP) is said in the header until it continues, and its clean end (SIGTERM) as
//! one; the process killed while the dashboard is paused is noticed, resuming then does not
//! end the dashboard, and the restarted process is named when it reconnects. Through
//! `--headless`: OOM dump paths that a client in another folder can open, and a socket left
//! behind by a dead process said as such. Attaching without an address: the stale sockets the
//! look removed are said on the dashboard.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use allocview_tests::tmux::{self, Child, EXIT_MARK, Session};

/// Longest wait for a socket or a dump.
const WAIT: Duration = Duration::from_secs(60);

const BIN: &str = env!("CARGO_BIN_EXE_allocview");

/// A headless demo in `dir` serving attach clients on `dir/demo.sock`, running `extra` too;
/// returns it once the socket is there, and the address.
fn demo(dir: &Path, extra: &[&str]) -> (Child, String) {
    allocview_tests::cli::listening_demo(BIN, dir, "300", extra)
}

/// The dashboard attached to `addr`, at 80x24, once it shows the live state.
fn dashboard(addr: &str) -> Session {
    let s = Session::start_private(
        &format!("env -u ALLOCVIEW_ADDR {BIN} --attach {addr}"),
        80,
        24,
    );
    s.wait_for(&["● live", "dropped"]);
    s
}

fn signal(child: &Child, name: &str) {
    assert!(
        allocview_tests::cli::signal(child.0.id(), name),
        "kill -{name} failed"
    );
}

#[test]
fn a_stopped_process_is_said_in_the_header_until_it_continues() {
    if !tmux::available("a_stopped_process_is_said_in_the_header_until_it_continues") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (demo, addr) = demo(dir.path(), &[]);
    let s = dashboard(&addr);
    // A reset of the peaks is confirmed once the agent carried it out.
    s.send(&["r"]);
    s.wait_for(&["the agent reset its peak statistics"]);
    signal(&demo, "STOP");
    let screen = s.wait_for(&["◌ no updates", "no update for", "is the process stopped"]);
    // The rate of updates that no longer come is not shown.
    assert!(!screen.contains(" Hz "), "{screen}");
    signal(&demo, "CONT");
    s.wait_for(&["● live", "updates resumed after"]);
    // A clean end is said as one, and the dashboard waits for the process to come back.
    signal(&demo, "TERM");
    s.wait_for(&["◌ reconnecting", "the process ended", "every 1 s (q quits)"]);
    s.quit_cleanly();
}

#[test]
fn a_process_killed_while_paused_is_noticed_and_its_restart_is_named() {
    if !tmux::available("a_process_killed_while_paused_is_noticed_and_its_restart_is_named") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (first, addr) = demo(dir.path(), &[]);
    let s = dashboard(&addr);
    s.send(&["p"]);
    s.wait_for(&["○ paused"]);
    signal(&first, "KILL");
    drop(first);
    // Paused, the connection is still watched.
    s.wait_for(&["◌ reconnecting", "connection lost"]);
    // Resuming with the agent gone does not end the dashboard.
    s.send(&["p"]);
    s.wait_for(&["resumed"]);
    let screen = s.wait_for(&["◌ reconnecting"]);
    assert!(!screen.contains(EXIT_MARK), "{screen}");
    // The service comes back at the same address: a new process, named as such.
    let (second, _) = demo(dir.path(), &[]);
    let screen = s.wait_for(&["● live", "reconnected to a new process, pid"]);
    assert!(
        screen.contains(&format!("pid {}", second.0.id())),
        "{screen}"
    );
    s.quit_cleanly();
}

/// `allocview --attach ADDR --headless --once --json` run in `cwd`.
fn attach_once_json(addr: &str, cwd: &Path) -> std::process::Output {
    Command::new(BIN)
        .current_dir(cwd)
        .args(["--attach", addr, "--headless", "--once", "--json"])
        .env_remove("ALLOCVIEW_ADDR")
        .stdin(Stdio::null())
        .output()
        .expect("run allocview")
}

#[test]
fn oom_dump_paths_reach_a_client_in_another_folder_as_paths_it_can_open() {
    let agent_dir = tempfile::tempdir().unwrap();
    let client_dir = tempfile::tempdir().unwrap();
    let sock = agent_dir.path().join("demo.sock");
    let addr = format!("unix:{}", sock.display());
    // The default dump folder: ./allocview-dumps, relative to the demo's folder.
    let _demo = Child(
        allocview_tests::cli::headless_demo(BIN, agent_dir.path())
            .env_remove("ALLOCVIEW_DUMP_DIR")
            .args(["--scenario", "oom", "--device-memory", "8GiB"])
            .args(["--seconds", "300", "--listen", &addr])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the demo"),
    );
    assert!(allocview_tests::cli::wait_for_path(&sock, WAIT));
    let deadline = Instant::now() + WAIT;
    let paths = loop {
        let out = attach_once_json(&addr, client_dir.path());
        let state = allocview_tests::cli::json_of_success(&out);
        let paths: Vec<String> = state["ooms"]
            .as_array()
            .and_then(|o| o.first())
            .and_then(|o| o["dump_paths"].as_array())
            .map(|p| {
                p.iter()
                    .filter_map(|p| p.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        if !paths.is_empty() {
            break paths;
        }
        assert!(Instant::now() < deadline, "no OOM dump within the wait");
        std::thread::sleep(Duration::from_millis(200));
    };
    for p in &paths {
        let p = Path::new(p);
        assert!(p.is_absolute(), "{}", p.display());
        assert!(
            p.starts_with(agent_dir.path().join("allocview-dumps")),
            "{}",
            p.display()
        );
        // Readable from the client's folder.
        assert!(client_dir.path().join(p).is_file(), "{}", p.display());
    }
}

#[test]
fn a_socket_left_behind_by_a_dead_process_is_said_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("4242.sock");
    // A listener that goes away without removing its socket, as a killed process leaves it.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let out = Command::new(BIN)
        .args([
            "--attach",
            &sock.display().to_string(),
            "--headless",
            "--once",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run allocview");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("nobody is listening there") && err.contains("process that died"),
        "{err}"
    );
}

#[test]
fn stale_sockets_removed_while_looking_for_the_agent_are_said_on_the_dashboard() {
    if !tmux::available(
        "stale_sockets_removed_while_looking_for_the_agent_are_said_on_the_dashboard",
    ) {
        return;
    }
    // The default folder under a runtime folder of the test's own.
    let runtime = tempfile::tempdir().unwrap();
    let sockets = runtime.path().join("allocview");
    std::fs::create_dir(&sockets).unwrap();
    std::fs::set_permissions(
        &sockets,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    // A socket a killed agent left behind, and a live agent beside it.
    drop(std::os::unix::net::UnixListener::bind(sockets.join("4242.sock")).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let sock = sockets.join("demo.sock");
    let _demo = Child(
        allocview_tests::cli::headless_demo(BIN, dir.path())
            .args(["--seconds", "300", "--listen"])
            .arg(format!("unix:{}", sock.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the demo"),
    );
    assert!(allocview_tests::cli::wait_for_path(&sock, WAIT));
    let s = Session::start_private(
        &format!(
            "env -u ALLOCVIEW_ADDR XDG_RUNTIME_DIR={} {BIN} --attach",
            runtime.path().display()
        ),
        120,
        30,
    );
    s.wait_for(&["● live", "removed 1 stale socket in"]);
    assert!(!sockets.join("4242.sock").exists());
    s.quit_cleanly();
}
