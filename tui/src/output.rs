//! Printing results to stdout for scripts: a closed pipe (`allocview ... | head`) ends the
//! command quietly instead of panicking as `println!` would. Every command prints through
//! [`print()`] or [`write()`]; a closed stdout comes back as a [`StdoutClosed`] error, which stops
//! the command (a loop printing lines stops too), and `main` exits with status 0 and no message
//! when it sees one ([`is_stdout_closed`]).

use std::io::{self, Write};

use serde::Serialize;

/// A JSON output's top level: `format` (which output this is) and `version` (bumped when a
/// field changes meaning or disappears; fields are only added within a version) first, then
/// the value's own fields. docs/json.md describes each format.
#[derive(Debug, Serialize)]
pub struct Versioned<'a, T: Serialize> {
    /// The output's name, `allocview-...`.
    pub format: &'static str,
    /// Its version.
    pub version: u32,
    /// The output's own fields, at the top level beside the two above.
    #[serde(flatten)]
    pub body: &'a T,
}

impl<'a, T: Serialize> Versioned<'a, T> {
    /// `body` as the output `format`, version `version`.
    pub fn new(format: &'static str, version: u32, body: &'a T) -> Self {
        Versioned {
            format,
            version,
            body,
        }
    }

    /// Pretty JSON (the one-shot outputs: `summary`, `replay`, `demo --headless`, `--once`).
    ///
    /// # Errors
    /// A value serde_json cannot write (a map with non-string keys).
    pub fn pretty(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }

    /// One line of JSON (the `--attach --headless --json` stream: NDJSON).
    ///
    /// # Errors
    /// A value serde_json cannot write (a map with non-string keys).
    pub fn line(&self) -> serde_json::Result<String> {
        serde_json::to_string(self)
    }
}

/// Stdout was closed by the reader (`EPIPE`): not a failure of the command.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed")]
pub struct StdoutClosed;

/// Writes `text` and a newline to stdout.
///
/// # Errors
/// [`StdoutClosed`] when the reader has gone; other write errors.
pub fn print(text: &str) -> anyhow::Result<()> {
    write_all(text, true)
}

/// Writes `text` as it is (no newline added) to stdout.
///
/// # Errors
/// [`StdoutClosed`] when the reader has gone; other write errors.
pub fn write(text: &str) -> anyhow::Result<()> {
    write_all(text, false)
}

fn write_all(text: &str, newline: bool) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    let written = out
        .write_all(text.as_bytes())
        .and_then(|()| {
            if newline {
                out.write_all(b"\n")
            } else {
                Ok(())
            }
        })
        .and_then(|()| out.flush());
    match written {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        r => Ok(r?),
    }
}

/// Whether `e` (or an error it wraps) is [`StdoutClosed`]: the command ends quietly.
pub fn is_stdout_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<StdoutClosed>())
}

/// `path` as the user best types it here: relative to the current folder when it lies inside
/// it (`allocview-dumps/oom-0001-pid42.pickle`), else as given. Agents report absolute dump
/// paths, which are long and cut at 80 columns.
pub fn shown_path(path: &str) -> String {
    // Read once: the dashboard draws this every frame, and never changes its folder.
    static CWD: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    let p = std::path::Path::new(path);
    CWD.get_or_init(|| std::env::current_dir().ok())
        .as_ref()
        .and_then(|cwd| p.strip_prefix(cwd).ok().map(|r| r.display().to_string()))
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| path.to_string())
}

/// Whether `a` and `b` name one existing file (the same path, a link, or another spelling of
/// it): what a command that writes a file checks so that it never writes over its input.
pub fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}
