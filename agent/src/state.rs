//! [`AgentState`]: everything the agent knows, as plain serde data.
//!
//! This is the model the dashboard renders (live over the attach protocol, or built from a file)
//! and the payload of the protocol's full-state frame. It holds no channels, locks or ratatui
//! types: a consistent copy the aggregator hands out (`Agent::state`), and
//! that `AttachClient` rebuilds on the other side of a socket by applying updates.
//!
//! Stability: fields are only ever added (with `#[serde(default)]`), never renamed or removed, so
//! a newer agent still talks to an older dashboard of the same protocol version.

use std::path::PathBuf;

use allocview_alloc::caching::stats::{DeviceStats, Stat, StatArray, StatType};
use allocview_alloc::global::HeapStats;
use allocview_alloc::snapshot::{DeviceMeta, DumpedOom, Frames, SegmentInfo, Snapshot};
use serde::{Deserialize, Serialize};

/// The start of an [`OomRecord::dump_error`] for a dump left out on purpose, not failed.
pub const NOT_WRITTEN: &str = "not written: ";

/// Whether a dump error is [`NOT_WRITTEN`]: a dump left out on purpose, not a failure.
pub fn is_not_written(dump_error: &str) -> bool {
    dump_error.starts_with(NOT_WRITTEN)
}

/// Nanoseconds per microsecond (the agent's times are in ns, snapshot files' in µs).
pub const NS_PER_US: u64 = 1_000;

/// Everything the agent knows about the process it lives in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentState {
    /// The process the agent runs in.
    pub process: ProcessInfo,
    /// One entry per device that published events or has a registered provider, by device index.
    pub devices: Vec<DeviceState>,
    /// CPU heap counters, when a host allocator publishes events.
    #[serde(default)]
    pub host: Option<HostState>,
    /// Health of the event pipeline: what was ingested, dropped, resynchronised.
    pub pipeline: PipelineStats,
    /// Every OOM seen, oldest first.
    pub ooms: Vec<OomRecord>,
    /// When this state was taken, nanoseconds since the Unix epoch.
    pub time_ns: u64,
}

impl AgentState {
    /// The device with this index, if known.
    pub fn device(&self, device: i32) -> Option<&DeviceState> {
        self.devices.iter().find(|d| d.device == device)
    }
}

/// The process the agent runs in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: u32,
    /// Executable name (or what the embedding program named itself).
    pub name: String,
    /// When the agent started, nanoseconds since the Unix epoch.
    pub started_ns: u64,
}

/// Which pool a block, segment or figure belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKey {
    /// The small pool (rounded requests of at most 1 MiB).
    Small,
    /// The large pool.
    Large,
    /// A private pool (graph capture), by the id events carry.
    Private(u64),
}

impl PoolKey {
    /// A short label (`small`, `large`, `private(7)`).
    pub fn label(&self) -> String {
        match self {
            PoolKey::Small => "small".into(),
            PoolKey::Large => "large".into(),
            PoolKey::Private(id) => format!("private({id})"),
        }
    }
}

/// What the agent knows about one device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceState {
    /// Device index (as in `cuda:N`).
    pub device: i32,
    /// Total device memory in bytes, when a provider told us (0 when unknown).
    pub total_memory: u64,
    /// Memory the allocator may use (memory fraction), when limited.
    pub allowed_memory: Option<u64>,
    /// The allocator's counters, recomputed from events (equal to the allocator's own).
    pub stats: DeviceStats,
    /// The live mirror of segments and blocks, sorted by address.
    pub segments: Vec<SegmentInfo>,
    /// Usage per stream, by stream id.
    pub streams: Vec<StreamUsage>,
    /// Usage per pool: small, large, then private pools by id.
    pub pools: Vec<PoolUsage>,
    /// Usage over time, oldest first (coarser resolution further back; see
    /// [`UsageSample`]).
    pub timeline: Vec<UsageSample>,
    /// Size, lifetime and latency distributions.
    pub histograms: Histograms,
    /// The most recent events, oldest first (a bounded tail, for the trace view).
    pub recent: Vec<RecentEvent>,
    /// The frames of the context ids `recent` uses, by id (ids whose frames the allocator no
    /// longer kept when the agent asked are missing: their events show none).
    #[serde(default)]
    pub contexts: Vec<ContextFrames>,
}

impl DeviceState {
    /// The frames of context `id` (see [`RecentEvent::context`]), when `contexts` names it
    /// (it is sorted by id, as the agent sends it and `apply_update` keeps it).
    pub fn context_frames(&self, id: u32) -> Option<&Frames> {
        if id == 0 {
            return None;
        }
        self.contexts
            .binary_search_by_key(&id, |c| c.id)
            .ok()
            .map(|i| &self.contexts[i].frames)
    }
}

/// Usage of one stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamUsage {
    /// Stream id (0 is the default stream).
    pub stream: u64,
    /// Bytes in blocks allocated on this stream.
    pub allocated: u64,
    /// Bytes in active blocks (allocated or pending free) of this stream.
    pub active: u64,
    /// Bytes reserved in segments of this stream.
    pub reserved: u64,
    /// Highest `allocated` since the last peak reset.
    pub peak_allocated: u64,
    /// Allocations made on this stream since the agent started.
    pub allocs: u64,
    /// Time of the last event on this stream, nanoseconds since the Unix epoch.
    #[serde(default)]
    pub last_event_ns: u64,
}

/// Usage of one pool, computed from the segment mirror.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolUsage {
    /// Which pool.
    pub pool: PoolKey,
    /// Segments in the pool.
    pub segments: u64,
    /// Bytes of those segments.
    pub reserved: u64,
    /// Bytes in allocated blocks.
    pub allocated: u64,
    /// Bytes in active blocks.
    pub active: u64,
    /// Free blocks inside split segments (cannot be returned to the device).
    pub inactive_split: u64,
    /// Bytes of those blocks.
    pub inactive_split_bytes: u64,
    /// The largest free block.
    pub largest_free: u64,
    /// Allocated blocks flagged oversize.
    pub oversize_allocations: u64,
}

/// One point of usage over time.
///
/// The newest samples are taken every second; older ones are kept at 10 s and then 1 min
/// resolution, and a coarser sample holds the highest value of each figure over its window (so
/// a peak is never averaged away).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageSample {
    /// First reading of the window, nanoseconds since the Unix epoch (never earlier than the
    /// data the sample summarizes).
    pub time_ns: u64,
    /// `allocated_bytes.all.current`.
    pub allocated: u64,
    /// `reserved_bytes.all.current`.
    pub reserved: u64,
    /// `active_bytes.all.current`.
    pub active: u64,
}

/// The distributions the agent keeps for one device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histograms {
    /// Over all pools and streams.
    pub all: HistogramSet,
    /// Per pool.
    pub by_pool: Vec<PoolHistograms>,
    /// Per stream.
    pub by_stream: Vec<StreamHistograms>,
}

/// Size, lifetime and latency of one slice of the allocations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HistogramSet {
    /// Requested size of each allocation, in bytes.
    pub size: HistogramSummary,
    /// Time from allocation to free completion, in nanoseconds.
    pub lifetime: HistogramSummary,
    /// Time the allocator call took (`latency_ns` of `alloc` events that measured it: the caching
    /// allocator measures a random sample of calls), in nanoseconds.
    pub latency: HistogramSummary,
}

/// The histograms of one pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolHistograms {
    /// Which pool.
    pub pool: PoolKey,
    /// Its distributions.
    pub set: HistogramSet,
}

/// The histograms of one stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamHistograms {
    /// Stream id.
    pub stream: u64,
    /// Its distributions.
    pub set: HistogramSet,
}

/// A summary of one HdrHistogram: quantiles plus log2 buckets for drawing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HistogramSummary {
    /// Values recorded.
    pub count: u64,
    /// Smallest value (0 when empty).
    pub min: u64,
    /// Largest value (0 when empty).
    pub max: u64,
    /// Mean value (exact: `sum / count`).
    pub mean: f64,
    /// Sum of the values recorded, kept exactly and given as a float (exact up to 2^53;
    /// absent in files written before it was kept: 0).
    #[serde(default)]
    pub sum: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// `(upper_bound, count)` per non-empty power-of-two bucket `[upper_bound / 2,
    /// upper_bound)` (the first bucket, upper bound 1, holds 0), ascending.
    pub buckets: Vec<(u64, u64)>,
}

/// One event of the recent-events tail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecentEvent {
    /// Sequence number of the event in the agent (strictly increasing; gaps are events that
    /// fell out of the tail, not drops).
    pub seq: u64,
    /// When it happened, nanoseconds since the Unix epoch.
    pub time_ns: u64,
    /// The action's name (`alloc`, `free_requested`, ... as
    /// [`EventAction::as_str`](allocview_alloc::event::EventAction::as_str) spells them).
    pub action: String,
    /// Address (for `oom`: the device's free bytes).
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// Requested size (alloc, free_requested, free, oom), else 0.
    pub requested: u64,
    /// Stream.
    pub stream: u64,
    /// Pool.
    pub pool: PoolKey,
    /// `FLAG_*` bits of the event.
    pub flags: u8,
    /// Allocator latency in nanoseconds (0 when not measured).
    pub latency_ns: u32,
    /// Id of the stack frames behind the event (0 = none): the device's
    /// [`contexts`](DeviceState::contexts) name the frames of the ids its recent events use.
    pub context: u32,
}

/// The stack frames of one context id (see [`RecentEvent::context`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextFrames {
    /// The id events carry.
    pub id: u32,
    /// Its frames, innermost first.
    pub frames: Frames,
}

/// CPU heap counters (events of the host pool).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostState {
    /// Live allocations.
    pub allocations: Stat,
    /// Live bytes.
    pub bytes: Stat,
}

impl HostState {
    /// The counters of a heap's own [`HeapStats`] (a resync): live allocations and bytes, the
    /// heap's byte peak, and its running totals. The heap keeps no peak of live allocations:
    /// that stays the higher of `previous`'s and the live count now.
    pub fn from_heap(heap: &HeapStats, previous: &HostState) -> HostState {
        let live = heap.count as i64 - heap.frees as i64;
        HostState {
            allocations: Stat {
                current: live,
                peak: previous.allocations.peak.max(live),
                allocated: heap.count as i64,
                freed: heap.frees as i64,
            },
            bytes: Stat {
                current: heap.current_bytes as i64,
                peak: heap.peak_bytes as i64,
                allocated: heap.total_bytes as i64,
                freed: heap.total_bytes as i64 - heap.current_bytes as i64,
            },
        }
    }
}

/// Health of the event pipeline.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineStats {
    /// Events the aggregator has folded in.
    pub events_ingested: u64,
    /// Events dropped because the channel was full.
    pub dropped_total: u64,
    /// Drops per action name (only actions with drops).
    pub dropped_by_action: Vec<(String, u64)>,
    /// Times the agent rebuilt its stats and mirror from the allocator after drops or an
    /// inconsistent event.
    pub resyncs: u64,
    /// Events that did not fit the mirror (a free of an unknown block, ...): evidence of drops;
    /// each leads to a resync when a provider is registered.
    #[serde(default)]
    pub inconsistencies: u64,
    /// Capacity of the event channel.
    pub channel_capacity: u64,
    /// Whether updates to this client are paused: the client's own flag, set by
    /// [`AttachClient::pause`](crate::client::AttachClient::pause) and kept across updates; the
    /// agent's own state (and every frame it sends) says false.
    pub paused: bool,
    /// OOM dumps written.
    #[serde(default)]
    pub dumps_written: u64,
    /// OOM dumps that could not be written.
    #[serde(default)]
    pub dump_failures: u64,
    /// Whether the figures may be partial: drops happened and no provider could resync them.
    #[serde(default)]
    pub partial: bool,
    /// Attach clients connected now.
    #[serde(default)]
    pub clients: u64,
    /// OOMs the agent saw, including those whose records are no longer kept (see
    /// [`OOM_KEEP_FIRST`]).
    #[serde(default)]
    pub ooms_total: u64,
    /// Attach clients the agent refused, per reason
    /// ([`RefusalReason::as_str`](crate::server::RefusalReason::as_str)): only reasons with
    /// refusals, in [`RefusalReason::ALL`](crate::server::RefusalReason::ALL)'s order.
    #[serde(default)]
    pub refused_clients: Vec<(String, u64)>,
}

impl PipelineStats {
    /// Attach clients refused, all reasons together.
    pub fn refused_clients_total(&self) -> u64 {
        self.refused_clients
            .iter()
            .fold(0u64, |t, (_, n)| t.saturating_add(*n))
    }
}

/// One OOM, with the facts taken when the agent saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomRecord {
    /// 1 for the first OOM of the process, then 2, 3, ...
    pub index: u64,
    /// When the allocation failed, nanoseconds since the Unix epoch.
    pub time_ns: u64,
    /// Device.
    pub device: i32,
    /// Stream of the failed request.
    pub stream: u64,
    /// Bytes the program asked for.
    pub requested: u64,
    /// The rounded request.
    pub rounded: u64,
    /// Free device memory the allocator saw.
    pub device_free: u64,
    /// `allocated_bytes.all.current` at the OOM.
    pub allocated: u64,
    /// `reserved_bytes.all.current` at the OOM.
    pub reserved: u64,
    /// The largest free (cached) block at the OOM.
    pub largest_free_block: u64,
    /// `inactive_split_bytes.all.current`: bytes stranded in split segments.
    #[serde(default)]
    pub inactive_split_bytes: u64,
    /// Total device memory, when known (0 when unknown).
    #[serde(default)]
    pub total_memory: u64,
    /// The dump files written for this OOM (pickle and JSON).
    pub dump_paths: Vec<PathBuf>,
    /// Why the dump could not be written, if it could not; [`NOT_WRITTEN`] starts the ones
    /// that are not failures (the agent's limit on dumps, a moment another record has).
    pub dump_error: Option<String>,
    /// The dump is being written (off the aggregator thread): `dump_paths` and `dump_error`
    /// are filled in when it lands, and the record is sent again.
    #[serde(default)]
    pub dump_pending: bool,
    /// The OOM's event was dropped (the channel was full): the agent learnt of it from the
    /// drop count, so `stream`, `requested`, `rounded` and `device_free` are unknown (0), and
    /// the other figures and the dump are from the resync after it.
    #[serde(default)]
    pub event_lost: bool,
}

impl OomRecord {
    /// The record as its dump carries it.
    pub fn dumped(&self) -> DumpedOom {
        DumpedOom {
            index: self.index,
            time_us: i64::try_from(self.time_ns / NS_PER_US).unwrap_or(i64::MAX),
            stream: self.stream,
            requested: self.requested,
            rounded: self.rounded,
            device_free: self.device_free,
            allocated: self.allocated,
            reserved: self.reserved,
            largest_free_block: self.largest_free_block,
            inactive_split_bytes: self.inactive_split_bytes,
            event_lost: self.event_lost,
        }
    }

    /// The record of device `device` (of `total_memory` bytes, 0: not known) that a dump
    /// carries, without the dump's paths (the dump is the file it was read from).
    pub fn from_dumped(device: i32, total_memory: u64, o: &DumpedOom) -> OomRecord {
        OomRecord {
            index: o.index,
            time_ns: u64::try_from(o.time_us)
                .unwrap_or(0)
                .saturating_mul(NS_PER_US),
            device,
            stream: o.stream,
            requested: o.requested,
            rounded: o.rounded,
            device_free: o.device_free,
            allocated: o.allocated,
            reserved: o.reserved,
            largest_free_block: o.largest_free_block,
            inactive_split_bytes: o.inactive_split_bytes,
            total_memory,
            event_lost: o.event_lost,
            ..OomRecord::default()
        }
    }

    /// Writes the record into `snapshot`, its dump, as its device's [`DeviceMeta::oom`] (with
    /// the device's total memory when the snapshot does not have it).
    pub fn put_in(&self, snapshot: &mut Snapshot) {
        let at = match snapshot
            .devices
            .iter()
            .position(|m| m.device == self.device)
        {
            Some(at) => at,
            None => {
                snapshot.devices.push(DeviceMeta {
                    device: self.device,
                    ..DeviceMeta::default()
                });
                snapshot.devices.len() - 1
            }
        };
        let meta = &mut snapshot.devices[at];
        if meta.total_memory.is_none() && self.total_memory > 0 {
            meta.total_memory = Some(self.total_memory);
        }
        meta.oom = Some(self.dumped());
    }
}

/// OOM records kept from the start of the process: the first OOM usually tells why.
pub const OOM_KEEP_FIRST: usize = 16;

/// OOM records kept from the end: the latest ones. Records between the first and the latest
/// are forgotten (their count stays in [`PipelineStats::ooms_total`]), so a program that catches
/// OOMs in a loop holds the agent and its clients to a bounded list.
pub const OOM_KEEP_LATEST: usize = 240;

/// The indices of the OOM records no longer kept once `total` OOMs were seen (those after the
/// first [`OOM_KEEP_FIRST`] and before the latest [`OOM_KEEP_LATEST`]), if any.
pub fn forgotten_oom_indices(total: u64) -> Option<std::ops::RangeInclusive<u64>> {
    let range = OOM_KEEP_FIRST as u64 + 1..=total.checked_sub(OOM_KEEP_LATEST as u64)?;
    (!range.is_empty()).then_some(range)
}

/// Inserts `record` into `records` (sorted by index), replacing the record of the same index,
/// then forgets the oldest records past the first [`OOM_KEEP_FIRST`] while more than
/// [`OOM_KEEP_FIRST`] + [`OOM_KEEP_LATEST`] are kept.
pub fn keep_oom_record(records: &mut Vec<OomRecord>, record: OomRecord) {
    match records.binary_search_by_key(&record.index, |r| r.index) {
        Ok(i) => records[i] = record,
        Err(i) => records.insert(i, record),
    }
    let over = records
        .len()
        .saturating_sub(OOM_KEEP_FIRST + OOM_KEEP_LATEST);
    if over > 0 {
        records.drain(OOM_KEEP_FIRST..OOM_KEEP_FIRST + over);
    }
}

/// An array's `all` current figure, as bytes or a count (0 if it went negative).
pub(crate) fn all_current(a: &StatArray) -> u64 {
    a.get(StatType::All).current.max(0) as u64
}

/// An array's `all` peak, as bytes or a count (0 if it went negative).
pub(crate) fn all_peak(a: &StatArray) -> u64 {
    a.get(StatType::All).peak.max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(index: u64) -> OomRecord {
        OomRecord {
            index,
            dump_pending: true,
            ..OomRecord::default()
        }
    }

    #[test]
    fn a_record_sent_again_replaces_the_first_and_the_list_stays_bounded() {
        let mut kept = Vec::new();
        // Out of order and repeated, as overlapping updates deliver them.
        for i in [2, 1, 3] {
            keep_oom_record(&mut kept, rec(i));
        }
        let landed = OomRecord {
            dump_pending: false,
            dump_paths: vec!["oom-0002.pickle".into()],
            ..rec(2)
        };
        keep_oom_record(&mut kept, landed.clone());
        assert_eq!(kept.iter().map(|r| r.index).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(kept[1], landed);

        let n = (OOM_KEEP_FIRST + OOM_KEEP_LATEST) as u64 + 10;
        for i in 4..=n {
            keep_oom_record(&mut kept, rec(i));
        }
        assert_eq!(kept.len(), OOM_KEEP_FIRST + OOM_KEEP_LATEST);
        assert_eq!(kept[OOM_KEEP_FIRST - 1].index, OOM_KEEP_FIRST as u64);
        assert_eq!(kept[OOM_KEEP_FIRST].index, OOM_KEEP_FIRST as u64 + 11);
        assert_eq!(kept.last().map(|r| r.index), Some(n));
        // A late copy of a forgotten record comes back, then goes again.
        keep_oom_record(&mut kept, rec(OOM_KEEP_FIRST as u64 + 1));
        assert_eq!(kept.len(), OOM_KEEP_FIRST + OOM_KEEP_LATEST);
        assert_eq!(kept[OOM_KEEP_FIRST].index, OOM_KEEP_FIRST as u64 + 11);
    }
}
