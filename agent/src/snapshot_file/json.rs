//! allocview's own snapshot format: versioned JSON, defined here and only here (documented in
//! `docs/snapshot-format.md`).
//!
//! ```json
//! {"format": "allocview-snapshot", "version": 1,
//!  "frames": [[{"name": "forward", "filename": "model.py", "line": 54}, ...], ...],
//!  "segments": [{"device": 0, "address": 139777059848192, ..., "frames": 0,
//!                "blocks": [{"address": ..., "size": ..., "requested_size": ...,
//!                            "state": "active_allocated", "frames": 3}]}],
//!  "device_traces": [[{"action": "alloc", "addr": ..., "size": ..., "stream": 0,
//!                      "time_us": ..., "frames": 3}]],
//!  "allocator_settings": [["max_split_size", {"Int": -1}], ...],
//!  "external_annotations": [],
//!  "devices": [{"device": 0, "total_memory": 85899345920, "trace_overflow": 0,
//!               "oom": {"index": 1, "requested": ..., ...}}]}
//! ```
//!
//! `devices[].oom` is in an agent's OOM dumps only: the agent's record of the OOM
//! ([`DumpedOom`](allocview_alloc::snapshot::DumpedOom)), there even when the trace is empty.
//!
//! Frame lists are written once in the `frames` table and referred to by index (absent when
//! empty), so a trace that repeats one stack thousands of times stays small, and reading it
//! back gives one shared [`Frames`] per table entry. Everything else maps one to one onto the
//! model. Readers accept any `version` up to [`VERSION`] and refuse newer ones.

use std::collections::HashMap;
use std::sync::Arc;

use allocview_alloc::snapshot::{
    BlockHistory, BlockInfo, BlockState, DeviceMeta, Frame, Frames, SegmentInfo, SegmentType,
    Snapshot, TraceAction, TraceEntry, Value, no_frames,
};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The `format` field of every allocview snapshot file.
pub const FORMAT: &str = "allocview-snapshot";

/// The version this code writes, and the newest it reads.
pub const VERSION: u32 = 1;

/// A JSON file that is not a snapshot this version of allocview reads.
#[derive(Debug, Error)]
pub enum JsonFormatError {
    /// Not JSON, or JSON of the wrong shape; `path` is where (`segments[3].blocks[7].size`).
    #[error("{path}: {message}")]
    Syntax {
        /// Where in the document.
        path: String,
        /// serde_json's message (with line and column).
        message: String,
    },
    /// JSON without `"format": "allocview-snapshot"`.
    #[error("not an allocview snapshot: \"format\" is {found}, expected \"{FORMAT}\"")]
    NotOurs {
        /// What the `format` field holds (or `missing`).
        found: String,
    },
    /// A version newer than this allocview reads.
    #[error(
        "allocview snapshot version {0} is newer than this allocview reads (up to version \
         {VERSION}); upgrade allocview"
    )]
    TooNew(u64),
    /// A frame list index outside the `frames` table.
    #[error("{path}: frame list {index} does not exist (the frames table has {len})")]
    BadFrameIndex {
        /// Where the index was.
        path: String,
        /// The index.
        index: u32,
        /// Size of the table.
        len: usize,
    },
}

#[derive(Deserialize)]
struct Header {
    format: Option<serde_json::Value>,
    version: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct FileV1 {
    format: String,
    version: u32,
    frames: Vec<Vec<Frame>>,
    segments: Vec<SegmentJ>,
    device_traces: Vec<Vec<TraceJ>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allocator_settings: Option<Vec<(String, Value)>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    external_annotations: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    devices: Vec<DeviceMeta>,
}

#[derive(Serialize, Deserialize)]
struct SegmentJ {
    device: i32,
    address: u64,
    total_size: u64,
    allocated_size: u64,
    active_size: u64,
    requested_size: u64,
    stream: u64,
    segment_type: SegmentType,
    segment_pool_id: (u64, u64),
    is_expandable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    frames: Option<u32>,
    blocks: Vec<BlockJ>,
}

#[derive(Serialize, Deserialize)]
struct BlockJ {
    address: u64,
    size: u64,
    requested_size: u64,
    state: BlockState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    frames: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    history: Vec<HistoryJ>,
}

#[derive(Serialize, Deserialize)]
struct HistoryJ {
    addr: u64,
    real_size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    frames: Option<u32>,
}

#[derive(Serialize, Deserialize)]
struct TraceJ {
    action: TraceAction,
    addr: u64,
    size: u64,
    stream: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    time_us: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    frames: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    compile_context: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    user_metadata: Option<String>,
}

/// Builds the frames table: one entry per distinct frame list (by `Arc`, then by content).
struct FrameTable<'s> {
    by_ptr: HashMap<usize, u32>,
    by_content: HashMap<&'s [Frame], u32>,
    lists: Vec<&'s [Frame]>,
}

impl<'s> FrameTable<'s> {
    fn id(&mut self, f: &'s Frames) -> Option<u32> {
        if f.is_empty() {
            return None;
        }
        let ptr = f.as_ptr() as usize;
        if let Some(&i) = self.by_ptr.get(&ptr) {
            return Some(i);
        }
        let content: &'s [Frame] = f;
        let i = *self.by_content.entry(content).or_insert_with(|| {
            self.lists.push(content);
            (self.lists.len() - 1) as u32
        });
        self.by_ptr.insert(ptr, i);
        Some(i)
    }
}

/// Writes a snapshot as allocview JSON (compact).
pub fn to_json(s: &Snapshot) -> Vec<u8> {
    let mut t = FrameTable {
        by_ptr: HashMap::new(),
        by_content: HashMap::new(),
        lists: Vec::new(),
    };
    let segments = s
        .segments
        .iter()
        .map(|seg| SegmentJ {
            device: seg.device,
            address: seg.address,
            total_size: seg.total_size,
            allocated_size: seg.allocated_size,
            active_size: seg.active_size,
            requested_size: seg.requested_size,
            stream: seg.stream,
            segment_type: seg.segment_type,
            segment_pool_id: seg.segment_pool_id,
            is_expandable: seg.is_expandable,
            frames: t.id(&seg.frames),
            blocks: seg
                .blocks
                .iter()
                .map(|b| BlockJ {
                    address: b.address,
                    size: b.size,
                    requested_size: b.requested_size,
                    state: b.state,
                    frames: t.id(&b.frames),
                    history: b
                        .history
                        .iter()
                        .map(|h| HistoryJ {
                            addr: h.addr,
                            real_size: h.real_size,
                            frames: t.id(&h.frames),
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect();
    let device_traces = s
        .device_traces
        .iter()
        .map(|trace| {
            trace
                .iter()
                .map(|e| TraceJ {
                    action: e.action,
                    addr: e.addr,
                    size: e.size,
                    stream: e.stream,
                    time_us: e.time_us,
                    frames: t.id(&e.frames),
                    compile_context: e.compile_context.clone(),
                    user_metadata: e.user_metadata.clone(),
                })
                .collect()
        })
        .collect();
    let file = FileV1 {
        format: FORMAT.to_string(),
        version: VERSION,
        frames: t.lists.iter().map(|l| l.to_vec()).collect(),
        segments,
        device_traces,
        allocator_settings: s.allocator_settings.clone(),
        external_annotations: s.external_annotations.clone(),
        devices: s.devices.clone(),
    };
    // Serializing plain structs of numbers and strings into memory cannot fail.
    serde_json::to_vec(&file).unwrap_or_default()
}

/// Reads allocview JSON.
///
/// # Errors
/// Not our format, a version newer than [`VERSION`], JSON of the wrong shape (the error names
/// the path: `segments[3].blocks[7].size`), or a frame index outside the table.
pub fn from_json(bytes: &[u8]) -> Result<Snapshot, JsonFormatError> {
    let syntax = |path: String, e: serde_json::Error| JsonFormatError::Syntax {
        path,
        message: e.to_string(),
    };
    let header: Header =
        serde_json::from_slice(bytes).map_err(|e| syntax("top level".into(), e))?;
    match header.format {
        Some(serde_json::Value::String(f)) if f == FORMAT => {}
        Some(other) => {
            return Err(JsonFormatError::NotOurs {
                found: other.to_string(),
            });
        }
        None => {
            return Err(JsonFormatError::NotOurs {
                found: "missing".into(),
            });
        }
    }
    match header.version {
        Some(v) if v > VERSION as u64 => return Err(JsonFormatError::TooNew(v)),
        _ => {}
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let file: FileV1 = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        syntax(path, e.into_inner())
    })?;
    let table: Vec<Frames> = file.frames.into_iter().map(Arc::from).collect();
    let frames = |id: Option<u32>, path: &dyn Fn() -> String| -> Result<Frames, JsonFormatError> {
        match id {
            None => Ok(no_frames()),
            Some(i) => {
                table
                    .get(i as usize)
                    .cloned()
                    .ok_or_else(|| JsonFormatError::BadFrameIndex {
                        path: path(),
                        index: i,
                        len: table.len(),
                    })
            }
        }
    };
    let mut segments = Vec::with_capacity(file.segments.len());
    for (si, seg) in file.segments.into_iter().enumerate() {
        let mut blocks = Vec::with_capacity(seg.blocks.len());
        for (bi, b) in seg.blocks.into_iter().enumerate() {
            let mut history = Vec::with_capacity(b.history.len());
            for (hi, h) in b.history.into_iter().enumerate() {
                history.push(BlockHistory {
                    addr: h.addr,
                    real_size: h.real_size,
                    frames: frames(h.frames, &|| {
                        format!("segments[{si}].blocks[{bi}].history[{hi}].frames")
                    })?,
                });
            }
            blocks.push(BlockInfo {
                address: b.address,
                size: b.size,
                requested_size: b.requested_size,
                state: b.state,
                frames: frames(b.frames, &|| format!("segments[{si}].blocks[{bi}].frames"))?,
                history,
            });
        }
        segments.push(SegmentInfo {
            device: seg.device,
            address: seg.address,
            total_size: seg.total_size,
            allocated_size: seg.allocated_size,
            active_size: seg.active_size,
            requested_size: seg.requested_size,
            stream: seg.stream,
            segment_type: seg.segment_type,
            segment_pool_id: seg.segment_pool_id,
            is_expandable: seg.is_expandable,
            frames: frames(seg.frames, &|| format!("segments[{si}].frames"))?,
            blocks,
        });
    }
    let mut device_traces = Vec::with_capacity(file.device_traces.len());
    for (di, trace) in file.device_traces.into_iter().enumerate() {
        let mut out = Vec::with_capacity(trace.len());
        for (ei, e) in trace.into_iter().enumerate() {
            out.push(TraceEntry {
                action: e.action,
                addr: e.addr,
                size: e.size,
                stream: e.stream,
                time_us: e.time_us,
                frames: frames(e.frames, &|| format!("device_traces[{di}][{ei}].frames"))?,
                compile_context: e.compile_context,
                user_metadata: e.user_metadata,
            });
        }
        device_traces.push(out);
    }
    Ok(Snapshot {
        segments,
        device_traces,
        allocator_settings: file.allocator_settings,
        external_annotations: file.external_annotations,
        devices: file.devices,
    })
}
