//! `allocview bench`: allocview's own hot paths measured against baselines, side by side in one
//! run, from the installed binary (no cargo needed).
//!
//! Every benchmark is timed the same way ([`harness`]): warm-up and calibration, then batches
//! of about `--seconds / 20` each, allocview's side and the baseline's alternating, for about
//! `--seconds` per side; the figure is the median over batches of nanoseconds per operation,
//! with every input and result passed through `std::hint::black_box`. The output is a table
//! (`benchmark | allocview | baseline | ratio | goal | verdict`) or, with `--json`, an array of
//! `{name, allocview_ns, baseline_ns, ratio, goal, met, baseline, notes}`. A benchmark that
//! cannot run here (no fixture, no Python) is listed as skipped with the reason.
//!
//! `snapshot.load` and `replay.throughput` read the largest real PyTorch snapshot fixture
//! ([`snapshot::LARGEST_FIXTURE`]) from the folder named by the environment variable
//! `ALLOCVIEW_FIXTURES` ([`snapshot::FIXTURES_ENV`]; it may also name the file itself), else
//! from [`snapshot::DEFAULT_FIXTURES`] relative to the current folder; without it they are
//! skipped, and the note says which path was tried. `allocview bench --help` says the same.
//!
//! `snapshot.large_load` needs no fixture: it generates its snapshot (see
//! [`snapshot::load_large`]).
//!
//! The same comparisons, with criterion's statistics, are the crates' `cargo bench` targets.

pub mod agent;
pub mod caching;
pub mod harness;
pub mod large;
pub mod outcome;
pub mod render;
pub mod replay;
pub mod snapshot;
pub mod workload;

use anyhow::bail;

use self::outcome::{Goal, Outcome, Unit};
use crate::cli::BenchArgs;

/// Largest `--seconds` accepted (per side of each benchmark).
pub const MAX_SECONDS: f64 = 600.0;

/// How a benchmark runs: the time per side, and the outcome to fill in.
type RunFn = fn(f64, Outcome) -> anyhow::Result<Outcome>;

/// One benchmark: its name, baseline, goal, and how to run it (`None`: it cannot run in this
/// build, and the note says why).
struct Entry {
    name: &'static str,
    baseline: &'static str,
    goal: Goal,
    unit: Unit,
    run: Result<RunFn, &'static str>,
}

/// Why `heap.instrumented` is not measured here.
const HEAP_INSTRUMENTED_UNAVAILABLE: &str = "not measured by this command: calling a \
    GlobalAlloc directly needs `unsafe`, which the allocview crate forbids, and allocview-alloc \
    has no safe entry point for one alloc/dealloc; run `cargo bench -p allocview-alloc --bench \
    instrumented_heap` for Instrumented<System> vs System";

/// Every benchmark, in the order they run and print.
const ENTRIES: [Entry; 13] = [
    Entry {
        name: "caching.alloc_free_pair",
        baseline: "glibc malloc + free of the same sizes (512 B .. 24 MiB)",
        goal: Goal::RatioAtMost(3.0),
        unit: Unit::Time,
        run: Ok(caching::alloc_free_pair),
    },
    Entry {
        name: "caching.with_trace_tracker",
        baseline: "the same cached pair without a trace tracker",
        goal: Goal::RatioAtMost(1.2),
        unit: Unit::Time,
        run: Ok(caching::with_trace_tracker),
    },
    Entry {
        name: "caching.with_event_sink",
        baseline: "the same cached pair without an event sink, in chunks the agent drains between",
        goal: Goal::RatioAtMost(1.2),
        unit: Unit::Time,
        run: Ok(caching::with_event_sink),
    },
    Entry {
        name: "caching.event_sink_overload",
        baseline: "the same cached pair without an event sink, in a flood the agent cannot keep up with",
        goal: Goal::Informational,
        unit: Unit::Time,
        run: Ok(caching::event_sink_overload),
    },
    Entry {
        name: "agent.publish",
        baseline: "an empty publish through the same dyn EventSink call",
        goal: Goal::NanosAtMost(15.0),
        unit: Unit::Time,
        run: Ok(agent::publish),
    },
    Entry {
        name: "agent.publish_batch",
        baseline: "the same events published one by one into the same sink",
        goal: Goal::NanosAtMost(15.0),
        unit: Unit::Time,
        run: Ok(agent::publish_batch),
    },
    Entry {
        name: "agent.publish_live",
        baseline: "an empty publish through the same dyn EventSink call",
        goal: Goal::NanosAtMost(15.0),
        unit: Unit::Time,
        run: Ok(agent::publish_live),
    },
    Entry {
        name: "agent.ingest",
        baseline: "draining the same events from a bare channel on this thread, no folding",
        goal: Goal::EventsPerSecAtLeast(20e6),
        unit: Unit::Events,
        run: Ok(agent::ingest),
    },
    Entry {
        name: "heap.instrumented",
        baseline: "System alloc + dealloc of 64 bytes",
        goal: Goal::RatioAtMost(2.0),
        unit: Unit::Time,
        run: Err(HEAP_INSTRUMENTED_UNAVAILABLE),
    },
    Entry {
        name: "snapshot.load",
        baseline: "python3 pickle.loads of the same bytes",
        goal: Goal::FasterThanBaseline,
        unit: Unit::Time,
        run: Ok(snapshot::load),
    },
    Entry {
        name: "snapshot.large_load",
        baseline: "python3 pickle.loads of the same bytes",
        goal: Goal::FasterThanBaseline,
        unit: Unit::Time,
        run: Ok(snapshot::load_large),
    },
    Entry {
        name: "replay.throughput",
        baseline: "a bare replay: the trace's allocs and frees straight into a fresh caching \
            allocator",
        goal: Goal::EventsPerSecAtLeast(5e6),
        unit: Unit::Events,
        run: Ok(replay::throughput),
    },
    Entry {
        name: "tui.render_segments",
        baseline: "the same 200x60 frame with no segments",
        goal: Goal::NanosAtMost(5e6),
        unit: Unit::Time,
        run: Ok(render::render_segments),
    },
];

/// Every benchmark's name, in order.
pub fn names() -> Vec<&'static str> {
    ENTRIES.iter().map(|e| e.name).collect()
}

/// Checks `--seconds`: a finite number above zero and at most [`MAX_SECONDS`].
pub fn check_seconds(seconds: f64) -> anyhow::Result<f64> {
    if !seconds.is_finite() || seconds <= 0.0 {
        bail!("--seconds must be a number of seconds above zero, got {seconds}");
    }
    if seconds > MAX_SECONDS {
        bail!("--seconds must be at most {MAX_SECONDS}, got {seconds}");
    }
    Ok(seconds)
}

/// Runs every benchmark whose name contains `filter` (all when `None`), `seconds` per side,
/// reporting progress through `progress` (the benchmark about to run).
pub fn run_benchmarks(
    filter: Option<&str>,
    seconds: f64,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<Vec<Outcome>> {
    let seconds = check_seconds(seconds)?;
    let chosen: Vec<&Entry> = ENTRIES
        .iter()
        .filter(|e| filter.is_none_or(|f| e.name.contains(f)))
        .collect();
    if chosen.is_empty() {
        bail!(
            "no benchmark matches {:?}; the benchmarks are: {}",
            filter.unwrap_or_default(),
            names().join(", ")
        );
    }
    let mut outcomes = Vec::with_capacity(chosen.len());
    for e in chosen {
        let blank = Outcome::new(e.name, e.baseline, e.goal, e.unit);
        let outcome = match e.run {
            Err(why) => blank.note(why),
            Ok(run) => {
                progress(e.name);
                run(seconds, blank.clone())
                    .unwrap_or_else(|err| blank.note(format!("failed: {err:#}")))
            }
        };
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// The machine the figures come from: cores, and the load average where the system reports it
/// (a busy machine inflates wall-clock figures, both sides alike).
fn machine_line() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string(LOADAVG)
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string));
    match load {
        Some(l) => format!(
            "machine: {cores} cores, load average {l}; each side ran about the same seconds, \
             interleaved"
        ),
        None => {
            format!("machine: {cores} cores; each side ran about the same seconds, interleaved")
        }
    }
}

/// Where Linux reports the load average.
const LOADAVG: &str = "/proc/loadavg";

/// Runs the command.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let quiet = args.json;
    let outcomes = run_benchmarks(args.filter.as_deref(), args.seconds, |name| {
        if !quiet {
            eprintln!("running {name} ...");
        }
    })?;
    let text = if args.json {
        outcome::to_json(&outcomes)
    } else {
        format!("{}\n{}", outcome::to_table(&outcomes), machine_line())
    };
    crate::output::print(text.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_seconds_are_refused_with_the_value() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_SECONDS * 2.0] {
            let err = check_seconds(bad).unwrap_err().to_string();
            assert!(err.contains("--seconds"), "{err}");
        }
        assert_eq!(check_seconds(0.5).unwrap(), 0.5);
    }

    #[test]
    fn a_filter_that_matches_nothing_names_the_benchmarks() {
        let err = run_benchmarks(Some("nothing-like-this"), 0.01, |_| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("no benchmark matches"), "{err}");
        assert!(err.contains("caching.alloc_free_pair"), "{err}");
    }

    #[test]
    fn a_benchmark_that_cannot_run_is_listed_with_its_reason() {
        let mut ran = Vec::new();
        let out =
            run_benchmarks(Some("heap.instrumented"), 0.01, |n| ran.push(n.to_string())).unwrap();
        assert!(ran.is_empty());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].verdict(), "skipped");
        assert!(out[0].notes[0].contains("unsafe"));
    }

    #[test]
    fn the_help_names_the_fixtures_variable_and_its_default() {
        use clap::CommandFactory;
        let mut cli = crate::cli::Cli::command();
        let bench = cli
            .find_subcommand_mut("bench")
            .expect("a bench subcommand");
        let help = bench.render_help().to_string();
        assert!(help.contains(snapshot::FIXTURES_ENV), "{help}");
        assert!(help.contains(snapshot::DEFAULT_FIXTURES), "{help}");
    }

    #[test]
    fn names_are_unique() {
        let mut n = names();
        n.sort_unstable();
        n.dedup();
        assert_eq!(n.len(), ENTRIES.len());
    }
}
