//! How `allocview --attach ADDR --headless` ends, through the real binary against a headless
//! demo's agent: the agent's shutdown (SIGTERM to the demo) is a clean end (exit 0), a
//! connection lost without a goodbye (SIGKILL) is an error (exit 1, said on stderr), and while
//! the agent is stopped (SIGSTOP) one line says no update came, and another that they resumed.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// Longest wait for anything (a socket, a line, an exit).
const WAIT: Duration = Duration::from_secs(60);
/// Poll interval of the waits.
const POLL: Duration = Duration::from_millis(50);

/// A child process whose stdout and stderr lines arrive on channels; killed on drop.
struct Watched {
    child: Child,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
    err_seen: Vec<String>,
}

impl Watched {
    fn spawn(cmd: &mut Command) -> Watched {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("process starts");
        let lines = |r: Box<dyn std::io::Read + Send>| {
            let (tx, rx) = channel();
            std::thread::spawn(move || {
                for l in BufReader::new(r).lines().map_while(Result::ok) {
                    if tx.send(l).is_err() {
                        return;
                    }
                }
            });
            rx
        };
        let stdout = lines(Box::new(child.stdout.take().unwrap()));
        let stderr = lines(Box::new(child.stderr.take().unwrap()));
        Watched {
            child,
            stdout,
            stderr,
            err_seen: Vec::new(),
        }
    }

    fn signal(&self, name: &str) {
        assert!(
            allocview_tests::cli::signal(self.child.id(), name),
            "kill -{name} failed"
        );
    }

    /// The next stdout line.
    fn line(&self) -> String {
        self.stdout.recv_timeout(WAIT).expect("a line on stdout")
    }

    /// Waits for a stderr line containing `text`; the lines seen so far.
    fn stderr_until(&mut self, text: &str) -> String {
        let deadline = Instant::now() + WAIT;
        while !self.err_seen.iter().any(|l| l.contains(text)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(l) => self.err_seen.push(l),
                Err(_) => panic!("no {text:?} on stderr: {:?}", self.err_seen),
            }
        }
        self.err_seen.join("\n")
    }

    /// Waits for the exit; its status and all of stderr.
    fn exit(&mut self) -> (ExitStatus, String) {
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "the process did not end");
            std::thread::sleep(POLL);
        };
        while let Ok(l) = self.stderr.recv_timeout(WAIT) {
            self.err_seen.push(l);
        }
        (status, self.err_seen.join("\n"))
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A headless demo serving attach clients on `dir/demo.sock`, and a headless attach
/// streaming from it, once its first line is out.
fn demo_and_attach(dir: &Path, json: bool) -> (Watched, Watched) {
    let sock = dir.join("demo.sock");
    let addr = format!("unix:{}", sock.display());
    let demo = Watched::spawn(
        allocview_tests::cli::headless_demo(env!("CARGO_BIN_EXE_allocview"), dir).args([
            "--seconds",
            "300",
            "--listen",
            &addr,
        ]),
    );
    assert!(
        allocview_tests::cli::wait_for_path(&sock, WAIT),
        "the demo opened no socket"
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allocview"));
    cmd.args(["--attach", &addr, "--headless"])
        .env_remove("ALLOCVIEW_ADDR");
    if json {
        cmd.arg("--json");
    }
    let attach = Watched::spawn(&mut cmd);
    let first = attach.line();
    assert!(!first.is_empty());
    (demo, attach)
}

#[test]
fn the_agents_shutdown_ends_a_headless_attach_with_success() {
    let dir = tempfile::tempdir().unwrap();
    let (mut demo, mut attach) = demo_and_attach(dir.path(), true);
    demo.signal("TERM");
    let (status, stderr) = attach.exit();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("agent shutting down"), "{stderr}");
    assert_eq!(demo.exit().0.code(), Some(143));
}

#[test]
fn a_connection_lost_without_a_goodbye_ends_a_headless_attach_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (demo, mut attach) = demo_and_attach(dir.path(), false);
    demo.signal("KILL");
    let (status, stderr) = attach.exit();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("allocview: connection lost") && stderr.contains("without a goodbye"),
        "{stderr}"
    );
}

#[test]
fn a_stopped_agent_gets_one_stall_line_then_one_when_updates_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (demo, mut attach) = demo_and_attach(dir.path(), false);
    demo.signal("STOP");
    let said = attach.stderr_until("no update from the agent for 5 s");
    demo.signal("CONT");
    let said_after = attach.stderr_until("updates resumed after");
    assert_eq!(
        said_after.matches("no update from the agent").count(),
        1,
        "{said_after}"
    );
    assert!(said.contains("still waiting"), "{said}");
    // The stream goes on.
    assert!(attach.line().starts_with("pid "));
    demo.signal("TERM");
    assert_eq!(attach.exit().0.code(), Some(0));
}
