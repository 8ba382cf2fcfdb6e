//! Replay never panics, whatever the trace says: entries in any order, frees of unknown
//! addresses, huge or zero sizes, OOM entries, unknown streams, segments that overlap.

use allocview_agent::replay::{self, ReplaySettings};
use allocview_alloc::snapshot::{
    BlockInfo, BlockState, SegmentInfo, SegmentType, Snapshot, TraceAction, TraceEntry, no_frames,
};
use proptest::prelude::*;

const BASE: u64 = 0x7f00_0000_0000;

fn entry() -> impl Strategy<Value = TraceEntry> {
    (
        prop::sample::select(TraceAction::ALL.to_vec()),
        0u64..64,
        prop_oneof![
            0u64..4096,
            4096u64..(64 << 20),
            Just(1u64 << 62),
            Just(u64::MAX)
        ],
        0u64..3,
    )
        .prop_map(|(action, slot, size, stream)| {
            TraceEntry::new(action, BASE + slot * (2 << 20), size, stream)
        })
}

/// A final segment at a slot, its blocks cut at random points (possibly overlapping another
/// segment: the snapshot need not be consistent).
fn segment() -> impl Strategy<Value = SegmentInfo> {
    (
        0u64..64,
        prop::sample::select(vec![2u64 << 20, 20 << 20, 64 << 20]),
        prop::collection::vec((1u64..8, any::<bool>()), 1..6),
    )
        .prop_map(|(slot, total, cuts)| {
            let address = BASE + slot * (2 << 20);
            let parts: u64 = cuts.iter().map(|c| c.0).sum();
            let mut a = address;
            let mut blocks = Vec::new();
            for (i, (w, live)) in cuts.iter().enumerate() {
                let size = if i + 1 == cuts.len() {
                    address + total - a
                } else {
                    (total * w / parts) / 512 * 512
                };
                blocks.push(BlockInfo {
                    address: a,
                    size,
                    requested_size: size,
                    state: if *live {
                        BlockState::ActiveAllocated
                    } else {
                        BlockState::Inactive
                    },
                    frames: no_frames(),
                    history: Vec::new(),
                });
                a += size;
            }
            SegmentInfo {
                device: 0,
                address,
                total_size: total,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                stream: 0,
                segment_type: if total == 2 << 20 {
                    SegmentType::Small
                } else {
                    SegmentType::Large
                },
                segment_pool_id: (0, 0),
                is_expandable: false,
                frames: no_frames(),
                blocks,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn arbitrary_traces_replay_without_panicking(
        trace in prop::collection::vec(entry(), 1..120),
        segments in prop::collection::vec(segment(), 0..4),
        small_device in any::<bool>(),
    ) {
        let snap = Snapshot { segments, device_traces: vec![trace.clone()], ..Snapshot::default() };
        let settings = ReplaySettings {
            configs: vec!["expandable_segments:True".into(), "max_split_size_mb:20".into()],
            device_memory: small_device.then_some(256 << 20),
            keep_history: true,
        };
        let out = replay::replay(&snap, &settings, &mut |_, _| {}).unwrap();
        prop_assert_eq!(out.report.events, trace.len());
        // The file records no device size: a small device is a column of its own.
        prop_assert_eq!(out.report.runs.len(), 3 + usize::from(small_device));
        prop_assert!(out.report.initial.warnings.len() <= replay::engine::MAX_WARNINGS + 1);
        let _ = out.report.to_text();
    }
}
