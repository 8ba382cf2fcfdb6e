//! `DeviceStats`: the counters PyTorch's caching allocator keeps per device, with the same
//! names, the same update rules and the same flat keys as `torch.cuda.memory_stats()`.
//!
//! A [`Stat`] is `{current, peak, allocated, freed}`; a [`StatArray`] holds one per
//! [`StatType`] (all, small pool, large pool). Updates go through [`Stat::update`], which is
//! PyTorch's `update_stat`: `current += n`, `peak = max(peak, current)`, and the positive part
//! added to `allocated`, the negative part to `freed`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::snapshot::{BlockState, SegmentType, Snapshot};

/// One counter, as PyTorch's `Stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stat {
    /// Value now.
    pub current: i64,
    /// Highest value since the last peak reset.
    pub peak: i64,
    /// Sum of all increases since the last accumulated reset.
    pub allocated: i64,
    /// Sum of all decreases since the last accumulated reset.
    pub freed: i64,
}

impl Stat {
    /// Adds `amount` (negative to subtract), as PyTorch's `update_stat`.
    #[inline]
    pub fn update(&mut self, amount: i64) {
        self.current += amount;
        self.peak = self.peak.max(self.current);
        if amount > 0 {
            self.allocated += amount;
        }
        if amount < 0 {
            self.freed += -amount;
        }
    }

    /// `peak = current`.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    /// `allocated = freed = 0`.
    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// Which entry of a [`StatArray`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatType {
    /// Both pools together.
    All = 0,
    /// The small pool.
    SmallPool = 1,
    /// The large pool.
    LargePool = 2,
}

impl StatType {
    /// The three types in PyTorch's order.
    pub const ALL: [StatType; 3] = [StatType::All, StatType::SmallPool, StatType::LargePool];

    /// The key PyTorch uses (`all`, `small_pool`, `large_pool`).
    pub fn key(self) -> &'static str {
        match self {
            StatType::All => "all",
            StatType::SmallPool => "small_pool",
            StatType::LargePool => "large_pool",
        }
    }

    /// The pool type for a block or segment of the small (`true`) or large pool.
    pub fn for_pool(is_small: bool) -> StatType {
        if is_small {
            StatType::SmallPool
        } else {
            StatType::LargePool
        }
    }
}

/// One [`Stat`] per [`StatType`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// The stat of one type.
    pub fn get(&self, t: StatType) -> &Stat {
        &self.0[t as usize]
    }

    /// Adds `amount` to `all` and to the given pool's stat, as PyTorch does for a block of
    /// that pool.
    #[inline]
    pub fn update_pool(&mut self, is_small: bool, amount: i64) {
        self.0[StatType::All as usize].update(amount);
        self.0[StatType::for_pool(is_small) as usize].update(amount);
    }

    fn for_each(&mut self, f: impl Fn(&mut Stat)) {
        self.0.iter_mut().for_each(f);
    }
}

/// Every counter of one device, as PyTorch's `DeviceStats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStats {
    /// Number of allocated blocks.
    pub allocation: StatArray,
    /// Number of segments (device allocations).
    pub segment: StatArray,
    /// Number of active blocks (allocated, or freed but still in use by a stream).
    pub active: StatArray,
    /// Number of free blocks that are part of a split segment (cannot be released).
    pub inactive_split: StatArray,
    /// Bytes in allocated blocks.
    pub allocated_bytes: StatArray,
    /// Bytes reserved from the device (all segments).
    pub reserved_bytes: StatArray,
    /// Bytes in active blocks.
    pub active_bytes: StatArray,
    /// Bytes in free blocks of split segments.
    pub inactive_split_bytes: StatArray,
    /// Bytes the program asked for (before rounding) in active blocks: PyTorch adds a block's
    /// request at allocation and subtracts it at free completion, with `active_bytes`.
    pub requested_bytes: StatArray,
    /// Allocations that had to free the whole cache and try again.
    pub num_alloc_retries: i64,
    /// Allocations that failed.
    pub num_ooms: i64,
    /// Times the allocator synchronized every stream.
    pub num_sync_all_streams: i64,
    /// Device allocations (cudaMalloc, or page maps for expandable segments).
    pub num_device_alloc: i64,
    /// Device frees.
    pub num_device_free: i64,
    /// The `max_split_size` setting in bytes, -1 when unlimited.
    pub max_split_size: i64,
    /// Allocated blocks of at least `max_split_size`.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size`.
    pub oversize_segments: Stat,
}

impl Default for DeviceStats {
    fn default() -> Self {
        DeviceStats {
            allocation: StatArray::default(),
            segment: StatArray::default(),
            active: StatArray::default(),
            inactive_split: StatArray::default(),
            allocated_bytes: StatArray::default(),
            reserved_bytes: StatArray::default(),
            active_bytes: StatArray::default(),
            inactive_split_bytes: StatArray::default(),
            requested_bytes: StatArray::default(),
            num_alloc_retries: 0,
            num_ooms: 0,
            num_sync_all_streams: 0,
            num_device_alloc: 0,
            num_device_free: 0,
            max_split_size: -1,
            oversize_allocations: Stat::default(),
            oversize_segments: Stat::default(),
        }
    }
}

impl DeviceStats {
    /// The stat arrays with the names `torch.cuda.memory_stats()` gives them.
    pub fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("active", &self.active),
            ("active_bytes", &self.active_bytes),
            ("allocated_bytes", &self.allocated_bytes),
            ("allocation", &self.allocation),
            ("inactive_split", &self.inactive_split),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("segment", &self.segment),
        ]
    }

    /// The nine stat arrays (every field but the single counters), to change alike, in the
    /// order of [`arrays`](Self::arrays) (so the two zip array to array).
    pub fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.active,
            &mut self.active_bytes,
            &mut self.allocated_bytes,
            &mut self.allocation,
            &mut self.inactive_split,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
            &mut self.reserved_bytes,
            &mut self.segment,
        ]
    }

    /// `peak = current` for every stat (`torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peak(&mut self) {
        for a in self.arrays_mut() {
            a.for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `allocated = freed = 0` everywhere and the scalar counters to 0
    /// (`torch.cuda.reset_accumulated_memory_stats`).
    pub fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            a.for_each(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// The flat, sorted `key -> value` map of `torch.cuda.memory_stats()`
    /// (`allocated_bytes.all.current`, `allocation.large_pool.peak`, `num_ooms`, ...).
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        fn put_stat(m: &mut BTreeMap<String, i64>, prefix: &str, s: &Stat) {
            m.insert(format!("{prefix}.current"), s.current);
            m.insert(format!("{prefix}.peak"), s.peak);
            m.insert(format!("{prefix}.allocated"), s.allocated);
            m.insert(format!("{prefix}.freed"), s.freed);
        }
        let mut m = BTreeMap::new();
        for (name, arr) in self.arrays() {
            for t in StatType::ALL {
                put_stat(&mut m, &format!("{name}.{}", t.key()), arr.get(t));
            }
        }
        put_stat(&mut m, "oversize_allocations", &self.oversize_allocations);
        put_stat(&mut m, "oversize_segments", &self.oversize_segments);
        m.insert("num_alloc_retries".into(), self.num_alloc_retries);
        m.insert("num_ooms".into(), self.num_ooms);
        m.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        m.insert("num_device_alloc".into(), self.num_device_alloc);
        m.insert("num_device_free".into(), self.num_device_free);
        m.insert("max_split_size".into(), self.max_split_size);
        m
    }
}

impl DeviceStats {
    /// The stats a snapshot implies for one device: every `current` figure recomputed from the
    /// segments and blocks (`peak` and `allocated` equal `current`, `freed` is 0, counters 0:
    /// a snapshot does not hold history). `max_split_size` is in bytes (`None` = unlimited) and
    /// decides which blocks and segments count as oversize.
    ///
    /// This is the independent check of the allocator's own bookkeeping: after any sequence of
    /// operations, the allocator's `current` figures equal these.
    pub fn from_snapshot(
        snapshot: &Snapshot,
        device: i32,
        max_split_size: Option<u64>,
    ) -> DeviceStats {
        let mut s = DeviceStats {
            max_split_size: max_split_size.map_or(-1, |m| m as i64),
            ..DeviceStats::default()
        };
        let oversize = |size: u64| max_split_size.is_some_and(|m| size >= m);
        for seg in snapshot.segments.iter().filter(|seg| seg.device == device) {
            let small = seg.segment_type == SegmentType::Small;
            s.segment.update_pool(small, 1);
            s.reserved_bytes.update_pool(small, seg.total_size as i64);
            if oversize(seg.total_size) && !seg.is_expandable {
                s.oversize_segments.update(1);
            }
            let split = seg.blocks.len() > 1 && !seg.is_expandable;
            for b in &seg.blocks {
                let size = b.size as i64;
                match b.state {
                    BlockState::ActiveAllocated => {
                        s.allocation.update_pool(small, 1);
                        s.allocated_bytes.update_pool(small, size);
                        s.requested_bytes
                            .update_pool(small, b.requested_size as i64);
                        s.active.update_pool(small, 1);
                        s.active_bytes.update_pool(small, size);
                        if oversize(b.size) {
                            s.oversize_allocations.update(1);
                        }
                    }
                    BlockState::ActivePendingFree => {
                        // PyTorch drops requested_bytes with active_bytes, at free completion.
                        s.active.update_pool(small, 1);
                        s.active_bytes.update_pool(small, size);
                        s.requested_bytes
                            .update_pool(small, b.requested_size as i64);
                    }
                    BlockState::Inactive => {
                        if split {
                            s.inactive_split.update_pool(small, 1);
                            s.inactive_split_bytes.update_pool(small, size);
                        }
                    }
                }
            }
        }
        s
    }

    /// Only the `current` figures of every stat, for comparing two stats whose histories differ
    /// (an allocator's own with one recomputed from a snapshot).
    pub fn currents(&self) -> BTreeMap<String, i64> {
        self.memory_stats()
            .into_iter()
            .filter(|(k, _)| k.ends_with(".current"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_tracks_peak_allocated_and_freed() {
        let mut s = Stat::default();
        s.update(10);
        s.update(-4);
        s.update(2);
        assert_eq!(
            s,
            Stat {
                current: 8,
                peak: 10,
                allocated: 12,
                freed: 4
            }
        );
        s.reset_peak();
        assert_eq!(s.peak, 8);
        s.reset_accumulated();
        assert_eq!((s.allocated, s.freed), (0, 0));
    }

    #[test]
    fn arrays_and_arrays_mut_list_the_arrays_in_one_order() {
        let mut stats = DeviceStats::default();
        for (i, a) in stats.arrays_mut().into_iter().enumerate() {
            a.0[0].current = i as i64;
        }
        let order: Vec<i64> = stats.arrays().iter().map(|(_, a)| a.0[0].current).collect();
        assert_eq!(order, (0..9).collect::<Vec<i64>>());
    }

    #[test]
    fn memory_stats_has_pytorch_keys_sorted() {
        let mut d = DeviceStats::default();
        d.allocated_bytes.update_pool(false, 4096);
        let m = d.memory_stats();
        assert_eq!(m["allocated_bytes.all.current"], 4096);
        assert_eq!(m["allocated_bytes.large_pool.peak"], 4096);
        assert_eq!(m["allocated_bytes.small_pool.current"], 0);
        assert_eq!(m["max_split_size"], -1);
        // 9 arrays x 3 types x 4 fields + 2 oversize x 4 + 6 scalars.
        assert_eq!(m.len(), 9 * 3 * 4 + 8 + 6);
        let keys: Vec<_> = m.keys().cloned().collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }
}
