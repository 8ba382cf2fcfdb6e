//! Adapter from the agent's [`AgentState`] (embedded in `allocview demo`, or rebuilt by an
//! attach client) to the dashboard [`State`].
//!
//! The agent sends figures; the adapter keeps the little history needed for rates
//! (allocations per second per stream, between two states) and for the host heap's chart
//! (the agent keeps no samples for it), and maps the agent's types onto
//! the dashboard's. OOMs are diagnosed with the agent's own rules
//! ([`allocview_agent::diagnosis`]), so the dashboard and `allocview summary` agree.

use std::collections::HashMap;
use std::sync::Arc;

use allocview_agent::diagnosis::{OomFacts, diagnose};
use allocview_agent::state::{
    AgentState, DeviceState, HistogramSet, NS_PER_US, OomRecord, PoolKey, RecentEvent,
};
use allocview_alloc::snapshot::{
    Frames, SegmentInfo, Snapshot, TraceAction, TraceEntry, no_frames,
};

use super::histogram::{Bucket, HistogramSummary, HistogramUnit, log2_buckets, log2_index};
use super::host::{HostHeap, HostSample};
use super::oom::OomReport;
use super::streams::StreamRow;
use super::timeline::{Sample, Timeline};
use super::{Mode, Source, State, TraceRowsMemo};

/// Nanoseconds per second.
const NS_PER_S: f64 = 1e9;

/// Facts the agent does not carry, supplied by whoever runs the dashboard.
#[derive(Debug, Clone, Default)]
pub struct LiveInfo {
    /// Device name (`simulated`, `H100`).
    pub device_name: Option<String>,
    /// Update rate of the source in Hz.
    pub rate_hz: Option<f64>,
    /// Connection mode (`Live`, `Paused`, `Reconnecting`).
    pub mode: Option<Mode>,
    /// Free device memory, when the runner can ask the device.
    pub device_free: Option<u64>,
}

/// Turns successive agent states into dashboard states.
#[derive(Debug, Default)]
pub struct AgentAdapter {
    /// Per stream: (time of the previous state, allocations then).
    prev_allocs: HashMap<u64, (u64, u64)>,
    /// Per stream: the last computed rate.
    rates: HashMap<u64, f64>,
    /// The host heap with the samples taken so far (the agent keeps none for it).
    host: Option<HostHeap>,
}

/// A log2 bucket list from the agent's `(upper_bound, count)` pairs of non-empty buckets,
/// the empty ones between filled in ([`log2_buckets`]).
fn buckets(pairs: &[(u64, u64)]) -> Vec<Bucket> {
    log2_buckets(pairs.iter().map(|&(hi, count)| (log2_index(hi), count)))
}

fn summaries(set: &HistogramSet, group: &str, out: &mut Vec<HistogramSummary>) {
    for (metric, h, unit) in [
        ("size", &set.size, HistogramUnit::Bytes),
        ("lifetime", &set.lifetime, HistogramUnit::Nanos),
        ("latency", &set.latency, HistogramUnit::Nanos),
    ] {
        out.push(HistogramSummary {
            metric: metric.to_string(),
            group: group.to_string(),
            unit,
            buckets: buckets(&h.buckets),
            count: h.count,
            p50: h.p50,
            p90: h.p90,
            p99: h.p99,
            max: h.max,
        });
    }
}

/// The trace entries of a recent event, as PyTorch records them: one for most events, two for
/// a `free` (a `free_requested` and a `free_completed` at one time), none for counter-only
/// events such as retries; with `frames`, the frames of the event's context id.
pub fn trace_entries<'a>(
    e: &'a RecentEvent,
    frames: Option<&'a Frames>,
) -> impl Iterator<Item = TraceEntry> + 'a {
    let actions = match e.action.as_str() {
        "free" => [
            Some(TraceAction::FreeRequested),
            Some(TraceAction::FreeCompleted),
        ],
        name => [TraceAction::parse(name), None],
    };
    actions.into_iter().flatten().map(move |action| {
        // PyTorch records a block's requested size on its alloc and on both halves of its
        // free; segment events carry the segment's size.
        let size = match action {
            TraceAction::Alloc | TraceAction::FreeRequested | TraceAction::FreeCompleted
                if e.requested != 0 =>
            {
                e.requested
            }
            _ => e.size,
        };
        let mut entry = TraceEntry {
            time_us: Some((e.time_ns / NS_PER_US) as i64),
            ..TraceEntry::new(action, e.addr, size, e.stream)
        };
        if let Some(f) = frames {
            entry.frames = Arc::clone(f);
        }
        entry
    })
}

/// Gives the active blocks of `segments` the frames of their allocation when it is among the
/// device's recent events: the newest `alloc` at the block's address, of its size, not freed
/// since, whose context the agent named. This is current at once; the frames a periodic
/// snapshot brings ([`SnapshotFrames::fill_blocks`]) only fill the blocks left without.
pub fn fill_block_frames_from_recent(segments: &mut [SegmentInfo], d: &DeviceState) {
    let mut live: HashMap<u64, (u64, &Frames)> = HashMap::new();
    for e in &d.recent {
        match e.action.as_str() {
            "alloc" => match d.context_frames(e.context) {
                Some(f) => {
                    live.insert(e.addr, (e.size, f));
                }
                None => {
                    live.remove(&e.addr);
                }
            },
            "free_completed" | "free" => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    if live.is_empty() {
        return;
    }
    for b in segments
        .iter_mut()
        .flat_map(|seg| &mut seg.blocks)
        .filter(|b| b.state.is_active())
    {
        if let Some(&(size, f)) = live.get(&b.address)
            && size == b.size
        {
            b.frames = Arc::clone(f);
        }
    }
}

/// The OOM report of an agent record.
pub fn oom_report(o: &OomRecord) -> OomReport {
    let mut d = diagnose(&OomFacts::from_dumped(&o.dumped(), o.total_memory));
    if o.event_lost {
        d.explanation = "the request's size was lost with its event, so exhaustion and \
                         fragmentation cannot be told apart; the figures above are from the \
                         resync after it"
            .into();
    }
    // Prefer the pickle (what PyTorch's viewers read); both hold the same snapshot.
    let dump = o
        .dump_paths
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "pickle"))
        .or(o.dump_paths.first())
        .map(|p| p.display().to_string());
    OomReport {
        number: o.index,
        time_us: Some((o.time_ns / NS_PER_US) as i64),
        device: o.device,
        stream: o.stream,
        requested: o.requested,
        rounded: o.rounded,
        segment_size: None,
        device_total: (o.total_memory > 0).then_some(o.total_memory),
        device_free: (!o.event_lost).then_some(o.device_free),
        allocated: o.allocated,
        reserved: o.reserved,
        largest_free: o.largest_free_block,
        diagnosis: d.kind,
        explanation: d.explanation,
        what_if: Vec::new(),
        dump_path: dump,
        dump_error: o.dump_error.clone(),
        dump_pending: o.dump_pending,
        event_lost: o.event_lost,
        frames: no_frames(),
        trace_index: None,
    }
}

/// The frames of an allocator's own snapshot, indexed once when the snapshot arrives, for
/// joining onto every live state until the next one: the agent's mirror is built from compact
/// events, which carry no frames, and the allocator's snapshot has them.
///
/// - **Blocks** are matched by address and size (active blocks only).
/// - **Trace entries**: each event and the trace entry the allocator recorded for it (in the
///   snapshot's `device_traces`) share the action, the address and the call's clock reading,
///   so they are matched on those three; the entry's user metadata comes along.
#[derive(Debug, Clone, Default)]
pub struct SnapshotFrames {
    /// Frames of the snapshot's active blocks, by (address, size).
    blocks: HashMap<(u64, u64), Frames>,
    /// Frames and user metadata of the snapshot's trace entries, by (action, address, time).
    traces: HashMap<(TraceAction, u64, i64), (Frames, Option<String>)>,
}

impl SnapshotFrames {
    /// Indexes the active blocks of `snapshot` that carry frames, and its trace entries that
    /// carry frames or user metadata.
    pub fn new(snapshot: &Snapshot) -> SnapshotFrames {
        let mut blocks = HashMap::new();
        for seg in &snapshot.segments {
            for b in seg
                .blocks
                .iter()
                .filter(|b| b.state.is_active() && !b.frames.is_empty())
            {
                blocks.insert((b.address, b.size), Arc::clone(&b.frames));
            }
        }
        let mut traces = HashMap::new();
        for e in snapshot.device_traces.iter().flatten() {
            if let Some(t) = e.time_us
                && (!e.frames.is_empty() || e.user_metadata.is_some())
            {
                traces.insert(
                    (e.action, e.addr, t),
                    (Arc::clone(&e.frames), e.user_metadata.clone()),
                );
            }
        }
        SnapshotFrames { blocks, traces }
    }

    /// Blocks indexed.
    pub fn indexed_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Trace entries indexed.
    pub fn indexed_traces(&self) -> usize {
        self.traces.len()
    }

    /// Joins the frames onto a dashboard state: its segments' blocks and its trace entries.
    pub fn apply(&self, state: &mut State) {
        self.fill_blocks(&mut state.segments);
        self.fill_trace(&mut state.trace);
    }

    /// Sets the frames of the blocks in `segments` that are not inactive, have none yet (the
    /// recent events' are newer than the snapshot's, see [`fill_block_frames_from_recent`])
    /// and match an indexed block by address and size.
    pub fn fill_blocks(&self, segments: &mut [SegmentInfo]) {
        if self.blocks.is_empty() {
            return;
        }
        for seg in segments {
            for b in seg
                .blocks
                .iter_mut()
                .filter(|b| b.state.is_active() && b.frames.is_empty())
            {
                if let Some(f) = self.blocks.get(&(b.address, b.size)) {
                    b.frames = Arc::clone(f);
                }
            }
        }
    }

    /// The indexed frames and user metadata for `e`, when it has no frames of its own.
    fn trace_context(&self, e: &TraceEntry) -> Option<&(Frames, Option<String>)> {
        if !e.frames.is_empty() {
            return None;
        }
        e.time_us
            .and_then(|t| self.traces.get(&(e.action, e.addr, t)))
    }

    /// Fills the frames (and user metadata) of the entries of `trace` that have none. Entries
    /// the snapshot's trace ring does not hold (newer than it, or fallen out) stay as they are.
    /// The entries are updated in place, copied first only when something matches and `trace`
    /// is shared.
    pub fn fill_trace(&self, trace: &mut Arc<[TraceEntry]>) {
        if self.traces.is_empty() {
            return;
        }
        let Some(first) = trace.iter().position(|e| self.trace_context(e).is_some()) else {
            return;
        };
        // Unique (as the adapter makes it): in place; shared: copied once. Entries before the
        // first match were looked up already.
        for e in &mut Arc::make_mut(trace)[first..] {
            if let Some((frames, meta)) = self.trace_context(e) {
                e.frames = Arc::clone(frames);
                if e.user_metadata.is_none() {
                    e.user_metadata = meta.clone();
                }
            }
        }
    }
}

impl AgentAdapter {
    /// A fresh adapter.
    pub fn new() -> AgentAdapter {
        AgentAdapter::default()
    }

    fn streams(&mut self, d: &DeviceState, now_ns: u64, started_ns: u64) -> Vec<StreamRow> {
        d.streams
            .iter()
            .map(|s| {
                // The rate between two states; before a second state, the average since the
                // process started.
                let (t, n) = self
                    .prev_allocs
                    .get(&s.stream)
                    .copied()
                    .unwrap_or((started_ns, 0));
                if t > 0 && now_ns > t && s.allocs >= n {
                    let rate = (s.allocs - n) as f64 / ((now_ns - t) as f64 / NS_PER_S);
                    self.rates.insert(s.stream, rate);
                }
                if self
                    .prev_allocs
                    .get(&s.stream)
                    .is_none_or(|&(t, _)| now_ns > t)
                {
                    self.prev_allocs.insert(s.stream, (now_ns, s.allocs));
                }
                StreamRow {
                    stream: s.stream,
                    allocated: s.allocated,
                    active: s.active,
                    pending_free: s.active.saturating_sub(s.allocated),
                    reserved: s.reserved,
                    peak: Some(s.peak_allocated),
                    allocs_per_s: self.rates.get(&s.stream).copied(),
                    idle_s: (s.last_event_ns > 0 && now_ns >= s.last_event_ns)
                        .then(|| (now_ns - s.last_event_ns) as f64 / NS_PER_S),
                }
            })
            .collect()
    }

    /// The dashboard state for `device` of `agent` (the first device when it is absent).
    pub fn state(&mut self, agent: &AgentState, device: i32, info: &LiveInfo) -> State {
        let empty = DeviceState::default();
        let d = agent
            .device(device)
            .or_else(|| agent.devices.first())
            .unwrap_or(&empty);
        let now = agent.time_ns;
        let t0 = agent.process.started_ns;
        let x = |t: u64| t.saturating_sub(t0) as f64 / NS_PER_S;
        let mut timeline = Timeline {
            origin_us: (t0 > 0).then_some((t0 / NS_PER_US) as i64),
            ..Timeline::default()
        };
        // A sample timed before the process started summarizes no reading of its own (an
        // older agent placed coarse windows there, holding the maximum seen since); drawn at
        // x = 0 it would be a false spike and set the chart's scale, so it is left out.
        for s in d.timeline.iter().filter(|s| s.time_ns >= t0) {
            timeline.push(Sample {
                x: x(s.time_ns),
                reserved: s.reserved,
                allocated: s.allocated,
                active: s.active,
            });
        }
        // An OOM of no known device (its event was dropped) shows on every device.
        let on_device = |o: &&OomRecord| o.device == d.device || o.device < 0;
        let (ooms, oom_x): (Vec<OomReport>, Vec<f64>) = agent
            .ooms
            .iter()
            .filter(on_device)
            .map(|o| (oom_report(o), x(o.time_ns)))
            .unzip();
        timeline.ooms = oom_x;
        // The newest sample holds until the agent's present: the chart's "now".
        if now > t0 {
            timeline.end = timeline.end.max(x(now));
        }
        let mut histograms = Vec::new();
        summaries(&d.histograms.all, "all", &mut histograms);
        for p in &d.histograms.by_pool {
            let name = match p.pool {
                PoolKey::Small => "small pool".to_string(),
                PoolKey::Large => "large pool".to_string(),
                PoolKey::Private(id) => format!("private pool {id}"),
            };
            summaries(&p.set, &name, &mut histograms);
        }
        for s in &d.histograms.by_stream {
            summaries(&s.set, &format!("stream {}", s.stream), &mut histograms);
        }
        let trace: Vec<TraceEntry> = d
            .recent
            .iter()
            .flat_map(|e| trace_entries(e, d.context_frames(e.context)))
            .collect();
        let mut segments = d.segments.clone();
        fill_block_frames_from_recent(&mut segments, d);
        let total = (d.total_memory > 0).then_some(d.total_memory);
        let host = agent.host.as_ref().map(|h| {
            let heap = self.host.get_or_insert_with(HostHeap::default);
            heap.bytes = h.bytes;
            heap.allocations = h.allocations;
            heap.push_sample(HostSample {
                x: x(now),
                bytes: h.bytes.current.max(0) as u64,
            });
            heap.clone()
        });
        State {
            mode: info.mode.clone().unwrap_or(if agent.pipeline.paused {
                Mode::Paused
            } else {
                Mode::Live
            }),
            source: Source {
                pid: Some(agent.process.pid),
                started_ns: Some(agent.process.started_ns).filter(|&t| t > 0),
                program: Some(agent.process.name.clone()).filter(|n| !n.is_empty()),
                device: d.device,
                device_name: info.device_name.clone(),
                total_memory: total,
                device_free: info.device_free,
                memory_fraction: match (d.allowed_memory, total) {
                    (Some(a), Some(t)) if t > 0 => Some(a as f64 / t as f64),
                    _ => Some(1.0).filter(|_| total.is_some()),
                },
                rate_hz: info.rate_hz,
                dropped: agent.pipeline.dropped_total,
                resyncs: agent.pipeline.resyncs,
                trace_overflow: 0,
            },
            stats: d.stats.clone(),
            streams: self.streams(d, now, t0),
            segments,
            timeline,
            histograms,
            trace: Arc::from(trace),
            trace_cursor: None,
            ooms,
            ooms_total: agent.pipeline.ooms_total,
            status: None,
            host,
            trace_rows_memo: TraceRowsMemo::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocview_agent::state::{StreamUsage, UsageSample};
    use allocview_alloc::snapshot::BlockState;

    /// A recent small-pool event on stream 3: a 1024-byte block for a 1000-byte request.
    fn recent(action: &str, addr: u64, time_ns: u64) -> RecentEvent {
        RecentEvent {
            seq: 1,
            time_ns,
            action: action.into(),
            addr,
            size: 1024,
            requested: 1000,
            stream: 3,
            pool: PoolKey::Small,
            flags: 0,
            latency_ns: 0,
            context: 0,
        }
    }

    /// [`recent`] carrying the allocator's context id `context` (0: none).
    fn with_context(action: &str, addr: u64, time_ns: u64, context: u32) -> RecentEvent {
        RecentEvent {
            context,
            ..recent(action, addr, time_ns)
        }
    }

    /// An agent whose process started at `started_ns`, its clock at `time_ns`.
    fn agent_at(started_ns: u64, time_ns: u64) -> AgentState {
        let mut a = AgentState::default();
        a.process.started_ns = started_ns;
        a.time_ns = time_ns;
        a
    }

    /// A usage sample at `time_ns` with allocated, reserved and active all `v`.
    fn sample(time_ns: u64, v: u64) -> UsageSample {
        UsageSample {
            time_ns,
            allocated: v,
            reserved: v,
            active: v,
        }
    }

    /// A one-frame stack: the tag `name` (`step 1 forward`).
    fn tag(name: &str) -> Frames {
        Arc::from(vec![allocview_alloc::snapshot::Frame::new(name, "??", 0)])
    }

    /// A small-pool segment at 0x1000 of blocks of `size` bytes for `requested`, at the given
    /// addresses and states, without frames (as the agent's mirror sends them).
    fn bare_segment(size: u64, requested: u64, blocks: &[(u64, BlockState)]) -> SegmentInfo {
        use crate::state::fixtures::segment;
        let blocks = blocks
            .iter()
            .map(|&(address, state)| {
                allocview_alloc::snapshot::BlockInfo::new(address, size, requested, state)
            })
            .collect();
        segment(
            0x1000,
            0,
            allocview_alloc::snapshot::SegmentType::Small,
            blocks,
        )
    }

    /// One-tag contexts by id, as the agent names them.
    fn named(pairs: &[(u32, &str)]) -> Vec<allocview_agent::state::ContextFrames> {
        pairs
            .iter()
            .map(|&(id, name)| allocview_agent::state::ContextFrames {
                id,
                frames: tag(name),
            })
            .collect()
    }

    #[test]
    fn samples_timed_before_the_process_started_are_not_charted() {
        let mut a = agent_at(10_000_000_000, 12_000_000_000);
        let mut d = DeviceState::default();
        // Coarse windows opened before the start, holding the maximum seen since.
        d.timeline.push(sample(4_400_000_000, 10 << 30));
        d.timeline.push(sample(9_400_000_000, 10 << 30));
        d.timeline.push(sample(10_150_000_000, 2 << 30));
        d.timeline.push(sample(11_150_000_000, 8 << 30));
        a.devices.push(d);
        let s = AgentAdapter::new().state(&a, 0, &LiveInfo::default());
        let xs: Vec<f64> = s.timeline.samples.iter().map(|s| s.x).collect();
        assert_eq!(xs, vec![0.15, 1.15]);
        assert_eq!(s.timeline.max_y(), 8 << 30);
    }

    /// The time column of the trace view's row for the event at `addr`.
    fn trace_time_of(state: &State, addr: u64) -> String {
        let text = crate::view::testing::view_text(crate::state::View::Trace, state, 100, 12);
        let addr = crate::units::address(addr);
        let row = text
            .lines()
            .find(|r| r.contains(&addr))
            .unwrap_or_else(|| panic!("no row for {addr}"));
        // Border, marker, then the right-aligned time.
        row.chars()
            .skip(2)
            .take(8)
            .collect::<String>()
            .trim()
            .to_string()
    }

    #[test]
    fn live_trace_times_count_from_the_process_start_and_keep_as_older_events_roll_out() {
        let mut a = agent_at(10_000_000_000, 80_000_000_000);
        let mut d = DeviceState::default();
        d.timeline.push(sample(10_500_000_000, 0));
        d.timeline.push(sample(76_000_000_000, 0));
        d.recent.push(recent("alloc", 0x1000, 60_000_000_000));
        d.recent.push(recent("alloc", 0x2000, 76_250_000_000));
        a.devices.push(d);
        let mut ad = AgentAdapter::new();
        let s = ad.state(&a, 0, &LiveInfo::default());
        // The chart's x is seconds since the process start; the trace counts from there too.
        assert_eq!(s.timeline.samples[0].x, 0.5);
        assert_eq!(trace_time_of(&s, 0x2000), "66.250 s");
        assert_eq!(trace_time_of(&s, 0x1000), "50.000 s");
        // The chart spans from the first sample to the agent's clock (70 s after the start),
        // labelled back from now.
        assert_eq!(s.timeline.x_range(), (0.5, 70.0));
        let text = crate::view::testing::view_text(crate::state::View::Overview, &s, 100, 30);
        assert!(text.contains("-1m 10s") && text.contains("now"), "{text}");
        // The older event rolls out of the recent tail: the newer one keeps its time.
        a.devices[0].recent.remove(0);
        let s = ad.state(&a, 0, &LiveInfo::default());
        assert_eq!(trace_time_of(&s, 0x2000), "66.250 s");
    }

    #[test]
    fn agent_figures_map_onto_the_dashboard() {
        let mut a = agent_at(1_000_000_000, 3_000_000_000);
        a.process.pid = 7;
        a.process.name = "demo".into();
        a.pipeline.dropped_total = 4;
        let mut d = DeviceState {
            device: 0,
            total_memory: 16 << 30,
            ..DeviceState::default()
        };
        d.timeline.push(UsageSample {
            time_ns: 2_000_000_000,
            allocated: 10,
            reserved: 20,
            active: 15,
        });
        d.streams.push(StreamUsage {
            stream: 3,
            allocated: 100,
            active: 150,
            reserved: 400,
            peak_allocated: 120,
            allocs: 10,
            last_event_ns: 2_500_000_000,
        });
        d.recent.push(recent("alloc", 0x1000, 2_000_000_000));
        d.recent.push(RecentEvent {
            action: "alloc_retry".into(),
            ..d.recent[0].clone()
        });
        a.devices.push(d);
        let mut ad = AgentAdapter::new();
        let s = ad.state(&a, 0, &LiveInfo::default());
        assert_eq!(s.source.pid, Some(7));
        assert_eq!(s.source.dropped, 4);
        assert_eq!(s.timeline.samples[0].x, 1.0);
        assert_eq!(s.streams[0].pending_free, 50);
        assert_eq!(s.streams[0].idle_s, Some(0.5));
        assert_eq!(s.trace.len(), 1);
        assert_eq!(s.trace[0].size, 1000);
        // The first state gives the average since the process started.
        assert_eq!(s.streams[0].allocs_per_s, Some(5.0));
        // A second state a second later gives a rate.
        a.time_ns += 1_000_000_000;
        a.devices[0].streams[0].allocs = 30;
        let s = ad.state(&a, 0, &LiveInfo::default());
        assert_eq!(s.streams[0].allocs_per_s, Some(20.0));
        assert!(s.host.is_none());
    }

    #[test]
    fn the_host_heap_maps_over_and_is_sampled_once_per_new_state() {
        use allocview_agent::state::HostState;
        let mut a = agent_at(1_000_000_000, 2_000_000_000);
        let mut h = HostState::default();
        h.bytes.update(4096);
        h.bytes.update(1024);
        h.bytes.update(-1024);
        for n in [1, 1, -1] {
            h.allocations.update(n);
        }
        a.host = Some(h);
        let mut ad = AgentAdapter::new();
        let s = ad.state(&a, 0, &LiveInfo::default());
        assert!(!s.has_device_data());
        let heap = s.host.expect("host heap");
        assert_eq!(
            (heap.current(), heap.peak(), heap.total()),
            (4096, 5120, 5120)
        );
        assert_eq!((heap.live(), heap.allocs(), heap.frees()), (1, 2, 1));
        assert_eq!(
            heap.samples,
            vec![HostSample {
                x: 1.0,
                bytes: 4096
            }]
        );
        // The same state again adds no sample; a newer one does.
        let s = ad.state(&a, 0, &LiveInfo::default());
        assert_eq!(s.host.unwrap().samples.len(), 1);
        a.time_ns += 1_000_000_000;
        a.host.as_mut().unwrap().bytes.update(100);
        let s = ad.state(&a, 0, &LiveInfo::default());
        let samples = s.host.unwrap().samples;
        assert_eq!(samples.len(), 2);
        assert_eq!(
            samples[1],
            HostSample {
                x: 2.0,
                bytes: 4196
            }
        );
    }

    #[test]
    fn a_free_event_is_a_free_requested_and_a_free_completed_entry_and_a_retry_none() {
        let got = |action: &str| -> Vec<(TraceAction, u64, u64, Option<i64>)> {
            trace_entries(&recent(action, 0x2000, 7_000), None)
                .map(|t| (t.action, t.addr, t.size, t.time_us))
                .collect()
        };
        // Both halves carry the requested size, as in PyTorch's own traces.
        assert_eq!(
            got("free"),
            vec![
                (TraceAction::FreeRequested, 0x2000, 1000, Some(7)),
                (TraceAction::FreeCompleted, 0x2000, 1000, Some(7)),
            ]
        );
        assert_eq!(
            got("free_completed"),
            vec![(TraceAction::FreeCompleted, 0x2000, 1000, Some(7))]
        );
        assert_eq!(
            got("segment_free"),
            vec![(TraceAction::SegmentFree, 0x2000, 1024, Some(7))]
        );
        assert_eq!(
            got("alloc"),
            vec![(TraceAction::Alloc, 0x2000, 1000, Some(7))]
        );
        assert_eq!(got("alloc_retry"), vec![]);
    }

    #[test]
    fn live_trace_entries_take_the_frames_of_their_events_context_ids_at_once() {
        let a = AgentState {
            devices: vec![DeviceState {
                recent: vec![
                    with_context("alloc", 0x1000, 1_000, 7),
                    with_context("free", 0x1000, 2_000, 9),
                    with_context("alloc", 0x2000, 3_000, 8),
                    recent("alloc", 0x3000, 4_000),
                ],
                contexts: named(&[(7, "step 1 forward"), (9, "step 1 optimizer")]),
                ..DeviceState::default()
            }],
            ..AgentState::default()
        };
        let s = AgentAdapter::new().state(&a, 0, &LiveInfo::default());
        let names: Vec<Option<&str>> = s
            .trace
            .iter()
            .map(|t| t.frames.first().map(|f| f.name.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![
                Some("step 1 forward"),
                Some("step 1 optimizer"),
                Some("step 1 optimizer"),
                None, // id 8 was not named (the allocator no longer kept it)
                None,
            ]
        );
    }

    #[test]
    fn live_trace_entries_take_the_frames_of_the_allocators_matching_entries() {
        let event = |action: &str, addr: u64, time_ns: u64| RecentEvent {
            size: 512,
            requested: 500,
            stream: 0,
            ..recent(action, addr, time_ns)
        };
        let mut trace: Arc<[TraceEntry]> = Arc::from(
            [
                event("alloc", 0x1000, 5_000),
                event("alloc", 0x1000, 9_000),
                event("free_requested", 0x1000, 9_000),
            ]
            .iter()
            .flat_map(|e| trace_entries(e, None))
            .collect::<Vec<_>>(),
        );
        let tagged = |action, time_us, name: &str| TraceEntry {
            time_us: Some(time_us),
            frames: tag(name),
            ..TraceEntry::new(action, 0x1000, 512, 0)
        };
        let snap = Snapshot {
            device_traces: vec![vec![
                tagged(TraceAction::Alloc, 5, "step 1 forward"),
                tagged(TraceAction::Alloc, 9, "step 2 forward"),
            ]],
            ..Snapshot::default()
        };
        let frames = SnapshotFrames::new(&snap);
        assert_eq!(frames.indexed_traces(), 2);
        frames.fill_trace(&mut trace);
        assert_eq!(trace[0].frames[0].name, "step 1 forward");
        assert_eq!(trace[1].frames[0].name, "step 2 forward");
        // Same address and time, another action: no match.
        assert!(trace[2].frames.is_empty());
    }

    #[test]
    fn a_snapshots_frames_join_onto_blocks_and_entries_in_place_unless_the_trace_is_shared() {
        use crate::state::fixtures::{block, segment};
        use allocview_alloc::snapshot::SegmentType;
        let snap = Snapshot {
            segments: vec![segment(
                0x1000,
                0,
                SegmentType::Small,
                vec![
                    block(0x1000, 512, 500, BlockState::ActiveAllocated),
                    block(0x1200, 512, 500, BlockState::Inactive),
                ],
            )],
            device_traces: vec![vec![TraceEntry {
                time_us: Some(5),
                user_metadata: Some("phase=eval".into()),
                ..TraceEntry::new(TraceAction::Alloc, 0x1000, 500, 0)
            }]],
            ..Snapshot::default()
        };
        let frames = SnapshotFrames::new(&snap);
        assert_eq!((frames.indexed_blocks(), frames.indexed_traces()), (1, 1));
        let live = |trace: Arc<[TraceEntry]>| State {
            segments: vec![bare_segment(
                512,
                500,
                &[
                    (0x1000, BlockState::ActiveAllocated),
                    (0x1200, BlockState::Inactive),
                    (0x1400, BlockState::ActiveAllocated),
                ],
            )],
            trace,
            ..State::default()
        };
        let entries: Arc<[TraceEntry]> = Arc::from(
            [
                recent("alloc", 0x1400, 4_000),
                recent("alloc", 0x1000, 5_000),
            ]
            .iter()
            .flat_map(|e| trace_entries(e, None))
            .collect::<Vec<_>>(),
        );

        // Unique: the entries are filled where they lie.
        let mut state = live(Arc::from(entries.to_vec()));
        let before = Arc::as_ptr(&state.trace);
        frames.apply(&mut state);
        assert_eq!(Arc::as_ptr(&state.trace), before);
        let b = &state.segments[0].blocks;
        assert_eq!(b[0].frames[0].name, "step 41 forward");
        // Inactive blocks and blocks the snapshot does not hold keep no frames.
        assert!(b[1].frames.is_empty() && b[2].frames.is_empty());
        assert_eq!(state.trace[0].user_metadata, None);
        assert_eq!(state.trace[1].user_metadata.as_deref(), Some("phase=eval"));

        // Shared: the state gets a filled copy, the other holder keeps its entries.
        let mut state = live(Arc::clone(&entries));
        frames.apply(&mut state);
        assert_eq!(state.trace[1].user_metadata.as_deref(), Some("phase=eval"));
        assert_eq!(entries[1].user_metadata, None);
    }

    #[test]
    fn live_blocks_take_the_frames_of_their_allocation_among_the_recent_events() {
        use crate::state::fixtures::{block, segment};
        use allocview_alloc::snapshot::{BlockInfo, SegmentType};
        let a = AgentState {
            devices: vec![DeviceState {
                segments: vec![{
                    let mut seg = bare_segment(
                        1024,
                        1000,
                        &[
                            (0x1000, BlockState::ActiveAllocated),
                            (0x1400, BlockState::ActivePendingFree),
                            (0x1800, BlockState::ActiveAllocated),
                            (0x1c00, BlockState::Inactive),
                            (0x2000, BlockState::ActiveAllocated),
                            (0x2400, BlockState::ActiveAllocated),
                        ],
                    );
                    // Another size at the address: another block.
                    seg.blocks[5].size = 2048;
                    seg
                }],
                recent: vec![
                    // Reallocated: the newest allocation's frames.
                    with_context("alloc", 0x1000, 1, 7),
                    with_context("free", 0x1000, 2, 9),
                    with_context("alloc", 0x1000, 3, 8),
                    // Pending free: still its allocation's.
                    with_context("alloc", 0x1400, 4, 7),
                    with_context("free_requested", 0x1400, 5, 9),
                    // The newest allocation has no context: none, not an older one's.
                    with_context("alloc", 0x1800, 6, 7),
                    with_context("free_completed", 0x1800, 7, 0),
                    with_context("alloc", 0x1800, 8, 0),
                    // Freed (the block is inactive now).
                    with_context("alloc", 0x1c00, 9, 7),
                    with_context("free", 0x1c00, 10, 9),
                    // A context the agent did not name.
                    with_context("alloc", 0x2000, 11, 42),
                    // Another size at the address: another block.
                    with_context("alloc", 0x2400, 12, 7),
                ],
                contexts: named(&[
                    (7, "step 1 forward"),
                    (8, "step 2 forward"),
                    (9, "step 1 optimizer"),
                ]),
                ..DeviceState::default()
            }],
            ..AgentState::default()
        };
        let mut s = AgentAdapter::new().state(&a, 0, &LiveInfo::default());
        let names = |s: &State| -> Vec<Option<String>> {
            s.segments[0]
                .blocks
                .iter()
                .map(|b| b.frames.first().map(|f| f.name.clone()))
                .collect()
        };
        let expected = [
            Some("step 2 forward"),
            Some("step 1 forward"),
            None,
            None,
            None,
            None,
        ];
        assert_eq!(names(&s), expected.map(|n| n.map(String::from)));

        // A snapshot's frames fill only the blocks still without: the recent events are newer.
        let snap = Snapshot {
            segments: vec![segment(
                0x1000,
                0,
                SegmentType::Small,
                vec![
                    BlockInfo {
                        frames: tag("step 0 stale"),
                        ..block(0x1000, 1024, 1000, BlockState::ActiveAllocated)
                    },
                    BlockInfo {
                        frames: tag("step 0 init"),
                        ..block(0x2000, 1024, 1000, BlockState::ActiveAllocated)
                    },
                ],
            )],
            ..Snapshot::default()
        };
        SnapshotFrames::new(&snap).apply(&mut s);
        let mut expected = expected.map(|n| n.map(String::from));
        expected[4] = Some("step 0 init".into());
        assert_eq!(names(&s), expected);
    }
}
