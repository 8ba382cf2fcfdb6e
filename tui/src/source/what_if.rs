//! What-if replays for live OOMs: when the agent has dumped the snapshot of an OOM, a worker
//! thread loads the dump, finds the OOM's entry in its trace, and replays the trace under the
//! usual cures ([`crate::state::from_snapshot::what_if_lines`]); the OOM view shows what
//! became of that request once it is there. The dashboard never waits for it.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use allocview_agent::snapshot_file;

use crate::source::file::WHAT_IFS_FAILED;
use crate::state::OomReport;
use crate::state::from_snapshot::{WhatIfCapacity, oom_entry_of, what_if_lines};

/// Shown while a replay runs.
pub const PENDING: &str = "replaying the dump under other settings…";

/// Runs `work` (a what-if replay, on its own thread): its result, or, when it panicked, the
/// lines that say so, starting with [`WHAT_IFS_FAILED`] and the panic's message (the panic hook
/// also keeps the message for the status line), so that an OOM's what-if lines never stay
/// pending.
pub fn caught<T>(work: impl FnOnce() -> T, failed: impl FnOnce(String) -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        Ok(v) => v,
        Err(payload) => {
            let why = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            failed(format!("{WHAT_IFS_FAILED}: {why}"))
        }
    }
}

/// Replays started, and their results by dump path.
#[derive(Debug, Default)]
pub struct WhatIfJobs {
    started: HashSet<String>,
    results: Arc<Mutex<HashMap<String, Vec<String>>>>,
}

impl WhatIfJobs {
    /// No jobs yet.
    pub fn new() -> WhatIfJobs {
        WhatIfJobs::default()
    }

    /// Starts replays for OOMs with a dump and a known device size, and fills in the results
    /// that are ready.
    pub fn fill(&mut self, ooms: &mut [OomReport]) {
        for o in ooms.iter_mut() {
            let (Some(path), Some(total)) = (o.dump_path.clone(), o.device_total) else {
                continue;
            };
            if self.started.insert(path.clone()) {
                let results = self.results.clone();
                let p = path.clone();
                // An OOM whose event was lost has no known request to find in the trace.
                let request = (!o.event_lost).then_some((o.requested, o.time_us));
                let spawned = std::thread::Builder::new()
                    .name("allocview-what-if".into())
                    .spawn(move || {
                        let lines = caught(
                            || match snapshot_file::load(Path::new(&p)) {
                                Ok(snap) => {
                                    let oom = request
                                        .and_then(|(size, time)| oom_entry_of(&snap, size, time));
                                    what_if_lines(&snap, WhatIfCapacity::device(total), oom)
                                }
                                Err(e) => vec![format!("cannot replay the dump: {e}")],
                            },
                            |failed| vec![failed],
                        );
                        results
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(p, lines);
                    });
                if spawned.is_err() {
                    self.results
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(path.clone(), vec!["cannot start a replay thread".into()]);
                }
            }
            o.what_if = self
                .results
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&path)
                .cloned()
                .unwrap_or_else(|| vec![PENDING.to_string()]);
        }
    }
}
