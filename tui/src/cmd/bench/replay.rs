//! `replay.throughput`: trace events per second replaying the largest fixture with
//! `allocview_agent::replay::replay` (the fidelity run, as `allocview replay FILE` does), against
//! a bare replay of the same trace: each `alloc` a `malloc` of the recorded size, each
//! `free_requested` a `free` of the block that address got, on a fresh caching allocator with
//! default settings — no initial state, no placement hints, no fidelity bookkeeping. The
//! difference is what faithful replay costs on top of the allocator's own work.

use std::collections::HashMap;
use std::hint::black_box;

use allocview_agent::replay::{self, ReplaySettings};
use allocview_agent::snapshot_file;
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::snapshot::{TraceAction, TraceEntry};
use anyhow::{Context, bail};

use super::harness::{compare, each};
use super::outcome::Outcome;
use super::snapshot::read_fixture;
use super::workload;

/// Replays `entries` bare (see the module docs); returns how many allocations succeeded.
fn bare_replay(entries: &[TraceEntry]) -> usize {
    let alloc = workload::allocator();
    let mut map = HashMap::with_capacity(entries.len() / 2);
    let mut done = 0;
    for e in entries {
        match e.action {
            TraceAction::Alloc => {
                if let Ok(p) = alloc.malloc(e.size, StreamId::DEFAULT) {
                    map.insert(e.addr, p);
                    done += 1;
                }
            }
            TraceAction::FreeRequested => {
                if let Some(p) = map.remove(&e.addr) {
                    let _ = alloc.free(p);
                }
            }
            _ => {}
        }
    }
    done
}

/// `replay.throughput`: the fidelity replay vs the bare replay, per trace event.
pub fn throughput(seconds: f64, mut out: Outcome) -> anyhow::Result<Outcome> {
    let (path, bytes) = match read_fixture() {
        Ok(x) => x,
        Err(why) => return Ok(out.note(why)),
    };
    let snapshot = snapshot_file::from_bytes(&bytes)
        .with_context(|| format!("decoding {}", path.display()))?;
    // The trace replay picks.
    let entries = replay::engine::trace_index(&snapshot)
        .map_or(&[][..], |i| snapshot.device_traces[i].as_slice());
    if entries.is_empty() {
        bail!("{} has no trace to replay", path.display());
    }
    let settings = ReplaySettings::default();
    let first = replay::replay(&snapshot, &settings, &mut |_, _| {})
        .with_context(|| format!("replaying {}", path.display()))?;
    let events = first.report.events;
    if events != entries.len() {
        bail!(
            "replay walked {events} events, the trace has {}",
            entries.len()
        );
    }
    if bare_replay(entries) == 0 {
        bail!("the bare replay allocated nothing");
    }
    let mut failed = None;
    let (a, b) = {
        let mut ours = each(|| {
            if let Err(e) = black_box(replay::replay(&snapshot, &settings, &mut |_, _| {})) {
                failed.get_or_insert(e.to_string());
            }
        });
        let mut bare = each(|| {
            black_box(bare_replay(black_box(entries)));
        });
        compare(seconds, &mut ours, &mut bare)
    };
    if let Some(e) = failed {
        bail!("replay failed: {e}");
    }
    // Per trace event: both sides walk the same trace.
    out.allocview_ns = Some(a.median_ns / events as f64);
    out.baseline_ns = Some(b.median_ns / events as f64);
    out = out.note(format!(
        "{events} trace events of {}; fidelity: {:.1}% of allocations at the recorded address",
        path.display(),
        first.report.fidelity.alloc_percent()
    ));
    Ok(out)
}
