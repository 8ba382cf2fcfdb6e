//! `allocview open` (being written).

use crate::cli::OpenArgs;

/// Runs the command.
pub fn run(_args: &OpenArgs) -> anyhow::Result<()> {
    anyhow::bail!("allocview open is not available in this build yet")
}
