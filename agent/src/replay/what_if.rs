//! Would other allocator settings have avoided a recorded OOM? Replays the trace at a fixed
//! device capacity under the recorded settings and under the usual cures
//! ([`CANDIDATE_CONFIGS`], each on top of the recorded settings, and only those that change
//! them), and says which of them ran without an OOM.

use serde::{Deserialize, Serialize};

use allocview_alloc::caching::AllocatorConfig;
use allocview_alloc::snapshot::Snapshot;

use crate::replay::engine::{self, ReplayError, RunOptions, recorded_config};
use crate::replay::report::OomEvent;
use crate::replay::settings::{compose, same_settings};

/// The settings tried: expandable segments (no fragmentation across segments), and
/// `max_split_size` values that keep large cached blocks whole for large requests.
pub const CANDIDATE_CONFIGS: [&str; 3] = [
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:512",
];

/// Label of the run under the recording's own settings.
pub const RECORDED_SETTINGS: &str = "recorded settings";

/// The result of one what-if run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhatIfOutcome {
    /// The settings (PyTorch's syntax), or [`RECORDED_SETTINGS`].
    pub config: String,
    /// OOMs in the run.
    pub ooms: u64,
    /// The first of them.
    pub first_oom: Option<OomEvent>,
    /// Peak reserved bytes.
    pub peak_reserved: u64,
    /// This run had no OOM while the recorded settings (at the same capacity) had one.
    pub avoided: bool,
    /// Indices of the trace entries whose allocation ran out of memory in this run.
    #[serde(default)]
    pub oom_entries: Vec<usize>,
}

impl WhatIfOutcome {
    /// Whether the allocation of trace entry `index` ran out of memory in this run.
    pub fn failed_at(&self, index: usize) -> bool {
        self.oom_entries.binary_search(&index).is_ok()
    }
}

/// Replays `snapshot` at `capacity` bytes under the recorded settings (first outcome) and each
/// of [`CANDIDATE_CONFIGS`] applied on top of them ([`compose`]), leaving out a candidate that
/// the recording already had (it would be the recorded settings again). A snapshot without a
/// trace gives an empty list.
pub fn what_if_avoided(snapshot: &Snapshot, capacity: u64) -> Vec<WhatIfOutcome> {
    let base = recorded_config(snapshot).unwrap_or_default();
    let mut runs: Vec<(String, AllocatorConfig)> =
        vec![(RECORDED_SETTINGS.to_string(), base.clone())];
    for c in CANDIDATE_CONFIGS {
        if let Ok(cfg) = compose(&base, c)
            && !same_settings(&cfg, &base)
        {
            runs.push((c.to_string(), cfg));
        }
    }
    let mut out: Vec<WhatIfOutcome> = Vec::new();
    for (label, config) in runs {
        let opts = RunOptions::what_if(config, label.clone(), Some(capacity), false);
        match engine::run(snapshot, &opts, &mut |_| {}) {
            Ok(r) => out.push(WhatIfOutcome {
                config: label,
                ooms: r.figures.ooms,
                first_oom: r.figures.first_oom,
                peak_reserved: r.figures.peak_reserved,
                avoided: false,
                oom_entries: r.oom_entries,
            }),
            Err(ReplayError::NoTrace) => return Vec::new(),
            Err(ReplayError::Config { .. }) => {}
        }
    }
    let baseline_ooms = out.first().map_or(0, |o| o.ooms);
    for o in out.iter_mut().skip(1) {
        o.avoided = baseline_ooms > 0 && o.ooms == 0;
    }
    out
}
