//! An OOM on the simulated device leaves a complete dump that the snapshot reader loads back.

use std::sync::Arc;

use allocview_agent::agent::Agent;
use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::history::HistoryOptions;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
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
    // No temporary files left behind.
    let names: Vec<_> = std::fs::read_dir(&dumps)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn a_dump_folder_that_cannot_be_created_is_an_error_counted_not_a_panic() {
    let dev = Arc::new(SimBackend::new(64 * MIB));
    let alloc = Arc::new(CachingAllocator::new(dev, AllocatorConfig::default()));
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"not a folder").unwrap();
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(blocker.join("dumps"))
        .provider(alloc.clone())
        .spawn()
        .unwrap();
    alloc.set_event_sink(Some(agent.sink()));
    assert!(alloc.malloc(128 * MIB, StreamId(0)).is_err());
    agent.flush();
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
