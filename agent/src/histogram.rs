//! HdrHistograms of allocation size, lifetime and allocator latency, per pool and per stream.
//!
//! Gil Tene's HdrHistogram (the `hdrhistogram` crate): recording is a few nanoseconds and
//! constant-time, memory grows with the logarithm of the range (auto-resizing), and quantiles
//! stay within [`SIGNIFICANT_DIGITS`] decimal digits of the true value. Each recorded value goes
//! to the set of its `(pool, stream)` pair; the per-pool, per-stream and all-pools sets are sums of
//! pair sets, built when a summary is asked for, so the hot path records each value once.
//!
//! Values are staged before they reach the histograms: the aggregator records a value per
//! event between two receives from the channel, and each receive is a locked compare-and-swap
//! that waits for every earlier store, so a count increment that misses the L1 cache (the count
//! arrays of a device's histograms together exceed it) stalls the next event. A staged value is
//! one store into a small buffer ([`HIST_STAGE`] values); a full buffer is recorded in one
//! tight loop. Summaries include the values still staged, so nothing recorded is ever missing.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use crate::state::{
    HistogramSet, HistogramSummary, Histograms, PoolHistograms, PoolKey, StreamHistograms,
};

/// Decimal digits of precision kept (2: quantiles within 1%, about 40 KiB per histogram over
/// a range of 2^50).
pub const SIGNIFICANT_DIGITS: u8 = 2;

/// Values staged before they are recorded into the histograms in one go (4 KiB of stage).
pub const HIST_STAGE: usize = 256;

/// The quantiles a summary reports.
const P50: f64 = 0.5;
const P90: f64 = 0.9;
const P99: f64 = 0.99;

/// Records a value; the histograms auto-resize, so this only clamps a value beyond any range
/// (which `record` refuses) to the highest trackable one.
#[inline]
fn record(h: &mut Histogram<u64>, v: u64) {
    if h.record(v).is_err() {
        h.saturating_record(v);
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new(SIGNIFICANT_DIGITS).expect("2 significant digits is a valid precision")
}

/// Summarises one histogram: count, extremes, quantiles and log2 buckets, with `sum` the exact
/// total of the values recorded (the mean is `sum / count`, exact too).
pub fn summarize(h: &Histogram<u64>, sum: u128) -> HistogramSummary {
    if h.is_empty() {
        return HistogramSummary::default();
    }
    let mut buckets: BTreeMap<u32, u64> = BTreeMap::new();
    for v in h.iter_recorded() {
        let value = h.highest_equivalent(v.value_iterated_to());
        let bucket = u64::BITS - value.leading_zeros();
        *buckets.entry(bucket).or_default() += v.count_at_value();
    }
    HistogramSummary {
        count: h.len(),
        min: h.min(),
        max: h.max(),
        mean: sum as f64 / h.len() as f64,
        sum: sum as f64,
        p50: h.value_at_quantile(P50),
        p90: h.value_at_quantile(P90),
        p99: h.value_at_quantile(P99),
        buckets: buckets
            .into_iter()
            .map(|(b, n)| (1u64.checked_shl(b).unwrap_or(u64::MAX), n))
            .collect(),
    }
}

/// Which histogram of a [`HistSet`] a staged value goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Size = 0,
    Lifetime = 1,
    Latency = 2,
}

/// A value recorded but not yet in its histogram.
#[derive(Debug, Clone, Copy)]
struct Staged {
    /// Index of the pair in [`DeviceHistograms`]' list (stable while values are staged: a new
    /// pair is only inserted after the stage is emptied).
    pair: u32,
    kind: Kind,
    value: u64,
}

/// Size, lifetime and latency histograms of one slice of the allocations, with the exact sum
/// of each one's values (the histograms keep values only to [`SIGNIFICANT_DIGITS`]).
#[derive(Debug, Clone)]
pub struct HistSet {
    size: Histogram<u64>,
    lifetime: Histogram<u64>,
    latency: Histogram<u64>,
    /// Exact sums of the values recorded, by [`Kind`] (`u128`: no total of `u64`s overflows).
    sums: [u128; 3],
}

impl Default for HistSet {
    fn default() -> Self {
        HistSet {
            size: new_histogram(),
            lifetime: new_histogram(),
            latency: new_histogram(),
            sums: [0; 3],
        }
    }
}

impl HistSet {
    /// Records a value into the histogram of `kind` and its sum.
    #[inline]
    fn record(&mut self, kind: Kind, value: u64) {
        let h = match kind {
            Kind::Size => &mut self.size,
            Kind::Lifetime => &mut self.lifetime,
            Kind::Latency => &mut self.latency,
        };
        record(h, value);
        self.sums[kind as usize] += u128::from(value);
    }

    fn add(&mut self, other: &HistSet) {
        // Auto-resizing histograms of the same precision always add.
        let _ = self.size.add(&other.size);
        let _ = self.lifetime.add(&other.lifetime);
        let _ = self.latency.add(&other.latency);
        for (sum, other) in self.sums.iter_mut().zip(other.sums) {
            *sum += other;
        }
    }

    fn summary(&self) -> HistogramSet {
        HistogramSet {
            size: summarize(&self.size, self.sums[Kind::Size as usize]),
            lifetime: summarize(&self.lifetime, self.sums[Kind::Lifetime as usize]),
            latency: summarize(&self.latency, self.sums[Kind::Latency as usize]),
        }
    }

    /// Recorded allocation sizes.
    pub fn size(&self) -> &Histogram<u64> {
        &self.size
    }
}

/// Slots of [`DeviceHistograms`]' lookup cache (a power of two).
const PAIR_HINTS: usize = 16;

/// The hint slot of a `(pool, stream)` pair: a multiplicative hash of both.
#[inline]
fn hint_slot(pool: PoolKey, stream: u64) -> usize {
    let p = match pool {
        PoolKey::Small => 0,
        PoolKey::Large => 1,
        PoolKey::Private(id) => id.wrapping_add(2),
    };
    let h = (stream ^ p.rotate_left(32)).wrapping_mul(crate::addr_map::FIBONACCI);
    (h >> (u64::BITS - PAIR_HINTS.trailing_zeros())) as usize
}

/// The histograms of one device.
///
/// Each value is recorded once, in the set of its `(pool, stream)` pair (few pairs: a sorted
/// vector, found through a small direct-mapped cache of indices, checked on use); the per-pool, per-stream and
/// all-pools sets are sums of pair sets, built when a summary is asked for. Adding
/// HdrHistograms of one precision adds their counts, so the sums equal recording every value
/// into each set they belong to.
#[derive(Debug, Clone, Default)]
pub struct DeviceHistograms {
    /// Sorted by `(pool, stream)`.
    pairs: Vec<((PoolKey, u64), HistSet)>,
    /// Likely index in `pairs` of the pairs hashing to each slot (a hint: checked on use).
    hints: [u32; PAIR_HINTS],
    version: u64,
    /// Values recorded but not yet in `pairs` (at most [`HIST_STAGE`]).
    staged: Vec<Staged>,
}

impl DeviceHistograms {
    /// The index of the `(pool, stream)` pair, created on first use.
    #[inline]
    fn pair(&mut self, pool: PoolKey, stream: u64) -> u32 {
        let key = (pool, stream);
        let slot = hint_slot(pool, stream);
        let hint = self.hints[slot];
        match self.pairs.get(hint as usize) {
            Some((k, _)) if *k == key => hint,
            _ => self.find_pair(key, slot),
        }
    }

    #[cold]
    fn find_pair(&mut self, key: (PoolKey, u64), slot: usize) -> u32 {
        let i = match self.pairs.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                // Inserting shifts indices: the staged values go in first.
                self.flush();
                let i = self.pairs.partition_point(|(k, _)| *k < key);
                self.pairs.insert(i, (key, HistSet::default()));
                i
            }
        };
        self.hints[slot] = i as u32;
        i as u32
    }

    #[inline]
    fn stage(&mut self, pair: u32, kind: Kind, value: u64) {
        self.staged.push(Staged { pair, kind, value });
    }

    /// Records the staged values into their histograms.
    pub fn flush(&mut self) {
        for s in &self.staged {
            self.pairs[s.pair as usize].1.record(s.kind, s.value);
        }
        self.staged.clear();
    }

    #[inline]
    fn flush_when_full(&mut self) {
        if self.staged.len() + 2 > HIST_STAGE {
            self.flush();
        }
    }

    /// Records an allocation of `requested` bytes (and, when measured, the allocator's
    /// latency).
    #[inline]
    pub fn record_alloc(&mut self, pool: PoolKey, stream: u64, requested: u64, latency_ns: u32) {
        let pair = self.pair(pool, stream);
        self.stage(pair, Kind::Size, requested);
        if latency_ns > 0 {
            self.stage(pair, Kind::Latency, u64::from(latency_ns));
        }
        self.version += 1;
        self.flush_when_full();
    }

    /// Records the lifetime of a block whose free completed.
    #[inline]
    pub fn record_lifetime(&mut self, pool: PoolKey, stream: u64, lifetime_ns: u64) {
        let pair = self.pair(pool, stream);
        self.stage(pair, Kind::Lifetime, lifetime_ns);
        self.version += 1;
        self.flush_when_full();
    }

    /// The staged values with the key of their pair.
    fn staged(&self) -> impl Iterator<Item = (&(PoolKey, u64), Kind, u64)> {
        self.staged
            .iter()
            .map(|s| (&self.pairs[s.pair as usize].0, s.kind, s.value))
    }

    /// A counter that changes whenever a value is recorded.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The histograms of one pool (all its streams), if anything was recorded there.
    pub fn pool(&self, pool: PoolKey) -> Option<HistSet> {
        let mut found = None;
        for (_, set) in self.pairs.iter().filter(|((p, _), _)| *p == pool) {
            found.get_or_insert_with(HistSet::default).add(set);
        }
        if let Some(sum) = &mut found {
            for (_, kind, value) in self.staged().filter(|((p, _), _, _)| *p == pool) {
                sum.record(kind, value);
            }
        }
        found
    }

    /// Each pool's set (all its streams), the staged values included.
    fn pool_sets(&self) -> BTreeMap<PoolKey, HistSet> {
        let mut by_pool: BTreeMap<PoolKey, HistSet> = BTreeMap::new();
        for ((pool, _), set) in &self.pairs {
            by_pool.entry(*pool).or_default().add(set);
        }
        for ((pool, _), kind, value) in self.staged() {
            by_pool.entry(*pool).or_default().record(kind, value);
        }
        by_pool
    }

    /// Summaries of every set, and of all pools together.
    pub fn summary(&self) -> Histograms {
        let by_pool = self.pool_sets();
        let mut all = HistSet::default();
        for set in by_pool.values() {
            all.add(set);
        }
        let mut by_stream: BTreeMap<u64, HistSet> = BTreeMap::new();
        for ((_, stream), set) in &self.pairs {
            by_stream.entry(*stream).or_default().add(set);
        }
        for ((_, stream), kind, value) in self.staged() {
            by_stream.entry(*stream).or_default().record(kind, value);
        }
        Histograms {
            all: all.summary(),
            by_pool: pool_histograms(by_pool),
            by_stream: by_stream
                .into_iter()
                .map(|(stream, set)| StreamHistograms {
                    stream,
                    set: set.summary(),
                })
                .collect(),
        }
    }

    /// The summaries of each pool only (what `/metrics` shows); `all` and `by_stream` stay
    /// empty.
    pub fn pool_summary(&self) -> Histograms {
        Histograms {
            by_pool: pool_histograms(self.pool_sets()),
            ..Histograms::default()
        }
    }
}

/// The summaries of per-pool sets, in pool order.
fn pool_histograms(by_pool: BTreeMap<PoolKey, HistSet>) -> Vec<PoolHistograms> {
    by_pool
        .into_iter()
        .map(|(pool, set)| PoolHistograms {
            pool,
            set: set.summary(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_report_quantiles_and_log2_buckets() {
        let mut h = DeviceHistograms::default();
        for size in [512u64, 512, 1000, 4096, 1 << 20] {
            h.record_alloc(PoolKey::Small, 0, size, 100);
        }
        h.record_alloc(PoolKey::Large, 1, 20 << 20, 0);
        h.record_lifetime(PoolKey::Large, 1, 5_000);
        let s = h.summary();
        assert_eq!(s.all.size.count, 6);
        assert_eq!(s.all.latency.count, 5, "unmeasured latency is not recorded");
        assert_eq!(s.by_pool.len(), 2);
        let small = &s.by_pool[0].set.size;
        assert_eq!(small.count, 5);
        assert_eq!(small.min, 512);
        assert!(small.max >= 1 << 20 && small.max <= (1 << 20) * 101 / 100);
        assert!(small.p50 >= 1000 && small.p50 <= 1010);
        // The sum and mean are exact, though the histogram keeps 1 MiB only to 1%.
        assert_eq!(small.sum, (512 + 512 + 1000 + 4096 + (1 << 20)) as f64);
        assert_eq!(small.mean, small.sum / 5.0);
        // 512 is in [512, 1024); 1000 too; 4096 in [4096, 8192); 1 MiB in [1 MiB, 2 MiB).
        assert_eq!(small.buckets, vec![(1024, 3), (8192, 1), (2 << 20, 1)]);
        assert_eq!(s.by_stream[1].set.lifetime.count, 1);
        assert_eq!(s.all.lifetime.count, 1);
    }

    #[test]
    fn pool_and_stream_summaries_equal_recording_into_each_set_directly() {
        let mut h = DeviceHistograms::default();
        let (mut small, mut stream1) = (HistSet::default(), HistSet::default());
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for i in 0..5_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let pool = if x.is_multiple_of(3) {
                PoolKey::Small
            } else {
                PoolKey::Large
            };
            let stream = (x >> 20) % 3;
            let (size, latency, life) = (1 + (x >> 8) % (64 << 20), (x >> 30) as u32 % 5000, i * 7);
            h.record_alloc(pool, stream, size, latency);
            h.record_lifetime(pool, stream, life);
            for (set, hit) in [
                (&mut small, pool == PoolKey::Small),
                (&mut stream1, stream == 1),
            ] {
                if hit {
                    set.record(Kind::Size, size);
                    if latency > 0 {
                        set.record(Kind::Latency, u64::from(latency));
                    }
                    set.record(Kind::Lifetime, life);
                }
            }
        }
        let s = h.summary();
        assert_eq!(s.by_pool[0].pool, PoolKey::Small);
        assert_eq!(s.by_pool[0].set, small.summary());
        assert_eq!(s.by_stream[1].stream, 1);
        assert_eq!(s.by_stream[1].set, stream1.summary());
        assert_eq!(
            h.pool(PoolKey::Small).map(|p| p.summary()),
            Some(small.summary())
        );
        assert!(h.pool(PoolKey::Private(3)).is_none());
        assert_eq!(s.all.size.count, 5_000);
    }

    #[test]
    fn staged_values_count_before_and_after_they_are_flushed() {
        let mut h = DeviceHistograms::default();
        let mut direct = HistSet::default();
        // Fewer values than the stage holds, over pairs that appear one after the other.
        for i in 0..(HIST_STAGE as u64 / 4) {
            let pool = [PoolKey::Large, PoolKey::Small, PoolKey::Private(7)][i as usize % 3];
            h.record_alloc(pool, i % 4, 512 * (i + 1), 10 + i as u32);
            h.record_lifetime(pool, i % 4, 1_000 * i);
            direct.record(Kind::Size, 512 * (i + 1));
            direct.record(Kind::Latency, 10 + i);
            direct.record(Kind::Lifetime, 1_000 * i);
        }
        assert!(!h.staged.is_empty(), "some values are still staged");
        let staged = h.summary();
        assert_eq!(staged.all, direct.summary());
        let private = h.pool(PoolKey::Private(7)).map(|p| p.summary());
        h.flush();
        assert!(h.staged.is_empty());
        assert_eq!(h.summary(), staged);
        assert_eq!(h.pool(PoolKey::Private(7)).map(|p| p.summary()), private);
    }

    #[test]
    fn an_empty_histogram_summarizes_to_zeros() {
        assert_eq!(summarize(&new_histogram(), 0), HistogramSummary::default());
    }
}
