//! The compact events allocators publish to an observer (the agent), and the sink they publish
//! into.
//!
//! An [`Event`] is a 64-byte `Copy` value: building one never allocates, and publishing it is one
//! call to [`EventSink::publish`], or one [`EventSink::publish_batch`] for up to [`MAX_BATCH`]
//! events, which must never block, lock, or allocate (the agent's sink is a pair of bounded
//! channels with `try_send`; a full channel drops the events and counts them).
//!
//! The caching allocator gathers its events under its lock and publishes them in batches (see
//! `caching/allocator.rs` for when), one event per trace entry it makes (same points, same
//! addresses; a free that completes in the same call, whose trace has a `free_requested` and a
//! `free_completed` entry, is one [`EventAction::Free`] event), plus [`EventAction::AllocRetry`]
//! and [`EventAction::SyncAllStreams`] for the counters that have no trace entry, so a consumer that mirrors segments and blocks from the
//! events can recompute every `DeviceStats` figure the allocator keeps.

pub(crate) mod clock;

/// What an event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EventAction {
    /// A block was handed out: `addr`, `size` = block size, `requested` = request.
    Alloc = 0,
    /// The program freed a block: `addr`, `size` = block size, `requested` = request.
    FreeRequested = 1,
    /// A block went back to the free set: `addr`, `size` = block size.
    FreeCompleted = 2,
    /// A segment was allocated from the device: `addr`, `size`.
    SegmentAlloc = 3,
    /// A segment was returned to the device: `addr`, `size`.
    SegmentFree = 4,
    /// Pages were mapped at the end of an expandable segment: `addr`, `size` of the new range.
    SegmentMap = 5,
    /// Pages were unmapped from an expandable segment: `addr`, `size` of the range.
    SegmentUnmap = 6,
    /// An allocation failed: `size` = rounded request, `requested` = request, `addr` = device
    /// free bytes.
    Oom = 7,
    /// The allocator freed its cache and retried (counts in `num_alloc_retries`).
    AllocRetry = 8,
    /// The allocator synchronized all streams (counts in `num_sync_all_streams`).
    SyncAllStreams = 9,
    /// A snapshot was taken.
    Snapshot = 10,
    /// A user annotation; `context` names it.
    UserDefined = 11,
    /// Peak statistics were reset by the program.
    ResetPeaks = 12,
    /// Accumulated statistics were reset by the program.
    ResetAccumulated = 13,
    /// The program freed a block and it went back to the free set in the same call (no other
    /// stream had used it): `addr`, `size` = block size, `requested` = request. It stands for a
    /// `FreeRequested` and a `FreeCompleted` at one time, in one event instead of two (the
    /// caching allocator's usual free).
    Free = 14,
}

impl EventAction {
    /// Number of actions (for per-action counters).
    pub const COUNT: usize = 15;

    /// A stable short name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventAction::Alloc => "alloc",
            EventAction::FreeRequested => "free_requested",
            EventAction::FreeCompleted => "free_completed",
            EventAction::SegmentAlloc => "segment_alloc",
            EventAction::SegmentFree => "segment_free",
            EventAction::SegmentMap => "segment_map",
            EventAction::SegmentUnmap => "segment_unmap",
            EventAction::Oom => "oom",
            EventAction::AllocRetry => "alloc_retry",
            EventAction::SyncAllStreams => "sync_all_streams",
            EventAction::Snapshot => "snapshot",
            EventAction::UserDefined => "user_defined",
            EventAction::ResetPeaks => "reset_peaks",
            EventAction::ResetAccumulated => "reset_accumulated",
            EventAction::Free => "free",
        }
    }

    /// The action with this discriminant.
    pub fn from_u8(v: u8) -> Option<EventAction> {
        use EventAction::*;
        [
            Alloc,
            FreeRequested,
            FreeCompleted,
            SegmentAlloc,
            SegmentFree,
            SegmentMap,
            SegmentUnmap,
            Oom,
            AllocRetry,
            SyncAllStreams,
            Snapshot,
            UserDefined,
            ResetPeaks,
            ResetAccumulated,
            Free,
        ]
        .get(v as usize)
        .copied()
    }
}

/// Which pool an event's block or segment belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EventPool {
    /// Small pool (rounded requests of at most 1 MiB).
    Small = 0,
    /// Large pool.
    Large = 1,
    /// Not a device pool: a CPU allocation (tracking allocator, instrumented heap).
    Host = 2,
}

/// Device number used for CPU events.
pub const CPU_DEVICE: i16 = -1;

/// Flag bit: the block or segment is part of an expandable segment.
pub const FLAG_EXPANDABLE: u8 = 1;
/// Flag bit: the block or segment belongs to a private pool (graph capture); `pool_id` names it.
pub const FLAG_PRIVATE_POOL: u8 = 1 << 1;
/// Flag bit: the block is oversize (at least `max_split_size`).
pub const FLAG_OVERSIZE: u8 = 1 << 2;
/// Flag bit: the allocation was served from the cache (no device call).
pub const FLAG_CACHED: u8 = 1 << 3;

/// One compact event: 64 bytes, `Copy`, built without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Event {
    /// Time of the event in nanoseconds since the Unix epoch (see [`now_ns`]).
    pub time_ns: u64,
    /// Address of the block or segment (for `Oom`: the device's free bytes).
    pub addr: u64,
    /// Size in bytes (block or segment size; for `Oom`, the rounded request).
    pub size: u64,
    /// Requested size (for `Alloc`, `FreeRequested`, `Free`, `Oom`), else 0.
    pub requested: u64,
    /// Stream the operation ran on (0 is the default stream).
    pub stream: u64,
    /// Private pool id (first half of PyTorch's `(id, id)` pair), 0 for the default pools.
    pub pool_id: u64,
    /// How long the allocator call took, in nanoseconds (0 when not measured).
    pub latency_ns: u32,
    /// Id of the stack frames (context) behind the event, 0 for none. The caching allocator
    /// gives the frames its context provider returned for the call an id (see
    /// [`CachingAllocator::context_frames`](crate::caching::CachingAllocator::context_frames));
    /// a block's event of a call that gathered none carries the id of the block's allocation.
    pub context: u32,
    /// Device index, or [`CPU_DEVICE`].
    pub device: i16,
    /// What happened.
    pub action: EventAction,
    /// Small, large or host.
    pub pool: EventPool,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// Padding kept zero (and room to grow without changing the size).
    pub _reserved: [u8; 3],
}

const _: () = assert!(std::mem::size_of::<Event>() == 64);

impl Event {
    /// Every field zero (action `Alloc`, pool `Small`): the filler of unused slots in batches.
    pub const EMPTY: Event = Event::new(EventAction::Alloc, 0, EventPool::Small, 0, 0);

    /// An event with every field zero but the ones given.
    #[inline]
    pub const fn new(
        action: EventAction,
        device: i16,
        pool: EventPool,
        addr: u64,
        size: u64,
    ) -> Event {
        Event {
            time_ns: 0,
            addr,
            size,
            requested: 0,
            stream: 0,
            pool_id: 0,
            latency_ns: 0,
            context: 0,
            device,
            action,
            pool,
            flags: 0,
            _reserved: [0; 3],
        }
    }
}

/// Where allocators publish events.
///
/// Implementations must never block, take a lock that an allocator could hold, or allocate: the
/// call sits on the allocator's hot path (and, for the instrumented global allocator, inside
/// `GlobalAlloc::alloc`). Dropping the event and counting the drop is the right answer to a full
/// buffer.
pub trait EventSink: Send + Sync {
    /// Publishes one event.
    fn publish(&self, event: &Event);

    /// Publishes a batch of one producer's events, in order: at most [`MAX_BATCH`] events that
    /// an allocator gathered under its own lock (the caching allocator publishes this way, so a
    /// channel operation is paid per batch rather than per event). The same rules as
    /// [`publish`](Self::publish) apply; the default publishes the events one by one.
    fn publish_batch(&self, events: &[Event]) {
        for e in events {
            self.publish(e);
        }
    }

    /// Whether anyone listens; allocators may skip building events when this is false.
    fn enabled(&self) -> bool {
        true
    }
}

/// Most events an allocator passes to one [`EventSink::publish_batch`] call (32 events, 2 KiB).
pub const MAX_BATCH: usize = 32;

/// Nanoseconds since the Unix epoch from a monotonic clock anchored once per process: cheap
/// (one time-stamp counter read where the CPU's counter is invariant, else the vDSO monotonic
/// clock; see `event/clock.rs`), never goes backwards, and comparable with the microsecond
/// `time_us` of PyTorch's trace entries.
#[inline]
pub fn now_ns() -> u64 {
    clock::now_ns()
}

/// Whether [`now_ns`] reads the CPU's time-stamp counter (one `rdtsc`, scaled) rather than the
/// vDSO's `CLOCK_MONOTONIC`. The counter takes over about 50 ms after the first read where the
/// CPU's counter is invariant and the kernel uses it as its clocksource; until then, and
/// elsewhere, the answer is false.
pub fn clock_uses_counter() -> bool {
    clock::uses_counter()
}
