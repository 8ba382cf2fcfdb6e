//! The runtime behind the C entry points, started directly on simulated devices: devices are
//! opened on first use, every allocator publishes to the agent and answers its snapshots.

use allocview_agent::agent::Agent;
use allocview_alloc::caching::AllocatorConfig;
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::stats::StatType;
use allocview_pluggable::{BackendKind, Runtime, RuntimeError, Settings};

const MIB: u64 = 1 << 20;

fn start(devices: i32) -> (Runtime, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(
        Settings::sim(1 << 30, devices),
        Agent::builder().no_listen().dump_dir(dir.path()),
    )
    .unwrap();
    (rt, dir)
}

#[test]
fn the_agent_sees_each_devices_allocations_and_its_snapshot() {
    let (rt, _dir) = start(2);
    assert_eq!(rt.device_count(), 2);
    let a = rt.malloc(3 * MIB as i64, 1, StreamId(7)).unwrap().unwrap();
    let b = rt.malloc(4096, 1, StreamId::DEFAULT).unwrap().unwrap();
    rt.agent().flush();
    let state = rt.agent().state();
    let d1 = state.device(1).expect("device 1 in the agent's state");
    let own = rt.memory_stats(1).unwrap();
    assert_eq!(
        d1.stats.allocated_bytes.get(StatType::All).current,
        own["allocated_bytes.all.current"]
    );
    assert_eq!(own["allocated_bytes.all.current"], (3 * MIB + 4096) as i64);
    assert!(
        d1.streams
            .iter()
            .any(|s| s.stream == 7 && s.allocated == 3 * MIB)
    );
    // Device 0 is registered but was never opened: empty, and its stats all zero.
    let d0 = state.device(0).expect("device 0 is registered");
    assert_eq!(
        d0.total_memory,
        1 << 30,
        "a simulated device's size is known before it opens"
    );
    assert_eq!(d0.stats.reserved_bytes.get(StatType::All).current, 0);
    let unused = rt.memory_stats(0).unwrap();
    for key in [
        "allocated_bytes.all.current",
        "reserved_bytes.all.current",
        "segment.all.current",
        "num_device_alloc",
    ] {
        assert_eq!(unused[key], 0, "{key}");
    }

    let snap = rt.agent().snapshot();
    assert!(snap.segments.iter().all(|s| s.device == 1));
    let blocks: u64 = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state.is_active())
        .map(|b| b.size)
        .sum();
    assert_eq!(blocks, 3 * MIB + 4096);

    rt.free(a, 1).unwrap();
    rt.free(b, 1).unwrap();
    rt.empty_cache().unwrap();
    rt.agent().flush();
    let d1 = rt.agent().state().device(1).unwrap().clone();
    assert_eq!(d1.stats.allocated_bytes.get(StatType::All).current, 0);
    assert_eq!(d1.stats.reserved_bytes.get(StatType::All).current, 0);
    rt.shutdown();
}

#[test]
fn bad_arguments_are_errors_that_name_the_problem() {
    let (rt, _dir) = start(1);
    assert_eq!(
        rt.malloc(-1, 0, StreamId::DEFAULT),
        Err(RuntimeError::BadSize(-1))
    );
    assert_eq!(rt.malloc(0, 0, StreamId::DEFAULT), Ok(None));
    let e = rt.malloc(512, 3, StreamId::DEFAULT).unwrap_err();
    assert_eq!(
        e.to_string(),
        "device 3 does not exist: this process has 1 device(s)"
    );
    let e = rt.malloc(512, -1, StreamId::DEFAULT).unwrap_err();
    assert!(
        matches!(e, RuntimeError::NoSuchDevice { device: -1, .. }),
        "{e}"
    );
    let e = rt.free(0xdead_0000, 0).unwrap_err();
    assert!(e.to_string().contains("invalid device pointer"), "{e}");
    assert!(!e.is_out_of_memory());
    let e = rt.malloc(2 << 30, 0, StreamId::DEFAULT).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    rt.shutdown();
}

#[test]
fn the_cuda_backend_without_a_usable_driver_refuses_to_start_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        backend: BackendKind::Cuda,
        config: AllocatorConfig::default(),
    };
    match Runtime::start(settings, Agent::builder().no_listen().dump_dir(dir.path())) {
        Ok(rt) => {
            // A machine with a GPU (and a build with CUDA): nothing to refuse.
            let built_with_cuda = cfg!(feature = "cuda");
            assert!(built_with_cuda, "a build without CUDA started on CUDA");
            rt.shutdown();
        }
        Err(e) if cfg!(feature = "cuda") => {
            assert!(matches!(e, RuntimeError::NoDevices(_)), "{e}");
        }
        Err(e) => assert_eq!(
            e.to_string(),
            "built without CUDA support; rebuild with --features cuda or set ALLOCVIEW_BACKEND=sim"
        ),
    }
}
