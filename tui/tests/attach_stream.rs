//! `allocview --attach ADDR --headless --json`, the stream: after the first line (the whole
//! state), each line carries only the events and usage samples that came since the previous
//! one, so a line a second does not print the client's last 1,024 events again and again.

use std::collections::HashSet;
use std::io::{BufRead as _, BufReader};

use serde_json::Value;

/// Lines read from the stream.
const LINES: usize = 4;

/// The `seq`s of a line's events (one device: the demo's first).
fn seqs(line: &Value) -> Vec<u64> {
    line["devices"][0]["recent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

#[test]
fn each_stream_line_after_the_first_carries_only_what_came_since_the_previous_line() {
    let dir = tempfile::tempdir().unwrap();
    let (demo, addr) = allocview_tests::cli::listening_demo(
        env!("CARGO_BIN_EXE_allocview"),
        dir.path(),
        "60",
        &[],
    );
    let mut stream =
        allocview_tests::cli::headless_json_stream(env!("CARGO_BIN_EXE_allocview"), &addr);
    let out = BufReader::new(stream.stdout.take().unwrap());
    let lines: Vec<Value> = out
        .lines()
        .take(LINES)
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    let _ = stream.kill();
    let _ = stream.wait();
    drop(demo);
    assert_eq!(lines.len(), LINES, "the stream ended early");

    assert!(lines[0]["since_ns"].is_null(), "{}", lines[0]["since_ns"]);
    let mut printed: HashSet<u64> = seqs(&lines[0]).into_iter().collect();
    for pair in lines.windows(2) {
        let (prev, line) = (&pair[0], &pair[1]);
        assert_eq!(line["since_ns"], prev["time_ns"]);
        let prev_last = seqs(prev).into_iter().max();
        for seq in seqs(line) {
            assert!(printed.insert(seq), "event {seq} printed twice");
            assert!(
                prev_last.is_none_or(|l| seq > l),
                "event {seq} before {prev_last:?}"
            );
        }
        // The frames are those of this line's events, no others.
        let used: HashSet<u64> = line["devices"][0]["recent"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["context"].as_u64().unwrap())
            .collect();
        for c in line["devices"][0]["contexts"].as_array().unwrap() {
            let id = c["id"].as_u64().unwrap();
            assert!(
                used.contains(&id),
                "frames of context {id}, used by no event"
            );
        }
        // Samples from the previous line's last one on.
        let prev_last_sample = prev["devices"][0]["timeline"]
            .as_array()
            .unwrap()
            .last()
            .map(|s| s["time_ns"].as_u64().unwrap());
        for s in line["devices"][0]["timeline"].as_array().unwrap() {
            let t = s["time_ns"].as_u64().unwrap();
            assert!(
                prev_last_sample.is_none_or(|p| t >= p),
                "sample {t} printed again"
            );
        }
    }
    // The demo publishes all along: later lines have events of their own.
    assert!(
        lines[1..].iter().any(|l| !seqs(l).is_empty()),
        "no events after the first line"
    );
}
