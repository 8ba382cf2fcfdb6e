//! The new keys in a real terminal (tmux) over the live demo: `z` zooms the selected segment
//! and `Esc` goes back, `p` / `s` switch the histograms' grouping, the trace's context column
//! shows the workload's step tags.

use allocview_tests::tmux;

#[test]
fn zoom_histogram_grouping_and_trace_context_in_the_live_demo() {
    if !tmux::available("zoom_histogram_grouping_and_trace_context_in_the_live_demo") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = tmux::start_demo(env!("CARGO_BIN_EXE_allocview").as_ref(), dir.path());
    s.wait_for(&["● live"]);
    s.send(&["2"]);
    s.wait_for(&["Segments (", "z zoom"]);
    s.send(&["z"]);
    s.wait_for(&["· zoom ", "/row", "z/Esc back", "Block 0x"]);
    s.send(&["Right"]);
    s.wait_for(&["block      2 of"]);
    s.send(&["Escape"]);
    s.wait_for(&["Segments (", "z zoom"]);
    s.send(&["5"]);
    s.wait_for(&["every group", "size — all"]);
    s.send(&["p"]);
    s.wait_for(&["per pool", "small pool", "p99"]);
    s.send(&["s"]);
    s.wait_for(&["per stream", "stream 0"]);
    s.send(&["s"]);
    s.wait_for(&["every group"]);
    s.send(&["6"]);
    s.wait_for(&["Trace (", " · model.py:88 layers."]);
    s.quit_cleanly();
}
