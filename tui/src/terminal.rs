//! Entering and leaving the terminal: raw mode, the alternate screen, mouse capture and the
//! hidden cursor, all undone on exit, on error and on panic. A panic hook restores the
//! terminal before the panic message prints, so the message lands on the normal screen in
//! cooked mode; this also holds where panics abort instead of unwinding, as nothing waits for
//! the guard's `Drop`.
//!
//! Restoring happens once: leaving the alternate screen a second time would move the cursor
//! back to where the dashboard started, and the shell would then write over the panic message.

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
            restore();
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
