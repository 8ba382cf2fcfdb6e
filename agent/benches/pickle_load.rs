//! Loading the largest PyTorch fixture (`cs336-ctx256-forward-mixed.pickle`, 1.4 MB, ~600 000
//! frame references) into the snapshot model, against CPython's `pickle.load` of the same file
//! timed in the same run.
//!
//! Python is timed in a subprocess that loads the file N times and reports its own median
//! per-load time, so interpreter start-up is not counted; it runs before and after ours and
//! both figures are printed beside criterion's. Without python3 or the fixture, the baseline is skipped with a visible line.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use allocview_agent::{pickle, pytorch, snapshot_file};
use criterion::{Criterion, criterion_group, criterion_main};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/fixtures/pytorch-snapshots/cs336-ctx256-forward-mixed.pickle"
);

/// Loads Python does (after one warm-up); the median is reported.
const PYTHON_LOADS: usize = 30;

const PYTHON_TIMER: &str = r#"
import pickle, sys, time
data = open(sys.argv[1], 'rb').read()
n = int(sys.argv[2])
pickle.loads(data)
ts = []
for _ in range(n):
    t = time.perf_counter()
    pickle.loads(data)
    ts.append(time.perf_counter() - t)
ts.sort()
print(ts[len(ts) // 2] * 1e6)
"#;

/// CPython's median time to `pickle.loads` the file, in microseconds.
fn python_median_us(path: &Path) -> Option<f64> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(PYTHON_TIMER)
        .arg(path)
        .arg(PYTHON_LOADS.to_string())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

fn bench(c: &mut Criterion) {
    let path = Path::new(FIXTURE);
    let Ok(bytes) = std::fs::read(path) else {
        println!("skipped: fixtures not found ({FIXTURE})");
        return;
    };
    // Python is timed before and after ours: on a shared machine the load changes, and the two
    // figures show by how much.
    let python_before = python_median_us(path);
    let mut g = c.benchmark_group("pickle_load");
    g.bench_function("allocview_pickle_parse", |b| {
        b.iter(|| pickle::parse(std::hint::black_box(&bytes)).map(|d| d.container_count()))
    });
    g.bench_function("allocview_into_model", |b| {
        b.iter(|| pytorch::from_pickle(std::hint::black_box(&bytes)).map(|s| s.segments.len()))
    });
    let snapshot = pytorch::from_pickle(&bytes).expect("fixture loads");
    let json = snapshot_file::to_bytes(&snapshot, snapshot_file::FileFormat::Json);
    g.bench_function("allocview_json_into_model", |b| {
        b.iter(|| snapshot_file::from_bytes(std::hint::black_box(&json)).map(|s| s.segments.len()))
    });
    g.bench_function("allocview_model_to_pickle", |b| {
        b.iter(|| pytorch::to_pickle(std::hint::black_box(&snapshot)).len())
    });
    g.finish();

    match (python_before, python_median_us(path)) {
        (Some(before), Some(after)) => println!(
            "baseline: python3 pickle.loads of the same file: {before:.0} µs per load before, \
             {after:.0} µs after (medians of {PYTHON_LOADS}); compare with \
             pickle_load/allocview_into_model above"
        ),
        _ => println!("skipped: python3 baseline (python3 not found)"),
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
