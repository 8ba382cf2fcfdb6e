//! Entering and leaving the terminal: raw mode, the alternate screen and mouse capture, all
//! undone on exit, on error and on panic (a panic hook restores the terminal before the panic
//! message prints).

use std::io::{self, Stdout};

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use ratatui::crossterm::execute;

/// The terminal while the dashboard owns it; restores it when dropped.
pub struct TerminalGuard {
    /// The ratatui terminal.
    pub terminal: Terminal<CrosstermBackend<Stdout>>,
}

fn restore() {
    let _ = execute!(io::stdout(), DisableMouseCapture);
    ratatui::restore();
}

impl TerminalGuard {
    /// Takes over the terminal (raw mode, alternate screen, mouse) and installs the panic hook.
    ///
    /// # Errors
    /// When stdout is not a terminal that can be put in raw mode.
    pub fn enter() -> io::Result<TerminalGuard> {
        let terminal = ratatui::try_init()?;
        // ratatui's hook restores raw mode and the screen; ours also releases the mouse.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let _ = execute!(io::stdout(), DisableMouseCapture);
            previous(info);
        }));
        execute!(io::stdout(), EnableMouseCapture)?;
        Ok(TerminalGuard { terminal })
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}
