//! How every benchmark is timed: warm-up and calibration, then batches of operations, with
//! allocview's side and the baseline's interleaved, and the median over batches.
//!
//! The method is criterion's "flat sampling" reduced to what a user's machine needs for a
//! side-by-side figure: a side is a closure that runs `n` operations and returns how long they
//! took (so a side may do untimed setup per batch, e.g. fill a channel before timing the drain).
//! Each side is first run with growing `n` until one batch takes about [`BATCHES_PER_SIDE`]th
//! of the time budget (this also warms caches, branch predictors and lazily built state); then
//! the two sides alternate batch by batch (`A B`, then `B A`, so a drift in the machine's speed
//! — another process starting, the CPU clocking down — hits both sides alike) until each has had
//! its budget and at least [`MIN_BATCHES`] batches. Budgets and batch sizes are wall-clock,
//! untimed setup included, so a side whose setup is slow still ends in time. The figure is the
//! median of the batches' timed nanoseconds per operation: robust to the odd batch that was
//! preempted.

use std::time::{Duration, Instant};

/// Batches each side aims for within its time budget.
pub const BATCHES_PER_SIDE: u32 = 20;

/// Fewest timed batches per side, however long an operation takes.
pub const MIN_BATCHES: usize = 5;

/// Most timed batches per side (bounds the run when batches are much shorter than planned).
pub const MAX_BATCHES: usize = 1000;

/// Largest operation count of one batch (bounds calibration of an operation that is free).
pub const MAX_OPS_PER_BATCH: u64 = 1 << 32;

/// Share of a side's budget spent warming up, on top of calibration.
pub const WARMUP_SHARE: f64 = 0.1;

/// What one side measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    /// Median over batches of nanoseconds per operation.
    pub median_ns: f64,
    /// Timed batches.
    pub batches: usize,
    /// Operations per timed batch.
    pub ops_per_batch: u64,
}

/// A side under measurement: runs `n` operations, returns the time they took.
pub trait Side {
    /// Runs `n` operations and returns the time they took.
    fn run(&mut self, n: u64) -> Duration;
}

impl<F: FnMut(u64) -> Duration> Side for F {
    fn run(&mut self, n: u64) -> Duration {
        self(n)
    }
}

/// A side whose every operation is `op`, timed as a whole batch.
pub fn each(mut op: impl FnMut()) -> impl FnMut(u64) -> Duration {
    move |n| {
        let start = Instant::now();
        for _ in 0..n {
            op();
        }
        start.elapsed()
    }
}

/// `side` run in chunks of at most `chunk` operations, with `between` (untimed) after each:
/// a side whose work must pause now and then, e.g. for an agent to drain its channel.
pub fn chunked<'a>(
    chunk: u64,
    mut side: impl FnMut(u64) -> Duration + 'a,
    mut between: impl FnMut() + 'a,
) -> impl FnMut(u64) -> Duration + 'a {
    move |n| {
        let mut left = n;
        let mut took = Duration::ZERO;
        while left > 0 {
            let part = left.min(chunk);
            took += run_part(&mut side, part);
            between();
            left -= part;
        }
        took
    }
}

/// One chunk of a [`chunked`] side, compiled on its own: the timed loop's code then does not
/// depend on what runs between chunks (inlined into its caller, the same loop measured up to
/// 1 ns an event slower in `agent.publish_batch`).
#[inline(never)]
fn run_part(side: &mut impl FnMut(u64) -> Duration, n: u64) -> Duration {
    side(n)
}

/// One side's calibration and samples.
struct Run<'a> {
    side: &'a mut dyn Side,
    ops: u64,
    /// Wall-clock time of the timed batches, setup included (what the budget bounds).
    spent: Duration,
    samples: Vec<f64>,
}

impl<'a> Run<'a> {
    /// Warms up and finds the batch size that takes about `batch` (at least one operation).
    fn calibrate(side: &'a mut dyn Side, batch: Duration, warmup: Duration) -> Run<'a> {
        let started = Instant::now();
        let mut ops = 1u64;
        loop {
            let wall = Instant::now();
            side.run(ops);
            let took = wall.elapsed();
            if took >= batch || ops >= MAX_OPS_PER_BATCH {
                break;
            }
            // Grow toward the target in one step when the batch already says how (at most
            // 16x, so a batch too short to time well does not overshoot).
            let factor = if took.is_zero() {
                16.0
            } else {
                (batch.as_secs_f64() / took.as_secs_f64()).clamp(2.0, 16.0)
            };
            ops = ((ops as f64 * factor).ceil() as u64).min(MAX_OPS_PER_BATCH);
        }
        while started.elapsed() < warmup {
            side.run(ops);
        }
        Run {
            side,
            ops,
            spent: Duration::ZERO,
            samples: Vec::new(),
        }
    }

    fn wants_more(&self, budget: Duration) -> bool {
        self.samples.len() < MIN_BATCHES
            || (self.spent < budget && self.samples.len() < MAX_BATCHES)
    }

    fn batch(&mut self) {
        let wall = Instant::now();
        let took = self.side.run(self.ops);
        self.spent += wall.elapsed();
        self.samples.push(took.as_nanos() as f64 / self.ops as f64);
    }

    fn timing(self) -> Timing {
        Timing {
            median_ns: median(self.samples.clone()),
            batches: self.samples.len(),
            ops_per_batch: self.ops,
        }
    }
}

/// Budgets derived from `seconds` per side.
fn budgets(seconds: f64) -> (Duration, Duration, Duration) {
    let budget = Duration::from_secs_f64(seconds);
    (
        budget,
        budget / BATCHES_PER_SIDE,
        budget.mul_f64(WARMUP_SHARE),
    )
}

/// Measures allocview's side and the baseline's, interleaved, each for about `seconds`.
pub fn compare(
    seconds: f64,
    allocview: &mut dyn Side,
    baseline: &mut dyn Side,
) -> (Timing, Timing) {
    let (budget, batch, warmup) = budgets(seconds);
    let mut a = Run::calibrate(allocview, batch, warmup);
    let mut b = Run::calibrate(baseline, batch, warmup);
    let mut round = 0u64;
    while a.wants_more(budget) || b.wants_more(budget) {
        let (first, second) = if round.is_multiple_of(2) {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        if first.wants_more(budget) {
            first.batch();
        }
        if second.wants_more(budget) {
            second.batch();
        }
        round += 1;
    }
    (a.timing(), b.timing())
}

/// Measures one side alone for about `seconds` (a benchmark whose baseline runs elsewhere).
pub fn single(seconds: f64, side: &mut dyn Side) -> Timing {
    let (budget, batch, warmup) = budgets(seconds);
    let mut a = Run::calibrate(side, batch, warmup);
    while a.wants_more(budget) {
        a.batch();
    }
    a.timing()
}

/// The median of `values` (the mean of the middle two for an even count; 0 for none).
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if !values.len().is_multiple_of(2) {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_odd_count_is_the_middle_value() {
        assert_eq!(median(vec![5.0, 1.0, 3.0]), 3.0);
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }

    #[test]
    fn both_sides_get_at_least_the_minimum_number_of_batches() {
        let mut calls_a = 0u64;
        let mut calls_b = 0u64;
        let mut a = |n: u64| {
            calls_a += n;
            Duration::from_micros(n)
        };
        let mut b = |n: u64| {
            calls_b += n;
            Duration::from_micros(2 * n)
        };
        let (ta, tb) = compare(0.001, &mut a, &mut b);
        assert!(ta.batches >= MIN_BATCHES && tb.batches >= MIN_BATCHES);
        // The reported durations are synthetic, so the medians are exact.
        assert_eq!(ta.median_ns, 1000.0);
        assert_eq!(tb.median_ns, 2000.0);
        assert!(calls_a > 0 && calls_b > 0);
    }

    #[test]
    fn untimed_setup_counts_against_the_budget() {
        // Each call sleeps (setup, untimed) at least 1 ms and reports 1 ns of timed work: with
        // a 10 ms budget the side cannot get more than 10 batches past the minimum.
        let mut slow = |_n: u64| {
            std::thread::sleep(Duration::from_millis(1));
            Duration::from_nanos(1)
        };
        let t = single(0.01, &mut slow);
        assert!(t.batches >= MIN_BATCHES);
        assert!(t.batches <= 11, "{} batches", t.batches);
    }
}
