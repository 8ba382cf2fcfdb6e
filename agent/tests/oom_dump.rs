//! An OOM on the simulated device leaves a complete dump that the snapshot reader loads back.

#[path = "support/toy.rs"]
mod toy;

use std::sync::Arc;

use allocview_agent::agent::{Agent, AgentError};
use allocview_agent::diagnosis::DiagnosisKind;
use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::history::HistoryOptions;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocError, AllocatorConfig, CachingAllocator};
use allocview_alloc::event::{Event, EventAction, EventPool};
use allocview_alloc::snapshot::{BlockState, Snapshot};

const MIB: u64 = 1 << 20;

#[test]
fn an_oom_leaves_a_pickle_and_a_json_dump_that_load_back() {
    let dev = Arc::new(SimBackend::new(256 * MIB));
    let alloc = Arc::new(CachingAllocator::new(dev, AllocatorConfig::default()));
    let dir = tempfile::tempdir().unwrap();
    let dumps = dir.path().join("dumps");
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(&dumps)
        .provider(alloc.clone())
        .spawn()
        .unwrap();
    alloc.set_event_sink(Some(agent.sink()));
    alloc.record_history(HistoryOptions::default());
    let a = alloc.malloc(100 * MIB, StreamId(0)).unwrap();
    let _b = alloc.malloc(5 * MIB, StreamId(0)).unwrap();
    alloc.free(a).unwrap();
    assert!(alloc.malloc(300 * MIB, StreamId(0)).is_err());
    agent.flush();

    let state = agent.state();
    assert_eq!(state.ooms.len(), 1);
    let oom = &state.ooms[0];
    assert_eq!(oom.index, 1);
    assert_eq!(oom.requested, 300 * MIB);
    assert_eq!(oom.rounded, 300 * MIB);
    assert_eq!(oom.total_memory, 256 * MIB);
    assert_eq!(oom.dump_error, None);
    assert_eq!(state.pipeline.dumps_written, 1);
    let pid = std::process::id();
    let pickle = dumps.join(format!("oom-0001-pid{pid}.pickle"));
    let json = dumps.join(format!("oom-0001-pid{pid}.json"));
    assert_eq!(oom.dump_paths, vec![pickle.clone(), json.clone()]);

    let from_pickle = snapshot_file::load(&pickle).unwrap();
    let from_json = snapshot_file::load(&json).unwrap();
    assert_eq!(
        snapshot_file::detect(&std::fs::read(&pickle).unwrap()),
        Some(FileFormat::Pickle)
    );
    // The allocator's state at the OOM: after the failed request's retry emptied the cache,
    // one 20 MiB segment holds the live 5 MiB block.
    for snap in [&from_pickle, &from_json] {
        assert_eq!(snap.segments.len(), 1);
        let live: Vec<_> = snap.segments[0]
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .collect();
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].requested_size, 5 * MIB);
        let oom = snap.device_traces[0]
            .iter()
            .find(|t| t.action.as_str() == "oom");
        assert_eq!(
            oom.map(|t| t.size),
            Some(300 * MIB),
            "the trace holds the OOM"
        );
    }
    assert_eq!(from_pickle.segments, from_json.segments);
    // `allocview summary` accepts it: the summary sees the live block and the OOM.
    let summary = allocview_agent::summary::summarize(&from_pickle);
    assert_eq!(summary.ooms, 1);
    assert_eq!(summary.total_allocated, 5 * MIB);
    assert_eq!(summary.devices[0].ooms[0].requested, 300 * MIB);
    // Diagnosed at the state the trace's replay reached at the entry.
    let why = summary.devices[0].ooms[0].diagnosis.as_ref().unwrap();
    assert_eq!(why.kind, DiagnosisKind::Exhaustion, "{}", why.explanation);
    assert!(why.explanation.contains("300 MiB"), "{}", why.explanation);
    // No temporary files left behind.
    let names: Vec<_> = std::fs::read_dir(&dumps)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn a_dump_made_without_history_still_says_which_request_failed() {
    let dev = Arc::new(SimBackend::new(256 * MIB));
    let alloc = Arc::new(CachingAllocator::new(dev, AllocatorConfig::default()));
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dir.path())
        .provider(alloc.clone())
        .spawn()
        .unwrap();
    alloc.set_event_sink(Some(agent.sink()));
    // No `record_history`: the snapshot's trace is empty.
    let _a = alloc.malloc(100 * MIB, StreamId(3)).unwrap();
    let _b = alloc.malloc(120 * MIB, StreamId(3)).unwrap();
    let err = alloc.malloc(200 * MIB + 1, StreamId(3)).unwrap_err();
    agent.flush();
    let state = agent.state();
    let rec = &state.ooms[0];
    let AllocError::OutOfMemory(oom) = err else {
        panic!("not an OOM: {err}")
    };
    for path in &rec.dump_paths {
        let snap = snapshot_file::load(path).unwrap();
        assert!(snap.device_traces.iter().all(Vec::is_empty), "{path:?}");
        let meta = &snap.devices[0];
        assert_eq!(meta.total_memory, Some(256 * MIB));
        let dumped = meta.oom.as_ref().expect("the dump carries its OOM");
        assert_eq!(*dumped, rec.dumped(), "{path:?}");
        assert_eq!(dumped.requested, 200 * MIB + 1);
        assert_eq!(dumped.rounded, oom.rounded);
        assert_eq!(dumped.device_free, oom.device_free);
        assert_eq!(dumped.stream, 3);
        assert_eq!(dumped.allocated, 220 * MIB);
        assert_eq!(dumped.reserved, 220 * MIB);

        // `allocview summary` reports it, marked as the agent's record.
        let summary = allocview_agent::summary::summarize(&snap);
        assert_eq!(summary.ooms, 1);
        let fact = &summary.devices[0].ooms[0];
        assert_eq!(fact.index, None);
        let why = fact.diagnosis.as_ref().expect("diagnosed from the record");
        assert_eq!(why.kind, DiagnosisKind::Exhaustion, "{}", why.explanation);
        assert_eq!((fact.requested, fact.stream), (oom.rounded, 3));
        let text = summary.to_string();
        assert!(text.contains("OOMs: 1"), "{text}");
        assert!(text.contains("not recording history"), "{text}");
    }
    agent.shutdown();
}

/// An agent dumping into `dump_dir`, after an OOM on its 64 MiB simulated device (flushed).
fn oom_dumping_into(dump_dir: &std::path::Path) -> (Agent, Arc<CachingAllocator<Arc<SimBackend>>>) {
    let dev = Arc::new(SimBackend::new(64 * MIB));
    let alloc = Arc::new(CachingAllocator::new(dev, AllocatorConfig::default()));
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dump_dir)
        .provider(alloc.clone())
        .spawn()
        .unwrap();
    alloc.set_event_sink(Some(agent.sink()));
    assert!(alloc.malloc(128 * MIB, StreamId(0)).is_err());
    agent.flush();
    (agent, alloc)
}

#[test]
fn a_dump_folder_that_cannot_be_created_is_an_error_counted_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"not a folder").unwrap();
    let (agent, alloc) = oom_dumping_into(&blocker.join("dumps"));
    let state = agent.state();
    assert_eq!(state.ooms.len(), 1);
    assert!(state.ooms[0].dump_paths.is_empty());
    let err = state.ooms[0].dump_error.as_deref().unwrap();
    assert!(err.contains("dump folder"), "{err}");
    assert_eq!(state.pipeline.dump_failures, 1);
    // The agent carries on.
    alloc.malloc(MIB, StreamId(0)).unwrap();
    agent.flush();
    assert_eq!(agent.state().devices[0].stats.allocation.0[0].current, 1);
}

#[test]
fn a_dump_that_cannot_be_written_names_its_path_once() {
    // `/proc/self` exists (so the folder needs no creating) and takes no new files, root or not.
    let dump_dir = std::path::Path::new("/proc/self");
    if !dump_dir.is_dir() {
        println!("skipped: /proc/self not found");
        return;
    }
    let (agent, _alloc) = oom_dumping_into(dump_dir);
    let state = agent.state();
    let err = state.ooms[0].dump_error.as_deref().unwrap();
    assert!(
        err.starts_with("cannot write /proc/self/oom-0001-pid"),
        "{err}"
    );
    assert_eq!(err.matches("/proc/self").count(), 1, "{err}");
    agent.shutdown();
}

#[test]
fn a_dump_folder_path_that_names_a_file_is_refused_at_spawn() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"not a folder").unwrap();
    let err = Agent::builder()
        .no_listen()
        .dump_dir(&file)
        .spawn()
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::DumpDirNotAFolder(p) if *p == file),
        "{err}"
    );
    assert!(err.to_string().contains("it is not a folder"), "{err}");
}

#[test]
fn two_providers_of_one_device_are_refused_at_spawn() {
    let on = |device: i32| {
        let dev = Arc::new(
            SimBackend::builder()
                .capacity(64 * MIB)
                .device(device)
                .build(),
        );
        Arc::new(CachingAllocator::new(dev, AllocatorConfig::default()))
    };
    let dir = tempfile::tempdir().unwrap();
    let err = Agent::builder()
        .no_listen()
        .dump_dir(dir.path())
        .provider(on(0))
        .provider(on(1))
        .provider(on(0))
        .spawn()
        .unwrap_err();
    assert!(matches!(err, AgentError::DuplicateDevice(0)), "{err}");
    assert!(err.to_string().contains("device 0"), "{err}");
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dir.path())
        .provider(on(0))
        .provider(on(1))
        .spawn()
        .unwrap();
    agent.shutdown();
}

#[test]
fn an_oom_storm_writes_at_most_the_configured_number_of_dumps() {
    let dev = Arc::new(SimBackend::new(64 * MIB));
    let alloc = Arc::new(CachingAllocator::new(dev, AllocatorConfig::default()));
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dir.path())
        .max_dumps(2)
        .provider(alloc.clone())
        .spawn()
        .unwrap();
    alloc.set_event_sink(Some(agent.sink()));
    for _ in 0..5 {
        assert!(alloc.malloc(128 * MIB, StreamId(0)).is_err());
    }
    agent.flush();
    let state = agent.state();
    assert_eq!(state.ooms.len(), 5);
    assert_eq!(state.pipeline.dumps_written, 2);
    assert!(
        state.ooms[4]
            .dump_error
            .as_deref()
            .unwrap()
            .contains("at most 2")
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 4);
}

#[test]
fn a_dump_never_replaces_an_earlier_one_of_the_same_name() {
    use allocview_agent::dump::OomDumper;
    let dir = tempfile::tempdir().unwrap();
    let dumper = OomDumper::new(dir.path());
    // A process restarted with the same pid (as in a container) numbers its OOMs from 1 again.
    let first = dumper.write(1, 7, &Snapshot::default()).unwrap();
    let before: Vec<Vec<u8>> = first.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let second = dumper.write(1, 7, &Snapshot::default()).unwrap();
    let third = dumper.write(1, 7, &Snapshot::default()).unwrap();
    let name = |p: &std::path::Path| p.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(name(&first[0]), "oom-0001-pid7.pickle");
    assert_eq!(name(&second[0]), "oom-0001-pid7-2.pickle");
    assert_eq!(name(&third[1]), "oom-0001-pid7-3.json");
    let after: Vec<Vec<u8>> = first.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert_eq!(before, after);
}

/// An agent over the toy allocator whose tick never comes: only flushes fold events in.
/// The indices of the OOM records kept out of `n`: the first and the latest.
fn kept_indices(n: u64) -> Vec<u64> {
    use allocview_agent::state::{OOM_KEEP_FIRST, OOM_KEEP_LATEST};
    (1..=OOM_KEEP_FIRST as u64)
        .chain(n - OOM_KEEP_LATEST as u64 + 1..=n)
        .collect()
}

fn toy_agent(toy: &Arc<toy::Toy>, dir: &std::path::Path, capacity: usize, dumps: u64) -> Agent {
    let agent = toy::quiet_agent(dir, capacity)
        .max_dumps(dumps)
        .provider(toy.clone())
        .spawn()
        .unwrap();
    toy.set_sink(agent.sink());
    agent
}

#[test]
fn an_oom_published_while_the_agent_resyncs_still_gets_its_record_and_dump() {
    let toy = toy::Toy::new();
    let dir = tempfile::tempdir().unwrap();
    let agent = toy_agent(&toy, dir.path(), 1024, 8);
    toy.malloc(0);
    toy.oom_in_next_snapshot();
    // A free of a block the agent never saw: an inconsistency, so the next flush resyncs; the
    // resync's snapshot publishes an OOM just before its marker, as a failed allocation on
    // another thread would. The snapshot's stats already count it (the fence skips it).
    agent.sink().publish(&Event::new(
        EventAction::FreeCompleted,
        0,
        EventPool::Large,
        0xdead_0000,
        MIB,
    ));
    agent.flush();
    agent.flush();
    let state = agent.state();
    assert_eq!(state.pipeline.resyncs, 1);
    assert_eq!(state.devices[0].stats.num_ooms, 1);
    assert_eq!(state.ooms.len(), 1, "{:?}", state.ooms);
    let oom = &state.ooms[0];
    assert_eq!(oom.requested, 3 << 30);
    assert!(!oom.event_lost && !oom.dump_pending);
    assert_eq!(oom.dump_paths.len(), 2, "{oom:?}");
    assert_eq!(state.devices[0].stats, toy.stats());
}

#[test]
fn ooms_whose_events_were_dropped_get_records_that_say_so() {
    let toy = toy::Toy::new();
    let dir = tempfile::tempdir().unwrap();
    let agent = toy_agent(&toy, dir.path(), 4, 2);
    // Nobody drains between these but the half-full wake-up, which races: most are dropped.
    for i in 0..100 {
        toy.oom(MIB * (i + 1));
    }
    agent.flush();
    let state = agent.state();
    let dropped = state
        .pipeline
        .dropped_by_action
        .iter()
        .find(|(a, _)| a == "oom")
        .map_or(0, |x| x.1);
    assert!(dropped > 0, "{:?}", state.pipeline);
    assert_eq!(state.devices[0].stats.num_ooms, 100);
    assert_eq!(state.pipeline.ooms_total, 100);
    assert_eq!(state.ooms.len(), 100);
    let lost: Vec<_> = state.ooms.iter().filter(|o| o.event_lost).collect();
    assert_eq!(lost.len() as u64, dropped);
    for o in &lost {
        assert_eq!((o.device, o.requested), (0, 0), "{o:?}");
    }
    // Those that arrived keep their request.
    assert!(
        state
            .ooms
            .iter()
            .filter(|o| !o.event_lost)
            .all(|o| o.requested > 0)
    );
    assert_eq!(state.pipeline.dumps_written, 2);
    assert!(state.ooms.iter().all(|o| !o.dump_pending));
    // One snapshot of the moment after the resync serves every lost OOM: the first gets it
    // (or the limit's reason), the others point to it.
    let first = lost[0].index;
    for o in &lost[1..] {
        let err = o.dump_error.as_deref().unwrap_or_default();
        assert_eq!(
            err,
            format!("not written: OOM #{first} has the snapshot of the same moment")
        );
    }
}

#[test]
fn lost_ooms_are_put_on_the_device_whose_event_was_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let agent = toy::quiet_agent(dir.path(), 4).spawn().unwrap();
    let sink = agent.sink();
    for i in 0..100u64 {
        let device = if i % 2 == 0 { 0 } else { 3 };
        sink.publish(&toy::oom_event(device, MIB));
    }
    agent.flush();
    let state = agent.state();
    assert_eq!(state.pipeline.ooms_total, 100);
    assert_eq!(state.ooms.len(), 100);
    for device in [0, 3] {
        let on: Vec<_> = state.ooms.iter().filter(|o| o.device == device).collect();
        assert_eq!(on.len(), 50, "device {device}: {on:?}");
        let lost = on.iter().filter(|o| o.event_lost).count();
        assert!(on.iter().all(|o| o.event_lost == (o.requested == 0)));
        assert!(lost > 0, "device {device}: the tiny channel dropped some");
    }
}

#[test]
fn an_oom_storm_keeps_the_first_and_the_latest_records_and_counts_every_one() {
    use allocview_agent::state::{OOM_KEEP_FIRST, OOM_KEEP_LATEST};
    let toy = toy::Toy::new();
    let dir = tempfile::tempdir().unwrap();
    let agent = toy_agent(&toy, dir.path(), 1 << 14, 1);
    let n = (OOM_KEEP_FIRST + OOM_KEEP_LATEST + 44) as u64;
    for i in 0..n {
        toy.oom(i + 1);
        if i % 64 == 0 {
            agent.flush();
        }
    }
    agent.flush();
    let state = agent.state();
    assert_eq!(state.pipeline.dropped_total, 0);
    assert_eq!(state.pipeline.ooms_total, n);
    let kept: Vec<u64> = state.ooms.iter().map(|o| o.index).collect();
    assert_eq!(kept, kept_indices(n));
    // Each record is the OOM of its index.
    assert!(state.ooms.iter().all(|o| o.requested == o.index));
    assert_eq!(state.ooms[0].dump_paths.len(), 2);
}

#[test]
fn a_flood_of_lost_ooms_keeps_the_same_bounded_list() {
    let toy = toy::Toy::new();
    let dir = tempfile::tempdir().unwrap();
    let agent = toy_agent(&toy, dir.path(), 4, 1);
    let n = 5_000u64;
    for i in 0..n {
        toy.oom(i + 1);
    }
    agent.flush();
    let state = agent.state();
    assert_eq!(state.pipeline.ooms_total, n);
    assert_eq!(state.devices[0].stats.num_ooms, n as i64);
    let kept: Vec<u64> = state.ooms.iter().map(|o| o.index).collect();
    assert_eq!(kept, kept_indices(n));
    assert!(state.ooms.last().unwrap().event_lost);
}

/// A provider whose every snapshot holds one free 2 MiB segment at an address that says which
/// call made it: `snapshot_with_stats` (the resync's) at `RESYNC_BASE + n * 2 MiB`, `snapshot`
/// at `SNAPSHOT_BASE + n * 2 MiB`.
#[derive(Default)]
struct Tagging {
    resyncs: std::sync::atomic::AtomicU64,
    snapshots: std::sync::atomic::AtomicU64,
}

const RESYNC_BASE: u64 = 0x1_0000_0000;
const SNAPSHOT_BASE: u64 = 0x2_0000_0000;

fn free_segment(address: u64) -> Snapshot {
    use allocview_alloc::snapshot::{BlockInfo, SegmentInfo, SegmentType};
    let free = BlockInfo::new(address, 2 * MIB, 0, BlockState::Inactive);
    Snapshot {
        segments: vec![SegmentInfo::tiled(
            address,
            0,
            SegmentType::Large,
            vec![free],
        )],
        ..Snapshot::default()
    }
}

impl allocview_agent::provider::SnapshotProvider for Tagging {
    fn device(&self) -> i32 {
        0
    }

    fn snapshot(&self) -> Snapshot {
        let n = self
            .snapshots
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        free_segment(SNAPSHOT_BASE + n * 2 * MIB)
    }

    fn device_stats(&self) -> allocview_alloc::caching::stats::DeviceStats {
        Default::default()
    }

    fn snapshot_with_stats(
        &self,
    ) -> Option<(Snapshot, allocview_alloc::caching::stats::DeviceStats)> {
        let n = self
            .resyncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some((free_segment(RESYNC_BASE + n * 2 * MIB), Default::default()))
    }

    fn reset_peak_stats(&self) {}
}

/// The snapshot in the JSON file of a record's dump.
fn json_dump(paths: &[std::path::PathBuf]) -> Snapshot {
    let path = paths
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .unwrap_or_else(|| panic!("no JSON dump in {paths:?}"));
    snapshot_file::load(path).unwrap()
}

#[test]
fn a_lost_ooms_dump_is_the_resyncs_own_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Arc::new(Tagging::default());
    let agent = toy::quiet_agent(dir.path(), 4)
        .max_dumps(1_000)
        .provider(provider.clone())
        .spawn()
        .unwrap();
    let sink = agent.sink();
    for i in 0..100u64 {
        sink.publish(&Event {
            requested: MIB * (i + 1),
            ..Event::new(EventAction::Oom, 0, EventPool::Large, MIB, MIB)
        });
    }
    agent.flush();
    let state = agent.state();
    let lost: Vec<_> = state.ooms.iter().filter(|o| o.event_lost).collect();
    assert!(!lost.is_empty(), "the tiny channel dropped some");
    let mut checked = 0;
    for o in lost.iter().filter(|o| !o.dump_paths.is_empty()) {
        let snap = json_dump(&o.dump_paths);
        let addr = snap.segments[0].address;
        assert!(
            (RESYNC_BASE..SNAPSHOT_BASE).contains(&addr),
            "OOM #{}: dump at {addr:#x} is not a resync's snapshot",
            o.index
        );
        // The dump carries the record: this OOM, its request not known.
        let meta = snap.devices.iter().find(|m| m.device == 0).unwrap();
        let dumped = meta.oom.as_ref().expect("the dump carries its OOM");
        assert_eq!((dumped.index, dumped.event_lost), (o.index, true));
        checked += 1;
    }
    assert!(checked > 0, "a lost OOM got a dump: {lost:?}");
    // OOMs whose events arrived get a snapshot of their own moment.
    for o in state.ooms.iter().filter(|o| !o.event_lost) {
        let snap = json_dump(&o.dump_paths);
        assert!(snap.segments[0].address >= SNAPSHOT_BASE);
        let dumped = snap.devices[0]
            .oom
            .as_ref()
            .expect("the dump carries its OOM");
        assert_eq!((dumped.index, dumped.requested), (o.index, o.requested));
        assert!(!dumped.event_lost);
    }
    agent.shutdown();
}
