//! `allocview summary FILE [--json]`: PyTorch's memory summary of a snapshot file (pickle or
//! allocview JSON), plus fragmentation per pool and stream, OOM entries and trace facts
//! ([`allocview_agent::summary`]).

pub mod progress;

use allocview_agent::summary;

use crate::cli::SummaryArgs;
use crate::output;

/// Runs the command: prints the summary as text, or as JSON with `--json`.
///
/// # Errors
/// The file cannot be read or is not a snapshot (the message names the file and the problem).
pub fn run(args: &SummaryArgs) -> anyhow::Result<()> {
    let snapshot = progress::load_snapshot(&args.file)?;
    let s = summary::summarize(&snapshot);
    if args.json {
        output::print(&serde_json::to_string_pretty(&s)?)?;
    } else {
        output::write(&s.to_string())?;
    }
    Ok(())
}
