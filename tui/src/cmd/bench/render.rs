//! `tui.render_segments`: one frame of the segments view over 10,000 segments, drawn through
//! ratatui's `Terminal` into a 200x60 `TestBackend`, against the same frame with no segments
//! (the fixed cost of a frame: header, footer, layout, the terminal's diff).
//!
//! The segments are real: a caching allocator on the simulated device is driven until it holds
//! [`SEGMENTS`] segments of mixed sizes (20 MiB segments split into 1-10 MiB blocks, and
//! segments of their own for larger requests), a third of the blocks are freed, and its
//! snapshot feeds the view's state.

use allocview_alloc::caching::backend::StreamId;
use anyhow::{Context, bail};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use super::harness::{compare, each};
use super::outcome::Outcome;
use super::workload;
use crate::state::{State, UiState, View};
use crate::view;

/// Segments in the measured frame's state.
pub const SEGMENTS: i64 = 10_000;

/// Terminal size of the measured frame (columns, rows).
pub const SCREEN: (u16, u16) = (200, 60);

/// Request sizes cycled through to build the segments.
const BUILD_SIZES: [u64; 4] = [3 << 20, 7 << 20, 12 << 20, 30 << 20];

/// The symbol the segments view draws allocated cells with (checked in the measured frame).
const ALLOCATED_CELL: &str = "█";

/// Every how many'th block is freed after building.
const FREE_EVERY: usize = 3;

/// A state whose device holds [`SEGMENTS`] segments.
fn busy_state() -> anyhow::Result<State> {
    let alloc = workload::allocator();
    let mut live = Vec::new();
    let mut next = 0;
    while workload::segments(&alloc) < SEGMENTS {
        let size = BUILD_SIZES[next % BUILD_SIZES.len()];
        next += 1;
        live.push(
            alloc
                .malloc(size, StreamId::DEFAULT)
                .with_context(|| format!("building segments: a {size}-byte allocation"))?,
        );
    }
    for p in live.iter().step_by(FREE_EVERY) {
        alloc.free(*p).context("building segments: a free")?;
    }
    let snapshot = alloc.snapshot();
    if snapshot.segments.len() as i64 != SEGMENTS {
        bail!(
            "built {} segments instead of {SEGMENTS}",
            snapshot.segments.len()
        );
    }
    Ok(State {
        stats: alloc.device_stats(),
        segments: snapshot.segments,
        ..State::default()
    })
}

/// `tui.render_segments`: the segments view over 10,000 segments vs over none.
pub fn render_segments(seconds: f64, mut out: Outcome) -> anyhow::Result<Outcome> {
    let busy = busy_state()?;
    let empty = State::default();
    let ui = UiState {
        view: View::Segments,
        ..UiState::default()
    };
    let terminal = || Terminal::new(TestBackend::new(SCREEN.0, SCREEN.1));
    let mut busy_term = terminal().context("making the test terminal")?;
    let mut empty_term = terminal().context("making the test terminal")?;
    let mut failed = None;
    let (a, b) = {
        let mut ours = each(|| {
            if let Err(e) = busy_term.draw(|f| view::draw(f, &busy, &ui)) {
                failed.get_or_insert(e.to_string());
            }
        });
        let mut floor = each(|| {
            let _ = empty_term.draw(|f| view::draw(f, &empty, &ui));
        });
        compare(seconds, &mut ours, &mut floor)
    };
    if let Some(e) = failed {
        bail!("drawing failed: {e}");
    }
    let drawn = busy_term.backend().buffer();
    if !drawn.content().iter().any(|c| c.symbol() == ALLOCATED_CELL) {
        bail!("the frame shows no allocated block: the segments view did not draw the segments");
    }
    out.allocview_ns = Some(a.median_ns);
    out.baseline_ns = Some(b.median_ns);
    Ok(out)
}
