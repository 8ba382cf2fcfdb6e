//! The demo engine end to end: the simulated run feeds the embedded agent, whose figures equal
//! the allocator's; an OOM run dumps a snapshot that `allocview open` shows with its OOM,
//! diagnosis and what-if replays; `--headless --json` prints the comparison.

use std::time::Duration;

use allocview::cli::Scenario;
use allocview::demo::{Demo, DemoConfig};
use allocview::source::file::FileSource;
use allocview::state::timetravel::CHECKPOINT_EVERY;
use allocview::units::GIB;
use allocview_agent::snapshot_file;
use allocview_alloc::snapshot::BlockState;

fn run(scenario: Scenario, steps: u64, dumps: &std::path::Path) -> Demo {
    let cfg = DemoConfig {
        scenario,
        pace: None,
        dump_dir: Some(dumps.to_path_buf()),
        max_steps: Some(steps),
        ..DemoConfig::new(4 * GIB)
    };
    let demo = Demo::start(cfg).unwrap();
    assert!(demo.wait_for_steps(steps, Duration::from_secs(120)));
    demo
}

#[test]
fn the_agent_agrees_with_the_allocator_after_a_training_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut demo = run(Scenario::Train, 6, dir.path());
    let r = demo.report();
    assert_eq!(r.steps, 6);
    assert!(r.agent_matches_allocator, "{:?}", r.differing_keys);
    assert_eq!(r.dropped_events, 0);
    assert_eq!(r.ooms, 0);
    assert!(r.stats["num_device_alloc"] > 0);
}

#[test]
fn an_oom_dump_opens_with_its_oom_diagnosis_and_what_ifs() {
    let dir = tempfile::tempdir().unwrap();
    let mut demo = run(Scenario::Oom, 12, dir.path());
    let r = demo.report();
    assert!(r.ooms > 0, "the OOM scenario ran out of memory");
    // Every OOM has its record; the dumps (a pickle and a JSON each) stop at the demo's limit.
    let dumped = r.ooms.min(allocview::demo::DEMO_MAX_DUMPS);
    assert_eq!(
        r.dumps.len() as u64,
        2 * dumped,
        "{} OOMs: {:?}",
        r.ooms,
        r.dumps
    );

    assert!(r.agent_matches_allocator, "{:?}", r.differing_keys);
    let dump = r
        .dumps
        .iter()
        .find(|p| p.ends_with(".pickle"))
        .expect("a pickle dump");
    let snap = snapshot_file::load(std::path::Path::new(dump)).unwrap();
    let src = FileSource::new(dump, &snap);
    let pm = src.post_mortem();
    let at = pm.next_oom(0).expect("the dump's trace holds the OOM");
    let state = pm.state_at(at);
    assert!(!state.ooms.is_empty());
    let o = &state.ooms[0];
    assert!(o.requested > 0 && o.device_total == Some(4 * GIB));
    assert!(!o.explanation.is_empty());
    // One line per setting tried (and a caveat when the dump's trace ends at the OOM), then
    // the smallest device without the OOM.
    let settings: Vec<&String> = o.what_if.iter().filter(|l| l.contains(" → ")).collect();
    assert_eq!(settings.len(), 4, "{:?}", o.what_if);
    assert!(settings[0].starts_with("expandable_segments:True"));
    assert!(
        settings[3].starts_with("smallest device ") && settings[3].contains("no OOM in the trace"),
        "{:?}",
        o.what_if
    );
    // The reconstruction fits the whole trace and the checkpoints agree with a full replay.
    let tt = pm.time_travel();
    assert_eq!(tt.at(tt.len()).1.mismatches, 0);
    for i in [at, tt.len() / 2, (CHECKPOINT_EVERY + 3).min(tt.len())] {
        assert_eq!(tt.at(i), tt.at_by_full_replay(i));
    }
    // Each stream's peak at every event is the highest of its allocated bytes in the states
    // seen so far (the demo allocates on a second stream too).
    let mut highest: std::collections::BTreeMap<u64, u64> = Default::default();
    let mut streams_seen = std::collections::BTreeSet::new();
    for i in 0..=tt.len() {
        let moment = tt.moment(i);
        let mut now: std::collections::BTreeMap<u64, u64> = Default::default();
        for seg in &moment.segments {
            let allocated: u64 = seg
                .blocks
                .iter()
                .filter(|b| b.state == BlockState::ActiveAllocated)
                .map(|b| b.size)
                .sum();
            *now.entry(seg.stream).or_default() += allocated;
        }
        for (stream, bytes) in now.into_iter().filter(|&(_, b)| b > 0) {
            let h = highest.entry(stream).or_default();
            *h = (*h).max(bytes);
        }
        if i == 0 {
            // The trace starts from what was allocated then.
            assert_eq!(
                moment.stream_peaks,
                highest.iter().map(|(&s, &b)| (s, b)).collect::<Vec<_>>()
            );
        }
        let got: std::collections::BTreeMap<u64, u64> =
            moment.stream_peaks.iter().copied().collect();
        for (stream, peak) in &highest {
            assert_eq!(got.get(stream), Some(peak), "stream {stream} at event {i}");
        }
        streams_seen.extend(got.keys().copied());
    }
    assert!(streams_seen.len() >= 2, "streams {streams_seen:?}");
    // The streams view of the state at the OOM shows them.
    let rows = pm.state_at(at).stream_rows();
    assert!(
        rows.iter()
            .all(|r| r.peak.is_some_and(|p| p >= r.allocated))
    );
}

#[test]
fn a_long_oom_run_writes_only_the_demos_few_dumps() {
    let dir = tempfile::tempdir().unwrap();
    let mut demo = run(Scenario::Oom, 40, dir.path());
    let r = demo.report();
    let limit = allocview::demo::DEMO_MAX_DUMPS;
    assert!(r.ooms > limit, "only {} OOMs in 40 steps", r.ooms);
    assert_eq!(r.dumps.len() as u64, 2 * limit, "{:?}", r.dumps);
    let files = std::fs::read_dir(dir.path()).unwrap().count() as u64;
    assert_eq!(files, 2 * limit);
}

/// `allocview demo --headless --seconds 0 --json` with `vars` set; its exit status, stdout and
/// stderr.
fn headless_with_env(vars: &[(&str, &str)]) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_allocview"));
    cmd.current_dir(dir.path())
        .args(["demo", "--headless", "--seconds", "0", "--json"])
        .env_remove("ALLOCVIEW_ALLOC_CONF")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_demo_takes_its_allocator_settings_from_the_environment_as_embedders_do() {
    let settings = |stdout: &str| -> String {
        let v: serde_json::Value = serde_json::from_str(stdout).unwrap();
        v["settings"].as_str().unwrap().to_string()
    };
    let (ok, out, err) = headless_with_env(&[]);
    assert!(ok, "{err}");
    assert_eq!(settings(&out), "");
    let (ok, out, err) =
        headless_with_env(&[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")]);
    assert!(ok, "{err}");
    assert_eq!(settings(&out), "expandable_segments:True");
    // allocview's own variable wins over PyTorch's.
    let (ok, out, err) = headless_with_env(&[
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ("ALLOCVIEW_ALLOC_CONF", "max_split_size_mb:256"),
    ]);
    assert!(ok, "{err}");
    assert_eq!(settings(&out), "max_split_size_mb:256");
    // A bad string is an error that names the variable, not silently the defaults.
    let (ok, _, err) = headless_with_env(&[("ALLOCVIEW_ALLOC_CONF", "bogus")]);
    assert!(!ok);
    assert!(err.contains("ALLOCVIEW_ALLOC_CONF=\"bogus\""), "{err}");
}

#[test]
fn headless_json_reports_the_comparison_and_drops() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_allocview"))
        .current_dir(dir.path())
        .args([
            "demo",
            "--headless",
            "--seconds",
            "1",
            "--json",
            "--device-memory",
            "2GiB",
        ])
        .output()
        .unwrap();
    let v = allocview_tests::cli::json_of_success(&out);
    assert_eq!(v["agent_matches_allocator"], true, "{v}");
    assert_eq!(v["dropped_events"], 0);
    assert!(v["stats"]["allocated_bytes.all.current"].as_i64().unwrap() > 0);
    assert!(v["steps"].as_u64().is_some());
}

#[test]
fn time_travel_ends_on_the_allocators_own_segments_under_every_setting() {
    use allocview_alloc::caching::AllocatorConfig;
    use allocview_alloc::snapshot::BlockState;
    for conf in [
        "",
        "expandable_segments:True",
        "max_split_size_mb:128",
        "roundup_power2_divisions:4",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = DemoConfig {
            scenario: Scenario::Oom,
            config: AllocatorConfig::parse(conf).unwrap(),
            pace: None,
            dump_dir: Some(dir.path().to_path_buf()),
            max_steps: Some(10),
            ..DemoConfig::new(4 * GIB)
        };
        let demo = Demo::start(cfg).unwrap();
        assert!(demo.wait_for_steps(10, Duration::from_secs(120)));
        let snap = demo.alloc.snapshot();
        let src = FileSource::new("run.json", &snap);
        let tt = src.post_mortem().time_travel();
        let (segs, totals) = tt.at(tt.len());
        assert_eq!(totals.mismatches, 0, "{conf}");
        type Shape = Vec<(u64, u64, Vec<(u64, u64, BlockState)>)>;
        let shape = |s: &[allocview_alloc::snapshot::SegmentInfo]| -> Shape {
            s.iter()
                .map(|g| {
                    (
                        g.address,
                        g.total_size,
                        g.blocks
                            .iter()
                            .map(|b| (b.address, b.size, b.state))
                            .collect(),
                    )
                })
                .collect()
        };
        assert_eq!(shape(&segs), shape(&snap.segments), "{conf}");
        // The whole run is in the trace: walking it back must undo every segment and block.
        assert_eq!(snap.devices[0].trace_overflow, 0);
        let (start, t0) = tt.at(0);
        assert!(
            start.is_empty(),
            "{conf}: {} segments before the first event",
            start.len()
        );
        assert_eq!(t0.reserved, 0);
    }
}

#[test]
fn the_live_trace_carries_the_workloads_context_tags() {
    use allocview::source::Source;
    use allocview::source::embedded::EmbeddedSource;
    use allocview::state::State;
    use allocview::state::context::summary;
    use allocview_alloc::snapshot::TraceAction;
    let dir = tempfile::tempdir().unwrap();
    let demo = run(Scenario::Train, 3, dir.path());
    // The agent folds events on its own tick: wait (bounded) until its tail holds allocations.
    let mut src = EmbeddedSource::new(demo);
    let mut state = State::default();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        src.poll(&mut state).unwrap();
        if state.trace.iter().any(|e| e.action == TraceAction::Alloc) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no allocation reached the trace"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let allocs: Vec<_> = state
        .trace
        .iter()
        .filter(|e| e.action == TraceAction::Alloc)
        .collect();
    // Each names its phase (`model init`, `step 2 forward`) and the layer's source line.
    let contexts: Vec<String> = allocs
        .iter()
        .map(|e| summary(&e.frames, e.user_metadata.as_deref()))
        .collect();
    let bare: Vec<&String> = contexts
        .iter()
        .filter(|c| !(c.starts_with("model init") || c.starts_with("step ")))
        .collect();
    assert!(bare.is_empty(), "untagged: {bare:?}");
    assert!(
        contexts.iter().any(|c| c.starts_with("step ")),
        "{contexts:?}"
    );
}

#[test]
fn the_demos_empty_oom_view_knows_the_demo_by_its_process_name() {
    use allocview::app::App;
    use allocview::source::embedded::EmbeddedSource;
    use allocview::state::View;
    let dir = tempfile::tempdir().unwrap();
    let demo = run(Scenario::Train, 1, dir.path());
    assert_eq!(
        demo.agent.state().process.name,
        allocview::demo::DEMO_PROGRAM
    );
    let mut app = App::new(Box::new(EmbeddedSource::new(demo)), dir.path().into()).unwrap();
    assert_eq!(
        app.state.source.program.as_deref(),
        Some(allocview::demo::DEMO_PROGRAM)
    );
    app.apply(allocview::input::Action::ShowView(View::Oom))
        .unwrap();
    let mut term = ratatui::Terminal::new(ratatui::backend::TestBackend::new(120, 30)).unwrap();
    app.draw(&mut term).unwrap();
    let screen: String = term
        .backend()
        .buffer()
        .content()
        .iter()
        .map(|c| c.symbol())
        .collect();
    assert!(
        screen.contains("allocview demo --scenario oom drives a run into one"),
        "{screen}"
    );
}
