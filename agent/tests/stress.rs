//! Eight threads hammer one caching allocator that publishes into an agent with a deliberately
//! small channel: drops are counted and reported, the agent resynchronises, the final stats are
//! exact, nothing deadlocks.
//!
//! Operations per thread: 50,000 by default (a debug build on 2 cores stays well under 30 s);
//! `ALLOCVIEW_STRESS_OPS=1000000` runs the full 8 x 1M.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use allocview_agent::agent::Agent;
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};

const THREADS: u64 = 8;
const DEFAULT_OPS: usize = 50_000;
const MAX_LIVE: usize = 32;
const MIB: u64 = 1 << 20;
/// Small enough that eight producers overrun it between ticks.
const CHANNEL: usize = 256;

/// The stress tests' xorshift generator, shared with the other crates' (this package cannot
/// depend on `allocview-tests`, so the file is included).
#[path = "../../tests/src/xorshift.rs"]
mod xorshift;
use xorshift::Rng;

fn ops() -> usize {
    std::env::var("ALLOCVIEW_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_OPS)
}

#[test]
fn eight_threads_with_a_small_channel_drop_resync_and_end_exact() {
    let dev = Arc::new(SimBackend::new(16 << 30));
    for s in 1..3 {
        dev.add_stream(StreamId(s));
    }
    let alloc = Arc::new(CachingAllocator::new(dev, AllocatorConfig::default()));
    let dir = tempfile::tempdir().unwrap();
    let agent = Arc::new(
        Agent::builder()
            .no_listen()
            .dump_dir(dir.path())
            .channel_capacity(CHANNEL)
            .tick(Duration::from_millis(10))
            .provider(alloc.clone())
            .spawn()
            .unwrap(),
    );
    alloc.set_event_sink(Some(agent.sink()));
    let ops = ops();
    let done = Arc::new(AtomicBool::new(false));
    // A reader asks for the state while the workload runs: no deadlock with producers.
    let reader = {
        let (agent, done) = (agent.clone(), done.clone());
        thread::spawn(move || {
            let mut reads = 0u64;
            while !done.load(Ordering::Acquire) {
                let s = agent.state();
                assert!(s.pipeline.channel_capacity == CHANNEL as u64);
                reads += 1;
                thread::sleep(Duration::from_millis(5));
            }
            reads
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let alloc = alloc.clone();
            thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1));
                let stream = StreamId(t % 3);
                let mut live = Vec::with_capacity(MAX_LIVE);
                for _ in 0..ops {
                    let r = rng.next_u64();
                    if live.len() < MAX_LIVE && (live.is_empty() || !r.is_multiple_of(3)) {
                        let size = match r % 10 {
                            0..=7 => 1 + (r >> 8) % MIB,
                            _ => MIB + (r >> 8) % (8 * MIB),
                        };
                        live.push(alloc.malloc(size, stream).expect("16 GiB is enough"));
                    } else {
                        let p = live.swap_remove((r >> 4) as usize % live.len());
                        if r.is_multiple_of(7) {
                            alloc.record_stream(p, StreamId((t + 1) % 3)).unwrap();
                        }
                        alloc.free(p).unwrap();
                    }
                }
                live
            })
        })
        .collect();
    let mut leftovers = Vec::new();
    for w in workers {
        leftovers.extend(w.join().unwrap());
    }
    done.store(true, Ordering::Release);
    assert!(reader.join().unwrap() > 0);

    agent.flush();
    let state = agent.state();
    let p = &state.pipeline;
    assert!(
        p.dropped_total > 0,
        "a {CHANNEL}-event channel must overflow: {p:?}"
    );
    assert!(!p.dropped_by_action.is_empty());
    assert!(p.resyncs >= 1, "drops lead to a resync: {p:?}");
    assert!(!p.partial);
    assert_eq!(
        state.devices[0].stats.memory_stats(),
        alloc.memory_stats(),
        "after the resync the agent's stats are the allocator's: {p:?}"
    );
    eprintln!(
        "stress: {} threads x {ops} ops, ingested {}, dropped {}, resyncs {}, inconsistent {}",
        THREADS, p.events_ingested, p.dropped_total, p.resyncs, p.inconsistencies
    );

    // Without drops, events alone keep it exact from here on.
    let resyncs = p.resyncs;
    for q in leftovers {
        alloc.free(q).unwrap();
    }
    alloc.empty_cache().unwrap();
    agent.flush();
    let state = agent.state();
    assert_eq!(state.devices[0].stats.memory_stats(), alloc.memory_stats());
    assert_eq!(state.devices[0].stats.reserved_bytes.0[0].current, 0);
    assert!(state.pipeline.resyncs >= resyncs);
}
