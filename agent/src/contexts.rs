//! `ContextCache`: the stack frames behind the context ids of one device's events.
//!
//! Events carry a `u32` context id, not frames (see `allocview_alloc::event::Event::context`);
//! the allocator keeps the frames of its recent ids and answers for them
//! ([`SnapshotProvider::context_frames`]). Once a tick, the aggregator notes the ids of the
//! recent events that came since the last tick (only those show frames; a compare per event,
//! consecutive events of one call or site sharing their id, and a lookup in an integer-hashed
//! map when the id changes; each new id is queued once), asks the provider for the new ones in
//! one call, off every allocator's hot path, and keeps what it got for the states and updates
//! it sends: each names the frames of the ids its recent events refer to ([`ContextFrames`]),
//! so a client shows where an allocation came from as soon as it sees the event, without
//! asking for a snapshot.
//!
//! Memory stays bounded: ids wait in a list of at most [`MAX_WANTED`], and past
//! [`MAX_KEPT`] ids the cache keeps only those the recent events still refer to. An
//! id the allocator no longer keeps (it made [`CONTEXT_TABLE_CAPACITY`] newer ones before the
//! aggregator asked) is remembered as unknown and never asked for again: its events show no
//! frames.
//!
//! [`SnapshotProvider::context_frames`]: crate::provider::SnapshotProvider::context_frames
//! [`CONTEXT_TABLE_CAPACITY`]: allocview_alloc::caching::CONTEXT_TABLE_CAPACITY

use std::collections::hash_map::Entry;

use allocview_alloc::snapshot::Frames;

use crate::addr_map::{AddrMap, AddrSet};
use crate::provider::SnapshotProvider;
use crate::state::ContextFrames;

/// Ids waiting to be resolved, at most (more in one tick are not asked for; their events show
/// no frames).
pub const MAX_WANTED: usize = 4096;

/// Ids kept before the cache drops those no recent event refers to.
pub const MAX_KEPT: usize = 8192;

/// The frames of one device's context ids (see the module docs).
#[derive(Debug, Default)]
pub struct ContextCache {
    /// Ids seen: their frames, or `None` while waiting to be asked for and for an id the
    /// provider no longer knew.
    known: AddrMap<Option<Frames>>,
    /// Ids seen in events and not yet asked for, each once.
    wanted: Vec<u32>,
    /// The id of the last event noted (consecutive events mostly share it).
    last: u32,
}

impl ContextCache {
    /// An empty cache.
    pub fn new() -> ContextCache {
        ContextCache::default()
    }

    /// Notes the context id of one recent event: called once a tick for each recent event new
    /// since the last tick (`DeviceAgg::resolve_contexts` in the aggregator), in order, so
    /// consecutive events sharing an id cost one compare.
    pub fn note(&mut self, id: u32) {
        if id == 0 || id == self.last {
            return;
        }
        self.last = id;
        if self.wanted.len() < MAX_WANTED
            && let Entry::Vacant(v) = self.known.entry(u64::from(id))
        {
            v.insert(None);
            self.wanted.push(id);
        }
    }

    /// Whether ids wait to be asked for.
    pub fn has_wanted(&self) -> bool {
        !self.wanted.is_empty()
    }

    /// Asks `provider` for the frames of the ids noted since the last call.
    pub fn resolve(&mut self, provider: &dyn SnapshotProvider) {
        if self.wanted.is_empty() {
            return;
        }
        self.wanted.sort_unstable();
        for (id, frames) in provider.context_frames(&self.wanted) {
            self.known.insert(u64::from(id), Some(frames));
        }
        self.wanted.clear();
    }

    /// The frames of `id`, when resolved.
    pub fn get(&self, id: u32) -> Option<&Frames> {
        self.known.get(&u64::from(id)).and_then(Option::as_ref)
    }

    /// Ids kept (resolved, unknown to the provider, or waiting to be asked for).
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether no id is kept.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// The frames of the distinct resolved ids among `ids`, by id.
    pub fn frames_of(&self, ids: impl IntoIterator<Item = u32>) -> Vec<ContextFrames> {
        let mut ids: Vec<u32> = ids.into_iter().filter(|&id| id != 0).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .filter_map(|id| {
                self.get(id).map(|frames| ContextFrames {
                    id,
                    frames: frames.clone(),
                })
            })
            .collect()
    }

    /// Past [`MAX_KEPT`] ids, keeps only those among `in_use` (the ids of the recent events,
    /// read only then).
    pub fn trim(&mut self, in_use: impl IntoIterator<Item = u32>) {
        if self.known.len() > MAX_KEPT {
            let in_use: AddrSet = in_use.into_iter().map(u64::from).collect();
            self.known.retain(|id, _| in_use.contains(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use allocview_alloc::caching::stats::DeviceStats;
    use allocview_alloc::snapshot::{Frame, Snapshot};

    fn frames(name: &str) -> Frames {
        Arc::from(vec![Frame::new(name, "train.py", 1)])
    }

    /// Knows ids 1..=3 and records what it was asked.
    #[derive(Default)]
    struct Asked(Mutex<Vec<Vec<u32>>>);

    impl SnapshotProvider for Asked {
        fn device(&self) -> i32 {
            0
        }
        fn snapshot(&self) -> Snapshot {
            Snapshot::default()
        }
        fn device_stats(&self) -> DeviceStats {
            DeviceStats::default()
        }
        fn reset_peak_stats(&self) {}
        fn context_frames(&self, ids: &[u32]) -> Vec<(u32, Frames)> {
            self.0.lock().unwrap().push(ids.to_vec());
            ids.iter()
                .filter(|&&id| (1..=3).contains(&id))
                .map(|&id| (id, frames(&format!("site{id}"))))
                .collect()
        }
    }

    #[test]
    fn ids_are_asked_for_once_in_one_call_and_unknown_ones_are_not_asked_again() {
        let p = Asked::default();
        let mut c = ContextCache::new();
        for id in [0, 1, 1, 2, 1, 7, 2] {
            c.note(id);
        }
        c.resolve(&p);
        assert_eq!(*p.0.lock().unwrap(), vec![vec![1, 2, 7]]);
        assert_eq!(c.get(1).unwrap()[0].name, "site1");
        assert!(c.get(7).is_none());
        for id in [1, 7, 3, 2] {
            c.note(id);
        }
        c.resolve(&p);
        assert_eq!(p.0.lock().unwrap()[1], vec![3], "only the new id");
        assert!(!c.has_wanted());
        let f = c.frames_of([3, 0, 7, 1, 3]);
        assert_eq!(
            f.iter().map(|c| c.id).collect::<Vec<_>>(),
            vec![1, 3],
            "distinct resolved ids, by id"
        );
    }

    #[test]
    fn the_cache_stays_bounded_and_keeps_what_recent_events_refer_to() {
        let p = Asked::default();
        let mut c = ContextCache::new();
        for id in 1..=(MAX_WANTED as u32 + 100) {
            c.note(id);
        }
        c.resolve(&p);
        assert_eq!(p.0.lock().unwrap()[0].len(), MAX_WANTED);
        for round in 1..4u32 {
            for id in 0..MAX_WANTED as u32 {
                c.note(round * 100_000 + id);
            }
            c.resolve(&p);
        }
        assert!(c.len() > MAX_KEPT);
        c.trim([2, 1, 2, 5_000_000]);
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(2).unwrap()[0].name, "site2");
    }
}
