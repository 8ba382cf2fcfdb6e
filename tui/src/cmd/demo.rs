//! `allocview demo`: a simulated training run on a simulated GPU with the agent embedded,
//! shown live; or, with `--headless`, run for a while and print the agent-versus-allocator
//! report.

use std::time::{Duration, Instant};

use allocview_alloc::caching::AllocatorConfig;
use anyhow::Context as _;

use crate::app::{self, App};
use crate::cli::{Backend, DemoArgs};
use crate::demo::{AGENT_TICK, Demo, DemoConfig, Report};
use crate::source::embedded::EmbeddedSource;
use crate::terminal::TerminalGuard;
use crate::{output, units};

/// The demo's settings from its arguments.
///
/// # Errors
/// A bad size, allocator setting or metrics address, named.
pub fn config(args: &DemoArgs) -> anyhow::Result<DemoConfig> {
    if args.backend == Backend::Cuda {
        anyhow::bail!(
            "the demo runs on the simulated device only; to watch a real GPU, run a program with \
             the agent embedded and use allocview --attach"
        );
    }
    let capacity = units::parse_size(&args.device_memory)
        .with_context(|| format!("--device-memory {:?}", args.device_memory))?;
    if capacity == 0 {
        anyhow::bail!("--device-memory must be more than 0 bytes");
    }
    let config = match &args.config {
        Some(s) => AllocatorConfig::parse(s).with_context(|| format!("--config {s:?}"))?,
        None => AllocatorConfig::default(),
    };
    let metrics = match &args.metrics {
        Some(m) => Some(m.parse().with_context(|| {
            format!("--metrics {m:?}: expected HOST:PORT, e.g. 127.0.0.1:9400")
        })?),
        None => None,
    };
    if !(args.seconds.is_finite() && args.seconds >= 0.0) {
        anyhow::bail!(
            "--seconds must be a non-negative number, got {}",
            args.seconds
        );
    }
    Ok(DemoConfig {
        config,
        scenario: args.scenario,
        seed: args.seed,
        listen: args.listen.clone(),
        metrics,
        ..DemoConfig::new(capacity)
    })
}

fn print_report(r: &Report, json: bool) -> anyhow::Result<()> {
    if json {
        output::print(&serde_json::to_string_pretty(r)?)?;
        return Ok(());
    }
    let get = |k: &str| r.stats.get(k).copied().unwrap_or(0).max(0) as u64;
    println!(
        "allocview demo ({}): {} steps in {:.1} s",
        r.scenario, r.steps, r.seconds
    );
    println!(
        "  allocated {}  reserved {}  peak reserved {}  OOMs {}",
        units::bytes(get("allocated_bytes.all.current")),
        units::bytes(get("reserved_bytes.all.current")),
        units::bytes(get("reserved_bytes.all.peak")),
        r.ooms
    );
    if r.agent_matches_allocator {
        println!(
            "  agent and allocator agree on all {} memory_stats keys",
            r.stats.len()
        );
    } else {
        println!(
            "  agent and allocator differ on {} keys:",
            r.differing_keys.len()
        );
        for k in &r.differing_keys {
            println!("    {k}");
        }
    }
    println!(
        "  dropped events {}  resyncs {}",
        units::count(r.dropped_events),
        units::count(r.resyncs)
    );
    for d in &r.dumps {
        println!("  OOM dump: {d}");
    }
    Ok(())
}

/// Runs the command.
///
/// # Errors
/// Bad arguments, an agent that cannot start, or a terminal that cannot be used.
pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let cfg = config(args)?;
    if args.headless {
        let mut demo = Demo::start(cfg)?;
        if let Some(a) = demo.agent.listen_addr() {
            eprintln!("allocview demo: serving attach clients at {a}");
        }
        let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
        while Instant::now() < deadline && demo.error().is_none() {
            std::thread::sleep(AGENT_TICK.min(deadline.saturating_duration_since(Instant::now())));
        }
        let report = demo.report();
        print_report(&report, args.json)?;
        if let Some(e) = demo.error() {
            anyhow::bail!("the workload stopped: {e}");
        }
        return Ok(());
    }
    let demo = Demo::start(cfg)?;
    let save_dir = std::env::current_dir().context("no current folder to save snapshots in")?;
    let mut app = App::new(Box::new(EmbeddedSource::new(demo)), save_dir)?;
    let mut guard =
        TerminalGuard::enter().context("allocview demo needs a terminal (or --headless)")?;
    app::run(&mut guard.terminal, &mut app, AGENT_TICK)
}
