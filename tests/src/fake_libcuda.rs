//! The stand-in `libcuda` the CUDA tests run against.
//!
//! `alloc/tests/cuda_backend/fake_libcuda.c` puts host memory behind device addresses (one
//! 1 GiB device) and follows the driver's rules for handles and mappings; a test builds it here
//! with the C compiler (`$CC`, else `cc`) as `libcuda.so` in a folder of its own and puts that
//! folder on `LD_LIBRARY_PATH` of the process it runs. Whenever the stand-in is unloaded it
//! prints a `fakecuda: live ...` line counting what is still alive; [`last_report`] picks the
//! one printed at exit.
//!
//! Std only: the alloc crate's own test includes this file with `#[path]` (it cannot depend on
//! this package), the others use it as `allocview_tests::fake_libcuda`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The stand-in driver's source (the path holds from both the `tests` and the `alloc` package,
/// which are siblings in the workspace).
pub const SOURCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../alloc/tests/cuda_backend/fake_libcuda.c"
);

/// The marker that starts the stand-in's report of what is still alive.
pub const REPORT_MARKER: &str = "fakecuda:";

/// How the stand-in's report starts when no memory, reservation, mapping or handle is left.
pub const NOTHING_LEFT: &str =
    "fakecuda: live allocations 0, reservations 0, mappings 0, handles 0";

/// The stand-in's whole report when everything was given back: no memory, reservation,
/// mapping, handle, stream, event or context reference left, nothing used.
pub const ALL_RETURNED: &str = "fakecuda: live allocations 0, reservations 0, mappings 0, \
                                handles 0, streams 0, events 0, context refs 0, used 0";

/// Builds the stand-in driver as `dir/libcuda.so` and returns that path; `None` (after printing
/// a `skipped:` line naming `test`) where the source or a C compiler is missing. A compiler
/// that fails on the source fails the test.
pub fn build(dir: &Path, test: &str) -> Option<PathBuf> {
    if !Path::new(SOURCE).exists() {
        println!("skipped: {SOURCE} not found ({test})");
        return None;
    }
    let lib = dir.join("libcuda.so");
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&compiler)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(SOURCE)
        .arg("-lpthread")
        .output();
    match built {
        Ok(out) => {
            assert!(
                out.status.success(),
                "building the stand-in driver failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(lib)
        }
        Err(e) => {
            println!("skipped: no C compiler ({compiler}: {e}) ({test})");
            None
        }
    }
}

/// The stand-in's last report in `stdout` (from [`REPORT_MARKER`] to the end of its line): it
/// reports whenever it is unloaded, so the last one is the one at exit.
pub fn last_report(stdout: &str) -> Option<&str> {
    stdout
        .lines()
        .filter_map(|l| l.find(REPORT_MARKER).map(|at| &l[at..]))
        .next_back()
}

/// Runs the current test binary again with `args` and `child_var=1`, the stand-in driver (built
/// into a fresh folder `allocview-{folder}-{pid}` under the temp dir, removed afterwards) first
/// on its `LD_LIBRARY_PATH`, and returns the child's output; `None` where [`build`] skipped
/// (its `skipped:` line names `test`).
pub fn rerun_self_on_stand_in(
    folder: &str,
    test: &str,
    args: &[&str],
    child_var: &str,
) -> Option<Output> {
    let dir = std::env::temp_dir().join(format!("allocview-{folder}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    if build(&dir, test).is_none() {
        let _ = std::fs::remove_dir_all(&dir);
        return None;
    }
    let child = Command::new(std::env::current_exe().unwrap())
        .args(args)
        .env(child_var, "1")
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Some(child)
}
