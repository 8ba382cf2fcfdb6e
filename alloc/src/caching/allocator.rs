//! `CachingAllocator`: PyTorch's CUDA caching allocator over any [`DeviceBackend`].
//!
//! The algorithm is PyTorch 2.x's `DeviceCachingAllocator` (c10/cuda/CUDACachingAllocator.cpp),
//! rule by rule: requests round up
//! ([`AllocatorConfig::round_size`]), go to the small pool (rounded size up to 1 MiB) or the
//! large pool, and take the best-fitting cached block of the same stream, ordered by
//! `(stream, size, address)`; when none fits, a new segment comes from the device (2 MiB for
//! small requests, 20 MiB for 1-10 MiB, else the request rounded to 2 MiB), then the cache is
//! freed and the device asked again. Blocks split (the allocated piece is the front) and merge
//! with free neighbours on free. Frees of blocks used by other streams wait for events.
//!
//! # Locking
//! One lock protects the whole state (one device per allocator). Stack context is gathered
//! before it is taken, OOM observers are called after it is released; trace trackers, free
//! memory callbacks, stream filters and the event sink run under it and must not call back
//! into the allocator. The lock (`caching/state_lock.rs`) unlocks with a plain store, and is
//! biased to the first thread that takes it: that thread enters with a store and a load, no
//! atomic read-modify-write, until another thread takes the lock once (which revokes the bias
//! for good with one `membarrier`). Where `membarrier` is unavailable it is a plain futex
//! mutex.
//!
//! # Events
//! With an event sink set ([`CachingAllocator::set_event_sink`]), every call makes the events
//! below, in the order the allocator did the work, and gathers them under the lock into a batch
//! that goes to [`EventSink::publish_batch`] still under
//! the lock (so events of different threads never interleave out of order). A batch is
//! published at the end of a call when it has fewer than two free places left (it holds
//! [`MAX_BATCH`](crate::event::MAX_BATCH) = 32), when the call started 1 ms or more after the
//! batch's first event (or the clock switched to the time-stamp counter since), when it holds
//! an `Oom`, `Snapshot`, `ResetPeaks` or `ResetAccumulated` event (which observers act on at
//! once), on [`CachingAllocator::flush_events`], when the sink is changed, and when the
//! allocator is dropped. So a sink sees a busy allocator's events within
//! about a millisecond, one sink call per ~30 events, while an allocator that stops calling
//! keeps its last few block events until one of those happens, or until an observer collects
//! them with [`CachingAllocator::try_flush_events`] (the agent's aggregator does, once a tick,
//! when the allocator [`holds_events`](CachingAllocator::holds_events) and its device went
//! quiet). The sink's
//! [`enabled`](crate::event::EventSink::enabled) is asked when a batch is published (a batch
//! gathered while it turned false is dropped) and, while it says false, at the start of every
//! call, which then makes no events.
//!
//! `time_ns` is the call's start: the call stamps the clock once, with the bare time-stamp
//! counter where [`now_ns`](crate::event::now_ns) uses it, and the stamps are turned into
//! nanoseconds when the batch is published. `latency_ns` is the time the whole call took on
//! one call in 16, drawn at random (a second stamp at the call's end;
//! [`CachingAllocator::set_event_latency_sampling`] changes the rate), and 0 ("not measured")
//! on the others: latency histograms are built from a random sample, and the hot path reads
//! the clock once per call instead of twice. `device` the allocator's device, `stream`
//! the stream of the block or segment, `pool` `Small`/`Large`, `flags` carry
//! [`FLAG_EXPANDABLE`](crate::event::FLAG_EXPANDABLE) (block or pages of an expandable segment),
//! [`FLAG_PRIVATE_POOL`](crate::event::FLAG_PRIVATE_POOL) with `pool_id` = the private pool's
//! first id, [`FLAG_OVERSIZE`](crate::event::FLAG_OVERSIZE) (size >= `max_split_size`) and
//! [`FLAG_CACHED`](crate::event::FLAG_CACHED) (an `Alloc` served without a device call).
//! `context` is the id of the frames the context provider gave the call (gathered as
//! [`record_history`](CachingAllocator::record_history)'s context level says) or, for a block's
//! event of a call that gathered none, of the block's allocation; 0 when there are none. Ids
//! are made only while a sink is set (the frames' content hash is taken before the lock, the
//! id under it), equal frames share one, and
//! [`CachingAllocator::context_frames`] turns the last
//! [`CONTEXT_TABLE_CAPACITY`](crate::caching::CONTEXT_TABLE_CAPACITY) back into frames.
//!
//! | action | when | `addr` | `size` | `requested` |
//! |---|---|---|---|---|
//! | `SegmentAlloc` | a device segment was allocated | segment | segment size | 0 |
//! | `SegmentFree` | a whole segment went back to the device | segment | segment size | 0 |
//! | `SegmentMap` | pages were mapped into an expandable segment | first page | bytes mapped | 0 |
//! | `SegmentUnmap` | whole free pages were unmapped | first page | bytes unmapped | 0 |
//! | `Alloc` | a block was handed out | block | block size after any split (includes an unsplit remainder) | request |
//! | `FreeRequested` | the program freed a block | block | block size | request |
//! | `FreeCompleted` | the block went back to the free set | block, before merging | block size before merging | request |
//! | `Free` | the program freed a block and it went back to the free set in the same call (no other stream used it): a `FreeRequested` and a `FreeCompleted` in one event | block, before merging | block size before merging | request |
//! | `AllocRetry` | the cache was flushed and the device asked again (`num_alloc_retries`) | 0 | 0 | 0 |
//! | `SyncAllStreams` | all outstanding events were waited for (`num_sync_all_streams`) | 0 | 0 | 0 |
//! | `Oom` | an allocation failed (`num_ooms`) | device free bytes | rounded request | request |
//! | `Snapshot`, `UserDefined`, `ResetPeaks`, `ResetAccumulated` | as named | 0 | 0 | 0 |
//!
//! A consumer mirrors segments and blocks from these: an `Alloc` inside a free block of the
//! mirror takes its front `size` bytes (the rest stays free); `FreeCompleted` (and `Free`, a
//! request and its completion at once) frees the block and
//! merges it with free, mapped-alike neighbours of the same segment (a block between
//! `FreeRequested` and `FreeCompleted` is pending, not free); `SegmentMap` adds free pages that
//! merge with a free neighbour. Stats then follow the spec: `allocated_*` drop at
//! `FreeRequested`, `active_*` and `requested_bytes` at `FreeCompleted`; expandable segments
//! count in `reserved_bytes` but not in `segment` or `inactive_split*`. With no sink set the
//! cost is one branch per event point.
//!
//! # Performance
//! The cached path takes the one lock, searches the pool's free set (a sorted vector, a
//! `BTreeMap` past 64 entries, keyed by `(stream index, size, address)` packed into a `u128`)
//! once, and changes it once per call: a split's remainder and a merge's grown block take the
//! old entry's place (in place when the order allows, as it usually does), the found block's
//! index travels with it so that the change needs no second search. Blocks live in a slab
//! indexed by `u32`, allocated blocks in an open-addressing table, and events in a reused
//! batch, so a warm cached malloc/free allocates nothing (`tests/caching_no_alloc.rs`).
//! The stat arrays update one pool entry and the `all` peak; `all`'s other figures are the
//! pools' sums, filled in when stats are read. Observing sits behind one flag, so the
//! unobserved path carries none of it; trace entries are made in cold helpers. A call reads the
//! clock only when something observes it: once at its start for its trace entries and events
//! (a raw time-stamp counter read, scaled later), and once more at its end on the calls that
//! measure their latency. Events are written in place into a reused batch of 32, the hot
//! path's block events from values the call already read, so a sink costs one
//! `publish_batch` per ~30 events. Trace entries are
//! built in one reused entry, so trackers alone clone no frames.
//!
//! # Differences from PyTorch
//! - `release_lock_on_cudamalloc` is parsed and reported but the lock is held across device
//!   calls.
//! - Cross-stream events are processed per stream in stream order (PyTorch walks a hash map).
//! - `empty_cache` also gives back expandable address ranges left wholly unmapped by a failed
//!   expansion (PyTorch keeps them for reuse).
//! - Dropping a `CachingAllocator` gives its cache back to the device (see its `Drop`);
//!   PyTorch's allocator lives as long as the process.
//! - `begin_allocate_to_pool` on a pool already recording replaces its stream filter, and
//!   `end_allocate_to_pool` / `release_pool` on unknown pools are ignored with a warning,
//!   where PyTorch raises.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::caching::backend::{DeviceBackend, DevicePtr, StreamId};
use crate::caching::config::AllocatorConfig;
use crate::caching::context_table::frames_hash;
use crate::caching::device_allocator::{DeviceCachingAllocator, MallocFailure};
use crate::caching::error::{AllocError, OomInfo};
use crate::caching::history::{ContextLevel, HistoryOptions};
use crate::caching::pool::PoolId;
use crate::caching::state_lock::{StateGuard, StateLock};
use crate::caching::stats::DeviceStats;
use crate::caching::summary::format_memory_summary;
use crate::event::{EventAction, EventSink};
use crate::snapshot::{DeviceMeta, Frame, Frames, Snapshot, TraceAction, TraceEntry};

/// Requests of this size (128 TiB) or more are refused outright, beyond any device (PyTorch
/// refuses from 1 EiB; the free-set keys hold sizes below 256 TiB exactly).
pub const MAX_REQUEST: u64 = 1 << 47;

/// A context provider: returns the frames to attach to a block or trace entry.
pub type ContextProvider = Arc<dyn Fn() -> Frames + Send + Sync>;

/// Cache figures (`torch.cuda` `cacheInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheInfo {
    /// `reserved - allocated`.
    pub cached_bytes: u64,
    /// The largest free cached block.
    pub largest_free_block: u64,
}

/// PyTorch's CUDA caching allocator for one device, over a [`DeviceBackend`].
///
/// # Examples
/// ```
/// use allocview_alloc::caching::backend::StreamId;
/// use allocview_alloc::caching::sim::SimBackend;
/// use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
///
/// let a = CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default());
/// let p = a.malloc(1000, StreamId::DEFAULT).unwrap();
/// // 1,000 bytes round up to 1,024, carved from a new 2 MiB small-pool segment.
/// assert_eq!(a.device_stats().allocated_bytes.0[0].current, 1024);
/// assert_eq!(a.base_allocation(p), Some((p, 2 << 20)));
/// a.free(p).unwrap();
/// a.empty_cache().unwrap();
/// assert_eq!(a.backend().used(), 0);
/// ```
pub struct CachingAllocator<B: DeviceBackend> {
    backend: B,
    state: StateLock<DeviceCachingAllocator>,
    /// The context level, readable without the lock (gathering happens before it).
    context_level: AtomicU8,
    /// Whether events wait in the batch (the state's flag, shared).
    holding: Arc<AtomicBool>,
    /// Whether an event sink is set, readable without the lock: gathered frames are hashed
    /// (for their context id) only then.
    has_sink: AtomicBool,
    provider: Mutex<Option<ContextProvider>>,
}

impl<B: DeviceBackend> CachingAllocator<B> {
    /// An allocator for the backend's device.
    pub fn new(backend: B, config: AllocatorConfig) -> Self {
        let device = backend.device();
        let state = DeviceCachingAllocator::new(device, config);
        CachingAllocator {
            backend,
            holding: state.holding.clone(),
            has_sink: AtomicBool::new(false),
            state: StateLock::new(state),
            context_level: AtomicU8::new(ContextLevel::Never as u8),
            provider: Mutex::new(None),
        }
    }

    /// The device backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The device index.
    pub fn device(&self) -> i32 {
        self.lock().device
    }

    /// The settings.
    pub fn config(&self) -> AllocatorConfig {
        self.lock().config.clone()
    }

    #[inline]
    fn lock(&self) -> StateGuard<'_, DeviceCachingAllocator> {
        self.state.lock()
    }

    /// Calls the context provider when the context level is at least `level`.
    #[inline]
    fn gather(&self, level: ContextLevel) -> Option<Frames> {
        if self.context_level.load(Ordering::Relaxed) < level as u8 {
            return None;
        }
        self.call_provider()
    }

    /// The content hash of the call's gathered frames, for their context id in events: taken
    /// before the lock, and only while a sink is set (a sink set meanwhile sees the call
    /// without an id).
    #[inline]
    fn context_hash(&self, context: Option<&Frames>) -> Option<u64> {
        context
            .filter(|_| self.has_sink.load(Ordering::Relaxed))
            .map(frames_hash)
    }

    /// The context provider's frames (the provider is cloned out of its lock first).
    #[cold]
    fn call_provider(&self) -> Option<Frames> {
        let provider = self
            .provider
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        provider.map(|f| f())
    }

    /// Allocates `size` bytes for use on `stream`.
    ///
    /// A request of 0 bytes gets a 512-byte block, as every request below 512 does (PyTorch's
    /// front end answers 0 bytes with a null pointer without calling its allocator, so its
    /// traces hold no such request). [`malloc_owned`](Self::malloc_owned) returns a block
    /// that frees itself.
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] when no cached block fits and the device has no room even
    /// after the cache is freed (OOM observers have been called); [`AllocError::Device`] for
    /// other device failures; [`AllocError::InvalidArgument`] for a request of [`MAX_REQUEST`] bytes or more.
    pub fn malloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        if size >= MAX_REQUEST {
            return Err(AllocError::InvalidArgument(format!(
                "request of {size} bytes is 128 TiB or more"
            )));
        }
        let context = self.gather(ContextLevel::State);
        let hash = self.context_hash(context.as_ref());
        let mut st = self.lock();
        st.begin_call(context.as_ref().zip(hash));
        let r = st.malloc(&self.backend, size, stream, context);
        st.end_call();
        match r {
            Ok(p) => Ok(p),
            Err(MallocFailure::Error(e)) => Err(e),
            Err(MallocFailure::Oom(failure)) => {
                drop(st);
                let (oom, info, observers) = *failure;
                for o in &observers {
                    o(&info);
                }
                Err(AllocError::OutOfMemory(Box::new(oom)))
            }
        }
    }

    /// Frees a pointer [`malloc`](Self::malloc) returned.
    ///
    /// # Errors
    /// [`AllocError::InvalidPointer`] for an unknown pointer or a double free;
    /// [`AllocError::Device`] when recording a stream event fails.
    pub fn free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        let context = self.gather(ContextLevel::All);
        let hash = self.context_hash(context.as_ref());
        let mut st = self.lock();
        st.begin_call(context.as_ref().zip(hash));
        // The success path builds its own `Ok` rather than moving the call's result past
        // `end_call`: a stack copy of the whole `Result` (sized for `AllocError`) right after
        // the narrow store that wrote it stalls on store forwarding.
        match st.free(&self.backend, ptr, context) {
            Ok(()) => {
                st.end_call();
                Ok(())
            }
            Err(e) => {
                st.end_call();
                Err(e)
            }
        }
    }

    /// Notes that `stream` uses the block at `ptr`: its free will wait for the stream's work.
    ///
    /// The stream is not checked here: the free records an event on it, and a stream the
    /// device does not know fails that free with [`AllocError::Device`], leaving the block
    /// neither allocated nor cached (as in PyTorch, where the free throws).
    ///
    /// # Errors
    /// [`AllocError::InvalidPointer`] when `ptr` is not an allocated block.
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        self.lock().record_stream(ptr, stream)
    }

    /// Completes the frees whose stream events have completed, as every
    /// [`malloc`](Self::malloc) does first (PyTorch's `process_events`): a block freed while
    /// another stream used it goes back to the cache now rather than at the next `malloc`.
    /// Does nothing during a graph capture.
    ///
    /// # Errors
    /// [`AllocError::Device`] when querying an event fails.
    pub fn process_events(&self) -> Result<(), AllocError> {
        let context = self.gather(ContextLevel::All);
        let hash = self.context_hash(context.as_ref());
        let mut st = self.lock();
        st.begin_call(context.as_ref().zip(hash));
        let r = st.process_ready_events(&self.backend, context.as_ref());
        st.end_call();
        r
    }

    /// Completes pending frees, then returns every whole cached segment to the device (and
    /// unmaps free pages of expandable segments), then releases freeable private pools.
    ///
    /// # Errors
    /// [`AllocError::Device`] when the device fails; [`AllocError::InvalidArgument`] during a
    /// graph capture (the allocator cannot synchronize then).
    pub fn empty_cache(&self) -> Result<(), AllocError> {
        let context = self.gather(ContextLevel::All);
        let hash = self.context_hash(context.as_ref());
        let mut st = self.lock();
        if !st.captures.is_empty() {
            return Err(AllocError::InvalidArgument(
                "empty_cache during a graph capture (allocate_to_pool is active)".into(),
            ));
        }
        st.begin_call(context.as_ref().zip(hash));
        let r = st.release_cached_blocks(&self.backend, context.as_ref());
        st.end_call();
        r
    }

    /// Limits the bytes this allocator may reserve to `fraction` of the device's total memory.
    ///
    /// # Errors
    /// [`AllocError::InvalidArgument`] for a fraction outside [0, 1];
    /// [`AllocError::Device`] when the device cannot report its memory.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), AllocError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(AllocError::InvalidArgument(format!(
                "memory fraction {fraction} is not within [0, 1]"
            )));
        }
        let (_, total) = self.backend.mem_get_info()?;
        let mut st = self.lock();
        st.allowed_memory_maximum = (fraction * total as f64) as u64;
        st.set_fraction = true;
        Ok(())
    }

    /// `reserved - allocated` and the largest free cached block.
    pub fn cache_info(&self) -> CacheInfo {
        let st = self.lock();
        CacheInfo {
            cached_bytes: st.cached_bytes(),
            largest_free_block: st.largest_free_block(),
        }
    }

    /// The base and size of the segment containing `ptr` (for an expandable segment, of the
    /// contiguous mapped range), or `None` when no segment holds it.
    pub fn base_allocation(&self, ptr: DevicePtr) -> Option<(DevicePtr, u64)> {
        self.lock().base_allocation(ptr)
    }

    /// A copy of the statistics.
    pub fn device_stats(&self) -> DeviceStats {
        self.lock().stats()
    }

    /// The statistics as `torch.cuda.memory_stats()` keys.
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.device_stats().memory_stats()
    }

    /// The `torch.cuda.memory_summary()` table.
    pub fn memory_summary(&self) -> String {
        let (stats, device) = {
            let st = self.lock();
            (st.stats(), st.device)
        };
        format_memory_summary(&stats, device)
    }

    /// `peak = current` everywhere.
    pub fn reset_peak_stats(&self) {
        let mut st = self.lock();
        st.begin_call(None);
        st.reset_peak_stats();
        st.emit_plain(EventAction::ResetPeaks, StreamId::DEFAULT);
        st.end_call();
    }

    /// `allocated = freed = 0` and the counters to 0.
    pub fn reset_accumulated_stats(&self) {
        let mut st = self.lock();
        st.begin_call(None);
        st.stats.reset_accumulated();
        st.emit_plain(EventAction::ResetAccumulated, StreamId::DEFAULT);
        st.end_call();
    }

    /// The segments (sorted by address), this device's trace, the settings, and the device's
    /// total memory and trace overflow. Records a `snapshot` trace entry (seen in the next
    /// snapshot's trace, as in PyTorch).
    ///
    /// To write it as a file that `allocview open` / `summary` and PyTorch's own viewers read,
    /// use the agent crate's `allocview_agent::snapshot_file::save(path, &snapshot, format)`
    /// (`FileFormat::Pickle`, as `torch.cuda.memory._dump_snapshot` writes, or
    /// `FileFormat::Json`). The serde form of [`Snapshot`] is the data model, not that file
    /// format: `allocview` refuses it ("not an allocview snapshot").
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_and(|_| ()).0
    }

    /// [`snapshot`](Self::snapshot) and [`device_stats`](Self::device_stats) taken under one
    /// hold of the lock, so both describe the same moment: the one of the `snapshot` event it
    /// publishes (what an agent resynchronises from while other threads keep allocating).
    pub fn snapshot_with_stats(&self) -> (Snapshot, DeviceStats) {
        self.snapshot_and(DeviceCachingAllocator::stats)
    }

    /// A [`snapshot`](Self::snapshot) and what `also` reads of the state under the same hold
    /// of the lock, after the snapshot's trace entry and event.
    fn snapshot_and<T>(&self, also: impl FnOnce(&DeviceCachingAllocator) -> T) -> (Snapshot, T) {
        let total_memory = self.backend.mem_get_info().ok().map(|(_, t)| t);
        let mut st = self.lock();
        st.begin_call(None);
        let trace = st.ring.entries();
        let overflow = st.ring.overflow();
        let (segments, total_active) = st.segments();
        st.record_trace(
            TraceAction::Snapshot,
            0,
            total_active,
            StreamId::DEFAULT,
            None,
        );
        st.emit_plain(EventAction::Snapshot, StreamId::DEFAULT);
        st.end_call();
        let also = also(&st);
        let device = st.device;
        let mut device_traces = vec![Vec::new(); device.max(0) as usize];
        device_traces.push(trace);
        let snapshot = Snapshot {
            segments,
            device_traces,
            allocator_settings: Some(st.config.to_settings()),
            external_annotations: Some(Vec::new()),
            devices: vec![DeviceMeta {
                device,
                total_memory,
                trace_overflow: overflow,
                oom: None,
            }],
        };
        (snapshot, also)
    }

    /// Turns trace history on or off (off clears it) and sets the context level and ring size.
    pub fn record_history(&self, opts: HistoryOptions) {
        let mut st = self.lock();
        st.set_record_history(opts.enabled);
        st.context_level = if opts.enabled {
            opts.context
        } else {
            ContextLevel::Never
        };
        st.ring.set_max(opts.max_entries);
        if !opts.enabled {
            st.ring.clear();
        }
        self.context_level
            .store(st.context_level as u8, Ordering::Relaxed);
    }

    /// Sets (or removes) the function that supplies stack frames. It is called outside the
    /// lock, only when the context level needs frames for the call; frames are stored shared.
    pub fn set_context_provider(&self, f: Option<ContextProvider>) {
        *self.provider.lock().unwrap_or_else(|e| e.into_inner()) = f;
    }

    /// Adds an observer called (outside the lock) on every out-of-memory failure.
    pub fn attach_oom_observer(&self, f: impl Fn(&OomInfo) + Send + Sync + 'static) {
        self.lock().oom_observers.push(Arc::new(f));
    }

    /// Adds a tracker that receives every trace entry, even with history off (called under
    /// the lock: it must not call the allocator).
    pub fn attach_trace_tracker(&self, f: impl Fn(&TraceEntry) + Send + Sync + 'static) {
        let mut st = self.lock();
        st.add_tracker(Arc::new(f));
    }

    /// Adds a free-memory callback, run when no cached block fits, before a device allocation
    /// (PyTorch's `FreeCudaMemoryCallbacksRegistry`). It returns whether it freed anything; it
    /// runs under the lock and must not call the allocator.
    pub fn add_free_memory_callback(&self, f: impl Fn() -> bool + Send + Sync + 'static) {
        self.lock().free_callbacks.push(Arc::new(f));
    }

    /// Sets (or removes) the sink events are published to (see the [module docs](self)). Events
    /// gathered for the previous sink are published to it first.
    pub fn set_event_sink(&self, sink: Option<Arc<dyn EventSink>>) {
        let mut st = self.lock();
        self.has_sink.store(sink.is_some(), Ordering::Relaxed);
        st.set_sink(sink);
    }

    /// Publishes the events gathered for the sink now, without waiting for the batch to fill
    /// or age (see the [module docs](self)). Call it before reading an observer's figures that must
    /// include every call made so far; dropping the allocator does it too.
    pub fn flush_events(&self) {
        self.lock().flush_batch();
    }

    /// Whether events gathered for the sink wait to be published (read without the lock; it
    /// may change at once).
    pub fn holds_events(&self) -> bool {
        self.holding.load(Ordering::Relaxed)
    }

    /// [`flush_events`](Self::flush_events) if that needs no waiting: false when another
    /// thread holds the lock (its call is under way, and will publish the batch in time).
    /// For an observer checking on an allocator that went quiet (the agent's aggregator does,
    /// once a tick, for a provider whose device sent nothing since the last tick). The lock is
    /// taken only when the allocator [`holds_events`](Self::holds_events): taking it from
    /// another thread ends the lock's bias to the allocating thread (see the [module docs](self)),
    /// about 2 ns on a cached pair here.
    pub fn try_flush_events(&self) -> bool {
        if !self.holds_events() {
            return true;
        }
        let Some(mut st) = self.state.try_lock() else {
            return false;
        };
        st.flush_batch();
        true
    }

    /// The frames behind context ids of events (`Event::context`), for those of `ids` the
    /// allocator still keeps (the last [`CONTEXT_TABLE_CAPACITY`] contexts it gave ids to), in
    /// the order asked. Takes the lock: for observers, off the hot path.
    ///
    /// [`CONTEXT_TABLE_CAPACITY`]: crate::caching::CONTEXT_TABLE_CAPACITY
    pub fn context_frames(&self, ids: &[u32]) -> Vec<(u32, Frames)> {
        self.lock().context_frames(ids)
    }

    /// Makes one call in `one_in` on average (drawn at random; 1 = every call) measure its
    /// latency for the events it publishes (default: 1 in 16).
    pub fn set_event_latency_sampling(&self, one_in: u32) {
        self.lock().set_latency_sampling(one_in);
    }

    /// Records a `user_defined` trace entry named `name` (a one-frame context).
    pub fn record_user_annotation(&self, name: &str, stream: StreamId) {
        let frames: Frames = Arc::from(vec![Frame::new(name, "", 0)]);
        let mut st = self.lock();
        st.begin_call(None);
        st.record_annotation(frames, stream);
        st.end_call();
    }

    /// Routes allocations on streams the filter accepts to the private pool `pool` (created, or
    /// its use count raised), as a graph capture does.
    pub fn begin_allocate_to_pool(
        &self,
        pool: PoolId,
        filter: impl Fn(StreamId) -> bool + Send + Sync + 'static,
    ) {
        self.lock().begin_allocate_to_pool(pool, Arc::new(filter));
    }

    /// Stops routing allocations to `pool`.
    pub fn end_allocate_to_pool(&self, pool: PoolId) {
        self.lock().end_allocate_to_pool(pool);
    }

    /// Drops one use of `pool`; at zero its cached memory goes back with the next
    /// `empty_cache`.
    pub fn release_pool(&self, pool: PoolId) {
        self.lock().release_pool(pool);
    }
}

/// Dropping the allocator publishes the events it gathered, then gives the device back what
/// no block holds: it completes pending frees (waiting for their streams), returns every cached
/// segment and unmaps free pages ([`empty_cache`](CachingAllocator::empty_cache), unpublished:
/// the sink is let go first), releases the address ranges of expandable segments left with
/// nothing mapped, and destroys its events. Segments that still hold blocks the program never
/// freed stay on the device (work queued on it may still use them), as does everything while a
/// graph capture is under way. A device error on the way is logged, not raised.
impl<B: DeviceBackend> Drop for CachingAllocator<B> {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        st.set_sink(None);
        if st.captures.is_empty() {
            st.begin_call(None);
            let released = st.release_cached_blocks(&self.backend, None);
            st.end_call();
            if let Err(e) = released {
                tracing::warn!(error = %e, "dropping a caching allocator: releasing its cache failed");
            }
            if let Err(e) = st.release_unmapped_address_ranges(&self.backend) {
                tracing::warn!(error = %e, "dropping a caching allocator: releasing an address range failed");
            }
        }
        st.destroy_events(&self.backend);
    }
}

impl<B: DeviceBackend + std::fmt::Debug> std::fmt::Debug for CachingAllocator<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}
