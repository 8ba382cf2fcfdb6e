//! [`AllocatorStats`]: the counters an allocator may keep, as TensorFlow's `AllocatorStats`
//! (`tensorflow/core/framework/allocator.h`), with a readable [`Display`](fmt::Display) in human
//! units ([`HumanBytes`]).

use std::fmt;

/// Counters an allocator keeps about itself (TensorFlow's `AllocatorStats`).
///
/// Byte figures count the bytes callers asked for (an allocator's own headers and padding are
/// not included), so two allocators serving the same requests report the same numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AllocatorStats {
    /// Number of successful allocations since the stats were last cleared.
    pub num_allocs: u64,
    /// Bytes handed out and not yet freed.
    pub bytes_in_use: u64,
    /// Highest `bytes_in_use` since the stats were last cleared.
    pub peak_bytes_in_use: u64,
    /// Largest single allocation since the stats were last cleared.
    pub largest_alloc_size: u64,
    /// The most bytes this allocator will hand out at once, where it has such a limit.
    pub bytes_limit: Option<u64>,
}

impl fmt::Display for AllocatorStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "allocs: {}, in use: {}, peak: {}, largest: {}, limit: ",
            self.num_allocs,
            HumanBytes(self.bytes_in_use),
            HumanBytes(self.peak_bytes_in_use),
            HumanBytes(self.largest_alloc_size),
        )?;
        match self.bytes_limit {
            Some(limit) => write!(f, "{}", HumanBytes(limit)),
            None => f.write_str("none"),
        }
    }
}

/// A byte count shown in binary units: `512 B`, `1.5 KiB`, `64.0 MiB`, `2.00 GiB`.
///
/// Values under 1 KiB print exactly; larger ones with one decimal (two from GiB up), in the
/// largest unit the value reaches, like TensorFlow's `strings::HumanReadableNumBytes`. Unlike
/// it, a value that would round to 1024 of a unit moves to the next one (`1048575` bytes is
/// `1.0 MiB`, never `1024.0 KiB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HumanBytes(pub u64);

/// Binary unit names, each 1024 times the one before.
const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// Ratio between consecutive units.
const UNIT_STEP: f64 = 1024.0;

/// Index in [`UNITS`] of the first unit shown with [`WIDE_DECIMALS`] (GiB).
const FIRST_WIDE_UNIT: usize = 3;

/// Decimals shown for KiB and MiB.
const NARROW_DECIMALS: usize = 1;

/// Decimals shown from [`FIRST_WIDE_UNIT`] up.
const WIDE_DECIMALS: usize = 2;

/// Decimals shown for the unit at `unit` in [`UNITS`].
fn decimals(unit: usize) -> usize {
    if unit >= FIRST_WIDE_UNIT {
        WIDE_DECIMALS
    } else {
        NARROW_DECIMALS
    }
}

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&binary_size(self.0, UNITS.len(), decimals))
    }
}

/// `bytes` in the largest of the first `units` (at least 1) of `B`, `KiB`, ... `EiB` that it
/// reaches, with `decimals(unit)` decimals (`unit` indexing that list), and exact below 1 KiB:
/// `512 B`, `1.5 KiB`. A value that would round to 1024 of a unit is given in the next
/// (1048575 bytes is `1.0 MiB` with one decimal, never `1024.0 KiB`).
pub fn binary_size(bytes: u64, units: usize, decimals: impl Fn(usize) -> usize) -> String {
    let units = units.clamp(1, UNITS.len());
    let mut value = bytes as f64;
    let mut unit = 0;
    while unit + 1 < units
        && (value >= UNIT_STEP
            || (unit > 0 && value >= UNIT_STEP - 0.5 / 10f64.powi(decimals(unit) as i32)))
    {
        value /= UNIT_STEP;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.*} {}", decimals(unit), UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_picks_the_largest_unit_below_the_value() {
        assert_eq!(HumanBytes(0).to_string(), "0 B");
        assert_eq!(HumanBytes(1023).to_string(), "1023 B");
        assert_eq!(HumanBytes(1024).to_string(), "1.0 KiB");
        assert_eq!(HumanBytes(1536).to_string(), "1.5 KiB");
        assert_eq!(HumanBytes(64 << 20).to_string(), "64.0 MiB");
        assert_eq!(HumanBytes(3 << 30).to_string(), "3.00 GiB");
        assert_eq!(HumanBytes(u64::MAX).to_string(), "16.00 EiB");
    }

    #[test]
    fn a_value_that_rounds_to_1024_of_a_unit_shows_the_next_unit() {
        assert_eq!(HumanBytes((1 << 20) - 1).to_string(), "1.0 MiB");
        assert_eq!(HumanBytes((1 << 30) - 1).to_string(), "1.00 GiB");
        assert_eq!(HumanBytes((1 << 40) - 1).to_string(), "1.00 TiB");
        assert_eq!(HumanBytes((1 << 60) - 1).to_string(), "1.00 EiB");
        // 1023.9502 KiB rounds to 1024.0: the next unit. 1023.9492 KiB stays.
        assert_eq!(HumanBytes(1_048_525).to_string(), "1.0 MiB");
        assert_eq!(HumanBytes(1_048_524).to_string(), "1023.9 KiB");
        // 1023.996 GiB rounds to 1024.00 at two decimals.
        let just_under_tib = (1u64 << 40) - (1 << 30) / 250;
        assert_eq!(HumanBytes(just_under_tib).to_string(), "1.00 TiB");
        assert_eq!(
            HumanBytes((1 << 40) - (1 << 30) / 50).to_string(),
            "1023.98 GiB"
        );
    }

    #[test]
    fn no_value_shows_1024_of_a_unit() {
        for shift in [10u32, 20, 30, 40, 50, 60] {
            for below in 0..2048u64 {
                let n = (1u64 << shift).saturating_sub(below);
                let text = HumanBytes(n).to_string();
                assert!(!text.starts_with("1024"), "{n} shows as {text}");
            }
        }
    }

    #[test]
    fn stats_display_reads_as_a_sentence_of_figures() {
        let stats = AllocatorStats {
            num_allocs: 3,
            bytes_in_use: 2048,
            peak_bytes_in_use: 4096,
            largest_alloc_size: 100,
            bytes_limit: Some(1 << 20),
        };
        assert_eq!(
            stats.to_string(),
            "allocs: 3, in use: 2.0 KiB, peak: 4.0 KiB, largest: 100 B, limit: 1.0 MiB"
        );
        let unlimited = AllocatorStats {
            bytes_limit: None,
            ..stats
        };
        assert!(unlimited.to_string().ends_with("limit: none"));
    }
}
