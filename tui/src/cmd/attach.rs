//! `allocview --attach` (being written).

use crate::cli::Cli;

/// Runs the command.
pub fn run(_cli: &Cli) -> anyhow::Result<()> {
    anyhow::bail!("allocview --attach is not available in this build yet")
}
