//! `allocview export IN --to json|pickle -o OUT`: converts a snapshot between PyTorch's pickle
//! and allocview's JSON. A pickle export is consistent the way PyTorch's tools check it: every
//! segment's blocks tile it (checked; an input that does not is refused), and its allocated,
//! active and requested sizes are the sums of its blocks (recomputed on write).

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
    let snapshot = load_snapshot(&args.input)?;
    let format = match args.to {
        ExportFormat::Json => FileFormat::Json,
        ExportFormat::Pickle => {
            pytorch::check_tiling(&snapshot).map_err(|e| {
                anyhow::anyhow!(
                    "{}: cannot export as a PyTorch pickle, blocks must tile their segment: {e}",
                    args.input.display()
                )
            })?;
            FileFormat::Pickle
        }
    };
    snapshot_file::save(&args.out, &snapshot, format)
        .map_err(|e| anyhow::anyhow!("cannot write {e}"))?;
    let bytes = std::fs::metadata(&args.out).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({} bytes, {}): {} segments, {} trace entries",
        args.out.display(),
        bytes,
        match format {
            FileFormat::Json => "allocview JSON",
            FileFormat::Pickle => "PyTorch pickle",
        },
        snapshot.segments.len(),
        snapshot.device_traces.iter().map(Vec::len).sum::<usize>()
    );
    Ok(())
}
