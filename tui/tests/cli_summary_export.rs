//! `allocview summary` and `allocview export`, through the real binary.

use std::path::Path;
use std::process::{Command, Output};

use allocview_agent::snapshot_file;
use allocview_tests::fixtures::fixture;

const BIN: &str = env!("CARGO_BIN_EXE_allocview");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("binary runs")
}

/// `allocview export INPUT --to FORMAT -o OUT`.
fn export(input: &Path, to: &str, out: &Path) -> Output {
    run(&[
        "export",
        input.to_str().unwrap(),
        "--to",
        to,
        "-o",
        out.to_str().unwrap(),
    ])
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: &Output) {
    assert!(o.status.success(), "failed: {}", stderr(o));
}

/// A failure: exit code 1, a message, no panic.
fn fails_cleanly(o: &Output) -> String {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.starts_with("allocview: "), "{err}");
    err
}

/// The text `allocview summary` prints for the fixture `name` (`None`: fixtures not found).
fn summary_text(name: &str) -> Option<String> {
    let p = fixture(name)?;
    let o = run(&["summary", p.to_str().unwrap()]);
    ok(&o);
    Some(stdout(&o))
}

#[test]
fn summary_prints_pytorchs_table_and_fragmentation() {
    let Some(out) = summary_text("small-97-events.pickle") else {
        return;
    };
    assert!(
        out.contains("PyTorch CUDA memory summary, device ID 0"),
        "{out}"
    );
    assert!(
        out.contains("By pool") && out.contains("By stream"),
        "{out}"
    );
    assert!(out.contains("97 trace entries"), "{out}");
    assert!(out.contains("Trace: 97 entries;"), "{out}");
}

#[test]
fn summary_counts_take_the_singular_for_one() {
    let Some(out) = summary_text("legacy-2.0-history-format.pickle") else {
        return;
    };
    assert!(out.contains("257 segments, 948 blocks"), "{out}");
    assert!(out.contains("; 1 trace entry, "), "{out}");
    assert!(out.contains("Trace: 1 entry;"), "{out}");
}

#[test]
fn summary_json_totals_equal_the_sums_over_the_files_segments() {
    for name in [
        "tiny-3-segments.pickle",
        "small-97-events.pickle",
        "legacy-2.0-history-format.pickle",
    ] {
        let Some(p) = fixture(name) else { return };
        let o = run(&["summary", "--json", p.to_str().unwrap()]);
        ok(&o);
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
        let s = snapshot_file::load(&p).unwrap();
        let blocks = || s.segments.iter().flat_map(|seg| &seg.blocks);
        let reserved: u64 = s.segments.iter().map(|seg| seg.total_size).sum();
        let allocated: u64 = blocks()
            .filter(|b| b.state.as_str() == "active_allocated")
            .map(|b| b.size)
            .sum();
        let active: u64 = blocks()
            .filter(|b| b.state.is_active())
            .map(|b| b.size)
            .sum();
        assert_eq!(v["total_reserved"].as_u64(), Some(reserved), "{name}");
        assert_eq!(v["total_allocated"].as_u64(), Some(allocated), "{name}");
        assert_eq!(v["total_active"].as_u64(), Some(active), "{name}");
        assert_eq!(v["segments"].as_u64(), Some(s.segments.len() as u64));
        assert_eq!(v["blocks"].as_u64(), Some(blocks().count() as u64));
        for key in [
            "total_requested",
            "largest_free_block",
            "trace_entries",
            "ooms",
        ] {
            assert!(v[key].is_u64(), "{name}: {key} is a plain integer");
        }
        assert!(v["devices"][0]["pools"]["large"]["reserved"].is_u64());
        assert!(v["devices"][0]["streams"][0]["stream"].is_u64());
    }
}

#[test]
fn export_converts_both_ways_without_loss() {
    let Some(p) = fixture("cs336-newest-format.pickle") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("snap.json");
    let pickle = dir.path().join("snap.pickle");
    ok(&export(&p, "json", &json));
    ok(&export(&json, "pickle", &pickle));
    let original = snapshot_file::load(&p).unwrap();
    assert_eq!(snapshot_file::load(&json).unwrap(), original);
    assert_eq!(snapshot_file::load(&pickle).unwrap(), original);
    assert_eq!(
        snapshot_file::detect(&std::fs::read(&json).unwrap()),
        Some(snapshot_file::FileFormat::Json)
    );
    assert_eq!(&std::fs::read(&pickle).unwrap()[..2], &[0x80, 0x04]);

    // The summary of the export is the summary of the original.
    let a = run(&["summary", "--json", p.to_str().unwrap()]);
    let b = run(&["summary", "--json", pickle.to_str().unwrap()]);
    assert_eq!(stdout(&a), stdout(&b));

    let has_python = Command::new("python3")
        .args(["-c", "import pickle"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_python {
        println!("skipped: python3 not found (python reading the export)");
        return;
    }
    let o = Command::new("python3")
        .args([
            "-c",
            "import pickle,sys; a=pickle.load(open(sys.argv[1],'rb')); \
             b=pickle.load(open(sys.argv[2],'rb')); print(a == b)",
            pickle.to_str().unwrap(),
            p.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(stdout(&o).trim(), "True", "{}", stderr(&o));
}

#[test]
fn bad_files_exit_1_with_a_message_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pickle");
    let err = fails_cleanly(&run(&["summary", missing.to_str().unwrap()]));
    assert!(err.contains("missing.pickle"), "{err}");

    let garbage = dir.path().join("garbage.bin");
    std::fs::write(&garbage, b"PK\x03\x04 not a snapshot").unwrap();
    let err = fails_cleanly(&run(&["summary", garbage.to_str().unwrap()]));
    assert!(err.contains("not a snapshot file"), "{err}");

    // pickle.dumps(os.system, protocol=4)
    let evil = dir.path().join("evil.pickle");
    std::fs::write(
        &evil,
        b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94.",
    )
    .unwrap();
    let err = fails_cleanly(&run(&["summary", "--json", evil.to_str().unwrap()]));
    assert!(
        err.contains("STACK_GLOBAL") && err.contains("offset 28"),
        "{err}"
    );

    let newer = dir.path().join("newer.json");
    std::fs::write(&newer, br#"{"format":"allocview-snapshot","version":7}"#).unwrap();
    let err = fails_cleanly(&export(&newer, "pickle", &dir.path().join("x.pickle")));
    assert!(err.contains("version 7"), "{err}");

    if let Some(p) = fixture("small-97-events.pickle") {
        let bytes = std::fs::read(&p).unwrap();
        let cut = dir.path().join("cut.pickle");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let err = fails_cleanly(&run(&["summary", cut.to_str().unwrap()]));
        assert!(
            err.contains("cut.pickle") && err.contains("truncated"),
            "{err}"
        );

        let err = fails_cleanly(&export(
            &p,
            "json",
            &dir.path().join("no/such/dir/out.json"),
        ));
        assert!(err.contains("out.json"), "{err}");
    }
}

#[test]
fn a_pickle_export_refuses_segments_whose_blocks_do_not_tile() {
    let Some(p) = fixture("tiny-3-segments.pickle") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut s = snapshot_file::load(&p).unwrap();
    s.segments[1].blocks[0].address += 512;
    let broken = dir.path().join("broken.json");
    snapshot_file::save(&broken, &s, snapshot_file::FileFormat::Json).unwrap();
    let err = fails_cleanly(&export(&broken, "pickle", &dir.path().join("out.pickle")));
    assert!(err.contains("segments[1]") && err.contains("tile"), "{err}");
    assert!(!dir.path().join("out.pickle").exists());
}

#[test]
fn export_refuses_an_output_name_whose_extension_names_the_other_format() {
    let Some(p) = fixture("tiny-3-segments.pickle") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for (to, name, other) in [
        ("json", "out.pickle", "pickle"),
        ("json", "OUT.PKL", "pickle"),
        ("pickle", "out.json", "json"),
    ] {
        let out = dir.path().join(name);
        let err = fails_cleanly(&export(&p, to, &out));
        assert!(
            err.contains(name) && err.contains(&format!("--to {other}")),
            "{err}"
        );
        assert!(!out.exists(), "{name} written");
    }
    // An extension naming no format is the user's choice.
    let out = dir.path().join("out.snapshot");
    ok(&export(&p, "json", &out));
    assert!(snapshot_file::load(&out).is_ok());
}

/// `allocview export INPUT -o OUT`, the format left to OUT's extension.
fn export_by_extension(input: &Path, out: &Path) -> Output {
    run(&[
        "export",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ])
}

/// The format of the file at `path`, read from its bytes.
fn format_of_file(path: &Path) -> Option<snapshot_file::FileFormat> {
    snapshot_file::detect(&std::fs::read(path).unwrap())
}

#[test]
fn export_without_to_takes_the_format_from_the_output_extension() {
    use snapshot_file::FileFormat::{Json, Pickle};
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.json");
    let snapshot = allocview_alloc::snapshot::Snapshot::default();
    snapshot_file::save(&input, &snapshot, Json).unwrap();
    for (name, format) in [
        ("out.pickle", Pickle),
        ("OUT.PKL", Pickle),
        ("out.Json", Json),
    ] {
        let out = dir.path().join(name);
        let o = export_by_extension(&input, &out);
        ok(&o);
        assert_eq!(format_of_file(&out), Some(format), "{name}");
        assert_eq!(snapshot_file::load(&out).unwrap(), snapshot, "{name}");
    }

    // --to still decides where given, and may name an extension-less or unknown output.
    let out = dir.path().join("out.snapshot");
    ok(&export(&input, "pickle", &out));
    assert_eq!(format_of_file(&out), Some(Pickle));

    // A real PyTorch file, through both inferred conversions, loses nothing.
    if let Some(p) = fixture("tiny-3-segments.pickle") {
        let json = dir.path().join("tiny.json");
        let pickle = dir.path().join("tiny.pkl");
        ok(&export_by_extension(&p, &json));
        ok(&export_by_extension(&json, &pickle));
        assert_eq!(format_of_file(&json), Some(Json));
        assert_eq!(format_of_file(&pickle), Some(Pickle));
        let original = snapshot_file::load(&p).unwrap();
        assert_eq!(snapshot_file::load(&pickle).unwrap(), original);
    }
}

#[test]
fn export_without_to_refuses_an_output_extension_naming_no_format_and_lists_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.json");
    let snapshot = allocview_alloc::snapshot::Snapshot::default();
    snapshot_file::save(&input, &snapshot, snapshot_file::FileFormat::Json).unwrap();
    for (name, says) in [
        ("out.snapshot", "`.snapshot` names no format"),
        ("out", "no extension"),
    ] {
        let out = dir.path().join(name);
        let err = fails_cleanly(&export_by_extension(&input, &out));
        assert!(err.contains(name) && err.contains(says), "{err}");
        assert!(err.contains(".json, .pickle or .pkl"), "{err}");
        assert!(err.contains("--to json|pickle"), "{err}");
        assert!(!out.exists(), "{name} written");
    }
}

#[test]
fn export_refuses_to_write_over_its_input_under_any_name() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pickle");
    let snapshot = allocview_alloc::snapshot::Snapshot::default();
    snapshot_file::save(&input, &snapshot, snapshot_file::FileFormat::Pickle).unwrap();
    let before = std::fs::read(&input).unwrap();
    let modified = std::fs::metadata(&input).unwrap().modified().unwrap();
    let link = dir.path().join("link.pickle");
    std::os::unix::fs::symlink(&input, &link).unwrap();
    let dotted = dir.path().join(".").join("in.pickle");
    for out in [&input, &link, &dotted] {
        let err = fails_cleanly(&export_by_extension(&input, out));
        assert!(err.contains("the output is the input file"), "{err}");
    }
    assert_eq!(std::fs::read(&input).unwrap(), before);
    assert_eq!(
        std::fs::metadata(&input).unwrap().modified().unwrap(),
        modified
    );
}

#[test]
fn export_help_says_the_extension_picks_the_format() {
    let o = run(&["export", "--help"]);
    ok(&o);
    let help = stdout(&o);
    assert!(help.contains("OUT's extension names"), "{help}");
    assert!(
        help.contains("allocview export oom.pickle -o oom.json"),
        "{help}"
    );
}

#[test]
fn counts_of_one_take_the_singular_in_the_demo_report_and_sizes_round_up_a_unit() {
    let report = allocview::demo::Report {
        scenario: "training".into(),
        device: "simulated".into(),
        steps: 1,
        seconds: 0.5,
        agent_matches_allocator: true,
        ..Default::default()
    };
    let text = allocview::cmd::demo::report_text(&report);
    assert!(text.contains(": 1 step in"), "{text}");
    let text = allocview::cmd::demo::report_text(&allocview::demo::Report { steps: 2, ..report });
    assert!(text.contains(": 2 steps in"), "{text}");
    assert_eq!(allocview::units::bytes((1 << 20) - 1), "1.00 MiB");
}
