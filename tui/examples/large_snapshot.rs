//! Writes the large PyTorch-shaped snapshot of `allocview bench`'s `snapshot.large_load`
//! (made by allocview's caching allocator on the simulated device, see
//! `allocview::cmd::bench::large`) to a file, as PyTorch's pickle or allocview's JSON.
//!
//! ```text
//! cargo run --release -p allocview --example large_snapshot -- OUT.pickle [tour|bench] [KEY=N]...
//! ```
//!
//! `tour` (the default) is an 80 GiB device with `max_entries=100000`; `bench` the bench
//! row's smaller run. `KEY=N` overrides one figure of the run: `entries` (ring size),
//! `steps`, `layers`, `streams`, `large` (10-16 MiB tensors, one segment each), `small`
//! (small buffers, two per 2 MiB segment), `gib` (device capacity). `layout=pytorch` (the
//! default) writes a pickle as PyTorch does, every traceback a list of its own
//! (`allocview_agent::pytorch::to_pickle_pytorch_layout`); `layout=allocview` as allocview
//! writes it, equal tracebacks written once.

use std::path::PathBuf;

use allocview::cmd::bench::large::{self, LargeSpec};
use allocview_agent::pytorch;
use allocview_agent::snapshot_file::{self, FileFormat};
use anyhow::{Context, bail};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(out) = args.next().map(PathBuf::from) else {
        bail!(
            "usage: large_snapshot OUT.(pickle|json) [tour|bench] [KEY=N]... [layout=pytorch|allocview]"
        );
    };
    let mut spec = match args.next().as_deref() {
        None | Some("tour") => LargeSpec::TOUR,
        Some("bench") => LargeSpec::BENCH,
        Some(other) => bail!("unknown run {other:?}: tour or bench"),
    };
    let mut pytorch_layout = true;
    for arg in args {
        let (key, n) = arg
            .split_once('=')
            .with_context(|| format!("{arg:?} is not KEY=N"))?;
        if key == "layout" {
            pytorch_layout = match n {
                "pytorch" => true,
                "allocview" => false,
                _ => bail!("layout={n}: pytorch or allocview"),
            };
            continue;
        }
        let n: usize = n.parse().with_context(|| format!("{arg:?}: not a count"))?;
        match key {
            "entries" => spec.max_entries = n,
            "steps" => spec.steps = n,
            "layers" => spec.layers = n,
            "streams" => spec.streams = n as u64,
            "large" => spec.persistent_large = n,
            "small" => spec.persistent_small = n,
            "gib" => spec.capacity = (n as u64) << 30,
            _ => bail!("unknown key {key:?}"),
        }
    }
    let snapshot = large::generate(&spec)?;
    if out.extension().is_some_and(|e| e == "json") {
        snapshot_file::save(&out, &snapshot, FileFormat::Json)
            .with_context(|| format!("writing {}", out.display()))?;
    } else if pytorch_layout {
        std::fs::write(&out, pytorch::to_pickle_pytorch_layout(&snapshot))
            .with_context(|| format!("writing {}", out.display()))?;
    } else {
        snapshot_file::save(&out, &snapshot, FileFormat::Pickle)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    let entries: usize = snapshot.device_traces.iter().map(Vec::len).sum();
    println!(
        "{}: {} segments, {entries} trace entries",
        out.display(),
        snapshot.segments.len()
    );
    Ok(())
}
