//! `allocview demo` (being written).

use crate::cli::DemoArgs;

/// Runs the command.
pub fn run(_args: &DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("allocview demo is not available in this build yet")
}
