//! [`DeviceMirror`]: a live copy of one device's segments and blocks, rebuilt from events, and
//! the `DeviceStats` PyTorch's rules derive from it.
//!
//! The caching allocator publishes one event per trace entry, so replaying them against a model
//! of its segments reproduces its bookkeeping (`docs/caching-allocator-spec.md`, "DeviceStats"):
//!
//! - `segment_alloc` adds a segment made of one free block (`segment`, `reserved_bytes`,
//!   `num_device_alloc`, `oversize_segments` up); `segment_free` removes it.
//! - `alloc` carves the block out of the free block that contains it (the allocator takes the
//!   front; a remainder stays free) and counts `allocation`, `allocated_bytes`, `active`,
//!   `active_bytes`, `requested_bytes` and, when flagged oversize, `oversize_allocations`.
//! - `free_requested` marks the block pending (`allocation`, `allocated_bytes`,
//!   `oversize_allocations` down); `free_completed` marks it free, merges it with free neighbours
//!   and drops `active`, `active_bytes` and `requested_bytes`.
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
//! Data structure: as in PyTorch's allocator, blocks are a doubly linked list per segment
//! (`prev`/`next` addresses) in a hash map keyed by address, so every event of the hot path is
//! a few O(1) lookups (an `alloc` takes the front of the free block starting at its address, a
//! free merges with its linked neighbours). An ordered set of segment starts serves the rare
//! range questions (overlaps, expandable segments growing into a neighbour) and the sorted
//! output.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use allocview_alloc::caching::stats::DeviceStats;
use allocview_alloc::event::{
    Event, EventAction, EventPool, FLAG_EXPANDABLE, FLAG_OVERSIZE, FLAG_PRIVATE_POOL,
};
use allocview_alloc::snapshot::{
    BlockInfo, BlockState, Frames, SegmentInfo, SegmentType, Snapshot, no_frames,
};

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

/// Hashes device addresses (multiples of 512) with one multiply: SipHash is not needed for
/// keys no attacker chooses, and costs more than the rest of an event.
#[derive(Debug, Default, Clone, Copy)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b) ^ self.0.rotate_left(8));
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        let x = (n ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 32);
    }
}

type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

/// One block of the mirror, linked to its neighbours in the segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MBlock {
    /// Start of the segment the block belongs to.
    seg: u64,
    size: u64,
    requested: u64,
    /// When it was allocated (0: unknown, e.g. taken over from a snapshot).
    alloc_ns: u64,
    prev: Option<u64>,
    next: Option<u64>,
    state: BlockState,
    oversize: bool,
}

impl MBlock {
    fn free(seg: u64, size: u64, prev: Option<u64>, next: Option<u64>) -> MBlock {
        MBlock {
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
    /// For `free_completed`: how long the block lived (when its allocation time is known).
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
    blocks: AddrMap<MBlock>,
    segments: AddrMap<MSegment>,
    starts: BTreeSet<u64>,
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
            blocks: AddrMap::default(),
            segments: AddrMap::default(),
            starts: BTreeSet::new(),
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
    pub fn apply(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let applied = match e.action {
            EventAction::Alloc => self.alloc(e)?,
            EventAction::FreeRequested => self.free_requested(e)?,
            EventAction::FreeCompleted => self.free_completed(e)?,
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

    /// The start of the segment containing `addr`.
    fn segment_at(&self, addr: u64) -> Option<u64> {
        let &a = self.starts.range(..=addr).next_back()?;
        (addr < a + self.segments[&a].size).then_some(a)
    }

    fn overlaps(&self, addr: u64, size: u64) -> bool {
        let end = addr.saturating_add(size);
        self.starts
            .range(..end)
            .next_back()
            .is_some_and(|&a| a + self.segments[&a].size > addr)
    }

    /// The block containing `addr`: by exact address (the hot path), else by walking its
    /// segment.
    fn block_containing(&self, addr: u64) -> Option<u64> {
        if self.blocks.contains_key(&addr) {
            return Some(addr);
        }
        let mut at = Some(self.segment_at(addr)?);
        while let Some(a) = at {
            let b = &self.blocks[&a];
            if addr < a + b.size {
                return Some(a);
            }
            at = b.next;
        }
        None
    }

    /// Links `next.prev` to `to` when `next` exists.
    fn set_prev(&mut self, next: Option<u64>, to: u64) {
        Self::link_prev(&mut self.blocks, next, to);
    }

    /// [`set_prev`](Self::set_prev) on the block map alone (while a segment is borrowed).
    #[inline]
    fn link_prev(blocks: &mut AddrMap<MBlock>, next: Option<u64>, to: u64) {
        if let Some(n) = next
            && let Some(nb) = blocks.get_mut(&n)
        {
            nb.prev = Some(to);
        }
    }

    /// Links `prev.next` to `to` when `prev` exists.
    fn set_next(&mut self, prev: Option<u64>, to: u64) {
        if let Some(p) = prev
            && let Some(pb) = self.blocks.get_mut(&p)
        {
            pb.next = Some(to);
        }
    }

    /// Free blocks of a split, non-expandable segment count as inactive split.
    fn split_contribution(seg: &MSegment, free: &[Option<u64>]) -> (i64, i64) {
        if seg.expandable || seg.blocks <= 1 {
            return (0, 0);
        }
        free.iter()
            .flatten()
            .fold((0, 0), |(n, bytes), &size| (n + 1, bytes + size as i64))
    }

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
        if e.size == 0 || self.overlaps(e.addr, e.size) {
            return Err(MirrorError::Overlap {
                action: e.action.as_str(),
                addr: e.addr,
                size: e.size,
            });
        }
        let small = e.pool == EventPool::Small;
        let oversize = self.oversize(e);
        let pool = pool_key(e);
        let stream_ix = self.stream_index(e.stream);
        self.blocks
            .insert(e.addr, MBlock::free(e.addr, e.size, None, None));
        self.segments.insert(
            e.addr,
            MSegment {
                size: e.size,
                stream: e.stream,
                stream_ix,
                pool,
                small,
                expandable: false,
                oversize,
                blocks: 1,
            },
        );
        self.starts.insert(e.addr);
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
        let fits = self
            .segments
            .get(&e.addr)
            .is_some_and(|s| s.size == e.size && !s.expandable && s.blocks == 1)
            && self
                .blocks
                .get(&e.addr)
                .is_some_and(|b| b.state == BlockState::Inactive && b.size == e.size);
        if !fits {
            return Err(MirrorError::NoSuchBlock {
                action: e.action.as_str(),
                addr: e.addr,
                size: e.size,
                wanted: "whole free segment",
            });
        }
        let seg = self.segments.remove(&e.addr).expect("checked above");
        self.blocks.remove(&e.addr);
        self.starts.remove(&e.addr);
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
        let fits = |b_addr: u64, b: &MBlock| {
            if b.state != BlockState::Inactive || e.size == 0 || b_addr + b.size < end {
                return Err(MirrorError::NoSuchBlock {
                    action: e.action.as_str(),
                    addr: e.addr,
                    size: e.size,
                    wanted: "free",
                });
            }
            Ok(())
        };
        let oversize = self.oversize(e);
        let taken = |b_addr: u64, b: &MBlock| MBlock {
            seg: b.seg,
            size: e.size,
            requested: e.requested,
            alloc_ns: e.time_ns,
            prev: if e.addr > b_addr {
                Some(b_addr)
            } else {
                b.prev
            },
            next: if b_addr + b.size > end {
                Some(end)
            } else {
                b.next
            },
            state: BlockState::ActiveAllocated,
            oversize,
        };
        // The allocator hands out the front of a free block, so the block usually starts at
        // the event's address: then one lookup finds it and the taken block replaces it in
        // place (its successor's link is unchanged unless a remainder is cut off below).
        let (b_addr, b) = match self.blocks.get_mut(&e.addr) {
            Some(bm) => {
                let b = *bm;
                fits(e.addr, &b)?;
                *bm = taken(e.addr, &b);
                (e.addr, b)
            }
            None => {
                let a = self
                    .block_containing(e.addr)
                    .ok_or(MirrorError::UnknownSegment {
                        action: e.action.as_str(),
                        addr: e.addr,
                    })?;
                let b = self.blocks[&a];
                fits(a, &b)?;
                (a, b)
            }
        };
        let front = e.addr - b_addr;
        let back = b_addr + b.size - end;
        let sm = self
            .segments
            .get_mut(&b.seg)
            .expect("a block's segment exists");
        let before = Self::split_contribution(sm, &[Some(b.size)]);
        sm.blocks += u32::from(front > 0) + u32::from(back > 0);
        let after = Self::split_contribution(
            sm,
            &[(front > 0).then_some(front), (back > 0).then_some(back)],
        );
        let (small, stream, pool) = (sm.small, sm.stream_ix, sm.pool);
        if front > 0 {
            let fb = self.blocks.get_mut(&b_addr).expect("found above");
            fb.size = front;
            fb.next = Some(e.addr);
            self.blocks.insert(e.addr, taken(b_addr, &b));
            if back == 0 {
                // The old block's successor now follows the taken block.
                Self::link_prev(&mut self.blocks, b.next, e.addr);
            }
        }
        if back > 0 {
            self.blocks
                .insert(end, MBlock::free(b.seg, back, Some(e.addr), b.next));
            Self::link_prev(&mut self.blocks, b.next, end);
        }
        self.apply_split_delta(small, before, after);
        let st = &mut self.stats;
        st.allocation.update_pool(small, 1);
        st.allocated_bytes.update_pool(small, e.size as i64);
        st.active.update_pool(small, 1);
        st.active_bytes.update_pool(small, e.size as i64);
        st.requested_bytes.update_pool(small, e.requested as i64);
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

    fn free_requested(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let wanted = BlockState::ActiveAllocated;
        let b = match self.blocks.get_mut(&e.addr) {
            Some(b) if b.state == wanted && (e.size == 0 || b.size == e.size) => {
                b.state = BlockState::ActivePendingFree;
                *b
            }
            found => {
                let found = found.is_some();
                return Err(self.no_block_in_state(e, wanted, found));
            }
        };
        let seg = &self.segments[&b.seg];
        let (small, stream, pool) = (seg.small, seg.stream_ix, seg.pool);
        let size = b.size as i64;
        self.stats.allocation.update_pool(small, -1);
        self.stats.allocated_bytes.update_pool(small, -size);
        if b.oversize {
            self.stats.oversize_allocations.update(-1);
        }
        self.stream_at(stream, e.time_ns).allocated -= size;
        Ok(applied(pool))
    }

    fn free_completed(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let wanted = BlockState::ActivePendingFree;
        let b = match self.blocks.get(&e.addr) {
            Some(b) if b.state == wanted && (e.size == 0 || b.size == e.size) => *b,
            found => {
                let found = found.is_some();
                return Err(self.no_block_in_state(e, wanted, found));
            }
        };
        let free_at = |a: Option<u64>| {
            a.and_then(|a| self.blocks.get(&a).map(|nb| (a, *nb)))
                .filter(|(_, nb)| nb.state == BlockState::Inactive)
        };
        let prev = free_at(b.prev);
        let next = free_at(b.next);
        let sm = self
            .segments
            .get_mut(&b.seg)
            .expect("a block's segment exists");
        let before =
            Self::split_contribution(sm, &[prev.map(|(_, p)| p.size), next.map(|(_, n)| n.size)]);
        let mut start = e.addr;
        let mut size = b.size;
        let mut new_prev = b.prev;
        let mut new_next = b.next;
        if let Some((pa, pb)) = prev {
            start = pa;
            size += pb.size;
            new_prev = pb.prev;
        }
        if let Some((_, nb)) = next {
            size += nb.size;
            new_next = nb.next;
        }
        sm.blocks -= u32::from(prev.is_some()) + u32::from(next.is_some());
        let after = Self::split_contribution(sm, &[Some(size)]);
        let (small, stream, pool) = (sm.small, sm.stream_ix, sm.pool);
        let merged = MBlock {
            requested: b.requested,
            ..MBlock::free(b.seg, size, new_prev, new_next)
        };
        // The merged block keeps the first address: `new_prev` already links to it (it
        // linked to the previous free block or to the freed one), so only the block after
        // it may need its link moved.
        if let Some((na, _)) = next {
            self.blocks.remove(&na);
        }
        if start != e.addr {
            self.blocks.remove(&e.addr);
        }
        *self.blocks.get_mut(&start).expect("found above") = merged;
        if next.is_some() || start != e.addr {
            Self::link_prev(&mut self.blocks, new_next, start);
        }
        self.apply_split_delta(small, before, after);
        self.stats.active.update_pool(small, -1);
        self.stats.active_bytes.update_pool(small, -(b.size as i64));
        self.stats
            .requested_bytes
            .update_pool(small, -(b.requested as i64));
        self.stream_at(stream, e.time_ns).active -= b.size as i64;
        let lifetime_ns =
            (b.alloc_ns != 0 && e.time_ns >= b.alloc_ns).then(|| e.time_ns - b.alloc_ns);
        Ok(Applied {
            lifetime_ns,
            ..applied(pool)
        })
    }

    /// The addresses of a segment's blocks, in order.
    fn chain(&self, seg: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut at = self.blocks.contains_key(&seg).then_some(seg);
        while let Some(a) = at {
            out.push(a);
            at = self.blocks[&a].next;
        }
        out
    }

    /// Merges the free block at `addr` with free linked neighbours (expandable segments).
    fn merge_free_around(&mut self, addr: u64) {
        let Some(b) = self.blocks.get(&addr).copied() else {
            return;
        };
        if b.state != BlockState::Inactive {
            return;
        }
        let mut start = addr;
        let mut size = b.size;
        let mut prev = b.prev;
        let mut next = b.next;
        let mut merged = 0;
        if let Some(pa) = b.prev
            && let Some(pb) = self.blocks.get(&pa).copied()
            && pb.state == BlockState::Inactive
        {
            self.blocks.remove(&pa);
            start = pa;
            size += pb.size;
            prev = pb.prev;
            merged += 1;
        }
        if let Some(na) = b.next
            && let Some(nb) = self.blocks.get(&na).copied()
            && nb.state == BlockState::Inactive
        {
            self.blocks.remove(&na);
            size += nb.size;
            next = nb.next;
            merged += 1;
        }
        self.blocks.remove(&addr);
        self.blocks
            .insert(start, MBlock::free(b.seg, size, prev, next));
        self.set_next(prev, start);
        self.set_prev(next, start);
        if let Some(s) = self.segments.get_mut(&b.seg) {
            s.blocks -= merged;
        }
    }

    fn map(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        if e.size == 0 || self.overlaps(e.addr, e.size) {
            return Err(MirrorError::Overlap {
                action: e.action.as_str(),
                addr: e.addr,
                size: e.size,
            });
        }
        let pool = pool_key(e);
        let small = e.pool == EventPool::Small;
        let joins = |s: &MSegment| s.expandable && s.stream == e.stream && s.pool == pool;
        let end = e.addr + e.size;
        let prev_seg = self
            .starts
            .range(..e.addr)
            .next_back()
            .copied()
            .filter(|a| {
                let s = &self.segments[a];
                a + s.size == e.addr && joins(s)
            });
        let next_seg = self.segments.get(&end).filter(|s| joins(s)).map(|_| end);
        let seg_start = prev_seg.unwrap_or(e.addr);
        let prev_block = prev_seg.and_then(|p| self.chain(p).last().copied());
        self.blocks.insert(
            e.addr,
            MBlock::free(seg_start, e.size, prev_block, next_seg),
        );
        self.set_next(prev_block, e.addr);
        self.set_prev(next_seg, e.addr);
        let stream_ix = self.stream_index(e.stream);
        let mut seg = match prev_seg {
            Some(p) => self.segments[&p],
            None => MSegment {
                size: 0,
                stream: e.stream,
                stream_ix,
                pool,
                small,
                expandable: true,
                oversize: false,
                blocks: 0,
            },
        };
        seg.size += e.size;
        seg.blocks += 1;
        if let Some(n) = next_seg {
            let ns = self.segments.remove(&n).expect("found above");
            self.starts.remove(&n);
            for a in self.chain(n) {
                self.blocks.get_mut(&a).expect("chained").seg = seg_start;
            }
            seg.size += ns.size;
            seg.blocks += ns.blocks;
        }
        self.segments.insert(seg_start, seg);
        self.starts.insert(seg_start);
        // A freshly mapped block merges with the free blocks beside it, as in PyTorch.
        self.merge_free_around(e.addr);
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
        let b_addr = self
            .block_containing(e.addr)
            .ok_or(MirrorError::UnknownSegment {
                action: e.action.as_str(),
                addr: e.addr,
            })?;
        let b = self.blocks[&b_addr];
        let seg = self.segments[&b.seg];
        let end = e.addr + e.size;
        if !seg.expandable
            || b.state != BlockState::Inactive
            || e.size == 0
            || b_addr + b.size < end
        {
            return Err(not_found());
        }
        let seg_start = b.seg;
        let seg_end = seg_start + seg.size;
        self.blocks.remove(&b_addr);
        // The part before the cut keeps the segment's start; the part after starts a new one.
        let head_last = if e.addr > b_addr {
            self.blocks.insert(
                b_addr,
                MBlock::free(seg_start, e.addr - b_addr, b.prev, None),
            );
            self.set_next(b.prev, b_addr);
            Some(b_addr)
        } else {
            if let Some(p) = b.prev {
                self.blocks.get_mut(&p).expect("linked").next = None;
            }
            b.prev
        };
        let tail_first = if b_addr + b.size > end {
            self.blocks
                .insert(end, MBlock::free(end, b_addr + b.size - end, None, b.next));
            self.set_prev(b.next, end);
            Some(end)
        } else {
            if let Some(n) = b.next {
                self.blocks.get_mut(&n).expect("linked").prev = None;
            }
            b.next
        };
        self.segments.remove(&seg_start);
        self.starts.remove(&seg_start);
        if head_last.is_some() {
            let n = self.chain(seg_start).len() as u32;
            self.segments.insert(
                seg_start,
                MSegment {
                    size: e.addr - seg_start,
                    blocks: n,
                    ..seg
                },
            );
            self.starts.insert(seg_start);
        }
        if let Some(t) = tail_first {
            let chain = self.chain(t);
            for a in &chain {
                self.blocks.get_mut(a).expect("chained").seg = t;
            }
            self.segments.insert(
                t,
                MSegment {
                    size: seg_end - t,
                    blocks: chain.len() as u32,
                    ..seg
                },
            );
            self.starts.insert(t);
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
        let mut blocks = AddrMap::default();
        let mut segments = AddrMap::default();
        let mut starts = BTreeSet::new();
        let device = self.device;
        for s in snapshot.segments.iter().filter(|s| s.device == device) {
            let n = s.blocks.len();
            let stream_ix = self.stream_index(s.stream);
            for (i, b) in s.blocks.iter().enumerate() {
                blocks.insert(
                    b.address,
                    MBlock {
                        seg: s.address,
                        size: b.size,
                        requested: b.requested_size,
                        alloc_ns: 0,
                        prev: (i > 0).then(|| s.blocks[i - 1].address),
                        next: (i + 1 < n).then(|| s.blocks[i + 1].address),
                        state: b.state,
                        oversize: b.state == BlockState::ActiveAllocated && oversize(b.size),
                    },
                );
            }
            segments.insert(
                s.address,
                MSegment {
                    size: s.total_size,
                    stream: s.stream,
                    stream_ix,
                    pool: segment_pool_key(s),
                    small: s.segment_type == SegmentType::Small,
                    expandable: s.is_expandable,
                    oversize: !s.is_expandable && oversize(s.total_size),
                    blocks: n as u32,
                },
            );
            starts.insert(s.address);
        }
        self.blocks = blocks;
        self.segments = segments;
        self.starts = starts;
        self.stats = stats;
        for (_, s) in &mut self.streams {
            s.allocated = 0;
            s.active = 0;
            s.reserved = 0;
        }
        let segs: Vec<(u64, MSegment)> =
            self.starts.iter().map(|a| (*a, self.segments[a])).collect();
        for (start, seg) in segs {
            let chain = self.chain(start);
            let (mut allocated, mut active) = (0i64, 0i64);
            for a in chain {
                let b = &self.blocks[&a];
                if b.state == BlockState::ActiveAllocated {
                    allocated += b.size as i64;
                }
                if b.state.is_active() {
                    active += b.size as i64;
                }
            }
            let acc = self.stream_at(seg.stream_ix, 0);
            acc.reserved += seg.size as i64;
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
        self.starts
            .iter()
            .map(|&addr| {
                let s = &self.segments[&addr];
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
                for a in self.chain(addr) {
                    let b = &self.blocks[&a];
                    if b.state == BlockState::ActiveAllocated {
                        info.allocated_size += b.size;
                        info.requested_size += b.requested;
                    }
                    if b.state.is_active() {
                        info.active_size += b.size;
                    }
                    info.blocks.push(BlockInfo {
                        address: a,
                        size: b.size,
                        requested_size: b.requested,
                        state: b.state,
                        frames: self.frames.clone(),
                        history: Vec::new(),
                    });
                }
                info
            })
            .collect()
    }

    /// The largest free block (0 when there is none).
    pub fn largest_free_block(&self) -> u64 {
        self.blocks
            .values()
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
        for (start, seg) in &self.segments {
            let u = pools
                .entry(seg.pool)
                .or_insert_with(|| PoolUsage::empty(seg.pool));
            u.segments += 1;
            u.reserved += seg.size;
            let split = !seg.expandable && seg.blocks > 1;
            for a in self.chain(*start) {
                let b = &self.blocks[&a];
                match b.state {
                    BlockState::ActiveAllocated => {
                        u.allocated += b.size;
                        u.active += b.size;
                        u.oversize_allocations += u64::from(b.oversize);
                    }
                    BlockState::ActivePendingFree => u.active += b.size,
                    BlockState::Inactive => {
                        u.largest_free = u.largest_free.max(b.size);
                        if split {
                            u.inactive_split += 1;
                            u.inactive_split_bytes += b.size;
                        }
                    }
                }
            }
        }
        pools.into_values().collect()
    }
}

impl PoolUsage {
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
