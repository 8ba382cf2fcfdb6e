//! A toy allocator for the agent's tests: it keeps the truth in a `DeviceMirror` behind a lock
//! and publishes each event under that lock, as the caching allocator does, so tests can check
//! the agent's figures against an allocator's own without the caching allocator.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use allocview_agent::agent::{Agent, AgentBuilder};

use allocview_agent::mirror::DeviceMirror;
use allocview_agent::provider::SnapshotProvider;
use allocview_alloc::caching::stats::DeviceStats;
use allocview_alloc::event::{Event, EventAction, EventPool, EventSink, now_ns};
use allocview_alloc::snapshot::Snapshot;

/// An agent that listens nowhere, dumps into `dir` and whose tick never comes (only flushes,
/// and the half-full wake-up, which races, fold events in), with a channel of `capacity`.
pub fn quiet_agent(dir: &std::path::Path, capacity: usize) -> AgentBuilder {
    Agent::builder()
        .no_listen()
        .dump_dir(dir)
        .channel_capacity(capacity)
        .tick(Duration::from_secs(3600))
}

/// Segment size of the toy (every segment holds up to two blocks).
pub const TOY_SEGMENT: u64 = 4 << 20;

/// An `oom` event on `device` for a request of `requested` bytes, with 1 MiB free on the
/// device.
pub fn oom_event(device: i16, requested: u64) -> Event {
    Event {
        requested,
        ..Event::new(
            EventAction::Oom,
            device,
            EventPool::Large,
            1 << 20,
            requested,
        )
    }
}

struct Inner {
    truth: DeviceMirror,
    next_addr: u64,
    /// Live blocks: (block addr, size, segment addr).
    live: Vec<(u64, u64, u64)>,
    /// Segments with one free half: (segment addr, address of the free half).
    half_free: Vec<(u64, u64)>,
}

/// The toy allocator.
pub struct Toy {
    inner: Mutex<Inner>,
    sink: Mutex<Option<Arc<dyn EventSink>>>,
    /// The next snapshot publishes an OOM just before its marker (as another thread's failed
    /// allocation would while the agent resyncs).
    oom_in_next_snapshot: AtomicBool,
}

impl Toy {
    pub fn new() -> Arc<Toy> {
        Arc::new(Toy {
            inner: Mutex::new(Inner {
                truth: DeviceMirror::new(0, None),
                next_addr: 0x7f00_0000_0000,
                live: Vec::new(),
                half_free: Vec::new(),
            }),
            sink: Mutex::new(None),
            oom_in_next_snapshot: AtomicBool::new(false),
        })
    }

    pub fn set_sink(&self, sink: Arc<dyn EventSink>) {
        *self.sink.lock().unwrap() = Some(sink);
    }

    fn emit(&self, inner: &mut Inner, e: Event) {
        let e = Event {
            time_ns: now_ns(),
            ..e
        };
        inner
            .truth
            .apply(&e)
            .expect("the toy only makes valid events");
        if let Some(s) = self.sink.lock().unwrap().as_ref() {
            s.publish(&e);
        }
    }

    /// Allocates half a segment (reusing a half-free segment when there is one); returns the
    /// block address.
    pub fn malloc(&self, stream: u64) -> u64 {
        let mut g = self.inner.lock().unwrap();
        let half = TOY_SEGMENT / 2;
        let (addr, seg) = if let Some((seg, free)) = g.half_free.pop() {
            (free, seg)
        } else {
            let seg = g.next_addr;
            g.next_addr += TOY_SEGMENT;
            self.emit(
                &mut g,
                Event {
                    stream,
                    ..Event::new(
                        EventAction::SegmentAlloc,
                        0,
                        EventPool::Large,
                        seg,
                        TOY_SEGMENT,
                    )
                },
            );
            g.half_free.push((seg, seg + half));
            (seg, seg)
        };
        self.emit(
            &mut g,
            Event {
                stream,
                requested: half - 100,
                latency_ns: 250,
                ..Event::new(EventAction::Alloc, 0, EventPool::Large, addr, half)
            },
        );
        g.live.push((addr, half, seg));
        addr
    }

    /// Frees the `i`-th live block (modulo the count); releases the segment when it empties.
    pub fn free_nth(&self, i: usize) -> bool {
        let mut g = self.inner.lock().unwrap();
        if g.live.is_empty() {
            return false;
        }
        let n = i % g.live.len();
        let (addr, size, seg) = g.live.swap_remove(n);
        let stream = 0;
        self.emit(
            &mut g,
            Event {
                requested: size - 100,
                stream,
                ..Event::new(EventAction::FreeRequested, 0, EventPool::Large, addr, size)
            },
        );
        self.emit(
            &mut g,
            Event::new(EventAction::FreeCompleted, 0, EventPool::Large, addr, size),
        );
        let other_live = g.live.iter().any(|&(_, _, s)| s == seg);
        if other_live {
            g.half_free.push((seg, addr));
        } else {
            g.half_free.retain(|&(s, _)| s != seg);
            self.emit(
                &mut g,
                Event::new(
                    EventAction::SegmentFree,
                    0,
                    EventPool::Large,
                    seg,
                    TOY_SEGMENT,
                ),
            );
        }
        true
    }

    /// A failed request of `requested` bytes: publishes an `oom` event.
    pub fn oom(&self, requested: u64) {
        let mut g = self.inner.lock().unwrap();
        self.emit(&mut g, oom_event(0, requested));
    }

    /// Makes the next snapshot publish an OOM just before its marker.
    pub fn oom_in_next_snapshot(&self) {
        self.oom_in_next_snapshot.store(true, Ordering::Relaxed);
    }

    pub fn live(&self) -> usize {
        self.inner.lock().unwrap().live.len()
    }

    pub fn stats(&self) -> DeviceStats {
        self.inner.lock().unwrap().truth.stats().clone()
    }
}

impl SnapshotProvider for Toy {
    fn device(&self) -> i32 {
        0
    }

    /// Publishes the `snapshot` marker under the lock, as the caching allocator does.
    fn snapshot(&self) -> Snapshot {
        let mut g = self.inner.lock().unwrap();
        let segments = g.truth.segments();
        if self.oom_in_next_snapshot.swap(false, Ordering::Relaxed) {
            self.emit(&mut g, oom_event(0, 3 << 30));
        }
        self.emit(
            &mut g,
            Event::new(EventAction::Snapshot, 0, EventPool::Large, 0, 0),
        );
        Snapshot {
            segments,
            ..Snapshot::default()
        }
    }

    fn device_stats(&self) -> DeviceStats {
        self.stats()
    }

    fn reset_peak_stats(&self) {
        let mut g = self.inner.lock().unwrap();
        self.emit(
            &mut g,
            Event::new(EventAction::ResetPeaks, 0, EventPool::Large, 0, 0),
        );
    }

    fn memory_info(&self) -> Option<(u64, Option<u64>)> {
        Some((80 << 30, None))
    }
}
