//! A Prometheus scrape does not show in the host figures it serves: with `Instrumented` as the
//! global allocator and its events going to the agent, scraping `/metrics` again and again
//! publishes no host event from any thread but the scraper's (the listener's connection
//! threads are agent threads) and leaves the agent's host bytes in use where
//! they were, instead of creeping up by each scrape's request (allocated, with the HTTP library
//! used before, on its threads, which published, and freed on an agent thread, which did not: a leak that was not
//! there).
//!
//! One test in this binary (`#[global_allocator]` scenario), so no other test thread runs.

use std::alloc::System;
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use allocview_agent::agent::Agent;
use allocview_alloc::event::{Event, EventSink};
use allocview_alloc::global::{Instrumented, unpublished};

#[global_allocator]
static HEAP: Instrumented<System> = Instrumented::new(System);

/// Scrapes measured (each drift of the old code was one request's bytes).
const SCRAPES: usize = 200;

/// Scrapes before the baseline, so that what the listener sets up once is in it.
const WARM_UP: usize = 20;

/// How long the test waits for figures to settle (a connection's thread finishes after the
/// client has its response).
const SETTLE: Duration = Duration::from_secs(20);

thread_local! {
    /// Set on the test's own thread: the scraper.
    static SCRAPER: Cell<bool> = const { Cell::new(false) };
}

/// The agent's sink, behind the `'static` reference the heap takes; counts the host events
/// published by threads other than the scraper's.
struct Forward {
    inner: Arc<dyn EventSink>,
    foreign: AtomicU64,
}

impl EventSink for Forward {
    fn publish(&self, event: &Event) {
        if !SCRAPER.with(Cell::get) {
            self.foreign.fetch_add(1, Relaxed);
        }
        self.inner.publish(event);
    }
}

/// One scrape, on this thread (its allocations are made and freed here, published).
fn scrape(addr: SocketAddr) -> usize {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Agent: Prometheus/2.42.0\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut page = Vec::new();
    s.read_to_end(&mut page).unwrap();
    assert!(page.starts_with(b"HTTP/1.1 200"));
    page.len()
}

/// The agent's host bytes in use, everything published so far folded in; the state copy is
/// the agent's, freed without publishing.
fn host_bytes(agent: &Agent) -> i64 {
    unpublished(|| {
        agent.flush();
        agent.state().host.map_or(0, |h| h.bytes.current)
    })
}

#[test]
fn scraping_metrics_leaves_the_host_bytes_in_use_where_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .no_listen()
        .metrics("127.0.0.1:0".parse().unwrap())
        .dump_dir(dir.path().join("dumps"))
        .host_provider(Arc::new(&HEAP))
        .spawn()
        .unwrap();
    let sink: &'static Forward = Box::leak(Box::new(Forward {
        inner: agent.sink(),
        foreign: AtomicU64::new(0),
    }));
    SCRAPER.with(|s| s.set(true));
    HEAP.set_sink(Some(sink));
    let addr = agent.metrics_addr().unwrap();
    for _ in 0..WARM_UP {
        scrape(addr);
    }
    std::thread::sleep(Duration::from_millis(200));
    let before = host_bytes(&agent);
    let foreign_before = sink.foreign.load(Relaxed);
    let mut page = 0;
    for _ in 0..SCRAPES {
        page = scrape(addr);
    }
    // What the connection threads allocated for the last connections is freed when they finish
    // with them, shortly after the client has the page; wait for the figure to come back.
    let deadline = std::time::Instant::now() + SETTLE;
    let mut after = host_bytes(&agent);
    while after != before && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        after = host_bytes(&agent);
    }
    let foreign = sink.foreign.load(Relaxed) - foreign_before;
    HEAP.set_sink(None);
    assert!(page > 1000, "a page of {page} bytes");
    assert_eq!(
        after,
        before,
        "{SCRAPES} scrapes moved the host bytes in use by {} ({} per scrape)",
        after - before,
        (after - before) / SCRAPES as i64
    );
    // The connection threads are agent threads: nothing they allocate is published.
    if cfg!(target_os = "linux") {
        assert_eq!(
            foreign, 0,
            "{SCRAPES} scrapes published {foreign} host events from the agent's side"
        );
    }
    agent.shutdown();
}
