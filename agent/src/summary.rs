//! What a snapshot says, in figures: per device, PyTorch's `memory_summary()` table recomputed
//! from the segments and blocks ([`DeviceStats::from_snapshot`] formatted by
//! [`format_memory_summary_with`], its peaks and totals from replaying the trace), and
//! allocview's additions: fragmentation per pool and per stream
//! ([`Fragmentation`]), the OOM entries of the trace with their facts, the trace length and
//! whether its ring overflowed, and how many entries of each action the trace holds.
//!
//! Used by `allocview summary` (its text is [`Summary`]'s `Display`, its `--json` is
//! [`Summary`]'s `Serialize`), the dashboard, and replay.

pub mod fragmentation;
pub mod render;

use std::collections::BTreeMap;

use allocview_alloc::caching::stats::{DeviceStats, Stat};
use allocview_alloc::caching::summary::{HistoryColumns, format_memory_summary_with};
use allocview_alloc::snapshot::{SegmentType, Snapshot, TraceAction, Value};
use serde::Serialize;

use allocview_alloc::stats::human_bytes;

use crate::diagnosis::{Diagnosis, OomFacts, diagnose_under};
use crate::replay::{self, OomEvent, RunOptions};

pub use fragmentation::Fragmentation;

/// The `allocator_settings` key holding `max_split_size` in bytes (negative = unlimited).
const MAX_SPLIT_SIZE_KEY: &str = "max_split_size";

/// A snapshot in figures. Totals are over every device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Bytes reserved from the devices (sum of segment sizes).
    pub total_reserved: u64,
    /// Bytes in allocated blocks.
    pub total_allocated: u64,
    /// Bytes in active blocks (allocated or pending free).
    pub total_active: u64,
    /// Requested bytes of active blocks.
    pub total_requested: u64,
    /// Number of segments.
    pub segments: u64,
    /// Number of blocks.
    pub blocks: u64,
    /// The largest free block of any device.
    pub largest_free_block: u64,
    /// Trace entries of every device.
    pub trace_entries: u64,
    /// OOM entries of every device's trace.
    pub ooms: u64,
    /// The allocator settings the file records, in one line (PyTorch's syntax, `PyTorch
    /// defaults`, or `not recorded` for a file without `allocator_settings`).
    pub recorded_settings: String,
    /// Per device, by index.
    pub devices: Vec<DeviceSummary>,
}

/// One device's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceSummary {
    /// Device index.
    pub device: i32,
    /// Total device memory, when the file says (allocview's files do).
    pub total_memory: Option<u64>,
    /// Everything on this device.
    pub totals: Fragmentation,
    /// PyTorch's `memory_summary()` text: current figures from the snapshot's segments; the
    /// Peak Usage, Tot Alloc and Tot Freed columns from replaying the trace, or "not known"
    /// (see [`window`](Self::window)).
    pub memory_summary: String,
    /// What the peaks and totals of [`memory_summary`](Self::memory_summary) cover.
    pub window: StatsWindow,
    /// The figures of `torch.cuda.memory_stats()` the file states: every stat's `current`;
    /// when [`window`](Self::window) is a trace, also its `peak`, `allocated` and `freed` over
    /// that window (not `requested_bytes`', which traces do not record) and `num_ooms`. What
    /// is not known is left out rather than written as 0.
    pub memory_stats: BTreeMap<String, i64>,
    /// Fragmentation per pool.
    pub pools: Pools,
    /// Fragmentation per stream, by stream.
    pub streams: Vec<StreamFragmentation>,
    /// Entries in this device's trace.
    pub trace_entries: u64,
    /// Entries lost because the trace ring was full (allocview's files record it).
    pub trace_overflow: u64,
    /// Whether the ring overflowed (the trace is missing its oldest entries).
    pub ring_overflowed: bool,
    /// Trace entries per action (every action, in PyTorch's order).
    pub actions: BTreeMap<String, u64>,
    /// The OOM entries of the trace.
    pub ooms: Vec<OomFact>,
    /// For a trace with OOMs (and no more than
    /// [`MAX_ENTRIES`](crate::replay::smallest_device::MAX_ENTRIES) entries), the smallest
    /// device on which it replays without an OOM under the recorded settings
    /// ([`smallest_device_without_oom`](crate::replay::smallest_device_without_oom)); for a file
    /// without the device's size, the smallest memory the allocator must reach
    /// ([`smallest_reachable_without_oom`](crate::replay::smallest_reachable_without_oom)).
    pub smallest_device: Option<replay::SmallestDevice>,
}

/// What the history columns (Peak Usage, Tot Alloc, Tot Freed) of a device's memory summary
/// cover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StatsWindow {
    /// The trace window: the trace was replayed from the state at its first entry (the
    /// replay reproduced the recording), so peaks and totals run from that entry to the last.
    Trace {
        /// Entries in the window.
        entries: u64,
        /// Microseconds from the first timed entry to the last, if times were recorded.
        span_us: Option<i64>,
        /// Peak allocated bytes over the window (what `allocview replay` reports).
        peak_allocated: u64,
        /// Peak reserved bytes over the window.
        peak_reserved: u64,
    },
    /// Not known; the columns say "not known".
    NotKnown {
        /// Why.
        why: String,
    },
}

impl StatsWindow {
    /// One line for the text output: which window the peaks and totals cover.
    pub fn describe(&self) -> String {
        match self {
            StatsWindow::Trace {
                entries,
                span_us,
                peak_allocated,
                peak_reserved,
            } => {
                let span = span_us.map_or(String::new(), |us| {
                    format!(", {:.3} s", us as f64 / render::US_PER_S)
                });
                format!(
                    "Peak Usage, Tot Alloc and Tot Freed cover the trace window ({}{span}), \
                     replayed from the state at its first entry (requested sizes are not \
                     traced);\npeak allocated {} ({peak_allocated} B), peak reserved {} \
                     ({peak_reserved} B); the table rounds down to whole units",
                    render::counted(*entries, "entry", "entries"),
                    human_bytes(*peak_allocated),
                    human_bytes(*peak_reserved),
                )
            }
            StatsWindow::NotKnown { why } => {
                format!("Peak Usage, Tot Alloc and Tot Freed are not known: {why}")
            }
        }
    }
}

/// Fragmentation of the small pool, the large pool, and the private pools (graph pools),
/// which hold segments of both sizes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Pools {
    /// The default small pool (requests up to 1 MiB).
    pub small: Fragmentation,
    /// The default large pool.
    pub large: Fragmentation,
    /// All private pools together.
    pub private: Fragmentation,
}

/// Fragmentation of the segments of one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StreamFragmentation {
    /// The stream (0 is the default stream).
    pub stream: u64,
    /// Its figures.
    #[serde(flatten)]
    pub fragmentation: Fragmentation,
}

/// One OOM: an entry of the trace, or the agent's record of the OOM its dump was taken at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomFact {
    /// Index of the entry in the device's trace, from 0 (the text shows it from 1, as the
    /// dashboard numbers entries); `None` for an agent's OOM dump whose trace holds no entry for
    /// it (history was off): the facts are then the agent's record
    /// ([`DumpedOom`](allocview_alloc::snapshot::DumpedOom)).
    pub index: Option<usize>,
    /// When, in microseconds since the epoch, if recorded.
    pub time_us: Option<i64>,
    /// Bytes the failed allocation asked for (rounded).
    pub requested: u64,
    /// Free bytes the device reported.
    pub device_free: u64,
    /// Stream of the request.
    pub stream: u64,
    /// The OOM's event was lost on its way to the agent that dumped it: the request, its
    /// stream and the device's free memory are not known (0).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub event_lost: bool,
    /// Why it failed ([`diagnose_under`]), with the numbers: for a trace
    /// entry, at the state the trace's replay reached there; for an agent's record, from its
    /// figures. `None` when the replay did not reproduce the recording, or the request was lost.
    pub diagnosis: Option<Diagnosis>,
}

/// `max_split_size` in bytes from a snapshot's `allocator_settings` (`None` = unlimited or
/// not recorded).
pub fn max_split_size(snapshot: &Snapshot) -> Option<u64> {
    snapshot
        .allocator_settings
        .as_ref()?
        .iter()
        .find(|(k, _)| k == MAX_SPLIT_SIZE_KEY)
        .and_then(|(_, v)| match v {
            Value::Int(i) if *i > 0 && *i < i64::MAX => Some(*i as u64),
            _ => None,
        })
}

/// Summarizes a snapshot.
pub fn summarize(snapshot: &Snapshot) -> Summary {
    let mut devices: Vec<i32> = snapshot.segments.iter().map(|s| s.device).collect();
    devices.extend(
        snapshot
            .device_traces
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.is_empty())
            .filter_map(|(i, _)| i32::try_from(i).ok()),
    );
    devices.extend(snapshot.devices.iter().map(|d| d.device));
    devices.sort_unstable();
    devices.dedup();
    let max_split = max_split_size(snapshot);
    let replayed = replay_window(snapshot);
    let per_device: Vec<DeviceSummary> = devices
        .into_iter()
        .map(|d| summarize_device(snapshot, d, max_split, &replayed))
        .collect();
    let mut all = Fragmentation::default();
    for d in &per_device {
        all.merge(&d.totals);
    }
    Summary {
        total_reserved: all.reserved,
        total_allocated: all.allocated,
        total_active: all.active,
        total_requested: all.requested,
        segments: all.segments,
        blocks: all.blocks,
        largest_free_block: all.largest_free_block,
        trace_entries: per_device.iter().map(|d| d.trace_entries).sum(),
        ooms: per_device.iter().map(|d| d.ooms.len() as u64).sum(),
        recorded_settings: replay::recorded_settings_text(snapshot),
        devices: per_device,
    }
}

/// The replayed trace's device, and its stats over the trace window with the replay's
/// diagnoses of the recorded OOMs, or why they are unknown.
type Replayed = Option<(i32, Result<(DeviceStats, Vec<OomEvent>), String>)>;

/// Replays the (first) trace as `allocview replay` does (its fidelity run: the recorded
/// settings, placement and device memory), for the stats over the trace window. `None` when
/// the snapshot has no trace.
fn replay_window(snapshot: &Snapshot) -> Replayed {
    let trace = replay::engine::trace_index(snapshot)?;
    let device = i32::try_from(trace).ok()?;
    let result = (|| {
        let opts = RunOptions::fidelity(snapshot, None, false)
            .map_err(|e| format!("the file's allocator settings do not parse ({e})"))?;
        let run = replay::engine::run(snapshot, &opts, &mut |_| {}).map_err(|e| e.to_string())?;
        if !run.fidelity.reproduced() {
            return Err("replaying the trace did not reproduce the recording".to_string());
        }
        Ok((run.stats, run.recorded_ooms))
    })();
    Some((device, result))
}

/// `current` (with the oversize stats) from `snapshot`, everything else from `replayed`; a
/// peak is never below its current figure.
fn merge_history(current: &mut DeviceStats, replayed: &DeviceStats) {
    fn stat(dst: &mut Stat, src: &Stat) {
        dst.peak = src.peak.max(dst.current);
        dst.allocated = src.allocated;
        dst.freed = src.freed;
    }
    for (dst, (_, src)) in current.arrays_mut().into_iter().zip(replayed.arrays()) {
        for (d, s) in dst.0.iter_mut().zip(&src.0) {
            stat(d, s);
        }
    }
    stat(
        &mut current.oversize_allocations,
        &replayed.oversize_allocations,
    );
    stat(&mut current.oversize_segments, &replayed.oversize_segments);
}

/// The keys of `memory_stats()` whose figures are known under `history` (the columns the
/// memory summary's table fills): every `current`; with a replayed trace also every `peak`,
/// `allocated` and `freed` but `requested_bytes`' and `num_ooms`. Left out, rather than
/// written as 0: what a trace cannot tell (requested sizes' history, retries, syncs, device
/// calls before the window).
fn known_memory_stats(stats: &DeviceStats, history: HistoryColumns) -> BTreeMap<String, i64> {
    match history {
        HistoryColumns::NotKnown => stats.currents(),
        HistoryColumns::Known => stats.memory_stats(),
        HistoryColumns::KnownExceptRequested => {
            let mut known: BTreeMap<String, i64> = stats
                .memory_stats()
                .into_iter()
                .filter(|(k, _)| {
                    k.ends_with(".current")
                        || (k.contains('.') && !k.starts_with("requested_bytes."))
                })
                .collect();
            known.insert("num_ooms".into(), stats.num_ooms);
            known
        }
    }
}

fn summarize_device(
    snapshot: &Snapshot,
    device: i32,
    max_split: Option<u64>,
    replayed: &Replayed,
) -> DeviceSummary {
    let mut totals = Fragmentation::default();
    let mut pools = Pools::default();
    let mut streams: BTreeMap<u64, Fragmentation> = BTreeMap::new();
    for seg in snapshot.segments.iter().filter(|s| s.device == device) {
        totals.add_segment(seg);
        let pool = if seg.private_pool().is_some() {
            &mut pools.private
        } else if seg.segment_type == SegmentType::Small {
            &mut pools.small
        } else {
            &mut pools.large
        };
        pool.add_segment(seg);
        streams.entry(seg.stream).or_default().add_segment(seg);
    }
    // PyTorch's counters are i64: a (malformed) snapshot whose byte sums do not fit gets no
    // table rather than wrapped figures.
    let fits = [
        totals.reserved,
        totals.allocated,
        totals.active,
        totals.requested,
        totals.free_in_split_segments,
    ]
    .iter()
    .all(|&v| v <= i64::MAX as u64);
    let trace: &[_] = usize::try_from(device)
        .ok()
        .and_then(|i| snapshot.device_traces.get(i))
        .map_or(&[], |t| t.as_slice());
    let mut actions: BTreeMap<String, u64> = TraceAction::ALL
        .iter()
        .map(|a| (a.as_str().to_string(), 0))
        .collect();
    let mut ooms = Vec::new();
    for (index, e) in trace.iter().enumerate() {
        *actions.entry(e.action.as_str().to_string()).or_default() += 1;
        if e.action == TraceAction::Oom {
            ooms.push(OomFact {
                index: Some(index),
                time_us: e.time_us,
                requested: e.size,
                device_free: e.addr,
                stream: e.stream,
                event_lost: false,
                diagnosis: match replayed {
                    Some((d, Ok((_, diagnosed)))) if *d == device => diagnosed
                        .iter()
                        .find(|o| o.index == index)
                        .map(|o| o.diagnosis.clone()),
                    _ => None,
                },
            });
        }
    }
    let meta = snapshot.devices.iter().find(|m| m.device == device);
    // An agent's dump made without history: the OOM it was taken at is in its record only.
    if ooms.is_empty()
        && let Some(o) = meta.and_then(|m| m.oom.as_ref())
    {
        ooms.push(OomFact {
            index: None,
            time_us: Some(o.time_us),
            requested: o.rounded,
            device_free: o.device_free,
            stream: o.stream,
            event_lost: o.event_lost,
            diagnosis: (!o.event_lost).then(|| {
                let total = meta.and_then(|m| m.total_memory).unwrap_or(0);
                // The advice leaves out a setting the recording already had.
                let expandable =
                    replay::recorded_config(snapshot).is_ok_and(|c| c.expandable_segments());
                diagnose_under(&OomFacts::from_dumped(o, total), expandable)
            }),
        });
    }
    let (memory_summary, memory_stats, window) = if fits {
        let mut stats = DeviceStats::from_snapshot(snapshot, device, max_split);
        let history = match replayed {
            Some((d, Ok((r, _)))) if *d == device => {
                merge_history(&mut stats, r);
                // The replay diagnoses the recorded OOMs rather than counting them: each left
                // one `oom` entry in the trace.
                stats.num_ooms = ooms.len() as i64;
                let times = trace.iter().filter_map(|e| e.time_us);
                let span_us = times.clone().min().zip(times.max()).map(|(a, b)| b - a);
                Ok(StatsWindow::Trace {
                    entries: trace.len() as u64,
                    span_us,
                    peak_allocated: crate::state::all_peak(&stats.allocated_bytes),
                    peak_reserved: crate::state::all_peak(&stats.reserved_bytes),
                })
            }
            Some((d, Err(why))) if *d == device => Err(why.clone()),
            _ if trace.is_empty() => Err("the snapshot holds no trace for this device".into()),
            _ => Err("only the first device's trace is replayed".into()),
        };
        let (columns, window) = match history {
            Ok(w) => (HistoryColumns::KnownExceptRequested, w),
            Err(why) => (HistoryColumns::NotKnown, StatsWindow::NotKnown { why }),
        };
        (
            format_memory_summary_with(&stats, device, columns),
            known_memory_stats(&stats, columns),
            window,
        )
    } else {
        (
            format!(
                "PyTorch's memory summary is not available for device {device}: its byte \
                 totals exceed the 64-bit signed counters PyTorch uses"
            ),
            BTreeMap::new(),
            StatsWindow::NotKnown {
                why: "the byte totals do not fit PyTorch's counters".into(),
            },
        )
    };
    let trace_overflow = meta.map_or(0, |m| m.trace_overflow);
    let reproduced = matches!(replayed, Some((d, Ok(_))) if *d == device);
    // A file without the device's size starts from what the allocator could reach at the
    // first recorded OOM (its diagnosis's capacity).
    let first_traced_oom = ooms.iter().find(|o| o.index.is_some());
    let smallest_device = match (
        meta.and_then(|m| m.total_memory),
        replay::recorded_config(snapshot),
        first_traced_oom.and_then(|o| o.diagnosis.as_ref()),
    ) {
        _ if !reproduced => None,
        (Some(total), Ok(config), _) if first_traced_oom.is_some() => {
            replay::smallest_device_without_oom(snapshot, &config, total)
        }
        (None, Ok(config), Some(diagnosis)) => {
            replay::smallest_reachable_without_oom(snapshot, &config, diagnosis.capacity)
        }
        _ => None,
    };
    DeviceSummary {
        device,
        total_memory: meta.and_then(|m| m.total_memory),
        totals,
        memory_summary,
        window,
        memory_stats,
        pools,
        streams: streams
            .into_iter()
            .map(|(stream, fragmentation)| StreamFragmentation {
                stream,
                fragmentation,
            })
            .collect(),
        trace_entries: trace.len() as u64,
        trace_overflow,
        ring_overflowed: trace_overflow > 0,
        actions,
        ooms,
        smallest_device,
    }
}
