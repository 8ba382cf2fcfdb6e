//! Per-stream usage: allocated, active (including frees pending on other streams), reserved,
//! peak and rate; and the flag for streams that hold cached memory no other stream can use
//! (PyTorch's caching allocator never hands a stream's cached blocks to another stream).

use std::collections::BTreeMap;

use allocview_alloc::snapshot::{BlockState, SegmentInfo};

use crate::units;

/// Cached free bytes on one stream above which it is flagged (when other streams exist).
pub const STRANDED_CACHE_FLAG_BYTES: u64 = 256 * units::MIB;

/// Seconds without an allocation after which a live stream's cache counts as stranded; a stream
/// still allocating reuses its own cache.
pub const STRANDED_IDLE_S: f64 = 10.0;

/// One row of the stream table.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StreamRow {
    /// Stream handle (0 = the default stream).
    pub stream: u64,
    /// Bytes of allocated blocks in this stream's segments.
    pub allocated: u64,
    /// Bytes of active blocks (allocated or pending free).
    pub active: u64,
    /// Bytes of pending-free blocks (freed, waiting on another stream).
    pub pending_free: u64,
    /// Bytes of this stream's segments.
    pub reserved: u64,
    /// Highest allocated bytes seen, when the source tracks it.
    pub peak: Option<u64>,
    /// Allocations per second, when live.
    pub allocs_per_s: Option<f64>,
    /// Seconds since the stream's last allocation, when live.
    pub idle_s: Option<f64>,
}

impl StreamRow {
    /// Cached bytes only this stream can use.
    pub fn cached_free(&self) -> u64 {
        self.reserved.saturating_sub(self.active)
    }

    /// A warning when the stream holds a lot of cached memory that other streams cannot use:
    /// only when there are other streams, and, where the source says how long the stream has
    /// been idle (live), only once it has gone [`STRANDED_IDLE_S`] without allocating.
    pub fn stranded_note(&self, streams: usize) -> Option<String> {
        let cached = self.cached_free();
        if streams < 2 || cached < STRANDED_CACHE_FLAG_BYTES {
            return None;
        }
        let note = format!("{} cached on s{}", units::bytes(cached), self.stream);
        match self.idle_s {
            Some(idle) if idle >= STRANDED_IDLE_S => {
                Some(format!("{note}, idle for {}", units::elapsed(idle)))
            }
            Some(_) => None,
            None => Some(note),
        }
    }
}

/// Per-stream rows derived from the segments (a segment belongs to the stream it was
/// allocated for), ordered by stream.
pub fn from_segments(segments: &[SegmentInfo]) -> Vec<StreamRow> {
    by_stream(segments).into_values().collect()
}

/// The rows of [`from_segments`] by stream.
fn by_stream(segments: &[SegmentInfo]) -> BTreeMap<u64, StreamRow> {
    let mut rows: BTreeMap<u64, StreamRow> = BTreeMap::new();
    for seg in segments {
        let row = rows.entry(seg.stream).or_insert_with(|| StreamRow {
            stream: seg.stream,
            ..StreamRow::default()
        });
        row.reserved += seg.total_size;
        for b in &seg.blocks {
            match b.state {
                BlockState::ActiveAllocated => {
                    row.allocated += b.size;
                    row.active += b.size;
                }
                BlockState::ActivePendingFree => {
                    row.active += b.size;
                    row.pending_free += b.size;
                }
                BlockState::Inactive => {}
            }
        }
    }
    rows
}

/// [`from_segments`] with each stream's peak allocated bytes from `peaks` (`(stream, peak)`,
/// for a source that tracks them over a window, such as a file's trace): a stream missing
/// there never held allocated bytes in the window (peak 0), and a stream that held some but
/// has no segment left gets a row of its own.
pub fn from_segments_with_peaks(segments: &[SegmentInfo], peaks: &[(u64, u64)]) -> Vec<StreamRow> {
    let mut rows = by_stream(segments);
    for &(stream, peak) in peaks {
        rows.entry(stream)
            .or_insert_with(|| StreamRow {
                stream,
                ..StreamRow::default()
            })
            .peak = Some(peak);
    }
    for r in rows.values_mut() {
        r.peak.get_or_insert(0);
    }
    rows.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::fixtures::{block, segment};
    use crate::units::{GIB, MIB};
    use allocview_alloc::snapshot::SegmentType;

    /// A segment on stream 0 (20 MiB allocated, 2 MiB pending free) and a free 1 GiB one on
    /// stream 7.
    fn two_streams() -> [SegmentInfo; 2] {
        let a = segment(
            0x1000,
            0,
            SegmentType::Large,
            vec![
                block(0x1000, 20 * MIB, 20 * MIB, BlockState::ActiveAllocated),
                block(
                    0x1000 + 20 * MIB,
                    2 * MIB,
                    2 * MIB,
                    BlockState::ActivePendingFree,
                ),
            ],
        );
        let b = segment(
            0x9000_0000,
            7,
            SegmentType::Large,
            vec![block(0x9000_0000, GIB, GIB, BlockState::Inactive)],
        );
        [a, b]
    }

    #[test]
    fn rows_split_usage_by_the_segment_stream() {
        let rows = from_segments(&two_streams());
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].allocated, 20 * MIB);
        assert_eq!(rows[0].pending_free, 2 * MIB);
        assert_eq!(rows[0].stranded_note(rows.len()), None);
        assert_eq!(rows[1].stream, 7);
        assert_eq!(
            rows[1].stranded_note(rows.len()).as_deref(),
            Some("1.00 GiB cached on s7")
        );
    }

    #[test]
    fn peaks_fill_every_row_and_keep_streams_that_left_no_segment() {
        let rows = from_segments_with_peaks(&two_streams(), &[(0, 30 * MIB), (3, 5 * MIB)]);
        let got: Vec<(u64, u64, Option<u64>)> = rows
            .iter()
            .map(|r| (r.stream, r.reserved, r.peak))
            .collect();
        assert_eq!(
            got,
            [
                (0, 22 * MIB, Some(30 * MIB)),
                (3, 0, Some(5 * MIB)),
                (7, GIB, Some(0))
            ]
        );
    }

    #[test]
    fn a_stream_is_flagged_only_when_another_could_use_its_cache_and_it_has_gone_idle() {
        let row = |idle_s| StreamRow {
            stream: 1,
            reserved: GIB,
            active: 0,
            idle_s,
            ..StreamRow::default()
        };
        // The only stream: no other stream is kept from its cache.
        assert_eq!(row(None).stranded_note(1), None);
        assert_eq!(row(Some(60.0)).stranded_note(1), None);
        // Live and still allocating: it reuses its own cache.
        assert_eq!(row(Some(STRANDED_IDLE_S - 1.0)).stranded_note(2), None);
        assert_eq!(
            row(Some(40.0)).stranded_note(2).as_deref(),
            Some("1.00 GiB cached on s1, idle for 40.0 s")
        );
        // Under the threshold of cached bytes: nothing to say.
        let small = StreamRow {
            reserved: STRANDED_CACHE_FLAG_BYTES - 1,
            ..row(Some(40.0))
        };
        assert_eq!(small.stranded_note(2), None);
    }
}
