//! The command line: `allocview demo | open | summary | replay | export | bench | screenshot`,
//! and `allocview --attach [ADDR]`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// allocview: see what your memory allocators are doing, live or after the fact.
#[derive(Debug, Parser)]
#[command(name = "allocview", version, about, long_about = None, after_help = MAIN_EXAMPLES)]
pub struct Cli {
    /// Attach to a live process's agent: `unix:PATH`, a socket path, or `HOST:PORT`
    /// (default: $ALLOCVIEW_ADDR, else the only socket in the default folder).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
    pub attach: Option<String>,

    /// With --attach: run without a terminal, printing the state as a text line (or JSON) a
    /// second. No reconnect: exits 0 when the agent shuts down, 1 when the connection is lost
    /// without its goodbye; says on stderr when no update came for 5 s.
    #[arg(long, requires = "attach")]
    pub headless: bool,

    /// With --attach --headless: print the first full state received and exit.
    #[arg(long, requires = "attach", requires = "headless")]
    pub once: bool,

    /// With --attach --headless: print JSON.
    #[arg(long, requires = "attach", requires = "headless")]
    pub json: bool,

    /// The subcommand.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// A simulated training run on a simulated GPU, shown live.
    #[command(after_help = DEMO_EXAMPLES)]
    Demo(DemoArgs),
    /// Post-mortem of a snapshot file (PyTorch pickle or allocview JSON), with time travel.
    #[command(after_help = OPEN_EXAMPLES)]
    Open(OpenArgs),
    /// PyTorch's memory summary of a snapshot file, plus fragmentation and OOM facts.
    #[command(after_help = SUMMARY_EXAMPLES)]
    Summary(SummaryArgs),
    /// Replay a recorded trace through the caching allocator, optionally under other settings.
    #[command(after_help = REPLAY_EXAMPLES)]
    Replay(ReplayArgs),
    /// Convert a snapshot between allocview JSON and PyTorch's pickle.
    #[command(after_help = EXPORT_EXAMPLES)]
    Export(ExportArgs),
    /// Benchmarks of allocview's own paths against baselines, in one run.
    #[command(after_help = BENCH_NOTES)]
    Bench(BenchArgs),
    /// Render every view of a seeded demo run to SVG and PNG.
    #[command(after_help = SCREENSHOT_EXAMPLES)]
    Screenshot(ScreenshotArgs),
}

/// Which device backend runs the allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Backend {
    /// The simulated device.
    #[default]
    Sim,
    /// A real GPU through the CUDA driver (build with `--features cuda`).
    Cuda,
}

/// The demo's workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Scenario {
    /// A steady training run.
    #[default]
    Train,
    /// A run whose activations grow until the device runs out of memory.
    Oom,
}

/// `allocview demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Simulated device memory (e.g. `16GiB`, `512MiB`, `8000000000`); ignored with
    /// `--backend cuda`.
    #[arg(long, value_name = "SIZE", default_value = "16GiB")]
    pub device_memory: String,
    /// Allocator settings in PyTorch's syntax (`KEY:VALUE,...`, e.g.
    /// `expandable_segments:True`); repeat to add more (joined with commas, as in
    /// `PYTORCH_CUDA_ALLOC_CONF`). Default: `$ALLOCVIEW_ALLOC_CONF`, else
    /// `$PYTORCH_CUDA_ALLOC_CONF`, else PyTorch's defaults.
    #[arg(long, value_name = "SETTINGS")]
    pub config: Vec<String>,
    /// Workload.
    #[arg(long, value_enum, default_value_t = Scenario::Train)]
    pub scenario: Scenario,
    /// Device backend.
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// Run without a terminal, then print a report.
    #[arg(long)]
    pub headless: bool,
    /// With --headless: how many seconds to run (default: 5; with `--scenario oom`, until the
    /// first OOM and 2 s more, at most 60 s).
    #[arg(long, requires = "headless")]
    pub seconds: Option<f64>,
    /// With --headless: print the report as JSON.
    #[arg(long, requires = "headless")]
    pub json: bool,
    /// Also serve attach clients here (`unix:PATH`, a path, or `127.0.0.1:PORT`), for
    /// `allocview --attach ADDR` from another terminal.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (e.g. `127.0.0.1:9400`).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Random seed of the workload.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// `allocview open FILE`.
#[derive(Debug, Args)]
pub struct OpenArgs {
    /// Snapshot file: a PyTorch `torch.cuda.memory._dump_snapshot` pickle, an OOM dump, or
    /// allocview JSON.
    pub file: PathBuf,
}

/// `allocview summary FILE`.
#[derive(Debug, Args)]
pub struct SummaryArgs {
    /// Snapshot file: a PyTorch `torch.cuda.memory._dump_snapshot` pickle, an OOM dump, or
    /// allocview JSON.
    pub file: PathBuf,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// CI gate: after the output, exit with status 3 when the file holds an OOM (in its trace
    /// or its header).
    #[arg(long)]
    pub fail_on_oom: bool,
    /// CI gate: after the output, exit with status 3 when the peak allocated bytes over the
    /// trace window exceed SIZE (bytes, or a number and a unit: 4GiB); status 1 when the
    /// peak is not known (no trace, or its replay did not reproduce the recording).
    #[arg(long, value_name = "SIZE")]
    pub max_peak: Option<String>,
}

/// `allocview replay FILE`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// A PyTorch snapshot recorded with `_record_memory_history` (so it has a trace),
    /// allocview JSON, or an RMM log (CSV).
    pub file: PathBuf,
    /// Allocator settings to replay under, in PyTorch's syntax
    /// (`expandable_segments:True,max_split_size_mb:256`); repeat to compare several side by
    /// side. Each is applied on top of the settings the file records: the keys given change,
    /// the others stay as recorded. Start with `defaults` to begin from PyTorch's defaults
    /// instead (`defaults`, `defaults,max_split_size_mb:128`). Without it, only the replay
    /// under the recorded settings runs.
    #[arg(long, value_name = "SETTINGS")]
    pub config: Vec<String>,
    /// Device capacity for the replay (e.g. `80GiB`; default: what the file says, else enough
    /// to never OOM for lack of device memory).
    #[arg(long, value_name = "SIZE")]
    pub device_memory: Option<String>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write a replayed run as a PyTorch snapshot pickle (for `allocview open` or PyTorch's
    /// viewers): with one `--config`, its what-if run; with several, one file per config
    /// (`what-if.pickle` becomes `what-if.1-SETTINGS.pickle`, `what-if.2-SETTINGS.pickle`, ...);
    /// without `--config`, the `recorded` column (the replay on the recorded device, even with
    /// `--device-memory`).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Output formats of `export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// allocview's versioned JSON.
    Json,
    /// PyTorch's snapshot pickle.
    Pickle,
}

/// `allocview export IN [--to FORMAT] -o OUT`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Input snapshot file (PyTorch pickle or allocview JSON).
    pub input: PathBuf,
    /// Output format (default: the one OUT's extension names: `.json`, or `.pickle`/`.pkl`).
    #[arg(long, value_enum)]
    pub to: Option<ExportFormat>,
    /// Output file; without --to, its extension (`.json`, `.pickle`, `.pkl`) picks the format.
    #[arg(short, long)]
    pub out: PathBuf,
}

/// `allocview bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Only benchmarks whose name contains this (e.g. `caching`, `agent.publish`).
    pub filter: Option<String>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// About how many seconds each side (allocview's and the baseline's) of each benchmark
    /// runs.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
}

/// `allocview screenshot`.
#[derive(Debug, Args)]
pub struct ScreenshotArgs {
    /// Output folder (created if missing).
    #[arg(long, default_value = "screenshots")]
    pub out: PathBuf,
    /// Terminal width in cells.
    #[arg(long, default_value_t = 120)]
    pub width: u16,
    /// Terminal height in cells.
    #[arg(long, default_value_t = 36)]
    pub height: u16,
}

/// Examples under `allocview --help`.
const MAIN_EXAMPLES: &str = "\
Examples:
  allocview demo                           A simulated training run, live (q quits, ? help)
  allocview summary oom.pickle             PyTorch's memory summary of a _dump_snapshot file
  allocview open oom.pickle                The dashboard over that file, with time travel
  allocview replay oom.pickle --config expandable_segments:True
                                           Would expandable segments have avoided the OOM?
  allocview --attach unix:/tmp/train.sock  A live process that embeds the agent
  ALLOCVIEW_TOKEN=s3cret allocview --attach 10.0.0.5:7070 --headless --once
                                           An agent that requires a token, as text

Environment:
  ALLOCVIEW_ADDR      The address --attach uses when none is given (agents listen there, too)
  ALLOCVIEW_TOKEN     The token --attach presents; agents with a token set refuse clients
                      without it (and need one to listen on a non-loopback address)
  ALLOCVIEW_DUMP_DIR  Where OOM dumps go (default ./allocview-dumps)
  ALLOCVIEW_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF
                      The demo's allocator settings when --config is not given

Run `allocview COMMAND --help` for a command's options.";

/// Examples under `allocview demo --help`.
const DEMO_EXAMPLES: &str = "\
Examples:
  allocview demo
  allocview demo --scenario oom --device-memory 8GiB
  allocview demo --scenario oom --headless   Runs to the first OOM (+2 s), then reports it
  allocview demo --config expandable_segments:True --listen unix:/tmp/demo.sock
  allocview demo --headless --seconds 10 --json

At each OOM the demo's agent writes a snapshot (PyTorch pickle and allocview JSON) to
$ALLOCVIEW_DUMP_DIR, else ./allocview-dumps: the first 4 OOMs of a run (later ones are listed,
not written). Open one with `allocview open allocview-dumps/oom-0001-pid<PID>.pickle`.";

/// Examples under `allocview open --help`.
const OPEN_EXAMPLES: &str = "\
Record the file in PyTorch with
  torch.cuda.memory._record_memory_history(max_entries=100_000)
  ...
  torch.cuda.memory._dump_snapshot(\"oom.pickle\")

Examples:
  allocview open oom.pickle

Keys: ,/. (or ←/→ outside Segments and Histograms) step through the trace, [/] ±100,
n next OOM, g next segment event, Home/End first/last; 1-7 or Tab views, ? help, q quit.";

/// Examples under `allocview summary --help`.
const SUMMARY_EXAMPLES: &str = "\
Examples:
  allocview summary oom.pickle             A torch.cuda.memory._dump_snapshot file
  allocview summary allocview-dumps/oom-0001-pid4242.json --json
  allocview summary run.pickle --json --fail-on-oom --max-peak 60GiB

Exit status: 0 success, 1 error, 2 usage error, 3 a --fail-on-oom or --max-peak gate failed
(the output is printed first). JSON fields and exit codes: docs/json.md.";

/// Examples under `allocview replay --help`.
const REPLAY_EXAMPLES: &str = "\
Examples:
  allocview replay oom.pickle
  allocview replay oom.pickle --config \"expandable_segments:True\"
  allocview replay oom.pickle --config expandable_segments:True --config max_split_size_mb:256
  allocview replay oom.pickle --config \"expandable_segments:True\" --out what-if.pickle";

/// Examples under `allocview export --help`.
const EXPORT_EXAMPLES: &str = "\
Examples:
  allocview export oom.pickle -o oom.json         The format from the extension
  allocview export oom.json -o oom.pickle         Opens in PyTorch's own viewers
  allocview export oom.pickle --to json -o oom.snapshot";

/// Notes under `allocview bench --help`.
const BENCH_NOTES: &str = "\
Environment:
  ALLOCVIEW_FIXTURES  Folder of PyTorch snapshot fixtures (or the fixture file itself) that
                      snapshot.load and replay.throughput read; default:
                      ../shared/fixtures/pytorch-snapshots. Without the file those two are
                      listed as skipped. snapshot.load's baseline also needs python3.

Examples:
  allocview bench
  allocview bench caching --seconds 3
  ALLOCVIEW_FIXTURES=/data/pytorch-snapshots allocview bench snapshot.load --json";

/// Examples under `allocview screenshot --help`.
const SCREENSHOT_EXAMPLES: &str = "\
Examples:
  allocview screenshot --out screenshots/
  allocview screenshot --out /tmp/shots --width 160 --height 48";
