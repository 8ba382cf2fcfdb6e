//! The app: state + UI state + a source, and the one loop over input, source updates and a
//! tick (tokio-console's shape). Input becomes an [`Action`]; [`App::apply`] applies it;
//! the screen is drawn only when something changed (ratatui diffs the rest), so nothing
//! flickers and an idle dashboard costs nothing.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use allocview_alloc::snapshot::TraceAction;
use ratatui::Terminal;
use ratatui::backend::Backend;
use ratatui::crossterm::event;
use ratatui::layout::Rect;

use crate::input::{self, Action, Seek};
use crate::source::Source;
use crate::state::filter::TraceFilter;
use crate::state::passing_note::PassingNote;
use crate::state::{State, UiState, View};
use crate::view::{self, theme};

/// The dashboard.
pub struct App {
    /// What is shown.
    pub state: State,
    /// What the user is looking at.
    pub ui: UiState,
    /// Something changed since the last draw.
    pub dirty: bool,
    /// The screen area of the last draw (for mouse clicks).
    pub area: Rect,
    source: Box<dyn Source>,
    save_dir: PathBuf,
    /// The last message the app put in the status line, and when: it gives the footer's keys
    /// back after [`NOTICE_SHOWN`].
    notice: PassingNote,
    /// OOMs the process had when last polled (live): more since is a new OOM to announce.
    ooms_seen: u64,
    /// After a slow draw (a slow terminal): no draw before then (see [`App::note_draw`]).
    next_draw: Option<Instant>,
    /// Live: the newest OOM whose dump's path the status line said (its number).
    dumps_said: u64,
    /// Live: the process of the last state polled (pid and agent start time), to notice
    /// another process (a restarted service reached by a reconnect) whose OOMs are numbered
    /// from 1 again.
    process_seen: Option<(u32, Option<u64>)>,
    /// Live: the user picked a segment or block (moved, clicked, zoomed, or came from a trace
    /// row): the selection then follows that segment as the list reorders; until then it stays
    /// on the top row, whose block the detail pane describes.
    segment_picked: bool,
    /// Background threads' panics already shown in the status line
    /// ([`crate::terminal::background_panics`]).
    panics_seen: usize,
}

/// A draw that took longer than this held the loop up: the terminal takes its output slowly
/// (a slow link, a terminal that stopped reading), and the next draws wait.
pub const SLOW_DRAW: Duration = Duration::from_millis(50);
/// After a slow draw, no draw for this many times as long as it took: the terminal catches up
/// while the loop keeps reading the keys and the agent (whose queue for a dashboard that does
/// not read is bounded: it would let it go).
pub const SLOW_DRAW_BACKOFF: u32 = 2;
/// The longest a slow terminal makes the next draw wait.
pub const MAX_DRAW_WAIT: Duration = Duration::from_secs(5);

/// How long a message the app shows (a save, a reset, a pause) stays in the status line.
pub const NOTICE_SHOWN: Duration = Duration::from_secs(6);

/// Enter in the live OOM view: a live OOM has no trace to travel in.
pub const LIVE_OOM_EVENT: &str = "live OOMs have no trace to travel in: open the OOM's dump (allocview open PATH) to go to its event";
/// Enter in an OOM view without OOMs.
pub const NO_OOM_TO_OPEN: &str = "no OOM to open";
/// Enter in the segment view where its detail pane is always shown.
pub const DETAIL_ALWAYS_SHOWN: &str =
    "the selected block's detail is always shown at this width (right pane); ◀▶ pick blocks";
/// `s` for a process with a host heap only.
pub const NO_DEVICE_TO_SAVE: &str = "nothing to save: this process has no device allocator to snapshot (its host heap is on the Overview)";

/// What the status line says of a time-travel key pressed live.
pub fn file_only_key(key: char) -> String {
    format!(
        "`{key}` steps through a snapshot file's trace (allocview open FILE); live, the \
         dashboard follows the process: Space pauses, s saves a snapshot to open"
    )
}

/// What the status line says of a background thread's panic (`message` is the panic's one
/// line: `thread 'NAME' panicked at FILE:LINE:COL: MESSAGE`).
pub fn background_panic_line(message: &str) -> String {
    format!("error: {message} (the dashboard carries on; the message is printed again on exit)")
}

/// Live: the selected trace row's event left the window of recent events the agent sends (the
/// trace follows the newest event again).
pub const TRACE_ROW_LEFT: &str = "the selected event left the live window of recent events: following the \
     newest again (Space pauses to look)";

/// What identifies a trace entry across live updates (entries carry no sequence number):
/// its time, action, address and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TraceKey {
    time_us: Option<i64>,
    action: TraceAction,
    addr: u64,
    size: u64,
}

impl TraceKey {
    fn of(e: &allocview_alloc::snapshot::TraceEntry) -> TraceKey {
        TraceKey {
            time_us: e.time_us,
            action: e.action,
            addr: e.addr,
            size: e.size,
        }
    }
}

/// OOMs of a state: those the agent counted, or those it reports where it counts none.
fn ooms_count(state: &State) -> u64 {
    state.ooms_total.max(state.ooms.len() as u64)
}

impl App {
    /// An app over `source`; `s` saves snapshots into `save_dir`.
    ///
    /// # Errors
    /// When the source's first poll fails.
    pub fn new(source: Box<dyn Source>, save_dir: PathBuf) -> anyhow::Result<App> {
        let mut app = App {
            state: State::default(),
            ui: UiState {
                no_color: theme::no_color_requested(
                    std::env::var_os(theme::NO_COLOR_VAR).as_deref(),
                ),
                ascii: crate::view::ascii::ascii_requested_by_env(),
                ..UiState::default()
            },
            dirty: true,
            area: Rect::default(),
            source,
            save_dir,
            notice: PassingNote::default(),
            ooms_seen: 0,
            next_draw: None,
            dumps_said: 0,
            process_seen: None,
            panics_seen: 0,
            segment_picked: false,
        };
        app.source.poll(&mut app.state)?;
        // OOMs from before the dashboard opened are on the OOM tab, not news.
        app.ooms_seen = ooms_count(&app.state);
        app.dumps_said = app.ooms_seen;
        app.process_seen = app.process();
        Ok(app)
    }

    /// Whether the source is a file (time-travel keys apply).
    pub fn file_mode(&self) -> bool {
        self.source.is_file()
    }

    /// Polls the source (paused: lets it watch its connection); marks the screen dirty when
    /// the state changed.
    ///
    /// # Errors
    /// When the source failed for good.
    pub fn tick(&mut self) -> anyhow::Result<()> {
        if self.ui.paused {
            if self.source.watch_while_paused(&mut self.state)? {
                self.dirty = true;
            }
        } else {
            let selected = self.selected_live_trace_entry();
            let segment = self.selected_live_segment();
            let status = self.state.status.clone();
            if self.source.poll(&mut self.state)? {
                self.dirty = true;
                self.notice_another_process();
                self.announce_new_ooms();
                self.announce_dumps();
                // A message of this tick (an OOM, a dump, the source's) is not replaced.
                let said = self.state.status.is_some() && self.state.status != status;
                if let Some(key) = selected {
                    self.keep_trace_selection(key, !said);
                }
                if let Some(at) = segment.filter(|_| self.segment_picked) {
                    self.keep_segment_selection(at);
                }
            }
        }
        self.show_background_panics();
        self.expire_notice(Instant::now());
        Ok(())
    }

    /// Puts the newest panic of a background thread (a file's what-if replays, the demo's
    /// workload) that the terminal's panic hook kept instead of printing over the screen in
    /// the status line, where it stays until another message replaces it; the terminal's
    /// restore prints them all again on exit.
    pub fn show_background_panics(&mut self) {
        if let Some((kept, newest)) = crate::terminal::newest_background_panic(self.panics_seen) {
            self.panics_seen = kept;
            self.state.status = Some(background_panic_line(&newest));
            // An error stays: it is not a notice that expires.
            self.notice.forget();
            self.dirty = true;
        }
    }

    /// Clears the app's last message from the status line once it has been shown
    /// [`NOTICE_SHOWN`] by `now` (a message the source put there since stays).
    pub fn expire_notice(&mut self, now: Instant) {
        if self
            .notice
            .expire(&mut self.state.status, NOTICE_SHOWN, now)
        {
            self.dirty = true;
        }
    }

    /// Live, with a trace row the user selected: what identifies its entry, so that the row
    /// stays on it while new events push the window of recent events along.
    fn selected_live_trace_entry(&self) -> Option<TraceKey> {
        if self.file_mode() {
            return None;
        }
        let row = self.ui.trace_row?;
        let rows = self.state.trace_rows(&self.ui.trace_filter);
        let i = *rows.get(row)?;
        Some(TraceKey::of(&self.state.trace[i]))
    }

    /// After a live update: the selected trace row moves to where its entry is now; once the
    /// entry left the window of recent events, the trace follows the newest again (a row on
    /// the oldest would leave it the next one out) and says so, once, where `say` (no other
    /// message came this tick).
    fn keep_trace_selection(&mut self, key: TraceKey, say: bool) {
        let rows = self.state.trace_rows(&self.ui.trace_filter);
        let at = rows
            .iter()
            .rposition(|&i| TraceKey::of(&self.state.trace[i]) == key);
        match at {
            Some(row) => self.ui.trace_row = Some(row),
            None => {
                self.ui.trace_row = None;
                if say && self.ui.view == View::Trace {
                    self.status(TRACE_ROW_LEFT);
                }
            }
        }
    }

    /// Live: the selected segment's address and the selected block's, so that the selection
    /// stays on them while segments come, go and change size (the list is ordered by size).
    fn selected_live_segment(&self) -> Option<(u64, u64)> {
        if self.file_mode() {
            return None;
        }
        let seg = &self.state.segments[self.state.selected_segment(&self.ui)?];
        let block = seg
            .blocks
            .get(self.ui.block)
            .map_or(seg.address, |b| b.address);
        Some((seg.address, block))
    }

    /// After a live update: the segment row moves to where the selected segment is now, and
    /// the block to the one holding the selected block's address (blocks split and merge). A
    /// segment that is gone leaves the row where it was.
    fn keep_segment_selection(&mut self, (segment, block): (u64, u64)) {
        let order = self.state.segment_order(self.ui.segment_filter);
        let Some(row) = order
            .iter()
            .position(|&i| self.state.segments[i].address == segment)
        else {
            return;
        };
        self.ui.segment_row = row;
        let blocks = &self.state.segments[order[row]].blocks;
        self.ui.block = blocks.iter().rposition(|b| b.address <= block).unwrap_or(0);
    }

    fn rows_in_view(&self) -> usize {
        match self.ui.view {
            View::Segments => self.state.segment_order(self.ui.segment_filter).len(),
            View::Streams => self.state.stream_rows().len(),
            View::Trace => self.state.trace_rows(&self.ui.trace_filter).len(),
            View::Oom => self.state.ooms.len(),
            _ => 0,
        }
    }

    fn current_row(&self) -> usize {
        match self.ui.view {
            View::Segments => self.ui.segment_row,
            View::Streams => self.ui.stream_row,
            View::Trace => self.ui.trace_row.unwrap_or_else(|| {
                let rows = self.state.trace_rows(&self.ui.trace_filter);
                self.state.default_trace_row(&rows)
            }),
            View::Oom => self.ui.oom,
            _ => 0,
        }
    }

    fn set_row(&mut self, row: usize) {
        let n = self.rows_in_view();
        let row = row.min(n.saturating_sub(1));
        match self.ui.view {
            View::Segments => {
                if row != self.ui.segment_row {
                    self.ui.block = 0;
                }
                self.ui.segment_row = row;
                self.segment_picked = true;
            }
            View::Streams => self.ui.stream_row = row,
            // Live, the last row follows the newest event; another stays on its event.
            View::Trace if !self.file_mode() && row + 1 >= n => self.ui.trace_row = None,
            View::Trace => self.ui.trace_row = Some(row),
            View::Oom => {
                if row != self.ui.oom {
                    self.ui.oom_scroll = 0;
                }
                self.ui.oom = row;
            }
            _ => {}
        }
    }

    fn selected_segment_blocks(&self) -> usize {
        self.state
            .selected_segment(&self.ui)
            .map_or(0, |i| self.state.segments[i].blocks.len())
    }

    /// Live: another process than before (its pid or start time changed, or its OOM count went
    /// down: a restarted service reached by a reconnect) starts the OOMs and dumps said over; its OOMs
    /// so far are on the OOM tab, not news.
    fn notice_another_process(&mut self) {
        if self.file_mode() {
            return;
        }
        let count = ooms_count(&self.state);
        let process = self.process();
        let other =
            process.is_some() && self.process_seen.is_some() && process != self.process_seen;
        if other || count < self.ooms_seen {
            self.ooms_seen = count;
            self.dumps_said = count;
        }
        if process.is_some() {
            self.process_seen = process;
        }
    }

    /// The watched process: its pid and its agent's start time (a restarted process in a
    /// container keeps its pid, not its start time).
    fn process(&self) -> Option<(u32, Option<u64>)> {
        self.state
            .source
            .pid
            .map(|pid| (pid, self.state.source.started_ns))
    }

    /// Live: a status line for OOMs that happened since the last poll, once each
    /// (`OOM #3: tried to allocate 1.00 GiB — press 7`).
    fn announce_new_ooms(&mut self) {
        let count = ooms_count(&self.state);
        if self.file_mode() || count <= self.ooms_seen {
            self.ooms_seen = count;
            return;
        }
        let new = count - self.ooms_seen;
        self.ooms_seen = count;
        // `press 7` shows the OOM the line names (the view opened on the first OOM); one
        // already reading the OOM view keeps their place.
        if self.ui.view != View::Oom && !self.state.ooms.is_empty() {
            self.ui.oom = self.state.ooms.len() - 1;
            self.ui.oom_scroll = 0;
        }
        let newest = match self.state.ooms.last() {
            Some(o) if o.event_lost => format!("OOM #{} (its request was lost)", o.number),
            Some(o) => format!(
                "OOM #{}: tried to allocate {}",
                o.number,
                crate::units::bytes(o.requested)
            ),
            None => format!("OOM #{count}"),
        };
        let mut msg = if new == 1 {
            format!("{newest} — press 7")
        } else {
            format!("{new} new OOMs, the last {newest} — press 7")
        };
        // Its snapshot already written: where, in the same line.
        if let Some(o) = self.state.ooms.last()
            && !o.dump_pending
            && let Some(path) = &o.dump_path
        {
            msg.push_str(&format!(" · snapshot {}", crate::output::shown_path(path)));
            self.dumps_said = self.dumps_said.max(o.number);
        }
        self.status(msg);
    }

    /// Live: once the dump of an OOM that happened while the dashboard watched is written
    /// (off the agent's thread, after the OOM itself was announced), the status line gives
    /// its path and how to open it.
    fn announce_dumps(&mut self) {
        if self.file_mode() {
            return;
        }
        let landed = self
            .state
            .ooms
            .iter()
            .rev()
            .find(|o| o.number > self.dumps_said && !o.dump_pending && o.dump_path.is_some());
        let Some(o) = landed else { return };
        let number = o.number;
        let path = crate::output::shown_path(o.dump_path.as_deref().unwrap_or_default());
        self.dumps_said = number;
        self.status(format!(
            "OOM #{number}'s snapshot: {path} (allocview open {path}; 7 shows the OOM)"
        ));
    }

    /// Shows `msg` in the status line for [`NOTICE_SHOWN`] (what happened before the screen
    /// opened, say).
    pub fn status(&mut self, msg: impl Into<String>) {
        self.notice
            .say(&mut self.state.status, msg.into(), Instant::now());
    }

    /// Applies one intent.
    ///
    /// # Errors
    /// When the source fails while serving it (saving is reported in the status line, not as
    /// an error).
    pub fn apply(&mut self, action: Action) -> anyhow::Result<()> {
        self.dirty = true;
        match action {
            Action::Quit => self.ui.quit = true,
            // The loop ([`run`]) suspends: it holds the terminal.
            Action::Suspend => {}
            Action::ToggleHelp => {
                self.ui.help = !self.ui.help;
                self.ui.help_scroll = 0;
            }
            // The open help overlay takes the moves: it scrolls.
            Action::Move(d) if self.ui.help => {
                let max = view::help::scroll_max(self.area);
                self.ui.help_scroll =
                    (self.ui.help_scroll.min(max) as i64 + d).clamp(0, max as i64) as usize;
            }
            Action::Top if self.ui.help => self.ui.help_scroll = 0,
            Action::Bottom if self.ui.help => {
                self.ui.help_scroll = view::help::scroll_max(self.area)
            }
            Action::NextView => self.show(self.ui.view.next()),
            Action::PrevView => self.show(self.ui.view.prev()),
            Action::ShowView(v) => self.show(v),
            Action::Move(d) => {
                let row = (self.current_row() as i64 + d).max(0) as usize;
                self.set_row(row);
            }
            Action::ScrollOom(pages) => {
                let body = view::regions(self.area).body;
                let (page, max) = view::oom::scroll_range(body, &self.state, &self.ui);
                let by = pages.saturating_mul(page as i64);
                self.ui.oom_scroll =
                    (self.ui.oom_scroll.min(max) as i64 + by).clamp(0, max as i64) as usize;
            }
            Action::Top => self.set_row(0),
            Action::Bottom => self.set_row(usize::MAX),
            Action::Left => match self.ui.view {
                View::Segments => {
                    self.ui.block = self.ui.block.saturating_sub(1);
                    self.segment_picked = true;
                }
                View::Histograms => {
                    let n = view::histograms::groups(&self.state, self.ui.histogram_by)
                        .len()
                        .max(1);
                    self.ui.histogram_group = (self.ui.histogram_group + n - 1) % n;
                }
                _ => {}
            },
            Action::Right => match self.ui.view {
                View::Segments => {
                    let n = self.selected_segment_blocks();
                    self.ui.block = (self.ui.block + 1).min(n.saturating_sub(1));
                    self.segment_picked = true;
                }
                View::Histograms => {
                    let n = view::histograms::groups(&self.state, self.ui.histogram_by)
                        .len()
                        .max(1);
                    self.ui.histogram_group = (self.ui.histogram_group + 1) % n;
                }
                _ => {}
            },
            Action::Enter => match self.ui.view {
                View::Trace => self.jump_to_block()?,
                View::Oom if self.file_mode() => self.jump_to_oom()?,
                View::Oom if self.state.ooms.is_empty() => self.status(NO_OOM_TO_OPEN),
                View::Oom => self.status(LIVE_OOM_EVENT),
                View::Segments if self.area.width >= view::segments::MIN_WIDTH_WITH_DETAIL => {
                    self.status(DETAIL_ALWAYS_SHOWN)
                }
                View::Segments => self.ui.detail = !self.ui.detail,
                v => self.status(format!(
                    "Enter opens nothing in the {} view: it selects in Segments, Trace and OOM",
                    v.title()
                )),
            },
            Action::Back => {
                if self.ui.filter_input.is_some() {
                    self.ui.filter_input = None;
                } else if self.ui.help {
                    self.ui.help = false;
                } else if self.ui.zoom && self.ui.view == View::Segments {
                    self.ui.zoom = false;
                } else if self.ui.detail {
                    self.ui.detail = false;
                } else if !self.ui.trace_filter.is_empty() && self.ui.view == View::Trace {
                    self.ui.trace_filter = TraceFilter::default();
                    self.ui.trace_row = None;
                } else {
                    self.state.status = None;
                }
            }
            Action::StartFilter => {
                self.ui.filter_input = Some(self.ui.trace_filter.text.clone());
                self.ui.view = View::Trace;
            }
            Action::FilterChar(c) => {
                if let Some(s) = &mut self.ui.filter_input {
                    s.push(c);
                }
            }
            Action::FilterBackspace => {
                if let Some(s) = &mut self.ui.filter_input {
                    s.pop();
                }
            }
            Action::FilterClear => {
                if let Some(s) = &mut self.ui.filter_input {
                    s.clear();
                }
            }
            Action::FilterDeleteWord => {
                if let Some(s) = &mut self.ui.filter_input {
                    let kept = s.trim_end().rfind(' ').map_or(0, |i| i + 1);
                    s.truncate(kept);
                }
            }
            Action::FilterApply => {
                let text = self.ui.filter_input.take().unwrap_or_default();
                match TraceFilter::parse(&text) {
                    Ok(f) => {
                        self.ui.trace_filter = f;
                        self.ui.trace_row = None;
                        self.state.status = None;
                    }
                    Err(e) => self.status(e.to_string()),
                }
            }
            Action::CycleSegmentFilter => {
                self.ui.segment_filter = self.ui.segment_filter.next();
                self.ui.segment_row = 0;
                self.ui.block = 0;
                self.segment_picked = false;
            }
            Action::ToggleZoom => {
                self.ui.zoom = !self.ui.zoom;
                self.segment_picked = true;
            }
            Action::CycleChartSpan => {
                let file = self.file_mode();
                self.ui.cycle_chart_span(file);
            }
            Action::HistogramsBy(g) => {
                self.ui.histogram_by = self.ui.histogram_by.toggle(g);
                self.ui.histogram_group = 0;
            }
            Action::TogglePause => {
                let paused = !self.ui.paused;
                let msg = self.source.set_paused(paused)?;
                if !self.file_mode() {
                    self.ui.paused = paused;
                    if paused {
                        self.state.mode = crate::state::Mode::Paused;
                    } else {
                        self.source.poll(&mut self.state)?;
                    }
                }
                self.status(msg);
            }
            Action::ResetPeaks => {
                let msg = self.source.reset_peaks()?;
                self.status(msg);
            }
            Action::FileOnly(key) => {
                self.status(file_only_key(key));
            }
            Action::Save if self.state.is_host_only() => self.status(NO_DEVICE_TO_SAVE),
            Action::Save => {
                let msg = match self.source.save(&self.state, &self.save_dir) {
                    Ok(p) => format!("saved snapshot to {}", p.display()),
                    Err(e) => format!("could not save a snapshot: {e:#}"),
                };
                self.status(msg);
            }
            Action::Seek(s) => {
                self.source.seek(s, &mut self.state)?;
                // The trace view follows the new position.
                self.ui.trace_row = None;
                if s == Seek::NextOom {
                    self.select_oom_at_cursor();
                }
            }
            // A click while the help covers the screen closes it (it chose a tab or row
            // under the overlay, unseen).
            Action::Click { .. } if self.ui.help => self.ui.help = false,
            Action::Click { x, y } => self.click(x, y),
            Action::Resize => {}
        }
        Ok(())
    }

    fn show(&mut self, v: View) {
        self.ui.view = v;
        self.ui.detail = false;
    }

    /// After `n` moved to an OOM's event: selects that OOM, so the OOM view (which lists from
    /// the selected one down) scrolls to it.
    fn select_oom_at_cursor(&mut self) {
        let Some(cursor) = self.state.trace_cursor else {
            return;
        };
        let at = |o: &crate::state::OomReport| o.trace_index.is_some_and(|i| i + 1 == cursor);
        if let Some(i) = self.state.ooms.iter().position(at) {
            self.ui.oom = i;
        }
    }

    /// In a file: moves to the selected OOM's event and shows the segments then.
    fn jump_to_oom(&mut self) -> anyhow::Result<()> {
        let sel = self.ui.oom.min(self.state.ooms.len().saturating_sub(1));
        if let Some(i) = self.state.ooms.get(sel).and_then(|o| o.trace_index) {
            self.source.seek(Seek::To(i + 1), &mut self.state)?;
            self.ui.trace_row = None;
            self.ui.segment_row = 0;
            self.ui.block = 0;
            self.show(View::Segments);
        }
        Ok(())
    }

    /// Enter on an `oom` trace row (entry `i`): in a file, travels to just after it; shows the
    /// OOM view with that OOM selected.
    fn show_oom_of_entry(&mut self, i: usize) -> anyhow::Result<()> {
        if self.file_mode() {
            self.source.seek(Seek::To(i + 1), &mut self.state)?;
        }
        let time = self.state.trace[i].time_us;
        let at = |o: &crate::state::OomReport| match o.trace_index {
            Some(t) => t == i,
            // Live, the reports carry no trace index: the OOM of the entry's time.
            None => time.is_some() && o.time_us == time,
        };
        match self.state.ooms.iter().position(at) {
            Some(o) => {
                self.ui.oom = o;
                self.show(View::Oom);
            }
            None => self.status("this OOM has no report (it is older than the reports kept)"),
        }
        Ok(())
    }

    /// The block of the selected trace row in the segment view. In a file, time travels to
    /// the row's event first (as PyTorch's memory_viz does): to just after it, or just before
    /// an event that removes its block or segment, so the block is there to see.
    fn jump_to_block(&mut self) -> anyhow::Result<()> {
        // Memoized: the rows `current_row` reads are these.
        let rows = self.state.trace_rows(&self.ui.trace_filter);
        let row = self.current_row();
        let Some(&i) = rows.get(row) else {
            return Ok(());
        };
        let (addr, action) = (self.state.trace[i].addr, self.state.trace[i].action);
        if action == TraceAction::Oom {
            // An OOM has no block (its address field is the device's free memory): its report.
            return self.show_oom_of_entry(i);
        }
        if self.file_mode() {
            let removes = matches!(
                action,
                TraceAction::FreeCompleted | TraceAction::SegmentFree | TraceAction::SegmentUnmap
            );
            self.source
                .seek(Seek::To(if removes { i } else { i + 1 }), &mut self.state)?;
            self.ui.trace_row = Some(row);
        }
        match self.state.find_block(addr) {
            Some((seg, block)) => {
                self.ui.segment_filter = crate::state::ui::SegmentFilter::All;
                let order = self.state.segment_order(self.ui.segment_filter);
                self.ui.segment_row = order.iter().position(|&s| s == seg).unwrap_or(0);
                self.ui.block = block;
                self.segment_picked = true;
                self.ui.view = View::Segments;
                self.ui.detail = true;
            }
            None => self.status(format!(
                "{} is in no segment at this point",
                crate::units::address(addr)
            )),
        }
        Ok(())
    }

    fn click(&mut self, x: u16, y: u16) {
        if view::too_small(self.area) {
            // Only the too-small message is on screen.
            return;
        }
        if let Some(v) = view::tab_at(self.area, x, y) {
            self.show(v);
            return;
        }
        let body = view::regions(self.area).body;
        if self.ui.view == View::Segments && self.ui.zoom {
            self.click_zoomed(body, x, y);
            return;
        }
        // Lists start below the border (segments) or the border and a heading (the others).
        let first_row = match self.ui.view {
            View::Segments => body.y + 1,
            View::Streams | View::Trace => body.y + 2,
            _ => return,
        };
        if y < first_row || y >= body.bottom().saturating_sub(1) || x < body.x || x >= body.right()
        {
            return;
        }
        let visible = body.bottom().saturating_sub(first_row + 1) as usize;
        let offset = match self.ui.view {
            View::Streams => 0,
            _ => view::segments::scroll_offset(self.current_row(), visible),
        };
        self.set_row(offset + (y - first_row) as usize);
    }

    /// A click on a zoomed segment selects the block drawn under it.
    fn click_zoomed(&mut self, body: Rect, x: u16, y: u16) {
        let inner = view::segments::list_inner(body, &self.ui);
        if !inner.contains(ratatui::layout::Position { x, y }) {
            return;
        }
        let Some(i) = self.state.selected_segment(&self.ui) else {
            return;
        };
        if let Some(b) = view::segments::zoom_block_at(
            &self.state.segments[i],
            inner.width as usize,
            inner.height as usize,
            (x - inner.x) as usize,
            (y - inner.y) as usize,
        ) {
            self.ui.block = b;
            self.segment_picked = true;
        }
    }

    /// Draws into a terminal when dirty, unless a slow terminal made the draw wait (see
    /// [`App::note_draw`]): it stays dirty for a later one.
    ///
    /// # Errors
    /// When the terminal cannot be written.
    pub fn draw<B: Backend>(&mut self, terminal: &mut Terminal<B>) -> anyhow::Result<()>
    where
        B::Error: Send + Sync + 'static,
    {
        if !self.dirty || !self.draw_due(Instant::now()) {
            return Ok(());
        }
        let started = Instant::now();
        let frame = terminal.draw(|f| view::draw(f, &self.state, &self.ui))?;
        self.area = frame.area;
        self.dirty = false;
        self.note_draw(started.elapsed(), Instant::now());
        Ok(())
    }

    /// A draw took `took`, ending at `now`: over [`SLOW_DRAW`], the next waits
    /// [`SLOW_DRAW_BACKOFF`] times as long (at most [`MAX_DRAW_WAIT`]), so that a terminal that
    /// takes its output slowly does not hold the loop up draw after draw (keys unread, the
    /// agent's updates piling up); a quick draw lifts the wait.
    pub fn note_draw(&mut self, took: Duration, now: Instant) {
        self.next_draw =
            (took > SLOW_DRAW).then(|| now + (took * SLOW_DRAW_BACKOFF).min(MAX_DRAW_WAIT));
    }

    /// Whether a draw may happen at `now` (no slow draw made it wait).
    pub fn draw_due(&self, now: Instant) -> bool {
        self.next_draw.is_none_or(|t| now >= t)
    }
}

/// Environment variable that makes the dashboard panic on purpose right after drawing its
/// first frame: how the tests prove that a panic gives the terminal back. Never set for users.
pub const PANIC_AFTER_FIRST_FRAME_ENV: &str = "ALLOCVIEW_TEST_PANIC_AFTER_FIRST_FRAME";

/// Runs the loop until the user quits: draw when dirty; wait for input until the next tick;
/// apply input; on each tick poll the source.
///
/// # Errors
/// Terminal I/O errors and source failures.
pub fn run<B: Backend>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    tick: Duration,
) -> anyhow::Result<()>
where
    B::Error: Send + Sync + 'static,
{
    let mut last_tick = Instant::now();
    let panic_on_purpose = std::env::var_os(PANIC_AFTER_FIRST_FRAME_ENV).is_some();
    loop {
        app.draw(terminal)?;
        if panic_on_purpose {
            panic!("{PANIC_AFTER_FIRST_FRAME_ENV} is set: panicking after the first frame");
        }
        let timeout = tick.saturating_sub(last_tick.elapsed());
        if event::poll(timeout)? {
            let e = event::read()?;
            match input::event(&e, &app.ui, app.file_mode()) {
                // Back from `fg`: the screen is the shell's; draw all of it.
                Some(Action::Suspend) if crate::terminal::suspend()? => {
                    terminal.clear()?;
                    app.dirty = true;
                }
                Some(Action::Suspend) => {}
                Some(a) => app.apply(a)?,
                None => {}
            }
        }
        if app.ui.quit {
            return Ok(());
        }
        if last_tick.elapsed() >= tick {
            app.tick()?;
            last_tick = Instant::now();
        }
    }
}
