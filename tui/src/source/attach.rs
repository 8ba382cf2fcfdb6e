//! Another process's agent as a source, over the attach protocol: the client's state each
//! tick, reconnecting with a back-off when the connection drops (the header then reads
//! `◌ reconnecting (n)` over the last state received). When the agent's count of attach
//! clients it refused rises, the status line says so with the reasons.
//!
//! The agent sends an update every tick whether or not anything changed (docs/protocol.md),
//! so silence means its process is stopped or stuck: after [`STALL_AFTER`] without one the
//! header reads `◌ no updates 12s` in place of `● live`, until they resume. While the user has
//! paused updates the connection is still watched ([`Source::watch_while_paused`]): a process
//! that dies meanwhile is noticed and reconnected to (paused again), and a request that finds
//! the connection gone starts a reconnect instead of ending the dashboard. A reconnect that
//! reaches another process (the service was restarted) says so and starts its figures over.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use allocview_agent::client::{AttachClient, ClientError, ClientUpdate};
use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_agent::state::PipelineStats;

use super::what_if::WhatIfJobs;
use super::{Source, fresh_path};
use crate::state::from_agent::{AgentAdapter, LiveInfo, SnapshotFrames};
use crate::state::passing_note::PassingNote;
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
/// How long without an update before the header says updates stopped (the agent sends one
/// every tick, at most 10 Hz): at least this, or `STALL_TICKS` (5) of the agent's observed
/// interval where it ticks slower.
pub const STALL_AFTER: Duration = Duration::from_secs(3);
/// Missed ticks, at the observed update interval, that count as a stall on a slow-ticking
/// agent.
const STALL_TICKS: f64 = 5.0;
/// The longest wait before a stall is said, however slowly the agent ticks.
const MAX_STALL_AFTER: Duration = Duration::from_secs(3600);
/// Intervals between updates (by the agent's clock) the observed interval is the median of:
/// one stretch without updates (a stopped process) among them does not move it, and an agent
/// that ticks slower than [`STALL_AFTER`] is measured within a few updates, after which its
/// quiet between ticks is no stall.
const INTERVALS_KEPT: usize = 7;
/// How long the source's own passing messages (`reconnected to ...`, `updates resumed ...`)
/// stay in the status line.
pub const SOURCE_NOTE_SHOWN: Duration = Duration::from_secs(6);

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
    /// The last [`INTERVALS_KEPT`] intervals between updates, by the agent's clock, in ns.
    intervals: VecDeque<u64>,
    /// The least [`Self::stall_after`] ([`STALL_AFTER`] unless set).
    stall_floor: Duration,
    last_update: Option<Instant>,
    saved: u32,
    what_if: WhatIfJobs,
    /// Attach clients the agent had refused when last said in the status line: a rise is
    /// said again.
    refused_said: u64,
    /// The agent's clock at the last update (the rate is measured by it).
    last_agent_ns: Option<u64>,
    /// Whether the user paused updates (a reconnect pauses the new connection too).
    paused: bool,
    /// When updates stopped arriving, once [`STALL_AFTER`] passed without one.
    stalled_since: Option<Instant>,
    /// The process of the last connection, as its pid and start time: a reconnect to another
    /// is a restart (a restarted service in a container often has the same pid).
    process: (u32, u64),
    /// A passing message this source put in the status line, and when: cleared after
    /// [`SOURCE_NOTE_SHOWN`] unless something replaced it.
    note: PassingNote,
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

/// Why a connection ended, for the status line while reconnecting: a clean end (the process
/// shut its agent down: it exited or is restarting), a loss (no goodbye: the process died), or
/// the agent letting this dashboard go (too slow to read), before anything else.
fn ended_why(e: &ClientError) -> String {
    match e {
        e if e.is_agent_shutdown() => "the process ended (its agent shut down)".into(),
        ClientError::ConnectionLost => {
            "connection lost without a goodbye (did the process die?)".into()
        }
        ClientError::Disconnected(reason) => format!("the agent let this dashboard go: {reason}"),
        e => e.to_string(),
    }
}

/// What a failed reconnect adds to the line: nothing when nobody listens at the address yet
/// (the process has not come back: what the retries wait for), else its error.
fn retry_detail(e: &ClientError) -> String {
    use std::io::ErrorKind;
    match e {
        ClientError::StaleSocket(_) => String::new(),
        ClientError::Connect { error, .. }
            if matches!(
                error.kind(),
                ErrorKind::NotFound | ErrorKind::ConnectionRefused
            ) =>
        {
            String::new()
        }
        e => format!(": {e}"),
    }
}

/// The agent's clock in the state a client has (from the full state it got on connecting);
/// `None` where the agent has not said it yet.
fn agent_clock(c: &AttachClient) -> Option<u64> {
    Some(c.state().time_ns).filter(|&t| t > 0)
}

/// The process a client is connected to: its pid and when it started (by the agent's clock).
fn process_of(c: &AttachClient) -> (u32, u64) {
    (c.process().0, c.state().process.started_ns)
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
        let process = process_of(&client);
        let last_agent_ns = agent_clock(&client);
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
            intervals: VecDeque::with_capacity(INTERVALS_KEPT),
            stall_floor: STALL_AFTER,
            last_update: None,
            saved: 0,
            what_if: WhatIfJobs::new(),
            refused_said: 0,
            last_agent_ns,
            paused: false,
            stalled_since: None,
            process,
            note: PassingNote::default(),
        })
    }

    fn lost(&mut self, e: &ClientError) {
        self.ended = Some(ended_why(e));
        self.client = None;
        self.attempts = self.attempts.max(1);
        self.next_retry = Instant::now() + RECONNECT_EVERY;
        self.stalled_since = None;
        self.last_update = None;
        self.last_agent_ns = None;
    }

    /// Says a stall only after `floor` at least without an update (default [`STALL_AFTER`]);
    /// an agent seen to tick slower still gets `STALL_TICKS` (5) of its interval.
    pub fn with_stall_after(mut self, floor: Duration) -> AttachSource {
        self.stall_floor = floor;
        self
    }

    /// The interval the agent sends updates at, by its clock: the median of the last
    /// [`INTERVALS_KEPT`] (`None` before the first update after connecting).
    fn interval(&self) -> Option<Duration> {
        let mut v: Vec<u64> = self.intervals.iter().copied().collect();
        v.sort_unstable();
        v.get(v.len() / 2).map(|&ns| Duration::from_nanos(ns))
    }

    /// An update at `t` by the agent's clock: the interval since the previous one is kept.
    fn note_update_at(&mut self, t: u64) {
        if let Some(prev) = self.last_agent_ns
            && t > prev
        {
            if self.intervals.len() == INTERVALS_KEPT {
                self.intervals.pop_front();
            }
            self.intervals.push_back(t - prev);
        }
        self.last_agent_ns = Some(t);
    }

    /// A request could not be sent: the connection is gone. Reconnecting starts; the message
    /// for the status line says so (the dashboard goes on).
    fn request_failed(&mut self, what: &str, e: ClientError) -> String {
        self.lost(&e);
        format!(
            "could not {what}: {}; reconnecting",
            self.ended.as_deref().unwrap_or_default()
        )
    }

    /// Puts a passing message in the status line (cleared after [`SOURCE_NOTE_SHOWN`]).
    fn say(&mut self, state: &mut State, msg: String) {
        self.note.say(&mut state.status, msg, Instant::now());
    }

    /// Clears this source's passing message once shown long enough; whether it did.
    fn expire_note(&mut self, state: &mut State) -> bool {
        self.note
            .expire(&mut state.status, SOURCE_NOTE_SHOWN, Instant::now())
    }

    /// How long without an update counts as a stall: [`STALL_AFTER`], or `STALL_TICKS` (5) of
    /// the agent's update interval where it ticks slower: the interval its hello said, or the
    /// one observed where that is longer.
    fn stall_after(&self) -> Duration {
        let said = self.client.as_ref().and_then(AttachClient::update_interval);
        let slow = self.interval().max(said).map_or(Duration::ZERO, |i| {
            i.mul_f64(STALL_TICKS).min(MAX_STALL_AFTER)
        });
        self.stall_floor.max(slow)
    }

    /// Live and not paused: when no update came for [`Self::stall_after`], the header says
    /// for how long (`◌ no updates N s`), and the status line why that matters once; whether
    /// the screen changed.
    fn watch_stall(&mut self, state: &mut State) -> bool {
        if self.paused || self.client.is_none() {
            return false;
        }
        let Some(last) = self.last_update else {
            return false;
        };
        let quiet = last.elapsed();
        if quiet < self.stall_after() {
            return false;
        }
        if self.stalled_since.is_none() {
            self.stalled_since = Some(last);
            state.status = Some(format!(
                "no update for {} s: is the process stopped (SIGSTOP, a debugger) or stuck?",
                quiet.as_secs()
            ));
        }
        let mode = Mode::Stalled(quiet.as_secs());
        let changed = state.mode != mode;
        state.mode = mode;
        changed
    }

    /// A connection made again: the state is the new one's; another process than before (the
    /// service restarted) starts the figures over and is named.
    fn reconnected(&mut self, c: AttachClient, state: &mut State) {
        let (pid, name) = c.process();
        let process = process_of(&c);
        let same = process == self.process;
        let msg = if same {
            format!("reconnected to {} (pid {pid})", self.addr)
        } else {
            format!(
                "reconnected to a new process, pid {pid} {name} (was pid {}), at {}; its \
                 figures start over",
                self.process.0, self.addr
            )
        };
        if !same {
            self.adapter = AgentAdapter::new();
            self.frames = None;
            self.what_if = WhatIfJobs::new();
            self.refused_said = 0;
            self.intervals.clear();
        }
        self.last_agent_ns = agent_clock(&c);
        self.process = process;
        self.client = Some(c);
        self.attempts = 0;
        self.ended = None;
        self.last_update = Some(Instant::now());
        self.next_frames = Instant::now();
        let mut msg = msg;
        if self.paused
            && let Some(c) = &mut self.client
        {
            match c.pause(true) {
                Ok(()) => msg.push_str("; still paused (Space resumes)"),
                Err(e) => {
                    self.lost(&e);
                    state.status = self.ended.clone();
                    state.mode = Mode::Reconnecting(self.attempts);
                    return;
                }
            }
        }
        // Paused, the figures shown stay (the new connection's come with the resume).
        if self.paused {
            state.mode = Mode::Paused;
        } else {
            self.refresh(state);
        }
        self.say(state, msg);
    }

    fn refresh(&mut self, state: &mut State) {
        let Some(c) = &self.client else { return };
        let info = LiveInfo {
            device_name: None,
            rate_hz: self
                .interval()
                .filter(|i| !i.is_zero())
                .map(|i| 1.0 / i.as_secs_f64()),
            mode: None,
            device_free: None,
        };
        let status = state.status.take();
        *state = self.adapter.state(c.state(), 0, &info);
        if self.paused {
            state.mode = Mode::Paused;
        }
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
        let noted = self.expire_note(state);
        if self.client.is_none() {
            if Instant::now() < self.next_retry {
                return Ok(noted);
            }
            match AttachClient::connect(&self.addr, self.token.clone()) {
                Ok(c) => {
                    self.reconnected(c, state);
                    return Ok(true);
                }
                Err(e) => {
                    self.attempts += 1;
                    self.next_retry = Instant::now() + RECONNECT_EVERY;
                    state.mode = Mode::Reconnecting(self.attempts);
                    state.status = Some(match &self.ended {
                        Some(why) => format!(
                            "{why}; retrying {} every {} s (q quits){}",
                            self.addr,
                            RECONNECT_EVERY.as_secs(),
                            retry_detail(&e)
                        ),
                        None => e.to_string(),
                    });
                    return Ok(true);
                }
            }
        }
        let mut changed = noted;
        let mut lost = None;
        if !self.paused
            && Instant::now() >= self.next_frames
            && let Some(c) = &mut self.client
        {
            self.next_frames = Instant::now() + FRAMES_EVERY;
            if let Err(e) = c.request_snapshot() {
                lost = Some(e);
            }
        }
        for _ in 0..MAX_UPDATES_PER_POLL {
            let Some(c) = &mut self.client else { break };
            match c.next_update(Duration::ZERO) {
                Ok(ClientUpdate::Full) | Ok(ClientUpdate::Update) => {
                    // The interval the agent sends at, by its clock: updates read in a burst
                    // (a dashboard held up by a slow terminal) arrive close together here. The
                    // one over a stall is kept too: the median leaves it out.
                    let t = c.state().time_ns;
                    self.note_update_at(t);
                    self.last_update = Some(Instant::now());
                    if let Some(since) = self.stalled_since.take() {
                        let msg = format!(
                            "updates resumed after {:.0} s",
                            since.elapsed().as_secs_f64()
                        );
                        self.say(state, msg);
                    }
                    changed = true;
                }
                Ok(ClientUpdate::Snapshot(s)) => {
                    self.frames = Some(SnapshotFrames::new(&s));
                    changed = true;
                }
                Ok(ClientUpdate::Ack(request)) => {
                    if request == "reset_peaks" {
                        self.say(state, "the agent reset its peak statistics".into());
                        changed = true;
                    }
                }
                Ok(ClientUpdate::Error(m)) => {
                    state.status = Some(format!("agent: {m}"));
                    changed = true;
                }
                Err(ClientError::Timeout) => break,
                Err(e) => {
                    lost = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = lost {
            self.lost(&e);
            state.status = self.ended.clone();
            state.mode = Mode::Reconnecting(self.attempts);
            return Ok(true);
        }
        // Paused, the figures shown stay (updates sent before the pause took effect wait in
        // the client's state for the resume).
        if changed && !self.paused {
            self.refresh(state);
        }
        if self.watch_stall(state) {
            changed = true;
        }
        Ok(changed)
    }

    fn watch_while_paused(&mut self, state: &mut State) -> anyhow::Result<bool> {
        // Paused, a poll reads the connection and the source's notes but rebuilds no figures.
        self.poll(state)
    }

    fn set_paused(&mut self, paused: bool) -> anyhow::Result<String> {
        self.paused = paused;
        self.stalled_since = None;
        let Some(c) = &mut self.client else {
            return Ok(if paused {
                "paused; not connected now (reconnecting)"
            } else {
                "resumed; not connected now (reconnecting)"
            }
            .into());
        };
        if let Err(e) = c.pause(paused) {
            let what = if paused { "pause" } else { "resume" };
            return Ok(self.request_failed(what, e));
        }
        // The agent's full state comes first after a resume: no stall before then, and no
        // interval measured over the pause (the agent's tick is kept).
        self.last_update = Some(Instant::now());
        self.last_agent_ns = None;
        Ok(if paused {
            "paused (Space resumes)"
        } else {
            "resumed"
        }
        .into())
    }

    fn reset_peaks(&mut self) -> anyhow::Result<String> {
        let Some(c) = &mut self.client else {
            return Ok("not connected to the agent now (reconnecting): peaks not reset".into());
        };
        match c.reset_peaks() {
            Ok(()) => Ok("asked the agent to reset peak statistics".into()),
            Err(e) => Ok(self.request_failed("reset peaks", e)),
        }
    }

    fn save(&mut self, _state: &State, dir: &Path) -> anyhow::Result<PathBuf> {
        if let Some(since) = self.stalled_since {
            anyhow::bail!(
                "the agent has sent nothing for {} s (is its process stopped?): no snapshot to \
                 save",
                since.elapsed().as_secs()
            );
        }
        let Some(c) = &mut self.client else {
            anyhow::bail!("not connected to the agent now (reconnecting)");
        };
        let got = c.request_snapshot().and_then(|()| {
            let deadline = Instant::now() + SAVE_TIMEOUT;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(None);
                }
                match c.next_update(left) {
                    Ok(ClientUpdate::Snapshot(s)) => return Ok(Some((s, c.process().0))),
                    Ok(_) | Err(ClientError::Timeout) => {}
                    Err(e) => return Err(e),
                }
            }
        });
        let (s, pid) = match got {
            Ok(Some(got)) => got,
            Ok(None) => anyhow::bail!(
                "the agent sent no snapshot within {} s",
                SAVE_TIMEOUT.as_secs()
            ),
            Err(e) => {
                let msg = self.request_failed("take a snapshot", e);
                anyhow::bail!(msg);
            }
        };
        self.saved += 1;
        let path = fresh_path(
            dir,
            &format!("allocview-attach-{pid}-{}", self.saved),
            FileFormat::Pickle.extension(),
        );
        snapshot_file::save(&path, &s, FileFormat::Pickle)?;
        self.frames = Some(SnapshotFrames::new(&s));
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reconnect_line_leads_with_why_the_connection_ended() {
        let shutdown =
            ClientError::Disconnected(allocview_agent::protocol::SHUTDOWN_GOODBYE.to_string());
        assert_eq!(
            ended_why(&shutdown),
            "the process ended (its agent shut down)"
        );
        assert!(ended_why(&ClientError::ConnectionLost).contains("did the process die?"));
        assert_eq!(
            ended_why(&ClientError::Disconnected("client queue full".into())),
            "the agent let this dashboard go: client queue full"
        );
        // Nobody listening yet is what the retries wait for: not repeated on the line.
        let refused = ClientError::Connect {
            addr: "127.0.0.1:7070".into(),
            error: std::io::ErrorKind::ConnectionRefused.into(),
        };
        assert_eq!(retry_detail(&refused), "");
        assert_eq!(
            retry_detail(&ClientError::StaleSocket("/x.sock".into())),
            ""
        );
        let token = ClientError::Refused("wrong token".into());
        assert_eq!(retry_detail(&token), ": the agent refused: wrong token");
    }

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
