//! `allocview demo`: a simulated training run on a simulated GPU (or, with `--backend cuda`, a
//! real one) with the agent embedded, shown live; or, with `--headless`, run for a while and print the agent-versus-allocator
//! report.

use std::time::{Duration, Instant};

use allocview_agent::state::AgentState;
use allocview_agent::summary::render::counted;
use allocview_alloc::caching::AllocatorConfig;
use anyhow::Context as _;

use crate::app::{self, App};
use crate::cli::{Backend, DemoArgs, Scenario};
use crate::demo::{AGENT_TICK, Demo, DemoConfig, Report};
use crate::output::Versioned;
use crate::source::embedded::EmbeddedSource;
use crate::terminal::TerminalGuard;
use crate::{output, units};

/// `--device-memory`'s default (in `cli.rs`): any other value on CUDA earns a note that it is
/// ignored there.
pub const DEFAULT_DEVICE_MEMORY: &str = "16GiB";

/// Why the interactive demo cannot run without a terminal, and what to do instead.
const NEEDS_TERMINAL: &str = "the demo's live dashboard needs one: run `allocview demo --headless` to \
     print a report instead (add --json for JSON)";

/// The demo's settings from its arguments.
///
/// # Errors
/// A bad size, allocator setting or metrics address, named.
pub fn config(args: &DemoArgs) -> anyhow::Result<DemoConfig> {
    #[cfg(not(feature = "cuda"))]
    if args.backend == Backend::Cuda {
        anyhow::bail!(crate::demo::device::NO_CUDA_SUPPORT);
    }
    if args.backend == Backend::Cuda && args.device_memory != DEFAULT_DEVICE_MEMORY {
        eprintln!(
            "allocview demo: --device-memory {:?} is ignored on CUDA: the GPU's own memory is used",
            args.device_memory
        );
    }
    let capacity = units::parse_size(&args.device_memory)
        .with_context(|| format!("--device-memory {:?}", args.device_memory))?;
    if capacity == 0 {
        anyhow::bail!("--device-memory must be more than 0 bytes");
    }
    // As an embedding program would: --config, else the environment's settings.
    let given = (!args.config.is_empty()).then(|| args.config.join(","));
    let config = match (&given, AllocatorConfig::env_setting()) {
        (Some(s), _) => AllocatorConfig::parse(s).with_context(|| format!("--config {s:?}"))?,
        (None, Some((var, s))) => {
            AllocatorConfig::parse(&s).with_context(|| format!("{var}={s:?}"))?
        }
        (None, None) => AllocatorConfig::default(),
    };
    // PyTorch quirks the settings follow that the string may not mean.
    for w in config.warnings() {
        eprintln!("allocview: warning: {w}");
    }
    let metrics = match &args.metrics {
        Some(m) => Some(m.parse().with_context(|| {
            format!("--metrics {m:?}: expected HOST:PORT, e.g. 127.0.0.1:9400")
        })?),
        None => None,
    };
    if let Some(seconds) = args.seconds
        && !(seconds.is_finite() && seconds >= 0.0)
    {
        anyhow::bail!("--seconds must be a non-negative number, got {seconds}");
    }
    Ok(DemoConfig {
        backend: args.backend,
        config,
        scenario: args.scenario,
        seed: args.seed,
        listen: args.listen.clone(),
        metrics,
        ..DemoConfig::new(capacity)
    })
}

/// The headless report as text, one line per figure.
pub fn report_text(r: &Report) -> String {
    use std::fmt::Write as _;
    let get = |k: &str| r.stats.get(k).copied().unwrap_or(0).max(0) as u64;
    let mut out = String::new();
    // Writing to a String cannot fail.
    let settings = if r.settings.is_empty() {
        "defaults"
    } else {
        &r.settings
    };
    let interrupted = r
        .interrupted
        .as_ref()
        .map_or(String::new(), |s| format!(" (interrupted by {s})"));
    let _ = writeln!(
        out,
        "allocview demo ({}, device: {}, settings: {settings}): {} in {:.1} s{interrupted}",
        r.scenario,
        r.device,
        counted(r.steps, "step", "steps"),
        r.seconds
    );
    let _ = writeln!(
        out,
        "  allocated {}  reserved {}  peak reserved {}  OOMs {}",
        units::bytes(get("allocated_bytes.all.current")),
        units::bytes(get("reserved_bytes.all.current")),
        units::bytes(get("reserved_bytes.all.peak")),
        r.ooms
    );
    if r.agent_matches_allocator {
        let _ = writeln!(
            out,
            "  agent and allocator agree on all {} memory_stats keys",
            r.stats.len()
        );
    } else {
        let _ = writeln!(
            out,
            "  agent and allocator differ on {} keys:",
            r.differing_keys.len()
        );
        for k in &r.differing_keys {
            let _ = writeln!(out, "    {k}");
        }
    }
    let _ = write!(
        out,
        "  dropped events {}  resyncs {}",
        units::count(r.dropped_events),
        units::count(r.resyncs)
    );
    for d in &r.dumps {
        let _ = write!(out, "\n  OOM dump: {d}");
    }
    if r.dump_failures > 0 {
        let _ = write!(
            out,
            "\n  OOM dumps that failed: {}",
            units::count(r.dump_failures)
        );
        for e in &r.dump_errors {
            let _ = write!(out, "\n  OOM dump failed: {e}");
        }
    }
    out
}

/// `demo --headless --json`'s `format` field.
pub const JSON_FORMAT: &str = "allocview-demo-report";
/// `demo --headless --json`'s `version` field (docs/json.md).
pub const JSON_VERSION: u32 = 1;

/// Prints the report (a closed pipe ends the output quietly).
fn print_report(r: &Report, json: bool) -> anyhow::Result<()> {
    if json {
        output::print(&Versioned::new(JSON_FORMAT, JSON_VERSION, r).pretty()?)?;
    } else {
        output::print(&report_text(r))?;
    }
    Ok(())
}

/// How long the headless demo runs without `--seconds`.
pub const HEADLESS_SECONDS: Duration = Duration::from_secs(5);
/// Without `--seconds`, the headless OOM scenario runs this long past its first OOM (the
/// dump is written, the run recovers)...
pub const OOM_MARGIN: Duration = Duration::from_secs(2);
/// ...and at most this long (a device too large to fill in time).
pub const OOM_MAX_SECONDS: Duration = Duration::from_secs(60);

/// Where the headless demo learns of the signals that end a run
/// ([`ENDING_SIGNALS`](crate::terminal::ENDING_SIGNALS), as the dashboard's): it then prints
/// the report of what ran, marked `interrupted`, shuts its agent down (removing its socket)
/// and exits with [`SIGNAL_EXIT_BASE`](crate::exit::SIGNAL_EXIT_BASE) + the signal's number
/// (nothing to learn where signals cannot be caught).
struct Interrupts {
    #[cfg(unix)]
    signals: Option<signal_hook::iterator::Signals>,
}

impl Interrupts {
    fn catch() -> Interrupts {
        #[cfg(unix)]
        {
            let signals = signal_hook::iterator::Signals::new(crate::terminal::ENDING_SIGNALS)
                .map_err(|e| tracing::warn!("cannot catch SIGINT/SIGTERM/SIGHUP: {e}"))
                .ok();
            Interrupts { signals }
        }
        #[cfg(not(unix))]
        Interrupts {}
    }

    /// The first signal caught since the last look, if any (never waits).
    fn caught(&mut self) -> Option<i32> {
        #[cfg(unix)]
        {
            self.signals.as_mut()?.pending().next()
        }
        #[cfg(not(unix))]
        None
    }
}

/// A signal's name (`SIGTERM`), for the report.
fn signal_name(signal: i32) -> String {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        match signal {
            SIGINT => return "SIGINT".into(),
            SIGTERM => return "SIGTERM".into(),
            SIGHUP => return "SIGHUP".into(),
            _ => {}
        }
    }
    format!("signal {signal}")
}

/// The longest `--seconds` is taken for (a century): `--seconds 1e30` runs until a signal.
const HEADLESS_FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// Lets the headless demo run: `--seconds`, else [`HEADLESS_SECONDS`] for training, else (the
/// OOM scenario) until the first OOM and [`OOM_MARGIN`] more, at most [`OOM_MAX_SECONDS`].
/// Stops early when the workload fails, or on a signal in [`Interrupts`] (returned).
fn run_headless(demo: &Demo, args: &DemoArgs, interrupts: &mut Interrupts) -> Option<i32> {
    let start = Instant::now();
    // Any longer is as good as for ever (and a longer `Duration` or deadline overflows).
    let fixed = args.seconds.map(|s| {
        Duration::try_from_secs_f64(s)
            .unwrap_or(HEADLESS_FOREVER)
            .min(HEADLESS_FOREVER)
    });
    let mut deadline = match (fixed, args.scenario) {
        (Some(d), _) => start + d,
        (None, Scenario::Train) => start + HEADLESS_SECONDS,
        (None, Scenario::Oom) => start + OOM_MAX_SECONDS,
    };
    let mut first_oom_seen = false;
    while Instant::now() < deadline && demo.error().is_none() {
        if let Some(signal) = interrupts.caught() {
            return Some(signal);
        }
        if fixed.is_none() && !first_oom_seen && demo.ooms() > 0 {
            first_oom_seen = true;
            deadline = deadline.min(Instant::now() + OOM_MARGIN);
        }
        std::thread::sleep(AGENT_TICK.min(deadline.saturating_duration_since(Instant::now())));
    }
    if fixed.is_none() && args.scenario == Scenario::Oom && demo.ooms() == 0 {
        eprintln!(
            "allocview demo: no OOM within {} s (give --seconds to run longer)",
            OOM_MAX_SECONDS.as_secs()
        );
    }
    None
}

/// The headless demo: runs, prints the report, ends its agent (which removes its socket).
/// A signal stops the run early: the report says so and the process exits with
/// 128 + the signal's number once the agent is down.
fn headless(cfg: DemoConfig, args: &DemoArgs) -> anyhow::Result<()> {
    let mut interrupts = Interrupts::catch();
    let mut demo = Demo::start(cfg)?;
    if let Some(a) = demo.agent.listen_addr() {
        eprintln!("allocview demo: serving attach clients at {a}");
    }
    let signal = run_headless(&demo, args, &mut interrupts);
    let mut report = demo.report();
    report.interrupted = signal.map(signal_name);
    let printed = print_report(&report, args.json);
    let error = demo.error();
    // The agent's shutdown says goodbye to attach clients and removes the socket.
    drop(demo);
    // A signal during the report or the shutdown is not lost either: the status says it.
    if let Some(signal) = signal.or_else(|| interrupts.caught()) {
        eprintln!("allocview demo: stopped by {}", signal_name(signal));
        if let Err(e) = printed
            && !output::is_stdout_closed(&e)
        {
            eprintln!("allocview: {e:#}");
        }
        std::process::exit(crate::exit::SIGNAL_EXIT_BASE + signal);
    }
    printed?;
    if let Some(e) = error {
        anyhow::bail!("the workload stopped: {e}");
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
        return headless(cfg, args);
    }
    crate::terminal::check_stdout().map_err(|e| e.advise(NEEDS_TERMINAL))?;
    let demo = Demo::start(cfg)?;
    let agent = demo.agent.clone();
    // A signal ends the dashboard without the agent's shutdown: its socket goes with it.
    if let Some(allocview_agent::server::ListenAddr::Unix(path)) = agent.listen_addr() {
        crate::terminal::remove_at_signal(path.clone());
    }
    let save_dir = std::env::current_dir().context("no current folder to save snapshots in")?;
    let mut app = App::new(Box::new(EmbeddedSource::new(demo)), save_dir)?;
    let mut guard = TerminalGuard::enter().map_err(|e| e.advise(NEEDS_TERMINAL))?;
    let result = app::run(&mut guard.terminal, &mut app, AGENT_TICK);
    // The terminal first, then the workload stops; the dumps started are waited for.
    drop(guard);
    drop(app);
    agent.flush();
    if let Some(note) = dumps_note(&agent.state()) {
        output::print(&note)?;
    }
    result
}

/// What the interactive demo prints when it ends, when its agent wrote OOM dumps or failed
/// to: the files, and the commands that open and summarise the first one.
pub fn dumps_note(state: &AgentState) -> Option<String> {
    use std::fmt::Write as _;
    let paths: Vec<&std::path::Path> = crate::demo::dump_paths(state).collect();
    let failures = state.pipeline.dump_failures;
    if paths.is_empty() && failures == 0 {
        return None;
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    if !paths.is_empty() {
        let _ = writeln!(out, "OOM dumps written:");
        for p in &paths {
            let _ = writeln!(out, "  {}", p.display());
        }
    }
    if failures > 0 {
        let _ = writeln!(out, "OOM dumps that failed: {}", units::count(failures));
        for e in crate::demo::dump_errors(state) {
            let _ = writeln!(out, "  {e}");
        }
    }
    let pickle = paths
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "pickle"))
        .or(paths.first());
    if let Some(p) = pickle {
        let _ = writeln!(out, "Open one:      allocview open {}", p.display());
        let _ = writeln!(out, "Its summary:   allocview summary {}", p.display());
    }
    Some(out.trim_end().to_string())
}
