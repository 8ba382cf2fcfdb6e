//! [`Instrumented`]: a `GlobalAlloc` adapter that counts a program's heap (bytes in use now, at
//! peak, in total, and allocation counts) and can publish every allocation, free and realloc as
//! an [`Event`] to an [`EventSink`], so any Rust program can put it behind
//! `#[global_allocator]` and watch itself.
//!
//! ```
//! use std::alloc::System;
//! use allocview_alloc::global::Instrumented;
//!
//! #[global_allocator]
//! static HEAP: Instrumented<System> = Instrumented::new(System);
//!
//! let before = HEAP.stats();
//! let v = vec![0u8; 1 << 20];
//! assert!(HEAP.stats().current_bytes >= before.current_bytes + (1 << 20));
//! drop(v);
//! ```
//!
//! # The hot path
//!
//! The rules of a `GlobalAlloc` hook (tracking-allocator, dhat-rs' `IgnoreAllocs`): an enable
//! flag checked first (off costs one branch); no locks; no allocation; a thread-local
//! reentrancy guard, so that a sink that allocates does not recurse into itself.
//!
//! An observer's own threads must not feed their allocations back into the stream they report
//! on: [`unpublished`] marks a scope, and on Linux a thread whose OS name starts with
//! [`UNPUBLISHED_THREAD_PREFIX`] publishes nothing at all. Threads a library starts without
//! naming them inherit the OS name of the thread that started them, so a library started on
//! such a thread (an HTTP server's accept and connection threads) is covered without hooks
//! into it. The name is read once per thread, when it claims its counter slot (below), on the
//! cold path; the hot path only gains a flag check on the way to a sink, where a sink is set.
//! A thread renamed after its first allocation keeps what its name said then. The main thread
//! always publishes: its OS name is the program's, which its unnamed threads inherit too, and
//! the prefix's `:` keeps a program's name from matching by chance.
//!
//! Counters are kept **per thread**. Shared atomic counters are correct but collapse when
//! threads allocate at once (measured for issue 8: four relaxed atomics cost ~20x the system
//! allocator on a 2-thread loop, per-thread counts ~0.8x), because every update bounces one
//! cache line between cores. Here each thread claims one of [`MAX_THREAD_SLOTS`] cache-padded
//! slots (a compare-and-swap on a process-wide ownership table, once per thread) and updates
//! it with plain relaxed loads and stores: only the owner writes a slot, so no read-modify-write
//! is needed. A thread's slot goes back to the table when the thread exits, and the next thread
//! to claim it keeps adding to the same counters: a slot holds contributions, not a thread's
//! state, so nothing is lost when threads come and go. Reading [`Instrumented::stats`] folds
//! all slots. When every slot is taken, further threads share an overflow slot updated with
//! atomic read-modify-writes (correct, just slower).
//!
//! # Peak
//!
//! Per-thread peaks do not add up to the process's peak, and computing the exact peak needs
//! the exact global current at every step, i.e. a shared counter. Instead each slot publishes
//! its net change to a shared approximate current (`fetch_add`) and raises a shared peak
//! (`fetch_max`) whenever its unpublished change reaches ±[`PEAK_STEP_BYTES`] (an allocation
//! that large publishes at once; the overflow slot publishes every change). A tight loop of
//! small allocations never touches the shared line. Reading also raises the peak to the exact
//! current folded at that moment. The guarantee:
//!
//! - the reported peak is at least the current reported alongside it, and at least every value
//!   the approximate current reached;
//! - it is within `PEAK_STEP_BYTES` per slot that has allocated or freed through this heap of
//!   the true peak (above or below): a single-threaded program's peak is exact to within
//!   64 KiB, a program with `n` allocating threads to within `n` x 64 KiB.
//!
//! # Counting rules
//!
//! Sizes are `Layout` sizes. A `realloc` counts as one allocation of the new size plus one free
//! of the old (and once in `reallocs`), as its events say. While disabled, nothing is counted:
//! memory allocated while disabled and freed while enabled lowers `current` (reported current
//! saturates at zero).
//!
//! # Event order
//!
//! A free is published before the memory goes back to the wrapped allocator, so its address
//! cannot be handed out (and published) elsewhere first. A realloc is published after it
//! returns (the new address is not known before), as a `FreeCompleted` of the old block then an
//! `Alloc` of the new; when the block moved, another thread may be handed the old address and
//! publish it in between.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::fmt;
use std::ptr;
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use crate::event::{CPU_DEVICE, Event, EventAction, EventPool, EventSink, now_ns};
use crate::stats::HumanBytes;

/// Number of per-thread counter slots. Threads beyond this many alive at once share one
/// overflow slot (atomic read-modify-writes). Each slot is 128 bytes, so an `Instrumented`
/// takes about 16 KiB.
pub const MAX_THREAD_SLOTS: usize = 128;

/// How far a slot's count of bytes in use may drift from what it has published to the shared
/// peak before it publishes again. The peak's error bound is this per slot in use.
pub const PEAK_STEP_BYTES: u64 = 64 * 1024;

/// Threads whose OS name starts with this publish nothing (their allocations are counted):
/// the threads of the allocview agent that start a library's threads (its metrics listener),
/// and on Linux the threads they start without naming them, which inherit the starting
/// thread's OS name (an HTTP library's accept and connection threads, for instance), so that
/// the agent's work never shows in the events it reports. The `:` is not found in programs'
/// names (which unnamed threads inherit from the main thread). Checked once per thread, at
/// its first allocation; never for the main thread (see [`unpublished`] for a scope).
pub const UNPUBLISHED_THREAD_PREFIX: &str = "allocview:";

/// `SLOT_INDEX`: the thread has not tried to claim a slot yet.
const UNCLAIMED: u32 = u32::MAX;
/// `SLOT_INDEX`: the thread is claiming one (an allocation made meanwhile uses the overflow).
const CLAIMING: u32 = u32::MAX - 1;
/// `SLOT_INDEX`: no slot (all taken, or the thread is exiting): use the overflow slot.
const OVERFLOW: u32 = u32::MAX - 2;

/// Which thread owns slot `i` (of every `Instrumented` at once: ownership is process-wide,
/// counters are per instance).
static SLOT_OWNED: [AtomicBool; MAX_THREAD_SLOTS] =
    [const { AtomicBool::new(false) }; MAX_THREAD_SLOTS];

thread_local! {
    /// This thread's slot index, or one of `UNCLAIMED`, `CLAIMING`, `OVERFLOW`. `const` and
    /// without a destructor: reading it never allocates or registers anything.
    static SLOT_INDEX: Cell<u32> = const { Cell::new(UNCLAIMED) };
    /// Set while this thread publishes an event: allocations the sink makes are counted but
    /// not published.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
    /// Gives the thread's slot back when the thread exits. Touched once, after claiming.
    static SLOT_RELEASE: SlotRelease = const { SlotRelease };
    /// Set once, at the thread's first allocation, when its OS name starts with
    /// [`UNPUBLISHED_THREAD_PREFIX`]: nothing this thread does is published.
    static UNPUBLISHED_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread, not the main thread, has an OS name that starts with
/// [`UNPUBLISHED_THREAD_PREFIX`] (two system calls, no allocation). The name a thread has at
/// its first allocation: `std` names a thread it starts before running its closure; an
/// unnamed thread has the name of the thread that started it.
#[cfg(target_os = "linux")]
fn os_name_is_unpublished() -> bool {
    // SAFETY: `gettid` and `getpid` take no arguments and cannot fail.
    let main_thread = unsafe { libc::syscall(libc::SYS_gettid) == libc::getpid() as libc::c_long };
    if main_thread {
        return false;
    }
    /// `PR_GET_NAME` writes at most 16 bytes, NUL included.
    const TASK_COMM_LEN: usize = 16;
    let mut name = [0u8; TASK_COMM_LEN];
    // SAFETY: `PR_GET_NAME` writes at most `TASK_COMM_LEN` bytes into the buffer it is given,
    // which is that long and lives across the call; the other arguments are ignored.
    let ok = unsafe {
        libc::prctl(
            libc::PR_GET_NAME,
            name.as_mut_ptr() as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    ok == 0 && name.starts_with(UNPUBLISHED_THREAD_PREFIX.as_bytes())
}

/// Thread names are not read on this platform: only [`unpublished`] scopes keep a thread's
/// allocations out of the events.
#[cfg(not(target_os = "linux"))]
fn os_name_is_unpublished() -> bool {
    false
}

/// Thread-exit hook: returns the thread's slot to the table.
struct SlotRelease;

impl Drop for SlotRelease {
    fn drop(&mut self) {
        let index = SLOT_INDEX.with(Cell::get);
        if (index as usize) < MAX_THREAD_SLOTS {
            // Later allocations of this exiting thread (other TLS destructors) go to overflow.
            SLOT_INDEX.with(|s| s.set(OVERFLOW));
            // Release: the next owner's Acquire claim sees every count written here.
            SLOT_OWNED[index as usize].store(false, Release);
        }
    }
}

/// Claims a free slot for this thread; `None` means use the overflow slot.
#[cold]
#[inline(never)]
fn claim_slot() -> Option<usize> {
    SLOT_INDEX.with(|s| s.set(CLAIMING));
    if os_name_is_unpublished() {
        UNPUBLISHED_THREAD.with(|u| u.set(true));
    }
    let claimed = SLOT_OWNED.iter().position(|owned| {
        owned
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_ok()
    });
    let result = claimed.and_then(|index| {
        // Registering the exit hook may fail if the thread is already tearing down its TLS;
        // then give the slot back at once rather than leak it.
        if SLOT_RELEASE.try_with(|_| ()).is_ok() {
            Some(index)
        } else {
            SLOT_OWNED[index].store(false, Release);
            None
        }
    });
    SLOT_INDEX.with(|s| s.set(result.map_or(OVERFLOW, |i| i as u32)));
    result
}

/// One thread's counters (or the shared overflow), alone on its cache lines.
#[repr(align(128))]
struct Slot {
    /// Net bytes allocated through this slot (frees of another thread's memory make it
    /// negative).
    current: AtomicI64,
    /// The part of `current` already added to the shared approximate current.
    published: AtomicI64,
    /// Bytes allocated (realloc: the new size).
    total: AtomicU64,
    /// Allocations (realloc counts one).
    allocs: AtomicU64,
    /// Frees (realloc counts one).
    frees: AtomicU64,
    /// Reallocations.
    reallocs: AtomicU64,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            current: AtomicI64::new(0),
            published: AtomicI64::new(0),
            total: AtomicU64::new(0),
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            reallocs: AtomicU64::new(0),
        }
    }
}

/// The shared peak state, on its own cache line (written only on step crossings).
#[repr(align(128))]
struct Shared {
    /// Sum of what the slots have published: the current within the step bound.
    approx_current: AtomicI64,
    /// Highest `approx_current` (or folded current at a read) since the last reset.
    peak: AtomicI64,
}

/// What an operation does to the counters.
#[derive(Clone, Copy)]
enum Op {
    Alloc,
    Free,
    Realloc,
}

/// A sink registered with [`Instrumented::set_sink`]: a thin pointer to a fat one, so an
/// `AtomicPtr` can hold it. Cells live until the `Instrumented` is dropped (never, for a
/// `static`), linked through `next` so none is lost.
struct SinkCell {
    sink: &'static dyn EventSink,
    next: *mut SinkCell,
}

/// Counters of an [`Instrumented`] heap, folded from every thread's slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes allocated and not yet freed (saturating at zero; see the module docs).
    pub current_bytes: u64,
    /// Highest bytes in use since start or [`Instrumented::reset_peak`], within the bound in
    /// the module docs.
    pub peak_bytes: u64,
    /// Bytes allocated in total.
    pub total_bytes: u64,
    /// Number of allocations (a realloc counts one).
    pub count: u64,
    /// Number of frees (a realloc counts one).
    pub frees: u64,
    /// Number of reallocations.
    pub reallocs: u64,
}

impl fmt::Display for HeapStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "in use: {}, peak: {}, total: {}, allocs: {}, frees: {}, reallocs: {}",
            HumanBytes(self.current_bytes),
            HumanBytes(self.peak_bytes),
            HumanBytes(self.total_bytes),
            self.count,
            self.frees,
            self.reallocs,
        )
    }
}

/// A `GlobalAlloc` that counts what passes through it to `A` (and publishes it to a sink, when
/// one is set). See the [module docs](self) for how counting stays cheap under threads and
/// what the peak guarantees.
pub struct Instrumented<A> {
    inner: A,
    enabled: AtomicBool,
    sink: AtomicPtr<SinkCell>,
    /// Every cell ever made, for `Drop`.
    cells: AtomicPtr<SinkCell>,
    shared: Shared,
    overflow: Slot,
    slots: [Slot; MAX_THREAD_SLOTS],
}

// SAFETY: the raw pointers are to `SinkCell`s that hold `&'static dyn EventSink` (`Sync`) and
// are never mutated after publication; all other state is atomics and `A`.
unsafe impl<A: Send> Send for Instrumented<A> {}
// SAFETY: as above; shared access only loads the cell pointers and calls `EventSink::publish`
// (`Sync`).
unsafe impl<A: Sync> Sync for Instrumented<A> {}

impl<A> fmt::Debug for Instrumented<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instrumented")
            .field("enabled", &self.is_enabled())
            .field("has_sink", &self.has_sink())
            .field("stats", &self.stats())
            .finish()
    }
}

impl<A> Instrumented<A> {
    /// Counting (enabled), without a sink.
    pub const fn new(inner: A) -> Instrumented<A> {
        Instrumented {
            inner,
            enabled: AtomicBool::new(true),
            sink: AtomicPtr::new(ptr::null_mut()),
            cells: AtomicPtr::new(ptr::null_mut()),
            shared: Shared {
                approx_current: AtomicI64::new(0),
                peak: AtomicI64::new(0),
            },
            overflow: Slot::new(),
            slots: [const { Slot::new() }; MAX_THREAD_SLOTS],
        }
    }

    /// The wrapped allocator.
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// Switches counting and publishing on or off (off: every call goes straight to the
    /// wrapped allocator after one branch).
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Relaxed);
    }

    /// Whether counting is on.
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    /// Publishes every later allocation, free and realloc to `sink` (`None`: stop).
    ///
    /// The sink is called inside the allocator: it must not block or lock; allocations it makes
    /// anyway are counted but not published (the reentrancy guard). Setting a sink allocates a
    /// 16-byte cell (kept until this heap is dropped), so do it at start-up, not per event.
    pub fn set_sink(&self, sink: Option<&'static dyn EventSink>) {
        let cell = match sink {
            None => ptr::null_mut(),
            Some(sink) => {
                let cell = Box::into_raw(Box::new(SinkCell {
                    sink,
                    next: ptr::null_mut(),
                }));
                let mut head = self.cells.load(Acquire);
                loop {
                    // SAFETY: `cell` is ours alone until the exchange below publishes it.
                    unsafe { (*cell).next = head };
                    match self
                        .cells
                        .compare_exchange_weak(head, cell, AcqRel, Acquire)
                    {
                        Ok(_) => break,
                        Err(actual) => head = actual,
                    }
                }
                cell
            }
        };
        self.sink.store(cell, Release);
    }

    /// Whether a sink is set.
    pub fn has_sink(&self) -> bool {
        !self.sink.load(Relaxed).is_null()
    }

    /// The counters now, folded over all slots (each read relaxed: a consistent picture when
    /// no other thread allocates meanwhile, close to one otherwise).
    pub fn stats(&self) -> HeapStats {
        let mut current = 0i64;
        let mut stats = HeapStats::default();
        for slot in self.slots.iter().chain(std::iter::once(&self.overflow)) {
            current = current.wrapping_add(slot.current.load(Relaxed));
            stats.total_bytes = stats.total_bytes.wrapping_add(slot.total.load(Relaxed));
            stats.count = stats.count.wrapping_add(slot.allocs.load(Relaxed));
            stats.frees = stats.frees.wrapping_add(slot.frees.load(Relaxed));
            stats.reallocs = stats.reallocs.wrapping_add(slot.reallocs.load(Relaxed));
        }
        let peak = self.shared.peak.fetch_max(current, Relaxed).max(current);
        stats.current_bytes = current.max(0) as u64;
        stats.peak_bytes = peak.max(0) as u64;
        stats
    }

    /// Restarts the peak from the current bytes in use.
    pub fn reset_peak(&self) {
        let mut current = 0i64;
        for slot in self.slots.iter().chain(std::iter::once(&self.overflow)) {
            current = current.wrapping_add(slot.current.load(Relaxed));
        }
        self.shared.peak.store(
            current.max(self.shared.approx_current.load(Relaxed)),
            Relaxed,
        );
    }

    /// This thread's slot, and whether this thread owns it (else it is the shared overflow).
    #[inline(always)]
    fn slot(&self) -> (&Slot, bool) {
        let index = SLOT_INDEX.with(Cell::get);
        if (index as usize) < MAX_THREAD_SLOTS {
            return (&self.slots[index as usize], true);
        }
        if index == UNCLAIMED
            && let Some(index) = claim_slot()
        {
            return (&self.slots[index], true);
        }
        (&self.overflow, false)
    }

    /// Updates this thread's counters for an operation of `delta` net bytes, `bytes` newly
    /// allocated.
    #[inline(always)]
    fn record(&self, op: Op, delta: i64, bytes: u64) {
        let (slot, owned) = self.slot();
        if owned {
            // Only this thread writes its slot: load + store, no read-modify-write.
            #[inline(always)]
            fn bump(counter: &AtomicU64, n: u64) {
                counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
            }
            let current = slot.current.load(Relaxed).wrapping_add(delta);
            slot.current.store(current, Relaxed);
            match op {
                Op::Alloc => {
                    bump(&slot.total, bytes);
                    bump(&slot.allocs, 1);
                }
                Op::Free => bump(&slot.frees, 1),
                Op::Realloc => {
                    bump(&slot.total, bytes);
                    bump(&slot.allocs, 1);
                    bump(&slot.frees, 1);
                    bump(&slot.reallocs, 1);
                }
            }
            let pending = current.wrapping_sub(slot.published.load(Relaxed));
            if pending.unsigned_abs() >= PEAK_STEP_BYTES {
                slot.published.store(current, Relaxed);
                self.publish_delta(pending);
            }
        } else {
            slot.current.fetch_add(delta, Relaxed);
            match op {
                Op::Alloc => {
                    slot.total.fetch_add(bytes, Relaxed);
                    slot.allocs.fetch_add(1, Relaxed);
                }
                Op::Free => {
                    slot.frees.fetch_add(1, Relaxed);
                }
                Op::Realloc => {
                    slot.total.fetch_add(bytes, Relaxed);
                    slot.allocs.fetch_add(1, Relaxed);
                    slot.frees.fetch_add(1, Relaxed);
                    slot.reallocs.fetch_add(1, Relaxed);
                }
            }
            self.publish_delta(delta);
        }
    }

    /// Adds a slot's change to the shared approximate current and raises the peak.
    #[cold]
    fn publish_delta(&self, delta: i64) {
        let approx = self
            .shared
            .approx_current
            .fetch_add(delta, Relaxed)
            .wrapping_add(delta);
        if delta > 0 {
            self.shared.peak.fetch_max(approx, Relaxed);
        }
    }

    /// Publishes events to the sink, if one is set and this thread is not already publishing.
    #[inline(always)]
    fn emit(
        &self,
        first: (EventAction, *mut u8, usize),
        second: Option<(EventAction, *mut u8, usize)>,
    ) {
        let cell = self.sink.load(Acquire);
        if cell.is_null() {
            return;
        }
        self.emit_slow(cell, first, second);
    }

    #[cold]
    #[inline(never)]
    fn emit_slow(
        &self,
        cell: *mut SinkCell,
        first: (EventAction, *mut u8, usize),
        second: Option<(EventAction, *mut u8, usize)>,
    ) {
        if UNPUBLISHED_THREAD.with(Cell::get) {
            return;
        }
        let Some(_guard) = HookGuard::enter() else {
            return;
        };
        // SAFETY: non-null cells come from `set_sink`'s `Box::into_raw`, were fully written
        // before the Release store that published them (we loaded with Acquire), and are freed
        // only by `Drop`, which cannot run while `&self` is borrowed.
        let sink = unsafe { (*cell).sink };
        if !sink.enabled() {
            return;
        }
        let time_ns = now_ns();
        for (action, addr, size) in std::iter::once(first).chain(second) {
            let mut event = Event::new(
                action,
                CPU_DEVICE,
                EventPool::Host,
                addr as u64,
                size as u64,
            );
            event.time_ns = time_ns;
            if action == EventAction::Alloc {
                event.requested = size as u64;
            }
            sink.publish(&event);
        }
    }
}

impl<A> Drop for Instrumented<A> {
    fn drop(&mut self) {
        let mut cell = *self.cells.get_mut();
        while !cell.is_null() {
            // SAFETY: every cell in the list came from `Box::into_raw` in `set_sink` and is
            // freed once, here; `&mut self` means no thread is reading any of them.
            let boxed = unsafe { Box::from_raw(cell) };
            cell = boxed.next;
        }
    }
}

/// Runs `f` with this thread's allocations counted but not published to any sink.
///
/// For threads whose allocations should not become events: an observer's own thread (the
/// agent's aggregator, a thread draining the sink), whose allocations would otherwise feed
/// events back into the stream it is processing. It is the same per-thread flag that keeps a
/// sink from recursing into itself; nesting is fine.
///
/// # Examples
///
/// ```
/// use allocview_alloc::global::unpublished;
///
/// let report = unpublished(|| format!("{} events", 42));
/// assert_eq!(report, "42 events");
/// ```
pub fn unpublished<R>(f: impl FnOnce() -> R) -> R {
    let _guard = HookGuard::enter();
    f()
}

/// Marks this thread as inside the sink for as long as it lives.
struct HookGuard;

impl HookGuard {
    #[inline]
    fn enter() -> Option<HookGuard> {
        IN_HOOK.with(|inside| {
            if inside.get() {
                None
            } else {
                inside.set(true);
                Some(HookGuard)
            }
        })
    }
}

impl Drop for HookGuard {
    fn drop(&mut self) {
        IN_HOOK.with(|inside| inside.set(false));
    }
}

// SAFETY: every method forwards to `inner` with the caller's arguments unchanged and returns
// its result unchanged; the bookkeeping around it never allocates, never unwinds and never
// touches the memory.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Instrumented<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        let ptr = unsafe { self.inner.alloc(layout) };
        if self.enabled.load(Relaxed) && !ptr.is_null() {
            self.record(Op::Alloc, layout.size() as i64, layout.size() as u64);
            self.emit((EventAction::Alloc, ptr, layout.size()), None);
        }
        ptr
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed` is passed on unchanged.
        let ptr = unsafe { self.inner.alloc_zeroed(layout) };
        if self.enabled.load(Relaxed) && !ptr.is_null() {
            self.record(Op::Alloc, layout.size() as i64, layout.size() as u64);
            self.emit((EventAction::Alloc, ptr, layout.size()), None);
        }
        ptr
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Published before the memory goes back, so no other thread can be handed (and
        // publish) this address before its free is out.
        if self.enabled.load(Relaxed) {
            self.record(Op::Free, -(layout.size() as i64), 0);
            self.emit((EventAction::FreeCompleted, ptr, layout.size()), None);
        }
        // SAFETY: the caller's contract for `dealloc` is passed on unchanged.
        unsafe { self.inner.dealloc(ptr, layout) };
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc` is passed on unchanged.
        let new_ptr = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if self.enabled.load(Relaxed) && !new_ptr.is_null() {
            let delta = (new_size as i64).wrapping_sub(layout.size() as i64);
            self.record(Op::Realloc, delta, new_size as u64);
            self.emit(
                (EventAction::FreeCompleted, ptr, layout.size()),
                Some((EventAction::Alloc, new_ptr, new_size)),
            );
        }
        new_ptr
    }
}
