//! The snapshot data model: segments, blocks and trace entries, mapped one to one onto the
//! dictionary that PyTorch's `torch.cuda.memory._snapshot()` returns (and `_dump_snapshot()`
//! pickles).
//!
//! [`CachingAllocator::snapshot`](crate::caching::CachingAllocator::snapshot) produces it; the
//! agent reads it from and writes it to files (PyTorch's pickle and allocview's JSON). Every
//! format version PyTorch has written maps onto this one model:
//!
//! | PyTorch | what differs | how it lands here |
//! |---|---|---|
//! | newest | trace entries carry `compile_context`, `user_metadata` | [`TraceEntry::compile_context`], [`TraceEntry::user_metadata`] |
//! | 2.2 - 2.6 | `allocator_settings`, `external_annotations`, `time_us` | [`Snapshot::allocator_settings`], [`Snapshot::external_annotations`] |
//! | 2.1 | no `time_us` | [`TraceEntry::time_us`] is `None` |
//! | 2.0 | blocks have `history` instead of `address`/`frames` | [`BlockInfo::history`]; the address is derived from the segment's tiling |
//! | bare list | segments only | empty [`Snapshot::device_traces`] |
//!
//! Stack frames are shared: a real trace repeats the same frame list thousands of times, so
//! [`Frames`] is an `Arc<[Frame]>` and readers hand out clones of one allocation.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One stack frame, innermost first in a [`Frames`] list. Unsymbolised C++ frames have the
/// filename `"??"` and line 0, as PyTorch writes them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    /// Function name.
    pub name: String,
    /// Source file, `"??"` when unknown.
    pub filename: String,
    /// Line number, 0 when unknown.
    pub line: i64,
}

impl Frame {
    /// The frame of `name` at `filename:line`.
    pub fn new(name: impl Into<String>, filename: impl Into<String>, line: i64) -> Frame {
        Frame {
            name: name.into(),
            filename: filename.into(),
            line,
        }
    }
}

/// A shared list of stack frames (or any context a user callback supplied, such as a
/// `step 41 forward` tag written as a single frame). Cloning is a reference-count bump.
pub type Frames = Arc<[Frame]>;

/// An empty frame list.
pub fn no_frames() -> Frames {
    Arc::from(Vec::new())
}

/// Which pool a segment belongs to, by the size class of the requests it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentType {
    /// Requests of at most 1 MiB (after rounding), served from 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

impl SegmentType {
    /// The name PyTorch uses (`"small"` / `"large"`).
    pub fn as_str(self) -> &'static str {
        match self {
            SegmentType::Small => "small",
            SegmentType::Large => "large",
        }
    }
}

/// The state of one block inside a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out to the program.
    ActiveAllocated,
    /// Freed by the program but still in use by another stream (`record_stream`); becomes
    /// free when the recorded events complete. Older PyTorch calls it `active_awaiting_free`.
    ActivePendingFree,
    /// Free, cached in the allocator.
    Inactive,
}

impl BlockState {
    /// The name PyTorch writes.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }

    /// Parses PyTorch's names, accepting the older `active_awaiting_free`.
    pub fn parse(s: &str) -> Option<BlockState> {
        match s {
            "active_allocated" => Some(BlockState::ActiveAllocated),
            "active_pending_free" | "active_awaiting_free" => Some(BlockState::ActivePendingFree),
            "inactive" => Some(BlockState::Inactive),
            _ => None,
        }
    }

    /// Whether the block counts as active (allocated or pending free).
    pub fn is_active(self) -> bool {
        !matches!(self, BlockState::Inactive)
    }
}

/// One entry of a legacy (PyTorch 2.0) block history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockHistory {
    /// Address of the allocation.
    pub addr: u64,
    /// Requested size of the allocation.
    pub real_size: u64,
    /// Where it was allocated.
    pub frames: Frames,
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockInfo {
    /// Device address of the block's first byte.
    pub address: u64,
    /// Size of the block in bytes (a multiple of 512).
    pub size: u64,
    /// Size the program asked for; `size - requested_size` is rounding waste. For a free block
    /// PyTorch reports the size of the last request it served (or the block size).
    pub requested_size: u64,
    /// Allocated, pending free, or free.
    pub state: BlockState,
    /// Where the block was allocated (empty when not recorded).
    pub frames: Frames,
    /// Legacy (2.0) history, oldest first; empty for newer files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<BlockHistory>,
}

impl BlockInfo {
    /// A block without frames or history.
    pub fn new(address: u64, size: u64, requested_size: u64, state: BlockState) -> BlockInfo {
        BlockInfo {
            address,
            size,
            requested_size,
            state,
            frames: no_frames(),
            history: Vec::new(),
        }
    }
}

/// One segment: a device allocation (or, for expandable segments, one contiguous mapped
/// range) tiled by its blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentInfo {
    /// Device index.
    pub device: i32,
    /// Device address of the segment.
    pub address: u64,
    /// Size of the segment in bytes.
    pub total_size: u64,
    /// Sum of the sizes of allocated blocks.
    pub allocated_size: u64,
    /// Sum of the sizes of active blocks (allocated or pending free).
    pub active_size: u64,
    /// Sum of the requested sizes of allocated blocks.
    pub requested_size: u64,
    /// The stream the segment was allocated for (PyTorch writes the stream handle as an int; 0 is
    /// the default stream).
    pub stream: u64,
    /// Small or large pool.
    pub segment_type: SegmentType,
    /// Private pool id, `(0, 0)` for the default pools.
    pub segment_pool_id: (u64, u64),
    /// Part of an expandable segment.
    pub is_expandable: bool,
    /// Where the segment was allocated (empty when not recorded).
    pub frames: Frames,
    /// The blocks, in address order; they tile the segment.
    pub blocks: Vec<BlockInfo>,
}

/// A segment's `(allocated_size, active_size, requested_size)` from its blocks, as PyTorch
/// computes them: allocated blocks' sizes, active blocks' sizes, allocated blocks' requested
/// sizes.
pub fn segment_sums(blocks: &[BlockInfo]) -> (u64, u64, u64) {
    let mut allocated = 0u64;
    let mut active = 0u64;
    let mut requested = 0u64;
    for b in blocks {
        if b.state == BlockState::ActiveAllocated {
            allocated = allocated.saturating_add(b.size);
            requested = requested.saturating_add(b.requested_size);
        }
        if b.state.is_active() {
            active = active.saturating_add(b.size);
        }
    }
    (allocated, active, requested)
}

impl SegmentInfo {
    /// The private pool the segment belongs to (a graph capture's, a `MemPool`'s), `None` for
    /// the default pools (`segment_pool_id` `(0, 0)`).
    pub fn private_pool(&self) -> Option<crate::caching::PoolId> {
        let (a, b) = self.segment_pool_id;
        ((a, b) != (0, 0)).then_some(crate::caching::PoolId(a, b))
    }

    /// A segment of device 0, in no private pool and not expandable, tiled by `blocks` (in
    /// address order): its size and its allocated, active and requested totals follow from
    /// them. The way tools and tests build one by hand.
    pub fn tiled(
        address: u64,
        stream: u64,
        segment_type: SegmentType,
        blocks: Vec<BlockInfo>,
    ) -> SegmentInfo {
        let (allocated_size, active_size, requested_size) = segment_sums(&blocks);
        SegmentInfo {
            device: 0,
            address,
            total_size: blocks.iter().map(|b| b.size).sum(),
            allocated_size,
            active_size,
            requested_size,
            stream,
            segment_type,
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: no_frames(),
            blocks,
        }
    }
}

/// What a trace entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceAction {
    /// A block was handed out; size is the unrounded request.
    Alloc,
    /// The program freed a block (it may still be in use by other streams).
    FreeRequested,
    /// The block went back to the free set.
    FreeCompleted,
    /// A new segment was allocated from the device.
    SegmentAlloc,
    /// A segment was returned to the device.
    SegmentFree,
    /// Pages were mapped into an expandable segment.
    SegmentMap,
    /// Pages were unmapped from an expandable segment.
    SegmentUnmap,
    /// A snapshot was taken.
    Snapshot,
    /// An allocation failed; the address field holds the device's free memory.
    Oom,
    /// A user's annotation.
    UserDefined,
}

impl TraceAction {
    /// Every action, in the order PyTorch's enum declares them.
    pub const ALL: [TraceAction; 10] = [
        TraceAction::Alloc,
        TraceAction::FreeRequested,
        TraceAction::FreeCompleted,
        TraceAction::SegmentAlloc,
        TraceAction::SegmentFree,
        TraceAction::SegmentMap,
        TraceAction::SegmentUnmap,
        TraceAction::Snapshot,
        TraceAction::Oom,
        TraceAction::UserDefined,
    ];

    /// The name PyTorch writes.
    pub fn as_str(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Snapshot => "snapshot",
            TraceAction::Oom => "oom",
            TraceAction::UserDefined => "user_defined",
        }
    }

    /// Parses PyTorch's names.
    pub fn parse(s: &str) -> Option<TraceAction> {
        TraceAction::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

impl fmt::Display for TraceAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry of a device's allocation trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// Address of the block or segment; for [`TraceAction::Oom`], the device's free bytes.
    pub addr: u64,
    /// Size in bytes (for `alloc`, the unrounded request; for `oom`, the rounded request).
    pub size: u64,
    /// Stream the operation was on.
    pub stream: u64,
    /// Wall-clock time in microseconds since the Unix epoch (absent in PyTorch 2.1 files).
    pub time_us: Option<i64>,
    /// Where it happened (empty when not recorded).
    pub frames: Frames,
    /// torch.compile context (newest PyTorch files).
    pub compile_context: Option<String>,
    /// User metadata (newest PyTorch files).
    pub user_metadata: Option<String>,
}

impl TraceEntry {
    /// An entry with the four fields every trace has; `time_us`, `compile_context` and
    /// `user_metadata` are `None` and `frames` is empty (as for a trace recorded without
    /// timestamps or stacks). Set the others with struct update syntax where needed.
    ///
    /// ```
    /// use allocview_alloc::snapshot::{TraceAction, TraceEntry};
    ///
    /// let e = TraceEntry::new(TraceAction::Alloc, 0x1000, 512, 0);
    /// assert_eq!((e.action, e.addr, e.size, e.stream), (TraceAction::Alloc, 0x1000, 512, 0));
    /// assert!(e.time_us.is_none() && e.frames.is_empty());
    ///
    /// let timed = TraceEntry { time_us: Some(7), ..TraceEntry::new(TraceAction::FreeRequested, 0x1000, 512, 0) };
    /// assert_eq!(timed.time_us, Some(7));
    /// ```
    pub fn new(action: TraceAction, addr: u64, size: u64, stream: u64) -> TraceEntry {
        TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us: None,
            frames: no_frames(),
            compile_context: None,
            user_metadata: None,
        }
    }
}

/// A loosely typed value, for the parts of a snapshot whose shape PyTorch changes between
/// versions (`allocator_settings`, `external_annotations`). Dict keys keep their order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Value {
    /// Python `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An integer that fits in 64 bits.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A list.
    List(Vec<Value>),
    /// A tuple.
    Tuple(Vec<Value>),
    /// A dict, in insertion order.
    Dict(Vec<(Value, Value)>),
}

/// Facts allocview records beside PyTorch's fields (absent from PyTorch's files).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceMeta {
    /// Device index.
    pub device: i32,
    /// Total device memory in bytes, when known.
    pub total_memory: Option<u64>,
    /// Trace entries overwritten because the history ring was full.
    pub trace_overflow: u64,
    /// The OOM this snapshot was taken at, in an agent's OOM dump: its facts are here even when
    /// the allocator recorded no trace (history off), which would otherwise hold them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<DumpedOom>,
}

/// The OOM an agent's OOM dump was taken at: the failed request and the allocator's figures at
/// that moment (allocview's own fact, kept beside PyTorch's fields).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpedOom {
    /// The OOM's number in the process: 1 for the first.
    pub index: u64,
    /// When the allocation failed, microseconds since the Unix epoch (as trace entries).
    pub time_us: i64,
    /// Stream of the failed request.
    pub stream: u64,
    /// Bytes the program asked for.
    pub requested: u64,
    /// The request after the allocator's rounding.
    pub rounded: u64,
    /// Free device memory the allocator saw.
    pub device_free: u64,
    /// Bytes in allocated blocks at the OOM.
    pub allocated: u64,
    /// Bytes reserved from the device at the OOM.
    pub reserved: u64,
    /// The largest free cached block at the OOM.
    pub largest_free_block: u64,
    /// Free bytes in segments that also hold allocated blocks (`inactive_split_bytes`).
    pub inactive_split_bytes: u64,
    /// The OOM's event was lost on its way to the agent (a full channel): the request, its
    /// stream and the device's free memory are not known (0), and the other figures are from
    /// the resynchronisation after it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub event_lost: bool,
}

/// A whole snapshot: what `torch.cuda.memory._snapshot()` returns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Segments of every device, sorted by address.
    pub segments: Vec<SegmentInfo>,
    /// One trace per device, oldest entry first.
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// `allocator_settings` as written (PyTorch 2.2 and newer), keys in file order.
    pub allocator_settings: Option<Vec<(String, Value)>>,
    /// `external_annotations` (PyTorch 2.2 and newer).
    pub external_annotations: Option<Vec<Value>>,
    /// allocview's own facts per device; empty for PyTorch's files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceMeta>,
}
