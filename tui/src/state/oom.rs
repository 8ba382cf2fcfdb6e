//! OOM reports: the facts of one failed allocation and the agent's diagnosis
//! ([`allocview_agent::diagnosis`]: exhaustion, fragmentation, or memory used outside the
//! allocator), so the dashboard, `allocview summary` and the agent's dumps agree.

use allocview_agent::diagnosis::DiagnosisKind;
use allocview_alloc::snapshot::Frames;

use crate::units;

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
    pub diagnosis: DiagnosisKind,
    /// The diagnosis in one sentence with the numbers.
    pub explanation: String,
    /// What-if replays (`expandable_segments:True → no OOM, ...`), when computed.
    pub what_if: Vec<String>,
    /// Where the snapshot taken at the OOM was written.
    pub dump_path: Option<String>,
    /// Why the snapshot could not be written, if it could not.
    pub dump_error: Option<String>,
    /// The snapshot is being written.
    pub dump_pending: bool,
    /// The OOM's event was dropped on its way (a full channel): the request is not known, and
    /// the memory figures are from the resync after it.
    pub event_lost: bool,
    /// Where the request came from (context frames).
    pub frames: Frames,
    /// Index of the OOM in the trace (file mode).
    pub trace_index: Option<usize>,
}

/// Between the device's figures and the allocator's in [`OomReport::memory_line`] (where a
/// narrow view breaks it).
pub const MEMORY_SEPARATOR: &str = " · ";

impl OomReport {
    /// The diagnosis as the OOM view heads it (`FRAGMENTATION`), or `NOT KNOWN` when the
    /// OOM's event was lost with its request.
    pub fn diagnosis_label(&self) -> String {
        if self.event_lost {
            "NOT KNOWN".into()
        } else {
            self.diagnosis.as_str().to_uppercase()
        }
    }

    /// The first line: `tried to allocate 1.50 GiB (rounded 1.50 GiB, segment 1.50 GiB)`.
    pub fn request_line(&self) -> String {
        if self.event_lost {
            return "request not known: the OOM's event was dropped (the event channel was full)"
                .into();
        }
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
            "device: {total}, {free}{MEMORY_SEPARATOR}allocator: {} allocated, {} reserved",
            units::bytes(self.allocated),
            units::bytes(self.reserved)
        )
    }
}

#[cfg(test)]
impl OomReport {
    /// OOM number `number` for tests: 1 GiB asked of a 16 GiB device whose allocator holds
    /// 15 GiB (exhaustion), nothing else known.
    pub(crate) fn example(number: u64) -> OomReport {
        OomReport {
            number,
            time_us: None,
            device: 0,
            stream: 0,
            requested: 1 << 30,
            rounded: 1 << 30,
            segment_size: None,
            device_total: Some(16 << 30),
            device_free: Some(1 << 20),
            allocated: 15 << 30,
            reserved: 15 << 30,
            largest_free: 0,
            diagnosis: DiagnosisKind::Exhaustion,
            explanation: String::new(),
            what_if: Vec::new(),
            dump_path: None,
            dump_error: None,
            dump_pending: false,
            event_lost: false,
            frames: allocview_alloc::snapshot::no_frames(),
            trace_index: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_state_the_request_and_memory() {
        let o = OomReport {
            requested: 3 << 29,
            rounded: 3 << 29,
            segment_size: Some(3 << 29),
            device_total: Some(80 << 30),
            device_free: None,
            allocated: 1 << 30,
            reserved: 2 << 30,
            ..OomReport::example(1)
        };
        assert_eq!(
            o.request_line(),
            "tried to allocate 1.50 GiB (rounded 1.50 GiB, segment 1.50 GiB)"
        );
        assert_eq!(
            o.memory_line(),
            "device: 80.0 GiB total, ? free · allocator: 1.00 GiB allocated, 2.00 GiB reserved"
        );
    }
}
