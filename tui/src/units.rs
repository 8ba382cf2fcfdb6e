//! Human units: byte sizes ([`bytes`], the workspace's one size formatter:
//! `9.80 GiB`, `640 MiB`, `512 B`), counts with thousands separators (`1,204,331`), durations (`1.25 ms`), and the size parser
//! behind `--device-memory` (`16GiB`, `512MiB`, `8000000000`).

use std::fmt::Write as _;

/// One kibibyte.
pub const KIB: u64 = 1 << 10;
/// One mebibyte.
pub const MIB: u64 = 1 << 20;
/// One gibibyte.
pub const GIB: u64 = 1 << 30;
/// One tebibyte.
pub const TIB: u64 = 1 << 40;
/// One pebibyte (the largest unit sizes are written in).
pub const PIB: u64 = 1 << 50;

pub use allocview_alloc::stats::is_byte_unit;

/// Significant digits shown for durations (sizes show as many, see [`bytes`]).
const SIGNIFICANT_DIGITS: usize = 3;

/// Formats `value` (below 1,000) with three significant digits: `0.98`, `1.50`, `12.1`, `640`.
fn three_digits(value: f64) -> String {
    let mut decimals = if value >= 100.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        SIGNIFICANT_DIGITS - 1
    };
    loop {
        let s = format!("{value:.decimals$}");
        let digits = s.chars().filter(char::is_ascii_digit).count();
        // Rounding can carry into a fourth digit (9.996 -> "10.00"): drop a decimal.
        if digits <= SIGNIFICANT_DIGITS || decimals == 0 {
            return s;
        }
        decimals -= 1;
    }
}

/// A byte count as every allocview view writes it: whole bytes below 1 KiB, else three
/// significant digits in binary units (`512 B`, `1.50 KiB`, `640 MiB`, `12.1 GiB`), the next
/// unit from 999.5 of one (`0.98 GiB`). The dashboard's name for
/// [`allocview_alloc::stats::human_bytes`], which the summary text and the OOM diagnosis use too.
pub use allocview_alloc::stats::human_bytes as bytes;

/// A signed byte count (`-1.50 GiB`).
pub fn signed_bytes(n: i64) -> String {
    if n < 0 {
        format!("-{}", bytes(n.unsigned_abs()))
    } else {
        bytes(n as u64)
    }
}

/// A count with thousands separators: `1,204,331`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A signed count with thousands separators.
pub fn signed_count(n: i64) -> String {
    if n < 0 {
        format!("-{}", count(n.unsigned_abs()))
    } else {
        count(n as u64)
    }
}

/// A duration in nanoseconds with three significant digits: `850 ns`, `1.25 µs`, `3.40 ms`,
/// `12.0 s`.
pub fn nanos(ns: u64) -> String {
    const UNITS: [(&str, f64); 3] = [("s", 1e9), ("ms", 1e6), ("µs", 1e3)];
    for (name, unit) in UNITS {
        if ns as f64 >= unit {
            return format!("{} {name}", three_digits(ns as f64 / unit));
        }
    }
    format!("{ns} ns")
}

/// Seconds elapsed since the start of a chart's axis, with three significant digits in a unit
/// that fits: `0 s`, `272 ms`, `12.0 s`, `5.00 min`, `26.0 h`.
pub fn elapsed(secs: f64) -> String {
    const SECONDS_BEFORE_MINUTES: f64 = 100.0;
    const MINUTES_BEFORE_HOURS: f64 = 100.0;
    if secs.is_nan() || secs <= 0.0 {
        return "0 s".into();
    }
    if secs < SECONDS_BEFORE_MINUTES {
        return nanos((secs * 1e9) as u64);
    }
    let minutes = secs / 60.0;
    if minutes < MINUTES_BEFORE_HOURS {
        return format!("{} min", three_digits(minutes));
    }
    format!("{} h", three_digits(minutes / 60.0))
}

/// Seconds in a minute (axis labels, chart spans).
pub const MINUTE: u64 = 60;
/// Seconds in an hour.
const HOUR: u64 = 60 * MINUTE;
/// Seconds in a day.
const DAY: u64 = 24 * HOUR;
/// Below this many seconds an axis label keeps a tenth of a second.
const TENTHS_BELOW_S: f64 = 10.0;
/// Milliseconds in a second (axis labels under a second count them).
const MS_PER_S: f64 = 1000.0;

/// A duration as an axis label: `150ms`, `2.5s`, `45s`, `5m 12s`, `2h 05m`, `3d 4h` (the two
/// largest units).
pub fn axis_time(secs: f64) -> String {
    if !secs.is_finite() || secs <= 0.0 {
        return "0s".to_string();
    }
    // Below a second in whole milliseconds (999.6 ms and up reads as a second).
    let ms = (secs * MS_PER_S).round();
    if ms < MS_PER_S {
        return format!("{ms}ms");
    }
    if secs < TENTHS_BELOW_S {
        let tenths = format!("{secs:.1}");
        return format!("{}s", tenths.strip_suffix(".0").unwrap_or(&tenths));
    }
    let s = secs.round() as u64;
    match s {
        s if s < MINUTE => format!("{s}s"),
        s if s < HOUR => match s % MINUTE {
            0 => format!("{}m", s / MINUTE),
            r => format!("{}m {r:02}s", s / MINUTE),
        },
        s if s < DAY => match s % HOUR / MINUTE {
            0 => format!("{}h", s / HOUR),
            m => format!("{}h {m:02}m", s / HOUR),
        },
        s => match s % DAY / HOUR {
            0 => format!("{}d", s / DAY),
            h => format!("{}d {h}h", s / DAY),
        },
    }
}

/// A percentage with no decimals, as `24%`.
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0%".to_string();
    }
    format!("{:.0}%", part as f64 * 100.0 / whole as f64)
}

/// A device address as `0x7f3a2c400000`.
pub fn address(addr: u64) -> String {
    let mut s = String::with_capacity(16);
    let _ = write!(s, "{addr:#x}");
    s
}

pub use allocview_agent::size::{SizeError, parse_size};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_is_the_shared_size_formatter() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1000), "1000 B");
        assert_eq!(bytes(1024), "1.00 KiB");
        assert_eq!(bytes(640 * MIB), "640 MiB");
        assert_eq!(bytes(1023 * MIB), "1.00 GiB");
        assert_eq!(signed_bytes(-((3 * GIB / 2) as i64)), "-1.50 GiB");
        assert_eq!(bytes(2 * TIB), allocview_alloc::stats::human_bytes(2 * TIB));
    }

    #[test]
    fn every_unit_bytes_writes_is_a_byte_unit() {
        for n in [1, KIB, MIB, GIB, TIB, TIB << 10] {
            let text = bytes(n);
            let unit = text.rsplit(' ').next().unwrap_or_default();
            assert!(is_byte_unit(unit), "{text}");
        }
        assert!(!is_byte_unit("ns"));
    }

    #[test]
    fn counts_have_thousands_separators() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1_204_331), "1,204,331");
        assert_eq!(signed_count(-12_034), "-12,034");
    }

    #[test]
    fn durations_pick_a_unit() {
        assert_eq!(nanos(850), "850 ns");
        assert_eq!(nanos(1250), "1.25 µs");
        assert_eq!(nanos(3_400_000), "3.40 ms");
        assert_eq!(nanos(12_000_000_000), "12.0 s");
    }

    #[test]
    fn elapsed_times_pick_a_unit_from_milliseconds_to_hours() {
        assert_eq!(elapsed(0.0), "0 s");
        assert_eq!(elapsed(-1.0), "0 s");
        assert_eq!(elapsed(f64::NAN), "0 s");
        assert_eq!(elapsed(0.272), "272 ms");
        assert_eq!(elapsed(12.0), "12.0 s");
        assert_eq!(elapsed(300.0), "5.00 min");
        assert_eq!(elapsed(26.0 * 3600.0), "26.0 h");
    }

    #[test]
    fn every_size_bytes_writes_parses_back_to_within_its_rounding() {
        for n in [
            0,
            1023,
            1536,
            10 * MIB + 1,
            3 * GIB / 2,
            5 * TIB,
            7 * PIB,
            u64::MAX / 2,
        ] {
            let shown = bytes(n);
            let back = parse_size(&shown).unwrap_or_else(|e| panic!("{shown}: {e}"));
            let err = back.abs_diff(n) as f64 / n.max(1) as f64;
            assert!(err < 0.005, "{n} -> {shown} -> {back}");
        }
    }

    #[test]
    fn axis_times_read_as_durations_in_their_two_largest_units() {
        let cases = [
            (0.0, "0s"),
            (0.15, "150ms"),
            (0.9996, "1s"),
            (2.5, "2.5s"),
            (7.0, "7s"),
            (59.5, "1m"),
            (45.2, "45s"),
            (312.0, "5m 12s"),
            (3600.0, "1h"),
            (7500.0, "2h 05m"),
            (3.0 * 86_400.0 + 4.0 * 3600.0, "3d 4h"),
            (f64::NAN, "0s"),
        ];
        for (secs, want) in cases {
            assert_eq!(axis_time(secs), want, "{secs}");
        }
    }
}
