//! Property tests: random alloc / free / record_stream / empty_cache / stream-completion
//! sequences over several streams and configurations keep the allocator's invariants.
//!
//! After every few operations: blocks never overlap and tile their segments, and the
//! allocator's current stats equal those recomputed from its snapshot. At the end, freeing
//! everything, completing the streams and emptying the cache returns the device to zero.
//!
//! 10,000 cases by default (`PROPTEST_CASES` overrides it); `ALLOCVIEW_LONG_PROPTEST=1` runs
//! 1,000,000.

#[path = "support/builders.rs"]
mod builders;

use allocview_alloc::caching::AllocError;
use allocview_alloc::caching::backend::StreamId;
use builders::*;
use proptest::prelude::*;

/// Cases in the default run.
const DEFAULT_CASES: u32 = 10_000;
/// Cases in the long run.
const LONG_CASES: u32 = 1_000_000;
/// Device size: small enough that some sequences run out of memory.
const CAPACITY: u64 = 192 * MIB;
/// Streams used (0 is the default stream).
const STREAMS: u64 = 3;

fn cases() -> u32 {
    if let Some(n) = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    if std::env::var("ALLOCVIEW_LONG_PROPTEST").as_deref() == Ok("1") {
        LONG_CASES
    } else {
        DEFAULT_CASES
    }
}

/// The configurations exercised, and whether a memory fraction is set.
const CONFIGS: [(&str, Option<f64>); 6] = [
    ("", None),
    ("max_split_size_mb:24", None),
    ("roundup_power2_divisions:[1:4,8:2,>:8]", None),
    ("expandable_segments:True", None),
    ("", Some(0.5)),
    (
        "max_split_size_mb:20,garbage_collection_threshold:0.6",
        Some(0.8),
    ),
];

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: u64, stream: u64 },
    Free { pick: usize },
    RecordStream { pick: usize, stream: u64 },
    SubmitWork { stream: u64 },
    CompleteStream { stream: u64 },
    EmptyCache,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..=MIB,
        3 => MIB + 1..=12 * MIB,
        1 => 12 * MIB..=40 * MIB,
        1 => prop::sample::select(vec![512u64, MIB, 2 * MIB, 19 * MIB, 20 * MIB]),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (size(), 0..STREAMS).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        6 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), 0..STREAMS).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        2 => (0..STREAMS).prop_map(|stream| Op::SubmitWork { stream }),
        2 => (0..STREAMS).prop_map(|stream| Op::CompleteStream { stream }),
        1 => Just(Op::EmptyCache),
    ]
}

/// How often (in operations) the full snapshot check runs.
const CHECK_EVERY: usize = 4;

fn run(config: usize, ops: &[Op]) {
    let (conf, fraction) = CONFIGS[config];
    let (a, dev) = allocator_with(CAPACITY, conf);
    if let Some(f) = fraction {
        a.set_memory_fraction(f).unwrap();
    }
    let mut live: Vec<u64> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc { size, stream } => match a.malloc(size, StreamId(stream)) {
                Ok(p) => {
                    assert!(!live.contains(&p), "a live pointer was handed out twice");
                    live.push(p);
                }
                Err(AllocError::OutOfMemory(_)) => {}
                Err(e) => panic!("malloc failed: {e}"),
            },
            Op::Free { pick } if !live.is_empty() => {
                let p = live.swap_remove(pick % live.len());
                a.free(p).unwrap();
                assert!(a.free(p).is_err(), "double free is refused");
            }
            Op::RecordStream { pick, stream } if !live.is_empty() => {
                a.record_stream(live[pick % live.len()], StreamId(stream))
                    .unwrap();
            }
            Op::SubmitWork { stream } => dev.submit_work(StreamId(stream)),
            Op::CompleteStream { stream } => dev.complete_stream(StreamId(stream)),
            Op::EmptyCache => a.empty_cache().unwrap(),
            _ => {}
        }
        if i % CHECK_EVERY == 0 {
            check_consistent(&a);
        }
    }
    check_consistent(&a);
    for p in live.drain(..) {
        a.free(p).unwrap();
    }
    dev.complete_all();
    a.empty_cache().unwrap();
    let s = a.device_stats();
    check_consistent(&a);
    assert_eq!(cur(&s.reserved_bytes), 0);
    assert_eq!(cur(&s.allocated_bytes), 0);
    assert_eq!(cur(&s.active), 0);
    assert_eq!(dev.used(), 0, "the device is back to zero");
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_sequences_keep_blocks_tiled_and_stats_consistent(
        config in 0..CONFIGS.len(),
        ops in prop::collection::vec(op(), 1..32),
    ) {
        run(config, &ops);
    }
}
