//! Eight threads hammer one caching allocator that publishes into an agent with a deliberately
//! small channel: drops are counted and reported, the agent resynchronises, the final stats are
//! exact, nothing deadlocks (the scenario is `support/small_channel_stress.rs`, which
//! `tests/batch_pipeline.rs` runs with full batches).
//!
//! Operations per thread: 50,000 by default (a debug build on 2 cores stays well under 30 s);
//! `ALLOCVIEW_STRESS_OPS=1000000` runs the full 8 x 1M.

use std::time::Duration;

#[path = "support/small_channel_stress.rs"]
mod small_channel_stress;
use small_channel_stress::{Publish, Scenario, mixed_size};

const THREADS: u64 = 8;
const DEFAULT_OPS: usize = 50_000;
/// Streams of the device: each thread allocates on one and records some blocks on the next.
const STREAMS: u64 = 3;
/// A free whose draw is a multiple of this first records the block on another stream.
const RECORD_STREAM_EVERY: u64 = 7;

fn ops() -> usize {
    std::env::var("ALLOCVIEW_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_OPS)
}

#[test]
fn eight_threads_with_a_small_channel_drop_resync_and_end_exact() {
    small_channel_stress::run(&Scenario {
        threads: THREADS,
        ops: ops(),
        streams: STREAMS,
        size: mixed_size,
        record_stream_every: Some(RECORD_STREAM_EVERY),
        publish: Publish::Direct,
        reader_pause: Duration::from_millis(5),
    });
}
