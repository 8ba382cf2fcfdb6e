//! Histogram summaries the histogram view draws: log2 buckets plus p50 / p90 / p99 / max.
//!
//! Live sources send summaries computed from the agent's HdrHistograms; for snapshot files
//! [`Log2Histogram`] builds them from the trace (allocation sizes, and lifetimes from an
//! `alloc` to the `free_completed` of the same address).

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
    /// Non-empty buckets in increasing order (empty buckets between them included).
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
        let first = self.counts.iter().position(|&c| c > 0);
        let last = self.counts.iter().rposition(|&c| c > 0);
        let buckets = match (first, last) {
            (Some(f), Some(l)) => (f..=l)
                .map(|i| Bucket {
                    lo: if i == 0 { 0 } else { 1u64 << (i - 1) },
                    hi: if i >= 64 { u64::MAX } else { 1u64 << i },
                    count: self.counts[i],
                })
                .collect(),
            _ => Vec::new(),
        };
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
