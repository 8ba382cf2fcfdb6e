//! Deterministic states for render tests: hand-built segments, streams, timeline, histograms,
//! trace and OOMs (no clock, no randomness).

#![allow(dead_code)]

use std::sync::Arc;

use allocview::state::histogram::{HistogramUnit, Log2Histogram};
use allocview::state::{HostHeap, HostSample, Mode, OomReport, Sample, Source, State, Timeline};
use allocview_agent::diagnosis::{OomFacts, diagnose};
use allocview_alloc::caching::stats::{DeviceStats, Stat};
use allocview_alloc::snapshot::{
    BlockInfo, BlockState, Frame, SegmentInfo, SegmentType, Snapshot, TraceAction, TraceEntry,
    no_frames,
};

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

pub fn frames(tag: &str) -> Arc<[Frame]> {
    Arc::from(vec![
        Frame {
            name: tag.to_string(),
            filename: "??".into(),
            line: 0,
        },
        Frame {
            name: "forward".into(),
            filename: "/src/model.py".into(),
            line: 88,
        },
    ])
}

pub fn block(address: u64, size: u64, requested: u64, state: BlockState) -> BlockInfo {
    BlockInfo {
        address,
        size,
        requested_size: requested,
        state,
        frames: if state == BlockState::Inactive {
            no_frames()
        } else {
            frames("step 41 forward")
        },
        history: Vec::new(),
    }
}

/// A segment tiled by blocks described as (size, requested, state).
pub fn segment(
    address: u64,
    stream: u64,
    kind: SegmentType,
    parts: &[(u64, u64, BlockState)],
) -> SegmentInfo {
    let mut at = address;
    let mut blocks = Vec::new();
    for &(size, req, state) in parts {
        blocks.push(block(at, size, req, state));
        at += size;
    }
    SegmentInfo::tiled(address, stream, kind, blocks)
}

pub fn segments() -> Vec<SegmentInfo> {
    use BlockState::*;
    vec![
        segment(
            0x7f3a_2c00_0000,
            0,
            SegmentType::Large,
            &[
                (64 * MIB, 63 * MIB, ActiveAllocated),
                (16 * MIB, 16 * MIB, Inactive),
                (80 * MIB, 80 * MIB, ActiveAllocated),
                (20 * MIB, 20 * MIB, ActivePendingFree),
                (20 * MIB, 20 * MIB, Inactive),
            ],
        ),
        segment(
            0x7f3a_1800_0000,
            0,
            SegmentType::Large,
            &[(120 * MIB, 120 * MIB, ActiveAllocated)],
        ),
        segment(
            0x7f3a_1600_0000,
            1,
            SegmentType::Large,
            &[
                (3 * MIB, 3 * MIB, ActiveAllocated),
                (17 * MIB, 17 * MIB, Inactive),
            ],
        ),
        segment(
            0x7f3a_15e0_0000,
            0,
            SegmentType::Small,
            &[
                (128 * KIB, 100 * KIB, ActiveAllocated),
                (128 * KIB, 128 * KIB, Inactive),
                (256 * KIB, 256 * KIB, ActiveAllocated),
                (512 * KIB, 512 * KIB, Inactive),
                (1024 * KIB, 1000 * KIB, ActiveAllocated),
            ],
        ),
    ]
}

pub fn trace() -> Vec<TraceEntry> {
    let mut out = Vec::new();
    let t0 = 1_700_000_000_000_000i64;
    let actions = [
        (TraceAction::SegmentAlloc, 0x7f3a_2c00_0000, 200 * MIB),
        (TraceAction::Alloc, 0x7f3a_2c00_0000, 63 * MIB),
        (TraceAction::Alloc, 0x7f3a_3000_0000, 80 * MIB),
        (TraceAction::FreeRequested, 0x7f3a_3500_0000, 20 * MIB),
        (TraceAction::Alloc, 0x7f3a_15e0_0000, 100 * KIB),
        (TraceAction::FreeCompleted, 0x7f3a_15e2_0000, 128 * KIB),
        (TraceAction::Oom, 2 * GIB, 6 * GIB),
        (TraceAction::SegmentFree, 0x7f3a_0000_0000, 20 * MIB),
    ];
    for (i, &(action, addr, size)) in actions.iter().enumerate() {
        out.push(TraceEntry {
            time_us: Some(t0 + i as i64 * 12_345),
            frames: frames(&format!("step {} forward", 40 + i / 4)),
            ..TraceEntry::new(action, addr, size, (i % 3 == 2) as u64)
        });
    }
    out
}

pub fn timeline() -> Timeline {
    let mut t = Timeline::default();
    for i in 0..120u64 {
        let wave = (i % 20) * 200 * MIB;
        t.push(Sample {
            x: i as f64 * 0.5,
            reserved: 6 * GIB + (i / 20) * 256 * MIB,
            allocated: 2 * GIB + wave,
            active: 2 * GIB + wave + 64 * MIB,
        });
    }
    t.ooms.push(55.0);
    t
}

pub fn histograms() -> Vec<allocview::state::HistogramSummary> {
    let mut out = Vec::new();
    for (group, scale) in [("all", 1u64), ("small pool", 1), ("large pool", 1024)] {
        let mut size = Log2Histogram::new();
        let mut life = Log2Histogram::new();
        let mut lat = Log2Histogram::new();
        for i in 1..=500u64 {
            size.record((i * i * 37 % 100_000 + 512) * scale);
            life.record(i * 1_000_003 % 50_000_000);
            lat.record(200 + i * 13 % 5000);
        }
        out.push(size.summary("size", group, HistogramUnit::Bytes));
        out.push(life.summary("lifetime", group, HistogramUnit::Nanos));
        out.push(lat.summary("latency", group, HistogramUnit::Nanos));
    }
    out
}

pub fn oom() -> OomReport {
    let d = diagnose(&OomFacts {
        requested: 3 * GIB / 2,
        device_total: 16 * GIB,
        device_free: 900 * MIB,
        allowed_max: None,
        allocated: 12 * GIB,
        reserved: 15 * GIB,
        largest_free_block: 610 * MIB,
        stranded_in_split_segments: 2 * GIB,
    });
    OomReport {
        number: 1,
        time_us: Some(1_700_000_000_123_456),
        device: 0,
        stream: 0,
        requested: 3 * GIB / 2,
        rounded: 3 * GIB / 2,
        segment_size: Some(3 * GIB / 2),
        device_total: Some(16 * GIB),
        device_free: Some(900 * MIB),
        allocated: 12 * GIB,
        reserved: 15 * GIB,
        largest_free: 610 * MIB,
        diagnosis: d.kind,
        explanation: d.explanation,
        dump_error: None,
        dump_pending: false,
        event_lost: false,
        what_if: vec!["expandable_segments:True → no OOM, peak reserved 14.2 GiB".into()],
        dump_path: Some("allocview-dumps/oom-0001-pid4242.json".into()),
        frames: frames("step 41 forward"),
        trace_index: Some(6),
    }
}

/// A live state with a bit of everything.
pub fn live_state() -> State {
    let segments = segments();
    let snap = Snapshot {
        segments: segments.clone(),
        ..Snapshot::default()
    };
    let mut stats = DeviceStats::from_snapshot(&snap, 0, None);
    stats.allocation.0[0].allocated = 1_204_331;
    stats.num_device_alloc = 412;
    stats.num_device_free = 380;
    stats.num_alloc_retries = 2;
    stats.num_ooms = 1;
    stats.reserved_bytes.0[0].peak = (14 * GIB) as i64;
    stats.allocated_bytes.0[0].peak = (12 * GIB) as i64;
    stats.active_bytes.0[0].peak = (12 * GIB + 100 * MIB) as i64;
    State {
        mode: Mode::Live,
        source: Source {
            pid: Some(4242),
            started_ns: None,
            program: Some("train.py".into()),
            device: 0,
            device_name: Some("simulated".into()),
            total_memory: Some(16 * GIB),
            device_free: Some(9 * GIB),
            memory_fraction: Some(1.0),
            rate_hz: Some(10.0),
            dropped: 0,
            resyncs: 0,
            trace_overflow: 0,
        },
        stats,
        segments,
        streams: Vec::new(),
        timeline: timeline(),
        histograms: histograms(),
        trace: Arc::from(trace()),
        trace_cursor: None,
        ooms: vec![oom()],
        ooms_total: 1,
        status: None,
        host: None,
        trace_rows_memo: Default::default(),
    }
}

/// A host heap: 48 MiB in use (peak 64 MiB) in 1,234 live allocations, 98,765 made and
/// 97,531 freed, 3.5 GiB allocated in total; `samples` seconds of samples (a slow rise).
pub fn host_heap(samples: usize) -> HostHeap {
    HostHeap {
        bytes: Stat {
            current: (48 * MIB) as i64,
            peak: (64 * MIB) as i64,
            allocated: (3 * GIB + GIB / 2) as i64,
            freed: (3 * GIB + GIB / 2 - 48 * MIB) as i64,
        },
        allocations: Stat {
            current: 1_234,
            peak: 2_000,
            allocated: 98_765,
            freed: 97_531,
        },
        samples: (0..samples)
            .map(|i| HostSample {
                x: i as f64,
                bytes: (i as u64 % 8 + 1) * 6 * MIB,
            })
            .collect(),
    }
}

/// What an attach client sees of a Rust service whose only instrumented allocator is the
/// host heap: process facts and the host heap, no device.
pub fn host_only_state(samples: usize) -> State {
    State {
        mode: Mode::Live,
        source: Source {
            pid: Some(31337),
            program: Some("heap-service".into()),
            rate_hz: Some(10.0),
            ..Source::default()
        },
        host: Some(host_heap(samples)),
        ..State::default()
    }
}

/// Many segments, for size and speed tests.
pub fn many_segments(n: usize) -> State {
    use BlockState::*;
    let mut segs = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let k = i % 7;
        segs.push(segment(
            0x7000_0000_0000 + i * 64 * MIB,
            i % 3,
            SegmentType::Large,
            &[
                ((k + 1) * MIB, (k + 1) * MIB - 512, ActiveAllocated),
                (2 * MIB, 2 * MIB, Inactive),
                ((7 - k) * MIB + 512, 512, ActivePendingFree),
                (MIB, MIB, ActiveAllocated),
                (12 * MIB, 12 * MIB, Inactive),
            ],
        ));
    }
    State {
        segments: segs,
        ..live_state()
    }
}

fn entry(action: TraceAction, addr: u64, size: u64, stream: u64, t: i64) -> TraceEntry {
    TraceEntry {
        time_us: Some(1_700_000_000_000_000 + t * 1000),
        frames: frames(&format!("step {} forward", t / 20)),
        ..TraceEntry::new(action, addr, size, stream)
    }
}

/// A snapshot whose trace runs `rounds` rounds of a small training-like pattern (segments
/// come and go, a cross-stream free, an OOM each round) and ends with everything released,
/// so its final segment list is empty and consistent with the trace.
pub fn traced_snapshot(rounds: u64) -> Snapshot {
    use TraceAction::*;
    let mut t = Vec::new();
    let mut n = 0i64;
    let mut e = |a, addr, size, stream| {
        n += 1;
        t.push(entry(a, addr, size, stream, n));
    };
    for r in 0..rounds {
        let a = 0x7000_0000_0000 + r * 256 * MIB;
        let b = a + 64 * MIB;
        let c = a + 128 * MIB;
        e(SegmentAlloc, a, 20 * MIB, 0);
        e(Alloc, a, 4 * MIB, 0);
        e(Alloc, a + 4 * MIB, 2 * MIB, 0);
        e(SegmentAlloc, b, 2 * MIB, 1);
        e(Alloc, b, 1000, 1);
        e(FreeRequested, a, 4 * MIB, 0);
        e(FreeCompleted, a, 4 * MIB, 0);
        e(Oom, 100 * MIB, 30 * MIB, 0);
        e(SegmentAlloc, c, 40 * MIB, 0);
        e(Alloc, c, 30 * MIB, 0);
        e(FreeRequested, a + 4 * MIB, 2 * MIB, 0);
        e(FreeCompleted, a + 4 * MIB, 2 * MIB, 0);
        e(FreeRequested, b, 1000, 1);
        e(FreeCompleted, b, 1000, 1);
        e(FreeRequested, c, 30 * MIB, 0);
        e(FreeCompleted, c, 30 * MIB, 0);
        e(SegmentFree, a, 20 * MIB, 0);
        e(SegmentFree, b, 2 * MIB, 1);
        e(SegmentFree, c, 40 * MIB, 0);
    }
    allocview_alloc::snapshot::Snapshot {
        segments: Vec::new(),
        device_traces: vec![t],
        ..Default::default()
    }
}

/// An app over `snap` opened as the file `path` (headers show its name), saving into a
/// temporary folder that lives as long as the returned guard.
pub fn file_app(path: &str, snap: &Snapshot) -> (allocview::app::App, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let src = allocview::source::file::FileSource::new(path, snap);
    let app = allocview::app::App::new(Box::new(src), dir.path().to_path_buf()).unwrap();
    (app, dir)
}

/// The live state with OOMs `1..=n` (OOM `i` asking for `i` GiB).
pub fn live_state_with_ooms(n: u64) -> State {
    let mut s = live_state();
    s.ooms = (1..=n)
        .map(|i| OomReport {
            number: i,
            requested: i * GIB,
            ..oom()
        })
        .collect();
    s.ooms_total = n;
    s
}

/// The live state, then the same with a 1 GiB segment bigger than all first (every row of
/// the size-ordered segment list moves down one).
pub fn live_states_then_a_bigger_segment() -> Vec<State> {
    let first = live_state();
    let mut second = first.clone();
    second.segments.insert(
        0,
        segment(
            0x7f00_0000_0000,
            0,
            SegmentType::Large,
            &[(1024 * MIB, 1024 * MIB, BlockState::ActiveAllocated)],
        ),
    );
    vec![first, second]
}

/// A live source that hands out `states` one per poll, and counts the saves asked of it.
pub struct Scripted {
    /// The states still to hand out.
    pub states: std::collections::VecDeque<State>,
    /// Saves asked of it (shared with the test).
    pub saves: std::rc::Rc<std::cell::Cell<u32>>,
}

impl Scripted {
    /// A source of `states`, in order.
    pub fn new(states: impl Into<std::collections::VecDeque<State>>) -> Scripted {
        Scripted {
            states: states.into(),
            saves: std::rc::Rc::default(),
        }
    }
}

impl allocview::source::Source for Scripted {
    fn poll(&mut self, state: &mut State) -> anyhow::Result<bool> {
        match self.states.pop_front() {
            Some(s) => {
                *state = s;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn save(
        &mut self,
        _state: &State,
        dir: &std::path::Path,
    ) -> anyhow::Result<std::path::PathBuf> {
        self.saves.set(self.saves.get() + 1);
        Ok(dir.join("saved.json"))
    }
}

/// A live app whose polls bring `states` in turn (the first when it opens), and the count of
/// the saves asked of its source.
pub fn live_app(states: Vec<State>) -> (allocview::app::App, std::rc::Rc<std::cell::Cell<u32>>) {
    let src = Scripted::new(states);
    let saves = src.saves.clone();
    (
        allocview::app::App::new(Box::new(src), std::env::temp_dir()).unwrap(),
        saves,
    )
}
