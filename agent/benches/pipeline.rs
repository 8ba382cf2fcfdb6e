//! The event pipeline's costs, each beside its baseline in the same run:
//!
//! - `publish`: one event into the agent's sink (a live aggregator draining it) vs building the
//!   event with no sink (what instrumentation off leaves), and the drop path (a full channel).
//! - `cached_pair`: a cached `malloc` + `free` of the caching allocator on the simulated device,
//!   with and without the agent's sink.
//! - `ingest`: the aggregator folding a recorded caching-allocator event stream (events/s),
//!   and the segment mirror alone.
//! - A one-off burst report (printed): events dropped by a 1 M-event burst at several channel
//!   capacities, which chose `DEFAULT_CHANNEL_CAPACITY`.
//!
//! Times are CPU time (the measured thread's, or for the aggregator the process's while the
//! caller waits), not wall time: on a shared, overloaded machine wall time mostly measures the
//! other tenants. The `_wall` variants give wall time for comparison.

use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allocview_agent::agent::Agent;
use allocview_agent::mirror::DeviceMirror;
use allocview_agent::sink;
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_alloc::event::{Event, EventAction, EventPool, EventSink, now_ns};
use cpu_time::{ProcessTime, ThreadTime};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const MIB: u64 = 1 << 20;

/// Runs `f` `iters` times and returns the CPU time this thread spent
/// (`CLOCK_THREAD_CPUTIME_ID`).
fn cpu_time(iters: u64, mut f: impl FnMut()) -> Duration {
    let t = ThreadTime::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed()
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
    g.bench_function("channel_sink_live_aggregator", |b| {
        b.iter_custom(|iters| {
            cpu_time(iters, || {
                i += 1;
                s.publish(black_box(&event(i)));
            })
        })
    });
    g.bench_function("channel_sink_live_aggregator_wall", |b| {
        b.iter(|| {
            i += 1;
            s.publish(black_box(&event(i)));
        })
    });
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
    // never reached), then one flush folds it in: mirror, stats, histograms, recent events.
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(std::env::temp_dir().join("allocview-bench-dumps"))
        .channel_capacity(2 * n + 2)
        .tick(Duration::from_secs(3600))
        .spawn()
        .unwrap();
    let s = agent.sink();
    // CPU time of the process while the calling thread waits in `flush`: the aggregator
    // thread's time folding the batch in (nothing else runs).
    g.bench_function("aggregator_flush", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                for e in &events {
                    s.publish(e);
                }
                let t = ProcessTime::now();
                agent.flush();
                total += t.elapsed();
            }
            total
        })
    });
    g.bench_function("aggregator_flush_wall", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                for e in &events {
                    s.publish(e);
                }
                let t = Instant::now();
                agent.flush();
                total += t.elapsed();
            }
            total
        })
    });
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

criterion_group!(benches, publish, cached_pair, ingest, burst_report);
criterion_main!(benches);
