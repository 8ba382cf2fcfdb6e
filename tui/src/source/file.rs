//! A snapshot file as a source: the state at a chosen event of its trace (starting at the
//! end, which is the file's own final state), moved with [`Seek`].

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, TryRecvError};

use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_alloc::snapshot::Snapshot;

use super::{Source, fresh_path, what_if};
use crate::input::Seek;
use crate::state::State;
use crate::state::from_snapshot::PostMortem;
use crate::state::ui::View;

/// A file seeked through its trace.
#[derive(Debug)]
pub struct FileSource {
    pm: PostMortem,
    event: usize,
    shown: bool,
    /// The what-if lines of the OOMs, while a thread replays the file ([`FileSource::open`]).
    what_ifs: Option<Receiver<Vec<Vec<String>>>>,
}

/// An OOM's what-if line when the thread replaying the file stopped without an answer.
pub const WHAT_IFS_FAILED: &str = "the what-if replays stopped without a result";

/// [`WHAT_IFS_FAILED`] as the what-if lines of every OOM of `pm`.
fn failed_what_ifs(pm: &PostMortem) -> Vec<Vec<String>> {
    vec![vec![WHAT_IFS_FAILED.to_string()]; pm.ooms().len()]
}

impl FileSource {
    /// Prepares `snapshot` (read from `path`), positioned after the last event, with the
    /// what-if replays of its OOMs done.
    pub fn new(path: &str, snapshot: &Snapshot) -> FileSource {
        FileSource::ready(PostMortem::new(path, snapshot), None)
    }

    /// [`new`](Self::new), with the what-if replays of the OOMs run on a thread of their own,
    /// which keeps the snapshot until they are done: the dashboard opens at once, and the OOM
    /// view shows their lines when [`poll`](Source::poll) finds them.
    pub fn open(path: &str, snapshot: Snapshot) -> FileSource {
        let (pm, plan) = PostMortem::without_what_ifs(path, &snapshot);
        let Some(plan) = plan else {
            return FileSource::ready(pm, None);
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("allocview-what-if".into())
            .spawn(move || {
                let n = plan.ooms();
                let lines = what_if::caught(
                    || {
                        what_if::panic_if_asked();
                        plan.run(&snapshot)
                    },
                    |failed| vec![vec![failed]; n],
                );
                let _ = tx.send(lines);
            });
        match spawned {
            Ok(_) => FileSource::ready(pm, Some(rx)),
            Err(_) => {
                let mut pm = pm;
                pm.set_what_ifs(failed_what_ifs(&pm));
                FileSource::ready(pm, None)
            }
        }
    }

    fn ready(pm: PostMortem, what_ifs: Option<Receiver<Vec<Vec<String>>>>) -> FileSource {
        let event = pm.len();
        FileSource {
            pm,
            event,
            shown: false,
            what_ifs,
        }
    }

    /// Takes the what-if lines when the replays are done; true when they changed the OOMs.
    fn collect_what_ifs(&mut self) -> bool {
        let Some(rx) = &self.what_ifs else {
            return false;
        };
        let lines = match rx.try_recv() {
            Ok(lines) => lines,
            Err(TryRecvError::Empty) => return false,
            Err(TryRecvError::Disconnected) => failed_what_ifs(&self.pm),
        };
        self.pm.set_what_ifs(lines);
        self.what_ifs = None;
        true
    }

    /// Whether the OOMs' what-if replays still run.
    pub fn what_ifs_pending(&self) -> bool {
        self.what_ifs.is_some()
    }

    /// The current event number.
    pub fn event(&self) -> usize {
        self.event
    }

    /// The prepared file.
    pub fn post_mortem(&self) -> &PostMortem {
        &self.pm
    }

    /// The event number a seek leads to (`None`: nothing there, e.g. no further OOM).
    pub fn target(&self, seek: Seek) -> Option<usize> {
        let len = self.pm.len();
        match seek {
            Seek::By(d) => Some((self.event as i64 + d).clamp(0, len as i64) as usize),
            Seek::NextOom => self.pm.next_oom(self.event),
            Seek::NextSegmentEvent => self.pm.next_segment_event(self.event),
            Seek::First => Some(0),
            Seek::Last => Some(len),
            Seek::To(e) => Some(e.min(len)),
        }
    }
}

impl Source for FileSource {
    fn poll(&mut self, state: &mut State) -> anyhow::Result<bool> {
        if self.collect_what_ifs() && self.shown {
            // Only the OOMs' lines change; the rest of the state (and its status) stays.
            state.ooms = self.pm.ooms().to_vec();
            return Ok(true);
        }
        if self.shown {
            return Ok(false);
        }
        self.shown = true;
        *state = self.pm.state_at(self.event);
        Ok(true)
    }

    fn save(&mut self, _state: &State, dir: &Path) -> anyhow::Result<PathBuf> {
        let snap = self.pm.snapshot_at(self.event);
        let path = fresh_path(dir, &format!("allocview-event-{}", self.event), "json");
        snapshot_file::save(&path, &snap, FileFormat::Json)?;
        Ok(path)
    }

    fn seek(&mut self, seek: Seek, state: &mut State) -> anyhow::Result<bool> {
        match self.target(seek) {
            Some(e) if e != self.event => {
                self.event = e;
                *state = self.pm.state_at(e);
                Ok(true)
            }
            Some(_) => {
                state.status = Some(match seek {
                    Seek::By(d) if d < 0 => "at the first event".into(),
                    _ => "at the last event".into(),
                });
                Ok(true)
            }
            None => {
                // `n` and `g` wrap round to the trace's first OOM or segment event.
                let (what, first) = match seek {
                    Seek::NextOom => ("OOM", self.pm.next_oom(0)),
                    _ => ("segment event", self.pm.next_segment_event(0)),
                };
                state.status = Some(match first {
                    Some(e) if e != self.event => {
                        self.event = e;
                        *state = self.pm.state_at(e);
                        format!("no {what} after this event: back to the first, at event {e}")
                    }
                    Some(_) => format!("this is the trace's only {what}"),
                    None if seek == Seek::NextOom && self.pm.has_dumped_oom() => format!(
                        "the trace holds no OOM entry (no history was recorded); the OOM \
                         view ({}) shows the OOM this dump was taken at",
                        View::Oom.index() + 1
                    ),
                    None => format!("the trace holds no {what}"),
                });
                Ok(true)
            }
        }
    }

    fn is_file(&self) -> bool {
        true
    }
}
