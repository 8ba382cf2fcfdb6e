//! The allocator's state at the first entry of a recorded trace.
//!
//! A trace rarely starts with the program: PyTorch keeps the last `max_entries` entries in a
//! ring, and recording often starts late. The snapshot's final segments and the trace together
//! say what existed when the trace began:
//!
//! - a segment that exists at the end but whose `segment_alloc` is not in the trace, or that the
//!   trace frees (`segment_free`) before creating it, existed at the start at its recorded
//!   address;
//! - a block the trace frees (`free_requested`, or a lone `free_completed`) without having
//!   allocated it, or that is active at the end without an `alloc` in the trace, was live at the
//!   start.
//!
//! Expandable segments (`expandable_segments:True`) are different: one reserved virtual range
//! grows by `segment_map` and shrinks by `segment_unmap`, and a snapshot reports each
//! contiguous mapped run of it as one segment with `is_expandable` (PyTorch's
//! `ExpandableSegment`; spec "Expandable segments"). A run's start need not be any mapping's
//! address (an unmap in the middle starts a new run), so those segments are undone as byte
//! ranges: the mapped ranges at the start are the final ones, less what the trace mapped, plus
//! what it unmapped, taken backwards from the last entry; each contiguous range left is one
//! initial segment.
//!
//! The layout of each initial segment follows from the allocator's invariants (forward from a
//! consistent guess, spec "Malloc" step 7 and "Free"): live blocks sit at their addresses; an
//! allocated block is the front of the free block it came from and a large-pool remainder of at
//! most 1 MiB stays inside it, so a gap of at most 1 MiB after a live block in a large segment
//! belongs to that block; any other gap is one free block (two free neighbours are always
//! merged). Block sizes come from the final snapshot where the block survives, else from the
//! rounded request.

use std::collections::BTreeMap;

use crate::addr_map::AddrSet;

use allocview_alloc::caching::PoolId;
use allocview_alloc::snapshot::{SegmentType, Snapshot, TraceAction, TraceEntry};

pub use allocview_alloc::caching::config::{MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE};
/// In the large pool a remainder must be strictly larger than this to be split off
/// (`kSmallSize`, reused by PyTorch's `should_split`).
pub const LARGE_SPLIT_MIN_REMAINDER: u64 = SMALL_SIZE;

/// One block of an initial segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitialBlock {
    /// Recorded address.
    pub address: u64,
    /// Block size in bytes.
    pub size: u64,
    /// The request it serves (equal to `size` for free blocks).
    pub requested: u64,
    /// Allocated at trace start (else free, cached).
    pub live: bool,
    /// Live, but its free was already requested before the trace began and completes inside
    /// it (a lone `free_completed`): active, waiting on another stream's work, and no longer
    /// counted as allocated (spec "Free": `allocated_*` drop at the request).
    pub pending_free: bool,
}

/// One segment that existed when the trace began, with its block layout then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialSegment {
    /// Recorded address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Recorded stream (the allocation stream of every block in it).
    pub stream: u64,
    /// Small or large pool.
    pub pool: SegmentType,
    /// The private pool the segment belongs to (a graph capture's, a `MemPool`'s), when the
    /// final snapshot names one (`segment_pool_id`); `None` for the default pools.
    pub private_pool: Option<PoolId>,
    /// Blocks in address order; they tile the segment.
    pub blocks: Vec<InitialBlock>,
}

/// The allocator's state at the first trace entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitialState {
    /// Segments in address order.
    pub segments: Vec<InitialSegment>,
    /// Facts that did not fit the model (a live block outside every segment, overlaps); each is
    /// one readable sentence. Empty for a consistent snapshot.
    pub warnings: Vec<String>,
}

/// Where a live-at-start block's size comes from.
#[derive(Debug, Clone, Copy)]
struct LiveBlock {
    /// Block size (exact when `exact`, else the rounded request).
    size: u64,
    requested: u64,
    stream: u64,
    /// The final snapshot gave the size.
    exact: bool,
    /// Its free was requested before the trace began ([`InitialBlock::pending_free`]).
    pending_free: bool,
}

impl LiveBlock {
    /// A block the trace frees without allocating it, so live at the start: its size is the
    /// request as `round` rounds it.
    fn freed_unallocated(e: &TraceEntry, round: &dyn Fn(u64) -> u64) -> LiveBlock {
        LiveBlock {
            size: round(e.size),
            requested: e.size,
            stream: e.stream,
            exact: false,
            pending_free: false,
        }
    }
}

/// PyTorch's default rounding: up to a multiple of [`MIN_BLOCK_SIZE`], at least one block.
pub fn round_to_min_block(size: u64) -> u64 {
    size.max(1)
        .div_ceil(MIN_BLOCK_SIZE)
        .saturating_mul(MIN_BLOCK_SIZE)
}

impl InitialState {
    /// Reconstructs the state at the first entry of `snapshot.device_traces[trace]` (device
    /// `device`'s segments). `round` maps a request to its block size as the recording's
    /// allocator rounded it ([`round_to_min_block`] for default settings).
    pub fn reconstruct(
        snapshot: &Snapshot,
        trace: usize,
        device: i32,
        round: &dyn Fn(u64) -> u64,
    ) -> InitialState {
        let entries: &[TraceEntry] = snapshot
            .device_traces
            .get(trace)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let mut warnings = Vec::new();

        // Forward pass: what the trace itself creates, and what it touches without creating.
        // Facts are gathered as (address, fact) lists and resolved once at the end
        // (`resolve`): for each address the first fact from the trace, unless the final
        // snapshot gives one, which then wins (its last).
        let sized = |n: usize| AddrSet::with_capacity_and_hasher(n, Default::default());
        let mut created_segments = sized(entries.len() / 16);
        let mut start_segments: Vec<(u64, SegmentFact)> = Vec::new();
        let mut allocated = sized(entries.len() / 4);
        let mut pending = sized(entries.len() / 16);
        let mut start_blocks: Vec<(u64, LiveBlock)> = Vec::new();
        for e in entries {
            match e.action {
                TraceAction::SegmentAlloc => {
                    created_segments.insert(e.addr);
                }
                TraceAction::SegmentFree if !created_segments.remove(&e.addr) => {
                    start_segments.push((e.addr, (e.size, e.stream, None)));
                }
                TraceAction::Alloc => {
                    allocated.insert(e.addr);
                }
                TraceAction::FreeRequested => {
                    pending.insert(e.addr);
                    if !allocated.remove(&e.addr) {
                        start_blocks.push((e.addr, LiveBlock::freed_unallocated(e, round)));
                    }
                }
                TraceAction::FreeCompleted
                    if !pending.remove(&e.addr) && !allocated.contains(&e.addr) =>
                {
                    // Freed before the trace began, completed inside it.
                    start_blocks.push((
                        e.addr,
                        LiveBlock {
                            pending_free: true,
                            ..LiveBlock::freed_unallocated(e, round)
                        },
                    ));
                }
                _ => {}
            }
        }

        // The final snapshot: segments and active blocks the trace did not create.
        let mut mapped = MappedRanges::default();
        let mut private_pools: BTreeMap<u64, PoolId> = BTreeMap::new();
        for seg in snapshot.segments.iter().filter(|s| s.device == device) {
            let mut addr = seg.address;
            for b in &seg.blocks {
                let b_addr = block_address(seg.address, addr, b.address, !b.history.is_empty());
                addr = b_addr.saturating_add(b.size);
                if b.state.is_active() && !allocated.contains(&b_addr) {
                    // Exact size from the end state (overrides a rounded guess).
                    start_blocks.push((
                        b_addr,
                        LiveBlock {
                            size: b.size,
                            requested: b.requested_size,
                            stream: seg.stream,
                            exact: true,
                            pending_free: false,
                        },
                    ));
                }
            }
            if seg.is_expandable {
                mapped.insert(
                    seg.address,
                    seg.total_size,
                    seg.stream,
                    Some(seg.segment_type),
                );
            } else if !created_segments.contains(&seg.address) {
                if let Some(pool) = seg.private_pool() {
                    private_pools.insert(seg.address, pool);
                }
                start_segments.push((
                    seg.address,
                    (seg.total_size, seg.stream, Some(seg.segment_type)),
                ));
            }
        }
        // Expandable segments: undo the trace's mappings, last first.
        for e in entries.iter().rev() {
            match e.action {
                TraceAction::SegmentMap => mapped.remove(e.addr, e.size),
                TraceAction::SegmentUnmap => mapped.insert(e.addr, e.size, e.stream, None),
                _ => {}
            }
        }
        start_segments.extend(mapped.runs());
        let start_segments = resolve(start_segments, |&(_, _, pool)| pool.is_some());
        let start_blocks = resolve(start_blocks, |b| b.exact);

        // Lay out each segment.
        let mut segments = Vec::with_capacity(start_segments.len());
        let mut used_blocks = vec![false; start_blocks.len()];
        for &(address, (size, stream, pool)) in &start_segments {
            let pool = pool.unwrap_or(if size == SMALL_BUFFER {
                SegmentType::Small
            } else {
                SegmentType::Large
            });
            let end = address.saturating_add(size);
            let first = start_blocks.partition_point(|&(a, _)| a < address);
            let last = start_blocks.partition_point(|&(a, _)| a < end);
            let inside = &start_blocks[first..last];
            let mut blocks = Vec::with_capacity(inside.len() * 2 + 1);
            let mut cursor = address;
            for (i, &(b_addr, live)) in inside.iter().enumerate() {
                used_blocks[first + i] = true;
                if b_addr < cursor {
                    warnings.push(format!(
                        "block {b_addr:#x} overlaps the block before it in segment {address:#x}; \
                         it is left out of the initial state"
                    ));
                    continue;
                }
                if b_addr > cursor {
                    blocks.push(free_block(cursor, b_addr - cursor));
                }
                let next = inside.get(i + 1).map_or(end, |&(a, _)| a).min(end);
                let mut b_size = live.size.min(end - b_addr);
                let gap = next.saturating_sub(b_addr + b_size);
                if !live.exact
                    && pool == SegmentType::Large
                    && gap > 0
                    && gap <= LARGE_SPLIT_MIN_REMAINDER
                {
                    // An unsplit remainder stays inside the allocated block.
                    b_size += gap;
                }
                if live.stream != stream {
                    warnings.push(format!(
                        "block {b_addr:#x} was freed on stream {} but its segment {address:#x} \
                         belongs to stream {stream}",
                        live.stream
                    ));
                }
                blocks.push(InitialBlock {
                    address: b_addr,
                    size: b_size,
                    requested: live.requested,
                    live: true,
                    pending_free: live.pending_free,
                });
                cursor = b_addr + b_size;
            }
            if cursor < end {
                blocks.push(free_block(cursor, end - cursor));
            }
            segments.push(InitialSegment {
                address,
                size,
                stream,
                pool,
                private_pool: private_pools.get(&address).copied(),
                blocks,
            });
        }
        for (&(a, _), _) in start_blocks
            .iter()
            .zip(&used_blocks)
            .filter(|&(_, &used)| !used)
        {
            warnings.push(format!(
                "block {a:#x} was live when the trace began but lies in no known segment; \
                 it is left out of the initial state"
            ));
        }
        InitialState { segments, warnings }
    }

    /// Bytes reserved at trace start.
    pub fn reserved(&self) -> u64 {
        self.segments
            .iter()
            .fold(0u64, |t, s| t.saturating_add(s.size))
    }

    /// Bytes allocated at trace start (live blocks whose free was not yet requested).
    pub fn allocated(&self) -> u64 {
        self.live_blocks()
            .filter(|b| !b.pending_free)
            .fold(0u64, |t, b| t.saturating_add(b.size))
    }

    /// Bytes active at trace start: every live block, pending frees included.
    pub fn active(&self) -> u64 {
        self.live_blocks()
            .fold(0u64, |t, b| t.saturating_add(b.size))
    }

    /// Every live block.
    pub fn live_blocks(&self) -> impl Iterator<Item = &InitialBlock> {
        self.segments
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.live)
    }
}

/// What is known of a segment at trace start: size, stream, and the pool when the final
/// snapshot names it.
type SegmentFact = (u64, u64, Option<SegmentType>);

/// Resolves `(address, fact)` pairs, gathered trace facts first and snapshot facts after, to
/// one fact per address in address order: the last snapshot fact (`from_snapshot`) if there
/// is one, else the first trace fact. (A map filled with `entry().or_insert` for the trace and
/// `insert` for the snapshot gives the same; sorting once is cheaper than a tree insert per
/// fact.)
fn resolve<T: Copy>(mut facts: Vec<(u64, T)>, from_snapshot: impl Fn(&T) -> bool) -> Vec<(u64, T)> {
    // Stable: facts of one address keep their gathering order.
    facts.sort_by_key(|&(a, _)| a);
    let mut out: Vec<(u64, T)> = Vec::with_capacity(facts.len());
    for group in facts.chunk_by(|x, y| x.0 == y.0) {
        let last = group[group.len() - 1];
        out.push(if from_snapshot(&last.1) {
            last
        } else {
            group[0]
        });
    }
    out
}

/// Mapped byte ranges of expandable segments: start -> (end, stream, pool where known).
/// Ranges never overlap; touching ones stay apart until [`runs`](Self::runs) joins them.
#[derive(Debug, Default)]
struct MappedRanges {
    ranges: BTreeMap<u64, (u64, u64, Option<SegmentType>)>,
}

impl MappedRanges {
    /// Marks `[addr, addr + size)` mapped (whatever part of it already was stays as it is).
    fn insert(&mut self, addr: u64, size: u64, stream: u64, pool: Option<SegmentType>) {
        let end = addr.saturating_add(size);
        self.remove(addr, size);
        if end > addr {
            self.ranges.insert(addr, (end, stream, pool));
        }
    }

    /// Marks `[addr, addr + size)` unmapped, cutting the ranges that overlap it.
    fn remove(&mut self, addr: u64, size: u64) {
        let end = addr.saturating_add(size);
        if end <= addr {
            return;
        }
        // The overlapping ranges start before `end` and end after `addr`: take them from the
        // last one down (the pieces left outside `[addr, end)` no longer overlap it).
        while let Some((&s, &(e, stream, pool))) = self.ranges.range(..end).next_back()
            && e > addr
        {
            self.ranges.remove(&s);
            if s < addr {
                self.ranges.insert(s, (addr, stream, pool));
            }
            if e > end {
                self.ranges.insert(end, (e, stream, pool));
            }
        }
    }

    /// Each contiguous mapped run as a segment fact: address, size, stream, and the pool where
    /// a final segment named it.
    fn runs(&self) -> Vec<(u64, SegmentFact)> {
        let mut out: Vec<(u64, SegmentFact)> = Vec::new();
        let mut last_end = None;
        for (&s, &(e, stream, pool)) in &self.ranges {
            if last_end == Some(s)
                && let Some((start, (size, _, known))) = out.last_mut()
            {
                *size = e - *start;
                *known = known.or(pool);
            } else {
                out.push((s, (e - s, stream, pool)));
            }
            last_end = Some(e);
        }
        out
    }
}

fn free_block(address: u64, size: u64) -> InitialBlock {
    InitialBlock {
        address,
        size,
        requested: size,
        live: false,
        pending_free: false,
    }
}

/// A block's address: the recorded one, or (legacy 2.0 files, which record none) the running
/// offset in its segment's tiling.
fn block_address(segment: u64, tiled: u64, recorded: u64, legacy: bool) -> u64 {
    if legacy || (recorded == 0 && segment != 0) {
        tiled
    } else {
        recorded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocview_alloc::snapshot::{BlockInfo, BlockState, SegmentInfo};

    const MIB: u64 = 1 << 20;

    fn entry(action: TraceAction, addr: u64, size: u64) -> TraceEntry {
        TraceEntry::new(action, addr, size, 0)
    }

    fn segment(address: u64, blocks: &[(u64, BlockState)]) -> SegmentInfo {
        let mut a = address;
        let blocks: Vec<BlockInfo> = blocks
            .iter()
            .map(|&(size, state)| {
                a += size;
                BlockInfo::new(a - size, size, size, state)
            })
            .collect();
        let kind = if a - address == SMALL_BUFFER {
            SegmentType::Small
        } else {
            SegmentType::Large
        };
        SegmentInfo::tiled(address, 0, kind, blocks)
    }

    #[test]
    fn segments_not_created_in_the_trace_existed_at_the_start() {
        let base = 0x1000_0000;
        let snap = Snapshot {
            segments: vec![segment(base, &[(20 * MIB, BlockState::Inactive)])],
            device_traces: vec![vec![
                entry(TraceAction::SegmentFree, 0x9000_0000, SMALL_BUFFER),
                entry(TraceAction::SegmentAlloc, 0x5000_0000, 20 * MIB),
                entry(TraceAction::Alloc, 0x5000_0000, 20 * MIB),
            ]],
            ..Snapshot::default()
        };
        let s = InitialState::reconstruct(&snap, 0, 0, &round_to_min_block);
        let addrs: Vec<_> = s.segments.iter().map(|s| (s.address, s.pool)).collect();
        assert_eq!(
            addrs,
            vec![
                (base, SegmentType::Large),
                (0x9000_0000, SegmentType::Small)
            ]
        );
        assert!(s.warnings.is_empty());
        assert_eq!(s.allocated(), 0);
    }

    #[test]
    fn blocks_freed_without_an_alloc_were_live_and_absorb_a_small_large_pool_remainder() {
        let base = 0x1000_0000;
        // End: one free 20 MiB segment. The trace frees a 19.5 MiB request at its start: the
        // remaining 0.5 MiB cannot have been split off, so the block was the whole segment.
        let snap = Snapshot {
            segments: vec![segment(base, &[(20 * MIB, BlockState::Inactive)])],
            device_traces: vec![vec![
                entry(TraceAction::FreeRequested, base, 19 * MIB + MIB / 2),
                entry(TraceAction::FreeCompleted, base, 19 * MIB + MIB / 2),
            ]],
            ..Snapshot::default()
        };
        let s = InitialState::reconstruct(&snap, 0, 0, &round_to_min_block);
        assert_eq!(s.segments[0].blocks.len(), 1);
        assert_eq!(s.segments[0].blocks[0].size, 20 * MIB);
        assert!(s.segments[0].blocks[0].live);
    }

    #[test]
    fn a_lone_free_completed_marks_a_block_whose_free_was_requested_before_the_trace() {
        let base = 0x1000_0000;
        let snap = Snapshot {
            segments: vec![segment(base, &[(20 * MIB, BlockState::Inactive)])],
            device_traces: vec![vec![
                entry(TraceAction::FreeCompleted, base, 8 * MIB),
                entry(TraceAction::FreeRequested, base + 8 * MIB, 4 * MIB),
                entry(TraceAction::FreeCompleted, base + 8 * MIB, 4 * MIB),
            ]],
            ..Snapshot::default()
        };
        let s = InitialState::reconstruct(&snap, 0, 0, &round_to_min_block);
        let layout: Vec<_> = s.segments[0]
            .blocks
            .iter()
            .map(|b| (b.address - base, b.size, b.live, b.pending_free))
            .collect();
        assert_eq!(
            layout,
            vec![
                (0, 8 * MIB, true, true),
                (8 * MIB, 4 * MIB, true, false),
                (12 * MIB, 8 * MIB, false, false),
            ]
        );
        // Only the block whose free the trace requests was still allocated at its start.
        assert_eq!(s.allocated(), 4 * MIB);
        assert_eq!(s.active(), 12 * MIB);
    }

    #[test]
    fn active_blocks_at_the_end_never_allocated_in_the_trace_were_live_with_free_gaps_between() {
        let base = 0x1000_0000;
        let snap = Snapshot {
            segments: vec![segment(
                base,
                &[
                    (4 * MIB, BlockState::ActiveAllocated),
                    (6 * MIB, BlockState::Inactive),
                    (4 * MIB, BlockState::ActiveAllocated),
                    (6 * MIB, BlockState::Inactive),
                ],
            )],
            device_traces: vec![vec![
                entry(TraceAction::Alloc, base + 14 * MIB, 2 * MIB),
                entry(TraceAction::FreeRequested, base + 14 * MIB, 2 * MIB),
                entry(TraceAction::FreeCompleted, base + 14 * MIB, 2 * MIB),
                entry(TraceAction::FreeRequested, base + 4 * MIB, 3 * MIB),
                entry(TraceAction::FreeCompleted, base + 4 * MIB, 3 * MIB),
            ]],
            ..Snapshot::default()
        };
        let s = InitialState::reconstruct(&snap, 0, 0, &round_to_min_block);
        let layout: Vec<_> = s.segments[0]
            .blocks
            .iter()
            .map(|b| (b.address - base, b.size, b.live))
            .collect();
        assert_eq!(
            layout,
            vec![
                (0, 4 * MIB, true),
                (4 * MIB, 3 * MIB, true),
                (7 * MIB, 3 * MIB, false),
                (10 * MIB, 4 * MIB, true),
                (14 * MIB, 6 * MIB, false),
            ]
        );
        assert_eq!(s.allocated(), 11 * MIB);
        assert_eq!(s.reserved(), 20 * MIB);
    }

    #[test]
    fn a_live_block_outside_every_segment_is_reported() {
        let snap = Snapshot {
            device_traces: vec![vec![entry(TraceAction::FreeRequested, 0x42_0000, 512)]],
            ..Snapshot::default()
        };
        let s = InitialState::reconstruct(&snap, 0, 0, &round_to_min_block);
        assert!(s.segments.is_empty());
        assert_eq!(s.warnings.len(), 1);
        assert!(s.warnings[0].contains("0x420000"));
    }
}
