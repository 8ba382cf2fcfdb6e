//! [`OomDumper`]: writes the allocator's snapshot at an OOM to the dump folder, as PyTorch's
//! pickle (for PyTorch's viewers) and allocview's JSON, so nothing is lost when the process dies
//! right after.
//!
//! Files are named `oom-NNNN-pidPID.{pickle,json}` (`NNNN` the OOM's index in the process) and
//! written atomically (a temporary file renamed into place), so a reader never sees half a
//! dump. The folder is created on first use. A failure is returned, never a panic: the
//! aggregator logs and counts it and carries on.
//!
//! The aggregator takes the snapshot at once and hands it to a dump writer, whose thread
//! (started at the first OOM) encodes and writes it: a large snapshot takes long to pickle and
//! write, and the aggregator must go on draining the event channel meanwhile.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use allocview_alloc::snapshot::Snapshot;
use crossbeam_channel::{Receiver, Sender};

use crate::snapshot_file::{FileFormat, SnapshotFileError, fresh_stem, save};

/// Why a dump could not be written.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The dump folder could not be created.
    #[error("cannot create the dump folder {path}: {error}")]
    Folder {
        /// The folder.
        path: PathBuf,
        /// Why (not a `source`: the message already says it, and a chain would say it twice).
        error: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {path}: {message}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

/// The file name, without extension, of OOM number `index` of process `pid`.
fn stem_name(index: u64, pid: u32) -> String {
    format!("oom-{index:04}-pid{pid}")
}

/// Writes OOM dumps into one folder.
#[derive(Debug, Clone)]
pub struct OomDumper {
    dir: PathBuf,
}

/// A dump's two files: PyTorch's pickle, then allocview's JSON.
const DUMP_FORMATS: [FileFormat; 2] = [FileFormat::Pickle, FileFormat::Json];

impl OomDumper {
    /// A dumper writing into `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> OomDumper {
        OomDumper { dir: dir.into() }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of OOM number `index` of process `pid`, without extension.
    pub fn stem(&self, index: u64, pid: u32) -> PathBuf {
        self.dir.join(stem_name(index, pid))
    }

    /// [`stem`](Self::stem), or `…-2`, `…-3`, … when an earlier dump already has that name (a
    /// restarted process that got the same pid, as in containers, or two agents of one
    /// process): a dump never replaces another.
    fn free_stem(&self, index: u64, pid: u32) -> PathBuf {
        fresh_stem(
            &self.dir,
            &stem_name(index, pid),
            &DUMP_FORMATS.map(FileFormat::extension),
        )
    }

    /// Writes the pickle and the JSON of OOM number `index`; returns the paths written.
    ///
    /// # Errors
    /// The folder cannot be created or a file cannot be written (the other file is still
    /// attempted; the error names the first failure).
    pub fn write(
        &self,
        index: u64,
        pid: u32,
        snapshot: &Snapshot,
    ) -> Result<Vec<PathBuf>, DumpError> {
        std::fs::create_dir_all(&self.dir).map_err(|error| DumpError::Folder {
            path: self.dir.clone(),
            error,
        })?;
        let stem = self.free_stem(index, pid);
        let mut written = Vec::new();
        let mut first_error = None;
        for format in DUMP_FORMATS {
            let path = stem.with_extension(format.extension());
            match save(&path, snapshot, format) {
                Ok(()) => written.push(path),
                Err(e) => {
                    // The message names the path once: an I/O error's own text leaves it out.
                    let message = match e {
                        SnapshotFileError::Io { error, .. } => error.to_string(),
                        other => other.to_string(),
                    };
                    first_error.get_or_insert(DumpError::Write { path, message });
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(written),
        }
    }
}

/// How a dump is written: the OOM's index and its snapshot to the paths written.
pub(crate) type WriteDump =
    Arc<dyn Fn(u64, &Snapshot) -> Result<Vec<PathBuf>, DumpError> + Send + Sync>;

/// One dump to write: the OOM's index and the snapshot taken at it.
type DumpJob = (u64, Snapshot);

/// The outcome of one dump: the OOM's index and the paths written, or why not.
pub(crate) type DumpOutcome = (u64, Result<Vec<PathBuf>, DumpError>);

/// Writes dumps on a thread of its own, started at the first dump, and reports each outcome.
///
/// Dropping it waits for the dumps handed to it, so shutdown leaves complete files.
pub(crate) struct DumpWriter {
    dumper: OomDumper,
    pid: u32,
    /// Writes one dump (`OomDumper::write` but in tests).
    write: WriteDump,
    /// The writing thread's queue, its outcomes and its handle, once started.
    thread: Option<DumpThread>,
    /// No thread could be started (asked once): dumps are written inline.
    inline: bool,
    /// Outcomes of dumps written inline, not returned yet.
    done_inline: Vec<DumpOutcome>,
    /// Indices of the dumps handed over whose outcome was not returned yet.
    pending: Vec<u64>,
}

/// The writing thread's ends.
struct DumpThread {
    jobs: Sender<DumpJob>,
    done: Receiver<DumpOutcome>,
    join: JoinHandle<()>,
}

impl DumpWriter {
    /// A writer of process `pid`'s dumps through `dumper`.
    pub(crate) fn new(dumper: OomDumper, pid: u32) -> DumpWriter {
        let d = dumper.clone();
        DumpWriter::with_write(dumper, pid, Arc::new(move |i, s| d.write(i, pid, s)))
    }

    /// A writer whose dumps `write` writes (names in errors still come from `dumper`).
    pub(crate) fn with_write(dumper: OomDumper, pid: u32, write: WriteDump) -> DumpWriter {
        DumpWriter {
            dumper,
            pid,
            write,
            thread: None,
            inline: false,
            done_inline: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// Starts the writing thread; where none can be started, dumps are written inline.
    fn start_thread(&mut self) {
        let (jobs, rx) = crossbeam_channel::unbounded::<DumpJob>();
        let (done_tx, done) = crossbeam_channel::unbounded();
        let (dumper, pid, write) = (self.dumper.clone(), self.pid, Arc::clone(&self.write));
        let spawned = crate::agent_thread::spawn("allocview-dump", move || {
            for (index, snapshot) in rx {
                // An outcome for every job, even a panicking one: `poll(true)` waits for
                // it.
                let write_one = || write(index, &snapshot);
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(write_one))
                    .unwrap_or_else(|_| {
                        Err(DumpError::Write {
                            path: dumper.stem(index, pid),
                            message: "the dump writer panicked".into(),
                        })
                    });
                let _ = done_tx.send((index, outcome));
            }
        });
        match spawned {
            Ok(join) => {
                self.thread = Some(DumpThread { jobs, done, join });
            }
            Err(err) => {
                tracing::warn!(%err, "no thread for OOM dumps: they are written inline");
                self.inline = true;
            }
        }
    }

    /// Hands OOM number `index`'s snapshot to the writing thread. Where no thread can be
    /// started, writes it here; the outcome comes from [`poll`](Self::poll) either way.
    pub(crate) fn start(&mut self, index: u64, snapshot: Snapshot) {
        self.pending.push(index);
        if self.thread.is_none() && !self.inline {
            self.start_thread();
        }
        let job = match &self.thread {
            Some(t) => t.jobs.send((index, snapshot)).err().map(|e| e.into_inner()),
            None => Some((index, snapshot)),
        };
        if let Some((index, snapshot)) = job {
            let outcome = (self.write)(index, &snapshot);
            self.done_inline.push((index, outcome));
        }
    }

    /// Dumps handed over whose outcome [`poll`](Self::poll) has not returned yet.
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The outcomes ready now; with `wait`, every outcome of the dumps handed over. A thread
    /// that ended without answering (it cannot, short of an abort) fails its dumps instead of
    /// leaving the caller waiting.
    pub(crate) fn poll(&mut self, wait: bool) -> Vec<DumpOutcome> {
        let mut out = std::mem::take(&mut self.done_inline);
        if let Some(t) = &self.thread {
            while out.len() < self.pending.len() {
                let next = if wait {
                    t.done.recv().ok()
                } else {
                    match t.done.try_recv() {
                        Ok(o) => Some(o),
                        Err(crossbeam_channel::TryRecvError::Empty) => break,
                        Err(crossbeam_channel::TryRecvError::Disconnected) => None,
                    }
                };
                match next {
                    Some(outcome) => out.push(outcome),
                    None => {
                        let answered: Vec<u64> = out.iter().map(|o| o.0).collect();
                        for &index in self.pending.iter().filter(|i| !answered.contains(i)) {
                            out.push((
                                index,
                                Err(DumpError::Write {
                                    path: self.dumper.stem(index, self.pid),
                                    message: "the dump writer stopped".into(),
                                }),
                            ));
                        }
                        break;
                    }
                }
            }
        }
        self.pending.retain(|i| !out.iter().any(|o| o.0 == *i));
        out
    }
}

impl Drop for DumpWriter {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            drop(t.jobs);
            let _ = t.join.join();
        }
    }
}
