//! `allocview summary` (being written).

use crate::cli::SummaryArgs;

/// Runs the command.
pub fn run(_args: &SummaryArgs) -> anyhow::Result<()> {
    anyhow::bail!("allocview summary is not available in this build yet")
}
