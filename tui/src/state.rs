//! The dashboard's state model: everything the views show, with no ratatui type in sight
//! (the tokio-console split: `state/` is data, `view/` renders it).
//!
//! A [`State`] is fed by small adapters, one per source:
//! - [`from_snapshot`]: a [`Snapshot`](allocview_alloc::snapshot::Snapshot) at a chosen trace
//!   event (post-mortem, `allocview open`), rebuilt by [`timetravel`];
//! - [`from_agent`]: an `AgentState` (live: embedded in `allocview demo`, or received by an
//!   attach client), including the process's [`host`] heap when an instrumented global
//!   allocator publishes it.
//!
//! Derived tables (pools, streams) are computed from the segment list here, so the views stay
//! pure render functions and the numbers are tested without a terminal.

pub mod context;
pub mod filter;
pub mod from_agent;
pub mod from_snapshot;
pub mod histogram;
pub mod host;
pub mod oom;
pub mod passing_note;
pub mod pools;
pub mod streams;
pub mod timeline;
pub mod timetravel;
pub mod ui;

use std::sync::{Arc, Mutex};

use allocview_alloc::caching::stats::{DeviceStats, StatType};
use allocview_alloc::snapshot::{BlockState, SegmentInfo, TraceEntry};

pub use histogram::{Bucket, HistogramSummary, HistogramUnit};
pub use host::{HostHeap, HostSample};
pub use oom::OomReport;
pub use pools::{PoolKind, PoolRow};
pub use streams::StreamRow;
pub use timeline::{Sample, Timeline};
pub use ui::{UiState, View};

/// Where the data comes from and how fresh it is: the header's first words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Receiving updates.
    Live,
    /// Updates paused by the user (`p`).
    Paused,
    /// Lost the agent; reconnect attempt number n.
    Reconnecting(u32),
    /// Connected, but no update came for this many seconds: the process is stopped or stuck
    /// (the agent sends one every tick), and the figures shown are from before.
    Stalled(u64),
    /// A snapshot file at one event of its trace.
    File {
        /// File name (no folder).
        name: String,
        /// Events applied so far (0 = the state before the first trace entry).
        event: usize,
        /// Events in the trace.
        total: usize,
    },
}

/// Facts about the watched process and device, shown in the header.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Source {
    /// Process id of the watched program, when known.
    pub pid: Option<u32>,
    /// When the watched program's agent started (ns since the Unix epoch), when known: with
    /// the pid, which process this is (a restarted one in a container keeps its pid).
    pub started_ns: Option<u64>,
    /// Program name (`train.py`, `allocview demo`), when known.
    pub program: Option<String>,
    /// Device index.
    pub device: i32,
    /// Device name (`H100`, `simulated`), when known.
    pub device_name: Option<String>,
    /// Total device memory, when known.
    pub total_memory: Option<u64>,
    /// Free device memory, when known.
    pub device_free: Option<u64>,
    /// Memory fraction limit applied by the allocator (1.0 = none).
    pub memory_fraction: Option<f64>,
    /// Update rate of the source in Hz, when live.
    pub rate_hz: Option<f64>,
    /// Events the agent dropped because its channel was full.
    pub dropped: u64,
    /// Times the agent or client had to resynchronise from a full snapshot.
    pub resyncs: u64,
    /// Trace entries lost to the history ring overflowing.
    pub trace_overflow: u64,
}

/// Everything the dashboard shows, from any source.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// Live, paused, reconnecting or a file at an event.
    pub mode: Mode,
    /// Process and device facts.
    pub source: Source,
    /// The allocator's counters (PyTorch's `memory_stats()`).
    pub stats: DeviceStats,
    /// Segments of the shown device, in address order.
    pub segments: Vec<SegmentInfo>,
    /// Per-stream usage (derived from the segments when the source has no better figures).
    pub streams: Vec<StreamRow>,
    /// Usage over time.
    pub timeline: Timeline,
    /// Histograms (size, lifetime, latency), grouped.
    pub histograms: Vec<HistogramSummary>,
    /// Recent trace entries, oldest first (live: the last events; file: the whole trace).
    pub trace: Arc<[TraceEntry]>,
    /// Index into [`State::trace`] of the current event in file mode (entries before it have
    /// happened).
    pub trace_cursor: Option<usize>,
    /// Every OOM, oldest first (live: those the agent still keeps, see
    /// [`allocview_agent::state::OOM_KEEP_FIRST`]).
    pub ooms: Vec<OomReport>,
    /// OOMs the agent counted in the process, kept or not, on every device (0 where no agent
    /// counts them: a file).
    pub ooms_total: u64,
    /// Where `s` last saved a snapshot, or a message for the status line.
    pub status: Option<String>,
    /// The process's host (CPU) heap, when its global allocator publishes events.
    pub host: Option<HostHeap>,
    /// The rows [`State::trace_rows`] gave last, for the filter it was given.
    pub trace_rows_memo: TraceRowsMemo,
}

/// The trace rows of the last filter asked for: a filter that searches stack frames reads
/// every frame of every entry, and the dashboard asks for the rows on each key and draw.
/// Tied to the trace it was computed on (which it holds, so that its address is not reused).
/// Clones share it: the states a file's time travel makes, one per event, share one trace.
#[derive(Clone, Default)]
pub struct TraceRowsMemo(Arc<Mutex<Option<MemoizedRows>>>);

impl PartialEq for TraceRowsMemo {
    /// Always equal: a memo is no part of what a state shows.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for TraceRowsMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TraceRowsMemo")
    }
}

/// The rows of `filter` over `trace`.
struct MemoizedRows {
    filter: filter::TraceFilter,
    trace: Arc<[TraceEntry]>,
    rows: Arc<[usize]>,
}

impl Default for State {
    fn default() -> Self {
        State {
            mode: Mode::Live,
            source: Source::default(),
            stats: DeviceStats::default(),
            segments: Vec::new(),
            streams: Vec::new(),
            timeline: Timeline::default(),
            histograms: Vec::new(),
            trace: Arc::from(Vec::new()),
            trace_cursor: None,
            ooms: Vec::new(),
            ooms_total: 0,
            status: None,
            host: None,
            trace_rows_memo: TraceRowsMemo::default(),
        }
    }
}

/// The fragmentation figures of the overview.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fragmentation {
    /// Reserved but not allocated (cached by the allocator).
    pub cached_free: u64,
    /// Largest free block in any segment.
    pub largest_free: u64,
    /// Free bytes inside segments that also hold active blocks (cannot be released).
    /// Expandable segments strand nothing: their free pages are unmapped one by one (as
    /// `summary` and the pools' inactive-split figures count them).
    pub stranded: u64,
}

impl State {
    /// Reserved, allocated and free figures over the segments, and the largest free block.
    pub fn fragmentation(&self) -> Fragmentation {
        let mut f = Fragmentation::default();
        for seg in &self.segments {
            let has_active = !seg.is_expandable && seg.blocks.iter().any(|b| b.state.is_active());
            for b in seg
                .blocks
                .iter()
                .filter(|b| b.state == BlockState::Inactive)
            {
                f.cached_free += b.size;
                f.largest_free = f.largest_free.max(b.size);
                if has_active {
                    f.stranded += b.size;
                }
            }
        }
        f
    }

    /// The per-stream table: the source's own when it has one, else derived from segments.
    pub fn stream_rows(&self) -> Vec<StreamRow> {
        if self.streams.is_empty() {
            streams::from_segments(&self.segments)
        } else {
            self.streams.clone()
        }
    }

    /// The pool table derived from the segments.
    pub fn pool_rows(&self) -> Vec<PoolRow> {
        let max_split =
            (self.stats.max_split_size >= 0).then_some(self.stats.max_split_size as u64);
        pools::from_segments(&self.segments, max_split)
    }

    /// Indices of the segments the segment view lists under `filter`: largest first, then by
    /// address.
    pub fn segment_order(&self, filter: ui::SegmentFilter) -> Vec<usize> {
        use allocview_alloc::snapshot::SegmentType;
        let mut idx: Vec<usize> = (0..self.segments.len())
            .filter(|&i| match filter {
                ui::SegmentFilter::All => true,
                ui::SegmentFilter::Large => self.segments[i].segment_type == SegmentType::Large,
                ui::SegmentFilter::Small => self.segments[i].segment_type == SegmentType::Small,
            })
            .collect();
        idx.sort_unstable_by_key(|&i| {
            let s = &self.segments[i];
            (std::cmp::Reverse(s.total_size), s.address)
        });
        idx
    }

    /// The segment view's list ([`segment_order`](State::segment_order) under its filter) and
    /// its selected row: `ui.segment_row` clamped to the list (0 when the list is empty).
    pub fn segment_selection(&self, ui: &ui::UiState) -> (Vec<usize>, usize) {
        let order = self.segment_order(ui.segment_filter);
        let row = ui.segment_row.min(order.len().saturating_sub(1));
        (order, row)
    }

    /// The index in `segments` of the segment the segment view has selected (its row clamped
    /// to the filtered list), if the list is not empty.
    pub fn selected_segment(&self, ui: &ui::UiState) -> Option<usize> {
        let (order, row) = self.segment_selection(ui);
        order.get(row).copied()
    }

    /// The index of the segment holding `addr`, if any.
    pub fn find_segment(&self, addr: u64) -> Option<usize> {
        self.segments
            .iter()
            .position(|s| addr >= s.address && addr < s.address.saturating_add(s.total_size))
    }

    /// The segment index and block index holding `addr`, if any.
    pub fn find_block(&self, addr: u64) -> Option<(usize, usize)> {
        let seg = self.find_segment(addr)?;
        let block = self.segments[seg]
            .blocks
            .iter()
            .position(|b| addr >= b.address && addr < b.address + b.size)
            .unwrap_or(0);
        Some((seg, block))
    }

    /// Indices of the trace entries that pass `filter` (computed once per filter and trace).
    pub fn trace_rows(&self, filter: &filter::TraceFilter) -> Arc<[usize]> {
        let mut memo = self
            .trace_rows_memo
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(m) = memo.as_ref()
            && m.filter == *filter
            && Arc::ptr_eq(&m.trace, &self.trace)
        {
            return Arc::clone(&m.rows);
        }
        let rows: Arc<[usize]> = (0..self.trace.len())
            .filter(|&i| filter.matches(&self.trace[i]))
            .collect();
        *memo = Some(MemoizedRows {
            filter: filter.clone(),
            trace: Arc::clone(&self.trace),
            rows: Arc::clone(&rows),
        });
        rows
    }

    /// The trace row selected by default: in file mode the last entry applied, else the newest.
    pub fn default_trace_row(&self, rows: &[usize]) -> usize {
        match self.trace_cursor {
            Some(cursor) => rows.iter().rposition(|&i| i < cursor).unwrap_or(0),
            None => rows.len().saturating_sub(1),
        }
    }

    /// Whether there is anything of a device to show: counters, segments or samples (a
    /// process whose only allocator is an instrumented host heap has none).
    pub fn has_device_data(&self) -> bool {
        self.source.total_memory.is_some()
            || !self.segments.is_empty()
            || !self.timeline.samples.is_empty()
            || self.stats.num_device_alloc > 0
            || self.stats.allocation.get(StatType::All).allocated > 0
    }

    /// Whether the process is watched for its host heap only: a host heap and nothing of a
    /// device (the device views have nothing to show; the overview shows the host heap).
    pub fn is_host_only(&self) -> bool {
        self.host.is_some() && !self.has_device_data()
    }

    /// Whether the state is a snapshot file's (time travel), not a live process's.
    pub fn is_file(&self) -> bool {
        matches!(self.mode, Mode::File { .. })
    }

    /// Whether the picture is known to be partial (drops, resyncs or a lost trace).
    pub fn is_partial(&self) -> bool {
        self.source.dropped > 0 || self.source.resyncs > 0
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Hand-built states for the unit tests of state and views.

    use std::sync::Arc;

    use allocview_alloc::snapshot::{BlockInfo, Frame, SegmentType};

    use super::*;

    /// A block.
    pub fn block(address: u64, size: u64, requested: u64, state: BlockState) -> BlockInfo {
        BlockInfo {
            address,
            size,
            requested_size: requested,
            state,
            frames: Arc::from(vec![Frame {
                name: "step 41 forward".into(),
                filename: "train.py".into(),
                line: 130,
            }]),
            history: Vec::new(),
        }
    }

    /// A segment tiled by `blocks`.
    pub fn segment(
        address: u64,
        stream: u64,
        kind: SegmentType,
        blocks: Vec<BlockInfo>,
    ) -> SegmentInfo {
        SegmentInfo::tiled(address, stream, kind, blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocview_alloc::snapshot::TraceAction;

    #[test]
    fn trace_rows_are_filtered_once_per_filter_and_trace() {
        let entries: Vec<TraceEntry> = (0..10)
            .map(|i| TraceEntry::new(TraceAction::Alloc, 0x1000 * i, 512 * (i % 3 + 1), i % 2))
            .collect();
        let mut state = State {
            trace: Arc::from(entries.clone()),
            ..State::default()
        };
        let s1 = filter::TraceFilter::parse("s1").unwrap();
        let first = state.trace_rows(&s1);
        assert_eq!(&*first, &[1, 3, 5, 7, 9]);
        // The same filter over the same trace: the same rows, not filtered again. A copy of
        // the state (time travel's next event) shares them.
        assert!(Arc::ptr_eq(&first, &state.trace_rows(&s1)));
        assert!(Arc::ptr_eq(&first, &state.clone().trace_rows(&s1)));
        // Another filter, or another trace (even one equal to it), is filtered anew.
        let big = filter::TraceFilter::parse(">1KiB").unwrap();
        assert_eq!(&*state.trace_rows(&big), &[2, 5, 8]);
        assert!(!Arc::ptr_eq(&first, &state.trace_rows(&s1)));
        let again = state.trace_rows(&s1);
        state.trace = Arc::from(entries[..4].to_vec());
        assert_eq!(&*state.trace_rows(&s1), &[1, 3]);
        assert!(!Arc::ptr_eq(&again, &state.trace_rows(&s1)));
    }
}
