//! Expandable segments inside the device allocator: finding room, mapping pages into a
//! segment and unmapping free ones (PyTorch's `find_expandable_block`, `map_block`,
//! `unmap_block`, `try_allocate_expandable_block`).

use crate::caching::backend::{DeviceBackend, StreamId};
use crate::caching::block::{Block, BlockId, NIL};
use crate::caching::config::expandable_page;
use crate::caching::error::AllocError;
use crate::caching::expandable::ExpandableSegment;
use crate::event::{EventAction, FLAG_EXPANDABLE};
use crate::snapshot::{Frames, TraceAction};

use super::{DeviceCachingAllocator, dec, inc};

impl DeviceCachingAllocator {
    pub(super) fn try_allocate_expandable_block<B: DeviceBackend>(
        &mut self,
        be: &B,
        stream: StreamId,
        sidx: u16,
        pool: u32,
        size: u64,
        context: Option<&Frames>,
    ) -> Result<Option<BlockId>, AllocError> {
        let Some(mut candidate) = self.find_expandable_block(be, stream, sidx, pool, size)? else {
            return Ok(None);
        };
        if !self.arena[candidate].mapped {
            let want = self.arena[candidate].size.min(size);
            if !self.map_block(be, candidate, want, context)? {
                return Ok(None);
            }
        }
        while self.arena[candidate].size < size {
            let remaining = size - self.arena[candidate].size;
            let next = self.arena[candidate].next;
            let want = remaining.min(self.arena[next].size);
            if !self.map_block(be, next, want, context)? {
                return Ok(None);
            }
            candidate = next;
        }
        self.remove_from_blocks(candidate);
        Ok(Some(candidate))
    }

    fn allocatable(&self, id: BlockId) -> bool {
        id != NIL && self.arena[id].is_free()
    }

    /// The lowest-addressed free/unmapped run with room for `size`, or a new segment.
    fn find_expandable_block<B: DeviceBackend>(
        &mut self,
        be: &B,
        stream: StreamId,
        sidx: u16,
        pool: u32,
        size: u64,
    ) -> Result<Option<BlockId>, AllocError> {
        let has_room = |this: &Self, mut b: BlockId| {
            let mut bytes = 0u64;
            while bytes < size && this.allocatable(b) {
                bytes += this.arena[b].size;
                b = this.arena[b].next;
            }
            bytes >= size
        };
        for (&(s, _), &id) in self.pools[pool as usize].unmapped.range((stream.0, 0)..) {
            if s != stream.0 {
                break;
            }
            let mut c = id;
            let prev = self.arena[c].prev;
            if self.allocatable(prev) {
                c = prev;
            }
            if has_room(self, c) {
                return Ok(Some(c));
            }
        }
        let page = expandable_page(self.is_small(pool));
        let (_, total) = be.mem_get_info()?;
        let es = match ExpandableSegment::reserve(be, total, page) {
            Ok(es) => es,
            Err(e) if e.is_out_of_memory() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let (va, full) = (es.va, es.size());
        let slot = match self.expandable.iter().position(Option::is_none) {
            Some(i) => {
                self.expandable[i] = Some(es);
                i
            }
            None => {
                self.expandable.push(Some(es));
                self.expandable.len() - 1
            }
        };
        if let Some(pp) = self.private_pool_of(pool) {
            pp.segment_count += 1;
        }
        let mut b = Block::new(va, full, stream, sidx, pool, self.is_small(pool));
        b.mapped = false;
        b.expandable = slot as u32;
        let id = self.arena.insert(b);
        self.pools[pool as usize]
            .unmapped
            .insert((stream.0, va), id);
        Ok(Some(id))
    }

    /// PyTorch's `map_block`: back the front `size` bytes of an unmapped block with pages.
    fn map_block<B: DeviceBackend>(
        &mut self,
        be: &B,
        to_map: BlockId,
        size: u64,
        context: Option<&Frames>,
    ) -> Result<bool, AllocError> {
        let (addr, bsize, stream, pool, es, next, sidx) = {
            let b = &self.arena[to_map];
            (
                b.addr,
                b.size,
                b.stream,
                b.pool,
                b.expandable,
                b.next,
                b.sidx,
            )
        };
        let Some(seg) = self.expandable[es as usize].as_mut() else {
            return Ok(false);
        };
        let (mptr, msize) = seg.map(be, addr, size)?;
        if msize == 0 {
            return Ok(false);
        }
        self.pools[pool as usize].unmapped.remove(&(stream.0, addr));
        self.arena[to_map].mapped = true;
        if msize < bsize {
            let mut rest = Block::new(
                addr + msize,
                bsize - msize,
                stream,
                sidx,
                pool,
                self.is_small(pool),
            );
            rest.mapped = false;
            rest.expandable = es;
            rest.prev = to_map;
            rest.next = next;
            let rid = self.arena.insert(rest);
            if next != NIL {
                self.arena[next].prev = rid;
            }
            self.arena[to_map].next = rid;
            self.arena[to_map].size = msize;
            self.pools[pool as usize]
                .unmapped
                .insert((stream.0, addr + msize), rid);
        }
        let prev = self.arena[to_map].prev;
        self.try_merge_blocks(to_map, prev);
        let next = self.arena[to_map].next;
        self.try_merge_blocks(to_map, next);
        self.insert_into_blocks(to_map);
        self.total_allocated_memory += msize;
        let small = self.is_small(pool);
        inc(&mut self.stats.reserved_bytes, small, msize);
        self.stats.num_device_alloc += 1;
        self.record_trace(TraceAction::SegmentMap, mptr, msize, stream, context);
        let b = &mut self.arena[to_map];
        if b.prev == NIL && b.segment_context.is_none() {
            b.segment_context = context.cloned();
        }
        self.emit(
            EventAction::SegmentMap,
            pool,
            mptr,
            msize,
            0,
            stream,
            FLAG_EXPANDABLE,
        );
        Ok(true)
    }

    /// PyTorch's `unmap_block`: give back the whole free pages inside a free block.
    pub(super) fn unmap_block<B: DeviceBackend>(
        &mut self,
        be: &B,
        id: BlockId,
        context: Option<&Frames>,
    ) -> Result<(), AllocError> {
        let (addr, size, stream, pool, es) = {
            let b = &self.arena[id];
            (b.addr, b.size, b.stream, b.pool, b.expandable)
        };
        let Some(seg) = self.expandable[es as usize].as_mut() else {
            return Ok(());
        };
        let (uptr, usize_) = seg.unmap(be, addr, size)?;
        if usize_ == 0 {
            return Ok(());
        }
        self.remove_from_blocks(id);
        let before = uptr - addr;
        if before > 0 {
            self.link_free_piece(id, addr, before, Side::Before);
        }
        let after = size - before - usize_;
        if after > 0 {
            self.link_free_piece(id, uptr + usize_, after, Side::After);
        }
        {
            let b = &mut self.arena[id];
            b.addr = uptr;
            b.size = usize_;
            b.mapped = false;
        }
        let prev = self.arena[id].prev;
        self.try_merge_blocks(id, prev);
        let next = self.arena[id].next;
        self.try_merge_blocks(id, next);
        let key = (stream.0, self.arena[id].addr);
        self.pools[pool as usize].unmapped.insert(key, id);
        self.total_allocated_memory -= usize_;
        let small = self.is_small(pool);
        dec(&mut self.stats.reserved_bytes, small, usize_);
        self.stats.num_device_free += 1;
        let seg_ctx = self.arena[id].segment_context.clone();
        self.record_trace(
            TraceAction::SegmentUnmap,
            uptr,
            usize_,
            stream,
            context.or(seg_ctx.as_ref()),
        );
        self.emit(
            EventAction::SegmentUnmap,
            pool,
            uptr,
            usize_,
            0,
            stream,
            FLAG_EXPANDABLE,
        );
        Ok(())
    }

    /// Links a new free block `[addr, addr + size)` into `id`'s expandable segment, just
    /// before or just after `id`, and puts it in the pool's free set (the still-mapped parts of
    /// a block whose middle pages were unmapped).
    fn link_free_piece(&mut self, id: BlockId, addr: u64, size: u64, side: Side) {
        let (stream, sidx, pool, es) = {
            let b = &self.arena[id];
            (b.stream, b.sidx, b.pool, b.expandable)
        };
        let mut piece = Block::new(addr, size, stream, sidx, pool, self.is_small(pool));
        piece.expandable = es;
        let (prev, next) = match side {
            Side::Before => (self.arena[id].prev, id),
            Side::After => (id, self.arena[id].next),
        };
        piece.prev = prev;
        piece.next = next;
        let pid = self.arena.insert(piece);
        if prev != NIL {
            self.arena[prev].next = pid;
        }
        if next != NIL {
            self.arena[next].prev = pid;
        }
        self.insert_into_blocks(pid);
    }

    /// Gives back the address ranges of every expandable segment with nothing mapped (when
    /// the allocator is dropped: the blocks that describe them are dropped with it).
    pub(crate) fn release_unmapped_address_ranges<B: DeviceBackend>(
        &mut self,
        be: &B,
    ) -> Result<(), AllocError> {
        for slot in &mut self.expandable {
            if let Some(seg) = slot.take_if(|seg| seg.is_unmapped()) {
                be.vm_release(seg.va, seg.size())?;
            }
        }
        Ok(())
    }

    /// Gives back the address range of an expandable segment with nothing mapped.
    pub(super) fn release_expandable_segment<B: DeviceBackend>(
        &mut self,
        be: &B,
        id: BlockId,
    ) -> Result<(), AllocError> {
        let (addr, stream, pool, es) = {
            let b = &self.arena[id];
            (b.addr, b.stream, b.pool, b.expandable)
        };
        if let Some(seg) = self.expandable[es as usize].take() {
            be.vm_release(seg.va, seg.size())?;
        }
        self.pools[pool as usize].unmapped.remove(&(stream.0, addr));
        if let Some(pp) = self.private_pool_of(pool) {
            pp.segment_count -= 1;
        }
        self.arena.remove(id);
        Ok(())
    }
}

/// Where `DeviceCachingAllocator::link_free_piece` puts the new block relative to the given one.
#[derive(Clone, Copy)]
enum Side {
    Before,
    After,
}
