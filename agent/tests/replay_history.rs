//! A replayed run's own trace (`allocview replay --out`) reads on the recording's clock and
//! with its context: each entry the replay made carries the time, frames and metadata of the
//! recorded entry whose replay made it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use allocview_agent::replay::{self, ReplaySettings};
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, HistoryOptions};
use allocview_alloc::snapshot::{Frame, Snapshot, TraceAction, TraceEntry};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A recording whose every call has frames naming its step (`step N`), with time passing
/// between calls.
fn recording() -> Snapshot {
    let alloc = CachingAllocator::new(Arc::new(SimBackend::new(GIB)), AllocatorConfig::default());
    let step = Arc::new(AtomicU64::new(0));
    let s2 = step.clone();
    alloc.set_context_provider(Some(Arc::new(move || {
        let n = s2.load(Ordering::Relaxed);
        Arc::from(vec![Frame::new(format!("step {n}"), "train.py", n as i64)])
    })));
    alloc.record_history(HistoryOptions::default());
    let s = StreamId::DEFAULT;
    let mut live = Vec::new();
    for n in 0..12u64 {
        step.store(n, Ordering::Relaxed);
        live.push(alloc.malloc((n % 4 + 1) * 3 * MIB, s).unwrap());
        if n % 3 == 2 {
            alloc.free(live.remove(0)).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    alloc.snapshot()
}

/// The (time, first frame's name) of each `alloc` entry.
fn allocs(trace: &[TraceEntry]) -> Vec<(Option<i64>, String)> {
    trace
        .iter()
        .filter(|e| e.action == TraceAction::Alloc)
        .map(|e| {
            (
                e.time_us,
                e.frames.first().map(|f| f.name.clone()).unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn a_what_if_runs_trace_carries_the_recorded_times_and_frames() {
    let snap = recording();
    let recorded = allocs(&snap.device_traces[0]);
    assert_eq!(recorded.len(), 12);
    let out = replay::replay(
        &snap,
        &ReplaySettings {
            configs: vec!["expandable_segments:True".into()],
            device_memory: None,
            keep_history: true,
        },
        &mut |_, _| {},
    )
    .unwrap();
    for run in std::iter::once(&out.replayed).chain(&out.what_ifs) {
        let trace = &run.device_traces[0];
        // Every allocation at its recorded moment, with its recorded frames.
        assert_eq!(allocs(trace), recorded);
        // Segment events the run made take the time of the call that made them: the trace
        // reads in order on the recording's clock.
        assert!(trace.iter().all(|e| e.time_us.is_some()));
        assert!(
            trace.windows(2).all(|w| w[0].time_us <= w[1].time_us),
            "{trace:#?}"
        );
    }
}
