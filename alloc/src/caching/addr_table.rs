//! `AddrTable`: the allocated blocks by device address (PyTorch's `allocated_blocks`).
//!
//! An open-addressing hash table with linear probing and backward-shift deletion (no
//! tombstones, so a table that sees millions of insert/remove pairs never degrades or needs
//! cleaning). Device addresses are distinct multiples of 512, hashed by a multiply-shift
//! (Fibonacci hashing) of `addr >> 9`. The table doubles when it is half full; it never shrinks,
//! so a warm table allocates nothing.
//!
//! In front of the table sits one slot holding the most recent insertion: a block freed
//! before the next allocation (the alloc/free pairing of a training step's temporaries) comes
//! and goes without touching the table. The next insertion moves the slot's entry into the
//! table, so every entry is in exactly one of the two places.

use crate::addr_map::FIBONACCI;
use crate::caching::block::BlockId;

/// Marks an empty slot (no block starts at the top address of the space).
const EMPTY: u64 = u64::MAX;
/// Slots at creation.
const INITIAL_SLOTS: usize = 2048;
/// Addresses are multiples of the 512-byte minimum block: the low 9 bits carry nothing.
const ADDR_SHIFT: u32 = 9;

/// Allocated block ids by address.
#[derive(Debug)]
pub(crate) struct AddrTable {
    /// The most recent insertion (`EMPTY` key: none), not in the table.
    front: (u64, BlockId),
    keys: Vec<u64>,
    vals: Vec<BlockId>,
    len: usize,
    /// `64 - log2(slots)`: the multiply-shift keeps the top bits.
    shift: u32,
}

impl AddrTable {
    pub(crate) fn new() -> AddrTable {
        AddrTable::with_slots(INITIAL_SLOTS)
    }

    fn with_slots(slots: usize) -> AddrTable {
        debug_assert!(slots.is_power_of_two());
        AddrTable {
            front: (EMPTY, 0),
            keys: vec![EMPTY; slots],
            vals: vec![0; slots],
            len: 0,
            shift: 64 - slots.trailing_zeros(),
        }
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.keys.len() - 1
    }

    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        ((key >> ADDR_SHIFT).wrapping_mul(FIBONACCI) >> self.shift) as usize
    }

    /// The slot holding `key`, if any.
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let k = self.keys[i];
            if k == key {
                return Some(i);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// The block at `key`.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<BlockId> {
        if self.front.0 == key {
            return Some(self.front.1);
        }
        self.find(key).map(|i| self.vals[i])
    }

    /// Records the block at `key`, which has no entry (an address is handed out once until
    /// it is freed).
    #[inline]
    pub(crate) fn insert(&mut self, key: u64, val: BlockId) {
        debug_assert_ne!(key, EMPTY);
        debug_assert!(self.get(key).is_none(), "address {key:#x} inserted twice");
        let older = std::mem::replace(&mut self.front, (key, val));
        if older.0 != EMPTY {
            self.insert_in_table(older.0, older.1);
        }
    }

    /// Entries (front slot and table).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.len + usize::from(self.front.0 != EMPTY)
    }

    /// Removes the entry at `key`, returning its block.
    #[inline]
    pub(crate) fn remove(&mut self, key: u64) -> Option<BlockId> {
        if self.front.0 == key {
            let val = self.front.1;
            self.front.0 = EMPTY;
            return Some(val);
        }
        self.remove_from_table(key)
    }

    /// Records `key` in the table proper.
    #[inline]
    fn insert_in_table(&mut self, key: u64, val: BlockId) {
        debug_assert_ne!(key, EMPTY);
        if (self.len + 1) * 2 > self.keys.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let k = self.keys[i];
            if k == EMPTY || k == key {
                if k == EMPTY {
                    self.len += 1;
                }
                self.keys[i] = key;
                self.vals[i] = val;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes `key` from the table proper.
    #[inline]
    fn remove_from_table(&mut self, key: u64) -> Option<BlockId> {
        let mut hole = self.find(key)?;
        let val = self.vals[hole];
        self.len -= 1;
        // Backward-shift: move later entries of the probe run into the hole when their home
        // slot does not lie (cyclically) between the hole and their position.
        let mask = self.mask();
        let mut i = hole;
        loop {
            i = (i + 1) & mask;
            let k = self.keys[i];
            if k == EMPTY {
                break;
            }
            let home = self.home(k);
            let dist_home = i.wrapping_sub(home) & mask;
            let dist_hole = i.wrapping_sub(hole) & mask;
            if dist_home >= dist_hole {
                self.keys[hole] = k;
                self.vals[hole] = self.vals[i];
                hole = i;
            }
        }
        self.keys[hole] = EMPTY;
        Some(val)
    }

    fn grow(&mut self) {
        let mut bigger = AddrTable::with_slots(self.keys.len() * 2);
        for (i, &k) in self.keys.iter().enumerate() {
            if k != EMPTY {
                bigger.insert_in_table(k, self.vals[i]);
            }
        }
        bigger.front = self.front;
        *self = bigger;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn table_agrees_with_a_hash_map_through_growth_and_removals() {
        let mut t = AddrTable::with_slots(8);
        let mut m = HashMap::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Clustered addresses (few segments) stress probe runs.
            let key = 0x7f00_0000_0000 + (x % 4096) * 512;
            if x.is_multiple_of(3) {
                assert_eq!(t.remove(key), m.remove(&key), "step {step}");
            } else {
                // Re-recording an address is a removal and an insertion (see `insert`).
                assert_eq!(t.remove(key), m.remove(&key), "step {step}");
                t.insert(key, step);
                m.insert(key, step);
            }
            assert_eq!(t.len(), m.len());
        }
        for (&k, &v) in &m {
            assert_eq!(t.get(k), Some(v));
        }
        assert_eq!(t.get(1 << 40), None);
    }
}
