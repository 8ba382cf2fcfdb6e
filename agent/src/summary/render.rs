//! The text `allocview summary` prints: [`Summary`]'s `Display`. Sizes as every view writes
//! them ([`human_bytes`]: three significant digits, binary units), columns aligned, one section
//! per device.

use std::fmt::{self, Write as _};

use allocview_alloc::stats::human_bytes;

use super::{DeviceSummary, Fragmentation, Summary};

/// Microseconds per second, for trace times.
pub(crate) const US_PER_S: f64 = 1e6;

/// `text` after `indent`, wrapped to [`REPORT_WIDTH`](crate::text::REPORT_WIDTH) columns,
/// its continuation lines two columns further in.
fn indented(text: &str, indent: &str) -> String {
    crate::text::paragraph(&format!("{indent}{text}"), crate::text::REPORT_WIDTH, "  ")
}

/// A stream as the dashboard names it: `s0` (the default stream), `s1`, ...
pub fn stream_label(stream: u64) -> String {
    format!("s{stream}")
}

/// `n` and the noun in the number it takes: "1 entry", "2 entries".
pub fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

/// Column headers of the fragmentation tables (after the row label).
const FRAG_COLUMNS: [&str; 9] = [
    "segments",
    "blocks",
    "reserved",
    "allocated",
    "active",
    "requested",
    "largest free",
    "free in splits",
    "rounding waste",
];

fn frag_cells(f: &Fragmentation) -> [String; 9] {
    [
        f.segments.to_string(),
        f.blocks.to_string(),
        human_bytes(f.reserved),
        human_bytes(f.allocated),
        human_bytes(f.active),
        human_bytes(f.requested),
        human_bytes(f.largest_free_block),
        human_bytes(f.free_in_split_segments),
        human_bytes(f.rounding_waste),
    ]
}

/// Writes a table with right-aligned cells (the first column left-aligned), columns as wide as
/// their widest cell.
fn table(out: &mut String, indent: &str, header: &[&str], rows: &[Vec<String>]) {
    let cols = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(cols) {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        out.push_str(indent);
        for (i, c) in cells.enumerate() {
            if i == 0 {
                let _ = write!(out, "{c:<w$}", w = width[0]);
            } else {
                let _ = write!(out, "  {c:>w$}", w = width[i]);
            }
        }
        out.push('\n');
    };
    line(out, &mut header.iter().copied());
    for r in rows {
        line(out, &mut r.iter().map(String::as_str));
    }
}

fn device_section(out: &mut String, d: &DeviceSummary) {
    let _ = write!(out, "Device {}", d.device);
    if let Some(t) = d.total_memory {
        let _ = write!(
            out,
            " (total memory {}, {} reserved)",
            human_bytes(t),
            percent(d.totals.reserved, t)
        );
    }
    out.push('\n');
    for line in d.memory_summary.lines() {
        let _ = writeln!(out, "  {line}");
    }
    for line in d.window.describe().lines() {
        out.push_str(&indented(line, "  "));
    }

    let t = &d.totals;
    let _ = writeln!(
        out,
        "\n  Fragmentation: {} free of {} reserved; largest free block {};\n  \
         {} of the free bytes ({}) are in split segments; rounding waste {}",
        human_bytes(t.free),
        human_bytes(t.reserved),
        human_bytes(t.largest_free_block),
        human_bytes(t.free_in_split_segments),
        percent(t.free_in_split_segments, t.free),
        human_bytes(t.rounding_waste),
    );

    let mut header = vec!["pool"];
    header.extend(FRAG_COLUMNS);
    let rows: Vec<Vec<String>> = [
        ("small", &d.pools.small),
        ("large", &d.pools.large),
        ("private", &d.pools.private),
    ]
    .into_iter()
    .map(|(name, f)| {
        let mut r = vec![name.to_string()];
        r.extend(frag_cells(f));
        r
    })
    .collect();
    out.push_str("\n  By pool\n");
    table(out, "  ", &header, &rows);

    header[0] = "stream";
    let rows: Vec<Vec<String>> = d
        .streams
        .iter()
        .map(|s| {
            let mut r = vec![stream_label(s.stream)];
            r.extend(frag_cells(&s.fragmentation));
            r
        })
        .collect();
    out.push_str("\n  By stream\n");
    if rows.is_empty() {
        out.push_str("  (no segments)\n");
    } else {
        table(out, "  ", &header, &rows);
    }

    let _ = write!(
        out,
        "\n  Trace: {}",
        counted(d.trace_entries, "entry", "entries")
    );
    if d.ring_overflowed {
        let _ = write!(
            out,
            "; the ring overflowed: {} older entries were lost",
            d.trace_overflow
        );
    } else if d.trace_entries == 0 {
        // Nothing to judge the ring by: history was off when the snapshot was taken.
        out.push_str(
            " (no history was recorded; in PyTorch, \
             torch.cuda.memory._record_memory_history() before the run records it)",
        );
    } else {
        out.push_str("; the ring did not overflow");
    }
    out.push('\n');
    let counts: Vec<String> = d
        .actions
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(a, n)| format!("{a} {n}"))
        .collect();
    if !counts.is_empty() {
        let _ = writeln!(out, "    {}", counts.join(", "));
    }

    if d.ooms.is_empty() {
        out.push_str("\n  OOMs: none in the trace\n");
    } else {
        let _ = writeln!(out, "\n  OOMs: {}", d.ooms.len());
        if d.ooms.iter().any(|o| o.index.is_none()) {
            out.push_str(
                "    the OOM this dump was taken at, from the agent's record (no trace: the \
                 allocator was not recording history)\n",
            );
        }
        let first_time = d.ooms.iter().find_map(|o| o.time_us);
        let rows: Vec<Vec<String>> = d
            .ooms
            .iter()
            .map(|o| {
                let unless_lost = |known: String| {
                    if o.event_lost {
                        "not known".to_string()
                    } else {
                        known
                    }
                };
                vec![
                    // Trace entries count from 1, as the dashboard numbers them.
                    o.index
                        .map_or_else(|| "dump".into(), |i| format!("#{}", i + 1)),
                    match (o.time_us, first_time) {
                        (Some(t), Some(t0)) => {
                            format!("+{:.3} s", t.saturating_sub(t0) as f64 / US_PER_S)
                        }
                        _ => "-".into(),
                    },
                    unless_lost(human_bytes(o.requested)),
                    unless_lost(human_bytes(o.device_free)),
                    unless_lost(stream_label(o.stream)),
                    o.diagnosis
                        .as_ref()
                        .map_or_else(|| "not known".into(), |d| d.kind.as_str().to_string()),
                ]
            })
            .collect();
        table(
            out,
            "  ",
            &[
                "entry",
                "time since first OOM",
                "requested",
                "device free",
                "stream",
                "diagnosis",
            ],
            &rows,
        );
        // The first OOM usually tells why the run failed.
        if let Some(diag) = d.ooms.first().and_then(|o| o.diagnosis.as_ref()) {
            out.push_str(&indented(
                &format!("first OOM — {}", diag.explanation),
                "    ",
            ));
            if let Some(s) = &d.smallest_device {
                out.push_str(&indented(
                    &crate::replay::report::smallest_device_line(s),
                    "    ",
                ));
            }
        } else if d.ooms.iter().any(|o| o.index.is_some()) {
            out.push_str(
                "    diagnosis not known: replaying the trace did not reproduce the recording\n",
            );
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Snapshot: {}, {} on {} device(s); {}, {} OOM(s)",
            counted(self.segments, "segment", "segments"),
            counted(self.blocks, "block", "blocks"),
            self.devices.len(),
            counted(self.trace_entries, "trace entry", "trace entries"),
            self.ooms
        );
        let _ = writeln!(
            out,
            "Recorded allocator settings: {}",
            self.recorded_settings
        );
        let rows = vec![
            vec!["reserved".to_string(), human_bytes(self.total_reserved)],
            vec!["allocated".to_string(), human_bytes(self.total_allocated)],
            vec!["active".to_string(), human_bytes(self.total_active)],
            vec!["requested".to_string(), human_bytes(self.total_requested)],
            vec![
                "largest free block".to_string(),
                human_bytes(self.largest_free_block),
            ],
        ];
        table(&mut out, "  ", &["totals", "bytes"], &rows);
        for d in &self.devices {
            out.push('\n');
            device_section(&mut out, d);
        }
        f.write_str(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::counted;

    #[test]
    fn counted_takes_the_singular_only_for_one() {
        assert_eq!(counted(1, "entry", "entries"), "1 entry");
        assert_eq!(counted(0, "entry", "entries"), "0 entries");
        assert_eq!(counted(2, "entry", "entries"), "2 entries");
    }
}
