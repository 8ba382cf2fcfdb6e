//! `allocview summary FILE [--json] [--fail-on-oom] [--max-peak SIZE]`: PyTorch's memory
//! summary of a snapshot file (pickle or allocview JSON), plus fragmentation per pool and
//! stream, OOM entries and trace facts ([`allocview_agent::summary`]). The two gates fail the
//! command with [`GATE_FAILED`](crate::exit::GATE_FAILED) after the output is printed, for CI.

pub mod progress;

use allocview_agent::summary::{self, StatsWindow, Summary};
use anyhow::Context as _;

use crate::cli::SummaryArgs;
use crate::exit::GateFailed;
use crate::output::{self, Versioned};
use crate::units;

/// `summary --json`'s `format` field.
pub const JSON_FORMAT: &str = "allocview-summary";
/// `summary --json`'s `version` field (docs/json.md).
pub const JSON_VERSION: u32 = 1;

/// Runs the command: prints the summary as text, or as JSON with `--json`; then applies the
/// gates asked for.
///
/// # Errors
/// The file cannot be read or is not a snapshot (the message names the file and the
/// problem); a bad `--max-peak` size; `--max-peak` on a file whose peak is not known; a
/// failed gate ([`GateFailed`]).
pub fn run(args: &SummaryArgs) -> anyhow::Result<()> {
    // A bad size is a mistake in the command line: said before the file is read.
    let max_peak = args
        .max_peak
        .as_deref()
        .map(|s| units::parse_size(s).with_context(|| format!("--max-peak {s:?}")))
        .transpose()?;
    let snapshot = progress::load_snapshot(&args.file)?;
    let s = summary::summarize(&snapshot);
    let printed = if args.json {
        let json = Versioned::new(JSON_FORMAT, JSON_VERSION, &s).pretty()?;
        output::print(&json)
    } else {
        output::write(&s.to_string())
    };
    // A gate's verdict stands whether or not the reader took all the output
    // (`summary --fail-on-oom | head`): it goes first.
    gates(&s, args.fail_on_oom, max_peak)?;
    printed
}

/// The gates: `--fail-on-oom` fails on any OOM (a trace entry or the header's record, as
/// [`Summary::ooms`] counts them); `--max-peak` fails when a device's peak allocated bytes over
/// the trace window exceed the limit, and is an error when a device's window is not known.
///
/// # Errors
/// [`GateFailed`] naming every gate that failed; an error when a peak is not known.
pub fn gates(s: &Summary, fail_on_oom: bool, max_peak: Option<u64>) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    if fail_on_oom && s.ooms > 0 {
        failed.push(format!(
            "the file holds {} (--fail-on-oom)",
            summary::render::counted(s.ooms, "OOM", "OOMs")
        ));
    }
    if let Some(max) = max_peak {
        if s.devices.is_empty() {
            anyhow::bail!("--max-peak: the peak is not known: the file holds no device");
        }
        for d in &s.devices {
            match &d.window {
                StatsWindow::Trace { peak_allocated, .. } if *peak_allocated > max => {
                    failed.push(format!(
                        "device {}: peak allocated {} ({peak_allocated} B) exceeds --max-peak {} \
                         ({max} B)",
                        d.device,
                        units::bytes(*peak_allocated),
                        units::bytes(max)
                    ));
                }
                StatsWindow::Trace { .. } => {}
                StatsWindow::NotKnown { why } => anyhow::bail!(
                    "--max-peak: device {}'s peak allocated bytes are not known: {why}",
                    d.device
                ),
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(GateFailed(format!("gate failed: {}", failed.join("; "))).into())
    }
}
