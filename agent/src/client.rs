//! [`AttachClient`]: the dashboard's end of the attach protocol. It connects, says hello, and
//! keeps a local [`AgentState`] up to date by applying the agent's updates.
//!
//! A reader thread decodes frames into a channel, so [`AttachClient::next_update`] can wait
//! with a timeout without ever cutting a frame in half.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use allocview_agent::client::{AttachClient, find_sockets};
//!
//! let sock = find_sockets().sockets.into_iter().next().expect("no agent running");
//! let mut client = AttachClient::connect(&format!("unix:{}", sock.display()), None)?;
//! loop {
//!     client.next_update(Duration::from_millis(500))?;
//!     println!("{} devices", client.state().devices.len());
//! }
//! # Ok::<(), allocview_agent::client::ClientError>(())
//! ```

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

use allocview_alloc::snapshot::Snapshot;
use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::protocol::{
    self, ClientFrame, MAGIC, MAX_SERVER_FRAME, PROTOCOL_VERSION, ProtocolError, SHUTDOWN_GOODBYE,
    ServerFrame,
};
use crate::server::{
    BadAddress, Conn, ListenAddr, ReadBefore, SocketProbe, default_socket_pid, probe_unix_socket,
};
use crate::state::AgentState;

pub use crate::server::default_socket_dir;

/// How long the agent has to answer the hello.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Frames decoded ahead of the caller before the reader waits.
const READ_AHEAD: usize = 256;

/// Why attaching failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address could not be parsed.
    #[error(transparent)]
    BadAddress(#[from] BadAddress),
    /// The connection could not be made.
    #[error("cannot connect to {addr}: {error}")]
    Connect {
        /// The address.
        addr: String,
        /// Why (not a `source`: the message already says it, and a chain would say it twice).
        error: io::Error,
    },
    /// The unix address names something that is not a socket (a regular file, a folder).
    #[error("cannot connect to unix:{}: it is not a socket", .0.display())]
    NotASocket(PathBuf),
    /// The unix socket exists but nobody listens on it: the agent that made it is gone
    /// (its process was killed or crashed before it could remove the socket).
    #[error(
        "cannot connect to unix:{}: nobody is listening there (a socket left behind by a \
         process that died? start it again, or attach to another address)",
        .0.display()
    )]
    StaleSocket(PathBuf),
    /// A frame could not be read or written.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// The peer is not an allocview agent.
    #[error("{0} is not an allocview agent")]
    NotAnAgent(String),
    /// The agent speaks another protocol version.
    #[error("protocol version mismatch: agent speaks {agent}, this client {client}")]
    VersionMismatch {
        /// The agent's version.
        agent: u32,
        /// Ours.
        client: u32,
    },
    /// The agent refused the connection or a request (wrong token, bad frame, ...).
    #[error("the agent refused: {0}")]
    Refused(String),
    /// The agent said goodbye and closed the connection: [`SHUTDOWN_GOODBYE`] when it shut down
    /// (see [`ClientError::is_agent_shutdown`]), else why it let this client go.
    #[error("disconnected: {0}")]
    Disconnected(String),
    /// The connection closed without a goodbye: the agent's process died (killed, crashed) or
    /// something between broke the connection.
    #[error("connection lost: closed without a goodbye from the agent (did its process die?)")]
    ConnectionLost,
    /// Nothing arrived within the timeout.
    #[error("no update within the timeout")]
    Timeout,
    /// The peer accepted the connection but did not answer within [`CONNECT_TIMEOUT`].
    #[error(
        "{addr} did not answer within {} s (is it an allocview agent, or is the process stopped?)",
        CONNECT_TIMEOUT.as_secs()
    )]
    Silent {
        /// The address.
        addr: String,
    },
}

impl ClientError {
    /// Whether the agent ended the connection because it shut down (a clean end, not a crash
    /// or a disconnection of this client).
    pub fn is_agent_shutdown(&self) -> bool {
        matches!(self, ClientError::Disconnected(reason) if reason == SHUTDOWN_GOODBYE)
    }
}

/// What [`AttachClient::next_update`] received.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientUpdate {
    /// The whole state was replaced (at connect or after a resume).
    Full,
    /// Changes were applied to the state.
    Update,
    /// A snapshot asked for with [`AttachClient::request_snapshot`].
    Snapshot(Box<Snapshot>),
    /// A request was carried out.
    Ack(String),
    /// The agent reported a problem that does not end the connection.
    Error(String),
}

/// A connection to an agent.
pub struct AttachClient {
    addr: ListenAddr,
    out: Conn,
    frames: Receiver<Result<ServerFrame, ProtocolError>>,
    state: AgentState,
    pid: u32,
    process: String,
    update_interval: Option<Duration>,
}

impl std::fmt::Debug for AttachClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachClient")
            .field("addr", &self.addr)
            .field("pid", &self.pid)
            .finish()
    }
}

impl AttachClient {
    /// Connects to `addr` (`unix:PATH`, a path, or `HOST:PORT`), presenting `token` if given,
    /// and waits for the full state.
    ///
    /// # Errors
    /// A bad address, a failed connection, a peer that is not an agent or speaks another
    /// version, or a refusal (wrong or missing token).
    pub fn connect(addr: &str, token: Option<String>) -> Result<AttachClient, ClientError> {
        let addr: ListenAddr = addr.parse()?;
        let connect_err = |error| ClientError::Connect {
            addr: addr.to_string(),
            error,
        };
        let mut input = match Conn::connect(&addr) {
            Ok(c) => c,
            Err(e) => {
                // Connecting to a regular file is refused like a dead socket; say what it is.
                if let ListenAddr::Unix(p) = &addr {
                    match std::fs::metadata(p) {
                        Ok(m) if !m.file_type().is_socket() => {
                            return Err(ClientError::NotASocket(p.clone()));
                        }
                        Ok(_) if e.kind() == io::ErrorKind::ConnectionRefused => {
                            return Err(ClientError::StaleSocket(p.clone()));
                        }
                        _ => {}
                    }
                }
                return Err(connect_err(e));
            }
        };
        input
            .set_read_timeout(Some(CONNECT_TIMEOUT))
            .map_err(connect_err)?;
        let mut out = input.try_clone().map_err(connect_err)?;
        // The hello within the timeout in all, however the peer splits it.
        let hello = protocol::read_frame::<_, ServerFrame>(
            &mut ReadBefore::new(&mut input, CONNECT_TIMEOUT),
            MAX_SERVER_FRAME,
        );
        input
            .set_read_timeout(Some(CONNECT_TIMEOUT))
            .map_err(connect_err)?;
        let (pid, process, update_interval_ms) = match hello {
            Ok(ServerFrame::Hello {
                magic,
                version,
                pid,
                process,
                update_interval_ms,
                ..
            }) => {
                if magic != MAGIC {
                    return Err(ClientError::NotAnAgent(addr.to_string()));
                }
                if version != PROTOCOL_VERSION {
                    return Err(ClientError::VersionMismatch {
                        agent: version,
                        client: PROTOCOL_VERSION,
                    });
                }
                (pid, process, update_interval_ms)
            }
            // An agent that refuses before its hello (too many connections waiting).
            Ok(ServerFrame::Error { message, .. }) => {
                return Err(ClientError::Refused(message));
            }
            Ok(_) | Err(ProtocolError::Malformed(_)) | Err(ProtocolError::TooLarge { .. }) => {
                return Err(ClientError::NotAnAgent(addr.to_string()));
            }
            Err(e) => return Err(silent_or(e, &addr)),
        };
        protocol::write_frame(
            &mut out,
            &ClientFrame::Hello {
                magic: MAGIC.into(),
                version: PROTOCOL_VERSION,
                token,
            },
        )?;
        let full = protocol::read_frame::<_, ServerFrame>(&mut input, MAX_SERVER_FRAME);
        let state = match full.map_err(|e| silent_or(e, &addr))? {
            ServerFrame::Full { state } => *state,
            ServerFrame::Error { message, .. } => return Err(ClientError::Refused(message)),
            ServerFrame::Goodbye { reason } => return Err(ClientError::Disconnected(reason)),
            other => {
                return Err(ClientError::Refused(format!(
                    "expected the full state, got {other:?}"
                )));
            }
        };
        input.set_read_timeout(None).map_err(connect_err)?;
        let (tx, frames) = crossbeam_channel::bounded(READ_AHEAD);
        thread::Builder::new()
            .name("allocview-attach-reader".into())
            .spawn(move || {
                loop {
                    let r = protocol::read_frame::<_, ServerFrame>(&mut input, MAX_SERVER_FRAME);
                    let end = r.is_err();
                    if tx.send(r).is_err() || end {
                        return;
                    }
                }
            })
            .map_err(connect_err)?;
        Ok(AttachClient {
            addr,
            out,
            frames,
            state,
            pid,
            process,
            update_interval: (update_interval_ms > 0)
                .then(|| Duration::from_millis(update_interval_ms)),
        })
    }

    /// The state as of the last update applied.
    pub fn state(&self) -> &AgentState {
        &self.state
    }

    /// The agent's process id and name.
    pub fn process(&self) -> (u32, &str) {
        (self.pid, &self.process)
    }

    /// How often the agent said it sends updates (its hello's `update_interval_ms`); `None`
    /// from an agent that did not say.
    pub fn update_interval(&self) -> Option<Duration> {
        self.update_interval
    }

    /// Where this client is connected.
    pub fn addr(&self) -> &ListenAddr {
        &self.addr
    }

    /// Waits up to `timeout` for the next frame and applies it.
    ///
    /// # Errors
    /// [`ClientError::Timeout`] when nothing arrived; [`ClientError::Disconnected`] when the
    /// agent said goodbye; [`ClientError::ConnectionLost`] when the connection closed without
    /// one; [`ClientError::Refused`] for a fatal error.
    pub fn next_update(&mut self, timeout: Duration) -> Result<ClientUpdate, ClientError> {
        let frame = match self.frames.recv_timeout(timeout) {
            Ok(Ok(f)) => f,
            Ok(Err(ProtocolError::Closed)) | Err(RecvTimeoutError::Disconnected) => {
                return Err(ClientError::ConnectionLost);
            }
            Ok(Err(e)) => return Err(e.into()),
            Err(RecvTimeoutError::Timeout) => return Err(ClientError::Timeout),
        };
        match frame {
            ServerFrame::Full { state } => {
                let paused = self.state.pipeline.paused;
                self.state = *state;
                self.state.pipeline.paused = paused;
                Ok(ClientUpdate::Full)
            }
            ServerFrame::Update { update } => {
                protocol::apply_update(&mut self.state, &update);
                Ok(ClientUpdate::Update)
            }
            ServerFrame::Snapshot { snapshot } => Ok(ClientUpdate::Snapshot(snapshot)),
            ServerFrame::Ack { request } => Ok(ClientUpdate::Ack(request)),
            ServerFrame::Error { message, fatal } => {
                if fatal {
                    Err(ClientError::Refused(message))
                } else {
                    Ok(ClientUpdate::Error(message))
                }
            }
            ServerFrame::Goodbye { reason } => Err(ClientError::Disconnected(reason)),
            ServerFrame::Hello { .. } => {
                Err(ClientError::Refused("unexpected second hello".into()))
            }
        }
    }

    fn send(&mut self, frame: &ClientFrame) -> Result<(), ClientError> {
        protocol::write_frame(&mut self.out, frame).map_err(ClientError::from)
    }

    /// Asks for a snapshot; it arrives as [`ClientUpdate::Snapshot`].
    ///
    /// # Errors
    /// The connection failed.
    pub fn request_snapshot(&mut self) -> Result<(), ClientError> {
        self.send(&ClientFrame::RequestSnapshot)
    }

    /// Asks the allocator to reset its peak statistics.
    ///
    /// # Errors
    /// The connection failed.
    pub fn reset_peaks(&mut self) -> Result<(), ClientError> {
        self.send(&ClientFrame::ResetPeaks)
    }

    /// Stops (`true`) or resumes (`false`) updates; a resume starts with a full state.
    ///
    /// # Errors
    /// The connection failed.
    pub fn pause(&mut self, paused: bool) -> Result<(), ClientError> {
        self.state.pipeline.paused = paused;
        self.send(&ClientFrame::Pause { paused })
    }
}

/// [`ClientError::Silent`] for a read that timed out while connecting, else the error itself.
fn silent_or(e: ProtocolError, addr: &ListenAddr) -> ClientError {
    if e.is_timeout() {
        ClientError::Silent {
            addr: addr.to_string(),
        }
    } else {
        e.into()
    }
}

impl Drop for AttachClient {
    fn drop(&mut self) {
        self.out.shutdown();
    }
}

/// What a look for agents' sockets in one folder found (see [`find_sockets_in`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketDiscovery {
    /// The folder looked in.
    pub dir: PathBuf,
    /// The live agents' sockets, newest first.
    pub sockets: Vec<PathBuf>,
    /// Stale sockets (nobody listening: their agents died without removing them) that the look
    /// removed.
    pub stale_removed: usize,
    /// Why the folder was not looked in, when it is not private to this user (another user's,
    /// writable by others, a symbolic link): whoever could put a socket there could pose as an
    /// agent and read the token a client presents ([`untrusted_socket_dir`]).
    pub untrusted: Option<String>,
}

impl SocketDiscovery {
    /// `removed 2 stale sockets in DIR` when the look removed any, for the line shown beside
    /// the listing (removing files unannounced would leave a user wondering where they went).
    pub fn stale_note(&self) -> Option<String> {
        (self.stale_removed > 0).then(|| {
            format!(
                "removed {} in {}",
                crate::summary::render::counted(
                    self.stale_removed as u64,
                    "stale socket",
                    "stale sockets"
                ),
                self.dir.display()
            )
        })
    }
}

/// The live agents' sockets in [`default_socket_dir`]: candidates for `allocview --attach`
/// without an address (see [`find_sockets_in`]).
pub fn find_sockets() -> SocketDiscovery {
    find_sockets_in(&default_socket_dir())
}

/// The live agents' sockets in `dir`, newest first, and how many stale ones were removed.
///
/// A `.sock` entry counts when an agent answers on it with its hello, or, when nothing says
/// hello, when it accepts a connection (or fails to in a way that does not prove it dead) and
/// the process its name starts with (`<pid>.sock`, `<pid>-N.sock`) still exists. The hello
/// wins over the name: an agent in another PID namespace (a container sharing the folder)
/// has a pid this process cannot see. A socket whose connection is refused has nobody listening:
/// its agent died without removing it (killed by a signal, say). Such a stale socket is left
/// out and removed, the folder being the agents' own (0700), and counted in
/// [`SocketDiscovery::stale_removed`]; anything else is left alone. A folder that cannot be
/// read holds no sockets.
pub fn find_sockets_in(dir: &Path) -> SocketDiscovery {
    let mut found = SocketDiscovery {
        dir: dir.to_path_buf(),
        ..SocketDiscovery::default()
    };
    if let Some(why) = untrusted_socket_dir(dir) {
        found.untrusted = Some(why);
        return found;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    let mut socks: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for p in entries.flatten().map(|e| e.path()) {
        if p.extension().is_none_or(|x| x != "sock") {
            continue;
        }
        match liveness(&p) {
            Liveness::Live => {
                let t = std::fs::metadata(&p)
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                socks.push((t, p));
            }
            Liveness::StaleRemoved => found.stale_removed += 1,
            Liveness::Other => {}
        }
    }
    socks.sort_by(|a, b| b.cmp(a));
    found.sockets = socks.into_iter().map(|(_, p)| p).collect();
    found
}

/// Why `dir` (a folder of agents' sockets) is not private to this user, or `None` when it is
/// (or does not exist). The agent makes its default folder ours with mode 0700 and refuses
/// one of another user; a client must not trust one either: a socket in a folder someone else
/// owns or can write to may be theirs, posing as an agent to read the client's token.
pub fn untrusted_socket_dir(dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::symlink_metadata(dir).ok()?;
    let what = if meta.file_type().is_symlink() {
        "is a symbolic link".to_string()
    } else if !meta.is_dir() {
        "is not a folder".to_string()
    } else if let Some(me) = crate::server::current_uid().filter(|&me| me != meta.uid()) {
        format!("belongs to another user (uid {}, you are {me})", meta.uid())
    } else if meta.mode() & GROUP_OTHER_WRITE != 0 {
        format!(
            "is writable by other users (mode {:o}, expected 700)",
            meta.mode() & 0o7777
        )
    } else {
        return None;
    };
    Some(format!(
        "not looking for agents in {}: it {what}, so a socket there may not be an agent's; \
         remove it (an agent makes it again, private) or give the address (allocview --attach \
         unix:PATH)",
        dir.display()
    ))
}

/// Mode bits that let users other than the owner add files to a folder.
const GROUP_OTHER_WRITE: u32 = 0o022;

/// What [`liveness`] makes of a `.sock` entry.
enum Liveness {
    /// An agent listens there.
    Live,
    /// Nobody listens; the socket was removed.
    StaleRemoved,
    /// Not an agent's (gone already, not a socket, a stale one some other process removed).
    Other,
}

/// Whether `path` is a socket an agent listens on (one of this user's); a stale one
/// (connection refused) is removed.
fn liveness(path: &Path) -> Liveness {
    // Another user's socket in our folder (put there before the folder was made private) may
    // pose as an agent: never connected to, never removed.
    use std::os::unix::fs::MetadataExt as _;
    let owner = std::fs::symlink_metadata(path).map(|m| m.uid());
    if let (Ok(owner), Some(me)) = (owner, crate::server::current_uid())
        && owner != me
    {
        return Liveness::Other;
    }
    let pid_alive = || default_socket_pid(path).map(process_exists) != Some(false);
    let live = |yes: bool| if yes { Liveness::Live } else { Liveness::Other };
    match probe_unix_socket(path) {
        // An agent said hello: live, even when its name's pid is not one this process can
        // see (an agent in another PID namespace, a container sharing the folder).
        SocketProbe::Live => Liveness::Live,
        SocketProbe::Silent | SocketProbe::Busy | SocketProbe::Failed(_) => live(pid_alive()),
        SocketProbe::Stale { removed: true } => Liveness::StaleRemoved,
        SocketProbe::Absent | SocketProbe::NotASocket | SocketProbe::Stale { removed: false } => {
            Liveness::Other
        }
    }
}

/// Whether process `pid` exists (true where `/proc` cannot tell).
fn process_exists(pid: u32) -> bool {
    !Path::new("/proc/self").exists() || Path::new("/proc").join(pid.to_string()).exists()
}
