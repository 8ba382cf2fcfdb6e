//! The C interface, driven from Python through ctypes exactly as PyTorch's
//! `CUDAPluggableAllocator` calls it, on the simulated device (`ALLOCVIEW_BACKEND=sim`).
//!
//! Cargo builds this package's cdylib before its integration tests, next to the test executable
//! (`target/debug/deps/liballocview_pluggable.so`). Each scenario is its own
//! Python process, since the library reads its environment once per process. Without python3,
//! each test prints a visible skip line and passes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use allocview_agent::client::{AttachClient, ClientError};
use allocview_alloc::caching::stats::StatType;
#[cfg(feature = "cuda")]
use allocview_tests::fake_libcuda;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c_abi.py");
const MIB: u64 = 1 << 20;
/// `STREAM_B` in c_abi.py.
const STREAM_B: u64 = 0x7F00_1234;
/// Variables of the library (and the allocator settings) cleared before each run, so the
/// developer's own environment cannot change what a test sees.
const LIBRARY_VARS: [&str; 7] = [
    "ALLOCVIEW_BACKEND",
    "ALLOCVIEW_SIM_MEMORY",
    "ALLOCVIEW_SIM_DEVICES",
    "ALLOCVIEW_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "ALLOCVIEW_ADDR",
    "ALLOCVIEW_TOKEN",
];

fn library() -> PathBuf {
    const NAME: &str = "liballocview_pluggable.so";
    let exe = std::env::current_exe().expect("test executable path");
    // Built for this test run: target/debug/deps/ (next to the test executable); a plain
    // `cargo build` puts it one folder up, in target/debug/.
    let deps = exe.parent().expect("deps folder");
    let candidates = [
        deps.join(NAME),
        deps.parent().expect("target folder").join(NAME),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| {
            panic!("{NAME} not found in {candidates:?}: cargo builds it before this test")
        })
}

/// Whether python3 runs here; prints the skip line when it does not.
fn python_available(test: &str) -> bool {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: python3 not found ({test})");
    }
    ok
}

/// A python3 command running c_abi.py in `mode`, with a private socket and dump folder.
fn python(mode: &str, dir: &Path) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(SCRIPT).arg(library()).arg(mode);
    for var in LIBRARY_VARS {
        cmd.env_remove(var);
    }
    cmd.env(
        "ALLOCVIEW_ADDR",
        format!("unix:{}", dir.join("agent.sock").display()),
    )
    .env("ALLOCVIEW_DUMP_DIR", dir.join("dumps"));
    cmd
}

fn run(mut cmd: Command) -> (Output, String, String) {
    let out = cmd.output().expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

fn lines_with(text: &str, needle: &str) -> usize {
    text.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn mallocs_and_frees_through_the_c_interface_keep_pytorchs_numbers() {
    if !python_available("mallocs_and_frees_through_the_c_interface_keep_pytorchs_numbers") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = python("sim", dir.path());
    cmd.env("ALLOCVIEW_BACKEND", "sim");
    let (out, stdout, stderr) = run(cmd);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("sim: ok"), "{stdout}");
    // Each kind of failure the script provokes is logged exactly once.
    assert_eq!(lines_with(&stderr, "allocview: free failed"), 1, "{stderr}");
    assert_eq!(
        lines_with(&stderr, "allocview: allocation failed: invalid size -4096"),
        1,
        "{stderr}"
    );
    assert_eq!(
        lines_with(
            &stderr,
            "allocview: device unavailable: device 9 does not exist"
        ),
        1,
        "{stderr}"
    );
    assert_eq!(lines_with(&stderr, "panic"), 0, "{stderr}");
}

#[test]
fn an_oom_returns_null_is_logged_once_and_dumped_by_the_agent() {
    if !python_available("an_oom_returns_null_is_logged_once_and_dumped_by_the_agent") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = python("oom", dir.path());
    cmd.env("ALLOCVIEW_BACKEND", "sim")
        .env("ALLOCVIEW_SIM_MEMORY", (64 * MIB).to_string());
    let (out, stdout, stderr) = run(cmd);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("oom: ok"), "{stdout}");
    assert_eq!(
        lines_with(&stderr, "allocview: out of memory"),
        1,
        "{stderr}"
    );
    let dumps: Vec<_> = std::fs::read_dir(dir.path().join("dumps"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(dumps.iter().any(|n| n.starts_with("oom-0001")), "{dumps:?}");
}

#[test]
fn without_a_gpu_the_default_backend_returns_null_and_says_why_once() {
    if !python_available("without_a_gpu_the_default_backend_returns_null_and_says_why_once") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, stdout, stderr) = run(python("default", dir.path()));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    if stdout.contains("default: GPU") {
        let built_with_cuda = cfg!(feature = "cuda");
        assert!(built_with_cuda, "a build without CUDA handed out memory");
        eprintln!("a CUDA device answered: the null path is not exercised on this machine");
        return;
    }
    assert!(stdout.contains("default: null"), "{stdout}");
    assert_eq!(
        lines_with(&stderr, "allocview: startup failed"),
        1,
        "{stderr}"
    );
    let reason = if cfg!(feature = "cuda") {
        "no CUDA devices: "
    } else {
        "built without CUDA support; rebuild with --features cuda or set ALLOCVIEW_BACKEND=sim"
    };
    assert_eq!(lines_with(&stderr, reason), 1, "{stderr}");
}

#[test]
fn an_attach_client_sees_the_allocations_of_a_running_python_process() {
    if !python_available("an_attach_client_sees_the_allocations_of_a_running_python_process") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let mut cmd = python("attach", dir.path());
    cmd.env("ALLOCVIEW_BACKEND", "sim")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("python3 starts");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "READY", "python said {line:?}");

    let mut client = AttachClient::connect(&format!("unix:{}", sock.display()), None)
        .expect("the agent in the python process accepts clients");
    // 1 MiB + 1 MiB on the default stream, 5 MiB on STREAM_B, held until the end.
    let held = 7 * MIB;
    let deadline = Instant::now() + Duration::from_secs(30);
    let seen = loop {
        if let Some(d) = client.state().device(0) {
            let allocated = d.stats.allocated_bytes.get(StatType::All).current as u64;
            let on_b = d.streams.iter().find(|s| s.stream == STREAM_B);
            if allocated >= held && on_b.is_some_and(|s| s.allocated == 5 * MIB) {
                break d.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "the client never saw the allocations"
        );
        match client.next_update(Duration::from_millis(500)) {
            Ok(_) | Err(ClientError::Timeout) => {}
            Err(e) => panic!("attach failed: {e}"),
        }
    };
    assert!(seen.stats.reserved_bytes.get(StatType::All).current as u64 >= held);
    assert!(
        client.process().1.contains("python"),
        "{:?}",
        client.process()
    );

    drop(child.stdin.take()); // EOF: the script frees everything and exits
    let status = child.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(status.success(), "python failed: {rest}");
    assert!(rest.contains("attach: ok"), "{rest}");
    assert!(!sock.exists(), "the socket was left behind at exit");
}

#[cfg(feature = "cuda")]
#[test]
fn the_cuda_backend_serves_python_through_a_stand_in_driver_and_gives_everything_back() {
    const TEST: &str =
        "the_cuda_backend_serves_python_through_a_stand_in_driver_and_gives_everything_back";
    if !python_available(TEST) {
        return;
    }
    let driver = tempfile::tempdir().unwrap();
    if fake_libcuda::build(driver.path(), TEST).is_none() {
        return;
    }
    for conf in ["", "expandable_segments:True"] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = python("fake-cuda", dir.path());
        cmd.env("LD_LIBRARY_PATH", driver.path())
            .env("ALLOCVIEW_ALLOC_CONF", conf);
        let (out, stdout, stderr) = run(cmd);
        assert!(
            out.status.success() && stdout.contains("fake-cuda: ok"),
            "{conf:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
        assert!(
            !stderr.contains("allocview:"),
            "{conf:?}: a failure was logged:\n{stderr}"
        );
        assert!(
            fake_libcuda::last_report(&stdout)
                .is_some_and(|l| l.starts_with(fake_libcuda::NOTHING_LEFT)),
            "{conf:?}: memory left on the device after empty_cache:\n{stdout}"
        );
    }
}
