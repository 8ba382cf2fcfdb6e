//! A trace that begins after a free was requested: its lone `free_completed` means the block
//! was active but no longer allocated when the trace began (PyTorch lowers `allocated_*` at
//! the request and `active_*` at the completion). Summary and replay start it that way, and the
//! replay completes it where the trace does, so a trace that ends right there still ends in
//! the recorded layout.

use allocview_agent::replay::{self, ReplaySettings};
use allocview_agent::summary::{self, StatsWindow};
use allocview_alloc::snapshot::{
    BlockInfo, BlockState, SegmentInfo, SegmentType, Snapshot, TraceAction, TraceEntry,
};

const MIB: u64 = 1 << 20;
const BASE: u64 = 0x7f00_0000_0000;
const STREAM: u64 = 0;

/// One 20 MiB large segment at [`BASE`] tiled by `blocks` (size, state).
fn segment(blocks: &[(u64, BlockState)]) -> SegmentInfo {
    let mut a = BASE;
    let blocks = blocks
        .iter()
        .map(|&(size, state)| {
            a += size;
            BlockInfo::new(a - size, size, size, state)
        })
        .collect();
    SegmentInfo::tiled(BASE, STREAM, SegmentType::Large, blocks)
}

/// At the trace's start: an 8 MiB block at [`BASE`] whose free was requested before the trace
/// (pending on another stream), a 4 MiB block after it that stays allocated, and 8 MiB free.
/// The trace completes the pending free, then runs `then`. At the end: the 4 MiB block alone.
fn pending_at_start(then: &[TraceEntry]) -> Snapshot {
    let mut trace = vec![TraceEntry::new(
        TraceAction::FreeCompleted,
        BASE,
        8 * MIB,
        STREAM,
    )];
    trace.extend_from_slice(then);
    Snapshot {
        segments: vec![segment(&[
            (8 * MIB, BlockState::Inactive),
            (4 * MIB, BlockState::ActiveAllocated),
            (8 * MIB, BlockState::Inactive),
        ])],
        device_traces: vec![trace],
        ..Snapshot::default()
    }
}

#[test]
fn a_block_freed_before_the_trace_counts_as_active_but_not_allocated_in_the_window_peaks() {
    // After the completion, a 2 MiB block comes and goes in the freed space.
    let snap = pending_at_start(&[
        TraceEntry::new(TraceAction::Alloc, BASE, 2 * MIB, STREAM),
        TraceEntry::new(TraceAction::FreeRequested, BASE, 2 * MIB, STREAM),
        TraceEntry::new(TraceAction::FreeCompleted, BASE, 2 * MIB, STREAM),
    ]);
    let s = summary::summarize(&snap);
    let device = &s.devices[0];
    match &device.window {
        StatsWindow::Trace { peak_allocated, .. } => {
            // The 4 MiB block and the 2 MiB one; the pending 8 MiB block was not allocated.
            assert_eq!(*peak_allocated, 6 * MIB);
        }
        StatsWindow::NotKnown { why } => panic!("the window should be known: {why}"),
    }
    let peak = |key: &str| {
        device
            .memory_summary
            .lines()
            .find(|l| l.starts_with(&format!("| {key}")))
            .unwrap_or_else(|| panic!("no {key} row in\n{}", device.memory_summary))
            .split('|')
            .nth(3)
            .unwrap_or("")
            .trim()
            .to_string()
    };
    assert_eq!(peak("Allocated memory"), "6144 KiB");
    // Active: the pending block and the 4 MiB one at the start.
    assert_eq!(peak("Active memory"), "12288 KiB");
    assert_eq!(peak("Allocations"), "2");

    let out = replay::replay(&snap, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    let fidelity = &out.report.fidelity;
    assert_eq!(fidelity.allocs_at_recorded_address, 1, "{fidelity:?}");
    assert_eq!(fidelity.final_state_matches, Some(true), "{fidelity:?}");
    assert_eq!(out.report.runs[0].peak_allocated, 6 * MIB);
}

#[test]
fn a_trace_that_ends_with_a_completion_ends_in_the_recorded_layout() {
    let snap = pending_at_start(&[]);
    let out = replay::replay(&snap, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    assert_eq!(
        out.report.fidelity.final_state_matches,
        Some(true),
        "{}",
        out.report.to_text()
    );
    assert_eq!(out.report.runs[0].peak_allocated, 4 * MIB);
}
