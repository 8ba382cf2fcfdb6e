//! [`Ring`]: the bounded multi-producer, single-consumer event queue behind the sink.
//!
//! Dmitry Vyukov's bounded MPMC queue, as crossbeam's array channel implements it (the slot
//! stamps, the lap encoding of positions, the full and empty tests are crossbeam's), with the
//! consumer side simplified for the one consumer the agent has: the aggregator advances the
//! head with a plain store instead of a compare-and-swap, and the channel's waker bookkeeping
//! is gone (the aggregator never blocks in a receive; the sink wakes it with `unpark`).
//!
//! Each slot holds an [`Event`] as eight `AtomicU64` words (relaxed loads and stores, ordered
//! by the slot's stamp: release after writing, acquire before reading), so the queue needs no
//! `unsafe` and publishing an event allocates nothing: the slots are allocated once.
//!
//! A producer reserves a slot with one compare-and-swap on the tail, writes the words and
//! publishes them by storing the stamp; a full queue is answered at once. The consumer reads
//! the slot at the head when its stamp says it was written; when a producer has reserved it
//! but not finished writing, the consumer waits for it with a backoff (a few instructions,
//! unless that producer was preempted), as crossbeam's `try_recv` does, so events leave in the
//! order their slots were reserved and none published before a flush is missed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

use allocview_alloc::event::{Event, EventAction, EventPool};
use crossbeam_utils::{Backoff, CachePadded};

/// Words of an encoded event.
const WORDS: usize = 8;

/// One slot: the stamp says which lap may read or write it.
#[derive(Debug)]
struct Slot {
    stamp: AtomicU64,
    words: [AtomicU64; WORDS],
}

/// Why an event was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PushError {
    /// Every slot is taken.
    Full,
    /// The consumer is gone.
    Disconnected,
}

/// The queue.
#[derive(Debug)]
pub(crate) struct Ring {
    /// Position of the next slot to read: index in the low bits, lap above.
    head: CachePadded<AtomicU64>,
    /// Position of the next slot to write.
    tail: CachePadded<AtomicU64>,
    slots: Box<[Slot]>,
    /// Events the queue holds at most.
    cap: u64,
    /// A power of two above `cap`: positions are `lap * one_lap + index`.
    one_lap: u64,
    disconnected: AtomicBool,
}

fn encode(e: &Event) -> [u64; WORDS] {
    let r = e._reserved;
    [
        e.time_ns,
        e.addr,
        e.size,
        e.requested,
        e.stream,
        e.pool_id,
        u64::from(e.latency_ns) | u64::from(e.context) << 32,
        u64::from(e.device as u16)
            | u64::from(e.action as u8) << 16
            | u64::from(e.pool as u8) << 24
            | u64::from(e.flags) << 32
            | u64::from(r[0]) << 40
            | u64::from(r[1]) << 48
            | u64::from(r[2]) << 56,
    ]
}

fn decode(w: [u64; WORDS]) -> Event {
    let byte = |shift: u32| (w[7] >> shift) as u8;
    Event {
        time_ns: w[0],
        addr: w[1],
        size: w[2],
        requested: w[3],
        stream: w[4],
        pool_id: w[5],
        latency_ns: w[6] as u32,
        context: (w[6] >> 32) as u32,
        device: w[7] as u16 as i16,
        // Only `encode` wrote these bytes, from valid values.
        action: EventAction::from_u8(byte(16)).unwrap_or(EventAction::UserDefined),
        pool: match byte(24) {
            0 => EventPool::Small,
            1 => EventPool::Large,
            _ => EventPool::Host,
        },
        flags: byte(32),
        _reserved: [byte(40), byte(48), byte(56)],
    }
}

impl Ring {
    /// A queue of `cap` events (at least 1).
    pub(crate) fn new(cap: usize) -> Ring {
        let cap = cap.max(1) as u64;
        Ring {
            head: CachePadded::new(AtomicU64::new(0)),
            tail: CachePadded::new(AtomicU64::new(0)),
            slots: (0..cap)
                .map(|i| Slot {
                    stamp: AtomicU64::new(i),
                    words: std::array::from_fn(|_| AtomicU64::new(0)),
                })
                .collect(),
            cap,
            one_lap: (cap + 1).next_power_of_two(),
            disconnected: AtomicBool::new(false),
        }
    }

    /// The position after `pos`.
    #[inline]
    fn next(&self, pos: u64) -> u64 {
        let index = pos & (self.one_lap - 1);
        if index + 1 < self.cap {
            pos + 1
        } else {
            (pos & !(self.one_lap - 1)).wrapping_add(self.one_lap)
        }
    }

    /// Queues `e` unless the queue is full or the consumer gone; never blocks or allocates.
    #[inline]
    pub(crate) fn push(&self, e: &Event) -> Result<(), PushError> {
        if self.disconnected.load(Ordering::Relaxed) {
            return Err(PushError::Disconnected);
        }
        let backoff = Backoff::new();
        let mut tail = self.tail.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[(tail & (self.one_lap - 1)) as usize];
            let stamp = slot.stamp.load(Ordering::Acquire);
            if tail == stamp {
                match self.tail.compare_exchange_weak(
                    tail,
                    self.next(tail),
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        for (w, v) in slot.words.iter().zip(encode(e)) {
                            w.store(v, Ordering::Relaxed);
                        }
                        slot.stamp.store(tail + 1, Ordering::Release);
                        return Ok(());
                    }
                    Err(t) => {
                        tail = t;
                        backoff.spin();
                    }
                }
            } else if stamp.wrapping_add(self.one_lap) == tail + 1 {
                // The slot still holds the previous lap's event: full unless the head moved.
                fence(Ordering::SeqCst);
                let head = self.head.load(Ordering::Relaxed);
                if head.wrapping_add(self.one_lap) == tail {
                    return Err(PushError::Full);
                }
                backoff.spin();
                tail = self.tail.load(Ordering::Relaxed);
            } else {
                // Another producer moved the tail past this slot meanwhile: look again.
                backoff.snooze();
                tail = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Takes the oldest event, if any. Only the one consumer may call this.
    #[inline]
    pub(crate) fn pop(&self) -> Option<Event> {
        let backoff = Backoff::new();
        let head = self.head.load(Ordering::Relaxed);
        let slot = &self.slots[(head & (self.one_lap - 1)) as usize];
        loop {
            let stamp = slot.stamp.load(Ordering::Acquire);
            if head + 1 == stamp {
                let words = std::array::from_fn(|i| slot.words[i].load(Ordering::Relaxed));
                slot.stamp
                    .store(head.wrapping_add(self.one_lap), Ordering::Release);
                self.head.store(self.next(head), Ordering::Release);
                return Some(decode(words));
            }
            if stamp == head {
                // Not written this lap: empty, unless a producer reserved it and is writing.
                fence(Ordering::SeqCst);
                if self.tail.load(Ordering::Relaxed) == head {
                    return None;
                }
            }
            backoff.snooze();
        }
    }

    /// Events queued now.
    pub(crate) fn len(&self) -> usize {
        loop {
            let tail = self.tail.load(Ordering::SeqCst);
            let head = self.head.load(Ordering::SeqCst);
            if self.tail.load(Ordering::SeqCst) == tail {
                let hix = head & (self.one_lap - 1);
                let tix = tail & (self.one_lap - 1);
                return if hix < tix {
                    (tix - hix) as usize
                } else if hix > tix {
                    (self.cap - hix + tix) as usize
                } else if tail == head {
                    0
                } else {
                    self.cap as usize
                };
            }
        }
    }

    /// Producers fail from now on (the consumer is gone).
    pub(crate) fn disconnect(&self) {
        self.disconnected.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(i: u64) -> Event {
        Event {
            time_ns: i,
            latency_ns: i as u32,
            context: u32::MAX - i as u32,
            flags: i as u8,
            _reserved: [1, 2, 3],
            ..Event::new(EventAction::SegmentMap, -1, EventPool::Host, i, 3 * i)
        }
    }

    #[test]
    fn events_come_back_unchanged_in_order_across_laps() {
        let r = Ring::new(5);
        let mut i = 0;
        for round in 0..20u64 {
            let pushed: Vec<Event> = (0..=round % 5)
                .map(|_| {
                    i += 1;
                    ev(i)
                })
                .collect();
            for e in &pushed {
                r.push(e).unwrap();
            }
            assert_eq!(r.len(), pushed.len());
            let popped: Vec<Event> = std::iter::from_fn(|| r.pop()).collect();
            assert_eq!(popped, pushed);
            assert_eq!(r.len(), 0);
        }
    }

    #[test]
    fn every_field_and_action_survives_encoding() {
        for a in 0..EventAction::COUNT as u8 {
            for pool in [EventPool::Small, EventPool::Large, EventPool::Host] {
                let e = Event {
                    device: i16::MIN + i16::from(a),
                    pool_id: u64::MAX,
                    stream: u64::MAX - 1,
                    requested: 7,
                    ..Event::new(EventAction::from_u8(a).unwrap(), 0, pool, 1, 2)
                };
                assert_eq!(decode(encode(&e)), e);
            }
        }
        assert_eq!(decode(encode(&ev(77))), ev(77));
    }

    #[test]
    fn a_full_ring_refuses_and_a_disconnected_one_too() {
        let r = Ring::new(3);
        for i in 0..3 {
            r.push(&ev(i)).unwrap();
        }
        assert_eq!(r.push(&ev(9)), Err(PushError::Full));
        assert_eq!(r.len(), 3);
        assert_eq!(r.pop(), Some(ev(0)));
        r.push(&ev(3)).unwrap();
        r.disconnect();
        assert_eq!(r.push(&ev(4)), Err(PushError::Disconnected));
        let got: Vec<u64> = std::iter::from_fn(|| r.pop()).map(|e| e.time_ns).collect();
        assert_eq!(got, vec![1, 2, 3]);
    }

    #[test]
    fn concurrent_producers_lose_nothing_that_was_accepted() {
        const PER_THREAD: u64 = 20_000;
        const PRODUCERS: u64 = 3;
        let r = std::sync::Arc::new(Ring::new(64));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    let mut accepted = 0u64;
                    for i in 0..PER_THREAD {
                        let e = Event { stream: t, ..ev(i) };
                        if r.push(&e).is_ok() {
                            accepted += 1;
                        }
                    }
                    accepted
                })
            })
            .collect();
        let mut last = [None::<u64>; PRODUCERS as usize];
        let mut got = 0u64;
        let mut check = |e: Event| {
            let t = e.stream as usize;
            assert_eq!(
                e,
                Event {
                    stream: e.stream,
                    ..ev(e.time_ns)
                }
            );
            assert!(last[t].is_none_or(|l| l < e.time_ns), "per-producer order");
            last[t] = Some(e.time_ns);
            got += 1;
        };
        while producers.iter().any(|p| !p.is_finished()) {
            if let Some(e) = r.pop() {
                check(e);
            }
        }
        while let Some(e) = r.pop() {
            check(e);
        }
        let accepted: u64 = producers.into_iter().map(|p| p.join().unwrap()).sum();
        assert_eq!(got, accepted);
    }
}
