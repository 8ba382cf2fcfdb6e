//! Why an allocation ran out of memory: exhaustion, fragmentation, or memory outside the
//! allocator.
//!
//! The facts of an OOM ([`OomFacts`]: the request, the device's free and total memory, what the
//! allocator had allocated and reserved, its largest free block and the free bytes stranded in
//! split segments) come from an allocator's `OutOfMemory` error, from an `oom` trace entry plus
//! the allocator state at that point (replay rebuilds it), or from a snapshot taken at the OOM.
//! [`diagnose`] classifies them, in this order:
//!
//! 1. **fragmentation**: the allocator holds at least the request in free reserved bytes, but no
//!    free block it may use is large enough: the free bytes are scattered between allocated
//!    blocks of split segments, or cached for another stream (the cure:
//!    `expandable_segments:True`, or a `max_split_size_mb` that keeps large blocks whole);
//! 2. **memory outside the allocator**: the device's used memory is mostly not reserved by this
//!    allocator (another process, another allocator, the CUDA context);
//! 3. **exhaustion at the segment size**: the request fits the device's free memory, but the
//!    segment the allocator asks for it (2 MiB, 20 MiB, or the request rounded to 2 MiB), or
//!    with expandable segments its whole 2 MiB or 20 MiB pages, do not;
//! 4. **fragmentation** too when the memory left beyond the live allocations (free bytes in the
//!    segments plus the device's free bytes) would hold the request but no piece of it is
//!    large enough: the free bytes of split segments cannot be given back to the device to
//!    join its free bytes;
//! 5. **exhaustion**: the program's live tensors fill the memory it may use.
//!
//! A fragmentation whose live allocations and request fill [`NEAR_FULL_SHARE`] of that memory
//! says so: a setting that cures the fragmentation fits this request but leaves no room to grow.
//!
//! PyTorch's own message states the same facts (allocated, reserved but unallocated, device
//! free); this module adds the largest free block and the stranded bytes, and
//! [`what_if_avoided`] replays a recorded trace under other settings to say whether they would
//! have avoided it.

use serde::{Deserialize, Serialize};

use allocview_alloc::caching::OutOfMemory;
use allocview_alloc::caching::config::{self, segment_size};
use allocview_alloc::snapshot::{BlockState, DumpedOom, SegmentInfo, TraceEntry};
use allocview_alloc::stats::human_bytes;

pub use crate::replay::what_if::{WhatIfOutcome, what_if_avoided};

/// Memory outside the allocator counts as the cause when it is at least this share of the
/// memory the allocator may use (and more than the allocator itself reserved).
pub const OUTSIDE_SHARE: f64 = 0.25;

/// A fragmentation OOM is said to be near exhaustion too when live allocations and the
/// request fill at least this share of the memory the allocator may use.
pub const NEAR_FULL_SHARE: f64 = 0.9;

/// The facts of one OOM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomFacts {
    /// Bytes asked for (rounded as the allocator rounds them).
    pub requested: u64,
    /// Total device memory (0: not known, as in PyTorch's own snapshot files).
    pub device_total: u64,
    /// Free device memory when the allocation failed.
    pub device_free: u64,
    /// The most this allocator may reserve (a memory fraction), when set.
    pub allowed_max: Option<u64>,
    /// Bytes in allocated blocks.
    pub allocated: u64,
    /// Bytes reserved from the device (all segments).
    pub reserved: u64,
    /// The largest free block in any segment.
    pub largest_free_block: u64,
    /// Free bytes in segments that also hold allocated blocks (they cannot be released).
    pub stranded_in_split_segments: u64,
}

impl OomFacts {
    /// The facts an allocator's out-of-memory error carries.
    pub fn from_oom(oom: &OutOfMemory) -> OomFacts {
        OomFacts {
            requested: oom.rounded,
            device_total: oom.device_total,
            device_free: oom.device_free,
            allowed_max: oom.allowed_max,
            allocated: oom.allocated,
            reserved: oom.reserved,
            largest_free_block: oom.largest_free_block,
            stranded_in_split_segments: oom.stranded_in_split_segments,
        }
    }

    /// The facts of an agent's OOM record as its dump carries it, on a device of
    /// `device_total` bytes (0: not known).
    pub fn from_dumped(oom: &DumpedOom, device_total: u64) -> OomFacts {
        OomFacts {
            requested: oom.rounded,
            device_total,
            device_free: oom.device_free,
            allowed_max: None,
            allocated: oom.allocated,
            reserved: oom.reserved,
            largest_free_block: oom.largest_free_block,
            stranded_in_split_segments: oom.inactive_split_bytes,
        }
    }

    /// The facts of an `oom` trace entry (its address field holds the device's free bytes, its
    /// size the rounded request) with the allocator state at that point, given as the segments
    /// then.
    pub fn from_trace_entry<'a>(
        entry: &TraceEntry,
        segments: impl IntoIterator<Item = &'a SegmentInfo>,
        device_total: u64,
    ) -> OomFacts {
        let mut f = OomFacts {
            requested: entry.size,
            device_total,
            device_free: entry.addr,
            allowed_max: None,
            allocated: 0,
            reserved: 0,
            largest_free_block: 0,
            stranded_in_split_segments: 0,
        };
        for seg in segments {
            f.reserved += seg.total_size;
            let split = seg.blocks.iter().any(|b| b.state.is_active());
            for b in &seg.blocks {
                match b.state {
                    BlockState::ActiveAllocated => f.allocated += b.size,
                    BlockState::ActivePendingFree => {}
                    BlockState::Inactive => {
                        f.largest_free_block = f.largest_free_block.max(b.size);
                        if split {
                            f.stranded_in_split_segments += b.size;
                        }
                    }
                }
            }
        }
        f
    }

    /// Free bytes inside reserved segments (`reserved - allocated`).
    pub fn free_in_reserved(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }

    /// Device memory in use by something other than this allocator.
    pub fn outside(&self) -> u64 {
        self.device_total
            .saturating_sub(self.device_free)
            .saturating_sub(self.reserved)
    }

    /// The memory this allocator may use: the fraction's limit, else the device; where
    /// neither is known, what it could reach for sure: its segments and the device's free
    /// memory (see [`capacity_known`](Self::capacity_known)).
    pub fn capacity(&self) -> u64 {
        match (self.allowed_max, self.device_total) {
            (Some(limit), _) => limit,
            (None, 0) => self.reserved.saturating_add(self.device_free),
            (None, total) => total,
        }
    }

    /// Whether [`capacity`](Self::capacity) is a limit or a device size the facts give, not
    /// only the reserved and free bytes.
    pub fn capacity_known(&self) -> bool {
        self.allowed_max.is_some() || self.device_total != 0
    }

    /// The memory left to this allocator beyond its live allocations: what it may use (less
    /// what others hold on the device) minus what it has allocated. Free bytes in its segments
    /// and free bytes on the device both count; whether one piece is large enough is another
    /// matter.
    pub fn free_for_allocator(&self) -> u64 {
        let usable = if self.device_total == 0 {
            self.capacity()
        } else {
            self.capacity()
                .min(self.device_total.saturating_sub(self.outside()))
        };
        usable.saturating_sub(self.allocated)
    }
}

/// The kind of OOM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiagnosisKind {
    /// Live allocations fill the memory the allocator may use.
    Exhaustion,
    /// Enough free bytes are reserved, but no free block is large enough.
    Fragmentation,
    /// Most used device memory is not this allocator's.
    OutsideAllocator,
}

impl DiagnosisKind {
    /// A short name (`exhaustion`, `fragmentation`, `outside allocator`).
    pub fn as_str(self) -> &'static str {
        match self {
            DiagnosisKind::Exhaustion => "exhaustion",
            DiagnosisKind::Fragmentation => "fragmentation",
            DiagnosisKind::OutsideAllocator => "outside allocator",
        }
    }
}

/// What [`diagnose`] concludes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// The kind.
    pub kind: DiagnosisKind,
    /// One readable sentence with the numbers.
    pub explanation: String,
    /// Bytes asked for.
    pub requested: u64,
    /// The largest free block.
    pub largest_free_block: u64,
    /// Free bytes in reserved segments.
    pub free_in_reserved: u64,
    /// Free bytes stranded in split segments.
    pub stranded_in_split_segments: u64,
    /// Device memory used outside the allocator.
    pub outside_allocator: u64,
    /// Bytes allocated.
    pub allocated: u64,
    /// Bytes reserved.
    pub reserved: u64,
    /// The memory the allocator may use (device total or the fraction's limit).
    pub capacity: u64,
}

/// The page an expandable segment maps for a request of `requested` bytes: that of the pool
/// the request goes to ([`config::expandable_page`]).
fn expandable_page(requested: u64) -> u64 {
    config::expandable_page(requested <= config::SMALL_SIZE)
}

/// How much the allocator takes from the device at once for a request of `requested` bytes:
/// a segment of [`segment_size`], or with expandable segments whole pages (at most; free
/// bytes at the end of the mapped range count towards it).
fn device_grain(requested: u64, expandable_segments: bool) -> u64 {
    if expandable_segments {
        let page = expandable_page(requested);
        requested.div_ceil(page).saturating_mul(page)
    } else {
        segment_size(requested)
    }
}

/// Classifies an OOM (see the module documentation for the rules).
pub fn diagnose(f: &OomFacts) -> Diagnosis {
    diagnose_under(f, false)
}

/// [`diagnose`], for an allocator that already used expandable segments (or not): the advice
/// for fragmentation differs.
pub fn diagnose_under(f: &OomFacts, expandable_segments: bool) -> Diagnosis {
    let free_in_reserved = f.free_in_reserved();
    let outside = f.outside();
    let capacity = f.capacity();
    let req = human_bytes(f.requested);
    let free_for_allocator = f.free_for_allocator();
    // What a new segment may take: the device's free memory, within the allocator's limit.
    let room_on_device = f.device_free.min(capacity.saturating_sub(f.reserved));
    // What the allocator takes from the device at once for this request.
    let grain = device_grain(f.requested, expandable_segments);
    let (kind, mut explanation) = if free_in_reserved >= f.requested {
        let where_ = if f.largest_free_block >= f.requested {
            format!(
                "the largest free block ({}) is cached for another stream or pool",
                human_bytes(f.largest_free_block)
            )
        } else {
            format!(
                "the largest free block is {}",
                human_bytes(f.largest_free_block)
            )
        };
        let cure = if expandable_segments {
            "even with expandable segments the free pages are scattered between live blocks"
        } else {
            "expandable_segments:True would let the free space be used"
        };
        (
            DiagnosisKind::Fragmentation,
            format!(
                "fragmentation: {} is reserved but free, more than the {req} asked for, yet \
                 {where_} and {} is stranded in split segments; {cure}",
                human_bytes(free_in_reserved),
                human_bytes(f.stranded_in_split_segments)
            ),
        )
    } else if outside as f64 >= OUTSIDE_SHARE * capacity as f64 && outside > f.reserved {
        (
            DiagnosisKind::OutsideAllocator,
            format!(
                "memory outside the allocator: {} of the device's {} is used by something else \
                 (this allocator reserves only {}), leaving {} free for the {req} asked for",
                human_bytes(outside),
                human_bytes(f.device_total),
                human_bytes(f.reserved),
                human_bytes(f.device_free)
            ),
        )
    } else if room_on_device >= f.requested && grain > room_on_device {
        // The request itself fits in the device's free memory, but the allocator asks the
        // device for a whole segment (PyTorch's `get_allocation_size`), or with expandable
        // segments maps whole pages of the same sizes, which do not.
        let what = if expandable_segments {
            format!(
                "maps {} of pages of {} at a time (expandable segments map the small pool in \
                 2 MiB pages and the large pool in 20 MiB ones)",
                human_bytes(grain),
                human_bytes(expandable_page(f.requested))
            )
        } else {
            format!(
                "asks the device for a whole segment of {} (PyTorch's caching allocator serves \
                 requests up to 1 MiB from 2 MiB segments and those below 10 MiB from 20 MiB \
                 ones, and rounds larger ones up to 2 MiB)",
                human_bytes(grain)
            )
        };
        (
            DiagnosisKind::Exhaustion,
            format!(
                "exhaustion at the segment size: the {req} asked for would fit in the {} the \
                 device has free for this allocator, but the allocator {what}; no allocator \
                 setting makes that smaller: a smaller request or more free device memory do",
                human_bytes(room_on_device),
            ),
        )
    } else if free_for_allocator >= f.requested {
        // Enough memory in all, none of it in one piece: the free bytes of split segments
        // cannot go back to the device to join its free bytes.
        let cure = if expandable_segments {
            "even with expandable segments the free pages are scattered between live blocks"
        } else {
            "expandable_segments:True would let the pieces be used together"
        };
        (
            DiagnosisKind::Fragmentation,
            format!(
                "fragmentation: {} is free in all, more than the {req} asked for, but in \
                 pieces: {} reserved but free (largest block {}, {} stranded in split segments \
                 that cannot be given back) and {} free on the device; {cure}",
                human_bytes(free_for_allocator),
                human_bytes(free_in_reserved),
                human_bytes(f.largest_free_block),
                human_bytes(f.stranded_in_split_segments),
                human_bytes(f.device_free)
            ),
        )
    } else {
        // Without a device size or a limit, the capacity is what the allocator could reach.
        let (verb, memory) = if f.capacity_known() {
            (
                "may use",
                format!(
                    "{} reserved, {} free on the device",
                    human_bytes(f.reserved),
                    human_bytes(f.device_free)
                ),
            )
        } else {
            (
                "could reach",
                format!(
                    "{} reserved and {} free on the device; the file does not record the \
                     device's size",
                    human_bytes(f.reserved),
                    human_bytes(f.device_free)
                ),
            )
        };
        // No setting makes room (replay and summary give the device that would).
        (
            DiagnosisKind::Exhaustion,
            format!(
                "exhaustion: live allocations hold {} of the {} this allocator {verb} \
                 ({memory}), so the {req} asked for does not fit; no allocator setting makes \
                 room: smaller batches, activation checkpointing or a larger device do",
                human_bytes(f.allocated),
                human_bytes(capacity),
            ),
        )
    };
    // Fragmentation of a nearly full device: curing it buys one request, not room to grow.
    let filled = f.allocated.saturating_add(f.requested) as f64 / capacity.max(1) as f64;
    if kind == DiagnosisKind::Fragmentation && filled >= NEAR_FULL_SHARE {
        explanation.push_str(&format!(
            "; but live allocations and this request would fill {:.0}% of the {} it may use, \
             so little room is left even without fragmentation: smaller batches or activation \
             checkpointing make room where a setting cannot",
            filled * 100.0,
            human_bytes(capacity)
        ));
    }
    Diagnosis {
        kind,
        explanation,
        requested: f.requested,
        largest_free_block: f.largest_free_block,
        free_in_reserved,
        stranded_in_split_segments: f.stranded_in_split_segments,
        outside_allocator: outside,
        allocated: f.allocated,
        reserved: f.reserved,
        capacity,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocview_alloc::snapshot::{BlockInfo, SegmentType, TraceAction};

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn facts() -> OomFacts {
        OomFacts {
            requested: 2 * GIB,
            device_total: 80 * GIB,
            device_free: GIB,
            allowed_max: None,
            allocated: 70 * GIB,
            reserved: 79 * GIB,
            largest_free_block: 512 * MIB,
            stranded_in_split_segments: 9 * GIB,
        }
    }

    #[test]
    fn without_a_device_size_the_reserved_and_free_bytes_are_what_the_allocator_could_reach() {
        // A PyTorch file: no device size, the OOM entry gives the device's free bytes.
        // 200 MiB free in segments and 300 MiB on the device: 500 MiB in all, in pieces.
        let f = OomFacts {
            requested: 400 * MIB,
            device_total: 0,
            device_free: 300 * MIB,
            allowed_max: None,
            allocated: 6 * GIB,
            reserved: 6 * GIB + 200 * MIB,
            largest_free_block: 100 * MIB,
            stranded_in_split_segments: 200 * MIB,
        };
        assert!(!f.capacity_known());
        assert_eq!(f.capacity(), 6 * GIB + 500 * MIB);
        assert_eq!(f.free_for_allocator(), 500 * MIB);
        assert_eq!(diagnose(&f).kind, DiagnosisKind::Fragmentation);
        // Less than the request in all: exhaustion, of what it could reach, never "of 0 B".
        let d = diagnose(&OomFacts {
            device_free: 100 * MIB,
            ..f
        });
        assert_eq!(d.kind, DiagnosisKind::Exhaustion);
        assert!(
            d.explanation
                .contains("of the 6.29 GiB this allocator could reach")
                && d.explanation.contains("does not record the device's size"),
            "{}",
            d.explanation
        );
        assert!(!d.explanation.contains(" 0 B"), "{}", d.explanation);
    }

    #[test]
    fn enough_free_reserved_bytes_but_no_large_block_is_fragmentation() {
        let d = diagnose(&facts());
        assert_eq!(d.kind, DiagnosisKind::Fragmentation);
        assert_eq!(d.free_in_reserved, 9 * GIB);
        assert!(d.explanation.contains("9.00 GiB"), "{}", d.explanation);
        assert!(d.explanation.contains("512 MiB"), "{}", d.explanation);
    }

    #[test]
    fn fragmentation_of_a_nearly_full_device_says_a_setting_leaves_no_room_to_grow() {
        // 14.2 GiB live and 1.11 GiB asked of 16 GiB (the demo's OOM): 96%.
        let full = OomFacts {
            requested: 1136 * MIB,
            device_total: 16 * GIB,
            device_free: 300 * MIB,
            allocated: 14 * GIB + 205 * MIB,
            reserved: 15 * GIB + 700 * MIB,
            largest_free_block: 600 * MIB,
            stranded_in_split_segments: 841 * MIB,
            ..facts()
        };
        let d = diagnose(&full);
        assert_eq!(d.kind, DiagnosisKind::Fragmentation);
        assert!(
            d.explanation
                .contains("would fill 96% of the 16.0 GiB it may use"),
            "{}",
            d.explanation
        );
        // Half full: fragmentation alone.
        let half = OomFacts {
            allocated: 6 * GIB,
            reserved: 14 * GIB,
            device_free: 2 * GIB,
            ..full
        };
        let d = diagnose(&half);
        assert_eq!(d.kind, DiagnosisKind::Fragmentation);
        assert!(!d.explanation.contains("would fill"), "{}", d.explanation);
    }

    #[test]
    fn fragmentation_under_expandable_segments_does_not_recommend_them_again() {
        let d = diagnose_under(&facts(), true);
        assert_eq!(d.kind, DiagnosisKind::Fragmentation);
        assert!(
            !d.explanation.contains("expandable_segments:True"),
            "{}",
            d.explanation
        );
        assert!(
            d.explanation.contains("even with expandable segments"),
            "{}",
            d.explanation
        );
    }

    #[test]
    fn live_allocations_filling_the_device_are_exhaustion() {
        let f = OomFacts {
            allocated: 78 * GIB + 512 * MIB,
            reserved: 79 * GIB,
            largest_free_block: 100 * MIB,
            ..facts()
        };
        let d = diagnose(&f);
        assert_eq!(d.kind, DiagnosisKind::Exhaustion);
        assert!(d.explanation.contains("78.5 GiB"), "{}", d.explanation);
    }

    #[test]
    fn room_in_all_but_split_between_stranded_blocks_and_the_device_is_fragmentation() {
        // The demo's OOM: 14.22 GiB live of 16 GiB leaves 1.78 GiB, more than the 1.11 GiB
        // asked for, but 0.84 GiB of it is stranded in split segments and the device has
        // only 0.94 GiB free.
        let f = OomFacts {
            requested: 1137 * MIB,
            device_total: 16 * GIB,
            device_free: 962 * MIB,
            allowed_max: None,
            allocated: 14561 * MIB,
            reserved: 15422 * MIB,
            largest_free_block: 300 * MIB,
            stranded_in_split_segments: 841 * MIB,
        };
        let d = diagnose(&f);
        assert_eq!(d.kind, DiagnosisKind::Fragmentation, "{}", d.explanation);
        // One sentence, words one space apart (a broken line continuation left runs of them).
        assert!(
            d.explanation.contains("but in pieces: ") && !d.explanation.contains("  "),
            "{}",
            d.explanation
        );
        assert!(
            d.explanation.contains("841 MiB stranded"),
            "{}",
            d.explanation
        );
        assert!(
            d.explanation.contains("expandable_segments:True"),
            "{}",
            d.explanation
        );
        // With 200 MiB more live, it no longer fits in all: exhaustion.
        let full = OomFacts {
            allocated: f.allocated + 700 * MIB,
            ..f
        };
        assert_eq!(diagnose(&full).kind, DiagnosisKind::Exhaustion);
    }

    #[test]
    fn a_request_that_fits_the_free_device_memory_but_its_segment_does_not_is_exhaustion() {
        // An 8 MiB request on a 10 MiB device with nothing reserved: PyTorch asks the device
        // for a 20 MiB segment, which does not fit. Not fragmentation ("in pieces"), and
        // expandable segments (20 MiB pages) are no cure.
        let f = OomFacts {
            requested: 8 * MIB,
            device_total: 10 * MIB,
            device_free: 10 * MIB,
            allowed_max: None,
            allocated: 0,
            reserved: 0,
            largest_free_block: 0,
            stranded_in_split_segments: 0,
        };
        let d = diagnose(&f);
        assert_eq!(d.kind, DiagnosisKind::Exhaustion, "{}", d.explanation);
        assert!(
            d.explanation.contains("segment of 20.0 MiB")
                && d.explanation.contains("10.0 MiB")
                && !d.explanation.contains("pieces")
                && !d.explanation.contains("expandable_segments:True"),
            "{}",
            d.explanation
        );
        // A request above 10 MiB: its segment is the request rounded up to 2 MiB.
        let d = diagnose(&OomFacts {
            requested: 11 * MIB,
            device_total: 12 * MIB,
            device_free: 11 * MIB + 512 * 1024,
            ..f
        });
        assert!(
            d.explanation.contains("segment of 12.0 MiB"),
            "{}",
            d.explanation
        );
        // With expandable segments: the 8 MiB maps a 20 MiB page, which does not fit either;
        // not "scattered pages".
        let d = diagnose_under(&f, true);
        assert_eq!(d.kind, DiagnosisKind::Exhaustion, "{}", d.explanation);
        assert!(
            d.explanation.contains("maps 20.0 MiB of pages of 20.0 MiB")
                && !d.explanation.contains("scattered"),
            "{}",
            d.explanation
        );
        // With room for the segment, it is not this.
        let d = diagnose(&OomFacts {
            device_total: 30 * MIB,
            device_free: 30 * MIB,
            ..f
        });
        assert!(!d.explanation.contains("segment size"), "{}", d.explanation);
    }

    #[test]
    fn low_device_free_with_little_reserved_is_memory_outside_the_allocator() {
        let f = OomFacts {
            allocated: 9 * GIB,
            reserved: 10 * GIB,
            largest_free_block: 100 * MIB,
            stranded_in_split_segments: 100 * MIB,
            ..facts()
        };
        let d = diagnose(&f);
        assert_eq!(d.kind, DiagnosisKind::OutsideAllocator);
        assert_eq!(d.outside_allocator, 69 * GIB);
        assert!(d.explanation.contains("69.0 GiB"), "{}", d.explanation);
    }

    #[test]
    fn facts_from_an_oom_entry_read_the_segments_at_that_point() {
        let seg = |blocks: Vec<(u64, BlockState)>| {
            let mut a = 0;
            let blocks = blocks
                .into_iter()
                .map(|(size, state)| {
                    a += size;
                    BlockInfo::new(a - size, size, size, state)
                })
                .collect();
            SegmentInfo::tiled(0, 0, SegmentType::Large, blocks)
        };
        let segs = [
            seg(vec![
                (10 * MIB, BlockState::ActiveAllocated),
                (6 * MIB, BlockState::Inactive),
                (4 * MIB, BlockState::ActiveAllocated),
            ]),
            seg(vec![(20 * MIB, BlockState::Inactive)]),
        ];
        let entry = TraceEntry::new(TraceAction::Oom, 3 * MIB, 64 * MIB, 0);
        let f = OomFacts::from_trace_entry(&entry, &segs, GIB);
        assert_eq!(f.allocated, 14 * MIB);
        assert_eq!(f.reserved, 40 * MIB);
        assert_eq!(f.largest_free_block, 20 * MIB);
        assert_eq!(f.stranded_in_split_segments, 6 * MIB);
        assert_eq!(f.device_free, 3 * MIB);
        assert_eq!(f.requested, 64 * MIB);
    }

    #[test]
    fn free_memory_cached_for_another_stream_is_fragmentation_and_says_so() {
        let f = OomFacts {
            requested: 400 * MIB,
            device_total: GIB,
            device_free: 224 * MIB,
            allowed_max: None,
            allocated: 2 * MIB,
            reserved: 800 * MIB,
            largest_free_block: 598 * MIB,
            stranded_in_split_segments: 798 * MIB,
        };
        let d = diagnose(&f);
        assert_eq!(d.kind, DiagnosisKind::Fragmentation);
        assert!(
            d.explanation.contains("another stream"),
            "{}",
            d.explanation
        );
        assert_eq!(d.free_in_reserved, 798 * MIB);
    }

    #[test]
    fn a_memory_fraction_is_the_capacity_the_diagnosis_measures_against() {
        let f = OomFacts {
            allowed_max: Some(40 * GIB),
            allocated: 39 * GIB,
            reserved: 39 * GIB + 512 * MIB,
            largest_free_block: 100 * MIB,
            device_free: 40 * GIB,
            ..facts()
        };
        let d = diagnose(&f);
        assert_eq!(d.kind, DiagnosisKind::Exhaustion);
        assert_eq!(d.capacity, 40 * GIB);
        assert!(
            d.explanation.contains("40.0 GiB this allocator may use"),
            "{}",
            d.explanation
        );
    }
}
