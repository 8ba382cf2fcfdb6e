//! A Rust program's own heap, watched by the agent: `Instrumented<System>` behind
//! `#[global_allocator]` publishing into the agent's sink (what `examples/src/bin/heap-service.rs`
//! does), seen through `Agent::state` and through an attach client over a real socket.
//!
//! Other threads (the test harness, the agent's own) allocate too, so the checks use the
//! counters that only grow (bytes and allocations in total) and margins, never exact totals.

use std::alloc::System;
use std::hint::black_box;
use std::time::{Duration, Instant};

use allocview_agent::agent::Agent;
use allocview_agent::client::{AttachClient, ClientError};
use allocview_agent::state::HostState;
use allocview_alloc::event::EventSink;
use allocview_alloc::global::Instrumented;

#[global_allocator]
static GLOBAL: Instrumented<System> = Instrumented::new(System);

const MIB: i64 = 1 << 20;
/// The buffer the test allocates and frees, large enough to stand out from the noise.
const BIG: usize = 8 << 20;

fn host(agent: &Agent) -> HostState {
    agent.flush();
    agent.state().host.unwrap_or_default()
}

#[test]
fn the_agent_counts_the_programs_heap_and_an_attach_client_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("heap.sock");
    let agent = Agent::builder()
        .listen(format!("unix:{}", sock.display()))
        .dump_dir(dir.path().join("dumps"))
        .tick(Duration::from_millis(20))
        .spawn()
        .unwrap();
    // A global allocator outlives everything: its sink must be 'static. One Arc, leaked once.
    let sink: &'static std::sync::Arc<dyn EventSink> = Box::leak(Box::new(agent.sink()));
    GLOBAL.set_sink(Some(&**sink));

    let before = host(&agent);
    let big = black_box(vec![7u8; BIG]);
    let strings: Vec<String> = (0..1000).map(|i| format!("key-{i:06}")).collect();
    let during = host(&agent);
    assert!(
        during.bytes.allocated - before.bytes.allocated >= BIG as i64,
        "{before:?} -> {during:?}"
    );
    assert!(
        during.allocations.allocated - before.allocations.allocated >= 1001,
        "{before:?} -> {during:?}"
    );
    assert!(during.bytes.peak >= during.bytes.current);
    assert!(during.bytes.current - before.bytes.current >= BIG as i64 - MIB);

    // An attach client over the socket sees the same heap.
    let mut client = AttachClient::connect(&format!("unix:{}", sock.display()), None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(h) = client.state().host
            && h.bytes.allocated >= during.bytes.allocated
        {
            break;
        }
        assert!(Instant::now() < deadline, "the client never saw the heap");
        match client.next_update(Duration::from_millis(200)) {
            Ok(_) | Err(ClientError::Timeout) => {}
            Err(e) => panic!("attach failed: {e}"),
        }
    }

    drop(black_box(big));
    drop(black_box(strings));
    let after = host(&agent);
    assert!(
        after.bytes.freed - during.bytes.freed >= BIG as i64,
        "{during:?} -> {after:?}"
    );
    assert!(after.bytes.current <= during.bytes.current - BIG as i64 + MIB);
    // The process's own exact counters agree that the buffer came and went.
    let stats = GLOBAL.stats();
    assert!(stats.peak_bytes >= BIG as u64);

    GLOBAL.set_sink(None);
    drop(client);
    agent.shutdown();
}
