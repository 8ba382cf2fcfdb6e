//! Entering and leaving the terminal: raw mode, the alternate screen, mouse capture and the
//! hidden cursor, all undone on exit, on error and on panic. A panic hook restores the
//! terminal before the panic message prints, so the message lands on the normal screen in
//! cooked mode (a panic on the dashboard's thread does not wait for the guard's `Drop`).
//!
//! Signals that end a program (SIGTERM from `kill`, SIGHUP when the terminal window closes,
//! SIGINT from `kill -INT`; Ctrl-C is a key in raw mode) would otherwise kill the process with
//! the terminal still in raw mode, on the alternate screen, with the cursor hidden and mouse
//! tracking on. While the dashboard holds the terminal, a thread waits for them
//! (`signal_hook::iterator::Signals`, which needs no `unsafe` here), restores the terminal and
//! exits with status 128 + the signal's number, as a shell reports a death by that signal. A
//! terminal that goes away without a SIGHUP (no controlling terminal) is noticed by
//! [`install_hangup_watch`] and ends the process the same way. Ctrl-Z, also a key in raw mode,
//! [`suspend`]s: the terminal is given back, the process stops, and `fg` takes it again.
//!
//! Restoring happens once (until a [`suspend`] takes the terminal again): leaving the alternate screen a second time would move the cursor
//! back to where the dashboard started, and the shell would then write over the panic message.
//! Only a panic on the thread that drives the dashboard restores. A panic on any other thread
//! (the demo's workload, a file's what-if replays) while the dashboard holds the terminal is
//! not printed over the screen, where raw stderr would garble the alternate screen: the hook
//! keeps its message, the dashboard shows it in its status line ([`background_panics`]), and
//! [`restore`] prints it once the terminal is back to normal.

use std::io::{self, IsTerminal as _, Stdout, Write as _};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::cursor::Show;
use ratatui::crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};

/// Whether the dashboard holds the terminal (set on entering, cleared by the first restore).
static HELD: AtomicBool = AtomicBool::new(false);
/// The panic hook is installed once per process.
static HOOK: Once = Once::new();
/// Panics of threads other than the dashboard's while it held the terminal, in order: kept
/// instead of printed over the screen (see the module's docs). Locked while [`HELD`] is read
/// by the hook and cleared by [`restore`], so that a message is either kept and printed by
/// the restore, or printed by the hook itself, never lost between the two.
static BACKGROUND_PANICS: std::sync::Mutex<Vec<BackgroundPanic>> =
    std::sync::Mutex::new(Vec::new());
/// How many of [`BACKGROUND_PANICS`] a restore printed already (a suspend restores too).
static PANICS_PRINTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// The signal thread is started once per process.
#[cfg(unix)]
static SIGNAL_THREAD: Once = Once::new();
/// The hang-up watch is started once per process.
#[cfg(unix)]
static HANGUP_WATCH: Once = Once::new();
/// How often the hang-up watch looks at the terminal.
pub const HANGUP_CHECK: std::time::Duration = std::time::Duration::from_millis(250);
/// `EIO` (os error 5): what writing to a terminal that hung up gets.
#[cfg(unix)]
const HUNG_UP: i32 = 5;

/// Files the process removes when a signal ends it (an agent's socket: its shutdown, which
/// would remove it, does not run then).
static REMOVE_AT_SIGNAL: std::sync::Mutex<Vec<std::path::PathBuf>> =
    std::sync::Mutex::new(Vec::new());

/// Removes `path` if a signal ends the process while the dashboard runs (see
/// [`install_signal_handler`]); a normal end leaves it to its owner.
pub fn remove_at_signal(path: std::path::PathBuf) {
    REMOVE_AT_SIGNAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(path);
}

/// The signals that restore the terminal and end the process while the dashboard runs.
#[cfg(unix)]
pub const ENDING_SIGNALS: [i32; 3] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
    signal_hook::consts::SIGINT,
];

thread_local! {
    /// Whether this thread entered the terminal (its panics restore it).
    static DRIVES_DASHBOARD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A panic of a background thread while the dashboard held the terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackgroundPanic {
    /// One line: `thread 'NAME' panicked at FILE:LINE:COL: MESSAGE`.
    pub message: String,
    /// The backtrace, when `RUST_BACKTRACE` asked for one (printed after the restore only).
    pub backtrace: Option<String>,
}

impl BackgroundPanic {
    /// The panic as the hook saw it (`std`'s own wording, on one line).
    fn of(info: &std::panic::PanicHookInfo<'_>) -> BackgroundPanic {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        let payload = panic_text(info.payload())
            .unwrap_or("Box<dyn Any>")
            .replace('\n', " ");
        let at = info
            .location()
            .map(|l| format!(" at {}:{}:{}", l.file(), l.line(), l.column()))
            .unwrap_or_default();
        let backtrace = std::backtrace::Backtrace::capture();
        BackgroundPanic {
            message: format!("thread '{name}' panicked{at}: {payload}"),
            backtrace: (backtrace.status() == std::backtrace::BacktraceStatus::Captured)
                .then(|| backtrace.to_string()),
        }
    }
}

/// A panic's message, when its payload is text (`panic!` with a literal or a format).
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}

/// Whether the dashboard holds the terminal now (between [`TerminalGuard::enter`] and the
/// first [`restore`]).
pub fn held() -> bool {
    HELD.load(Ordering::SeqCst)
}

/// Every background thread's panic kept while the dashboard held the terminal, oldest first
/// (the dashboard shows the ones it has not shown yet).
pub fn background_panics() -> Vec<BackgroundPanic> {
    lock_panics().clone()
}

/// The newest kept background panic's message and how many are kept, when more than `seen`
/// are (what the dashboard checks on each tick): one look under the lock, no copy of the rest.
pub fn newest_background_panic(seen: usize) -> Option<(usize, String)> {
    let panics = lock_panics();
    let newest = panics.last().filter(|_| panics.len() > seen)?;
    Some((panics.len(), newest.message.clone()))
}

fn lock_panics() -> std::sync::MutexGuard<'static, Vec<BackgroundPanic>> {
    BACKGROUND_PANICS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `ENXIO` (os error 6): opening `/dev/tty` without a controlling terminal.
const NO_CONTROLLING_TERMINAL: i32 = 6;

/// Why the dashboard cannot take the terminal.
#[derive(Debug, thiserror::Error)]
pub enum TerminalError {
    /// Stdout goes to a file or a pipe: the dashboard's escape codes would land there.
    #[error("stdout is not a terminal (it goes to a file or a pipe)")]
    StdoutNotATerminal,
    /// The process has no controlling terminal (started by a service, `setsid`, ...).
    #[error("the process has no controlling terminal")]
    NoControllingTerminal,
    /// `TERM=dumb` (an editor's shell buffer, a CI log viewer): the terminal moves no cursor
    /// and draws no colours, so the dashboard's escape codes would land on it as text.
    #[error("the terminal is a dumb one (TERM=dumb): it cannot draw a dashboard")]
    DumbTerminal,
    /// Another failure setting the terminal up.
    #[error("cannot set up the terminal: {0}")]
    Io(io::Error),
}

impl From<io::Error> for TerminalError {
    fn from(e: io::Error) -> TerminalError {
        if e.raw_os_error() == Some(NO_CONTROLLING_TERMINAL) {
            TerminalError::NoControllingTerminal
        } else {
            TerminalError::Io(e)
        }
    }
}

/// The environment variable that names the terminal's type.
pub const TERM_VAR: &str = "TERM";
/// [`TERM_VAR`]'s value for a terminal without cursor movement or colours.
pub const DUMB_TERM: &str = "dumb";

/// Checks that stdout is a terminal the dashboard can draw on (call it before any other work,
/// so a redirected run fails at once).
///
/// # Errors
/// [`TerminalError::StdoutNotATerminal`]; [`TerminalError::DumbTerminal`] where `TERM` is
/// `dumb`.
pub fn check_stdout() -> Result<(), TerminalError> {
    if !io::stdout().is_terminal() {
        Err(TerminalError::StdoutNotATerminal)
    } else if std::env::var_os(TERM_VAR).is_some_and(|t| t == DUMB_TERM) {
        Err(TerminalError::DumbTerminal)
    } else {
        Ok(())
    }
}

impl TerminalError {
    /// The error with `advice` after it (what needs the terminal, what to run instead).
    pub fn advise(self, advice: &str) -> anyhow::Error {
        anyhow::anyhow!("{self}; {advice}")
    }
}

/// The terminal while the dashboard owns it; restores it when dropped.
pub struct TerminalGuard {
    /// The ratatui terminal.
    pub terminal: Terminal<CrosstermBackend<Stdout>>,
}

/// Gives the terminal back, once: raw mode off, mouse released, alternate screen left, cursor
/// shown; then prints the background threads' panics kept meanwhile (on stderr, on the normal
/// screen). Later calls (the guard's drop after the panic hook ran) do nothing.
pub fn restore() {
    // Stdout first, then the kept panics: the order every thread takes them in (the signal
    // thread holds stdout while it restores), so no two restores wait on each other.
    let mut out = io::stdout().lock();
    let to_print: Vec<String> = {
        let panics = lock_panics();
        if !HELD.swap(false, Ordering::SeqCst) {
            return;
        }
        let _ = disable_raw_mode();
        let _ = execute!(out, DisableMouseCapture, LeaveAlternateScreen, Show);
        let printed = PANICS_PRINTED.swap(panics.len(), Ordering::SeqCst);
        panics
            .iter()
            .skip(printed)
            .map(|p| match &p.backtrace {
                Some(backtrace) => format!("{}\n{backtrace}", p.message),
                None => p.message.clone(),
            })
            .collect()
    };
    drop(out);
    // Written after the locks are let go, and a failed write (a terminal that hung up, a full
    // disk) ignored: a panic here would run the panic hook, which takes the same lock.
    let mut err = io::stderr().lock();
    for m in to_print {
        let _ = writeln!(err, "allocview: while the dashboard ran, {m}");
    }
}

/// Installs (once) the panic hook. On the dashboard's thread it [`restore`]s the terminal,
/// then runs the hook that was there before (which prints the panic message). On another
/// thread while the dashboard holds the terminal, it keeps the message for the dashboard and
/// the restore ([`background_panics`]) instead of printing it over the screen; otherwise it
/// runs the previous hook.
pub fn install_panic_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if DRIVES_DASHBOARD.with(std::cell::Cell::get) {
                restore();
            } else {
                let mut panics = lock_panics();
                if HELD.load(Ordering::SeqCst) {
                    panics.push(BackgroundPanic::of(info));
                    return;
                }
            }
            previous(info);
        }));
    });
}

/// Starts (once) the thread that waits for [`ENDING_SIGNALS`]: on the first one it
/// [`restore`]s the terminal, removes the files given to [`remove_at_signal`] and exits with [`SIGNAL_EXIT_BASE`](crate::exit::SIGNAL_EXIT_BASE) + the signal's number. When
/// the signals cannot be caught, the dashboard runs without (the reason goes to the log).
pub fn install_signal_handler() {
    #[cfg(unix)]
    SIGNAL_THREAD.call_once(|| {
        let mut signals = match signal_hook::iterator::Signals::new(ENDING_SIGNALS) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("cannot catch SIGTERM/SIGHUP/SIGINT: {e}");
                return;
            }
        };
        let spawned = std::thread::Builder::new()
            .name("allocview-signals".into())
            .spawn(move || {
                if let Some(signal) = signals.forever().next() {
                    // Hold stdout so the dashboard's thread cannot draw after the restore.
                    let _stdout = io::stdout().lock();
                    restore();
                    end_as_signalled(signal);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the signal thread: {e}");
        }
    });
}

/// Takes the terminal (raw mode, held, alternate screen, mouse), as [`TerminalGuard::enter`]
/// does and [`suspend`] does again after `fg`; [`restore`] undoes it.
fn take_terminal() -> io::Result<()> {
    enable_raw_mode()?;
    HELD.store(true, Ordering::SeqCst);
    execute!(io::stdout(), EnterAlternateScreen, EnableMouseCapture)
}

/// Ends the process as `signal` would have: the files given to [`remove_at_signal`] removed,
/// status [`SIGNAL_EXIT_BASE`](crate::exit::SIGNAL_EXIT_BASE) + the signal's number.
#[cfg(unix)]
fn end_as_signalled(signal: i32) -> ! {
    let paths = REMOVE_AT_SIGNAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for p in paths.iter() {
        let _ = std::fs::remove_file(p);
    }
    std::process::exit(crate::exit::SIGNAL_EXIT_BASE + signal);
}

/// Ctrl-Z (which raw mode delivers as a key, not as the terminal's SIGTSTP): gives the
/// terminal back as on exit, stops the process's group as a shell's job control expects
/// (SIGTSTP to the group, as the terminal sends it),
/// and once `fg` continues it takes the terminal again; the caller then redraws the whole
/// screen. Where no shell does job control (an orphaned process group, where the kernel
/// discards SIGTSTP) the process does not stop and the dashboard simply comes back.
///
/// Returns whether the terminal was given back and taken again: `false` where the dashboard
/// does not hold it (a test's backend) or on a platform without job control.
///
/// # Errors
/// When the terminal cannot be taken again (raw mode, the alternate screen).
pub fn suspend() -> io::Result<bool> {
    #[cfg(unix)]
    {
        if !held() {
            return Ok(false);
        }
        restore();
        // The whole process group, as the terminal's own Ctrl-Z would: a program that started
        // the dashboard and waits for it (`cargo run`, a script) stops too, so the shell gets
        // its prompt back.
        if let Err(e) = rustix::process::kill_current_process_group(rustix::process::Signal::TSTP) {
            tracing::warn!("cannot stop for Ctrl-Z: {e}");
        }
        // Continued (`fg`): the terminal is the dashboard's again.
        take_terminal()?;
        Ok(true)
    }
    #[cfg(not(unix))]
    Ok(false)
}

/// Starts (once) the thread that notices the terminal going away without a SIGHUP: a window
/// closed on a dashboard with no controlling terminal (`setsid`) or one that ignores SIGHUP
/// (`nohup`). Reads of a terminal that hung up return nothing at once, and the input library
/// then reads in a loop that never returns: the dashboard spun at a full core forever. Every
/// [`HANGUP_CHECK`] the thread writes nothing to stdout; a hung-up terminal answers `EIO`, and
/// the process ends as a SIGHUP would end it (files given to [`remove_at_signal`] removed,
/// status [`SIGNAL_EXIT_BASE`](crate::exit::SIGNAL_EXIT_BASE) + SIGHUP).
pub fn install_hangup_watch() {
    #[cfg(unix)]
    HANGUP_WATCH.call_once(|| {
        use std::io::Write as _;
        use std::os::fd::AsFd as _;
        let out = match io::stdout().as_fd().try_clone_to_owned() {
            Ok(fd) => std::fs::File::from(fd),
            Err(e) => {
                tracing::warn!("cannot watch the terminal for a hang-up: {e}");
                return;
            }
        };
        let spawned = std::thread::Builder::new()
            .name("allocview-hangup".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(HANGUP_CHECK);
                    // An empty write reaches the terminal's driver without showing anything.
                    let hung_up = (&out)
                        .write(&[])
                        .is_err_and(|e| e.raw_os_error() == Some(HUNG_UP));
                    if hung_up && held() {
                        end_as_signalled(signal_hook::consts::SIGHUP);
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the hang-up watch: {e}");
        }
    });
}

impl TerminalGuard {
    /// Takes over the terminal (raw mode, alternate screen, mouse) and installs the panic hook,
    /// the signal handler and the hang-up watch.
    ///
    /// # Errors
    /// When stdout is not a terminal, or the terminal cannot be put in raw mode.
    pub fn enter() -> Result<TerminalGuard, TerminalError> {
        check_stdout()?;
        install_panic_hook();
        install_signal_handler();
        install_hangup_watch();
        DRIVES_DASHBOARD.with(|d| d.set(true));
        let entered =
            take_terminal().and_then(|()| Terminal::new(CrosstermBackend::new(io::stdout())));
        match entered {
            Ok(terminal) => Ok(TerminalGuard { terminal }),
            Err(e) => {
                restore();
                Err(e.into())
            }
        }
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_panic_on_the_dashboards_thread_gives_the_terminal_back() {
        install_panic_hook();
        // Pretend the dashboard holds the terminal (no real terminal in a test).
        HELD.store(true, Ordering::SeqCst);
        let background = std::thread::spawn(|| panic!("a background thread panics"));
        assert!(background.join().is_err());
        assert!(
            HELD.load(Ordering::SeqCst),
            "a background panic kept the screen"
        );
        let kept = background_panics();
        assert!(
            kept.iter().any(|p| p.message.contains("panicked at")
                && p.message.ends_with(": a background thread panics")),
            "its message was kept for the dashboard: {kept:?}"
        );
        let dashboard = std::thread::spawn(|| {
            DRIVES_DASHBOARD.with(|d| d.set(true));
            panic!("the dashboard's thread panics");
        });
        assert!(dashboard.join().is_err());
        assert!(
            !HELD.load(Ordering::SeqCst),
            "the dashboard's panic restored"
        );
        // A second restore (the guard's drop) does nothing more.
        restore();
        assert!(!HELD.load(Ordering::SeqCst));
    }
}
