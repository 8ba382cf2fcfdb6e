//! [`PassingNote`]: a message put in the status line for a while, then taken back unless
//! something replaced it meanwhile.

use std::time::{Duration, Instant};

/// The last passing message one party (the app, a source) put in the status line, and when.
#[derive(Debug, Clone, Default)]
pub struct PassingNote(Option<(String, Instant)>);

impl PassingNote {
    /// Puts `msg` in `status` as of `now`.
    pub fn say(&mut self, status: &mut Option<String>, msg: String, now: Instant) {
        self.0 = Some((msg.clone(), now));
        *status = Some(msg);
    }

    /// Forgets the message (it stays in the status line: an error, say, is not passing).
    pub fn forget(&mut self) {
        self.0 = None;
    }

    /// Once the message has been shown for `shown` by `now`, takes it out of `status` if it is
    /// still there; whether it did.
    pub fn expire(&mut self, status: &mut Option<String>, shown: Duration, now: Instant) -> bool {
        let Some((msg, since)) = &self.0 else {
            return false;
        };
        if now.saturating_duration_since(*since) < shown {
            return false;
        }
        let cleared = status.as_ref() == Some(msg);
        if cleared {
            *status = None;
        }
        self.0 = None;
        cleared
    }
}
