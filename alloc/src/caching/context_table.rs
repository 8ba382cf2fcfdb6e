//! `ContextTable`: the ids that events carry in place of stack frames.
//!
//! An [`Event`](crate::event::Event) is a fixed 64-byte `Copy` value, so it cannot hold the
//! frames a context provider returned; it carries a `u32` id instead, and an observer (the
//! agent) looks the id up here, off the hot path, through
//! [`CachingAllocator::context_frames`](crate::caching::CachingAllocator::context_frames).
//!
//! Interning happens only on calls that gathered frames while a sink listens, which already
//! paid for the provider's call (a stack walk, strings). Their content hash ([`frames_hash`])
//! is taken before the allocator's lock; under it, equal frames get the same id: the same
//! shared list is found by pointer (a provider that hands out one list per site pays two
//! pointer comparisons: its hash is kept per thread too), another list with the same content by its hash, confirmed by comparing the lists.
//! The table keeps the last [`CONTEXT_TABLE_CAPACITY`] ids: a new id takes the slot of the id
//! that many before it, so memory stays bounded however many distinct contexts a long run
//! makes (a tag with the step number makes new ones every step), and an observer that reads
//! ids within a few thousand contexts of their making always finds them. Ids count up from 1 (0 means "none"),
//! wrapping past `u32::MAX` back to 1; a slot remembers its id, so a stale id is never answered
//! with another context's frames.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use crate::snapshot::Frames;

/// Contexts the table keeps (the most recent ids).
pub const CONTEXT_TABLE_CAPACITY: usize = 4096;

thread_local! {
    /// The frames this thread hashed last, with their hash: a provider that hands out one
    /// shared list per site is recognised by pointer, and its strings are hashed once.
    static LAST_HASHED: RefCell<Option<(Frames, u64)>> = const { RefCell::new(None) };
}

/// The content hash [`ContextTable::intern`] files frames under. The caller computes it before
/// taking the allocator's lock, so the strings are hashed outside it; under the lock a found
/// entry is only confirmed (by pointer, else by comparing the lists). The same shared list as
/// this thread's previous call costs a pointer comparison.
pub(crate) fn frames_hash(frames: &Frames) -> u64 {
    let hash = || {
        let mut h = DefaultHasher::new();
        frames.hash(&mut h);
        h.finish()
    };
    LAST_HASHED
        .try_with(|last| {
            let mut last = last.borrow_mut();
            match &*last {
                Some((f, h)) if Arc::ptr_eq(f, frames) => *h,
                _ => {
                    let h = hash();
                    *last = Some((Arc::clone(frames), h));
                    h
                }
            }
        })
        // The thread is being torn down: hash without the cache.
        .unwrap_or_else(|_| hash())
}

/// One kept context: its id, the hash it is filed under, its frames.
type Slot = Option<(u32, u64, Frames)>;

/// Ids of stack frames, for events (see the module docs).
#[derive(Debug)]
pub(crate) struct ContextTable {
    /// Slot `id % CONTEXT_TABLE_CAPACITY` holds the id's context while it is among the last
    /// [`CONTEXT_TABLE_CAPACITY`] made.
    slots: Vec<Slot>,
    /// The id of each kept context, by [`frames_hash`] (a colliding newer context takes the
    /// entry; the older one stays readable by id).
    ids: BTreeMap<u64, u32>,
    /// The last context interned: a provider that returns one shared list per site is
    /// recognised by pointer, without a lookup.
    last: Option<(Frames, u32)>,
    /// The id the next new context gets (never 0).
    next: u32,
}

impl ContextTable {
    pub(crate) fn new() -> ContextTable {
        ContextTable {
            slots: Vec::new(),
            ids: BTreeMap::new(),
            last: None,
            next: 1,
        }
    }

    /// The id of `frames` (0 for an empty list), whose [`frames_hash`] is `hash`: the id it
    /// already has, else a new one.
    pub(crate) fn intern(&mut self, frames: &Frames, hash: u64) -> u32 {
        if frames.is_empty() {
            return 0;
        }
        if let Some((f, id)) = &self.last
            && Arc::ptr_eq(f, frames)
        {
            return *id;
        }
        let found = self.ids.get(&hash).copied().filter(|&id| {
            self.get(id)
                .is_some_and(|f| Arc::ptr_eq(f, frames) || f == frames)
        });
        let id = match found {
            Some(id) => id,
            None => self.insert(frames, hash),
        };
        self.last = Some((Arc::clone(frames), id));
        id
    }

    /// Gives `frames` the next id, in the slot of the context that id replaces.
    fn insert(&mut self, frames: &Frames, hash: u64) -> u32 {
        let id = self.next;
        self.next = match id.wrapping_add(1) {
            0 => 1,
            n => n,
        };
        if self.slots.is_empty() {
            self.slots.resize(CONTEXT_TABLE_CAPACITY, None);
        }
        let slot = &mut self.slots[id as usize % CONTEXT_TABLE_CAPACITY];
        if let Some((old_id, old_hash, _)) = slot.take() {
            if self.ids.get(&old_hash) == Some(&old_id) {
                self.ids.remove(&old_hash);
            }
            if self.last.as_ref().is_some_and(|(_, id)| *id == old_id) {
                self.last = None;
            }
        }
        *slot = Some((id, hash, Arc::clone(frames)));
        self.ids.insert(hash, id);
        id
    }

    /// The frames of `id`, while the table keeps it.
    pub(crate) fn get(&self, id: u32) -> Option<&Frames> {
        match self.slots.get(id as usize % CONTEXT_TABLE_CAPACITY)? {
            Some((slot_id, _, frames)) if *slot_id == id && id != 0 => Some(frames),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::Frame;

    impl ContextTable {
        /// `intern` with the hash its callers compute outside the lock.
        fn intern_hashing(&mut self, frames: &Frames) -> u32 {
            self.intern(frames, frames_hash(frames))
        }
    }

    fn frames(name: &str) -> Frames {
        Arc::from(vec![Frame::new(name, "train.py", 7)])
    }

    #[test]
    fn equal_frames_share_an_id_whether_the_list_is_shared_or_a_copy() {
        let mut t = ContextTable::new();
        let a = frames("forward");
        let id = t.intern_hashing(&a);
        assert_eq!(id, 1);
        assert_eq!(t.intern_hashing(&a), id);
        assert_eq!(t.intern_hashing(&frames("forward")), id);
        assert_eq!(t.intern_hashing(&frames("backward")), 2);
        assert_eq!(t.intern_hashing(&a), id);
        assert_eq!(t.get(id).unwrap()[0].name, "forward");
        assert_eq!(t.get(2).unwrap()[0].name, "backward");
    }

    #[test]
    fn empty_frames_and_unknown_ids_are_none() {
        let mut t = ContextTable::new();
        assert_eq!(t.intern_hashing(&crate::snapshot::no_frames()), 0);
        assert!(t.get(0).is_none());
        assert!(t.get(1).is_none());
        t.intern_hashing(&frames("a"));
        assert!(t.get(0).is_none());
        assert!(t.get(2).is_none());
    }

    #[test]
    fn the_table_keeps_the_last_contexts_and_forgets_older_ones() {
        let mut t = ContextTable::new();
        let n = CONTEXT_TABLE_CAPACITY as u32 + 10;
        for i in 0..n {
            assert_eq!(t.intern_hashing(&frames(&format!("f{i}"))), i + 1);
        }
        // Ids 1..=10 gave their slots to the last ten.
        for id in 1..=10 {
            assert!(t.get(id).is_none(), "id {id} should be gone");
        }
        assert_eq!(t.get(11).unwrap()[0].name, "f10");
        assert_eq!(t.get(n).unwrap()[0].name, format!("f{}", n - 1));
        assert_eq!(t.ids.len(), CONTEXT_TABLE_CAPACITY);
        // A forgotten context comes back with a new id.
        assert_eq!(t.intern_hashing(&frames("f0")), n + 1);
        // The shared list last interned is not answered with an id the table gave away.
        let shared = frames("shared");
        let id = t.intern_hashing(&shared);
        for i in 0..CONTEXT_TABLE_CAPACITY {
            t.intern_hashing(&frames(&format!("g{i}")));
        }
        assert!(t.get(id).is_none());
        let again = t.intern_hashing(&shared);
        assert_ne!(again, id);
        assert_eq!(t.get(again).unwrap()[0].name, "shared");
    }

    #[test]
    fn ids_wrap_past_u32_max_to_1_never_0() {
        let mut t = ContextTable::new();
        t.next = u32::MAX;
        assert_eq!(t.intern_hashing(&frames("last")), u32::MAX);
        assert_eq!(t.intern_hashing(&frames("wrapped")), 1);
        assert_eq!(t.get(u32::MAX).unwrap()[0].name, "last");
        assert_eq!(t.get(1).unwrap()[0].name, "wrapped");
    }
}
