//! `FreeSet`: a pool's ordered set of free blocks, keyed by packed `(stream, size, address)`.
//!
//! Most pools hold few free blocks, and there a sorted vector beats a B-tree several times over
//! (one binary search and a short `memmove` against a descent through allocated nodes), so the
//! set is a sorted `Vec` up to [`SMALL_MAX`] entries and a `BTreeMap` beyond; it moves back to
//! the vector once it shrinks below [`DEMOTE_AT`] (the gap stops a set near the boundary from
//! switching back and forth). Search is `O(log n)` either way, and an insert or removal moves at
//! most [`SMALL_MAX`] entries. The vector keeps its capacity, so a warm set allocates nothing.
//!
//! A removal from the vector leaves a *hole*: the entry keeps its key (so the order holds) but
//! no block. The next insertion whose key sorts there fills it, so a block handed out whole and
//! given back whole (a training loop reusing a tensor's exact block) moves no entries at all;
//! any other change first closes the hole (the shift the removal saved). There is at most one
//! hole, and every query skips it.

use std::collections::BTreeMap;
use std::collections::btree_map;

use crate::caching::block::{BlockId, NIL};
use crate::caching::pool::SizeKey;

/// Largest set kept as a sorted vector.
pub(crate) const SMALL_MAX: usize = 64;
/// A B-tree set this small goes back to the vector.
pub(crate) const DEMOTE_AT: usize = 16;
/// The block of a hole (an entry whose block was removed).
const VACANT: BlockId = NIL;
/// `FreeSet::hole` when there is none.
const NO_HOLE: usize = usize::MAX;

/// Vectors up to this long are searched by counting rather than bisecting.
const COUNT_SEARCH_MAX: usize = 16;

/// The index of the first entry whose key is at least `key`. A short vector counts the smaller
/// keys: the comparisons are independent of each other, where each step of a bisection waits
/// for the load and compare before it, so a dozen entries are counted faster than bisected.
#[inline(always)]
fn lower_bound(v: &[(SizeKey, BlockId)], key: SizeKey) -> usize {
    if v.len() <= COUNT_SEARCH_MAX {
        v.iter().map(|e| usize::from(e.0 < key)).sum()
    } else {
        v.partition_point(|e| e.0 < key)
    }
}

/// An ordered map from free-set keys to block ids.
#[derive(Debug, Default)]
pub(crate) struct FreeSet {
    small: Vec<(SizeKey, BlockId)>,
    large: Option<BTreeMap<SizeKey, BlockId>>,
    /// Index of the hole in `small` (see the module docs), or `NO_HOLE`.
    hole: usize,
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
            FreeIter::Small(it) => it.find(|e| e.1 != VACANT).copied(),
            FreeIter::Large(it) => it.next().map(|(&k, &v)| (k, v)),
        }
    }
}

impl FreeSet {
    pub(crate) fn new() -> FreeSet {
        FreeSet {
            small: Vec::with_capacity(SMALL_MAX),
            large: None,
            hole: NO_HOLE,
        }
    }

    /// Closes the hole, if any (the shift its removal saved).
    #[inline]
    fn close_hole(&mut self) {
        if self.hole != NO_HOLE {
            self.small.remove(self.hole);
            self.hole = NO_HOLE;
        }
    }

    /// Closes the hole, if any, and returns where the entry at index `i` is then.
    #[inline]
    fn close_hole_keeping(&mut self, i: usize) -> usize {
        let moved = self.hole != NO_HOLE && self.hole < i;
        self.close_hole();
        i - usize::from(moved)
    }

    /// Makes the vector entry at `pos` the hole (closing an older one first), returning its
    /// block.
    #[inline]
    fn vacate(&mut self, pos: usize) -> BlockId {
        let pos = self.close_hole_keeping(pos);
        self.hole = pos;
        std::mem::replace(&mut self.small[pos].1, VACANT)
    }

    /// Number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        match &self.large {
            Some(m) => m.len(),
            None => self.small.len() - usize::from(self.hole != NO_HOLE),
        }
    }

    /// Adds an entry (keys are unique: they hold the block's address).
    #[inline(always)]
    pub(crate) fn insert(&mut self, key: SizeKey, id: BlockId) {
        if self.hole != NO_HOLE {
            let (h, v) = (self.hole, &mut self.small);
            if (h == 0 || v[h - 1].0 < key) && v.get(h + 1).is_none_or(|e| key < e.0) {
                v[h] = (key, id);
                self.hole = NO_HOLE;
                return;
            }
        }
        self.insert_shifting(key, id);
    }

    /// `insert` past the hole's place: closes the hole, then shifts entries (or grows into,
    /// or inserts in, the B-tree).
    #[inline(never)]
    fn insert_shifting(&mut self, key: SizeKey, id: BlockId) {
        self.close_hole();
        match &mut self.large {
            Some(m) => {
                m.insert(key, id);
            }
            None if self.small.len() < SMALL_MAX => {
                let pos = lower_bound(&self.small, key);
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
        if self.large.is_none()
            && self
                .small
                .get(hint)
                .is_some_and(|e| e.0 == key && e.1 != VACANT)
        {
            return Some(self.vacate(hint));
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
                let pos = lower_bound(&self.small, *key);
                match self.small.get(pos) {
                    Some(e) if e.0 == *key && e.1 != VACANT => Some(self.vacate(pos)),
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
            lower_bound(v, old)
        };
        debug_assert!(
            v.get(i).is_some_and(|e| e.0 == old && e.1 != VACANT),
            "replaced a key that is not in the set"
        );
        // Most often the new key still sorts between the old one's neighbours: write in place.
        let above_prev = i == 0 || v[i - 1].0 < new;
        let below_next = v.get(i + 1).is_none_or(|e| new < e.0);
        if above_prev && below_next {
            v[i] = (new, id);
            return;
        }
        // The entries shift: close the hole first (a hole's key orders like any other, so
        // the in-place case above could keep it).
        let i = self.close_hole_keeping(i);
        let v = &mut self.small;
        // With `old` still in place: `new` belongs before index `j`.
        let j = lower_bound(v, new);
        if j <= i {
            // Moves down (or stays): the entries in [j, i) move up one.
            v.copy_within(j..i, j + 1);
            v[j] = (new, id);
        } else {
            // Moves up: the entries in (i, j) move down one into the gap.
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
                let mut pos = lower_bound(&self.small, from);
                if pos == self.hole {
                    // The hint names the first entry the iterator yields.
                    pos += 1;
                }
                (
                    pos,
                    FreeIter::Small(self.small[pos.min(self.small.len())..].iter()),
                )
            }
        }
    }

    /// Entries with keys from `from` on, in order.
    #[inline]
    pub(crate) fn iter_from(&self, from: SizeKey) -> FreeIter<'_> {
        self.search(from).1
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
        self.close_hole();
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

    #[test]
    fn every_operation_agrees_with_an_ordered_map_holes_and_all() {
        // Sizes around the vector/B-tree boundary, so both forms and both moves between them
        // are exercised, with holes left by removals and filled or closed by what follows.
        for max_keys in [6u128, 40, 160] {
            let mut set = FreeSet::new();
            let mut model: BTreeMap<SizeKey, BlockId> = BTreeMap::new();
            let mut x = 0x2545_F491_4F6C_DD1Du64 ^ max_keys as u64;
            let (mut saw_vector, mut saw_tree, mut saw_hole) = (false, false, false);
            for step in 0..20_000u32 {
                saw_vector |= set.large.is_none();
                saw_tree |= set.large.is_some();
                saw_hole |= set.hole != NO_HOLE;
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let key = u128::from(x % max_keys as u64) * 16;
                let present: Vec<SizeKey> = model.keys().copied().collect();
                match x % 7 {
                    0 | 1 if !model.contains_key(&key) => {
                        set.insert(key, step);
                        model.insert(key, step);
                    }
                    2 => assert_eq!(set.remove(&key), model.remove(&key), "step {step}"),
                    3 if !present.is_empty() => {
                        // A removal at the index a search gave, as malloc does.
                        let k = present[(x >> 20) as usize % present.len()];
                        let (hint, mut it) = set.search(k);
                        assert_eq!(it.next().map(|e| e.0), Some(k), "step {step}");
                        assert_eq!(set.remove_at_hint(k, hint), model.remove(&k));
                    }
                    4 if !present.is_empty() && !model.contains_key(&key) => {
                        let k = present[(x >> 20) as usize % present.len()];
                        let hint = (x >> 40) as usize % 70;
                        set.replace(k, key, step, hint);
                        model.remove(&k);
                        model.insert(key, step);
                    }
                    _ => {
                        let from = u128::from((x >> 8) % max_keys as u64) * 16 + 1;
                        let got: Vec<_> = set.iter_from(from).collect();
                        let want: Vec<_> = model.range(from..).map(|(&k, &v)| (k, v)).collect();
                        assert_eq!(got, want, "step {step}: from {from}");
                    }
                }
                assert_eq!(set.len(), model.len(), "step {step}");
            }
            assert!(
                saw_vector && saw_hole,
                "{max_keys} keys: vector and hole exercised"
            );
            assert_eq!(
                saw_tree,
                max_keys > SMALL_MAX as u128,
                "{max_keys} keys: B-tree"
            );
            let all: Vec<_> = set.iter().collect();
            let want: Vec<_> = model.iter().map(|(&k, &v)| (k, v)).collect();
            assert_eq!(all, want);
            assert_eq!(set.take_all(), want);
        }
    }
}
