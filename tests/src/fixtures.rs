//! The real PyTorch snapshot files in `../shared/fixtures/pytorch-snapshots` (relative to the
//! workspace root). They are never copied into the project: where the folder is absent a test
//! prints a visible `skipped: fixtures not found` line and passes.

use std::path::{Path, PathBuf};

/// The fixtures folder (the `tests` package sits beside `tui` and `agent`, so the path is the
/// same from each).
pub const DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/fixtures/pytorch-snapshots"
);

/// The fixtures folder, or `None` (after printing the skip line) when it is absent.
pub fn dir() -> Option<PathBuf> {
    let dir = PathBuf::from(DIR);
    if dir.is_dir() {
        Some(dir)
    } else {
        println!("skipped: fixtures not found at {}", dir.display());
        None
    }
}

/// The path of fixture `name`, or `None` (after printing the skip line) when it is absent.
pub fn fixture(name: &str) -> Option<PathBuf> {
    let p = Path::new(DIR).join(name);
    if p.exists() {
        Some(p)
    } else {
        println!("skipped: fixtures not found ({})", p.display());
        None
    }
}
