//! `allocview replay` (being written).

use crate::cli::ReplayArgs;

/// Runs the command.
pub fn run(_args: &ReplayArgs) -> anyhow::Result<()> {
    anyhow::bail!("allocview replay is not available in this build yet")
}
