//! `allocview`'s exit statuses, one constant each (docs/json.md lists them for scripts), and
//! the error a CI gate returns so that `main` exits with [`GATE_FAILED`] rather than
//! [`FAILURE`].

/// The command did what it was asked.
pub const SUCCESS: u8 = 0;
/// An error: a file that cannot be read or parsed, an agent that cannot be reached, a bad
/// value. The message is on stderr.
pub const FAILURE: u8 = 1;
/// A usage error (clap's: an unknown flag, a missing argument), or `allocview` with no
/// arguments: the help or message is on stderr.
pub const USAGE: u8 = 2;
/// A CI gate (`summary --fail-on-oom`, `summary --max-peak`) failed: the command's output was
/// printed as usual, the reason is on stderr.
pub const GATE_FAILED: u8 = 3;
/// A process ended by signal N exits, as shells report a death by it, with status `128 + N`
/// (130 SIGINT, 143 SIGTERM, 129 SIGHUP).
pub const SIGNAL_EXIT_BASE: i32 = 128;

/// A CI gate failed: `main` prints the reason and exits with [`GATE_FAILED`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct GateFailed(pub String);

/// The exit status for a command's error: [`GATE_FAILED`] when it is (or wraps) a
/// [`GateFailed`], else [`FAILURE`].
pub fn status_of(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| c.is::<GateFailed>()) {
        GATE_FAILED
    } else {
        FAILURE
    }
}
