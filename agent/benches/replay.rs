//! Replay throughput on the largest fixture trace (`cs336-ctx256-forward-mixed.pickle`, 6,587
//! events), in events per second, beside a baseline in the same run: one pass over the trace
//! that only builds the recorded-to-replayed address map (the bookkeeping every replay does,
//! without an allocator). Each run is measured end to end (reconstructing and installing the
//! initial state of 688 segments, the trace, the final comparison) and for the trace alone
//! (`*_events_only`, set-up outside the timing; the returned replayer is dropped untimed).
//! A second group replays a long synthetic trace in the steady state of a training loop
//! (every allocation served from the cache), the same baseline beside it.
//!
//! `cargo bench -p allocview-agent --bench replay -- --warm-up-time 1 --measurement-time 3`

use std::collections::HashMap;
use std::hint::black_box;
use std::path::PathBuf;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

use allocview_agent::replay::engine::{self, Placement, Replayer, RunOptions};
use allocview_agent::snapshot_file;
use allocview_alloc::caching::AllocatorConfig;
use allocview_alloc::snapshot::{Snapshot, TraceAction, TraceEntry};

/// The largest fixture with a trace.
const FIXTURE: &str = "cs336-ctx256-forward-mixed.pickle";

fn fixture() -> Option<Snapshot> {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/fixtures/pytorch-snapshots"
    ))
    .join(FIXTURE);
    match snapshot_file::load(&path) {
        Ok(s) => Some(s),
        Err(e) => {
            println!("skipped: fixtures not found ({e})");
            None
        }
    }
}

/// The baseline: the address map alone.
fn address_map_only(snapshot: &Snapshot) -> usize {
    let mut map: HashMap<u64, u64> = HashMap::with_capacity(snapshot.device_traces[0].len() / 2);
    for e in &snapshot.device_traces[0] {
        match e.action {
            TraceAction::Alloc => {
                map.insert(e.addr, e.addr);
            }
            TraceAction::FreeRequested => {
                map.remove(&e.addr);
            }
            _ => {}
        }
    }
    map.len()
}

/// Events in the synthetic steady-state trace.
const STEADY_EVENTS: usize = 200_000;

/// A long trace whose allocations are all served from the cache after a warm-up (the steady
/// state of a training loop): 64 live blocks of mixed sizes on two streams, each freed and
/// allocated again in turn.
fn steady_state() -> Snapshot {
    let entry = TraceEntry::new;
    let sizes = [512u64, 4096, 65_536, 1 << 20, 3 << 20, 12 << 20];
    let mut t = Vec::with_capacity(STEADY_EVENTS);
    let mut i = 0u64;
    while t.len() < STEADY_EVENTS {
        let slot = i % 64;
        let size = sizes[(slot % sizes.len() as u64) as usize];
        let stream = slot % 2;
        let addr = 0x7f00_0000_0000 + slot * (64 << 20);
        if i >= 64 {
            t.push(entry(TraceAction::FreeRequested, addr, size, stream));
            t.push(entry(TraceAction::FreeCompleted, addr, size, stream));
        }
        t.push(entry(TraceAction::Alloc, addr, size, stream));
        i += 1;
    }
    Snapshot {
        device_traces: vec![t],
        ..Snapshot::default()
    }
}

fn bench_steady_state(c: &mut Criterion) {
    let snapshot = steady_state();
    let mut group = c.benchmark_group("replay_steady_state");
    group.throughput(Throughput::Elements(snapshot.device_traces[0].len() as u64));
    group.sample_size(20);
    group.bench_function("baseline_address_map", |b| {
        b.iter(|| black_box(address_map_only(black_box(&snapshot))))
    });
    let opts = RunOptions {
        config: AllocatorConfig::default(),
        label: "steady".into(),
        device_memory: None,
        placement: Placement::Free,
        keep_history: false,
    };
    group.bench_function("what_if_defaults", |b| {
        b.iter(|| {
            let r = engine::run(black_box(&snapshot), &opts, &mut |_| {}).unwrap();
            black_box(r.figures.peak_reserved)
        })
    });
    group.finish();
}

fn bench(c: &mut Criterion) {
    let Some(snapshot) = fixture() else { return };
    let events = snapshot.device_traces[0].len() as u64;
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(events));
    group.bench_function("baseline_address_map", |b| {
        b.iter(|| black_box(address_map_only(black_box(&snapshot))))
    });
    for (name, placement) in [
        ("fidelity_recorded_addresses", Placement::Recorded),
        ("what_if_defaults", Placement::Free),
    ] {
        let opts = RunOptions {
            config: AllocatorConfig::default(),
            label: name.into(),
            device_memory: None,
            placement,
            keep_history: false,
        };
        // End to end: initial state reconstructed and installed, trace, final comparison.
        group.bench_function(name, |b| {
            b.iter(|| {
                let r = engine::run(black_box(&snapshot), &opts, &mut |_| {}).unwrap();
                black_box(r.figures.peak_reserved)
            })
        });
        // The trace alone, the set-up done outside the timing.
        group.bench_function(format!("{name}_events_only"), |b| {
            b.iter_batched(
                || Replayer::new(&snapshot, &opts),
                |mut r| {
                    r.replay_events(&mut |_| {});
                    r
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench, bench_steady_state);
criterion_main!(benches);
