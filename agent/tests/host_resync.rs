//! The host heap after dropped events: with a [`HostProvider`] registered, the agent takes the
//! heap's own counters in place of those it folded from an incomplete event stream, counts the
//! resync and does not mark the state partial; without one, the state says it is partial. A
//! client's peak reset reaches the heap too.

#[path = "support/toy.rs"]
mod toy;

use std::sync::Arc;
use std::sync::Mutex;

use allocview_agent::agent::Agent;
use allocview_agent::provider::HostProvider;
use allocview_agent::state::HostState;
use allocview_alloc::event::{CPU_DEVICE, Event, EventAction, EventPool};
use allocview_alloc::global::HeapStats;

/// Channel capacity small enough that a burst of events overflows it.
const CAPACITY: usize = 64;

/// Events per burst.
const BURST: u64 = 50_000;

/// Bursts published, at most, before giving up on seeing a drop.
const MAX_BURSTS: usize = 100;

/// A heap whose counters the test sets, and which counts peak resets.
#[derive(Default)]
struct FakeHeap {
    stats: Mutex<HeapStats>,
    resets: Mutex<u32>,
}

impl HostProvider for FakeHeap {
    fn heap_stats(&self) -> HeapStats {
        *self.stats.lock().unwrap()
    }

    fn reset_peak(&self) {
        *self.resets.lock().unwrap() += 1;
        let mut s = self.stats.lock().unwrap();
        s.peak_bytes = s.current_bytes;
    }
}

/// The heap's counters the fake reports: what a heap that saw the bursts would say.
fn heap_after() -> HeapStats {
    HeapStats {
        current_bytes: 7 * 4096,
        peak_bytes: 1 << 20,
        total_bytes: 3 << 30,
        count: 2_000_007,
        frees: 2_000_000,
        reallocs: 12,
    }
}

/// An agent whose tick no test lives to see: it then resyncs only when flushed, after every
/// event is in, so the figures compared are the provider's alone (a resync on a tick during the
/// bursts would fold later events on top of them).
fn agent(host: Option<Arc<dyn HostProvider>>) -> Agent {
    let mut b = toy::quiet_agent(&std::env::temp_dir(), CAPACITY);
    if let Some(h) = host {
        b = b.host_provider(h);
    }
    b.spawn().unwrap()
}

/// Publishes alloc/free pairs of host events until some were dropped; returns the drops.
fn publish_until_dropped(agent: &Agent) -> u64 {
    let sink = agent.sink();
    for _ in 0..MAX_BURSTS {
        for i in 0..BURST {
            let addr = 0x1000 + (i % 64) * 4096;
            sink.publish(&Event::new(
                EventAction::Alloc,
                CPU_DEVICE,
                EventPool::Host,
                addr,
                4096,
            ));
            sink.publish(&Event::new(
                EventAction::Free,
                CPU_DEVICE,
                EventPool::Host,
                addr,
                4096,
            ));
        }
        let dropped = agent.channel_sink().shared().dropped_total();
        if dropped > 0 {
            return dropped;
        }
    }
    panic!(
        "no event was dropped in {MAX_BURSTS} bursts of {BURST} through a channel of {CAPACITY}"
    );
}

#[test]
fn after_drops_the_host_heap_takes_the_heaps_own_counters_and_says_it_resynced() {
    let heap = Arc::new(FakeHeap::default());
    *heap.stats.lock().unwrap() = heap_after();
    let agent = agent(Some(heap.clone()));
    let dropped = publish_until_dropped(&agent);
    agent.flush();
    let state = agent.state();
    assert!(state.pipeline.dropped_total >= dropped);
    assert!(state.pipeline.resyncs >= 1, "{:?}", state.pipeline);
    assert!(!state.pipeline.partial, "{:?}", state.pipeline);
    let host = state.host.expect("host events were folded");
    let live = heap_after().count as i64 - heap_after().frees as i64;
    assert_eq!(host.bytes.current, heap_after().current_bytes as i64);
    assert_eq!(host.bytes.peak, heap_after().peak_bytes as i64);
    assert_eq!(host.bytes.allocated, heap_after().total_bytes as i64);
    assert_eq!(
        host.bytes.freed,
        (heap_after().total_bytes - heap_after().current_bytes) as i64
    );
    assert_eq!(host.allocations.current, live);
    assert_eq!(host.allocations.allocated, heap_after().count as i64);
    assert_eq!(host.allocations.freed, heap_after().frees as i64);
    assert!(host.allocations.peak >= live);

    // A peak reset reaches the heap, and the agent's copy follows.
    agent.reset_peaks();
    agent.flush();
    assert_eq!(*heap.resets.lock().unwrap(), 1);
    let host = agent.state().host.unwrap();
    assert_eq!(host.bytes.peak, host.bytes.current);
    assert_eq!(host.allocations.peak, host.allocations.current);
    agent.shutdown();
}

#[test]
fn after_drops_without_a_host_provider_the_state_says_it_is_partial() {
    let agent = agent(None);
    publish_until_dropped(&agent);
    agent.flush();
    let state = agent.state();
    assert!(state.pipeline.partial, "{:?}", state.pipeline);
    assert_eq!(state.pipeline.resyncs, 0);
    agent.shutdown();
}

#[test]
fn a_heaps_counters_map_onto_the_host_state() {
    let previous = HostState {
        allocations: allocview_alloc::caching::stats::Stat {
            current: 3,
            peak: 40,
            allocated: 100,
            freed: 97,
        },
        ..HostState::default()
    };
    let s = HostState::from_heap(&heap_after(), &previous);
    assert_eq!(s.allocations.current, 7);
    // The heap keeps no peak of live allocations: the agent's own stays.
    assert_eq!(s.allocations.peak, 40);
    assert_eq!(s.bytes.current, 7 * 4096);
    assert_eq!(s.bytes.peak, 1 << 20);
    let fresh = HostState::from_heap(&heap_after(), &HostState::default());
    assert_eq!(fresh.allocations.peak, 7);
}
