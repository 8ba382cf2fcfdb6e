//! RMM memory-resource logs (`rmm::mr::logging_resource_adaptor`), read as a trace.
//!
//! The log is CSV with the header `Thread,Time,Action,Pointer,Size,Stream` and one row per call:
//! `allocate`, `allocate failure` or `free` (older RMM writes `deallocate`). Pointers and streams
//! are hexadecimal (`0x7f8a40000000`) or decimal; time is either seconds since the epoch with a
//! fraction (`1634567890.123456`) or a wall-clock time of day (`15:21:42.370066`).
//!
//! A row becomes one or two [`TraceEntry`]s of PyTorch's vocabulary: `allocate` an `alloc`,
//! `free` a `free_requested` followed by its `free_completed` (RMM frees at once), and
//! `allocate failure` an `oom` whose size is the request. The log has no segments: the result is
//! a [`Snapshot`] with one trace and no segments, which replay treats as a run that began empty.

use allocview_alloc::snapshot::{Snapshot, TraceAction, TraceEntry};

/// The header RMM writes (first line of every log).
pub const RMM_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// Microseconds in one second.
const US_PER_SECOND: f64 = 1e6;

/// A malformed RMM log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RmmError {
    /// The first line is not RMM's header.
    #[error("not an RMM log: the first line is not `{RMM_HEADER}`")]
    NoHeader,
    /// A row could not be read.
    #[error("RMM log line {line}: {problem}")]
    Row {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        problem: String,
    },
}

/// `bytes` from where an RMM log's header would start: after a BOM and white space.
fn after_bom_and_space(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    &bytes[start..]
}

/// Whether `bytes` look like an RMM log (its header, after optional whitespace or a BOM).
pub fn is_rmm_log(bytes: &[u8]) -> bool {
    after_bom_and_space(bytes).starts_with(RMM_HEADER.as_bytes())
}

/// Whether `bytes`, the first bytes read of a file, may start an RMM log: they are the start
/// of its header, or hold the whole header (as [`is_rmm_log`]).
pub fn may_be_rmm_log(bytes: &[u8]) -> bool {
    let rest = after_bom_and_space(bytes);
    let n = rest.len().min(RMM_HEADER.len());
    rest[..n] == RMM_HEADER.as_bytes()[..n]
}

/// Parses an RMM log into a snapshot holding its trace (device 0, no segments).
///
/// # Errors
/// [`RmmError::NoHeader`] when the header is missing, [`RmmError::Row`] naming the line and the
/// field for a row that cannot be read.
pub fn parse_rmm_log(text: &str) -> Result<Snapshot, RmmError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text
        .lines()
        .enumerate()
        .skip_while(|(_, l)| l.trim().is_empty());
    match lines.next() {
        Some((_, l)) if l.trim() == RMM_HEADER => {}
        _ => return Err(RmmError::NoHeader),
    }
    let mut trace = Vec::new();
    for (i, line) in lines {
        let line_no = i + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let row = |problem: String| RmmError::Row {
            line: line_no,
            problem,
        };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != 6 {
            return Err(row(format!("expected 6 fields, found {}", fields.len())));
        }
        let time_us =
            parse_time(fields[1]).ok_or_else(|| row(format!("bad time `{}`", fields[1])))?;
        let addr =
            parse_int(fields[3]).ok_or_else(|| row(format!("bad pointer `{}`", fields[3])))?;
        let size = parse_int(fields[4]).ok_or_else(|| row(format!("bad size `{}`", fields[4])))?;
        let stream =
            parse_int(fields[5]).ok_or_else(|| row(format!("bad stream `{}`", fields[5])))?;
        let make = |action| TraceEntry {
            time_us: Some(time_us),
            ..TraceEntry::new(action, addr, size, stream)
        };
        match fields[2] {
            "allocate" => trace.push(make(TraceAction::Alloc)),
            "free" | "deallocate" => {
                trace.push(make(TraceAction::FreeRequested));
                trace.push(make(TraceAction::FreeCompleted));
            }
            "allocate failure" => trace.push(TraceEntry {
                // An `oom` entry's address holds the device's free bytes, which RMM does not log.
                addr: 0,
                ..make(TraceAction::Oom)
            }),
            other => return Err(row(format!("unknown action `{other}`"))),
        }
    }
    Ok(Snapshot {
        device_traces: vec![trace],
        ..Snapshot::default()
    })
}

/// `0x...` hexadecimal or decimal.
fn parse_int(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None if s == "nullptr" || s == "(nil)" => Some(0),
        None => s.parse().ok(),
    }
}

/// Epoch seconds with a fraction, or `HH:MM:SS.ffffff` (microseconds since midnight).
fn parse_time(s: &str) -> Option<i64> {
    if s.contains(':') {
        let mut parts = s.splitn(3, ':');
        let h: i64 = parts.next()?.parse().ok()?;
        let m: i64 = parts.next()?.parse().ok()?;
        let sec: f64 = parts.next()?.parse().ok()?;
        if !(0.0..61.0).contains(&sec) || !(0..60).contains(&m) || h < 0 {
            return None;
        }
        Some((h * 3600 + m * 60) * 1_000_000 + (sec * US_PER_SECOND).round() as i64)
    } else {
        let secs: f64 = s.parse().ok()?;
        secs.is_finite()
            .then(|| (secs * US_PER_SECOND).round() as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "Thread,Time,Action,Pointer,Size,Stream\n\
        140573312345856,1634567890.123456,allocate,0x7f8a40000000,1024,0x0\n\
        140573312345856,1634567890.234567,allocate failure,0x0,4096,0x0\n\
        140573312345856,15:21:42.5,free,0x7f8a40000000,1024,0x10\n";

    #[test]
    fn the_first_bytes_of_an_rmm_log_may_be_one_and_others_are_not() {
        for prefix in ["Th", "  Thread,Ti", "\u{feff}Thread", LOG] {
            assert!(may_be_rmm_log(prefix.as_bytes()), "{prefix:?}");
        }
        for other in ["Tx", "\0\0", "{\"format\"", "Thread;Time"] {
            assert!(!may_be_rmm_log(other.as_bytes()), "{other:?}");
        }
    }

    #[test]
    fn an_rmm_log_becomes_alloc_free_and_oom_entries() {
        assert!(is_rmm_log(LOG.as_bytes()));
        let snap = parse_rmm_log(LOG).unwrap();
        let actions: Vec<_> = snap.device_traces[0].iter().map(|e| e.action).collect();
        assert_eq!(
            actions,
            vec![
                TraceAction::Alloc,
                TraceAction::Oom,
                TraceAction::FreeRequested,
                TraceAction::FreeCompleted
            ]
        );
        let t = &snap.device_traces[0];
        assert_eq!(t[0].addr, 0x7f8a_4000_0000);
        assert_eq!(t[0].time_us, Some(1_634_567_890_123_456));
        assert_eq!(t[1].size, 4096);
        assert_eq!(t[2].stream, 0x10);
        assert_eq!(
            t[2].time_us,
            Some((15 * 3600 + 21 * 60 + 42) * 1_000_000 + 500_000)
        );
        assert!(snap.segments.is_empty());
    }

    #[test]
    fn a_bad_row_is_an_error_naming_its_line_and_field() {
        let bad = "Thread,Time,Action,Pointer,Size,Stream\n1,1.0,allocate,0xZZ,10,0\n";
        let err = parse_rmm_log(bad).unwrap_err();
        assert_eq!(err.to_string(), "RMM log line 2: bad pointer `0xZZ`");
        let short = "Thread,Time,Action,Pointer,Size,Stream\n1,1.0,allocate\n";
        assert!(
            parse_rmm_log(short)
                .unwrap_err()
                .to_string()
                .contains("expected 6 fields")
        );
        let action = "Thread,Time,Action,Pointer,Size,Stream\n1,1.0,grow,0x1,1,0\n";
        assert!(
            parse_rmm_log(action)
                .unwrap_err()
                .to_string()
                .contains("`grow`")
        );
    }

    #[test]
    fn a_file_without_the_header_is_not_an_rmm_log() {
        assert!(!is_rmm_log(b"\x80\x04\x95"));
        assert_eq!(parse_rmm_log("a,b\n1,2\n"), Err(RmmError::NoHeader));
    }
}
