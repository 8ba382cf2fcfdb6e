//! `allocview bench` (being written).

use crate::cli::BenchArgs;

/// Runs the command.
pub fn run(_args: &BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("allocview bench is not available in this build yet")
}
