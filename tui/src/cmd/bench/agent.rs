//! The agent's two ends: publishing into its channel sink (one event at a time, the cost the
//! instrumented `GlobalAlloc` pays per event, `agent.publish`; or in batches, the caching
//! device allocator's path, `agent.publish_batch`) and the aggregator folding events into its
//! mirror, histograms and recent ring (the rate it can keep up with).
//!
//! Both use the events of a recorded allocator cycle ([`workload::event_cycle`]) published
//! over and over, so the aggregator's mirror stays consistent and does the work a real run
//! makes it do. The aggregator has no public way to fold events without its thread, so
//! ingestion is measured end to end through a real [`Agent`]: fill its channel (untimed), then
//! time `Agent::flush`, which drains and folds everything published.

use std::hint::black_box;
use std::time::{Duration, Instant};

use allocview_agent::agent::Agent;
use allocview_agent::sink;
use allocview_alloc::event::{Event, EventSink, MAX_BATCH};
use anyhow::bail;

use super::harness::{self, Timing, compare, each, median};
use super::outcome::{self, Outcome};
use super::workload;

/// Events published between two timed flushes in `agent.ingest` (well under half the
/// channel, so publishing never wakes the aggregator early).
pub const INGEST_CHUNK: usize = 1 << 15;

/// Channel capacity for `agent.ingest`: four chunks, so half capacity is never reached.
pub const INGEST_CAPACITY: usize = 4 * INGEST_CHUNK;

/// Aggregator tick for `agent.ingest`: long, so the only drains are the timed flushes.
const INGEST_TICK: Duration = Duration::from_secs(3600);

/// Empty flushes timed to show the round trip to the aggregator thread.
const FLUSH_PROBES: usize = 21;

/// Median time of an empty flush, in nanoseconds.
fn flush_round_trip(agent: &Agent) -> f64 {
    let times = (0..FLUSH_PROBES)
        .map(|_| {
            let start = Instant::now();
            agent.flush();
            start.elapsed().as_nanos() as f64
        })
        .collect();
    median(times)
}

/// A sink that does nothing: the floor of a publish through `dyn EventSink`.
#[derive(Debug)]
struct NullSink;

impl EventSink for NullSink {
    #[inline(never)]
    fn publish(&self, event: &Event) {
        black_box(event);
    }
}

/// Publishes `events` in a cycle, one per operation.
fn publish_side<'a>(sink: &'a dyn EventSink, events: &'a [Event]) -> impl FnMut(u64) -> Duration {
    let mut next = 0;
    each(move || {
        sink.publish(black_box(&events[next]));
        next += 1;
        if next == events.len() {
            next = 0;
        }
    })
}

/// Publishes `n` events of the cycle per run in batches of [`MAX_BATCH`] (as the caching
/// allocator publishes), the batches cut from the cycle in order.
fn publish_batch_side<'a>(
    sink: &'a dyn EventSink,
    events: &'a [Event],
) -> impl FnMut(u64) -> Duration + 'a {
    let mut next = 0;
    move |n| {
        let start = Instant::now();
        let mut left = n as usize;
        while left > 0 {
            let k = left.min(MAX_BATCH).min(events.len() - next);
            sink.publish_batch(black_box(&events[next..next + k]));
            left -= k;
            next = (next + k) % events.len();
        }
        start.elapsed()
    }
}

/// Publishes the next `n` events of the cycle into `sink`, from `cursor` on.
fn fill(sink: &dyn EventSink, events: &[Event], cursor: &mut usize, n: usize) {
    for _ in 0..n {
        sink.publish(&events[*cursor]);
        *cursor = (*cursor + 1) % events.len();
    }
}

/// An agent whose aggregator only drains when flushed: a long tick, and a channel that
/// [`INGEST_CHUNK`] events never fill to half (the early wake-up mark).
fn quiet_agent() -> anyhow::Result<Agent> {
    workload::spawn_agent(
        workload::agent_builder()
            .channel_capacity(INGEST_CAPACITY)
            .tick(INGEST_TICK),
    )
}

/// `side` in chunks of at most [`INGEST_CHUNK`] operations, `agent` flushed (untimed) after
/// each, so the channel always has room.
fn chunked<'a>(
    agent: &'a Agent,
    side: impl FnMut(u64) -> Duration + 'a,
) -> impl FnMut(u64) -> Duration + 'a {
    harness::chunked(INGEST_CHUNK as u64, side, || agent.flush())
}

/// Fills in a parked benchmark's figures (`a` allocview's side, `b` the baseline) with the
/// note `note(events published)`, once the agent shows it ingested events and dropped none.
fn parked_outcome(
    agent: Agent,
    (a, b): (Timing, Timing),
    mut out: Outcome,
    note: impl FnOnce(u64) -> String,
) -> anyhow::Result<Outcome> {
    let pipeline = agent.state().pipeline;
    if pipeline.events_ingested == 0 {
        bail!("the agent ingested none of the published events");
    }
    if pipeline.dropped_total > 0 {
        bail!("events were dropped although the channels had room (the figure would be wrong)");
    }
    out.allocview_ns = Some(a.median_ns);
    out.baseline_ns = Some(b.median_ns);
    out = out.note(note(pipeline.events_ingested));
    agent.shutdown();
    Ok(out)
}

/// `agent.publish`: one publish into the agent's sink while the channel has room and the
/// aggregator is parked (flushed, untimed, between chunks of [`INGEST_CHUNK`] events) vs a
/// publish that does nothing.
pub fn publish(seconds: f64, out: Outcome) -> anyhow::Result<Outcome> {
    let events = workload::event_cycle()?;
    let agent = quiet_agent()?;
    let sink = agent.sink();
    let null = NullSink;
    let (a, b) = {
        let mut ours = chunked(&agent, publish_side(sink.as_ref(), &events));
        let mut empty = publish_side(&null, &events);
        compare(seconds, &mut ours, &mut empty)
    };
    parked_outcome(agent, (a, b), out, |published| {
        format!(
            "aggregator parked while timing ({published} events published, none dropped); \
             agent.publish_live measures it draining at the same time"
        )
    })
}

/// `agent.publish_batch`: an event published as part of a batch of [`MAX_BATCH`] (the caching
/// allocator's path) into the agent's sink, the aggregator parked as in `agent.publish`, vs
/// the same events published one by one into the same sink.
pub fn publish_batch(seconds: f64, out: Outcome) -> anyhow::Result<Outcome> {
    let events = workload::event_cycle()?;
    let agent = quiet_agent()?;
    let sink = agent.sink();
    let (a, b) = {
        let mut batched = chunked(&agent, publish_batch_side(sink.as_ref(), &events));
        let mut one_by_one = chunked(&agent, publish_side(sink.as_ref(), &events));
        compare(seconds, &mut batched, &mut one_by_one)
    };
    parked_outcome(agent, (a, b), out, |published| {
        format!(
            "per event, in batches of {MAX_BATCH}; aggregator parked while timing ({published} \
             events published, none dropped)"
        )
    })
}

/// `agent.publish_live`: one publish into a running agent's sink whose aggregator drains
/// concurrently on its default tick and wake-ups (drops counted) vs a publish that does nothing.
pub fn publish_live(seconds: f64, mut out: Outcome) -> anyhow::Result<Outcome> {
    let events = workload::event_cycle()?;
    let agent = workload::spawn_agent(workload::agent_builder())?;
    let sink = agent.sink();
    let null = NullSink;
    let (a, b) = {
        let mut ours = publish_side(sink.as_ref(), &events);
        let mut empty = publish_side(&null, &events);
        compare(seconds, &mut ours, &mut empty)
    };
    agent.flush();
    let pipeline = agent.state().pipeline;
    if pipeline.events_ingested == 0 {
        bail!("the agent ingested none of the published events");
    }
    out.allocview_ns = Some(a.median_ns);
    out.baseline_ns = Some(b.median_ns);
    if let Some(note) = workload::dropped_note(&pipeline) {
        out = out.note(note);
    }
    agent.shutdown();
    Ok(out)
}

/// `agent.ingest`: events folded per second by the aggregator (flush of a full channel) vs
/// draining the same number of events from a bare channel on this thread, without folding.
pub fn ingest(seconds: f64, mut out: Outcome) -> anyhow::Result<Outcome> {
    let events = workload::event_cycle()?;
    let agent = quiet_agent()?;
    let agent_sink = agent.sink();
    let (bare_sink, bare_rx) = sink::channel(INGEST_CAPACITY);
    let mut agent_cursor = 0;
    let mut bare_cursor = 0;
    let (a, b) = {
        let mut folded = |n: u64| {
            let mut left = n as usize;
            let mut took = Duration::ZERO;
            while left > 0 {
                let chunk = left.min(INGEST_CHUNK);
                fill(agent_sink.as_ref(), &events, &mut agent_cursor, chunk);
                let start = Instant::now();
                agent.flush();
                took += start.elapsed();
                left -= chunk;
            }
            took
        };
        let mut drained = |n: u64| {
            let mut left = n as usize;
            let mut took = Duration::ZERO;
            while left > 0 {
                let chunk = left.min(INGEST_CHUNK);
                fill(&bare_sink, &events, &mut bare_cursor, chunk);
                let start = Instant::now();
                while let Some(e) = bare_rx.try_recv() {
                    black_box(e);
                }
                took += start.elapsed();
                left -= chunk;
            }
            took
        };
        compare(seconds, &mut folded, &mut drained)
    };
    let round_trip = flush_round_trip(&agent);
    let pipeline = agent.state().pipeline;
    if pipeline.dropped_total > 0 || bare_sink.shared().dropped_total() > 0 {
        bail!("events were dropped although the channel had room (the figure would be wrong)");
    }
    out.allocview_ns = Some(a.median_ns);
    out.baseline_ns = Some(b.median_ns);
    out = out.note(format!(
        "{} events folded; each timed flush drains up to {INGEST_CHUNK} events (one round trip \
         to the aggregator thread included)",
        pipeline.events_ingested
    ));
    out = out.note(format!(
        "a flush of an empty channel takes {} here (median of {FLUSH_PROBES})",
        outcome::nanos(round_trip)
    ));
    if pipeline.inconsistencies > 0 {
        out = out.note(format!(
            "{} events did not fit the mirror (the recorded cycle should always fit)",
            pipeline.inconsistencies
        ));
    }
    agent.shutdown();
    Ok(out)
}
