//! Entering and leaving the terminal: raw mode, the alternate screen, mouse capture and the
//! hidden cursor, all undone on exit, on error and on panic. A panic hook restores the
//! terminal before the panic message prints, so the message lands on the normal screen in
//! cooked mode; this also holds where panics abort instead of unwinding, as nothing waits for
//! the guard's `Drop`.
//!
//! Restoring happens once: leaving the alternate screen a second time would move the cursor
//! back to where the dashboard started, and the shell would then write over the panic message.
//! Only a panic on the thread that drives the dashboard restores: a background thread's panic
//! (the demo's workload) is reported by the dashboard itself, which keeps the screen.

use std::io::{self, Stdout};
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

thread_local! {
    /// Whether this thread entered the terminal (its panics restore it).
    static DRIVES_DASHBOARD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The terminal while the dashboard owns it; restores it when dropped.
pub struct TerminalGuard {
    /// The ratatui terminal.
    pub terminal: Terminal<CrosstermBackend<Stdout>>,
}

/// Gives the terminal back, once: raw mode off, mouse released, alternate screen left, cursor
/// shown. Later calls (the guard's drop after the panic hook ran) do nothing.
pub fn restore() {
    if !HELD.swap(false, Ordering::SeqCst) {
        return;
    }
    let _ = disable_raw_mode();
    let _ = execute!(
        io::stdout(),
        DisableMouseCapture,
        LeaveAlternateScreen,
        Show
    );
}

/// Installs (once) the panic hook that [`restore`]s the terminal, then runs the hook that was
/// there before (which prints the panic message).
pub fn install_panic_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if DRIVES_DASHBOARD.with(std::cell::Cell::get) {
                restore();
            }
            previous(info);
        }));
    });
}

impl TerminalGuard {
    /// Takes over the terminal (raw mode, alternate screen, mouse) and installs the panic hook.
    ///
    /// # Errors
    /// When stdout is not a terminal that can be put in raw mode.
    pub fn enter() -> io::Result<TerminalGuard> {
        install_panic_hook();
        enable_raw_mode()?;
        HELD.store(true, Ordering::SeqCst);
        DRIVES_DASHBOARD.with(|d| d.set(true));
        let entered = execute!(io::stdout(), EnterAlternateScreen, EnableMouseCapture)
            .and_then(|()| Terminal::new(CrosstermBackend::new(io::stdout())));
        match entered {
            Ok(terminal) => Ok(TerminalGuard { terminal }),
            Err(e) => {
                restore();
                Err(e)
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
