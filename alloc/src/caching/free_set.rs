//! `FreeSet`: a pool's ordered set of free blocks, keyed by packed `(stream, size, address)`.
//!
//! Most pools hold few free blocks, and there a sorted vector beats a B-tree several times over
//! (one binary search and a short `memmove` against a descent through allocated nodes), so the
//! set is a sorted `Vec` up to [`SMALL_MAX`] entries and a `BTreeMap` beyond; it moves back to
//! the vector once it shrinks below [`DEMOTE_AT`] (the gap stops a set near the boundary from
//! switching back and forth). Search is `O(log n)` either way, and an insert or removal moves at
//! most [`SMALL_MAX`] entries. The vector keeps its capacity, so a warm set allocates nothing.

use std::collections::BTreeMap;
use std::collections::btree_map;

use crate::caching::block::BlockId;
use crate::caching::pool::SizeKey;

/// Largest set kept as a sorted vector.
pub(crate) const SMALL_MAX: usize = 64;
/// A B-tree set this small goes back to the vector.
pub(crate) const DEMOTE_AT: usize = 16;

/// An ordered map from free-set keys to block ids.
#[derive(Debug, Default)]
pub(crate) struct FreeSet {
    small: Vec<(SizeKey, BlockId)>,
    large: Option<BTreeMap<SizeKey, BlockId>>,
}

/// Entries in key order from a starting key.
pub(crate) enum FreeIter<'a> {
    Small(std::slice::Iter<'a, (SizeKey, BlockId)>),
    Large(btree_map::Range<'a, SizeKey, BlockId>),
}

impl Iterator for FreeIter<'_> {
    type Item = (SizeKey, BlockId);

    #[inline]
    fn next(&mut self) -> Option<(SizeKey, BlockId)> {
        match self {
            FreeIter::Small(it) => it.next().copied(),
            FreeIter::Large(it) => it.next().map(|(&k, &v)| (k, v)),
        }
    }
}

impl FreeSet {
    pub(crate) fn new() -> FreeSet {
        FreeSet {
            small: Vec::with_capacity(SMALL_MAX),
            large: None,
        }
    }

    /// Number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        match &self.large {
            Some(m) => m.len(),
            None => self.small.len(),
        }
    }

    /// Adds an entry (keys are unique: they hold the block's address).
    #[inline]
    pub(crate) fn insert(&mut self, key: SizeKey, id: BlockId) {
        match &mut self.large {
            Some(m) => {
                m.insert(key, id);
            }
            None if self.small.len() < SMALL_MAX => {
                let pos = self.small.partition_point(|e| e.0 < key);
                self.small.insert(pos, (key, id));
            }
            None => {
                let mut m: BTreeMap<SizeKey, BlockId> = self.small.drain(..).collect();
                m.insert(key, id);
                self.large = Some(m);
            }
        }
    }

    /// [`remove`](Self::remove) with the entry's index from [`search`](Self::search) (any
    /// index works: a wrong one only costs the search it would have saved).
    #[inline]
    pub(crate) fn remove_at_hint(&mut self, key: SizeKey, hint: usize) -> Option<BlockId> {
        if self.large.is_none() && self.small.get(hint).is_some_and(|e| e.0 == key) {
            return Some(self.small.remove(hint).1);
        }
        self.remove(&key)
    }

    /// Removes an entry, returning its block.
    #[inline]
    pub(crate) fn remove(&mut self, key: &SizeKey) -> Option<BlockId> {
        match &mut self.large {
            Some(m) => {
                let r = m.remove(key);
                if m.len() < DEMOTE_AT {
                    self.small.extend(m.iter().map(|(&k, &v)| (k, v)));
                    self.large = None;
                }
                r
            }
            None => {
                let pos = self.small.partition_point(|e| e.0 < *key);
                match self.small.get(pos) {
                    Some(e) if e.0 == *key => Some(self.small.remove(pos).1),
                    _ => None,
                }
            }
        }
    }

    /// Replaces the entry at `old` (which must be present) by `new` for block `id`: one
    /// search for each key and a shift of only the entries between them, where a removal and
    /// an insertion would each shift the whole tail (a split leaves the remainder, a merge the
    /// grown block, near where the old key sat).
    ///
    /// `hint` is the old entry's index when the caller knows it (from
    /// [`search`](Self::search)); any other value costs a search.
    #[inline(always)]
    pub(crate) fn replace(&mut self, old: SizeKey, new: SizeKey, id: BlockId, hint: usize) {
        if self.large.is_some() {
            let removed = self.remove(&old);
            debug_assert!(removed.is_some(), "replaced a key that is not in the set");
            self.insert(new, id);
            return;
        }
        let v = &mut self.small;
        let i = if v.get(hint).is_some_and(|e| e.0 == old) {
            hint
        } else {
            v.partition_point(|e| e.0 < old)
        };
        debug_assert!(
            v.get(i).is_some_and(|e| e.0 == old),
            "replaced a key that is not in the set"
        );
        // Most often the new key still sorts between the old one's neighbours: write in place.
        let above_prev = i == 0 || v[i - 1].0 < new;
        let below_next = v.get(i + 1).is_none_or(|e| new < e.0);
        if above_prev && below_next {
            v[i] = (new, id);
            return;
        }
        // With `old` still in place: `new` belongs before index `j`.
        let j = v.partition_point(|e| e.0 < new);
        if j <= i {
            // Moves down (or stays): the entries in [j, i) move up one.
            v.copy_within(j..i, j + 1);
            v[j] = (new, id);
        } else {
            // Moves up: the entries in (i, j) move down one into the hole.
            v.copy_within(i + 1..j, i);
            v[j - 1] = (new, id);
        }
    }

    /// Entries with keys from `from` on, in order, and the first one's index (a hint for
    /// [`replace`](Self::replace) and [`remove_at_hint`](Self::remove_at_hint); `usize::MAX`
    /// when the set is a B-tree).
    #[inline]
    pub(crate) fn search(&self, from: SizeKey) -> (usize, FreeIter<'_>) {
        match &self.large {
            Some(m) => (usize::MAX, FreeIter::Large(m.range(from..))),
            None => {
                let pos = self.small.partition_point(|e| e.0 < from);
                (pos, FreeIter::Small(self.small[pos..].iter()))
            }
        }
    }

    /// Entries with keys from `from` on, in order.
    #[inline]
    pub(crate) fn iter_from(&self, from: SizeKey) -> FreeIter<'_> {
        match &self.large {
            Some(m) => FreeIter::Large(m.range(from..)),
            None => {
                let pos = self.small.partition_point(|e| e.0 < from);
                FreeIter::Small(self.small[pos..].iter())
            }
        }
    }

    /// Every entry, in order.
    pub(crate) fn iter(&self) -> FreeIter<'_> {
        self.iter_from(0)
    }

    /// The block ids with keys in `[from, to)`, highest key first.
    pub(crate) fn ids_in_rev(&self, from: SizeKey, to: SizeKey) -> Vec<BlockId> {
        let mut v: Vec<BlockId> = self
            .iter_from(from)
            .take_while(|(k, _)| *k < to)
            .map(|(_, id)| id)
            .collect();
        v.reverse();
        v
    }

    /// Every block id, in key order.
    pub(crate) fn ids(&self) -> Vec<BlockId> {
        self.iter().map(|(_, id)| id).collect()
    }

    /// Removes every entry, returning them.
    pub(crate) fn take_all(&mut self) -> Vec<(SizeKey, BlockId)> {
        match self.large.take() {
            Some(m) => m.into_iter().collect(),
            None => std::mem::replace(&mut self.small, Vec::with_capacity(SMALL_MAX)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_set_keeps_order_across_promotion_and_demotion() {
        let mut s = FreeSet::new();
        // Insert 200 keys in a scrambled order: past SMALL_MAX it becomes a B-tree.
        let keys: Vec<u128> = (0..200u128).map(|i| (i * 7919) % 200).collect();
        for &k in &keys {
            s.insert(k, k as u32);
        }
        assert!(s.large.is_some());
        assert_eq!(s.len(), 200);
        let all: Vec<u128> = s.iter().map(|(k, _)| k).collect();
        assert_eq!(all, (0..200).collect::<Vec<_>>());
        assert_eq!(s.iter_from(150).next(), Some((150, 150)));
        assert_eq!(s.ids_in_rev(10, 13), vec![12, 11, 10]);
        for k in 0..190u128 {
            assert_eq!(s.remove(&k), Some(k as u32));
        }
        assert!(s.large.is_none(), "shrunk back to the vector");
        assert_eq!(s.remove(&5), None);
        assert_eq!(s.ids(), (190..200).collect::<Vec<u32>>());
        assert_eq!(s.take_all().len(), 10);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn replace_agrees_with_remove_then_insert_in_both_forms() {
        for n in [5u128, 40, 120] {
            let mut a = FreeSet::new();
            let mut b = std::collections::BTreeMap::new();
            for k in 0..n {
                a.insert(k * 10, k as u32);
                b.insert(k * 10, k as u32);
            }
            let mut x = 0x9E37_79B9u128;
            for step in 0..500u32 {
                x = (x * 6_364_136_223_846_793_005 + 1) % (1 << 61);
                let keys: Vec<u128> = b.keys().copied().collect();
                let old = keys[(x % keys.len() as u128) as usize];
                // A fresh key anywhere: before, between or after the others.
                let new = (x >> 7) % (n * 10 + 20) * 3 + 1_000_000 * u128::from(step % 2);
                if b.contains_key(&new) && new != old {
                    continue;
                }
                a.replace(old, new, step, (x % 7) as usize);
                b.remove(&old);
                b.insert(new, step);
                let got: Vec<(u128, u32)> = a.iter().collect();
                let want: Vec<(u128, u32)> = b.iter().map(|(&k, &v)| (k, v)).collect();
                assert_eq!(got, want, "n {n} step {step}: {old} -> {new}");
            }
        }
    }
}
