//! A bounded mutation fuzzer over real snapshot files: bytes flipped, inserted, deleted,
//! overwritten with huge length fields, files truncated, and random bytes. Every input must
//! give a snapshot or an error, never a panic or a hang; what loads must also summarize and
//! write back without panicking.
//!
//! Runs `ALLOCVIEW_FUZZ_CASES` inputs per seed file (default [`DEFAULT_CASES`]) and prints how
//! many it tried. For long runs use the cargo-fuzz target in `fuzz/` (see
//! `docs/snapshot-format.md`).

#[path = "support/snapshot_fixtures.rs"]
mod support;

#[path = "support/snapshot_builders.rs"]
mod builders;

use std::sync::atomic::{AtomicU64, Ordering};

use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_agent::summary;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Inputs tried per seed file when `ALLOCVIEW_FUZZ_CASES` is not set.
const DEFAULT_CASES: u32 = 1000;

/// Most mutations applied to one input.
const MAX_MUTATIONS: usize = 8;

#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: usize,
        bits: u8,
    },
    Insert {
        at: usize,
        byte: u8,
    },
    Delete {
        at: usize,
    },
    /// Overwrites 8 bytes with an extreme little-endian number (a huge length or memo key).
    Huge {
        at: usize,
        value: u64,
    },
    Truncate {
        at: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 1u8..=255).prop_map(|(at, bits)| Mutation::Flip { at, bits }),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        2 => any::<usize>().prop_map(|at| Mutation::Delete { at }),
        1 => (any::<usize>(), prop_oneof![
            Just(u64::MAX),
            Just(u32::MAX as u64),
            Just(1u64 << 62),
            Just(0x7fff_ffff),
        ])
        .prop_map(|(at, value)| Mutation::Huge { at, value }),
        1 => any::<usize>().prop_map(|at| Mutation::Truncate { at }),
    ]
}

fn apply(seed: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for m in muts {
        if b.is_empty() {
            break;
        }
        match *m {
            Mutation::Flip { at, bits } => {
                let i = at % b.len();
                b[i] ^= bits;
            }
            Mutation::Insert { at, byte } => {
                let i = at % (b.len() + 1);
                b.insert(i, byte);
            }
            Mutation::Delete { at } => {
                let i = at % b.len();
                b.remove(i);
            }
            Mutation::Huge { at, value } => {
                let i = at % b.len();
                for (k, byte) in value.to_le_bytes().iter().enumerate() {
                    if let Some(slot) = b.get_mut(i + k) {
                        *slot = *byte;
                    }
                }
            }
            Mutation::Truncate { at } => {
                let i = at % b.len();
                b.truncate(i);
            }
        }
    }
    b
}

fn cases() -> u32 {
    std::env::var("ALLOCVIEW_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// Loads an input; whatever loads must summarize and encode too.
fn exercise(bytes: &[u8]) {
    if let Ok(s) = snapshot_file::from_bytes(bytes) {
        let _ = summary::summarize(&s).to_string();
        let _ = snapshot_file::to_bytes(&s, FileFormat::Pickle);
        let _ = snapshot_file::to_bytes(&s, FileFormat::Json);
    }
}

fn fuzz_seed(name: &str, seed: &[u8], tried: &AtomicU64) {
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = proptest::collection::vec(mutation(), 1..=MAX_MUTATIONS);
    let result = runner.run(&strategy, |muts| {
        let input = apply(seed, &muts);
        tried.fetch_add(1, Ordering::Relaxed);
        exercise(&input);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

#[test]
fn mutated_snapshot_files_never_panic() {
    let tried = AtomicU64::new(0);
    let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();
    let rich = builders::rich_snapshot();
    seeds.push((
        "rich (pickle)".into(),
        snapshot_file::to_bytes(&rich, FileFormat::Pickle),
    ));
    seeds.push((
        "rich (json)".into(),
        snapshot_file::to_bytes(&rich, FileFormat::Json),
    ));
    for name in support::SMALL_FIXTURES {
        if let Some(bytes) = support::fixture_bytes(name) {
            seeds.push((name.to_string(), bytes));
        }
    }
    for (name, seed) in &seeds {
        fuzz_seed(name, seed, &tried);
    }
    println!(
        "fuzz: tried {} mutated inputs over {} seed files",
        tried.load(Ordering::Relaxed),
        seeds.len()
    );
    assert!(tried.load(Ordering::Relaxed) >= cases() as u64 * seeds.len() as u64);
}

#[test]
fn random_bytes_after_a_pickle_header_never_panic() {
    let tried = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (2u8..=5, proptest::collection::vec(any::<u8>(), 0..512));
    runner
        .run(&strategy, |(proto, body)| {
            let mut input = vec![0x80, proto];
            input.extend_from_slice(&body);
            tried.fetch_add(1, Ordering::Relaxed);
            exercise(&input);
            exercise(&body);
            Ok(())
        })
        .unwrap();
    println!(
        "fuzz: tried {} random inputs",
        tried.load(Ordering::Relaxed) * 2
    );
}
