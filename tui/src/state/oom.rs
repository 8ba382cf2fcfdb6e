//! OOM reports: the facts of one failed allocation and a diagnosis.
//!
//! The diagnosis follows the reasoning of PyTorch's OOM message ("reserved but unallocated
//! memory is large, try expandable_segments"): when the allocator holds enough cached memory
//! for the request but no single free block is large enough, the cause is fragmentation;
//! otherwise the program needs more memory than the device gives.

use std::fmt;

use allocview_alloc::snapshot::Frames;

use crate::units;

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Diagnosis {
    /// Enough memory cached in total, but split into blocks too small for the request.
    Fragmentation {
        /// Cached free bytes.
        cached_free: u64,
        /// Largest free block.
        largest_free: u64,
    },
    /// The program needs more than the device has left, even with the cache emptied.
    Capacity {
        /// Bytes allocated when it failed.
        allocated: u64,
        /// Bytes requested (rounded).
        requested: u64,
    },
}

impl Diagnosis {
    /// Diagnoses an OOM from the request and the allocator's state at the failure.
    pub fn of(rounded: u64, cached_free: u64, largest_free: u64, allocated: u64) -> Diagnosis {
        if cached_free >= rounded && largest_free < rounded {
            Diagnosis::Fragmentation {
                cached_free,
                largest_free,
            }
        } else {
            Diagnosis::Capacity {
                allocated,
                requested: rounded,
            }
        }
    }
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Diagnosis::Fragmentation {
                cached_free,
                largest_free,
            } => write!(
                f,
                "FRAGMENTATION — {} cached but the largest free block is {} (try expandable_segments:True)",
                units::bytes(cached_free),
                units::bytes(largest_free)
            ),
            Diagnosis::Capacity {
                allocated,
                requested,
            } => write!(
                f,
                "CAPACITY — {} allocated + {} requested is more than the device can give",
                units::bytes(allocated),
                units::bytes(requested)
            ),
        }
    }
}

/// One OOM with its facts.
#[derive(Debug, Clone, PartialEq)]
pub struct OomReport {
    /// 1-based number of the OOM on this device.
    pub number: u64,
    /// Wall-clock time in microseconds since the Unix epoch, when known.
    pub time_us: Option<i64>,
    /// Device index.
    pub device: i32,
    /// Stream of the failed request.
    pub stream: u64,
    /// Bytes the program asked for.
    pub requested: u64,
    /// After the allocator's rounding.
    pub rounded: u64,
    /// Size of the segment the allocator tried to get from the device, when known.
    pub segment_size: Option<u64>,
    /// Device memory in total, when known.
    pub device_total: Option<u64>,
    /// Device memory free at the failure, when known.
    pub device_free: Option<u64>,
    /// Allocated bytes at the failure.
    pub allocated: u64,
    /// Reserved bytes at the failure.
    pub reserved: u64,
    /// Largest free cached block at the failure.
    pub largest_free: u64,
    /// Why it failed.
    pub diagnosis: Diagnosis,
    /// What-if replays (`expandable_segments:True → no OOM, ...`), when computed.
    pub what_if: Vec<String>,
    /// Where the snapshot taken at the OOM was written.
    pub dump_path: Option<String>,
    /// Where the request came from (context frames).
    pub frames: Frames,
    /// Index of the OOM in the trace (file mode).
    pub trace_index: Option<usize>,
}

impl OomReport {
    /// The first line: `tried to allocate 1.50 GiB (rounded 1.50 GiB, segment 1.50 GiB)`.
    pub fn request_line(&self) -> String {
        let mut s = format!(
            "tried to allocate {} (rounded {}",
            units::bytes(self.requested),
            units::bytes(self.rounded)
        );
        if let Some(seg) = self.segment_size {
            s.push_str(&format!(", segment {}", units::bytes(seg)));
        }
        s.push(')');
        s
    }

    /// `device: 80.0 GiB total, 0.90 GiB free · allocator: 71.2 GiB allocated, 77.9 GiB reserved`.
    pub fn memory_line(&self) -> String {
        let total = self.device_total.map_or_else(
            || "? total".to_string(),
            |t| format!("{} total", units::bytes(t)),
        );
        let free = self.device_free.map_or_else(
            || "? free".to_string(),
            |f| format!("{} free", units::bytes(f)),
        );
        format!(
            "device: {total}, {free} · allocator: {} allocated, {} reserved",
            units::bytes(self.allocated),
            units::bytes(self.reserved)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::{GIB, MIB};

    #[test]
    fn enough_cache_in_small_pieces_is_fragmentation() {
        let d = Diagnosis::of(3 * GIB / 2, 6 * GIB, 610 * MIB, 71 * GIB);
        assert!(matches!(d, Diagnosis::Fragmentation { .. }));
        assert_eq!(
            d.to_string(),
            "FRAGMENTATION — 6.00 GiB cached but the largest free block is 610 MiB (try expandable_segments:True)"
        );
    }

    #[test]
    fn too_little_cache_is_capacity() {
        let d = Diagnosis::of(3 * GIB / 2, GIB, 610 * MIB, 14 * GIB);
        assert_eq!(
            d,
            Diagnosis::Capacity {
                allocated: 14 * GIB,
                requested: 3 * GIB / 2
            }
        );
    }
}
