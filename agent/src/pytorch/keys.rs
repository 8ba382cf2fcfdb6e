//! The dictionary keys of PyTorch's snapshot format (and allocview's one extra key), named
//! once.

/// Top level: the segment list.
pub const SEGMENTS: &str = "segments";
/// Top level: one trace per device.
pub const DEVICE_TRACES: &str = "device_traces";
/// Top level: the allocator's settings (PyTorch 2.2 and newer).
pub const ALLOCATOR_SETTINGS: &str = "allocator_settings";
/// Top level: user annotations (PyTorch 2.2 and newer).
pub const EXTERNAL_ANNOTATIONS: &str = "external_annotations";
/// Top level: allocview's own facts (PyTorch's viewers ignore unknown keys).
pub const ALLOCVIEW: &str = "allocview";
/// In [`ALLOCVIEW`]: per-device metadata.
pub const DEVICES: &str = "devices";
/// Device metadata: total device memory.
pub const TOTAL_MEMORY: &str = "total_memory";
/// Device metadata: trace entries lost to the ring.
pub const TRACE_OVERFLOW: &str = "trace_overflow";
/// Device metadata: the OOM an agent's dump was taken at (a dict of the keys below, with
/// [`TIME_US`], [`STREAM`] and [`DEVICE_FREE`]).
pub const OOM: &str = "oom";
/// Dumped OOM: its number in the process.
pub const OOM_INDEX: &str = "index";
/// Dumped OOM: bytes asked for.
pub const REQUESTED: &str = "requested";
/// Dumped OOM: the rounded request.
pub const ROUNDED: &str = "rounded";
/// Dumped OOM: bytes in allocated blocks.
pub const ALLOCATED: &str = "allocated";
/// Dumped OOM: bytes reserved.
pub const RESERVED: &str = "reserved";
/// Dumped OOM: the largest free cached block.
pub const LARGEST_FREE_BLOCK: &str = "largest_free_block";
/// Dumped OOM: free bytes in split segments.
pub const INACTIVE_SPLIT_BYTES: &str = "inactive_split_bytes";
/// Dumped OOM: its event was lost (present only when true).
pub const EVENT_LOST: &str = "event_lost";

/// Segment: device index.
pub const DEVICE: &str = "device";
/// Segment or block: address.
pub const ADDRESS: &str = "address";
/// Segment: size.
pub const TOTAL_SIZE: &str = "total_size";
/// Segment: bytes in allocated blocks.
pub const ALLOCATED_SIZE: &str = "allocated_size";
/// Segment: bytes in active blocks.
pub const ACTIVE_SIZE: &str = "active_size";
/// Segment or block: requested bytes.
pub const REQUESTED_SIZE: &str = "requested_size";
/// Segment or trace entry: stream.
pub const STREAM: &str = "stream";
/// Segment: `small` or `large`.
pub const SEGMENT_TYPE: &str = "segment_type";
/// Segment: private pool id.
pub const SEGMENT_POOL_ID: &str = "segment_pool_id";
/// Segment: part of an expandable segment.
pub const IS_EXPANDABLE: &str = "is_expandable";
/// Segment, block, history entry or trace entry: stack frames.
pub const FRAMES: &str = "frames";
/// Segment: blocks.
pub const BLOCKS: &str = "blocks";

/// Block or trace entry: size.
pub const SIZE: &str = "size";
/// Block: state.
pub const STATE: &str = "state";
/// Legacy block: history.
pub const HISTORY: &str = "history";
/// History or trace entry: address.
pub const ADDR: &str = "addr";
/// History entry: requested size.
pub const REAL_SIZE: &str = "real_size";

/// Trace entry: action.
pub const ACTION: &str = "action";
/// OOM trace entry: the device's free bytes (instead of `addr`).
pub const DEVICE_FREE: &str = "device_free";
/// Trace entry: time in microseconds since the epoch.
pub const TIME_US: &str = "time_us";
/// Trace entry: torch.compile context.
pub const COMPILE_CONTEXT: &str = "compile_context";
/// Trace entry: user metadata.
pub const USER_METADATA: &str = "user_metadata";

/// Frame: function name.
pub const NAME: &str = "name";
/// Frame: file name.
pub const FILENAME: &str = "filename";
/// Frame: line.
pub const LINE: &str = "line";
