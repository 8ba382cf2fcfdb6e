//! The caching allocator's hot path: a cached `malloc` + `free` pair on the simulated device
//! against glibc's `malloc` + `free` of the same sizes, and the cost of observing it (a trace
//! tracker, the agent's event sink) against the same allocator unobserved.
//!
//! The glibc baseline goes through `std::alloc::System` (a `Vec<u8>` with that capacity, made
//! and dropped): for these sizes and byte alignment `System` calls `malloc` and `free` directly,
//! and this crate forbids `unsafe`, so it cannot call `libc::malloc` itself.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use allocview_agent::agent::Agent;
use allocview_alloc::caching::CachingAllocator;
use allocview_alloc::caching::sim::SimBackend;
use anyhow::bail;

use super::harness::{Side, chunked, compare, each};
use super::outcome::Outcome;
use super::workload::{self, MIXED_SIZES};

/// Cached `malloc` + `free` pairs on `alloc`; the first error lands in `failed`.
fn pair_side<'a>(
    alloc: &'a CachingAllocator<SimBackend>,
    failed: &'a mut Option<String>,
) -> impl FnMut(u64) -> Duration + 'a {
    let mut next = 0;
    each(move || workload::alloc_free_pair(alloc, &mut next, failed))
}

/// glibc `malloc` + `free` of the next mixed size (through `System`, see the module docs).
fn glibc_side() -> impl FnMut(u64) -> Duration {
    let mut next = 0;
    each(move || {
        let size = MIXED_SIZES[next];
        next = (next + 1) % MIXED_SIZES.len();
        let block: Vec<u8> = Vec::with_capacity(black_box(size as usize));
        black_box(block.as_ptr());
    })
}

/// Fails when a side hit an error, or when the allocator went to the device during the timed
/// loop (then the figure would not be the cached path's).
fn check(
    what: &str,
    failed: Option<String>,
    alloc: &CachingAllocator<SimBackend>,
    device_allocs_before: i64,
) -> anyhow::Result<()> {
    if let Some(e) = failed {
        bail!("{what}: {e}");
    }
    let after = workload::device_allocs(alloc);
    if after != device_allocs_before {
        bail!(
            "{what}: {} segment allocations during the timed loop (the cache did not hold)",
            after - device_allocs_before
        );
    }
    Ok(())
}

/// `caching.alloc_free_pair`: cached pair vs glibc.
pub fn alloc_free_pair(seconds: f64, mut out: Outcome) -> anyhow::Result<Outcome> {
    let alloc = workload::allocator();
    workload::prewarm(&alloc)?;
    let before = workload::device_allocs(&alloc);
    let mut failed = None;
    let (a, b) = {
        let mut ours = pair_side(&alloc, &mut failed);
        let mut glibc = glibc_side();
        compare(seconds, &mut ours as &mut dyn Side, &mut glibc)
    };
    check("caching allocator", failed, &alloc, before)?;
    out.allocview_ns = Some(a.median_ns);
    out.baseline_ns = Some(b.median_ns);
    Ok(out)
}

/// `caching.with_trace_tracker`: the pair with a trace tracker attached vs without.
pub fn with_trace_tracker(seconds: f64, mut out: Outcome) -> anyhow::Result<Outcome> {
    let plain = workload::allocator();
    let tracked = workload::allocator();
    let entries = Arc::new(AtomicU64::new(0));
    let counter = entries.clone();
    // Trackers run under the allocator's lock, one at a time: a load and a store count
    // without the locked read-modify-write that would time the counter rather than the
    // allocator's tracing.
    tracked.attach_trace_tracker(move |entry| {
        black_box(entry);
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    });
    workload::prewarm(&plain)?;
    workload::prewarm(&tracked)?;
    let (plain_before, tracked_before) = (
        workload::device_allocs(&plain),
        workload::device_allocs(&tracked),
    );
    let seen_before = entries.load(Ordering::Relaxed);
    let (mut plain_failed, mut tracked_failed) = (None, None);
    let (a, b) = {
        let mut with = pair_side(&tracked, &mut tracked_failed);
        let mut without = pair_side(&plain, &mut plain_failed);
        compare(seconds, &mut with, &mut without)
    };
    check("with tracker", tracked_failed, &tracked, tracked_before)?;
    check("without tracker", plain_failed, &plain, plain_before)?;
    if entries.load(Ordering::Relaxed) == seen_before {
        bail!("the trace tracker saw no entries during the timed loop");
    }
    out.allocview_ns = Some(a.median_ns);
    out.baseline_ns = Some(b.median_ns);
    Ok(out)
}

/// Pairs per timed chunk of `caching.with_event_sink`: about 8 Ki events (2 a pair), an eighth
/// of the default channel, so a chunk never reaches the sink's half-full wake-up or a drop.
pub const SINK_CHUNK_PAIRS: u64 = 4096;

/// Clock reads timed per round of [`clock_read_ns`].
const CLOCK_READS: u32 = 1_000_000;
/// Rounds of [`clock_read_ns`] (the fastest is kept).
const CLOCK_ROUNDS: usize = 5;

/// Nanoseconds one read of the clock that stamps events takes here (the fastest of
/// [`CLOCK_ROUNDS`] rounds of [`CLOCK_READS`] back-to-back reads): each observed call reads it
/// once, so a pair pays it twice.
fn clock_read_ns() -> f64 {
    (0..CLOCK_ROUNDS)
        .map(|_| {
            let start = std::time::Instant::now();
            let mut sum = 0u64;
            for _ in 0..CLOCK_READS {
                sum = sum.wrapping_add(black_box(allocview_alloc::event::now_ns()));
            }
            black_box(sum);
            start.elapsed().as_nanos() as f64 / f64::from(CLOCK_READS)
        })
        .fold(f64::INFINITY, f64::min)
}

/// The agent's pipeline figures (events ingested, dropped) as notes, once it drained; fails
/// when it ingested nothing.
fn sink_notes(agent: &Agent, mut out: Outcome) -> anyhow::Result<Outcome> {
    agent.flush();
    let pipeline = agent.state().pipeline;
    if pipeline.events_ingested == 0 {
        bail!("the agent ingested no events");
    }
    out = out.note(format!(
        "agent ingested {} events",
        pipeline.events_ingested
    ));
    if let Some(note) = workload::dropped_note(&pipeline) {
        out = out.note(note);
    }
    Ok(out)
}

/// `caching.with_event_sink`: the cost of publishing, the pair publishing into a running agent
/// vs no sink, at a pace the agent keeps up with.
///
/// The pairs run in chunks of [`SINK_CHUNK_PAIRS`] (well within the channel), and the agent
/// drains the chunk's events between chunks, off the clock, as it does between the bursts of a
/// real program (which calls the allocator well under 1 M times a second, a tick or the
/// half-full wake-up draining in between): so the figure is the publisher's cost, writing into
/// slots the aggregator last read, and nothing is dropped. The baseline runs the same chunks
/// and pauses. [`event_sink_overload`] times the flood the agent cannot keep up with.
pub fn with_event_sink(seconds: f64, out: Outcome) -> anyhow::Result<Outcome> {
    sink_comparison(seconds, out, Pace::Drained)
}

/// `caching.event_sink_overload`: the pair flooding a running agent vs no sink (no goal: it
/// shows what publishing costs when the aggregator falls behind).
///
/// The loop publishes about 50 M events/s, more than the aggregator folds (20-25 M/s), so the
/// channel fills and events drop (each dropped publish a counter increment), while the
/// aggregator, busy on the other core, takes the cache lines the publisher writes. The observed
/// allocator is not registered as the agent's provider: with one, each tick would
/// resynchronise from a snapshot taken under the allocator's lock (measured: 86 ns a pair
/// instead of 65), which times recovery from overload rather than publishing.
pub fn event_sink_overload(seconds: f64, out: Outcome) -> anyhow::Result<Outcome> {
    sink_comparison(seconds, out, Pace::Flood)
}

/// How the sink benchmarks run their pairs.
#[derive(Debug, Clone, Copy)]
enum Pace {
    /// In chunks the agent drains between, off the clock ([`with_event_sink`]).
    Drained,
    /// Back to back, faster than the agent folds ([`event_sink_overload`]).
    Flood,
}

/// The cached pair publishing into a running agent vs the same pair without a sink.
fn sink_comparison(seconds: f64, out: Outcome, pace: Pace) -> anyhow::Result<Outcome> {
    let agent = workload::spawn_agent(workload::agent_builder())?;
    let plain = workload::allocator();
    let observed = workload::allocator();
    // The sink is set before the first allocation, so the agent's mirror sees every segment.
    observed.set_event_sink(Some(agent.sink()));
    workload::prewarm(&plain)?;
    workload::prewarm(&observed)?;
    let (plain_before, observed_before) = (
        workload::device_allocs(&plain),
        workload::device_allocs(&observed),
    );
    let (mut plain_failed, mut observed_failed) = (None, None);
    let (a, b) = match pace {
        Pace::Drained => {
            let drained = |side| chunked(SINK_CHUNK_PAIRS, side, || agent.flush());
            let mut with = drained(pair_side(&observed, &mut observed_failed));
            let mut without = drained(pair_side(&plain, &mut plain_failed));
            compare(seconds, &mut with, &mut without)
        }
        Pace::Flood => {
            let mut with = pair_side(&observed, &mut observed_failed);
            let mut without = pair_side(&plain, &mut plain_failed);
            compare(seconds, &mut with, &mut without)
        }
    };
    check(
        "with event sink",
        observed_failed,
        &observed,
        observed_before,
    )?;
    check("without event sink", plain_failed, &plain, plain_before)?;
    observed.set_event_sink(None);
    let mut out = sink_notes(&agent, out)?;
    out.allocview_ns = Some(a.median_ns);
    out.baseline_ns = Some(b.median_ns);
    agent.shutdown();
    if let Pace::Drained = pace {
        let clock = clock_read_ns();
        let source = if allocview_alloc::event::clock_uses_counter() {
            "the CPU's time-stamp counter"
        } else {
            "CLOCK_MONOTONIC"
        };
        out = out.note(format!(
            "each observed call reads the clock that times its events once (2 reads a pair): \
             {:.1} ns a read back to back here ({source}), less beside the call's other work",
            clock
        ));
    }
    Ok(out)
}
