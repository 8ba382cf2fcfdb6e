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

/// Environment variable that makes the what-if replay threads panic on purpose
/// ([`panic_if_asked`]): how the tests prove that a background thread's panic leaves the
/// dashboard's screen intact. Never set for users.
pub const PANIC_IN_WHAT_IF_ENV: &str = "ALLOCVIEW_TEST_PANIC_IN_WHAT_IF";
/// The longest the panic of [`PANIC_IN_WHAT_IF_ENV`] waits for the dashboard to take the
/// terminal.
const PANIC_IN_WHAT_IF_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How often that wait looks.
const PANIC_IN_WHAT_IF_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// Panics when [`PANIC_IN_WHAT_IF_ENV`] is set, once the dashboard holds the terminal (`open`
/// starts the replays before it takes the terminal; a bounded wait), as a panic in a long
/// replay comes while it is up.
pub fn panic_if_asked() {
    if std::env::var_os(PANIC_IN_WHAT_IF_ENV).is_none() {
        return;
    }
    let deadline = std::time::Instant::now() + PANIC_IN_WHAT_IF_WAIT;
    while !crate::terminal::held() && std::time::Instant::now() < deadline {
        std::thread::sleep(PANIC_IN_WHAT_IF_POLL);
    }
    panic!("{PANIC_IN_WHAT_IF_ENV} is set: the what-if replays panic");
}

/// Runs `work` (a what-if replay, on its own thread): its result, or, when it panicked, the
/// lines that say so, starting with [`WHAT_IFS_FAILED`] and the panic's message (the panic hook
/// also keeps the message for the status line), so that an OOM's what-if lines never stay
/// pending.
pub fn caught<T>(work: impl FnOnce() -> T, failed: impl FnOnce(String) -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        Ok(v) => v,
        Err(payload) => {
            let why = crate::terminal::panic_text(&*payload).unwrap_or("a panic");
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
                            || match snapshot_file::load(Path::new(&p))
                                .inspect(|_| panic_if_asked())
                            {
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
