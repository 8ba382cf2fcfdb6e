//! `allocview demo` and `allocview --attach` arguments through the real binary: the dashboard
//! refuses a stdout that is not a terminal (suggesting `--headless`), options that only mean
//! something with `--headless` require it, `--config` repeats, and the headless OOM scenario
//! reaches its OOMs and reports dumps that could not be written.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use allocview_tests::cli::{headless_demo, json_of_success};

/// `allocview ARGS` with stdin closed and stdout/stderr captured (so stdout is a pipe).
fn allocview(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .env_remove("ALLOCVIEW_ADDR")
        .stdin(Stdio::null())
        .output()
        .expect("allocview runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `allocview demo --headless --json ARGS` run in `dir`, its OOM dumps going to `dumps`, no
/// allocator settings from the environment: the JSON report, after checking that it succeeded.
fn headless_demo_json(dir: &Path, args: &[&str], dumps: &Path) -> serde_json::Value {
    let out = headless_demo(env!("CARGO_BIN_EXE_allocview"), dir)
        .arg("--json")
        .args(args)
        .env("ALLOCVIEW_DUMP_DIR", dumps)
        .output()
        .unwrap();
    json_of_success(&out)
}

#[test]
fn the_dashboard_refuses_a_redirected_stdout_and_suggests_headless() {
    for args in [
        &["demo"][..],
        &["demo", "--scenario", "oom"][..],
        &["--attach", "127.0.0.1:1"][..],
    ] {
        let out = allocview(args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(
            err.contains("stdout is not a terminal") && err.contains("--headless"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("os error"), "{args:?}: {err}");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: nothing is drawn into the redirected stdout"
        );
    }
}

#[test]
fn options_that_only_mean_something_headless_require_headless() {
    for args in [
        &["demo", "--seconds", "2"][..],
        &["demo", "--json"][..],
        &["demo", "--seconds", "2", "--json"][..],
        &["--attach", "127.0.0.1:1", "--once"][..],
        &["--attach", "127.0.0.1:1", "--json"][..],
    ] {
        let out = allocview(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("required arguments were not provided") && err.contains("--headless"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn demo_config_repeats_and_the_settings_join_with_commas() {
    let dir = tempfile::tempdir().unwrap();
    let json = headless_demo_json(
        dir.path(),
        &[
            "--seconds",
            "0",
            "--config",
            "expandable_segments:True",
            "--config",
            "max_split_size_mb:256",
        ],
        &dir.path().join("dumps"),
    );
    let settings = json["settings"].as_str().unwrap();
    assert!(
        settings.contains("expandable_segments:True") && settings.contains("max_split_size_mb:256"),
        "{settings}"
    );
}

#[test]
fn a_malformed_demo_config_says_what_is_expected() {
    let out = allocview(&["demo", "--headless", "--seconds", "0", "--config", "bogus"]);
    let err = stderr(&out);
    assert!(!out.status.success());
    // The setting as written and what is missing, in plain words (no parser token numbers).
    assert_eq!(
        err.trim_end(),
        r#"allocview: --config "bogus": "bogus": expected KEY:VALUE (a ':' after "bogus")"#
    );
}

#[test]
fn the_headless_oom_scenario_runs_until_it_meets_an_oom_by_default() {
    let dir = tempfile::tempdir().unwrap();
    // The help's example: `allocview demo --scenario oom --device-memory 8GiB`, headless.
    let json = headless_demo_json(
        dir.path(),
        &["--scenario", "oom", "--device-memory", "8GiB"],
        &dir.path().join("dumps"),
    );
    assert!(json["ooms"].as_u64().unwrap() >= 1, "{json}");
    assert!(!json["dumps"].as_array().unwrap().is_empty(), "{json}");
}

#[test]
fn the_headless_demo_reports_oom_dumps_that_could_not_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("somefile");
    std::fs::write(&file, "not a folder").unwrap();
    let json = headless_demo_json(dir.path(), &["--scenario", "oom"], &file.join("sub"));
    assert!(json["ooms"].as_u64().unwrap() >= 1, "{json}");
    assert!(json["dumps"].as_array().unwrap().is_empty(), "{json}");
    assert!(json["dump_failures"].as_u64().unwrap() >= 1, "{json}");
    let errors = json["dump_errors"].as_array().unwrap();
    assert!(
        errors
            .iter()
            .any(|e| e.as_str().unwrap().starts_with("OOM 1: ")
                && e.as_str().unwrap().contains("somefile")),
        "{json}"
    );
    // The text report shows the same.
    let report = allocview::demo::Report {
        scenario: "oom".into(),
        device: "simulated".into(),
        steps: 9,
        ooms: 1,
        seconds: 1.0,
        agent_matches_allocator: true,
        dump_failures: json["dump_failures"].as_u64().unwrap(),
        dump_errors: errors
            .iter()
            .map(|e| e.as_str().unwrap().to_string())
            .collect(),
        ..Default::default()
    };
    let text = allocview::cmd::demo::report_text(&report);
    assert!(
        text.contains("OOM dumps that failed: ") && text.contains("OOM dump failed: OOM 1: "),
        "{text}"
    );
}

#[test]
fn the_headless_attach_line_counts_dropped_events_and_resyncs() {
    let dir = tempfile::tempdir().unwrap();
    let (_demo, addr) = allocview_tests::cli::listening_demo(
        env!("CARGO_BIN_EXE_allocview"),
        dir.path(),
        "30",
        &[],
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let line = loop {
        let out = allocview(&["--attach", &addr, "--headless", "--once"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && text.contains(" dev ") {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no device line: {text} {}",
            stderr(&out)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        line.contains(" dropped ") && line.contains(" resyncs "),
        "{line}"
    );
}
