//! `allocview replay` end to end: an RMM log of a fragmenting two-stream workload, replayed on
//! a 1 GiB device under two settings side by side, as text and as JSON.

use std::process::Command;

use allocview::units::MIB;

/// Stream 1 caches 800 MiB and pins it with a small block in the middle; stream 2 then needs
/// 400 MiB: an OOM under the default settings on a 1 GiB device.
fn rmm_log() -> String {
    let rows: [(&str, u64, u64, u64); 14] = [
        ("allocate", 0x1000, 800 * MIB, 1),
        ("free", 0x1000, 800 * MIB, 1),
        ("allocate", 0x2000, 100 * MIB, 1),
        ("allocate", 0x3000, 100 * MIB, 1),
        ("allocate", 0x4000, 2 * MIB, 1),
        ("free", 0x2000, 100 * MIB, 1),
        ("free", 0x3000, 100 * MIB, 1),
        ("allocate", 0x5000, 400 * MIB, 2),
        ("free", 0x5000, 400 * MIB, 2),
        ("allocate", 0x6000, 4096, 1),
        ("allocate failure", 0x0, 1024 * MIB, 1),
        ("free", 0x6000, 4096, 1),
        ("free", 0x4000, 2 * MIB, 1),
        ("allocate", 0x7000, 512, 2),
    ];
    allocview_tests::fixtures::rmm_log(&rows)
}

fn allocview(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .output()
        .expect("allocview runs")
}

/// `allocview ARGS`'s stdout, after checking that it succeeded.
fn allocview_ok(args: &[&str]) -> Vec<u8> {
    let out = allocview(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn replay_compares_two_configs_side_by_side_with_the_recording_first() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("rmm.csv");
    std::fs::write(&log, rmm_log()).unwrap();
    let log = log.to_str().unwrap();
    let common = [
        "replay",
        log,
        "--device-memory",
        "1GiB",
        "--config",
        "expandable_segments:True",
        "--config",
        "max_split_size_mb:200",
    ];

    let stdout = allocview_ok(&[&common[..], &["--json"]].concat());
    let json: serde_json::Value = serde_json::from_slice(&stdout).unwrap();
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    assert_eq!(runs[0]["label"], "recorded");
    assert_eq!(runs[1]["label"], "recorded settings, 1.00 GiB device");
    assert_eq!(runs[2]["label"], "expandable_segments:True");
    assert_eq!(runs[3]["label"], "max_split_size_mb:200");
    // The log records no device size: the recorded column is the recording, its one failure.
    assert_eq!(runs[0]["ooms"], 1, "{json:#}");
    assert_eq!(runs[0]["first_oom"]["requested"], 1024 * MIB);
    assert!(json["recorded_device_memory"].is_null(), "{json:#}");
    // On 1 GiB the recorded settings also fail the 400 MiB request the default layout
    // cannot serve.
    assert_eq!(runs[1]["ooms"], 2, "{json:#}");
    assert_eq!(runs[1]["first_oom"]["requested"], 400 * MIB);
    assert_eq!(runs[1]["first_oom"]["diagnosis"]["kind"], "fragmentation");
    // Expandable segments release the stranded pages: only the 1 GiB request fails.
    assert_eq!(runs[2]["ooms"], 1, "{json:#}");
    assert_eq!(runs[2]["first_oom"]["requested"], 1024 * MIB);
    assert_eq!(json["events"], 20);
    assert_eq!(json["device_memory"], 1u64 << 30);

    let stdout = allocview_ok(&common);
    let text = String::from_utf8(stdout).unwrap();
    let header = text
        .lines()
        .find(|l| l.contains("recorded") && l.contains("expandable_segments:True"))
        .unwrap_or_else(|| panic!("no table header in:\n{text}"));
    assert!(header.find("recorded") < header.find("max_split_size_mb:200"));
    assert!(text.contains("peak reserved"), "{text}");
    assert!(text.contains("first OOM at trace entry"), "{text}");
}

#[test]
fn replay_of_a_missing_file_or_bad_size_fails_with_a_clear_message() {
    let out = allocview(&["replay", "/nonexistent/trace.pickle"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/trace.pickle"), "{err}");
    // The reason is said once.
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("rmm.csv");
    std::fs::write(&log, rmm_log()).unwrap();
    let out = allocview(&["replay", log.to_str().unwrap(), "--device-memory", "lots"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--device-memory") && err.contains("bad size \"lots\""),
        "{err}"
    );
    // Zero, as `demo` says it.
    let out = allocview(&["replay", log.to_str().unwrap(), "--device-memory", "0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--device-memory must be more than 0 bytes"),
        "{err}"
    );

    // `defaults` anywhere but first says where it goes instead of "expected KEY:VALUE".
    let out = allocview(&[
        "replay",
        log.to_str().unwrap(),
        "--config",
        "expandable_segments:True,defaults",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"write "defaults,expandable_segments:True""#),
        "{err}"
    );

    // An --out that cannot be written names its path once.
    let out = allocview(&[
        "replay",
        log.to_str().unwrap(),
        "--out",
        "/nonexistent/x.pickle",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("/nonexistent/x.pickle").count(), 1, "{err}");

    // An --out that is the input file is refused, and the input stays as it was.
    let before = std::fs::read(&log).unwrap();
    let out = allocview(&[
        "replay",
        log.to_str().unwrap(),
        "--out",
        log.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--out names the input file"), "{err}");
    assert_eq!(std::fs::read(&log).unwrap(), before);
}

#[test]
fn replay_of_a_pytorch_snapshot_reports_full_fidelity_and_writes_the_replayed_run() {
    let Some(fixture) = allocview_tests::fixtures::fixture("small-97-events.pickle") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("replayed.pickle");
    let stdout = allocview_ok(&[
        "replay",
        fixture.to_str().unwrap(),
        "--out",
        out_path.to_str().unwrap(),
    ]);
    let text = String::from_utf8(stdout).unwrap();
    assert!(
        text.contains("36/36 allocations at the recorded address (100.0%)"),
        "{text}"
    );
    assert!(
        text.contains("9/9 segment allocations of the recorded size"),
        "{text}"
    );
    assert!(
        text.contains("final segments match the snapshot's"),
        "{text}"
    );
    // A protocol 4 pickle that reads back with the replay's own trace.
    let bytes = std::fs::read(&out_path).unwrap();
    assert_eq!(&bytes[..2], &[0x80, 0x04]);
    let back = allocview_agent::snapshot_file::load(&out_path).unwrap();
    let allocs = back.device_traces[0]
        .iter()
        .filter(|e| e.action == allocview_alloc::snapshot::TraceAction::Alloc)
        .count();
    assert_eq!(allocs, 36);
    assert_eq!(back.segments.len(), 9);
}

#[test]
fn replay_out_writes_the_what_if_run_and_one_file_per_config_when_there_are_several() {
    let Some(fixture) = allocview_tests::fixtures::fixture("small-97-events.pickle") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("replayed.pickle");
    let fixture = fixture.to_str().unwrap();
    let stdout = allocview_ok(&[
        "replay",
        fixture,
        "--config",
        "expandable_segments:True",
        "--out",
        out_path.to_str().unwrap(),
    ]);
    let text = String::from_utf8(stdout).unwrap();
    assert!(
        text.contains(&format!(
            "what-if run (expandable_segments:True) written to {}",
            out_path.display()
        )),
        "{text}"
    );
    let back = allocview_agent::snapshot_file::load(&out_path).unwrap();
    let settings = allocview_agent::replay::recorded_config(&back).unwrap();
    assert!(settings.expandable_segments());
    assert!(!back.segments.is_empty());
    assert!(back.segments.iter().all(|s| s.is_expandable));
    use allocview_alloc::snapshot::TraceAction;
    let trace = &back.device_traces[0];
    assert!(trace.iter().any(|e| e.action == TraceAction::SegmentMap));
    assert!(!trace.iter().any(|e| e.action == TraceAction::SegmentAlloc));

    // Two configs: one file each, named after its run; `defaults` is PyTorch's defaults.
    let stdout = allocview_ok(&[
        "replay",
        fixture,
        "--config",
        "expandable_segments:True",
        "--config",
        "defaults",
        "--out",
        out_path.to_str().unwrap(),
    ]);
    let text = String::from_utf8(stdout).unwrap();
    let first = dir
        .path()
        .join("replayed.1-expandable_segments_True.pickle");
    let second = dir.path().join("replayed.2-defaults.pickle");
    assert!(
        text.contains(&format!(
            "what-if run (defaults) written to {}",
            second.display()
        )),
        "{text}"
    );
    let header = text
        .lines()
        .find(|l| l.trim_start().starts_with("recorded") && l.contains("expandable"))
        .unwrap_or_else(|| panic!("no table header in:\n{text}"));
    // The recording used PyTorch's defaults: `defaults` is the recorded settings again.
    assert!(
        header.trim_end().ends_with("defaults (as recorded)"),
        "{header}"
    );
    assert!(
        text.contains("recorded settings: PyTorch defaults\n"),
        "{text}"
    );
    let exp = allocview_agent::snapshot_file::load(&first).unwrap();
    assert!(exp.segments.iter().all(|s| s.is_expandable));
    let def = allocview_agent::snapshot_file::load(&second).unwrap();
    assert!(!def.segments.is_empty());
    assert!(def.segments.iter().all(|s| !s.is_expandable));
}
