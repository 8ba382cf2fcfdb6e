//! The host (CPU) heap of the watched process, as the agent folds it from the events of the
//! instrumented global allocator (`allocview_alloc::global::Instrumented`, device
//! `CPU_DEVICE`): bytes and allocations in use with their peaks and running totals, and the
//! bytes in use over time.
//!
//! The agent keeps counters only, no history for the host; the adapter samples the counters
//! each time a new agent state arrives, so the chart grows while the dashboard watches
//! (bounded as [`Timeline`](super::Timeline): old samples merge pairwise, keeping maxima).

use allocview_alloc::caching::stats::Stat;

use super::timeline::MAX_SAMPLES;

/// One sample of the host heap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostSample {
    /// Seconds since the watched process started.
    pub x: f64,
    /// Bytes in use.
    pub bytes: u64,
}

/// The host heap's figures.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostHeap {
    /// Bytes in use: current, peak, total allocated (`allocated`) and total freed (`freed`).
    pub bytes: Stat,
    /// Allocations: live (`current`), peak live, allocations made (`allocated`) and frees
    /// (`freed`).
    pub allocations: Stat,
    /// Bytes in use over time, in increasing x.
    pub samples: Vec<HostSample>,
}

/// Clamps a counter that should never be negative.
fn nonneg(v: i64) -> u64 {
    v.max(0) as u64
}

impl HostHeap {
    /// Bytes in use now.
    pub fn current(&self) -> u64 {
        nonneg(self.bytes.current)
    }

    /// Most bytes in use at once (since the last peak reset).
    pub fn peak(&self) -> u64 {
        nonneg(self.bytes.peak)
    }

    /// Allocations live now.
    pub fn live(&self) -> u64 {
        nonneg(self.allocations.current)
    }

    /// Allocations made.
    pub fn allocs(&self) -> u64 {
        nonneg(self.allocations.allocated)
    }

    /// Frees made.
    pub fn frees(&self) -> u64 {
        nonneg(self.allocations.freed)
    }

    /// Bytes allocated in total.
    pub fn total(&self) -> u64 {
        nonneg(self.bytes.allocated)
    }

    /// Appends a sample after the last one (a sample at or before the last x is ignored),
    /// merging old samples pairwise when over [`MAX_SAMPLES`].
    pub fn push_sample(&mut self, s: HostSample) {
        if self.samples.last().is_some_and(|l| s.x <= l.x) {
            return;
        }
        self.samples.push(s);
        if self.samples.len() > MAX_SAMPLES {
            self.samples = self
                .samples
                .chunks(2)
                .map(|c| HostSample {
                    x: c[0].x,
                    bytes: c.iter().map(|s| s.bytes).max().unwrap_or(0),
                })
                .collect();
        }
    }

    /// Highest sampled value (0 without samples).
    pub fn max_sample(&self) -> u64 {
        self.samples.iter().map(|s| s.bytes).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_only_move_forward_and_stay_bounded() {
        let mut h = HostHeap::default();
        h.push_sample(HostSample { x: 1.0, bytes: 10 });
        h.push_sample(HostSample { x: 1.0, bytes: 99 });
        h.push_sample(HostSample { x: 0.5, bytes: 99 });
        assert_eq!(h.samples.len(), 1);
        for i in 0..(2 * MAX_SAMPLES) {
            h.push_sample(HostSample {
                x: 2.0 + i as f64,
                bytes: i as u64,
            });
        }
        assert!(h.samples.len() <= MAX_SAMPLES);
        assert_eq!(h.max_sample(), 2 * MAX_SAMPLES as u64 - 1);
        assert!(h.samples.windows(2).all(|w| w[0].x < w[1].x));
    }

    #[test]
    fn negative_counters_read_as_zero() {
        let h = HostHeap {
            bytes: Stat {
                current: -5,
                peak: 7,
                allocated: 9,
                freed: 14,
            },
            ..HostHeap::default()
        };
        assert_eq!((h.current(), h.peak(), h.total()), (0, 7, 9));
    }
}
