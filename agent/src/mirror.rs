//! [`DeviceMirror`]: a live copy of one device's segments and blocks, rebuilt from events, and
//! the `DeviceStats` PyTorch's rules derive from it.
//!
//! The caching allocator publishes one event per trace entry, so replaying them against a model
//! of its segments reproduces its bookkeeping (PyTorch's `DeviceStats`, as `allocview_alloc::caching` keeps them):
//!
//! - `segment_alloc` adds a segment made of one free block (`segment`, `reserved_bytes`,
//!   `num_device_alloc`, `oversize_segments` up); `segment_free` removes it.
//! - `alloc` carves the block out of the free block that contains it (the allocator takes the
//!   front; a remainder stays free) and counts `allocation`, `allocated_bytes`, `active`,
//!   `active_bytes`, `requested_bytes` and, when flagged oversize, `oversize_allocations`.
//! - `free_requested` marks the block pending (`allocation`, `allocated_bytes`,
//!   `oversize_allocations` down); `free_completed` marks it free, merges it with free neighbours
//!   and drops `active`, `active_bytes` and `requested_bytes`. `free` (both at once, the usual
//!   free) applies the two in turn.
//! - `inactive_split` / `inactive_split_bytes` change by the net change of free blocks inside
//!   split segments, computed on the blocks an event touches. That reproduces PyTorch's three
//!   split cases (splitting an unsplit block: +1 and the remainder; splitting a split block: minus
//!   the allocated size; taking a whole split block: -1 and its size) and its merge rule, and is
//!   skipped for expandable segments as PyTorch skips it.
//! - Expandable segments: `segment_map` grows (or creates, or joins) the mirror segment with a
//!   free block and merges it with a free neighbour; `segment_unmap` cuts the range out of a free
//!   block, splitting the segment in two when the range sits in the middle. Both count
//!   `reserved_bytes` and `num_device_alloc` / `num_device_free`, not `segment`.
//! - `oom`, `alloc_retry`, `sync_all_streams` count their scalars; `reset_peaks` and
//!   `reset_accumulated` reset as `torch.cuda.reset_*_memory_stats` do.
//!
//! An event that does not fit the mirror (a free of an unknown block, an alloc over allocated
//! memory) is refused with a [`MirrorError`] and leaves the mirror untouched: it means events
//! were lost, and the aggregator resynchronises from the allocator's own snapshot
//! ([`DeviceMirror::resync`]).
//!
//! Data structure: as in PyTorch's allocator, blocks are a doubly linked list per segment. Blocks
//! and segments live in slabs (vectors whose freed slots are reused) and link to each other by
//! index: a block names its neighbours and its segment by slot, so following a link is an array
//! access. One hash map from address to block slot serves the lookup each event starts with (an
//! `alloc` takes the front of the free block starting at its address, a free finds its block);
//! neighbours to merge with, the segment's figures and the successor's back link are then
//! reached by index, and only blocks created or merged away touch the map. An ordered map of
//! segment starts serves the rare range questions (overlaps, expandable segments growing into a
//! neighbour) and the sorted output.

use std::collections::BTreeMap;

use allocview_alloc::caching::stats::{DeviceStats, Stat, StatArray, StatType};
use allocview_alloc::event::{
    Event, EventAction, EventPool, FLAG_EXPANDABLE, FLAG_OVERSIZE, FLAG_PRIVATE_POOL,
};
use allocview_alloc::snapshot::{
    BlockInfo, BlockState, Frames, SegmentInfo, SegmentType, Snapshot, no_frames, segment_sums,
};

use crate::addr_map::AddrMap;
use crate::state::{PoolKey, PoolUsage, StreamUsage};

/// An event the mirror cannot apply: evidence that events were lost.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MirrorError {
    /// No segment of the mirror contains the address.
    #[error("{action} at {addr:#x}: no segment contains this address")]
    UnknownSegment {
        /// The event's action.
        action: &'static str,
        /// The event's address.
        addr: u64,
    },
    /// The block is not where the event says, or not in the state it needs.
    #[error("{action} at {addr:#x} ({size} bytes): no matching {wanted} block")]
    NoSuchBlock {
        /// The event's action.
        action: &'static str,
        /// The event's address.
        addr: u64,
        /// The event's size.
        size: u64,
        /// The state the block should have been in.
        wanted: &'static str,
    },
    /// A new segment overlaps one the mirror already has.
    #[error("{action} at {addr:#x} ({size} bytes) overlaps an existing segment")]
    Overlap {
        /// The event's action.
        action: &'static str,
        /// The event's address.
        addr: u64,
        /// The event's size.
        size: u64,
    },
}

/// "No block": the end of a segment's block list.
const NIL: u32 = u32::MAX;

/// A vector whose freed slots are reused: blocks and segments live in slabs and refer to each
/// other by index, so following a link is an array access rather than a hash lookup.
#[derive(Debug, Clone)]
struct Slab<T> {
    items: Vec<T>,
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Stores `v` in a free slot (or a new one) and returns its index.
    #[inline]
    fn insert(&mut self, v: T) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.items[i as usize] = v;
                i
            }
            None => {
                self.items.push(v);
                (self.items.len() - 1) as u32
            }
        }
    }

    /// Frees slot `i` for reuse (its content is stale from now on).
    #[inline]
    fn release(&mut self, i: u32) {
        self.free.push(i);
    }
}

impl<T> std::ops::Index<u32> for Slab<T> {
    type Output = T;

    #[inline]
    fn index(&self, i: u32) -> &T {
        &self.items[i as usize]
    }
}

impl<T> std::ops::IndexMut<u32> for Slab<T> {
    #[inline]
    fn index_mut(&mut self, i: u32) -> &mut T {
        &mut self.items[i as usize]
    }
}

/// One block of the mirror, linked to its neighbours in the segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MBlock {
    addr: u64,
    size: u64,
    requested: u64,
    /// When it was allocated (0: unknown, e.g. taken over from a snapshot).
    alloc_ns: u64,
    /// Index of the segment the block belongs to.
    seg: u32,
    /// Indices of the neighbouring blocks in the segment ([`NIL`] at either end).
    prev: u32,
    next: u32,
    state: BlockState,
    oversize: bool,
}

impl MBlock {
    fn free(addr: u64, seg: u32, size: u64, prev: u32, next: u32) -> MBlock {
        MBlock {
            addr,
            seg,
            size,
            requested: size,
            alloc_ns: 0,
            prev,
            next,
            state: BlockState::Inactive,
            oversize: false,
        }
    }
}

/// One segment of the mirror; its first block starts at its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MSegment {
    addr: u64,
    size: u64,
    stream: u64,
    /// Index of `stream` in the mirror's stream list.
    stream_ix: u32,
    pool: PoolKey,
    small: bool,
    expandable: bool,
    oversize: bool,
    blocks: u32,
}

/// Per-stream counters (signed so that an inconsistent event can never wrap).
#[derive(Debug, Clone, Copy, Default)]
struct StreamAcc {
    allocated: i64,
    active: i64,
    reserved: i64,
    peak_allocated: i64,
    allocs: u64,
    last_event_ns: u64,
}

/// What applying an event learned that the aggregator records elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Applied {
    /// For `free_completed` and `free`: how long the block lived (when its allocation time is
    /// known).
    pub lifetime_ns: Option<u64>,
    /// The pool of the block or segment.
    pub pool: Option<PoolKey>,
    /// Whether the segment and block layout changed (the segment map must be redrawn).
    pub layout_changed: bool,
}

/// The mirror of one device: segments, blocks, stats and per-stream usage.
#[derive(Debug, Clone)]
pub struct DeviceMirror {
    device: i32,
    /// Blocks by index; `block_at` finds one by address.
    blocks: Slab<MBlock>,
    block_at: AddrMap<u32>,
    /// Segments by index; `seg_at` finds one by start address, in address order.
    segs: Slab<MSegment>,
    seg_at: BTreeMap<u64, u32>,
    stats: DeviceStats,
    /// Few streams: a vector beats a map. In order of first use (segments hold indices into
    /// it); [`streams`](Self::streams) sorts.
    streams: Vec<(u64, StreamAcc)>,
    max_split_size: Option<u64>,
    version: u64,
    frames: Frames,
}

/// The pool key an event names.
pub fn pool_key(e: &Event) -> PoolKey {
    if e.flags & FLAG_PRIVATE_POOL != 0 {
        PoolKey::Private(e.pool_id)
    } else if e.pool == EventPool::Small {
        PoolKey::Small
    } else {
        PoolKey::Large
    }
}

/// The pool key of a snapshot segment: a private pool when its id is not `(0, 0)`, named by
/// the first half as events carry it.
pub fn segment_pool_key(seg: &SegmentInfo) -> PoolKey {
    match seg.segment_pool_id {
        (0, 0) => match seg.segment_type {
            SegmentType::Small => PoolKey::Small,
            SegmentType::Large => PoolKey::Large,
        },
        (id, _) => PoolKey::Private(id),
    }
}

/// `StatArray::update_pool(small, n)` for an `n` the caller knows the sign of: PyTorch's
/// `update_stat` on `all` and the pool without testing the sign (the hot path updates a
/// handful of arrays per event). A negative `n` (a size past `i64::MAX`) takes the general
/// path, so the result is always the same.
#[inline(always)]
fn grow(a: &mut StatArray, small: bool, n: i64) {
    if n < 0 {
        a.update_pool(small, n);
        return;
    }
    let up = |s: &mut Stat| {
        s.current += n;
        s.peak = s.peak.max(s.current);
        s.allocated += n;
    };
    up(&mut a.0[StatType::All as usize]);
    up(&mut a.0[StatType::for_pool(small) as usize]);
}

/// `StatArray::update_pool(small, -n)` for `n >= 0`, without testing the sign (see [`grow`]).
#[inline(always)]
fn shrink(a: &mut StatArray, small: bool, n: i64) {
    if n < 0 {
        a.update_pool(small, -n);
        return;
    }
    let down = |s: &mut Stat| {
        s.current -= n;
        s.peak = s.peak.max(s.current);
        s.freed += n;
    };
    down(&mut a.0[StatType::All as usize]);
    down(&mut a.0[StatType::for_pool(small) as usize]);
}

fn applied(pool: PoolKey) -> Applied {
    Applied {
        pool: Some(pool),
        layout_changed: true,
        ..Applied::default()
    }
}

impl DeviceMirror {
    /// An empty mirror of `device` (`max_split_size` in bytes, `None` = unlimited).
    pub fn new(device: i32, max_split_size: Option<u64>) -> DeviceMirror {
        DeviceMirror {
            device,
            blocks: Slab::default(),
            block_at: AddrMap::default(),
            segs: Slab::default(),
            seg_at: BTreeMap::new(),
            stats: DeviceStats {
                max_split_size: max_split_size.map_or(-1, |m| m as i64),
                ..DeviceStats::default()
            },
            streams: Vec::new(),
            max_split_size,
            version: 0,
            frames: no_frames(),
        }
    }

    /// The device.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// The stats recomputed so far.
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// A counter that changes whenever the segment and block layout does.
    pub fn version(&self) -> u64 {
        self.version
    }

    fn oversize(&self, e: &Event) -> bool {
        e.flags & FLAG_OVERSIZE != 0 || self.max_split_size.is_some_and(|m| e.size >= m)
    }

    /// The index of `stream` in `streams`, added when new. Entries are never removed, so a
    /// segment keeps its stream's index for the hot path.
    fn stream_index(&mut self, stream: u64) -> u32 {
        match self.streams.iter().position(|(s, _)| *s == stream) {
            Some(i) => i as u32,
            None => {
                self.streams.push((stream, StreamAcc::default()));
                (self.streams.len() - 1) as u32
            }
        }
    }

    /// The counters of the stream at index `ix`, seen at `time_ns`.
    #[inline]
    fn stream_at(&mut self, ix: u32, time_ns: u64) -> &mut StreamAcc {
        let s = &mut self.streams[ix as usize].1;
        s.last_event_ns = s.last_event_ns.max(time_ns);
        s
    }

    /// Applies one event. On error the mirror is unchanged.
    #[inline]
    pub fn apply(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let applied = match e.action {
            EventAction::Alloc => self.alloc(e)?,
            EventAction::FreeRequested => self.free_requested(e)?,
            EventAction::FreeCompleted => self.free_completed(e)?,
            // The request, then the completion, on the one block found allocated: once the
            // request applied, the block is pending free at this address with this size, so
            // the completion needs no second lookup and cannot fail; on error the mirror is
            // unchanged.
            EventAction::Free => {
                let bi = self.block_in_state(e, BlockState::ActiveAllocated)?;
                self.request_free(bi, e);
                self.complete_free(bi, e)
            }
            EventAction::SegmentAlloc if e.flags & FLAG_EXPANDABLE != 0 => self.map(e)?,
            EventAction::SegmentAlloc => self.segment_alloc(e)?,
            EventAction::SegmentFree if e.flags & FLAG_EXPANDABLE != 0 => self.unmap(e)?,
            EventAction::SegmentFree => self.segment_free(e)?,
            EventAction::SegmentMap => self.map(e)?,
            EventAction::SegmentUnmap => self.unmap(e)?,
            EventAction::Oom => {
                self.stats.num_ooms += 1;
                Applied::default()
            }
            EventAction::AllocRetry => {
                self.stats.num_alloc_retries += 1;
                Applied::default()
            }
            EventAction::SyncAllStreams => {
                self.stats.num_sync_all_streams += 1;
                Applied::default()
            }
            EventAction::ResetPeaks => {
                self.reset_peaks();
                Applied::default()
            }
            EventAction::ResetAccumulated => {
                self.stats.reset_accumulated();
                Applied::default()
            }
            EventAction::Snapshot | EventAction::UserDefined => Applied::default(),
        };
        if applied.layout_changed {
            self.version += 1;
        }
        Ok(applied)
    }

    /// `peak = current` for the stats and every stream.
    pub fn reset_peaks(&mut self) {
        self.stats.reset_peak();
        for (_, s) in &mut self.streams {
            s.peak_allocated = s.allocated;
        }
    }

    /// The index of the segment containing `addr`.
    fn segment_at(&self, addr: u64) -> Option<u32> {
        let (&a, &si) = self.seg_at.range(..=addr).next_back()?;
        (addr < a + self.segs[si].size).then_some(si)
    }

    fn overlaps(&self, addr: u64, size: u64) -> bool {
        let end = addr.saturating_add(size);
        self.seg_at
            .range(..end)
            .next_back()
            .is_some_and(|(&a, &si)| a + self.segs[si].size > addr)
    }

    /// Refuses a new segment or mapped range (`e`) that is empty or overlaps a segment the
    /// mirror already has.
    fn check_new_range(&self, e: &Event) -> Result<(), MirrorError> {
        if e.size == 0 || self.overlaps(e.addr, e.size) {
            return Err(MirrorError::Overlap {
                action: e.action.as_str(),
                addr: e.addr,
                size: e.size,
            });
        }
        Ok(())
    }

    /// The index of the first block of segment `si`.
    fn first_block(&self, si: u32) -> u32 {
        self.block_at
            .get(&self.segs[si].addr)
            .copied()
            .unwrap_or(NIL)
    }

    /// The block containing `addr`: by exact address (the hot path), else by walking its
    /// segment.
    fn block_containing(&self, addr: u64) -> Option<u32> {
        if let Some(&i) = self.block_at.get(&addr) {
            return Some(i);
        }
        let mut at = self.first_block(self.segment_at(addr)?);
        while at != NIL {
            let b = &self.blocks[at];
            if addr < b.addr + b.size {
                return Some(at);
            }
            at = b.next;
        }
        None
    }

    /// The indices of the blocks from `first` on, following the links.
    fn chain_from(&self, first: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = first;
        while at != NIL {
            out.push(at);
            at = self.blocks[at].next;
        }
        out
    }

    /// The indices of a segment's blocks, in order.
    fn chain(&self, si: u32) -> Vec<u32> {
        self.chain_from(self.first_block(si))
    }

    /// Links `next.prev` to `to` when `next` is a block.
    #[inline]
    fn set_prev(&mut self, next: u32, to: u32) {
        if next != NIL {
            self.blocks[next].prev = to;
        }
    }

    /// Links `prev.next` to `to` when `prev` is a block.
    #[inline]
    fn set_next(&mut self, prev: u32, to: u32) {
        if prev != NIL {
            self.blocks[prev].next = to;
        }
    }

    /// A new block, findable by its address.
    fn add_block(&mut self, b: MBlock) -> u32 {
        let addr = b.addr;
        let i = self.blocks.insert(b);
        self.block_at.insert(addr, i);
        i
    }

    /// Forgets block `i` (its address and its slot).
    fn remove_block(&mut self, i: u32) {
        self.block_at.remove(&self.blocks[i].addr);
        self.blocks.release(i);
    }

    /// A new segment, findable by its start address.
    fn add_segment(&mut self, s: MSegment) -> u32 {
        let addr = s.addr;
        let i = self.segs.insert(s);
        self.seg_at.insert(addr, i);
        i
    }

    /// Forgets segment `i` (its start address and its slot).
    fn remove_segment(&mut self, i: u32) {
        self.seg_at.remove(&self.segs[i].addr);
        self.segs.release(i);
    }

    /// Free blocks of a split, non-expandable segment count as inactive split.
    #[inline]
    fn split_contribution(seg: &MSegment, free: &[Option<u64>]) -> (i64, i64) {
        if seg.expandable || seg.blocks <= 1 {
            return (0, 0);
        }
        free.iter()
            .flatten()
            .fold((0, 0), |(n, bytes), &size| (n + 1, bytes + size as i64))
    }

    #[inline]
    fn apply_split_delta(&mut self, small: bool, before: (i64, i64), after: (i64, i64)) {
        let (dn, db) = (after.0 - before.0, after.1 - before.1);
        if dn != 0 {
            self.stats.inactive_split.update_pool(small, dn);
        }
        if db != 0 {
            self.stats.inactive_split_bytes.update_pool(small, db);
        }
    }

    fn segment_alloc(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        self.check_new_range(e)?;
        let small = e.pool == EventPool::Small;
        let oversize = self.oversize(e);
        let pool = pool_key(e);
        let stream_ix = self.stream_index(e.stream);
        let si = self.add_segment(MSegment {
            addr: e.addr,
            size: e.size,
            stream: e.stream,
            stream_ix,
            pool,
            small,
            expandable: false,
            oversize,
            blocks: 1,
        });
        self.add_block(MBlock::free(e.addr, si, e.size, NIL, NIL));
        self.stats.segment.update_pool(small, 1);
        self.stats.reserved_bytes.update_pool(small, e.size as i64);
        self.stats.num_device_alloc += 1;
        if oversize {
            self.stats.oversize_segments.update(1);
        }
        self.stream_at(stream_ix, e.time_ns).reserved += e.size as i64;
        Ok(applied(pool))
    }

    fn segment_free(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let found = self.seg_at.get(&e.addr).copied().and_then(|si| {
            let s = &self.segs[si];
            let bi = *self.block_at.get(&e.addr)?;
            let b = &self.blocks[bi];
            (s.size == e.size
                && !s.expandable
                && s.blocks == 1
                && b.state == BlockState::Inactive
                && b.size == e.size)
                .then_some((si, bi))
        });
        let Some((si, bi)) = found else {
            return Err(MirrorError::NoSuchBlock {
                action: e.action.as_str(),
                addr: e.addr,
                size: e.size,
                wanted: "whole free segment",
            });
        };
        let seg = self.segs[si];
        self.remove_segment(si);
        self.remove_block(bi);
        self.stats.segment.update_pool(seg.small, -1);
        self.stats
            .reserved_bytes
            .update_pool(seg.small, -(seg.size as i64));
        self.stats.num_device_free += 1;
        if seg.oversize {
            self.stats.oversize_segments.update(-1);
        }
        self.stream_at(seg.stream_ix, e.time_ns).reserved -= seg.size as i64;
        Ok(applied(seg.pool))
    }

    fn alloc(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let end = e.addr + e.size;
        // The allocator hands out the front of a free block, so the block usually starts at
        // the event's address: then one lookup finds it.
        let bi = match self.block_at.get(&e.addr) {
            Some(&i) => i,
            None => self
                .block_containing(e.addr)
                .ok_or(MirrorError::UnknownSegment {
                    action: e.action.as_str(),
                    addr: e.addr,
                })?,
        };
        let b = self.blocks[bi];
        if b.state != BlockState::Inactive || e.size == 0 || b.addr + b.size < end {
            return Err(MirrorError::NoSuchBlock {
                action: e.action.as_str(),
                addr: e.addr,
                size: e.size,
                wanted: "free",
            });
        }
        let oversize = self.oversize(e);
        let front = e.addr - b.addr;
        let back = b.addr + b.size - end;
        let sm = &mut self.segs[b.seg];
        let before = Self::split_contribution(sm, &[Some(b.size)]);
        sm.blocks += u32::from(front > 0) + u32::from(back > 0);
        let after = Self::split_contribution(
            sm,
            &[(front > 0).then_some(front), (back > 0).then_some(back)],
        );
        let (small, stream, pool) = (sm.small, sm.stream_ix, sm.pool);
        let mut taken = MBlock {
            addr: e.addr,
            seg: b.seg,
            size: e.size,
            requested: e.requested,
            alloc_ns: e.time_ns,
            prev: b.prev,
            next: b.next,
            state: BlockState::ActiveAllocated,
            oversize,
        };
        // The taken block keeps the free block's slot unless a front remainder stays there.
        let ti = if front > 0 {
            taken.prev = bi;
            let ti = self.add_block(taken);
            let fb = &mut self.blocks[bi];
            fb.size = front;
            fb.next = ti;
            ti
        } else {
            self.blocks[bi] = taken;
            bi
        };
        if back > 0 {
            let ri = self.add_block(MBlock::free(end, b.seg, back, ti, b.next));
            self.blocks[ti].next = ri;
            self.set_prev(b.next, ri);
        } else if front > 0 {
            // The old block's successor now follows the taken block.
            self.set_prev(b.next, ti);
        }
        self.apply_split_delta(small, before, after);
        let st = &mut self.stats;
        grow(&mut st.allocation, small, 1);
        grow(&mut st.allocated_bytes, small, e.size as i64);
        grow(&mut st.active, small, 1);
        grow(&mut st.active_bytes, small, e.size as i64);
        grow(&mut st.requested_bytes, small, e.requested as i64);
        if oversize {
            st.oversize_allocations.update(1);
        }
        let s = self.stream_at(stream, e.time_ns);
        s.allocated += e.size as i64;
        s.active += e.size as i64;
        s.peak_allocated = s.peak_allocated.max(s.allocated);
        s.allocs += 1;
        Ok(applied(pool))
    }

    fn no_block_in_state(&self, e: &Event, state: BlockState, found: bool) -> MirrorError {
        if found || self.segment_at(e.addr).is_some() {
            MirrorError::NoSuchBlock {
                action: e.action.as_str(),
                addr: e.addr,
                size: e.size,
                wanted: state.as_str(),
            }
        } else {
            MirrorError::UnknownSegment {
                action: e.action.as_str(),
                addr: e.addr,
            }
        }
    }

    /// The block at `e.addr` when it is in state `wanted` and of the event's size (0: any).
    #[inline]
    fn block_in_state(&self, e: &Event, wanted: BlockState) -> Result<u32, MirrorError> {
        match self.block_at.get(&e.addr) {
            Some(&i) => {
                let b = &self.blocks[i];
                if b.state == wanted && (e.size == 0 || b.size == e.size) {
                    Ok(i)
                } else {
                    Err(self.no_block_in_state(e, wanted, true))
                }
            }
            None => Err(self.no_block_in_state(e, wanted, false)),
        }
    }

    fn free_requested(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let bi = self.block_in_state(e, BlockState::ActiveAllocated)?;
        Ok(applied(self.request_free(bi, e)))
    }

    /// Marks the allocated block `bi` pending free (`free_requested`); returns its pool.
    #[inline]
    fn request_free(&mut self, bi: u32, e: &Event) -> PoolKey {
        let b = &mut self.blocks[bi];
        b.state = BlockState::ActivePendingFree;
        let (size, oversize) = (b.size as i64, b.oversize);
        let seg = &self.segs[b.seg];
        let (small, stream, pool) = (seg.small, seg.stream_ix, seg.pool);
        shrink(&mut self.stats.allocation, small, 1);
        shrink(&mut self.stats.allocated_bytes, small, size);
        if oversize {
            self.stats.oversize_allocations.update(-1);
        }
        self.stream_at(stream, e.time_ns).allocated -= size;
        pool
    }

    fn free_completed(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let bi = self.block_in_state(e, BlockState::ActivePendingFree)?;
        Ok(self.complete_free(bi, e))
    }

    /// Frees the pending block `bi` (`free_completed`): merges it with its free neighbours.
    #[inline]
    fn complete_free(&mut self, bi: u32, e: &Event) -> Applied {
        let b = self.blocks[bi];
        let (prev, next) = self.free_neighbours(&b);
        let (prev_size, next_size) = (prev.map(|p| p.size), next.map(|n| n.size));
        let sm = &mut self.segs[b.seg];
        let before = Self::split_contribution(sm, &[prev_size, next_size]);
        sm.blocks -= u32::from(prev.is_some()) + u32::from(next.is_some());
        let merged_size = b.size + prev_size.unwrap_or(0) + next_size.unwrap_or(0);
        let after = Self::split_contribution(sm, &[Some(merged_size)]);
        let (small, stream, pool) = (sm.small, sm.stream_ix, sm.pool);
        self.merge_free(bi, &b, b.requested, prev, next);
        self.apply_split_delta(small, before, after);
        shrink(&mut self.stats.active, small, 1);
        shrink(&mut self.stats.active_bytes, small, b.size as i64);
        shrink(&mut self.stats.requested_bytes, small, b.requested as i64);
        self.stream_at(stream, e.time_ns).active -= b.size as i64;
        let lifetime_ns =
            (b.alloc_ns != 0 && e.time_ns >= b.alloc_ns).then(|| e.time_ns - b.alloc_ns);
        Applied {
            lifetime_ns,
            ..applied(pool)
        }
    }

    /// The neighbours of block `b` that are free (`None` at a segment's end or beside a block
    /// in use).
    #[inline(always)]
    fn free_neighbours(&self, b: &MBlock) -> (Option<MBlock>, Option<MBlock>) {
        let free_at = |i: u32| {
            (i != NIL && self.blocks[i].state == BlockState::Inactive).then(|| self.blocks[i])
        };
        (free_at(b.prev), free_at(b.next))
    }

    /// Makes block `bi` (`b`) one free block, carrying `requested`, with its free neighbours
    /// `prev` and `next` (as [`free_neighbours`](Self::free_neighbours) found them); the
    /// caller takes the merged neighbours off its segment's block count. The merged block keeps
    /// the first address and that block's slot: `merged.prev` already links to it, so only the
    /// block after it may need its link moved.
    #[inline(always)]
    fn merge_free(
        &mut self,
        bi: u32,
        b: &MBlock,
        requested: u64,
        prev: Option<MBlock>,
        next: Option<MBlock>,
    ) {
        let mut merged = MBlock {
            requested,
            ..MBlock::free(b.addr, b.seg, b.size, b.prev, b.next)
        };
        let mut keep = bi;
        if let Some(p) = prev {
            merged.addr = p.addr;
            merged.size += p.size;
            merged.prev = p.prev;
            keep = b.prev;
        }
        if let Some(n) = next {
            merged.size += n.size;
            merged.next = n.next;
        }
        if next.is_some() {
            self.remove_block(b.next);
        }
        if keep != bi {
            self.remove_block(bi);
        }
        self.blocks[keep] = merged;
        if keep != bi || next.is_some() {
            self.set_prev(merged.next, keep);
        }
    }

    /// Merges the free block `bi` with free linked neighbours (expandable segments).
    fn merge_free_around(&mut self, bi: u32) {
        let b = self.blocks[bi];
        if b.state != BlockState::Inactive {
            return;
        }
        let (prev, next) = self.free_neighbours(&b);
        self.segs[b.seg].blocks -= u32::from(prev.is_some()) + u32::from(next.is_some());
        // `requested` stays the block's own size (as `MBlock::free` set it), not the merged size.
        self.merge_free(bi, &b, b.size, prev, next);
    }

    fn map(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        self.check_new_range(e)?;
        let pool = pool_key(e);
        let small = e.pool == EventPool::Small;
        let joins = |s: &MSegment| s.expandable && s.stream == e.stream && s.pool == pool;
        let end = e.addr + e.size;
        let prev_seg = self
            .seg_at
            .range(..e.addr)
            .next_back()
            .map(|(_, &si)| si)
            .filter(|&si| {
                let s = &self.segs[si];
                s.addr + s.size == e.addr && joins(s)
            });
        let next_seg = self
            .seg_at
            .get(&end)
            .copied()
            .filter(|&si| joins(&self.segs[si]));
        let prev_block = prev_seg.and_then(|p| self.chain(p).last().copied());
        let next_first = next_seg.map_or(NIL, |n| self.first_block(n));
        let stream_ix = self.stream_index(e.stream);
        let si = match prev_seg {
            Some(p) => p,
            None => self.add_segment(MSegment {
                addr: e.addr,
                size: 0,
                stream: e.stream,
                stream_ix,
                pool,
                small,
                expandable: true,
                oversize: false,
                blocks: 0,
            }),
        };
        let nb = self.add_block(MBlock::free(
            e.addr,
            si,
            e.size,
            prev_block.unwrap_or(NIL),
            next_first,
        ));
        self.set_next(prev_block.unwrap_or(NIL), nb);
        self.set_prev(next_first, nb);
        self.segs[si].size += e.size;
        self.segs[si].blocks += 1;
        if let Some(n) = next_seg {
            let ns = self.segs[n];
            self.remove_segment(n);
            for a in self.chain_from(next_first) {
                self.blocks[a].seg = si;
            }
            self.segs[si].size += ns.size;
            self.segs[si].blocks += ns.blocks;
        }
        // A freshly mapped block merges with the free blocks beside it, as in PyTorch.
        self.merge_free_around(nb);
        self.stats.reserved_bytes.update_pool(small, e.size as i64);
        self.stats.num_device_alloc += 1;
        self.stream_at(stream_ix, e.time_ns).reserved += e.size as i64;
        Ok(applied(pool))
    }

    fn unmap(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let not_found = || MirrorError::NoSuchBlock {
            action: e.action.as_str(),
            addr: e.addr,
            size: e.size,
            wanted: "free mapped",
        };
        let bi = self
            .block_containing(e.addr)
            .ok_or(MirrorError::UnknownSegment {
                action: e.action.as_str(),
                addr: e.addr,
            })?;
        let b = self.blocks[bi];
        let seg = self.segs[b.seg];
        let end = e.addr + e.size;
        if !seg.expandable
            || b.state != BlockState::Inactive
            || e.size == 0
            || b.addr + b.size < end
        {
            return Err(not_found());
        }
        let seg_end = seg.addr + seg.size;
        // The part before the cut keeps the segment's start (and its slot); the part after
        // starts a new one.
        let head_last = if e.addr > b.addr {
            self.blocks[bi] = MBlock::free(b.addr, b.seg, e.addr - b.addr, b.prev, NIL);
            bi
        } else {
            self.remove_block(bi);
            self.set_next(b.prev, NIL);
            b.prev
        };
        let tail_first = if b.addr + b.size > end {
            let ti = self.add_block(MBlock::free(end, b.seg, b.addr + b.size - end, NIL, b.next));
            self.set_prev(b.next, ti);
            ti
        } else {
            self.set_prev(b.next, NIL);
            b.next
        };
        if head_last != NIL {
            let n = self.chain(b.seg).len() as u32;
            let hs = &mut self.segs[b.seg];
            hs.size = e.addr - seg.addr;
            hs.blocks = n;
        } else {
            self.remove_segment(b.seg);
        }
        if tail_first != NIL {
            let chain = self.chain_from(tail_first);
            let t = self.blocks[tail_first].addr;
            let ti = self.add_segment(MSegment {
                addr: t,
                size: seg_end - t,
                blocks: chain.len() as u32,
                ..seg
            });
            for &a in &chain {
                self.blocks[a].seg = ti;
            }
        }
        self.stats
            .reserved_bytes
            .update_pool(seg.small, -(e.size as i64));
        self.stats.num_device_free += 1;
        self.stream_at(seg.stream_ix, e.time_ns).reserved -= e.size as i64;
        Ok(applied(seg.pool))
    }

    /// Replaces the mirror by the allocator's own view: the segments of `snapshot` on this
    /// device and `stats`. Per-stream figures are recomputed from the segments (their peaks
    /// never go down).
    pub fn resync(&mut self, snapshot: &Snapshot, stats: DeviceStats) {
        self.max_split_size = (stats.max_split_size >= 0).then_some(stats.max_split_size as u64);
        let max_split_size = self.max_split_size;
        let oversize = |size: u64| max_split_size.is_some_and(|m| size >= m);
        self.blocks = Slab::default();
        self.block_at = AddrMap::default();
        self.segs = Slab::default();
        self.seg_at = BTreeMap::new();
        self.stats = stats;
        for (_, s) in &mut self.streams {
            s.allocated = 0;
            s.active = 0;
            s.reserved = 0;
        }
        let device = self.device;
        for s in snapshot.segments.iter().filter(|s| s.device == device) {
            let n = s.blocks.len();
            let stream_ix = self.stream_index(s.stream);
            let si = self.add_segment(MSegment {
                addr: s.address,
                size: s.total_size,
                stream: s.stream,
                stream_ix,
                pool: segment_pool_key(s),
                small: s.segment_type == SegmentType::Small,
                expandable: s.is_expandable,
                oversize: !s.is_expandable && oversize(s.total_size),
                blocks: n as u32,
            });
            let (mut allocated, mut active) = (0i64, 0i64);
            let mut prev = NIL;
            for b in &s.blocks {
                let bi = self.add_block(MBlock {
                    addr: b.address,
                    seg: si,
                    size: b.size,
                    requested: b.requested_size,
                    alloc_ns: 0,
                    prev,
                    next: NIL,
                    state: b.state,
                    oversize: b.state == BlockState::ActiveAllocated && oversize(b.size),
                });
                self.set_next(prev, bi);
                prev = bi;
                if b.state == BlockState::ActiveAllocated {
                    allocated += b.size as i64;
                }
                if b.state.is_active() {
                    active += b.size as i64;
                }
            }
            let acc = self.stream_at(stream_ix, 0);
            acc.reserved += s.total_size as i64;
            acc.allocated += allocated;
            acc.active += active;
        }
        for (_, s) in &mut self.streams {
            s.peak_allocated = s.peak_allocated.max(s.allocated);
        }
        self.version += 1;
    }

    /// The mirror as snapshot segments, sorted by address.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.seg_at
            .iter()
            .map(|(&addr, &si)| {
                let s = &self.segs[si];
                let mut info = SegmentInfo {
                    device: self.device,
                    address: addr,
                    total_size: s.size,
                    allocated_size: 0,
                    active_size: 0,
                    requested_size: 0,
                    stream: s.stream,
                    segment_type: if s.small {
                        SegmentType::Small
                    } else {
                        SegmentType::Large
                    },
                    // Events carry the first half of a private pool's id only.
                    segment_pool_id: match s.pool {
                        PoolKey::Private(id) => (id, 0),
                        _ => (0, 0),
                    },
                    is_expandable: s.expandable,
                    frames: self.frames.clone(),
                    blocks: Vec::with_capacity(s.blocks as usize),
                };
                for i in self.chain(si) {
                    let b = &self.blocks[i];
                    info.blocks.push(BlockInfo {
                        address: b.addr,
                        size: b.size,
                        requested_size: b.requested,
                        state: b.state,
                        frames: self.frames.clone(),
                        history: Vec::new(),
                    });
                }
                (info.allocated_size, info.active_size, info.requested_size) =
                    segment_sums(&info.blocks);
                info
            })
            .collect()
    }

    /// The largest free block (0 when there is none).
    pub fn largest_free_block(&self) -> u64 {
        self.block_at
            .values()
            .map(|&i| &self.blocks[i])
            .filter(|b| b.state == BlockState::Inactive)
            .map(|b| b.size)
            .max()
            .unwrap_or(0)
    }

    /// Usage per stream, by stream id.
    pub fn streams(&self) -> Vec<StreamUsage> {
        let pos = |v: i64| v.max(0) as u64;
        let mut out: Vec<StreamUsage> = self
            .streams
            .iter()
            .map(|&(stream, s)| StreamUsage {
                stream,
                allocated: pos(s.allocated),
                active: pos(s.active),
                reserved: pos(s.reserved),
                peak_allocated: pos(s.peak_allocated),
                allocs: s.allocs,
                last_event_ns: s.last_event_ns,
            })
            .collect();
        out.sort_by_key(|u| u.stream);
        out
    }

    /// Usage per pool: small and large always, then private pools by id.
    pub fn pools(&self) -> Vec<PoolUsage> {
        let mut pools: BTreeMap<PoolKey, PoolUsage> = [PoolKey::Small, PoolKey::Large]
            .into_iter()
            .map(|p| (p, PoolUsage::empty(p)))
            .collect();
        for &si in self.seg_at.values() {
            let seg = &self.segs[si];
            let u = pools
                .entry(seg.pool)
                .or_insert_with(|| PoolUsage::empty(seg.pool));
            u.segments += 1;
            u.reserved += seg.size;
            let split = !seg.expandable && seg.blocks > 1;
            for i in self.chain(si) {
                let b = &self.blocks[i];
                u.count_block(b.state, b.size, split, b.oversize);
            }
        }
        pools.into_values().collect()
    }
}

impl PoolUsage {
    /// Counts one block of a pool's segment by PyTorch's rules: an allocated block is allocated
    /// and active (and may be oversize), a pending free is active, a free block competes for the
    /// largest free block and, in a segment split into several blocks (`split`), is an inactive
    /// split block. The dashboard's pool table over snapshot files counts with it too.
    pub fn count_block(&mut self, state: BlockState, size: u64, split: bool, oversize: bool) {
        match state {
            BlockState::ActiveAllocated => {
                self.allocated += size;
                self.active += size;
                self.oversize_allocations += u64::from(oversize);
            }
            BlockState::ActivePendingFree => self.active += size,
            BlockState::Inactive => {
                self.largest_free = self.largest_free.max(size);
                if split {
                    self.inactive_split += 1;
                    self.inactive_split_bytes += size;
                }
            }
        }
    }

    /// A pool with nothing in it.
    pub fn empty(pool: PoolKey) -> PoolUsage {
        PoolUsage {
            pool,
            segments: 0,
            reserved: 0,
            allocated: 0,
            active: 0,
            inactive_split: 0,
            inactive_split_bytes: 0,
            largest_free: 0,
            oversize_allocations: 0,
        }
    }
}

#[cfg(test)]
mod tests;
