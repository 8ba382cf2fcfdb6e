//! Shared helpers of the snapshot-file tests: where the real PyTorch fixtures are, and python3.

#![allow(dead_code)]

use std::process::Command;

/// Where the real PyTorch snapshots are and the skip line when they are not, shared with the
/// other crates' tests (this package cannot depend on `allocview-tests`, so the file is
/// included).
#[path = "../../../tests/src/fixtures.rs"]
mod shared;
pub use shared::fixture;

/// Every fixture file, by name.
pub const FIXTURES: [&str; 5] = [
    "tiny-3-segments.pickle",
    "small-97-events.pickle",
    "legacy-2.0-history-format.pickle",
    "cs336-newest-format.pickle",
    "cs336-ctx256-forward-mixed.pickle",
];

/// The small fixtures (cheap enough for exhaustive tests).
pub const SMALL_FIXTURES: [&str; 2] = ["tiny-3-segments.pickle", "small-97-events.pickle"];

/// The bytes of a fixture, or `None` with a skip line.
pub fn fixture_bytes(name: &str) -> Option<Vec<u8>> {
    fixture(name).map(|p| std::fs::read(&p).expect("fixture readable"))
}

/// Whether python3 runs here; prints a visible skip line when not.
pub fn python3_available(test: &str) -> bool {
    let ok = Command::new("python3")
        .arg("-c")
        .arg("import pickle")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        println!("skipped: python3 not found ({test})");
    }
    ok
}

/// Runs a python3 script with arguments; returns stdout, panicking with stderr on failure.
pub fn python3(script: &str, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}
