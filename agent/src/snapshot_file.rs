//! Snapshot files: PyTorch's pickle and allocview's JSON, told apart by their first bytes,
//! loaded and saved through one API. The agent writes its OOM dumps through [`save`]; the TUI
//! opens files through [`load`] / [`load_with_progress`].
//!
//! - [`FileFormat::Pickle`]: what `torch.cuda.memory._dump_snapshot()` writes (every version);
//!   see [`crate::pytorch`]. Files start with `PROTO` (`0x80`, then 2 to 5).
//! - [`FileFormat::Json`]: allocview's versioned JSON; see [`json`] and
//!   `docs/snapshot-format.md`. Files start with `{` (after optional whitespace).
//!
//! [`save`] is atomic: it writes a temporary file in the same folder, flushes it to disk and
//! renames it over the target, so a reader (or a crash) never sees half a file.

pub mod json;

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use allocview_alloc::snapshot::Snapshot;
use thiserror::Error;

pub use json::JsonFormatError;

use crate::pytorch::{self, PytorchError};

/// How much of a file [`load_with_progress`] reads between progress reports.
pub const READ_CHUNK: usize = 1 << 20;

/// Largest snapshot file [`load_with_progress`] reads: the pickle reader's limit (its offsets
/// are 32-bit), far beyond any real snapshot. A larger file (or an endless stream such as a
/// device or a pipe) is refused by its size, before or while it is read, never read whole.
pub const MAX_FILE_BYTES: u64 = u32::MAX as u64;

/// The error for a file over `max` bytes ([`MAX_FILE_BYTES`]; `size`: its size, or what was
/// read of a stream).
fn too_large(size: u64, stream: bool, max: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!(
            "{} {size} bytes, over the {max} bytes a snapshot file can have",
            if stream {
                "read more than"
            } else {
                "the file has"
            }
        ),
    )
}

/// The [`SnapshotFileError::UnknownFormat`] of a file starting with `bytes`.
fn unknown_format(bytes: &[u8]) -> SnapshotFileError {
    SnapshotFileError::UnknownFormat {
        found: if bytes.is_empty() {
            "nothing (empty file)".into()
        } else {
            bytes
                .iter()
                .take(8)
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        },
    }
}

/// The formats of snapshot files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileFormat {
    /// allocview's versioned JSON.
    Json,
    /// PyTorch's snapshot pickle (protocol 2 to 5 to read, 4 to write).
    Pickle,
}

impl FileFormat {
    /// The usual file extension.
    pub fn extension(self) -> &'static str {
        match self {
            FileFormat::Json => "json",
            FileFormat::Pickle => "pickle",
        }
    }
}

/// A path in `dir` named `stem`, or `stem-2`, `stem-3`, ... : the first for which no file
/// `{name}.{ext}` exists for any of `exts`, so that writing there replaces nothing.
pub fn fresh_stem(dir: &Path, stem: &str, exts: &[&str]) -> PathBuf {
    let free = |name: &str| {
        !exts
            .iter()
            .any(|e| dir.join(format!("{name}.{e}")).exists())
    };
    std::iter::once(stem.to_string())
        .chain((2u64..).map(|n| format!("{stem}-{n}")))
        .find(|name| free(name))
        .map_or_else(|| dir.join(stem), |name| dir.join(name))
}

/// Errors of reading or writing snapshot files.
#[derive(Debug, Error)]
pub enum SnapshotFileError {
    /// The file could not be read or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The bytes are neither format.
    #[error(
        "not a snapshot file: neither a PyTorch pickle (starts with 80 02..05) nor allocview JSON \
         (starts with '{{'); it starts with {found}"
    )]
    UnknownFormat {
        /// The first bytes, hex.
        found: String,
    },
    /// A PyTorch pickle that could not be read.
    #[error("PyTorch snapshot: {0}")]
    Pickle(PytorchError),
    /// allocview JSON that could not be read.
    #[error("allocview JSON: {0}")]
    Json(JsonFormatError),
    /// Any of the above, in a named file.
    #[error("{}: {error}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        error: Box<SnapshotFileError>,
    },
}

// The messages above already include the inner error's text, so the inner errors are not
// exposed as `source` (a reporter walking the chain would print them twice).
impl From<PytorchError> for SnapshotFileError {
    fn from(e: PytorchError) -> Self {
        SnapshotFileError::Pickle(e)
    }
}

impl From<JsonFormatError> for SnapshotFileError {
    fn from(e: JsonFormatError) -> Self {
        SnapshotFileError::Json(e)
    }
}

/// The format of a file from its first bytes, or `None` when it is neither.
pub fn detect(bytes: &[u8]) -> Option<FileFormat> {
    match bytes {
        [0x80, 2..=5, ..] => Some(FileFormat::Pickle),
        _ => match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{') => Some(FileFormat::Json),
            _ => None,
        },
    }
}

/// Reads a snapshot from the bytes of a file of either format.
///
/// # Errors
/// [`SnapshotFileError::UnknownFormat`], or the format's own error naming the place.
pub fn from_bytes(bytes: &[u8]) -> Result<Snapshot, SnapshotFileError> {
    from_bytes_with_progress(bytes, &mut |_| {})
}

fn from_bytes_with_progress(
    bytes: &[u8],
    progress: &mut dyn FnMut(usize),
) -> Result<Snapshot, SnapshotFileError> {
    match detect(bytes) {
        Some(FileFormat::Pickle) => Ok(pytorch::from_pickle_with_progress(bytes, progress)?),
        Some(FileFormat::Json) => Ok(json::from_json(bytes)?),
        None => Err(unknown_format(bytes)),
    }
}

/// Loads a snapshot file of either format.
///
/// # Errors
/// As [`from_bytes`], or an I/O error; every error names the file.
pub fn load(path: &Path) -> Result<Snapshot, SnapshotFileError> {
    load_with_progress(path, &mut |_, _| {})
}

/// Loads a snapshot file, calling `progress(done, total)` as it goes: `total` is twice the
/// file size (reading the file, then decoding it), `done` grows to `total`.
///
/// # Errors
/// As [`load`].
pub fn load_with_progress(
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Snapshot, SnapshotFileError> {
    let bytes = read_input(path, &|_| false, progress)?;
    let read = bytes.len() as u64;
    let total = read.saturating_mul(2);
    let result = from_bytes_with_progress(&bytes, &mut |pos| progress(read + pos as u64, total))
        .map_err(|e| SnapshotFileError::InFile {
            path: path.to_path_buf(),
            error: Box::new(e),
        });
    progress(total, total);
    result
}

/// Reads the file at `path` whole, for a snapshot (or, where `also` accepts its start, another
/// input such as an RMM log), calling `progress(done, total)` with `total` twice the file size.
/// A file over [`MAX_FILE_BYTES`] is refused by its size, or once that much is read (a device,
/// which has no size); one whose first bytes start neither a snapshot nor what `also` accepts
/// (a binary file named by mistake, `/dev/zero`) is refused at once instead of read to its end.
///
/// # Errors
/// [`SnapshotFileError::Io`] for a failed read or a file too large,
/// [`SnapshotFileError::InFile`] for a start that is no snapshot; each names the file.
pub(crate) fn read_input(
    path: &Path,
    also: &dyn Fn(&[u8]) -> bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<u8>, SnapshotFileError> {
    read_input_within(path, also, progress, MAX_FILE_BYTES)
}

/// [`read_input`] with `max` bytes for a snapshot in place of [`MAX_FILE_BYTES`].
fn read_input_within(
    path: &Path,
    also: &dyn Fn(&[u8]) -> bool,
    progress: &mut dyn FnMut(u64, u64),
    max: u64,
) -> Result<Vec<u8>, SnapshotFileError> {
    let io_err = |error| SnapshotFileError::Io {
        path: path.to_path_buf(),
        error,
    };
    let mut file = File::open(path).map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len();
    // A snapshot over the limit is refused by its size before anything is read; what `also`
    // accepts (an RMM log, not bound by the pickle reader's 32-bit offsets) is told by its
    // first bytes, so a file over the limit is refused after those unless it is that.
    let mut limit = max;
    if len > max && !may_be_other(&mut file, also).map_err(io_err)? {
        return Err(io_err(too_large(len, false, max)));
    }
    let total = len.saturating_mul(2);
    progress(0, total);
    let mut bytes = Vec::with_capacity(usize::try_from(len.min(max)).unwrap_or(0));
    let mut chunk = vec![0u8; READ_CHUNK];
    // Whether the first bytes were seen to start a snapshot: what does not (a device, a
    // binary file named by mistake) is refused at once instead of read to its end.
    let mut format_known = false;
    loop {
        let n = match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(e)),
        };
        bytes.extend_from_slice(&chunk[..n]);
        if !format_known && bytes.len() >= 2 && bytes.iter().any(|b| !b.is_ascii_whitespace()) {
            if detect(&bytes).is_none() && also(&bytes) {
                limit = u64::MAX;
            } else if detect(&bytes).is_none() {
                return Err(SnapshotFileError::InFile {
                    path: path.to_path_buf(),
                    error: Box::new(unknown_format(&bytes)),
                });
            }
            format_known = true;
        }
        if bytes.len() as u64 > limit {
            return Err(io_err(too_large(bytes.len() as u64, true, max)));
        }
        progress((bytes.len() as u64).min(len), total);
    }
    Ok(bytes)
}

/// Whether the first bytes of `file` (a regular file, read from its start; the position is
/// put back) are accepted by `also`.
fn may_be_other(file: &mut File, also: &dyn Fn(&[u8]) -> bool) -> io::Result<bool> {
    use std::io::Seek as _;
    let mut start = vec![0u8; READ_CHUNK];
    let n = file.read(&mut start)?;
    file.rewind()?;
    Ok(also(&start[..n]))
}

/// Encodes a snapshot in a format.
pub fn to_bytes(snapshot: &Snapshot, format: FileFormat) -> Vec<u8> {
    match format {
        FileFormat::Json => json::to_json(snapshot),
        FileFormat::Pickle => pytorch::to_pickle(snapshot),
    }
}

/// Symbolic links followed at most by [`save`] (Linux's own limit, `MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

/// The file [`save`] replaces for `path`: `path` itself, or the file its symbolic links lead
/// to (so that the link stays a link); an error when that is not a regular file (a device
/// such as `/dev/full`, a FIFO, a socket, a folder), which a rename would replace.
fn save_target(path: &Path) -> io::Result<PathBuf> {
    let mut target = path.to_path_buf();
    for _ in 0..MAX_SYMLINKS {
        let meta = match fs::symlink_metadata(&target) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(target),
            Err(e) => return Err(e),
        };
        if meta.file_type().is_symlink() {
            let link = fs::read_link(&target)?;
            target = match target.parent() {
                Some(dir) if link.is_relative() => dir.join(link),
                _ => link,
            };
            continue;
        }
        if meta.is_file() {
            return Ok(target);
        }
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not a regular file (a folder, device, FIFO or socket), which saving would \
                 replace; give the name of a file",
                target.display()
            ),
        ));
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "more than {MAX_SYMLINKS} symbolic links lead from {}",
            path.display()
        ),
    ))
}

/// Writes a snapshot file atomically: a temporary file in the same folder, flushed to disk,
/// then renamed over `path` (over the file it links to when `path` is a symbolic link). A
/// `path` that is not a regular file (a device, a FIFO) is refused, never replaced.
///
/// # Errors
/// An I/O error naming the file; the temporary file is removed.
pub fn save(path: &Path, snapshot: &Snapshot, format: FileFormat) -> Result<(), SnapshotFileError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let io_err = |error| SnapshotFileError::Io {
        path: path.to_path_buf(),
        error,
    };
    let target = save_target(path).map_err(io_err)?;
    let path = target.as_path();
    let bytes = to_bytes(snapshot, format);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io_err(io::Error::new(io::ErrorKind::InvalidInput, "no file name")))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let write = || -> io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        // Make the rename itself durable; not every platform can open a folder, so best effort.
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io_err(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `start` then spaces, `len` bytes in all.
    fn file_of(dir: &Path, name: &str, start: &str, len: usize) -> std::path::PathBuf {
        let mut bytes = start.as_bytes().to_vec();
        bytes.resize(len, b' ');
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn only_what_the_caller_also_accepts_may_be_larger_than_a_snapshot_can_be() {
        let dir = tempfile::tempdir().unwrap();
        let rmm = |b: &[u8]| b.starts_with(b"Thread,");
        let max = 64;
        let log = file_of(dir.path(), "log.csv", "Thread,Time\n", 200);
        let bytes = read_input_within(&log, &rmm, &mut |_, _| {}, max).unwrap();
        assert_eq!(bytes.len(), 200);
        let json = file_of(dir.path(), "snap.json", "{\"format\"", 200);
        let err = read_input_within(&json, &rmm, &mut |_, _| {}, max).unwrap_err();
        assert!(
            err.to_string()
                .contains("the file has 200 bytes, over the 64 bytes"),
            "{err}"
        );
    }
}
