//! `allocview open` on a real PyTorch snapshot in tmux: the file and event in the header,
//! time travel with Home, `]`, `.` and `[`, the segment view, a clean exit.

use allocview_tests::tmux;

use tmux::Session;

#[test]
fn open_travels_through_a_real_trace() {
    if !tmux::available("open_travels_through_a_real_trace") {
        return;
    }
    let Some(file) = allocview_tests::fixtures::fixture("small-97-events.pickle") else {
        return;
    };
    let cmd = format!("{} open {}", tmux::binary().display(), file.display());
    let s = Session::start(&cmd, 120, 36);
    s.wait_for(&["file small-97-events.pickle  event 97/97", "Memory"]);
    s.send(&["2"]);
    s.wait_for(&["Segments (9, by size)"]);
    s.send(&["Home"]);
    s.wait_for(&["event 0/97", "Segments (0, by size)"]);
    s.send(&["."]);
    s.wait_for(&["event 1/97", "Segments (1, by size)"]);
    s.send(&["]"]);
    s.wait_for(&["event 97/97"]);
    s.send(&["["]);
    s.wait_for(&["event 0/97"]);
    s.send(&["g"]);
    s.wait_for(&["event 1/97"]);
    s.send(&["End"]);
    s.wait_for(&["event 97/97", "Segments (9, by size)"]);
    s.quit_cleanly();
}

#[test]
fn opening_a_missing_file_names_it() {
    let out = std::process::Command::new(tmux::binary())
        .args(["open", "/nonexistent/x.pickle"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/x.pickle"), "{err}");
}
