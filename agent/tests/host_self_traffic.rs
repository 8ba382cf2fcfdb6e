//! The agent's own threads do not publish their heap traffic: with `Instrumented` as the
//! global allocator, its sink set to the agent's and the heap registered as host provider, an
//! idle agent with attach clients and a metrics listener publishes no host event from any
//! thread but the application's, while the application's allocations still arrive.
//!
//! One test in this binary (`#[global_allocator]` scenario), so no other test thread runs.

#[path = "support/raw_client.rs"]
mod raw_client;

use std::alloc::System;
use std::cell::Cell;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use allocview_agent::agent::Agent;
use allocview_agent::protocol::{self, MAX_SERVER_FRAME, ServerFrame};
use allocview_alloc::event::{Event, EventPool, EventSink};
use allocview_alloc::global::Instrumented;
use raw_client::{raw_hello, send_hello};

#[global_allocator]
static HEAP: Instrumented<System> = Instrumented::new(System);

/// Attach clients kept connected while the agent idles.
const CLIENTS: usize = 3;

/// Aggregator ticks the agent idles for (each would encode updates and sample the timeline).
const IDLE_TICKS: u32 = 60;

const TICK: Duration = Duration::from_millis(5);

thread_local! {
    /// Set on the test's own thread: the application.
    static APP: Cell<bool> = const { Cell::new(false) };
}

/// Forwards to the agent's sink and counts host events published by threads other than the
/// application's.
struct CountingSink {
    inner: Arc<dyn EventSink>,
    foreign: AtomicU64,
    app: AtomicU64,
}

impl EventSink for CountingSink {
    fn publish(&self, event: &Event) {
        if event.pool == EventPool::Host {
            if APP.with(Cell::get) {
                self.app.fetch_add(1, Relaxed);
            } else {
                self.foreign.fetch_add(1, Relaxed);
            }
        }
        self.inner.publish(event);
    }
}

/// A client over a raw socket, handshaken on this thread (an `AttachClient` would read on a
/// thread of its own, whose allocations are not the agent's).
fn attach(addr: &std::path::Path) -> UnixStream {
    let mut s = raw_hello(addr);
    send_hello(&mut s);
    let full: ServerFrame = protocol::read_frame(&mut s, MAX_SERVER_FRAME).unwrap();
    assert!(matches!(full, ServerFrame::Full { .. }), "{full:?}");
    s
}

#[test]
fn an_idle_agent_publishes_no_host_events_of_its_own_while_the_apps_still_arrive() {
    APP.with(|a| a.set(true));
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let agent = Agent::builder()
        .listen(format!("unix:{}", sock.display()))
        .no_token()
        .metrics("127.0.0.1:0".parse().unwrap())
        .dump_dir(dir.path().join("dumps"))
        .tick(TICK)
        .host_provider(Arc::new(&HEAP))
        .spawn()
        .unwrap();
    let sink: &'static CountingSink = Box::leak(Box::new(CountingSink {
        inner: agent.sink(),
        foreign: AtomicU64::new(0),
        app: AtomicU64::new(0),
    }));
    HEAP.set_sink(Some(sink));
    let clients: Vec<UnixStream> = (0..CLIENTS).map(|_| attach(&sock)).collect();
    agent.flush();

    let foreign_before = sink.foreign.load(Relaxed);
    let app_before = sink.app.load(Relaxed);
    let allocated_before = agent.state().host.map_or(0, |h| h.bytes.allocated);
    for _ in 0..IDLE_TICKS {
        std::thread::sleep(TICK);
    }
    let block = std::hint::black_box(vec![7u8; 12_345]);
    agent.flush();
    let state = agent.state();
    let foreign = sink.foreign.load(Relaxed) - foreign_before;
    HEAP.set_sink(None);

    assert_eq!(
        foreign, 0,
        "the agent's threads published {foreign} host events"
    );
    assert!(sink.app.load(Relaxed) > app_before);
    let host = state.host.expect("host events arrived");
    assert!(
        host.bytes.allocated >= allocated_before + block.len() as i64,
        "{} -> {}",
        allocated_before,
        host.bytes.allocated
    );
    drop(clients);
    agent.shutdown();
}
