//! `allocview replay FILE [--config STR]... [--device-memory BYTES] [--json] [--out OUT]`:
//! replays a recorded trace through the caching allocator on a simulated device (fidelity to
//! the recording, and what-if runs under other settings side by side). See
//! `allocview_agent::replay`. `--out` writes the what-if run (one file per `--config` when there
//! are several), or the replay under the recorded settings without `--config`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use allocview_agent::replay::{self, ReplayOutput, ReplayReport, ReplaySettings};
use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_alloc::snapshot::Snapshot;

use crate::cli::ReplayArgs;
use crate::output::{self, Versioned};
use crate::units;

/// Replays shorter than this many events (over all runs) get no progress bar.
const PROGRESS_MIN_EVENTS: usize = 100_000;

/// How often the progress bar redraws.
const PROGRESS_TICK: Duration = Duration::from_millis(100);

/// An error when `out` is the input file `input` (by any name): replay never rewrites its
/// input.
fn refuse_input(out: &Path, input: &Path) -> anyhow::Result<()> {
    if crate::output::same_file(out, input) {
        anyhow::bail!(
            "{}: --out names the input file; give another name (replay never rewrites its \
             input)",
            out.display()
        );
    }
    Ok(())
}

/// Runs the command.
pub fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    // Said before the replay runs (each written path is checked again before it is written).
    if let Some(out) = &args.out {
        refuse_input(out, &args.file)?;
    }
    let snapshot = replay::load(&args.file)?;
    let device_memory = args
        .device_memory
        .as_deref()
        .map(|s| units::parse_size(s).with_context(|| format!("--device-memory {s:?}")))
        .transpose()?;
    if device_memory == Some(0) {
        anyhow::bail!("--device-memory must be more than 0 bytes");
    }
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
    let mut written = Vec::new();
    let mut lines = Vec::new();
    if let Some(out) = &args.out {
        for (path, snapshot, what, label) in outputs(out, &args.config, &output) {
            refuse_input(&path, &args.file)?;
            snapshot_file::save(&path, snapshot, FileFormat::Pickle)
                // The error names the path already.
                .map_err(|e| anyhow::anyhow!("cannot write {e}"))?;
            lines.push(format!("{what} written to {}", path.display()));
            written.push(Written { label, path });
        }
    }
    if args.json {
        let json = ReplayJson {
            report: &output.report,
            written,
        };
        output::print(&Versioned::new(JSON_FORMAT, JSON_VERSION, &json).pretty()?)?;
        for line in &lines {
            eprintln!("{line}");
        }
    } else {
        output::write(&output.report.to_text())?;
        for line in &lines {
            output::print(line)?;
        }
    }
    Ok(())
}

/// `replay --json`'s `format` field.
pub const JSON_FORMAT: &str = "allocview-replay";
/// `replay --json`'s `version` field (docs/json.md).
pub const JSON_VERSION: u32 = 1;

/// `replay --json`: the report's fields, and the files `--out` wrote.
#[derive(Debug, Serialize)]
struct ReplayJson<'a> {
    #[serde(flatten)]
    report: &'a ReplayReport,
    /// Empty without `--out`.
    written: Vec<Written>,
}

/// A file `replay --out` wrote.
#[derive(Debug, Serialize)]
pub struct Written {
    /// The run it holds: the `label` of its entry in `runs` (`recorded` for the replay under
    /// the recorded settings, else the `--config` run's label).
    pub label: String,
    /// Where, as given (relative to the current folder when `--out` was).
    pub path: PathBuf,
}

/// What `--out OUT` writes: without `--config`, the replay under the recorded settings to
/// `OUT`; with one, that what-if run to `OUT`; with several, each what-if run to its own file,
/// `OUT` with the run's number and settings before the extension (`OUT.1-SETTINGS.pickle`).
/// Each with a description of the run for the message, and the run's label in the report.
fn outputs<'a>(
    out: &Path,
    configs: &[String],
    output: &'a ReplayOutput,
) -> Vec<(PathBuf, &'a Snapshot, String, String)> {
    let describe = |config: &str| format!("what-if run ({})", replay::config_label(config));
    // The report's runs: the recorded one first, then (with `--device-memory` of another
    // size) the recorded settings resized, then one per `--config`, last.
    let runs = &output.report.runs;
    let first_what_if = runs.len().saturating_sub(configs.len());
    let label = |i: usize| runs.get(i).map_or_else(String::new, |r| r.label.clone());
    match (configs, output.what_ifs.as_slice()) {
        ([], _) => vec![(
            out.to_path_buf(),
            &output.replayed,
            "replayed run (recorded settings)".to_string(),
            label(0),
        )],
        ([config], [run]) => vec![(
            out.to_path_buf(),
            run,
            describe(config),
            label(first_what_if),
        )],
        _ => configs
            .iter()
            .zip(&output.what_ifs)
            .enumerate()
            .map(|(i, (config, run))| {
                (
                    numbered(out, i + 1, config),
                    run,
                    describe(config),
                    label(first_what_if + i),
                )
            })
            .collect(),
    }
}

/// `OUT` with `N-SETTINGS` inserted before its extension, the settings reduced to letters,
/// digits, `_`, `.` and `-` (others become `_`).
fn numbered(out: &Path, n: usize, config: &str) -> PathBuf {
    let settings: String = replay::config_label(config)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let stem = out
        .file_stem()
        .map_or_else(|| "replayed".into(), |s| s.to_string_lossy().into_owned());
    let name = match out.extension() {
        Some(ext) => format!("{stem}.{n}-{settings}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{n}-{settings}"),
    };
    out.with_file_name(name)
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
