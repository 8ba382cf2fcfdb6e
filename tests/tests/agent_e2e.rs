//! End to end: a `CachingAllocator` on the simulated device publishes into an agent; after a
//! random workload (several streams, record_stream, empty_cache, an OOM) the agent's stats are
//! the allocator's own, key for key, and its segment mirror is the allocator's snapshot.

use std::sync::Arc;

use allocview_agent::agent::Agent;
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_alloc::snapshot::SegmentInfo;
use allocview_tests::xorshift::Rng;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const STREAMS: u64 = 3;
/// Live blocks at most (about 400 MiB on average: OOMs stay rare until the final one).
const MAX_LIVE: usize = 60;

type Alloc = CachingAllocator<Arc<SimBackend>>;

/// The layout of segments and blocks, without frames (the mirror records none) and without
/// the requested size of free blocks (PyTorch reports the last request there).
/// `(address, size, state)` of a block.
type BlockLayout = (u64, u64, &'static str);

/// `(address, size, stream, expandable, blocks)` of a segment.
type SegmentLayout = (u64, u64, u64, bool, Vec<BlockLayout>);

fn layout(segments: &[SegmentInfo]) -> Vec<SegmentLayout> {
    segments
        .iter()
        .map(|s| {
            (
                s.address,
                s.total_size,
                s.stream,
                s.is_expandable,
                s.blocks
                    .iter()
                    .map(|b| (b.address, b.size, b.state.as_str()))
                    .collect(),
            )
        })
        .collect()
}

fn run_workload(config: &str, seed: u64) {
    let capacity = 2 * GIB;
    let dev = Arc::new(
        SimBackend::builder()
            .capacity(capacity)
            .auto_complete(false)
            .build(),
    );
    for s in 1..STREAMS {
        dev.add_stream(StreamId(s));
    }
    let alloc: Arc<Alloc> = Arc::new(CachingAllocator::new(
        dev.clone(),
        AllocatorConfig::parse(config).unwrap(),
    ));
    let dumps = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dumps.path())
        .provider(alloc.clone())
        .spawn()
        .unwrap();
    alloc.set_event_sink(Some(agent.sink()));

    let mut rng = Rng(seed);
    let mut live: Vec<u64> = Vec::new();
    for i in 0..6_000 {
        let r = rng.next_u64();
        match r % 100 {
            0..=54 if live.len() < MAX_LIVE => {
                let size = match (r >> 8) % 10 {
                    0..=5 => 1 + (r >> 16) % MIB,
                    6..=8 => MIB + (r >> 16) % (9 * MIB),
                    _ => 10 * MIB + (r >> 16) % (60 * MIB),
                };
                let stream = StreamId((r >> 40) % STREAMS);
                if let Ok(p) = alloc.malloc(size, stream) {
                    live.push(p);
                }
            }
            0..=89 if !live.is_empty() => {
                let p = live.swap_remove((r >> 8) as usize % live.len());
                if r.is_multiple_of(5) {
                    let other = StreamId((r >> 20) % STREAMS);
                    alloc.record_stream(p, other).unwrap();
                    dev.submit_work(other);
                }
                alloc.free(p).unwrap();
            }
            90..=96 => dev.complete_stream(StreamId((r >> 8) % STREAMS)),
            97 | 98 => {
                dev.complete_all();
                alloc.empty_cache().unwrap();
            }
            _ if i % 1000 == 999 => alloc.reset_peak_stats(),
            _ => {}
        }
    }
    // An OOM: more than the device has.
    assert!(alloc.malloc(3 * GIB, StreamId(0)).is_err());
    agent.flush();

    let state = agent.state();
    assert_eq!(state.pipeline.dropped_total, 0);
    assert_eq!(
        state.pipeline.inconsistencies, 0,
        "every event fit the mirror"
    );
    assert_eq!(state.pipeline.resyncs, 0);
    let d = state.device(0).unwrap();
    assert_eq!(
        d.stats.memory_stats(),
        alloc.memory_stats(),
        "config {config:?}"
    );
    assert!(d.stats.num_ooms >= 1);
    assert!(d.stats.num_sync_all_streams > 0 && d.stats.num_device_free > 0);
    assert_eq!(layout(&d.segments), layout(&alloc.snapshot().segments));
    assert_eq!(state.ooms.len(), d.stats.num_ooms as usize);
    assert_eq!(state.ooms.last().unwrap().requested, 3 * GIB);

    // Free everything: the agent follows to zero.
    for p in live {
        alloc.free(p).unwrap();
    }
    dev.complete_all();
    alloc.empty_cache().unwrap();
    agent.flush();
    let state = agent.state();
    assert_eq!(
        state.device(0).unwrap().stats.memory_stats(),
        alloc.memory_stats()
    );
    assert_eq!(
        state.device(0).unwrap().stats.reserved_bytes.0[0].current,
        0
    );
    agent.shutdown();
}

#[test]
fn the_agent_equals_the_allocator_with_default_settings() {
    run_workload("", 0x9E37_79B9_7F4A_7C15);
}

#[test]
fn the_agent_equals_the_allocator_with_max_split_size() {
    run_workload("max_split_size_mb:40", 0x1234_5678_9ABC_DEF1);
}

#[test]
fn the_agent_equals_the_allocator_with_expandable_segments() {
    run_workload("expandable_segments:True", 0x0F0F_1234_AAAA_5555);
}

#[test]
fn the_agent_equals_the_allocator_with_rounding_divisions() {
    run_workload(
        "roundup_power2_divisions:4,garbage_collection_threshold:0.5",
        77,
    );
}
