//! `allocview replay FILE [--config STR]... [--device-memory BYTES] [--json] [--out OUT]`:
//! replays a recorded trace through the caching allocator on a simulated device (fidelity to
//! the recording, and what-if runs under other settings side by side). See
//! `allocview_agent::replay`.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use allocview_agent::replay::{self, ReplaySettings};
use allocview_agent::snapshot_file::{self, FileFormat};

use crate::cli::ReplayArgs;

/// Replays shorter than this many events (over all runs) get no progress bar.
const PROGRESS_MIN_EVENTS: usize = 100_000;

/// How often the progress bar redraws.
const PROGRESS_TICK: Duration = Duration::from_millis(100);

/// Runs the command.
pub fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    let snapshot = replay::load(&args.file)?;
    let device_memory = args
        .device_memory
        .as_deref()
        .map(replay::parse_bytes)
        .transpose()
        .context("--device-memory")?;
    let settings = ReplaySettings {
        configs: args.config.clone(),
        device_memory,
        keep_history: args.out.is_some(),
    };
    let events: usize = snapshot
        .device_traces
        .iter()
        .map(Vec::len)
        .max()
        .unwrap_or(0);
    let bar = progress_bar((events * (1 + args.config.len())) as u64);
    let output = replay::replay(&snapshot, &settings, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    let output = output.with_context(|| format!("replaying {}", args.file.display()))?;
    if let Some(out) = &args.out {
        snapshot_file::save(out, &output.replayed, FileFormat::Pickle)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&output.report)?);
    } else {
        print!("{}", output.report.to_text());
        if let Some(out) = &args.out {
            println!("replayed run written to {}", out.display());
        }
    }
    Ok(())
}

/// A progress bar on stderr, hidden when stderr is not a terminal or the replay is short.
fn progress_bar(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() || total < PROGRESS_MIN_EVENTS as u64 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("replaying {bar:40} {pos}/{len} events ({per_sec}, {eta})")
    {
        bar.set_style(style);
    }
    bar.enable_steady_tick(PROGRESS_TICK);
    bar
}
