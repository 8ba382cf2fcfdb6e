//! Per-stream usage: allocated, active (including frees pending on other streams), reserved,
//! peak and rate; and the flag for streams that hold cached memory no other stream can use
//! (PyTorch's caching allocator never hands a stream's cached blocks to another stream).

use std::collections::BTreeMap;

use allocview_alloc::snapshot::{BlockState, SegmentInfo};

use crate::units;

/// Cached free bytes on one stream above which an idle stream is flagged.
pub const STRANDED_CACHE_FLAG_BYTES: u64 = 256 * units::MIB;

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

    /// A warning when the stream holds a lot of cached memory that other streams cannot use.
    pub fn stranded_note(&self) -> Option<String> {
        let cached = self.cached_free();
        if cached < STRANDED_CACHE_FLAG_BYTES {
            return None;
        }
        Some(match self.idle_s {
            Some(idle) if idle >= 1.0 => format!(
                "{} cached on s{}, idle for {:.0} s",
                units::bytes(cached),
                self.stream,
                idle
            ),
            _ => format!("{} cached on s{}", units::bytes(cached), self.stream),
        })
    }
}

/// Per-stream rows derived from the segments (a segment belongs to the stream it was
/// allocated for), ordered by stream.
pub fn from_segments(segments: &[SegmentInfo]) -> Vec<StreamRow> {
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
    rows.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::fixtures::{block, segment};
    use crate::units::{GIB, MIB};
    use allocview_alloc::snapshot::SegmentType;

    #[test]
    fn rows_split_usage_by_the_segment_stream() {
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
        let rows = from_segments(&[a, b]);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].allocated, 20 * MIB);
        assert_eq!(rows[0].pending_free, 2 * MIB);
        assert_eq!(rows[0].stranded_note(), None);
        assert_eq!(rows[1].stream, 7);
        assert_eq!(
            rows[1].stranded_note().as_deref(),
            Some("1.00 GiB cached on s7")
        );
    }
}
