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
    /// One sample per window, timed at the window's first reading (so never earlier than the
    /// data it summarizes); the window's start is derived from that time.
    ring: VecDeque<UsageSample>,
}

impl Tier {
    /// Start of the window holding `time_ns`.
    fn window(&self, time_ns: u64) -> u64 {
        time_ns - time_ns % self.resolution_ns
    }

    /// End (exclusive) of the window holding `time_ns`.
    fn window_end(&self, time_ns: u64) -> u64 {
        self.window(time_ns).saturating_add(self.resolution_ns)
    }

    fn record(&mut self, s: UsageSample) {
        let window = self.window(s.time_ns);
        match self.ring.back_mut() {
            Some(last) if last.time_ns >= window && last.time_ns <= s.time_ns => {
                last.allocated = last.allocated.max(s.allocated);
                last.reserved = last.reserved.max(s.reserved);
                last.active = last.active.max(s.active);
            }
            Some(last) if last.time_ns > s.time_ns => {}
            _ => {
                if self.ring.len() == self.capacity {
                    self.ring.pop_front();
                }
                self.ring.push_back(s);
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

    /// Every sample, oldest first, each instant covered once: the finest tier, preceded by each
    /// coarser tier's windows holding readings the finer tiers no longer keep. Where such a
    /// window reaches into the finer tiers' span, it stands for that stretch and the finer
    /// samples inside it are left out, so the series is strictly increasing in time, starts at
    /// the first reading still held, and no sample carries a maximum over readings taken after
    /// the next sample's time.
    pub fn samples(&self) -> Vec<UsageSample> {
        let mut out: VecDeque<UsageSample> = self.tiers[0].ring.iter().copied().collect();
        for t in &self.tiers[1..] {
            let Some(first) = out.front().map(|s| s.time_ns) else {
                break;
            };
            let older = t.ring.iter().take_while(|s| s.time_ns < first).count();
            let Some(last) = older.checked_sub(1).map(|i| t.ring[i]) else {
                continue;
            };
            let end = t.window_end(last.time_ns);
            while out.front().is_some_and(|s| s.time_ns < end) {
                out.pop_front();
            }
            for s in t.ring.iter().take(older).rev() {
                out.push_front(*s);
            }
        }
        out.into()
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

    /// Time of the finest tier's newest sample (0 when empty).
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
        // Timed at the window's first reading.
        assert_eq!(tl.samples(), vec![at(3, 9)]);
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
    fn no_sample_is_timed_before_the_first_reading() {
        // Windows are aligned on multiples of their resolution, so the coarse tiers' windows
        // open before a first reading that falls mid-window; none of them may show up.
        let mut tl = Timeline::new(10);
        for t in (1_234..1_300).step_by(10) {
            tl.record(at(t, t));
        }
        let s = tl.samples();
        assert_eq!(s[0], at(1_234, 1_234));
        assert_eq!(
            s.iter().map(|s| s.time_ns).collect::<Vec<_>>(),
            (1_234..1_300).step_by(10).collect::<Vec<_>>(),
            "the fine tier alone while it still holds every reading"
        );
    }

    #[test]
    fn coarse_and_fine_samples_cover_each_instant_once() {
        let mut tl = Timeline::new(1);
        for t in 5..=705 {
            tl.record(at(t, t));
        }
        // The fine tier keeps 106..=705; the 10-unit tier stands for what it lost, its window
        // [100, 110) (first reading 100, maximum 109) replacing the fine samples 106..=109.
        let mut want = vec![at(5, 9)];
        want.extend((10..=100).step_by(10).map(|t| at(t, t + 9)));
        want.extend((110..=705).map(|t| at(t, t)));
        assert_eq!(tl.samples(), want);
    }

    #[test]
    fn merging_replaces_the_open_window_and_appends_new_ones() {
        let mut copy = vec![at(0, 1), at(10, 2)];
        merge_samples(&mut copy, &[at(0, 7), at(10, 3), at(20, 4)]);
        assert_eq!(copy, vec![at(0, 1), at(10, 3), at(20, 4)]);
    }
}
