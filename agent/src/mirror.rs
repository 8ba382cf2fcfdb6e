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

use std::collections::BTreeMap;

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

/// One block of the mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MBlock {
    size: u64,
    requested: u64,
    state: BlockState,
    oversize: bool,
    /// When it was allocated (0: unknown, e.g. taken over from a snapshot).
    alloc_ns: u64,
}

impl MBlock {
    fn free(size: u64) -> MBlock {
        MBlock {
            size,
            requested: size,
            state: BlockState::Inactive,
            oversize: false,
            alloc_ns: 0,
        }
    }
}

/// One segment of the mirror; blocks keyed by address tile it.
#[derive(Debug, Clone)]
struct MSegment {
    size: u64,
    stream: u64,
    pool: PoolKey,
    small: bool,
    expandable: bool,
    oversize: bool,
    blocks: BTreeMap<u64, MBlock>,
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
    segments: BTreeMap<u64, MSegment>,
    stats: DeviceStats,
    streams: BTreeMap<u64, StreamAcc>,
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

impl DeviceMirror {
    /// An empty mirror of `device` (`max_split_size` in bytes, `None` = unlimited).
    pub fn new(device: i32, max_split_size: Option<u64>) -> DeviceMirror {
        DeviceMirror {
            device,
            segments: BTreeMap::new(),
            stats: DeviceStats {
                max_split_size: max_split_size.map_or(-1, |m| m as i64),
                ..DeviceStats::default()
            },
            streams: BTreeMap::new(),
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

    fn stream(&mut self, stream: u64, time_ns: u64) -> &mut StreamAcc {
        let s = self.streams.entry(stream).or_default();
        s.last_event_ns = s.last_event_ns.max(time_ns);
        s
    }

    /// Applies one event. On error the mirror is unchanged.
    pub fn apply(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let applied = match e.action {
            EventAction::SegmentAlloc if e.flags & FLAG_EXPANDABLE != 0 => self.map(e)?,
            EventAction::SegmentAlloc => self.segment_alloc(e)?,
            EventAction::SegmentFree if e.flags & FLAG_EXPANDABLE != 0 => self.unmap(e)?,
            EventAction::SegmentFree => self.segment_free(e)?,
            EventAction::SegmentMap => self.map(e)?,
            EventAction::SegmentUnmap => self.unmap(e)?,
            EventAction::Alloc => self.alloc(e)?,
            EventAction::FreeRequested => self.free_requested(e)?,
            EventAction::FreeCompleted => self.free_completed(e)?,
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
        for s in self.streams.values_mut() {
            s.peak_allocated = s.allocated;
        }
    }

    fn segment_at(&self, addr: u64) -> Option<u64> {
        let (&a, s) = self.segments.range(..=addr).next_back()?;
        (addr < a + s.size).then_some(a)
    }

    fn overlaps(&self, addr: u64, size: u64) -> bool {
        let end = addr + size;
        if let Some((&a, s)) = self.segments.range(..end).next_back() {
            return a + s.size > addr;
        }
        false
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
        let mut blocks = BTreeMap::new();
        blocks.insert(e.addr, MBlock::free(e.size));
        self.segments.insert(
            e.addr,
            MSegment {
                size: e.size,
                stream: e.stream,
                pool: pool_key(e),
                small,
                expandable: false,
                oversize,
                blocks,
            },
        );
        self.stats.segment.update_pool(small, 1);
        self.stats.reserved_bytes.update_pool(small, e.size as i64);
        self.stats.num_device_alloc += 1;
        if oversize {
            self.stats.oversize_segments.update(1);
        }
        self.stream(e.stream, e.time_ns).reserved += e.size as i64;
        Ok(Applied {
            pool: Some(pool_key(e)),
            layout_changed: true,
            ..Applied::default()
        })
    }

    fn segment_free(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let fits = self.segments.get(&e.addr).is_some_and(|s| {
            s.size == e.size
                && !s.expandable
                && s.blocks.len() == 1
                && s.blocks.values().all(|b| b.state == BlockState::Inactive)
        });
        if !fits {
            return Err(MirrorError::NoSuchBlock {
                action: e.action.as_str(),
                addr: e.addr,
                size: e.size,
                wanted: "whole free segment",
            });
        }
        let seg = self.segments.remove(&e.addr).expect("checked above");
        self.stats.segment.update_pool(seg.small, -1);
        self.stats
            .reserved_bytes
            .update_pool(seg.small, -(seg.size as i64));
        self.stats.num_device_free += 1;
        if seg.oversize {
            self.stats.oversize_segments.update(-1);
        }
        self.stream(seg.stream, e.time_ns).reserved -= seg.size as i64;
        Ok(Applied {
            pool: Some(seg.pool),
            layout_changed: true,
            ..Applied::default()
        })
    }

    /// Free blocks of a split, non-expandable segment count as inactive split.
    fn split_contribution(seg: &MSegment, addrs: &[u64]) -> (i64, i64) {
        if seg.expandable || seg.blocks.len() <= 1 {
            return (0, 0);
        }
        addrs
            .iter()
            .filter_map(|a| seg.blocks.get(a))
            .filter(|b| b.state == BlockState::Inactive)
            .fold((0, 0), |(n, bytes), b| (n + 1, bytes + b.size as i64))
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

    fn alloc(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let not_found = || MirrorError::NoSuchBlock {
            action: e.action.as_str(),
            addr: e.addr,
            size: e.size,
            wanted: "free",
        };
        let seg_addr = self.segment_at(e.addr).ok_or(MirrorError::UnknownSegment {
            action: e.action.as_str(),
            addr: e.addr,
        })?;
        let oversize = self.oversize(e);
        let seg = self.segments.get_mut(&seg_addr).expect("found above");
        let (&b_addr, &b) = seg
            .blocks
            .range(..=e.addr)
            .next_back()
            .ok_or_else(not_found)?;
        if b.state != BlockState::Inactive || e.size == 0 || b_addr + b.size < e.addr + e.size {
            return Err(not_found());
        }
        let before = Self::split_contribution(seg, &[b_addr]);
        seg.blocks.remove(&b_addr);
        let mut touched = [e.addr, 0, 0];
        if e.addr > b_addr {
            seg.blocks.insert(b_addr, MBlock::free(e.addr - b_addr));
            touched[1] = b_addr;
        }
        let end = e.addr + e.size;
        if b_addr + b.size > end {
            seg.blocks.insert(end, MBlock::free(b_addr + b.size - end));
            touched[2] = end;
        }
        seg.blocks.insert(
            e.addr,
            MBlock {
                size: e.size,
                requested: e.requested,
                state: BlockState::ActiveAllocated,
                oversize,
                alloc_ns: e.time_ns,
            },
        );
        let after = Self::split_contribution(seg, &touched[..]);
        let (small, stream, pool) = (seg.small, seg.stream, seg.pool);
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
        let s = self.stream(stream, e.time_ns);
        s.allocated += e.size as i64;
        s.active += e.size as i64;
        s.peak_allocated = s.peak_allocated.max(s.allocated);
        s.allocs += 1;
        Ok(Applied {
            pool: Some(pool),
            layout_changed: true,
            ..Applied::default()
        })
    }

    fn block_at(&self, e: &Event, state: BlockState) -> Result<u64, MirrorError> {
        let seg_addr = self.segment_at(e.addr).ok_or(MirrorError::UnknownSegment {
            action: e.action.as_str(),
            addr: e.addr,
        })?;
        let ok = self.segments[&seg_addr]
            .blocks
            .get(&e.addr)
            .is_some_and(|b| b.state == state && (e.size == 0 || b.size == e.size));
        if !ok {
            return Err(MirrorError::NoSuchBlock {
                action: e.action.as_str(),
                addr: e.addr,
                size: e.size,
                wanted: state.as_str(),
            });
        }
        Ok(seg_addr)
    }

    fn free_requested(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let seg_addr = self.block_at(e, BlockState::ActiveAllocated)?;
        let seg = self.segments.get_mut(&seg_addr).expect("found above");
        let b = seg.blocks.get_mut(&e.addr).expect("found above");
        b.state = BlockState::ActivePendingFree;
        let (size, oversize) = (b.size as i64, b.oversize);
        let (small, stream, pool) = (seg.small, seg.stream, seg.pool);
        self.stats.allocation.update_pool(small, -1);
        self.stats.allocated_bytes.update_pool(small, -size);
        if oversize {
            self.stats.oversize_allocations.update(-1);
        }
        self.stream(stream, e.time_ns).allocated -= size;
        Ok(Applied {
            pool: Some(pool),
            layout_changed: true,
            ..Applied::default()
        })
    }

    fn free_completed(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let seg_addr = self.block_at(e, BlockState::ActivePendingFree)?;
        let seg = self.segments.get_mut(&seg_addr).expect("found above");
        let b = *seg.blocks.get(&e.addr).expect("found above");
        let prev = seg
            .blocks
            .range(..e.addr)
            .next_back()
            .filter(|(_, p)| p.state == BlockState::Inactive)
            .map(|(&a, _)| a);
        let next_addr = e.addr + b.size;
        let next = seg
            .blocks
            .get(&next_addr)
            .filter(|n| n.state == BlockState::Inactive)
            .map(|_| next_addr);
        let neighbours: Vec<u64> = prev.into_iter().chain(next).collect();
        let before = Self::split_contribution(seg, &neighbours);
        let mut start = e.addr;
        let mut size = b.size;
        if let Some(p) = prev {
            let pb = seg.blocks.remove(&p).expect("found above");
            start = p;
            size += pb.size;
        }
        if let Some(n) = next {
            size += seg.blocks.remove(&n).expect("found above").size;
        }
        seg.blocks.remove(&e.addr);
        seg.blocks.insert(
            start,
            MBlock {
                requested: b.requested,
                ..MBlock::free(size)
            },
        );
        let after = Self::split_contribution(seg, &[start]);
        let (small, stream, pool) = (seg.small, seg.stream, seg.pool);
        self.apply_split_delta(small, before, after);
        self.stats.active.update_pool(small, -1);
        self.stats.active_bytes.update_pool(small, -(b.size as i64));
        self.stats
            .requested_bytes
            .update_pool(small, -(b.requested as i64));
        self.stream(stream, e.time_ns).active -= b.size as i64;
        let lifetime_ns =
            (b.alloc_ns != 0 && e.time_ns >= b.alloc_ns).then(|| e.time_ns - b.alloc_ns);
        Ok(Applied {
            lifetime_ns,
            pool: Some(pool),
            layout_changed: true,
        })
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
        let mut seg = MSegment {
            size: e.size,
            stream: e.stream,
            pool,
            small,
            expandable: true,
            oversize: false,
            blocks: BTreeMap::from([(e.addr, MBlock::free(e.size))]),
        };
        let mut start = e.addr;
        if let Some((&a, _)) = self
            .segments
            .range(..e.addr)
            .next_back()
            .filter(|(a, s)| *a + s.size == e.addr && joins(s))
        {
            let mut prev = self.segments.remove(&a).expect("found above");
            prev.size += seg.size;
            prev.blocks.append(&mut seg.blocks);
            seg = prev;
            start = a;
        }
        let end = e.addr + e.size;
        if self.segments.get(&end).is_some_and(joins) {
            let mut next = self.segments.remove(&end).expect("found above");
            seg.size += next.size;
            seg.blocks.append(&mut next.blocks);
        }
        // Merge the new free range with free neighbours, as PyTorch merges a freshly mapped
        // block with the free blocks beside it.
        Self::merge_free_at(&mut seg, e.addr);
        if let Some((&a, _)) = seg.blocks.range(..=e.addr).next_back() {
            Self::merge_free_at(&mut seg, a);
        }
        self.segments.insert(start, seg);
        self.stats.reserved_bytes.update_pool(small, e.size as i64);
        self.stats.num_device_alloc += 1;
        self.stream(e.stream, e.time_ns).reserved += e.size as i64;
        Ok(Applied {
            pool: Some(pool),
            layout_changed: true,
            ..Applied::default()
        })
    }

    /// Merges the free block at `addr` (if free) with a free block right after it, and a free
    /// block right before it with it.
    fn merge_free_at(seg: &mut MSegment, addr: u64) {
        let Some(b) = seg.blocks.get(&addr).copied() else {
            return;
        };
        if b.state != BlockState::Inactive {
            return;
        }
        let mut start = addr;
        let mut size = b.size;
        if let Some((&p, pb)) = seg.blocks.range(..addr).next_back()
            && pb.state == BlockState::Inactive
            && p + pb.size == addr
        {
            start = p;
            size += pb.size;
        }
        if let Some(nb) = seg.blocks.get(&(addr + b.size))
            && nb.state == BlockState::Inactive
        {
            size += nb.size;
            seg.blocks.remove(&(addr + b.size));
        }
        seg.blocks.remove(&addr);
        seg.blocks.insert(start, MBlock::free(size));
    }

    fn unmap(&mut self, e: &Event) -> Result<Applied, MirrorError> {
        let not_found = || MirrorError::NoSuchBlock {
            action: e.action.as_str(),
            addr: e.addr,
            size: e.size,
            wanted: "free mapped",
        };
        let seg_addr = self.segment_at(e.addr).ok_or(MirrorError::UnknownSegment {
            action: e.action.as_str(),
            addr: e.addr,
        })?;
        let seg = &self.segments[&seg_addr];
        let end = e.addr + e.size;
        let (&b_addr, &b) = seg
            .blocks
            .range(..=e.addr)
            .next_back()
            .ok_or_else(not_found)?;
        if !seg.expandable
            || b.state != BlockState::Inactive
            || e.size == 0
            || b_addr + b.size < end
        {
            return Err(not_found());
        }
        let mut seg = self.segments.remove(&seg_addr).expect("found above");
        seg.blocks.remove(&b_addr);
        if e.addr > b_addr {
            seg.blocks.insert(b_addr, MBlock::free(e.addr - b_addr));
        }
        if b_addr + b.size > end {
            seg.blocks.insert(end, MBlock::free(b_addr + b.size - end));
        }
        let tail_blocks = seg.blocks.split_off(&end);
        let seg_end = seg_addr + seg.size;
        let (small, stream, pool) = (seg.small, seg.stream, seg.pool);
        if seg_end > end {
            self.segments.insert(
                end,
                MSegment {
                    size: seg_end - end,
                    blocks: tail_blocks,
                    ..seg.clone()
                },
            );
        }
        if e.addr > seg_addr {
            seg.size = e.addr - seg_addr;
            self.segments.insert(seg_addr, seg);
        }
        self.stats
            .reserved_bytes
            .update_pool(small, -(e.size as i64));
        self.stats.num_device_free += 1;
        self.stream(stream, e.time_ns).reserved -= e.size as i64;
        Ok(Applied {
            pool: Some(pool),
            layout_changed: true,
            ..Applied::default()
        })
    }

    /// Replaces the mirror by the allocator's own view: the segments of `snapshot` on this
    /// device and `stats`. Per-stream figures are recomputed from the segments (their peaks
    /// never go down).
    pub fn resync(&mut self, snapshot: &Snapshot, stats: DeviceStats) {
        self.max_split_size = (stats.max_split_size >= 0).then_some(stats.max_split_size as u64);
        let oversize = |size: u64| self.max_split_size.is_some_and(|m| size >= m);
        let mut segments = BTreeMap::new();
        for s in snapshot.segments.iter().filter(|s| s.device == self.device) {
            let blocks = s
                .blocks
                .iter()
                .map(|b| {
                    (
                        b.address,
                        MBlock {
                            size: b.size,
                            requested: b.requested_size,
                            state: b.state,
                            oversize: b.state == BlockState::ActiveAllocated && oversize(b.size),
                            alloc_ns: 0,
                        },
                    )
                })
                .collect();
            segments.insert(
                s.address,
                MSegment {
                    size: s.total_size,
                    stream: s.stream,
                    pool: segment_pool_key(s),
                    small: s.segment_type == SegmentType::Small,
                    expandable: s.is_expandable,
                    oversize: !s.is_expandable && oversize(s.total_size),
                    blocks,
                },
            );
        }
        self.segments = segments;
        self.stats = stats;
        for s in self.streams.values_mut() {
            s.allocated = 0;
            s.active = 0;
            s.reserved = 0;
        }
        for seg in self.segments.values() {
            let acc = self.streams.entry(seg.stream).or_default();
            acc.reserved += seg.size as i64;
            for b in seg.blocks.values() {
                if b.state == BlockState::ActiveAllocated {
                    acc.allocated += b.size as i64;
                }
                if b.state.is_active() {
                    acc.active += b.size as i64;
                }
            }
            acc.peak_allocated = acc.peak_allocated.max(acc.allocated);
        }
        self.version += 1;
    }

    /// The mirror as snapshot segments, sorted by address.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.segments
            .iter()
            .map(|(&addr, s)| {
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
                    blocks: Vec::with_capacity(s.blocks.len()),
                };
                for (&a, b) in &s.blocks {
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
        self.segments
            .values()
            .flat_map(|s| s.blocks.values())
            .filter(|b| b.state == BlockState::Inactive)
            .map(|b| b.size)
            .max()
            .unwrap_or(0)
    }

    /// Usage per stream, by stream id.
    pub fn streams(&self) -> Vec<StreamUsage> {
        let pos = |v: i64| v.max(0) as u64;
        self.streams
            .iter()
            .map(|(&stream, s)| StreamUsage {
                stream,
                allocated: pos(s.allocated),
                active: pos(s.active),
                reserved: pos(s.reserved),
                peak_allocated: pos(s.peak_allocated),
                allocs: s.allocs,
                last_event_ns: s.last_event_ns,
            })
            .collect()
    }

    /// Usage per pool: small and large always, then private pools by id.
    pub fn pools(&self) -> Vec<PoolUsage> {
        let mut pools: BTreeMap<PoolKey, PoolUsage> = [PoolKey::Small, PoolKey::Large]
            .into_iter()
            .map(|p| (p, PoolUsage::empty(p)))
            .collect();
        for seg in self.segments.values() {
            let u = pools
                .entry(seg.pool)
                .or_insert_with(|| PoolUsage::empty(seg.pool));
            u.segments += 1;
            u.reserved += seg.size;
            let split = !seg.expandable && seg.blocks.len() > 1;
            for b in seg.blocks.values() {
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
