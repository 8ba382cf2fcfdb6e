//! The caching allocator's behaviour suite, written once (`caching_suite/rules.rs`) and run on
//! every backend:
//! - `sim::*`: on `SimBackend` (1 GiB), always; one test per rule.
//! - `on_stand_in::*` (feature `cuda`): on `CudaBackend` over the stand-in `libcuda.so`
//!   (`cuda_backend/fake_libcuda.c`). They are `#[ignore]`d in the normal run:
//!   [`the_suite_passes_on_cuda_backend_over_the_stand_in_driver`] builds the stand-in and runs
//!   them in a child process (skipped, with a line saying so, without a C compiler or under
//!   valgrind).
//! - [`the_suite_passes_on_a_real_gpu`] (feature `cuda`): every rule in turn on `CudaBackend`
//!   device 0 when `ALLOCVIEW_CUDA_TESTS=1`; otherwise it prints a `skipped: no GPU` line.
//!
//! Run: `cargo test -p allocview-alloc --test caching_suite` (simulator only), or with
//! `--features cuda -- --nocapture` to see the stand-in and GPU lines.

#[path = "support/builders.rs"]
mod support;

/// Building the stand-in driver, shared with the other crates' CUDA tests (this package cannot
/// depend on `allocview-tests`, so the file is included). Not every item is used here.
#[cfg(feature = "cuda")]
#[allow(dead_code)]
#[path = "../../tests/src/fake_libcuda.rs"]
mod fake_libcuda;
#[path = "caching_suite/rules.rs"]
mod rules;
#[cfg(feature = "cuda")]
#[path = "caching_suite/stand_in.rs"]
mod stand_in;

use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};

/// The simulated device's capacity (the stand-in driver's too).
const SIM_CAPACITY: u64 = 1 << 30;

fn config(conf: &str) -> AllocatorConfig {
    AllocatorConfig::parse(conf).unwrap_or_else(|e| panic!("settings {conf:?}: {e}"))
}

/// An allocator over a fresh simulated device (stream work completes at once).
fn on_sim(conf: &str) -> CachingAllocator<SimBackend> {
    CachingAllocator::new(SimBackend::new(SIM_CAPACITY), config(conf))
}

#[cfg(feature = "cuda")]
use allocview_alloc::caching::cuda::CudaBackend;

/// An allocator over CUDA device 0 (the stand-in driver or a real GPU).
#[cfg(feature = "cuda")]
fn on_cuda(conf: &str) -> CachingAllocator<CudaBackend> {
    let backend = CudaBackend::new(0).unwrap_or_else(|e| panic!("CUDA device 0: {e}"));
    CachingAllocator::new(backend, config(conf))
}

/// Set to `1` to run the suite on a real GPU.
#[cfg(feature = "cuda")]
const GPU_TESTS_VAR: &str = "ALLOCVIEW_CUDA_TESTS";

/// One `#[test]` per rule on the simulator and on the stand-in driver, and the list of rules
/// for the real-GPU run.
macro_rules! suite {
    ($($rule:ident),* $(,)?) => {
        /// Every rule on `SimBackend`.
        mod sim {
            $(
                #[test]
                fn $rule() {
                    crate::rules::$rule(&crate::on_sim);
                }
            )*
        }

        /// Every rule on `CudaBackend` over the stand-in driver (run in the child process).
        #[cfg(feature = "cuda")]
        mod on_stand_in {
            $(
                #[test]
                #[ignore = "run in a child process over the stand-in libcuda"]
                fn $rule() {
                    if !crate::stand_in::in_child() {
                        println!(
                            "skipped: not in the stand-in driver's child process ({})",
                            crate::stand_in::CHILD_VAR
                        );
                        return;
                    }
                    crate::rules::$rule(&crate::on_cuda);
                }
            )*
        }

        /// Every rule, by name, for the run on a real GPU.
        #[cfg(feature = "cuda")]
        const CUDA_RULES: &[(&str, fn(&rules::Make<CudaBackend>))] =
            &[$((stringify!($rule), rules::$rule::<CudaBackend>)),*];
    };
}

suite! {
    requests_round_up_to_512_bytes_or_to_power_of_two_divisions,
    segments_are_2_mib_small_20_mib_large_or_the_request_rounded_to_2_mib,
    best_fit_reuses_a_freed_block_and_takes_the_smallest_that_fits,
    splits_take_the_front_and_frees_merge_with_free_neighbours,
    oversize_blocks_serve_only_oversize_requests_within_the_rounding_slack,
    empty_cache_returns_every_whole_free_segment_to_the_device,
    cache_info_reports_cached_bytes_and_the_largest_free_block,
    base_allocation_finds_the_segment_of_any_pointer_inside_it,
    memory_stats_follow_a_known_sequence,
    a_free_after_record_stream_completes_after_the_other_streams_work,
    expandable_segments_grow_in_pages_and_empty_cache_unmaps_them,
    a_memory_fraction_refuses_a_big_request_with_out_of_memory,
    snapshots_stay_consistent_with_the_stats_through_a_mixed_sequence,
    a_request_beyond_the_device_fails_with_out_of_memory_after_flushing_the_cache,
    an_expandable_segment_that_cannot_grow_gives_back_the_pages_it_mapped,
}

#[cfg(feature = "cuda")]
#[test]
fn the_suite_passes_on_cuda_backend_over_the_stand_in_driver() {
    if stand_in::in_child() {
        return; // the child runs only the `on_stand_in` rules (this test is not selected there)
    }
    stand_in::run_in_child(CUDA_RULES.len());
}

#[cfg(feature = "cuda")]
#[test]
fn the_suite_passes_on_a_real_gpu() {
    if !std::env::var(GPU_TESTS_VAR).is_ok_and(|v| v == "1") {
        println!(
            "skipped: no GPU (caching suite on CudaBackend; set {GPU_TESTS_VAR}=1 on a machine \
             with one)"
        );
        return;
    }
    // Every rule runs even when one fails, so one GPU run reports all the differences.
    let mut failed = Vec::new();
    for (name, rule) in CUDA_RULES {
        println!("caching suite on the GPU: {name}");
        if std::panic::catch_unwind(|| rule(&on_cuda)).is_err() {
            failed.push(*name);
        }
    }
    assert!(
        failed.is_empty(),
        "caching suite on the GPU: {} of {} rules failed: {failed:?}",
        failed.len(),
        CUDA_RULES.len()
    );
    println!(
        "caching suite on the GPU: {} rules passed",
        CUDA_RULES.len()
    );
}
