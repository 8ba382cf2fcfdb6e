//! The event pipeline's costs, each beside its baseline in the same run:
//!
//! - `publish`: one event into the agent's sink (a live aggregator draining it) vs building the
//!   event with no sink (what instrumentation off leaves), and the drop path (a full channel).
//! - `publish_32`: 32 events into the agent's sink, one `publish` each vs one `publish_batch`
//!   of 32 (and batches of 4), with the aggregator parked (nothing drains while the clock
//!   runs; the channels are emptied between timed chunks) and live (draining on the other
//!   core). Throughput is in events, so criterion's figures are per event.
//! - `publish_batch_size_parked`: one `publish_batch` of 1, 4, 8, 16 or 32 events vs one
//!   `publish` (`single`), aggregator parked: what a batch costs by size (its 2 KiB message).
//! - `publish_32_paced`: 32 events (one by one, one batch, batches of 4) into a live agent after
//!   ~3 us of arithmetic each round, so nothing floods; `pace_only`, the arithmetic alone, is
//!   the baseline to subtract.
//! - `cached_pair`: a cached `malloc` + `free` of the caching allocator on the simulated device,
//!   without a sink, with a sink that ignores the batches it is given (the allocator's own cost
//!   of gathering events) and with the agent's sink.
//! - `ingest`: the aggregator folding a recorded caching-allocator event stream (events/s),
//!   published as single events vs as batches of 32, and the segment mirror alone.
//! - A one-off burst report (printed): events dropped by a 1 M-event burst at several channel
//!   capacities, which chose `DEFAULT_CHANNEL_CAPACITY`.
//!
//! Times are CPU time (the measured thread's, or for the aggregator the process's while the
//! caller waits), not wall time: on a shared, overloaded machine wall time mostly measures the
//! other tenants. The `_wall` variants give wall time for comparison.

#[path = "../tests/support/publish.rs"]
mod publish;

use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allocview_agent::agent::Agent;
use allocview_agent::mirror::DeviceMirror;
use allocview_agent::sink;
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_alloc::event::{Event, EventAction, EventPool, EventSink, MAX_BATCH, now_ns};
use cpu_time::{ProcessTime, ThreadTime};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use publish::Publish;

const MIB: u64 = 1 << 20;

/// The clock a benchmark reads.
#[derive(Clone, Copy)]
enum Clock {
    /// CPU time of the measuring thread (`CLOCK_THREAD_CPUTIME_ID`).
    Thread,
    /// CPU time of the process (`CLOCK_PROCESS_CPUTIME_ID`): the aggregator thread's while
    /// the measuring thread waits for it.
    Process,
    /// Wall time (the `_wall` variants).
    Wall,
}

impl Clock {
    /// The time `f` takes on this clock.
    #[inline(always)]
    fn time(self, f: impl FnOnce()) -> Duration {
        match self {
            Clock::Thread => {
                let t = ThreadTime::now();
                f();
                t.elapsed()
            }
            Clock::Process => {
                let t = ProcessTime::now();
                f();
                t.elapsed()
            }
            Clock::Wall => {
                let t = Instant::now();
                f();
                t.elapsed()
            }
        }
    }

    /// Runs `f` `iters` times and returns the time the loop took on this clock (with
    /// [`Clock::Wall`], what criterion's own `iter` measures).
    #[inline(always)]
    fn run(self, iters: u64, mut f: impl FnMut()) -> Duration {
        self.time(|| {
            for _ in 0..iters {
                f();
            }
        })
    }
}

/// Runs `f` `iters` times and returns the CPU time this thread spent.
fn cpu_time(iters: u64, f: impl FnMut()) -> Duration {
    Clock::Thread.run(iters, f)
}

fn event(i: u64) -> Event {
    Event {
        time_ns: i,
        requested: 4000,
        latency_ns: 100,
        ..Event::new(
            EventAction::Alloc,
            0,
            EventPool::Small,
            0x7f00_0000_0000 + i,
            4096,
        )
    }
}

fn quiet_agent(capacity: usize, tick: Duration) -> Agent {
    Agent::builder()
        .no_listen()
        .dump_dir(std::env::temp_dir().join("allocview-bench-dumps"))
        .channel_capacity(capacity)
        .tick(tick)
        .recent_events(0)
        .spawn()
        .unwrap()
}

fn publish(c: &mut Criterion) {
    let mut g = c.benchmark_group("publish");
    g.throughput(Throughput::Elements(1));
    let mut i = 0u64;
    g.bench_function("no_sink_build_only", |b| {
        let sink: Option<Arc<dyn EventSink>> = None;
        b.iter_custom(|iters| {
            cpu_time(iters, || {
                i += 1;
                if let Some(s) = black_box(&sink) {
                    s.publish(&event(i));
                } else {
                    black_box(event(i));
                }
            })
        })
    });
    // Events that do not fit the mirror are counted and cheap to fold: the aggregator keeps up,
    // which is what a well-sized channel looks like.
    let agent = quiet_agent(sink::DEFAULT_CHANNEL_CAPACITY, Duration::from_millis(100));
    let s = agent.sink();
    for (name, clock) in [
        ("channel_sink_live_aggregator", Clock::Thread),
        ("channel_sink_live_aggregator_wall", Clock::Wall),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                clock.run(iters, || {
                    i += 1;
                    s.publish(black_box(&event(i)));
                })
            })
        });
    }
    let (full, _rx) = sink::channel(2);
    full.publish(&event(0));
    full.publish(&event(1));
    g.bench_function("channel_sink_full_drop", |b| {
        b.iter_custom(|iters| {
            cpu_time(iters, || {
                i += 1;
                full.publish(black_box(&event(i)));
            })
        })
    });
    g.finish();
    drop(agent);
}

/// Batches of 4 events: what a producer that publishes each call's events at its end sends.
const SMALL_BATCH: usize = 4;

/// Sends `events` `iters` times as `publish` says into channels nobody drains while the clock
/// runs: timed in chunks of `per_chunk` calls (chosen to fill at most half a channel: no wake-up,
/// no drop), the channels emptied between chunks, off the clock. CPU time of this thread.
fn parked(
    iters: u64,
    per_chunk: u64,
    events: &[Event],
    sink: &sink::ChannelSink,
    rx: &sink::EventReceiver,
    publish: Publish,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let n = per_chunk.min(iters - done);
        let t = ThreadTime::now();
        for _ in 0..n {
            publish.send(sink, black_box(events));
        }
        total += t.elapsed();
        while rx.try_recv().is_some() {}
        while rx.try_recv_batch().is_some() {}
        done += n;
    }
    total
}

fn publish_32(c: &mut Criterion) {
    let mut g = c.benchmark_group("publish_32");
    g.throughput(Throughput::Elements(MAX_BATCH as u64));
    let events: Vec<Event> = (0..MAX_BATCH as u64).map(event).collect();
    let (one_by_one, batch) = (Publish::OneByOne, Publish::Batch);
    let small_batches = Publish::BatchesOf(SMALL_BATCH);
    let (bare, rx) = sink::channel(sink::DEFAULT_CHANNEL_CAPACITY);
    // Calls that fill half a channel: 32 single events, 1 batch or 8 batches each.
    let half_events = (rx.shared().capacity() / 2 / MAX_BATCH) as u64;
    let half_batches = (rx.shared().batch_capacity() / 2) as u64;
    let small_per_call = (MAX_BATCH / SMALL_BATCH) as u64;
    g.bench_function("one_by_one_parked", |b| {
        b.iter_custom(|iters| parked(iters, half_events, &events, &bare, &rx, one_by_one))
    });
    g.bench_function("batch_of_32_parked", |b| {
        b.iter_custom(|iters| parked(iters, half_batches, &events, &bare, &rx, batch))
    });
    g.bench_function("batches_of_4_parked", |b| {
        b.iter_custom(|iters| {
            let per_chunk = half_batches / small_per_call;
            parked(iters, per_chunk, &events, &bare, &rx, small_batches)
        })
    });
    assert_eq!(rx.shared().dropped_total(), 0, "parked runs must not drop");
    g.finish();

    // What one `publish_batch` costs by batch size, parked: the message is 2 KiB whatever the
    // batch holds, so small batches pay for it (`single` is one `publish`, for comparison).
    let mut g = c.benchmark_group("publish_batch_size_parked");
    g.throughput(Throughput::Elements(1));
    g.bench_function("single", |b| {
        b.iter_custom(|iters| {
            let per_chunk = half_events * MAX_BATCH as u64;
            parked(iters, per_chunk, &events[..1], &bare, &rx, one_by_one)
        })
    });
    for n in [1, 4, 8, 16, MAX_BATCH] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("batch_of_{n}"), |b| {
            b.iter_custom(|iters| parked(iters, half_batches, &events[..n], &bare, &rx, batch))
        });
    }
    assert_eq!(rx.shared().dropped_total(), 0, "parked runs must not drop");
    g.finish();
    let mut g = c.benchmark_group("publish_32");
    g.throughput(Throughput::Elements(MAX_BATCH as u64));
    drop((bare, rx));
    let agent = quiet_agent(sink::DEFAULT_CHANNEL_CAPACITY, Duration::from_millis(100));
    let s = agent.channel_sink().clone();
    for (name, publish, clock) in [
        ("one_by_one_live", one_by_one, Clock::Thread),
        ("batch_of_32_live", batch, Clock::Thread),
        ("one_by_one_live_wall", one_by_one, Clock::Wall),
        ("batch_of_32_live_wall", batch, Clock::Wall),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| clock.run(iters, || publish.send(s.as_ref(), black_box(&events))))
        });
    }
    g.finish();
    let p = agent.state().pipeline;
    eprintln!(
        "publish_32 live (flooding): {} ingested, {} dropped",
        p.events_ingested, p.dropped_total
    );
    drop(agent);

    // Live without flooding: between two rounds of 32 events the publisher does PACE_STEPS of
    // dependent arithmetic (~3 us), slower than the aggregator folds 32 events, so (nearly)
    // every event takes a slot while the aggregator drains on the other core. The publish cost
    // per event is (round - pace_only) / 32. The pace starts with a full fence, so the
    // publish's stores (their cache misses) are paid before it rather than hidden under it.
    let mut g = c.benchmark_group("publish_32_paced");
    g.throughput(Throughput::Elements(MAX_BATCH as u64));
    let agent = quiet_agent(sink::DEFAULT_CHANNEL_CAPACITY, Duration::from_millis(100));
    let s = agent.channel_sink().clone();
    g.bench_function("pace_only", |b| {
        b.iter_custom(|iters| cpu_time(iters, pace))
    });
    for (name, publish) in [
        ("one_by_one_live", one_by_one),
        ("batch_of_32_live", batch),
        ("batches_of_4_live", small_batches),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                cpu_time(iters, || {
                    pace();
                    publish.send(s.as_ref(), black_box(&events))
                })
            })
        });
    }
    g.finish();
    let p = agent.state().pipeline;
    eprintln!(
        "publish_32_paced: {} ingested, {} dropped",
        p.events_ingested, p.dropped_total
    );
}

/// Steps of [`pace`]'s dependent arithmetic (a multiply and an add each).
const PACE_STEPS: u64 = 4000;

/// Work that stands for the program between two rounds of events (~3 us).
fn pace() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    let mut x = 0u64;
    for i in 0..PACE_STEPS {
        x = black_box(x.wrapping_mul(31).wrapping_add(i));
    }
    black_box(x);
}

fn cached_pair(c: &mut Criterion) {
    let mut g = c.benchmark_group("cached_pair");
    g.throughput(Throughput::Elements(1));
    let dev = Arc::new(SimBackend::new(8 << 30));
    let alloc = CachingAllocator::new(dev, AllocatorConfig::default());
    // Warm the cache: the pair below is served without a device call.
    let p = alloc.malloc(4096, StreamId(0)).unwrap();
    alloc.free(p).unwrap();
    g.bench_function("uninstrumented", |b| {
        b.iter_custom(|iters| {
            cpu_time(iters, || {
                let p = alloc.malloc(black_box(4096), StreamId(0)).unwrap();
                alloc.free(p).unwrap();
            })
        })
    });
    // A sink that takes each batch and does nothing with it: the allocator's own cost of
    // gathering and publishing events, without the agent's channel.
    struct NullSink;
    impl EventSink for NullSink {
        fn publish(&self, e: &Event) {
            black_box(e);
        }
        fn publish_batch(&self, events: &[Event]) {
            black_box(events);
        }
    }
    alloc.set_event_sink(Some(Arc::new(NullSink)));
    g.bench_function("instrumented_null_sink", |b| {
        b.iter_custom(|iters| {
            cpu_time(iters, || {
                let p = alloc.malloc(black_box(4096), StreamId(0)).unwrap();
                alloc.free(p).unwrap();
            })
        })
    });
    let agent = quiet_agent(sink::DEFAULT_CHANNEL_CAPACITY, Duration::from_millis(100));
    alloc.set_event_sink(Some(agent.sink()));
    g.bench_function("instrumented_agent", |b| {
        b.iter_custom(|iters| {
            cpu_time(iters, || {
                let p = alloc.malloc(black_box(4096), StreamId(0)).unwrap();
                alloc.free(p).unwrap();
            })
        })
    });
    alloc.set_event_sink(None);
    g.finish();
    let p = agent.state().pipeline;
    eprintln!(
        "cached_pair: {} ingested, {} dropped",
        p.events_ingested, p.dropped_total
    );
    drop(agent);
}

/// Records the events of a mixed workload that ends with everything freed and the cache
/// emptied, so the stream can be replayed into the same mirror again and again.
fn recorded_stream() -> Vec<Event> {
    struct Rec(Mutex<Vec<Event>>);
    impl EventSink for Rec {
        fn publish(&self, e: &Event) {
            self.0.lock().unwrap().push(*e);
        }
    }
    let rec = Arc::new(Rec(Mutex::new(Vec::new())));
    let dev = Arc::new(SimBackend::new(64 << 30));
    for s in 1..4 {
        dev.add_stream(StreamId(s));
    }
    let alloc = CachingAllocator::new(dev, AllocatorConfig::default());
    alloc.set_event_sink(Some(rec.clone()));
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut live = Vec::new();
    for _ in 0..200_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if live.len() < 256 && (live.is_empty() || !x.is_multiple_of(3)) {
            let size = if x % 10 < 8 {
                1 + (x >> 8) % MIB
            } else {
                MIB + (x >> 8) % (16 * MIB)
            };
            live.push(alloc.malloc(size, StreamId((x >> 40) % 4)).unwrap());
        } else {
            let p = live.swap_remove((x >> 4) as usize % live.len());
            alloc.free(p).unwrap();
        }
    }
    for p in live {
        alloc.free(p).unwrap();
    }
    alloc.empty_cache().unwrap();
    alloc.set_event_sink(None);
    let v = rec.0.lock().unwrap().clone();
    let t = now_ns();
    v.into_iter().map(|e| Event { time_ns: t, ..e }).collect()
}

fn ingest(c: &mut Criterion) {
    let events = recorded_stream();
    let n = events.len();
    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements(n as u64));
    g.sample_size(10);
    g.bench_function("mirror_only", |b| {
        b.iter_custom(|iters| {
            let mut m = DeviceMirror::new(0, None);
            cpu_time(iters, || {
                for e in &events {
                    let _ = black_box(m.apply(e));
                }
            })
        })
    });
    // The whole aggregator: the stream sits in the channel (no wake-up: half capacity is
    // never reached, in events or in batches of 32), then one flush folds it in: mirror,
    // stats, histograms, recent events.
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(std::env::temp_dir().join("allocview-bench-dumps"))
        .channel_capacity(2 * n + 4 * MAX_BATCH)
        .tick(Duration::from_secs(3600))
        .spawn()
        .unwrap();
    let s = agent.sink();
    // Each pass is published off the clock, then one `flush` is timed: on the process's CPU
    // time (the aggregator thread's time folding the pass in while the calling thread waits;
    // nothing else runs) or on the wall. `_batches`: the same stream published with
    // `publish_batch`, which sends one message per MAX_BATCH events.
    for (name, publish, clock) in [
        ("aggregator_flush", Publish::OneByOne, Clock::Process),
        ("aggregator_flush_wall", Publish::OneByOne, Clock::Wall),
        ("aggregator_flush_batches", Publish::Batch, Clock::Process),
        ("aggregator_flush_batches_wall", Publish::Batch, Clock::Wall),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    publish.send(s.as_ref(), &events);
                    total += clock.time(|| agent.flush());
                }
                total
            })
        });
    }
    g.finish();
    let st = agent.state();
    eprintln!(
        "ingest: {} events per pass, {} ingested, {} dropped, {} inconsistent",
        n, st.pipeline.events_ingested, st.pipeline.dropped_total, st.pipeline.inconsistencies
    );
}

/// Not a timing: how many events of a 1 M-event burst (published as fast as one thread can)
/// each capacity drops with the default tick.
fn burst_report(_c: &mut Criterion) {
    const BURST: u64 = 1_000_000;
    for cap in [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18] {
        let agent = quiet_agent(cap, Duration::from_millis(100));
        let s = agent.sink();
        let t = ThreadTime::now();
        for i in 0..BURST {
            s.publish(&event(i));
        }
        let elapsed = t.elapsed();
        agent.flush();
        let p = agent.state().pipeline;
        eprintln!(
            "burst: capacity {cap:>7}: dropped {:>7} of {BURST} ({:.2}%), {:.1} ns CPU/publish",
            p.dropped_total,
            100.0 * p.dropped_total as f64 / BURST as f64,
            elapsed.as_nanos() as f64 / BURST as f64
        );
    }
}

criterion_group!(
    benches,
    publish,
    publish_32,
    cached_pair,
    ingest,
    burst_report
);
criterion_main!(benches);
