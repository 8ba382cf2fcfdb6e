//! A what-if run attempts each recorded OOM's request again; where it succeeds, the run held
//! that block (it is given back at once, since the recorded program never had it), so the
//! run's peaks include it.

#[path = "support/oom_recording.rs"]
mod oom_recording;

use allocview_agent::replay::{self, RunOptions};
use allocview_alloc::caching::AllocatorConfig;
use oom_recording::*;

#[test]
fn a_what_if_that_rescues_the_recorded_oom_counts_the_rescued_block_in_its_peaks() {
    let snap = record();
    let opts = RunOptions::what_if(AllocatorConfig::default(), "2 GiB", Some(2 * GIB), false);
    let r = replay::engine::run(&snap, &opts, &mut |_| {}).unwrap();
    assert_eq!(r.figures.ooms, 0, "{:?}", r.figures);
    assert_eq!(r.figures.peak_allocated, LIVE + TOO_BIG, "{:?}", r.figures);
    assert_eq!(r.figures.peak_reserved, LIVE + TOO_BIG, "{:?}", r.figures);
    assert_eq!(
        r.figures.peak_allocated,
        r.stats.allocated_bytes.0[0].peak as u64
    );
}
