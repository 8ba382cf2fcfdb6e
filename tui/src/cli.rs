//! The command line: `allocview demo | open | summary | replay | export | bench | screenshot`,
//! and `allocview --attach [ADDR]`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// allocview: see what your memory allocators are doing, live or after the fact.
#[derive(Debug, Parser)]
#[command(name = "allocview", version, about, long_about = None)]
pub struct Cli {
    /// Attach to a live process's agent: `unix:PATH`, a socket path, or `HOST:PORT`
    /// (default: $ALLOCVIEW_ADDR, else the only socket in the default folder).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
    pub attach: Option<String>,

    /// With --attach: run without a terminal.
    #[arg(long, requires = "attach")]
    pub headless: bool,

    /// With --attach --headless: print the first full state received and exit.
    #[arg(long, requires = "attach")]
    pub once: bool,

    /// With --attach --headless: print JSON.
    #[arg(long, requires = "attach")]
    pub json: bool,

    /// The subcommand.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// A simulated training run on a simulated GPU, shown live.
    Demo(DemoArgs),
    /// Post-mortem of a snapshot file (PyTorch pickle or allocview JSON), with time travel.
    Open(OpenArgs),
    /// PyTorch's memory summary of a snapshot file, plus fragmentation and OOM facts.
    Summary(SummaryArgs),
    /// Replay a recorded trace through the caching allocator, optionally under other settings.
    Replay(ReplayArgs),
    /// Convert a snapshot between formats.
    Export(ExportArgs),
    /// Benchmarks of allocview's own paths against baselines, in one run.
    Bench(BenchArgs),
    /// Render every view of a demo run to SVG and PNG.
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
    /// Simulated device memory (e.g. `16GiB`, `8000000000`).
    #[arg(long, default_value = "16GiB")]
    pub device_memory: String,
    /// Allocator settings in PyTorch's syntax (`expandable_segments:True,...`); default:
    /// `$ALLOCVIEW_ALLOC_CONF`, else `$PYTORCH_CUDA_ALLOC_CONF`, else PyTorch's defaults.
    #[arg(long)]
    pub config: Option<String>,
    /// Workload.
    #[arg(long, value_enum, default_value_t = Scenario::Train)]
    pub scenario: Scenario,
    /// Device backend.
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// Run without a terminal.
    #[arg(long)]
    pub headless: bool,
    /// With --headless: how long to run.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// With --headless: print JSON.
    #[arg(long)]
    pub json: bool,
    /// Also serve attach clients here (`unix:PATH`, a path, or `127.0.0.1:PORT`).
    #[arg(long)]
    pub listen: Option<String>,
    /// Serve Prometheus metrics on this address (`127.0.0.1:9400`).
    #[arg(long)]
    pub metrics: Option<String>,
    /// Random seed of the workload.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// `allocview open FILE`.
#[derive(Debug, Args)]
pub struct OpenArgs {
    /// Snapshot file (PyTorch pickle or allocview JSON).
    pub file: PathBuf,
}

/// `allocview summary FILE`.
#[derive(Debug, Args)]
pub struct SummaryArgs {
    /// Snapshot file (PyTorch pickle or allocview JSON).
    pub file: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `allocview replay FILE`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// A PyTorch snapshot with a trace, allocview JSON, or an RMM log (CSV).
    pub file: PathBuf,
    /// Allocator settings to replay under; repeat to compare several side by side.
    #[arg(long)]
    pub config: Vec<String>,
    /// Device capacity for the replay (default: what the file says, else enough to never OOM
    /// for lack of device memory).
    #[arg(long)]
    pub device_memory: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Write the replayed run as a PyTorch snapshot pickle.
    #[arg(long)]
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

/// `allocview export IN --to FORMAT -o OUT`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Input snapshot file.
    pub input: PathBuf,
    /// Output format.
    #[arg(long, value_enum)]
    pub to: ExportFormat,
    /// Output file.
    #[arg(short, long)]
    pub out: PathBuf,
}

/// `allocview bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Only benchmarks whose name contains this.
    pub filter: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
}

/// `allocview screenshot`.
#[derive(Debug, Args)]
pub struct ScreenshotArgs {
    /// Output folder.
    #[arg(long, default_value = "screenshots")]
    pub out: PathBuf,
    /// Terminal width in cells.
    #[arg(long, default_value_t = 120)]
    pub width: u16,
    /// Terminal height in cells.
    #[arg(long, default_value_t = 36)]
    pub height: u16,
}
