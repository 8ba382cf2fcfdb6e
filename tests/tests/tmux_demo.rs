//! `allocview demo` in a real terminal (tmux): every view shows its title and numbers, keys
//! switch views, the filter and help work, `q` exits cleanly and restores the terminal.

use allocview_tests::tmux::{self, Session};

#[test]
fn the_demo_shows_every_view_and_quits_cleanly() {
    if !tmux::available("the_demo_shows_every_view_and_quits_cleanly") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = tmux::start_demo(&tmux::binary(), dir.path());
    s.wait_for(&[
        "● live",
        "Memory",
        "Counters",
        "allocations",
        "Over time",
        "dev 0 (simulated 8.00 GiB)",
    ]);
    s.send(&["2"]);
    s.wait_for(&["Segments (", " L s0 ", "Block 0x"]);
    s.send(&["3"]);
    s.wait_for(&["Pools", "small", "large", "largest free"]);
    s.send(&["4"]);
    s.wait_for(&["Streams (2)", " s0 "]);
    s.send(&["5"]);
    s.wait_for(&["size — all", "p50", "latency (sampled) — all"]);
    s.send(&["6"]);
    s.wait_for(&["Trace (", "alloc"]);
    s.send(&["/"]);
    s.type_text("segment_alloc");
    s.send(&["Enter"]);
    s.wait_for(&["filter: segment_alloc"]);
    s.send(&["7"]);
    s.wait_for(&["No OOM so far"]);
    s.send(&["Tab"]);
    s.wait_for(&["Memory", "Counters"]);
    s.send(&["?"]);
    s.wait_for(&["Keys", "reset peak statistics"]);
    s.send(&["Escape"]);
    s.wait_gone("reset peak statistics");
    s.send(&["p"]);
    s.wait_for(&["○ paused"]);
    s.send(&["p"]);
    s.wait_for(&["● live"]);
    s.send(&["s"]);
    let screen = s.wait_for(&["saved snapshot to "]);
    assert!(screen.contains(".pickle"), "{screen}");
    s.quit_cleanly();
    let saved: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert_eq!(saved.len(), 1, "one snapshot file saved");
}

#[test]
fn an_oom_run_shows_the_oom_facts() {
    if !tmux::available("an_oom_run_shows_the_oom_facts") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cmd = format!(
        "cd {} && {} demo --scenario oom --device-memory 4GiB",
        dir.path().display(),
        tmux::binary().display()
    );
    let s = Session::start(&cmd, 120, 36);
    s.wait_for(&["● live"]);
    s.send(&["7"]);
    s.wait_for(&[
        "OOM #1",
        "tried to allocate",
        "diagnosis:",
        "largest free block:",
    ]);
    s.quit_cleanly();
}

#[test]
fn a_narrow_terminal_still_shows_the_numbers() {
    if !tmux::available("a_narrow_terminal_still_shows_the_numbers") {
        return;
    }
    let cmd = format!("{} demo", tmux::binary().display());
    let s = Session::start(&cmd, 80, 24);
    let screen = s.wait_for(&["● live", "allocated", "reserved", "peak", "Counters"]);
    assert!(screen.lines().all(|l| l.chars().count() <= 80));
    s.quit_cleanly();
}

#[test]
fn bad_arguments_are_clear_errors() {
    let out = std::process::Command::new(tmux::binary())
        .args(["demo", "--headless", "--device-memory", "lots"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--device-memory \"lots\""), "{err}");
}
