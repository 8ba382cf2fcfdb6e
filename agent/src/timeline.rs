//! [`Timeline`]: usage over time in bounded memory, as round-robin tiers.
//!
//! The round-robin database idea (RRDtool): a fine tier keeps the recent past, coarser tiers keep
//! further back, each a fixed-size ring, so a process watched for days holds a bounded number of
//! samples. Every tier sees every reading; a reading falling into the tier's current window
//! raises that window's figures to their maximum (a peak is never averaged away), one falling
//! past it opens a new window and, when the ring is full, pushes the oldest out.
//!
//! With the default base resolution of one second: 1 s for 10 min, 10 s for 3 h, 1 min for
//! 7 days (11,760 samples, under 400 KiB per device).

use std::collections::VecDeque;

use crate::state::UsageSample;

/// Base (finest) resolution by default, in nanoseconds.
pub const DEFAULT_RESOLUTION_NS: u64 = 1_000_000_000;

/// `(resolution as a multiple of the base, samples kept)` per tier, finest first.
pub const TIERS: [(u64, usize); 3] = [(1, 600), (10, 1_080), (60, 10_080)];

/// Samples a full timeline holds at most.
pub const MAX_SAMPLES: usize = TIERS[0].1 + TIERS[1].1 + TIERS[2].1;

#[derive(Debug, Clone)]
struct Tier {
    resolution_ns: u64,
    capacity: usize,
    ring: VecDeque<UsageSample>,
}

impl Tier {
    fn record(&mut self, s: UsageSample) {
        let window = s.time_ns - s.time_ns % self.resolution_ns;
        match self.ring.back_mut() {
            Some(last) if last.time_ns == window => {
                last.allocated = last.allocated.max(s.allocated);
                last.reserved = last.reserved.max(s.reserved);
                last.active = last.active.max(s.active);
            }
            Some(last) if last.time_ns > window => {}
            _ => {
                if self.ring.len() == self.capacity {
                    self.ring.pop_front();
                }
                self.ring.push_back(UsageSample {
                    time_ns: window,
                    ..s
                });
            }
        }
    }
}

/// Usage over time for one device.
#[derive(Debug, Clone)]
pub struct Timeline {
    tiers: Vec<Tier>,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline::new(DEFAULT_RESOLUTION_NS)
    }
}

impl Timeline {
    /// A timeline whose finest tier has `base_resolution_ns` (at least 1).
    pub fn new(base_resolution_ns: u64) -> Timeline {
        let base = base_resolution_ns.max(1);
        Timeline {
            tiers: TIERS
                .iter()
                .map(|&(mult, capacity)| Tier {
                    resolution_ns: base.saturating_mul(mult),
                    capacity,
                    ring: VecDeque::with_capacity(capacity.min(64)),
                })
                .collect(),
        }
    }

    /// Records a reading.
    pub fn record(&mut self, sample: UsageSample) {
        for t in &mut self.tiers {
            t.record(sample);
        }
    }

    /// Every sample, oldest first: the coarse tiers where the finer ones no longer reach.
    pub fn samples(&self) -> Vec<UsageSample> {
        let mut out = Vec::new();
        let mut horizon = u64::MAX;
        let mut parts = Vec::new();
        for t in &self.tiers {
            let part: Vec<UsageSample> = t
                .ring
                .iter()
                .filter(|s| s.time_ns < horizon)
                .copied()
                .collect();
            if let Some(first) = t.ring.front() {
                horizon = horizon.min(first.time_ns);
            }
            parts.push(part);
        }
        for p in parts.into_iter().rev() {
            out.extend(p);
        }
        out
    }

    /// The finest tier's samples from `time_ns` on (the window being filled included).
    pub fn since(&self, time_ns: u64) -> Vec<UsageSample> {
        self.tiers[0]
            .ring
            .iter()
            .filter(|s| s.time_ns >= time_ns)
            .copied()
            .collect()
    }

    /// Start of the finest tier's newest window (0 when empty).
    pub fn last_time(&self) -> u64 {
        self.tiers[0].ring.back().map_or(0, |s| s.time_ns)
    }
}

/// Adds `new` samples to a client's copy of a timeline: a sample for a window it has replaces
/// it, a newer one is appended, older ones are ignored; the copy keeps at most
/// [`MAX_SAMPLES`].
pub fn merge_samples(samples: &mut Vec<UsageSample>, new: &[UsageSample]) {
    for s in new {
        match samples.last_mut() {
            Some(last) if last.time_ns == s.time_ns => *last = *s,
            Some(last) if last.time_ns > s.time_ns => {}
            _ => samples.push(*s),
        }
    }
    if samples.len() > MAX_SAMPLES {
        let excess = samples.len() - MAX_SAMPLES;
        samples.drain(..excess);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: u64, v: u64) -> UsageSample {
        UsageSample {
            time_ns: t,
            allocated: v,
            reserved: v * 2,
            active: v,
        }
    }

    #[test]
    fn readings_in_one_window_keep_their_maximum() {
        let mut tl = Timeline::new(10);
        tl.record(at(3, 5));
        tl.record(at(7, 9));
        tl.record(at(8, 2));
        assert_eq!(tl.samples(), vec![at(0, 9)]);
    }

    #[test]
    fn memory_stays_bounded_and_old_data_survives_at_coarser_resolution() {
        let mut tl = Timeline::new(1);
        let n = 200_000u64;
        for t in 0..n {
            tl.record(at(t, t));
        }
        let s = tl.samples();
        assert!(s.len() <= MAX_SAMPLES);
        assert!(s.windows(2).all(|w| w[0].time_ns < w[1].time_ns), "ordered");
        assert_eq!(s.last().unwrap().time_ns, n - 1);
        // The coarsest tier (10,080 windows of 60 base units) still reaches the first reading,
        // and its first sample holds the maximum of that window.
        assert_eq!(s[0].time_ns, 0);
        assert_eq!(s[0].allocated, 59);
        // The finest tier keeps the last 600 readings one by one.
        assert_eq!(s[s.len() - 600].time_ns, n - 600);
    }

    #[test]
    fn merging_replaces_the_open_window_and_appends_new_ones() {
        let mut copy = vec![at(0, 1), at(10, 2)];
        merge_samples(&mut copy, &[at(0, 7), at(10, 3), at(20, 4)]);
        assert_eq!(copy, vec![at(0, 1), at(10, 3), at(20, 4)]);
    }
}
