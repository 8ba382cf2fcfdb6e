//! `allocview screenshot --out DIR`: renders every view of a headless, seeded demo run (the
//! OOM scenario, so the OOM view has a real failure to show) at a fixed size, to SVG and PNG;
//! plus the help overlay and the post-mortem views (segments, OOM with what-if replays) of the
//! run's trace at its first OOM.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;

use crate::cli::{Scenario, ScreenshotArgs};
use crate::demo::{Demo, DemoConfig};
use crate::screenshot::{png, svg};
use crate::state::from_agent::{AgentAdapter, LiveInfo, SnapshotFrames};
use crate::state::from_snapshot::{PostMortem, WhatIfCapacity, oom_entry_of, what_if_lines};
use crate::state::ui::{HistogramGrouping, SegmentFilter};
use crate::state::{State, UiState, View};
use crate::units::GIB;
use crate::view;

/// Simulated device of the pictured run.
pub const DEVICE: u64 = 16 * GIB;
/// Steps of the pictured run (enough for two OOMs and a recovery).
pub const STEPS: u64 = 14;
/// Seed of the pictured run.
pub const SEED: u64 = 42;
/// Sleep between allocator calls, so the usage timeline has samples.
const PACE: Duration = Duration::from_micros(1500);
/// Timeline resolution of the pictured run.
const SAMPLE: Duration = Duration::from_millis(50);
/// The run must finish within this.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The pictures: file stem, view, help overlay open.
pub const SHOTS: [(&str, View, bool); 8] = [
    ("1-overview", View::Overview, false),
    ("2-segments", View::Segments, false),
    ("3-pools", View::Pools, false),
    ("4-streams", View::Streams, false),
    ("5-histograms", View::Histograms, false),
    ("6-trace", View::Trace, false),
    ("7-oom", View::Oom, false),
    ("help", View::Overview, true),
];

/// Renders one screen into a buffer.
pub fn screen(state: &State, ui: &UiState, width: u16, height: u16) -> Buffer {
    let mut buf = Buffer::empty(Rect::new(0, 0, width, height));
    view::render(buf.area, &mut buf, state, ui);
    buf
}

fn write(dir: &Path, stem: &str, buf: &Buffer) -> anyhow::Result<Vec<PathBuf>> {
    let svg_path = dir.join(format!("{stem}.svg"));
    std::fs::write(&svg_path, svg::render(buf)).with_context(|| svg_path.display().to_string())?;
    let png_path = dir.join(format!("{stem}.png"));
    let bytes = png::encode(buf).with_context(|| format!("encoding {stem}.png"))?;
    std::fs::write(&png_path, bytes).with_context(|| png_path.display().to_string())?;
    Ok(vec![svg_path, png_path])
}

/// Runs the pictured demo and returns its live state and a post-mortem of its trace.
///
/// # Errors
/// The demo could not run.
pub fn pictured_run() -> anyhow::Result<(State, PostMortem)> {
    let dumps = std::env::temp_dir().join(format!("allocview-screenshot-{}", std::process::id()));
    let cfg = DemoConfig {
        scenario: Scenario::Oom,
        seed: SEED,
        pace: Some(PACE),
        dump_dir: Some(dumps.clone()),
        sample_interval: SAMPLE,
        max_steps: Some(STEPS),
        ..DemoConfig::new(DEVICE)
    };
    let mut demo = Demo::start(cfg)?;
    if !demo.wait_for_steps(STEPS, RUN_TIMEOUT) {
        anyhow::bail!(
            "the pictured run did not finish in {} s",
            RUN_TIMEOUT.as_secs()
        );
    }
    if let Some(e) = demo.error() {
        anyhow::bail!("the pictured run failed: {e}");
    }
    let _ = demo.report();
    let snapshot = demo.alloc.snapshot();
    let info = LiveInfo {
        device_name: Some("simulated".into()),
        rate_hz: Some(10.0),
        mode: None,
        device_free: None,
    };
    let mut state = AgentAdapter::new().state(&demo.agent.state(), 0, &info);
    SnapshotFrames::new(&snapshot).apply(&mut state);
    // What-if replays of each OOM's dump, before the dumps are removed.
    for o in &mut state.ooms {
        if let (Some(p), Some(total)) = (&o.dump_path, o.device_total)
            && let Ok(dump) = allocview_agent::snapshot_file::load(Path::new(p))
        {
            let oom = oom_entry_of(&dump, o.requested, o.time_us);
            o.what_if = what_if_lines(&dump, WhatIfCapacity::device(total), oom);
        }
    }
    let pm = PostMortem::new("demo-trace.pickle", &snapshot);
    drop(demo);
    let _ = std::fs::remove_dir_all(&dumps);
    Ok((state, pm))
}

/// Runs the command.
///
/// # Errors
/// The demo could not run or a file could not be written.
pub fn run(args: &ScreenshotArgs) -> anyhow::Result<()> {
    if args.width < 20 || args.height < 10 {
        anyhow::bail!(
            "--width and --height must be at least 20x10 (got {}x{})",
            args.width,
            args.height
        );
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let (state, pm) = pictured_run()?;
    let mut written = Vec::new();
    for (stem, v, help) in SHOTS {
        let ui = UiState {
            view: v,
            help,
            ..UiState::default()
        };
        written.extend(write(
            &args.out,
            stem,
            &screen(&state, &ui, args.width, args.height),
        )?);
    }
    // Post-mortem: the run's own trace, at its first OOM, segment view.
    let event = pm.next_oom(0).unwrap_or(pm.len());
    let ui = UiState {
        view: View::Segments,
        ..UiState::default()
    };
    let at_oom = pm.state_at(event);
    let buf = screen(&at_oom, &ui, args.width, args.height);
    written.extend(write(&args.out, "8-open-time-travel", &buf)?);
    // The same OOM in the file: facts, diagnosis and the what-if replays.
    let ui = UiState {
        view: View::Oom,
        ..UiState::default()
    };
    let buf = screen(&at_oom, &ui, args.width, args.height);
    written.extend(write(&args.out, "9-open-oom-what-if", &buf)?);
    // The segment with the most blocks zoomed (`z`), its second block selected.
    let order = state.segment_order(SegmentFilter::All);
    let busiest = (0..order.len())
        .max_by_key(|&r| (state.segments[order[r]].blocks.len(), std::cmp::Reverse(r)))
        .unwrap_or(0);
    let ui = UiState {
        view: View::Segments,
        zoom: true,
        segment_row: busiest,
        block: 1,
        ..UiState::default()
    };
    let buf = screen(&state, &ui, args.width, args.height);
    written.extend(write(&args.out, "10-segments-zoom", &buf)?);
    // The histograms per pool (`p`): percentiles side by side, the large pool's bars.
    let ui = UiState {
        view: View::Histograms,
        histogram_by: HistogramGrouping::Pool,
        histogram_group: 1,
        ..UiState::default()
    };
    let buf = screen(&state, &ui, args.width, args.height);
    written.extend(write(&args.out, "11-histograms-per-pool", &buf)?);
    for p in written {
        crate::output::print(&p.display().to_string())?;
    }
    Ok(())
}
