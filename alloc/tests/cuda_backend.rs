//! The CUDA backend (feature `cuda`).
//!
//! Without a GPU (no `libcuda`, or no device) opening a device must return
//! `NoDriver`/`NoDevice`, never panic: that is checked everywhere. The real-device checks run
//! only with `ALLOCVIEW_CUDA_TESTS=1` (on a machine with a GPU); otherwise each prints a visible
//! "skipped: no GPU" line and passes.
//!
//! One more test runs everywhere a C compiler is: it builds a stand-in `libcuda.so`
//! (`cuda_backend/fake_libcuda.c`: host memory behind device addresses, the driver's rules for
//! handles and mappings) and runs the backend against it in a child process, checking the
//! backend's bookkeeping (tables, rollback after a failed map, everything given back on drop).
#![cfg(feature = "cuda")]

use allocview_alloc::caching::backend::{DeviceBackend, DeviceError, EventId, StreamId};
use allocview_alloc::caching::cuda::{CudaBackend, MIN_VM_GRANULARITY};

/// Building the stand-in driver, shared with the other crates' CUDA tests (this package cannot
/// depend on `allocview-tests`, so the file is included). Not every item is used here.
#[allow(dead_code)]
#[path = "../../tests/src/fake_libcuda.rs"]
mod fake_libcuda;

const MIB: u64 = 1 << 20;

/// Set to `1` to run the checks that need a real GPU.
const GPU_TESTS_VAR: &str = "ALLOCVIEW_CUDA_TESTS";

fn gpu_tests_enabled() -> bool {
    std::env::var(GPU_TESTS_VAR).is_ok_and(|v| v == "1")
}

/// Device 0 when the GPU checks are enabled; otherwise prints the skip line and returns `None`.
fn gpu(test: &str) -> Option<CudaBackend> {
    if !gpu_tests_enabled() {
        println!("skipped: no GPU ({test}; set {GPU_TESTS_VAR}=1 on a machine with one)");
        return None;
    }
    match CudaBackend::new(0) {
        Ok(backend) => Some(backend),
        Err(err) => panic!("{GPU_TESTS_VAR}=1 but CUDA device 0 could not be opened: {err}"),
    }
}

fn is_invalid<T: std::fmt::Debug>(result: Result<T, DeviceError>) -> bool {
    matches!(result, Err(DeviceError::Invalid(_)))
}

#[test]
fn opening_a_device_without_a_gpu_returns_no_driver_or_no_device_instead_of_panicking() {
    let opened = CudaBackend::new(0);
    if gpu_tests_enabled() {
        assert!(opened.is_ok(), "{GPU_TESTS_VAR}=1 but: {:?}", opened.err());
        return;
    }
    match opened {
        Err(DeviceError::NoDriver(msg)) => {
            assert!(!msg.is_empty());
            println!("no CUDA driver here, as expected without a GPU: {msg}");
        }
        Err(DeviceError::NoDevice(msg)) => {
            println!("CUDA driver but no device here: {msg}");
        }
        Err(other) => panic!("expected NoDriver or NoDevice without a GPU, got {other:?}"),
        Ok(_) => println!(
            "skipped: a GPU is present but {GPU_TESTS_VAR} is unset, so the no-GPU error is not \
             checked"
        ),
    }
}

#[test]
fn a_negative_or_absent_device_ordinal_is_an_error_not_a_panic() {
    for ordinal in [-1, 4096] {
        match CudaBackend::new(ordinal) {
            Err(DeviceError::NoDriver(_) | DeviceError::NoDevice(_)) => {}
            other => panic!("device {ordinal}: expected NoDriver or NoDevice, got {other:?}"),
        }
    }
}

#[test]
fn segments_are_allocated_and_freed_and_bad_frees_are_invalid() {
    let Some(gpu) = gpu("malloc/free") else {
        return;
    };
    assert_eq!(gpu.device(), 0);
    let a = gpu.malloc(2 * MIB).unwrap();
    let b = gpu.malloc(20 * MIB).unwrap();
    assert_ne!(a, b);
    assert_eq!(a % 512, 0);
    gpu.memset(b, 0xab, 20 * MIB).unwrap();
    let mut tail = [0u8; 512];
    gpu.copy_to_host(b + 20 * MIB - 512, &mut tail).unwrap();
    assert!(tail.iter().all(|&x| x == 0xab));
    gpu.free(a).unwrap();
    assert!(is_invalid(gpu.free(a)), "double free");
    assert!(is_invalid(gpu.free(b + 512)), "interior pointer");
    assert!(is_invalid(gpu.memset(a, 0, 512)), "freed memory");
    assert!(is_invalid(gpu.malloc(0)));
    gpu.free(b).unwrap();
}

#[test]
fn mem_get_info_sees_allocations_and_oversized_mallocs_are_out_of_memory() {
    let Some(gpu) = gpu("mem_get_info") else {
        return;
    };
    let (free, total) = gpu.mem_get_info().unwrap();
    assert!(total > 0 && free <= total);
    let big = 1 << 30;
    let p = gpu.malloc(big).unwrap();
    let (free_after, total_after) = gpu.mem_get_info().unwrap();
    assert_eq!(total_after, total);
    // Other processes may allocate meanwhile, but ours is at least this much.
    assert!(
        free_after + big <= free + 64 * MIB,
        "{free} -> {free_after}"
    );
    gpu.free(p).unwrap();
    assert_eq!(
        gpu.malloc(2 * total),
        Err(DeviceError::OutOfMemory { size: 2 * total })
    );
}

#[test]
fn events_complete_after_the_work_recorded_before_them_on_their_stream() {
    let Some(gpu) = gpu("streams and events") else {
        return;
    };
    let s1 = gpu.create_stream().unwrap();
    let s2 = gpu.create_stream().unwrap();
    assert_ne!(s1, s2);
    assert_ne!(s1, StreamId::DEFAULT);
    let (e1, e2) = (gpu.create_event().unwrap(), gpu.create_event().unwrap());
    // An event never recorded is complete.
    assert!(gpu.query_event(e1).unwrap());
    // Queue real work on the default stream, then record on it and on a side stream.
    let buffer = gpu.malloc(256 * MIB).unwrap();
    gpu.memset(buffer, 1, 256 * MIB).unwrap();
    gpu.record_event(e1, StreamId::DEFAULT).unwrap();
    gpu.record_event(e2, s1).unwrap();
    gpu.synchronize_event(e1).unwrap();
    assert!(gpu.query_event(e1).unwrap());
    gpu.synchronize_device().unwrap();
    assert!(gpu.query_event(e2).unwrap());
    // Re-recording works; the event completes again.
    gpu.record_event(e1, s2).unwrap();
    gpu.synchronize_event(e1).unwrap();
    assert!(gpu.query_event(e1).unwrap());
    // Unknown ids never reach the driver.
    assert!(is_invalid(gpu.record_event(e1, StreamId(0xdead_0000))));
    assert!(is_invalid(gpu.record_event(EventId(0xdead_0000), s1)));
    gpu.destroy_event(e1).unwrap();
    assert!(is_invalid(gpu.query_event(e1)));
    assert!(is_invalid(gpu.destroy_event(e1)));
    gpu.destroy_event(e2).unwrap();
    gpu.free(buffer).unwrap();
}

#[test]
fn virtual_memory_reserves_maps_unmaps_and_releases_and_rejects_misuse() {
    let Some(gpu) = gpu("virtual memory") else {
        return;
    };
    let g = gpu.vm_granularity();
    assert!(g >= MIN_VM_GRANULARITY);
    let va = gpu.vm_reserve(16 * g).unwrap();
    assert_eq!(va % g, 0);
    let (free_before, _) = gpu.mem_get_info().unwrap();
    gpu.vm_map(va, 4 * g).unwrap();
    let (free_mapped, _) = gpu.mem_get_info().unwrap();
    assert!(free_mapped + 4 * g <= free_before + 64 * MIB);
    // Mapped memory is writable and readable (cuMemSetAccess took effect).
    gpu.memset(va, 0x5a, 4 * g).unwrap();
    let mut probe = [0u8; 4096];
    gpu.copy_to_host(va + 3 * g, &mut probe).unwrap();
    assert!(probe.iter().all(|&x| x == 0x5a));
    // Misuse.
    assert!(is_invalid(gpu.vm_map(va + 512, g)));
    assert!(
        is_invalid(gpu.vm_map(va + 3 * g, 2 * g)),
        "overlaps a mapping"
    );
    assert!(
        is_invalid(gpu.vm_map(va + 15 * g, 2 * g)),
        "runs off the end"
    );
    assert!(
        is_invalid(gpu.vm_unmap(va + 3 * g, 2 * g)),
        "partly unmapped"
    );
    assert!(is_invalid(gpu.vm_release(va, 16 * g)), "still mapped");
    assert!(is_invalid(gpu.vm_release(va, 8 * g)), "wrong size");
    assert!(is_invalid(gpu.memset(va + 4 * g, 0, 512)), "unmapped page");
    // Unmap one page in the middle, map it again, then unmap everything.
    gpu.vm_unmap(va + g, g).unwrap();
    assert!(is_invalid(gpu.memset(va + g, 0, 512)));
    gpu.vm_map(va + g, g).unwrap();
    gpu.memset(va + g, 1, g).unwrap();
    gpu.vm_unmap(va, 4 * g).unwrap();
    gpu.vm_release(va, 16 * g).unwrap();
    assert!(is_invalid(gpu.vm_release(va, 16 * g)));
}

#[test]
fn the_backend_is_usable_from_several_threads() {
    let Some(gpu) = gpu("threads") else {
        return;
    };
    let gpu = std::sync::Arc::new(gpu);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let gpu = std::sync::Arc::clone(&gpu);
            std::thread::spawn(move || {
                for _ in 0..50 {
                    let p = gpu.malloc(2 * MIB).unwrap();
                    let e = gpu.create_event().unwrap();
                    gpu.record_event(e, StreamId::DEFAULT).unwrap();
                    gpu.synchronize_event(e).unwrap();
                    gpu.destroy_event(e).unwrap();
                    gpu.free(p).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

// ---- the stand-in driver ----

/// Set in the child process that runs against the stand-in driver.
const FAKE_CHILD_VAR: &str = "ALLOCVIEW_FAKE_CUDA_CHILD";

const FAKE_TEST_NAME: &str = "the_backend_keeps_its_books_on_a_stand_in_driver";

#[test]
fn the_backend_keeps_its_books_on_a_stand_in_driver() {
    if std::env::var_os(FAKE_CHILD_VAR).is_some() {
        stand_in_driver_scenario();
        return;
    }
    let Some(child) = fake_libcuda::rerun_self_on_stand_in(
        "fakecuda",
        FAKE_TEST_NAME,
        &["--exact", FAKE_TEST_NAME, "--nocapture", "--test-threads=1"],
        FAKE_CHILD_VAR,
    ) else {
        return;
    };
    let stdout = String::from_utf8_lossy(&child.stdout);
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(
        child.status.success() && stdout.contains("1 passed"),
        "the backend failed against the stand-in driver ({}):\n{stdout}\n{stderr}",
        child.status
    );
    // The stand-in reports whenever it is unloaded; cudarc's probe loads and unloads it once
    // before the backend starts, so only the last report (at exit) counts.
    assert_eq!(
        fake_libcuda::last_report(&stdout),
        Some(fake_libcuda::ALL_RETURNED),
        "dropping the backend did not give everything back:\n{stdout}"
    );
}

/// Runs in the child, where `libcuda.so` is the stand-in (1 GiB, one device, 1 MiB
/// recommended granularity).
fn stand_in_driver_scenario() {
    let capacity = 1u64 << 30;
    let gpu = CudaBackend::new(0).expect("the stand-in driver opens device 0");
    assert!(matches!(CudaBackend::new(1), Err(DeviceError::NoDevice(_))));
    // The driver recommends 1 MiB; the backend never goes below 2 MiB.
    let g = gpu.vm_granularity();
    assert_eq!(g, MIN_VM_GRANULARITY);

    // Segments.
    let a = gpu.malloc(4 * MIB).unwrap();
    assert_eq!(gpu.mem_get_info().unwrap(), (capacity - 4 * MIB, capacity));
    gpu.memset(a, 7, 4 * MIB).unwrap();
    let mut back = [0u8; 1024];
    gpu.copy_to_host(a + 4 * MIB - 1024, &mut back).unwrap();
    assert!(back.iter().all(|&x| x == 7));
    assert!(
        is_invalid(gpu.copy_to_host(a + 4 * MIB - 512, &mut back)),
        "runs past the segment"
    );
    gpu.free(a).unwrap();
    assert!(is_invalid(gpu.free(a)));
    assert_eq!(
        gpu.malloc(2 * capacity),
        Err(DeviceError::OutOfMemory { size: 2 * capacity })
    );
    assert_eq!(gpu.mem_get_info().unwrap(), (capacity, capacity));

    // Streams and events.
    let s = gpu.create_stream().unwrap();
    let e = gpu.create_event().unwrap();
    gpu.record_event(e, s).unwrap();
    gpu.record_event(e, StreamId::DEFAULT).unwrap();
    assert!(gpu.query_event(e).unwrap());
    gpu.synchronize_event(e).unwrap();
    gpu.synchronize_device().unwrap();
    assert!(is_invalid(gpu.record_event(e, StreamId(0x1234_5678))));
    gpu.destroy_event(e).unwrap();
    assert!(is_invalid(gpu.destroy_event(e)));

    // Virtual memory.
    let va = gpu.vm_reserve(16 * g).unwrap();
    assert_eq!(va % g, 0);
    gpu.vm_map(va, 4 * g).unwrap();
    assert_eq!(gpu.mem_get_info().unwrap().0, capacity - 4 * g);
    // Faults (and kills this process) unless cuMemSetAccess made the pages writable.
    gpu.memset(va, 0x5a, 4 * g).unwrap();
    gpu.vm_unmap(va + g, g).unwrap();
    assert!(is_invalid(gpu.memset(va + g, 0, 512)));
    gpu.vm_map(va + g, g).unwrap();
    gpu.memset(va + g, 1, g).unwrap();
    assert!(is_invalid(gpu.vm_map(va + 3 * g, 2 * g)));
    assert!(is_invalid(gpu.vm_unmap(va + 3 * g, 2 * g)));
    assert!(is_invalid(gpu.vm_release(va, 16 * g)));
    assert!(is_invalid(gpu.vm_release(va, 8 * g)));

    // A map that runs out of memory part-way gives back the pages it had mapped.
    let free_before = gpu.mem_get_info().unwrap().0;
    let pages = capacity / g;
    let big = gpu.vm_reserve(pages * g).unwrap();
    assert_eq!(
        gpu.vm_map(big, pages * g),
        Err(DeviceError::OutOfMemory { size: pages * g })
    );
    assert_eq!(gpu.mem_get_info().unwrap().0, free_before);
    gpu.vm_map(big, g).unwrap();
    gpu.vm_unmap(big, g).unwrap();
    gpu.vm_release(big, pages * g).unwrap();

    // Leave things behind: dropping the backend must give them all back.
    let _segment = gpu.malloc(2 * MIB).unwrap();
    let _event = gpu.create_event().unwrap();
    let _stream = gpu.create_stream().unwrap();
    drop(gpu);
}
