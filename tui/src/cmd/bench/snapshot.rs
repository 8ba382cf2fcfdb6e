//! `snapshot.load` and `snapshot.large_load`.
//!
//! `snapshot.load`: decoding the largest PyTorch snapshot fixture with
//! `allocview_agent::snapshot_file::from_bytes` against Python's own `pickle.loads` of the same
//! bytes (the C unpickler), each timed in its own process on the same machine in the same run.
//!
//! Python reports its own median: it loads the file's bytes once, then times `pickle.loads`
//! repeatedly (at least `MIN_BATCHES` times, for about the time
//! budget) and prints the median in nanoseconds, so neither interpreter start-up nor file I/O
//! is counted on either side.
//!
//! `snapshot.large_load`: the same comparison on a large snapshot made here, so it needs no
//! fixture: [`large::generate`] of [`LargeSpec::BENCH`] (allocview's caching allocator on the
//! simulated device, history on, deep stacks, ending in an OOM), written as PyTorch writes it
//! (`to_pickle_pytorch_layout`: every traceback a list of its own), handed to Python on its
//! standard input.

use std::hint::black_box;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use allocview_agent::{pytorch, snapshot_file};
use anyhow::Context;

use super::harness::{MAX_BATCHES, MIN_BATCHES, each, single};
use super::large::{self, LargeSpec};
use super::outcome::Outcome;

/// Environment variable naming the folder of PyTorch snapshot fixtures.
pub const FIXTURES_ENV: &str = "ALLOCVIEW_FIXTURES";

/// Where the fixtures are when [`FIXTURES_ENV`] is not set, relative to the current folder.
pub const DEFAULT_FIXTURES: &str = "../shared/fixtures/pytorch-snapshots";

/// The largest fixture: the one both sides load.
pub const LARGEST_FIXTURE: &str = "cs336-ctx256-forward-mixed.pickle";

/// The Python interpreter the baseline runs.
const PYTHON: &str = "python3";

/// The baseline: `argv[1]` the file (`-`: standard input), `argv[2]` seconds, `argv[3]`/`argv[4]`
/// the fewest and most loads; prints the median nanoseconds of one `pickle.loads`.
const PYTHON_BASELINE: &str = r#"
import pickle, sys, time
data = sys.stdin.buffer.read() if sys.argv[1] == "-" else open(sys.argv[1], "rb").read()
budget, least, most = float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pickle.loads(data)
times = []
start = time.perf_counter()
while len(times) < least or (time.perf_counter() - start < budget and len(times) < most):
    t = time.perf_counter_ns()
    pickle.loads(data)
    times.append(time.perf_counter_ns() - t)
times.sort()
n = len(times)
print(times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) / 2)
"#;

/// The fixture to load: `$ALLOCVIEW_FIXTURES/LARGEST_FIXTURE` (or `$ALLOCVIEW_FIXTURES` itself
/// when it names a file), else under [`DEFAULT_FIXTURES`].
pub fn fixture_path() -> PathBuf {
    match std::env::var_os(FIXTURES_ENV).filter(|v| !v.is_empty()) {
        Some(v) => {
            let p = PathBuf::from(v);
            if p.is_file() {
                p
            } else {
                p.join(LARGEST_FIXTURE)
            }
        }
        None => Path::new(DEFAULT_FIXTURES).join(LARGEST_FIXTURE),
    }
}

/// What reading the fixture gave: its bytes, or why the benchmark is skipped.
pub fn read_fixture() -> Result<(PathBuf, Vec<u8>), String> {
    let path = fixture_path();
    std::fs::read(&path)
        .map(|b| (path.clone(), b))
        .map_err(|e| {
            format!(
                "skipped: fixture {} not readable ({e}); set {FIXTURES_ENV} to the folder holding \
             {LARGEST_FIXTURE}",
                path.display()
            )
        })
}

/// What the Python baseline loads: a file, or bytes given on its standard input.
enum PythonInput<'a> {
    File(&'a Path),
    Bytes(&'a [u8]),
}

/// Runs the Python baseline on `input` for about `seconds`: its median nanoseconds, or why
/// not.
fn python_median(input: PythonInput<'_>, seconds: f64) -> Result<f64, String> {
    let mut cmd = Command::new(PYTHON);
    cmd.arg("-c").arg(PYTHON_BASELINE);
    match input {
        PythonInput::File(path) => cmd.arg(path).stdin(Stdio::null()),
        PythonInput::Bytes(_) => cmd.arg("-").stdin(Stdio::piped()),
    };
    let mut child = cmd
        .arg(seconds.to_string())
        .arg(MIN_BATCHES.to_string())
        .arg(MAX_BATCHES.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("baseline skipped: cannot run {PYTHON} ({e})"))?;
    if let (PythonInput::Bytes(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
        // A failed write shows as Python's own error below.
        let _ = stdin.write_all(bytes);
    }
    let output = child
        .wait_with_output()
        .map_err(|e| format!("baseline skipped: {PYTHON} did not finish ({e})"))?;
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let last = err.lines().last().unwrap_or("no message");
        return Err(format!(
            "baseline skipped: {PYTHON} failed ({}): {last}",
            output.status
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    match text.trim().parse::<f64>() {
        Ok(ns) if ns.is_finite() && ns > 0.0 => Ok(ns),
        _ => Err(format!(
            "baseline skipped: {PYTHON} printed {:?}, not a time",
            text.trim()
        )),
    }
}

/// `snapshot.load`: `from_bytes` of the largest fixture vs Python's `pickle.loads`.
pub fn load(seconds: f64, mut out: Outcome) -> anyhow::Result<Outcome> {
    let (path, bytes) = match read_fixture() {
        Ok(x) => x,
        Err(why) => return Ok(out.note(why)),
    };
    let snapshot = snapshot_file::from_bytes(&bytes)
        .with_context(|| format!("decoding {}", path.display()))?;
    let segments = snapshot.segments.len();
    out.allocview_ns = Some(decode_median_ns(seconds, &bytes));
    out = out.note(format!(
        "{} ({}, {segments} segments)",
        path.display(),
        crate::units::bytes(bytes.len() as u64)
    ));
    match python_median(PythonInput::File(&path), seconds) {
        Ok(ns) => out.baseline_ns = Some(ns),
        Err(why) => out = out.note(why),
    }
    Ok(out)
}

/// The median nanoseconds of [`snapshot_file::from_bytes`] of `bytes`, timed for `seconds`.
fn decode_median_ns(seconds: f64, bytes: &[u8]) -> f64 {
    single(
        seconds,
        &mut each(|| {
            let _ = black_box(snapshot_file::from_bytes(black_box(bytes)));
        }),
    )
    .median_ns
}

/// `snapshot.large_load`: `from_bytes` of a large generated snapshot in PyTorch's layout vs
/// Python's `pickle.loads` of the same bytes.
pub fn load_large(seconds: f64, mut out: Outcome) -> anyhow::Result<Outcome> {
    let snapshot = large::generate(&LargeSpec::BENCH).context("generating the snapshot")?;
    let bytes = pytorch::to_pickle_pytorch_layout(&snapshot);
    let decoded = snapshot_file::from_bytes(&bytes).context("decoding the generated snapshot")?;
    if decoded != snapshot {
        anyhow::bail!("the generated snapshot does not read back as written");
    }
    let entries: usize = snapshot.device_traces.iter().map(Vec::len).sum();
    let depth = snapshot
        .device_traces
        .iter()
        .flatten()
        .map(|e| e.frames.len())
        .max()
        .unwrap_or(0);
    let segments = snapshot.segments.len();
    drop((snapshot, decoded));
    out.allocview_ns = Some(decode_median_ns(seconds, &bytes));
    out = out.note(format!(
        "generated: {} in PyTorch's layout, {segments} segments, {entries} trace entries, \
         stacks of up to {depth} frames",
        crate::units::bytes(bytes.len() as u64),
    ));
    match python_median(PythonInput::Bytes(&bytes), seconds) {
        Ok(ns) => out.baseline_ns = Some(ns),
        Err(why) => out = out.note(why),
    }
    Ok(out)
}
