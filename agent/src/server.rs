//! The attach server: a unix socket (or loopback TCP) that dashboards connect to.
//!
//! One accept thread; per client a reader thread (hello, then requests) and a writer thread
//! that drains the client's bounded queue. The aggregator only `try_send`s encoded frames to
//! that queue and disconnects a client whose queue is full, so a slow or stuck client never
//! slows the aggregator, let alone the allocator. Frames are defined in [`crate::protocol`].
//!
//! Security: the default unix socket lives in a per-user folder created with mode 0700
//! (`$XDG_RUNTIME_DIR/allocview`, else `/tmp/allocview-<uid>`), and the socket itself gets mode
//! 0600. TCP listens on loopback unless a token is configured; a listener on any other address
//! without a token is refused at start. With a token, every client must present it in its hello.
//!
//! Every client refused (over the hello cap, no hello in time, a bad hello, version or token,
//! an oversize frame, a bad request) is counted per [`RefusalReason`], in the pipeline stats
//! and in `/metrics` (`allocview_attach_refused_total{reason}`).

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use allocview_alloc::snapshot::Snapshot;

use crate::agent_thread;
use crate::aggregator::{AggregatorHandle, ClientControl, ClientSlot, Command, Encoded};
use crate::protocol::{
    self, ClientFrame, MAGIC, MAX_CLIENT_FRAME, PROTOCOL_VERSION, ProtocolError, ServerFrame,
};
use crate::state::ProcessInfo;

/// Mode of the folder holding default sockets: owner only.
pub const SOCKET_DIR_MODE: u32 = 0o700;

/// Mode of a socket file: owner read/write only.
pub const SOCKET_MODE: u32 = 0o600;

/// Environment variable naming the address to listen on (and, for clients, to attach to).
pub const ADDR_ENV: &str = "ALLOCVIEW_ADDR";

/// Environment variable holding the token clients must present.
pub const TOKEN_ENV: &str = "ALLOCVIEW_TOKEN";

/// Frames queued per client before it counts as too slow and is disconnected (at 10 Hz, 6.4 s
/// of updates).
pub const DEFAULT_CLIENT_QUEUE: usize = 64;

/// How long one frame may take to write before the client is dropped.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a client has to send its hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections accepted and not yet past their hello, at most. Each has a thread of its own
/// until it sends its hello or [`HELLO_TIMEOUT`] passes, so connections that never speak (a
/// port scanner, a stuck client, a flood) would otherwise cost a thread and two descriptors
/// each. Over the cap, the newest connection gets a fatal error frame (in place of the
/// agent's hello) and is closed at once; a `tracing` warning says so, and the refusal is
/// counted ([`RefusalReason::HelloCap`]).
pub const MAX_AWAITING_HELLO: usize = 64;

/// Clients attached (past their hello) at most. Each costs two threads and a queue of
/// frames the aggregator fills every tick, and any local user may connect to a loopback TCP
/// listener without a token, so their number is bounded too: a client over the cap gets a
/// fatal error frame in place of the full state and is closed ([`RefusalReason::ClientCap`]).
pub const MAX_CLIENTS: usize = 64;

/// Why the attach server refused a client: the `reason` label of the refusal counter
/// (`allocview_attach_refused_total`) and the key of
/// [`PipelineStats::refused_clients`](crate::state::PipelineStats::refused_clients).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// Over [`MAX_AWAITING_HELLO`] connections were already waiting for their hello.
    HelloCap,
    /// Over [`MAX_CLIENTS`] clients were already attached.
    ClientCap,
    /// No hello within [`HELLO_TIMEOUT`].
    HelloTimeout,
    /// The first frame was not an allocview client's hello (another frame, a wrong magic, not
    /// a frame of the protocol at all).
    BadHello,
    /// The client speaks another protocol version.
    Version,
    /// A token was required and missing, or wrong.
    Token,
    /// A frame over the size limit (before or after the hello).
    OversizeFrame,
    /// After the hello, a request that is not one (malformed, a second hello).
    BadRequest,
}

impl RefusalReason {
    /// Every reason, in the order metrics and state list them.
    pub const ALL: [RefusalReason; 8] = [
        RefusalReason::HelloCap,
        RefusalReason::ClientCap,
        RefusalReason::HelloTimeout,
        RefusalReason::BadHello,
        RefusalReason::Version,
        RefusalReason::Token,
        RefusalReason::OversizeFrame,
        RefusalReason::BadRequest,
    ];

    /// The label value (`hello_cap`, `hello_timeout`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::HelloCap => "hello_cap",
            RefusalReason::ClientCap => "client_cap",
            RefusalReason::HelloTimeout => "hello_timeout",
            RefusalReason::BadHello => "bad_hello",
            RefusalReason::Version => "version",
            RefusalReason::Token => "token",
            RefusalReason::OversizeFrame => "oversize_frame",
            RefusalReason::BadRequest => "bad_request",
        }
    }

    /// Why a frame could not be read: a timeout ([`HelloTimeout`](Self::HelloTimeout)) or an
    /// oversize frame, else `otherwise`.
    fn of_error(e: &ProtocolError, otherwise: RefusalReason) -> RefusalReason {
        match e {
            e if e.is_timeout() => RefusalReason::HelloTimeout,
            ProtocolError::TooLarge { .. } => RefusalReason::OversizeFrame,
            _ => otherwise,
        }
    }
}

/// Clients refused, per [`RefusalReason`]: counted by the server's threads (relaxed atomics, no
/// lock), read by the aggregator into [`PipelineStats`](crate::state::PipelineStats).
#[derive(Debug, Default)]
pub(crate) struct RefusalCounts([AtomicU64; RefusalReason::ALL.len()]);

impl RefusalCounts {
    /// Counts one refusal.
    pub(crate) fn count(&self, why: RefusalReason) {
        self.0[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The reasons with refusals, and how many, in [`RefusalReason::ALL`]'s order.
    pub(crate) fn nonzero(&self) -> Vec<(String, u64)> {
        RefusalReason::ALL
            .iter()
            .map(|r| {
                (
                    r.as_str().to_string(),
                    self.0[*r as usize].load(Ordering::Relaxed),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// How long the accept thread may spend telling a connection over [`MAX_AWAITING_HELLO`]
/// why it is refused (a fresh connection's send buffer takes the frame at once).
const REFUSE_WRITE_TIMEOUT: Duration = Duration::from_millis(100);

/// How often a writer thread checks whether its client was disconnected.
const WRITER_POLL: Duration = Duration::from_millis(50);

/// How long [`Server::stop`] waits for clients' last update and goodbye to go out before it
/// closes their connections.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ListenAddr {
    /// A unix socket at this path.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(SocketAddr),
}

/// An address string that is not `unix:PATH`, a path, or `HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad attach address {addr:?}: {why}")]
pub struct BadAddress {
    /// The address as given.
    pub addr: String,
    /// What is wrong with it.
    pub why: String,
}

/// What [`BadAddress`] says of an address whose form is not recognised.
const ADDRESS_FORMS: &str = "expected unix:PATH, a path, or HOST:PORT";

impl BadAddress {
    fn new(addr: &str, why: impl Into<String>) -> BadAddress {
        BadAddress {
            addr: addr.into(),
            why: why.into(),
        }
    }

    /// Why `HOST:PORT`-like text `s` is not an address: its port, its host, or its form.
    fn of_tcp(addr: &str, s: &str) -> BadAddress {
        let Some((host, port)) = s.rsplit_once(':') else {
            return BadAddress::new(addr, ADDRESS_FORMS);
        };
        if host.is_empty() {
            return BadAddress::new(
                addr,
                format!("no host before :{port} (for example 127.0.0.1:{port})"),
            );
        }
        match port.parse::<u64>() {
            Ok(p) if p > u64::from(u16::MAX) => BadAddress::new(
                addr,
                format!("port {p} is out of range (0 to {})", u16::MAX),
            ),
            Ok(_) => BadAddress::new(addr, format!("cannot resolve the host {host:?}")),
            Err(_) => BadAddress::new(
                addr,
                format!("the port {port:?} is not a number ({ADDRESS_FORMS})"),
            ),
        }
    }
}

impl FromStr for ListenAddr {
    type Err = BadAddress;

    fn from_str(s: &str) -> Result<ListenAddr, BadAddress> {
        let s = s.trim();
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(BadAddress::new(s, "no path after unix:"));
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        if s.contains('/') || s.ends_with(".sock") {
            return Ok(ListenAddr::Unix(PathBuf::from(s)));
        }
        let s_tcp = s.strip_prefix("tcp:").unwrap_or(s);
        resolve_tcp(s, s_tcp).map(|addrs| ListenAddr::Tcp(addrs[0]))
    }
}

/// The addresses `HOST:PORT` text `s` names, in the resolver's order (never none): an IP
/// address and port as written, or the addresses a host name resolves to. Else a
/// [`BadAddress`] for `addr` (the text as given) saying why: its port, its host, or its form.
pub(crate) fn resolve_tcp(addr: &str, s: &str) -> Result<Vec<SocketAddr>, BadAddress> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    let addrs: Vec<SocketAddr> = s
        .to_socket_addrs()
        .map(Iterator::collect)
        .unwrap_or_default();
    if addrs.is_empty() {
        return Err(BadAddress::of_tcp(addr, s));
    }
    Ok(addrs)
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "{a}"),
        }
    }
}

/// The user id of this process (the owner of `/proc/self`), without unsafe code.
pub(crate) fn current_uid() -> Option<u32> {
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// The folder for default sockets: `$XDG_RUNTIME_DIR/allocview`, else `/tmp/allocview-<uid>`.
pub fn default_socket_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d).join("allocview"),
        None => {
            let uid = current_uid().map_or_else(|| "unknown".to_string(), |u| u.to_string());
            std::env::temp_dir().join(format!("allocview-{uid}"))
        }
    }
}

/// What to do about a default socket folder that cannot be used.
const UNTRUSTED_DIR_ADVICE: &str =
    "remove it (the agent then makes it, private), or choose the address with ALLOCVIEW_ADDR";

/// Creates (or checks) a private folder: ours, mode 0700.
pub(crate) fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(SOCKET_DIR_MODE).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::DirBuilder::new()
                .mode(SOCKET_DIR_MODE)
                .create(dir)?;
        }
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.file_type().is_symlink() {
        return Err(io::Error::other(format!(
            "{} is a symbolic link, which an agent does not follow for its sockets: {}",
            dir.display(),
            UNTRUSTED_DIR_ADVICE
        )));
    }
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} exists and is not a folder: {}",
            dir.display(),
            UNTRUSTED_DIR_ADVICE
        )));
    }
    if let Some(me) = current_uid().filter(|&u| u != meta.uid()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} belongs to another user (uid {}, this process runs as {me}), who could \
                 read or replace the sockets in it: {}",
                dir.display(),
                meta.uid(),
                UNTRUSTED_DIR_ADVICE
            ),
        ));
    }
    if meta.mode() & 0o777 != SOCKET_DIR_MODE {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(SOCKET_DIR_MODE))?;
    }
    Ok(())
}

/// A connected client socket.
#[derive(Debug)]
pub(crate) enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    pub(crate) fn try_clone(&self) -> io::Result<Conn> {
        Ok(match self {
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
        })
    }

    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Conn::Unix(s) => s.shutdown(Shutdown::Both),
            Conn::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Conn::Unix(s) => s.set_read_timeout(t),
            Conn::Tcp(s) => s.set_read_timeout(t),
        }
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Conn::Unix(s) => s.set_write_timeout(t),
            Conn::Tcp(s) => s.set_write_timeout(t),
        }
    }

    /// Connects to an address.
    pub(crate) fn connect(addr: &ListenAddr) -> io::Result<Conn> {
        Ok(match addr {
            ListenAddr::Unix(p) => Conn::Unix(UnixStream::connect(p)?),
            ListenAddr::Tcp(a) => {
                let s = TcpStream::connect(a)?;
                let _ = s.set_nodelay(true);
                Conn::Tcp(s)
            }
        })
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(buf),
            Conn::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Unix(s) => s.flush(),
            Conn::Tcp(s) => s.flush(),
        }
    }
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    fn accept(&self) -> io::Result<Conn> {
        match self {
            Listener::Unix(l) => l.accept().map(|(s, _)| Conn::Unix(s)),
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Conn::Tcp(s)
            }),
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A non-loopback TCP address without a token.
    #[error(
        "refusing to listen on {0} without a token: set ALLOCVIEW_TOKEN (or the builder's token) or listen on loopback"
    )]
    TokenRequired(SocketAddr),
    /// Another live agent listens at this unix socket.
    #[error("{0} is in use by a live agent")]
    InUse(PathBuf),
    /// The unix socket path names something other than a socket, which is left alone.
    #[error("cannot listen on {0}: a file that is not a socket is there (choose another path)")]
    NotASocket(PathBuf),
    /// Creating the folder or binding failed.
    #[error("cannot listen on {addr}: {error}")]
    Io {
        /// The address.
        addr: String,
        /// Why.
        error: io::Error,
    },
}

// The messages above already include the OS error's text, so it is not exposed as `source`
// (a reporter walking the chain, such as anyhow's `{:#}`, would print it twice).

/// What the server needs besides the aggregator.
pub(crate) struct ServerConfig {
    pub token: Option<String>,
    pub client_queue: usize,
    pub write_timeout: Duration,
    pub process: ProcessInfo,
    /// How often clients get an update (said in the hello).
    pub update_interval: Duration,
    pub snapshot: Arc<dyn Fn() -> Snapshot + Send + Sync>,
    pub reset_peaks: Arc<dyn Fn() + Send + Sync>,
}

/// The connections being served, with the thread serving each.
type ClientThreads = Arc<Mutex<Vec<(Conn, JoinHandle<()>)>>>;

/// A running attach server.
pub(crate) struct Server {
    addr: ListenAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    remove_on_drop: Option<PathBuf>,
    clients: ClientThreads,
}

fn io_err(addr: impl fmt::Display) -> impl FnOnce(io::Error) -> ServerError {
    let addr = addr.to_string();
    move |error| ServerError::Io { addr, error }
}

/// What a probe found at a unix socket path.
#[derive(Debug)]
pub(crate) enum SocketProbe {
    /// Nothing there.
    Absent,
    /// Something other than a socket (a user's file named by mistake): not ours to touch.
    NotASocket,
    /// An agent listens: its hello was read.
    Live,
    /// Something accepted the connection but sent no agent's hello in time (a process that
    /// inherited the listener, or an agent too busy to answer).
    Silent,
    /// An agent listens there, busy (its backlog is full).
    Busy,
    /// Nobody listens (refused): the socket outlived its agent, killed by a signal, say. It
    /// was removed (`removed`) if it was still the socket probed and removing it worked.
    Stale {
        /// Whether this probe removed the socket file.
        removed: bool,
    },
    /// The probe failed otherwise.
    Failed(io::Error),
}

/// How long a probe waits for a live agent's hello before hanging up.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// Largest hello a probe reads (an agent's is a few hundred bytes: its process name is the
/// longest part).
const PROBE_FRAME_LIMIT: u32 = 64 * 1024;

/// Probes `path` (see [`SocketProbe`]); removes a stale socket.
pub(crate) fn probe_unix_socket(path: &Path) -> SocketProbe {
    let before = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return SocketProbe::Absent,
        Err(e) => return SocketProbe::Failed(e),
    };
    if !before.file_type().is_socket() {
        return SocketProbe::NotASocket;
    }
    match UnixStream::connect(path) {
        Ok(mut s) => {
            // Wait for the hello (the agent writes it at once) before hanging up, so the
            // agent never writes to a connection already closed.
            let _ = s.set_read_timeout(Some(PROBE_TIMEOUT));
            match protocol::read_frame::<_, ServerFrame>(&mut s, PROBE_FRAME_LIMIT) {
                Ok(ServerFrame::Hello { magic, .. }) if magic == MAGIC => SocketProbe::Live,
                _ => SocketProbe::Silent,
            }
        }
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            // Remove it only if it is still the socket found above (an agent starting now
            // replaces it with its own).
            let same = std::fs::symlink_metadata(path)
                .is_ok_and(|now| now.dev() == before.dev() && now.ino() == before.ino());
            SocketProbe::Stale {
                removed: same && std::fs::remove_file(path).is_ok(),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => SocketProbe::Absent,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => SocketProbe::Busy,
        Err(e) => SocketProbe::Failed(e),
    }
}

/// Binds a unix socket, replacing a stale one; `Ok(None)` when a live agent holds the path.
fn bind_unix(path: &Path) -> Result<Option<UnixListener>, ServerError> {
    match probe_unix_socket(path) {
        SocketProbe::Absent | SocketProbe::Stale { .. } => {}
        // Only a stale socket is ours to replace: anything else at the path (a typo in
        // ALLOCVIEW_ADDR naming a user's file) is left alone.
        SocketProbe::NotASocket => return Err(ServerError::NotASocket(path.to_path_buf())),
        SocketProbe::Live | SocketProbe::Silent | SocketProbe::Busy => return Ok(None),
        SocketProbe::Failed(e) => return Err(io_err(path.display())(e)),
    }
    let l = UnixListener::bind(path).map_err(io_err(path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(io_err(path.display()))?;
    Ok(Some(l))
}

/// The name of a default socket: `<pid>.sock`, or `<pid>-N.sock` for the process's `n`th
/// agent.
fn default_socket_name(pid: u32, n: u32) -> String {
    if n == 1 {
        format!("{pid}.sock")
    } else {
        format!("{pid}-{n}.sock")
    }
}

/// The pid a [`default_socket_name`] starts with.
pub(crate) fn default_socket_pid(path: &Path) -> Option<u32> {
    let stem = path.file_stem()?.to_str()?;
    stem.split('-').next()?.parse().ok()
}

/// The default socket path for this process (`<pid>.sock`, or `<pid>-N.sock` when another
/// agent of the same process already listens).
fn bind_default(pid: u32) -> Result<(PathBuf, UnixListener), ServerError> {
    let dir = default_socket_dir();
    ensure_private_dir(&dir).map_err(io_err(dir.display()))?;
    for n in 1.. {
        let path = dir.join(default_socket_name(pid, n));
        if let Some(l) = bind_unix(&path)? {
            return Ok((path, l));
        }
    }
    unreachable!("the loop only ends by returning")
}

impl Server {
    /// Starts listening (`None`: the default unix socket).
    pub(crate) fn start(
        addr: Option<ListenAddr>,
        cfg: ServerConfig,
        agg: AggregatorHandle,
    ) -> Result<Server, ServerError> {
        let (addr, listener, remove) = match addr {
            None => {
                let (path, l) = bind_default(cfg.process.pid)?;
                (
                    ListenAddr::Unix(path.clone()),
                    Listener::Unix(l),
                    Some(path),
                )
            }
            Some(ListenAddr::Unix(path)) => match bind_unix(&path)? {
                Some(l) => (
                    ListenAddr::Unix(path.clone()),
                    Listener::Unix(l),
                    Some(path),
                ),
                None => return Err(ServerError::InUse(path)),
            },
            Some(ListenAddr::Tcp(a)) => {
                if !a.ip().is_loopback() && cfg.token.is_none() {
                    return Err(ServerError::TokenRequired(a));
                }
                let l = TcpListener::bind(a).map_err(io_err(a))?;
                let bound = l.local_addr().map_err(io_err(a))?;
                (ListenAddr::Tcp(bound), Listener::Tcp(l), None)
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let clients = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let stop = stop.clone();
            let clients = clients.clone();
            let cfg = Arc::new(cfg);
            agent_thread::spawn("allocview-accept", move || {
                accept_loop(listener, stop, cfg, agg, clients)
            })
            .map_err(io_err(&addr))?
        };
        tracing::info!(%addr, "allocview agent listening");
        Ok(Server {
            addr,
            stop,
            accept: Some(accept),
            remove_on_drop: remove,
            clients,
        })
    }

    /// Where the server listens (a TCP port of 0 resolved to the real one).
    pub(crate) fn addr(&self) -> &ListenAddr {
        &self.addr
    }

    /// Stops accepting, closes every client and removes the socket file.
    pub(crate) fn stop(&mut self) {
        if self.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the blocking accept with a connection of our own.
        let _ = Conn::connect(&self.addr);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let clients = std::mem::take(&mut *self.clients.lock().unwrap_or_else(|p| p.into_inner()));
        // Clients the aggregator has said goodbye to close on their own once it is written.
        let deadline = std::time::Instant::now() + SHUTDOWN_GRACE;
        while std::time::Instant::now() < deadline && clients.iter().any(|(_, h)| !h.is_finished())
        {
            thread::sleep(WRITER_POLL / 10);
        }
        for (conn, _) in &clients {
            conn.shutdown();
        }
        for (_, h) in clients {
            let _ = h.join();
        }
        if let Some(p) = self.remove_on_drop.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

static NEXT_CLIENT: AtomicU64 = AtomicU64::new(1);

fn accept_loop(
    listener: Listener,
    stop: Arc<AtomicBool>,
    cfg: Arc<ServerConfig>,
    agg: AggregatorHandle,
    clients: ClientThreads,
) {
    let awaiting_hello = Arc::new(AtomicUsize::new(0));
    let attached = Arc::new(AtomicUsize::new(0));
    loop {
        let conn = listener.accept();
        if stop.load(Ordering::Acquire) {
            return;
        }
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "attach accept failed");
                thread::sleep(WRITER_POLL);
                continue;
            }
        };
        let id = NEXT_CLIENT.fetch_add(1, Ordering::Relaxed);
        let Some(awaiting) = Slot::enter(&awaiting_hello, MAX_AWAITING_HELLO) else {
            let _ = conn.set_write_timeout(Some(REFUSE_WRITE_TIMEOUT));
            let message = format!(
                "too many connections waiting for their hello ({MAX_AWAITING_HELLO}): try again \
                 later"
            );
            refuse(
                &Mutex::new(conn),
                id,
                message,
                RefusalReason::HelloCap,
                &agg,
            );
            continue;
        };
        let Ok(handle_conn) = conn.try_clone() else {
            continue;
        };
        let (cfg, agg, attached) = (cfg.clone(), agg.clone(), attached.clone());
        let spawned = agent_thread::spawn(format!("allocview-client-{id}"), move || {
            serve_client(id, conn, awaiting, &attached, &cfg, &agg)
        });
        let mut list = clients.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|(_, h)| !h.is_finished());
        match spawned {
            Ok(h) => list.push((handle_conn, h)),
            Err(e) => tracing::warn!(error = %e, "cannot start a client thread"),
        }
    }
}

/// One connection counted against a cap ([`MAX_AWAITING_HELLO`], [`MAX_CLIENTS`]) until
/// dropped.
pub(crate) struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// Counts one more connection, unless `cap` are counted already.
    pub(crate) fn enter(count: &Arc<AtomicUsize>, cap: usize) -> Option<Slot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(Arc::clone(count)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Reads from a connection until a deadline: each read waits at most the time left, so a
/// peer that trickles its bytes (each within a read's timeout, slowloris) still runs out of
/// time: a hello costs its connection's slot for at most [`HELLO_TIMEOUT`] in all, and an
/// attaching client waits at most its connect timeout for the agent's hello.
pub(crate) struct ReadBefore<'a> {
    conn: &'a mut Conn,
    deadline: Instant,
}

impl<'a> ReadBefore<'a> {
    /// Reads from `conn` until `within` from now.
    pub(crate) fn new(conn: &'a mut Conn, within: Duration) -> ReadBefore<'a> {
        ReadBefore {
            conn,
            deadline: Instant::now() + within,
        }
    }

    /// Reads until `within` from now from here on (the next request on a kept-alive
    /// connection).
    pub(crate) fn restart(&mut self, within: Duration) {
        self.deadline = Instant::now() + within;
    }
}

impl Read for ReadBefore<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        self.conn.set_read_timeout(Some(left))?;
        self.conn.read(buf)
    }
}

/// Compares tokens in time independent of where they differ.
fn token_matches(expected: &str, given: Option<&str>) -> bool {
    let Some(given) = given else {
        return false;
    };
    let (a, b) = (expected.as_bytes(), given.as_bytes());
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

fn send(out: &Mutex<Conn>, frame: &ServerFrame) -> Result<(), ProtocolError> {
    let mut w = out.lock().unwrap_or_else(|p| p.into_inner());
    protocol::write_frame(&mut *w, frame)
}

fn refuse(out: &Mutex<Conn>, id: u64, message: String, why: RefusalReason, agg: &AggregatorHandle) {
    agg.refusals().count(why);
    tracing::warn!(client = id, %message, "attach client refused");
    let _ = send(
        out,
        &ServerFrame::Error {
            message,
            fatal: true,
        },
    );
}

/// One client: hello, then requests; a writer thread sends the aggregator's frames.
fn serve_client(
    id: u64,
    mut input: Conn,
    awaiting: Slot,
    attached: &Arc<AtomicUsize>,
    cfg: &ServerConfig,
    agg: &AggregatorHandle,
) {
    let Ok(output) = input.try_clone() else {
        return;
    };
    let _ = output.set_write_timeout(Some(cfg.write_timeout));
    let _ = input.set_read_timeout(Some(HELLO_TIMEOUT));
    let out = Arc::new(Mutex::new(output));
    let hello = ServerFrame::Hello {
        magic: MAGIC.into(),
        version: PROTOCOL_VERSION,
        pid: cfg.process.pid,
        process: cfg.process.name.clone(),
        token_required: cfg.token.is_some(),
        update_interval_ms: u64::try_from(cfg.update_interval.as_millis()).unwrap_or(u64::MAX),
    };
    if send(&out, &hello).is_err() {
        input.shutdown();
        return;
    }
    let first = protocol::read_frame::<_, ClientFrame>(
        &mut ReadBefore::new(&mut input, HELLO_TIMEOUT),
        MAX_CLIENT_FRAME,
    );
    let accepted = match first {
        Ok(ClientFrame::Hello {
            magic,
            version,
            token,
        }) => {
            if magic != MAGIC {
                Err((
                    RefusalReason::BadHello,
                    format!("not an allocview client (magic {magic:?})"),
                ))
            } else if version != PROTOCOL_VERSION {
                Err((
                    RefusalReason::Version,
                    format!(
                        "protocol version mismatch: agent speaks {PROTOCOL_VERSION}, client \
                         {version}"
                    ),
                ))
            } else if let Some(expected) = &cfg.token
                && !token_matches(expected, token.as_deref())
            {
                Err((
                    RefusalReason::Token,
                    if token.is_none() {
                        "this agent requires a token (ALLOCVIEW_TOKEN)".to_string()
                    } else {
                        "wrong token".to_string()
                    },
                ))
            } else {
                Ok(())
            }
        }
        Ok(other) => Err((
            RefusalReason::BadHello,
            format!("expected a hello, got {}", other.wire_name()),
        )),
        Err(ProtocolError::Closed) => {
            input.shutdown();
            return;
        }
        Err(e) if e.is_timeout() => Err((
            RefusalReason::HelloTimeout,
            format!("no hello within {} s", HELLO_TIMEOUT.as_secs()),
        )),
        Err(e) => Err((
            RefusalReason::of_error(&e, RefusalReason::BadHello),
            format!("bad hello: {e}"),
        )),
    };
    drop(awaiting);
    let accepted = accepted.and_then(|()| {
        Slot::enter(attached, MAX_CLIENTS).ok_or_else(|| {
            (
                RefusalReason::ClientCap,
                format!("too many clients attached ({MAX_CLIENTS}): try again later"),
            )
        })
    });
    let _attached = match accepted {
        Ok(slot) => slot,
        Err((why, message)) => {
            refuse(&out, id, message, why, agg);
            input.shutdown();
            return;
        }
    };
    let _ = input.set_read_timeout(None);

    let (tx, rx) = crossbeam_channel::bounded::<Encoded>(cfg.client_queue.max(1));
    let control = Arc::new(ClientControl::default());
    let closed = Arc::new(AtomicBool::new(false));
    let writer = {
        let (out, control, closed) = (out.clone(), control.clone(), closed.clone());
        agent_thread::spawn(format!("allocview-client-{id}-writer"), move || {
            write_loop(id, rx, &out, &control, &closed)
        })
    };
    let Ok(writer) = writer else {
        input.shutdown();
        return;
    };
    if !agg.send(Command::AddClient(ClientSlot {
        id,
        tx,
        control: control.clone(),
    })) {
        closed.store(true, Ordering::Release);
    }
    tracing::debug!(client = id, "attach client connected");

    while !closed.load(Ordering::Acquire) {
        let frame = match protocol::read_frame::<_, ClientFrame>(&mut input, MAX_CLIENT_FRAME) {
            Ok(f) => f,
            Err(ProtocolError::Closed) => break,
            Err(ProtocolError::Io(_)) => break,
            Err(e) => {
                let why = RefusalReason::of_error(&e, RefusalReason::BadRequest);
                refuse(&out, id, format!("bad request: {e}"), why, agg);
                break;
            }
        };
        let reply = match frame {
            ClientFrame::RequestSnapshot => ServerFrame::Snapshot {
                snapshot: Box::new((cfg.snapshot)()),
            },
            ClientFrame::ResetPeaks => {
                (cfg.reset_peaks)();
                ServerFrame::Ack {
                    request: "reset_peaks".into(),
                }
            }
            ClientFrame::Pause { paused } => {
                control.paused.store(paused, Ordering::Release);
                if !paused {
                    control.want_full.store(true, Ordering::Release);
                }
                ServerFrame::Ack {
                    request: if paused { "pause" } else { "resume" }.into(),
                }
            }
            ClientFrame::Hello { .. } => {
                refuse(
                    &out,
                    id,
                    "unexpected second hello".into(),
                    RefusalReason::BadRequest,
                    agg,
                );
                break;
            }
        };
        if send(&out, &reply).is_err() {
            break;
        }
    }
    closed.store(true, Ordering::Release);
    control.kick("connection closed".into());
    input.shutdown();
    let _ = writer.join();
    tracing::debug!(client = id, "attach client gone");
}

fn write_loop(
    id: u64,
    rx: crossbeam_channel::Receiver<Encoded>,
    out: &Mutex<Conn>,
    control: &ClientControl,
    closed: &AtomicBool,
) {
    loop {
        if let Some(reason) = control.kicked() {
            if !closed.load(Ordering::Acquire) {
                let _ = send(out, &ServerFrame::Goodbye { reason });
            }
            break;
        }
        match rx.recv_timeout(WRITER_POLL) {
            Ok(bytes) => {
                let mut w = out.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = w.write_all(&bytes).and_then(|()| w.flush()) {
                    tracing::debug!(client = id, error = %e, "write to attach client failed");
                    control.kick(format!("write failed: {e}"));
                    break;
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            // Only once every frame queued before is written: the last update goes out
            // before the goodbye.
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                // The aggregator let go of its queue (the agent shuts down): said after the
                // frames queued before.
                control.kick(crate::protocol::SHUTDOWN_GOODBYE.into());
            }
        }
    }
    closed.store(true, Ordering::Release);
    out.lock().unwrap_or_else(|p| p.into_inner()).shutdown();
}
