//! `allocview export` (being written).

use crate::cli::ExportArgs;

/// Runs the command.
pub fn run(_args: &ExportArgs) -> anyhow::Result<()> {
    anyhow::bail!("allocview export is not available in this build yet")
}
