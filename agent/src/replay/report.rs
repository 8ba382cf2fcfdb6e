//! What a replay reports: fidelity to the recording, and the figures of each run side by side.

use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

use allocview_alloc::stats::human_bytes;

use crate::diagnosis::Diagnosis;
use crate::summary::render::counted;
use crate::text::{REPORT_WIDTH, paragraph};

/// How closely a replay at the recorded addresses followed the recording.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fidelity {
    /// `alloc` entries replayed.
    pub allocs: u64,
    /// Of those, placed at the recorded address.
    pub allocs_at_recorded_address: u64,
    /// `segment_alloc` entries in the trace (and segments the replay allocated where the
    /// recording did not).
    pub segment_allocs: u64,
    /// Segment allocations the replay made at the recorded size, where the recording made one.
    pub segment_allocs_of_recorded_size: u64,
    /// The first place the replay left the recording, if it did.
    pub first_divergence: Option<Divergence>,
    /// Whether the replay's final segments and blocks equal the snapshot's (`None` when the
    /// file has no segments to compare with, as an RMM log).
    pub final_state_matches: Option<bool>,
}

impl Fidelity {
    /// Share of allocations at the recorded address, in percent (100 when there are none).
    pub fn alloc_percent(&self) -> f64 {
        percent(self.allocs_at_recorded_address, self.allocs)
    }

    /// Share of segment allocations of the recorded size, in percent (100 when none).
    pub fn segment_percent(&self) -> f64 {
        percent(self.segment_allocs_of_recorded_size, self.segment_allocs)
    }

    /// Whether every allocation and segment allocation matched.
    pub fn is_exact(&self) -> bool {
        self.allocs == self.allocs_at_recorded_address
            && self.segment_allocs == self.segment_allocs_of_recorded_size
    }

    /// Whether the replay reproduced the recording: every allocation and segment allocation
    /// matched, and the final state too where the file has one to compare with.
    pub fn reproduced(&self) -> bool {
        self.is_exact() && self.final_state_matches != Some(false)
    }
}

/// `part/whole NOUN WHAT (P%)`, or `no NOUN in the trace` when `whole` is 0.
fn share(part: u64, whole: u64, noun: &str, what: &str) -> String {
    if whole == 0 {
        format!("no {noun} in the trace")
    } else {
        format!(
            "{part}/{whole} {noun} {what} ({:.1}%)",
            percent(part, whole)
        )
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        100.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// The first point where a replay differs from its recording.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Divergence {
    /// Index of the entry in the input file's trace, from 0 (the text shows it from 1 as
    /// "trace entry N", as the dashboard and `summary` number entries).
    pub index: usize,
    /// Its action (`alloc`, `segment_alloc`, ...).
    pub action: String,
    /// What the recording shows.
    pub expected: String,
    /// What the replay did.
    pub got: String,
    /// Why, as far as the replay can tell.
    pub why: String,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "trace entry {} ({}): expected {}, got {} ({})",
            // Trace entries count from 1 in text, as the dashboard numbers them.
            self.index + 1,
            self.action,
            self.expected,
            self.got,
            self.why
        )
    }
}

/// One OOM a run met.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomEvent {
    /// Index of the entry in the input file's trace whose allocation failed, from 0 (the text
    /// shows it from 1 as "trace entry N", as the dashboard and `summary` number entries).
    pub index: usize,
    /// Bytes asked for (unrounded; the diagnosis's `requested` is the allocator's rounded
    /// size).
    pub requested: u64,
    /// Index of this OOM's `oom` entry in the run's own trace, from 0, when the run kept it
    /// (`replay --out`): the replayed trace numbers its entries differently (the allocator's
    /// own segment entries, no `snapshot` entries), so the file `--out` writes lists this OOM
    /// at this index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_index: Option<usize>,
    /// Why.
    pub diagnosis: Diagnosis,
}

/// What a run began from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStart {
    /// The recorded state at the first trace entry: segments, cached free blocks and live
    /// blocks at their recorded addresses (the recording's own column, and every run whose
    /// settings can hold those segments).
    #[default]
    RecordedState,
    /// The live blocks alone, allocated afresh under the run's settings: the recorded segments
    /// cannot exist under them (expandable segments against ordinary ones). The run's peaks
    /// leave out the recorded cache, so they do not compare directly with the recorded
    /// column's.
    LiveBlocksOnly,
}

/// Marks the figures of a [`RunStart::LiveBlocksOnly`] column in the table.
pub const LIVE_BLOCKS_ONLY_MARK: &str = "*";

/// The figures of one run (the recording, or a replay under some settings).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFigures {
    /// Column heading: `recorded`, or the settings string.
    pub label: String,
    /// Allocator settings in PyTorch's syntax (empty for defaults).
    pub config: String,
    /// Highest reserved bytes.
    pub peak_reserved: u64,
    /// Highest allocated bytes.
    pub peak_allocated: u64,
    /// Highest `reserved - allocated`.
    pub peak_fragmentation: u64,
    /// What the run began from.
    pub start: RunStart,
    /// Device allocations (segments, or page maps of expandable segments) during the trace.
    pub device_mallocs: u64,
    /// Allocations that failed.
    pub ooms: u64,
    /// The first of them.
    pub first_oom: Option<OomEvent>,
}

/// The state a replay began from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitialSummary {
    /// Segments that existed when the trace began.
    pub segments: usize,
    /// Blocks live when the trace began.
    pub live_blocks: usize,
    /// Bytes reserved then.
    pub reserved: u64,
    /// Bytes allocated then.
    pub allocated: u64,
    /// Bytes active then: allocated, and blocks whose free was requested but not completed
    /// (0 in reports written before it was recorded).
    #[serde(default)]
    pub active: u64,
    /// What did not fit the reconstruction.
    pub warnings: Vec<String>,
}

/// One row of the runs table: its name and how to show a run's figure.
type Row = (&'static str, fn(&RunFigures) -> String);

/// Everything `allocview replay` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// Trace entries replayed.
    pub events: usize,
    /// Simulated device capacity of the what-if runs in bytes (`None`: unlimited).
    pub device_memory: Option<u64>,
    /// Device capacity of the recorded column's run: the recording's device (`None`:
    /// unlimited). Differs from [`device_memory`](Self::device_memory) when `--device-memory`
    /// asked for another size than the file records.
    #[serde(default)]
    pub recorded_device_memory: Option<u64>,
    /// The allocator settings the file records, in one line (PyTorch's syntax, `PyTorch
    /// defaults`, or `not recorded`): the recorded column's, and what each `--config` changes.
    #[serde(default)]
    pub recorded_settings: String,
    /// Warnings from parsing the `--config` strings (PyTorch quirks the replay follows).
    #[serde(default)]
    pub config_warnings: Vec<String>,
    /// The state the replay began from.
    pub initial: InitialSummary,
    /// Fidelity of the replay at the recorded settings and addresses.
    pub fidelity: Fidelity,
    /// The runs: the recording first (the baseline), then one per `--config`.
    pub runs: Vec<RunFigures>,
    /// The trace ends at an OOM: no allocation follows its last `oom` entry (a dump taken at
    /// the OOM), so a run that fits that request says nothing of the program's next ones.
    #[serde(default)]
    pub ends_at_oom: bool,
    /// Where the recording ran out of memory: the smallest device on which the trace replays
    /// without an OOM under the recorded settings
    /// ([`smallest_device_without_oom`](crate::replay::smallest_device_without_oom)), or for
    /// a file without the device's size the smallest reachable memory
    /// ([`smallest_reachable_without_oom`](crate::replay::smallest_reachable_without_oom)).
    #[serde(default)]
    pub smallest_device: Option<crate::replay::SmallestDevice>,
}

impl ReplayReport {
    /// The report as text: fidelity, then the runs as a table, one column per run.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let fid = &self.fidelity;
        let size = |m: Option<u64>| m.map_or("unlimited memory".to_string(), human_bytes);
        // Both columns on one device, or the recorded column on the recording's own.
        let on = if self.recorded_device_memory == self.device_memory {
            " on".to_string()
        } else {
            let recorded = match self.recorded_device_memory {
                Some(m) => format!("on the recording's device of {}", human_bytes(m)),
                None => "on an unlimited device (the file records no device size)".to_string(),
            };
            format!(": the recorded column {recorded}, the other columns on")
        };
        say(
            &mut out,
            &format!(
                "replayed {}{on} a simulated device of {}",
                counted(self.events as u64, "trace entry", "trace entries"),
                size(self.device_memory)
            ),
        );
        if !self.recorded_settings.is_empty() {
            say(
                &mut out,
                &format!("recorded settings: {}", self.recorded_settings),
            );
        }
        if self
            .runs
            .iter()
            .skip(1)
            .any(|r| !r.label.starts_with("recorded settings, "))
        {
            say(
                &mut out,
                "each --config column: the recorded settings with the keys given changed \
                 (`defaults` first: PyTorch's defaults with them)",
            );
        }
        for w in &self.config_warnings {
            say(&mut out, &format!("  warning: {w}"));
        }
        if let Some(run) = self
            .runs
            .iter()
            .find(|r| r.config.contains("garbage_collection_threshold"))
        {
            say(
                &mut out,
                &format!(
                    "note: garbage_collection_threshold has no effect in this replay ({}): PyTorch \
                 collects garbage only under set_per_process_memory_fraction, which the replay \
                 does not set",
                    run.label
                ),
            );
        }
        say(
            &mut out,
            &format!(
                "initial state: {} segments ({} reserved), {} live blocks ({} allocated)",
                self.initial.segments,
                human_bytes(self.initial.reserved),
                self.initial.live_blocks,
                human_bytes(self.initial.allocated)
            ),
        );
        for w in &self.initial.warnings {
            say(&mut out, &format!("  warning: {w}"));
        }
        // One line, whatever its width: scripts and people grep for it.
        let _ = writeln!(
            out,
            "fidelity: {}, {}",
            share(
                fid.allocs_at_recorded_address,
                fid.allocs,
                "allocations",
                "at the recorded address"
            ),
            share(
                fid.segment_allocs_of_recorded_size,
                fid.segment_allocs,
                "segment allocations",
                "of the recorded size"
            )
        );
        match &fid.first_divergence {
            Some(d) => {
                say(&mut out, &format!("first divergence: {d}"));
            }
            None => {
                say(&mut out, "no divergence");
            }
        }
        if let Some(m) = fid.final_state_matches {
            say(
                &mut out,
                &format!(
                    "final segments {} the snapshot's",
                    if m { "match" } else { "differ from" }
                ),
            );
        }
        out.push('\n');
        out.push_str(&self.table());
        say(
            &mut out,
            "peak unallocated: the most reserved bytes not allocated at one moment (the cache, \
             reusable or stranded in split segments)",
        );
        for run in self
            .runs
            .iter()
            .filter(|r| r.start == RunStart::LiveBlocksOnly)
        {
            say(
                &mut out,
                &format!(
                    "{LIVE_BLOCKS_ONLY_MARK} {}: the recorded segments cannot exist under these \
                 settings, so the run began from the {} live blocks alone ({} allocated), \
                 without the recorded cache ({} free); its peaks do not compare directly with \
                 the recorded column's",
                    run.label,
                    self.initial.live_blocks,
                    human_bytes(self.initial.allocated),
                    human_bytes(
                        self.initial
                            .reserved
                            .saturating_sub(self.initial.active.max(self.initial.allocated))
                    )
                ),
            );
        }
        if self.ends_at_oom && self.runs.iter().skip(1).any(|r| r.ooms == 0) {
            say(
                &mut out,
                "the trace ends at its OOM: a run without an OOM fitted that request, but the \
                 allocations the program would have made next are not in the trace, so it may \
                 still run out of memory after it",
            );
        }
        if let Some(s) = &self.smallest_device {
            say(&mut out, &smallest_device_line(s));
        }
        for run in &self.runs {
            if let Some(oom) = &run.first_oom {
                let rounded = if oom.diagnosis.requested != oom.requested {
                    format!(", rounded to {}", human_bytes(oom.diagnosis.requested))
                } else {
                    String::new()
                };
                let written = match oom.written_index {
                    Some(w) if w != oom.index => {
                        format!(" (entry {} of the replayed trace --out writes)", w + 1)
                    }
                    _ => String::new(),
                };
                say(
                    &mut out,
                    &format!(
                        "{}: first OOM at trace entry {}{written} ({} requested{rounded}): {}",
                        run.label,
                        oom.index + 1,
                        human_bytes(oom.requested),
                        oom.diagnosis.explanation
                    ),
                );
            }
        }
        out
    }

    /// The runs as an aligned table, one column per run.
    pub fn table(&self) -> String {
        let rows: [Row; 5] = [
            ("peak reserved", |r| marked(r, human_bytes(r.peak_reserved))),
            ("peak allocated", |r| human_bytes(r.peak_allocated)),
            ("peak unallocated", |r| {
                marked(r, human_bytes(r.peak_fragmentation))
            }),
            ("device mallocs", |r| r.device_mallocs.to_string()),
            ("OOMs", |r| r.ooms.to_string()),
        ];
        let mut cells: Vec<Vec<String>> = vec![
            std::iter::once(String::new())
                .chain(self.runs.iter().map(|r| r.label.clone()))
                .collect(),
        ];
        for (name, f) in rows {
            cells.push(
                std::iter::once(name.to_string())
                    .chain(self.runs.iter().map(f))
                    .collect(),
            );
        }
        let cols = self.runs.len() + 1;
        let widths: Vec<usize> = (0..cols)
            .map(|c| {
                cells
                    .iter()
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &cells {
            for (c, cell) in row.iter().enumerate() {
                if c == 0 {
                    let _ = write!(out, "{cell:<w$}", w = widths[c]);
                } else {
                    let _ = write!(out, "  {cell:>w$}", w = widths[c]);
                }
            }
            out.push('\n');
        }
        out
    }
}

/// Continuation indent of a wrapped sentence in the text report.
const INDENT: &str = "    ";

/// Appends `text` to `out` as one sentence wrapped to [`REPORT_WIDTH`] columns.
fn say(out: &mut String, text: &str) {
    out.push_str(&paragraph(text, REPORT_WIDTH, INDENT));
}

/// The text of [`ReplayReport::smallest_device`] (also in `allocview summary`).
pub fn smallest_device_line(s: &crate::replay::SmallestDevice) -> String {
    let (what, from) = if s.from_recorded_device {
        ("device", "the recording's")
    } else {
        (
            "memory the allocator can reach",
            "the file does not record the device's size; at the first OOM the allocator could \
             reach",
        )
    };
    let mut line = format!(
        "smallest {what} without an OOM under the recorded settings: ~{} ({from} {} plus a \
         shortfall of {}; {} replays of this trace window, to within {})",
        human_bytes(s.bytes),
        human_bytes(s.from),
        human_bytes(s.shortfall),
        s.runs,
        human_bytes(s.granularity)
    );
    if !s.from_recorded_device {
        line.push_str(
            "; the device needs that plus what its other users held (CUDA's context, other \
             processes)",
        );
    }
    line
}

/// A peak as shown: with [`LIVE_BLOCKS_ONLY_MARK`] when the run left out the recorded cache.
fn marked(run: &RunFigures, figure: String) -> String {
    match run.start {
        RunStart::RecordedState => figure,
        RunStart::LiveBlocksOnly => format!("{figure}{LIVE_BLOCKS_ONLY_MARK}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(label: &str, reserved: u64, ooms: u64) -> RunFigures {
        RunFigures {
            label: label.into(),
            config: String::new(),
            peak_reserved: reserved,
            peak_allocated: reserved / 2,
            peak_fragmentation: reserved / 2,
            start: RunStart::RecordedState,
            device_mallocs: 3,
            ooms,
            first_oom: None,
        }
    }

    #[test]
    fn the_table_has_one_column_per_run_with_the_recording_first() {
        let report = ReplayReport {
            events: 10,
            device_memory: Some(1 << 30),
            recorded_device_memory: Some(1 << 30),
            recorded_settings: String::new(),
            config_warnings: Vec::new(),
            initial: InitialSummary::default(),
            fidelity: Fidelity {
                allocs: 4,
                allocs_at_recorded_address: 3,
                segment_allocs: 0,
                ..Fidelity::default()
            },
            runs: vec![
                run("recorded", 4 << 20, 0),
                run("expandable_segments:True", 2 << 20, 1),
            ],
            ends_at_oom: true,
            smallest_device: None,
        };
        let table = report.table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 6);
        assert!(lines[0].trim_start().starts_with("recorded"));
        assert!(lines[0].ends_with("expandable_segments:True"));
        assert!(lines[1].starts_with("peak reserved"));
        assert!(lines[1].contains("4.00 MiB") && lines[1].ends_with("2.00 MiB"));
        assert!(lines[5].ends_with('1'));
        let text = report.to_text();
        assert!(text.contains("3/4 allocations at the recorded address (75.0%)"));
        assert!(text.starts_with("replayed 10 trace entries on a simulated device of 1.00 GiB\n"));
        assert!(text.contains(
            "fidelity: 3/4 allocations at the recorded address (75.0%), \
             no segment allocations in the trace\n"
        ));
        assert!(!report.fidelity.is_exact());
        // Every run has an OOM: nothing to warn of at the trace's end.
        assert!(!text.contains("the trace ends at its OOM"), "{text}");
        let mut cured = report.clone();
        cured.runs[1].ooms = 0;
        assert!(
            cured.to_text().contains(
                "the trace ends at its OOM: a run without an OOM fitted that request, but"
            ),
            "{}",
            cured.to_text()
        );
        cured.ends_at_oom = false;
        assert!(!cured.to_text().contains("the trace ends at its OOM"));
    }
}
