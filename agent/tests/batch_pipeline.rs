//! Batches through the whole pipeline: events published with `publish_batch` (the batch
//! channel) and with `publish` (the event channel) fold into the same figures as the same
//! events sent one by one, and a caching allocator publishing in batches into a deliberately
//! small channel drops, resynchronises and ends exact.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use allocview_agent::agent::Agent;
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_alloc::event::{CPU_DEVICE, Event, EventAction, EventPool, EventSink, MAX_BATCH};

#[path = "support/small_channel_stress.rs"]
mod small_channel_stress;
use small_channel_stress::{MIB, Publish, Rng, Scenario, mixed_size};

/// Publishes between two flushes at most: with a channel of [`CAPACITY`] events (and so
/// `CAPACITY / MAX_BATCH` batches), nothing can be dropped even if every publish is a batch
/// of one event.
const WAVE: usize = 512;
const CAPACITY: usize = WAVE * MAX_BATCH;

struct Recorder(Mutex<Vec<Event>>);

impl EventSink for Recorder {
    fn publish(&self, e: &Event) {
        self.0.lock().unwrap().push(*e);
    }
}

/// A mixed workload on a caching allocator over the simulated device `device`: its events and
/// the allocator (for its own figures).
fn recorded(device: i32, seed: u64) -> (Vec<Event>, CachingAllocator<Arc<SimBackend>>) {
    let rec = Arc::new(Recorder(Mutex::new(Vec::new())));
    let dev = Arc::new(
        SimBackend::builder()
            .device(device)
            .capacity(16 << 30)
            .build(),
    );
    dev.add_stream(StreamId(1));
    let alloc = CachingAllocator::new(dev, AllocatorConfig::default());
    alloc.set_event_sink(Some(rec.clone()));
    let mut rng = Rng(seed);
    let mut live = Vec::new();
    for _ in 0..4_000 {
        let r = rng.next_u64();
        if live.len() < 64 && (live.is_empty() || !r.is_multiple_of(3)) {
            let size = mixed_size(r);
            live.push(alloc.malloc(size, StreamId((r >> 40) % 2)).unwrap());
        } else {
            let p = live.swap_remove((r >> 4) as usize % live.len());
            alloc.free(p).unwrap();
        }
    }
    // Half of what is live stays allocated; the cache keeps the rest.
    for p in live.drain(..live.len() / 2) {
        alloc.free(p).unwrap();
    }
    alloc.set_event_sink(None);
    let events = rec.0.lock().unwrap().clone();
    (events, alloc)
}

/// Host events of a tracking-allocator-like producer: allocations and frees, some left live.
fn host_events(n: u64) -> Vec<Event> {
    (0..n)
        .map(|i| {
            let action = if i % 3 == 2 {
                EventAction::FreeRequested
            } else {
                EventAction::Alloc
            };
            Event::new(action, CPU_DEVICE, EventPool::Host, 0x5000 + i, 64 + i % 7)
        })
        .collect()
}

fn agent(dir: &std::path::Path) -> Agent {
    Agent::builder()
        .no_listen()
        .dump_dir(dir)
        .channel_capacity(CAPACITY)
        .tick(Duration::from_millis(5))
        .spawn()
        .unwrap()
}

/// One producer's events and how it publishes them.
struct Producer<'a> {
    events: &'a [Event],
    next: usize,
    batched: bool,
}

#[test]
fn the_aggregator_folds_a_mix_of_batches_and_single_events_into_the_same_stats_as_single_events() {
    let (dev0, alloc0) = recorded(0, 0x9E37_79B9_7F4A_7C15);
    let (dev1, alloc1) = recorded(1, 0xD1B5_4A32_D192_ED03);
    let host = host_events(2_000);
    let total = (dev0.len() + dev1.len() + host.len()) as u64;
    assert!(
        dev0.len() > 4_000 && dev1.len() > 4_000,
        "workloads too small"
    );

    let dir = tempfile::tempdir().unwrap();
    let one_by_one = agent(dir.path());
    let mixed = agent(dir.path());

    // One by one: every event through `publish`, the producers interleaved.
    for (i, chunk) in dev0
        .iter()
        .chain(&dev1)
        .chain(&host)
        .collect::<Vec<_>>()
        .chunks(WAVE)
        .enumerate()
    {
        for e in chunk {
            one_by_one.sink().publish(e);
        }
        if i % 4 == 0 {
            one_by_one.flush();
        }
    }
    one_by_one.flush();

    // Mixed: device 0 in batches of 1 to 2 * MAX_BATCH + 7 events (so some are split), device 1
    // and the host one by one, the three producers taking turns.
    let sink = mixed.sink();
    let mut producers = [
        Producer {
            events: &dev0,
            next: 0,
            batched: true,
        },
        Producer {
            events: &dev1,
            next: 0,
            batched: false,
        },
        Producer {
            events: &host,
            next: 0,
            batched: false,
        },
    ];
    let mut rng = Rng(7);
    let mut publishes = 0;
    while producers.iter().any(|p| p.next < p.events.len()) {
        let r = rng.next_u64();
        let p = &mut producers[(r % 3) as usize];
        let n = (1 + (r >> 8) as usize % (2 * MAX_BATCH + 7)).min(p.events.len() - p.next);
        let slice = &p.events[p.next..p.next + n];
        if p.batched {
            sink.publish_batch(slice);
            publishes += n.div_ceil(MAX_BATCH);
        } else {
            for e in slice {
                sink.publish(e);
            }
            publishes += n;
        }
        p.next += n;
        if publishes >= WAVE / 2 {
            mixed.flush();
            publishes = 0;
        }
    }
    mixed.flush();

    let a = one_by_one.state();
    let b = mixed.state();
    for s in [&a, &b] {
        assert_eq!(s.pipeline.events_ingested, total, "{:?}", s.pipeline);
        assert_eq!(s.pipeline.dropped_total, 0, "{:?}", s.pipeline);
        assert_eq!(s.pipeline.inconsistencies, 0, "{:?}", s.pipeline);
        assert_eq!(s.pipeline.resyncs, 0, "{:?}", s.pipeline);
    }
    assert_eq!(a.devices.len(), 2);
    assert_eq!(b.devices.len(), 2);
    for (da, db) in a.devices.iter().zip(&b.devices) {
        assert_eq!(da.device, db.device);
        assert_eq!(da.stats, db.stats, "device {}", da.device);
        assert_eq!(da.segments, db.segments, "device {}", da.device);
    }
    // And both are the allocators' own figures.
    assert_eq!(b.devices[0].stats.memory_stats(), alloc0.memory_stats());
    assert_eq!(b.devices[1].stats.memory_stats(), alloc1.memory_stats());
    assert_eq!(a.host, b.host);
    let h = b.host.expect("host events were published");
    assert_eq!(h.allocations.current, 2_000 - 2 * 666);
}

#[test]
fn full_batches_from_a_caching_allocator_into_a_small_channel_drop_resync_and_end_exact() {
    /// Four producers: they overrun the eight-batch channel between ticks.
    const THREADS: u64 = 4;
    const OPS: usize = 20_000;
    small_channel_stress::run(&Scenario {
        threads: THREADS,
        ops: OPS,
        streams: 2,
        size: |r| 1 + (r >> 8) % (2 * MIB),
        record_stream_every: None,
        publish: Publish::FullBatches,
        reader_pause: Duration::from_millis(3),
    });
}

#[test]
fn the_last_events_of_an_allocator_that_went_quiet_reach_the_agent_without_a_flush() {
    let alloc = Arc::new(CachingAllocator::new(
        Arc::new(SimBackend::new(8 << 30)),
        AllocatorConfig::default(),
    ));
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dir.path())
        .tick(Duration::from_millis(10))
        .provider(alloc.clone())
        .spawn()
        .unwrap();
    alloc.set_event_sink(Some(agent.sink()));
    let warm = alloc.malloc(MIB, StreamId(0)).unwrap();
    alloc.free(warm).unwrap();
    agent.flush();
    // A few cached pairs and one block left allocated: far fewer events than a batch holds,
    // made well within the batch's age, so the allocator keeps them when it stops calling.
    for _ in 0..3 {
        let p = alloc.malloc(4096, StreamId(0)).unwrap();
        alloc.free(p).unwrap();
    }
    let kept = alloc.malloc(2 * MIB, StreamId(0)).unwrap();
    let expected = alloc.memory_stats();
    let agrees = || {
        agent
            .state()
            .device(0)
            .is_some_and(|d| d.stats.memory_stats() == expected)
    };
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !agrees() && std::time::Instant::now() < until {
        thread::sleep(Duration::from_millis(5));
    }
    assert!(
        agrees(),
        "the agent never saw the quiet allocator's last calls (holds events: {})",
        alloc.holds_events()
    );
    assert!(!alloc.holds_events());
    alloc.free(kept).unwrap();
}
