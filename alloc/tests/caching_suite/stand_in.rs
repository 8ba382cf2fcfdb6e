//! Running the suite on `CudaBackend` over the stand-in driver (`cuda_backend/fake_libcuda.c`:
//! host memory behind device addresses, 1 GiB, one device), in a child process whose
//! `LD_LIBRARY_PATH` finds the stand-in `libcuda.so` first.
//!
//! The parent builds the library with the C compiler (`$CC`, else `cc`; the shared
//! `fake_libcuda` module), runs this test binary again with `--ignored on_stand_in::` and
//! [`CHILD_VAR`] set, and checks that every rule passed and that the driver's exit report shows
//! nothing left alive.

use crate::fake_libcuda;

/// Set in the child process that runs the rules against the stand-in driver.
pub const CHILD_VAR: &str = "ALLOCVIEW_CACHING_SUITE_STAND_IN";

/// Set by `.ci/valgrind-alloc`: the child process and its C library are not run under it.
const VALGRIND_VAR: &str = "ALLOCVIEW_VALGRIND";

/// The test-name filter that selects the stand-in copies of the rules.
const CHILD_FILTER: &str = "on_stand_in::";

/// What the skip and summary lines name.
const WHAT: &str = "caching suite on CudaBackend over the stand-in driver";

/// Whether this process is the child that runs against the stand-in.
pub fn in_child() -> bool {
    std::env::var_os(CHILD_VAR).is_some()
}

/// Runs the `rules` stand-in tests in a child process and checks the outcome.
pub fn run_in_child(rules: usize) {
    if std::env::var(VALGRIND_VAR).is_ok_and(|v| v == "1") {
        println!("skipped: {VALGRIND_VAR}=1 ({WHAT} runs natively only)");
        return;
    }
    let Some(child) = fake_libcuda::rerun_self_on_stand_in(
        "caching-suite-fakecuda",
        WHAT,
        &["--ignored", CHILD_FILTER, "--nocapture", "--test-threads=1"],
        CHILD_VAR,
    ) else {
        return;
    };
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
    assert_eq!(
        fake_libcuda::last_report(&stdout),
        Some(fake_libcuda::ALL_RETURNED),
        "the run left driver objects alive:\n{stdout}"
    );
    println!("{WHAT}: {summary}");
}
