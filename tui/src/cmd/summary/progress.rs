//! Loading a snapshot file with a progress bar on stderr (indicatif), shown only when loading
//! takes more than a moment and only when stderr is a terminal.

use std::io::IsTerminal as _;
use std::path::Path;
use std::time::{Duration, Instant};

use allocview_agent::snapshot_file;
use allocview_alloc::snapshot::Snapshot;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Files at least this large show the bar from the start.
pub const BAR_MIN_BYTES: u64 = 4 << 20;

/// Smaller files show it once loading has taken this long.
pub const BAR_DELAY: Duration = Duration::from_millis(200);

/// Loads a snapshot file of either format; a progress bar appears on stderr for big or slow
/// loads when stderr is a terminal.
///
/// # Errors
/// The file's error, naming it.
pub fn load_snapshot(path: &Path) -> anyhow::Result<Snapshot> {
    let mut fifo = FifoNotice::start(path);
    let tty = std::io::stderr().is_terminal();
    let start = Instant::now();
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    if let Ok(style) =
        ProgressStyle::with_template("loading {msg} [{bar:40}] {percent}% ({elapsed})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(path.display().to_string());
    let mut shown = false;
    let result = snapshot_file::load_with_progress(path, &mut |done, total| {
        // Called first once the file is open.
        fifo.opened();
        bar.set_length(total);
        bar.set_position(done);
        let big = total / 2 >= BAR_MIN_BYTES;
        if tty && !shown && (big || start.elapsed() >= BAR_DELAY) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            shown = true;
        }
    });
    bar.finish_and_clear();
    // The error names the file and the problem; its text is the whole message.
    result.map_err(|e| anyhow::anyhow!("cannot load {e}"))
}

/// How long opening a FIFO may wait before [`FifoNotice`] says it waits for a writer.
pub const FIFO_WAIT: Duration = Duration::from_millis(200);

/// Says on stderr that `path` is a FIFO whose opening waits for a writer, when it still waits
/// after [`FIFO_WAIT`]: opening one blocks until a writer opens it, which a mistyped path may
/// never get (a silent hang otherwise). A pipe with a writer already (`<(zcat ...)`,
/// `/dev/stdin` of a pipeline) opens at once and is not said. Cancelled by
/// [`opened`](Self::opened) or by dropping it.
#[derive(Debug)]
pub struct FifoNotice(Option<std::sync::mpsc::Sender<()>>);

impl FifoNotice {
    /// Starts watching the opening of `path` when it is a FIFO.
    pub fn start(path: &Path) -> FifoNotice {
        use std::os::unix::fs::FileTypeExt as _;
        if !std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo()) {
            return FifoNotice(None);
        }
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let shown = path.display().to_string();
        let spawned = std::thread::Builder::new()
            .name("allocview-fifo-notice".into())
            .spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(FIFO_WAIT)
                {
                    eprintln!("allocview: {shown} is a FIFO: waiting for a writer (Ctrl-C stops)");
                }
            });
        FifoNotice(spawned.ok().map(|_| tx))
    }

    /// The file is open: nothing to say.
    pub fn opened(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}
