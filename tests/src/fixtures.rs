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

/// An RMM allocation log (CSV, as RMM's `logging_resource_adaptor` writes it) of `rows`, each
/// `(action, pointer, size, stream)`, one a millisecond apart on one thread.
pub fn rmm_log(rows: &[(&str, u64, u64, u64)]) -> String {
    let mut s = format!("{}\n", allocview_agent::replay::rmm::RMM_HEADER);
    for (i, (action, ptr, size, stream)) in rows.iter().enumerate() {
        s.push_str(&format!(
            "140573312345856,1634567890.{:06},{action},{ptr:#x},{size},{stream:#x}\n",
            i * 1000
        ));
    }
    s
}
