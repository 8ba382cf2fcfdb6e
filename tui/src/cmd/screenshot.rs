//! `allocview screenshot` (being written).

use crate::cli::ScreenshotArgs;

/// Runs the command.
pub fn run(_args: &ScreenshotArgs) -> anyhow::Result<()> {
    anyhow::bail!("allocview screenshot is not available in this build yet")
}
