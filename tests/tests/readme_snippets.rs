//! The README's two Rust snippets (embedding the agent beside a caching allocator, and an
//! instrumented `#[global_allocator]`), compiled and run: every line of each README block
//! appears, in order, in this file (`the_readme_snippets_are_the_code_these_tests_run` fails
//! when the README and this file drift apart), and each test checks that the agent saw what
//! the snippet did.

use std::alloc::System;
use std::error::Error;
use std::sync::Arc;

use allocview_agent::agent::Agent;
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::history::HistoryOptions;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::stats::StatType;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use allocview_alloc::global::Instrumented;

#[global_allocator]
static HEAP: Instrumented<System> = Instrumented::new(System);

/// The README, read from the workspace root.
fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md")
}

/// The README's ```` ```rust ```` blocks (any attributes after `rust`), as lines.
fn rust_blocks(readme: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut open: Option<Vec<String>> = None;
    for line in readme.lines() {
        match open.as_mut() {
            None if line.starts_with("```rust") => open = Some(Vec::new()),
            None => {}
            Some(_) if line.starts_with("```") => blocks.extend(open.take()),
            Some(block) => block.push(line.to_string()),
        }
    }
    blocks
}

#[test]
fn the_readme_snippets_are_the_code_these_tests_run() {
    let readme = readme();
    let blocks = rust_blocks(&readme);
    assert_eq!(
        blocks.len(),
        2,
        "the README's Rust blocks changed: update this file"
    );
    let this: Vec<&str> = include_str!("readme_snippets.rs")
        .lines()
        .map(str::trim)
        .collect();
    for block in &blocks {
        // Each `use` line of the block, trimmed, somewhere in this file (rustfmt orders them);
        // every other non-blank line in order among this file's lines.
        let mut at = 0;
        for line in block.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
            if line.starts_with("use ") {
                assert!(
                    this.contains(&line),
                    "README import not in this file: {line}"
                );
                continue;
            }
            match this[at..].iter().position(|l| *l == line) {
                Some(i) => at += i + 1,
                None => {
                    panic!("README line not in tests/tests/readme_snippets.rs (in order): {line}")
                }
            }
        }
    }
}

#[test]
#[rustfmt::skip] // the README's lines, as the README writes them
fn the_embedding_snippet_publishes_an_allocation_and_its_free_to_the_agent()
-> Result<(), Box<dyn Error>> {
    let allocator = Arc::new(CachingAllocator::new(SimBackend::new(16 << 30), AllocatorConfig::from_env()?));
    // Optional: keep a trace (PyTorch's _record_memory_history), so that an OOM dump also shows
    // the calls that led to it, and `allocview summary` / `replay` can rebuild peaks from it.
    // Bound it in a long-running process: the default, as PyTorch's, keeps every entry.
    allocator.record_history(HistoryOptions { max_entries: 100_000, ..HistoryOptions::default() });
    let agent = Agent::builder()
        .provider(allocator.clone())        // snapshots for OOM dumps and resyncs (one per device)
        .dump_dir("/var/tmp/my-service")    // default $ALLOCVIEW_DUMP_DIR, else ./allocview-dumps
        .spawn()?;                          // listens at $ALLOCVIEW_ADDR, else $XDG_RUNTIME_DIR/allocview/<pid>.sock
    allocator.set_event_sink(Some(agent.sink()));
    let p = allocator.malloc(64 << 20, StreamId::DEFAULT)?;
    allocator.free(p)?;
    agent.flush();                          // providers publish their gathered events, then fold

    let state = agent.state();
    let stats = &state.devices[0].stats;
    assert_eq!(stats.allocated_bytes.get(StatType::All).allocated, 64 << 20);
    assert_eq!(stats.allocated_bytes.get(StatType::All).freed, 64 << 20);
    assert!(agent.listen_addr().is_some(), "the agent listens by default");
    agent.shutdown();
    Ok(())
}

#[test]
#[rustfmt::skip] // the README's lines, as the README writes them
fn the_global_allocator_snippet_shows_the_heap_to_the_agent() -> Result<(), Box<dyn Error>> {
    let agent = Agent::builder().host_provider(Arc::new(&HEAP)).spawn()?;
    HEAP.set_sink(Some(agent.leak_sink()));   // or Box::leak(Box::new(agent.sink())) as &'static _

    let held: Vec<Box<[u8; 4096]>> = (0..64).map(|_| Box::new([1u8; 4096])).collect();
    agent.flush();
    let host = agent.state().host.expect("the heap publishes");
    assert!(host.bytes.current >= 64 * 4096, "{host:?}");
    drop(held);
    HEAP.set_sink(None);
    agent.shutdown();
    Ok(())
}
