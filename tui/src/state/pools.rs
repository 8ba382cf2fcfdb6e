//! The pool table: small, large and each private pool, with PyTorch's figures (segments,
//! reserved, allocated, active, inactive split blocks, largest free block, oversize blocks),
//! derived from the segment list.

use allocview_agent::state::{PoolKey, PoolUsage};
use allocview_alloc::snapshot::{SegmentInfo, SegmentType};

/// Which pool a row describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PoolKind {
    /// The small pool (blocks of at most 1 MiB in 2 MiB segments).
    Small,
    /// The large pool.
    Large,
    /// A private pool (CUDA graph capture), by PyTorch's `(id, id)` pair.
    Private(u64, u64),
}

impl PoolKind {
    /// `small`, `large`, `private (1,7)`.
    pub fn label(self) -> String {
        match self {
            PoolKind::Small => "small".into(),
            PoolKind::Large => "large".into(),
            PoolKind::Private(a, b) => format!("private ({a},{b})"),
        }
    }

    /// The pool a segment belongs to.
    pub fn of(seg: &SegmentInfo) -> PoolKind {
        match seg.segment_pool_id {
            (0, 0) => match seg.segment_type {
                SegmentType::Small => PoolKind::Small,
                SegmentType::Large => PoolKind::Large,
            },
            (a, b) => PoolKind::Private(a, b),
        }
    }
}

/// One row of the pool table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolRow {
    /// The pool.
    pub kind: PoolKind,
    /// Segments in the pool.
    pub segments: u64,
    /// Bytes of those segments.
    pub reserved: u64,
    /// Bytes of allocated blocks.
    pub allocated: u64,
    /// Bytes of active blocks (allocated or pending free).
    pub active: u64,
    /// Free blocks inside split segments (they keep the segment from being released).
    pub inactive_split: u64,
    /// Bytes of those blocks.
    pub inactive_split_bytes: u64,
    /// Largest free block.
    pub largest_free: u64,
    /// Allocated blocks at least `max_split_size` (none when unlimited).
    pub oversize: Option<u64>,
}

impl PoolRow {
    /// The row of `kind` from its figures, counted as the agent counts its live pools.
    fn new(kind: PoolKind, u: &PoolUsage, unlimited: bool) -> PoolRow {
        PoolRow {
            kind,
            segments: u.segments,
            reserved: u.reserved,
            allocated: u.allocated,
            active: u.active,
            inactive_split: u.inactive_split,
            inactive_split_bytes: u.inactive_split_bytes,
            largest_free: u.largest_free,
            oversize: (!unlimited).then_some(u.oversize_allocations),
        }
    }
}

/// The table: small and large always (even when empty), then private pools in id order.
/// `max_split_size` decides which blocks count as oversize (`None` = unlimited).
pub fn from_segments(segments: &[SegmentInfo], max_split_size: Option<u64>) -> Vec<PoolRow> {
    // The figures live in the agent's `PoolUsage` (its pool key is not shown: rows name their
    // pool by `PoolKind`, which keeps PyTorch's private pool pair).
    let empty = || PoolUsage::empty(PoolKey::Small);
    let mut pools: Vec<(PoolKind, PoolUsage)> =
        vec![(PoolKind::Small, empty()), (PoolKind::Large, empty())];
    for seg in segments {
        let kind = PoolKind::of(seg);
        let idx = match pools.iter().position(|(k, _)| *k == kind) {
            Some(i) => i,
            None => {
                pools.push((kind, empty()));
                pools.len() - 1
            }
        };
        let u = &mut pools[idx].1;
        u.segments += 1;
        u.reserved += seg.total_size;
        let split = seg.blocks.len() > 1 && !seg.is_expandable;
        for b in &seg.blocks {
            let oversize = max_split_size.is_some_and(|m| b.size >= m);
            u.count_block(b.state, b.size, split, oversize);
        }
    }
    pools[2..].sort_by_key(|(k, _)| *k);
    let unlimited = max_split_size.is_none();
    pools
        .iter()
        .map(|(kind, u)| PoolRow::new(*kind, u, unlimited))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::fixtures::{block, segment};
    use crate::units::MIB;
    use allocview_alloc::snapshot::BlockState;

    #[test]
    fn pools_count_segments_bytes_and_split_blocks() {
        let small = segment(
            0x1000_0000,
            0,
            SegmentType::Small,
            vec![
                block(0x1000_0000, MIB, MIB, BlockState::ActiveAllocated),
                block(0x1010_0000, MIB, MIB, BlockState::Inactive),
            ],
        );
        let large = segment(
            0x2000_0000,
            0,
            SegmentType::Large,
            vec![
                block(0x2000_0000, 12 * MIB, 11 * MIB, BlockState::ActiveAllocated),
                block(0x20c0_0000, 4 * MIB, 4 * MIB, BlockState::ActivePendingFree),
                block(0x2100_0000, 4 * MIB, 4 * MIB, BlockState::Inactive),
            ],
        );
        let mut private = large.clone();
        private.segment_pool_id = (1, 7);
        let rows = from_segments(&[small, large, private], Some(10 * MIB));
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].kind, PoolKind::Small);
        assert_eq!((rows[0].segments, rows[0].reserved), (1, 2 * MIB));
        assert_eq!(
            (rows[0].inactive_split, rows[0].inactive_split_bytes),
            (1, MIB)
        );
        assert_eq!(rows[1].allocated, 12 * MIB);
        assert_eq!(rows[1].active, 16 * MIB);
        assert_eq!(rows[1].largest_free, 4 * MIB);
        assert_eq!(rows[1].oversize, Some(1));
        assert_eq!(rows[2].kind.label(), "private (1,7)");
    }

    #[test]
    fn empty_state_still_lists_small_and_large() {
        let rows = from_segments(&[], None);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].oversize, None);
    }
}
