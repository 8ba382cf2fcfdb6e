//! `summary`, `export`, `open` and `replay` given files that are not what they seem: a FIFO no
//! one writes to yet (said, not a silent hang), `/dev/zero` (refused, not read without end).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_alloc::snapshot::Snapshot;

const BIN: &str = env!("CARGO_BIN_EXE_allocview");

/// How long a test waits for the binary before it counts as hung.
const WAIT: Duration = Duration::from_secs(30);

fn mkfifo(path: &std::path::Path) -> bool {
    Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success())
}

/// Waits for `child` to exit (killing it after [`WAIT`]); its status, `None` when it hung.
fn wait_or_kill(child: &mut Child) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn summary_of_a_fifo_says_it_waits_for_a_writer_then_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("snapshot.pickle");
    if !mkfifo(&fifo) {
        println!("skipped: mkfifo is not available");
        return;
    }
    let mut child = Command::new(BIN)
        .args(["summary", fifo.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let said = lines.recv_timeout(WAIT);
    // Whatever was said, give it a writer so that it ends.
    let bytes = snapshot_file::to_bytes(&Snapshot::default(), FileFormat::Pickle);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .unwrap()
        .write_all(&bytes)
        .unwrap();
    let status = wait_or_kill(&mut child);
    let said = said.expect("nothing on stderr while waiting for the FIFO's writer");
    assert!(said.contains("is a FIFO"), "{said}");
    assert!(said.contains("waiting for a writer"), "{said}");
    assert!(said.contains("snapshot.pickle"), "{said}");
    assert!(status.expect("summary hung").success());
}

#[test]
fn summary_of_a_pipe_that_already_has_a_writer_says_nothing_of_waiting() {
    // `cat snap.pickle | allocview summary /dev/stdin`, `summary <(zcat ...)`: a pipe, but one
    // with a writer, so it opens at once.
    let bytes = snapshot_file::to_bytes(&Snapshot::default(), FileFormat::Pickle);
    let mut child = Command::new(BIN)
        .args(["summary", "/dev/stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // The writer holds the pipe a while before writing, as a slow producer would.
    std::thread::sleep(Duration::from_millis(500));
    stdin.write_all(&bytes).unwrap();
    drop(stdin);
    let status = wait_or_kill(&mut child).expect("summary hung");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    assert!(!err.contains("waiting for a writer"), "{err}");
}

#[test]
fn summary_and_replay_of_dev_zero_are_refused_at_once_not_read_for_ever() {
    if !std::path::Path::new("/dev/zero").exists() {
        println!("skipped: no /dev/zero");
        return;
    }
    for command in ["summary", "replay"] {
        let mut child = Command::new(BIN)
            .args([command, "/dev/zero"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = wait_or_kill(&mut child).unwrap_or_else(|| panic!("{command} /dev/zero hung"));
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(1), "{command}: {err}");
        assert!(err.contains("/dev/zero"), "{command}: {err}");
        assert!(err.contains("not a snapshot file"), "{command}: {err}");
        assert!(!err.contains("panicked"), "{command}: {err}");
    }
}
