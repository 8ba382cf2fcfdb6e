//! `allocview demo --backend cuda` (feature `cuda`).
//!
//! Against a stand-in `libcuda` (the alloc crate's `tests/cuda_backend/fake_libcuda.c`: host
//! memory behind device addresses, one 1 GiB device, built here with the C compiler and found
//! through `LD_LIBRARY_PATH`), the demo's workload runs on the real CUDA backend, the embedded
//! agent agrees with the allocator, and everything is given back at exit. Without a driver the
//! command exits non-zero with a clear error, never a panic.
#![cfg(feature = "cuda")]

use std::path::Path;
use std::process::{Command, Output};

/// The stand-in driver's source.
const FAKE_LIBCUDA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../alloc/tests/cuda_backend/fake_libcuda.c"
);

/// What the stand-in prints when it is unloaded with no memory, reservation, mapping or handle
/// left.
const FAKE_NOTHING_LEFT: &str =
    "fakecuda: live allocations 0, reservations 0, mappings 0, handles 0";

/// Builds the stand-in driver as `dir/libcuda.so`; `None` (with a skip line) without a C
/// compiler or the source.
fn build_fake_libcuda(dir: &Path, test: &str) -> Option<()> {
    if !Path::new(FAKE_LIBCUDA).exists() {
        println!("skipped: {FAKE_LIBCUDA} not found ({test})");
        return None;
    }
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&compiler)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(dir.join("libcuda.so"))
        .arg(FAKE_LIBCUDA)
        .arg("-lpthread")
        .output();
    match built {
        Ok(out) => {
            assert!(
                out.status.success(),
                "building the stand-in driver failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(())
        }
        Err(e) => {
            println!("skipped: no C compiler ({compiler}: {e}) ({test})");
            None
        }
    }
}

fn allocview(args: &[&str], lib_dir: &Path) -> (Output, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run allocview");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// The first JSON value in `stdout` (the stand-in prints lines of its own around it).
fn report(stdout: &str) -> serde_json::Value {
    let at = stdout.find('{').expect("a JSON report on stdout");
    serde_json::Deserializer::from_str(&stdout[at..])
        .into_iter::<serde_json::Value>()
        .next()
        .expect("a JSON value")
        .expect("valid JSON")
}

#[test]
fn the_demo_runs_on_the_cuda_backend_through_a_stand_in_driver_and_the_agent_agrees() {
    const TEST: &str =
        "the_demo_runs_on_the_cuda_backend_through_a_stand_in_driver_and_the_agent_agrees";
    let driver = tempfile::tempdir().unwrap();
    if build_fake_libcuda(driver.path(), TEST).is_none() {
        return;
    }
    for (scenario, config) in [("train", ""), ("oom", "expandable_segments:True")] {
        let mut args = vec![
            "demo",
            "--backend",
            "cuda",
            "--headless",
            "--seconds",
            "2",
            "--json",
            "--scenario",
            scenario,
        ];
        if !config.is_empty() {
            args.extend(["--config", config]);
        }
        let (out, stdout, stderr) = allocview(&args, driver.path());
        assert!(
            out.status.success(),
            "{args:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
        let r = report(&stdout);
        assert_eq!(r["device"], "CUDA device 0", "{args:?}");
        assert_eq!(
            r["agent_matches_allocator"], true,
            "{args:?}: {}",
            r["differing_keys"]
        );
        assert!(r["steps"].as_u64().unwrap() > 0, "{args:?}: no step ran");
        assert!(r["stats"]["num_device_alloc"].as_i64().unwrap() > 0);
        assert!(r["stats"]["allocation.all.allocated"].as_i64().unwrap() > 0);
        assert_eq!(r["dropped_events"], 0);
        // The stand-in reports whenever it is unloaded; the last report is the one at exit.
        let last = stdout
            .lines()
            .filter_map(|l| l.find("fakecuda:").map(|at| &l[at..]))
            .next_back();
        assert!(
            last.is_some_and(|l| l.starts_with(FAKE_NOTHING_LEFT)),
            "{args:?}: device memory left at exit:\n{stdout}"
        );
    }
}

#[test]
fn without_a_cuda_driver_the_demo_exits_non_zero_with_a_clear_error_and_no_panic() {
    let empty = tempfile::tempdir().unwrap();
    let (out, stdout, stderr) = allocview(
        &[
            "demo",
            "--backend",
            "cuda",
            "--headless",
            "--seconds",
            "1",
            "--device-memory",
            "4GiB",
        ],
        empty.path(),
    );
    if out.status.success() {
        println!("skipped: a CUDA driver and GPU are installed here, so there is no error to see");
        return;
    }
    assert_eq!(out.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.contains("cannot open CUDA device 0: no CUDA driver")
            || stderr.contains("cannot open CUDA device 0: no CUDA device"),
        "stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("--device-memory \"4GiB\" is ignored on CUDA"),
        "stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "stderr:\n{stderr}"
    );
    assert!(stdout.trim().is_empty(), "stdout:\n{stdout}");
}
