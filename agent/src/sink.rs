//! The event sink allocators publish into: a bounded lock-free channel, `try_send` only.
//!
//! The pattern is tokio-console's (console-subscriber): the producer never waits. A full
//! channel drops the event and counts the drop per action (relaxed atomics on cache lines of
//! their own, see below for how producers share them); the count travels with every
//! figure the agent shows, and the aggregator resynchronises from the allocator when it sees it
//! grow. The consumer is woken early, without a lock, when the channel reaches half capacity (or
//! at once for an OOM): an `AtomicBool` says a wake-up is pending, so only the first producer past
//! the mark pays for `Thread::unpark`.
//!
//! The channel is crossbeam's array flavour (a fixed ring of slots allocated once): `try_send`
//! reserves a slot with one compare-and-swap and writes the 64-byte [`Event`] into it, so
//! publishing allocates nothing.
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
//! An OOM event always probes the ring (it is rare and wakes the aggregator at once).
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
//! (`allocview_alloc::event::EventPool::Host`): an `alloc` adds, and a `free_requested` or a
//! `free_completed` (a producer sends one of the two per free) subtracts.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;

use allocview_alloc::event::{Event, EventAction, EventSink};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use crossbeam_utils::CachePadded;

/// Default channel capacity, in events (64 bytes each, so 4 MiB of slots).
///
/// Measured with `benches/pipeline.rs` on the shared 2-core development machine (CPU time):
/// a publish that takes a slot costs ~10 ns, a dropped one 2.4 ns (a flood into a live agent
/// averages 4-8 ns, most of it dropped), the aggregator folds a caching-allocator
/// event stream at about 20 M events/s, so a burst from a tight loop outruns it several times
/// over and only the channel absorbs the difference. The half-full wake-up starts a drain at
/// 32 Ki events; a PyTorch-like allocator (well under 1 M events/s, a cached malloc+free pair
/// costing ~140 ns and making 3 events) never fills 64 Ki slots between drains. A 1 M-event
/// burst from a tight loop dropped 93% at 64 Ki, 47% at 256 Ki and 93-99% at 1-16 Ki (noisy:
/// it depends on when the aggregator thread is scheduled); past 64 Ki the memory (16 MiB at
/// 256 Ki) buys protection only against such synthetic floods, and drops are counted and
/// resynchronised anyway. Raise it with
/// [`AgentBuilder::channel_capacity`](crate::agent::AgentBuilder::channel_capacity) for
/// allocation storms.
pub const DEFAULT_CHANNEL_CAPACITY: usize = 1 << 16;

/// A producer looks at the channel's fill level once per this many of its own publishes
/// (counted per thread, without atomics): `len()` reads both ends of the ring, cache lines the
/// consumer is writing, which would otherwise cost more than the send itself.
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

/// One row of per-action drop counters, on cache lines of its own.
type DropRow = CachePadded<[AtomicU64; EventAction::COUNT]>;

fn drop_row() -> DropRow {
    CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0)))
}

/// Smallest capacity accepted (a channel of one slot would wake the aggregator on every event).
pub const MIN_CHANNEL_CAPACITY: usize = 2;

/// The latch on a full channel is lifted after the consumer took this fraction of the capacity
/// (`capacity / RESUME_DIVISOR` events, at least one).
pub const RESUME_DIVISOR: usize = 64;

/// Counters and the wake-up flag shared by the sink and the aggregator.
#[derive(Debug)]
pub struct SinkShared {
    /// Rows `0..OWNED_DROP_SLOTS` are written by their thread only; the last row is shared.
    dropped: Box<[DropRow; OWNED_DROP_SLOTS + 1]>,
    wake_pending: CachePadded<AtomicBool>,
    /// Set by a publish that found the channel full; lifted by the consumer.
    full: CachePadded<AtomicBool>,
    consumer: OnceLock<Thread>,
    capacity: usize,
    half: usize,
    resume_interval: usize,
}

impl SinkShared {
    fn new(capacity: usize) -> SinkShared {
        SinkShared {
            dropped: Box::new(std::array::from_fn(|_| drop_row())),
            wake_pending: CachePadded::new(AtomicBool::new(false)),
            full: CachePadded::new(AtomicBool::new(false)),
            consumer: OnceLock::new(),
            capacity,
            half: (capacity / 2).max(1),
            resume_interval: (capacity / RESUME_DIVISOR).max(1),
        }
    }

    /// Events the consumer takes between two lifts of the full-channel latch.
    pub fn resume_interval(&self) -> usize {
        self.resume_interval
    }

    /// Whether publishes are dropping without probing the channel (it was found full and the
    /// consumer has not lifted the latch yet).
    pub fn is_latched_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }

    /// Lifts the full-channel latch (called by the consumer once it made room): the next
    /// publish probes the channel again. Writes the flag only when it is set, so a consumer
    /// calling this often does not take the line from the producers.
    #[inline]
    pub fn resume(&self) {
        if self.full.load(Ordering::Relaxed) {
            self.full.store(false, Ordering::Relaxed);
        }
    }

    /// Counts a dropped event and makes sure the consumer is coming.
    #[inline]
    fn drop_event(&self, action: EventAction) {
        let slot = drop_slot();
        let counter = &self.dropped[slot][action as usize];
        if slot < OWNED_DROP_SLOTS {
            // This thread is the row's only writer: no increment can be lost.
            counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        } else {
            counter.fetch_add(1, Ordering::Relaxed);
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

    /// The channel's capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
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

/// The [`EventSink`] the agent hands to allocators.
#[derive(Debug, Clone)]
pub struct ChannelSink {
    tx: Sender<Event>,
    shared: Arc<SinkShared>,
}

/// The consuming end of the channel (held by the aggregator).
#[derive(Debug)]
pub struct EventReceiver {
    rx: Receiver<Event>,
    shared: Arc<SinkShared>,
}

/// A bounded event channel of `capacity` events (at least [`MIN_CHANNEL_CAPACITY`]).
pub fn channel(capacity: usize) -> (ChannelSink, EventReceiver) {
    let capacity = capacity.max(MIN_CHANNEL_CAPACITY);
    let (tx, rx) = crossbeam_channel::bounded(capacity);
    let shared = Arc::new(SinkShared::new(capacity));
    (
        ChannelSink {
            tx,
            shared: shared.clone(),
        },
        EventReceiver { rx, shared },
    )
}

impl ChannelSink {
    /// The counters this sink shares with its receiver.
    pub fn shared(&self) -> &Arc<SinkShared> {
        &self.shared
    }
}

impl EventSink for ChannelSink {
    #[inline]
    fn publish(&self, event: &Event) {
        if self.shared.full.load(Ordering::Relaxed) && event.action != EventAction::Oom {
            self.shared.drop_event(event.action);
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
                    || (n.is_multiple_of(WAKE_CHECK_INTERVAL) && self.tx.len() >= self.shared.half)
                {
                    self.shared.wake();
                }
            }
            Err(TrySendError::Full(e)) => {
                self.shared.full.store(true, Ordering::Relaxed);
                self.shared.drop_event(e.action);
            }
            Err(TrySendError::Disconnected(e)) => self.shared.drop_event(e.action),
        }
    }
}

impl EventReceiver {
    /// The counters this receiver shares with its sinks.
    pub fn shared(&self) -> &Arc<SinkShared> {
        &self.shared
    }

    /// Takes one event if there is one; never blocks.
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

    /// Events waiting in the channel now.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// Whether no event is waiting.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
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
}
