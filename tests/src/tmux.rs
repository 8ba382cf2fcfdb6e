//! Driving the real `allocview` binary inside tmux: detached sessions of a fixed size, keys
//! sent, panes captured, every wait bounded, sessions killed on drop (also when a test fails).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a wait for text on screen may take.
pub const WAIT: Duration = Duration::from_secs(20);
/// Poll interval of waits.
const POLL: Duration = Duration::from_millis(100);

/// Whether tmux is installed; prints a visible skip line when not.
pub fn available(test: &str) -> bool {
    let ok = Command::new("tmux")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("skipped {test}: tmux not found (.ci/run installs it)");
    }
    ok
}

/// The `allocview` binary of this workspace (built when missing).
pub fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/allocview
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target folder");
    let bin = dir.join("allocview");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "allocview", "--bin", "allocview"])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "cargo build -p allocview failed");
    }
    assert!(bin.exists(), "{} not found", bin.display());
    bin
}

/// `allocview demo` (8 GiB simulated device) started in `dir` in a 120x36 session, from the
/// binary `bin`.
pub fn start_demo(bin: &Path, dir: &Path) -> Session {
    let cmd = format!(
        "cd {} && {} demo --device-memory 8GiB",
        dir.display(),
        bin.display()
    );
    Session::start(&cmd, 120, 36)
}

/// A name no other test or run uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A detached tmux session running one command.
pub struct Session {
    /// Session name.
    pub name: String,
    /// The tmux server of its own (`tmux -L NAME`), if it has one.
    server: Option<String>,
}

/// The marker the wrapper shell prints when the command exits.
pub const EXIT_MARK: &str = "ALLOCVIEW-EXIT=";

impl Session {
    /// Starts `cmd` (a shell command line) in a `width`x`height` session; after it exits, the
    /// pane shows `ALLOCVIEW-EXIT=<status>` and stays open.
    pub fn start(cmd: &str, width: u16, height: u16) -> Session {
        Self::start_on(None, cmd, width, height)
    }

    /// [`start`](Self::start) on a tmux server of its own (`tmux -L`), so that no other
    /// session or server option is seen; the server is killed on drop.
    pub fn start_private(cmd: &str, width: u16, height: u16) -> Session {
        Self::start_on(Some(unique("allocview-server")), cmd, width, height)
    }

    fn start_on(server: Option<String>, cmd: &str, width: u16, height: u16) -> Session {
        let s = Session {
            name: unique("allocview-test"),
            server,
        };
        let wrapped = format!("{cmd}; echo {EXIT_MARK}$?; sleep 600");
        let status = s
            .tmux()
            .args([
                "new-session",
                "-d",
                "-s",
                &s.name,
                "-x",
                &width.to_string(),
                "-y",
                &height.to_string(),
            ])
            .arg(wrapped)
            .status()
            .expect("run tmux");
        assert!(status.success(), "tmux new-session failed");
        s
    }

    /// A `tmux` command on this session's server.
    fn tmux(&self) -> Command {
        let mut c = Command::new("tmux");
        if let Some(server) = &self.server {
            c.args(["-L", server]);
        }
        c
    }

    /// Sends keys (tmux key names: `q`, `Enter`, `Escape`, `Home`, `Tab`, ...).
    pub fn send(&self, keys: &[&str]) {
        let status = self
            .tmux()
            .args(["send-keys", "-t", &self.name])
            .args(keys)
            .status()
            .expect("run tmux send-keys");
        assert!(status.success());
    }

    /// Types text literally.
    pub fn type_text(&self, text: &str) {
        let status = self
            .tmux()
            .args(["send-keys", "-l", "-t", &self.name, text])
            .status()
            .expect("run tmux send-keys");
        assert!(status.success());
    }

    /// The pane's text now.
    pub fn capture(&self) -> String {
        let out = self
            .tmux()
            .args(["capture-pane", "-p", "-t", &self.name])
            .output()
            .expect("run tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// tmux's `display-message` of `format` for the pane (`#{cursor_flag}`, ...).
    pub fn display(&self, format: &str) -> String {
        let out = self
            .tmux()
            .args(["display-message", "-p", "-t", &self.name, format])
            .output()
            .expect("run tmux display-message");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until every one of `texts` is on screen; panics with the screen after [`WAIT`].
    pub fn wait_for(&self, texts: &[&str]) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let screen = self.capture();
            if texts.iter().all(|t| screen.contains(t)) {
                return screen;
            }
            if Instant::now() >= deadline {
                panic!(
                    "waited {} s for {texts:?} in session {}; screen:\n{screen}",
                    WAIT.as_secs(),
                    self.name
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until `text` is gone from the screen.
    pub fn wait_gone(&self, text: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let screen = self.capture();
            if !screen.contains(text) {
                return screen;
            }
            if Instant::now() >= deadline {
                panic!(
                    "waited {} s for {text:?} to go; screen:\n{screen}",
                    WAIT.as_secs()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Quits with `q` and checks the program exited with status 0 and left the alternate
    /// screen (the dashboard's header is gone).
    pub fn quit_cleanly(&self) {
        self.send(&["q"]);
        let screen = self.wait_for(&[&format!("{EXIT_MARK}0")]);
        assert!(
            !screen.contains(" allocview  "),
            "the dashboard is still on screen after exit:\n{screen}"
        );
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let mut kill = self.tmux();
        match &self.server {
            Some(_) => kill.arg("kill-server"),
            None => kill.args(["kill-session", "-t", &self.name]),
        };
        let _ = kill.stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

/// A child process killed on drop.
pub struct Child(pub std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
