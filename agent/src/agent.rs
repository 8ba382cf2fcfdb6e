//! [`Agent`]: the embedding API. Build one, attach its [`sink`](Agent::sink) to your
//! allocators, and it aggregates, dumps OOMs, serves `allocview --attach` and (optionally)
//! Prometheus.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use allocview_agent::agent::Agent;
//! use allocview_alloc::caching::stats::StatType;
//! use allocview_alloc::event::{Event, EventAction, EventPool};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let agent = Agent::builder()
//!     .no_listen()
//!     .dump_dir(dir.path())
//!     .spawn()
//!     .unwrap();
//! let sink = agent.sink();
//! sink.publish(&Event::new(EventAction::SegmentAlloc, 0, EventPool::Large, 0x1000_0000, 20 << 20));
//! agent.flush();
//! let stats = &agent.state().devices[0].stats;
//! assert_eq!(stats.reserved_bytes.get(StatType::All).current, 20 << 20);
//! agent.shutdown();
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use allocview_alloc::event::{EventSink, now_ns};
use allocview_alloc::snapshot::Snapshot;

use crate::aggregator::{
    self, AggregatorConfig, AggregatorHandle, Command, DEFAULT_MAX_DUMPS, DEFAULT_RECENT_EVENTS,
    DEFAULT_TICK,
};
use crate::dump::OomDumper;
use crate::prometheus::MetricsServer;
use crate::provider::{HostProvider, SnapshotProvider};
use crate::server::{
    self, ADDR_ENV, BadAddress, DEFAULT_CLIENT_QUEUE, DEFAULT_WRITE_TIMEOUT, ListenAddr, Server,
    ServerConfig, ServerError, TOKEN_ENV,
};
use crate::sink::{self, ChannelSink, DEFAULT_CHANNEL_CAPACITY};
use crate::state::{AgentState, ProcessInfo};
use crate::timeline::DEFAULT_RESOLUTION_NS;

/// Why an agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The attach address could not be parsed.
    #[error(transparent)]
    BadAddress(#[from] BadAddress),
    /// The attach server could not start.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The metrics address given to [`AgentBuilder::metrics_at`] names no address.
    #[error("bad metrics address {addr:?}: {why}")]
    BadMetricsAddress {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        why: String,
    },
    /// The metrics listener could not start.
    #[error("cannot serve metrics on {addr}: {message}")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// Why.
        message: String,
    },
    /// The token given to the builder is empty: a client sending an empty token would match
    /// it, which on a non-loopback address is as good as no token.
    #[error(
        "the attach token is empty: give a non-empty token, or no_token() to require none (loopback and unix sockets only)"
    )]
    EmptyToken,
    /// Two registered providers report the same device: the agent would fold two allocators'
    /// events into one device's figures.
    #[error(
        "two providers report device {0}: register one allocator per device index (for simulated devices, SimBackend::builder().device(n))"
    )]
    DuplicateDevice(i32),
    /// The OOM dump folder's path names something that is not a folder.
    #[error("cannot write OOM dumps into {0}: it is not a folder")]
    DumpDirNotAFolder(PathBuf),
    /// A thread could not be started.
    #[error("cannot start the {what} thread: {error}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// Why.
        error: std::io::Error,
    },
}

// The messages above include their cause's text; the OS errors are therefore not exposed as
// `source`, so a reporter walking the chain (anyhow's `{:#}`) prints each cause once.

#[derive(Debug, Clone)]
enum Listen {
    /// `ALLOCVIEW_ADDR` if set, else the default unix socket.
    Default,
    /// The default unix socket, whatever `ALLOCVIEW_ADDR` says.
    DefaultSocket,
    Addr(String),
    Off,
}

/// Where the metrics listener binds, as given to the builder.
#[derive(Debug, Clone)]
enum MetricsAt {
    Addr(SocketAddr),
    /// `HOST:PORT`, resolved at spawn.
    Name(String),
}

impl MetricsAt {
    /// The addresses to try binding, in the resolver's order (never none).
    fn resolve(&self) -> Result<Vec<SocketAddr>, AgentError> {
        let name = match self {
            MetricsAt::Addr(a) => return Ok(vec![*a]),
            MetricsAt::Name(n) => n.trim(),
        };
        let name = name.strip_prefix("tcp:").unwrap_or(name);
        server::resolve_tcp(name, name)
            .map_err(|BadAddress { addr, why }| AgentError::BadMetricsAddress { addr, why })
    }
}

#[derive(Debug, Clone)]
enum Token {
    /// `ALLOCVIEW_TOKEN` if set.
    Env,
    Given(String),
    None,
}

/// Configures and starts an [`Agent`].
pub struct AgentBuilder {
    listen: Listen,
    dump_dir: Option<PathBuf>,
    channel_capacity: usize,
    tick: Duration,
    sample_interval: Duration,
    metrics: Option<MetricsAt>,
    metrics_write_timeout: Duration,
    providers: Vec<Arc<dyn SnapshotProvider>>,
    host: Option<Arc<dyn HostProvider>>,
    token: Token,
    client_queue: usize,
    write_timeout: Duration,
    recent_events: usize,
    process_name: Option<String>,
    max_dumps: u64,
}

impl Default for AgentBuilder {
    fn default() -> Self {
        AgentBuilder {
            listen: Listen::Default,
            dump_dir: None,
            channel_capacity: DEFAULT_CHANNEL_CAPACITY,
            tick: DEFAULT_TICK,
            sample_interval: Duration::from_nanos(DEFAULT_RESOLUTION_NS),
            metrics: None,
            metrics_write_timeout: crate::prometheus::DEFAULT_WRITE_TIMEOUT,
            providers: Vec::new(),
            host: None,
            token: Token::Env,
            client_queue: DEFAULT_CLIENT_QUEUE,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            recent_events: DEFAULT_RECENT_EVENTS,
            process_name: None,
            max_dumps: DEFAULT_MAX_DUMPS,
        }
    }
}

impl AgentBuilder {
    /// Listens at `addr` (`unix:PATH`, a path, or `HOST:PORT`) instead of the default.
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = Listen::Addr(addr.into());
        self
    }

    /// Listens on the default unix socket even when `ALLOCVIEW_ADDR` names another address.
    pub fn listen_default_socket(mut self) -> Self {
        self.listen = Listen::DefaultSocket;
        self
    }

    /// Serves no attach clients.
    pub fn no_listen(mut self) -> Self {
        self.listen = Listen::Off;
        self
    }

    /// Folder for OOM dumps (default: `ALLOCVIEW_DUMP_DIR`, else `./allocview-dumps`); a
    /// relative path is taken from the working folder at [`spawn`](Self::spawn), so the dumps'
    /// paths in OOM records are absolute. It is
    /// created at the first OOM, not before, so a process that never runs out of memory leaves
    /// no folder behind; [`spawn`](Self::spawn) refuses a path that names something other than
    /// a folder, and a folder that cannot be created or written then is counted in
    /// [`PipelineStats::dump_failures`](crate::state::PipelineStats::dump_failures), its reason
    /// kept in the OOM record's `dump_error` and logged with `tracing`.
    pub fn dump_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dump_dir = Some(dir.into());
        self
    }

    /// Capacity of the event channel, in events; the batch channel beside it gets
    /// [`batch_capacity_for`](crate::sink::batch_capacity_for) this many (`n / MAX_BATCH`
    /// batches), so it holds as many events in full batches.
    pub fn channel_capacity(mut self, n: usize) -> Self {
        self.channel_capacity = n;
        self
    }

    /// The aggregation tick: how often drops are checked, usage is sampled and clients are
    /// updated (default 100 ms). A tick under 100 ms still updates clients at most 10 times a
    /// second ([`MIN_UPDATE_INTERVAL`](crate::aggregator::MIN_UPDATE_INTERVAL)).
    pub fn tick(mut self, tick: Duration) -> Self {
        self.tick = tick.max(Duration::from_millis(1));
        self
    }

    /// The finest timeline resolution (default 1 s).
    pub fn sample_interval(mut self, d: Duration) -> Self {
        self.sample_interval = d;
        self
    }

    /// Serves Prometheus metrics at `http://addr/metrics`. The endpoint has no
    /// authentication, as is usual for Prometheus targets: on an address other hosts reach,
    /// they can read the figures (not the segment map, frames or snapshots, which only the
    /// attach protocol serves).
    pub fn metrics(mut self, addr: SocketAddr) -> Self {
        self.metrics = Some(MetricsAt::Addr(addr));
        self
    }

    /// Serves Prometheus metrics at `http://HOST:PORT/metrics`, like [`metrics`](Self::metrics)
    /// but from text: an IP address and port, or a host name and port (`localhost:9464`),
    /// resolved when the agent starts as the attach listener's `HOST:PORT` is. The listener
    /// binds the first resolved address it can (`localhost` may resolve to `::1` on a host
    /// without IPv6). [`spawn`](Self::spawn) refuses a name that does not resolve.
    ///
    /// ```
    /// use allocview_agent::agent::Agent;
    ///
    /// let agent = Agent::builder().no_listen().metrics_at("localhost:0").spawn()?;
    /// assert!(agent.metrics_addr().unwrap().ip().is_loopback());
    /// # agent.shutdown();
    /// # Ok::<(), allocview_agent::agent::AgentError>(())
    /// ```
    pub fn metrics_at(mut self, addr: impl Into<String>) -> Self {
        self.metrics = Some(MetricsAt::Name(addr.into()));
        self
    }

    /// Abandons a metrics response the client reads none of for `timeout` (default
    /// [`DEFAULT_WRITE_TIMEOUT`](crate::prometheus::DEFAULT_WRITE_TIMEOUT)), or has not read
    /// whole within [`RESPONSE_DEADLINE_WRITES`](crate::prometheus::RESPONSE_DEADLINE_WRITES)
    /// times `timeout`, so that a stalled or slow client holds its connection's thread (one of
    /// [`MAX_CONNECTIONS`](crate::prometheus::MAX_CONNECTIONS)) for at most about one more
    /// `timeout` than that. At least 1 ms (a zero timeout would cut every response).
    pub fn metrics_write_timeout(mut self, timeout: Duration) -> Self {
        self.metrics_write_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Registers an allocator the agent may ask for snapshots and stats: one per device
    /// ([`spawn`](Self::spawn) refuses two with the same [`device`](SnapshotProvider::device)).
    pub fn provider(mut self, p: Arc<dyn SnapshotProvider>) -> Self {
        self.providers.push(p);
        self
    }

    /// Registers the host heap (the process's [`Instrumented`] global allocator) the agent may
    /// ask for its own counters after dropped events, and whose peak a client's reset resets.
    ///
    /// ```
    /// use std::alloc::System;
    /// use std::sync::Arc;
    /// use allocview_agent::agent::Agent;
    /// use allocview_alloc::global::Instrumented;
    ///
    /// static HEAP: Instrumented<System> = Instrumented::new(System);
    ///
    /// let agent = Agent::builder().no_listen().host_provider(Arc::new(&HEAP)).spawn()?;
    /// # agent.shutdown();
    /// # Ok::<(), allocview_agent::agent::AgentError>(())
    /// ```
    ///
    /// [`Instrumented`]: allocview_alloc::global::Instrumented
    pub fn host_provider(mut self, host: Arc<dyn HostProvider>) -> Self {
        self.host = Some(host);
        self
    }

    /// The token clients must present (default: `ALLOCVIEW_TOKEN`, when set and not empty).
    /// [`spawn`](Self::spawn) refuses an empty one.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Token::Given(token.into());
        self
    }

    /// Requires no token, whatever `ALLOCVIEW_TOKEN` says.
    pub fn no_token(mut self) -> Self {
        self.token = Token::None;
        self
    }

    /// Frames queued per client before it is disconnected as too slow.
    pub fn client_queue(mut self, n: usize) -> Self {
        self.client_queue = n.max(1);
        self
    }

    /// How long a frame may take to write to a client.
    pub fn write_timeout(mut self, d: Duration) -> Self {
        self.write_timeout = d;
        self
    }

    /// Events kept per device for the trace view.
    pub fn recent_events(mut self, n: usize) -> Self {
        self.recent_events = n;
        self
    }

    /// OOM dumps written at most (later OOMs are recorded without files).
    pub fn max_dumps(mut self, n: u64) -> Self {
        self.max_dumps = n;
        self
    }

    /// The process name clients see (default: the executable's name).
    pub fn process_name(mut self, name: impl Into<String>) -> Self {
        self.process_name = Some(name.into());
        self
    }

    /// Starts the aggregator and, as configured, the attach server and the metrics listener.
    ///
    /// # Errors
    /// A bad address (attach or metrics), a listener that cannot bind (or a non-loopback TCP address without a
    /// token), an empty token, two providers of one device, a dump folder path that names a
    /// file, or a thread that cannot start.
    pub fn spawn(self) -> Result<Agent, AgentError> {
        let token = match self.token {
            Token::Env => std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()),
            Token::Given(t) if t.is_empty() => return Err(AgentError::EmptyToken),
            Token::Given(t) => Some(t),
            Token::None => None,
        };
        let mut devices: Vec<i32> = self.providers.iter().map(|p| p.device()).collect();
        devices.sort_unstable();
        if let Some(w) = devices.windows(2).find(|w| w[0] == w[1]) {
            return Err(AgentError::DuplicateDevice(w[0]));
        }
        let dump_dir = self.dump_dir.unwrap_or_else(aggregator::default_dump_dir);
        // Made absolute now, against the folder the process is in at spawn: the dumps' paths
        // (in OOM records, sent to attach clients) then name the same files from any folder,
        // even after the process changes its own.
        let dump_dir = std::path::absolute(&dump_dir).unwrap_or(dump_dir);
        if std::fs::metadata(&dump_dir).is_ok_and(|m| !m.is_dir()) {
            return Err(AgentError::DumpDirNotAFolder(dump_dir));
        }
        let listen = match &self.listen {
            Listen::Off => None,
            Listen::DefaultSocket => Some(None),
            Listen::Addr(a) => Some(Some(a.parse::<ListenAddr>()?)),
            Listen::Default => match std::env::var(ADDR_ENV).ok().filter(|v| !v.is_empty()) {
                Some(a) => Some(Some(a.parse::<ListenAddr>()?)),
                None => Some(None),
            },
        };
        // Resolved before anything starts, as the attach address is parsed.
        let metrics = self.metrics.as_ref().map(MetricsAt::resolve).transpose()?;
        let process = ProcessInfo {
            pid: std::process::id(),
            name: self.process_name.unwrap_or_else(process_name),
            started_ns: now_ns(),
        };
        let (sink, rx) = sink::channel(self.channel_capacity);
        let cfg = AggregatorConfig {
            tick: self.tick,
            sample_interval: self.sample_interval,
            recent_events: self.recent_events,
            process: process.clone(),
            providers: self.providers.clone(),
            host: self.host.clone(),
            dumper: OomDumper::new(dump_dir),
            max_dumps: self.max_dumps,
        };
        let (handle, join) = aggregator::spawn(cfg, rx).map_err(|error| AgentError::Thread {
            what: "aggregator",
            error,
        })?;
        let mut agent = Agent {
            sink: Arc::new(sink),
            handle,
            aggregator: Some(join),
            server: None,
            metrics: None,
            providers: self.providers,
            host: self.host,
        };
        if let Some(addr) = listen {
            let providers = agent.providers.clone();
            let providers2 = agent.providers.clone();
            let host = agent.host.clone();
            let handle = agent.handle.clone();
            let cfg = ServerConfig {
                token,
                client_queue: self.client_queue,
                write_timeout: self.write_timeout,
                process,
                update_interval: aggregator::update_interval(self.tick),
                snapshot: Arc::new(move || merged_snapshot(&providers)),
                reset_peaks: Arc::new(move || reset_peaks(&providers2, host.as_deref(), &handle)),
            };
            agent.server = Some(Server::start(addr, cfg, agent.handle.clone())?);
        }
        if let Some(addrs) = metrics {
            let mut last = None;
            for addr in addrs {
                match MetricsServer::start(addr, agent.handle.clone(), self.metrics_write_timeout) {
                    Ok(m) => {
                        agent.metrics = Some(m);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            if let (None, Some(e)) = (&agent.metrics, last) {
                return Err(e);
            }
        }
        Ok(agent)
    }
}

fn process_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "unknown".into())
}

/// One snapshot of every provider's device, segments sorted by address.
fn merged_snapshot(providers: &[Arc<dyn SnapshotProvider>]) -> Snapshot {
    let mut out = Snapshot::default();
    for p in providers {
        let s = p.snapshot();
        out.segments.extend(s.segments);
        out.device_traces.extend(s.device_traces);
        out.devices.extend(s.devices);
        if out.allocator_settings.is_none() {
            out.allocator_settings = s.allocator_settings;
        }
        if out.external_annotations.is_none() {
            out.external_annotations = s.external_annotations;
        }
    }
    out.segments.sort_by_key(|s| (s.device, s.address));
    out
}

fn reset_peaks(
    providers: &[Arc<dyn SnapshotProvider>],
    host: Option<&dyn HostProvider>,
    handle: &AggregatorHandle,
) {
    for p in providers {
        p.reset_peak_stats();
    }
    if let Some(h) = host {
        h.reset_peak();
    }
    handle.send(Command::ResetPeaks);
}

/// A running agent. Dropping it shuts it down.
pub struct Agent {
    sink: Arc<ChannelSink>,
    handle: AggregatorHandle,
    aggregator: Option<JoinHandle<()>>,
    server: Option<Server>,
    metrics: Option<MetricsServer>,
    providers: Vec<Arc<dyn SnapshotProvider>>,
    host: Option<Arc<dyn HostProvider>>,
}

impl Agent {
    /// A builder with the defaults.
    pub fn builder() -> AgentBuilder {
        AgentBuilder::default()
    }

    /// The sink to attach to allocators.
    pub fn sink(&self) -> Arc<dyn EventSink> {
        self.sink.clone()
    }

    /// The sink for a `static` allocator, such as
    /// [`Instrumented::set_sink`](allocview_alloc::global::Instrumented::set_sink), which
    /// takes a `&'static dyn EventSink`: a clone of [`sink`](Self::sink) kept alive for the
    /// rest of the process (one small leaked box per call, so call it once). Events published
    /// into it after the agent shut down are counted as dropped.
    ///
    /// ```
    /// use std::alloc::System;
    /// use allocview_agent::agent::Agent;
    /// use allocview_alloc::global::Instrumented;
    ///
    /// // In a program: `#[global_allocator] static HEAP: ...`.
    /// static HEAP: Instrumented<System> = Instrumented::new(System);
    ///
    /// let agent = Agent::builder().no_listen().spawn()?;
    /// HEAP.set_sink(Some(agent.leak_sink()));
    /// assert!(HEAP.has_sink());
    /// # HEAP.set_sink(None);
    /// # agent.shutdown();
    /// # Ok::<(), allocview_agent::agent::AgentError>(())
    /// ```
    pub fn leak_sink(&self) -> &'static dyn EventSink {
        let sink: &'static Arc<ChannelSink> = Box::leak(Box::new(Arc::clone(&self.sink)));
        &**sink
    }

    /// The sink as its concrete type (drop counters, capacity).
    pub fn channel_sink(&self) -> &Arc<ChannelSink> {
        &self.sink
    }

    /// A consistent copy of the state, with every event published so far folded in.
    pub fn state(&self) -> AgentState {
        self.handle.state().unwrap_or_default()
    }

    /// A snapshot from every registered provider (empty without providers).
    pub fn snapshot(&self) -> Snapshot {
        merged_snapshot(&self.providers)
    }

    /// Resets peak statistics: the providers' (which publish `reset_peaks`), the host heap's,
    /// and the agent's own for devices without a provider and for the host.
    pub fn reset_peaks(&self) {
        reset_peaks(&self.providers, self.host.as_deref(), &self.handle);
    }

    /// Has every registered provider publish the events it gathered
    /// ([`SnapshotProvider::flush_events`]), then waits until every event published before
    /// this call is folded in (and a resync done if events were dropped) and every OOM dump
    /// started is written (dumps are written on a thread of their own, so between flushes a
    /// record can say [`dump_pending`](crate::state::OomRecord::dump_pending)). An allocator attached
    /// to the sink but not registered as a provider publishes its gathered events with its own
    /// `flush_events` (or when dropped).
    pub fn flush(&self) {
        for p in &self.providers {
            p.flush_events();
        }
        self.handle.flush();
    }

    /// Where attach clients connect, when the server runs.
    pub fn listen_addr(&self) -> Option<&ListenAddr> {
        self.server.as_ref().map(Server::addr)
    }

    /// Where Prometheus scrapes, when the metrics listener runs.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::addr)
    }

    /// Drains, sends clients a last update, stops every thread and removes the socket.
    pub fn shutdown(mut self) {
        self.stop();
    }

    /// Publishes what the providers gathered, lets the aggregator fold everything in and send
    /// clients their last update and goodbye, then closes the listeners.
    fn stop(&mut self) {
        if let Some(j) = self.aggregator.take() {
            for p in &self.providers {
                p.flush_events();
            }
            self.handle.send(Command::Shutdown);
            let _ = j.join();
        }
        if let Some(mut s) = self.server.take() {
            s.stop();
        }
        if let Some(mut m) = self.metrics.take() {
            m.stop();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("listen", &self.listen_addr())
            .field("metrics", &self.metrics_addr())
            .field("providers", &self.providers.len())
            .finish()
    }
}
