//! Adapter from a snapshot file to the dashboard [`State`], at any event of its trace
//! (`allocview open`).
//!
//! Everything that does not depend on the chosen event is computed once when the file is
//! opened: the time-travel checkpoints, the usage timeline (one forward pass), the histograms
//! (allocation sizes; lifetimes from each `alloc` to the `free_completed` at the same address)
//! and the OOM reports (the state at each `oom` entry).

use std::collections::HashMap;
use std::sync::Arc;

use allocview_alloc::caching::stats::{DeviceStats, StatType};
use allocview_alloc::snapshot::{DeviceMeta, DumpedOom, Snapshot, TraceAction, TraceEntry, Value};

use super::histogram::{HistogramUnit, Log2Histogram};
use super::oom::OomReport;
use super::streams;
use super::timeline::{Sample, Timeline};
use super::timetravel::{SMALL_SIZE, TimeTravel, Totals, is_segment_event};
use super::{HistogramSummary, Mode, Source, State, TraceRowsMemo};
use allocview_agent::diagnosis::{OomFacts, diagnose_under};
use allocview_agent::replay::engine::trace_index;
use allocview_agent::replay::what_if::RECORDED_SETTINGS;
use allocview_agent::replay::{
    WhatIfOutcome, recorded_config, recorded_settings_text, smallest_device_without_oom,
    smallest_reachable_without_oom, what_if_avoided,
};
use allocview_agent::state::{NS_PER_US, OomRecord};
use allocview_agent::summary::render::counted;
use allocview_alloc::stats::human_bytes;

use super::from_agent::oom_report;

/// Microseconds per second.
const US_PER_S: f64 = 1e6;
/// Size of the segment the allocator asks the device for, for a rounded request (PyTorch's
/// `get_allocation_size`).
pub use allocview_alloc::caching::config::segment_size as segment_size_for;

/// The device a snapshot is shown for: the one with the most segments, else the first with a
/// trace, else 0.
pub fn main_device(snapshot: &Snapshot) -> i32 {
    let mut counts: HashMap<i32, usize> = HashMap::new();
    for s in &snapshot.segments {
        *counts.entry(s.device).or_default() += 1;
    }
    if let Some((&d, _)) = counts.iter().max_by_key(|&(&d, &n)| (n, -d)) {
        return d;
    }
    snapshot
        .device_traces
        .iter()
        .position(|t| !t.is_empty())
        .map_or(0, |d| d as i32)
}

/// `max_split_size` from a file's `allocator_settings` (`None` = unlimited or not recorded).
pub fn max_split_size(snapshot: &Snapshot) -> Option<u64> {
    let settings = snapshot.allocator_settings.as_ref()?;
    settings.iter().find_map(|(k, v)| match (k.as_str(), v) {
        ("max_split_size", Value::Int(n)) if *n > 0 && *n < i64::MAX => Some(*n as u64),
        _ => None,
    })
}

/// A snapshot file prepared for viewing at any event.
#[derive(Debug, Clone)]
pub struct PostMortem {
    name: String,
    path: String,
    tt: TimeTravel,
    trace: Arc<[TraceEntry]>,
    timeline: Timeline,
    /// x of each event number (index = event).
    event_x: Vec<f64>,
    histograms: Vec<HistogramSummary>,
    ooms: Vec<OomReport>,
    total_memory: Option<u64>,
    trace_overflow: u64,
    max_split: Option<u64>,
    /// The agent's record of the OOM the file (an agent's OOM dump) was taken at.
    dumped_oom: Option<DumpedOom>,
    /// The filtered trace rows, shared by the states of every event.
    trace_rows_memo: TraceRowsMemo,
    /// The file was recorded with expandable segments: the diagnosis does not recommend them.
    recorded_expandable: bool,
}

impl PostMortem {
    /// Prepares `snapshot`, read from `path`.
    pub fn new(path: &str, snapshot: &Snapshot) -> PostMortem {
        let (mut pm, plan) = PostMortem::without_what_ifs(path, snapshot);
        if let Some(plan) = plan {
            pm.set_what_ifs(plan.run(snapshot));
        }
        pm
    }

    /// [`new`](Self::new) but for the what-if replays of its OOMs, which the returned plan
    /// runs (on another thread, say: see `FileSource::open`); meanwhile each OOM's what-if
    /// lines say they are being computed ([`WHAT_IFS_PENDING`]). `None` when no OOM of the
    /// trace gets what-ifs.
    pub fn without_what_ifs(path: &str, snapshot: &Snapshot) -> (PostMortem, Option<WhatIfPlan>) {
        let device = main_device(snapshot);
        let tt = TimeTravel::new(snapshot, device);
        let name = std::path::Path::new(path)
            .file_name()
            .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned());
        let meta = snapshot.devices.iter().find(|m| m.device == device);
        let total_memory = meta.and_then(|m| m.total_memory);
        let trace: Arc<[TraceEntry]> = tt.shared_trace();

        // Timeline and event positions: seconds when every entry has a time, else events.
        let timed = !trace.is_empty() && trace.iter().all(|e| e.time_us.is_some());
        let t0 = trace.first().and_then(|e| e.time_us).unwrap_or(0);
        let x_of = |i: usize, e: Option<&TraceEntry>| -> f64 {
            match e.and_then(|e| e.time_us) {
                Some(t) if timed => (t - t0) as f64 / US_PER_S,
                _ => i as f64,
            }
        };
        let mut timeline = Timeline {
            x_is_events: !timed,
            origin_us: timed.then_some(t0),
            ..Timeline::default()
        };
        let mut event_x = Vec::with_capacity(trace.len() + 1);
        event_x.push(0.0);
        let (_, start) = tt.at(0);
        timeline.push(sample(0.0, &start));
        tt.for_each_total(|i, e, totals| {
            let x = x_of(i, Some(e));
            event_x.push(x);
            timeline.push(sample(x, totals));
            if e.action == TraceAction::Oom {
                timeline.ooms.push(x);
            }
        });

        let histograms = histograms(&trace);
        let mut pm = PostMortem {
            name,
            path: path.to_string(),
            tt,
            trace,
            timeline,
            event_x,
            histograms,
            ooms: Vec::new(),
            total_memory,
            trace_overflow: meta.map_or(0, |m| m.trace_overflow),
            max_split: max_split_size(snapshot),
            dumped_oom: meta.and_then(|m| m.oom.clone()),
            trace_rows_memo: TraceRowsMemo::default(),
            recorded_expandable: recorded_config(snapshot).is_ok_and(|c| c.expandable_segments()),
        };
        pm.ooms = pm.oom_reports();
        // What-ifs replay the trace: only for OOMs in it, on the recording's device, or for a
        // file without its size on what the allocator could reach at the first OOM.
        let first_in_trace = pm.ooms.iter().find(|o| o.trace_index.is_some());
        let capacity = match (pm.total_memory, first_in_trace) {
            (Some(total), Some(_)) => Some(WhatIfCapacity::device(total)),
            (None, Some(o)) => o
                .device_free
                .map(|free| WhatIfCapacity::reachable(o.reserved.saturating_add(free))),
            (_, None) => None,
        };
        // The replays run the first device with a trace: per OOM only when it is the one
        // shown (the OOMs' indices are into its trace).
        let same_trace = trace_index(snapshot) == Some(pm.tt.device().max(0) as usize);
        let plan = capacity.map(|capacity| WhatIfPlan {
            capacity,
            ooms: pm
                .ooms
                .iter()
                .map(|o| o.trace_index.filter(|_| same_trace))
                .collect(),
            trace: pm.trace.clone(),
        });
        if plan.is_some() {
            for o in &mut pm.ooms {
                o.what_if = vec![WHAT_IFS_PENDING.to_string()];
            }
        }
        (pm, plan)
    }

    /// The OOMs of the file (every state shows them all).
    pub fn ooms(&self) -> &[OomReport] {
        &self.ooms
    }

    /// Gives the OOMs the what-if lines a [`WhatIfPlan`] computed (one list per OOM, in order).
    pub fn set_what_ifs(&mut self, lines: Vec<Vec<String>>) {
        for (o, l) in self.ooms.iter_mut().zip(lines) {
            o.what_if = l;
        }
    }

    /// Number of events (trace entries).
    pub fn len(&self) -> usize {
        self.tt.len()
    }

    /// Whether the file has no trace.
    pub fn is_empty(&self) -> bool {
        self.tt.is_empty()
    }

    /// The time-travel engine.
    pub fn time_travel(&self) -> &TimeTravel {
        &self.tt
    }

    /// The event number after `event` at which the next OOM has happened.
    pub fn next_oom(&self, event: usize) -> Option<usize> {
        self.tt
            .next_matching(event, |e| e.action == TraceAction::Oom)
    }

    /// Whether the file is an agent's OOM dump that carries the agent's record of its OOM.
    pub fn has_dumped_oom(&self) -> bool {
        self.dumped_oom.is_some()
    }

    /// The event number after `event` at which the next segment event has happened.
    pub fn next_segment_event(&self, event: usize) -> Option<usize> {
        self.tt.next_matching(event, is_segment_event)
    }

    fn oom_reports(&self) -> Vec<OomReport> {
        let mut out = Vec::new();
        for (i, e) in self.trace.iter().enumerate() {
            if e.action != TraceAction::Oom {
                continue;
            }
            let (segs, totals) = self.tt.at(i);
            let facts = OomFacts::from_trace_entry(e, &segs, self.total_memory.unwrap_or(0));
            let d = diagnose_under(&facts, self.recorded_expandable);
            out.push(OomReport {
                number: out.len() as u64 + 1,
                time_us: e.time_us,
                device: self.tt.device(),
                stream: e.stream,
                requested: e.size,
                rounded: e.size,
                segment_size: Some(segment_size_for(e.size)),
                device_total: self.total_memory,
                device_free: Some(e.addr),
                allocated: totals.allocated,
                reserved: totals.reserved,
                largest_free: facts.largest_free_block,
                diagnosis: d.kind,
                explanation: d.explanation,
                what_if: Vec::new(),
                dump_path: Some(self.path.clone()),
                dump_error: None,
                dump_pending: false,
                event_lost: false,
                frames: e.frames.clone(),
                trace_index: Some(i),
            });
        }
        // An agent's dump made without history: its OOM is in the agent's record only.
        if let (true, Some(o)) = (out.is_empty(), &self.dumped_oom) {
            let rec = OomRecord::from_dumped(self.tt.device(), self.total_memory.unwrap_or(0), o);
            let mut report = oom_report(&rec);
            report.dump_path = Some(self.path.clone());
            out.push(report);
        }
        out
    }

    /// The snapshot after `event` entries: the segments then, the trace so far and the
    /// device's facts.
    pub fn snapshot_at(&self, event: usize) -> Snapshot {
        let (segments, _) = self.tt.at(event);
        let event = event.min(self.trace.len());
        let mut traces = vec![Vec::new(); self.tt.device().max(0) as usize + 1];
        traces[self.tt.device().max(0) as usize] = self.trace[..event].to_vec();
        Snapshot {
            segments,
            device_traces: traces,
            // The device's facts travel with it (its size gives the summary its "% reserved").
            devices: vec![DeviceMeta {
                device: self.tt.device(),
                total_memory: self.total_memory,
                trace_overflow: self.trace_overflow,
                oom: None,
            }],
            ..Snapshot::default()
        }
    }

    /// The dashboard state after `event` entries (clamped to the trace).
    pub fn state_at(&self, event: usize) -> State {
        let event = event.min(self.len());
        let moment = self.tt.moment(event);
        let totals = moment.totals;
        let device = self.tt.device();
        let streams = streams::from_segments_with_peaks(&moment.segments, &moment.stream_peaks);
        let snap = Snapshot {
            segments: moment.segments,
            ..Snapshot::default()
        };
        let mut stats = DeviceStats::from_snapshot(&snap, device, self.max_split);
        patch_counters(&mut stats, &totals);
        let mut timeline = self.timeline.clone();
        timeline.cursor = self.event_x.get(event).copied();
        State {
            mode: Mode::File {
                name: self.name.clone(),
                event,
                total: self.len(),
            },
            source: Source {
                program: Some(self.name.clone()),
                device,
                total_memory: self.total_memory,
                trace_overflow: self.trace_overflow,
                ..Source::default()
            },
            stats,
            segments: snap.segments,
            streams,
            timeline,
            histograms: self.histograms.clone(),
            trace: self.trace.clone(),
            trace_cursor: Some(event),
            ooms: self.ooms.clone(),
            ooms_total: 0,
            host: None,
            trace_rows_memo: self.trace_rows_memo.clone(),
            status: (totals.mismatches > 0).then(|| {
                format!(
                    "{} trace entries did not fit the reconstructed state (truncated trace?)",
                    totals.mismatches
                )
            }),
        }
    }
}

/// An OOM's what-if line while its file's replays run.
pub const WHAT_IFS_PENDING: &str = "replaying the trace under other settings…";

/// The what-if replays of a file's OOMs, to run once over the file's snapshot
/// ([`PostMortem::without_what_ifs`]).
#[derive(Debug, Clone)]
pub struct WhatIfPlan {
    capacity: WhatIfCapacity,
    /// Per OOM, the index of its entry in the replayed trace (`None`: not in it).
    ooms: Vec<Option<usize>>,
    trace: Arc<[TraceEntry]>,
}

impl WhatIfPlan {
    /// How many OOMs the plan replays (as many what-if line lists as [`run`](Self::run) gives).
    pub fn ooms(&self) -> usize {
        self.ooms.len()
    }

    /// Replays `snapshot` (the file the plan was made from) under the usual cures and bisects
    /// for the smallest device: the what-if lines of each OOM, in order.
    pub fn run(&self, snapshot: &Snapshot) -> Vec<Vec<String>> {
        let done = WhatIfsDone::of(snapshot, self.capacity);
        self.ooms
            .iter()
            .map(|&oom| done.lines(&self.trace, oom))
            .collect()
    }
}

/// The what-if replays of a file done once, for the lines of any of its OOMs.
struct WhatIfsDone {
    capacity: WhatIfCapacity,
    outcomes: Vec<WhatIfOutcome>,
    smallest: Option<String>,
    note: String,
}

impl WhatIfsDone {
    /// Replays `snapshot` under the usual cures and bisects for the smallest device.
    fn of(snapshot: &Snapshot, capacity: WhatIfCapacity) -> WhatIfsDone {
        WhatIfsDone {
            capacity,
            outcomes: what_if_avoided(snapshot, capacity.bytes),
            smallest: smallest_device_line(snapshot, capacity),
            note: settings_note(snapshot),
        }
    }

    /// The lines of the OOM at trace entry `oom` (of `trace`), or of the trace without one.
    fn lines(&self, trace: &[TraceEntry], oom: Option<usize>) -> Vec<String> {
        let mut lines = what_if_lines_of(&self.outcomes, self.capacity, trace, oom);
        lines.extend(self.smallest.clone());
        lines.push(self.note.clone());
        lines
    }
}

/// The memory what-if replays run on: the recording's device, or, for a file that does not
/// record the device's size, what the allocator could reach at the first OOM (its reserved
/// bytes plus the device's free bytes then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WhatIfCapacity {
    /// Bytes.
    pub bytes: u64,
    /// Whether [`bytes`](Self::bytes) is the device's size, rather than reachable memory.
    pub device: bool,
}

impl WhatIfCapacity {
    /// The recording's device of `bytes`.
    pub fn device(bytes: u64) -> WhatIfCapacity {
        WhatIfCapacity {
            bytes,
            device: true,
        }
    }

    /// `bytes` the allocator could reach, on a device of unknown size.
    pub fn reachable(bytes: u64) -> WhatIfCapacity {
        WhatIfCapacity {
            bytes,
            device: false,
        }
    }

    /// `6.00 GiB`, or `6.00 GiB reachable`.
    fn text(self) -> String {
        let bytes = crate::units::bytes(self.bytes);
        if self.device {
            bytes
        } else {
            format!("{bytes} reachable")
        }
    }
}

/// What-if lines for an OOM of a file: the whole trace replayed on the simulated device at
/// `capacity` under the usual cures ([`what_if_avoided`]), then the smallest device without an
/// OOM ([`smallest_device_line`]). With `oom`, the index of the OOM's trace entry, each line
/// says what became of that request; without it, of the trace.
pub fn what_if_lines(
    snapshot: &Snapshot,
    capacity: WhatIfCapacity,
    oom: Option<usize>,
) -> Vec<String> {
    let trace = trace_index(snapshot)
        .and_then(|d| snapshot.device_traces.get(d))
        .map_or(&[][..], |t| &t[..]);
    WhatIfsDone::of(snapshot, capacity).lines(trace, oom)
}

/// The what-if line of the smallest device (or, on a device of unknown size, the smallest
/// reachable memory) on which the trace replays without an OOM under the recorded settings,
/// bisected from `capacity` (`allocview_agent::replay::smallest_device`); none when the trace
/// fits `capacity` or no size near it does.
pub fn smallest_device_line(snapshot: &Snapshot, capacity: WhatIfCapacity) -> Option<String> {
    let config = recorded_config(snapshot).ok()?;
    let (label, s) = if capacity.device {
        (
            "smallest device",
            smallest_device_without_oom(snapshot, &config, capacity.bytes)?,
        )
    } else {
        (
            "smallest reachable memory",
            smallest_reachable_without_oom(snapshot, &config, capacity.bytes)?,
        )
    };
    Some(format!(
        "{label:<WHAT_IF_LABEL_WIDTH$} → no OOM in the trace from ~{} ({} more; {} replays, to \
         within {})",
        human_bytes(s.bytes),
        human_bytes(s.shortfall),
        s.runs,
        human_bytes(s.granularity)
    ))
}

/// The last what-if line: the settings the file was recorded with, which each what-if changes
/// (only settings that differ from them are tried).
pub fn settings_note(snapshot: &Snapshot) -> String {
    format!(
        "(recorded settings: {}; each what-if changes only the key it names)",
        recorded_settings_text(snapshot)
    )
}

/// Width of a what-if line's settings, so that the arrows line up.
const WHAT_IF_LABEL_WIDTH: usize = 26;

/// [`what_if_lines`] of replays already run (the recorded settings' first) at `capacity`
/// bytes, over `trace` (the replayed one).
pub fn what_if_lines_of(
    outcomes: &[WhatIfOutcome],
    capacity: WhatIfCapacity,
    trace: &[TraceEntry],
    oom: Option<usize>,
) -> Vec<String> {
    let mut lines = Vec::new();
    if let (Some(k), Some(recorded)) = (oom, outcomes.first())
        && !recorded.failed_at(k)
    {
        lines.push(format!(
            "{RECORDED_SETTINGS:<WHAT_IF_LABEL_WIDTH$} → the replay fits this request (it does not reproduce the OOM)"
        ));
    }
    let mut some_fit = false;
    for o in outcomes.iter().skip(1) {
        let verdict = match oom {
            Some(k) if o.failed_at(k) => "still OOM here".to_string(),
            Some(_) if o.ooms == 0 => "fits; no OOM in the trace".to_string(),
            Some(_) => {
                let first = o.oom_entries.first().map_or(0, |i| i + 1);
                format!(
                    "fits; {}, first at entry {first}",
                    counted(o.ooms, "other OOM", "other OOMs")
                )
            }
            None if o.ooms == 0 => "no OOM".to_string(),
            None => format!("still {}", counted(o.ooms, "OOM", "OOMs")),
        };
        some_fit |= oom.is_some_and(|k| !o.failed_at(k));
        lines.push(format!(
            "{:<WHAT_IF_LABEL_WIDTH$} → {verdict}, peak reserved {} of {}",
            o.config,
            crate::units::bytes(o.peak_reserved),
            capacity.text()
        ));
    }
    // A request that fits says nothing of the program's next ones when the trace stops here
    // (an OOM's dump is taken at the OOM).
    if let Some(k) = oom
        && some_fit
        && !trace
            .iter()
            .skip(k + 1)
            .any(|e| e.action == TraceAction::Alloc)
    {
        lines.push(format!(
            "(the trace ends at this request: whether the program's next allocations fit the \
             {} left is not known)",
            crate::units::bytes(
                capacity.bytes.saturating_sub(
                    outcomes
                        .iter()
                        .skip(1)
                        .filter(|o| !o.failed_at(k))
                        .map(|o| o.peak_reserved)
                        .min()
                        .unwrap_or(0)
                )
            )
        ));
    }
    lines
}

/// The index of the OOM entry in the trace a replay of `snapshot` runs (see
/// `engine::trace_index`) that an agent's OOM record of `requested` bytes at `time_us` is: of
/// the OOM entries of that size, the one nearest in time (the last, where entries have no
/// time). A dump can hold entries after its OOM.
pub fn oom_entry_of(snapshot: &Snapshot, requested: u64, time_us: Option<i64>) -> Option<usize> {
    let trace = snapshot.device_traces.get(trace_index(snapshot)?)?;
    let mut candidates = trace
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == TraceAction::Oom && e.size == requested);
    match time_us {
        Some(t) => candidates
            // Of entries as near, the last.
            .min_by_key(|&(i, e)| {
                (
                    e.time_us.map_or(u64::MAX, |u| u.abs_diff(t)),
                    std::cmp::Reverse(i),
                )
            })
            .map(|(i, _)| i),
        None => candidates.next_back().map(|(i, _)| i),
    }
}

fn sample(x: f64, t: &Totals) -> Sample {
    Sample {
        x,
        reserved: t.reserved,
        allocated: t.allocated,
        active: t.active,
    }
}

/// Puts the trace's counters and peaks into stats recomputed from segments.
fn patch_counters(stats: &mut DeviceStats, t: &Totals) {
    let all = StatType::All as usize;
    stats.allocated_bytes.0[all].peak = t.peak_allocated as i64;
    stats.reserved_bytes.0[all].peak = t.peak_reserved as i64;
    stats.active_bytes.0[all].peak = t.peak_active as i64;
    stats.allocation.0[all].allocated = t.allocs as i64;
    stats.num_device_alloc = t.segment_allocs as i64;
    stats.num_device_free = t.segment_frees as i64;
    stats.num_ooms = t.ooms as i64;
}

/// Size and lifetime histograms of a trace: for every allocation, per pool (small / large by
/// size, as the allocator splits them) and per stream.
fn histograms(trace: &[TraceEntry]) -> Vec<HistogramSummary> {
    /// One group's two histograms.
    struct Pair {
        size: Log2Histogram,
        lifetime: Log2Histogram,
    }
    let pair = || Pair {
        size: Log2Histogram::new(),
        lifetime: Log2Histogram::new(),
    };
    let (mut all, mut small, mut large) = (pair(), pair(), pair());
    let mut streams: std::collections::BTreeMap<u64, Pair> = std::collections::BTreeMap::new();
    // Address -> (time allocated, small pool?, stream).
    let mut born: HashMap<u64, (i64, bool, u64)> = HashMap::new();
    for e in trace {
        match e.action {
            TraceAction::Alloc => {
                let is_small = e.size <= SMALL_SIZE;
                for p in [
                    &mut all,
                    if is_small { &mut small } else { &mut large },
                    streams.entry(e.stream).or_insert_with(pair),
                ] {
                    p.size.record(e.size);
                }
                if let Some(t) = e.time_us {
                    born.insert(e.addr, (t, is_small, e.stream));
                }
            }
            TraceAction::FreeCompleted => {
                if let (Some(t), Some((t0, is_small, stream))) = (e.time_us, born.remove(&e.addr)) {
                    let ns = (t - t0).max(0) as u64 * NS_PER_US;
                    all.lifetime.record(ns);
                    if is_small { &mut small } else { &mut large }
                        .lifetime
                        .record(ns);
                    streams
                        .entry(stream)
                        .or_insert_with(pair)
                        .lifetime
                        .record(ns);
                }
            }
            _ => {}
        }
    }
    let mut groups = vec![
        ("all".to_string(), all),
        ("small pool".to_string(), small),
        ("large pool".to_string(), large),
    ];
    groups.extend(streams.into_iter().map(|(s, p)| (format!("stream {s}"), p)));
    let mut out = Vec::new();
    for (name, p) in groups {
        out.push(p.size.summary("size", &name, HistogramUnit::Bytes));
        out.push(p.lifetime.summary("lifetime", &name, HistogramUnit::Nanos));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    #[test]
    fn file_histograms_come_per_pool_and_per_stream() {
        let entry = |action, addr, size, stream, t| TraceEntry {
            time_us: Some(t),
            ..TraceEntry::new(action, addr, size, stream)
        };
        let trace = [
            entry(TraceAction::Alloc, 0x10, 512, 0, 0),
            entry(TraceAction::Alloc, 0x20, 4 * MIB, 7, 1),
            entry(TraceAction::Alloc, 0x30, 8 * MIB, 7, 2),
            entry(TraceAction::FreeCompleted, 0x20, 4 * MIB, 7, 10),
        ];
        let h = histograms(&trace);
        let find = |metric: &str, group: &str| {
            h.iter()
                .find(|s| s.metric == metric && s.group == group)
                .unwrap_or_else(|| panic!("no {metric} / {group}"))
        };
        assert_eq!(find("size", "all").count, 3);
        assert_eq!(find("size", "small pool").count, 1);
        assert_eq!(find("size", "large pool").max, 8 * MIB);
        assert_eq!(find("size", "stream 0").count, 1);
        assert_eq!(find("size", "stream 7").p50, 4 * MIB);
        assert_eq!(find("lifetime", "stream 7").max, 9 * NS_PER_US);
        assert_eq!(find("lifetime", "large pool").count, 1);
        assert_eq!(find("lifetime", "stream 0").count, 0);
    }

    #[test]
    fn file_trace_times_and_the_chart_count_from_the_first_event() {
        use crate::view::testing::view_text;
        let entry = |action, addr, t| TraceEntry {
            time_us: Some(t),
            ..TraceEntry::new(action, addr, 4 * MIB, 0)
        };
        let snap = Snapshot {
            device_traces: vec![vec![
                entry(TraceAction::SegmentAlloc, 0x7f00_0000_0000, 5_000_000),
                entry(TraceAction::Alloc, 0x7f00_0000_0000, 7_500_000),
            ]],
            ..Snapshot::default()
        };
        let s = PostMortem::new("trace.pickle", &snap).state_at(2);
        assert_eq!(s.timeline.origin_us, Some(5_000_000));
        assert_eq!(s.timeline.samples.last().map(|s| s.x), Some(2.5));
        let text = view_text(crate::state::View::Trace, &s, 100, 8);
        assert!(
            text.contains("0.000 s") && text.contains("2.500 s"),
            "{text}"
        );
    }

    #[test]
    fn segment_sizes_follow_pytorch() {
        assert_eq!(segment_size_for(512), 2 * MIB);
        assert_eq!(segment_size_for(MIB + 512), 20 * MIB);
        assert_eq!(segment_size_for(10 * MIB + 1), 12 * MIB);
    }
}
