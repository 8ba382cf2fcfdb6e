//! The demo's embedded agent as a source: the agent's state each tick, with the frames
//! (context tags) of blocks and trace entries joined from the allocator's own snapshot.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_alloc::caching::backend::DeviceBackend as _;

use super::what_if::WhatIfJobs;
use super::{Source, fresh_path};
use crate::demo::{AGENT_TICK, Demo};
use crate::state::State;
use crate::state::from_agent::{AgentAdapter, LiveInfo, SnapshotFrames};

/// How often the allocator's snapshot is taken again for the frames of blocks and trace
/// entries (indexed once per snapshot): taking it copies the trace ring, and frames change far
/// slower than figures.
pub const FRAMES_EVERY: Duration = Duration::from_secs(1);

/// Live state from an embedded agent.
pub struct EmbeddedSource {
    demo: Demo,
    adapter: AgentAdapter,
    last_time_ns: u64,
    saved: u32,
    /// When the allocator's snapshot was taken, and its frames.
    frames: Option<(Instant, SnapshotFrames)>,
    what_if: WhatIfJobs,
}

impl EmbeddedSource {
    /// Shows `demo`.
    pub fn new(demo: Demo) -> EmbeddedSource {
        EmbeddedSource {
            demo,
            adapter: AgentAdapter::new(),
            last_time_ns: 0,
            saved: 0,
            frames: None,
            what_if: WhatIfJobs::new(),
        }
    }

    /// The demo.
    pub fn demo(&mut self) -> &mut Demo {
        &mut self.demo
    }
}

impl Source for EmbeddedSource {
    fn poll(&mut self, state: &mut State) -> anyhow::Result<bool> {
        let agent_state = self.demo.agent.state();
        if agent_state.time_ns == self.last_time_ns {
            return Ok(false);
        }
        self.last_time_ns = agent_state.time_ns;
        let info = LiveInfo {
            device_name: Some(self.demo.device.name()),
            rate_hz: Some(1.0 / AGENT_TICK.as_secs_f64()),
            mode: None,
            device_free: self
                .demo
                .alloc
                .backend()
                .mem_get_info()
                .ok()
                .map(|(free, _)| free),
        };
        let status = state.status.take();
        *state = self
            .adapter
            .state(&agent_state, self.demo.alloc.device(), &info);
        if self
            .frames
            .as_ref()
            .is_none_or(|(t, _)| t.elapsed() >= FRAMES_EVERY)
        {
            let frames = SnapshotFrames::new(&self.demo.alloc.snapshot());
            self.frames = Some((Instant::now(), frames));
        }
        if let Some((_, frames)) = &self.frames {
            frames.apply(state);
        }
        self.what_if.fill(&mut state.ooms);
        if state.status.is_none() {
            state.status = status;
        }
        if let Some(e) = self.demo.error() {
            state.status = Some(format!("the workload stopped: {e}"));
        }
        Ok(true)
    }

    fn set_paused(&mut self, paused: bool) -> anyhow::Result<String> {
        Ok(if paused {
            "paused: the run goes on, the screen holds still (Space resumes)".into()
        } else {
            "resumed".into()
        })
    }

    fn reset_peaks(&mut self) -> anyhow::Result<String> {
        self.demo.agent.reset_peaks();
        Ok("peak statistics reset".into())
    }

    fn save(&mut self, _state: &State, dir: &Path) -> anyhow::Result<PathBuf> {
        let snap = self.demo.alloc.snapshot();
        self.saved += 1;
        let path = fresh_path(
            dir,
            &format!("allocview-demo-{}-{}", std::process::id(), self.saved),
            FileFormat::Pickle.extension(),
        );
        snapshot_file::save(&path, &snap, FileFormat::Pickle)?;
        Ok(path)
    }
}
