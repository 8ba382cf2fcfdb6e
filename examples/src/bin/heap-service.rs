//! A service that watches its own heap: `Instrumented<System>` is its global allocator and
//! publishes every allocation and free to an in-process agent, which `allocview --attach` (or a
//! Prometheus scrape) can read while the service runs.
//!
//! Two worker threads serve made-up requests (parse a payload into words, count them in a map,
//! keep the last results in a bounded cache); once a second the service prints its heap as the
//! allocator counts it and as the agent has folded it from the events.
//!
//! ```text
//! cargo run --release -p allocview-examples --bin heap-service -- --seconds 30
//! allocview --attach unix:/tmp/heap-service.sock        # in another terminal
//! ```
//!
//! Options: `--seconds N` (default 10), `--listen ADDR` (`unix:PATH` or `HOST:PORT`; default
//! the agent's, from `ALLOCVIEW_ADDR`), `--no-listen`, `--metrics HOST:PORT`, `--help`. A bad
//! argument is one line on stderr and exit code 2; a failure while running, exit code 1.
//! SIGINT or SIGTERM stops it early the way the time running out does: the workers stop, the
//! last report prints and the agent shuts down (saying goodbye to attach clients and removing
//! its socket), then it exits 0.

#![forbid(unsafe_code)]

use std::alloc::System;
use std::collections::{HashMap, VecDeque};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use allocview_agent::agent::Agent;
use allocview_agent::server::TOKEN_ENV;
use allocview_alloc::global::{Instrumented, unpublished};
use allocview_alloc::stats::HumanBytes;
use anyhow::{Context, bail};
use signal_hook::consts::{SIGINT, SIGTERM};

#[global_allocator]
static HEAP: Instrumented<System> = Instrumented::new(System);

/// Results each worker keeps (a bounded cache: the heap levels off once it is full).
const CACHE_ENTRIES: usize = 512;
/// Worker threads serving requests.
const WORKERS: usize = 2;
/// How often the service reports.
const REPORT_EVERY: Duration = Duration::from_secs(1);
/// How often the main thread looks for a stopping signal.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// `--help`.
const USAGE: &str = "\
heap-service: a service that watches its own heap through an in-process allocview agent

Usage: heap-service [OPTIONS]

Options:
  --seconds N         how long to serve (default 10)
  --listen ADDR       where attach clients connect: unix:PATH or HOST:PORT
                      (default: the agent's, from ALLOCVIEW_ADDR)
  --no-listen         serve no attach clients
  --metrics HOST:PORT serve Prometheus metrics there
  -h, --help          print this help
";

/// Exit code of a bad command line (as clap uses).
const EXIT_USAGE: i32 = 2;
/// Exit code of a failure while running.
const EXIT_FAILURE: i32 = 1;

/// What the command line asks for.
enum Command {
    /// Print [`USAGE`].
    Help,
    /// Run the service.
    Run(Options),
}

struct Options {
    seconds: u64,
    listen: Option<Option<String>>,
    /// `HOST:PORT`, a host name or an IP address (resolved by the agent at start).
    metrics: Option<String>,
}

fn parse_options(args: impl IntoIterator<Item = String>) -> anyhow::Result<Command> {
    let mut options = Options {
        seconds: 10,
        listen: Some(None),
        metrics: None,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--seconds" => {
                let v = value("--seconds")?;
                options.seconds = v
                    .parse()
                    .with_context(|| format!("--seconds: {v:?} is not a number"))?;
            }
            "--listen" => options.listen = Some(Some(value("--listen")?)),
            "--no-listen" => options.listen = None,
            "--metrics" => {
                let v = value("--metrics")?;
                if !v.contains(':') {
                    bail!("--metrics: {v:?} is not HOST:PORT (for example localhost:9464)");
                }
                options.metrics = Some(v);
            }
            other => bail!(
                "unknown argument {other:?} (expected --seconds N, --listen ADDR, --no-listen, \
                 --metrics HOST:PORT, --help)"
            ),
        }
    }
    Ok(Command::Run(options))
}

/// One made-up request: split a payload into words, count them, keep the top few.
fn serve(request: u64, cache: &mut VecDeque<(u64, Vec<(String, usize)>)>) {
    let payload: String = (0..200)
        .map(|i| format!("w{} ", (request * 31 + i * 7) % 97))
        .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for word in payload.split_whitespace() {
        *counts.entry(word).or_default() += 1;
    }
    let mut top: Vec<(String, usize)> =
        counts.into_iter().map(|(w, n)| (w.to_owned(), n)).collect();
    top.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top.truncate(8);
    if cache.len() == CACHE_ENTRIES {
        cache.pop_front();
    }
    cache.push_back((request, black_box(top)));
}

fn main() {
    let options = match parse_options(std::env::args().skip(1)) {
        Ok(Command::Help) => {
            print!("{USAGE}");
            return;
        }
        Ok(Command::Run(options)) => options,
        Err(e) => {
            eprintln!("heap-service: {e:#} (see --help)");
            std::process::exit(EXIT_USAGE);
        }
    };
    // Errors print as one line (never `Debug`, which would add a backtrace).
    if let Err(e) = run(&options) {
        eprintln!("heap-service: {e:#}");
        std::process::exit(EXIT_FAILURE);
    }
}

fn run(options: &Options) -> anyhow::Result<()> {
    // SIGINT/SIGTERM set `signal` to their number: the serving loop ends and the agent shuts
    // down cleanly (a signal's default action would leave its socket behind). A second one,
    // while a stuck shutdown drags on, ends the process at once.
    let signal = Arc::new(AtomicUsize::new(0));
    let once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, EXIT_FAILURE, Arc::clone(&once))
            .context("catching SIGINT/SIGTERM")?;
        signal_hook::flag::register(sig, Arc::clone(&once)).context("catching SIGINT/SIGTERM")?;
        signal_hook::flag::register_usize(sig, Arc::clone(&signal), sig as usize)
            .context("catching SIGINT/SIGTERM")?;
    }

    // After dropped events the agent takes the heap's own counters (a resync).
    let mut builder = Agent::builder()
        .process_name("heap-service")
        .host_provider(Arc::new(&HEAP));
    builder = match &options.listen {
        None => builder.no_listen(),
        Some(None) => builder,
        Some(Some(addr)) => builder.listen(addr.clone()),
    };
    if let Some(addr) = &options.metrics {
        builder = builder.metrics_at(addr.clone());
    }
    let agent = builder.spawn().context("starting the agent")?;
    if let Some(addr) = agent.listen_addr() {
        // A token the agent requires is needed by the attach too: said, never shown.
        let token_set = std::env::var_os(TOKEN_ENV).is_some_and(|t| !t.is_empty());
        let with_token = if token_set {
            format!(" (with {TOKEN_ENV} set to this service's token)")
        } else {
            String::new()
        };
        println!("agent listening at {addr}; attach with: allocview --attach {addr}{with_token}");
    }
    if let Some(addr) = agent.metrics_addr() {
        println!("metrics at http://{addr}/metrics");
    }

    // The heap wants a `&'static dyn EventSink`: the agent's sink, kept alive for the process.
    let at_attach = HEAP.stats();
    HEAP.set_sink(Some(agent.leak_sink()));

    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (stop, served) = (Arc::clone(&stop), Arc::clone(&served));
            std::thread::spawn(move || {
                let mut cache = VecDeque::with_capacity(CACHE_ENTRIES);
                let mut request = w as u64;
                while !stop.load(Relaxed) {
                    serve(request, &mut cache);
                    request += WORKERS as u64;
                    served.fetch_add(1, Relaxed);
                }
            })
        })
        .collect();

    let start = Instant::now();
    let deadline = start + Duration::from_secs(options.seconds);
    let mut next_report = start + REPORT_EVERY;
    while Instant::now() < deadline && signal.load(Relaxed) == 0 {
        std::thread::sleep(SIGNAL_POLL.min(deadline.saturating_duration_since(Instant::now())));
        if Instant::now() >= next_report {
            next_report += REPORT_EVERY;
            // Reporting allocates: keep those allocations out of the event stream.
            unpublished(|| report(&agent, start, served.load(Relaxed)));
        }
    }
    match signal.load(Relaxed) as i32 {
        0 => {}
        SIGINT => println!("stopping: SIGINT"),
        _ => println!("stopping: SIGTERM"),
    }
    stop.store(true, Relaxed);
    for w in workers {
        w.join().map_err(|_| anyhow::anyhow!("a worker panicked"))?;
    }
    agent.flush();
    unpublished(|| report(&agent, start, served.load(Relaxed)));
    HEAP.set_sink(None);

    let end = HEAP.stats();
    let state = agent.state();
    let host = state.host.unwrap_or_default();
    println!(
        "done: heap in use {} ({} before the agent attached), agent saw {} live in {} allocations, \
         {} events dropped",
        HumanBytes(end.current_bytes),
        HumanBytes(at_attach.current_bytes),
        HumanBytes(host.bytes.current.max(0) as u64),
        host.allocations.current,
        state.pipeline.dropped_total,
    );
    agent.shutdown();
    Ok(())
}

fn report(agent: &Agent, start: Instant, served: u64) {
    let heap = HEAP.stats();
    let state = agent.state();
    let host = state.host.unwrap_or_default();
    println!(
        "t={:>4.1}s requests={served:<8} heap: {} in use, peak {}, {} allocs | agent: {} in use, \
         peak {}, {} events, {} dropped",
        start.elapsed().as_secs_f64(),
        HumanBytes(heap.current_bytes),
        HumanBytes(heap.peak_bytes),
        heap.count,
        HumanBytes(host.bytes.current.max(0) as u64),
        HumanBytes(host.bytes.peak.max(0) as u64),
        state.pipeline.events_ingested,
        state.pipeline.dropped_total,
    );
}
