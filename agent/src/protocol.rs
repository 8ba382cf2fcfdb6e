//! The attach protocol: every frame the agent and its clients exchange, and the framing. This
//! module is the one definition of the wire format (`docs/protocol.md` describes it; the
//! round-trip test in `tests/attach.rs` fails when the two drift).
//!
//! Framing: each frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON
//! (one [`ServerFrame`] or [`ClientFrame`], internally tagged by `"type"`). A length above the
//! receiver's limit is refused before anything is allocated.
//!
//! Conversation: both sides send a hello first ([`ServerFrame::Hello`],
//! [`ClientFrame::Hello`]) carrying [`MAGIC`] and [`PROTOCOL_VERSION`]; a mismatch (or a missing
//! or wrong token where the agent requires one) is answered with [`ServerFrame::Error`] and the
//! connection closes. Then the agent sends the full state ([`ServerFrame::Full`]) and, at up to
//! 10 Hz, [`ServerFrame::Update`]s carrying only what changed; the client may send requests at
//! any time.

use std::collections::HashSet;
use std::io::{self, Read, Write};

use allocview_alloc::caching::stats::DeviceStats;
use allocview_alloc::snapshot::{SegmentInfo, Snapshot};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::state::{
    AgentState, ContextFrames, DeviceState, Histograms, HostState, OomRecord, PipelineStats,
    PoolUsage, RecentEvent, StreamUsage, UsageSample, keep_oom_record,
};
use crate::timeline;

/// Identifies the protocol in both hellos.
pub const MAGIC: &str = "allocview-attach";

/// The protocol version; both sides must speak the same one.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest frame an agent accepts from a client (requests are small).
pub const MAX_CLIENT_FRAME: u32 = 64 * 1024;

/// Largest frame a client accepts from an agent (a full state or snapshot of a busy device).
pub const MAX_SERVER_FRAME: u32 = 256 * 1024 * 1024;

/// Bytes of the length prefix.
pub const LENGTH_PREFIX: usize = 4;

/// The `goodbye` reason of an agent that shuts down (its process ends or stops the agent): a
/// clean end, which a client can tell from a slow client's disconnection or a connection that
/// drops without a goodbye (the process died).
pub const SHUTDOWN_GOODBYE: &str = "agent shutting down";

/// Recent events a client keeps per device.
pub const CLIENT_RECENT_EVENTS: usize = 1024;

/// A frame the agent sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerFrame {
    /// First frame of every connection.
    Hello {
        /// Always [`MAGIC`].
        magic: String,
        /// The agent's [`PROTOCOL_VERSION`].
        version: u32,
        /// Process id of the agent's process.
        pid: u32,
        /// Name of that process.
        process: String,
        /// Whether the client must send a token.
        token_required: bool,
        /// How often the agent sends an update, in ms: its tick, or
        /// [`MIN_UPDATE_INTERVAL`](crate::aggregator::MIN_UPDATE_INTERVAL) where it ticks
        /// faster (0 from an agent that does not say). A client can tell a stopped process from
        /// a slow-ticking agent from the first update.
        #[serde(default)]
        update_interval_ms: u64,
    },
    /// The whole state (after the hello, and after a resume).
    Full {
        /// The state.
        state: Box<AgentState>,
    },
    /// What changed since the previous update.
    Update {
        /// The changes.
        update: Box<StateUpdate>,
    },
    /// The answer to [`ClientFrame::RequestSnapshot`].
    Snapshot {
        /// The allocator's snapshot (all devices with a provider).
        snapshot: Box<Snapshot>,
    },
    /// A request was carried out.
    Ack {
        /// What was done (`reset_peaks`, `pause`, `resume`).
        request: String,
    },
    /// Something was wrong; the agent closes the connection after this frame when `fatal`.
    Error {
        /// What was wrong.
        message: String,
        /// Whether the connection closes.
        fatal: bool,
    },
    /// The agent closes the connection (slow client, shutdown).
    Goodbye {
        /// Why.
        reason: String,
    },
}

/// A frame a client sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientFrame {
    /// First frame of every connection.
    Hello {
        /// Always [`MAGIC`].
        magic: String,
        /// The client's [`PROTOCOL_VERSION`].
        version: u32,
        /// The token, where the agent requires one.
        token: Option<String>,
    },
    /// Asks for a full snapshot from the allocator.
    RequestSnapshot,
    /// Asks the allocator to reset its peak statistics.
    ResetPeaks,
    /// Stops (`true`) or resumes (`false`) updates; a resume starts with a full state.
    Pause {
        /// Whether updates stop.
        paused: bool,
    },
}

impl ClientFrame {
    /// The frame's `type` on the wire (`hello`, `request_snapshot`, `reset_peaks`, `pause`),
    /// for messages that name a frame as a client's author knows it.
    pub fn wire_name(&self) -> &'static str {
        match self {
            ClientFrame::Hello { .. } => "hello",
            ClientFrame::RequestSnapshot => "request_snapshot",
            ClientFrame::ResetPeaks => "reset_peaks",
            ClientFrame::Pause { .. } => "pause",
        }
    }
}

/// What changed since the previous update.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StateUpdate {
    /// When the update was made, nanoseconds since the Unix epoch.
    pub time_ns: u64,
    /// Pipeline health (always sent).
    pub pipeline: PipelineStats,
    /// Devices with changes.
    pub devices: Vec<DeviceUpdate>,
    /// Host counters, when a host allocator publishes.
    pub host: Option<HostState>,
    /// OOM records new since the last update, or whose dump landed since (replacing the
    /// record of the same index).
    pub new_ooms: Vec<OomRecord>,
}

/// What changed on one device. `None` means unchanged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceUpdate {
    /// Device index.
    pub device: i32,
    /// Total memory, allowed memory.
    pub total_memory: Option<(u64, Option<u64>)>,
    /// New stats.
    pub stats: Option<DeviceStats>,
    /// The whole segment mirror, when its layout changed.
    pub segments: Option<Vec<SegmentInfo>>,
    /// Per-stream usage, when it changed.
    pub streams: Option<Vec<StreamUsage>>,
    /// Per-pool usage, when it changed.
    pub pools: Option<Vec<PoolUsage>>,
    /// Histogram summaries, when anything was recorded.
    pub histograms: Option<Histograms>,
    /// New timeline samples (and the newest window, which may have grown).
    pub timeline: Vec<UsageSample>,
    /// Events not sent before, oldest first.
    pub recent: Vec<RecentEvent>,
    /// The frames of the context ids `recent` uses, by id.
    #[serde(default)]
    pub contexts: Vec<ContextFrames>,
}

/// Applies an update to a client's copy of the state.
///
/// Applying is idempotent for overlapping updates (a full state followed by an update covering
/// part of it): figures are replaced, samples are merged by time, events by sequence number,
/// OOMs by index.
pub fn apply_update(state: &mut AgentState, update: &StateUpdate) {
    state.time_ns = update.time_ns;
    let paused = state.pipeline.paused;
    state.pipeline = update.pipeline.clone();
    state.pipeline.paused = paused;
    if update.host.is_some() {
        state.host = update.host;
    }
    for o in &update.new_ooms {
        keep_oom_record(&mut state.ooms, o.clone());
    }
    for u in &update.devices {
        let d = match state.devices.iter().position(|d| d.device == u.device) {
            Some(i) => &mut state.devices[i],
            None => {
                state.devices.push(DeviceState {
                    device: u.device,
                    ..DeviceState::default()
                });
                state.devices.sort_by_key(|d| d.device);
                let i = state
                    .devices
                    .iter()
                    .position(|d| d.device == u.device)
                    .expect("just inserted");
                &mut state.devices[i]
            }
        };
        if let Some((total, allowed)) = u.total_memory {
            d.total_memory = total;
            d.allowed_memory = allowed;
        }
        if let Some(s) = &u.stats {
            d.stats = s.clone();
        }
        if let Some(s) = &u.segments {
            d.segments = s.clone();
        }
        if let Some(s) = &u.streams {
            d.streams = s.clone();
        }
        if let Some(p) = &u.pools {
            d.pools = p.clone();
        }
        if let Some(h) = &u.histograms {
            d.histograms = h.clone();
        }
        timeline::merge_samples(&mut d.timeline, &u.timeline);
        let last = d.recent.last().map(|e| e.seq);
        d.recent.extend(
            u.recent
                .iter()
                .filter(|e| last.is_none_or(|l| e.seq > l))
                .cloned(),
        );
        if d.recent.len() > CLIENT_RECENT_EVENTS {
            let excess = d.recent.len() - CLIENT_RECENT_EVENTS;
            d.recent.drain(..excess);
        }
        merge_contexts(&mut d.contexts, &u.contexts, &d.recent);
    }
}

/// Adds `new` to a device's `contexts` (replacing equal ids) and keeps only the ids `recent`
/// still uses, sorted by id.
fn merge_contexts(
    contexts: &mut Vec<ContextFrames>,
    new: &[ContextFrames],
    recent: &[RecentEvent],
) {
    if new.is_empty() && contexts.is_empty() {
        return;
    }
    let used: HashSet<u32> = recent.iter().map(|e| e.context).collect();
    let replaced: HashSet<u32> = new.iter().map(|c| c.id).collect();
    contexts.retain(|c| used.contains(&c.id) && !replaced.contains(&c.id));
    contexts.extend(new.iter().filter(|c| used.contains(&c.id)).cloned());
    contexts.sort_by_key(|c| c.id);
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The connection failed or closed.
    ///
    /// Not a `source`: the message already says it, and a chain would say it twice.
    #[error("connection error: {0}")]
    Io(io::Error),
    /// The peer closed the connection between frames.
    #[error("connection closed")]
    Closed,
    /// The length prefix exceeds the limit.
    #[error("frame of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The announced length.
        len: u32,
        /// The limit.
        limit: u32,
    },
    /// The payload is not a frame of this protocol.
    #[error("malformed frame: {0}")]
    Malformed(String),
}

impl ProtocolError {
    /// Whether the read timed out (the peer said nothing in time), as opposed to failing.
    pub fn is_timeout(&self) -> bool {
        matches!(self, ProtocolError::Io(io)
            if matches!(io.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }
}

impl From<io::Error> for ProtocolError {
    fn from(error: io::Error) -> ProtocolError {
        ProtocolError::Io(error)
    }
}

/// Encodes one frame: the length prefix and the JSON payload.
///
/// # Errors
/// [`ProtocolError::TooLarge`] for a frame beyond `u32::MAX` bytes, [`ProtocolError::Malformed`]
/// when the value cannot be serialised.
pub fn encode_frame<T: Serialize>(frame: &T) -> Result<Vec<u8>, ProtocolError> {
    let mut buf = vec![0u8; LENGTH_PREFIX];
    serde_json::to_writer(&mut buf, frame).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    let len = u32::try_from(buf.len() - LENGTH_PREFIX).map_err(|_| ProtocolError::TooLarge {
        len: u32::MAX,
        limit: u32::MAX,
    })?;
    buf[..LENGTH_PREFIX].copy_from_slice(&len.to_be_bytes());
    Ok(buf)
}

/// Writes one frame.
///
/// # Errors
/// I/O errors, and [`ProtocolError::TooLarge`] for a frame beyond `u32::MAX` bytes.
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, frame: &T) -> Result<(), ProtocolError> {
    let buf = encode_frame(frame)?;
    w.write_all(&buf)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame of at most `limit` bytes.
///
/// # Errors
/// [`ProtocolError::Closed`] at a clean end of stream, [`ProtocolError::TooLarge`] before
/// reading an oversized payload, [`ProtocolError::Malformed`] for bytes that are not a frame.
pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R, limit: u32) -> Result<T, ProtocolError> {
    let mut len = [0u8; LENGTH_PREFIX];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(ProtocolError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len);
    if len > limit {
        return Err(ProtocolError::TooLarge { len, limit });
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body).map_err(|e| ProtocolError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_length_is_refused_before_reading_the_payload() {
        let mut bytes = (MAX_CLIENT_FRAME + 1).to_be_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        let err = read_frame::<_, ClientFrame>(&mut &bytes[..], MAX_CLIENT_FRAME).unwrap_err();
        assert!(matches!(err, ProtocolError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn garbage_is_a_malformed_frame_and_eof_is_closed() {
        let mut bytes = 5u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(b"hello");
        let err = read_frame::<_, ClientFrame>(&mut &bytes[..], MAX_CLIENT_FRAME).unwrap_err();
        assert!(matches!(err, ProtocolError::Malformed(_)), "{err}");
        let err = read_frame::<_, ClientFrame>(&mut &[][..], MAX_CLIENT_FRAME).unwrap_err();
        assert!(matches!(err, ProtocolError::Closed), "{err}");
    }
}
