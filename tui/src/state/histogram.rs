//! Histogram summaries the histogram view draws: log2 buckets plus p50 / p90 / p99 / max.
//!
//! Live sources send summaries computed from the agent's HdrHistograms; for snapshot files
//! [`Log2Histogram`] builds them from the trace (allocation sizes, and lifetimes from an
//! `alloc` to the `free_completed` of the same address). Both make their buckets with
//! [`log2_buckets`]: the agent sends only non-empty buckets, and the empty ones between are
//! filled in as 0 rows there, as a file's are.

/// What a histogram's values measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistogramUnit {
    /// Bytes.
    Bytes,
    /// Nanoseconds.
    Nanos,
}

/// One bucket `[lo, hi)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Lowest value in the bucket.
    pub lo: u64,
    /// One past the highest value.
    pub hi: u64,
    /// Values recorded.
    pub count: u64,
}

/// A histogram ready to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSummary {
    /// What it measures: `size`, `lifetime`, `latency`.
    pub metric: String,
    /// Which group: `all`, `small pool`, `stream 7`.
    pub group: String,
    /// Unit of the values.
    pub unit: HistogramUnit,
    /// Buckets in increasing order from the lowest non-empty one to the highest, the empty
    /// ones between included ([`log2_buckets`]).
    pub buckets: Vec<Bucket>,
    /// Values recorded.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest value.
    pub max: u64,
}

/// Number of log2 buckets (values up to 2^64).
const LOG2_BUCKETS: usize = 65;

/// The log2 bucket of index `i` with `count` values: `[2^(i-1), 2^i)`, index 0 holding 0 and
/// the last one ending at `u64::MAX`.
fn log2_bucket(i: usize, count: u64) -> Bucket {
    Bucket {
        lo: if i == 0 { 0 } else { 1u64 << (i - 1).min(63) },
        hi: if i >= 64 { u64::MAX } else { 1u64 << i },
        count,
    }
}

/// The index of the log2 bucket whose upper bound is `hi` (the agent's `(upper_bound, count)`
/// form: a power of two, or `u64::MAX` for the last bucket).
pub fn log2_index(hi: u64) -> usize {
    if hi == u64::MAX {
        LOG2_BUCKETS - 1
    } else {
        (hi.max(1).trailing_zeros() as usize).min(LOG2_BUCKETS - 1)
    }
}

/// The bucket list every histogram is drawn from, given `(index, count)` per log2 bucket (see
/// [`log2_index`]; any order, empty ones and repeats allowed): every bucket from the lowest to
/// the highest non-empty one, those between with no values as 0, so file and live histograms
/// read the same way.
pub fn log2_buckets(counts: impl IntoIterator<Item = (usize, u64)>) -> Vec<Bucket> {
    let mut all = [0u64; LOG2_BUCKETS];
    for (i, n) in counts {
        all[i.min(LOG2_BUCKETS - 1)] += n;
    }
    let (Some(first), Some(last)) = (
        all.iter().position(|&c| c > 0),
        all.iter().rposition(|&c| c > 0),
    ) else {
        return Vec::new();
    };
    (first..=last).map(|i| log2_bucket(i, all[i])).collect()
}

/// A small exact-count histogram over log2 buckets, with values kept for percentiles.
#[derive(Debug, Clone, Default)]
pub struct Log2Histogram {
    counts: Vec<u64>,
    values: Vec<u64>,
}

impl Log2Histogram {
    /// An empty histogram.
    pub fn new() -> Log2Histogram {
        Log2Histogram {
            counts: vec![0; LOG2_BUCKETS],
            values: Vec::new(),
        }
    }

    /// Records one value.
    pub fn record(&mut self, v: u64) {
        let idx = if v == 0 {
            0
        } else {
            64 - v.leading_zeros() as usize
        };
        self.counts[idx] += 1;
        self.values.push(v);
    }

    /// The summary, named `metric` / `group`.
    pub fn summary(mut self, metric: &str, group: &str, unit: HistogramUnit) -> HistogramSummary {
        self.values.sort_unstable();
        let pct = |p: f64| -> u64 {
            if self.values.is_empty() {
                return 0;
            }
            let rank = ((p * self.values.len() as f64).ceil() as usize).clamp(1, self.values.len());
            self.values[rank - 1]
        };
        let buckets = log2_buckets(self.counts.iter().copied().enumerate());
        HistogramSummary {
            metric: metric.to_string(),
            group: group.to_string(),
            unit,
            buckets,
            count: self.values.len() as u64,
            p50: pct(0.50),
            p90: pct(0.90),
            p99: pct(0.99),
            max: self.values.last().copied().unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_and_percentiles_exact() {
        let mut h = Log2Histogram::new();
        for v in 1..=100u64 {
            h.record(v);
        }
        let s = h.summary("size", "all", HistogramUnit::Bytes);
        assert_eq!(s.count, 100);
        assert_eq!((s.p50, s.p90, s.p99, s.max), (50, 90, 99, 100));
        assert_eq!(
            s.buckets[0],
            Bucket {
                lo: 1,
                hi: 2,
                count: 1
            }
        );
        assert_eq!(s.buckets.last().unwrap().lo, 64);
        assert_eq!(s.buckets.iter().map(|b| b.count).sum::<u64>(), 100);
    }

    #[test]
    fn an_empty_histogram_has_no_buckets() {
        let s = Log2Histogram::new().summary("lifetime", "all", HistogramUnit::Nanos);
        assert!(s.buckets.is_empty());
        assert_eq!(s.max, 0);
    }
}
