//! Another process's agent as a source, over the attach protocol: the client's state each
//! tick, reconnecting with a back-off when the connection drops (the header then reads
//! `◌ reconnecting (n)` over the last state received). When the agent's count of attach
//! clients it refused rises, the status line says so with the reasons.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use allocview_agent::client::{AttachClient, ClientError, ClientUpdate};
use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_agent::state::PipelineStats;

use super::what_if::WhatIfJobs;
use super::{Source, fresh_path};
use crate::state::from_agent::{AgentAdapter, LiveInfo, SnapshotFrames};
use crate::state::{Mode, State};
use crate::units;

/// Wait between reconnect attempts.
pub const RECONNECT_EVERY: Duration = Duration::from_secs(1);
/// How often the client asks for a full snapshot (for the frames of blocks and trace entries,
/// indexed once per snapshot).
pub const FRAMES_EVERY: Duration = Duration::from_secs(5);
/// How long `s` waits for the agent's snapshot.
pub const SAVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Updates applied per poll at most (the rest wait for the next tick, so input stays fast).
const MAX_UPDATES_PER_POLL: usize = 256;

/// Live state from an attached agent.
pub struct AttachSource {
    addr: String,
    token: Option<String>,
    client: Option<AttachClient>,
    adapter: AgentAdapter,
    attempts: u32,
    next_retry: Instant,
    /// Why the last connection ended (the agent's goodbye, or the error), shown while
    /// reconnecting: a failed reconnect's own error ("No such file or directory" once the
    /// agent's socket is gone) says less.
    ended: Option<String>,
    /// The frames of the last snapshot received.
    frames: Option<SnapshotFrames>,
    next_frames: Instant,
    rate_hz: Option<f64>,
    last_update: Option<Instant>,
    saved: u32,
    what_if: WhatIfJobs,
    /// Attach clients the agent had refused when last said in the status line: a rise is
    /// said again.
    refused_said: u64,
}

/// `3 (hello_cap 2, token 1)`: the attach clients the agent refused, all together and per
/// reason; `None` when it refused none.
pub fn refused_summary(p: &PipelineStats) -> Option<String> {
    if p.refused_clients.is_empty() {
        return None;
    }
    let why: Vec<String> = p
        .refused_clients
        .iter()
        .map(|(reason, n)| format!("{reason} {}", units::count(*n)))
        .collect();
    Some(format!(
        "{} ({})",
        units::count(p.refused_clients_total()),
        why.join(", ")
    ))
}

/// The status line when the agent has refused more attach clients than `said`.
fn refused_status(p: &PipelineStats, said: u64) -> Option<String> {
    if p.refused_clients_total() <= said {
        return None;
    }
    refused_summary(p).map(|s| format!("the agent refused attach clients: {s}"))
}

impl AttachSource {
    /// Connects to `addr`.
    ///
    /// # Errors
    /// The first connection fails (a bad address, nobody listening, a refusal): later losses
    /// are retried instead.
    pub fn connect(addr: &str, token: Option<String>) -> Result<AttachSource, ClientError> {
        let client = AttachClient::connect(addr, token.clone())?;
        Ok(AttachSource {
            addr: addr.to_string(),
            token,
            client: Some(client),
            adapter: AgentAdapter::new(),
            attempts: 0,
            next_retry: Instant::now(),
            ended: None,
            frames: None,
            next_frames: Instant::now(),
            rate_hz: None,
            last_update: None,
            saved: 0,
            what_if: WhatIfJobs::new(),
            refused_said: 0,
        })
    }

    fn lost(&mut self, why: String) {
        self.ended = Some(why);
        self.client = None;
        self.attempts = self.attempts.max(1);
        self.next_retry = Instant::now() + RECONNECT_EVERY;
    }

    fn refresh(&mut self, state: &mut State) {
        let Some(c) = &self.client else { return };
        let info = LiveInfo {
            device_name: None,
            rate_hz: self.rate_hz,
            mode: None,
            device_free: None,
        };
        let status = state.status.take();
        *state = self.adapter.state(c.state(), 0, &info);
        if let Some(frames) = &self.frames {
            frames.apply(state);
        }
        // The dump is readable when the agent runs on this machine.
        self.what_if.fill(&mut state.ooms);
        state.status = status;
        let pipeline = &c.state().pipeline;
        if let Some(note) = refused_status(pipeline, self.refused_said) {
            state.status = Some(note);
        }
        self.refused_said = pipeline.refused_clients_total();
    }
}

impl Source for AttachSource {
    fn poll(&mut self, state: &mut State) -> anyhow::Result<bool> {
        if self.client.is_none() {
            if Instant::now() < self.next_retry {
                return Ok(false);
            }
            match AttachClient::connect(&self.addr, self.token.clone()) {
                Ok(c) => {
                    self.client = Some(c);
                    self.attempts = 0;
                    self.ended = None;
                    self.refresh(state);
                    state.status = Some(format!("reconnected to {}", self.addr));
                    return Ok(true);
                }
                Err(e) => {
                    self.attempts += 1;
                    self.next_retry = Instant::now() + RECONNECT_EVERY;
                    state.mode = Mode::Reconnecting(self.attempts);
                    state.status = Some(match &self.ended {
                        Some(why) => format!("{why}; reconnecting: {e}"),
                        None => e.to_string(),
                    });
                    return Ok(true);
                }
            }
        }
        let mut changed = false;
        let mut lost = None;
        if Instant::now() >= self.next_frames
            && let Some(c) = &mut self.client
        {
            self.next_frames = Instant::now() + FRAMES_EVERY;
            if let Err(e) = c.request_snapshot() {
                lost = Some(e.to_string());
            }
        }
        for _ in 0..MAX_UPDATES_PER_POLL {
            let Some(c) = &mut self.client else { break };
            match c.next_update(Duration::ZERO) {
                Ok(ClientUpdate::Full) | Ok(ClientUpdate::Update) => {
                    let now = Instant::now();
                    if let Some(t) = self.last_update {
                        let dt = now.duration_since(t).as_secs_f64();
                        if dt > 0.0 {
                            self.rate_hz = Some(1.0 / dt);
                        }
                    }
                    self.last_update = Some(now);
                    changed = true;
                }
                Ok(ClientUpdate::Snapshot(s)) => {
                    self.frames = Some(SnapshotFrames::new(&s));
                    changed = true;
                }
                Ok(ClientUpdate::Ack(_)) => {}
                Ok(ClientUpdate::Error(m)) => {
                    state.status = Some(format!("agent: {m}"));
                    changed = true;
                }
                Err(ClientError::Timeout) => break,
                Err(e) => {
                    lost = Some(e.to_string());
                    break;
                }
            }
        }
        if let Some(why) = lost {
            state.status = Some(why.clone());
            self.lost(why);
            state.mode = Mode::Reconnecting(self.attempts);
            return Ok(true);
        }
        if changed {
            self.refresh(state);
        }
        Ok(changed)
    }

    fn set_paused(&mut self, paused: bool) -> anyhow::Result<String> {
        match &mut self.client {
            Some(c) => {
                c.pause(paused)?;
                Ok(if paused {
                    "paused (Space resumes)"
                } else {
                    "resumed"
                }
                .into())
            }
            None => Ok("not connected".into()),
        }
    }

    fn reset_peaks(&mut self) -> anyhow::Result<String> {
        match &mut self.client {
            Some(c) => {
                c.reset_peaks()?;
                Ok("asked the agent to reset peak statistics".into())
            }
            None => Ok("not connected".into()),
        }
    }

    fn save(&mut self, _state: &State, dir: &Path) -> anyhow::Result<PathBuf> {
        let Some(c) = &mut self.client else {
            anyhow::bail!("not connected to an agent");
        };
        c.request_snapshot()?;
        let deadline = Instant::now() + SAVE_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                anyhow::bail!(
                    "the agent sent no snapshot within {} s",
                    SAVE_TIMEOUT.as_secs()
                );
            }
            if let ClientUpdate::Snapshot(s) = c.next_update(left)? {
                self.saved += 1;
                let (pid, _) = c.process();
                let path = fresh_path(
                    dir,
                    &format!("allocview-attach-{pid}-{}", self.saved),
                    FileFormat::Pickle.extension(),
                );
                snapshot_file::save(&path, &s, FileFormat::Pickle)?;
                self.frames = Some(SnapshotFrames::new(&s));
                return Ok(path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_clients_are_said_once_per_rise_with_their_reasons() {
        let mut p = PipelineStats::default();
        assert_eq!(refused_status(&p, 0), None);
        p.refused_clients = vec![("hello_cap".into(), 2), ("token".into(), 1)];
        assert_eq!(
            refused_status(&p, 0).as_deref(),
            Some("the agent refused attach clients: 3 (hello_cap 2, token 1)")
        );
        assert_eq!(refused_status(&p, 3), None);
    }
}
