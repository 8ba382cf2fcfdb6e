//! Time travel over a recording with thousands of segments and deep stacks (the run of
//! `allocview bench`'s large snapshot, smaller): the checkpoints share the segments they have
//! in common, and no seek, forward or back, sees a change made after its checkpoint.

use allocview::cmd::bench::large::{self, LargeSpec};
use allocview::state::from_snapshot::PostMortem;
use allocview::state::timetravel::{CHECKPOINT_EVERY, TimeTravel};
use allocview_alloc::snapshot::{SegmentInfo, Snapshot};

/// Thousands of segments, a trace of several checkpoints, small enough for a debug test.
const SPEC: LargeSpec = LargeSpec {
    capacity: 80 << 30,
    max_entries: 6_000,
    persistent_large: 300,
    persistent_small: 4_000,
    steps: 30,
    layers: 12,
    streams: 4,
};

fn recording() -> Snapshot {
    large::generate(&SPEC).expect("the run records")
}

#[test]
fn every_seek_matches_a_full_replay_in_any_order() {
    let snap = recording();
    assert!(snap.segments.len() >= 2_000, "{}", snap.segments.len());
    let tt = TimeTravel::new(&snap, 0);
    let n = tt.len();
    assert!(n > 4 * CHECKPOINT_EVERY, "{n} events");
    // Forward, then backward: a later seek must not see what an earlier one changed, and
    // no checkpoint may hold a change made after it.
    let mut events: Vec<usize> = (0..=n).step_by(n / 7).collect();
    events.extend([
        1,
        CHECKPOINT_EVERY - 1,
        CHECKPOINT_EVERY,
        CHECKPOINT_EVERY + 1,
        n,
    ]);
    let forward: Vec<_> = events.iter().map(|&e| tt.at(e)).collect();
    for (&e, seen) in events.iter().zip(&forward).rev() {
        let again = tt.at(e);
        assert_eq!(&again, seen, "event {e} changed between seeks");
        assert_eq!(again, tt.at_by_full_replay(e), "event {e}");
    }
    // The last event is the file's own state (free blocks are gaps to time travel: their
    // requested size is not the file's).
    let shape = |segs: &[SegmentInfo]| -> Vec<_> {
        segs.iter()
            .map(|s| {
                let blocks: Vec<_> = s
                    .blocks
                    .iter()
                    .map(|b| (b.address, b.size, b.state, b.frames.clone()))
                    .collect();
                (
                    s.address,
                    s.total_size,
                    s.allocated_size,
                    s.active_size,
                    s.stream,
                    blocks,
                )
            })
            .collect()
    };
    assert_eq!(shape(&tt.at(n).0), shape(&snap.segments));
}

#[test]
fn the_post_mortem_of_thousands_of_segments_shows_every_segment() {
    let snap = recording();
    let pm = PostMortem::new("large.pickle", &snap);
    let last = pm.len();
    let state = pm.state_at(last);
    assert_eq!(state.segments.len(), snap.segments.len());
    let first = pm.state_at(0);
    assert!(first.segments.len() <= state.segments.len());
}
