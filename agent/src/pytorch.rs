//! PyTorch's memory snapshot (what `torch.cuda.memory._dump_snapshot()` pickles) <-> the
//! snapshot model [`allocview_alloc::snapshot`].
//!
//! Every layout PyTorch has written lands on the one model:
//!
//! | layout | recognised by | read as |
//! |---|---|---|
//! | newest | trace entries with `compile_context`, `user_metadata` | those fields set |
//! | 2.2 - 2.6 | `allocator_settings`, `external_annotations`, `time_us` | those fields set |
//! | 2.1 | no `time_us` | `time_us: None` |
//! | 2.0 legacy | blocks with `history`, no `address`/`frames` | addresses by tiling from the segment address; frames from `history[0]` (what `_memory_viz.py` shows) |
//! | bare list | the top level is a list | segments only |
//!
//! OOM trace entries carry `device_free` instead of `addr`; both land in
//! [`TraceEntry::addr`](allocview_alloc::snapshot::TraceEntry::addr). Optional keys
//! (`segment_pool_id`, `is_expandable`, `frames`, `time_us`, ...) default when absent; anything
//! else missing or of the wrong type is a [`PytorchError`] naming the place
//! (`segments[3].blocks[7]: key 'size' is a str, expected int`).
//!
//! The writer ([`to_pickle`]) writes the newest layout; see [`encode`].

pub mod decode;
pub mod encode;
pub mod error;
pub mod keys;

use allocview_alloc::snapshot::Snapshot;
use thiserror::Error;

pub use allocview_alloc::snapshot::segment_sums;
pub use error::PytorchError;

use crate::pickle;

/// Reads a snapshot pickle.
///
/// # Errors
/// A [`PytorchError`] naming the byte offset (pickle errors) or the path and key (shape errors).
pub fn from_pickle(bytes: &[u8]) -> Result<Snapshot, PytorchError> {
    from_pickle_with_progress(bytes, &mut |_| {})
}

/// Reads a snapshot pickle, calling `progress(bytes_decoded)` now and then.
///
/// # Errors
/// As [`from_pickle`].
pub fn from_pickle_with_progress(
    bytes: &[u8],
    progress: &mut dyn FnMut(usize),
) -> Result<Snapshot, PytorchError> {
    let doc = pickle::parse_with_progress(bytes, progress)?;
    decode::decode(&doc, bytes.len())
}

/// Writes a snapshot as a protocol 4 pickle that PyTorch's tools read.
pub fn to_pickle(snapshot: &Snapshot) -> Vec<u8> {
    encode::encode(snapshot)
}

/// Writes a snapshot as [`to_pickle`] does, but with every trace entry's and block's frames a
/// list object of its own, even where another holds the same frames: the layout of PyTorch's
/// own `_dump_snapshot`, where every call captures a traceback of its own (see
/// [`encode::Lists::PerUse`]). It reads back to the same snapshot, from a larger file: what
/// readers meet in files PyTorch wrote.
pub fn to_pickle_pytorch_layout(snapshot: &Snapshot) -> Vec<u8> {
    encode::encode_with(snapshot, encode::Lists::PerUse)
}

/// A segment whose blocks do not tile it (PyTorch's `_memory_viz.py stats` asserts they do).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("segments[{segment}] (address {address:#x}): {problem}")]
pub struct TilingError {
    /// Index of the segment.
    pub segment: usize,
    /// Its address.
    pub address: u64,
    /// What is wrong.
    pub problem: String,
}

/// Checks that every segment's blocks tile it: the first starts at the segment address, each
/// next one where the previous ends, and the last ends at the segment's end.
///
/// # Errors
/// The first segment that does not tile.
pub fn check_tiling(snapshot: &Snapshot) -> Result<(), TilingError> {
    for (i, seg) in snapshot.segments.iter().enumerate() {
        let err = |problem: String| TilingError {
            segment: i,
            address: seg.address,
            problem,
        };
        let mut next = seg.address;
        for (j, b) in seg.blocks.iter().enumerate() {
            if b.address != next {
                return Err(err(format!(
                    "blocks[{j}] starts at {:#x}, expected {next:#x}",
                    b.address
                )));
            }
            next = next
                .checked_add(b.size)
                .ok_or_else(|| err(format!("blocks[{j}] ends past 2^64")))?;
        }
        let end = seg.address.saturating_add(seg.total_size);
        if next != end {
            return Err(err(format!(
                "blocks end at {next:#x}, the segment at {end:#x}"
            )));
        }
    }
    Ok(())
}
