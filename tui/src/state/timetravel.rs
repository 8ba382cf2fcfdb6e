//! Time travel through a snapshot's trace: the segments and blocks as they were after any
//! event.
//!
//! The algorithm is the one of PyTorch's `memory_viz` "allocator state history", made
//! seekable:
//! 1. **Backward walk.** Start from the file's final segments (exact) and undo the trace from
//!    the last entry to the first: an `alloc` undone removes its block, a `free_requested`
//!    undone makes the block allocated again, a `free_completed` undone puts a pending-free
//!    block back, `segment_alloc`/`segment_free` undone remove/restore the segment,
//!    `segment_map`/`segment_unmap` undone unmap/map the range again (see below). The result
//!    is the state before the first entry. Each undone
//!    `alloc` records the size its block had, so the forward pass reproduces exact sizes for
//!    every block that survives to the end.
//! 2. **Forward pass with checkpoints.** Replay from that initial state, cloning the state every
//!    N = [`CHECKPOINT_EVERY`] events (more for traces so long that [`MAX_CHECKPOINTS`] would
//!    not cover them). The state after event `i` is the nearest checkpoint at or before `i`
//!    plus at most `N - 1` events: a seek costs O(N + state), not O(trace). Checkpoints share
//!    the segments they have in common (copy on write), so each costs one entry per segment
//!    plus the segments changed since the one before, not a copy of every block.
//!
//! Block sizes unknown to the file (blocks freed before the end and allocated before the trace
//! began) follow the allocator's rules: the request rounded up to 512 bytes, extended to the
//! next block when the remainder is too small to split (small pool: below 512 bytes; large
//! pool: at most 1 MiB), as in PyTorch's caching allocator.
//!
//! Only free space is implicit: a segment keeps its active blocks (allocated or pending free);
//! the gaps between them are the free blocks (free neighbours always merge).
//!
//! **Expandable segments** (PyTorch's Note [Expandable Segments]) are one reserved virtual
//! range per (stream, pool) whose pages are mapped (`segment_map`: address of the first page,
//! bytes mapped) and unmapped (`segment_unmap`) as the allocator grows and shrinks it; a
//! snapshot shows one segment per contiguous mapped run, `is_expandable`. So a reconstructed
//! expandable segment is a mapped run: a map joins the runs that end where it begins and
//! begin where it ends, an unmap cuts its range out of the run holding it (splitting it in
//! two when the range is in the middle). A run's pool comes from its neighbours when it joins
//! them, else from the page size (large-pool pages are 20 MiB, small-pool ones 2 MiB); blocks
//! in expandable segments split by the small pool's rule, as the allocator splits them.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use allocview_alloc::snapshot::{
    BlockInfo, BlockState, Frames, SegmentInfo, SegmentType, Snapshot, TraceAction, TraceEntry,
    no_frames,
};

/// Events between two checkpoints (for traces up to `CHECKPOINT_EVERY * MAX_CHECKPOINTS`
/// events; longer traces space their checkpoints out so memory stays bounded).
pub const CHECKPOINT_EVERY: usize = 512;
/// Most checkpoints kept: each is a copy of the segment state.
pub const MAX_CHECKPOINTS: usize = 256;
pub use allocview_alloc::caching::config::{MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE};
/// Page of a large-pool expandable segment (PyTorch's `kLargeBuffer`): every `segment_map`
/// of the large pool is a multiple of it, every one of the small pool a multiple of
/// [`SMALL_BUFFER`] pages that is not.
pub const LARGE_PAGE: u64 = allocview_alloc::caching::config::LARGE_BUFFER;

/// The pool of a mapped expandable range of `size` bytes, by its page size.
fn mapped_type(size: u64) -> SegmentType {
    if size.is_multiple_of(LARGE_PAGE) {
        SegmentType::Large
    } else {
        SegmentType::Small
    }
}

/// One active block of a reconstructed segment.
#[derive(Debug, Clone, PartialEq)]
struct Block {
    size: u64,
    requested: u64,
    state: BlockState,
    frames: Frames,
}

/// One reconstructed segment.
#[derive(Debug, Clone, PartialEq)]
struct Segment {
    total_size: u64,
    stream: u64,
    segment_type: SegmentType,
    pool_id: (u64, u64),
    is_expandable: bool,
    frames: Frames,
    /// Active blocks by address; gaps are free.
    blocks: BTreeMap<u64, Block>,
}

impl Segment {
    fn new(size: u64, stream: u64, segment_type: SegmentType, expandable: bool) -> Segment {
        Segment {
            total_size: size,
            stream,
            segment_type,
            pool_id: (0, 0),
            is_expandable: expandable,
            frames: no_frames(),
            blocks: BTreeMap::new(),
        }
    }

    /// Whether blocks split by the small pool's rule (small segments, and every expandable
    /// one).
    fn splits_small(&self) -> bool {
        self.segment_type == SegmentType::Small || self.is_expandable
    }

    /// Whether a range mapped on `stream` right next to this segment joins it: both are then
    /// runs of one reserved range, which a snapshot shows as one segment (a reserved range
    /// is 1.125 x the device's memory, so it never ends where another begins while mapped).
    fn joins(&self, stream: u64) -> bool {
        self.is_expandable && self.stream == stream
    }
}

/// Running figures of a reconstructed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    /// Bytes of segments.
    pub reserved: u64,
    /// Bytes of allocated blocks.
    pub allocated: u64,
    /// Bytes of active blocks.
    pub active: u64,
    /// Highest reserved so far.
    pub peak_reserved: u64,
    /// Highest allocated so far.
    pub peak_allocated: u64,
    /// Highest active so far.
    pub peak_active: u64,
    /// `alloc` entries applied.
    pub allocs: u64,
    /// `free_completed` entries applied.
    pub frees: u64,
    /// Segments allocated (or mapped).
    pub segment_allocs: u64,
    /// Segments freed (or unmapped).
    pub segment_frees: u64,
    /// OOMs.
    pub ooms: u64,
    /// Entries that did not fit the reconstructed state (a truncated or inconsistent trace).
    pub mismatches: u64,
}

impl Totals {
    fn bump_peaks(&mut self) {
        self.peak_reserved = self.peak_reserved.max(self.reserved);
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        self.peak_active = self.peak_active.max(self.active);
    }
}

/// The allocator state of one device at one point of the trace.
///
/// Segments are shared between copies (copy on write): a checkpoint costs one entry per
/// segment, and the events between two checkpoints copy only the segments they change.
#[derive(Debug, Clone, PartialEq)]
struct Memory {
    segments: BTreeMap<u64, Arc<Segment>>,
    totals: Totals,
    /// Allocated bytes per stream (of the segment holding the block), with the highest each
    /// reached (the per-stream `peak_allocated`).
    streams: BTreeMap<u64, StreamAllocated>,
}

/// Allocated bytes of one stream and their highest value so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct StreamAllocated {
    now: u64,
    peak: u64,
}

/// The reconstructed state after one event: what [`TimeTravel::moment`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Moment {
    /// The segments then.
    pub segments: Vec<SegmentInfo>,
    /// The running totals then.
    pub totals: Totals,
    /// `(stream, peak)`: the highest allocated bytes of each stream that held any from the
    /// start of the trace to then, ascending by stream.
    pub stream_peaks: Vec<(u64, u64)>,
}

/// Size of a block serving `requested` bytes at `addr`, where the free space runs to `gap_end`.
fn block_size(requested: u64, addr: u64, gap_end: u64, small: bool) -> u64 {
    let rounded = requested.max(1).div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE;
    let room = gap_end.saturating_sub(addr);
    if rounded >= room {
        return rounded.min(room.max(MIN_BLOCK_SIZE));
    }
    let remaining = room - rounded;
    let split = if small {
        remaining >= MIN_BLOCK_SIZE
    } else {
        remaining > SMALL_SIZE
    };
    if split { rounded } else { room }
}

impl Memory {
    fn from_segments(segments: &[SegmentInfo]) -> Memory {
        let mut m = Memory {
            segments: BTreeMap::new(),
            totals: Totals::default(),
            streams: BTreeMap::new(),
        };
        for s in segments {
            let mut seg = Segment {
                total_size: s.total_size,
                stream: s.stream,
                segment_type: s.segment_type,
                pool_id: s.segment_pool_id,
                is_expandable: s.is_expandable,
                frames: s.frames.clone(),
                blocks: BTreeMap::new(),
            };
            m.totals.reserved += s.total_size;
            for b in s.blocks.iter().filter(|b| b.state.is_active()) {
                m.totals.active += b.size;
                if b.state == BlockState::ActiveAllocated {
                    m.allocate(s.stream, b.size);
                }
                seg.blocks.insert(
                    b.address,
                    Block {
                        size: b.size,
                        requested: b.requested_size,
                        state: b.state,
                        frames: b.frames.clone(),
                    },
                );
            }
            m.segments.insert(s.address, Arc::new(seg));
        }
        m.totals.bump_peaks();
        m
    }

    /// Counts `size` more allocated bytes, on `stream` too.
    fn allocate(&mut self, stream: u64, size: u64) {
        self.totals.allocated += size;
        let s = self.streams.entry(stream).or_default();
        s.now += size;
        s.peak = s.peak.max(s.now);
    }

    /// Counts `size` fewer allocated bytes, on `stream` too.
    fn release(&mut self, stream: u64, size: u64) {
        self.totals.allocated -= size;
        if let Some(s) = self.streams.get_mut(&stream) {
            s.now -= size;
        }
    }

    /// Forgets the totals' counters and peaks: from here on they count from the current state.
    fn restart_counting(&mut self) {
        self.totals = Totals {
            reserved: self.totals.reserved,
            allocated: self.totals.allocated,
            active: self.totals.active,
            ..Totals::default()
        };
        self.totals.bump_peaks();
        self.streams.retain(|_, s| s.now > 0);
        for s in self.streams.values_mut() {
            s.peak = s.now;
        }
    }

    /// The segment whose range holds `addr`, to change (its own copy first if it is shared).
    fn segment_at(&mut self, addr: u64) -> Option<(u64, &mut Segment)> {
        let (&start, seg) = self.segments.range_mut(..=addr).next_back()?;
        if addr < start + seg.total_size {
            Some((start, Arc::make_mut(seg)))
        } else {
            None
        }
    }

    /// The segment whose range holds `addr`, to read.
    fn segment_ref(&self, addr: u64) -> Option<(u64, &Segment)> {
        let (&start, seg) = self.segments.range(..=addr).next_back()?;
        (addr < start + seg.total_size).then_some((start, &**seg))
    }

    /// Size a new block at `addr` would get.
    fn rule_size(seg: &Segment, seg_start: u64, addr: u64, requested: u64) -> u64 {
        let gap_end = seg
            .blocks
            .range((Bound::Excluded(addr), Bound::Unbounded))
            .next()
            .map_or(seg_start + seg.total_size, |(&a, _)| a);
        block_size(requested, addr, gap_end, seg.splits_small())
    }

    /// Adds an active block; returns its size.
    fn insert_block(
        &mut self,
        addr: u64,
        size: Option<u64>,
        requested: u64,
        state: BlockState,
        frames: &Frames,
    ) -> Option<u64> {
        if self.segment_ref(addr)?.1.blocks.contains_key(&addr) {
            return None;
        }
        let (start, seg) = self.segment_at(addr)?;
        let size = size.unwrap_or_else(|| Memory::rule_size(seg, start, addr, requested));
        let stream = seg.stream;
        seg.blocks.insert(
            addr,
            Block {
                size,
                requested,
                state,
                frames: frames.clone(),
            },
        );
        self.totals.active += size;
        if state == BlockState::ActiveAllocated {
            self.allocate(stream, size);
        }
        Some(size)
    }

    /// Removes an active block; returns it.
    fn remove_block(&mut self, addr: u64) -> Option<Block> {
        if !self.segment_ref(addr)?.1.blocks.contains_key(&addr) {
            return None;
        }
        let (_, seg) = self.segment_at(addr)?;
        let b = seg.blocks.remove(&addr)?;
        let stream = seg.stream;
        self.totals.active -= b.size;
        if b.state == BlockState::ActiveAllocated {
            self.release(stream, b.size);
        }
        Some(b)
    }

    /// Changes a block's state; returns whether it existed.
    fn set_state(&mut self, addr: u64, state: BlockState) -> bool {
        if !self
            .segment_ref(addr)
            .is_some_and(|(_, seg)| seg.blocks.contains_key(&addr))
        {
            return false;
        }
        let Some((_, seg)) = self.segment_at(addr) else {
            return false;
        };
        let Some(b) = seg.blocks.get_mut(&addr) else {
            return false;
        };
        let size = b.size;
        let was = b.state;
        b.state = state;
        let stream = seg.stream;
        match (was, state) {
            (BlockState::ActiveAllocated, BlockState::ActivePendingFree) => {
                self.release(stream, size)
            }
            (BlockState::ActivePendingFree, BlockState::ActiveAllocated) => {
                self.allocate(stream, size)
            }
            _ => {}
        }
        true
    }

    /// Whether any segment overlaps `[addr, addr + size)`.
    fn overlaps(&self, addr: u64, size: u64) -> bool {
        self.segments
            .range(..addr.saturating_add(size))
            .next_back()
            .is_some_and(|(&start, seg)| start + seg.total_size > addr)
    }

    /// Adds an ordinary segment (`segment_alloc`): small when it is a small-pool buffer.
    fn add_segment(&mut self, addr: u64, size: u64, stream: u64) -> bool {
        if self.overlaps(addr, size) {
            return false;
        }
        let segment_type = if size == SMALL_BUFFER {
            SegmentType::Small
        } else {
            SegmentType::Large
        };
        self.segments.insert(
            addr,
            Arc::new(Segment::new(size, stream, segment_type, false)),
        );
        self.totals.reserved += size;
        true
    }

    fn remove_segment(&mut self, addr: u64) -> bool {
        match self.segments.remove(&addr) {
            Some(seg) => {
                self.totals.reserved -= seg.total_size;
                for b in seg.blocks.values() {
                    self.totals.active -= b.size;
                    if b.state == BlockState::ActiveAllocated {
                        self.release(seg.stream, b.size);
                    }
                }
                true
            }
            None => false,
        }
    }

    /// Maps `[addr, addr+size)` of an expandable segment: the run ending at `addr` and the
    /// run starting at `addr + size` (when there are such runs) join it into one segment, as
    /// a snapshot shows one segment per contiguous mapped run. `segment_type` is the pool of
    /// a run that joins neither.
    fn map(&mut self, addr: u64, size: u64, stream: u64, segment_type: SegmentType) -> bool {
        if size == 0 || self.overlaps(addr, size) {
            return false;
        }
        let end = addr + size;
        let after = match self.segments.get(&end) {
            Some(next) if next.joins(stream) => self.segments.remove(&end),
            _ => None,
        };
        let before = self
            .segments
            .range_mut(..addr)
            .next_back()
            .filter(|(start, seg)| **start + seg.total_size == addr && seg.joins(stream));
        match (before, after) {
            // The run before grows over the range (and the run after, when there is one).
            (Some((_, seg)), after) => {
                let seg = Arc::make_mut(seg);
                seg.total_size += size;
                if let Some(next) = after {
                    let next = Arc::unwrap_or_clone(next);
                    seg.total_size += next.total_size;
                    seg.blocks.extend(next.blocks);
                }
            }
            // The run after grows down over the range: it now starts at `addr`.
            (None, Some(mut next)) => {
                Arc::make_mut(&mut next).total_size += size;
                self.segments.insert(addr, next);
            }
            (None, None) => {
                self.segments.insert(
                    addr,
                    Arc::new(Segment::new(size, stream, segment_type, true)),
                );
            }
        }
        self.totals.reserved += size;
        true
    }

    /// Unmaps `[addr, addr+size)` from the segment holding it (its tail, its head, all of it,
    /// or the middle, splitting it in two).
    fn unmap(&mut self, addr: u64, size: u64) -> bool {
        let Some((start, seg)) = self.segment_ref(addr) else {
            return false;
        };
        let end = start + seg.total_size;
        if size == 0 || addr + size > end {
            return false;
        }
        // Only free pages are unmapped: an active block inside means the state is off.
        let inside_active = seg
            .blocks
            .range(..addr + size)
            .next_back()
            .is_some_and(|(&a, b)| a + b.size > addr);
        if inside_active {
            return false;
        }
        if addr == start && size == seg.total_size {
            return self.remove_segment(start);
        }
        let mut seg =
            Arc::unwrap_or_clone(self.segments.remove(&start).expect("segment found above"));
        let tail_blocks = seg.blocks.split_off(&addr);
        // The run after the range: the segment's own facts, without its frames or the head's
        // blocks (not cloned only to be replaced).
        let tail = Segment {
            total_size: end - (addr + size),
            stream: seg.stream,
            segment_type: seg.segment_type,
            pool_id: seg.pool_id,
            is_expandable: seg.is_expandable,
            frames: no_frames(),
            blocks: tail_blocks
                .into_iter()
                .filter(|(a, _)| *a >= addr + size)
                .collect(),
        };
        seg.total_size = addr - start;
        self.totals.reserved -= size;
        if seg.total_size > 0 {
            self.segments.insert(start, Arc::new(seg));
        }
        if tail.total_size > 0 {
            self.segments.insert(addr + size, Arc::new(tail));
        }
        true
    }

    /// Applies one entry forward. `alloc_size` is the exact block size when known.
    fn apply(&mut self, e: &TraceEntry, alloc_size: Option<u64>) {
        let ok = match e.action {
            TraceAction::Alloc => {
                self.totals.allocs += 1;
                self.insert_block(
                    e.addr,
                    alloc_size,
                    e.size,
                    BlockState::ActiveAllocated,
                    &e.frames,
                )
                .is_some()
            }
            TraceAction::FreeRequested => self.set_state(e.addr, BlockState::ActivePendingFree),
            TraceAction::FreeCompleted => {
                self.totals.frees += 1;
                self.remove_block(e.addr).is_some()
            }
            TraceAction::SegmentAlloc => {
                self.totals.segment_allocs += 1;
                self.add_segment(e.addr, e.size, e.stream)
            }
            TraceAction::SegmentFree => {
                self.totals.segment_frees += 1;
                self.remove_segment(e.addr)
            }
            TraceAction::SegmentMap => {
                self.totals.segment_allocs += 1;
                self.map(e.addr, e.size, e.stream, mapped_type(e.size))
            }
            TraceAction::SegmentUnmap => {
                self.totals.segment_frees += 1;
                self.unmap(e.addr, e.size)
            }
            TraceAction::Oom => {
                self.totals.ooms += 1;
                true
            }
            TraceAction::Snapshot | TraceAction::UserDefined => true,
        };
        if !ok {
            self.totals.mismatches += 1;
        }
        self.totals.bump_peaks();
    }

    /// Undoes one entry (walking backwards); returns the size of the block an undone `alloc`
    /// removed. `unmapped_type` is the pool of the range an undone `segment_unmap` maps
    /// again, for a run that joins no neighbour.
    fn undo(&mut self, e: &TraceEntry, unmapped_type: SegmentType) -> Option<u64> {
        match e.action {
            TraceAction::Alloc => return self.remove_block(e.addr).map(|b| b.size),
            TraceAction::FreeRequested => {
                self.set_state(e.addr, BlockState::ActiveAllocated);
            }
            TraceAction::FreeCompleted => {
                self.insert_block(
                    e.addr,
                    None,
                    e.size,
                    BlockState::ActivePendingFree,
                    &e.frames,
                );
            }
            TraceAction::SegmentAlloc => {
                self.remove_segment(e.addr);
            }
            TraceAction::SegmentFree => {
                self.add_segment(e.addr, e.size, e.stream);
            }
            TraceAction::SegmentMap => {
                self.unmap(e.addr, e.size);
            }
            TraceAction::SegmentUnmap => {
                self.map(e.addr, e.size, e.stream, unmapped_type);
            }
            TraceAction::Oom | TraceAction::Snapshot | TraceAction::UserDefined => {}
        }
        None
    }

    fn to_segments(&self, device: i32) -> Vec<SegmentInfo> {
        self.segments
            .iter()
            .map(|(&address, seg)| {
                let end = address + seg.total_size;
                let mut blocks = Vec::with_capacity(seg.blocks.len() * 2 + 1);
                let mut at = address;
                let (mut allocated, mut active, mut requested) = (0, 0, 0);
                let free = |from: u64, to: u64| BlockInfo {
                    address: from,
                    size: to - from,
                    requested_size: to - from,
                    state: BlockState::Inactive,
                    frames: no_frames(),
                    history: Vec::new(),
                };
                for (&a, b) in &seg.blocks {
                    if a > at {
                        blocks.push(free(at, a));
                    }
                    active += b.size;
                    requested += b.requested;
                    if b.state == BlockState::ActiveAllocated {
                        allocated += b.size;
                    }
                    blocks.push(BlockInfo {
                        address: a,
                        size: b.size,
                        requested_size: b.requested,
                        state: b.state,
                        frames: b.frames.clone(),
                        history: Vec::new(),
                    });
                    at = at.max(a + b.size);
                }
                if end > at {
                    blocks.push(free(at, end));
                }
                SegmentInfo {
                    device,
                    address,
                    total_size: seg.total_size,
                    allocated_size: allocated,
                    active_size: active,
                    requested_size: requested,
                    stream: seg.stream,
                    segment_type: seg.segment_type,
                    segment_pool_id: seg.pool_id,
                    is_expandable: seg.is_expandable,
                    frames: seg.frames.clone(),
                    blocks,
                }
            })
            .collect()
    }
}

/// A snapshot's trace for one device, seekable to any event.
#[derive(Debug, Clone)]
pub struct TimeTravel {
    device: i32,
    trace: Arc<[TraceEntry]>,
    /// Exact block size of each `alloc` entry, from the backward walk.
    alloc_sizes: Vec<Option<u64>>,
    /// State after `k * interval` events.
    checkpoints: Vec<Memory>,
    /// Events between checkpoints.
    interval: usize,
    /// Totals after each event would cost too much memory; samples are kept by the caller.
    final_totals: Totals,
}

impl TimeTravel {
    /// Prepares time travel over `device`'s trace of `snapshot`.
    pub fn new(snapshot: &Snapshot, device: i32) -> TimeTravel {
        let finals: Vec<SegmentInfo> = snapshot
            .segments
            .iter()
            .filter(|s| s.device == device)
            .cloned()
            .collect();
        let trace = usize::try_from(device)
            .ok()
            .and_then(|d| snapshot.device_traces.get(d))
            .cloned()
            .unwrap_or_default();
        let unmapped_types = unmapped_types(&trace, &finals);
        let mut memory = Memory::from_segments(&finals);
        let mut alloc_sizes = vec![None; trace.len()];
        for (i, e) in trace.iter().enumerate().rev() {
            alloc_sizes[i] = memory.undo(e, unmapped_types[i]);
        }
        memory.restart_counting();
        let interval = CHECKPOINT_EVERY.max(trace.len().div_ceil(MAX_CHECKPOINTS));
        let mut checkpoints = vec![memory.clone()];
        for (i, e) in trace.iter().enumerate() {
            memory.apply(e, alloc_sizes[i]);
            if (i + 1) % interval == 0 {
                checkpoints.push(memory.clone());
            }
        }
        TimeTravel {
            device,
            trace: Arc::from(trace),
            alloc_sizes,
            checkpoints,
            interval,
            final_totals: memory.totals,
        }
    }

    /// Number of trace entries (the last event number).
    pub fn len(&self) -> usize {
        self.trace.len()
    }

    /// Whether the trace is empty.
    pub fn is_empty(&self) -> bool {
        self.trace.is_empty()
    }

    /// The trace.
    pub fn trace(&self) -> &[TraceEntry] {
        &self.trace
    }

    /// The trace, shared (a reference-count bump, not a copy).
    pub fn shared_trace(&self) -> Arc<[TraceEntry]> {
        Arc::clone(&self.trace)
    }

    /// The device shown.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// Totals after the whole trace.
    pub fn final_totals(&self) -> Totals {
        self.final_totals
    }

    fn memory_at(&self, event: usize) -> Memory {
        let event = event.min(self.trace.len());
        let cp = event / self.interval;
        let mut m = self.checkpoints[cp].clone();
        for i in cp * self.interval..event {
            m.apply(&self.trace[i], self.alloc_sizes[i]);
        }
        m
    }

    /// The segments after `event` entries (0 = before the first; `len()` = the end), and the
    /// running totals there.
    pub fn at(&self, event: usize) -> (Vec<SegmentInfo>, Totals) {
        let m = self.moment(event);
        (m.segments, m.totals)
    }

    /// The state after `event` entries (as [`Self::at`]) with each stream's peak so far.
    pub fn moment(&self, event: usize) -> Moment {
        let m = self.memory_at(event);
        Moment {
            segments: m.to_segments(self.device),
            totals: m.totals,
            stream_peaks: m.streams.iter().map(|(&s, a)| (s, a.peak)).collect(),
        }
    }

    /// The same by replaying every event from the start, without checkpoints (the reference
    /// the checkpoints are tested against).
    pub fn at_by_full_replay(&self, event: usize) -> (Vec<SegmentInfo>, Totals) {
        let mut m = self.checkpoints[0].clone();
        for i in 0..event.min(self.trace.len()) {
            m.apply(&self.trace[i], self.alloc_sizes[i]);
        }
        (m.to_segments(self.device), m.totals)
    }

    /// Calls `f(i, totals)` after each event, in one forward pass (for timelines).
    pub fn for_each_total(&self, mut f: impl FnMut(usize, &TraceEntry, &Totals)) {
        let mut m = self.checkpoints[0].clone();
        for (i, e) in self.trace.iter().enumerate() {
            m.apply(e, self.alloc_sizes[i]);
            f(i + 1, e, &m.totals);
        }
    }

    /// The first event number after `event` whose entry matches `pred` (the event number is
    /// one past the entry's index: seeking there shows the entry applied).
    pub fn next_matching(&self, event: usize, pred: impl Fn(&TraceEntry) -> bool) -> Option<usize> {
        self.trace
            .iter()
            .enumerate()
            .skip(event)
            .find(|(_, e)| pred(e))
            .map(|(i, _)| i + 1)
    }
}

/// Pools of the expandable ranges mapped so far, by start address (a later map of the same
/// start replaces an earlier one: the pool belongs to the reserved range, which both share).
#[derive(Debug, Default)]
struct MappedPools(BTreeMap<u64, (u64, SegmentType)>);

impl MappedPools {
    fn insert(&mut self, addr: u64, size: u64, segment_type: SegmentType) {
        self.0.insert(addr, (addr + size, segment_type));
    }

    /// The pool of a known range holding `addr` (the nearest ranges starting at or below
    /// it are looked at, a few of them: ranges of one reserved range overlap only when
    /// mapped again).
    fn pool_at(&self, addr: u64) -> Option<SegmentType> {
        /// Ranges looked at below `addr`.
        const NEAREST: usize = 8;
        self.0
            .range(..=addr)
            .rev()
            .take(NEAREST)
            .find(|(_, (end, _))| *end > addr)
            .map(|(_, &(_, t))| t)
    }
}

/// For each `segment_unmap` entry, the pool of the range it unmaps (other entries get
/// [`SegmentType::Large`], unused): the pool of the last earlier `segment_map` holding its
/// first page (a map's pool is exact, by its page size); else of a later map or a final
/// segment holding it (the same reserved range mapped again or still partly mapped); else
/// guessed from its size like a map's.
fn unmapped_types(trace: &[TraceEntry], finals: &[SegmentInfo]) -> Vec<SegmentType> {
    let mut types = vec![SegmentType::Large; trace.len()];
    let mut earlier = MappedPools::default();
    let mut from_earlier = vec![None; trace.len()];
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            TraceAction::SegmentMap => earlier.insert(e.addr, e.size, mapped_type(e.size)),
            TraceAction::SegmentUnmap => from_earlier[i] = earlier.pool_at(e.addr),
            _ => {}
        }
    }
    let mut later = MappedPools::default();
    for s in finals.iter().filter(|s| s.is_expandable) {
        later.insert(s.address, s.total_size, s.segment_type);
    }
    for (i, e) in trace.iter().enumerate().rev() {
        match e.action {
            TraceAction::SegmentMap => later.insert(e.addr, e.size, mapped_type(e.size)),
            TraceAction::SegmentUnmap => {
                let t = from_earlier[i]
                    .or_else(|| later.pool_at(e.addr))
                    .unwrap_or_else(|| mapped_type(e.size));
                types[i] = t;
                later.insert(e.addr, e.size, t);
            }
            _ => {}
        }
    }
    types
}

/// Whether an entry changes the segment list.
pub fn is_segment_event(e: &TraceEntry) -> bool {
    matches!(
        e.action,
        TraceAction::SegmentAlloc
            | TraceAction::SegmentFree
            | TraceAction::SegmentMap
            | TraceAction::SegmentUnmap
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    fn entry(action: TraceAction, addr: u64, size: u64) -> TraceEntry {
        TraceEntry::new(action, addr, size, 0)
    }

    #[test]
    fn block_sizes_follow_the_split_rules() {
        // Small pool: a remainder of 512 splits, less is absorbed.
        assert_eq!(block_size(1000, 0, 2048, true), 1024);
        assert_eq!(block_size(1000, 0, 1536, true), 1024);
        assert_eq!(block_size(1000, 0, 1024 + 511, true), 1024 + 511);
        assert_eq!(block_size(1000, 0, 1024, true), 1024);
        // Large pool: a remainder must exceed 1 MiB to split.
        assert_eq!(block_size(3 * MIB, 0, 4 * MIB, false), 4 * MIB);
        assert_eq!(block_size(3 * MIB, 0, 4 * MIB + 512, false), 3 * MIB);
    }

    /// A trace: one 20 MiB segment, two allocations, a cross-stream free, a free, and the
    /// segment released at the end after a second segment comes and goes.
    fn scenario() -> Snapshot {
        let seg = 0x1000_0000u64;
        let trace = vec![
            entry(TraceAction::SegmentAlloc, seg, 20 * MIB),
            entry(TraceAction::Alloc, seg, 4 * MIB),
            entry(TraceAction::Alloc, seg + 4 * MIB, 2 * MIB),
            entry(TraceAction::FreeRequested, seg, 4 * MIB),
            entry(TraceAction::SegmentAlloc, 0x2000_0000, 2 * MIB),
            entry(TraceAction::Alloc, 0x2000_0000, 1000),
            entry(TraceAction::FreeCompleted, seg, 4 * MIB),
            entry(TraceAction::FreeRequested, 0x2000_0000, 1000),
            entry(TraceAction::FreeCompleted, 0x2000_0000, 1000),
            entry(TraceAction::SegmentFree, 0x2000_0000, 2 * MIB),
        ];
        // The final state: the segment with the 2 MiB block allocated at +4 MiB.
        let final_seg = SegmentInfo {
            device: 0,
            address: seg,
            total_size: 20 * MIB,
            allocated_size: 2 * MIB,
            active_size: 2 * MIB,
            requested_size: 2 * MIB,
            stream: 0,
            segment_type: SegmentType::Large,
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: no_frames(),
            blocks: vec![
                BlockInfo {
                    address: seg,
                    size: 4 * MIB,
                    requested_size: 4 * MIB,
                    state: BlockState::Inactive,
                    frames: no_frames(),
                    history: vec![],
                },
                BlockInfo {
                    address: seg + 4 * MIB,
                    size: 2 * MIB,
                    requested_size: 2 * MIB,
                    state: BlockState::ActiveAllocated,
                    frames: no_frames(),
                    history: vec![],
                },
                BlockInfo {
                    address: seg + 6 * MIB,
                    size: 14 * MIB,
                    requested_size: 14 * MIB,
                    state: BlockState::Inactive,
                    frames: no_frames(),
                    history: vec![],
                },
            ],
        };
        Snapshot {
            segments: vec![final_seg],
            device_traces: vec![trace],
            ..Snapshot::default()
        }
    }

    #[test]
    fn the_state_before_the_trace_is_empty_and_the_end_matches_the_file() {
        let snap = scenario();
        let tt = TimeTravel::new(&snap, 0);
        assert_eq!(tt.len(), 10);
        let (start, totals) = tt.at(0);
        assert!(start.is_empty());
        assert_eq!(totals.reserved, 0);
        let (end, totals) = tt.at(10);
        assert_eq!(end, snap.segments);
        assert_eq!(totals.mismatches, 0);
        assert_eq!(totals.peak_reserved, 22 * MIB);
    }

    #[test]
    fn stream_peaks_follow_each_streams_allocated_bytes_through_the_trace() {
        // The scenario with its second segment (and the 1000-byte block in it) on stream 7.
        let mut snap = scenario();
        for e in &mut snap.device_traces[0] {
            if e.addr == 0x2000_0000 {
                e.stream = 7;
            }
        }
        let tt = TimeTravel::new(&snap, 0);
        // Before the trace nothing is allocated; stream 0 peaks at 6 MiB after the second
        // alloc, and keeps that peak after the free; stream 7 appears with its 1024-byte
        // block and keeps its peak after its segment is gone.
        assert!(tt.moment(0).stream_peaks.is_empty());
        assert_eq!(tt.moment(3).stream_peaks, [(0, 6 * MIB)]);
        assert_eq!(tt.moment(6).stream_peaks, [(0, 6 * MIB), (7, 1024)]);
        assert_eq!(tt.moment(10).stream_peaks, [(0, 6 * MIB), (7, 1024)]);
        assert_eq!(tt.moment(10).segments.len(), 1);
    }

    #[test]
    fn intermediate_states_show_pending_frees_and_second_segments() {
        let tt = TimeTravel::new(&scenario(), 0);
        let (segs, t) = tt.at(6);
        assert_eq!(segs.len(), 2);
        assert_eq!(segs[0].blocks[0].state, BlockState::ActivePendingFree);
        assert_eq!(segs[1].segment_type, SegmentType::Small);
        assert_eq!(segs[1].blocks[0].size, 1024);
        assert_eq!(t.allocated, 2 * MIB + 1024);
        assert_eq!(t.active, 6 * MIB + 1024);
        assert_eq!(tt.next_matching(0, is_segment_event), Some(1));
        assert_eq!(tt.next_matching(1, is_segment_event), Some(5));
        assert_eq!(tt.next_matching(5, is_segment_event), Some(10));
    }

    #[test]
    fn expandable_segments_grow_and_shrink_by_mapping() {
        let trace = vec![
            entry(TraceAction::SegmentMap, 0x1000_0000, 2 * MIB),
            entry(TraceAction::SegmentMap, 0x1000_0000 + 2 * MIB, 2 * MIB),
            entry(TraceAction::Alloc, 0x1000_0000, 3 * MIB),
            entry(TraceAction::SegmentUnmap, 0x1000_0000 + 2 * MIB, 2 * MIB),
        ];
        let snap = Snapshot {
            device_traces: vec![trace],
            ..Snapshot::default()
        };
        let tt = TimeTravel::new(&snap, 0);
        let (segs, _) = tt.at(2);
        assert_eq!(segs.len(), 1);
        assert_eq!(segs[0].total_size, 4 * MIB);
        assert!(segs[0].is_expandable);
    }
}
