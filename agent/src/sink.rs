//! The event sink allocators publish into: two bounded lock-free channels, `try_send` only.
//!
//! The pattern is tokio-console's (console-subscriber): the producer never waits. A full
//! channel drops the event and counts the drop per action (relaxed atomics on cache lines of
//! their own, see below for how producers share them); the count travels with every
//! figure the agent shows, and the aggregator resynchronises from the allocator when it sees it
//! grow. The consumer is woken early, without a lock, when a channel reaches half capacity (or
//! at once for an OOM): an `AtomicBool` says a wake-up is pending, so only the first producer past
//! the mark pays for `Thread::unpark`.
//!
//! Both channels are crossbeam's array flavour (a fixed ring of slots allocated once):
//! `try_send` reserves a slot with one compare-and-swap and writes the message into it, so
//! publishing allocates nothing.
//!
//! - The event channel carries one 64-byte [`Event`] per message: [`EventSink::publish`] (the
//!   tracking allocator and the instrumented global allocator publish single events). Its
//!   capacity is the configured one, in events.
//! - The batch channel carries one [`EventBatch`] per message, up to [`MAX_BATCH`] events of one
//!   producer in order (2056 bytes: the events inline and their count):
//!   [`EventSink::publish_batch`] (the caching allocator gathers its events under its own lock
//!   and publishes them this way). A batch is one reservation (one compare-and-swap on the
//!   ring's tail, one stamp) instead of one per event; the message is always the full 2 KiB
//!   (zero-filled past the batch's events: safe Rust moves the whole value). Measured with
//!   `benches/pipeline.rs` (CPU time, shared 2-core machine, ranges over runs): with nothing
//!   draining, a `publish` costs 9-10 ns and a `publish_batch` 35-51 ns for 1 event, 35-50 for
//!   4, 37-52 for 8, 44-56 for 16 and 53-66 for 32 (1.7-2.1 ns an event); with the aggregator
//!   draining on the other core, 32 events cost ~9 ns each one by one, ~3 ns in one batch and
//!   ~12-15 ns in batches of 4. So a batch pays off from about 4 events, and full batches are
//!   3-5 times cheaper per event. The caching allocator's cached `malloc` + `free` pair (2
//!   events, an `alloc` and a `free`, in batches of up to 32) measured 34.8 ns without a sink,
//!   50.1 ns with a sink that ignores its batches and 55.4 ns with this one, the aggregator
//!   draining on the other core: ~2.6 ns an event for the channel.
//!   Its capacity is [`batch_capacity_for`] the configured capacity: `capacity / MAX_BATCH`
//!   batches (at least [`MIN_CHANNEL_CAPACITY`]), so full batches hold as many events as the
//!   event channel, in about as much memory (2048 batches, 4 MiB, by default; the ring's size
//!   did not change the cost of a batch in the measurements).
//!
//! Events are ordered within a channel only: a producer must publish all of its events through
//! one of the two (the aggregator relies on one producer's order, for example an `alloc` before
//! the `free_requested` of the same block, or the snapshot marker a resync's fence waits for).
//! Every rule below holds for both channels, each with its own latch; a dropped batch counts
//! every one of its events, per action, in the same counters.
//!
//! A full channel is latched: finding out that the ring is full means reading the consumer's
//! head index and the slot it is about to take, cache lines the draining aggregator writes on
//! every event, so probing a full ring costs a cross-core cache miss per publish (measured: a
//! flooding publisher paid ~80 ns per event while the aggregator drained, against ~11 ns with
//! it parked). The first publish that finds the channel full sets a `full` flag; later
//! publishes see the flag (a line written once per latch) and drop at once, counted as any
//! other drop, without touching the ring. The aggregator lifts the latch when it starts a drain
//! and again after every [`resume_interval`](SinkShared::resume_interval) events it takes
//! (1/64th of the capacity), so at most that many free slots go unused while the latch holds:
//! a hysteresis of 1.6% of the ring in exchange for not fighting the consumer over its lines.
//! An OOM event always probes the ring (it is rare and wakes the aggregator at once), and so
//! does a batch holding one. The batch channel has a latch of its own, lifted with the event
//! channel's, and after every `batch_capacity / RESUME_DIVISOR` batches taken.
//!
//! Drop counts are exact without a locked read-modify-write per drop: a flood drops most of
//! its events, and a locked increment of a shared counter cost ~10 ns of the ~14 ns a publish
//! took while the aggregator drained (measured). Each producer thread gets, on its first drop,
//! a number for the whole process; the first [`OWNED_DROP_SLOTS`] threads own one row of
//! per-action counters in every sink and bump them with a plain load and store (one writer
//! per counter, so no update is lost); later threads share a row and use `fetch_add`. Readers
//! sum the rows.
//!
//! Host (CPU) allocators publish into the same sink with `EventPool::Host`
//! (`allocview_alloc::event::EventPool::Host`): an `alloc` adds, and a `free_requested`, a
//! `free_completed` or a `free` (a producer sends one of the three per free) subtracts.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;

use allocview_alloc::event::{Event, EventAction, EventSink, MAX_BATCH};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use crossbeam_utils::CachePadded;

/// Default channel capacity, in events (64 bytes each, 4.5 MiB of slots with crossbeam's stamps;
/// the batch channel gets 2048 batches of up to 32 events, another 4 MiB, see
/// [`batch_capacity_for`]).
///
/// Measured with `benches/pipeline.rs` on the shared 2-core development machine (CPU time):
/// a publish that takes a slot costs ~10 ns, a dropped one 2.4 ns (a flood into a live agent
/// averages 4-8 ns, most of it dropped), the aggregator folds a caching-allocator
/// event stream at about 20 M events/s, so a burst from a tight loop outruns it several times
/// over and only the channel absorbs the difference. The half-full wake-up starts a drain at
/// 32 Ki events in the event channel and at 1024 batches in the batch channel. The tracking and
/// instrumented global allocators fill the event channel; the caching allocator fills the batch
/// channel, whose 2048 batches hold 64 Ki events only when every batch is full (what its cached
/// `malloc` + `free` pair costs with this sink is measured in the module documentation).
/// A 1 M-event burst from a tight loop dropped 93% at 64 Ki, 47% at 256 Ki and 93-99% at
/// 1-16 Ki (noisy: it depends on when the aggregator thread is scheduled); past 64 Ki the memory
/// (16 MiB at 256 Ki) buys protection only against such synthetic floods, and drops are counted
/// and resynchronised anyway. Raise it with
/// [`AgentBuilder::channel_capacity`](crate::agent::AgentBuilder::channel_capacity) for
/// allocation storms.
pub const DEFAULT_CHANNEL_CAPACITY: usize = 1 << 16;

/// A producer looks at the event channel's fill level once per this many of its own single
/// publishes (counted per thread, without atomics): `len()` reads both ends of the ring, cache
/// lines the consumer is writing, which would otherwise cost more than the send itself. A batch
/// publish looks every time (once per up to [`MAX_BATCH`] events).
pub const WAKE_CHECK_INTERVAL: u32 = 16;

thread_local! {
    /// Publishes of this thread, for [`WAKE_CHECK_INTERVAL`]. A const-initialised `Cell` needs
    /// no destructor and no allocation, so this is safe inside a global allocator.
    static PUBLISHED: Cell<u32> = const { Cell::new(0) };
}

/// Producer threads that count their drops in a row of counters of their own (see the module
/// documentation); threads past this many share one row, with atomic adds.
pub const OWNED_DROP_SLOTS: usize = 32;

/// No drop slot taken yet (the thread has not dropped an event).
const NO_DROP_SLOT: u32 = u32::MAX;

/// Drop slots handed out in this process so far (one per thread that dropped an event).
static DROP_SLOTS_TAKEN: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's drop slot ([`NO_DROP_SLOT`] until its first drop). Const-initialised,
    /// without destructor or allocation, as [`PUBLISHED`].
    static DROP_SLOT: Cell<u32> = const { Cell::new(NO_DROP_SLOT) };
}

/// This thread's drop slot: below [`OWNED_DROP_SLOTS`] it owns that row of counters.
#[inline]
fn drop_slot() -> usize {
    DROP_SLOT.with(|c| {
        let mut slot = c.get();
        if slot == NO_DROP_SLOT {
            let taken = DROP_SLOTS_TAKEN.fetch_add(1, Ordering::Relaxed);
            slot = taken.min(OWNED_DROP_SLOTS) as u32;
            c.set(slot);
        }
        slot as usize
    })
}

/// Adds `n` to a drop counter of row `slot`: a plain load and store in a row the thread owns
/// (its only writer: no increment can be lost), an atomic add in the shared row.
#[inline]
fn add_drops(counter: &AtomicU64, n: u64, slot: usize) {
    if slot < OWNED_DROP_SLOTS {
        counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    } else {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// One row of per-action drop counters, on cache lines of its own.
type DropRow = CachePadded<[AtomicU64; EventAction::COUNT]>;

fn drop_row() -> DropRow {
    CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0)))
}

/// Devices whose dropped `oom` events are counted one by one (`cuda:0` to `cuda:63`).
pub const OOM_DROP_DEVICES: usize = 64;

/// Smallest capacity accepted (a channel of one slot would wake the aggregator on every event).
pub const MIN_CHANNEL_CAPACITY: usize = 2;

/// The latch on a full channel is lifted after the consumer took this fraction of its capacity
/// (`capacity / RESUME_DIVISOR` events from the event channel, `batch_capacity /
/// RESUME_DIVISOR` batches from the batch channel, at least one).
pub const RESUME_DIVISOR: usize = 64;

/// One channel's full-channel latch and fill marks (the event channel counts events, the batch
/// channel batches).
#[derive(Debug)]
struct Lane {
    /// Set by a publish that found the channel full; lifted by the consumer.
    full: CachePadded<AtomicBool>,
    capacity: usize,
    /// The fill level that wakes the consumer early.
    half: usize,
    /// Messages the consumer takes between two lifts of the latches.
    resume_interval: usize,
}

impl Lane {
    fn new(capacity: usize) -> Lane {
        Lane {
            full: CachePadded::new(AtomicBool::new(false)),
            capacity,
            half: (capacity / 2).max(1),
            resume_interval: (capacity / RESUME_DIVISOR).max(1),
        }
    }

    #[inline]
    fn is_latched(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }

    #[inline]
    fn latch(&self) {
        self.full.store(true, Ordering::Relaxed);
    }

    /// Lifts the latch, writing the flag only when it is set (so a consumer calling this often
    /// does not take the line from the producers).
    #[inline]
    fn lift(&self) {
        if self.is_latched() {
            self.full.store(false, Ordering::Relaxed);
        }
    }
}

/// Drop counters, full-channel latches and the wake-up flag shared by the sink and the
/// aggregator.
#[derive(Debug)]
pub struct SinkShared {
    /// Rows `0..OWNED_DROP_SLOTS` are written by their thread only; the last row is shared.
    dropped: Box<[DropRow; OWNED_DROP_SLOTS + 1]>,
    /// Dropped `oom` events per device (`0..OOM_DROP_DEVICES`; the last counts any other
    /// device): an OOM whose event was lost still gets a record on the right device.
    dropped_ooms: Box<[AtomicU64; OOM_DROP_DEVICES + 1]>,
    wake_pending: CachePadded<AtomicBool>,
    /// The event channel's latch and marks, in events.
    events: Lane,
    /// The batch channel's latch and marks, in batches.
    batches: Lane,
    consumer: OnceLock<Thread>,
}

impl SinkShared {
    fn new(capacity: usize, batch_capacity: usize) -> SinkShared {
        SinkShared {
            dropped: Box::new(std::array::from_fn(|_| drop_row())),
            dropped_ooms: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
            wake_pending: CachePadded::new(AtomicBool::new(false)),
            events: Lane::new(capacity),
            batches: Lane::new(batch_capacity),
            consumer: OnceLock::new(),
        }
    }

    /// Events the consumer takes from the event channel between two lifts of the full-channel
    /// latches.
    pub fn resume_interval(&self) -> usize {
        self.events.resume_interval
    }

    /// Batches the consumer takes from the batch channel between two lifts of the full-channel
    /// latches (`batch_capacity / RESUME_DIVISOR`, at least one).
    pub fn batch_resume_interval(&self) -> usize {
        self.batches.resume_interval
    }

    /// Whether publishes are dropping without probing the event channel (it was found full and
    /// the consumer has not lifted the latch yet).
    pub fn is_latched_full(&self) -> bool {
        self.events.is_latched()
    }

    /// Whether batch publishes are dropping without probing the batch channel (it was found
    /// full and the consumer has not lifted the latch yet).
    pub fn is_batch_latched_full(&self) -> bool {
        self.batches.is_latched()
    }

    /// Lifts both full-channel latches (called by the consumer once it made room): the next
    /// publish or batch publish probes its channel again. Writes a flag only when it is set,
    /// so a consumer calling this often does not take the lines from the producers.
    #[inline]
    pub fn resume(&self) {
        self.events.lift();
        self.batches.lift();
    }

    /// Counts a dropped event and makes sure the consumer is coming.
    #[inline]
    fn drop_event(&self, e: &Event) {
        let slot = drop_slot();
        add_drops(&self.dropped[slot][e.action as usize], 1, slot);
        if e.action == EventAction::Oom {
            self.drop_oom(e.device);
        }
        self.wake();
    }

    /// Counts a dropped `oom` event of `device` (rare: a relaxed add on a shared counter).
    #[cold]
    fn drop_oom(&self, device: i16) {
        let i = usize::try_from(device).map_or(OOM_DROP_DEVICES, |d| d.min(OOM_DROP_DEVICES));
        self.dropped_ooms[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Dropped `oom` events per device: index `d` counts device `d`, the last index the others
    /// (negative, or at or past [`OOM_DROP_DEVICES`]) together.
    pub fn dropped_ooms_by_device(&self) -> [u64; OOM_DROP_DEVICES + 1] {
        std::array::from_fn(|i| self.dropped_ooms[i].load(Ordering::Relaxed))
    }

    /// Counts every event of a dropped batch, per action (one add per action present, not
    /// one per event), and makes sure the consumer is coming (once for the batch).
    fn drop_events(&self, events: &[Event]) {
        let mut counts = [0u64; EventAction::COUNT];
        for e in events {
            counts[e.action as usize] += 1;
        }
        if counts[EventAction::Oom as usize] > 0 {
            for e in events.iter().filter(|e| e.action == EventAction::Oom) {
                self.drop_oom(e.device);
            }
        }
        let slot = drop_slot();
        for (counter, &n) in self.dropped[slot].iter().zip(&counts) {
            if n > 0 {
                add_drops(counter, n, slot);
            }
        }
        self.wake();
    }

    /// Events dropped so far, per action (indexed by the action's discriminant).
    pub fn dropped_by_action(&self) -> [u64; EventAction::COUNT] {
        let rows = self.rows_in_use();
        std::array::from_fn(|i| rows.clone().map(|r| r[i].load(Ordering::Relaxed)).sum())
    }

    /// The rows that can hold counts: those of the slots handed out so far, and the shared one.
    fn rows_in_use(&self) -> impl Iterator<Item = &DropRow> + Clone {
        let owned = DROP_SLOTS_TAKEN
            .load(Ordering::Relaxed)
            .min(OWNED_DROP_SLOTS);
        self.dropped[..owned]
            .iter()
            .chain(&self.dropped[OWNED_DROP_SLOTS..])
    }

    /// Events dropped so far, all actions together.
    pub fn dropped_total(&self) -> u64 {
        self.rows_in_use()
            .flat_map(|r| r.iter())
            .map(|d| d.load(Ordering::Relaxed))
            .sum()
    }

    /// The event channel's capacity, in events (the configured capacity).
    pub fn capacity(&self) -> usize {
        self.events.capacity
    }

    /// The batch channel's capacity, in batches (see [`batch_capacity_for`]).
    pub fn batch_capacity(&self) -> usize {
        self.batches.capacity
    }

    /// Registers the thread that [`wake`](Self::wake) unparks (the aggregator). Only the first
    /// registration counts.
    pub fn set_consumer(&self, thread: Thread) {
        let _ = self.consumer.set(thread);
    }

    /// Wakes the consumer unless a wake-up is already pending. Lock-free.
    #[inline]
    pub fn wake(&self) {
        if !self.wake_pending.load(Ordering::Relaxed)
            && !self.wake_pending.swap(true, Ordering::AcqRel)
            && let Some(t) = self.consumer.get()
        {
            t.unpark();
        }
    }

    /// Called by the consumer before it drains: later producers past the mark wake it again.
    pub fn clear_wake(&self) {
        self.wake_pending.store(false, Ordering::Release);
    }
}

/// A batch of at most [`MAX_BATCH`] events of one producer, in order: the batch channel's
/// message.
///
/// Layout: the events inline (`[Event; MAX_BATCH]`, 2048 bytes) and the count of those in use
/// (a `u32`, padded to 8 bytes): 2056 bytes, `Copy`, built on the stack without allocating.
/// Slots past `len` hold zeroed events and are never read as events.
#[derive(Clone, Copy)]
pub struct EventBatch {
    events: [Event; MAX_BATCH],
    len: u32,
}

impl EventBatch {
    /// A batch of `events` (at most [`MAX_BATCH`]; callers split longer slices).
    #[inline]
    fn new(events: &[Event]) -> EventBatch {
        debug_assert!(events.len() <= MAX_BATCH);
        let len = events.len().min(MAX_BATCH);
        // A zero fill and one copy over it: building the array element by element
        // (`array::from_fn`) measured twice as slow.
        let mut batch = EventBatch {
            events: [Event::EMPTY; MAX_BATCH],
            len: len as u32,
        };
        batch.events[..len].copy_from_slice(&events[..len]);
        batch
    }

    /// The batch's events, in the order they were published.
    #[inline]
    pub fn events(&self) -> &[Event] {
        &self.events[..self.len as usize]
    }

    /// Number of events in the batch.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the batch holds no event (a sink never sends one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for EventBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.events()).finish()
    }
}

/// The batch channel's capacity for a configured capacity of `capacity` events:
/// `capacity / MAX_BATCH` batches, at least [`MIN_CHANNEL_CAPACITY`]. Full batches then hold
/// as many events as the event channel, in about as much memory (2056 bytes a batch against 64
/// a single event, plus crossbeam's 8-byte stamp per slot): the default 64 Ki events give the
/// event channel 4.5 MiB of slots and the batch channel 2048 batches, 4 MiB.
pub fn batch_capacity_for(capacity: usize) -> usize {
    (capacity / MAX_BATCH).max(MIN_CHANNEL_CAPACITY)
}

/// The [`EventSink`] the agent hands to allocators.
#[derive(Debug, Clone)]
pub struct ChannelSink {
    tx: Sender<Event>,
    batch_tx: Sender<EventBatch>,
    shared: Arc<SinkShared>,
}

/// The consuming ends of the two channels (held by the aggregator).
#[derive(Debug)]
pub struct EventReceiver {
    rx: Receiver<Event>,
    batch_rx: Receiver<EventBatch>,
    shared: Arc<SinkShared>,
}

/// A bounded event channel of `capacity` events (at least [`MIN_CHANNEL_CAPACITY`]) and, beside
/// it, a batch channel of [`batch_capacity_for`]`(capacity)` batches.
pub fn channel(capacity: usize) -> (ChannelSink, EventReceiver) {
    let capacity = capacity.max(MIN_CHANNEL_CAPACITY);
    let batch_capacity = batch_capacity_for(capacity);
    let (tx, rx) = crossbeam_channel::bounded(capacity);
    let (batch_tx, batch_rx) = crossbeam_channel::bounded(batch_capacity);
    let shared = Arc::new(SinkShared::new(capacity, batch_capacity));
    (
        ChannelSink {
            tx,
            batch_tx,
            shared: shared.clone(),
        },
        EventReceiver {
            rx,
            batch_rx,
            shared,
        },
    )
}

impl ChannelSink {
    /// The counters this sink shares with its receiver.
    pub fn shared(&self) -> &Arc<SinkShared> {
        &self.shared
    }

    /// Publishes one batch of at most [`MAX_BATCH`] events: one `try_send` of an
    /// [`EventBatch`], or, latched or full, every event counted as dropped.
    #[inline]
    fn publish_chunk(&self, events: &[Event]) {
        let has_oom = events.iter().any(|e| e.action == EventAction::Oom);
        if self.shared.batches.is_latched() && !has_oom {
            self.shared.drop_events(events);
            return;
        }
        match self.batch_tx.try_send(EventBatch::new(events)) {
            Ok(()) => {
                // The fill level is read on every batch: checking every 4th batch instead (as
                // `publish` does every WAKE_CHECK_INTERVAL events) measured no difference,
                // the read being paid once per up to MAX_BATCH events.
                if has_oom || self.batch_tx.len() >= self.shared.batches.half {
                    self.shared.wake();
                }
            }
            Err(TrySendError::Full(_)) => {
                self.shared.batches.latch();
                self.shared.drop_events(events);
            }
            Err(TrySendError::Disconnected(_)) => self.shared.drop_events(events),
        }
    }
}

impl EventSink for ChannelSink {
    #[inline]
    fn publish(&self, event: &Event) {
        if self.shared.events.is_latched() && event.action != EventAction::Oom {
            self.shared.drop_event(event);
            return;
        }
        match self.tx.try_send(*event) {
            Ok(()) => {
                let n = PUBLISHED.with(|c| {
                    let n = c.get().wrapping_add(1);
                    c.set(n);
                    n
                });
                if event.action == EventAction::Oom
                    || (n.is_multiple_of(WAKE_CHECK_INTERVAL)
                        && self.tx.len() >= self.shared.events.half)
                {
                    self.shared.wake();
                }
            }
            Err(TrySendError::Full(e)) => {
                self.shared.events.latch();
                self.shared.drop_event(&e);
            }
            Err(TrySendError::Disconnected(e)) => self.shared.drop_event(&e),
        }
    }

    /// One `try_send` into the batch channel per [`MAX_BATCH`] events (a longer slice is split,
    /// in order; an empty one sends nothing). The rules of [`publish`](Self::publish) hold per
    /// batch: a latched or full batch channel drops the whole batch and counts every event per
    /// action; a batch holding an OOM probes the channel whatever the latch and wakes the
    /// aggregator at once.
    #[inline]
    fn publish_batch(&self, events: &[Event]) {
        for chunk in events.chunks(MAX_BATCH) {
            self.publish_chunk(chunk);
        }
    }
}

impl EventReceiver {
    /// The counters this receiver shares with its sinks.
    pub fn shared(&self) -> &Arc<SinkShared> {
        &self.shared
    }

    /// Takes one event from the event channel if there is one; never blocks.
    #[inline]
    pub fn try_recv(&self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    /// [`try_recv`](Self::try_recv) as the channel answers it: the event is written straight
    /// into the caller's `Result`, without the copy a conversion to `Option` makes (the
    /// aggregator receives one event ahead and wants that copy out of the cache miss's way).
    #[inline]
    pub(crate) fn try_recv_in_place(&self) -> Result<Event, crossbeam_channel::TryRecvError> {
        self.rx.try_recv()
    }

    /// Takes one batch from the batch channel if there is one; never blocks.
    #[inline]
    pub fn try_recv_batch(&self) -> Option<EventBatch> {
        self.batch_rx.try_recv().ok()
    }

    /// [`try_recv_batch`](Self::try_recv_batch) without the conversion to `Option`, which
    /// would copy the 2 KiB message once more.
    #[inline]
    pub(crate) fn try_recv_batch_in_place(
        &self,
    ) -> Result<EventBatch, crossbeam_channel::TryRecvError> {
        self.batch_rx.try_recv()
    }

    /// Single events waiting in the event channel now.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// Batches waiting in the batch channel now.
    pub fn batch_len(&self) -> usize {
        self.batch_rx.len()
    }

    /// At least as many events as wait in both channels now: the single events, and
    /// [`MAX_BATCH`] per waiting batch (a batch's length is only known once it is taken).
    pub fn pending_events_bound(&self) -> usize {
        self.len() + self.batch_len() * MAX_BATCH
    }

    /// Whether neither channel holds anything.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty() && self.batch_rx.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocview_alloc::event::EventPool;

    fn ev(action: EventAction) -> Event {
        Event::new(action, 0, EventPool::Large, 0x1000, 512)
    }

    #[test]
    fn a_full_channel_drops_and_counts_per_action() {
        let (sink, rx) = channel(4);
        for _ in 0..4 {
            sink.publish(&ev(EventAction::Alloc));
        }
        sink.publish(&ev(EventAction::Alloc));
        sink.publish(&ev(EventAction::FreeCompleted));
        sink.publish(&ev(EventAction::FreeCompleted));
        let d = rx.shared().dropped_by_action();
        assert_eq!(d[EventAction::Alloc as usize], 1);
        assert_eq!(d[EventAction::FreeCompleted as usize], 2);
        assert_eq!(rx.shared().dropped_total(), 3);
        assert_eq!(rx.len(), 4);
        assert_eq!(rx.try_recv(), Some(ev(EventAction::Alloc)));
    }

    #[test]
    fn reaching_half_capacity_sets_the_wake_flag() {
        let cap = 4 * WAKE_CHECK_INTERVAL as usize;
        let (sink, rx) = channel(cap);
        rx.shared().set_consumer(std::thread::current());
        for _ in 0..WAKE_CHECK_INTERVAL {
            sink.publish(&ev(EventAction::Alloc));
        }
        assert!(
            !rx.shared().wake_pending.load(Ordering::Relaxed),
            "below half"
        );
        for _ in 0..cap / 2 {
            sink.publish(&ev(EventAction::Alloc));
        }
        assert!(rx.shared().wake_pending.load(Ordering::Relaxed));
        rx.shared().clear_wake();
        assert!(!rx.shared().wake_pending.load(Ordering::Relaxed));
    }

    #[test]
    fn a_full_channel_latches_until_the_consumer_resumes_it() {
        let cap = 2 * RESUME_DIVISOR;
        let (sink, rx) = channel(cap);
        for _ in 0..cap {
            sink.publish(&ev(EventAction::Alloc));
        }
        assert!(
            !rx.shared().is_latched_full(),
            "full, but not found full yet"
        );
        sink.publish(&ev(EventAction::FreeRequested));
        assert!(rx.shared().is_latched_full());
        // Room made without lifting the latch: publishes still drop, and are counted.
        assert_eq!(rx.try_recv(), Some(ev(EventAction::Alloc)));
        sink.publish(&ev(EventAction::FreeCompleted));
        let d = rx.shared().dropped_by_action();
        assert_eq!(d[EventAction::FreeRequested as usize], 1);
        assert_eq!(d[EventAction::FreeCompleted as usize], 1);
        assert_eq!(rx.len(), cap - 1);
        rx.shared().resume();
        assert!(!rx.shared().is_latched_full());
        sink.publish(&ev(EventAction::FreeCompleted));
        assert_eq!(
            rx.len(),
            cap,
            "the freed slot is used once the latch is lifted"
        );
        assert_eq!(rx.shared().dropped_total(), 2);
        assert_eq!(rx.shared().resume_interval(), 2);
    }

    #[test]
    fn an_oom_probes_the_channel_even_while_latched() {
        let (sink, rx) = channel(4);
        for _ in 0..5 {
            sink.publish(&ev(EventAction::Alloc));
        }
        assert!(rx.shared().is_latched_full());
        assert_eq!(rx.try_recv(), Some(ev(EventAction::Alloc)));
        sink.publish(&ev(EventAction::Oom));
        assert_eq!(rx.len(), 4, "the OOM took the free slot");
        assert_eq!(
            rx.shared().dropped_by_action()[EventAction::Oom as usize],
            0
        );
    }

    #[test]
    fn drops_from_more_threads_than_owned_rows_are_all_counted() {
        let (sink, rx) = channel(2);
        sink.publish(&ev(EventAction::Alloc));
        sink.publish(&ev(EventAction::Alloc));
        let threads = OWNED_DROP_SLOTS + 8;
        let per_thread = 1_000u64;
        std::thread::scope(|s| {
            for t in 0..threads {
                let sink = sink.clone();
                s.spawn(move || {
                    let action = if t % 2 == 0 {
                        EventAction::FreeRequested
                    } else {
                        EventAction::SegmentFree
                    };
                    for _ in 0..per_thread {
                        sink.publish(&ev(action));
                    }
                });
            }
        });
        let d = rx.shared().dropped_by_action();
        let half = (threads as u64 / 2) * per_thread;
        assert_eq!(d[EventAction::FreeRequested as usize], half);
        assert_eq!(d[EventAction::SegmentFree as usize], half);
        assert_eq!(rx.shared().dropped_total(), threads as u64 * per_thread);
        assert_eq!(rx.len(), 2);
    }

    #[test]
    fn an_oom_wakes_the_consumer_at_once() {
        let (sink, rx) = channel(1024);
        sink.publish(&ev(EventAction::Oom));
        assert!(rx.shared().wake_pending.load(Ordering::Relaxed));
    }

    fn numbered(action: EventAction, i: u64) -> Event {
        Event {
            time_ns: i,
            ..Event::new(action, 0, EventPool::Large, 0x1000 + i, 512)
        }
    }

    fn received_batches(rx: &EventReceiver) -> Vec<Vec<Event>> {
        std::iter::from_fn(|| rx.try_recv_batch())
            .map(|b| b.events().to_vec())
            .collect()
    }

    #[test]
    fn a_batch_publish_delivers_all_events_in_order_as_one_message() {
        let (sink, rx) = channel(1024);
        let events: Vec<Event> = (0..20).map(|i| numbered(EventAction::Alloc, i)).collect();
        sink.publish_batch(&events);
        sink.publish_batch(&events[..3]);
        assert_eq!(rx.batch_len(), 2);
        assert_eq!(rx.len(), 0, "batches do not go through the event channel");
        assert_eq!(rx.pending_events_bound(), 2 * MAX_BATCH);
        let got = received_batches(&rx);
        assert_eq!(got, vec![events.clone(), events[..3].to_vec()]);
        assert!(rx.is_empty());
        assert_eq!(rx.shared().dropped_total(), 0);
    }

    #[test]
    fn an_empty_batch_publishes_nothing() {
        let (sink, rx) = channel(1024);
        sink.publish_batch(&[]);
        assert!(rx.is_empty());
        assert_eq!(rx.shared().dropped_total(), 0);
    }

    #[test]
    fn an_oversized_slice_is_split_into_batches_of_at_most_max_batch_in_order() {
        let (sink, rx) = channel(1024);
        let n = 2 * MAX_BATCH as u64 + 5;
        let events: Vec<Event> = (0..n).map(|i| numbered(EventAction::Alloc, i)).collect();
        sink.publish_batch(&events);
        let got = received_batches(&rx);
        let sizes: Vec<usize> = got.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![MAX_BATCH, MAX_BATCH, 5]);
        assert_eq!(got.concat(), events);
    }

    #[test]
    fn a_full_batch_channel_drops_whole_batches_and_counts_every_event_per_action() {
        let (sink, rx) = channel(4 * MAX_BATCH);
        assert_eq!(rx.shared().batch_capacity(), 4);
        let one = [numbered(EventAction::Alloc, 0)];
        for _ in 0..4 {
            sink.publish_batch(&one);
        }
        assert!(!rx.shared().is_batch_latched_full());
        // Several actions in one dropped batch: 3 alloc, 2 free_requested, 1 segment_alloc.
        let mixed = [
            numbered(EventAction::SegmentAlloc, 1),
            numbered(EventAction::Alloc, 2),
            numbered(EventAction::FreeRequested, 3),
            numbered(EventAction::Alloc, 4),
            numbered(EventAction::FreeRequested, 5),
            numbered(EventAction::Alloc, 6),
        ];
        sink.publish_batch(&mixed);
        assert!(rx.shared().is_batch_latched_full());
        // Latched: dropped without probing, counted the same way; an oversized slice too.
        let long: Vec<Event> = (0..MAX_BATCH as u64 + 3)
            .map(|i| numbered(EventAction::FreeCompleted, i))
            .collect();
        sink.publish_batch(&long);
        let d = rx.shared().dropped_by_action();
        assert_eq!(d[EventAction::Alloc as usize], 3);
        assert_eq!(d[EventAction::FreeRequested as usize], 2);
        assert_eq!(d[EventAction::SegmentAlloc as usize], 1);
        assert_eq!(d[EventAction::FreeCompleted as usize], MAX_BATCH as u64 + 3);
        assert_eq!(rx.shared().dropped_total(), 6 + MAX_BATCH as u64 + 3);
        assert_eq!(rx.batch_len(), 4, "the batches that fitted are intact");
        // The event channel has its own latch: single events still go through.
        assert!(!rx.shared().is_latched_full());
        sink.publish(&numbered(EventAction::Alloc, 9));
        assert_eq!(rx.len(), 1);
        // Room made and the latch lifted: the next batch goes through.
        assert_eq!(rx.try_recv_batch().map(|b| b.len()), Some(1));
        rx.shared().resume();
        assert!(!rx.shared().is_batch_latched_full());
        sink.publish_batch(&mixed);
        assert_eq!(rx.batch_len(), 4);
        assert_eq!(rx.shared().dropped_total(), 6 + MAX_BATCH as u64 + 3);
    }

    #[test]
    fn an_oom_inside_a_batch_probes_past_the_latch_and_wakes_the_consumer() {
        let (sink, rx) = channel(2 * MAX_BATCH);
        rx.shared().set_consumer(std::thread::current());
        let plain = [numbered(EventAction::Alloc, 0)];
        for _ in 0..3 {
            sink.publish_batch(&plain);
        }
        assert!(rx.shared().is_batch_latched_full());
        assert_eq!(rx.shared().dropped_total(), 1);
        assert!(rx.try_recv_batch().is_some());
        rx.shared().clear_wake();
        // Latched, with room: a batch without an OOM still drops.
        sink.publish_batch(&plain);
        assert_eq!(rx.batch_len(), 1);
        assert_eq!(rx.shared().dropped_total(), 2);
        rx.shared().clear_wake();
        let with_oom = [
            numbered(EventAction::AllocRetry, 1),
            numbered(EventAction::Oom, 2),
        ];
        sink.publish_batch(&with_oom);
        assert_eq!(rx.batch_len(), 2, "the OOM's batch took the free slot");
        assert!(rx.shared().wake_pending.load(Ordering::Relaxed));
        assert_eq!(
            rx.shared().dropped_by_action()[EventAction::Oom as usize],
            0
        );
        assert_eq!(received_batches(&rx)[1], with_oom.to_vec());
    }

    #[test]
    fn an_oom_batch_wakes_the_consumer_at_once() {
        let (sink, rx) = channel(1024);
        rx.shared().set_consumer(std::thread::current());
        sink.publish_batch(&[numbered(EventAction::Alloc, 0)]);
        assert!(!rx.shared().wake_pending.load(Ordering::Relaxed));
        sink.publish_batch(&[numbered(EventAction::Oom, 1)]);
        assert!(rx.shared().wake_pending.load(Ordering::Relaxed));
    }

    #[test]
    fn reaching_half_of_the_batch_channel_sets_the_wake_flag() {
        let batch_cap = 32;
        let (sink, rx) = channel(batch_cap * MAX_BATCH);
        assert_eq!(rx.shared().batch_capacity(), batch_cap);
        rx.shared().set_consumer(std::thread::current());
        let one = [numbered(EventAction::Alloc, 0)];
        for _ in 0..batch_cap / 2 - 1 {
            sink.publish_batch(&one);
        }
        assert!(
            !rx.shared().wake_pending.load(Ordering::Relaxed),
            "below half"
        );
        sink.publish_batch(&one);
        assert!(rx.shared().wake_pending.load(Ordering::Relaxed));
        assert_eq!(rx.shared().dropped_total(), 0);
    }

    #[test]
    fn a_disconnected_batch_channel_counts_every_event_as_dropped() {
        let (sink, rx) = channel(1024);
        drop(rx);
        sink.publish_batch(&[
            numbered(EventAction::Alloc, 0),
            numbered(EventAction::FreeRequested, 1),
            numbered(EventAction::Alloc, 2),
        ]);
        sink.publish(&numbered(EventAction::SegmentFree, 3));
        let d = sink.shared().dropped_by_action();
        assert_eq!(d[EventAction::Alloc as usize], 2);
        assert_eq!(d[EventAction::FreeRequested as usize], 1);
        assert_eq!(d[EventAction::SegmentFree as usize], 1);
        assert_eq!(sink.shared().dropped_total(), 4);
    }

    #[test]
    fn the_batch_channel_holds_as_many_events_as_the_event_channel() {
        assert_eq!(
            batch_capacity_for(DEFAULT_CHANNEL_CAPACITY) * MAX_BATCH,
            DEFAULT_CHANNEL_CAPACITY
        );
        assert_eq!(batch_capacity_for(1), MIN_CHANNEL_CAPACITY);
        let (_, rx) = channel(0);
        assert_eq!(rx.shared().capacity(), MIN_CHANNEL_CAPACITY);
        assert_eq!(rx.shared().batch_capacity(), MIN_CHANNEL_CAPACITY);
        assert_eq!(rx.shared().batch_resume_interval(), 1);
    }
}
