//! Replay a recorded allocation trace through the caching allocator, on a simulated device, and
//! ask what would have happened under other allocator settings (issue 5).
//!
//! The input is a snapshot with a trace (PyTorch's pickle, allocview's JSON) or an RMM log.
//! [`InitialState`] rebuilds what existed when the trace began; the engine installs it, then
//! drives a `CachingAllocator` over a `SimBackend` through the trace.

pub mod bytes;
pub mod initial;
pub mod report;
pub mod rmm;

pub use bytes::{BytesError, parse_bytes};
pub use initial::{InitialBlock, InitialSegment, InitialState};
pub use report::{Divergence, Fidelity, InitialSummary, OomEvent, ReplayReport, RunFigures};
pub use rmm::{RmmError, is_rmm_log, parse_rmm_log};
