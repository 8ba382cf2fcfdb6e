//! Snapshot files: format detection, allocview JSON, load/save, round trips on every fixture.

#[path = "support/snapshot_fixtures.rs"]
mod support;

#[path = "support/snapshot_builders.rs"]
mod builders;

use std::collections::HashSet;
use std::sync::Arc;

use allocview_agent::snapshot_file::{self, FileFormat, SnapshotFileError};
use allocview_alloc::snapshot::{Frame, Snapshot};
use builders::rich_snapshot;

#[test]
fn formats_are_detected_from_their_first_bytes() {
    assert_eq!(
        snapshot_file::detect(b"\x80\x04\x95"),
        Some(FileFormat::Pickle)
    );
    assert_eq!(
        snapshot_file::detect(b"\x80\x02}"),
        Some(FileFormat::Pickle)
    );
    assert_eq!(
        snapshot_file::detect(b"  \n{\"format\""),
        Some(FileFormat::Json)
    );
    assert_eq!(snapshot_file::detect(b"\x80\x01"), None);
    assert_eq!(snapshot_file::detect(b"PK\x03\x04"), None);
    assert_eq!(snapshot_file::detect(b""), None);
}

#[test]
fn every_fixture_round_trips_through_json_and_pickle() {
    for name in support::FIXTURES {
        let Some(bytes) = support::fixture_bytes(name) else {
            return;
        };
        let s = snapshot_file::from_bytes(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        for format in [FileFormat::Json, FileFormat::Pickle] {
            let out = snapshot_file::to_bytes(&s, format);
            assert_eq!(snapshot_file::detect(&out), Some(format));
            let back = snapshot_file::from_bytes(&out).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(back == s, "{name}: model -> {format:?} -> model differs");
        }
    }
}

#[test]
fn a_model_using_every_field_round_trips_through_json() {
    let s = rich_snapshot();
    let json = snapshot_file::to_bytes(&s, FileFormat::Json);
    let text = std::str::from_utf8(&json).unwrap();
    assert!(
        text.starts_with(r#"{"format":"allocview-snapshot","version":1,"#),
        "{text}"
    );
    assert_eq!(snapshot_file::from_bytes(&json).unwrap(), s);
}

fn distinct_frame_lists(s: &Snapshot) -> usize {
    let mut set = HashSet::new();
    for seg in &s.segments {
        for b in &seg.blocks {
            set.insert(Arc::as_ptr(&b.frames) as *const Frame as usize);
        }
    }
    for t in &s.device_traces {
        for e in t {
            set.insert(Arc::as_ptr(&e.frames) as *const Frame as usize);
        }
    }
    set.len()
}

#[test]
fn json_keeps_frame_lists_shared_and_small() {
    let Some(bytes) = support::fixture_bytes("cs336-ctx256-forward-mixed.pickle") else {
        return;
    };
    let s = snapshot_file::from_bytes(&bytes).unwrap();
    let json = snapshot_file::to_bytes(&s, FileFormat::Json);
    assert!(
        json.len() < bytes.len() * 2,
        "{} vs {}",
        json.len(),
        bytes.len()
    );
    let back = snapshot_file::from_bytes(&json).unwrap();
    assert!(distinct_frame_lists(&back) <= distinct_frame_lists(&s));
}

fn json_error(text: &str) -> String {
    let e = snapshot_file::from_bytes(text.as_bytes()).unwrap_err();
    assert!(matches!(e, SnapshotFileError::Json(_)), "{e:?}");
    e.to_string()
}

#[test]
fn a_newer_version_is_refused_clearly() {
    let msg = json_error(r#"{"format":"allocview-snapshot","version":2,"whatever":[]}"#);
    assert!(
        msg.contains("version 2 is newer") && msg.contains("up to version 1"),
        "{msg}"
    );
}

#[test]
fn json_that_is_not_ours_or_is_mistyped_names_the_problem() {
    let msg = json_error(r#"{"segments": []}"#);
    assert!(msg.contains("not an allocview snapshot"), "{msg}");
    let msg = json_error(r#"{"format": "something-else"}"#);
    assert!(msg.contains("something-else"), "{msg}");
    let msg = json_error("{ not json");
    assert!(msg.contains("line 1"), "{msg}");

    let mut v: serde_json::Value =
        serde_json::from_slice(&snapshot_file::to_bytes(&rich_snapshot(), FileFormat::Json))
            .unwrap();
    v["segments"][0]["blocks"][1]["size"] = serde_json::json!("big");
    let msg = json_error(&v.to_string());
    assert!(msg.contains("segments[0].blocks[1].size"), "{msg}");

    let mut v: serde_json::Value =
        serde_json::from_slice(&snapshot_file::to_bytes(&rich_snapshot(), FileFormat::Json))
            .unwrap();
    v["device_traces"][0][0]["frames"] = serde_json::json!(99);
    let msg = json_error(&v.to_string());
    assert!(
        msg.contains("device_traces[0][0].frames") && msg.contains("frame list 99"),
        "{msg}"
    );
}

#[test]
fn unknown_bytes_are_neither_format() {
    let e = snapshot_file::from_bytes(b"PK\x03\x04zip").unwrap_err();
    assert!(e.to_string().contains("not a snapshot file"), "{e}");
    assert!(e.to_string().contains("50 4b 03 04"), "{e}");
}

#[test]
fn load_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.pickle");
    let e = snapshot_file::load(&missing).unwrap_err();
    assert!(e.to_string().contains("nope.pickle"), "{e}");

    let bad = dir.path().join("bad.pickle");
    std::fs::write(&bad, b"\x80\x04\x95\x00").unwrap();
    let e = snapshot_file::load(&bad).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("bad.pickle") && msg.contains("offset"),
        "{msg}"
    );
}

#[test]
fn save_is_atomic_and_load_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let s = rich_snapshot();
    for format in [FileFormat::Json, FileFormat::Pickle] {
        let path = dir.path().join(format!("snap.{}", format.extension()));
        std::fs::write(&path, b"old contents").unwrap();
        snapshot_file::save(&path, &s, format).unwrap();
        assert_eq!(snapshot_file::load(&path).unwrap(), s);
    }
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "no temporary files left: {names:?}");

    let e = snapshot_file::save(&dir.path().join("no/such/dir/x.json"), &s, FileFormat::Json)
        .unwrap_err();
    assert!(e.to_string().contains("x.json"), "{e}");
}

#[test]
fn progress_is_reported_up_to_the_total() {
    let Some(path) = support::fixture("small-97-events.pickle") else {
        return;
    };
    let mut seen = Vec::new();
    let s = snapshot_file::load_with_progress(&path, &mut |done, total| seen.push((done, total)))
        .unwrap();
    assert_eq!(s.segments.len(), 9);
    let total = std::fs::metadata(&path).unwrap().len() * 2;
    assert!(seen.iter().all(|&(_, t)| t == total));
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
    assert_eq!(seen.last(), Some(&(total, total)));
}

#[test]
fn every_prefix_of_a_small_file_in_either_format_is_an_error() {
    let Some(bytes) = support::fixture_bytes("tiny-3-segments.pickle") else {
        return;
    };
    let s = snapshot_file::from_bytes(&bytes).unwrap();
    for full in [bytes.clone(), snapshot_file::to_bytes(&s, FileFormat::Json)] {
        for n in 0..full.len() {
            assert!(
                snapshot_file::from_bytes(&full[..n]).is_err(),
                "a prefix of {n} bytes loaded"
            );
        }
    }
}
