//! What a Prometheus scrape of `/metrics` costs, by the number of devices on the page (each
//! device is about 340 series: the stat arrays per pool, two pools' histograms):
//!
//! - `render`: writing the page of a state (`openmetrics`, what Prometheus asks for, and
//!   `text`, the classic format), beside `clone_state`, the copy of the same state the scrape takes
//!   first: the baseline the rendering adds to.
//! - `scrape`: one `GET /metrics` over loopback TCP to a live agent with that many devices
//!   (state copy on the aggregator's thread, rendering, HTTP), beside `connect_404`, a request
//!   for another path on the same listener (HTTP and TCP alone).
//!
//! CPU time, not wall time (on a shared, overloaded machine wall time mostly measures the
//! other tenants): `render` the measuring thread's, `scrape` the whole process's (the client,
//! the listener's, its connection threads' and the aggregator's).

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use allocview_agent::agent::Agent;
use allocview_agent::prometheus::{Format, render, render_as};
use allocview_agent::state::{
    AgentState, DeviceState, HistogramSet, HistogramSummary, Histograms, PoolHistograms, PoolKey,
};
use allocview_alloc::event::{Event, EventAction, EventPool};
use cpu_time::{ProcessTime, ThreadTime};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

/// `iters` runs of `f` on the measuring thread's CPU clock.
fn thread_time<T>(iters: u64, mut f: impl FnMut() -> T) -> std::time::Duration {
    let start = ThreadTime::now();
    for _ in 0..iters {
        black_box(f());
    }
    start.elapsed()
}

/// `iters` runs of `f` on the process's CPU clock.
fn process_time<T>(iters: u64, mut f: impl FnMut() -> T) -> std::time::Duration {
    let start = ProcessTime::now();
    for _ in 0..iters {
        black_box(f());
    }
    start.elapsed()
}

/// Device counts measured.
const DEVICES: [usize; 3] = [1, 8, 64];

/// A histogram summary with values in buckets 2^10..2^30.
fn summary() -> HistogramSummary {
    let buckets: Vec<(u64, u64)> = (10..30).map(|b| (1u64 << b, 100 + b as u64)).collect();
    let count = buckets.iter().map(|b| b.1).sum();
    HistogramSummary {
        count,
        min: 1 << 9,
        max: 1 << 29,
        mean: 1e6,
        sum: 1e6 * count as f64,
        p50: 1 << 20,
        p90: 1 << 25,
        p99: 1 << 28,
        buckets,
    }
}

/// A state with `n` devices, each with both pools' histograms.
fn state(n: usize) -> AgentState {
    let set = HistogramSet {
        size: summary(),
        lifetime: summary(),
        latency: summary(),
    };
    let devices = (0..n)
        .map(|d| DeviceState {
            device: d as i32,
            total_memory: 80 << 30,
            histograms: Histograms {
                by_pool: [PoolKey::Small, PoolKey::Large]
                    .map(|pool| PoolHistograms {
                        pool,
                        set: set.clone(),
                    })
                    .into(),
                ..Histograms::default()
            },
            ..DeviceState::default()
        })
        .collect();
    AgentState {
        devices,
        ..AgentState::default()
    }
}

/// A GET of `path`; the response's length.
fn get(addr: SocketAddr, path: &str) -> usize {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = Vec::new();
    s.read_to_end(&mut body).unwrap();
    body.len()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("render");
    for n in DEVICES {
        let s = state(n);
        let series = render(&s).lines().filter(|l| !l.starts_with('#')).count();
        println!("{n} devices: {series} samples, {} bytes", render(&s).len());
        g.bench_with_input(BenchmarkId::new("clone_state", n), &s, |b, s| {
            b.iter_custom(|n| thread_time(n, || s.clone()))
        });
        g.bench_with_input(BenchmarkId::new("openmetrics", n), &s, |b, s| {
            b.iter_custom(|n| thread_time(n, || render(s)))
        });
        g.bench_with_input(BenchmarkId::new("text", n), &s, |b, s| {
            b.iter_custom(|n| thread_time(n, || render_as(s, Format::Text)))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("scrape");
    for n in DEVICES {
        let agent = Agent::builder()
            .no_listen()
            .metrics("127.0.0.1:0".parse().unwrap())
            .dump_dir(std::env::temp_dir().join("allocview-bench-dumps"))
            .spawn()
            .unwrap();
        for d in 0..n {
            for (i, size) in [(0u64, 2u64 << 20), (1, 20 << 20)] {
                let pool = if i == 0 {
                    EventPool::Small
                } else {
                    EventPool::Large
                };
                let addr = 0x1000_0000 * (d as u64 + 1) + i * (64 << 20);
                agent.sink().publish(&Event::new(
                    EventAction::SegmentAlloc,
                    d as i16,
                    pool,
                    addr,
                    size,
                ));
                let mut alloc = Event::new(EventAction::Alloc, d as i16, pool, addr, size / 2);
                alloc.requested = size / 2;
                agent.sink().publish(&alloc);
            }
        }
        agent.flush();
        let addr = agent.metrics_addr().unwrap();
        g.bench_function(BenchmarkId::new("get_metrics", n), |b| {
            b.iter_custom(|n| process_time(n, || get(addr, "/metrics")))
        });
        g.bench_function(BenchmarkId::new("connect_404", n), |b| {
            b.iter_custom(|n| process_time(n, || get(addr, "/other")))
        });
        agent.shutdown();
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
