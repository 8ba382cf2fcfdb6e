//! `allocview export IN --to json|pickle -o OUT`: converts a snapshot between PyTorch's pickle
//! and allocview's JSON. A pickle export is consistent the way PyTorch's tools check it: every
//! segment's blocks tile it (checked; an input that does not is refused), and its allocated,
//! active and requested sizes are the sums of its blocks (recomputed on write).
//!
//! An output name whose extension names the other format (`--to json -o out.pickle`) is
//! refused before anything is read or written: a file's name never lies about its format.

use std::path::Path;

use allocview_agent::pytorch;
use allocview_agent::snapshot_file::{self, FileFormat};

use super::summary::progress::load_snapshot;
use crate::cli::{ExportArgs, ExportFormat};

/// Runs the command.
///
/// # Errors
/// The input cannot be read, its segments do not tile (pickle export), or the output cannot be
/// written.
pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let wanted = match args.to {
        ExportFormat::Json => FileFormat::Json,
        ExportFormat::Pickle => FileFormat::Pickle,
    };
    if let Some(named) = format_named_by(&args.out)
        && named != wanted
    {
        // `--to` spells each format as its extension.
        let (to, other) = (wanted.extension(), named.extension());
        anyhow::bail!(
            "{}: the extension says {} but --to {to} was given; name the output `.{to}` or pass \
             --to {other}",
            args.out.display(),
            format_name(named),
        );
    }
    let snapshot = load_snapshot(&args.input)?;
    if wanted == FileFormat::Pickle {
        pytorch::check_tiling(&snapshot).map_err(|e| {
            anyhow::anyhow!(
                "{}: cannot export as a PyTorch pickle, blocks must tile their segment: {e}",
                args.input.display()
            )
        })?;
    }
    snapshot_file::save(&args.out, &snapshot, wanted)
        .map_err(|e| anyhow::anyhow!("cannot write {e}"))?;
    let bytes = std::fs::metadata(&args.out).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({} bytes, {}): {} segments, {} trace entries",
        args.out.display(),
        bytes,
        format_name(wanted),
        snapshot.segments.len(),
        snapshot.device_traces.iter().map(Vec::len).sum::<usize>()
    );
    Ok(())
}

/// Extensions that name a PyTorch pickle.
const PICKLE_EXTENSIONS: [&str; 2] = ["pickle", "pkl"];

/// The format an output file's extension names (case-insensitive), if it names one.
fn format_named_by(path: &Path) -> Option<FileFormat> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    if ext == FileFormat::Json.extension() {
        Some(FileFormat::Json)
    } else if PICKLE_EXTENSIONS.contains(&ext.as_str()) {
        Some(FileFormat::Pickle)
    } else {
        None
    }
}

/// A format in words.
fn format_name(f: FileFormat) -> &'static str {
    match f {
        FileFormat::Json => "allocview JSON",
        FileFormat::Pickle => "PyTorch pickle",
    }
}
