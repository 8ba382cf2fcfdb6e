//! allocview's machine-readable outputs through the real binary, as docs/json.md describes
//! them: every JSON output names its format and version first, `summary`'s CI gates
//! (`--fail-on-oom`, `--max-peak`) exit with status 3 after the output, `replay --json` lists
//! the files `--out` wrote, no arguments is a usage error with the help on stderr, `summary`
//! and `replay` word a file they cannot load alike, the documented jq gate works, and every
//! output's keys are the ones docs/json.md lists.

#[path = "support/builders.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use allocview_tests::cli::headless_demo;

use allocview::units::MIB;
use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_alloc::snapshot::Snapshot;

/// The exit status of a failed gate (docs/json.md).
const GATE_FAILED: i32 = 3;

fn allocview(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .env_remove("ALLOCVIEW_ADDR")
        .env_remove("ALLOCVIEW_ALLOC_CONF")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .stdin(Stdio::null())
        .output()
        .expect("allocview runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `allocview ARGS`'s stdout as JSON, after checking that it succeeded.
fn json_ok(args: &[&str]) -> serde_json::Value {
    allocview_tests::cli::json_of_success(&allocview(args))
}

/// Checks that pretty JSON text begins with `format` then `version`, with these values.
fn starts_with_format_and_version(text: &str, format: &str, version: u32) {
    let start = format!("{{\n  \"format\": \"{format}\",\n  \"version\": {version},\n");
    assert!(text.starts_with(&start), "{}", &text[..text.len().min(200)]);
}

/// A traced snapshot with an OOM each round.
fn with_ooms() -> Snapshot {
    support::traced_snapshot(2)
}

/// An RMM log of a few allocations and frees, no failure: 8 MiB and 3 MiB live together at
/// the peak.
fn clean_rmm_log() -> String {
    allocview_tests::fixtures::rmm_log(&[
        ("allocate", 0x1000, 8 * MIB, 1),
        ("allocate", 0x2000, 3 * MIB, 1),
        ("free", 0x1000, 8 * MIB, 1),
        ("allocate", 0x3000, 4096, 1),
        ("free", 0x2000, 3 * MIB, 1),
        ("free", 0x3000, 4096, 1),
    ])
}

/// A snapshot without OOMs whose trace the caching allocator itself wrote (`replay --out` of
/// [`clean_rmm_log`]), so that `summary` reproduces it and knows its peaks.
fn clean_file(dir: &Path) -> PathBuf {
    let log = dir.join("clean.csv");
    std::fs::write(&log, clean_rmm_log()).unwrap();
    let out = dir.join("clean.pickle");
    let o = allocview(&[
        "replay",
        log.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

/// A file with OOMs whose trace the caching allocator itself wrote, so that `summary`
/// reproduces it: [`clean_rmm_log`] replayed with PyTorch's defaults on a 10 MiB device (its
/// 8 MiB and 3 MiB requests each need a 20 MiB segment).
fn oom_file(dir: &Path) -> PathBuf {
    let log = dir.join("clean.csv");
    std::fs::write(&log, clean_rmm_log()).unwrap();
    let out = dir.join("ooms.pickle");
    let o = allocview(&[
        "replay",
        log.to_str().unwrap(),
        "--device-memory",
        "10MiB",
        "--config",
        "defaults",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

/// Segments and no trace: the peaks over the trace window are not known.
fn without_trace() -> Snapshot {
    Snapshot {
        segments: support::segments(),
        ..Default::default()
    }
}

/// `snapshot` saved as allocview JSON in `dir` under `name`.
fn saved(dir: &Path, name: &str, snapshot: &Snapshot) -> PathBuf {
    let p = dir.join(name);
    snapshot_file::save(&p, snapshot, FileFormat::Json).unwrap();
    p
}

/// docs/json.md.
fn json_md() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/json.md"))
        .expect("docs/json.md")
}

/// One row of a key table in docs/json.md: the backticked keys of its first cell, and the
/// rest of the row (the meaning).
struct KeyRow {
    keys: Vec<String>,
    meaning: String,
}

/// The rows of the first table after the lines starting with each of `markers` in turn (a
/// section's heading, then for a sub-table its `` `devices[]`: `` line).
fn key_table(doc: &str, markers: &[&str]) -> Vec<KeyRow> {
    let mut at = 0;
    for m in markers {
        at += doc[at..]
            .find(&format!("\n{m}"))
            .unwrap_or_else(|| panic!("docs/json.md has no line starting with {m}"))
            + 1;
    }
    let mut rows = Vec::new();
    for line in doc[at..].lines().skip(1) {
        let Some(row) = line.strip_prefix('|') else {
            if rows.is_empty() {
                continue;
            }
            break;
        };
        let (first, meaning) = row.split_once('|').unwrap_or((row, ""));
        if first.trim() == "key" || first.starts_with("---") {
            continue;
        }
        let keys = first
            .split('`')
            .skip(1)
            .step_by(2)
            .map(String::from)
            .collect();
        rows.push(KeyRow {
            keys,
            meaning: meaning.to_string(),
        });
    }
    assert!(!rows.is_empty(), "docs/json.md: no table after {markers:?}");
    rows
}

/// Checks `value`'s keys against the table after `markers` in docs/json.md: every key the
/// output has is listed, every key listed is in the output (unless its row says it is present
/// only when something holds), and for an object (or a list of objects) each nested key is
/// named in its row, as `` `key` `` or `"key"` (except the keys of `free_form`: data-keyed
/// maps and objects the row describes by reference).
fn keys_match_docs(value: &serde_json::Value, markers: &[&str], free_form: &[&str]) {
    let rows = key_table(&json_md(), markers);
    let object = value.as_object().expect("an object");
    let listed = |k: &str| rows.iter().any(|r| r.keys.iter().any(|d| d == k));
    for k in object.keys() {
        assert!(
            listed(k),
            "{markers:?}: the output's key {k} is not in docs/json.md"
        );
    }
    for row in &rows {
        for k in &row.keys {
            let Some(v) = object.get(k) else {
                assert!(
                    row.meaning.contains("only when"),
                    "{markers:?}: docs/json.md lists {k}, not in the output"
                );
                continue;
            };
            let inner = match v {
                serde_json::Value::Array(items) => items.first(),
                v => Some(v),
            };
            let Some(serde_json::Value::Object(inner)) = inner else {
                continue;
            };
            if free_form.contains(&k.as_str()) {
                continue;
            }
            for nk in inner.keys() {
                assert!(
                    row.meaning.contains(&format!("`{nk}`"))
                        || row.meaning.contains(&format!("\"{nk}\"")),
                    "{markers:?}: docs/json.md's row for {k} does not name its key {nk}"
                );
            }
        }
    }
}

#[test]
fn summary_and_replay_json_name_their_format_and_version_first() {
    let dir = tempfile::tempdir().unwrap();
    let f = saved(dir.path(), "ooms.json", &with_ooms());
    let f = f.to_str().unwrap();
    let o = allocview(&["summary", f, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    starts_with_format_and_version(&stdout(&o), "allocview-summary", 1);
    let o = allocview(&["replay", f, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    starts_with_format_and_version(&stdout(&o), "allocview-replay", 1);
    // The report's own fields are still at the top level, under their names.
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["runs"].is_array() && v["fidelity"].is_object(), "{v}");
}

#[test]
fn summary_and_replay_json_have_the_keys_docs_json_md_lists() {
    let dir = tempfile::tempdir().unwrap();
    let f = oom_file(dir.path());
    let f = f.to_str().unwrap();
    let summary = json_ok(&["summary", f, "--json"]);
    let section = "## `summary FILE --json`";
    // `devices[]` has its own table.
    keys_match_docs(&summary, &[section], &["devices"]);
    let device = &summary["devices"][0];
    assert_eq!(device["window"]["kind"], "trace", "{device}");
    assert!(device["ooms"][0]["diagnosis"].is_object(), "{device}");
    // Keyed by stat name and by action; `streams` are `Fragmentation`s, as `totals` is.
    let free_form = ["memory_stats", "actions", "streams"];
    keys_match_docs(device, &[section, "`devices[]`:"], &free_form);

    let out = dir.path().join("what-if.pickle");
    let replay = json_ok(&[
        "replay",
        f,
        "--json",
        "--config",
        "expandable_segments:True",
        "--out",
        out.to_str().unwrap(),
    ]);
    let section = "## `replay FILE --json`";
    assert!(replay["smallest_device"].is_object(), "{replay}");
    // `smallest_device` is `summary`'s; `runs[]` has its own table.
    keys_match_docs(&replay, &[section], &["smallest_device", "runs"]);
    for run in replay["runs"].as_array().unwrap() {
        keys_match_docs(run, &[section, "`runs[]`:"], &[]);
    }
}

#[test]
fn fail_on_oom_exits_3_after_printing_the_output_and_passes_a_file_without_ooms() {
    let dir = tempfile::tempdir().unwrap();
    let ooms = saved(dir.path(), "ooms.json", &with_ooms());
    let clean = clean_file(dir.path());
    let (ooms, clean) = (ooms.to_str().unwrap(), clean.to_str().unwrap());

    // Without the flag an OOM is no failure.
    assert!(allocview(&["summary", ooms, "--json"]).status.success());

    let o = allocview(&["summary", ooms, "--json", "--fail-on-oom"]);
    assert_eq!(o.status.code(), Some(GATE_FAILED), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("the output comes first");
    assert_eq!(v["ooms"], 2);
    let err = stderr(&o);
    assert!(
        err.starts_with("allocview: gate failed: the file holds 2 OOMs (--fail-on-oom)"),
        "{err}"
    );
    // The text output too.
    let o = allocview(&["summary", ooms, "--fail-on-oom"]);
    assert_eq!(o.status.code(), Some(GATE_FAILED), "{}", stderr(&o));
    assert!(stdout(&o).contains("OOM"), "{}", stdout(&o));

    let o = allocview(&["summary", clean, "--json", "--fail-on-oom"]);
    assert!(o.status.success(), "{}", stderr(&o));

    // A reader that closes early (`| head`) does not turn a failed gate into a pass.
    let mut child = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(["summary", ooms, "--fail-on-oom"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    assert_eq!(child.wait().unwrap().code(), Some(GATE_FAILED));
}

#[test]
fn max_peak_fails_above_the_peak_passes_at_it_and_is_an_error_when_the_peak_is_not_known() {
    let dir = tempfile::tempdir().unwrap();
    let clean = clean_file(dir.path());
    let no_trace = saved(dir.path(), "no-trace.json", &without_trace());
    let (clean, no_trace) = (clean.to_str().unwrap(), no_trace.to_str().unwrap());

    let v = json_ok(&["summary", clean, "--json"]);
    let window = &v["devices"][0]["window"];
    assert_eq!(window["kind"], "trace", "{v}");
    let peak = window["peak_allocated"].as_u64().unwrap();
    assert!(peak > 0);

    let at = peak.to_string();
    let o = allocview(&["summary", clean, "--max-peak", &at]);
    assert!(o.status.success(), "{}", stderr(&o));
    let below = (peak - 1).to_string();
    let o = allocview(&["summary", clean, "--json", "--max-peak", &below]);
    assert_eq!(o.status.code(), Some(GATE_FAILED), "{}", stderr(&o));
    assert!(serde_json::from_slice::<serde_json::Value>(&o.stdout).is_ok());
    assert!(
        stderr(&o).contains("exceeds --max-peak") && stderr(&o).contains(&below),
        "{}",
        stderr(&o)
    );

    // No trace: an error (status 1), not a silent pass.
    let o = allocview(&["summary", no_trace, "--json", "--max-peak", "1TiB"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("not known"), "{}", stderr(&o));

    // A bad size is said before the file is read.
    let o = allocview(&["summary", clean, "--max-peak", "lots"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--max-peak \"lots\""), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
}

#[test]
fn replay_json_lists_the_files_out_wrote_with_their_runs_labels() {
    let dir = tempfile::tempdir().unwrap();
    let f = clean_file(dir.path());
    let f = f.to_str().unwrap();
    let v = json_ok(&["replay", f, "--json"]);
    assert_eq!(v["written"], serde_json::json!([]), "{v}");

    let out = dir.path().join("w.pickle");
    let out_s = out.to_str().unwrap();
    let v = json_ok(&["replay", f, "--json", "--out", out_s]);
    let written = v["written"].as_array().unwrap();
    assert_eq!(written.len(), 1, "{v}");
    assert_eq!(written[0]["label"], v["runs"][0]["label"]);
    assert_eq!(written[0]["path"], out_s);

    let v = json_ok(&[
        "replay",
        f,
        "--json",
        "--config",
        "expandable_segments:True",
        "--config",
        "defaults",
        "--out",
        out_s,
    ]);
    let written = v["written"].as_array().unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(written.len(), 2, "{v}");
    for (w, run) in written.iter().zip(&runs[runs.len() - 2..]) {
        assert_eq!(w["label"], run["label"], "{v}");
        let path = Path::new(w["path"].as_str().unwrap());
        assert!(path.exists(), "{}", path.display());
        snapshot_file::load(path).unwrap();
    }
    assert_ne!(written[0]["path"], written[1]["path"]);
}

#[test]
fn no_arguments_is_a_usage_error_with_the_help_on_stderr() {
    let o = allocview(&[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty(), "{}", stdout(&o));
    assert!(stderr(&o).contains("Usage: allocview"), "{}", stderr(&o));
    // Asked for, the help goes to stdout with status 0.
    let o = allocview(&["--help"]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("Usage: allocview"));
}

#[test]
fn summary_replay_export_and_open_word_a_file_they_cannot_load_alike() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pickle");
    let garbage = dir.path().join("garbage.bin");
    std::fs::write(&garbage, b"PK\x03\x04 not a snapshot").unwrap();
    let out = dir.path().join("out.json");
    for file in [&missing, &garbage] {
        let start = format!("allocview: cannot load {}: ", file.display());
        let file = file.to_str().unwrap();
        for args in [
            vec!["summary", file, "--json"],
            vec!["replay", file, "--json"],
            vec!["export", file, "-o", out.to_str().unwrap()],
            // Before it needs a terminal.
            vec!["open", file],
        ] {
            let o = allocview(&args);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
            assert!(stderr(&o).starts_with(&start), "{args:?}: {}", stderr(&o));
            assert!(o.stdout.is_empty());
        }
    }
}

/// The ```sh block after `<!-- ci-gate -->` in docs/json.md.
fn documented_gate() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/json.md"))
        .expect("docs/json.md");
    let after = doc
        .split_once("<!-- ci-gate -->")
        .expect("docs/json.md marks its CI gate with <!-- ci-gate -->")
        .1;
    let block = after
        .split_once("```sh\n")
        .expect("a ```sh block follows the marker")
        .1;
    block
        .split_once("```")
        .expect("the block ends")
        .0
        .to_string()
}

#[test]
fn the_jq_gate_in_docs_json_md_passes_a_clean_file_and_fails_the_rest() {
    if Command::new("jq").arg("--version").output().is_err() {
        println!("skipped: jq not found");
        return;
    }
    let script = documented_gate();
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_allocview")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let gate = |file: &Path| {
        Command::new("bash")
            .arg("-c")
            .arg(&script)
            .env("PATH", &path)
            .env("FILE", file)
            .env("MAX_PEAK", "4000000000")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("bash runs")
            .success()
    };
    assert!(gate(&clean_file(dir.path())));
    assert!(!gate(&saved(dir.path(), "ooms.json", &with_ooms())));
    // The traps: no trace (no peaks), and a missing file (jq -e on no input).
    assert!(!gate(&saved(dir.path(), "no-trace.json", &without_trace())));
    assert!(!gate(&dir.path().join("missing.json")));
}

/// How long the demo may take to serve its first state.
const ATTACH_WAIT: Duration = Duration::from_secs(30);

#[test]
fn demo_report_and_attach_state_json_name_their_format_and_version_first() {
    let dir = tempfile::tempdir().unwrap();
    let o = headless_demo(env!("CARGO_BIN_EXE_allocview"), dir.path())
        .args(["--json", "--seconds", "0.5"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    starts_with_format_and_version(&stdout(&o), "allocview-demo-report", 1);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // `stats`: keyed by stat name.
    keys_match_docs(&report, &["## `demo --headless --json`"], &["stats"]);

    let (demo, addr) = allocview_tests::cli::listening_demo(
        env!("CARGO_BIN_EXE_allocview"),
        dir.path(),
        "60",
        &[],
    );
    let deadline = Instant::now() + ATTACH_WAIT;
    let once = loop {
        let o = allocview(&["--attach", &addr, "--headless", "--once", "--json"]);
        if o.status.success() {
            break o;
        }
        assert!(
            Instant::now() < deadline,
            "the demo never served: {}",
            stderr(&o)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // The stream: one compact state per line, the two fields first.
    let mut stream =
        allocview_tests::cli::headless_json_stream(env!("CARGO_BIN_EXE_allocview"), &addr);
    let mut line = String::new();
    let read = std::io::BufRead::read_line(
        &mut std::io::BufReader::new(stream.stdout.take().unwrap()),
        &mut line,
    );
    let _ = stream.kill();
    let _ = stream.wait();
    drop(demo);
    read.unwrap();
    let protocol = allocview_agent::protocol::PROTOCOL_VERSION;
    assert!(
        line.starts_with(&format!(
            "{{\"format\":\"allocview-agent-state\",\"version\":{protocol},"
        )),
        "{}",
        &line[..line.len().min(200)]
    );
    starts_with_format_and_version(&stdout(&once), "allocview-agent-state", protocol);
    let v: serde_json::Value = serde_json::from_slice(&once.stdout).unwrap();
    assert!(v["devices"].is_array() && v["pipeline"].is_object(), "{v}");
    keys_match_docs(&v, &["## `--attach [ADDR] --headless"], &[]);
}

#[test]
fn summary_help_documents_the_gates_and_their_exit_status() {
    let o = allocview(&["summary", "--help"]);
    assert!(o.status.success());
    let text = stdout(&o);
    assert!(
        text.contains("--fail-on-oom") && text.contains("--max-peak <SIZE>"),
        "{text}"
    );
    assert!(
        text.contains("3 a --fail-on-oom or --max-peak gate failed"),
        "{text}"
    );
    assert!(text.contains("docs/json.md"), "{text}");
}
