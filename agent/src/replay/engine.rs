//! The replay engine: one run of a trace through a `CachingAllocator` on a `SimBackend`.
//!
//! Two placements:
//! - [`Placement::Recorded`] (fidelity): the run is checked against the recording: it reports
//!   how often replayed addresses agree with recorded ones ([`Fidelity`]), and recorded `oom`
//!   entries are diagnosed at the replay's state.
//! - [`Placement::Free`] (what-if): no checks; recorded `oom` entries are attempted again.
//!
//! Both begin the same way (see [`carried_start`]): the initial state (segments, cached free
//! blocks and live blocks) is installed at its recorded addresses, and before each allocation
//! the trace shows causing a `segment_alloc` the simulated device is told to place the next
//! segment at the recorded address (a hint the device takes only when that range is free). A
//! what-if run under the recorded settings therefore makes the fidelity run's decisions, and
//! its figures equal the recorded column's. Only where the run's settings cannot hold the
//! recorded segments (ordinary segments recorded, expandable ones asked for, or the reverse)
//! does a run begin from the live blocks alone, allocated under its settings
//! ([`RunStart::LiveBlocksOnly`]); the report marks such a column.
//!
//! Either way frees go through an address map (recorded address -> replayed pointer).
//! `free_requested`/`free_completed` pairs that another stream held apart are emulated with
//! `record_stream` on a helper stream whose work completes at the recorded `free_completed`
//! (see [`TracePlan`]); a run of `segment_free` the program asked for becomes an `empty_cache`
//! call; a run before a recorded `oom` releases the whole cache, as the allocator did before
//! giving up; recorded `oom` entries are diagnosed at the replay's state (fidelity) or attempted
//! again (what-if).
//!
//! # Releases before a new segment
//! A run directly before a `segment_alloc` is the allocator's own retry (PyTorch's
//! CUDACachingAllocator.cpp `malloc`; spec "Malloc" 5), unless it released a segment that the
//! allocation fits (then the program emptied the cache: see [`TracePlan`]). The retry is
//! `release_available_cached_blocks`
//! (with `max_split_size`, only cached oversize segments) and, when that is not enough,
//! `release_cached_blocks` (the whole cache). Which of the two ran depends on how much the
//! device had free, and a recording's device usually had less than the replay's (other users:
//! another process, the CUDA context). So the replay does not release anything itself: for the
//! next `malloc` only, it makes the simulated device as full as the recording's was
//! ([`SimBackend::set_external_usage`]), with the least free memory the trace allows: the new
//! segment's size less what the run released. With that much free, the replayed allocator's own
//! retry frees the same segments: first the oversize ones `release_available_cached_blocks`
//! picks (it decides on the cache alone, which the replay shares), then, only if the recording
//! went on to it, the rest of the cache (the oversize ones alone then leave it short of the new
//! segment, as they left the recording). A what-if run is squeezed the same way, by the memory
//! the recording implies other users held, so its allocator releases by its own settings'
//! rules from the device the recording had.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use allocview_alloc::caching::backend::{DeviceBackend, DevicePtr, StreamId};
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::stats::DeviceStats;
use allocview_alloc::caching::{
    AllocError, AllocatorConfig, CachingAllocator, ContextLevel, HistoryOptions, PoolId,
};
use allocview_alloc::snapshot::{
    SegmentInfo, SegmentType, Snapshot, TraceAction, TraceEntry, Value,
};

use allocview_alloc::stats::human_bytes;

use crate::addr_map::AddrMap;
use crate::diagnosis::{OomFacts, diagnose_under};
use crate::replay::initial::{InitialState, MIN_BLOCK_SIZE, SMALL_SIZE};
use crate::replay::plan::{FreeRun, TracePlan, is_release};
use crate::replay::pool_routes::PoolRoutes;
use crate::replay::report::{Divergence, Fidelity, InitialSummary, OomEvent, RunFigures, RunStart};
use crate::state::{all_current, all_peak};

/// Device capacity of a replay that must never run out for lack of device memory: 1 PiB, far
/// beyond any recording, yet small enough that expandable segments (which reserve 1.125 x the
/// device in address space per stream and pool) fit many times in the 64-bit address space.
pub const UNLIMITED_DEVICE_MEMORY: u64 = 1 << 50;

/// At most this many warnings are kept per run; the rest are counted.
pub const MAX_WARNINGS: usize = 20;

/// Progress is reported every this many events.
pub const PROGRESS_EVERY: usize = 4096;

/// Where the replay places segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// At the recorded addresses (fidelity).
    Recorded,
    /// Wherever the simulated device puts them (what-if).
    Free,
}

/// How to run one replay.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Allocator settings.
    pub config: AllocatorConfig,
    /// Column label for the report.
    pub label: String,
    /// Device capacity (`None`: unlimited).
    pub device_memory: Option<u64>,
    /// Where segments go.
    pub placement: Placement,
    /// Keep the replay's own trace (history) for [`RunResult::snapshot`].
    pub keep_history: bool,
}

impl RunOptions {
    /// The fidelity run's options: the file's recorded settings, recorded placement, and
    /// `device_memory` (else the file's device size).
    ///
    /// # Errors
    /// The file's allocator settings do not parse (the message says why).
    pub fn fidelity(
        snapshot: &Snapshot,
        device_memory: Option<u64>,
        keep_history: bool,
    ) -> Result<RunOptions, String> {
        Ok(Self::fidelity_with(
            recorded_config(snapshot)?,
            snapshot,
            device_memory,
            keep_history,
        ))
    }

    /// [`fidelity`](Self::fidelity) with the recorded settings already parsed (`config`).
    pub fn fidelity_with(
        config: AllocatorConfig,
        snapshot: &Snapshot,
        device_memory: Option<u64>,
        keep_history: bool,
    ) -> RunOptions {
        RunOptions {
            config,
            label: crate::replay::RECORDED_LABEL.into(),
            device_memory: device_memory
                .or_else(|| snapshot.devices.iter().find_map(|d| d.total_memory)),
            placement: Placement::Recorded,
            keep_history,
        }
    }

    /// A what-if run's options: `config`, labelled `label`, on a device of `device_memory`
    /// bytes (`None`: unlimited), without address checks ([`Placement::Free`]).
    pub fn what_if(
        config: AllocatorConfig,
        label: impl Into<String>,
        device_memory: Option<u64>,
        keep_history: bool,
    ) -> RunOptions {
        RunOptions {
            config,
            label: label.into(),
            device_memory,
            placement: Placement::Free,
            keep_history,
        }
    }
}

/// What one replay produced.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The run's figures.
    pub figures: RunFigures,
    /// Agreement with the recording (meaningful for [`Placement::Recorded`]).
    pub fidelity: Fidelity,
    /// The state the run began from.
    pub initial: InitialSummary,
    /// OOM entries in the recording, diagnosed at the replay's state at that point.
    pub recorded_ooms: Vec<OomEvent>,
    /// Indices of the trace entries whose allocation ran out of memory in this run, in order
    /// (a recorded OOM the run's settings avoided is not among them).
    pub oom_entries: Vec<usize>,
    /// Frees of blocks the replay never had (their allocation failed, or was unknown).
    pub unmapped_frees: u64,
    /// The replayed run as a snapshot (final segments and, with `keep_history`, the trace);
    /// taken for fidelity runs of files with segments and whenever history is kept.
    pub snapshot: Option<Snapshot>,
    /// The allocator's `memory_stats()` over the trace window: peaks and totals (allocated,
    /// freed, counters) reset after the initial state was installed, so they cover the first
    /// trace entry to the last.
    pub stats: DeviceStats,
}

/// A replay failed to run (not an OOM: those are results).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The snapshot has no trace for the device.
    #[error("the file has no allocation trace to replay")]
    NoTrace,
    /// An allocator settings string that does not parse.
    #[error("bad allocator settings `{config}`: {message}")]
    Config {
        /// The string.
        config: String,
        /// What is wrong.
        message: String,
    },
}

/// The allocator settings a recording was made with, from its `allocator_settings`
/// (`PYTORCH_CUDA_ALLOC_CONF`, else the individual keys); defaults when absent.
///
/// # Errors
/// The settings string did not parse (the message names the key).
pub fn recorded_config(snapshot: &Snapshot) -> Result<AllocatorConfig, String> {
    let Some(settings) = &snapshot.allocator_settings else {
        return Ok(AllocatorConfig::default());
    };
    let get = |k: &str| settings.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    if let Some(Value::Str(conf)) = get("PYTORCH_CUDA_ALLOC_CONF")
        && !conf.trim().is_empty()
    {
        return AllocatorConfig::parse(conf).map_err(|e| e.to_string());
    }
    let mut parts = Vec::new();
    if let Some(Value::Bool(true)) = get("expandable_segments") {
        parts.push("expandable_segments:True".to_string());
    }
    if let Some(Value::Int(m)) = get("max_split_size")
        && *m > 0
        && (*m as u64) < u64::MAX / 2
    {
        parts.push(format!("max_split_size_mb:{}", (*m as u64) >> 20));
    }
    AllocatorConfig::parse(&parts.join(",")).map_err(|e| e.to_string())
}

/// How a run under `config` begins, for a recording made under `recorded`: from the recorded
/// state (segments, cache and live blocks at their recorded addresses) whenever `config` keeps
/// segments of the same kind; a recording of ordinary segments cannot start as expandable
/// segments (nor the reverse), so such a run begins from the live blocks alone.
pub fn carried_start(recorded: &AllocatorConfig, config: &AllocatorConfig) -> RunStart {
    if recorded.expandable_segments() == config.expandable_segments() {
        RunStart::RecordedState
    } else {
        RunStart::LiveBlocksOnly
    }
}

/// Index of the first device trace with entries (replay works on one device).
pub fn trace_index(snapshot: &Snapshot) -> Option<usize> {
    snapshot.device_traces.iter().position(|t| !t.is_empty())
}

/// Replays `snapshot`'s trace once: [`Replayer::new`], [`Replayer::replay_events`],
/// [`Replayer::finish`].
///
/// `progress` is called with the number of events done, every [`PROGRESS_EVERY`] events and at
/// the end.
///
/// # Errors
/// [`ReplayError::NoTrace`] when the snapshot has no trace (allocator failures, OOMs included,
/// are results, not errors).
pub fn run(
    snapshot: &Snapshot,
    opts: &RunOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<RunResult, ReplayError> {
    if trace_index(snapshot).is_none() {
        return Err(ReplayError::NoTrace);
    }
    let mut r = Replayer::new(snapshot, opts);
    r.replay_events(progress);
    Ok(r.finish())
}

/// Which entries of a replayed trace each recorded entry made: counts of the allocator's
/// trace entries when history was turned on (`base`) and after each recorded entry was
/// replayed (`after[i]`).
#[derive(Debug)]
struct HistoryMarks {
    base: u64,
    after: Vec<u64>,
}

impl HistoryMarks {
    /// Entries made before recorded entry `i` was replayed.
    fn before(&self, i: usize) -> u64 {
        i.checked_sub(1)
            .and_then(|j| self.after.get(j).copied())
            .unwrap_or(self.base)
    }

    /// The count of the first of the last `kept` entries (those a trace of `kept` entries holds).
    fn first_kept(&self, kept: usize) -> u64 {
        self.after
            .last()
            .copied()
            .unwrap_or(self.base)
            .saturating_sub(kept as u64)
    }
}

/// One replay: set up (initial state reconstructed and installed) by [`new`](Self::new),
/// driven through the trace by [`replay_events`](Self::replay_events), summed up by
/// [`finish`](Self::finish).
pub struct Replayer<'a> {
    snapshot: &'a Snapshot,
    entries: &'a [TraceEntry],
    plan: TracePlan,
    device: i32,
    initial: InitialSummary,
    alloc: CachingAllocator<Arc<SimBackend>>,
    sim: Arc<SimBackend>,
    opts: &'a RunOptions,
    capacity: u64,
    map: AddrMap<DevicePtr>,
    /// Recorded address of a deferred free -> the helper stream holding it.
    held: AddrMap<StreamId>,
    idle_helpers: Vec<StreamId>,
    fidelity: Fidelity,
    figures: RunFigures,
    recorded_ooms: Vec<OomEvent>,
    oom_entries: Vec<usize>,
    /// With `keep_history`: which replayed trace entries each recorded entry made.
    history_marks: Option<HistoryMarks>,
    unmapped_frees: u64,
    base_device_alloc: i64,
    warnings: Vec<String>,
    /// Warnings beyond [`MAX_WARNINGS`].
    suppressed_warnings: usize,
    /// The recorded state was installed, and new segments follow the recorded addresses.
    carried: bool,
    /// Bytes the recording held in segments at the current entry: the initial segments plus
    /// the trace's `segment_alloc`/`segment_map` less its `segment_free`/`segment_unmap`.
    recorded_reserved: u64,
    /// The simulated device is made as full as the recording's for the next `malloc` (see
    /// [`Replayer::squeeze_for_retry`]); undone after it.
    squeezed: bool,
    /// The replay's own last `segment_alloc` or `segment_map` (address, size), written by a
    /// trace tracker on the allocator; taken before and after each replayed `malloc` to tell
    /// which segment (or mapping, for expandable segments) it made.
    last_segment: Arc<Mutex<Vec<(u64, u64)>>>,
    /// Trace entries the allocator has made so far (its tracker counts them): the history
    /// marks are differences of it.
    traced: Arc<AtomicU64>,
    /// The private pool of each recorded allocation that went to one.
    routes: PoolRoutes,
    /// Private pools this run has made: one use each is kept, so that their cached segments
    /// stay theirs, as the recording's graphs kept theirs.
    held_pools: Vec<PoolId>,
}

impl<'a> Replayer<'a> {
    /// Reconstructs the state at the first trace entry and installs it on a fresh simulated
    /// device under `opts`.
    pub fn new(snapshot: &'a Snapshot, opts: &'a RunOptions) -> Replayer<'a> {
        let trace = trace_index(snapshot).unwrap_or(0);
        let entries: &[TraceEntry] = snapshot
            .device_traces
            .get(trace)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        // PyTorch writes one trace per device, indexed by device.
        let device = i32::try_from(trace).unwrap_or(0);
        let recorded = recorded_config(snapshot).unwrap_or_default();
        let initial =
            InitialState::reconstruct(snapshot, trace, device, &|s| recorded.round_size(s));
        let plan = TracePlan::new(entries, &recorded);
        let routes = PoolRoutes::new(snapshot, device, entries, &initial);

        let capacity = opts.device_memory.unwrap_or(UNLIMITED_DEVICE_MEMORY);
        let sim = Arc::new(
            SimBackend::builder()
                .device(device)
                .capacity(capacity)
                .auto_complete(false)
                .build(),
        );
        // Each distinct stream once (segments share a handful of streams).
        let mut streams: Vec<u64> = plan.streams.clone();
        for seg in &initial.segments {
            if !streams.contains(&seg.stream) {
                streams.push(seg.stream);
            }
        }
        for &s in &streams {
            sim.add_stream(StreamId(s));
        }
        let alloc = CachingAllocator::new(Arc::clone(&sim), opts.config.clone());
        let mut r = Replayer {
            snapshot,
            entries,
            plan,
            device,
            initial: InitialSummary {
                segments: initial.segments.len(),
                live_blocks: initial.live_blocks().count(),
                reserved: initial.reserved(),
                allocated: initial.allocated(),
                active: initial.active(),
                warnings: Vec::new(),
            },
            alloc,
            sim,
            opts,
            capacity,
            map: AddrMap::with_capacity_and_hasher(entries.len() / 2 + 16, Default::default()),
            held: AddrMap::default(),
            idle_helpers: Vec::new(),
            fidelity: Fidelity::default(),
            figures: RunFigures {
                label: opts.label.clone(),
                config: opts.config.to_conf_string(),
                peak_reserved: 0,
                peak_allocated: 0,
                peak_fragmentation: 0,
                start: RunStart::RecordedState,
                device_mallocs: 0,
                ooms: 0,
                first_oom: None,
            },
            recorded_ooms: Vec::new(),
            oom_entries: Vec::new(),
            history_marks: None,
            unmapped_frees: 0,
            base_device_alloc: 0,
            warnings: Vec::new(),
            suppressed_warnings: 0,
            carried: false,
            recorded_reserved: initial.reserved(),
            squeezed: false,
            last_segment: Arc::new(Mutex::new(Vec::new())),
            traced: Arc::new(AtomicU64::new(0)),
            routes,
            held_pools: Vec::new(),
        };
        let last_segment = Arc::clone(&r.last_segment);
        let traced = Arc::clone(&r.traced);
        r.alloc.attach_trace_tracker(move |e| {
            traced.fetch_add(1, Ordering::Relaxed);
            if matches!(
                e.action,
                TraceAction::SegmentAlloc | TraceAction::SegmentMap
            ) {
                last_segment
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((e.addr, e.size));
            }
        });
        for w in &initial.warnings {
            r.warn(w.clone());
        }
        r.carried = carried_start(&recorded, &opts.config) == RunStart::RecordedState;
        if r.carried {
            r.install_recorded(&initial);
        } else {
            r.install_free(&initial);
            // Only a recorded cache left behind makes the peaks incomparable.
            if initial.reserved() > initial.active() {
                r.figures.start = RunStart::LiveBlocksOnly;
            }
        }
        r.request_pending_frees(&initial);
        // Peaks and totals cover the trace window, not the installation of its initial state.
        r.alloc.reset_peak_stats();
        r.alloc.reset_accumulated_stats();
        r.base_device_alloc = r.alloc.device_stats().num_device_alloc;
        if opts.keep_history {
            r.alloc.record_history(HistoryOptions {
                enabled: true,
                context: ContextLevel::Never,
                max_entries: entries.len() * 2 + 1024,
            });
            r.history_marks = Some(HistoryMarks {
                base: r.traced.load(Ordering::Relaxed),
                after: Vec::with_capacity(entries.len()),
            });
        }
        r.sample();
        r
    }

    /// Number of trace entries.
    pub fn events(&self) -> usize {
        self.entries.len()
    }

    /// Drives the allocator through every trace entry.
    pub fn replay_events(&mut self, progress: &mut dyn FnMut(usize)) {
        let entries = self.entries;
        // The recorded segments (or mappings) the next `alloc` made: an expandable segment can
        // map more than one range for one allocation.
        let mut pending_segments: Vec<(u64, u64)> = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            match e.action {
                // A new segment, or an expandable segment grew: the next `alloc` made it (a new
                // reservation starts at its first mapping's address).
                TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
                    self.recorded_reserved = self.recorded_reserved.saturating_add(e.size);
                    pending_segments.push((e.addr, e.size));
                }
                TraceAction::Alloc => {
                    self.replay_alloc(i, e, &std::mem::take(&mut pending_segments));
                }
                TraceAction::FreeRequested => {
                    self.replay_free(i, e, self.plan.is_deferred(i));
                    self.sample();
                }
                // Completion changes what is active, not what is allocated or reserved.
                TraceAction::FreeCompleted => self.replay_free_completed(i, e),
                TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                    if let Some((kind, end)) = self.plan.free_run_span(i) {
                        self.replay_free_run(kind, &entries[i..end], entries.get(end), i);
                        self.sample();
                    }
                    self.recorded_reserved = self.recorded_reserved.saturating_sub(e.size);
                }
                TraceAction::Oom => {
                    pending_segments.clear();
                    self.replay_recorded_oom(i, e);
                    self.sample();
                }
                TraceAction::Snapshot | TraceAction::UserDefined => {}
            }
            // The squeeze is for the `malloc` right after its run; one the trace does not
            // show (cut off after the `segment_alloc`) leaves none behind.
            if !matches!(
                e.action,
                TraceAction::SegmentAlloc | TraceAction::SegmentMap
            ) && !is_release(e.action)
            {
                self.release_squeeze();
            }
            if let Some(marks) = &mut self.history_marks {
                marks.after.push(self.traced.load(Ordering::Relaxed));
            }
            if (i + 1) % PROGRESS_EVERY == 0 {
                progress(i + 1);
            }
        }
        progress(entries.len());
    }

    /// Gives each entry of the replayed trace the time, frames and metadata of the recorded
    /// entry whose replay made it, so that a what-if's file reads on the recording's clock,
    /// with its context.
    fn stamp_replayed_trace(&self, end: &mut Snapshot) {
        let Some(marks) = &self.history_marks else {
            return;
        };
        let Some(trace) = end.device_traces.get_mut(self.device_trace()) else {
            return;
        };
        let first = marks.first_kept(trace.len());
        for (j, t) in trace.iter_mut().enumerate() {
            let n = first + j as u64;
            // The recorded entry whose replay took the count past `n`.
            let i = marks.after.partition_point(|&m| m <= n);
            if let Some(e) = self.entries.get(i) {
                t.time_us = e.time_us;
                t.frames = e.frames.clone();
                t.user_metadata = e.user_metadata.clone();
            }
        }
    }

    /// Puts the recording's OOMs into a fidelity run's replayed trace, where the recording had
    /// them, and its OOM header (`devices[].oom`) on the run's device: the fidelity run only
    /// diagnoses a recorded `oom` (it does not attempt the request again), so the allocator
    /// wrote none, yet the run's file is the recording replayed and must show its OOMs.
    fn carry_recorded_ooms(&mut self, end: &mut Snapshot) {
        let Some(marks) = &self.history_marks else {
            return;
        };
        if let Some(trace) = end.device_traces.get_mut(self.device_trace()) {
            let first = marks.first_kept(trace.len());
            // Where each goes in the replayed trace as it is, then inserted last to first so
            // that each position holds; each lands after the ones before it.
            let places: Vec<usize> = self
                .recorded_ooms
                .iter()
                .map(|oom| {
                    (marks.before(oom.index).saturating_sub(first) as usize).min(trace.len())
                })
                .collect();
            for (oom, &at) in self.recorded_ooms.iter().zip(&places).rev() {
                if let Some(e) = self.entries.get(oom.index) {
                    trace.insert(at, e.clone());
                }
            }
            for (k, (oom, at)) in self.recorded_ooms.iter_mut().zip(places).enumerate() {
                oom.written_index = Some(at + k);
            }
        }
        let header = self
            .snapshot
            .devices
            .iter()
            .find(|d| d.device == self.device)
            .and_then(|d| d.oom.clone());
        if let Some(header) = header
            && let Some(meta) = end.devices.iter_mut().find(|d| d.device == self.device)
        {
            meta.oom = Some(header);
        }
    }

    /// Sets where a what-if run's first OOM lies in its own kept trace: the allocator wrote the
    /// `oom` entry last while it replayed the recorded entry.
    fn note_written_index(&mut self, end: &Snapshot) {
        let kept = end
            .device_traces
            .get(self.device_trace())
            .map_or(0, Vec::len);
        let (Some(marks), Some(oom)) = (&self.history_marks, &mut self.figures.first_oom) else {
            return;
        };
        let first = marks.first_kept(kept);
        if let Some(&after) = marks.after.get(oom.index)
            && after > first
        {
            oom.written_index = Some((after - 1 - first) as usize);
        }
    }

    /// The run's results: figures, fidelity (with the final state compared to the snapshot's
    /// for a fidelity run), and the replayed snapshot.
    pub fn finish(mut self) -> RunResult {
        let compare =
            self.opts.placement == Placement::Recorded && !self.snapshot.segments.is_empty();
        let mut end = (compare || self.opts.keep_history).then(|| self.alloc.snapshot());
        if let Some(end) = &mut end {
            self.stamp_replayed_trace(end);
            if self.opts.placement == Placement::Recorded {
                self.carry_recorded_ooms(end);
            } else {
                self.note_written_index(end);
            }
        }
        if compare && let Some(end) = &end {
            self.fidelity.final_state_matches = Some(same_layout(self.snapshot, end, self.device));
        }
        let stats = self.alloc.device_stats();
        self.figures.device_mallocs =
            (stats.num_device_alloc - self.base_device_alloc).max(0) as u64;
        if self.suppressed_warnings > 0 {
            self.warnings.push(format!(
                "... and {} more warnings",
                self.suppressed_warnings
            ));
        }
        self.initial.warnings = self.warnings;
        // The allocator's own peaks (reset after the initial state was installed) see every
        // moment of the trace window, within calls too; the samples see the state between
        // entries.
        let f = &mut self.figures;
        f.peak_allocated = f.peak_allocated.max(all_peak(&stats.allocated_bytes));
        f.peak_reserved = f.peak_reserved.max(all_peak(&stats.reserved_bytes));
        RunResult {
            stats,
            figures: self.figures,
            fidelity: self.fidelity,
            initial: self.initial,
            recorded_ooms: self.recorded_ooms,
            oom_entries: self.oom_entries,
            unmapped_frees: self.unmapped_frees,
            snapshot: end,
        }
    }
}

impl Replayer<'_> {
    /// The index of the replayed device's trace in `device_traces`.
    fn device_trace(&self) -> usize {
        self.device.max(0) as usize
    }

    /// The replay's `segment_alloc`/`segment_map` entries since the previous call, in order.
    fn take_last_segment(&self) -> Vec<(u64, u64)> {
        std::mem::take(
            &mut *self
                .last_segment
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Records the peaks after an event.
    fn sample(&mut self) {
        let s = self.alloc.device_stats();
        let allocated = all_current(&s.allocated_bytes);
        let reserved = all_current(&s.reserved_bytes);
        let f = &mut self.figures;
        f.peak_allocated = f.peak_allocated.max(allocated);
        f.peak_reserved = f.peak_reserved.max(reserved);
        f.peak_fragmentation = f.peak_fragmentation.max(reserved.saturating_sub(allocated));
    }

    /// Installs the initial state at its recorded addresses through the public API: each
    /// segment is allocated whole at its address, freed, and carved front to back into its
    /// blocks while every other segment is fully allocated (so best fit can only pick this
    /// segment's remainder); the placeholders standing for free blocks are freed at the end.
    ///
    /// A large segment that is one live block (the common case) keeps the whole allocation as
    /// that block: freeing it and allocating the same size again would give back the very same
    /// block (the only free block, an exact fit), so the two calls are skipped. Expandable
    /// segments always take the general path (their free space merges across the mapping).
    fn install_recorded(&mut self, initial: &InitialState) {
        let mut placeholders = Vec::new();
        let expandable = self.opts.config.expandable_segments();
        for seg in &initial.segments {
            let stream = StreamId(seg.stream);
            let small = seg.pool == SegmentType::Small;
            let pool = seg.private_pool;
            if !small
                && !expandable
                && let [only] = seg.blocks.as_slice()
                && only.live
                && only.size == seg.size
            {
                self.sim.hint_next_segment(seg.address);
                match self.malloc_in(pool, seg.size, stream) {
                    Ok(p) => {
                        if p != seg.address {
                            self.warn(format!(
                                "initial segment {:#x} was placed at {p:#x}",
                                seg.address
                            ));
                            self.warn(format!(
                                "initial block {:#x} was placed at {p:#x}",
                                only.address
                            ));
                        }
                        self.map.insert(only.address, p);
                    }
                    Err(e) => self.warn(format!(
                        "initial segment {:#x} ({} bytes) could not be allocated: {e}",
                        seg.address, seg.size
                    )),
                }
                continue;
            }
            self.sim.hint_next_segment(seg.address);
            let first = if small { MIN_BLOCK_SIZE } else { seg.size };
            let p = match self.malloc_in(pool, first, stream) {
                Ok(p) => p,
                Err(e) => {
                    self.warn(format!(
                        "initial segment {:#x} ({} bytes) could not be allocated: {e}",
                        seg.address, seg.size
                    ));
                    continue;
                }
            };
            if p != seg.address {
                self.warn(format!(
                    "initial segment {:#x} was placed at {p:#x}",
                    seg.address
                ));
            }
            self.free_or_warn(0, p);
            for b in &seg.blocks {
                if b.live {
                    match self.malloc_in(pool, b.size, stream) {
                        Ok(q) => {
                            if q != b.address {
                                self.warn(format!(
                                    "initial block {:#x} was placed at {q:#x}",
                                    b.address
                                ));
                            }
                            self.map.insert(b.address, q);
                        }
                        Err(e) => self.warn(format!(
                            "initial block {:#x} could not be allocated: {e}",
                            b.address
                        )),
                    }
                    continue;
                }
                // A free block: placeholders, at most SMALL_SIZE each in the small pool so
                // they stay there.
                let chunk = if small { SMALL_SIZE } else { b.size };
                if !small && b.size <= SMALL_SIZE {
                    self.warn(format!(
                        "free block {:#x} of {} bytes in large segment {:#x} is too small for \
                         the large pool; the layout after it may differ",
                        b.address, b.size, seg.address
                    ));
                    continue;
                }
                let mut off = 0;
                while off < b.size {
                    let c = chunk.min(b.size - off);
                    match self.malloc_in(pool, c, stream) {
                        Ok(q) => placeholders.push(q),
                        Err(e) => {
                            self.warn(format!(
                                "free block {:#x} could not be laid out: {e}",
                                b.address
                            ));
                            break;
                        }
                    }
                    off += c;
                }
            }
        }
        for q in placeholders {
            self.free_or_warn(0, q);
        }
    }

    /// Installs the initial live blocks under the run's own settings.
    fn install_free(&mut self, initial: &InitialState) {
        for seg in &initial.segments {
            for b in seg.blocks.iter().filter(|b| b.live) {
                match self.malloc_in(seg.private_pool, b.requested.max(1), StreamId(seg.stream)) {
                    Ok(p) => {
                        self.map.insert(b.address, p);
                    }
                    Err(err) => {
                        self.note_oom(0, b.requested, &err);
                    }
                }
            }
        }
    }

    /// Replays the `alloc` at `index`, for which the recording made the segments (or
    /// mappings) `recorded_segments`.
    fn replay_alloc(&mut self, index: usize, e: &TraceEntry, recorded_segments: &[(u64, u64)]) {
        let recorded = self.opts.placement == Placement::Recorded;
        if self.carried
            && let Some(&(addr, _)) = recorded_segments.last()
        {
            self.sim.hint_next_segment(addr);
        }
        self.take_last_segment();
        let result = self.malloc_in(self.routes.pool_of(index), e.size, StreamId(e.stream));
        self.release_squeeze();
        self.sample();
        // The segments (or, for expandable segments, the mappings) this `malloc` made.
        let new_segments = self.take_last_segment();
        match result {
            Ok(p) => {
                self.map.insert(e.addr, p);
                if recorded {
                    self.check_alloc(index, e, p, recorded_segments, &new_segments);
                }
            }
            Err(err) => {
                self.note_oom(index, e.size, &err);
                if recorded {
                    self.fidelity.allocs += 1;
                    self.diverge(
                        index,
                        "alloc",
                        format!("{:#x}", e.addr),
                        "an OOM".into(),
                        match err.out_of_memory() {
                            Some(oom) => format!(
                                "the replay's device ran out: {} requested, {} free of {}",
                                human_bytes(oom.rounded),
                                human_bytes(oom.device_free),
                                human_bytes(oom.device_total)
                            ),
                            None => err.to_string(),
                        },
                    );
                }
            }
        }
    }

    /// `malloc`, in the private pool `pool` where given (routed there as the recording's
    /// capture did: `begin_allocate_to_pool` around it). The run keeps one use of each pool it
    /// made, so that the pool is never released under it.
    fn malloc_in(
        &mut self,
        pool: Option<PoolId>,
        size: u64,
        stream: StreamId,
    ) -> Result<DevicePtr, AllocError> {
        let Some(pool) = pool else {
            return self.alloc.malloc(size, stream);
        };
        self.alloc.begin_allocate_to_pool(pool, |_| true);
        let result = self.alloc.malloc(size, stream);
        self.alloc.end_allocate_to_pool(pool);
        if self.held_pools.contains(&pool) {
            self.alloc.release_pool(pool);
        } else {
            self.held_pools.push(pool);
        }
        result
    }

    fn check_alloc(
        &mut self,
        index: usize,
        e: &TraceEntry,
        p: DevicePtr,
        recorded_segments: &[(u64, u64)],
        new_segments: &[(u64, u64)],
    ) {
        self.fidelity.allocs += 1;
        if p == e.addr {
            self.fidelity.allocs_at_recorded_address += 1;
        }
        // Each recorded `segment_alloc`/`segment_map` counts (an expandable segment can map
        // two ranges for one allocation), matched in order with the replay's.
        match (recorded_segments.last(), new_segments.last()) {
            (Some(&rec), Some(&got)) => {
                self.fidelity.segment_allocs += recorded_segments.len() as u64;
                let same = recorded_segments
                    .iter()
                    .zip(new_segments)
                    .filter(|(r, g)| r.1 == g.1)
                    .count() as u64;
                self.fidelity.segment_allocs_of_recorded_size += same;
                if same as usize != recorded_segments.len()
                    || new_segments.len() != recorded_segments.len()
                {
                    let sizes = |v: &[(u64, u64)]| {
                        v.iter()
                            .map(|x| x.1.to_string())
                            .collect::<Vec<_>>()
                            .join(" + ")
                    };
                    self.diverge(
                        index,
                        "segment_alloc",
                        format!("a segment of {} bytes", sizes(recorded_segments)),
                        format!("{} bytes", sizes(new_segments)),
                        "the segment-size rule gave another size".into(),
                    );
                }
                if p != e.addr && rec.0 != got.0 {
                    self.diverge(
                        index,
                        "alloc",
                        format!("{:#x}", e.addr),
                        format!("{p:#x}"),
                        "the recorded segment address was taken in the replay".into(),
                    );
                }
            }
            (Some(&rec), None) => {
                self.fidelity.segment_allocs += recorded_segments.len() as u64;
                self.diverge(
                    index,
                    "segment_alloc",
                    format!("a new segment at {:#x} of {} bytes", rec.0, rec.1),
                    format!("a cached block at {p:#x}"),
                    "the replay had a free block that fits; the recording did not".into(),
                );
            }
            (None, Some(&got)) => {
                self.fidelity.segment_allocs += new_segments.len() as u64;
                self.diverge(
                    index,
                    "alloc",
                    format!("a cached block at {:#x}", e.addr),
                    format!("a new segment at {:#x} of {} bytes", got.0, got.1),
                    "the replay had no free block that fits; the recording did".into(),
                );
            }
            (None, None) => {
                if p != e.addr {
                    self.diverge(
                        index,
                        "alloc",
                        format!("{:#x}", e.addr),
                        format!("{p:#x}"),
                        "best fit chose another cached block".into(),
                    );
                }
            }
        }
    }

    fn diverge(&mut self, index: usize, action: &str, expected: String, got: String, why: String) {
        if self.fidelity.first_divergence.is_none() {
            self.fidelity.first_divergence = Some(Divergence {
                index,
                action: action.into(),
                expected,
                got,
                why,
            });
        }
    }

    fn replay_free(&mut self, index: usize, e: &TraceEntry, deferred: bool) {
        let Some(p) = self.map.remove(&e.addr) else {
            self.unmapped_frees += 1;
            return;
        };
        if deferred {
            self.hold_on_helper(index, e.addr, p);
        }
        self.free_or_warn(index, p);
    }

    /// Makes the block at `p` (recorded at `addr`) wait on a helper stream's unfinished work, so
    /// that its free stays pending until the trace's `free_completed` for `addr`.
    fn hold_on_helper(&mut self, index: usize, addr: u64, p: DevicePtr) {
        let helper = self.helper_stream();
        self.sim.submit_work(helper);
        if let Err(err) = self.alloc.record_stream(p, helper) {
            self.warnings
                .push(format!("event {index}: record_stream: {err}"));
        }
        self.held.insert(addr, helper);
    }

    /// Requests the free of every initial block whose free the recording requested before the
    /// trace began: it starts the window active but not allocated, pending until its
    /// `free_completed`, as in the recording.
    fn request_pending_frees(&mut self, initial: &InitialState) {
        for b in initial.live_blocks().filter(|b| b.pending_free) {
            if let Some(p) = self.map.remove(&b.address) {
                self.hold_on_helper(0, b.address, p);
                self.free_or_warn(0, p);
            }
        }
    }

    fn replay_free_completed(&mut self, index: usize, e: &TraceEntry) {
        if let Some(helper) = self.held.remove(&e.addr) {
            // The recording completed the free here (in a `malloc`'s or a synchronisation's
            // `process_events`): so does the replay, in the recorded order.
            self.sim.complete_stream(helper);
            self.idle_helpers.push(helper);
            if let Err(err) = self.alloc.process_events() {
                self.warn(format!("event {index}: {err}"));
            }
        } else if let Some(p) = self.map.remove(&e.addr) {
            // Freed before the trace began, its completion recorded inside it.
            self.free_or_warn(index, p);
        }
    }

    fn free_or_warn(&mut self, index: usize, p: DevicePtr) {
        if let Err(err) = self.alloc.free(p) {
            self.warn(format!("event {index}: {err}"));
        }
    }

    fn empty_cache(&mut self, index: usize) {
        if let Err(err) = self.alloc.empty_cache() {
            self.warnings
                .push(format!("event {index}: empty_cache: {err}"));
        }
    }

    fn helper_stream(&mut self) -> StreamId {
        if let Some(h) = self.idle_helpers.pop() {
            return h;
        }
        match self.sim.create_stream() {
            Ok(h) => h,
            Err(_) => StreamId(u64::MAX - self.held.len() as u64),
        }
    }

    /// Replays the run of releases `run` (its first entry at `index`), followed in the trace by
    /// `after` (the plan already found where the run ends).
    fn replay_free_run(
        &mut self,
        kind: FreeRun,
        run: &[TraceEntry],
        after: Option<&TraceEntry>,
        index: usize,
    ) {
        match kind {
            FreeRun::EmptyCache => self.empty_cache(index),
            FreeRun::Retry => match after {
                // The allocator released its cache (release_cached_blocks in PyTorch's
                // CUDACachingAllocator.cpp) and the allocation still failed (spec
                // "Malloc" 5(d), then 6). No replayed `malloc` follows to retry by itself:
                // a fidelity run only diagnoses a recorded `oom`, and a what-if run
                // attempts it on the state the recording reached. So release the cache
                // here, whatever room the replay's device has.
                Some(n) if n.action == TraceAction::Oom => self.empty_cache(index),
                // The retry made room for a new segment: the replayed `malloc` retries by
                // itself on a device as full as the recording's. What-if runs do the same,
                // so a what-if under the recorded settings is the fidelity run.
                Some(n) => {
                    let released = run.iter().map(|r| r.size).fold(0, u64::saturating_add);
                    self.squeeze_for_retry(n.size, released);
                }
                // The plan takes a run the trace ends with for an `empty_cache`.
                None => self.empty_cache(index),
            },
        }
    }

    /// Makes the simulated device, for the next `malloc` only, as full as the recording's was
    /// when it needed a `segment_size` segment and released `released` bytes of cache to get
    /// it (see the module docs, "Releases before a new segment").
    ///
    /// The recording's free memory `F` was short of the segment (`F < segment_size`, its first
    /// try failed) and enough once the run was released (`F + released >= segment_size`);
    /// the least such `F`, `segment_size - released`, makes the replayed allocator release
    /// exactly as much: an oversize release that was enough is enough again, one that was not
    /// is not, and the whole cache follows. Memory beyond that is held as external usage, the
    /// other users the recording's device had: the device's capacity less the recording's
    /// segments and that free memory, and never so much that the replay's device has less
    /// free than `F` (a replay that reserved more than the recording stays as it is).
    fn squeeze_for_retry(&mut self, segment_size: u64, released: u64) {
        let target_free = segment_size.saturating_sub(released);
        let Ok((free, capacity)) = self.sim.mem_get_info() else {
            return;
        };
        let others = capacity
            .saturating_sub(self.recorded_reserved.saturating_add(target_free))
            .min(free.saturating_sub(target_free));
        if others > 0 {
            self.sim.set_external_usage(others);
            self.squeezed = true;
        }
    }

    /// Undoes [`squeeze_for_retry`](Self::squeeze_for_retry) once the `malloc` it was for ran.
    fn release_squeeze(&mut self) {
        if self.squeezed {
            self.sim.set_external_usage(0);
            self.squeezed = false;
        }
    }

    fn replay_recorded_oom(&mut self, index: usize, e: &TraceEntry) {
        match self.opts.placement {
            Placement::Recorded => {
                let stats = self.alloc.device_stats();
                let info = self.alloc.cache_info();
                let facts = OomFacts {
                    requested: e.size,
                    device_total: if self.capacity == UNLIMITED_DEVICE_MEMORY {
                        e.addr.saturating_add(all_current(&stats.reserved_bytes))
                    } else {
                        self.capacity
                    },
                    device_free: e.addr,
                    allowed_max: None,
                    allocated: all_current(&stats.allocated_bytes),
                    reserved: all_current(&stats.reserved_bytes),
                    largest_free_block: info.largest_free_block,
                    // Free blocks of split segments: PyTorch's inactive_split_bytes.
                    stranded_in_split_segments: all_current(&stats.inactive_split_bytes),
                };
                self.recorded_ooms.push(OomEvent {
                    index,
                    requested: e.size,
                    diagnosis: diagnose_under(&facts, self.opts.config.expandable_segments()),
                    written_index: None,
                });
            }
            Placement::Free => match self.alloc.malloc(e.size, StreamId(e.stream)) {
                // The recorded program never got this block: give it back at once, after the
                // peaks count it (the run did hold it).
                Ok(p) => {
                    self.sample();
                    self.free_or_warn(index, p);
                }
                Err(err) => self.note_oom(index, e.size, &err),
            },
        }
    }

    /// Keeps a warning (up to [`MAX_WARNINGS`], then counts them).
    fn warn(&mut self, message: String) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(message);
        } else {
            self.suppressed_warnings += 1;
        }
    }

    /// Counts a failed allocation: an OOM (the first one diagnosed), or any other allocator
    /// error as a warning (a request the allocator refuses outright, say).
    fn note_oom(&mut self, index: usize, requested: u64, err: &AllocError) {
        let AllocError::OutOfMemory(oom) = err else {
            self.warn(format!("event {index}: {err}"));
            return;
        };
        self.figures.ooms += 1;
        self.oom_entries.push(index);
        if self.figures.first_oom.is_none() {
            self.figures.first_oom = Some(OomEvent {
                index,
                requested,
                diagnosis: diagnose_under(&OomFacts::from_oom(oom), oom.expandable_segments),
                written_index: None,
            });
        }
    }
}

/// Whether two snapshots have the same segments and blocks (addresses, sizes, states) on
/// `device`.
///
/// When both list their segments in strictly increasing address order (as the allocator and
/// PyTorch write them) the two lists are walked side by side without building anything;
/// otherwise each is collected and sorted first.
fn same_layout(a: &Snapshot, b: &Snapshot, device: i32) -> bool {
    let strictly_sorted = |s: &Snapshot| {
        s.segments
            .iter()
            .filter(|seg| seg.device == device)
            .is_sorted_by(|x, y| x.address < y.address)
    };
    if strictly_sorted(a) && strictly_sorted(b) {
        let mut xs = a.segments.iter().filter(|seg| seg.device == device);
        let mut ys = b.segments.iter().filter(|seg| seg.device == device);
        loop {
            match (xs.next(), ys.next()) {
                (None, None) => return true,
                (Some(x), Some(y)) => {
                    if !same_segment(x, y) {
                        return false;
                    }
                }
                _ => return false,
            }
        }
    }
    sorted_layout_equal(a, b, device)
}

/// Whether two segments have the same address, size and blocks (tiled addresses, sizes,
/// states), as [`sorted_layout_equal`] compares them.
fn same_segment(x: &SegmentInfo, y: &SegmentInfo) -> bool {
    if x.address != y.address || x.total_size != y.total_size || x.blocks.len() != y.blocks.len() {
        return false;
    }
    // Both tilings start at the same address, so equal sizes give equal addresses.
    x.blocks
        .iter()
        .zip(&y.blocks)
        .all(|(p, q)| p.size == q.size && p.state.is_active() == q.state.is_active())
}

/// [`same_layout`] for snapshots whose segments are not in address order: each side is
/// collected and sorted, then compared.
fn sorted_layout_equal(a: &Snapshot, b: &Snapshot, device: i32) -> bool {
    type Layout = Vec<(u64, u64, Vec<(u64, u64, bool)>)>;
    let layout = |s: &Snapshot| -> Layout {
        let mut v: Layout = s
            .segments
            .iter()
            .filter(|seg| seg.device == device)
            .map(|seg| {
                let mut addr = seg.address;
                let blocks = seg
                    .blocks
                    .iter()
                    .map(|b| {
                        let t = (addr, b.size, b.state.is_active());
                        addr += b.size;
                        t
                    })
                    .collect();
                (seg.address, seg.total_size, blocks)
            })
            .collect();
        if !v.is_sorted() {
            v.sort();
        }
        v
    };
    layout(a) == layout(b)
}
