//! Running the suite on `CudaBackend` over the stand-in driver (`cuda_backend/fake_libcuda.c`:
//! host memory behind device addresses, 1 GiB, one device), in a child process whose
//! `LD_LIBRARY_PATH` finds the stand-in `libcuda.so` first.
//!
//! The parent builds the library with the C compiler (`$CC`, else `cc`), runs this test binary
//! again with `--ignored on_stand_in::` and [`CHILD_VAR`] set, and checks that every rule passed
//! and that the driver's exit report shows nothing left alive.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Set in the child process that runs the rules against the stand-in driver.
pub const CHILD_VAR: &str = "ALLOCVIEW_CACHING_SUITE_STAND_IN";

/// Set by `.ci/valgrind-alloc`: the child process and its C library are not run under it.
const VALGRIND_VAR: &str = "ALLOCVIEW_VALGRIND";

/// The stand-in driver's exit report when everything was given back.
const ALL_RETURNED: &str = "fakecuda: live allocations 0, reservations 0, mappings 0, \
                            handles 0, streams 0, events 0, context refs 0, used 0";

/// The test-name filter that selects the stand-in copies of the rules.
const CHILD_FILTER: &str = "on_stand_in::";

/// Whether this process is the child that runs against the stand-in.
pub fn in_child() -> bool {
    std::env::var_os(CHILD_VAR).is_some()
}

/// Builds the stand-in into `dir/libcuda.so`; `None` (after printing the skip line) when its
/// source is not found or no C compiler can be started.
fn build_driver(dir: &Path) -> Option<PathBuf> {
    let source =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cuda_backend/fake_libcuda.c");
    if !source.is_file() {
        // A test binary copied away from its source tree (the GPU bundle) has no C source.
        println!(
            "skipped: the stand-in driver's source {} is not here (caching suite on \
             CudaBackend over the stand-in driver)",
            source.display()
        );
        return None;
    }
    let lib = dir.join("libcuda.so");
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&compiler)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&source)
        .arg("-lpthread")
        .output();
    let built = match built {
        Ok(out) => out,
        Err(err) => {
            println!(
                "skipped: no C compiler ({compiler}: {err}) to build the stand-in driver \
                 (caching suite on CudaBackend)"
            );
            return None;
        }
    };
    assert!(
        built.status.success(),
        "building the stand-in driver failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    Some(lib)
}

/// Runs the `rules` stand-in tests in a child process and checks the outcome.
pub fn run_in_child(rules: usize) {
    if std::env::var(VALGRIND_VAR).is_ok_and(|v| v == "1") {
        println!(
            "skipped: {VALGRIND_VAR}=1 (caching suite on CudaBackend over the stand-in driver \
             runs natively only)"
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!(
        "allocview-caching-suite-fakecuda-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(_lib) = build_driver(&dir) else {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", CHILD_FILTER, "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, "1")
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&child.stdout);
    let stderr = String::from_utf8_lossy(&child.stderr);
    let summary = format!("{rules} passed; 0 failed");
    assert!(
        child.status.success() && stdout.contains(&summary),
        "the caching suite failed on CudaBackend over the stand-in driver ({}; expected \
         \"{summary}\"):\n{stdout}\n{stderr}",
        child.status
    );
    // The stand-in reports whenever it is unloaded; only the last report (at exit) counts.
    let last_report = stdout
        .lines()
        .filter_map(|l| l.find("fakecuda:").map(|at| &l[at..]))
        .next_back();
    assert_eq!(
        last_report,
        Some(ALL_RETURNED),
        "the run left driver objects alive:\n{stdout}"
    );
    println!("caching suite on CudaBackend over the stand-in driver: {summary}");
}
