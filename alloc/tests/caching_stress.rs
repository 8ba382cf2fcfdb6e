//! Eight threads share one allocator: random allocs and frees (some cross-stream), then the
//! stats agree with the snapshot and everything goes back to the device.

#[path = "support/builders.rs"]
mod builders;

use std::sync::Arc;
use std::thread;

use allocview_alloc::caching::backend::StreamId;
use builders::*;

const THREADS: u64 = 8;
const OPS_PER_THREAD: usize = 2_000;
/// Live blocks a thread keeps at most.
const MAX_LIVE: usize = 32;

/// The stress tests' xorshift generator, shared with the other crates' (this package cannot
/// depend on `allocview-tests`, so the file is included).
#[path = "../../tests/src/xorshift.rs"]
mod xorshift;
use xorshift::Rng;

#[test]
fn eight_threads_sharing_one_allocator_leave_consistent_stats() {
    let (a, dev) = allocator_with(4 * GIB, "");
    let a = Arc::new(a);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let a = a.clone();
            let dev = dev.clone();
            thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1));
                let stream = StreamId(t % 3);
                let mut live = Vec::new();
                for _ in 0..OPS_PER_THREAD {
                    let r = rng.next_u64();
                    if live.len() < MAX_LIVE && (live.is_empty() || !r.is_multiple_of(3)) {
                        let size = match r % 10 {
                            0..=6 => 1 + (r >> 8) % MIB,
                            7 | 8 => MIB + (r >> 8) % (8 * MIB),
                            _ => 10 * MIB + (r >> 8) % (20 * MIB),
                        };
                        live.push(a.malloc(size, stream).expect("4 GiB is enough"));
                    } else {
                        let p = live.swap_remove((r >> 4) as usize % live.len());
                        if r.is_multiple_of(7) {
                            let other = StreamId((t + 1) % 3);
                            a.record_stream(p, other).unwrap();
                            dev.submit_work(other);
                        }
                        a.free(p).unwrap();
                    }
                }
                live
            })
        })
        .collect();
    let mut leftovers = Vec::new();
    for h in handles {
        leftovers.extend(h.join().unwrap());
    }
    check_consistent(&a);
    let s = a.device_stats();
    assert_eq!(cur(&s.allocation) as usize, leftovers.len());
    for p in leftovers {
        a.free(p).unwrap();
    }
    dev.complete_all();
    a.empty_cache().unwrap();
    check_consistent(&a);
    let s = a.device_stats();
    assert_eq!((cur(&s.reserved_bytes), cur(&s.active)), (0, 0));
    assert_eq!(s.allocation.0[0].allocated, s.allocation.0[0].freed);
    assert_eq!(dev.used(), 0);
}

/// Snapshots taken while [`THREADS`] threads allocate and free.
const SNAPSHOTS_UNDER_LOAD: usize = 200;

#[test]
fn a_snapshot_with_stats_taken_while_threads_allocate_describes_one_moment() {
    use allocview_alloc::caching::stats::DeviceStats;
    use std::sync::atomic::{AtomicBool, Ordering};

    let (a, _dev) = allocator_with(4 * GIB, "");
    let a = Arc::new(a);
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (a, stop) = (a.clone(), stop.clone());
            thread::spawn(move || {
                let mut rng = Rng(0xD1B5_4A32_D192_ED03 ^ (t + 1));
                let mut live = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let r = rng.next_u64();
                    if live.len() < MAX_LIVE && !r.is_multiple_of(3) {
                        let size = 1 + (r >> 8) % (4 * MIB);
                        live.push(a.malloc(size, StreamId::DEFAULT).expect("4 GiB is enough"));
                    } else if let Some(p) = live.pop() {
                        a.free(p).unwrap();
                    }
                }
                for p in live {
                    a.free(p).unwrap();
                }
            })
        })
        .collect();
    for _ in 0..SNAPSHOTS_UNDER_LOAD {
        let (snap, stats) = a.snapshot_with_stats();
        let theirs = DeviceStats::from_snapshot(&snap, a.device(), a.config().max_split_size());
        assert_arrays_agree(&stats, &theirs, false);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
}
