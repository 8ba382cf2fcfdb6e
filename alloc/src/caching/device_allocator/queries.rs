//! Read-only views of the device allocator: segment bases and the snapshot's segments.

use crate::caching::backend::DevicePtr;
use crate::caching::block::NIL;
use crate::snapshot::{BlockInfo, BlockState, SegmentInfo, SegmentType};

use super::{DeviceCachingAllocator, all_current};

impl DeviceCachingAllocator {
    /// The segment base and size containing `ptr` (for expandable segments, the contiguous
    /// mapped range).
    pub(crate) fn base_allocation(&self, ptr: DevicePtr) -> Option<(DevicePtr, u64)> {
        let id = match self.allocated.get(ptr) {
            Some(id) => id,
            None => self
                .arena
                .iter()
                .find(|(_, b)| b.mapped && b.addr <= ptr && ptr < b.addr + b.size)
                .map(|(id, _)| id)?,
        };
        let mut head = id;
        while self.arena[head].prev != NIL && self.arena[self.arena[head].prev].mapped {
            head = self.arena[head].prev;
        }
        let base = self.arena[head].addr;
        let mut size = 0;
        let mut b = head;
        while b != NIL && self.arena[b].mapped {
            size += self.arena[b].size;
            b = self.arena[b].next;
        }
        Some((base, size))
    }

    /// The segments (one per contiguous mapped range for expandable segments), sorted by
    /// address, and the total active bytes.
    pub(crate) fn segments(&self) -> (Vec<SegmentInfo>, u64) {
        let mut out = Vec::new();
        let mut total_active = 0;
        for (id, head) in self.arena.iter() {
            if !head.mapped || (head.prev != NIL && self.arena[head.prev].mapped) {
                continue;
            }
            let pool = &self.pools[head.pool as usize];
            let mut seg = SegmentInfo {
                device: self.device,
                address: head.addr,
                total_size: 0,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                stream: head.stream.0,
                segment_type: if pool.is_small {
                    SegmentType::Small
                } else {
                    SegmentType::Large
                },
                segment_pool_id: pool.owner.map_or((0, 0), |p| (p.0, p.1)),
                is_expandable: head.is_expandable(),
                frames: head
                    .segment_context
                    .clone()
                    .unwrap_or_else(|| self.empty_frames.clone()),
                blocks: Vec::new(),
            };
            let mut b = id;
            while b != NIL && self.arena[b].mapped {
                let blk = &self.arena[b];
                let active = blk.is_active();
                seg.total_size += blk.size;
                if blk.allocated {
                    seg.allocated_size += blk.size;
                }
                if active {
                    seg.active_size += blk.size;
                    seg.requested_size += blk.requested;
                }
                seg.blocks.push(BlockInfo {
                    address: blk.addr,
                    size: blk.size,
                    requested_size: blk.requested,
                    state: if blk.allocated {
                        BlockState::ActiveAllocated
                    } else if active {
                        BlockState::ActivePendingFree
                    } else {
                        BlockState::Inactive
                    },
                    frames: blk
                        .context
                        .clone()
                        .unwrap_or_else(|| self.empty_frames.clone()),
                    history: Vec::new(),
                });
                b = blk.next;
            }
            total_active += seg.active_size;
            out.push(seg);
        }
        out.sort_by_key(|s| s.address);
        (out, total_active)
    }

    /// `reserved - allocated` (all pools).
    pub(crate) fn cached_bytes(&self) -> u64 {
        let r = all_current(&self.stats.reserved_bytes);
        let a = all_current(&self.stats.allocated_bytes);
        (r - a).max(0) as u64
    }
}
