//! Time travel over recordings made with `expandable_segments:True`: the state at the last
//! event is the file's own, the state before the trace is what the trace implies, and every
//! step in between matches what the recording allocator itself reported then.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use allocview::state::from_snapshot::PostMortem;
use allocview::state::timetravel::CHECKPOINT_EVERY;
use allocview::units::{KIB, MIB};
use allocview_alloc::caching::backend::{DevicePtr, StreamId};
use allocview_alloc::caching::history::HistoryOptions;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_alloc::snapshot::{BlockState, SegmentInfo, SegmentType, Snapshot, TraceAction};

/// Device capacity of the recordings: small enough for an OOM.
const CAPACITY: u64 = 256 * MIB;

/// What the recording allocator reported after one call: trace entries so far, reserved
/// and allocated bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Step {
    event: usize,
    reserved: u64,
    allocated: u64,
}

/// A recording allocator and the figures it reported after each call.
struct Recorder {
    alloc: CachingAllocator<SimBackend>,
    entries: Arc<AtomicUsize>,
    steps: Vec<Step>,
}

impl Recorder {
    fn new(conf: &str) -> Recorder {
        let sim = SimBackend::builder().capacity(CAPACITY).build();
        sim.add_stream(StreamId(1));
        let alloc = CachingAllocator::new(sim, AllocatorConfig::parse(conf).unwrap());
        alloc.record_history(HistoryOptions::default());
        let entries = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&entries);
        alloc.attach_trace_tracker(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        let mut r = Recorder {
            alloc,
            entries,
            steps: Vec::new(),
        };
        r.step();
        r
    }

    fn step(&mut self) {
        let stats = self.alloc.device_stats();
        self.steps.push(Step {
            event: self.entries.load(Ordering::Relaxed),
            reserved: stats.reserved_bytes.0[0].current as u64,
            allocated: stats.allocated_bytes.0[0].current as u64,
        });
    }

    fn malloc(&mut self, size: u64, stream: u64) -> DevicePtr {
        let p = self.alloc.malloc(size, StreamId(stream)).unwrap();
        self.step();
        p
    }

    fn free(&mut self, p: DevicePtr) {
        self.alloc.free(p).unwrap();
        self.step();
    }

    fn empty_cache(&mut self) {
        self.alloc.empty_cache().unwrap();
        self.step();
    }

    fn oom(&mut self, size: u64) {
        assert!(self.alloc.malloc(size, StreamId::DEFAULT).is_err());
        self.step();
    }

    /// The snapshot (its trace holds exactly the entries counted so far).
    fn snapshot(&self) -> Snapshot {
        let snap = self.alloc.snapshot();
        assert_eq!(
            snap.device_traces[0].len(),
            self.steps.last().unwrap().event
        );
        snap
    }
}

/// Expandable segments that grow, get holes unmapped by `empty_cache`, are mapped again
/// (joining runs), a small pool that is unmapped entirely and mapped again, a second stream,
/// and an OOM at the end.
fn expandable_recording() -> (Snapshot, Vec<Step>) {
    let mut r = Recorder::new("expandable_segments:True");
    let small: Vec<DevicePtr> = (0..4).map(|i| r.malloc(1000 + i * 300, 0)).collect();
    let big: Vec<DevicePtr> = (0..8).map(|i| r.malloc(9 * MIB + i * KIB, 0)).collect();
    let other = r.malloc(30 * MIB, 1);
    let other_small = r.malloc(64 * KIB, 1);
    // Holes in the middle of the large run, and the small pool emptied.
    for &p in &big[2..6] {
        r.free(p);
    }
    for &p in &small {
        r.free(p);
    }
    r.free(other_small);
    r.empty_cache();
    // Mapped again: the hole fills and the runs join; the small pool comes back.
    let refill: Vec<DevicePtr> = (0..3).map(|_| r.malloc(15 * MIB, 0)).collect();
    let _small_again = r.malloc(100 * KIB, 0);
    let tail = r.malloc(45 * MIB, 0);
    r.free(refill[1]);
    r.free(tail);
    r.free(other);
    r.empty_cache();
    let _late = r.malloc(3 * MIB, 0);
    r.oom(CAPACITY);
    (r.snapshot(), r.steps)
}

/// A long expandable recording (several checkpoints' worth of events): rounds of
/// allocations of varied sizes, half freed each round, the cache emptied every third round.
fn long_expandable_recording() -> (Snapshot, Vec<Step>) {
    let mut r = Recorder::new("expandable_segments:True");
    let mut live: Vec<DevicePtr> = Vec::new();
    for round in 0..30u64 {
        for i in 0..12u64 {
            let size = match (round + i) % 4 {
                0 => 700 + i * 100,
                1 => 3 * MIB + i * KIB,
                2 => 200 * KIB,
                _ => 11 * MIB + round * KIB,
            };
            let stream = (i % 3 == 0) as u64;
            live.push(r.malloc(size, stream));
        }
        let keep = live.len() / 2;
        for p in live.split_off(keep) {
            r.free(p);
        }
        if round % 3 == 2 {
            r.empty_cache();
        }
        // Freed from the front too, so holes open in the middle of the runs.
        if live.len() > 24 {
            for p in live.drain(..6).collect::<Vec<_>>() {
                r.free(p);
            }
        }
    }
    (r.snapshot(), r.steps)
}

/// Ordinary segments (no expandable ones), with an `empty_cache` and an OOM.
fn ordinary_recording() -> (Snapshot, Vec<Step>) {
    let mut r = Recorder::new("");
    let a: Vec<DevicePtr> = (0..6).map(|i| r.malloc(5 * MIB + i * KIB, 0)).collect();
    let s = r.malloc(2000, 0);
    let b = r.malloc(40 * MIB, 1);
    r.free(a[1]);
    r.free(b);
    r.empty_cache();
    r.free(s);
    let _c = r.malloc(12 * MIB, 0);
    r.oom(CAPACITY);
    (r.snapshot(), r.steps)
}

/// What a segment list says about each segment, free blocks included.
type SegmentView = (
    u64,
    u64,
    SegmentType,
    bool,
    u64,
    u64,
    u64,
    Vec<(u64, u64, BlockState)>,
);

fn view(segments: &[SegmentInfo]) -> Vec<SegmentView> {
    segments
        .iter()
        .map(|s| {
            (
                s.address,
                s.total_size,
                s.segment_type,
                s.is_expandable,
                s.stream,
                s.allocated_size,
                s.active_size,
                s.blocks
                    .iter()
                    .map(|b| (b.address, b.size, b.state))
                    .collect(),
            )
        })
        .collect()
}

fn totals_of(segments: &[SegmentInfo]) -> (u64, u64) {
    (
        segments.iter().map(|s| s.total_size).sum(),
        segments.iter().map(|s| s.allocated_size).sum(),
    )
}

/// Checks the three promises of time travel on one recording.
fn check(snap: &Snapshot, steps: &[Step]) {
    let pm = PostMortem::new("recording.pickle", snap);
    let tt = pm.time_travel();
    let n = tt.len();
    assert_eq!(n, steps.last().unwrap().event);

    // (a) The last event is the file's own state.
    let end = tt.moment(n);
    assert_eq!(view(&end.segments), view(&snap.segments));
    let (reserved, allocated) = totals_of(&snap.segments);
    assert_eq!(
        (end.totals.reserved, end.totals.allocated),
        (reserved, allocated)
    );
    assert_eq!(end.totals.mismatches, 0);
    let state = pm.state_at(n);
    assert_eq!(view(&state.segments), view(&snap.segments));
    assert_eq!(state.stats.reserved_bytes.0[0].current as u64, reserved);
    assert_eq!(state.stats.allocated_bytes.0[0].current as u64, allocated);
    assert!(state.status.is_none(), "{:?}", state.status);

    // (b) The recording starts from an empty allocator: nothing before the first entry.
    let start = tt.moment(0);
    assert!(start.segments.is_empty(), "{:?}", view(&start.segments));
    assert_eq!((start.totals.reserved, start.totals.allocated), (0, 0));

    // (c) After every call, the figures the recording allocator had then.
    for s in steps {
        let m = tt.moment(s.event);
        assert_eq!(
            (m.totals.reserved, m.totals.allocated),
            (s.reserved, s.allocated),
            "after event {} of {n}",
            s.event
        );
        assert_eq!(totals_of(&m.segments), (s.reserved, s.allocated));
        assert_eq!(m.totals.mismatches, 0, "after event {}", s.event);
    }
}

#[test]
fn a_long_expandable_recording_matches_the_allocator_through_every_checkpoint() {
    let (snap, steps) = long_expandable_recording();
    let n = snap.device_traces[0].len();
    assert!(n > 2 * CHECKPOINT_EVERY, "only {n} events");
    check(&snap, &steps);
    // Seeking through checkpoints gives what replaying from the start gives.
    let pm = PostMortem::new("recording.pickle", &snap);
    let tt = pm.time_travel();
    for event in (0..=n).step_by(97).chain([n]) {
        let m = tt.moment(event);
        assert_eq!(
            (m.segments, m.totals),
            tt.at_by_full_replay(event),
            "event {event}"
        );
    }
}

#[test]
fn an_expandable_recording_ends_in_the_files_own_state_and_starts_from_nothing() {
    let (snap, steps) = expandable_recording();
    let segs = &snap.segments;
    // The recording has what the bug needs: several runs of one expandable segment, a
    // small-pool run, and unmaps.
    assert!(segs.iter().all(|s| s.is_expandable));
    assert!(segs.iter().any(|s| s.segment_type == SegmentType::Small));
    assert!(
        snap.device_traces[0]
            .iter()
            .any(|e| e.action == TraceAction::SegmentUnmap)
    );
    check(&snap, &steps);
}

#[test]
fn expandable_small_pool_runs_are_small_segments_at_every_event() {
    let (snap, steps) = expandable_recording();
    let pm = PostMortem::new("recording.pickle", &snap);
    for s in &steps {
        for seg in pm.time_travel().moment(s.event).segments {
            assert_eq!(
                seg.segment_type == SegmentType::Small,
                seg.total_size % (20 * MIB) != 0,
                "segment {:#x} of {} bytes after event {}",
                seg.address,
                seg.total_size,
                s.event
            );
        }
    }
}

#[test]
fn an_ordinary_recording_still_ends_in_the_files_own_state_and_starts_from_nothing() {
    let (snap, steps) = ordinary_recording();
    assert!(snap.segments.iter().all(|s| !s.is_expandable));
    check(&snap, &steps);
}

#[test]
fn the_overviews_stranded_bytes_agree_with_summary_and_the_pools_on_expandable_segments() {
    // Live blocks with free pages between them, in expandable segments and in an ordinary
    // recording: the free pages of an expandable segment can be unmapped, so only the
    // ordinary recording strands anything.
    for (conf, strands) in [("expandable_segments:True", false), ("", true)] {
        let mut r = Recorder::new(conf);
        let big: Vec<DevicePtr> = (0..6).map(|_| r.malloc(9 * MIB, 0)).collect();
        for &p in big.iter().step_by(2) {
            r.free(p);
        }
        let snap = r.snapshot();
        let state =
            PostMortem::new("recording.pickle", &snap).state_at(snap.device_traces[0].len());
        let overview = state.fragmentation().stranded;
        let pools: u64 = state
            .pool_rows()
            .iter()
            .map(|p| p.inactive_split_bytes)
            .sum();
        let summary = allocview_agent::summary::summarize(&snap).devices[0]
            .totals
            .free_in_split_segments;
        assert_eq!((overview, pools), (summary, summary), "{conf:?}");
        assert_eq!(summary > 0, strands, "{conf:?}: {summary}");
    }
}
