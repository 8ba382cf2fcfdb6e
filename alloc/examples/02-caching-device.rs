//! The caching device allocator on the simulated device, the way an inference server that
//! manages device memory itself would use it: settings in PyTorch's syntax (or the builder),
//! blocks that free themselves, a second stream with `record_stream`, an OOM observer and a
//! trace tracker, a memory fraction, an out-of-memory error, and `memory_summary()`.
//!
//! Run: `cargo run -p allocview-alloc --example 02-caching-device`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use allocview_alloc::caching::{
    AllocatorConfig, CachingAllocator, DeviceBackend, SimBackend, StreamId,
};

const MIB: u64 = 1 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The same settings twice: as PYTORCH_CUDA_ALLOC_CONF would give them, and typed.
    let config = AllocatorConfig::parse("max_split_size_mb:128, expandable_segments:True")?;
    let typed = AllocatorConfig::builder()
        .max_split_size_mb(128)
        .expandable_segments(true)
        .build()?;
    assert_eq!(config.to_conf_string(), typed.to_conf_string());
    // A typo is an error that names the key and the valid ones.
    let typo = AllocatorConfig::parse("expandable_segment:True").unwrap_err();
    println!("a typo: {typo}\n");

    // A 1 GiB simulated device whose streams finish work only when told (as a real one would).
    let device = Arc::new(
        SimBackend::builder()
            .capacity(1 << 30)
            .auto_complete(false)
            .build(),
    );
    let allocator = Arc::new(CachingAllocator::new(device.clone(), config));
    let ooms = Arc::new(AtomicU64::new(0));
    let seen = ooms.clone();
    allocator.attach_oom_observer(move |oom| {
        seen.fetch_add(1, Relaxed);
        println!(
            "observer: device {} could not get {} bytes",
            oom.device, oom.segment_size
        );
    });
    let entries = Arc::new(AtomicU64::new(0));
    let counted = entries.clone();
    allocator.attach_trace_tracker(move |_entry| {
        counted.fetch_add(1, Relaxed);
    });

    // Weights on the default stream, freed when the block is dropped.
    let weights = allocator.malloc_owned(300 * MIB, StreamId::DEFAULT)?;
    // An activation handed to a copy stream: its free waits for that stream's work.
    let copy_stream = device.create_stream()?;
    let activation = allocator.malloc_owned(40 * MIB, StreamId::DEFAULT)?;
    activation.record_stream(copy_stream)?;
    device.submit_work(copy_stream);
    drop(activation);
    let stats = allocator.memory_stats();
    println!(
        "after the free: allocated {} MiB, active {} MiB (the copy stream still uses 40 MiB)",
        stats["allocated_bytes.all.current"] / MIB as i64,
        stats["active_bytes.all.current"] / MIB as i64,
    );
    device.complete_stream(copy_stream);
    allocator.process_events()?;
    println!(
        "copy done:      active {} MiB\n",
        allocator.memory_stats()["active_bytes.all.current"] / MIB as i64
    );

    // Half the device at most: a 600 MiB request cannot fit beside the 300 MiB of weights.
    allocator.set_memory_fraction(0.5)?;
    let err = allocator.malloc(600 * MIB, StreamId::DEFAULT).unwrap_err();
    println!("{err}\n");
    assert_eq!(ooms.load(Relaxed), 1);

    drop(weights);
    allocator.empty_cache()?;
    println!("{}", allocator.memory_summary());
    println!(
        "{} trace entries seen by the tracker; {} bytes still mapped on the device",
        entries.load(Relaxed),
        device.mapped_bytes()
    );
    Ok(())
}
