//! `format_memory_summary`: the text table of `torch.cuda.memory_summary()`, from a
//! [`DeviceStats`].
//!
//! The layout is PyTorch's (`torch/cuda/memory.py`, `memory_summary`): 75 columns between `|`
//! borders; a header naming the device; "CUDA OOMs | cudaMalloc retries"; the columns Metric,
//! Cur Usage, Peak Usage, Tot Alloc, Tot Freed; one group of rows per stat array (all, then
//! "from large pool" and "from small pool"), then the oversize stats. Sizes print as a 6-digit
//! integer and a unit (B, KiB, ... PiB), the unit chosen from the group's "all" row and stepping
//! up once that figure reaches 768 of the next unit; counts print as `%7d` with K/M suffixes
//! stepping at 750,000.

use std::fmt::Write as _;

use crate::caching::stats::{DeviceStats, Stat, StatArray, StatType};

/// Width of the table between its `|` borders.
pub const SUMMARY_WIDTH: usize = 75;
/// One size unit is this many of the one below (B, KiB, MiB, ...).
const SIZE_BASE: i64 = 1024;
/// A size steps up to the next unit once the reference figure reaches this many of it
/// (768 KiB shows as KiB, 767 KiB as B).
const SIZE_STEP: i64 = 768 * SIZE_BASE;
/// One count unit is this many of the one below (none, K, M).
const COUNT_BASE: i64 = 1000;
/// A count steps up to K (then M) once the reference figure reaches this.
const COUNT_STEP: i64 = 750 * COUNT_BASE;
const SIZE_UNITS: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
const COUNT_UNITS: [&str; 3] = [" ", "K", "M"];

#[derive(Clone, Copy)]
enum Kind {
    Size,
    Count,
}

/// The loop `_format_size` and `_format_count` share: while the reference figure `pref`
/// (in the current unit) reaches `step`, move to the next of `units`, dividing `v` (flooring)
/// and `pref` by `base`.
fn scale(
    mut v: i64,
    pref: i64,
    units: &[&'static str],
    step: i64,
    base: i64,
) -> (i64, &'static str) {
    let mut pref = pref as f64;
    let mut unit = units[0];
    for next in &units[1..] {
        if pref < step as f64 {
            break;
        }
        unit = next;
        v = v.div_euclid(base);
        pref /= base as f64;
    }
    (v, unit)
}

/// PyTorch's `_format_size(sz, pref_sz)`: the unit is chosen from `pref` (the "all" row).
fn format_size(sz: i64, pref: i64) -> String {
    let (sz, unit) = scale(sz, pref, &SIZE_UNITS, SIZE_STEP, SIZE_BASE);
    format!("{sz:6} {unit}")
}

/// PyTorch's `_format_count(cnt, pref_cnt)`.
fn format_count(cnt: i64, pref: i64) -> String {
    let (cnt, unit) = scale(cnt, pref, &COUNT_UNITS, COUNT_STEP, COUNT_BASE);
    format!("{cnt:7} {unit} ")
}

fn format_value(kind: Kind, v: i64, pref: i64) -> String {
    match kind {
        Kind::Size => format_size(v, pref),
        Kind::Count => format_count(v, pref),
    }
}

/// What the Peak Usage, Tot Alloc and Tot Freed columns show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryColumns {
    /// The stats' `peak`, `allocated` and `freed` figures.
    Known,
    /// As [`Known`](Self::Known), except for the Requested memory rows and the cudaMalloc
    /// retries, which show [`NOT_KNOWN`]: figures from a replayed trace, which records rounded
    /// block sizes, not requested ones, and cannot tell a retry after emptying the cache from
    /// other releases of cached segments.
    KnownExceptRequested,
    /// [`NOT_KNOWN`] in each cell: the stats hold current figures only (a snapshot without a
    /// trace), so no peak or total can be stated.
    NotKnown,
}

/// The cell text of a figure that cannot be known.
pub const NOT_KNOWN: &str = "not known";

/// Width of a figure's cell (`format_size` and `format_count` both give this many characters).
const CELL_WIDTH: usize = 10;

fn row(
    out: &mut Vec<String>,
    name: &str,
    kind: Kind,
    (s, pref): (&Stat, &Stat),
    history: HistoryColumns,
) {
    let cur = format_value(kind, s.current, pref.current);
    let [peak, alloc, freed] = match history {
        HistoryColumns::Known | HistoryColumns::KnownExceptRequested => [
            format_value(kind, s.peak, pref.peak),
            format_value(kind, s.allocated, pref.allocated),
            format_value(kind, s.freed, pref.freed),
        ],
        HistoryColumns::NotKnown => [0; 3].map(|_| format!("{NOT_KNOWN:>w$}", w = CELL_WIDTH)),
    };
    out.push(format!(" {name:<21} | {cur} | {peak} | {alloc} | {freed} "));
}

/// The header's OOM and retry counts, which are totals since the start like the history
/// columns: [`NOT_KNOWN`] where those are, and the retries of a replayed trace (see
/// [`HistoryColumns::KnownExceptRequested`]). The line keeps PyTorch's width.
fn counters_line(stats: &DeviceStats, history: HistoryColumns) -> String {
    let (ooms, retries) = match history {
        HistoryColumns::Known => (
            stats.num_ooms.to_string(),
            stats.num_alloc_retries.to_string(),
        ),
        HistoryColumns::KnownExceptRequested => (stats.num_ooms.to_string(), NOT_KNOWN.to_string()),
        HistoryColumns::NotKnown => (NOT_KNOWN.to_string(), NOT_KNOWN.to_string()),
    };
    // PyTorch's spacing, one column of it given to a count of 9 characters.
    let gap = if retries.len() > 8 { 5 } else { 6 };
    format!(
        "  {:9} CUDA OOMs: {ooms:<12} | {:gap$} cudaMalloc retries: {retries:<w$}  ",
        "",
        "",
        w = 14 - gap
    )
}

/// The `torch.cuda.memory_summary(device)` table for these stats (not abbreviated), each line
/// ending in a newline.
pub fn format_memory_summary(stats: &DeviceStats, device: i32) -> String {
    format_memory_summary_with(stats, device, HistoryColumns::Known)
}

/// [`format_memory_summary`], with the history columns (Peak Usage, Tot Alloc, Tot Freed)
/// shown as `history` says.
pub fn format_memory_summary_with(
    stats: &DeviceStats,
    device: i32,
    history: HistoryColumns,
) -> String {
    let metrics: [(&StatArray, &str, Kind); 9] = [
        (&stats.allocated_bytes, "Allocated memory", Kind::Size),
        (&stats.active_bytes, "Active memory", Kind::Size),
        (&stats.requested_bytes, "Requested memory", Kind::Size),
        (&stats.reserved_bytes, "GPU reserved memory", Kind::Size),
        (
            &stats.inactive_split_bytes,
            "Non-releasable memory",
            Kind::Size,
        ),
        (&stats.allocation, "Allocations", Kind::Count),
        (&stats.active, "Active allocs", Kind::Count),
        (&stats.segment, "GPU reserved segments", Kind::Count),
        (&stats.inactive_split, "Non-releasable allocs", Kind::Count),
    ];
    let rule = "-".repeat(SUMMARY_WIDTH);
    let double = "=".repeat(SUMMARY_WIDTH);
    let mut lines: Vec<String> = vec![
        double.clone(),
        format!(
            " {:16} PyTorch CUDA memory summary, device ID {:<17} ",
            "", device
        ),
        rule.clone(),
        counters_line(stats, history),
        double.clone(),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];
    for (arr, name, kind) in metrics {
        lines.push(rule.clone());
        let all = arr.get(StatType::All);
        let history = if history == HistoryColumns::KnownExceptRequested
            && std::ptr::eq(arr, &stats.requested_bytes)
        {
            HistoryColumns::NotKnown
        } else {
            history
        };
        row(&mut lines, name, kind, (all, all), history);
        row(
            &mut lines,
            "      from large pool",
            kind,
            (arr.get(StatType::LargePool), all),
            history,
        );
        row(
            &mut lines,
            "      from small pool",
            kind,
            (arr.get(StatType::SmallPool), all),
            history,
        );
    }
    for (s, name) in [
        (&stats.oversize_allocations, "Oversize allocations"),
        (&stats.oversize_segments, "Oversize GPU segments"),
    ] {
        lines.push(rule.clone());
        row(&mut lines, name, Kind::Count, (s, s), history);
    }
    lines.push(double);
    let mut out = String::with_capacity(lines.len() * (SUMMARY_WIDTH + 3));
    for l in &lines {
        let _ = writeln!(out, "|{l}|");
    }
    out
}
