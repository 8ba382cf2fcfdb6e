//! Printing results to stdout for scripts: a closed pipe (`allocview ... | head`) ends the
//! output quietly instead of panicking as `println!` would.

use std::io::{self, Write};

/// Writes `text` and a newline to stdout; a closed pipe is not an error.
///
/// # Errors
/// Other write errors.
pub fn print(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}
