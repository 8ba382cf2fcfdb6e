//! The aggregator thread: folds events into per-device state and feeds clients.
//!
//! tokio-console's aggregator pattern: the thread sleeps until the tick (100 ms by default), a
//! wake-up from the sink (a channel half full, an OOM) or a command; then it drains what the
//! sink's two channels (single events, batches) hold without blocking, in one pass, and on each
//! tick checks for drops, samples the timeline and sends every attached client only what
//! changed since the previous update (at most every [`MIN_UPDATE_INTERVAL`]). It never
//! waits on a client: each has a bounded queue that the aggregator only `try_send`s to, and a
//! client whose queue is full is disconnected.
//!
//! Drops: when the sink's drop counter grew (or an event did not fit the mirror), the aggregator
//! drains, asks every registered [`SnapshotProvider`] for its snapshot and stats, rebuilds the
//! mirror from them and counts a resync. A snapshot whose figures disagree with the stats read
//! beside it (the allocator moved in between) is retried, and failing that, resynced again on
//! the next tick. An `oom` event gets a record and a dump (the snapshot taken at once, written
//! on a thread of its own), also when a resync's fence skips the event; an `oom` event that was
//! dropped still gets a record, marked [`event_lost`](crate::state::OomRecord::event_lost).
//! The host heap's counters come from its [`HostProvider`], when one is registered. Without a
//! provider, the state is marked partial.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use allocview_alloc::caching::stats::DeviceStats;
use allocview_alloc::event::{CPU_DEVICE, Event, EventAction, EventPool, now_ns};
use allocview_alloc::snapshot::Snapshot;
use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};

use crate::contexts::ContextCache;
use crate::dump::{DumpWriter, OomDumper};
use crate::histogram::DeviceHistograms;
use crate::mirror::{DeviceMirror, pool_key};
use crate::protocol::{DeviceUpdate, ServerFrame, StateUpdate, encode_frame};
use crate::provider::{HostProvider, SnapshotProvider};
use crate::server::RefusalCounts;
use crate::sink::{EventReceiver, OOM_DROP_DEVICES};
use crate::state::{
    AgentState, ContextFrames, DeviceState, HostState, NOT_WRITTEN, OomRecord, PipelineStats,
    ProcessInfo, RecentEvent, UsageSample, all_current, forgotten_oom_indices, keep_oom_record,
};
use crate::timeline::Timeline;

/// Default aggregation tick.
pub const DEFAULT_TICK: Duration = Duration::from_millis(100);

/// Clients get an update at most this often (10 Hz), whatever the tick.
pub const MIN_UPDATE_INTERVAL: Duration = Duration::from_millis(100);

/// How often clients get an update under a `tick`: updates go out on ticks, on the first tick
/// at least [`MIN_UPDATE_INTERVAL`] after the previous update, so every tick from 100 ms up,
/// and a faster tick's smallest multiple of at least 100 ms (every 2nd tick of 60 ms: 120 ms).
pub fn update_interval(tick: Duration) -> Duration {
    if tick.is_zero() || tick >= MIN_UPDATE_INTERVAL {
        return tick.max(MIN_UPDATE_INTERVAL);
    }
    let ticks = MIN_UPDATE_INTERVAL.as_nanos().div_ceil(tick.as_nanos());
    tick * u32::try_from(ticks).unwrap_or(u32::MAX)
}

/// Events kept per device for the trace view.
pub const DEFAULT_RECENT_EVENTS: usize = 1024;

/// OOM dumps written per agent at most: an OOM storm (a loop retrying a failed allocation)
/// must not fill the disk; later OOMs are still recorded, without files.
pub const DEFAULT_MAX_DUMPS: u64 = 32;

/// Attempts at a resync whose snapshot and stats agree, before trying again next tick.
const RESYNC_ATTEMPTS: usize = 3;

/// An encoded frame, shared by every client it goes to.
pub(crate) type Encoded = Arc<Vec<u8>>;

/// How the server and the aggregator share one client's fate.
#[derive(Debug, Default)]
pub(crate) struct ClientControl {
    /// Updates stop while set.
    pub paused: AtomicBool,
    /// The next frame is a full state (after a resume).
    pub want_full: AtomicBool,
    /// Set when the aggregator disconnects the client, with the reason.
    pub kicked: Mutex<Option<String>>,
}

impl ClientControl {
    pub(crate) fn kick(&self, reason: String) {
        let mut k = self.kicked.lock().unwrap_or_else(|p| p.into_inner());
        k.get_or_insert(reason);
    }

    /// Whether the client was disconnected (or left): its slot can go.
    pub(crate) fn is_kicked(&self) -> bool {
        self.kicked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    pub(crate) fn kicked(&self) -> Option<String> {
        self.kicked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The aggregator's end of one client.
#[derive(Debug)]
pub(crate) struct ClientSlot {
    pub id: u64,
    pub tx: Sender<Encoded>,
    pub control: Arc<ClientControl>,
}

/// What other threads ask of the aggregator.
pub(crate) enum Command {
    /// Drain everything published so far, resync if needed, then answer.
    Flush(Sender<()>),
    /// A consistent copy of the state, whole or only what `/metrics` shows.
    State(Sender<AgentState>, StateScope),
    /// A new client: send it the full state, then updates.
    AddClient(ClientSlot),
    /// Reset the agent's own peaks (devices without a provider).
    ResetPeaks,
    /// Drain, send the last update and stop.
    Shutdown,
}

/// How much of the state a [`Command::State`] copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateScope {
    /// Everything: segments, streams, pools, timeline, recent events and their frames, OOMs.
    Full,
    /// What [`prometheus::render`](crate::prometheus::render) reads: per device its index,
    /// memory, stats and per-pool histograms; the host counters; the pipeline. The segment map,
    /// streams, pools, timeline, recent events, the all-pool and per-stream histograms and OOM
    /// records stay empty, so a scrape neither copies the mirror, merges histograms it does not
    /// show nor resolves frames on the aggregator's thread.
    Metrics,
}

/// A handle to talk to the aggregator thread.
#[derive(Clone, Debug)]
pub(crate) struct AggregatorHandle {
    cmds: Sender<Command>,
    thread: Thread,
    /// Attach clients refused, counted by the server, reported in the pipeline stats.
    refusals: Arc<RefusalCounts>,
}

impl AggregatorHandle {
    /// The attach server's refusal counters (see [`RefusalCounts`]).
    pub fn refusals(&self) -> &RefusalCounts {
        &self.refusals
    }

    /// Sends a command and wakes the thread; false when the aggregator is gone.
    pub fn send(&self, cmd: Command) -> bool {
        let ok = self.cmds.send(cmd).is_ok();
        self.thread.unpark();
        ok
    }

    /// A consistent copy of the state, `None` when the aggregator is gone.
    pub fn state(&self) -> Option<AgentState> {
        self.state_of(StateScope::Full)
    }

    /// A consistent copy of what `/metrics` shows ([`StateScope::Metrics`]), `None` when the
    /// aggregator is gone.
    pub fn metrics_state(&self) -> Option<AgentState> {
        self.state_of(StateScope::Metrics)
    }

    fn state_of(&self, scope: StateScope) -> Option<AgentState> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        if !self.send(Command::State(tx, scope)) {
            return None;
        }
        rx.recv().ok()
    }

    /// Waits until everything published so far is folded in; false when the aggregator is gone.
    pub fn flush(&self) -> bool {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send(Command::Flush(tx)) && rx.recv().is_ok()
    }
}

/// Settings of the aggregator.
pub(crate) struct AggregatorConfig {
    pub tick: Duration,
    pub sample_interval: Duration,
    pub recent_events: usize,
    pub process: ProcessInfo,
    pub providers: Vec<Arc<dyn SnapshotProvider>>,
    pub host: Option<Arc<dyn HostProvider>>,
    pub dumper: OomDumper,
    pub max_dumps: u64,
}

/// How the aggregator learnt of an OOM ([`Aggregator::oom_record`]).
enum OomSeen<'a> {
    /// From its event, which carries the request.
    Event(&'a Event),
    /// From the drop count (its event was lost), with the snapshot the resync after it took.
    Lost(Option<Snapshot>),
}

/// What was last sent to clients, per device.
#[derive(Debug, Default)]
struct Sent {
    version: Option<u64>,
    hist_version: Option<u64>,
    stats: Option<DeviceStats>,
    memory: Option<(u64, Option<u64>)>,
    sample_time: u64,
    recent_seq: u64,
}

/// Events to skip after a resync: those the snapshot already holds, up to the provider's
/// `snapshot` marker.
#[derive(Debug, Clone, Copy)]
struct Fence {
    /// The marker's `time_ns` (the call's start) lies in `[from_ns, to_ns]`.
    from_ns: u64,
    to_ns: u64,
    /// At least as many events as the channels held when the snapshot returned (a waiting
    /// batch counts as `MAX_BATCH` events): the marker is among them unless it was dropped. A
    /// dropped marker also grew the drop count, so the next check resyncs again whatever this
    /// fence swallowed.
    remaining: usize,
}

/// Events a [`RecentRing`] stages before copying them into its ring in one go.
///
/// The ring of the default 1024 events (72 KiB) does not fit the L1 cache, so writing each
/// event straight into it misses on every store, and the next receive from the channel (a
/// locked compare-and-swap, a full fence) waits for that store: measured, 22 M events/s
/// folded against 26.5 M with an L1-sized ring. Staging 64 events (4.5 KiB, L1-resident) and
/// copying them as one block keeps the per-event store in L1 and lets the block copy overlap
/// its misses.
const RECENT_STAGE: usize = 64;

/// The last `cap` events of one device, oldest first: a ring of fixed capacity that a full
/// ring overwrites in place, fed through a small staging buffer ([`RECENT_STAGE`]).
#[derive(Debug, Default)]
struct RecentRing {
    cap: usize,
    /// Grows to `cap`, then is overwritten round-robin.
    slots: Vec<(u64, Event)>,
    /// Index of the oldest entry of `slots` once it is full (0 before).
    oldest: usize,
    /// Events newer than every entry of `slots`, not yet copied there.
    stage: Vec<(u64, Event)>,
}

impl RecentRing {
    fn new(cap: usize) -> RecentRing {
        RecentRing {
            cap,
            slots: Vec::new(),
            oldest: 0,
            stage: Vec::with_capacity(RECENT_STAGE.min(cap)),
        }
    }

    #[inline]
    fn push(&mut self, seq: u64, e: &Event) {
        self.stage.push((seq, *e));
        if self.stage.len() >= RECENT_STAGE.min(self.cap) {
            self.flush();
        }
    }

    /// Copies the staged events into the ring (only the last `cap` of them can stay).
    fn flush(&mut self) {
        let take = self.stage.len().min(self.cap);
        let mut src = &self.stage[self.stage.len() - take..];
        if self.slots.len() < self.cap {
            let n = (self.cap - self.slots.len()).min(src.len());
            self.slots.extend_from_slice(&src[..n]);
            src = &src[n..];
        }
        while !src.is_empty() {
            let n = (self.cap - self.oldest).min(src.len());
            self.slots[self.oldest..self.oldest + n].copy_from_slice(&src[..n]);
            self.oldest += n;
            if self.oldest == self.cap {
                self.oldest = 0;
            }
            src = &src[n..];
        }
        self.stage.clear();
    }

    /// Entries after `seq` among the last `cap`, oldest first.
    fn since(&self, seq: u64) -> impl Iterator<Item = &(u64, Event)> {
        let (new, old) = self.slots.split_at(self.oldest);
        let total = self.slots.len() + self.stage.len();
        old.iter()
            .chain(new)
            .chain(&self.stage)
            .skip(total.saturating_sub(self.cap))
            .skip_while(move |(s, _)| *s <= seq)
    }
}

/// The devices seen so far, sorted by device number, with the last one used remembered:
/// events of one device come in long runs, so the hot path skips the search.
#[derive(Default)]
struct Devices {
    list: Vec<DeviceAgg>,
    last: usize,
}

impl Devices {
    /// The device's aggregate, created on first use.
    #[inline(always)]
    fn entry(&mut self, device: i32, sample_interval: Duration, recent: usize) -> &mut DeviceAgg {
        if self.list.get(self.last).is_some_and(|d| d.device == device) {
            return &mut self.list[self.last];
        }
        self.find_or_add(device, sample_interval, recent)
    }

    #[cold]
    #[inline(never)]
    fn find_or_add(
        &mut self,
        device: i32,
        sample_interval: Duration,
        recent: usize,
    ) -> &mut DeviceAgg {
        let i = match self.list.binary_search_by_key(&device, |d| d.device) {
            Ok(i) => i,
            Err(i) => {
                self.list
                    .insert(i, DeviceAgg::new(device, sample_interval, recent));
                i
            }
        };
        self.last = i;
        &mut self.list[i]
    }

    fn values(&self) -> std::slice::Iter<'_, DeviceAgg> {
        self.list.iter()
    }

    fn values_mut(&mut self) -> std::slice::IterMut<'_, DeviceAgg> {
        self.list.iter_mut()
    }
}

struct DeviceAgg {
    device: i32,
    fence: Option<Fence>,
    mirror: DeviceMirror,
    hist: DeviceHistograms,
    timeline: Timeline,
    recent: RecentRing,
    contexts: ContextCache,
    /// Sequence number of the last recent event whose context id was noted.
    contexts_noted: u64,
    total_memory: u64,
    allowed: Option<u64>,
    provider: Option<Arc<dyn SnapshotProvider>>,
    sent: Sent,
    /// The aggregator's sequence number of this device's last event.
    last_seq: u64,
    /// `last_seq` at the previous tick: equal means the device went quiet.
    last_seq_at_tick: u64,
}

impl DeviceAgg {
    fn new(device: i32, sample_interval: Duration, recent: usize) -> DeviceAgg {
        DeviceAgg {
            device,
            fence: None,
            mirror: DeviceMirror::new(device, None),
            hist: DeviceHistograms::default(),
            timeline: Timeline::new(sample_interval.as_nanos() as u64),
            recent: RecentRing::new(recent),
            contexts: ContextCache::new(),
            contexts_noted: 0,
            total_memory: 0,
            allowed: None,
            provider: None,
            sent: Sent::default(),
            last_seq: 0,
            last_seq_at_tick: 0,
        }
    }

    /// Rebuilds the mirror from the provider: whether the view was consistent, and the
    /// snapshot it was rebuilt from (`None`: no provider, nothing done).
    ///
    /// A provider that gives the snapshot and its stats of one moment
    /// ([`SnapshotProvider::snapshot_with_stats`], the caching allocator) is consistent at
    /// once. Otherwise the stats are read before and after the snapshot: when they are equal, no
    /// call changed the allocator in between, so the snapshot and the stats describe the same
    /// moment. With `rx` given, a fence then skips the events the snapshot already holds
    /// (everything up to the provider's `snapshot` marker).
    fn resync(&mut self, rx: Option<&EventReceiver>) -> Option<(bool, Snapshot)> {
        let p = self.provider.clone()?;
        if let Some((total, allowed)) = p.memory_info() {
            self.total_memory = total;
            self.allowed = allowed;
        }
        let mut attempt = 1;
        loop {
            let from_ns = now_ns();
            let (snapshot, stats, consistent) = match p.snapshot_with_stats() {
                Some((snapshot, stats)) => (snapshot, stats, true),
                None => {
                    let before = p.device_stats();
                    let snapshot = p.snapshot();
                    let after = p.device_stats();
                    let consistent = before == after;
                    (snapshot, after, consistent)
                }
            };
            let to_ns = now_ns();
            // Only this thread receives, so the channels hold at least this many events from
            // the snapshot's return on.
            let remaining = rx.map_or(0, EventReceiver::pending_events_bound);
            if consistent || attempt >= RESYNC_ATTEMPTS {
                self.mirror.resync(&snapshot, stats);
                self.fence = (rx.is_some() && p.marks_snapshots()).then_some(Fence {
                    from_ns,
                    to_ns,
                    remaining,
                });
                return Some((consistent, snapshot));
            }
            attempt += 1;
        }
    }

    /// Whether the fence swallows this event (it is already in the resync's snapshot). Sets
    /// `lost_marker` when the fence ran out without meeting the marker (it was dropped).
    fn fenced(&mut self, e: &Event, lost_marker: &mut bool) -> bool {
        let Some(f) = &mut self.fence else {
            return false;
        };
        if f.remaining == 0 {
            self.fence = None;
            *lost_marker = true;
            return false;
        }
        f.remaining -= 1;
        if e.action == EventAction::Snapshot && (f.from_ns..=f.to_ns).contains(&e.time_ns) {
            self.fence = None;
        }
        true
    }

    fn sample(&self, time_ns: u64) -> UsageSample {
        let s = self.mirror.stats();
        UsageSample {
            time_ns,
            allocated: all_current(&s.allocated_bytes),
            reserved: all_current(&s.reserved_bytes),
            active: all_current(&s.active_bytes),
        }
    }

    fn recent_since(&self, seq: u64) -> Vec<RecentEvent> {
        self.recent
            .since(seq)
            .map(|(s, e)| recent_event(*s, e))
            .collect()
    }

    /// Notes the context ids of the recent events that came since the last time (only the
    /// recent events show frames, so ids are looked at here, once a tick, not per event
    /// folded), asks the provider for the new ones, and drops resolved ids no recent event
    /// uses once there are many.
    fn resolve_contexts(&mut self) {
        let Some(p) = &self.provider else {
            return;
        };
        for (seq, e) in self.recent.since(self.contexts_noted) {
            self.contexts.note(e.context);
            self.contexts_noted = *seq;
        }
        if self.contexts.has_wanted() {
            self.contexts.resolve(p.as_ref());
            self.contexts
                .trim(self.recent.since(0).map(|(_, e)| e.context));
        }
    }

    /// The frames of the context ids of `recent`.
    fn contexts_of(&self, recent: &[RecentEvent]) -> Vec<ContextFrames> {
        self.contexts.frames_of(recent.iter().map(|e| e.context))
    }

    fn state(&self, scope: StateScope) -> DeviceState {
        if scope == StateScope::Metrics {
            return DeviceState {
                device: self.mirror.device(),
                total_memory: self.total_memory,
                allowed_memory: self.allowed,
                stats: self.mirror.stats().clone(),
                histograms: self.hist.pool_summary(),
                ..DeviceState::default()
            };
        }
        let recent = self.recent_since(0);
        DeviceState {
            contexts: self.contexts_of(&recent),
            device: self.mirror.device(),
            total_memory: self.total_memory,
            allowed_memory: self.allowed,
            stats: self.mirror.stats().clone(),
            segments: self.mirror.segments(),
            streams: self.mirror.streams(),
            pools: self.mirror.pools(),
            timeline: self.timeline.samples(),
            histograms: self.hist.summary(),
            recent,
        }
    }

    /// What changed since the last update; advances the marks.
    fn update(&mut self) -> Option<DeviceUpdate> {
        let mut u = DeviceUpdate {
            device: self.mirror.device(),
            ..DeviceUpdate::default()
        };
        let mut changed = false;
        let memory = (self.total_memory, self.allowed);
        if self.sent.memory != Some(memory) {
            self.sent.memory = Some(memory);
            u.total_memory = Some(memory);
            changed = true;
        }
        if self.sent.stats.as_ref() != Some(self.mirror.stats()) {
            self.sent.stats = Some(self.mirror.stats().clone());
            u.stats = self.sent.stats.clone();
            changed = true;
        }
        if self.sent.version != Some(self.mirror.version()) {
            self.sent.version = Some(self.mirror.version());
            u.segments = Some(self.mirror.segments());
            u.streams = Some(self.mirror.streams());
            u.pools = Some(self.mirror.pools());
            changed = true;
        }
        if self.sent.hist_version != Some(self.hist.version()) {
            self.sent.hist_version = Some(self.hist.version());
            u.histograms = Some(self.hist.summary());
            changed = true;
        }
        u.timeline = self.timeline.since(self.sent.sample_time);
        self.sent.sample_time = self.timeline.last_time();
        u.recent = self.recent_since(self.sent.recent_seq);
        u.contexts = self.contexts_of(&u.recent);
        if let Some(last) = u.recent.last() {
            self.sent.recent_seq = last.seq;
        }
        changed |= !u.timeline.is_empty() || !u.recent.is_empty();
        changed.then_some(u)
    }

    /// Marks everything as sent (a full state went out to the only client).
    fn mark_sent(&mut self) {
        self.sent = Sent::default();
        let _ = self.update();
    }
}

fn recent_event(seq: u64, e: &Event) -> RecentEvent {
    RecentEvent {
        seq,
        time_ns: e.time_ns,
        action: e.action.as_str().to_string(),
        addr: e.addr,
        size: e.size,
        requested: e.requested,
        stream: e.stream,
        pool: pool_key(e),
        flags: e.flags,
        latency_ns: e.latency_ns,
        context: e.context,
    }
}

/// The aggregator: owned by its thread.
pub(crate) struct Aggregator {
    cfg: AggregatorConfig,
    rx: EventReceiver,
    cmds: Receiver<Command>,
    devices: Devices,
    host: Option<HostState>,
    /// The kept OOM records ([`keep_oom_record`]), by index.
    ooms: Vec<OomRecord>,
    /// Every OOM seen, kept or not.
    ooms_total: u64,
    /// Indices of the records to send in the next update: new, or their dump landed.
    ooms_changed: Vec<u64>,
    /// `Oom` events dropped per device, as last counted: each one dropped since gets a record.
    seen_dropped_ooms: [u64; OOM_DROP_DEVICES + 1],
    dumps: DumpWriter,
    ingested: u64,
    seq: u64,
    resyncs: u64,
    inconsistencies: u64,
    dumps_written: u64,
    dump_failures: u64,
    seen_dropped: u64,
    needs_resync: bool,
    partial: bool,
    clients: Vec<ClientSlot>,
    /// Attach clients refused (shared with the handle the server counts through).
    refusals: Arc<RefusalCounts>,
    /// When clients last got an update.
    last_broadcast: Instant,
}

/// Starts the aggregator thread.
pub(crate) fn spawn(
    cfg: AggregatorConfig,
    rx: EventReceiver,
) -> std::io::Result<(AggregatorHandle, thread::JoinHandle<()>)> {
    let dumps = DumpWriter::new(cfg.dumper.clone(), cfg.process.pid);
    spawn_with_dumps(cfg, rx, dumps)
}

/// [`spawn`] with the given dump writer.
fn spawn_with_dumps(
    cfg: AggregatorConfig,
    rx: EventReceiver,
    dumps: DumpWriter,
) -> std::io::Result<(AggregatorHandle, thread::JoinHandle<()>)> {
    let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
    let refusals = Arc::new(RefusalCounts::default());
    let mut agg = Aggregator {
        cfg,
        rx,
        cmds: cmd_rx,
        devices: Devices::default(),
        host: None,
        ooms: Vec::new(),
        ooms_total: 0,
        ooms_changed: Vec::new(),
        seen_dropped_ooms: [0; OOM_DROP_DEVICES + 1],
        dumps,
        ingested: 0,
        seq: 0,
        resyncs: 0,
        inconsistencies: 0,
        dumps_written: 0,
        dump_failures: 0,
        seen_dropped: 0,
        needs_resync: false,
        partial: false,
        clients: Vec::new(),
        refusals: refusals.clone(),
        last_broadcast: Instant::now(),
    };
    for p in agg.cfg.providers.clone() {
        let d = agg.device_mut(p.device());
        d.provider = Some(p);
        // Nothing can have published into this agent yet: no fence.
        d.resync(None);
    }
    let join = crate::agent_thread::spawn("allocview-aggregator", move || agg.run())?;
    let handle = AggregatorHandle {
        cmds: cmd_tx,
        thread: join.thread().clone(),
        refusals,
    };
    Ok((handle, join))
}

impl Aggregator {
    fn device_mut(&mut self, device: i32) -> &mut DeviceAgg {
        let interval = self.cfg.sample_interval;
        self.devices.entry(device, interval, self.cfg.recent_events)
    }

    fn run(mut self) {
        self.rx.shared().set_consumer(thread::current());
        let mut next_tick = Instant::now() + self.cfg.tick;
        loop {
            let now = Instant::now();
            if now < next_tick {
                thread::park_timeout(next_tick - now);
            }
            self.rx.shared().clear_wake();
            let mut shutdown = false;
            while let Ok(cmd) = self.cmds.try_recv() {
                match cmd {
                    Command::Flush(reply) => {
                        self.drain();
                        self.check_resync();
                        self.settle_dumps(true);
                        let _ = reply.send(());
                    }
                    Command::State(reply, scope) => {
                        self.drain();
                        if scope == StateScope::Full {
                            self.resolve_contexts();
                        }
                        let _ = reply.send(self.state(scope));
                    }
                    Command::AddClient(slot) => self.add_client(slot),
                    Command::ResetPeaks => {
                        for d in self.devices.values_mut() {
                            if d.provider.is_none() {
                                d.mirror.reset_peaks();
                            }
                        }
                        if let Some(h) = &mut self.host {
                            h.allocations.reset_peak();
                            h.bytes.reset_peak();
                        }
                    }
                    Command::Shutdown => shutdown = true,
                }
            }
            self.drain();
            self.settle_dumps(false);
            if shutdown || Instant::now() >= next_tick {
                self.tick(shutdown);
                next_tick = Instant::now() + self.cfg.tick;
            }
            if shutdown {
                // Each client's writer sends what is queued (this tick's last update), then
                // finds the queue closed and says goodbye.
                self.clients.clear();
                return;
            }
        }
    }

    /// Folds in the events in both channels now (not those published while draining: the
    /// pass is bounded by what each channel held when it started, so a flood cannot starve
    /// commands and ticks): first the single events, then the batches, each batch's events in
    /// order. Order between the two channels does not matter: a producer publishes through one
    /// of them (see the sink's module documentation).
    ///
    /// Single events are software-pipelined by one: the next event is received before the
    /// current one is folded. An event comes from a slot the publishing core wrote, so reading
    /// it misses the cache; received ahead, that miss overlaps the folding of the previous one
    /// instead of stalling the fold that needs it (perf: ~12% of the aggregator's time waited
    /// there). A batch is received whole (one copy of its 2 KiB message, whose misses overlap
    /// one another) and then folded.
    ///
    /// Lifts the sink's full-channel latches before and after, and after every
    /// `resume_interval` events taken from the event channel or `batch_resume_interval` batches
    /// taken from the batch channel, so publishers fill the room made.
    fn drain(&mut self) {
        let singles = self.rx.len();
        let batches = self.rx.batch_len();
        self.rx.shared().resume();
        if singles > 0 {
            self.drain_singles(singles);
        }
        if batches > 0 {
            self.drain_batches(batches);
        }
        self.rx.shared().resume();
    }

    /// Folds in at most `bound` events of the event channel.
    fn drain_singles(&mut self, bound: usize) {
        let every = self.rx.shared().resume_interval();
        let mut taken = 0;
        let mut receive = |rx: &EventReceiver| {
            if taken == bound {
                return Err(TryRecvError::Empty);
            }
            let e = rx.try_recv_in_place();
            taken += usize::from(e.is_ok());
            e
        };
        let mut next = receive(&self.rx);
        let mut since_resume = 0;
        while let Ok(e) = next {
            next = receive(&self.rx);
            self.ingest(&e);
            since_resume += 1;
            if since_resume == every {
                self.rx.shared().resume();
                since_resume = 0;
            }
        }
    }

    /// Folds in at most `bound` batches of the batch channel.
    fn drain_batches(&mut self, bound: usize) {
        let every = self.rx.shared().batch_resume_interval();
        let mut since_resume = 0;
        for _ in 0..bound {
            let received = self.rx.try_recv_batch_in_place();
            let Ok(batch) = &received else {
                break;
            };
            for e in batch.events() {
                self.ingest(e);
            }
            since_resume += 1;
            if since_resume == every {
                self.rx.shared().resume();
                since_resume = 0;
            }
        }
    }

    fn ingest(&mut self, e: &Event) {
        self.ingested += 1;
        if e.pool == EventPool::Host || e.device == CPU_DEVICE {
            self.ingest_host(e);
            return;
        }
        self.seq += 1;
        let seq = self.seq;
        let recent_cap = self.cfg.recent_events;
        let device = i32::from(e.device);
        let interval = self.cfg.sample_interval;
        // One lookup per event: the mirror, histograms and recent events all hang off it.
        let d = self.devices.entry(device, interval, recent_cap);
        d.last_seq = seq;
        if recent_cap > 0 {
            d.recent.push(seq, e);
        }
        let mut lost_marker = false;
        if !d.fenced(e, &mut lost_marker) {
            if lost_marker {
                self.needs_resync = true;
            }
            match d.mirror.apply(e) {
                Ok(applied) => {
                    let pool = applied.pool.unwrap_or_else(|| pool_key(e));
                    match e.action {
                        EventAction::Alloc => {
                            d.hist
                                .record_alloc(pool, e.stream, e.requested, e.latency_ns)
                        }
                        EventAction::FreeCompleted | EventAction::Free => {
                            if let Some(l) = applied.lifetime_ns {
                                d.hist.record_lifetime(pool, e.stream, l);
                            }
                        }
                        _ => {}
                    }
                }
                Err(err) => {
                    self.inconsistencies += 1;
                    self.needs_resync = true;
                    tracing::debug!(device = e.device, %err, "event does not fit the mirror");
                }
            }
        }
        // Fenced or not (a fenced one is already in the resync's stats), an OOM gets its
        // record and dump; the mirror never refuses an `oom` event.
        if e.action == EventAction::Oom {
            self.on_oom(e);
        }
    }

    /// A host (CPU) allocator's event: counts only.
    fn ingest_host(&mut self, e: &Event) {
        let h = self.host.get_or_insert_with(HostState::default);
        match e.action {
            EventAction::Alloc => {
                h.allocations.update(1);
                h.bytes.update(e.size as i64);
            }
            EventAction::FreeRequested | EventAction::FreeCompleted | EventAction::Free => {
                h.allocations.update(-1);
                h.bytes.update(-(e.size as i64));
            }
            EventAction::ResetPeaks => {
                h.allocations.reset_peak();
                h.bytes.reset_peak();
            }
            _ => {}
        }
    }

    fn on_oom(&mut self, e: &Event) {
        let device = i32::from(e.device);
        let time_ns = if e.time_ns != 0 { e.time_ns } else { now_ns() };
        self.ooms_total += 1;
        let rec = self.oom_record(self.ooms_total, device, time_ns, OomSeen::Event(e));
        tracing::error!(
            oom = rec.index,
            device,
            requested = rec.requested,
            device_free = rec.device_free,
            allocated = rec.allocated,
            reserved = rec.reserved,
            "allocation failed: out of memory"
        );
        self.keep_oom(rec);
    }

    /// The record of OOM number `index` on `device`, with the request's facts from its event
    /// (when seen), the mirror's figures now and its dump started (or the reason it is not
    /// written): of the snapshot a resync just took after a lost OOM, else of a snapshot taken
    /// now. The dump carries the record ([`DumpedOom`]), so that it tells what failed even
    /// without a trace.
    fn oom_record(
        &mut self,
        index: u64,
        device: i32,
        time_ns: u64,
        seen: OomSeen<'_>,
    ) -> OomRecord {
        let started = self.dumps_written + self.dump_failures + self.dumps.pending() as u64;
        let interval = self.cfg.sample_interval;
        let d = self.devices.entry(device, interval, self.cfg.recent_events);
        let s = d.mirror.stats();
        let mut rec = OomRecord {
            index,
            time_ns,
            device,
            allocated: all_current(&s.allocated_bytes),
            reserved: all_current(&s.reserved_bytes),
            largest_free_block: d.mirror.largest_free_block(),
            inactive_split_bytes: all_current(&s.inactive_split_bytes),
            total_memory: d.total_memory,
            ..OomRecord::default()
        };
        let resync_snapshot = match seen {
            OomSeen::Event(e) => {
                rec.stream = e.stream;
                rec.requested = e.requested;
                rec.rounded = e.size;
                rec.device_free = e.addr;
                None
            }
            OomSeen::Lost(resync_snapshot) => {
                rec.event_lost = true;
                resync_snapshot
            }
        };
        if started >= self.cfg.max_dumps {
            rec.dump_error = Some(format!(
                "{NOT_WRITTEN}this agent writes at most {} OOM dumps (AgentBuilder::max_dumps)",
                self.cfg.max_dumps
            ));
            return rec;
        }
        // The snapshot is taken now, the moment after the OOM (or, for OOMs whose events were
        // dropped, is the resync's, taken after them); encoding and writing it happen on the
        // dump thread.
        let mut snapshot = match (resync_snapshot, &d.provider) {
            (Some(resync), _) => resync,
            (None, Some(p)) => p.snapshot(),
            (None, None) => Snapshot {
                segments: d.mirror.segments(),
                ..Snapshot::default()
            },
        };
        rec.put_in(&mut snapshot);
        self.dumps.start(index, snapshot);
        rec.dump_pending = true;
        rec
    }

    fn keep_oom(&mut self, rec: OomRecord) {
        self.note_oom_changed(rec.index);
        keep_oom_record(&mut self.ooms, rec);
    }

    /// Queues record `index` for the next update (clients that connect later get it in their
    /// full state, so nothing is queued while none is connected).
    fn note_oom_changed(&mut self, index: u64) {
        if !self.clients.is_empty() {
            self.ooms_changed.push(index);
        }
    }

    /// Folds in the outcomes of the dumps written since the last call; with `wait`, waits for
    /// every dump started.
    fn settle_dumps(&mut self, wait: bool) {
        if self.dumps.pending() == 0 {
            return;
        }
        for (index, outcome) in self.dumps.poll(wait) {
            let (paths, error) = match outcome {
                Ok(paths) => {
                    self.dumps_written += 1;
                    tracing::info!(oom = index, dump = ?paths, "OOM dump written");
                    (paths, None)
                }
                Err(err) => {
                    self.dump_failures += 1;
                    tracing::error!(oom = index, %err, "could not write the OOM dump");
                    (Vec::new(), Some(err.to_string()))
                }
            };
            // A record forgotten meanwhile (an OOM storm) still had its dump counted.
            if let Ok(i) = self.ooms.binary_search_by_key(&index, |r| r.index) {
                let rec = &mut self.ooms[i];
                rec.dump_paths = paths;
                rec.dump_error = error;
                rec.dump_pending = false;
                self.note_oom_changed(index);
            }
        }
    }

    /// Records the OOMs whose events were dropped since the last call (the sink counts them per
    /// device), after a resync that took `snapshots` (by device): the request's facts went
    /// with the event, but the OOM is not left out of the list.
    fn record_lost_ooms(&mut self, mut snapshots: Vec<(i32, Snapshot)>) {
        let counts = self.rx.shared().dropped_ooms_by_device();
        let seen = std::mem::replace(&mut self.seen_dropped_ooms, counts);
        for (i, (&count, &seen)) in counts.iter().zip(&seen).enumerate() {
            if count > seen {
                let device = (i < OOM_DROP_DEVICES).then_some(i as i32);
                let snapshot = device
                    .and_then(|d| snapshots.iter().position(|(s, _)| *s == d))
                    .map(|at| snapshots.swap_remove(at).1);
                self.record_lost(device, count - seen, snapshot);
            }
        }
    }

    /// Records `lost` OOMs of `device` (`None`: not known) whose events were dropped. The first
    /// gets the dump, of `resync_snapshot` (the moment after the resync), else of a snapshot
    /// taken now; the others would only repeat it. Only records that stay kept are built
    /// ([`keep_oom_record`]), so a huge count costs no more than the list's bound.
    fn record_lost(&mut self, device: Option<i32>, lost: u64, resync_snapshot: Option<Snapshot>) {
        tracing::error!(
            device,
            lost,
            "allocation failed: out of memory (the OOM's event was dropped: the channel was full)"
        );
        let time_ns = now_ns();
        let first = self.ooms_total + 1;
        let last = self.ooms_total + lost;
        self.ooms_total = last;
        let rec = match device {
            Some(device) => self.oom_record(first, device, time_ns, OomSeen::Lost(resync_snapshot)),
            None => OomRecord {
                index: first,
                time_ns,
                device: -1,
                dump_error: Some(format!("{NOT_WRITTEN}the OOM's device is not known")),
                event_lost: true,
                ..OomRecord::default()
            },
        };
        // The others are the same moment: copies of the first, without its dump.
        let other = OomRecord {
            dump_pending: false,
            dump_paths: Vec::new(),
            dump_error: Some(match device {
                Some(_) => format!("{NOT_WRITTEN}OOM #{first} has the snapshot of the same moment"),
                None => format!("{NOT_WRITTEN}the OOM's device is not known"),
            }),
            ..rec.clone()
        };
        self.keep_oom(rec);
        // The indices outside the forgotten gap (none: an empty gap past the last).
        let (gap_from, gap_to) =
            forgotten_oom_indices(last).map_or((last + 1, last), |f| (*f.start(), *f.end()));
        let kept = (first + 1..=last.min(gap_from - 1)).chain((first + 1).max(gap_to + 1)..=last);
        for index in kept {
            self.keep_oom(OomRecord {
                index,
                ..other.clone()
            });
        }
    }

    fn check_resync(&mut self) {
        let dropped = self.rx.shared().dropped_total();
        if dropped == self.seen_dropped && !self.needs_resync {
            // A producer counts a dropped OOM after its drop (two relaxed adds): a resync that
            // read the total between the two did not see the OOM, which is recorded now.
            if self.rx.shared().dropped_ooms_by_device() != self.seen_dropped_ooms {
                self.record_lost_ooms(Vec::new());
            }
            return;
        }
        // Events already in the channels predate the snapshot: fold them in first.
        self.drain();
        let dropped = self.rx.shared().dropped_total();
        self.seen_dropped = dropped;
        self.needs_resync = false;
        let mut any = false;
        let mut all_consistent = true;
        if let (Some(h), Some(p)) = (&mut self.host, &self.cfg.host) {
            // The heap's counters are relaxed reads of per-thread slots: a call running
            // meanwhile may be counted there and also arrive as an event (or the reverse);
            // the next drop resyncs again.
            *h = HostState::from_heap(&p.heap_stats(), h);
            any = true;
        }
        let mut snapshots = Vec::new();
        for d in self.devices.values_mut() {
            match d.resync(Some(&self.rx)) {
                Some((consistent, snapshot)) => {
                    any = true;
                    all_consistent &= consistent;
                    snapshots.push((d.mirror.device(), snapshot));
                }
                None if dropped > 0 => self.partial = true,
                None => {}
            }
        }
        if any {
            self.resyncs += 1;
            self.needs_resync = !all_consistent;
            tracing::warn!(
                dropped,
                resyncs = self.resyncs,
                "events were lost; stats and segments resynchronised from the allocator"
            );
        } else if dropped > 0 {
            self.partial = true;
            tracing::warn!(
                dropped,
                "events were lost and no allocator can be asked: figures are partial"
            );
        }
        self.record_lost_ooms(snapshots);
    }

    /// Resolves the context ids noted since the last time, on every device.
    fn resolve_contexts(&mut self) {
        for d in self.devices.values_mut() {
            d.resolve_contexts();
        }
    }

    /// Samples usage and sends clients an update, at most every [`MIN_UPDATE_INTERVAL`] (and
    /// always with `last`, at shutdown).
    fn tick(&mut self, last: bool) {
        // A device quiet since the last tick may still hold the last events its allocator
        // gathered: ask for them (without waiting), and fold what comes before sampling.
        let mut asked = false;
        for d in self.devices.values_mut() {
            if d.last_seq == d.last_seq_at_tick
                && let Some(p) = &d.provider
            {
                p.flush_idle_events();
                asked = true;
            }
            d.last_seq_at_tick = d.last_seq;
        }
        if asked {
            self.drain();
        }
        self.check_resync();
        if last {
            // The last update carries every dump's outcome, those the resync above started too.
            self.settle_dumps(true);
        }
        let now = now_ns();
        for d in self.devices.values_mut() {
            let s = d.sample(now);
            d.timeline.record(s);
        }
        // Every tick, while the allocator still keeps the ids just seen.
        self.resolve_contexts();
        if !self.clients.is_empty()
            && (last || self.last_broadcast.elapsed() >= MIN_UPDATE_INTERVAL)
        {
            self.last_broadcast = Instant::now();
            self.broadcast();
        }
    }

    fn pipeline(&self) -> PipelineStats {
        let shared = self.rx.shared();
        let by_action = shared.dropped_by_action();
        PipelineStats {
            events_ingested: self.ingested,
            dropped_total: by_action.iter().sum(),
            dropped_by_action: by_action
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .filter_map(|(i, n)| {
                    EventAction::from_u8(i as u8).map(|a| (a.as_str().to_string(), *n))
                })
                .collect(),
            resyncs: self.resyncs,
            inconsistencies: self.inconsistencies,
            channel_capacity: shared.capacity() as u64,
            paused: false,
            dumps_written: self.dumps_written,
            dump_failures: self.dump_failures,
            partial: self.partial,
            clients: self.clients.len() as u64,
            ooms_total: self.ooms_total,
            refused_clients: self.refusals.nonzero(),
        }
    }

    fn state(&self, scope: StateScope) -> AgentState {
        AgentState {
            process: self.cfg.process.clone(),
            devices: self.devices.values().map(|d| d.state(scope)).collect(),
            host: self.host,
            pipeline: self.pipeline(),
            ooms: match scope {
                StateScope::Full => self.ooms.clone(),
                StateScope::Metrics => Vec::new(),
            },
            time_ns: now_ns(),
        }
    }

    fn full_frame(&self) -> Option<Encoded> {
        let frame = ServerFrame::Full {
            state: Box::new(self.state(StateScope::Full)),
        };
        match encode_frame(&frame) {
            Ok(bytes) => Some(Arc::new(bytes)),
            Err(err) => {
                tracing::error!(%err, "could not encode the state");
                None
            }
        }
    }

    fn add_client(&mut self, slot: ClientSlot) {
        if self.clients.is_empty() {
            for d in self.devices.values_mut() {
                d.mark_sent();
            }
            self.ooms_changed.clear();
        }
        self.resolve_contexts();
        let Some(full) = self.full_frame() else {
            slot.control
                .kick("the agent could not encode its state".into());
            return;
        };
        if slot.tx.try_send(full).is_ok() {
            self.clients.push(slot);
        }
    }

    /// The kept records among those changed since the last update, once each, by index.
    fn changed_ooms(&mut self) -> Vec<OomRecord> {
        let mut changed = std::mem::take(&mut self.ooms_changed);
        changed.sort_unstable();
        changed.dedup();
        changed
            .into_iter()
            .filter_map(|i| {
                let at = self.ooms.binary_search_by_key(&i, |r| r.index).ok()?;
                Some(self.ooms[at].clone())
            })
            .collect()
    }

    fn broadcast(&mut self) {
        let update = StateUpdate {
            time_ns: now_ns(),
            pipeline: self.pipeline(),
            devices: self
                .devices
                .values_mut()
                .filter_map(DeviceAgg::update)
                .collect(),
            host: self.host,
            new_ooms: self.changed_ooms(),
        };
        let frame = ServerFrame::Update {
            update: Box::new(update),
        };
        let encoded = match encode_frame(&frame) {
            Ok(b) => Arc::new(b),
            Err(err) => {
                tracing::error!(%err, "could not encode an update");
                return;
            }
        };
        let mut full: Option<Encoded> = None;
        let clients = std::mem::take(&mut self.clients);
        for c in clients {
            if c.control.is_kicked() {
                // Gone (a paused client that left is never sent to, so `try_send` would not
                // find out).
                continue;
            }
            if c.control.paused.load(Ordering::Acquire) {
                self.clients.push(c);
                continue;
            }
            let frame = if c.control.want_full.swap(false, Ordering::AcqRel) {
                if full.is_none() {
                    full = self.full_frame();
                }
                match &full {
                    Some(f) => f.clone(),
                    None => continue,
                }
            } else {
                encoded.clone()
            };
            match c.tx.try_send(frame) {
                Ok(()) => self.clients.push(c),
                Err(TrySendError::Full(_)) => {
                    let reason = format!(
                        "client too slow: {} updates queued and unread",
                        c.tx.capacity().unwrap_or(0)
                    );
                    tracing::warn!(client = c.id, %reason, "disconnecting attach client");
                    c.control.kick(reason);
                }
                Err(TrySendError::Disconnected(_)) => {
                    tracing::debug!(client = c.id, "attach client left");
                }
            }
        }
    }
}

/// Where OOM dumps go when nothing else is configured.
pub const DEFAULT_DUMP_DIR: &str = "allocview-dumps";

/// The dump folder: `ALLOCVIEW_DUMP_DIR`, else [`DEFAULT_DUMP_DIR`] in the working directory.
pub fn default_dump_dir() -> PathBuf {
    std::env::var_os("ALLOCVIEW_DUMP_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DUMP_DIR))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_go_out_on_the_first_tick_at_least_100_ms_after_the_last() {
        let ms = Duration::from_millis;
        assert_eq!(update_interval(ms(100)), ms(100));
        assert_eq!(update_interval(ms(300)), ms(300));
        assert_eq!(update_interval(ms(60)), ms(120));
        assert_eq!(update_interval(ms(50)), ms(100));
        assert_eq!(update_interval(ms(1)), ms(100));
        assert_eq!(update_interval(ms(0)), ms(100));
    }
    use crate::protocol::{MAX_SERVER_FRAME, read_frame};
    use allocview_alloc::event::EventSink;

    /// The frames a client slot received until one satisfies `want`; panics after 20 s.
    fn frame_until(rx: &Receiver<Encoded>, want: impl Fn(&StateUpdate) -> bool) -> StateUpdate {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let bytes = rx.recv_timeout(left).expect("an update in time");
            let frame: ServerFrame = read_frame(&mut bytes.as_slice(), MAX_SERVER_FRAME).unwrap();
            if let ServerFrame::Update { update } = frame
                && want(&update)
            {
                return *update;
            }
        }
    }

    #[test]
    fn a_record_is_sent_when_new_then_again_when_its_dump_lands() {
        let dir = tempfile::tempdir().unwrap();
        let dumper = OomDumper::new(dir.path());
        // The dump waits for the gate: the record is out while its dump is still being written.
        let (gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(0);
        let inner = dumper.clone();
        let write: crate::dump::WriteDump = Arc::new(move |index, snapshot| {
            let _ = gate_rx.recv();
            inner.write(index, 7, snapshot)
        });
        let dumps = DumpWriter::with_write(dumper.clone(), 7, write);
        let (sink, rx) = crate::sink::channel(1024);
        let cfg = AggregatorConfig {
            tick: Duration::from_millis(5),
            sample_interval: Duration::from_secs(1),
            recent_events: 16,
            process: ProcessInfo::default(),
            providers: Vec::new(),
            host: None,
            dumper,
            max_dumps: 4,
        };
        let (handle, join) = spawn_with_dumps(cfg, rx, dumps).unwrap();
        let (tx, client) = crossbeam_channel::bounded(1024);
        handle.send(Command::AddClient(ClientSlot {
            id: 1,
            tx,
            control: Arc::new(ClientControl::default()),
        }));
        sink.publish(&Event {
            requested: 3 << 20,
            ..Event::new(EventAction::Oom, 0, EventPool::Large, 1 << 20, 4 << 20)
        });
        let first = frame_until(&client, |u| !u.new_ooms.is_empty());
        assert_eq!(first.new_ooms.len(), 1);
        assert!(first.new_ooms[0].dump_pending);
        assert!(first.new_ooms[0].dump_paths.is_empty());
        gate_tx.send(()).unwrap();
        let landed = frame_until(&client, |u| !u.new_ooms.is_empty());
        assert_eq!(landed.new_ooms.len(), 1);
        let rec = &landed.new_ooms[0];
        assert_eq!((rec.index, rec.requested), (1, 3 << 20));
        assert!(!rec.dump_pending);
        assert_eq!(rec.dump_paths.len(), 2, "{rec:?}");
        assert_eq!(landed.pipeline.dumps_written, 1);
        handle.send(Command::Shutdown);
        join.join().unwrap();
    }

    fn ev(i: u64) -> Event {
        Event::new(EventAction::Alloc, 0, EventPool::Small, 0x1000 + i, 512)
    }

    #[test]
    fn the_recent_ring_keeps_the_last_events_oldest_first() {
        for cap in [1, 4, 63, 64, 65, 100, 1024] {
            let mut ring = RecentRing::new(cap);
            let mut model: std::collections::VecDeque<u64> = Default::default();
            for seq in 1..=3000u64 {
                ring.push(seq, &ev(seq));
                if model.len() == cap {
                    model.pop_front();
                }
                model.push_back(seq);
                if seq % 37 == 0 || seq < 200 {
                    let got: Vec<u64> = ring.since(0).map(|(s, _)| *s).collect();
                    assert_eq!(got, Vec::from(model.clone()), "cap {cap} after {seq}");
                    assert!(ring.since(0).all(|(s, e)| e.addr == 0x1000 + s));
                    let mid = seq.saturating_sub(cap as u64 / 2);
                    let after: Vec<u64> = ring.since(mid).map(|(s, _)| *s).collect();
                    let want: Vec<u64> = model.iter().copied().filter(|s| *s > mid).collect();
                    assert_eq!(after, want, "cap {cap} after {seq} since {mid}");
                    assert_eq!(ring.since(seq).count(), 0);
                }
            }
        }
    }

    #[test]
    fn devices_stay_sorted_whatever_order_they_appear_in() {
        let mut devices = Devices::default();
        let interval = Duration::from_secs(1);
        for d in [3, 0, 3, 1, 0, 2] {
            assert_eq!(devices.entry(d, interval, 8).device, d);
        }
        let order: Vec<i32> = devices.values().map(|d| d.device).collect();
        assert_eq!(order, vec![0, 1, 2, 3]);
    }
}
