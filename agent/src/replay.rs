//! Replay a recorded allocation trace through the caching allocator, on a simulated device, and
//! ask what would have happened under other allocator settings (issue 5).
//!
//! # What it does
//! The input is a snapshot with a trace (PyTorch's pickle, allocview's JSON) or an RMM log
//! ([`rmm`]). [`InitialState`] rebuilds what existed when the trace began (a trace usually
//! starts mid-run), and the [`engine`] drives a `CachingAllocator` over a `SimBackend` through
//! the trace:
//! - the **fidelity run** uses the recording's settings and places every segment at its
//!   recorded address, so replayed addresses compare directly with recorded ones; it reports
//!   the share of allocations at the recorded address, of segment allocations of the recorded
//!   size, and the first divergence ([`Fidelity`]), and gives the baseline column;
//! - one **what-if run** per `--config`, at the same device capacity, without address hints.
//!
//! # Installing the initial state
//! Replay installs the initial segments through the allocator's public API rather than a
//! back door into its internals: each segment is allocated whole at its recorded address
//! (`SimBackend::hint_next_segment`), freed, and carved front to back into its blocks while
//! every other segment is fully allocated, so best fit can only take the front of this
//! segment's remainder; placeholders for the free blocks are freed at the end (free blocks
//! never touch each other, so nothing merges). This holds for the default rounding and split
//! rules the recordings were made with (every large-pool block is larger than 1 MiB, every
//! small-pool allocation at most 1 MiB); a recording made with `max_split_size_mb` or
//! power-of-two rounding divisions could lay out differently, and a mismatch shows as a
//! warning in [`InitialSummary::warnings`]. The advantage: replay depends on nothing but the
//! allocator's public contract, so it checks that contract rather than sharing its bugs.
//!
//! # What-if runs
//! What-if runs begin from the live blocks alone, allocated under the run's settings: the
//! recorded cache is the recorded settings' doing. Recorded `oom` entries are attempted again
//! (a success is given back at once: the program never had that block).

pub mod bytes;
pub mod initial;
pub mod plan;
pub mod report;
pub mod rmm;

pub use bytes::{BytesError, parse_bytes};
pub use initial::{InitialBlock, InitialSegment, InitialState};
pub use report::{Divergence, Fidelity, InitialSummary, OomEvent, ReplayReport, RunFigures};
pub use rmm::{RmmError, is_rmm_log, parse_rmm_log};
