//! The shape of a snapshot's segments, for comparing a replay's with a recording's.

use allocview_alloc::snapshot::Snapshot;

/// A segment's address and size, with each block's size and whether it is active.
pub type SegmentLayout = (u64, u64, Vec<(u64, bool)>);

/// Each segment's [`SegmentLayout`], sorted by address.
pub fn layout(snap: &Snapshot) -> Vec<SegmentLayout> {
    let mut v: Vec<SegmentLayout> = snap
        .segments
        .iter()
        .map(|seg| {
            let blocks = seg
                .blocks
                .iter()
                .map(|b| (b.size, b.state.is_active()))
                .collect();
            (seg.address, seg.total_size, blocks)
        })
        .collect();
    v.sort();
    v
}
