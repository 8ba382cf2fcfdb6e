//! The small-channel stress scenario `tests/stress.rs` and `tests/batch_pipeline.rs` share:
//! threads hammer one caching allocator on the simulated device that publishes into an agent
//! with a deliberately small channel while a reader asks for the state; drops are counted and
//! reported, the agent resynchronises, the final stats are exact, nothing deadlocks. Then the
//! leftovers are freed and the cache emptied with no further drops, and the events alone keep
//! the figures exact.
//!
//! What the two tests vary (threads, operations, streams, block sizes, `record_stream`, and
//! how the allocator's events reach the agent's sink) is a [`Scenario`]; the workload draws
//! from the stress tests' xorshift generator, seeded per thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use allocview_agent::agent::Agent;
use allocview_alloc::caching::backend::{DevicePtr, StreamId};
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_alloc::event::{Event, EventAction, EventSink, MAX_BATCH};

/// The stress tests' xorshift generator, shared with the other crates' (this package cannot
/// depend on `allocview-tests`, so the file is included, once per test binary: a test that
/// includes this file takes the generator from here).
#[path = "../../../tests/src/xorshift.rs"]
mod xorshift;
pub use xorshift::Rng;

/// One mebibyte, for the scenarios' block sizes.
pub const MIB: u64 = 1 << 20;
/// The agent's channel: 256 events, eight batches, small enough that the producers overrun it
/// between ticks whether they publish events or batches.
pub const CHANNEL: usize = 8 * MAX_BATCH;
/// The tests' mixed block size from a generator draw `r`: eight in ten draws (`r % 10` below 8)
/// give a small block of 1 byte to 1 MiB, the rest a large one of 1 to 9 MiB (below 9 MiB),
/// both from the bits of `r` above its lowest 8.
pub fn mixed_size(r: u64) -> u64 {
    match r % 10 {
        0..=7 => 1 + (r >> 8) % MIB,
        _ => MIB + (r >> 8) % (8 * MIB),
    }
}

/// Blocks one thread holds at most.
const MAX_LIVE: usize = 32;
/// Size of the simulated device: no `malloc` of the workload runs out of it.
const DEVICE_BYTES: u64 = 16 << 30;
/// The agent's tick: the producers overrun the channel between two.
const TICK: Duration = Duration::from_millis(10);
/// Leftover frees between two settles once the workload is over: far fewer events than the
/// channel holds, so nothing is dropped from there on.
const FREES_PER_SETTLE: usize = 8;
/// Seed of thread `t`'s generator, xored with `t + 1`.
const SEED: u64 = 0x9E37_79B9_7F4A_7C15;

/// How the allocator's events reach the agent's sink.
#[derive(Clone, Copy, Debug)]
#[allow(
    dead_code,
    reason = "a test binary that includes this file may run one of the two"
)]
pub enum Publish {
    /// The agent's sink is the allocator's: each call's gathered events as the allocator hands
    /// them on.
    Direct,
    /// A [`Batching`] sink in front of the agent's regathers the events into full batches of
    /// [`MAX_BATCH`] handed on with `publish_batch`.
    FullBatches,
}

/// What differs between the runs of the scenario.
pub struct Scenario {
    /// Producer threads.
    pub threads: u64,
    /// Operations (a `malloc` or a `free`) per thread.
    pub ops: usize,
    /// Streams of the device (stream 0 and the ones added): thread `t` allocates on stream
    /// `t % streams`.
    pub streams: u64,
    /// A block's size from the generator's draw for it.
    pub size: fn(u64) -> u64,
    /// When `Some(n)`, a free whose draw is a multiple of `n` first records the block on the
    /// next thread's stream.
    pub record_stream_every: Option<u64>,
    /// How the events reach the agent.
    pub publish: Publish,
    /// The reader's pause between two states.
    pub reader_pause: Duration,
}

/// A sink in front of the agent's that regathers one producer's events (the caching allocator
/// hands it its own batches, which the trait's default `publish_batch` passes on one event at a
/// time) into full batches of `MAX_BATCH` before handing them on with `publish_batch`: a full
/// batch goes at once, and the snapshot marker and an OOM go at once with whatever preceded
/// them (a resync's fence waits for the marker).
struct Batching {
    inner: Arc<dyn EventSink>,
    pending: Mutex<Vec<Event>>,
}

impl Batching {
    fn flush(&self) {
        let mut p = self.pending.lock().unwrap();
        self.inner.publish_batch(&p);
        p.clear();
    }
}

impl EventSink for Batching {
    fn publish(&self, e: &Event) {
        let mut p = self.pending.lock().unwrap();
        p.push(*e);
        if p.len() == MAX_BATCH || matches!(e.action, EventAction::Snapshot | EventAction::Oom) {
            self.inner.publish_batch(&p);
            p.clear();
        }
    }
}

/// Runs the scenario and checks it: see the module's documentation.
pub fn run(scenario: &Scenario) {
    let dev = Arc::new(SimBackend::new(DEVICE_BYTES));
    for s in 1..scenario.streams {
        dev.add_stream(StreamId(s));
    }
    let alloc = Arc::new(CachingAllocator::new(dev, AllocatorConfig::default()));
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dir.path())
        .channel_capacity(CHANNEL)
        .tick(TICK)
        .provider(alloc.clone())
        .spawn()
        .unwrap();
    let batching = match scenario.publish {
        Publish::Direct => None,
        Publish::FullBatches => Some(Arc::new(Batching {
            inner: agent.sink(),
            pending: Mutex::new(Vec::with_capacity(MAX_BATCH)),
        })),
    };
    let sink: Arc<dyn EventSink> = match &batching {
        Some(b) => b.clone(),
        None => agent.sink(),
    };
    alloc.set_event_sink(Some(sink));
    // Everything published so far, folded in: the allocator's gathered events into its sink,
    // the regathering sink's into the agent, then the agent's drain.
    let settle = || {
        alloc.flush_events();
        if let Some(b) = &batching {
            b.flush();
        }
        agent.flush();
    };

    let stop = AtomicBool::new(false);
    let leftovers: Vec<_> = thread::scope(|s| {
        // A reader asks for the state while the workload runs (each state drains): no deadlock
        // with the producers.
        let reader = s.spawn(|| {
            let mut reads = 0u64;
            while !stop.load(Ordering::Acquire) {
                let st = agent.state();
                assert_eq!(st.pipeline.channel_capacity, CHANNEL as u64);
                reads += 1;
                thread::sleep(scenario.reader_pause);
            }
            reads
        });
        let workers: Vec<_> = (0..scenario.threads)
            .map(|t| {
                let alloc = alloc.clone();
                s.spawn(move || work(scenario, t, &alloc))
            })
            .collect();
        let live = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        stop.store(true, Ordering::Release);
        assert!(reader.join().unwrap() > 0, "the reader never read");
        live
    });
    settle();
    let state = agent.state();
    let p = &state.pipeline;
    assert!(
        p.dropped_total > 0,
        "a {CHANNEL}-event channel must overflow: {p:?}"
    );
    assert!(!p.dropped_by_action.is_empty());
    assert_eq!(
        p.dropped_by_action.iter().map(|(_, n)| n).sum::<u64>(),
        p.dropped_total
    );
    assert!(p.resyncs >= 1, "drops lead to a resync: {p:?}");
    assert!(!p.partial);
    assert_eq!(
        state.devices[0].stats.memory_stats(),
        alloc.memory_stats(),
        "after the resync the agent's stats are the allocator's: {p:?}"
    );
    eprintln!(
        "stress ({:?}): {} threads x {} ops, ingested {}, dropped {}, resyncs {}, inconsistent {}",
        scenario.publish,
        scenario.threads,
        scenario.ops,
        p.events_ingested,
        p.dropped_total,
        p.resyncs,
        p.inconsistencies
    );

    // Without drops, the events alone keep it exact from here on.
    let (dropped, resyncs) = (p.dropped_total, p.resyncs);
    for (i, q) in leftovers.into_iter().enumerate() {
        alloc.free(q).unwrap();
        if i % FREES_PER_SETTLE == 0 {
            settle();
        }
    }
    alloc.empty_cache().unwrap();
    settle();
    let state = agent.state();
    assert_eq!(
        state.pipeline.dropped_total, dropped,
        "{:?}",
        state.pipeline
    );
    assert_eq!(state.devices[0].stats.memory_stats(), alloc.memory_stats());
    assert_eq!(state.devices[0].stats.reserved_bytes.0[0].current, 0);
    assert!(state.pipeline.resyncs >= resyncs);
}

/// Thread `t`'s share of the workload: what it leaves allocated.
fn work(scenario: &Scenario, t: u64, alloc: &CachingAllocator<Arc<SimBackend>>) -> Vec<DevicePtr> {
    let mut rng = Rng(SEED ^ (t + 1));
    let stream = StreamId(t % scenario.streams);
    let mut live = Vec::with_capacity(MAX_LIVE);
    for _ in 0..scenario.ops {
        let r = rng.next_u64();
        if live.len() < MAX_LIVE && (live.is_empty() || !r.is_multiple_of(3)) {
            let size = (scenario.size)(r);
            live.push(alloc.malloc(size, stream).expect("16 GiB is enough"));
        } else {
            let p = live.swap_remove((r >> 4) as usize % live.len());
            if scenario
                .record_stream_every
                .is_some_and(|n| r.is_multiple_of(n))
            {
                let next = StreamId((t + 1) % scenario.streams);
                alloc.record_stream(p, next).unwrap();
            }
            alloc.free(p).unwrap();
        }
    }
    live
}
