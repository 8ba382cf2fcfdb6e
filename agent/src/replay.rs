//! Replay a recorded allocation trace through the caching allocator, on a simulated device, and
//! ask what would have happened under other allocator settings (issue 5).
//!
//! # What it does
//! The input is a snapshot with a trace (PyTorch's pickle, allocview's JSON) or an RMM log
//! ([`rmm`]). [`InitialState`] rebuilds what existed when the trace began (a trace usually
//! starts mid-run), and the [`engine`] drives a `CachingAllocator` over a `SimBackend` through
//! the trace:
//! - the **fidelity run** uses the recording's settings and places every segment at its
//!   recorded address, so replayed addresses compare directly with recorded ones; it reports
//!   the share of allocations at the recorded address, of segment allocations of the recorded
//!   size, and the first divergence ([`Fidelity`]), and gives the baseline column;
//! - one **what-if run** per `--config`, at the same device capacity, without address hints.
//!
//! # Device size
//! The recorded column describes the recording: the fidelity run uses the device size the file
//! records, or an unlimited device when it records none (an RMM log, an old snapshot: the
//! recording then ran out of memory only where its trace says so). A different
//! `--device-memory` ([`ReplaySettings::device_memory`]) is a what-if: the `--config` runs use
//! it, and one more column, [`resized_label`], replays the recorded settings on it.
//!
//! # Installing the initial state
//! Replay installs the initial segments through the allocator's public API rather than a
//! back door into its internals: each segment is allocated whole at its recorded address
//! (`SimBackend::hint_next_segment`), freed, and carved front to back into its blocks while
//! every other segment is fully allocated, so best fit can only take the front of this
//! segment's remainder; placeholders for the free blocks are freed at the end (free blocks
//! never touch each other, so nothing merges). This holds for the default rounding and split
//! rules the recordings were made with (every large-pool block is larger than 1 MiB, every
//! small-pool allocation at most 1 MiB); a recording made with `max_split_size_mb` or
//! power-of-two rounding divisions could lay out differently, and a mismatch shows as a
//! warning in [`InitialSummary::warnings`]. The advantage: replay depends on nothing but the
//! allocator's public contract, so it checks that contract rather than sharing its bugs.
//!
//! # Private pools
//! Allocations the recording routed to a private pool (a CUDA graph capture, a
//! `torch.cuda.MemPool`) are routed to the same pool in every run ([`PoolRoutes`]: found from
//! the final snapshot's `segment_pool_id`, as PyTorch's trace entries do not name pools), and
//! initial segments of a private pool are installed in it.
//!
//! # What-if runs
//! A what-if run begins from the same recorded state as the fidelity run (cache included) and
//! follows the same segment placement hints, with its own settings from the first trace entry
//! on: under the recording's own settings it reproduces the recorded column exactly, so any
//! difference in another column is the settings' doing. Where the settings cannot hold the
//! recorded segments (expandable segments against ordinary ones), the run begins from the live
//! blocks alone and its column is marked ([`RunStart::LiveBlocksOnly`]). Recorded `oom`
//! entries are attempted again (a success is given back at once: the program never had that
//! block).

pub mod bytes;
pub mod engine;
pub mod initial;
pub mod plan;
pub mod pool_routes;
pub mod report;
pub mod rmm;
pub mod settings;
pub mod smallest_device;
pub mod what_if;

use std::path::Path;

use allocview_alloc::caching::AllocatorConfig;
use allocview_alloc::snapshot::{Snapshot, TraceAction};

pub use bytes::{BytesError, parse_bytes};
pub use engine::{Placement, ReplayError, RunOptions, RunResult, carried_start, recorded_config};
pub use initial::{InitialBlock, InitialSegment, InitialState};
pub use pool_routes::PoolRoutes;
pub use report::{
    Divergence, Fidelity, InitialSummary, LIVE_BLOCKS_ONLY_MARK, OomEvent, ReplayReport,
    RunFigures, RunStart,
};
pub use rmm::{RmmError, is_rmm_log, parse_rmm_log};
pub use settings::{compose, recorded_settings_text};
pub use smallest_device::{
    SmallestDevice, smallest_device_without_oom, smallest_reachable_without_oom,
};
pub use what_if::{WhatIfOutcome, what_if_avoided};

/// Column label of the recorded run.
pub const RECORDED_LABEL: &str = "recorded";

/// The column label of the what-if run that replays the recorded settings on a device of
/// `device_memory` bytes other than the recording's (see the module docs, "Device size").
pub fn resized_label(device_memory: u64) -> String {
    format!(
        "recorded settings, {} device",
        allocview_alloc::stats::human_bytes(device_memory)
    )
}

/// Column label of a what-if run under PyTorch's defaults (`--config defaults`).
pub const DEFAULTS_LABEL: &str = settings::DEFAULTS_WORD;

/// Column label of a what-if run under an empty settings string: it changes no key, so it is
/// the recorded settings.
pub const UNCHANGED_LABEL: &str = "recorded settings";

/// The column label of a what-if run under `config`: what it changes against the recorded
/// settings, that is the string itself (see [`settings`]), or [`UNCHANGED_LABEL`] when it is
/// empty.
pub fn config_label(config: &str) -> String {
    if config.trim().is_empty() {
        UNCHANGED_LABEL.to_string()
    } else {
        config.trim().to_string()
    }
}

/// A file replay cannot read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read. Every message says `cannot load FILE: ...`, as
    /// `allocview summary`'s do.
    #[error("cannot load {path}: {why}")]
    Io {
        /// The file.
        path: String,
        /// Why (in the message, not a separate source, so that it is said once).
        why: std::io::Error,
    },
    /// An RMM log with a bad row.
    #[error("cannot load {path}: {error}")]
    Rmm {
        /// The file.
        path: String,
        /// What is wrong with it.
        error: RmmError,
    },
    /// A snapshot file that did not parse: `FILE: problem`.
    #[error("cannot load {0}")]
    Snapshot(String),
}

/// Reads a trace: an RMM log (detected by its header) or a snapshot file (PyTorch pickle or
/// allocview JSON).
///
/// # Errors
/// [`LoadError`] naming the file and the problem.
pub fn load(path: &Path) -> Result<Snapshot, LoadError> {
    use crate::snapshot_file::SnapshotFileError;
    let bytes = crate::snapshot_file::read_input(path, &rmm::may_be_rmm_log, &mut |_, _| {})
        .map_err(|e| match e {
            SnapshotFileError::Io { error, .. } => LoadError::Io {
                path: path.display().to_string(),
                why: error,
            },
            e => LoadError::Snapshot(e.to_string()),
        })?;
    if is_rmm_log(&bytes) {
        let text = String::from_utf8_lossy(&bytes);
        return parse_rmm_log(&text).map_err(|error| LoadError::Rmm {
            path: path.display().to_string(),
            error,
        });
    }
    crate::snapshot_file::from_bytes(&bytes)
        .map_err(|e| LoadError::Snapshot(format!("{}: {e}", path.display())))
}

/// What to replay.
#[derive(Debug, Clone, Default)]
pub struct ReplaySettings {
    /// Settings for what-if runs (PyTorch's syntax), one run each.
    pub configs: Vec<String>,
    /// Device capacity of the what-if runs; `None`: the file's, else unlimited. When this
    /// differs from the recording's device (the file's size, or unlimited when it records
    /// none), the recorded column keeps the recording's and a [`resized_label`] column replays
    /// the recorded settings on this one.
    pub device_memory: Option<u64>,
    /// Keep each run's own trace, for [`ReplayOutput::replayed`] and
    /// [`ReplayOutput::what_ifs`].
    pub keep_history: bool,
}

/// A replay's report and the replayed run.
#[derive(Debug, Clone)]
pub struct ReplayOutput {
    /// Fidelity and the runs side by side.
    pub report: ReplayReport,
    /// The fidelity run as a snapshot (its final segments, and its trace with
    /// `keep_history`).
    pub replayed: Snapshot,
    /// With `keep_history`, each what-if run as a snapshot (its settings, final segments and
    /// trace), in the order of [`ReplaySettings::configs`]; empty otherwise.
    pub what_ifs: Vec<Snapshot>,
}

/// Replays a snapshot's trace: the fidelity run, then one what-if run per config.
///
/// `progress(done, total)` counts events over all runs.
///
/// # Errors
/// [`ReplayError::NoTrace`] for a file without a trace, [`ReplayError::Config`] for a settings
/// string that does not parse.
pub fn replay(
    snapshot: &Snapshot,
    settings: &ReplaySettings,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ReplayOutput, ReplayError> {
    let trace = engine::trace_index(snapshot).ok_or(ReplayError::NoTrace)?;
    let entries = &snapshot.device_traces[trace];
    let recorded = recorded_config(snapshot).map_err(|message| ReplayError::Config {
        config: "allocator_settings of the file".into(),
        message,
    })?;
    // Each `--config` changes the recorded settings (see [`settings`]).
    let configs = settings
        .configs
        .iter()
        .map(|c| {
            settings::compose(&recorded, c).map_err(|e| ReplayError::Config {
                config: c.clone(),
                message: e.to_string(),
            })
        })
        .collect::<Result<Vec<AllocatorConfig>, _>>()?;
    let mut config_warnings: Vec<String> = Vec::new();
    for (given, config) in settings.configs.iter().zip(&configs) {
        for w in config.warnings() {
            config_warnings.push(format!("--config {}: {w}", config_label(given)));
        }
    }
    // The recorded column runs on the recording's device (see the module docs, "Device size").
    // A file that records no device size replays its recorded column on an unlimited device:
    // the recording did not run out for lack of device memory except where it says so.
    let fidelity_opts =
        RunOptions::fidelity_with(recorded.clone(), snapshot, None, settings.keep_history);
    let device_memory = settings.device_memory.or(fidelity_opts.device_memory);
    let resized = device_memory.filter(|&m| fidelity_opts.device_memory != Some(m));
    let mut runs_opts: Vec<RunOptions> = Vec::with_capacity(configs.len() + 1);
    if let Some(m) = resized {
        runs_opts.push(RunOptions::what_if(
            fidelity_opts.config.clone(),
            resized_label(m),
            device_memory,
            false,
        ));
    }
    let what_if_start = runs_opts.len();
    for (label, config) in settings.configs.iter().zip(configs) {
        let mut label = config_label(label);
        if settings::same_settings(&config, &recorded) && label != UNCHANGED_LABEL {
            label.push_str(settings::AS_RECORDED_MARK);
        }
        runs_opts.push(RunOptions::what_if(
            config,
            label,
            device_memory,
            settings.keep_history,
        ));
    }
    let total = entries.len() * (1 + runs_opts.len());

    let base = engine::run(snapshot, &fidelity_opts, &mut |done| progress(done, total))?;
    let mut recorded_run = base.figures.clone();
    // The baseline column is the recording itself: its device mallocs and OOMs as recorded,
    // its peaks as the fidelity replay measured them.
    recorded_run.device_mallocs = entries
        .iter()
        .filter(|e| {
            matches!(
                e.action,
                TraceAction::SegmentAlloc | TraceAction::SegmentMap
            )
        })
        .count() as u64;
    recorded_run.ooms = entries
        .iter()
        .filter(|e| e.action == TraceAction::Oom)
        .count() as u64;
    // OOMs the replay itself met mean its device was smaller than the recording's.
    recorded_run.ooms += base.figures.ooms;
    recorded_run.first_oom = base
        .recorded_ooms
        .first()
        .into_iter()
        .chain(base.figures.first_oom.as_ref())
        .min_by_key(|o| o.index)
        .cloned();
    // Where the recording ran out on a device of known size: the device that would have been
    // enough, under the recorded settings, for this trace.
    // A file without the device's size starts from what the allocator could reach at its
    // first recorded OOM.
    let smallest_device = match (fidelity_opts.device_memory, base.recorded_ooms.first()) {
        (Some(m), _) if recorded_run.ooms > 0 => {
            smallest_device::smallest_device_without_oom(snapshot, &recorded, m)
        }
        (None, Some(first)) => smallest_device::smallest_reachable_without_oom(
            snapshot,
            &recorded,
            first.diagnosis.capacity,
        ),
        _ => None,
    };
    // With `--config`, `--out` writes the what-if runs, not this one.
    if !settings.configs.is_empty()
        && let Some(oom) = &mut recorded_run.first_oom
    {
        oom.written_index = None;
    }
    let mut runs = vec![recorded_run];
    let mut what_ifs = Vec::new();
    for (i, opts) in runs_opts.iter().enumerate() {
        let offset = entries.len() * (i + 1);
        let r = engine::run(snapshot, opts, &mut |done| progress(offset + done, total))?;
        runs.push(r.figures);
        if settings.keep_history && i >= what_if_start {
            what_ifs.push(r.snapshot.unwrap_or_default());
        }
    }
    Ok(ReplayOutput {
        report: ReplayReport {
            events: entries.len(),
            device_memory,
            recorded_device_memory: fidelity_opts.device_memory,
            recorded_settings: recorded_settings_text(snapshot),
            config_warnings,
            initial: base.initial,
            fidelity: base.fidelity,
            runs,
            ends_at_oom: ends_at_oom(entries),
            smallest_device,
        },
        replayed: base.snapshot.unwrap_or_default(),
        what_ifs,
    })
}

/// Whether `entries` hold an `oom` entry with no allocation after the last one.
fn ends_at_oom(entries: &[allocview_alloc::snapshot::TraceEntry]) -> bool {
    entries
        .iter()
        .rev()
        .take_while(|e| e.action != TraceAction::Alloc)
        .any(|e| e.action == TraceAction::Oom)
}
