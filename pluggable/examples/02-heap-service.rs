//! A Rust service that watches its own heap: `Instrumented<System>` behind
//! `#[global_allocator]`, an embedded agent listening on a socket, and a workload of strings,
//! maps and buffers, so that `allocview --attach` can be pointed at it.
//!
//! ```text
//! cargo run -p allocview-pluggable --example 02-heap-service -- --addr unix:/tmp/heap.sock
//! allocview --attach unix:/tmp/heap.sock        # in another terminal
//! ```
//!
//! Options: `--addr ADDR` (default: `ALLOCVIEW_ADDR`, else the agent's default unix socket,
//! which `allocview --attach` finds by itself), `--seconds N` (default: run until Ctrl-C).
//! Every second it prints the heap's own exact counters next to what the agent folded from
//! events.

use std::alloc::System;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use allocview_agent::agent::Agent;
use allocview_alloc::event::EventSink;
use allocview_alloc::global::Instrumented;

#[global_allocator]
static GLOBAL: Instrumented<System> = Instrumented::new(System);

/// Entries the session cache keeps before it evicts the oldest.
const CACHE_ENTRIES: usize = 5_000;
/// Pause between two batches of work (keeps the event rate far below the channel's).
const BATCH_PAUSE: Duration = Duration::from_millis(10);
/// How often the service prints its counters.
const REPORT_EVERY: Duration = Duration::from_secs(1);
/// Every this many batches, a large buffer is built and dropped (a spike on the timeline).
const SPIKE_EVERY: u64 = 200;
/// The spike's size.
const SPIKE_BYTES: usize = 32 << 20;

struct Options {
    addr: Option<String>,
    seconds: Option<u64>,
}

fn parse_args() -> Result<Options, String> {
    let mut opts = Options {
        addr: None,
        seconds: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--addr" => opts.addr = Some(args.next().ok_or("--addr needs an address")?),
            "--seconds" => {
                let v = args.next().ok_or("--seconds needs a number")?;
                opts.seconds = Some(
                    v.parse()
                        .map_err(|_| format!("--seconds {v:?}: not a number"))?,
                );
            }
            "-h" | "--help" => {
                return Err("usage: 02-heap-service [--addr ADDR] [--seconds N]".into());
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(opts)
}

/// One batch of a toy service: sessions in a map with eviction, per-route counters, a log ring.
struct Service {
    sessions: HashMap<String, Vec<u8>>,
    order: VecDeque<String>,
    counters: BTreeMap<String, u64>,
    log: VecDeque<String>,
    batch: u64,
}

impl Service {
    fn new() -> Service {
        Service {
            sessions: HashMap::new(),
            order: VecDeque::new(),
            counters: BTreeMap::new(),
            log: VecDeque::new(),
            batch: 0,
        }
    }

    fn run_batch(&mut self) {
        self.batch += 1;
        for i in 0..50 {
            let id = self.batch * 50 + i;
            let key = format!("session-{id:08x}");
            let payload = vec![(id % 251) as u8; 256 + (id as usize * 37) % 4096];
            self.sessions.insert(key.clone(), payload);
            self.order.push_back(key);
            *self
                .counters
                .entry(format!("/api/route/{}", id % 17))
                .or_default() += 1;
            self.log
                .push_back(format!("batch {} request {id} ok", self.batch));
        }
        while self.order.len() > CACHE_ENTRIES {
            if let Some(old) = self.order.pop_front() {
                self.sessions.remove(&old);
            }
        }
        while self.log.len() > 1_000 {
            self.log.pop_front();
        }
        if self.batch.is_multiple_of(SPIKE_EVERY) {
            let spike = std::hint::black_box(vec![1u8; SPIKE_BYTES]);
            drop(spike);
        }
    }
}

fn main() {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut builder = Agent::builder().process_name("02-heap-service");
    if let Some(a) = &opts.addr {
        builder = builder.listen(a.clone());
    }
    let agent = match builder.spawn() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cannot start the agent: {e}");
            std::process::exit(1);
        }
    };
    // The global allocator outlives main: its sink must be 'static (leaked once, at start).
    let sink: &'static Arc<dyn EventSink> = Box::leak(Box::new(agent.sink()));
    GLOBAL.set_sink(Some(&**sink));

    match agent.listen_addr() {
        Some(addr) => println!(
            "heap service pid {} listening: allocview --attach {addr}",
            std::process::id()
        ),
        None => println!("heap service pid {} (not listening)", std::process::id()),
    }
    let stop_at = opts
        .seconds
        .map(|s| Instant::now() + Duration::from_secs(s));
    let mut service = Service::new();
    let mut next_report = Instant::now() + REPORT_EVERY;
    while stop_at.is_none_or(|t| Instant::now() < t) {
        service.run_batch();
        if Instant::now() >= next_report {
            next_report += REPORT_EVERY;
            let host = agent.state().host.unwrap_or_default();
            println!(
                "heap: {} | agent: {} live allocations, {} live bytes (peak {})",
                GLOBAL.stats(),
                host.allocations.current,
                host.bytes.current,
                host.bytes.peak,
            );
        }
        std::thread::sleep(BATCH_PAUSE);
    }
    GLOBAL.set_sink(None);
    agent.shutdown();
    println!("done after {} batches", service.batch);
}
