//! Usage over time: reserved, allocated and active bytes sampled at increasing x (seconds for
//! live sources and timed traces, event numbers for traces without time), with OOMs marked.
//!
//! A sample stands for a stretch of time, not an instant: it holds from its x until the next
//! sample's x (the last one until [`Timeline::end`]). That is what both sources give: the
//! agent's round-robin tiers time each window at its first reading and keep the window's
//! maximum (1 s, 10 s and 1 min windows side by side in one series), and a trace's totals hold
//! from one event to the next. The chart asks for [`Timeline::columns`]: the x range cut into
//! equal columns, each the maximum of every sample overlapping it (the max-per-bucket
//! downsampling of RRDtool's `MAX` consolidation), so samples of every resolution are drawn the
//! same way, placed by time, and a peak shows whatever tier it came from.

/// One sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Position on the x axis (seconds, or event number; see [`Timeline::x_is_events`]).
    pub x: f64,
    /// Reserved bytes.
    pub reserved: u64,
    /// Allocated bytes.
    pub allocated: u64,
    /// Active bytes.
    pub active: u64,
}

impl Sample {
    /// The largest of the three figures.
    pub fn max_y(&self) -> u64 {
        self.reserved.max(self.allocated).max(self.active)
    }

    /// Each figure raised to `other`'s where that is larger (x unchanged).
    fn raise(&mut self, other: &Sample) {
        self.reserved = self.reserved.max(other.reserved);
        self.allocated = self.allocated.max(other.allocated);
        self.active = self.active.max(other.active);
    }
}

/// Most samples a timeline keeps; older ones are merged two by two (keeping maxima), so a long
/// trace keeps its shape in bounded memory. Above the agent's own bound, so a live timeline
/// (already bounded by the agent's tiers) reaches the chart as the agent keeps it.
pub const MAX_SAMPLES: usize = 16_384;

const _: () = assert!(MAX_SAMPLES >= allocview_agent::timeline::MAX_SAMPLES);

/// The usage chart's data.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Timeline {
    /// Samples in increasing x, each holding until the next one's x.
    pub samples: Vec<Sample>,
    /// x positions of OOMs.
    pub ooms: Vec<f64>,
    /// The x axis counts trace events rather than seconds.
    pub x_is_events: bool,
    /// In file mode: the x of the current event (drawn as a cursor).
    pub cursor: Option<f64>,
    /// When x counts seconds: the instant x = 0 stands for, in microseconds since the Unix
    /// epoch (live: the process start as the agent reports it; file: the first trace event).
    /// Trace times count from it too, so an event keeps its time and matches the chart.
    pub origin_us: Option<i64>,
    /// Where the last sample stops holding: the largest x pushed, or later where the source
    /// knows its present (live: the agent's clock), which the chart calls "now".
    pub end: f64,
}

impl Timeline {
    /// Appends a sample, merging samples pairwise when over [`MAX_SAMPLES`]: a merged sample
    /// keeps the first one's x (it holds from there) and the maxima of both.
    pub fn push(&mut self, s: Sample) {
        self.end = if self.samples.is_empty() {
            s.x
        } else {
            self.end.max(s.x)
        };
        self.samples.push(s);
        if self.samples.len() > MAX_SAMPLES {
            let merged: Vec<Sample> = self
                .samples
                .chunks(2)
                .map(|c| {
                    let mut m = c[0];
                    for s in &c[1..] {
                        m.raise(s);
                    }
                    m
                })
                .collect();
            self.samples = merged;
        }
    }

    /// The largest y value (for the chart's scale).
    pub fn max_y(&self) -> u64 {
        self.samples.iter().map(Sample::max_y).max().unwrap_or(0)
    }

    /// First x and [`end`](Timeline::end).
    pub fn x_range(&self) -> (f64, f64) {
        match self.samples.first() {
            Some(a) => {
                let last = self.samples[self.samples.len() - 1].x;
                (a.x, self.end.max(last).max(a.x))
            }
            None => (0.0, 0.0),
        }
    }

    /// The x range the chart shows for a span of `span` x units (`None`: all of it): with a
    /// cursor (file mode), the span around the cursor, so the cursor stays in view; else the
    /// span ending at [`end`](Timeline::end). Never wider than [`x_range`](Timeline::x_range)
    /// and never empty (a single instant gets one unit).
    pub fn window(&self, span: Option<f64>) -> (f64, f64) {
        let (x0, x1) = self.x_range();
        let (lo, hi) = match span.filter(|s| s.is_finite() && *s > 0.0 && *s < x1 - x0) {
            None => (x0, x1),
            Some(s) => match self.cursor {
                Some(c) => {
                    let lo = (c - s / 2.0).clamp(x0, x1 - s);
                    (lo, lo + s)
                }
                None => (x1 - s, x1),
            },
        };
        if hi > lo { (lo, hi) } else { (lo, lo + 1.0) }
    }

    /// `[lo, hi)` cut into `n` equal columns, each the maxima of the samples holding during
    /// any part of it (x: the column's start); `None` where no sample does. A sample holding
    /// for no time (two at one x) still counts in the column where it falls; the last sample
    /// holds until [`end`](Timeline::end) and counts in the column of `hi` when it falls there.
    pub fn columns(&self, lo: f64, hi: f64, n: usize) -> Vec<Option<Sample>> {
        let mut out: Vec<Option<Sample>> = vec![None; n];
        if n == 0 || hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
            return out;
        }
        let width = (hi - lo) / n as f64;
        let last_column = n - 1;
        // The column holding x (clamped to the range).
        let column = |x: f64| (((x - lo) / width).floor().max(0.0) as usize).min(last_column);
        let (_, end) = self.x_range();
        for (i, s) in self.samples.iter().enumerate() {
            let until = self.samples.get(i + 1).map_or(end, |next| next.x);
            let for_no_time = until <= s.x;
            // Outside the range, or touching it only at an edge.
            if until < lo || s.x > hi || (!for_no_time && (until == lo || s.x == hi)) {
                continue;
            }
            let first = column(s.x);
            // Its end is the next sample's start: the column before the one `until` opens.
            let last = if for_no_time {
                first
            } else {
                let opened = ((until.min(hi) - lo) / width).ceil() as usize;
                opened.saturating_sub(1).clamp(first, last_column)
            };
            for c in &mut out[first..=last] {
                match c {
                    Some(m) => m.raise(s),
                    None => *c = Some(*s),
                }
            }
        }
        for (i, c) in out.iter_mut().enumerate() {
            if let Some(c) = c {
                c.x = lo + width * i as f64;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(x: f64, v: u64) -> Sample {
        Sample {
            x,
            reserved: v,
            allocated: v,
            active: v,
        }
    }

    fn timeline(samples: &[Sample]) -> Timeline {
        let mut t = Timeline::default();
        for s in samples {
            t.push(*s);
        }
        t
    }

    fn maxima(cols: &[Option<Sample>]) -> Vec<Option<u64>> {
        cols.iter().map(|c| c.map(|s| s.reserved)).collect()
    }

    #[test]
    fn long_runs_are_merged_keeping_maxima_from_the_first_sample_of_each_pair() {
        let mut t = Timeline::default();
        for i in 0..(MAX_SAMPLES as u64 + 1) {
            t.push(Sample {
                x: i as f64,
                reserved: i,
                allocated: i / 2,
                active: i / 2,
            });
        }
        assert!(t.samples.len() <= MAX_SAMPLES);
        assert_eq!(t.max_y(), MAX_SAMPLES as u64);
        assert_eq!(t.x_range(), (0.0, MAX_SAMPLES as f64));
        // The pair (2, 3) holds from 2, with 3's figures.
        assert_eq!(t.samples[1].x, 2.0);
        assert_eq!(t.samples[1].reserved, 3);
    }

    #[test]
    fn a_column_holds_the_maximum_of_every_sample_holding_during_it() {
        // A wide sample (one coarse window) then fine ones.
        let t = timeline(&[at(0.0, 9), at(4.0, 1), at(5.0, 2), at(5.5, 7), at(6.0, 1)]);
        // end = 6: columns of 1 unit over [0, 6).
        assert_eq!(
            maxima(&t.columns(0.0, 6.0, 6)),
            vec![Some(9), Some(9), Some(9), Some(9), Some(1), Some(7)]
        );
        // Columns of 2 units: the wide sample reaches into [2, 4) but not [4, 6).
        assert_eq!(
            maxima(&t.columns(0.0, 6.0, 3)),
            vec![Some(9), Some(9), Some(7)]
        );
        // Finer columns than samples: the wide sample covers each column it spans.
        let cols = t.columns(0.0, 4.0, 8);
        assert!(cols.iter().all(|c| c.map(|s| s.reserved) == Some(9)));
        assert_eq!(cols[3].map(|s| s.x), Some(1.5));
    }

    #[test]
    fn columns_before_the_first_sample_are_empty_and_the_last_sample_holds_until_the_end() {
        let mut t = timeline(&[at(10.0, 3), at(12.0, 5)]);
        t.end = 20.0;
        assert_eq!(
            maxima(&t.columns(8.0, 20.0, 6)),
            vec![None, Some(3), Some(5), Some(5), Some(5), Some(5)]
        );
    }

    #[test]
    fn a_sample_holding_for_no_time_still_shows() {
        // Two events at one instant: the spike between them lasts no time but happened.
        let t = timeline(&[at(0.0, 1), at(5.0, 100), at(5.0, 2), at(10.0, 2)]);
        let cols = maxima(&t.columns(0.0, 10.0, 10));
        assert_eq!(cols[5], Some(100));
        assert_eq!(cols[4], Some(1));
        assert_eq!(cols[6], Some(2));
        // The last sample, alone at the range's end, lands in the last column.
        assert_eq!(cols[9], Some(2));
    }

    #[test]
    fn the_window_ends_at_the_end_or_keeps_the_cursor_in_view() {
        let mut t = timeline(&[at(0.0, 1), at(100.0, 1)]);
        t.end = 120.0;
        assert_eq!(t.window(None), (0.0, 120.0));
        assert_eq!(t.window(Some(60.0)), (60.0, 120.0));
        // Wider than the run: the whole run.
        assert_eq!(t.window(Some(600.0)), (0.0, 120.0));
        t.cursor = Some(50.0);
        assert_eq!(t.window(Some(20.0)), (40.0, 60.0));
        t.cursor = Some(5.0);
        assert_eq!(t.window(Some(20.0)), (0.0, 20.0));
        t.cursor = Some(119.0);
        assert_eq!(t.window(Some(20.0)), (100.0, 120.0));
        // A single instant still gets a range.
        let one = timeline(&[at(3.0, 1)]);
        assert_eq!(one.window(None), (3.0, 4.0));
    }
}
