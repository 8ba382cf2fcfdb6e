//! Fragmentation figures of a group of segments (a pool, a stream, a device), summed block by
//! block.
//!
//! The definitions follow PyTorch's `DeviceStats` where one exists, so the figures agree with
//! the `memory_summary` table printed beside them: *active* counts allocated and pending-free
//! blocks; *requested* sums the requested sizes of active blocks (PyTorch drops them at free
//! completion); *free in split segments* is `inactive_split_bytes` (free blocks of segments
//! split into more than one block, not expandable: memory the cache cannot give back).

use allocview_alloc::snapshot::{BlockState, SegmentInfo};
use serde::Serialize;

/// Fragmentation figures of a group of segments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Fragmentation {
    /// Segments in the group.
    pub segments: u64,
    /// Blocks in those segments.
    pub blocks: u64,
    /// Bytes reserved from the device (segment sizes).
    pub reserved: u64,
    /// Bytes in allocated blocks.
    pub allocated: u64,
    /// Bytes in active blocks (allocated or pending free).
    pub active: u64,
    /// Requested bytes of active blocks.
    pub requested: u64,
    /// Bytes in free (inactive) blocks: `reserved - active`.
    pub free: u64,
    /// Size of the largest free block: the largest request the cache can serve without a new
    /// segment.
    pub largest_free_block: u64,
    /// Free bytes in split segments (PyTorch's `inactive_split_bytes`).
    pub free_in_split_segments: u64,
    /// Bytes lost to rounding: `size - requested_size` over allocated blocks.
    pub rounding_waste: u64,
}

impl Fragmentation {
    /// Adds one segment and its blocks.
    pub fn add_segment(&mut self, seg: &SegmentInfo) {
        self.segments += 1;
        self.reserved = self.reserved.saturating_add(seg.total_size);
        let split = seg.blocks.len() > 1 && !seg.is_expandable;
        for b in &seg.blocks {
            self.blocks += 1;
            match b.state {
                BlockState::ActiveAllocated => {
                    self.allocated = self.allocated.saturating_add(b.size);
                    self.rounding_waste = self
                        .rounding_waste
                        .saturating_add(b.size.saturating_sub(b.requested_size));
                }
                BlockState::ActivePendingFree => {}
                BlockState::Inactive => {
                    self.free = self.free.saturating_add(b.size);
                    self.largest_free_block = self.largest_free_block.max(b.size);
                    if split {
                        self.free_in_split_segments =
                            self.free_in_split_segments.saturating_add(b.size);
                    }
                }
            }
            if b.state.is_active() {
                self.active = self.active.saturating_add(b.size);
                self.requested = self.requested.saturating_add(b.requested_size);
            }
        }
    }

    /// Adds another group's figures.
    pub fn merge(&mut self, o: &Fragmentation) {
        self.segments += o.segments;
        self.blocks += o.blocks;
        self.reserved = self.reserved.saturating_add(o.reserved);
        self.allocated = self.allocated.saturating_add(o.allocated);
        self.active = self.active.saturating_add(o.active);
        self.requested = self.requested.saturating_add(o.requested);
        self.free = self.free.saturating_add(o.free);
        self.largest_free_block = self.largest_free_block.max(o.largest_free_block);
        self.free_in_split_segments = self
            .free_in_split_segments
            .saturating_add(o.free_in_split_segments);
        self.rounding_waste = self.rounding_waste.saturating_add(o.rounding_waste);
    }

    /// Share of free bytes stranded in split segments, 0 to 1 (0 when nothing is free).
    pub fn split_share(&self) -> f64 {
        if self.free == 0 {
            0.0
        } else {
            self.free_in_split_segments as f64 / self.free as f64
        }
    }
}
