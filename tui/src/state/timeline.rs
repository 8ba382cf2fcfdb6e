//! Usage over time: reserved, allocated and active bytes sampled at increasing x (seconds for
//! live sources and timed traces, event numbers for traces without time), with OOMs marked.

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

/// Most samples a timeline keeps; older ones are merged two by two (keeping maxima), so a long
/// run keeps its shape in bounded memory.
pub const MAX_SAMPLES: usize = 4096;

/// The usage chart's data.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Timeline {
    /// Samples in increasing x.
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
}

impl Timeline {
    /// Appends a sample, merging old samples pairwise when over [`MAX_SAMPLES`].
    pub fn push(&mut self, s: Sample) {
        self.samples.push(s);
        if self.samples.len() > MAX_SAMPLES {
            let merged: Vec<Sample> = self
                .samples
                .chunks(2)
                .map(|c| Sample {
                    x: c[c.len() - 1].x,
                    reserved: c.iter().map(|s| s.reserved).max().unwrap_or(0),
                    allocated: c.iter().map(|s| s.allocated).max().unwrap_or(0),
                    active: c.iter().map(|s| s.active).max().unwrap_or(0),
                })
                .collect();
            self.samples = merged;
        }
    }

    /// The largest y value (for the chart's scale).
    pub fn max_y(&self) -> u64 {
        self.samples
            .iter()
            .map(|s| s.reserved.max(s.allocated).max(s.active))
            .max()
            .unwrap_or(0)
    }

    /// First and last x.
    pub fn x_range(&self) -> (f64, f64) {
        match (self.samples.first(), self.samples.last()) {
            (Some(a), Some(b)) => (a.x, b.x.max(a.x)),
            _ => (0.0, 0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_runs_are_merged_keeping_maxima() {
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
        assert_eq!(t.x_range(), (1.0, MAX_SAMPLES as f64));
    }
}
