//! `allocview --attach` to a `demo --listen` process over a unix socket: the live view in
//! tmux, reconnecting when the agent goes away; and `--headless --once --json`.

use allocview_tests::tmux;

use std::process::{Command, Stdio};

use tmux::{Child, Session};

fn socket() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{}.sock", tmux::unique("av")));
    let addr = format!("unix:{}", path.display());
    (dir, addr)
}

fn serve(addr: &str) -> Child {
    serve_for(addr, 120)
}

/// A headless demo serving at `addr` for `seconds`, then shutting its agent down.
fn serve_for(addr: &str, seconds: u32) -> Child {
    let child = Command::new(tmux::binary())
        .args([
            "demo",
            "--headless",
            "--seconds",
            &seconds.to_string(),
            "--listen",
            addr,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let path = addr.trim_start_matches("unix:");
    let deadline = std::time::Instant::now() + tmux::WAIT;
    while !std::path::Path::new(path).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the demo never listened at {addr}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Child(child)
}

#[test]
fn attach_shows_the_live_process_and_reconnects_when_it_goes() {
    if !tmux::available("attach_shows_the_live_process_and_reconnects_when_it_goes") {
        return;
    }
    let (_dir, addr) = socket();
    let mut demo = serve(&addr);
    let pid = demo.0.id();
    let cmd = format!("{} --attach {addr}", tmux::binary().display());
    let s = Session::start(&cmd, 120, 36);
    s.wait_for(&["● live", &format!("pid {pid} allocview demo"), "Memory"]);
    s.send(&["2"]);
    s.wait_for(&["Segments ("]);
    // The agent goes away: the view says so and keeps trying.
    let _ = demo.0.kill();
    let _ = demo.0.wait();
    s.wait_for(&["◌ reconnecting ("]);
    // A new agent at the same address: the view reconnects to it.
    let again = serve(&addr);
    s.wait_for(&["● live", &format!("pid {} allocview demo", again.0.id())]);
    s.quit_cleanly();
}

#[test]
fn when_the_agent_shuts_down_the_view_says_why_while_it_reconnects() {
    if !tmux::available("when_the_agent_shuts_down_the_view_says_why_while_it_reconnects") {
        return;
    }
    let (_dir, addr) = socket();
    let _demo = serve_for(&addr, 4);
    let cmd = format!("{} --attach {addr}", tmux::binary().display());
    let s = Session::start(&cmd, 120, 36);
    s.wait_for(&["● live"]);
    // The demo ends and its agent says goodbye; the reconnect attempts that follow fail on
    // the removed socket, and the footer leads with the goodbye's reason.
    s.wait_for(&[
        "◌ reconnecting (",
        "the process ended (its agent shut down)",
    ]);
    s.quit_cleanly();
}

#[test]
fn headless_once_json_prints_the_first_full_state() {
    let (_dir, addr) = socket();
    let demo = serve(&addr);
    let out = Command::new(tmux::binary())
        .args(["--attach", &addr, "--headless", "--once", "--json"])
        .output()
        .unwrap();
    let v = allocview_tests::cli::json_of_success(&out);
    assert_eq!(v["process"]["pid"].as_u64(), Some(demo.0.id() as u64));
    assert_eq!(v["process"]["name"], "allocview demo");
    assert!(v["devices"][0]["stats"].is_object());
}

#[test]
fn attaching_to_nothing_is_a_clear_error() {
    let (_dir, addr) = socket();
    let out = Command::new(tmux::binary())
        .args(["--attach", &addr, "--headless", "--once"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot connect to unix:"), "{err}");
}
