//! `allocview --attach [ADDR]`: the dashboard over another process's agent; with
//! `--headless --once --json`, the first full state received, as JSON (text: a line per device
//! and one for the host heap).

use std::collections::{HashMap, HashSet};
use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

use allocview_agent::client::{self, AttachClient, ClientError, ClientUpdate, SocketDiscovery};
use allocview_agent::server::{ADDR_ENV, TOKEN_ENV, default_socket_dir};
use allocview_agent::state::{AgentState, HostState, PipelineStats};
use anyhow::Context as _;

use crate::app::{self, App};
use crate::cli::Cli;
use crate::output::Versioned;
use crate::source::attach::{AttachSource, refused_summary};
use crate::terminal::TerminalGuard;
use crate::{output, units};

/// How often the dashboard polls the connection.
pub const TICK: Duration = Duration::from_millis(100);
/// Why the dashboard cannot run without a terminal, and what to do instead.
const NEEDS_TERMINAL: &str = "the live dashboard needs one: add --headless to print the state as text \
     lines (or --json)";
/// Headless mode prints a line at most this often.
const HEADLESS_LINE_EVERY: Duration = Duration::from_secs(1);

/// Where to attach, and what looking for it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The address.
    pub addr: String,
    /// A line to show before attaching: the stale sockets the look removed (see
    /// [`SocketDiscovery::stale_note`]).
    pub note: Option<String>,
}

/// The address to attach to: the one given, else `$ALLOCVIEW_ADDR`, else the only socket in
/// the default folder (`sockets` lists them, probing each: called only when needed). Stale
/// sockets that look removed are said in one line: before the listing in an error, else in
/// [`Target::note`].
///
/// # Errors
/// No address and no socket, or several sockets (listed, to choose from).
pub fn resolve(
    given: Option<&str>,
    env: Option<String>,
    sockets: impl FnOnce() -> SocketDiscovery,
) -> anyhow::Result<Target> {
    let chosen = |addr: &str| Target {
        addr: addr.trim().to_string(),
        note: None,
    };
    if let Some(a) = given.filter(|a| !a.trim().is_empty()) {
        return Ok(chosen(a));
    }
    if let Some(a) = env.filter(|a| !a.trim().is_empty()) {
        return Ok(chosen(&a));
    }
    let found = sockets();
    if let Some(why) = found.untrusted {
        anyhow::bail!("{why}");
    }
    let note = found.stale_note();
    let before = note.as_ref().map_or(String::new(), |n| format!("{n}\n"));
    match found.sockets.as_slice() {
        [] => anyhow::bail!(
            "{before}no allocview agent found: no socket in {} and ${ADDR_ENV} is not set; give \
             an address (allocview --attach unix:PATH or HOST:PORT) or start one \
             (allocview demo --listen unix:PATH)",
            default_socket_dir().display()
        ),
        [one] => Ok(Target {
            addr: format!("unix:{}", one.display()),
            note,
        }),
        many => {
            let list: Vec<String> = many
                .iter()
                .map(|p| format!("  unix:{}", p.display()))
                .collect();
            anyhow::bail!(
                "{before}{} agents are listening; choose one with allocview --attach ADDR:\n{}",
                many.len(),
                list.join("\n")
            )
        }
    }
}

/// `allocview: connecting to ADDR…` on stderr while the first connection is made (it can take
/// up to the client's connect timeout when the peer does not answer), erased once done. Shown
/// only when stderr is a terminal.
struct ConnectingNote {
    shown: bool,
}

impl ConnectingNote {
    fn show(addr: &str) -> ConnectingNote {
        let shown = std::io::stderr().is_terminal();
        if shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "allocview: connecting to {addr}…");
            let _ = err.flush();
        }
        ConnectingNote { shown }
    }
}

impl Drop for ConnectingNote {
    fn drop(&mut self) {
        if self.shown {
            // Back to the line's start, and erase it.
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

/// The first connection, with [`ConnectingNote`] meanwhile.
fn connect<T>(addr: &str, connect: impl FnOnce() -> Result<T, ClientError>) -> anyhow::Result<T> {
    let _note = ConnectingNote::show(addr);
    connect().map_err(|e| anyhow::anyhow!("{e}"))
}

/// `--attach --headless --json`'s `format` field: the agent's state as the attach protocol
/// carries it (docs/protocol.md), with these two fields added at the top level.
pub const JSON_FORMAT: &str = "allocview-agent-state";
/// `--attach --headless --json`'s `version` field: the attach protocol's version, which
/// changes when the state's fields change meaning.
pub const JSON_VERSION: u32 = allocview_agent::protocol::PROTOCOL_VERSION;

/// How long headless mode waits for an update before it says on stderr that none came (the
/// agent sends one every tick, at most 10 Hz, whether or not anything changed).
pub const STALL_WARNING: Duration = Duration::from_secs(5);

/// What headless mode says on stderr when updates stop and start again.
#[derive(Debug)]
struct StallWatch {
    last: Instant,
    warned: bool,
}

impl StallWatch {
    fn new() -> StallWatch {
        StallWatch {
            last: Instant::now(),
            warned: false,
        }
    }

    /// An update arrived: `updates resumed after N s` when a stall was said.
    fn update(&mut self) -> Option<String> {
        let note = self.warned.then(|| {
            format!(
                "updates resumed after {:.0} s",
                self.last.elapsed().as_secs_f64()
            )
        });
        self.last = Instant::now();
        self.warned = false;
        note
    }

    /// Nothing arrived: the stall's line, once, when it has lasted [`STALL_WARNING`].
    fn quiet(&mut self) -> Option<String> {
        if self.warned || self.last.elapsed() < STALL_WARNING {
            return None;
        }
        self.warned = true;
        Some(format!(
            "no update from the agent for {} s (is its process stopped or stuck?); still waiting",
            STALL_WARNING.as_secs()
        ))
    }
}

/// Headless mode: the first state (`--once`), or a line a second until the agent ends the
/// connection. It does not reconnect: the agent's shutdown ends it with success, a connection
/// lost any other way (the process died, the agent let this client go) with an error.
fn headless(addr: &str, token: Option<String>, cli: &Cli) -> anyhow::Result<()> {
    let mut c = connect(addr, || AttachClient::connect(addr, token))?;
    if cli.once {
        if cli.json {
            output::print(&Versioned::new(JSON_FORMAT, JSON_VERSION, c.state()).pretty()?)?;
        } else {
            print_line(&c)?;
        }
        return Ok(());
    }
    let mut last = Instant::now() - HEADLESS_LINE_EVERY;
    let mut stall = StallWatch::new();
    let mut cursor = StreamCursor::default();
    loop {
        match c.next_update(HEADLESS_LINE_EVERY) {
            Ok(ClientUpdate::Full) | Ok(ClientUpdate::Update) => {
                if let Some(note) = stall.update() {
                    eprintln!("allocview: {note}");
                }
                if last.elapsed() >= HEADLESS_LINE_EVERY {
                    last = Instant::now();
                    if cli.json {
                        let line = cursor.next_line(c.state());
                        output::print(&Versioned::new(JSON_FORMAT, JSON_VERSION, &line).line()?)?;
                    } else {
                        print_line(&c)?;
                    }
                }
            }
            Ok(_) | Err(ClientError::Timeout) => {
                if let Some(note) = stall.quiet() {
                    eprintln!("allocview: {note}");
                }
            }
            Err(e) if e.is_agent_shutdown() => {
                eprintln!("allocview: {e}");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// One line of the `--attach --headless --json` stream: the state, with `since_ns`.
#[derive(Debug, serde::Serialize)]
struct StreamLine {
    /// The previous line's `time_ns` (`None` on the first line): `recent`, `contexts` and
    /// `timeline` hold only what came after it.
    since_ns: Option<u64>,
    #[serde(flatten)]
    state: AgentState,
}

/// What the stream has printed, so that each line carries the events and usage samples that
/// came since the previous one rather than the client's whole window again (the demo's state
/// is about 250 KB, 190 KB of it the last 1,024 events: a line a second repeated them).
#[derive(Debug, Default)]
struct StreamCursor {
    /// The previous line's `time_ns`.
    since_ns: Option<u64>,
    /// Per device: the last event printed (its `seq`), and the time of the last usage sample
    /// printed (that sample is printed again: a window's figures rise until it closes).
    printed: HashMap<i32, (Option<u64>, Option<u64>)>,
}

impl StreamCursor {
    /// The next line for `state`: the first is the whole state.
    fn next_line(&mut self, state: &AgentState) -> StreamLine {
        let mut state = state.clone();
        for d in &mut state.devices {
            let (seq, sample) = self.printed.entry(d.device).or_default();
            if let Some(seq) = *seq {
                d.recent.retain(|e| e.seq > seq);
            }
            if let Some(t) = *sample {
                d.timeline.retain(|s| s.time_ns >= t);
            }
            let used: HashSet<u32> = d.recent.iter().map(|e| e.context).collect();
            d.contexts.retain(|c| used.contains(&c.id));
            *seq = d.recent.last().map(|e| e.seq).or(*seq);
            *sample = d.timeline.last().map(|s| s.time_ns).or(*sample);
        }
        let line = StreamLine {
            since_ns: self.since_ns,
            state,
        };
        self.since_ns = Some(line.state.time_ns);
        line
    }
}

fn print_line(c: &AttachClient) -> anyhow::Result<()> {
    let s = c.state();
    let (pid, name) = c.process();
    // The pipeline's counts end each device line; without devices, the line shown.
    let pipeline = pipeline_counts(&s.pipeline);
    for d in &s.devices {
        let st = &d.stats;
        output::print(&format!(
            "pid {pid} {name} dev {}: allocated {} reserved {} active {} OOMs {}{pipeline}",
            d.device,
            units::bytes(st.allocated_bytes.0[0].current.max(0) as u64),
            units::bytes(st.reserved_bytes.0[0].current.max(0) as u64),
            units::bytes(st.active_bytes.0[0].current.max(0) as u64),
            st.num_ooms,
        ))?;
    }
    let pipeline = if s.devices.is_empty() {
        &pipeline[..]
    } else {
        ""
    };
    if let Some(h) = &s.host {
        output::print(&format!("{}{pipeline}", host_line(pid, name, h)))?;
    }
    if s.devices.is_empty() && s.host.is_none() {
        output::print(&format!("pid {pid} {name}: no device events yet{pipeline}"))?;
    }
    Ok(())
}

/// ` dropped N resyncs N`, then the attach clients the agent refused, per reason, when any
/// (` refused 3 (hello_cap 2, token 1)`).
fn pipeline_counts(p: &PipelineStats) -> String {
    let mut out = format!(
        " dropped {} resyncs {}",
        units::count(p.dropped_total),
        units::count(p.resyncs)
    );
    if let Some(refused) = refused_summary(p) {
        out.push_str(&format!(" refused {refused}"));
    }
    out
}

/// The headless line of the host heap.
fn host_line(pid: u32, name: &str, h: &HostState) -> String {
    let n = |v: i64| v.max(0) as u64;
    format!(
        "pid {pid} {name} host heap: in use {} peak {} allocations {} frees {} live {} total \
         allocated {}",
        units::bytes(n(h.bytes.current)),
        units::bytes(n(h.bytes.peak)),
        units::count(n(h.allocations.allocated)),
        units::count(n(h.allocations.freed)),
        units::count(n(h.allocations.current)),
        units::bytes(n(h.bytes.allocated)),
    )
}

/// Runs the command.
///
/// # Errors
/// No address to attach to, a failed first connection, or a terminal that cannot be used.
pub fn run(cli: &Cli) -> anyhow::Result<()> {
    let Target { addr, note } = resolve(
        cli.attach.as_deref(),
        std::env::var(ADDR_ENV).ok(),
        client::find_sockets,
    )?;
    let token = std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty());
    if cli.headless {
        if let Some(note) = note {
            eprintln!("allocview: {note}");
        }
        return headless(&addr, token, cli);
    }
    // The stale sockets removed are said on the dashboard (a line on stderr would be gone
    // under its screen at once), or on stderr when it does not open.
    let opened = || -> anyhow::Result<App> {
        crate::terminal::check_stdout().map_err(|e| e.advise(NEEDS_TERMINAL))?;
        let src = connect(&addr, || AttachSource::connect(&addr, token))?;
        let save_dir = std::env::current_dir().context("no current folder to save snapshots in")?;
        App::new(Box::new(src), save_dir)
    };
    let mut app = match opened() {
        Ok(app) => app,
        Err(e) => {
            if let Some(note) = note {
                eprintln!("allocview: {note}");
            }
            return Err(e);
        }
    };
    if let Some(note) = note {
        app.status(format!("attached to {addr}; {note}"));
    }
    let mut guard = TerminalGuard::enter().map_err(|e| e.advise(NEEDS_TERMINAL))?;
    app::run(&mut guard.terminal, &mut app, TICK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// What a look in `/run/allocview` finds: `live` sockets, `stale` removed.
    fn found(live: &[&str], stale: usize) -> SocketDiscovery {
        SocketDiscovery {
            dir: PathBuf::from("/run/allocview"),
            sockets: live.iter().map(PathBuf::from).collect(),
            stale_removed: stale,
            untrusted: None,
        }
    }

    #[test]
    fn the_address_comes_from_the_flag_then_the_environment_then_the_only_socket() {
        let socks = || found(&["/tmp/a.sock"], 0);
        let addr = |t: anyhow::Result<Target>| t.unwrap().addr;
        assert_eq!(
            addr(resolve(Some("unix:/x.sock"), Some("h:1".into()), socks)),
            "unix:/x.sock"
        );
        assert_eq!(addr(resolve(Some(""), Some("h:1".into()), socks)), "h:1");
        assert_eq!(
            resolve(None, None, socks).unwrap(),
            Target {
                addr: "unix:/tmp/a.sock".into(),
                note: None
            }
        );
    }

    #[test]
    fn stale_sockets_removed_while_looking_are_said_in_one_line_with_the_listing() {
        let t = resolve(None, None, || found(&["/tmp/a.sock"], 2)).unwrap();
        assert_eq!(
            t.note.as_deref(),
            Some("removed 2 stale sockets in /run/allocview")
        );
        let e = resolve(None, None, || found(&[], 1))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("removed 1 stale socket in /run/allocview\nno allocview agent found"),
            "{e}"
        );
        let e = resolve(None, None, || found(&["/tmp/a.sock", "/tmp/b.sock"], 3))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("removed 3 stale sockets in /run/allocview\n2 agents are listening"),
            "{e}"
        );
    }

    #[test]
    fn the_host_line_names_every_host_figure() {
        let mut h = HostState::default();
        h.bytes.update(3 << 20);
        h.bytes.update(-(1 << 20));
        h.allocations.update(1);
        h.allocations.update(1);
        h.allocations.update(-1);
        let l = host_line(7, "svc", &h);
        assert_eq!(
            l,
            "pid 7 svc host heap: in use 2.00 MiB peak 3.00 MiB allocations 2 frees 1 live 1 total \
             allocated 3.00 MiB"
        );
    }

    #[test]
    fn the_pipeline_counts_name_refused_clients_per_reason_only_when_there_are_some() {
        let mut p = PipelineStats {
            dropped_total: 4,
            resyncs: 1,
            ..PipelineStats::default()
        };
        assert_eq!(pipeline_counts(&p), " dropped 4 resyncs 1");
        p.refused_clients = vec![("hello_cap".into(), 2), ("token".into(), 1)];
        assert_eq!(
            pipeline_counts(&p),
            " dropped 4 resyncs 1 refused 3 (hello_cap 2, token 1)"
        );
    }

    #[test]
    fn no_socket_or_several_are_clear_errors() {
        let e = resolve(None, None, || found(&[], 0))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("no allocview agent found"), "{e}");
        let e = resolve(None, None, || found(&["/tmp/a.sock", "/tmp/b.sock"], 0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("2 agents are listening") && e.contains("unix:/tmp/b.sock"),
            "{e}"
        );
    }
}
