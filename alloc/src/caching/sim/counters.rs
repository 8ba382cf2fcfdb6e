//! How many times each device call reached the simulated device.

/// Calls into a [`SimBackend`](super::SimBackend), counted whether they succeeded or not, plus
/// the outcomes tests care about (failed allocations, placement hints).
///
/// A plain `Copy` struct: take one with [`SimBackend::counters`](super::SimBackend::counters)
/// before and after an operation and compare.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SimCounters {
    /// `malloc` calls.
    pub malloc: u64,
    /// `free` calls.
    pub free: u64,
    /// `mem_get_info` calls.
    pub mem_get_info: u64,
    /// `create_stream` calls.
    pub create_stream: u64,
    /// `create_event` calls.
    pub create_event: u64,
    /// `destroy_event` calls.
    pub destroy_event: u64,
    /// `record_event` calls.
    pub record_event: u64,
    /// `query_event` calls.
    pub query_event: u64,
    /// `synchronize_event` calls.
    pub synchronize_event: u64,
    /// `synchronize_device` calls.
    pub synchronize_device: u64,
    /// `vm_reserve` calls.
    pub vm_reserve: u64,
    /// `vm_map` calls.
    pub vm_map: u64,
    /// `vm_unmap` calls.
    pub vm_unmap: u64,
    /// `vm_release` calls.
    pub vm_release: u64,
    /// `malloc` calls that failed (out of memory, injected faults, bad sizes).
    pub failed_mallocs: u64,
    /// `vm_map` calls that failed (out of memory, injected faults, misuse).
    pub failed_maps: u64,
    /// Placement hints that put a segment or reservation exactly at the hinted address.
    pub hints_honoured: u64,
    /// Placement hints that could not be honoured (range taken or misaligned); the call fell
    /// back to first fit.
    pub hints_ignored: u64,
    /// Test controls (`submit_work`, `complete_stream`) naming a stream the device does not
    /// know; they did nothing.
    pub ignored_controls: u64,
}
