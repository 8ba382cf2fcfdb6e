//! The over-time chart's title keeps its legend whole at every width from the smallest the
//! dashboard draws: at 80 columns the OOM mark's key ("│ OOM") was cut to "│" by a long span
//! label ("last 10 min: all 1m so far"), which now gives way first.

#[path = "support/screen.rs"]
#[allow(dead_code)]
mod screen;
#[path = "support/builders.rs"]
mod support;

use allocview::state::{UiState, View};
use allocview::view;

/// The row of the chart's title on the Overview at `w` x `h`.
fn title_row(w: u16, h: u16) -> String {
    let t = screen::view_text(
        &support::live_state(),
        View::Overview,
        UiState::default(),
        w,
        h,
    );
    t.lines()
        .find(|l| l.contains(" Over time "))
        .unwrap_or_else(|| panic!("no chart title at {w}x{h}:\n{t}"))
        .to_string()
}

#[test]
fn the_chart_legend_is_whole_at_every_width() {
    for w in view::MIN_WIDTH..=130 {
        let row = title_row(w, 24);
        for key in ["reserved ", "allocated ", "active ", "OOM "] {
            assert!(row.contains(key), "{w} columns: {key:?} cut in {row:?}");
        }
    }
}

#[test]
fn the_span_label_is_shortened_before_it_goes() {
    // Wide: the whole label; at 80 columns the span alone; the legend stays in both.
    assert!(title_row(130, 36).contains("(last 10 min: all 1m so far)"));
    let narrow = title_row(80, 24);
    assert!(narrow.contains("(last 10 min) "), "{narrow}");
}
