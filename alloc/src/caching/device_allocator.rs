//! The allocator's state and algorithm for one device: PyTorch's `DeviceCachingAllocator`
//! (c10/cuda/CUDACachingAllocator.cpp, 2.x), function for function.
//!
//! Everything here runs under the allocator's one mutex; the public wrapper
//! ([`CachingAllocator`](crate::caching::CachingAllocator)) takes it, gathers stack context
//! before it, and calls OOM observers after it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::caching::addr_table::AddrTable;
use crate::caching::backend::{DeviceBackend, DeviceError, DevicePtr, EventId, StreamId};
use crate::caching::block::{Block, BlockArena, BlockId, NIL};
use crate::caching::config::{AllocatorConfig, MIN_BLOCK_SIZE, SMALL_SIZE, segment_size};
use crate::caching::context_table::ContextTable;
use crate::caching::error::{AllocError, OomInfo, OutOfMemory};
use crate::caching::expandable::ExpandableSegment;
use crate::caching::history::{ContextLevel, TraceRing};
use crate::caching::pool::{BlockPool, PoolId, PrivatePool, SizeKey, size_key, stream_end_key};
use crate::caching::stats::{DeviceStats, StatArray, StatType};
use crate::event::{
    Event, EventAction, EventPool, EventSink, FLAG_CACHED, FLAG_EXPANDABLE, FLAG_OVERSIZE,
    FLAG_PRIVATE_POOL, MAX_BATCH, clock,
};
use crate::snapshot::{Frames, TraceAction, TraceEntry, no_frames};

mod expandable_blocks;
mod private_pools;
mod queries;

/// A trace tracker callback.
pub(crate) type TraceTracker = Arc<dyn Fn(&TraceEntry) + Send + Sync>;
/// An OOM observer callback.
pub(crate) type OomObserver = Arc<dyn Fn(&OomInfo) + Send + Sync>;
/// A free-memory callback: frees memory elsewhere, returns whether it did.
pub(crate) type FreeMemoryCallback = Arc<dyn Fn() -> bool + Send + Sync>;
/// Which streams a capture routes to its private pool.
pub(crate) type StreamFilter = Arc<dyn Fn(StreamId) -> bool + Send + Sync>;

/// Index of the default large pool.
const LARGE_POOL: u32 = 0;
/// Index of the default small pool.
const SMALL_POOL: u32 = 1;
/// Slab slots reserved up front, so early calls do not grow the slab.
const INITIAL_BLOCKS: usize = 1024;
/// A batch is published at the end of a call that leaves fewer free places than this (a cached
/// call makes one or two events), so batches rarely split a call.
const BATCH_HEADROOM: usize = 2;
/// A batch is published at the end of the first call that starts this long after its first
/// event (so a live view lags a busy allocator by about this much).
pub(crate) const MAX_BATCH_AGE_NS: u64 = 1_000_000;
/// The deadline of an empty batch: no stamp reaches it.
const NO_DEADLINE: u64 = u64::MAX;
/// The deadline of a batch to publish at the end of the current call: every stamp reaches it.
const PUBLISH_NOW: u64 = 0;
/// By default one call in this many, drawn at random, measures its latency.
pub(crate) const DEFAULT_LATENCY_SAMPLING: u32 = 16;

/// [`FLAG_CACHED`] when an allocation was served from the cache.
#[inline(always)]
fn cached_flag(cached: bool) -> u8 {
    if cached { FLAG_CACHED } else { 0 }
}

/// What an event says besides its action and the fields every event of the allocator shares
/// (`device`, the call's time), gathered from values its caller already holds.
struct EventFields {
    addr: u64,
    size: u64,
    requested: u64,
    stream: StreamId,
    pool: u32,
    small: bool,
    context: u32,
    flags: u8,
}

// The allocator's `StatArray`s keep only the pools' stats and the `all` peak up to date: every
// update moves `all` and one pool by the same amount, so `all`'s current, allocated and freed
// are the pools' sums, filled in by `DeviceCachingAllocator::stats` when the stats are read.
// That halves the counter writes of the hot path.

/// `Stat::update` for an increase of one pool's stat (and the `all` peak), without testing the
/// sign.
#[inline(always)]
fn inc(a: &mut StatArray, small: bool, n: u64) {
    let n = n as i64;
    let pi = StatType::for_pool(small) as usize;
    // The other pool: 1 + 2 - pi.
    let oi = StatType::SmallPool as usize + StatType::LargePool as usize - pi;
    let a = &mut a.0;
    a[pi].current += n;
    a[pi].allocated += n;
    // Past the warm-up a new peak is rare: a predicted branch, and no store, beats a
    // conditional move and a store on every update.
    if a[pi].current > a[pi].peak {
        a[pi].peak = a[pi].current;
    }
    let all = a[pi].current + a[oi].current;
    if all > a[0].peak {
        a[0].peak = all;
    }
}

/// `Stat::update` for a decrease of one pool's stat.
#[inline(always)]
fn dec(a: &mut StatArray, small: bool, n: u64) {
    let p = &mut a.0[StatType::for_pool(small) as usize];
    p.current -= n as i64;
    p.freed += n as i64;
}

/// `Stat::update` of one pool's stat by a signed amount.
#[inline(always)]
fn update(a: &mut StatArray, small: bool, n: i64) {
    if n > 0 {
        inc(a, small, n as u64);
    } else if n < 0 {
        dec(a, small, n.unsigned_abs());
    }
}

/// The `all` entry's current value of an allocator stat array (see above).
#[inline]
fn all_current(a: &StatArray) -> i64 {
    a.0[StatType::SmallPool as usize].current + a.0[StatType::LargePool as usize].current
}

/// Why a malloc failed, with what the caller must do outside the lock.
pub(crate) enum MallocFailure {
    /// Out of memory: call these observers with this info, then return the error (boxed, so
    /// the hot path's `Result` stays two words).
    Oom(Box<(OutOfMemory, OomInfo, Vec<OomObserver>)>),
    /// Any other error.
    Error(AllocError),
}

impl From<AllocError> for MallocFailure {
    fn from(e: AllocError) -> Self {
        MallocFailure::Error(e)
    }
}

impl From<DeviceError> for MallocFailure {
    fn from(e: DeviceError) -> Self {
        MallocFailure::Error(AllocError::Device(e))
    }
}

/// One request being served (PyTorch's `AllocParams`).
struct Params {
    stream: StreamId,
    sidx: u16,
    size: u64,
    pool: u32,
    /// The segment size a new segment for the request gets (set on the uncached path).
    alloc_size: u64,
    block: BlockId,
    /// The block's free-set key, and its index there as a hint, while it is still in its
    /// pool's free set (a cached block found by `get_free_block`; a new segment's block never
    /// is).
    cached_key: Option<(SizeKey, usize)>,
}

/// The state of one device's caching allocator.
pub(crate) struct DeviceCachingAllocator {
    pub(crate) device: i32,
    pub(crate) config: AllocatorConfig,
    /// `max_split_size` with unlimited as `u64::MAX`.
    max_split: u64,
    /// The statistics as updated (`all` entries partly stale: read them through `stats()`).
    pub(crate) stats: DeviceStats,
    arena: BlockArena,
    /// Block pools: 0 = default large, 1 = default small, then private pools' pairs.
    pools: Vec<BlockPool>,
    free_pool_slots: Vec<u32>,
    private_pools: Vec<PrivatePool>,
    pub(crate) captures: Vec<(PoolId, StreamFilter)>,
    /// Streams seen, sorted: a stream's index here is its free-set key prefix.
    streams: Vec<u64>,
    /// Blocks handed out to the program, by address.
    allocated: AddrTable,
    /// Frees with stream uses made during a capture, waiting for the capture to end.
    deferred_until_no_capture: Vec<BlockId>,
    /// Streams recorded on blocks during a capture (they need no event afterwards).
    cudagraph_stream_uses: HashMap<BlockId, Vec<StreamId>>,
    /// Outstanding events per stream, in record order.
    events: BTreeMap<StreamId, VecDeque<(EventId, BlockId)>>,
    pending_events: usize,
    event_pool: Vec<EventId>,
    /// Bytes reserved from the device (all pools, private ones included).
    total_allocated_memory: u64,
    pub(crate) allowed_memory_maximum: u64,
    pub(crate) set_fraction: bool,
    expandable: Vec<Option<ExpandableSegment>>,
    /// Whether the trace ring records (set with [`Self::set_record_history`]).
    record_history: bool,
    pub(crate) context_level: ContextLevel,
    pub(crate) ring: TraceRing,
    /// Receivers of every trace entry (added with [`Self::add_tracker`]).
    trackers: Vec<TraceTracker>,
    pub(crate) oom_observers: Vec<OomObserver>,
    pub(crate) free_callbacks: Vec<FreeMemoryCallback>,
    pub(crate) sink: Option<Arc<dyn EventSink>>,
    /// Whether the current call publishes events (a sink is set and enabled).
    publishing: bool,
    /// The sink's answer to `enabled` when last asked: when the last batch was published, or
    /// at the start of each call while it said no.
    sink_enabled: bool,
    /// Whether the current call publishes or traces (the hot path's one check).
    observing: bool,
    /// Events gathered for the sink, published in one batch (see `end_call`): the first
    /// `batch_len`; `time_ns` holds a raw clock stamp until the batch is published. A fixed
    /// array inside the state (no pointer to load), written in place field by field (a
    /// `Vec`'s push measured slower: a capacity check and a copy of each event).
    batch: [Event; MAX_BATCH],
    /// Events in `batch` (less than [`MAX_BATCH`] between calls).
    batch_len: usize,
    /// Whether calls make trace entries: `tracing`, kept by [`Self::tracing_changed`] (so a
    /// call's start reads one flag).
    tracing_now: bool,
    /// Ids of the frames events refer to (interned only while a sink listens).
    contexts: ContextTable,
    /// The current call's context id in `contexts` (0: none gathered, or no sink listens).
    call_context: u32,
    /// Index in `batch` of the current call's first event.
    call_first: usize,
    /// The current call's start (a raw `clock::stamp`).
    call_start: u64,
    /// Stamp from which the batch is published at the end of a call: its first call's start
    /// plus [`MAX_BATCH_AGE_NS`], [`PUBLISH_NOW`] once it is nearly full or holds an OOM, a
    /// snapshot marker or a reset (an observer acts on those at once), [`NO_DEADLINE`] while
    /// it is empty. So the end of a call checks one comparison.
    batch_deadline: u64,
    /// Set while `batch` holds events, for readers without the lock
    /// ([`CachingAllocator::holds_events`](crate::caching::CachingAllocator::holds_events)).
    pub(crate) holding: Arc<AtomicBool>,
    /// One publishing call in this many (on average) measures its latency.
    latency_one_in: u32,
    /// Xorshift state drawing the calls that measure their latency (never 0).
    latency_draw: u32,
    /// Publishing calls left until the next measured one (drawn at random, `one_in` on
    /// average, by each measured call: one decrement per call in between).
    latency_countdown: u32,
    empty_frames: Frames,
    /// The trace entry `push_trace` fills (its frames are `empty_frames` between calls).
    scratch_entry: TraceEntry,
}

impl DeviceCachingAllocator {
    pub(crate) fn new(device: i32, config: AllocatorConfig) -> DeviceCachingAllocator {
        let max_split = config.max_split_size_or_max();
        let empty_frames = no_frames();
        let stats = DeviceStats {
            max_split_size: config.max_split_size().map_or(-1, |m| m as i64),
            ..DeviceStats::default()
        };
        DeviceCachingAllocator {
            device,
            config,
            max_split,
            stats,
            arena: BlockArena::with_capacity(INITIAL_BLOCKS),
            pools: vec![BlockPool::new(false, None), BlockPool::new(true, None)],
            free_pool_slots: Vec::new(),
            private_pools: Vec::new(),
            captures: Vec::new(),
            streams: Vec::new(),
            allocated: AddrTable::new(),
            deferred_until_no_capture: Vec::new(),
            cudagraph_stream_uses: HashMap::new(),
            events: BTreeMap::new(),
            pending_events: 0,
            event_pool: Vec::new(),
            total_allocated_memory: 0,
            allowed_memory_maximum: 0,
            set_fraction: false,
            expandable: Vec::new(),
            record_history: false,
            context_level: ContextLevel::Never,
            ring: TraceRing::new(),
            trackers: Vec::new(),
            oom_observers: Vec::new(),
            free_callbacks: Vec::new(),
            sink: None,
            publishing: false,
            sink_enabled: false,
            observing: false,
            // Every event of this allocator has its device: written here once.
            batch: [Event {
                device: device as i16,
                ..Event::EMPTY
            }; MAX_BATCH],
            batch_len: 0,
            tracing_now: false,
            contexts: ContextTable::new(),
            call_context: 0,
            call_first: 0,
            call_start: 0,
            batch_deadline: NO_DEADLINE,
            holding: Arc::new(AtomicBool::new(false)),
            latency_one_in: DEFAULT_LATENCY_SAMPLING,
            latency_draw: 0x9E37_79B9,
            latency_countdown: 1,
            empty_frames: empty_frames.clone(),
            scratch_entry: TraceEntry {
                frames: empty_frames,
                ..TraceEntry::new(TraceAction::Alloc, 0, 0, 0)
            },
        }
    }

    // ---------------------------------------------------------------- calls, events, trace

    /// Starts a public call: stamps the clock once when anything will be timestamped (events,
    /// trace entries); every event and entry of the call carries that time. `context` is the
    /// frames gathered for the call with their content hash (`context_table::frames_hash`, taken before the lock): while a
    /// sink listens, the call's events carry their id.
    #[inline]
    pub(crate) fn begin_call(&mut self, context: Option<(&Frames, u64)>) {
        if !self.sink_enabled && self.sink.is_some() {
            self.check_sink_enabled();
        }
        self.publishing = self.sink_enabled;
        self.observing = self.publishing || self.tracing_now;
        if self.observing {
            self.call_start = clock::stamp();
            self.call_first = self.batch_len;
        }
        self.call_context = match context {
            Some((frames, hash)) if self.publishing => self.contexts.intern(frames, hash),
            _ => 0,
        };
    }

    /// The frames of the context ids still kept (see [`ContextTable`]), in the order asked.
    pub(crate) fn context_frames(&self, ids: &[u32]) -> Vec<(u32, Frames)> {
        ids.iter()
            .filter_map(|&id| self.contexts.get(id).map(|f| (id, Arc::clone(f))))
            .collect()
    }

    /// Ends a public call: a sampled call stamps its events with its latency; the batch is
    /// published when it is nearly full, old, or holds an OOM, snapshot marker or reset.
    #[inline]
    pub(crate) fn end_call(&mut self) {
        if self.publishing {
            self.finish_publishing_call();
        }
    }

    /// The end of a call that published: the latency sample's countdown, and the batch's
    /// deadline (which `batch_edge` and `queue_event` set, so that one comparison sees every
    /// reason to publish).
    #[inline]
    fn finish_publishing_call(&mut self) {
        self.latency_countdown -= 1;
        if self.latency_countdown == 0 {
            self.stamp_latency();
        }
        if clock::reached(self.call_start, self.batch_deadline) {
            self.publish_batch();
        }
    }

    /// Gives the current call's events the time the call took (at least 1 ns: 0 means "not
    /// measured"), and draws how many calls until the next measured one: uniform in
    /// `1..=2 * one_in - 1`, so one call in `one_in` on average, at random.
    #[inline(never)]
    fn stamp_latency(&mut self) {
        let mut x = self.latency_draw;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.latency_draw = x;
        // `x * span / 2^32` is uniform in `0..span` (a multiply and a shift, not a division).
        let span = 2 * u64::from(self.latency_one_in) - 1;
        self.latency_countdown = 1 + ((u64::from(x) * span) >> 32) as u32;
        let took = clock::elapsed_ns(self.call_start, clock::stamp());
        let latency = u32::try_from(took).unwrap_or(u32::MAX).max(1);
        for e in &mut self.batch[self.call_first..self.batch_len] {
            e.latency_ns = latency;
        }
    }

    /// Publishes the gathered events (their stamps turned into times) in one batch, or drops
    /// them when the sink no longer listens.
    #[inline(never)]
    fn publish_batch(&mut self) {
        self.check_sink_enabled();
        if let Some(sink) = self.sink.as_ref().filter(|_| self.sink_enabled) {
            clock::stamps_to_ns(&mut self.batch[..self.batch_len]);
            sink.publish_batch(&self.batch[..self.batch_len]);
        }
        self.batch_len = 0;
        self.call_first = 0;
        self.batch_deadline = NO_DEADLINE;
        self.holding.store(false, Ordering::Relaxed);
    }

    /// Asks the sink whether it listens (now: a disabled or new sink at a call's start, every
    /// sink when a batch is published).
    #[inline(never)]
    fn check_sink_enabled(&mut self) {
        self.sink_enabled = self.sink.as_ref().is_some_and(|s| s.enabled());
    }

    /// Publishes the gathered events, if any, now.
    pub(crate) fn flush_batch(&mut self) {
        if self.batch_len != 0 {
            self.publish_batch();
        }
    }

    /// Sets the sink, publishing what was gathered for the previous one first.
    pub(crate) fn set_sink(&mut self, sink: Option<Arc<dyn EventSink>>) {
        self.flush_batch();
        self.sink = sink;
        self.sink_enabled = false;
    }

    /// One call in `one_in` (at least 1) measures its latency, starting with the next call.
    pub(crate) fn set_latency_sampling(&mut self, one_in: u32) {
        self.latency_one_in = one_in.clamp(1, u32::MAX / 2);
        self.latency_countdown = 1;
    }

    /// Adds an event to the batch (see [`Self::write_event`]).
    #[inline(always)]
    fn push_event(&mut self, action: EventAction, f: &EventFields) {
        let i = self.event_slot();
        self.write_event(i, action, f);
    }

    /// The batch's next place, for [`Self::write_event`]. One comparison sees both edges of a
    /// batch (its first event: 0 wraps round; its last places), which `batch_edge` handles out
    /// of line. Hot callers take the place before they read the event's fields, so that
    /// those need not be kept across the possible call.
    #[inline(always)]
    fn event_slot(&mut self) -> usize {
        if self.batch_len.wrapping_sub(1) >= MAX_BATCH - BATCH_HEADROOM - 1 {
            self.batch_edge();
        }
        self.batch_len
    }

    /// Writes an event (its `time_ns` the call's stamp) into the batch's place `i` (from
    /// [`Self::event_slot`], nothing pushed since), field by field: `device` and the zero
    /// padding were written once, when the batch was made, and never change.
    #[inline(always)]
    fn write_event(&mut self, i: usize, action: EventAction, f: &EventFields) {
        let mut flags = f.flags;
        let mut pool_id = 0;
        // The default pools (large, small) have no owner.
        if f.pool > SMALL_POOL
            && let Some(owner) = self.pools[f.pool as usize].owner
        {
            flags |= FLAG_PRIVATE_POOL;
            pool_id = owner.0;
        }
        let time = self.call_start;
        let e = &mut self.batch[i & (MAX_BATCH - 1)];
        e.time_ns = time;
        e.addr = f.addr;
        e.size = f.size;
        e.requested = f.requested;
        e.stream = f.stream.0;
        e.pool_id = pool_id;
        e.latency_ns = 0;
        e.context = f.context;
        e.action = action;
        e.pool = if f.small {
            EventPool::Small
        } else {
            EventPool::Large
        };
        e.flags = flags;
        self.batch_len = i + 1;
    }

    /// Before an event goes into an empty batch or one of its last [`BATCH_HEADROOM`] places:
    /// a full batch is published first (a call with that many events is split); the first
    /// event sets the batch's deadline from its call's start (once per batch, not per call)
    /// and tells lock-free readers that events wait; a nearly full batch is published at the
    /// end of the call.
    #[inline(never)]
    fn batch_edge(&mut self) {
        if self.batch_len >= MAX_BATCH {
            self.publish_batch();
        }
        if self.batch_len == 0 {
            self.batch_deadline = clock::stamp_after(self.call_start, MAX_BATCH_AGE_NS);
            self.holding.store(true, Ordering::Relaxed);
        } else {
            self.batch_deadline = PUBLISH_NOW;
        }
    }

    /// The context id of a block's event: the call's, else the block's allocation's.
    #[inline(always)]
    fn event_context(&self, block_context: u32) -> u32 {
        if self.call_context != 0 {
            self.call_context
        } else {
            block_context
        }
    }

    /// Queues a block's event with its address, sizes, stream, pool and flags read from the
    /// block (the free request of a block other streams still use; the hot path's alloc and
    /// free build theirs from values they already hold).
    fn publish_block(&mut self, action: EventAction, id: BlockId) {
        let b = &self.arena[id];
        let context = self.event_context(b.context_id);
        let e = EventFields {
            addr: b.addr,
            size: b.size,
            requested: b.requested,
            stream: b.stream,
            pool: b.pool,
            small: b.small,
            context,
            flags: self.block_flags(b.is_expandable(), b.size),
        };
        self.push_event(action, &e);
    }

    /// [`FLAG_EXPANDABLE`] and [`FLAG_OVERSIZE`] of a block from what the caller knows of it
    /// (callers that already read these for the statistics pay nothing more).
    #[inline(always)]
    fn block_flags(&self, expandable: bool, size: u64) -> u8 {
        let mut flags = if expandable { FLAG_EXPANDABLE } else { 0 };
        if size >= self.max_split {
            flags |= FLAG_OVERSIZE;
        }
        flags
    }

    /// Queues an event for a block or segment of `pool` (nothing when no sink is set or the
    /// sink is disabled: one branch).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn emit(
        &mut self,
        action: EventAction,
        pool: u32,
        addr: u64,
        size: u64,
        requested: u64,
        stream: StreamId,
        flags: u8,
    ) {
        if self.publishing {
            self.queue_event(action, pool, addr, size, requested, stream, flags);
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn queue_event(
        &mut self,
        action: EventAction,
        pool: u32,
        addr: u64,
        size: u64,
        requested: u64,
        stream: StreamId,
        flags: u8,
    ) {
        let f = EventFields {
            addr,
            size,
            requested,
            stream,
            pool,
            small: self.pools[pool as usize].is_small,
            context: self.call_context,
            flags,
        };
        self.push_event(action, &f);
        if matches!(
            action,
            EventAction::Oom
                | EventAction::Snapshot
                | EventAction::ResetPeaks
                | EventAction::ResetAccumulated
        ) {
            self.batch_deadline = PUBLISH_NOW;
        }
    }

    /// Queues an event that concerns no block (retry, sync, snapshot, resets).
    pub(crate) fn emit_plain(&mut self, action: EventAction, stream: StreamId) {
        self.emit(action, LARGE_POOL, 0, 0, 0, stream, 0);
    }

    /// The current call's start in microseconds since the Unix epoch (trace entries' time).
    fn call_time_us(&self) -> i64 {
        (clock::stamp_ns(self.call_start) / 1000) as i64
    }

    /// Turns the trace ring's recording on or off.
    pub(crate) fn set_record_history(&mut self, on: bool) {
        self.record_history = on;
        self.tracing_changed();
    }

    /// Adds a receiver of every trace entry.
    pub(crate) fn add_tracker(&mut self, t: TraceTracker) {
        self.trackers.push(t);
        self.tracing_changed();
    }

    /// Whether trace entries go anywhere (history on or a tracker attached), kept in
    /// `tracing_now` so a call's start reads one flag.
    fn tracing_changed(&mut self) {
        self.tracing_now = self.record_history || !self.trackers.is_empty();
    }

    /// PyTorch's `record_trace`: to the trackers always, to the ring when history is on (one
    /// branch when neither).
    #[inline(always)]
    pub(crate) fn record_trace(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: StreamId,
        context: Option<&Frames>,
    ) {
        if self.tracing_now {
            self.push_trace(action, addr, size, stream, context);
        }
    }

    /// Fills the reused entry and hands it to the trackers (then a copy to the ring), so a
    /// tracker-only call clones no frames.
    #[inline(never)]
    fn push_trace(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: StreamId,
        context: Option<&Frames>,
    ) {
        let time_us = self.call_time_us();
        let te = &mut self.scratch_entry;
        te.action = action;
        te.addr = addr;
        te.size = size;
        te.stream = stream.0;
        te.time_us = Some(time_us);
        let frames = context.filter(|_| self.context_level >= ContextLevel::Alloc);
        if let Some(f) = frames {
            te.frames = f.clone();
        }
        for t in &self.trackers {
            t(te);
        }
        if self.record_history {
            self.ring.push(te.clone());
        }
        if frames.is_some() {
            te.frames = self.empty_frames.clone();
        }
    }

    /// A user annotation: the name travels as a one-frame context.
    pub(crate) fn record_annotation(&mut self, frames: Frames, stream: StreamId) {
        if self.tracing_now {
            let te = TraceEntry {
                time_us: Some(self.call_time_us()),
                frames,
                ..TraceEntry::new(TraceAction::UserDefined, 0, 0, stream.0)
            };
            for t in &self.trackers {
                t(&te);
            }
            if self.record_history {
                self.ring.push(te);
            }
        }
        self.emit_plain(EventAction::UserDefined, stream);
    }

    // ---------------------------------------------------------------- stats helpers

    /// The statistics, with each array's `all` entry filled in from the pools (see `inc`).
    pub(crate) fn stats(&self) -> DeviceStats {
        let mut out = self.stats.clone();
        for a in out.arrays_mut() {
            let [all, s, l] = &mut a.0;
            all.current = s.current + l.current;
            all.allocated = s.allocated + l.allocated;
            all.freed = s.freed + l.freed;
        }
        out
    }

    /// `reset_peak_memory_stats`: every peak (the `all` ones too) to its current value.
    pub(crate) fn reset_peak_stats(&mut self) {
        self.stats = self.stats();
        self.stats.reset_peak();
    }

    #[inline]
    fn is_small(&self, pool: u32) -> bool {
        self.pools[pool as usize].is_small
    }

    #[inline]
    fn insert_into_blocks(&mut self, id: BlockId) {
        let b = &mut self.arena[id];
        let pool = &mut self.pools[b.pool as usize];
        b.gc_count_base = pool.get_free_blocks_call_count;
        pool.blocks.insert(size_key(b.sidx, b.size, b.addr), id);
    }

    /// `insert_into_blocks` for a block whose old key `old` is still in the set (a split's
    /// remainder, a merge's grown block): one [`FreeSet::replace`](crate::caching::free_set::FreeSet::replace),
    /// `hint` the old entry's index if known.
    #[inline(always)]
    fn reinsert_into_blocks(&mut self, id: BlockId, old: SizeKey, hint: usize) {
        let b = &mut self.arena[id];
        let pool = &mut self.pools[b.pool as usize];
        b.gc_count_base = pool.get_free_blocks_call_count;
        pool.blocks
            .replace(old, size_key(b.sidx, b.size, b.addr), id, hint);
    }

    fn remove_from_blocks(&mut self, id: BlockId) {
        let b = &self.arena[id];
        self.pools[b.pool as usize]
            .blocks
            .remove(&size_key(b.sidx, b.size, b.addr));
    }

    fn private_pool_of(&mut self, pool: u32) -> Option<&mut PrivatePool> {
        let owner = self.pools[pool as usize].owner?;
        self.private_pools.iter_mut().find(|p| p.id == owner)
    }

    // ---------------------------------------------------------------- malloc

    /// PyTorch's `malloc`.
    #[inline]
    pub(crate) fn malloc<B: DeviceBackend>(
        &mut self,
        be: &B,
        orig_size: u64,
        stream: StreamId,
        context: Option<Frames>,
    ) -> Result<DevicePtr, MallocFailure> {
        self.process_ready_events(be, context.as_ref())?;
        let size = self.config.round_size(orig_size);
        let pool = self.get_pool(size, stream);
        let sidx = self.stream_index(stream)?;
        let mut p = Params {
            stream,
            sidx,
            size,
            pool,
            alloc_size: 0,
            block: NIL,
            cached_key: None,
        };

        if !self.get_free_block(&mut p) {
            return self.malloc_uncached(be, p, orig_size, context);
        }
        let split = self.should_split(p.block, p.size);
        let id = self.alloc_found_block(&p, orig_size, context, split, true);
        Ok(self.arena[id].addr)
    }

    /// `malloc` when no cached block fits at first: free-memory callbacks, then garbage
    /// collection, a new segment, and the retries (kept out of the cached path's code).
    #[cold]
    #[inline(never)]
    fn malloc_uncached<B: DeviceBackend>(
        &mut self,
        be: &B,
        mut p: Params,
        orig_size: u64,
        context: Option<Frames>,
    ) -> Result<DevicePtr, MallocFailure> {
        p.alloc_size = segment_size(p.size);
        let mut found = self.trigger_free_memory_callbacks() && self.get_free_block(&mut p);
        let mut from_device = false;
        if !found {
            if self.set_fraction && self.config.garbage_collection_threshold() > 0.0 {
                self.garbage_collect_cached_blocks(be, context.as_ref())?;
            }
            found = self.alloc_block(be, &mut p, false, context.as_ref())?;
            if !found && self.release_available_cached_blocks(be, &p, context.as_ref())? {
                found = self.alloc_block(be, &mut p, false, context.as_ref())?;
            }
            if !found && self.captures.is_empty() {
                self.release_cached_blocks(be, context.as_ref())?;
                found = self.alloc_block(be, &mut p, true, context.as_ref())?;
            }
            from_device = found;
        }

        if !found {
            return Err(self.out_of_memory(be, &p, orig_size, context.as_ref()));
        }

        let split = self.should_split(p.block, p.size);
        let id = self.alloc_found_block(&p, orig_size, context, split, !from_device);
        Ok(self.arena[id].addr)
    }

    fn out_of_memory<B: DeviceBackend>(
        &mut self,
        be: &B,
        p: &Params,
        orig_size: u64,
        context: Option<&Frames>,
    ) -> MallocFailure {
        let (device_free, device_total) = match be.mem_get_info() {
            Ok(v) => v,
            Err(e) => return e.into(),
        };
        self.record_trace(TraceAction::Oom, device_free, p.size, p.stream, context);
        self.stats.num_ooms += 1;
        self.emit(
            EventAction::Oom,
            p.pool,
            device_free,
            p.size,
            orig_size,
            p.stream,
            0,
        );
        let allocated = all_current(&self.stats.allocated_bytes).max(0) as u64;
        let reserved = all_current(&self.stats.reserved_bytes).max(0) as u64;
        let owner = self.pools[p.pool as usize].owner;
        let oom = OutOfMemory {
            device: self.device,
            stream: p.stream,
            requested: orig_size,
            rounded: p.size,
            segment_size: p.alloc_size,
            device_total,
            device_free,
            allowed_max: self.set_fraction.then_some(self.allowed_memory_maximum),
            allocated,
            reserved,
            reserved_unallocated: reserved.saturating_sub(allocated),
            largest_free_block: self.largest_free_block(),
            stranded_in_split_segments: all_current(&self.stats.inactive_split_bytes).max(0) as u64,
            expandable_segments: self.config.expandable_segments(),
            private_pool: owner,
            during_capture: !self.captures.is_empty(),
            releasable_in_other_pools: self.releasable_outside(owner),
        };
        let info = OomInfo {
            device: self.device,
            size: p.size,
            segment_size: p.alloc_size,
            requested: orig_size,
            total_or_allowed: if self.set_fraction {
                self.allowed_memory_maximum
            } else {
                device_total
            },
            device_free,
            stream: p.stream,
        };
        MallocFailure::Oom(Box::new((oom, info, self.oom_observers.clone())))
    }

    /// Bytes of whole cached segments (free, unsplit, not in an expandable segment) in pools
    /// other than those of `owner`: what `empty_cache` could give back that a request routed
    /// to `owner`'s pools cannot use.
    fn releasable_outside(&self, owner: Option<PoolId>) -> u64 {
        self.pools
            .iter()
            .filter(|p| p.owner != owner)
            .flat_map(|p| p.blocks.iter())
            .map(|(_, id)| &self.arena[id])
            .filter(|b| !b.is_split() && b.expandable == NIL)
            .map(|b| b.size)
            .sum()
    }

    /// The largest free cached block over every pool.
    pub(crate) fn largest_free_block(&self) -> u64 {
        self.pools
            .iter()
            .flat_map(|p| p.blocks.iter())
            .map(|(_, id)| self.arena[id].size)
            .max()
            .unwrap_or(0)
    }

    /// The dense index of a stream: its rank among the streams seen so far, so free sets
    /// order by stream value as PyTorch's do. A stream seen for the first time shifts the ranks
    /// above it and rebuilds the free sets (rare: programs use a handful of streams).
    #[inline]
    fn stream_index(&mut self, stream: StreamId) -> Result<u16, AllocError> {
        // Most programs allocate on one stream: no search then.
        if let [only] = self.streams[..]
            && only == stream.0
        {
            return Ok(0);
        }
        self.stream_index_search(stream)
    }

    /// `stream_index` beyond the one-stream case.
    fn stream_index_search(&mut self, stream: StreamId) -> Result<u16, AllocError> {
        let pos = match self.streams.binary_search(&stream.0) {
            Ok(i) => return Ok(i as u16),
            Err(pos) => pos,
        };
        if self.streams.len() > usize::from(u16::MAX) {
            return Err(AllocError::InvalidArgument(format!(
                "more than {} distinct streams",
                u16::MAX
            )));
        }
        self.streams.insert(pos, stream.0);
        let pos = pos as u16;
        if usize::from(pos) + 1 < self.streams.len() {
            let ids: Vec<BlockId> = self.arena.iter().map(|(id, _)| id).collect();
            for id in ids {
                let b = &mut self.arena[id];
                if b.sidx >= pos {
                    b.sidx += 1;
                }
            }
            for pool in &mut self.pools {
                for (_, id) in pool.blocks.take_all() {
                    let b = &self.arena[id];
                    pool.blocks.insert(size_key(b.sidx, b.size, b.addr), id);
                }
            }
        }
        Ok(pos)
    }

    #[inline]
    fn get_pool(&self, size: u64, stream: StreamId) -> u32 {
        if !self.captures.is_empty() {
            for (id, filter) in &self.captures {
                if filter(stream)
                    && let Some(pp) = self.private_pools.iter().find(|p| p.id == *id)
                {
                    return if size <= SMALL_SIZE {
                        pp.small
                    } else {
                        pp.large
                    };
                }
            }
        }
        if size <= SMALL_SIZE {
            SMALL_POOL
        } else {
            LARGE_POOL
        }
    }

    #[inline]
    fn should_split(&self, id: BlockId, size: u64) -> bool {
        let b = &self.arena[id];
        let remaining = b.size - size;
        if self.is_small(b.pool) || self.config.expandable_segments() {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.max_split && remaining > SMALL_SIZE
        }
    }

    /// PyTorch's `get_free_block`: best fit by `(stream, size, address)`.
    #[inline(always)]
    fn get_free_block(&mut self, p: &mut Params) -> bool {
        let gc_on = self.set_fraction && self.config.garbage_collection_threshold() > 0.0;
        let pool = &mut self.pools[p.pool as usize];
        if gc_on {
            pool.get_free_blocks_call_count += 1;
        }
        // One-sided range (cheaper than a two-sided one); the stream bound is checked here.
        let end = stream_end_key(p.sidx);
        let (mut index, mut iter) = pool.blocks.search(size_key(p.sidx, p.size, 0));
        let Some((key, first)) = iter.next() else {
            return false;
        };
        if key >= end {
            return false;
        }
        let (mut key, mut id) = (key, first);
        if self.arena[id].is_expandable() {
            // For best fit, an expandable block counts with the unmapped range after it.
            let arena = &self.arena;
            let expandable_size = |b: BlockId| {
                let blk = &arena[b];
                let extra = if blk.next != NIL && !arena[blk.next].mapped {
                    arena[blk.next].size
                } else {
                    0
                };
                blk.size + extra
            };
            for (k2, n) in iter {
                if k2 >= end
                    || !arena[id].is_expandable()
                    || expandable_size(n) >= expandable_size(id)
                {
                    break;
                }
                key = k2;
                id = n;
                index = index.wrapping_add(1);
            }
        }
        let bsize = self.arena[id].size;
        if p.size < self.max_split && bsize >= self.max_split {
            return false;
        }
        if p.size >= self.max_split
            && bsize >= p.size.saturating_add(self.config.max_non_split_rounding())
        {
            return false;
        }
        // The block stays in the set until `alloc_found_block` replaces (split) or removes it.
        p.block = id;
        p.cached_key = Some((key, index));
        true
    }

    fn trigger_free_memory_callbacks(&self) -> bool {
        let mut freed = false;
        for cb in &self.free_callbacks {
            freed |= cb();
        }
        freed
    }

    /// PyTorch's `garbage_collect_cached_blocks`: frees unsplit large blocks of at least the
    /// average age until the excess over the threshold is reclaimed.
    fn garbage_collect_cached_blocks<B: DeviceBackend>(
        &mut self,
        be: &B,
        context: Option<&Frames>,
    ) -> Result<(), AllocError> {
        let threshold = (self.config.garbage_collection_threshold()
            * self.allowed_memory_maximum as f64) as u64;
        if self.total_allocated_memory <= threshold {
            return Ok(());
        }
        let target = self.total_allocated_memory - threshold;
        let mut reclaimed = 0u64;
        let clock = self.pools[LARGE_POOL as usize].get_free_blocks_call_count;
        let mut total_age = 0i64;
        let mut freeable = 0i64;
        for (_, id) in self.pools[LARGE_POOL as usize].blocks.iter() {
            let b = &self.arena[id];
            if !b.is_split() && !b.is_expandable() {
                total_age += clock - b.gc_count_base;
                freeable += 1;
            }
        }
        if freeable == 0 {
            return Ok(());
        }
        let mut block_freed = true;
        while reclaimed < target && block_freed && freeable > 0 {
            let age_threshold = total_age as f64 / freeable as f64;
            block_freed = false;
            let ids: Vec<BlockId> = self.pools[LARGE_POOL as usize].blocks.ids();
            for id in ids {
                let b = &self.arena[id];
                let age = clock - b.gc_count_base;
                if !b.is_split() && !b.is_expandable() && age as f64 >= age_threshold {
                    block_freed = true;
                    reclaimed += b.size;
                    total_age -= age;
                    freeable -= 1;
                    self.release_block(be, id, context)?;
                }
            }
        }
        Ok(())
    }

    /// PyTorch's `alloc_block`: a new segment (or mapped pages) for the request.
    fn alloc_block<B: DeviceBackend>(
        &mut self,
        be: &B,
        p: &mut Params,
        is_retry: bool,
        context: Option<&Frames>,
    ) -> Result<bool, AllocError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
            self.emit_plain(EventAction::AllocRetry, p.stream);
        }
        let size = p.alloc_size;
        if self.set_fraction
            && self.total_allocated_memory.saturating_add(size) > self.allowed_memory_maximum
        {
            return Ok(false);
        }
        if self.config.expandable_segments() {
            return match self
                .try_allocate_expandable_block(be, p.stream, p.sidx, p.pool, p.size, context)?
            {
                Some(id) => {
                    p.block = id;
                    Ok(true)
                }
                None => Ok(false),
            };
        }
        let ptr = match be.malloc(size) {
            Ok(ptr) => ptr,
            Err(e) if e.is_out_of_memory() => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        if let Some(pp) = self.private_pool_of(p.pool) {
            pp.segment_count += 1;
        }
        self.total_allocated_memory += size;
        let small = self.is_small(p.pool);
        let mut b = Block::new(ptr, size, p.stream, p.sidx, p.pool, small);
        b.segment_context = context.cloned();
        let id = self.arena.insert(b);
        inc(&mut self.stats.segment, small, 1);
        inc(&mut self.stats.reserved_bytes, small, size);
        if size >= self.max_split {
            self.stats.oversize_segments.update(1);
        }
        self.stats.num_device_alloc += 1;
        self.record_trace(TraceAction::SegmentAlloc, ptr, size, p.stream, context);
        let flags = if size >= self.max_split {
            FLAG_OVERSIZE
        } else {
            0
        };
        self.emit(
            EventAction::SegmentAlloc,
            p.pool,
            ptr,
            size,
            0,
            p.stream,
            flags,
        );
        p.block = id;
        Ok(true)
    }

    /// PyTorch's `release_available_cached_blocks`: frees cached oversize blocks of this stream
    /// (one at least as large as the request, else the largest ones until enough).
    fn release_available_cached_blocks<B: DeviceBackend>(
        &mut self,
        be: &B,
        p: &Params,
        context: Option<&Frames>,
    ) -> Result<bool, AllocError> {
        if self.max_split == u64::MAX {
            return Ok(false);
        }
        let key_size = p.size.max(self.max_split);
        let pool = &self.pools[p.pool as usize];
        let end = stream_end_key(p.sidx);
        let one = pool
            .blocks
            .iter_from(size_key(p.sidx, key_size, 0))
            .next()
            .filter(|(k, _)| *k < end)
            .map(|(_, id)| id);
        if let Some(id) = one {
            if self.releasable(id) {
                self.release_block(be, id, context)?;
                return Ok(true);
            }
            return Ok(false);
        }
        let candidates: Vec<BlockId> = pool
            .blocks
            .ids_in_rev(size_key(p.sidx, 0, 0), size_key(p.sidx, key_size, 0))
            .into_iter()
            .take_while(|&id| self.arena[id].size >= self.max_split)
            .collect();
        let mut total = 0u64;
        for id in candidates {
            if total >= key_size {
                break;
            }
            if !self.releasable(id) {
                continue;
            }
            total += self.arena[id].size;
            self.release_block(be, id, context)?;
        }
        Ok(total >= key_size)
    }

    /// A whole device segment that can be given back.
    fn releasable(&self, id: BlockId) -> bool {
        let b = &self.arena[id];
        !b.is_split() && !b.is_expandable()
    }

    /// PyTorch's `release_cached_blocks` (what `empty_cache` does).
    pub(crate) fn release_cached_blocks<B: DeviceBackend>(
        &mut self,
        be: &B,
        context: Option<&Frames>,
    ) -> Result<(), AllocError> {
        self.synchronize_and_free_events(be, context)?;
        self.release_blocks(be, LARGE_POOL, context)?;
        self.release_blocks(be, SMALL_POOL, context)?;
        let mut i = 0;
        while i < self.private_pools.len() {
            if self.private_pools[i].use_count > 0 {
                i += 1;
                continue;
            }
            let (small, large) = (self.private_pools[i].small, self.private_pools[i].large);
            self.release_blocks(be, small, context)?;
            self.release_blocks(be, large, context)?;
            if self.private_pools[i].segment_count == 0 {
                let pp = self.private_pools.remove(i);
                for slot in [pp.small, pp.large] {
                    let pool = &mut self.pools[slot as usize];
                    *pool = BlockPool::new(pool.is_small, None);
                    self.free_pool_slots.push(slot);
                }
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// PyTorch's `release_blocks`: every unsplit cached segment of the pool goes back to the
    /// device; free pages of expandable segments are unmapped.
    fn release_blocks<B: DeviceBackend>(
        &mut self,
        be: &B,
        pool: u32,
        context: Option<&Frames>,
    ) -> Result<(), AllocError> {
        let ids: Vec<BlockId> = self.pools[pool as usize].blocks.ids();
        let mut to_unmap = Vec::new();
        for id in ids {
            let b = &self.arena[id];
            if b.is_expandable() {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(be, id, context)?;
            }
        }
        for id in to_unmap {
            let b = &self.arena[id];
            if !b.live || !b.mapped || !b.is_free() {
                continue;
            }
            self.unmap_block(be, id, context)?;
            let b = &self.arena[id];
            if b.live && !b.is_split() && !b.mapped {
                self.release_expandable_segment(be, id)?;
            }
        }
        // Reserved ranges left wholly unmapped (an expansion that ran out of memory) go too.
        let idle: Vec<BlockId> = self.pools[pool as usize]
            .unmapped
            .values()
            .copied()
            .filter(|&id| !self.arena[id].is_split())
            .collect();
        for id in idle {
            self.release_expandable_segment(be, id)?;
        }
        Ok(())
    }

    /// PyTorch's `release_block`: one whole segment back to the device.
    fn release_block<B: DeviceBackend>(
        &mut self,
        be: &B,
        id: BlockId,
        context: Option<&Frames>,
    ) -> Result<(), AllocError> {
        let (addr, size, stream, pool) = {
            let b = &self.arena[id];
            (b.addr, b.size, b.stream, b.pool)
        };
        self.stats.num_device_free += 1;
        let seg_ctx = self.arena[id].segment_context.clone();
        self.record_trace(
            TraceAction::SegmentFree,
            addr,
            size,
            stream,
            context.or(seg_ctx.as_ref()),
        );
        be.free(addr)?;
        self.total_allocated_memory -= size;
        if let Some(pp) = self.private_pool_of(pool) {
            pp.segment_count -= 1;
        }
        let small = self.is_small(pool);
        dec(&mut self.stats.segment, small, 1);
        dec(&mut self.stats.reserved_bytes, small, size);
        let flags = if size >= self.max_split {
            self.stats.oversize_segments.update(-1);
            FLAG_OVERSIZE
        } else {
            0
        };
        self.emit(EventAction::SegmentFree, pool, addr, size, 0, stream, flags);
        self.remove_from_blocks(id);
        self.arena.remove(id);
        Ok(())
    }

    // ---------------------------------------------------------------- found block, free

    /// PyTorch's `alloc_found_block`: split off the front when asked, account, record.
    #[inline(always)]
    fn alloc_found_block(
        &mut self,
        p: &Params,
        orig_size: u64,
        context: Option<Frames>,
        split: bool,
        cached: bool,
    ) -> BlockId {
        let size = p.size;
        let mut id = p.block;
        let (pool, small, already_split, expandable, bsize_before) = {
            let b = &self.arena[id];
            (b.pool, b.small, b.is_split(), b.is_expandable(), b.size)
        };
        if split {
            // As in PyTorch, the front piece is a new block and the remainder keeps the old
            // one's fields (its stale `requested` size, and the segment's allocation context,
            // which snapshots then no longer show for the split segment).
            let remaining = id;
            id = self.arena.split_front(remaining, size, p.stream);
            match p.cached_key {
                Some((old, hint)) => self.reinsert_into_blocks(remaining, old, hint),
                None => self.insert_into_blocks(remaining),
            }
            if !expandable {
                if already_split {
                    dec(&mut self.stats.inactive_split_bytes, small, size);
                } else {
                    inc(
                        &mut self.stats.inactive_split_bytes,
                        small,
                        bsize_before - size,
                    );
                    inc(&mut self.stats.inactive_split, small, 1);
                }
            }
        } else {
            if let Some((key, hint)) = p.cached_key {
                self.pools[pool as usize].blocks.remove_at_hint(key, hint);
            }
            if already_split && !expandable {
                dec(&mut self.stats.inactive_split_bytes, small, bsize_before);
                dec(&mut self.stats.inactive_split, small, 1);
            }
        }

        let (addr, bsize, stream) = {
            let b = &mut self.arena[id];
            b.allocated = true;
            b.requested = orig_size;
            b.context = context;
            b.context_id = self.call_context;
            (b.addr, b.size, b.stream)
        };
        self.allocated.insert(addr, id);
        let s = &mut self.stats;
        inc(&mut s.allocation, small, 1);
        inc(&mut s.allocated_bytes, small, bsize);
        inc(&mut s.active, small, 1);
        inc(&mut s.active_bytes, small, bsize);
        inc(&mut s.requested_bytes, small, orig_size);
        if bsize >= self.max_split {
            s.oversize_allocations.update(1);
        }
        if self.observing {
            if self.publishing {
                // The block's context id is the call's, just set.
                let e = EventFields {
                    addr,
                    size: bsize,
                    requested: orig_size,
                    stream,
                    pool,
                    small,
                    context: self.call_context,
                    flags: cached_flag(cached) | self.block_flags(expandable, bsize),
                };
                self.push_event(EventAction::Alloc, &e);
            }
            if self.tracing_now {
                self.trace_block(TraceAction::Alloc, id, None);
            }
        }
        id
    }

    /// A block's trace entry, with the call's context, else the block's allocation context.
    #[cold]
    #[inline(never)]
    fn trace_block(&mut self, trace: TraceAction, id: BlockId, context: Option<&Frames>) {
        let b = &self.arena[id];
        let (addr, requested, stream) = (b.addr, b.requested, b.stream);
        let ctx = context.cloned().or_else(|| b.context.clone());
        self.push_trace(trace, addr, requested, stream, ctx.as_ref());
    }

    /// PyTorch's `free`: allocated drops now; the block is cached now or once other streams
    /// are done with it.
    #[inline]
    pub(crate) fn free<B: DeviceBackend>(
        &mut self,
        be: &B,
        ptr: DevicePtr,
        context: Option<Frames>,
    ) -> Result<(), AllocError> {
        let id = self
            .allocated
            .remove(ptr)
            .ok_or(AllocError::InvalidPointer(ptr))?;
        let (size, small) = {
            let b = &mut self.arena[id];
            b.allocated = false;
            (b.size, b.small)
        };
        debug_assert_eq!(small, self.is_small(self.arena[id].pool));
        dec(&mut self.stats.allocation, small, 1);
        dec(&mut self.stats.allocated_bytes, small, size);
        if size >= self.max_split {
            self.stats.oversize_allocations.update(-1);
        }
        if !self.arena[id].stream_uses.is_empty() {
            if self.observing {
                if self.tracing_now {
                    self.trace_block(TraceAction::FreeRequested, id, context.as_ref());
                }
                if self.publishing {
                    self.publish_block(EventAction::FreeRequested, id);
                }
            }
            if !self.captures.is_empty() {
                self.deferred_until_no_capture.push(id);
            } else {
                self.insert_events(be, id)?;
            }
        } else {
            // Requested and completed at once: two trace entries, one event.
            if self.tracing_now {
                self.trace_block(TraceAction::FreeRequested, id, context.as_ref());
            }
            self.free_block(id, EventAction::Free, context.as_ref());
        }
        Ok(())
    }

    /// PyTorch's `free_block`: back to the free set, merged with free neighbours. `event` is
    /// the block's event: [`EventAction::FreeCompleted`], or [`EventAction::Free`] when the
    /// program's free completes in the same call.
    #[inline(always)]
    fn free_block(&mut self, id: BlockId, event: EventAction, context: Option<&Frames>) {
        let (size, requested, pool, small, expandable) = {
            let b = &self.arena[id];
            (b.size, b.requested, b.pool, b.small, b.is_expandable())
        };
        if self.observing {
            if self.publishing {
                let slot = self.event_slot();
                let b = &self.arena[id];
                let (addr, stream, block_context) = (b.addr, b.stream, b.context_id);
                let e = EventFields {
                    addr,
                    size,
                    requested,
                    stream,
                    pool,
                    small,
                    context: self.event_context(block_context),
                    flags: self.block_flags(expandable, size),
                };
                self.write_event(slot, event, &e);
            }
            if self.tracing_now {
                self.trace_block(TraceAction::FreeCompleted, id, context);
            }
        }
        self.arena[id].context = None;
        let m = self.arena.merge_free_neighbours(id);
        match m.absorbed {
            [None, None] => self.insert_into_blocks(id),
            [Some(old), None] | [None, Some(old)] => {
                self.reinsert_into_blocks(id, old, usize::MAX);
            }
            [Some(before), Some(after)] => {
                self.pools[pool as usize].blocks.remove(&before);
                self.reinsert_into_blocks(id, after, usize::MAX);
            }
        }
        let mut net_blocks = -m.blocks;
        let mut net_size = -(m.bytes as i64);
        if m.split {
            net_blocks += 1;
            net_size += (size + m.bytes) as i64;
        }
        let s = &mut self.stats;
        if !expandable {
            update(&mut s.inactive_split, small, net_blocks);
            update(&mut s.inactive_split_bytes, small, net_size);
        }
        dec(&mut s.active, small, 1);
        dec(&mut s.active_bytes, small, size);
        dec(&mut s.requested_bytes, small, requested);
    }

    /// PyTorch's `try_merge_blocks`: `dst` absorbs `src` when `src` is free and in the same
    /// mapped state. Returns the bytes absorbed.
    fn try_merge_blocks(&mut self, dst: BlockId, src: BlockId) -> u64 {
        if !self.arena.mergeable(dst, src) {
            return 0;
        }
        let s = &self.arena[src];
        let pool = &mut self.pools[s.pool as usize];
        if s.mapped {
            pool.blocks.remove(&size_key(s.sidx, s.size, s.addr));
        } else {
            pool.unmapped.remove(&(s.stream.0, s.addr));
        }
        self.arena.absorb(dst, src)
    }

    // ---------------------------------------------------------------- streams and events

    /// `record_stream`: another stream uses the block.
    pub(crate) fn record_stream(
        &mut self,
        ptr: DevicePtr,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        let id = self
            .allocated
            .get(ptr)
            .ok_or(AllocError::InvalidPointer(ptr))?;
        let b = &mut self.arena[id];
        if stream == b.stream {
            return Ok(());
        }
        if !b.stream_uses.contains(&stream) {
            b.stream_uses.push(stream);
        }
        if !self.captures.is_empty() {
            let uses = self.cudagraph_stream_uses.entry(id).or_default();
            if !uses.contains(&stream) {
                uses.push(stream);
            }
        }
        Ok(())
    }

    fn get_event<B: DeviceBackend>(&mut self, be: &B) -> Result<EventId, DeviceError> {
        match self.event_pool.pop() {
            Some(e) => Ok(e),
            None => be.create_event(),
        }
    }

    /// PyTorch's `insert_events`: one event per using stream.
    fn insert_events<B: DeviceBackend>(&mut self, be: &B, id: BlockId) -> Result<(), AllocError> {
        let streams = std::mem::take(&mut self.arena[id].stream_uses);
        for s in streams {
            let ev = self.get_event(be)?;
            if let Err(e) = be.record_event(ev, s) {
                // Not recorded: the event goes back to the pool rather than being lost.
                self.event_pool.push(ev);
                return Err(e.into());
            }
            self.arena[id].event_count += 1;
            self.events.entry(s).or_default().push_back((ev, id));
            self.pending_events += 1;
        }
        Ok(())
    }

    fn insert_events_deferred_until_no_capture<B: DeviceBackend>(
        &mut self,
        be: &B,
        context: Option<&Frames>,
    ) -> Result<(), AllocError> {
        if self.deferred_until_no_capture.is_empty() {
            return Ok(());
        }
        let blocks = std::mem::take(&mut self.deferred_until_no_capture);
        for id in blocks {
            // Streams recorded during the capture are done with the block by now.
            if let Some(graph_uses) = self.cudagraph_stream_uses.remove(&id) {
                self.arena[id]
                    .stream_uses
                    .retain(|s| !graph_uses.contains(s));
            }
            self.insert_events(be, id)?;
            if self.arena[id].event_count == 0 {
                self.free_block(id, EventAction::FreeCompleted, context);
            }
        }
        Ok(())
    }

    /// What `malloc` does first: [`process_events`](Self::process_events) when events are
    /// outstanding, unless a graph capture is under way (PyTorch defers them then).
    #[inline]
    pub(crate) fn process_ready_events<B: DeviceBackend>(
        &mut self,
        be: &B,
        context: Option<&Frames>,
    ) -> Result<(), AllocError> {
        if self.captures.is_empty()
            && (self.pending_events > 0 || !self.deferred_until_no_capture.is_empty())
        {
            self.process_events(be, context)?;
        }
        Ok(())
    }

    /// PyTorch's `process_events`: completed events, per stream in FIFO order, complete their
    /// blocks' frees.
    #[cold]
    #[inline(never)]
    fn process_events<B: DeviceBackend>(
        &mut self,
        be: &B,
        context: Option<&Frames>,
    ) -> Result<(), AllocError> {
        self.insert_events_deferred_until_no_capture(be, context)?;
        if self.pending_events == 0 {
            return Ok(());
        }
        let mut events = std::mem::take(&mut self.events);
        let mut result = Ok(());
        'streams: for queue in events.values_mut() {
            while let Some(&(ev, id)) = queue.front() {
                match be.query_event(ev) {
                    Ok(false) => break,
                    Ok(true) => {}
                    Err(e) => {
                        result = Err(e.into());
                        break 'streams;
                    }
                }
                queue.pop_front();
                self.event_done(ev, id, context);
            }
        }
        events.retain(|_, q| !q.is_empty());
        self.events = events;
        result
    }

    /// PyTorch's `synchronize_and_free_events`: wait for every outstanding event.
    ///
    /// An event leaves its queue only once waited for: when a wait fails, it and the events
    /// after it stay pending (their blocks are not lost), for the next `malloc`, `empty_cache`
    /// or retry.
    fn synchronize_and_free_events<B: DeviceBackend>(
        &mut self,
        be: &B,
        context: Option<&Frames>,
    ) -> Result<(), AllocError> {
        self.stats.num_sync_all_streams += 1;
        self.emit_plain(EventAction::SyncAllStreams, StreamId::DEFAULT);
        self.insert_events_deferred_until_no_capture(be, context)?;
        while let Some((stream, ev, id)) = self
            .events
            .iter()
            .find_map(|(s, q)| q.front().map(|&(ev, id)| (*s, ev, id)))
        {
            be.synchronize_event(ev)?;
            if let Some(queue) = self.events.get_mut(&stream) {
                queue.pop_front();
                if queue.is_empty() {
                    self.events.remove(&stream);
                }
            }
            self.event_done(ev, id, context);
        }
        Ok(())
    }

    /// Event `ev`, taken off its queue, completed for block `id`: back to the pool, and the
    /// block's free completes with its last event.
    fn event_done(&mut self, ev: EventId, id: BlockId, context: Option<&Frames>) {
        self.pending_events -= 1;
        self.event_pool.push(ev);
        let b = &mut self.arena[id];
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(id, EventAction::FreeCompleted, context);
        }
    }

    /// Destroys every event (at drop): the pooled ones, and those still queued behind work on
    /// their streams (a wait that failed left them there; their blocks stay allocated).
    pub(crate) fn destroy_events<B: DeviceBackend>(&mut self, be: &B) {
        let queued = std::mem::take(&mut self.events)
            .into_values()
            .flatten()
            .map(|(ev, _)| ev);
        for ev in self.event_pool.drain(..).chain(queued) {
            let _ = be.destroy_event(ev);
        }
        self.pending_events = 0;
    }

    /// Lets go of the trace trackers and stops the history (at drop): no user code runs from
    /// a destructor, where a tracker's panic (its receiver dropped first) could abort a
    /// process already unwinding.
    pub(crate) fn stop_tracing(&mut self) {
        self.trackers.clear();
        self.record_history = false;
        self.tracing_changed();
    }
}
