//! Trace history: what to record (`HistoryOptions`, `ContextLevel`) and the bounded ring that
//! keeps the entries (PyTorch's `TraceEntryRingBuffer`).

use crate::snapshot::TraceEntry;

/// How much stack context to gather (PyTorch's `RecordContext`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(u8)]
pub enum ContextLevel {
    /// No context.
    #[default]
    Never = 0,
    /// Context of live blocks only (shown in snapshots).
    State = 1,
    /// Also on `alloc` trace entries (and `free_*` entries carry the allocation's context).
    Alloc = 2,
    /// Also where blocks are freed.
    All = 3,
}

impl ContextLevel {
    /// The level with this discriminant (anything above 3 is `All`).
    pub fn from_u8(v: u8) -> ContextLevel {
        match v {
            0 => ContextLevel::Never,
            1 => ContextLevel::State,
            2 => ContextLevel::Alloc,
            _ => ContextLevel::All,
        }
    }
}

/// PyTorch's default ring size (`sys.maxsize`): unbounded.
pub const DEFAULT_MAX_ENTRIES: usize = usize::MAX;

/// Options of [`CachingAllocator::record_history`](crate::caching::CachingAllocator::record_history).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryOptions {
    /// Keep trace entries (disabling clears the ring).
    pub enabled: bool,
    /// Stack context to gather.
    pub context: ContextLevel,
    /// Ring capacity; the oldest entries are overwritten beyond it (at least 1).
    pub max_entries: usize,
}

impl Default for HistoryOptions {
    /// `torch.cuda.memory._record_memory_history()`: enabled, all context, unbounded.
    fn default() -> Self {
        HistoryOptions {
            enabled: true,
            context: ContextLevel::All,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

/// A ring of trace entries: appends until full, then overwrites the oldest and counts it.
#[derive(Debug, Default)]
pub(crate) struct TraceRing {
    entries: Vec<TraceEntry>,
    next: usize,
    max: usize,
    overflow: u64,
}

impl TraceRing {
    pub(crate) fn new() -> TraceRing {
        TraceRing {
            entries: Vec::new(),
            next: 0,
            max: 1,
            overflow: 0,
        }
    }

    /// Sets the capacity, keeping the newest entries that fit (the dropped ones count as
    /// overflow).
    pub(crate) fn set_max(&mut self, max: usize) {
        let max = max.max(1);
        if max == self.max {
            return;
        }
        let mut all = self.take_ordered();
        if all.len() > max {
            let drop = all.len() - max;
            self.overflow += drop as u64;
            all.drain(..drop);
        }
        self.entries = all;
        self.next = 0;
        self.max = max;
    }

    fn take_ordered(&mut self) -> Vec<TraceEntry> {
        let mut v = std::mem::take(&mut self.entries);
        v.rotate_left(self.next);
        self.next = 0;
        v
    }

    pub(crate) fn push(&mut self, e: TraceEntry) {
        if self.entries.len() < self.max {
            self.entries.push(e);
        } else {
            self.entries[self.next] = e;
            self.next += 1;
            if self.next == self.max {
                self.next = 0;
            }
            self.overflow += 1;
        }
    }

    /// Oldest first.
    pub(crate) fn entries(&self) -> Vec<TraceEntry> {
        let mut out = Vec::with_capacity(self.entries.len());
        out.extend_from_slice(&self.entries[self.next..]);
        out.extend_from_slice(&self.entries[..self.next]);
        out
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.next = 0;
        self.overflow = 0;
    }

    pub(crate) fn overflow(&self) -> u64 {
        self.overflow
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::TraceAction;

    fn e(addr: u64) -> TraceEntry {
        TraceEntry::new(TraceAction::Alloc, addr, 0, 0)
    }

    #[test]
    fn ring_overwrites_oldest_and_reads_oldest_first() {
        let mut r = TraceRing::new();
        r.set_max(3);
        for a in 0..5 {
            r.push(e(a));
        }
        let addrs: Vec<u64> = r.entries().iter().map(|t| t.addr).collect();
        assert_eq!(addrs, [2, 3, 4]);
        assert_eq!(r.overflow(), 2);
        r.set_max(2);
        let addrs: Vec<u64> = r.entries().iter().map(|t| t.addr).collect();
        assert_eq!(addrs, [3, 4]);
        assert_eq!(r.overflow(), 3);
        r.clear();
        assert!(r.entries().is_empty());
    }
}
