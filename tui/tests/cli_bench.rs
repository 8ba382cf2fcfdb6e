//! `allocview bench` through the real binary: JSON shape and positive figures (never their
//! values: tests do not judge wall-clock time), filters, skips with reasons, and bad input.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// Seconds per side: enough to run every side's minimum number of batches, fast in a test.
const SECONDS: &str = "0.05";

/// The fixtures folder, relative to this crate.
const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/fixtures/pytorch-snapshots"
);

fn allocview(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allocview"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("the allocview binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json_rows(o: &Output) -> Vec<Value> {
    assert!(o.status.success(), "stderr: {}", stderr(o));
    let v: Value = serde_json::from_str(&stdout(o))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)));
    v.as_array().expect("a JSON array").clone()
}

fn positive(v: &Value) -> bool {
    v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0)
}

#[test]
fn caching_benchmarks_print_json_with_their_names_and_positive_figures() {
    let o = allocview(&["bench", "--seconds", SECONDS, "--json", "caching"], &[]);
    let rows = json_rows(&o);
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "caching.alloc_free_pair",
            "caching.with_trace_tracker",
            "caching.with_event_sink",
            "caching.event_sink_overload"
        ]
    );
    for r in &rows {
        assert!(positive(&r["allocview_ns"]), "{r}");
        assert!(positive(&r["baseline_ns"]), "{r}");
        assert!(positive(&r["ratio"]), "{r}");
        if r["name"] == "caching.event_sink_overload" {
            // Shown beside the goal's row, with no goal of its own.
            assert_eq!(r["goal"], "none", "{r}");
            assert!(r["met"].is_null(), "{r}");
        } else {
            assert!(
                r["goal"].as_str().is_some_and(|g| g.starts_with("<=")),
                "{r}"
            );
            assert!(r["met"].is_boolean(), "{r}");
        }
    }
    // The sink's row says what its clock reads cost here, a positive figure.
    let sink = &rows[2]["notes"];
    let clock = sink
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .find_map(|n| n.split_once("(2 reads a pair): "))
        .and_then(|(_, rest)| rest.split_once(" ns a read"))
        .and_then(|(ns, _)| ns.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no clock note in {sink}"));
    assert!(clock > 0.0, "{sink}");
}

#[test]
fn agent_benchmarks_measure_both_sides() {
    let o = allocview(&["bench", "--seconds", SECONDS, "--json", "agent."], &[]);
    let rows = json_rows(&o);
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "agent.publish",
            "agent.publish_batch",
            "agent.publish_live",
            "agent.ingest"
        ]
    );
    for r in &rows {
        assert!(positive(&r["allocview_ns"]), "{r}");
        assert!(positive(&r["baseline_ns"]), "{r}");
    }
}

#[test]
fn the_segments_frame_is_measured_against_an_empty_frame() {
    let o = allocview(
        &["bench", "--seconds", SECONDS, "--json", "tui.render"],
        &[],
    );
    let rows = json_rows(&o);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["name"], "tui.render_segments");
    assert!(positive(&rows[0]["allocview_ns"]), "{}", rows[0]);
    assert!(positive(&rows[0]["baseline_ns"]), "{}", rows[0]);
}

#[test]
fn a_filter_matching_nothing_fails_and_lists_the_benchmarks() {
    let o = allocview(&["bench", "--seconds", SECONDS, "no-such-benchmark"], &[]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("no benchmark matches"), "{err}");
    assert!(err.contains("snapshot.load"), "{err}");
}

#[test]
fn negative_nan_or_zero_seconds_are_clear_errors() {
    for bad in [
        "--seconds=-1",
        "--seconds=NaN",
        "--seconds=0",
        "--seconds=inf",
    ] {
        let o = allocview(&["bench", bad, "caching"], &[]);
        assert!(!o.status.success(), "{bad} was accepted");
        let err = stderr(&o);
        assert!(err.contains("--seconds"), "{bad}: {err}");
        assert!(stdout(&o).is_empty(), "{bad}: printed a table anyway");
    }
    // As a separate word, clap refuses a negative value before the command sees it.
    let o = allocview(&["bench", "--seconds", "-1", "caching"], &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("-1"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty());
}

#[test]
fn a_missing_fixture_is_listed_as_skipped_with_the_reason() {
    let o = allocview(
        &["bench", "--seconds", SECONDS, "--json", "snapshot.load"],
        &[("ALLOCVIEW_FIXTURES", "/nonexistent/allocview-fixtures")],
    );
    let rows = json_rows(&o);
    assert_eq!(rows.len(), 1);
    assert!(rows[0]["allocview_ns"].is_null());
    let notes = rows[0]["notes"].to_string();
    assert!(
        notes.contains("skipped") && notes.contains("ALLOCVIEW_FIXTURES"),
        "{notes}"
    );
}

#[test]
fn the_largest_fixture_is_measured_against_python_or_says_why_not() {
    if !Path::new(FIXTURES).is_dir() {
        println!("skipped: fixtures not found");
        return;
    }
    let o = allocview(
        &["bench", "--seconds", SECONDS, "--json", "snapshot.load"],
        &[("ALLOCVIEW_FIXTURES", FIXTURES)],
    );
    let rows = json_rows(&o);
    assert!(positive(&rows[0]["allocview_ns"]), "{}", rows[0]);
    // The Python baseline is there when python3 is; otherwise a note says why not.
    let notes = rows[0]["notes"].to_string();
    assert!(
        positive(&rows[0]["baseline_ns"]) || notes.contains("baseline skipped"),
        "{}",
        rows[0]
    );
}

#[test]
fn a_large_generated_snapshot_is_measured_against_python_without_fixtures() {
    let o = allocview(
        &[
            "bench",
            "--seconds",
            SECONDS,
            "--json",
            "snapshot.large_load",
        ],
        &[("ALLOCVIEW_FIXTURES", "/nonexistent/allocview-fixtures")],
    );
    let rows = json_rows(&o);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["name"], "snapshot.large_load");
    assert!(positive(&rows[0]["allocview_ns"]), "{}", rows[0]);
    assert_eq!(rows[0]["goal"], "faster than baseline", "{}", rows[0]);
    let notes = rows[0]["notes"].to_string();
    assert!(
        notes.contains("PyTorch's layout") && notes.contains("trace entries"),
        "{notes}"
    );
    // The Python baseline is there when python3 is; otherwise a note says why not.
    assert!(
        positive(&rows[0]["baseline_ns"]) || notes.contains("baseline skipped"),
        "{}",
        rows[0]
    );
}

#[test]
fn the_table_has_the_columns_and_names_what_cannot_run() {
    let o = allocview(&["bench", "--seconds", SECONDS, "heap.instrumented"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let header = out.lines().next().unwrap_or_default();
    for col in [
        "benchmark",
        "allocview",
        "baseline",
        "ratio",
        "goal",
        "verdict",
    ] {
        assert!(header.contains(col), "{header}");
    }
    assert!(
        out.contains("heap.instrumented") && out.contains("skipped"),
        "{out}"
    );
    assert!(out.contains("note: "), "{out}");
}

#[test]
fn replay_throughput_is_measured_per_trace_event_against_a_bare_replay() {
    if !Path::new(FIXTURES).is_dir() {
        println!("skipped: fixtures not found");
        return;
    }
    let o = allocview(
        &["bench", "--seconds", SECONDS, "--json", "replay.throughput"],
        &[("ALLOCVIEW_FIXTURES", FIXTURES)],
    );
    let rows = json_rows(&o);
    assert_eq!(rows.len(), 1);
    assert!(positive(&rows[0]["allocview_ns"]), "{}", rows[0]);
    assert!(positive(&rows[0]["baseline_ns"]), "{}", rows[0]);
    assert!(
        rows[0]["notes"].to_string().contains("trace events"),
        "{}",
        rows[0]
    );
}

#[test]
fn help_documents_the_fixtures_variable() {
    let o = allocview(&["bench", "--help"], &[]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let help = stdout(&o);
    assert!(help.contains("ALLOCVIEW_FIXTURES"), "{help}");
    assert!(
        help.contains("snapshot.load") && help.contains("replay.throughput"),
        "{help}"
    );
}
