//! Where the dashboard's [`State`] comes from: a snapshot file seeked through its trace
//! ([`file::FileSource`]), or a live agent (embedded or attached). The app loop talks to every
//! source through [`Source`].

pub mod attach;
pub mod embedded;
pub mod file;
pub mod what_if;

use std::path::{Path, PathBuf};

use allocview_agent::snapshot_file::fresh_stem;

use crate::input::Seek;
use crate::state::State;

/// A source of dashboard state.
pub trait Source {
    /// Brings `state` up to date without blocking; returns whether anything changed.
    ///
    /// # Errors
    /// When the source failed for good (a lost connection is not an error: the source shows
    /// it in [`State::mode`] and keeps trying).
    fn poll(&mut self, state: &mut State) -> anyhow::Result<bool>;

    /// Called each tick in place of [`Source::poll`] while the user has paused updates: a
    /// source with a connection watches it (a lost one is shown and reconnected to) without
    /// changing the figures shown; returns whether anything changed. Default: nothing to watch.
    ///
    /// # Errors
    /// When the source failed for good.
    fn watch_while_paused(&mut self, state: &mut State) -> anyhow::Result<bool> {
        let _ = state;
        Ok(false)
    }

    /// Pauses or resumes updates; returns a message for the status line.
    ///
    /// # Errors
    /// When the request could not be sent.
    fn set_paused(&mut self, paused: bool) -> anyhow::Result<String> {
        let _ = paused;
        Ok("nothing to pause: this source does not update".into())
    }

    /// Resets peak statistics; returns a message for the status line.
    ///
    /// # Errors
    /// When the request could not be sent.
    fn reset_peaks(&mut self) -> anyhow::Result<String> {
        Ok("peaks of a file come from its trace and cannot be reset".into())
    }

    /// Saves a snapshot of what is shown into `dir`; returns the file written.
    ///
    /// # Errors
    /// When the snapshot cannot be taken or written.
    fn save(&mut self, state: &State, dir: &Path) -> anyhow::Result<PathBuf>;

    /// Moves through a file's trace; returns whether the state changed.
    ///
    /// # Errors
    /// Never for files; live sources cannot seek and say so.
    fn seek(&mut self, seek: Seek, state: &mut State) -> anyhow::Result<bool> {
        let _ = (seek, state);
        Ok(false)
    }

    /// Whether this is a file (time-travel keys apply).
    fn is_file(&self) -> bool {
        false
    }
}

/// A file name in `dir` that does not exist yet: `{stem}.{ext}`, then `{stem}-2.{ext}`, ...
pub fn fresh_path(dir: &Path, stem: &str, ext: &str) -> PathBuf {
    let mut path = fresh_stem(dir, stem, &[ext]).into_os_string();
    path.push(format!(".{ext}"));
    path.into()
}
