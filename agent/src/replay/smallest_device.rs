//! The smallest device on which a trace replays without an OOM under the recorded settings:
//! a bisection over device sizes, each probe a what-if run of the whole trace (the recorded
//! settings, the recorded state and segment placement) at that capacity.
//!
//! The recording's device is tried first: the replay has none of the device's other users
//! (other processes, memory outside the allocator), so when the trace fits it there the OOM
//! came from outside the trace and no device size is named (`None`). Else it is the lower
//! bound; the upper bound doubles from it
//! (at most [`MAX_DOUBLINGS`] times) until a run has no OOM; then the interval is halved until
//! it is no wider than [`granularity`] (64 MiB, or 1% of the recording's device when that is
//! more), in at most [`MAX_RUNS`] runs in all. The answer is the upper end of the last
//! interval: a device of that size ran the trace without an OOM. It speaks for the trace
//! window only (what the program did before the trace began, or would have done after a
//! trace cut at its OOM, is not replayed) and for the recorded settings only; OOMs need not be
//! monotonic in the device size, so it is the answer the bisection found, not a proof that
//! every larger device fits.
//!
//! A file that does not record its device's size (PyTorch's own snapshots) starts instead from
//! what the allocator could reach at the first recorded OOM: its reserved memory plus the
//! device's free memory then ([`smallest_reachable_without_oom`]). The answer is then memory
//! the allocator must be able to reach, on top of what the device's other users held.

use serde::{Deserialize, Serialize};

use allocview_alloc::caching::AllocatorConfig;
use allocview_alloc::snapshot::Snapshot;

use crate::replay::engine::{self, RunOptions};

/// Bisection stops once the interval is this narrow (or [`GRANULARITY_SHARE`] of the device,
/// when that is more).
pub const MIN_GRANULARITY: u64 = 64 << 20;

/// The granularity as a share of the recording's device.
pub const GRANULARITY_SHARE: f64 = 0.01;

/// The upper bound doubles from the recording's device at most this many times (a device 8
/// times larger).
pub const MAX_DOUBLINGS: u32 = 3;

/// At most this many replays in all (the recording's device, doublings and halvings).
pub const MAX_RUNS: usize = 13;

/// Traces longer than this are not bisected (each replay takes its time, [`MAX_RUNS`] times).
pub const MAX_ENTRIES: usize = 200_000;

/// Probed sizes are multiples of this (the allocator's segment granularity).
const ALIGN: u64 = 2 << 20;

/// What the bisection found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmallestDevice {
    /// The smallest device size found without an OOM in the trace, in bytes.
    pub bytes: u64,
    /// The device the bisection started from (the recording's, which ran out).
    pub from: u64,
    /// `bytes - from`: how much more memory the trace needed.
    pub shortfall: u64,
    /// The answer is within this many bytes of the boundary the bisection closed in on.
    pub granularity: u64,
    /// Replays run to find it.
    pub runs: usize,
    /// Whether [`from`](Self::from) is the recording's device size (true), or the memory the
    /// allocator could reach at the first OOM, for a file without the device's size (false:
    /// see [`smallest_reachable_without_oom`]).
    #[serde(default = "recorded_device_default")]
    pub from_recorded_device: bool,
}

/// Reports written before [`SmallestDevice::from_recorded_device`] existed started from the
/// recording's device.
fn recorded_device_default() -> bool {
    true
}

/// [`MIN_GRANULARITY`], or [`GRANULARITY_SHARE`] of `device` when more.
pub fn granularity(device: u64) -> u64 {
    MIN_GRANULARITY.max((device as f64 * GRANULARITY_SHARE) as u64)
}

/// Bisects for the smallest device above `failing` bytes (a size on which the recording ran
/// out of memory) on which `snapshot`'s trace replays under `config` without an OOM. `None`
/// when the trace replays without an OOM on `failing` itself (the OOM came from memory the
/// trace does not show), when a device [`MAX_DOUBLINGS`] doublings larger still ran out (a
/// request beyond any device near it), when the trace is longer than [`MAX_ENTRIES`], or the
/// snapshot has no trace.
pub fn smallest_device_without_oom(
    snapshot: &Snapshot,
    config: &AllocatorConfig,
    failing: u64,
) -> Option<SmallestDevice> {
    let runs = std::cell::Cell::new(0usize);
    let fits = |capacity: u64| -> Option<bool> {
        runs.set(runs.get() + 1);
        let opts = RunOptions::what_if(config.clone(), "smallest device", Some(capacity), false);
        engine::run(snapshot, &opts, &mut |_| {})
            .ok()
            .map(|r| r.figures.ooms == 0)
    };
    if snapshot.device_traces.iter().map(Vec::len).sum::<usize>() > MAX_ENTRIES || fits(failing)? {
        return None;
    }
    let step = granularity(failing);
    let mut lo = failing;
    let mut hi = None;
    let mut probe = failing;
    for _ in 0..MAX_DOUBLINGS {
        probe = probe.saturating_mul(2);
        if fits(probe)? {
            hi = Some(probe);
            break;
        }
        lo = probe;
    }
    let mut hi = hi?;
    while hi - lo > step && runs.get() < MAX_RUNS {
        let mid = (lo + (hi - lo) / 2).div_ceil(ALIGN) * ALIGN;
        if mid <= lo || mid >= hi {
            break;
        }
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(SmallestDevice {
        bytes: hi,
        from: failing,
        shortfall: hi - failing,
        granularity: step,
        runs: runs.get(),
        from_recorded_device: true,
    })
}

/// [`smallest_device_without_oom`] for a file that does not record its device's size, from
/// `reachable`: the memory the allocator could reach at the first recorded OOM (its reserved
/// bytes plus the device's free bytes then, as the OOM's diagnosis computes). The answer is
/// allocator-reachable memory; the device needs that plus what its other users held (CUDA's
/// context, other processes), which such a file does not show.
pub fn smallest_reachable_without_oom(
    snapshot: &Snapshot,
    config: &AllocatorConfig,
    reachable: u64,
) -> Option<SmallestDevice> {
    smallest_device_without_oom(snapshot, config, reachable).map(|s| SmallestDevice {
        from_recorded_device: false,
        ..s
    })
}
