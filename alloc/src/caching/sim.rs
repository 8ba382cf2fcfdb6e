//! A simulated device: the [`DeviceBackend`] every caching-allocator rule is tested on.
//!
//! [`SimBackend`] models what the caching allocator can observe of a CUDA device, and lets a
//! test drive what it cannot:
//! - **Capacity.** `malloc` and `vm_map` fail with [`DeviceError::OutOfMemory`] when the bytes
//!   backed by physical memory (live segments, mapped pages, and "external" usage standing for
//!   other processes) would exceed the capacity; `mem_get_info` reports `(capacity - used,
//!   capacity)`.
//! - **Addresses.** A deterministic address space: segments go first fit in address order from
//!   a base address, aligned to [`SEGMENT_ALIGNMENT`], never overlapping live segments or
//!   reservations, so the same calls give the same addresses. A placement hint
//!   ([`SimBackend::hint_next_segment`]) puts the next segment exactly at a chosen address when
//!   that range is free, which is how replay reproduces the addresses of a PyTorch recording.
//!   The map is two `BTreeMap`s (module `address_space`), so arbitrary
//!   placements in any order stay cheap.
//! - **Streams and events.** Each stream counts work submitted and completed; an event recorded
//!   on a stream captures the submitted count and is complete when the completed count reaches
//!   it. With auto-complete on (the default) recorded events complete at once; off, a test
//!   queues work with [`SimBackend::submit_work`] and finishes it with
//!   [`SimBackend::complete_stream`]. `synchronize_*` finish the work they wait for, except in
//!   never-complete mode, where they return an error instead of hanging.
//! - **Virtual memory** (expandable segments): reservations that use no memory, mapping and
//!   unmapping granularity-aligned pages inside them, releasing empty reservations. Misuse is
//!   [`DeviceError::Invalid`] with a message, as the driver would reject it.
//! - **Fault injection and counters**: fail the n-th malloc, fail every malloc or map above a
//!   size, and count every call ([`SimCounters`]).
//!
//! All state sits behind one mutex: backend calls are rare next to the allocator's own work
//! (a segment allocation per thousands of block allocations), and the allocator calls the
//! device under its own lock anyway.
//!
//! # Examples
//! ```
//! use allocview_alloc::caching::backend::{DeviceBackend, DeviceError};
//! use allocview_alloc::caching::sim::SimBackend;
//!
//! let device = SimBackend::new(64 << 20);
//! let a = device.malloc(20 << 20).unwrap();
//! let b = device.malloc(20 << 20).unwrap();
//! assert_eq!(b, a + (20 << 20));
//! assert_eq!(device.mem_get_info().unwrap(), (24 << 20, 64 << 20));
//! assert!(matches!(device.malloc(40 << 20), Err(DeviceError::OutOfMemory { .. })));
//! ```

mod address_space;
mod counters;
mod streams;

use std::sync::{Mutex, MutexGuard};

use self::address_space::AddressSpace;
pub use self::counters::SimCounters;
use self::streams::Streams;
use crate::caching::backend::{DeviceBackend, DeviceError, DevicePtr, EventId, StreamId};

/// Where the simulated address space hands out its first segment: a realistic device
/// pointer (PyTorch recordings show addresses around `0x7f..._....`).
pub const DEFAULT_BASE_ADDRESS: u64 = 0x7f00_0000_0000;

/// Alignment of every segment the simulated device places by itself (first fit). The real
/// driver aligns to at least 512 B; 2 MiB keeps segment maps readable and matches the large
/// page the driver uses for big allocations.
pub const SEGMENT_ALIGNMENT: u64 = 2 << 20;

/// Default virtual-memory page size (`cuMemGetAllocationGranularity` on current GPUs).
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;

/// Smallest alignment a placement hint for a segment may have: CUDA's minimum allocation
/// alignment, and the granularity of addresses in PyTorch recordings.
pub const MIN_HINT_ALIGNMENT: u64 = 512;

/// Capacity of a device built with [`SimBackend::builder`] when none is given: 16 GiB.
pub const DEFAULT_CAPACITY: u64 = 16 << 30;

/// Status code of the error `synchronize_event` / `synchronize_device` return in never-complete
/// mode (CUDA_ERROR_UNKNOWN's value: the real driver has no "would hang" status).
pub const NEVER_COMPLETE_ERROR_CODE: i32 = 999;

/// All mutable state of a simulated device.
#[derive(Debug)]
struct State {
    capacity: u64,
    /// Bytes of live segments.
    segment_bytes: u64,
    /// Bytes of mapped virtual-memory pages.
    mapped_bytes: u64,
    /// Bytes used on the device outside the allocator.
    external_bytes: u64,
    space: AddressSpace,
    streams: Streams,
    auto_complete: bool,
    never_complete: bool,
    hint: Option<u64>,
    /// Countdown to an injected malloc failure: `Some(1)` fails the next malloc.
    fail_countdown: Option<u64>,
    fail_above: Option<u64>,
    counters: SimCounters,
}

impl State {
    fn used(&self) -> u64 {
        self.segment_bytes
            .saturating_add(self.mapped_bytes)
            .saturating_add(self.external_bytes)
    }

    /// Whether `size` more bytes of physical memory fit.
    fn admits(&self, size: u64) -> bool {
        self.used()
            .checked_add(size)
            .is_some_and(|total| total <= self.capacity)
    }

    /// Places a `size`-byte segment: at the placement hint (taken, counted either way) when
    /// that range is free and aligned to [`MIN_HINT_ALIGNMENT`], checked and placed with one
    /// lookup; else first fit from `base`.
    fn place_segment(&mut self, size: u64, base: u64) -> Result<u64, DeviceError> {
        if let Some(hint) = self.hint.take() {
            if hint.is_multiple_of(MIN_HINT_ALIGNMENT) && self.space.try_insert_segment(hint, size)
            {
                self.counters.hints_honoured += 1;
                return Ok(hint);
            }
            self.counters.hints_ignored += 1;
            tracing::debug!(
                hint = format_args!("{hint:#x}"),
                size,
                "simulated device: placement hint ignored (range taken or misaligned)"
            );
        }
        let start = self
            .space
            .first_fit(base, size, SEGMENT_ALIGNMENT)
            .ok_or(DeviceError::OutOfMemory { size })?;
        self.space.insert_segment(start, size);
        Ok(start)
    }

    /// Takes the placement hint and returns it if `[hint, hint + size)` is free and aligned;
    /// counts it either way.
    fn take_hint(&mut self, size: u64, align: u64) -> Option<u64> {
        let hint = self.hint.take()?;
        if hint % align == 0 && self.space.is_free(hint, size) {
            self.counters.hints_honoured += 1;
            Some(hint)
        } else {
            self.counters.hints_ignored += 1;
            tracing::debug!(
                hint = format_args!("{hint:#x}"),
                size,
                "simulated device: placement hint ignored (range taken or misaligned)"
            );
            None
        }
    }
}

/// A simulated device: capacity, deterministic addresses, streams and events whose completion
/// a test controls, virtual memory, fault injection and call counters. See the
/// [module docs](self).
#[derive(Debug)]
pub struct SimBackend {
    device: i32,
    base_address: u64,
    granularity: u64,
    state: Mutex<State>,
}

/// Builds a [`SimBackend`] with non-default settings.
///
/// # Examples
/// ```
/// use allocview_alloc::caching::backend::DeviceBackend;
/// use allocview_alloc::caching::sim::SimBackend;
///
/// let device = SimBackend::builder()
///     .capacity(1 << 30)
///     .device(1)
///     .base_address(0x1000_0000)
///     .auto_complete(false)
///     .build();
/// assert_eq!(device.device(), 1);
/// assert_eq!(device.malloc(512).unwrap(), 0x1000_0000);
/// ```
#[derive(Debug, Clone)]
pub struct SimBackendBuilder {
    capacity: u64,
    device: i32,
    base_address: u64,
    granularity: u64,
    auto_complete: bool,
}

impl Default for SimBackendBuilder {
    fn default() -> Self {
        SimBackendBuilder {
            capacity: DEFAULT_CAPACITY,
            device: 0,
            base_address: DEFAULT_BASE_ADDRESS,
            granularity: DEFAULT_GRANULARITY,
            auto_complete: true,
        }
    }
}

impl SimBackendBuilder {
    /// Physical memory in bytes (default [`DEFAULT_CAPACITY`]).
    pub fn capacity(mut self, bytes: u64) -> Self {
        self.capacity = bytes;
        self
    }

    /// Device index reported by [`DeviceBackend::device`] (default 0).
    pub fn device(mut self, device: i32) -> Self {
        self.device = device;
        self
    }

    /// Lowest address first-fit placement uses (default [`DEFAULT_BASE_ADDRESS`]); rounded up
    /// to [`SEGMENT_ALIGNMENT`], and to at least one alignment unit (never the null page).
    pub fn base_address(mut self, base: u64) -> Self {
        self.base_address = base;
        self
    }

    /// Virtual-memory page size (default [`DEFAULT_GRANULARITY`]); rounded up to a power of two
    /// of at least [`MIN_HINT_ALIGNMENT`].
    pub fn granularity(mut self, bytes: u64) -> Self {
        self.granularity = bytes;
        self
    }

    /// Whether recorded events complete at once (default true).
    pub fn auto_complete(mut self, on: bool) -> Self {
        self.auto_complete = on;
        self
    }

    /// The device.
    pub fn build(self) -> SimBackend {
        let granularity = self
            .granularity
            .max(MIN_HINT_ALIGNMENT)
            .checked_next_power_of_two()
            .unwrap_or(DEFAULT_GRANULARITY);
        let align = SEGMENT_ALIGNMENT.max(granularity);
        let base_address = self
            .base_address
            .max(align)
            .checked_next_multiple_of(align)
            .unwrap_or(DEFAULT_BASE_ADDRESS);
        SimBackend {
            device: self.device,
            base_address,
            granularity,
            state: Mutex::new(State {
                capacity: self.capacity,
                segment_bytes: 0,
                mapped_bytes: 0,
                external_bytes: 0,
                space: AddressSpace::new(),
                streams: Streams::new(),
                auto_complete: self.auto_complete,
                never_complete: false,
                hint: None,
                fail_countdown: None,
                fail_above: None,
                counters: SimCounters::default(),
            }),
        }
    }
}

impl SimBackend {
    /// Device 0 with `capacity` bytes, events that complete at once, and a 2 MiB
    /// virtual-memory granularity.
    pub fn new(capacity: u64) -> SimBackend {
        SimBackend::builder().capacity(capacity).build()
    }

    /// A builder starting from the defaults of [`new`](Self::new) (with [`DEFAULT_CAPACITY`]).
    pub fn builder() -> SimBackendBuilder {
        SimBackendBuilder::default()
    }

    /// The state, recovering it if a thread panicked while holding the lock (every update
    /// leaves it consistent before anything can panic).
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Alignment of first-fit placements and of reservations.
    fn placement_alignment(&self) -> u64 {
        SEGMENT_ALIGNMENT.max(self.granularity)
    }

    /// Physical memory in bytes.
    pub fn capacity(&self) -> u64 {
        self.state().capacity
    }

    /// Changes the capacity (memory already in use stays; later allocations see the new
    /// limit).
    pub fn set_capacity(&self, bytes: u64) {
        self.state().capacity = bytes;
    }

    /// Bytes backed by physical memory: live segments, mapped pages, and external usage.
    pub fn used(&self) -> u64 {
        self.state().used()
    }

    /// Bytes of mapped virtual-memory pages.
    pub fn mapped_bytes(&self) -> u64 {
        self.state().mapped_bytes
    }

    /// The lowest address first-fit placement uses.
    pub fn base_address(&self) -> u64 {
        self.base_address
    }

    /// With `on`, every recorded event is complete at once (and turning it on finishes all
    /// work queued so far); with it off, events wait for [`complete_stream`](Self::complete_stream).
    pub fn set_auto_complete(&self, on: bool) {
        let mut state = self.state();
        state.auto_complete = on;
        if on {
            state.streams.complete_all();
        }
    }

    /// Finishes all work queued on `stream` so far: events recorded on it become complete.
    /// An unknown stream does nothing (counted in [`SimCounters::ignored_controls`]).
    pub fn complete_stream(&self, stream: StreamId) {
        let mut state = self.state();
        if let Err(err) = state.streams.complete_stream(stream) {
            state.counters.ignored_controls += 1;
            tracing::warn!(%err, "simulated device: complete_stream ignored");
        }
    }

    /// Finishes all work on every stream.
    pub fn complete_all(&self) {
        self.state().streams.complete_all();
    }

    /// Queues one unfinished work item on `stream`: events recorded on it afterwards stay
    /// incomplete until [`complete_stream`](Self::complete_stream) (unless auto-complete is on).
    /// An unknown stream does nothing (counted in [`SimCounters::ignored_controls`]).
    pub fn submit_work(&self, stream: StreamId) {
        let mut state = self.state();
        if let Err(err) = state.streams.submit_work(stream) {
            state.counters.ignored_controls += 1;
            tracing::warn!(%err, "simulated device: submit_work ignored");
        }
    }

    /// Work items queued on `stream` and not finished, or `None` for an unknown stream.
    pub fn pending_work(&self, stream: StreamId) -> Option<u64> {
        self.state().streams.pending_work(stream)
    }

    /// Makes `stream` a known stream without `create_stream` (replay uses the stream ids a
    /// recording names). Returns false if it already existed.
    pub fn add_stream(&self, stream: StreamId) -> bool {
        self.state().streams.add_stream(stream)
    }

    /// Every known stream, the default stream included, sorted.
    pub fn streams(&self) -> Vec<StreamId> {
        self.state().streams.stream_ids()
    }

    /// Number of events created and not destroyed.
    pub fn live_events(&self) -> usize {
        self.state().streams.live_events()
    }

    /// Places the next `malloc` or `vm_reserve` exactly at `addr` if `[addr, addr + size)` is
    /// free and suitably aligned (512 B for segments, the granularity for reservations). A hint
    /// that cannot be honoured is ignored (first fit instead) and counted in
    /// [`SimCounters::hints_ignored`]. The hint is used up by the next call that gets as far as
    /// placing something (a call that fails before, e.g. out of memory, leaves it for the
    /// retry); a new hint replaces an unused one.
    pub fn hint_next_segment(&self, addr: u64) {
        self.state().hint = Some(addr);
    }

    /// Makes the `n`-th `malloc` call from now fail with [`DeviceError::OutOfMemory`] (1 = the
    /// next one). `n = 0` cancels a pending injection.
    pub fn fail_nth_malloc(&self, n: u64) {
        self.state().fail_countdown = (n > 0).then_some(n);
    }

    /// Makes every `malloc` and `vm_map` larger than `size` bytes fail with
    /// [`DeviceError::OutOfMemory`]; `None` turns it off.
    pub fn fail_malloc_above(&self, size: Option<u64>) {
        self.state().fail_above = size;
    }

    /// With `on`, recorded events never complete: queries return false, and
    /// `synchronize_event` (on a recorded event) and `synchronize_device` return
    /// [`DeviceError::Driver`] with code [`NEVER_COMPLETE_ERROR_CODE`] instead of waiting
    /// forever. Turning it off restores the work-counter model (nothing is lost).
    pub fn set_events_never_complete(&self, on: bool) {
        self.state().never_complete = on;
    }

    /// Memory used on the device outside the allocator (another process, a framework's
    /// workspace): lowers `mem_get_info`'s free figure and counts toward capacity.
    pub fn set_external_usage(&self, bytes: u64) {
        self.state().external_bytes = bytes;
    }

    /// Calls so far, and their outcomes.
    pub fn counters(&self) -> SimCounters {
        self.state().counters
    }

    /// `(address, size)` of every live `malloc` segment, sorted by address.
    pub fn live_segments(&self) -> Vec<(u64, u64)> {
        self.state().space.segments()
    }

    /// `(address, size)` of every virtual-memory reservation, sorted by address.
    pub fn live_reservations(&self) -> Vec<(u64, u64)> {
        self.state().space.reservations()
    }

    /// `(address, size)` of every mapped range (adjacent mappings merged), sorted by address.
    pub fn mapped_ranges(&self) -> Vec<(u64, u64)> {
        self.state().space.mapped_ranges()
    }

    fn never_complete_error(what: &str) -> DeviceError {
        DeviceError::Driver {
            code: NEVER_COMPLETE_ERROR_CODE,
            message: format!(
                "{what}: the simulated device's events never complete \
                 (set_events_never_complete), so this wait would hang"
            ),
        }
    }
}

impl DeviceBackend for SimBackend {
    fn device(&self) -> i32 {
        self.device
    }

    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let mut state = self.state();
        state.counters.malloc += 1;
        let result = (|| {
            if let Some(n) = state.fail_countdown {
                state.fail_countdown = n.checked_sub(1).filter(|&left| left > 0);
                if n == 1 {
                    return Err(DeviceError::OutOfMemory { size });
                }
            }
            if size == 0 {
                return Err(DeviceError::Invalid("malloc of 0 bytes".into()));
            }
            if state.fail_above.is_some_and(|limit| size > limit) || !state.admits(size) {
                return Err(DeviceError::OutOfMemory { size });
            }
            let start = state.place_segment(size, self.base_address)?;
            state.segment_bytes += size;
            Ok(start)
        })();
        if result.is_err() {
            state.counters.failed_mallocs += 1;
        }
        result
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let mut state = self.state();
        state.counters.free += 1;
        let size = state.space.remove_segment(ptr)?;
        state.segment_bytes -= size;
        Ok(())
    }

    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        let mut state = self.state();
        state.counters.mem_get_info += 1;
        Ok((state.capacity.saturating_sub(state.used()), state.capacity))
    }

    fn create_stream(&self) -> Result<StreamId, DeviceError> {
        let mut state = self.state();
        state.counters.create_stream += 1;
        Ok(state.streams.create_stream())
    }

    fn create_event(&self) -> Result<EventId, DeviceError> {
        let mut state = self.state();
        state.counters.create_event += 1;
        Ok(state.streams.create_event())
    }

    fn destroy_event(&self, event: EventId) -> Result<(), DeviceError> {
        let mut state = self.state();
        state.counters.destroy_event += 1;
        state.streams.destroy_event(event)
    }

    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), DeviceError> {
        let mut state = self.state();
        state.counters.record_event += 1;
        let auto = state.auto_complete;
        state.streams.record_event(event, stream, auto)
    }

    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        let mut state = self.state();
        state.counters.query_event += 1;
        if state.never_complete && state.streams.is_recorded("query_event", event)? {
            return Ok(false);
        }
        state.streams.is_complete("query_event", event)
    }

    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError> {
        let mut state = self.state();
        state.counters.synchronize_event += 1;
        if state.never_complete && state.streams.is_recorded("synchronize_event", event)? {
            return Err(Self::never_complete_error("synchronize_event"));
        }
        state.streams.complete_event(event)
    }

    fn synchronize_device(&self) -> Result<(), DeviceError> {
        let mut state = self.state();
        state.counters.synchronize_device += 1;
        if state.never_complete {
            return Err(Self::never_complete_error("synchronize_device"));
        }
        state.streams.complete_all();
        Ok(())
    }

    fn vm_granularity(&self) -> u64 {
        self.granularity
    }

    fn vm_reserve(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let mut state = self.state();
        state.counters.vm_reserve += 1;
        if size == 0 || !size.is_multiple_of(self.granularity) {
            return Err(DeviceError::Invalid(format!(
                "vm_reserve({size}): the size must be a positive multiple of the granularity \
                 ({} bytes)",
                self.granularity
            )));
        }
        let align = self.placement_alignment();
        let start = match state.take_hint(size, self.granularity) {
            Some(hinted) => hinted,
            None => state
                .space
                .first_fit(self.base_address, size, align)
                .ok_or(DeviceError::OutOfMemory { size })?,
        };
        state.space.insert_reservation(start, size);
        Ok(start)
    }

    fn vm_map(&self, va: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let mut state = self.state();
        state.counters.vm_map += 1;
        let granularity = self.granularity;
        let result = (|| {
            if size == 0 || !size.is_multiple_of(granularity) || !va.is_multiple_of(granularity) {
                return Err(DeviceError::Invalid(format!(
                    "vm_map({va:#x}, {size}): address and size must be multiples of the \
                     granularity ({granularity} bytes), size positive"
                )));
            }
            state.space.check_map(va, size)?;
            if state.fail_above.is_some_and(|limit| size > limit) || !state.admits(size) {
                return Err(DeviceError::OutOfMemory { size });
            }
            state.space.map(va, size)?;
            state.mapped_bytes += size;
            Ok(())
        })();
        if result.is_err() {
            state.counters.failed_maps += 1;
        }
        result
    }

    fn vm_unmap(&self, va: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let mut state = self.state();
        state.counters.vm_unmap += 1;
        let granularity = self.granularity;
        if size == 0 || !size.is_multiple_of(granularity) || !va.is_multiple_of(granularity) {
            return Err(DeviceError::Invalid(format!(
                "vm_unmap({va:#x}, {size}): address and size must be multiples of the \
                 granularity ({granularity} bytes), size positive"
            )));
        }
        state.space.unmap(va, size)?;
        state.mapped_bytes -= size;
        Ok(())
    }

    fn vm_release(&self, va: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let mut state = self.state();
        state.counters.vm_release += 1;
        state.space.release(va, size)
    }
}
