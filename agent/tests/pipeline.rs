//! The pipeline end to end inside one process: events published into the agent's sink come out
//! as the state the dashboard renders.

#[path = "support/toy.rs"]
mod toy;

use std::time::Duration;

use allocview_agent::agent::Agent;
use allocview_alloc::caching::stats::StatType;
use allocview_alloc::event::{Event, EventAction, EventPool};
use allocview_alloc::snapshot::BlockState;

const MIB: u64 = 1 << 20;
const SEG: u64 = 0x7f00_0000_0000;

fn agent(dir: &std::path::Path) -> Agent {
    Agent::builder()
        .no_listen()
        .dump_dir(dir)
        .tick(Duration::from_millis(5))
        .sample_interval(Duration::from_millis(1))
        .spawn()
        .unwrap()
}

#[test]
fn published_events_become_stats_segments_histograms_and_recent_events() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent(dir.path());
    let sink = agent.sink();
    sink.publish(&Event {
        stream: 3,
        ..Event::new(
            EventAction::SegmentAlloc,
            0,
            EventPool::Large,
            SEG,
            20 * MIB,
        )
    });
    sink.publish(&Event {
        stream: 3,
        requested: 3 * MIB,
        latency_ns: 800,
        time_ns: 1_000,
        ..Event::new(EventAction::Alloc, 0, EventPool::Large, SEG, 4 * MIB)
    });
    sink.publish(&Event {
        stream: 3,
        requested: 3 * MIB,
        ..Event::new(
            EventAction::FreeRequested,
            0,
            EventPool::Large,
            SEG,
            4 * MIB,
        )
    });
    sink.publish(&Event {
        stream: 3,
        time_ns: 51_000,
        ..Event::new(
            EventAction::FreeCompleted,
            0,
            EventPool::Large,
            SEG,
            4 * MIB,
        )
    });
    sink.publish(&Event {
        stream: 3,
        requested: 100,
        ..Event::new(EventAction::Alloc, 0, EventPool::Large, SEG, 2 * MIB)
    });
    agent.flush();
    let state = agent.state();
    assert_eq!(state.pipeline.events_ingested, 5);
    assert_eq!(state.pipeline.dropped_total, 0);
    let d = &state.devices[0];
    assert_eq!(d.device, 0);
    assert_eq!(
        d.stats.reserved_bytes.get(StatType::All).current,
        20 * MIB as i64
    );
    assert_eq!(
        d.stats.allocated_bytes.get(StatType::LargePool).current,
        2 * MIB as i64
    );
    assert_eq!(
        d.stats.allocated_bytes.get(StatType::LargePool).peak,
        4 * MIB as i64
    );
    assert_eq!(d.stats.inactive_split.get(StatType::All).current, 1);
    assert_eq!(d.segments.len(), 1);
    assert_eq!(d.segments[0].blocks[0].state, BlockState::ActiveAllocated);
    assert_eq!(d.segments[0].blocks[1].state, BlockState::Inactive);
    assert_eq!(d.streams[0].stream, 3);
    assert_eq!(d.streams[0].allocs, 2);
    assert_eq!(d.histograms.all.size.count, 2);
    assert_eq!(d.histograms.all.latency.count, 1);
    assert_eq!(d.histograms.all.lifetime.count, 1);
    assert!(d.histograms.all.lifetime.max >= 50_000);
    assert_eq!(d.recent.len(), 5);
    assert_eq!(d.recent[1].action, "alloc");
    assert!(d.recent.windows(2).all(|w| w[0].seq < w[1].seq));
    agent.shutdown();
}

#[test]
fn the_timeline_samples_usage_on_each_tick() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent(dir.path());
    agent.sink().publish(&Event::new(
        EventAction::SegmentAlloc,
        0,
        EventPool::Large,
        SEG,
        20 * MIB,
    ));
    agent.flush();
    let mut samples = Vec::new();
    for _ in 0..1000 {
        samples = agent.state().devices[0].timeline.clone();
        if samples.len() >= 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        samples.len() >= 3,
        "ticks sampled the timeline: {samples:?}"
    );
    assert!(samples.iter().all(|s| s.reserved == 20 * MIB));
    assert!(samples.windows(2).all(|w| w[0].time_ns < w[1].time_ns));
}

#[test]
fn drops_without_a_provider_are_counted_and_mark_the_state_partial() {
    let dir = tempfile::tempdir().unwrap();
    let agent = toy::quiet_agent(dir.path(), 4).spawn().unwrap();
    let sink = agent.sink();
    // Nobody drains between these (the tick is an hour; the half-full wake-up races), so at
    // most 4 fit and the rest are counted, per action.
    for i in 0..100u64 {
        sink.publish(&Event::new(
            EventAction::SegmentAlloc,
            0,
            EventPool::Large,
            SEG + i * 20 * MIB,
            20 * MIB,
        ));
    }
    agent.flush();
    let p = agent.state().pipeline;
    assert_eq!(p.events_ingested + p.dropped_total, 100);
    assert!(p.dropped_total > 0);
    assert_eq!(
        p.dropped_by_action,
        vec![("segment_alloc".to_string(), p.dropped_total)]
    );
    assert!(p.partial, "no provider could resync: {p:?}");
    assert_eq!(p.resyncs, 0);
    assert_eq!(p.channel_capacity, 4);
}

#[test]
fn drops_with_a_provider_lead_to_a_resync_that_restores_exact_stats() {
    let dir = tempfile::tempdir().unwrap();
    let toy = toy::Toy::new();
    let agent = toy::quiet_agent(dir.path(), 8)
        .provider(toy.clone())
        .spawn()
        .unwrap();
    toy.set_sink(agent.sink());
    for i in 0..2_000usize {
        if i % 3 == 2 {
            toy.free_nth(i * 7);
        } else {
            toy.malloc((i % 4) as u64);
        }
    }
    agent.flush();
    let state = agent.state();
    assert!(state.pipeline.dropped_total > 0, "the tiny channel dropped");
    assert!(state.pipeline.resyncs >= 1);
    assert!(!state.pipeline.partial);
    assert_eq!(
        state.devices[0].stats.memory_stats(),
        toy.stats().memory_stats()
    );
    assert_eq!(state.devices[0].total_memory, 80 << 30);
}

#[test]
fn without_drops_the_agent_equals_the_allocator_with_no_resync() {
    let dir = tempfile::tempdir().unwrap();
    let toy = toy::Toy::new();
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dir.path())
        .channel_capacity(1 << 16)
        .provider(toy.clone())
        .spawn()
        .unwrap();
    toy.set_sink(agent.sink());
    for i in 0..5_000usize {
        if i % 3 == 2 {
            toy.free_nth(i * 7);
        } else {
            toy.malloc((i % 4) as u64);
        }
    }
    // Through the agent: the provider resets and publishes `reset_peaks`.
    agent.reset_peaks();
    agent.flush();
    let state = agent.state();
    assert_eq!(state.pipeline.dropped_total, 0);
    assert_eq!(state.pipeline.resyncs, 0);
    assert_eq!(state.pipeline.inconsistencies, 0);
    assert_eq!(
        state.devices[0].stats.memory_stats(),
        toy.stats().memory_stats()
    );
    let s = &state.devices[0].stats.allocated_bytes.0[0];
    assert_eq!(s.peak, s.current, "peaks were reset");
}

#[test]
fn host_events_feed_the_host_counters() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent(dir.path());
    let sink = agent.sink();
    for i in 0..10 {
        sink.publish(&Event::new(
            EventAction::Alloc,
            -1,
            EventPool::Host,
            0x1000 + i * 64,
            64,
        ));
    }
    for i in 0..4 {
        sink.publish(&Event::new(
            EventAction::FreeRequested,
            -1,
            EventPool::Host,
            0x1000 + i * 64,
            64,
        ));
    }
    agent.flush();
    let h = agent.state().host.unwrap();
    assert_eq!(h.allocations.current, 6);
    assert_eq!(h.bytes.current, 6 * 64);
    assert_eq!(h.bytes.peak, 10 * 64);
}

#[test]
fn shutting_down_folds_in_what_was_published_and_joins() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent(dir.path());
    let sink = agent.sink();
    agent.shutdown();
    // Publishing after shutdown never blocks; the event is counted as dropped.
    sink.publish(&Event::new(EventAction::Oom, 0, EventPool::Large, 0, 0));
}
