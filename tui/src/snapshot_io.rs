//! Reading and writing snapshot files for the dashboard.

use std::path::Path;

use allocview_alloc::snapshot::Snapshot;

/// Writes `snapshot` to `path` as JSON.
///
/// # Errors
/// When the file cannot be written.
pub fn save(path: &Path, snapshot: &Snapshot) -> anyhow::Result<()> {
    let f = std::fs::File::create(path)?;
    serde_json::to_writer(std::io::BufWriter::new(f), snapshot)?;
    Ok(())
}
