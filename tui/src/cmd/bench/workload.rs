//! The inputs the benchmarks share: a mixed list of request sizes, a caching allocator on the
//! simulated device with every one of those sizes cached, and a recorded cycle of allocator
//! events that leaves the device as it found it (so it can be published over and over and the
//! agent's mirror stays consistent).

use std::sync::{Arc, Mutex, PoisonError};

use allocview_agent::agent::{Agent, AgentBuilder};
use allocview_agent::state::PipelineStats;
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::stats::StatType;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_alloc::event::{Event, EventSink};
use anyhow::{Context, bail};

/// Request sizes of the allocation benchmarks, in the order they are requested: both pools,
/// every rounding regime of the caching allocator (512-byte blocks, the 1 MiB small-pool
/// limit and the block just above it, 20 MiB segments shared by 1-10 MiB requests, and
/// requests of 10 MiB and more that get their own 2 MiB-rounded segment), 512 B to 24 MiB.
pub const MIXED_SIZES: [u64; 12] = [
    512,
    1_536,
    4_096,
    20_000,
    65_536,
    262_144,
    1 << 20,
    (1 << 20) + 1,
    3 << 20,
    8 << 20,
    12 << 20,
    24 << 20,
];

/// Capacity of the simulated device (no host memory backs it).
pub const SIM_CAPACITY: u64 = 1 << 40;

/// Times [`MIXED_SIZES`] is requested (all live at once) in one recorded event cycle.
const CYCLE_ROUNDS: usize = 8;

/// A caching allocator on a fresh simulated device with default settings.
pub fn allocator() -> CachingAllocator<SimBackend> {
    CachingAllocator::new(SimBackend::new(SIM_CAPACITY), AllocatorConfig::default())
}

/// Requests every size of [`MIXED_SIZES`] at once and frees them, so each has a cached block.
pub fn prewarm(alloc: &CachingAllocator<SimBackend>) -> anyhow::Result<()> {
    let mut live = Vec::with_capacity(MIXED_SIZES.len());
    for size in MIXED_SIZES {
        live.push(
            alloc
                .malloc(size, StreamId::DEFAULT)
                .with_context(|| format!("pre-warming a {size}-byte block"))?,
        );
    }
    for p in live {
        alloc.free(p).context("freeing a pre-warmed block")?;
    }
    Ok(())
}

/// Segments the device has handed the allocator so far (`cudaMalloc` calls).
pub fn device_allocs(alloc: &CachingAllocator<SimBackend>) -> i64 {
    alloc.device_stats().num_device_alloc
}

/// Segments the allocator holds now.
pub fn segments(alloc: &CachingAllocator<SimBackend>) -> i64 {
    alloc.device_stats().segment.get(StatType::All).current
}

/// One cached `malloc` + `free` of the next size of [`MIXED_SIZES`]; the first error is kept
/// in `failed` (and later calls do nothing), so a timed loop never panics.
#[inline]
pub fn alloc_free_pair(
    alloc: &CachingAllocator<SimBackend>,
    next: &mut usize,
    failed: &mut Option<String>,
) {
    if failed.is_some() {
        return;
    }
    let size = MIXED_SIZES[*next];
    *next = (*next + 1) % MIXED_SIZES.len();
    match alloc.malloc(std::hint::black_box(size), StreamId::DEFAULT) {
        Ok(p) => {
            if let Err(e) = alloc.free(std::hint::black_box(p)) {
                *failed = Some(format!("free failed: {e}"));
            }
        }
        Err(e) => *failed = Some(format!("malloc of {size} bytes failed: {e}")),
    }
}

/// A sink that keeps every event (setup only: it locks).
#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<Event>>);

impl EventSink for Recorder {
    fn publish(&self, event: &Event) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(*event);
    }
}

/// The events of one allocator cycle on a fresh device: `CYCLE_ROUNDS` x [`MIXED_SIZES`]
/// allocated, freed in an interleaved order, then the cache emptied, so the device ends as it
/// began (every segment the cycle maps, it unmaps) and the cycle can be repeated.
pub fn event_cycle() -> anyhow::Result<Vec<Event>> {
    let recorder = Arc::new(Recorder::default());
    let alloc = allocator();
    alloc.set_event_sink(Some(recorder.clone()));
    let mut live = Vec::new();
    for _ in 0..CYCLE_ROUNDS {
        for size in MIXED_SIZES {
            live.push(
                alloc
                    .malloc(size, StreamId::DEFAULT)
                    .with_context(|| format!("recording a {size}-byte allocation"))?,
            );
        }
    }
    // Every other block first, then the rest: frees that split and merge, as in real runs.
    let (even, odd): (Vec<_>, Vec<_>) = live.iter().enumerate().partition(|(i, _)| i % 2 == 0);
    for (_, p) in even.into_iter().chain(odd) {
        alloc.free(*p).context("recording a free")?;
    }
    alloc.empty_cache().context("recording empty_cache")?;
    alloc.set_event_sink(None);
    if segments(&alloc) != 0 {
        bail!("the recorded cycle left segments on the device");
    }
    let events = std::mem::take(&mut *recorder.0.lock().unwrap_or_else(PoisonError::into_inner));
    if events.is_empty() {
        bail!("the allocator published no events");
    }
    Ok(events)
}

/// The agent the benchmarks publish into, before its last settings: no listener, named
/// `allocview bench`.
pub fn agent_builder() -> AgentBuilder {
    Agent::builder().no_listen().process_name("allocview bench")
}

/// Starts an agent from `builder`.
pub fn spawn_agent(builder: AgentBuilder) -> anyhow::Result<Agent> {
    builder.spawn().context("starting the agent")
}

/// The note on the events a benchmark's agent dropped (`None` when it dropped none).
pub fn dropped_note(pipeline: &PipelineStats) -> Option<String> {
    (pipeline.dropped_total > 0).then(|| {
        format!(
            "{} of {} events dropped (channel full: the aggregator fell behind the publisher); \
             a dropped publish costs a counter increment instead of a slot write",
            pipeline.dropped_total,
            pipeline.dropped_total + pipeline.events_ingested
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_prewarm_every_mixed_size_is_served_from_the_cache() {
        let alloc = allocator();
        prewarm(&alloc).unwrap();
        let before = device_allocs(&alloc);
        let (mut next, mut failed) = (0, None);
        for _ in 0..3 * MIXED_SIZES.len() {
            alloc_free_pair(&alloc, &mut next, &mut failed);
        }
        assert_eq!(failed, None);
        assert_eq!(device_allocs(&alloc), before);
    }

    #[test]
    fn the_event_cycle_maps_and_unmaps_as_many_segments() {
        use allocview_alloc::event::EventAction;
        let events = event_cycle().unwrap();
        let count = |a: EventAction| events.iter().filter(|e| e.action == a).count();
        assert!(count(EventAction::SegmentAlloc) > 0);
        assert_eq!(
            count(EventAction::SegmentAlloc),
            count(EventAction::SegmentFree)
        );
        assert_eq!(count(EventAction::Alloc), CYCLE_ROUNDS * MIXED_SIZES.len());
    }
}
