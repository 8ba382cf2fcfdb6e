//! `allocview open FILE`: the dashboard over a snapshot file (PyTorch pickle or allocview
//! JSON), with time travel through its trace.

use std::time::Duration;

use allocview_agent::snapshot_file;
use anyhow::Context as _;

use crate::app::{self, App};
use crate::cli::OpenArgs;
use crate::source::file::FileSource;
use crate::terminal::TerminalGuard;

/// How often the loop wakes without input (a file never changes, so this only bounds
/// latency of resizes).
pub const TICK: Duration = Duration::from_millis(250);
/// Why `open` cannot run without a terminal, and what to do instead.
const NEEDS_TERMINAL: &str = "the dashboard needs one: `allocview summary FILE` prints the file's \
     summary instead";
/// Files larger than this get a progress bar while loading.
const PROGRESS_FROM_BYTES: u64 = 8 << 20;

/// Loads a snapshot file, with a progress bar on stderr for large files.
///
/// # Errors
/// The file cannot be read or is not a snapshot (the error names the file and the problem).
pub fn load(path: &std::path::Path) -> anyhow::Result<allocview_alloc::snapshot::Snapshot> {
    let mut fifo = super::summary::progress::FifoNotice::start(path);
    let big = std::fs::metadata(path).is_ok_and(|m| m.len() >= PROGRESS_FROM_BYTES);
    if !big {
        // The error's message already names the file and the cause (its source chain would
        // repeat them); worded as `summary`, `replay` and `export` word it. The first progress
        // call comes once the file is open.
        return snapshot_file::load_with_progress(path, &mut |_, _| fifo.opened())
            .map_err(|e| anyhow::anyhow!("cannot load {e}"));
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_message(format!("reading {}", path.display()));
    let snap = snapshot_file::load_with_progress(path, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    snap.map_err(|e| anyhow::anyhow!("cannot load {e}"))
}

/// Runs the command.
///
/// # Errors
/// The file cannot be loaded, or the terminal cannot be used.
pub fn run(args: &OpenArgs) -> anyhow::Result<()> {
    // The file's own problems first (a missing file is named even when redirected).
    let snap = load(&args.file)?;
    crate::terminal::check_stdout().map_err(|e| e.advise(NEEDS_TERMINAL))?;
    // The what-if replays of the file's OOMs run beside the dashboard (they keep `snap`).
    let src = FileSource::open(&args.file.display().to_string(), snap);
    let save_dir = std::env::current_dir().context("no current folder to save snapshots in")?;
    let mut app = App::new(Box::new(src), save_dir)?;
    let mut guard = TerminalGuard::enter().map_err(|e| e.advise(NEEDS_TERMINAL))?;
    app::run(&mut guard.terminal, &mut app, TICK)
}
