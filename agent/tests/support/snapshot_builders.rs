//! A model snapshot that uses every field, for round-trip tests.

#![allow(dead_code)]

use std::sync::Arc;

use allocview_agent::pytorch;
use allocview_alloc::snapshot::{
    BlockInfo, BlockState, DeviceMeta, DumpedOom, Frame, SegmentInfo, SegmentType, Snapshot,
    TraceAction, TraceEntry, Value, no_frames,
};

/// A frame in `train.py`.
pub fn frame(name: &str) -> Frame {
    Frame {
        name: name.into(),
        filename: "train.py".into(),
        line: 7,
    }
}

/// A small model that uses every field: two devices, pending-free blocks, a private pool, an
/// expandable segment, an OOM, addresses above 2^63, every optional trace field.
pub fn rich_snapshot() -> Snapshot {
    let shared: allocview_alloc::snapshot::Frames = Arc::from(vec![frame("f"), frame("g")]);
    let seg = |device: i32, address: u64, blocks: Vec<(u64, BlockState)>| {
        let mut next = address;
        let blocks: Vec<BlockInfo> = blocks
            .into_iter()
            .map(|(size, state)| {
                let b = BlockInfo {
                    address: next,
                    size,
                    requested_size: size - 100,
                    state,
                    frames: if state == BlockState::Inactive {
                        no_frames()
                    } else {
                        shared.clone()
                    },
                    history: vec![],
                };
                next += size;
                b
            })
            .collect();
        let (allocated_size, active_size, requested_size) = pytorch::segment_sums(&blocks);
        SegmentInfo {
            device,
            address,
            total_size: next - address,
            allocated_size,
            active_size,
            requested_size,
            stream: 0,
            segment_type: SegmentType::Large,
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: shared.clone(),
            blocks,
        }
    };
    let mut private = seg(0, 1 << 40, vec![(2 << 20, BlockState::ActivePendingFree)]);
    private.segment_pool_id = (1, 3);
    private.stream = 0x5555_0000;
    let mut expandable = seg(
        1,
        u64::MAX - (64 << 20),
        vec![(32 << 20, BlockState::Inactive)],
    );
    expandable.is_expandable = true;
    expandable.total_size = 32 << 20;
    expandable.segment_type = SegmentType::Small;
    let entry = |action, addr, size| TraceEntry {
        time_us: Some(1_700_000_000_000_000),
        frames: shared.clone(),
        compile_context: Some("N/A".into()),
        user_metadata: Some("step 3".into()),
        ..TraceEntry::new(action, addr, size, 0)
    };
    Snapshot {
        segments: vec![
            seg(
                0,
                1 << 30,
                vec![
                    (1 << 20, BlockState::ActiveAllocated),
                    (512, BlockState::Inactive),
                    (4096, BlockState::ActivePendingFree),
                ],
            ),
            private,
            expandable,
        ],
        device_traces: vec![
            vec![
                entry(TraceAction::Alloc, 1 << 30, 1000),
                TraceEntry::new(TraceAction::FreeRequested, 1 << 30, 1000, 0),
            ],
            vec![entry(TraceAction::Oom, 12345, 1 << 33)],
        ],
        allocator_settings: Some(vec![
            ("max_split_size".into(), Value::Int(-1)),
            ("garbage_collection_threshold".into(), Value::Float(0.5)),
            ("expandable_segments".into(), Value::Bool(true)),
            (
                "roundup_power2_divisions".into(),
                Value::Dict(vec![(Value::Str("1".into()), Value::Int(4))]),
            ),
            (
                "odd".into(),
                Value::Tuple(vec![
                    Value::None,
                    Value::Int(i64::MIN),
                    Value::Str("x".repeat(300)),
                    Value::List(vec![]),
                ]),
            ),
        ]),
        external_annotations: Some(vec![Value::Dict(vec![(
            Value::Str("stage".into()),
            Value::Tuple(vec![Value::Int(1)]),
        )])]),
        devices: vec![
            DeviceMeta {
                device: 0,
                total_memory: Some(80 << 30),
                trace_overflow: 17,
                oom: Some(DumpedOom {
                    index: 3,
                    time_us: 1_700_000_000_123_456,
                    stream: 7,
                    requested: 1_000_000_001,
                    rounded: 1_000_000_512,
                    device_free: 12 << 20,
                    allocated: 70 << 30,
                    reserved: 79 << 30,
                    largest_free_block: 900 << 20,
                    inactive_split_bytes: 5 << 30,
                    event_lost: false,
                }),
            },
            DeviceMeta {
                device: 1,
                total_memory: None,
                trace_overflow: 0,
                oom: None,
            },
        ],
    }
}
