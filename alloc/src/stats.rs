//! [`AllocatorStats`]: the counters an allocator may keep, as TensorFlow's `AllocatorStats`
//! (`tensorflow/core/framework/allocator.h`), with a readable [`Display`](fmt::Display) in human
//! units; and [`HumanBytes`] / [`human_bytes`], the one byte-size formatter every allocview view
//! uses (three significant digits in binary units, whole bytes below 1 KiB).

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

/// A byte count as every allocview view writes it: whole bytes below 1 KiB, else three
/// significant digits in binary units (`0 B`, `1023 B`, `1.00 KiB`, `12.1 GiB`, `640 MiB`).
///
/// This is the one size formatter of the workspace: the summary text, the OOM diagnosis, replay
/// reports, CLI messages and the dashboard all print sizes through it (or [`human_bytes`]), so a
/// figure reads the same everywhere. The rule:
///
/// - below 1024 bytes, the exact count and `B` (`1000 B`, `1023 B`);
/// - otherwise the largest unit of `KiB`, `MiB`, `GiB`, `TiB`, `PiB` the value reaches, with
///   two decimals below 10 of it, one below 100, none from 100 (`1.50 KiB`, `12.1 MiB`,
///   `640 GiB`);
/// - a value that would read 1000 or more of a unit (from 999.5) moves to the next unit, so no
///   figure shows four digits: 999.5 MiB is `0.98 GiB`, 1048575 bytes is `1.00 MiB`;
/// - PiB is the largest unit: from 999.5 PiB the figure is whole PiB (`u64::MAX` is
///   `16384 PiB`).
///
/// At most [`HUMAN_BYTES_WIDTH`] characters wide below 999.5 PiB (`0.98 MiB`, `12.1 GiB`,
/// `1023 B`), so a column that wide keeps sizes aligned. Width, fill and alignment flags apply (`{:>9}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HumanBytes(pub u64);

/// The widest [`HumanBytes`] text below 999.5 PiB (`0.98 MiB`, `12.1 GiB`).
pub const HUMAN_BYTES_WIDTH: usize = 8;

/// `n` bytes as [`HumanBytes`] writes them: `1.50 KiB`, `640 MiB`, `512 B`.
pub fn human_bytes(n: u64) -> String {
    HumanBytes(n).to_string()
}

/// The unit names [`HumanBytes`] writes, each 1024 times the one before; the last is the largest
/// shown.
pub const BYTE_UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/// Whether `word` is the name of a unit [`HumanBytes`] writes (`B`, `KiB`, ... `PiB`).
pub fn is_byte_unit(word: &str) -> bool {
    BYTE_UNITS.contains(&word)
}

/// Ratio between consecutive units.
const UNIT_STEP: f64 = 1024.0;

/// Significant digits shown from KiB up.
pub const SIGNIFICANT_DIGITS: usize = 3;

/// The smallest figure that would print as 1000 of a unit (with no decimals): from it a value
/// moves to the next unit.
const NEXT_UNIT_FROM: f64 = 999.5;

/// Below this a figure keeps two decimals (`9.99`); from it, `9.995` would round to `10.00`.
const TWO_DECIMALS_BELOW: f64 = 9.995;

/// Below this a figure keeps one decimal (`99.9`); from it, `99.95` would round to `100.0`.
const ONE_DECIMAL_BELOW: f64 = 99.95;

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        if bytes < UNIT_STEP as u64 {
            return f.pad(&format!("{bytes} {}", BYTE_UNITS[0]));
        }
        let last = BYTE_UNITS.len() - 1;
        let mut value = bytes as f64 / UNIT_STEP;
        let mut unit = 1;
        while unit < last && value >= NEXT_UNIT_FROM {
            value /= UNIT_STEP;
            unit += 1;
        }
        let decimals = if value < TWO_DECIMALS_BELOW {
            SIGNIFICANT_DIGITS - 1
        } else if value < ONE_DECIMAL_BELOW {
            SIGNIFICANT_DIGITS - 2
        } else {
            0
        };
        f.pad(&format!("{value:.decimals$} {}", BYTE_UNITS[unit]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    const PIB: u64 = 1 << 50;

    #[test]
    fn whole_bytes_are_exact_below_one_kib() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1000), "1000 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.00 KiB");
    }

    #[test]
    fn sizes_from_one_kib_show_three_significant_digits() {
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(10 * KIB), "10.0 KiB");
        assert_eq!(human_bytes(640 * MIB), "640 MiB");
        assert_eq!(human_bytes(12 * GIB + GIB / 10), "12.1 GiB");
        assert_eq!(human_bytes(7_840_000_000), "7.30 GiB");
        assert_eq!(human_bytes(80 * GIB), "80.0 GiB");
        assert_eq!(human_bytes(3 << 40), "3.00 TiB");
        assert_eq!(human_bytes(5 * PIB), "5.00 PiB");
    }

    #[test]
    fn a_value_that_would_read_1000_of_a_unit_shows_the_next_unit() {
        // 1048575 B is 1023.999 KiB.
        assert_eq!(human_bytes(MIB - 1), "1.00 MiB");
        assert_eq!(human_bytes(GIB - 1), "1.00 GiB");
        assert_eq!(human_bytes(1023 * MIB), "1.00 GiB");
        // 999.5 MiB would round to 1000 MiB; 999.49 MiB rounds to 999.
        let edge = 999 * MIB + MIB / 2;
        assert_eq!(human_bytes(edge), "0.98 GiB");
        assert_eq!(human_bytes(edge - 1), "999 MiB");
        assert_eq!(human_bytes(1000 * KIB), "0.98 MiB");
        // 9.995 and 99.95 of a unit would carry into a fourth digit.
        assert_eq!(human_bytes(9 * KIB + 1018), "9.99 KiB");
        assert_eq!(human_bytes(9 * KIB + 1019), "10.0 KiB");
        assert_eq!(human_bytes(99 * KIB + 972), "99.9 KiB");
        assert_eq!(human_bytes(99 * KIB + 973), "100 KiB");
    }

    #[test]
    fn pib_is_the_largest_unit() {
        assert_eq!(human_bytes(999 * PIB), "999 PiB");
        assert_eq!(human_bytes(1024 * PIB), "1024 PiB");
        assert_eq!(human_bytes(u64::MAX), "16384 PiB");
    }

    #[test]
    fn no_size_shows_four_digits_below_1000_pib() {
        for shift in [10u32, 20, 30, 40, 50] {
            for offset in 0..4096u64 {
                for n in [
                    (1u64 << shift).saturating_sub(offset),
                    (1000u64 << (shift - 10)).saturating_sub(offset),
                    (1u64 << shift) * 10 - offset,
                    (1u64 << shift) * 100 - offset,
                ] {
                    let text = human_bytes(n);
                    let number = text.split(' ').next().unwrap_or_default();
                    let digits = number.chars().filter(char::is_ascii_digit).count();
                    let limit = if n < KIB { 4 } else { SIGNIFICANT_DIGITS };
                    assert!(digits <= limit, "{n} shows as {text}");
                    assert!(text.len() <= HUMAN_BYTES_WIDTH, "{n} shows as {text}");
                }
            }
        }
    }

    #[test]
    fn width_flags_align_the_text() {
        assert_eq!(format!("{:>8}", HumanBytes(1536)), "1.50 KiB");
        assert_eq!(format!("{:>8}", HumanBytes(512)), "   512 B");
        assert_eq!(format!("{:<8}|", HumanBytes(640 * MIB)), "640 MiB |");
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
            "allocs: 3, in use: 2.00 KiB, peak: 4.00 KiB, largest: 100 B, limit: 1.00 MiB"
        );
        let unlimited = AllocatorStats {
            bytes_limit: None,
            ..stats
        };
        assert!(unlimited.to_string().ends_with("limit: none"));
    }
}
