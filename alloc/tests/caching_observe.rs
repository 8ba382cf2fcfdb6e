//! What the caching allocator tells observers: trace history and trackers, context levels,
//! snapshots, and the events it publishes.

#[path = "support/builders.rs"]
mod builders;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use allocview_alloc::caching::{ContextLevel, HistoryOptions};
use allocview_alloc::event::{
    Event, EventAction, EventPool, EventSink, FLAG_CACHED, FLAG_OVERSIZE, MAX_BATCH,
};
use allocview_alloc::snapshot::{BlockState, Frame, Frames, SegmentType, TraceAction, Value};
use builders::*;

fn actions(a: &Alloc) -> Vec<(TraceAction, u64, u64)> {
    a.snapshot().device_traces[0]
        .iter()
        .map(|t| (t.action, t.addr, t.size))
        .collect()
}

fn frames(name: &str) -> Frames {
    Arc::from(vec![Frame::new(name, "train.py", 7)])
}

#[test]
fn history_records_pytorchs_actions_with_unrounded_alloc_sizes() {
    let (a, _) = allocator();
    a.record_history(HistoryOptions::default());
    let p = a.malloc(1000, S0).unwrap();
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    let t = actions(&a);
    let seg = p;
    assert_eq!(
        t,
        vec![
            (TraceAction::SegmentAlloc, seg, 2 * MIB),
            (TraceAction::Alloc, p, 1000),
            (TraceAction::FreeRequested, p, 1000),
            (TraceAction::FreeCompleted, p, 1000),
            (TraceAction::SegmentFree, seg, 2 * MIB),
        ]
    );
    // The snapshot entry of that call shows up in the next one.
    assert_eq!(actions(&a).last().unwrap().0, TraceAction::Snapshot);
}

#[test]
fn the_ring_keeps_the_newest_entries_and_counts_the_overflow() {
    let (a, _) = allocator();
    a.record_history(HistoryOptions {
        enabled: true,
        context: ContextLevel::Never,
        max_entries: 3,
    });
    for _ in 0..3 {
        let p = a.malloc(512, S0).unwrap();
        a.free(p).unwrap();
    }
    // 1 segment_alloc + 3 x (alloc, free_requested, free_completed) = 10 entries; 3 kept.
    let snap = a.snapshot();
    let kept: Vec<TraceAction> = snap.device_traces[0].iter().map(|t| t.action).collect();
    assert_eq!(
        kept,
        [
            TraceAction::Alloc,
            TraceAction::FreeRequested,
            TraceAction::FreeCompleted
        ]
    );
    assert_eq!(snap.devices[0].trace_overflow, 7);
    assert_eq!(snap.devices[0].total_memory, Some(8 * GIB));
    // Disabling clears the ring.
    a.record_history(HistoryOptions {
        enabled: false,
        ..HistoryOptions::default()
    });
    assert!(a.snapshot().device_traces[0].is_empty());
}

#[test]
fn trackers_receive_every_entry_even_with_history_off() {
    let (a, _) = allocator();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    a.attach_trace_tracker(move |t| s2.lock().unwrap().push((t.action, t.size)));
    let p = a.malloc(3000, S1).unwrap();
    a.free(p).unwrap();
    a.record_user_annotation("step 3", S1);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            (TraceAction::SegmentAlloc, 2 * MIB),
            (TraceAction::Alloc, 3000),
            (TraceAction::FreeRequested, 3000),
            (TraceAction::FreeCompleted, 3000),
            (TraceAction::UserDefined, 0),
        ]
    );
    assert!(a.snapshot().device_traces[0].is_empty(), "history is off");
}

#[test]
fn user_annotations_carry_their_name_as_a_frame() {
    let (a, _) = allocator();
    a.record_history(HistoryOptions::default());
    a.record_user_annotation("forward", S0);
    let t = &a.snapshot().device_traces[0][0];
    assert_eq!(t.action, TraceAction::UserDefined);
    assert_eq!(t.frames[0].name, "forward");
}

fn counting_provider(a: &Alloc) -> Arc<AtomicUsize> {
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let n = Arc::new(AtomicU64::new(0));
    a.set_context_provider(Some(Arc::new(move || {
        c2.fetch_add(1, Ordering::SeqCst);
        frames(&format!("site{}", n.fetch_add(1, Ordering::SeqCst)))
    })));
    calls
}

#[test]
fn context_level_state_keeps_frames_on_live_blocks_only() {
    let (a, _) = allocator();
    let calls = counting_provider(&a);
    a.record_history(HistoryOptions {
        context: ContextLevel::State,
        ..HistoryOptions::default()
    });
    let p = a.malloc(512, S0).unwrap();
    let q = a.malloc(512, S0).unwrap();
    a.free(q).unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "gathered at malloc, not at free"
    );
    let snap = a.snapshot();
    let blocks = &snap.segments[0].blocks;
    assert_eq!(blocks[0].address, p);
    assert_eq!(blocks[0].frames[0].name, "site0");
    assert!(blocks[1].frames.is_empty(), "free blocks keep no frames");
    assert!(snap.device_traces[0].iter().all(|t| t.frames.is_empty()));
}

#[test]
fn context_level_alloc_puts_frames_on_alloc_entries_and_all_on_free_sites() {
    let (a, _) = allocator();
    let calls = counting_provider(&a);
    a.record_history(HistoryOptions {
        context: ContextLevel::Alloc,
        ..HistoryOptions::default()
    });
    let p = a.malloc(512, S0).unwrap();
    a.free(p).unwrap();
    let t = &a.snapshot().device_traces[0];
    assert_eq!(t[1].action, TraceAction::Alloc);
    assert_eq!(t[1].frames[0].name, "site0");
    // PyTorch: a free entry carries the allocation's context when the free site is not taken.
    assert_eq!(t[2].frames[0].name, "site0");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    a.record_history(HistoryOptions {
        context: ContextLevel::All,
        ..HistoryOptions::default()
    });
    let p = a.malloc(512, S0).unwrap();
    a.free(p).unwrap();
    let t = a.snapshot().device_traces[0].clone();
    let n = t.len();
    assert_eq!(t[n - 2].action, TraceAction::FreeRequested);
    assert_eq!(t[n - 2].frames[0].name, "site2", "the free site");
    // Frames are shared, not copied: the alloc entry and the block hold one allocation.
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn snapshot_describes_segments_blocks_and_settings_like_pytorch() {
    let (a, dev) = allocator_with(8 * GIB, "max_split_size_mb:64");
    let p = a.malloc(1000, S0).unwrap();
    let q = a.malloc(3 * MIB, S1).unwrap();
    a.record_stream(q, S2).unwrap();
    dev.submit_work(S2);
    a.free(q).unwrap();
    let snap = check_consistent(&a);
    assert_eq!(snap.segments.len(), 2);
    assert!(snap.segments[0].address < snap.segments[1].address);
    let small = snap
        .segments
        .iter()
        .find(|s| s.address <= p && p < s.address + s.total_size)
        .unwrap();
    assert_eq!(small.segment_type, SegmentType::Small);
    assert_eq!(small.stream, 0);
    assert_eq!(small.blocks[0].requested_size, 1000);
    assert_eq!(small.requested_size, 1000);
    assert_eq!(small.allocated_size, 1024);
    let large = snap.segments.iter().find(|s| s.stream == 1).unwrap();
    assert_eq!(large.segment_type, SegmentType::Large);
    assert_eq!(large.blocks[0].state, BlockState::ActivePendingFree);
    assert_eq!(large.active_size, 3 * MIB);
    assert_eq!(large.allocated_size, 0);
    assert_eq!(large.segment_pool_id, (0, 0));
    assert!(!large.is_expandable);
    let settings = snap.allocator_settings.unwrap();
    assert_eq!(settings[1], ("max_split_size".into(), Value::Int(64 << 20)));
}

#[test]
fn events_mirror_trace_entries_with_block_sizes_and_flags() {
    let (a, dev) = allocator_with(8 * GIB, "max_split_size_mb:20");
    let sink = Arc::new(Batches::default());
    a.set_event_sink(Some(sink.clone()));
    let p = a.malloc(5 * MIB + 100, S1).unwrap();
    let q = a.malloc(5 * MIB, S1).unwrap();
    a.free(q).unwrap();
    let big = a.malloc(30 * MIB, S0).unwrap();
    a.free(big).unwrap();
    a.record_stream(p, S2).unwrap();
    dev.submit_work(S2);
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    a.reset_peak_stats();
    let ev = sink.events();
    let got: Vec<(EventAction, u64, u64, u64)> = ev
        .iter()
        .map(|e| (e.action, e.addr, e.size, e.requested))
        .collect();
    let seg = p;
    let rounded = 5 * MIB + 512;
    assert_eq!(
        got,
        vec![
            (EventAction::SegmentAlloc, seg, 20 * MIB, 0),
            (EventAction::Alloc, p, rounded, 5 * MIB + 100),
            (EventAction::Alloc, q, 5 * MIB, 5 * MIB),
            // Freed and back in the cache in one call: one event.
            (EventAction::Free, q, 5 * MIB, 5 * MIB),
            (EventAction::SegmentAlloc, big, 30 * MIB, 0),
            (EventAction::Alloc, big, 30 * MIB, 30 * MIB),
            (EventAction::Free, big, 30 * MIB, 30 * MIB),
            // Used by another stream: requested now, completed once that stream is done.
            (EventAction::FreeRequested, p, rounded, 5 * MIB + 100),
            (EventAction::SyncAllStreams, 0, 0, 0),
            (EventAction::FreeCompleted, p, rounded, 5 * MIB + 100),
            (EventAction::SegmentFree, big, 30 * MIB, 0),
            (EventAction::SegmentFree, seg, 20 * MIB, 0),
            (EventAction::ResetPeaks, 0, 0, 0),
        ]
    );
    assert_eq!(ev[1].pool, EventPool::Large);
    assert_eq!(ev[1].stream, 1);
    assert_eq!(ev[1].flags & FLAG_CACHED, 0, "served by a new segment");
    assert_ne!(ev[2].flags & FLAG_CACHED, 0, "served from the cache");
    assert_ne!(ev[5].flags & FLAG_OVERSIZE, 0);
    assert_ne!(
        ev[6].flags & FLAG_OVERSIZE,
        0,
        "a free carries its block's flags"
    );
    assert!(ev.iter().all(|e| e.device == 0 && e.time_ns > 0));
    // Without a sink nothing is published.
    a.set_event_sink(None);
    a.malloc(512, S0).unwrap();
    assert_eq!(sink.events().len(), ev.len());
}

#[test]
fn events_carry_context_ids_that_the_allocator_turns_back_into_the_frames_of_their_call() {
    let (a, _) = allocator();
    let sink = Arc::new(Batches::default());
    a.set_event_sink(Some(sink.clone()));
    // No frames gathered yet: no ids.
    let p = a.malloc(512, S0).unwrap();
    a.free(p).unwrap();
    let site = Arc::new(Mutex::new(frames("forward")));
    let s2 = site.clone();
    a.set_context_provider(Some(Arc::new(move || s2.lock().unwrap().clone())));
    a.record_history(HistoryOptions {
        context: ContextLevel::Alloc,
        ..HistoryOptions::default()
    });
    let p = a.malloc(512, S0).unwrap();
    let q = a.malloc(4096, S0).unwrap();
    *site.lock().unwrap() = frames("backward");
    let r = a.malloc(1 << 20, S0).unwrap();
    // At level Alloc, frees gather nothing: their events carry the allocation's id.
    a.free(p).unwrap();
    a.record_history(HistoryOptions {
        context: ContextLevel::All,
        ..HistoryOptions::default()
    });
    *site.lock().unwrap() = frames("optimizer");
    // At level All, the free's own site.
    a.free(q).unwrap();
    a.flush_events();
    let ev: Vec<(EventAction, u32)> = sink
        .events()
        .iter()
        .filter(|e| matches!(e.action, EventAction::Alloc | EventAction::Free))
        .map(|e| (e.action, e.context))
        .collect();
    let names = |id: u32| -> String {
        let f = a.context_frames(&[id]);
        assert_eq!(f.len(), 1, "id {id} resolves");
        f[0].1[0].name.clone()
    };
    assert_eq!(ev.len(), 7);
    assert_eq!(ev[0], (EventAction::Alloc, 0));
    assert_eq!(ev[1], (EventAction::Free, 0));
    let (forward, backward) = (ev[2].1, ev[4].1);
    assert_ne!(forward, 0);
    assert_eq!(ev[3].1, forward, "the same frames share one id");
    assert_ne!(backward, forward);
    assert_eq!(
        ev[5],
        (EventAction::Free, forward),
        "the allocation's context"
    );
    assert_eq!(ev[6].0, EventAction::Free);
    assert_eq!(names(forward), "forward");
    assert_eq!(names(backward), "backward");
    assert_eq!(names(ev[6].1), "optimizer");
    // Unknown ids and 0 are not answered.
    assert!(a.context_frames(&[0, 9999]).is_empty());
    a.free(r).unwrap();
}

#[test]
fn without_a_sink_no_context_ids_are_made() {
    let (a, _) = allocator();
    a.set_context_provider(Some(Arc::new(|| frames("forward"))));
    a.record_history(HistoryOptions {
        context: ContextLevel::All,
        ..HistoryOptions::default()
    });
    let p = a.malloc(512, S0).unwrap();
    a.free(p).unwrap();
    assert!(a.context_frames(&[1]).is_empty());
    // The snapshot still has the frames: ids are only for events.
    assert_eq!(a.snapshot().device_traces[0][1].frames[0].name, "forward");
}

#[test]
fn retries_and_ooms_are_published() {
    let (a, _) = allocator_with(40 * MIB, "");
    let sink = Arc::new(Batches::default());
    a.set_event_sink(Some(sink.clone()));
    let p = a.malloc(5 * MIB, S0).unwrap();
    a.free(p).unwrap();
    a.malloc(30 * MIB, S0).unwrap();
    assert!(a.malloc(30 * MIB, S0).is_err());
    let ev = sink.events();
    let count = |act| ev.iter().filter(|e| e.action == act).count();
    assert_eq!(count(EventAction::AllocRetry), 2);
    assert_eq!(count(EventAction::SyncAllStreams), 2);
    let oom = ev.iter().find(|e| e.action == EventAction::Oom).unwrap();
    assert_eq!(
        (oom.addr, oom.size, oom.requested),
        (10 * MIB, 30 * MIB, 30 * MIB)
    );
    assert_eq!(a.device_stats().num_alloc_retries, 2);
}

#[test]
fn segment_frames_show_for_unsplit_segments_and_vanish_once_split_as_in_pytorch() {
    let (a, _) = allocator();
    counting_provider(&a);
    a.record_history(HistoryOptions {
        context: ContextLevel::State,
        ..HistoryOptions::default()
    });
    let big = a.malloc(30 * MIB, S0).unwrap(); // its own segment, one block
    a.malloc(512, S0).unwrap(); // the front of a split small segment
    let snap = a.snapshot();
    let seg_of = |p: u64| {
        snap.segments
            .iter()
            .find(|s| s.address <= p && p < s.address + s.total_size)
            .unwrap()
    };
    assert_eq!(seg_of(big).frames[0].name, "site0");
    // PyTorch keeps the segment's context on the remainder block, so a split segment shows
    // none (every multi-block segment in the real fixtures has empty frames).
    let small = snap.segments.iter().find(|s| s.blocks.len() > 1).unwrap();
    assert!(small.frames.is_empty());
}

/// A sink that says nobody listens.
struct Disabled(Mutex<usize>);

impl EventSink for Disabled {
    fn publish(&self, _e: &Event) {
        *self.0.lock().unwrap() += 1;
    }
    fn enabled(&self) -> bool {
        false
    }
}

#[test]
fn a_disabled_sink_gets_no_events() {
    let (a, _) = allocator();
    let sink = Arc::new(Disabled(Mutex::new(0)));
    a.set_event_sink(Some(sink.clone()));
    let p = a.malloc(512, S0).unwrap();
    a.free(p).unwrap();
    assert_eq!(*sink.0.lock().unwrap(), 0);
}

/// A sink that keeps each batch as it came.
#[derive(Default)]
struct Batches(Mutex<Vec<Vec<Event>>>);

impl EventSink for Batches {
    fn publish(&self, e: &Event) {
        self.0.lock().unwrap().push(vec![*e]);
    }
    fn publish_batch(&self, events: &[Event]) {
        self.0.lock().unwrap().push(events.to_vec());
    }
}

impl Batches {
    /// Every event received so far, in order.
    fn events(&self) -> Vec<Event> {
        self.0.lock().unwrap().concat()
    }

    /// Every event received so far, in order, forgetting them.
    fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.0.lock().unwrap()).concat()
    }
}

/// An allocator publishing into a fresh `Batches` sink, after a warm-up pair (a 1 MiB
/// segment made and cached) whose events were flushed.
fn warmed_with_batches() -> (Alloc, Arc<Batches>) {
    let (a, _) = allocator();
    let sink = Arc::new(Batches::default());
    a.set_event_sink(Some(sink.clone()));
    let warm = a.malloc(MIB, S0).unwrap();
    a.free(warm).unwrap();
    a.flush_events();
    (a, sink)
}

/// Reads the clock past its switch to the time-stamp counter where it makes one.
fn clock_settled() -> bool {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(120);
    while std::time::Instant::now() < until {
        allocview_alloc::event::now_ns();
        if allocview_alloc::event::clock_uses_counter() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    false
}

#[test]
fn block_events_come_in_order_in_batches_of_at_most_32_and_all_arrive_by_flush_events() {
    let counter = clock_settled();
    let (a, sink) = warmed_with_batches();
    sink.take();
    const PAIRS: usize = 1_000;
    let mut ptrs = Vec::new();
    for i in 0..PAIRS {
        let p = a.malloc(512 * (1 + i as u64 % 7), S0).unwrap();
        a.free(p).unwrap();
        ptrs.push(p);
    }
    a.flush_events();
    let batches = sink.0.lock().unwrap().clone();
    assert!(
        batches
            .iter()
            .all(|b| !b.is_empty() && b.len() <= MAX_BATCH)
    );
    let ev: Vec<Event> = batches.concat();
    assert_eq!(ev.len(), 2 * PAIRS, "every event exactly once");
    for (i, pair) in ev.chunks(2).enumerate() {
        let got: Vec<(EventAction, u64)> = pair.iter().map(|e| (e.action, e.addr)).collect();
        assert_eq!(
            got,
            vec![(EventAction::Alloc, ptrs[i]), (EventAction::Free, ptrs[i]),]
        );
    }
    // Times are the calls' starts in nanoseconds: never going back.
    assert!(ev.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    assert!(ev[0].time_ns > 1_600_000_000_000_000_000);
    if counter {
        // A tight loop fills batches: far fewer sink calls than events.
        assert!(
            batches.len() < ev.len() / 4,
            "{} batches for {} events",
            batches.len(),
            ev.len()
        );
    } else {
        println!("the clock does not use the time-stamp counter here: batching by age not checked");
    }
}

#[test]
fn ooms_snapshots_and_resets_go_out_at_the_end_of_their_call_with_everything_before_them() {
    let (a, _) = allocator_with(40 * MIB, "");
    let sink = Arc::new(Batches::default());
    a.set_event_sink(Some(sink.clone()));
    let actions = || -> Vec<EventAction> { sink.events().iter().map(|e| e.action).collect() };
    let p = a.malloc(30 * MIB, S0).unwrap(); // a new segment
    a.free(p).unwrap();
    a.snapshot();
    assert_eq!(
        actions(),
        vec![
            EventAction::SegmentAlloc,
            EventAction::Alloc,
            EventAction::Free,
            EventAction::Snapshot
        ],
        "the snapshot marker follows every earlier event"
    );
    let q = a.malloc(MIB, S0).unwrap();
    a.reset_peak_stats();
    let got = actions();
    assert_eq!(got.last(), Some(&EventAction::ResetPeaks));
    assert_eq!(got[got.len() - 2], EventAction::Alloc, "{got:?}");
    a.reset_accumulated_stats();
    assert_eq!(actions().last(), Some(&EventAction::ResetAccumulated));
    a.free(q).unwrap();
    assert!(a.malloc(60 * MIB, S0).is_err());
    let got = actions();
    assert_eq!(got.last(), Some(&EventAction::Oom), "{got:?}");
    assert!(got.contains(&EventAction::Free));
}

#[test]
fn gathered_events_reach_the_sink_on_flush_on_a_sink_change_and_on_drop() {
    let (a, first) = warmed_with_batches();
    let mut expected = first.events().len();
    for _ in 0..5 {
        let p = a.malloc(MIB, S0).unwrap();
        a.free(p).unwrap();
        expected += 2;
        a.flush_events();
        assert_eq!(first.events().len(), expected);
    }
    let p = a.malloc(MIB, S0).unwrap();
    let second = Arc::new(Batches::default());
    a.set_event_sink(Some(second.clone()));
    assert_eq!(
        first.events().len(),
        expected + 1,
        "the old sink got its alloc"
    );
    a.free(p).unwrap();
    drop(a);
    let got: Vec<(EventAction, u64)> = second.events().iter().map(|e| (e.action, e.addr)).collect();
    assert_eq!(
        got,
        vec![(EventAction::Free, p)],
        "dropping the allocator publishes what it gathered"
    );
}

#[test]
fn latency_is_measured_on_a_random_sample_of_calls_or_on_every_call_when_asked() {
    let (a, _) = allocator();
    let sink = Arc::new(Batches::default());
    a.set_event_sink(Some(sink.clone()));
    const PAIRS: usize = 1_600;
    let run = || {
        for _ in 0..PAIRS {
            let p = a.malloc(4096, S0).unwrap();
            a.free(p).unwrap();
        }
        a.flush_events();
        let ev = sink.take();
        let allocs: Vec<Event> = ev
            .into_iter()
            .filter(|e| e.action == EventAction::Alloc)
            .collect();
        assert_eq!(allocs.len(), PAIRS);
        allocs.iter().filter(|e| e.latency_ns > 0).count()
    };
    let sampled = run();
    // One call in 16 on average: 100 of 1,600 expected.
    assert!(
        (PAIRS / 64..=PAIRS / 4).contains(&sampled),
        "{sampled} of {PAIRS} calls measured"
    );
    a.set_event_latency_sampling(1);
    assert_eq!(run(), PAIRS, "every call measured");
}
