//! [`OomDumper`]: writes the allocator's snapshot at an OOM to the dump folder, as PyTorch's
//! pickle (for PyTorch's viewers) and allocview's JSON, so nothing is lost when the process dies
//! right after.
//!
//! Files are named `oom-NNNN-pidPID.{pickle,json}` (`NNNN` the OOM's index in the process) and
//! written atomically (a temporary file renamed into place), so a reader never sees half a
//! dump. The folder is created on first use. A failure is returned, never a panic: the
//! aggregator logs and counts it and carries on.

use std::path::{Path, PathBuf};

use allocview_alloc::snapshot::Snapshot;

use crate::snapshot_file::{FileFormat, save};

/// Why a dump could not be written.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The dump folder could not be created.
    #[error("cannot create the dump folder {path}: {source}")]
    Folder {
        /// The folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
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

/// Writes OOM dumps into one folder.
#[derive(Debug, Clone)]
pub struct OomDumper {
    dir: PathBuf,
}

/// The extensions of a dump's two files: PyTorch's pickle, then allocview's JSON.
const DUMP_EXTENSIONS: [&str; 2] = ["pickle", "json"];

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
        self.dir.join(format!("oom-{index:04}-pid{pid}"))
    }

    /// [`stem`](Self::stem), or `…-2`, `…-3`, … when an earlier dump already has that name (a
    /// restarted process that got the same pid, as in containers, or two agents of one
    /// process): a dump never replaces another.
    fn free_stem(&self, index: u64, pid: u32) -> PathBuf {
        let taken = |stem: &Path| {
            DUMP_EXTENSIONS
                .iter()
                .any(|ext| stem.with_extension(ext).exists())
        };
        let base = self.stem(index, pid);
        let mut stem = base.clone();
        for n in 2u64.. {
            if !taken(&stem) {
                break;
            }
            let mut name = base.clone().into_os_string();
            name.push(format!("-{n}"));
            stem = name.into();
        }
        stem
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
        std::fs::create_dir_all(&self.dir).map_err(|source| DumpError::Folder {
            path: self.dir.clone(),
            source,
        })?;
        let stem = self.free_stem(index, pid);
        let mut written = Vec::new();
        let mut first_error = None;
        for (ext, format) in DUMP_EXTENSIONS
            .into_iter()
            .zip([FileFormat::Pickle, FileFormat::Json])
        {
            let path = stem.with_extension(ext);
            match save(&path, snapshot, format) {
                Ok(()) => written.push(path),
                Err(e) => {
                    first_error.get_or_insert(DumpError::Write {
                        path,
                        message: e.to_string(),
                    });
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(written),
        }
    }
}
