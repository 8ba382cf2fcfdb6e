//! Blocks (pieces of a segment) and the slab that holds them.
//!
//! PyTorch keeps each `Block` on the heap and links neighbours by pointer. Here blocks live in a
//! slab (`BlockArena`) and link by index: a split reuses a freed slot, so the cached
//! malloc/free path allocates nothing once the slab has grown to the working set.

use crate::caching::backend::StreamId;
use crate::caching::pool::{SizeKey, size_key};
use crate::snapshot::Frames;

/// Index of a block in its arena.
pub(crate) type BlockId = u32;

/// "No block" (a null `prev`/`next`, no expandable segment).
pub(crate) const NIL: u32 = u32::MAX;

/// One block: a contiguous range of a segment, allocated, free, or waiting for streams.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    /// Device address of the first byte.
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// The request this block last served (PyTorch keeps it after the free).
    pub requested: u64,
    /// The stream it was allocated for.
    pub stream: StreamId,
    /// The allocator's dense index of that stream (the free-set key uses it).
    pub sidx: u16,
    /// Index of its `BlockPool`.
    pub pool: u32,
    /// Whether `pool` is a small pool (kept here so that a free reaches its stats without
    /// a second lookup).
    pub small: bool,
    /// Neighbour below in the same segment, or `NIL`.
    pub prev: BlockId,
    /// Neighbour above in the same segment, or `NIL`.
    pub next: BlockId,
    /// Handed out to the program.
    pub allocated: bool,
    /// Backed by physical memory (always true outside expandable segments).
    pub mapped: bool,
    /// In use in the arena (false for a free slot).
    pub live: bool,
    /// Outstanding device events (frees waiting for other streams).
    pub event_count: u32,
    /// Id of `context` in the allocator's context table, for events (0 when none was interned:
    /// no sink listened, or no frames were gathered).
    pub context_id: u32,
    /// Streams other than the allocation stream that used the block (`record_stream`).
    pub stream_uses: Vec<StreamId>,
    /// The pool's free-block search count when the block was cached (garbage collection age).
    pub gc_count_base: i64,
    /// Index of the expandable segment the block lies in, or `NIL`.
    pub expandable: u32,
    /// Context where the block was last allocated.
    pub context: Option<Frames>,
    /// Context where its segment was allocated (kept on the segment's first block).
    pub segment_context: Option<Frames>,
}

impl Block {
    /// A live, free, mapped block.
    pub(crate) fn new(
        addr: u64,
        size: u64,
        stream: StreamId,
        sidx: u16,
        pool: u32,
        small: bool,
    ) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            sidx,
            pool,
            small,
            prev: NIL,
            next: NIL,
            allocated: false,
            mapped: true,
            live: true,
            event_count: 0,
            context_id: 0,
            stream_uses: Vec::new(),
            gc_count_base: 0,
            expandable: NIL,
            context: None,
            segment_context: None,
        }
    }

    /// Part of a segment that holds other blocks.
    #[inline]
    pub(crate) fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    /// Part of an expandable segment.
    #[inline]
    pub(crate) fn is_expandable(&self) -> bool {
        self.expandable != NIL
    }

    /// Not allocated, no pending events, no recorded stream uses: may be merged or reused.
    #[inline]
    pub(crate) fn is_free(&self) -> bool {
        !self.allocated && self.event_count == 0 && self.stream_uses.is_empty()
    }

    /// Allocated, or freed while other streams still use it.
    #[inline]
    pub(crate) fn is_active(&self) -> bool {
        self.allocated || self.event_count > 0 || !self.stream_uses.is_empty()
    }
}

/// Empties a slot whose block is gone: not live, no contexts or stream uses (the list keeps
/// its capacity), unlinked.
#[inline(always)]
fn vacate(b: &mut Block) {
    b.live = false;
    b.context = None;
    b.segment_context = None;
    b.stream_uses.clear();
    b.prev = NIL;
    b.next = NIL;
}

/// `dst` takes over its neighbour `src`: links, address, size and the segment's context (when
/// `src` comes first) move to `dst`, and `src`'s slot is freed as [`BlockArena::remove`] frees
/// one. Works on one slice so its pointer and length stay in registers. Returns the bytes
/// absorbed.
#[inline(always)]
fn absorb_neighbour(
    blocks: &mut [Block],
    free: &mut Vec<BlockId>,
    dst: BlockId,
    src: BlockId,
) -> u64 {
    let s = &mut blocks[src as usize];
    let (s_addr, s_size, s_prev, s_next) = (s.addr, s.size, s.prev, s.next);
    let seg_ctx = s.segment_context.take();
    vacate(s);
    free.push(src);
    let d = &mut blocks[dst as usize];
    if d.prev == src {
        d.addr = s_addr;
        d.prev = s_prev;
        d.segment_context = seg_ctx;
        if s_prev != NIL {
            blocks[s_prev as usize].next = dst;
        }
    } else {
        d.next = s_next;
        if s_next != NIL {
            blocks[s_next as usize].prev = dst;
        }
    }
    blocks[dst as usize].size += s_size;
    s_size
}

/// What [`BlockArena::merge_free_neighbours`] did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Merged {
    /// The free-set keys of the neighbours absorbed (before, after).
    pub absorbed: [Option<SizeKey>; 2],
    /// Neighbours absorbed.
    pub blocks: i64,
    /// Bytes absorbed.
    pub bytes: u64,
    /// Whether the grown block still shares its segment with other blocks.
    pub split: bool,
}

/// A slab of blocks with a free list of slots.
#[derive(Debug, Default)]
pub(crate) struct BlockArena {
    blocks: Vec<Block>,
    free: Vec<BlockId>,
}

impl BlockArena {
    pub(crate) fn with_capacity(n: usize) -> BlockArena {
        BlockArena {
            blocks: Vec::with_capacity(n),
            free: Vec::with_capacity(n),
        }
    }

    /// Stores a block, reusing a free slot when there is one.
    pub(crate) fn insert(&mut self, b: Block) -> BlockId {
        if let Some(id) = self.free.pop() {
            self.blocks[id as usize] = b;
            id
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as BlockId
        }
    }

    /// Adds a free, mapped, unlinked block like [`Block::new`], resetting a vacant slot in
    /// place when there is one (its context fields are already empty, and its stream-use
    /// list keeps its capacity), so the hot path moves no whole `Block`.
    #[inline]
    pub(crate) fn insert_new(
        &mut self,
        addr: u64,
        size: u64,
        stream: StreamId,
        sidx: u16,
        pool: u32,
        small: bool,
    ) -> BlockId {
        let Some(id) = self.free.pop() else {
            return self.insert(Block::new(addr, size, stream, sidx, pool, small));
        };
        let b = &mut self.blocks[id as usize];
        debug_assert!(!b.live && b.context.is_none() && b.segment_context.is_none());
        debug_assert!(b.stream_uses.is_empty() && b.prev == NIL && b.next == NIL);
        b.addr = addr;
        b.size = size;
        b.requested = 0;
        b.stream = stream;
        b.sidx = sidx;
        b.pool = pool;
        b.small = small;
        b.allocated = false;
        b.mapped = true;
        b.live = true;
        b.event_count = 0;
        b.context_id = 0;
        b.gc_count_base = 0;
        b.expandable = NIL;
        id
    }

    /// Splits block `rem` (which keeps the back part and its other fields, as in PyTorch):
    /// a new block takes its first `size` bytes for `stream`, linked in before it. Returns
    /// the new block.
    #[inline]
    pub(crate) fn split_front(&mut self, rem: BlockId, size: u64, stream: StreamId) -> BlockId {
        let r = &self.blocks[rem as usize];
        let (addr, prev, sidx, pool, small, es) =
            (r.addr, r.prev, r.sidx, r.pool, r.small, r.expandable);
        let front = self.insert_new(addr, size, stream, sidx, pool, small);
        let blocks = &mut self.blocks[..];
        let f = &mut blocks[front as usize];
        f.expandable = es;
        f.prev = prev;
        f.next = rem;
        if prev != NIL {
            blocks[prev as usize].next = front;
        }
        let r = &mut blocks[rem as usize];
        r.prev = front;
        r.addr += size;
        r.size -= size;
        front
    }

    /// Marks a block gone (its context and stream uses dropped, unlinked); its slot is reused.
    #[inline]
    pub(crate) fn remove(&mut self, id: BlockId) {
        vacate(&mut self.blocks[id as usize]);
        self.free.push(id);
    }

    /// Whether `dst` may absorb `src`: a neighbour that is free and mapped alike.
    #[inline(always)]
    pub(crate) fn mergeable(&self, dst: BlockId, src: BlockId) -> bool {
        if src == NIL {
            return false;
        }
        let blocks = &self.blocks[..];
        let s = &blocks[src as usize];
        s.is_free() && s.mapped == blocks[dst as usize].mapped
    }

    /// `dst` takes over its neighbour `src` (already out of its pool's sets): links, address,
    /// size and the segment's context move to `dst`, and `src` is gone. Returns the bytes
    /// absorbed.
    #[inline(always)]
    pub(crate) fn absorb(&mut self, dst: BlockId, src: BlockId) -> u64 {
        let BlockArena { blocks, free } = self;
        absorb_neighbour(blocks, free, dst, src)
    }

    /// PyTorch's merge step of `free_block`: the freed block `id` absorbs its free, mapped-alike
    /// neighbours (the one before, then the one after). The caller updates the free set from
    /// the keys returned (the absorbed neighbours' entries go) and the grown block.
    #[inline(always)]
    pub(crate) fn merge_free_neighbours(&mut self, id: BlockId) -> Merged {
        let BlockArena { blocks, free } = self;
        // One slice for the whole merge: its pointer and length stay in registers.
        let blocks = &mut blocks[..];
        let mut out = Merged {
            absorbed: [None, None],
            blocks: 0,
            bytes: 0,
            split: false,
        };
        let (prev, next, mapped) = {
            let b = &blocks[id as usize];
            (b.prev, b.next, b.mapped)
        };
        for (slot, src) in [prev, next].into_iter().enumerate() {
            if src == NIL {
                continue;
            }
            let s = &mut blocks[src as usize];
            if !s.is_free() || s.mapped != mapped {
                continue;
            }
            out.absorbed[slot] = Some(size_key(s.sidx, s.size, s.addr));
            out.bytes += absorb_neighbour(blocks, free, id, src);
            out.blocks += 1;
        }
        out.split = blocks[id as usize].is_split();
        out
    }

    /// Every live block with its id.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> {
        self.blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.live)
            .map(|(i, b)| (i as BlockId, b))
    }
}

impl std::ops::Index<BlockId> for BlockArena {
    type Output = Block;
    #[inline]
    fn index(&self, id: BlockId) -> &Block {
        &self.blocks[id as usize]
    }
}

impl std::ops::IndexMut<BlockId> for BlockArena {
    #[inline]
    fn index_mut(&mut self, id: BlockId) -> &mut Block {
        &mut self.blocks[id as usize]
    }
}
