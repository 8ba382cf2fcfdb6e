//! View 6, Trace: the event log (time, action, address, size, stream, pool, context), filtered
//! with `/` (action, stream, size range, address); in file mode the entries after the current
//! event are dimmed and the current one is marked.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use allocview_alloc::caching::config::SMALL_BUFFER;
use allocview_alloc::snapshot::{SegmentType, TraceAction, TraceEntry};

use super::segments::scroll_offset;
use super::{left, put, right, theme};
use crate::state::timetravel::SMALL_SIZE;
use crate::state::{State, UiState};
use crate::units;

/// Microseconds per second.
const US_PER_S: f64 = 1e6;
/// What the views say where there is no trace.
pub const NO_TRACE: &str = "no trace recorded";
/// The PyTorch call that makes a snapshot carry a trace.
pub const RECORD_HISTORY: &str = "torch.cuda.memory._record_memory_history()";

fn action_style(a: TraceAction) -> Style {
    match a {
        TraceAction::Alloc => Style::new().fg(theme::ALLOCATED),
        TraceAction::FreeRequested => Style::new().fg(theme::PENDING),
        TraceAction::FreeCompleted => Style::new().fg(theme::FREE),
        TraceAction::SegmentAlloc | TraceAction::SegmentMap => Style::new().fg(theme::RESERVED),
        TraceAction::SegmentFree | TraceAction::SegmentUnmap => Style::new().fg(theme::ACTIVE),
        TraceAction::Oom => theme::alert(),
        TraceAction::Snapshot | TraceAction::UserDefined => Style::new().fg(theme::ACCENT),
    }
}

/// The pool column of an entry: `S` (small) or `L` (large). Trace entries carry no pool (not
/// in PyTorch's files, not in ours), so it is told as PyTorch's caching allocator decides it
/// (caching-allocator-spec.md, `get_pool` / `get_allocation_size`):
/// - a block (`alloc`, `free_*`) or an `oom`: its request rounded to 512 bytes is at most
///   [`SMALL_SIZE`] (1 MiB) in the small pool;
/// - a segment map/unmap (expandable segments): the pool of the segment holding its address,
///   when the state still has it; else as a segment alloc/free;
/// - a segment alloc/free: small-pool segments are exactly [`SMALL_BUFFER`] (2 MiB); large-pool
///   ones are [`LARGE_BUFFER`](allocview_alloc::caching::config::LARGE_BUFFER) (20 MiB) or a request of at least 10 MiB rounded to 2 MiB, never
///   2 MiB.
fn pool_letter(state: &State, e: &TraceEntry) -> &'static str {
    let small = match e.action {
        TraceAction::SegmentAlloc | TraceAction::SegmentFree => e.size == SMALL_BUFFER,
        TraceAction::SegmentMap | TraceAction::SegmentUnmap => state
            .find_segment(e.addr)
            .map_or(e.size == SMALL_BUFFER, |s| {
                state.segments[s].segment_type == SegmentType::Small
            }),
        TraceAction::Snapshot | TraceAction::UserDefined => return " ",
        _ => e.size <= SMALL_SIZE,
    };
    if small { "S" } else { "L" }
}

/// The context column: the entry's tags, user frame and metadata
/// ([`context::summary`](crate::state::context::summary)).
fn context(e: &TraceEntry) -> String {
    crate::state::context::summary(&e.frames, e.user_metadata.as_deref())
}

/// Width of the time column's figure.
const TIME_WIDTH: usize = 8;

/// Seconds since the origin in at most [`TIME_WIDTH`] cells: milliseconds while they fit
/// (`12.345 s`), fewer decimals further on (`1234.5 s`), then [`units::elapsed`] (`27.8 h`).
fn time_column(secs: f64) -> String {
    (0..=3)
        .rev()
        .map(|decimals| format!("{secs:.decimals$} s"))
        .find(|s| s.chars().count() <= TIME_WIDTH)
        .unwrap_or_else(|| units::elapsed(secs))
}

/// Draws the trace table.
pub fn render(area: Rect, buf: &mut Buffer, state: &State, ui: &UiState) {
    let rows = state.trace_rows(&ui.trace_filter);
    let filter = if ui.trace_filter.is_empty() {
        String::new()
    } else {
        format!(" filter: {} ", ui.trace_filter.text)
    };
    let mut title = vec![Span::styled(
        format!(
            " Trace ({} of {}) ",
            units::count(rows.len() as u64),
            units::count(state.trace.len() as u64)
        ),
        theme::title(),
    )];
    // Live, the agent sends its newest events only, and events it dropped are missing from
    // them: said, so that a gap is not read as nothing happening.
    if !state.is_file() && !state.trace.is_empty() {
        title.push(Span::styled("the newest events ", theme::dim()));
        if state.source.dropped > 0 {
            title.push(Span::styled(
                format!("· {} dropped: gaps ", units::count(state.source.dropped)),
                theme::alert(),
            ));
        }
    }
    let block = Block::bordered()
        .title(Line::from(title))
        .title(Line::styled(filter, Style::new().fg(theme::PENDING)).right_aligned());
    let inner = block.inner(area);
    block.render(area, buf);
    let head = format!(
        "{} {}{}{}{}  {}",
        right("time", 9),
        left("action", 14),
        right("address", 15),
        right("size", 9),
        right("strm", 5),
        "pool context"
    );
    put(buf, inner, 0, &Line::styled(head, theme::title()));
    if rows.is_empty() {
        let msg = if state.trace.is_empty() {
            if state.is_file() {
                format!("{NO_TRACE} in this file: PyTorch records one while {RECORD_HISTORY} is on")
            } else {
                NO_TRACE.to_string()
            }
        } else {
            "no entry matches the filter (/ to change it)".to_string()
        };
        super::put_wrapped(buf, inner, 1, &msg, theme::dim());
        return;
    }
    let visible = inner.height.saturating_sub(1) as usize;
    let selected = ui
        .trace_row
        .unwrap_or_else(|| state.default_trace_row(&rows))
        .min(rows.len() - 1);
    let offset = scroll_offset(selected, visible);
    // The chart's origin (live: the process start), so an event keeps its time as older ones
    // roll out of the recent tail; without one, the first entry's time.
    let t0 = state
        .timeline
        .origin_us
        .or_else(|| state.trace.first().and_then(|e| e.time_us));
    for (r, &i) in rows.iter().skip(offset).take(visible).enumerate() {
        let e = &state.trace[i];
        let time = match (e.time_us, t0) {
            (Some(t), Some(t0)) => time_column((t - t0) as f64 / US_PER_S),
            _ => format!("#{}", units::count(i as u64 + 1)),
        };
        let pool = pool_letter(state, e);
        let future = state.trace_cursor.is_some_and(|c| i >= c);
        let current = state.trace_cursor.is_some_and(|c| c > 0 && i == c - 1);
        let mut base = if future { theme::dim() } else { Style::new() };
        if offset + r == selected {
            base = base.add_modifier(Modifier::REVERSED);
        }
        let marker = if current { "▶" } else { " " };
        // An OOM entry's address field holds the device's free memory.
        let addr = if e.action == TraceAction::Oom {
            format!("free {}", units::bytes(e.addr))
        } else {
            units::address(e.addr)
        };
        let line = Line::from(vec![
            Span::styled(format!("{}{} ", marker, right(&time, TIME_WIDTH)), base),
            Span::styled(
                left(e.action.as_str(), 14),
                if future {
                    base
                } else {
                    action_style(e.action).patch(base)
                },
            ),
            Span::styled(
                format!(
                    "{}{}{}  {}    {}",
                    right(&addr, 15),
                    right(&units::bytes(e.size), 9),
                    right(&format!("s{}", e.stream), 5),
                    pool,
                    context(e)
                ),
                base,
            ),
        ]);
        put(buf, inner, r as u16 + 1, &line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::View;
    use crate::view::testing::view_text;
    use std::sync::Arc;

    #[test]
    fn a_live_trace_says_it_holds_the_newest_events_and_when_drops_left_gaps() {
        let mut state = State {
            trace: Arc::from(vec![TraceEntry::new(TraceAction::Alloc, 0x1000, 512, 0)]),
            ..State::default()
        };
        let t = view_text(View::Trace, &state, 100, 10);
        assert!(t.contains("Trace (1 of 1) the newest events"), "{t}");
        assert!(!t.contains("dropped"), "{t}");
        state.source.dropped = 1234;
        let t = view_text(View::Trace, &state, 100, 10);
        assert!(t.contains("· 1,234 dropped: gaps"), "{t}");
    }

    /// The pool letter of each trace row of `state`, with the row's action.
    fn pools_shown(state: &State) -> Vec<(String, String)> {
        view_text(View::Trace, state, 100, 20)
            .lines()
            .filter_map(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                let s0 = words.iter().position(|w| *w == "s0")?;
                let action = words
                    .iter()
                    .find(|w| w.contains('_') || **w == "alloc" || **w == "oom")?;
                Some((action.to_string(), words.get(s0 + 1)?.to_string()))
            })
            .collect()
    }

    #[test]
    fn small_pool_segments_and_blocks_show_s_and_large_ones_l() {
        let mib = 1u64 << 20;
        let state = State {
            trace: Arc::from(vec![
                TraceEntry::new(TraceAction::SegmentAlloc, 0x7000_0000, 2 * mib, 0),
                TraceEntry::new(TraceAction::Alloc, 0x7000_0000, 512, 0),
                TraceEntry::new(TraceAction::SegmentAlloc, 0x8000_0000, 20 * mib, 0),
                TraceEntry::new(TraceAction::Alloc, 0x8000_0000, 2 * mib, 0),
                TraceEntry::new(TraceAction::SegmentAlloc, 0x9000_0000, 12 * mib, 0),
                TraceEntry::new(TraceAction::Oom, 1 << 30, 4096, 0),
                TraceEntry::new(TraceAction::SegmentFree, 0x7000_0000, 2 * mib, 0),
            ]),
            ..State::default()
        };
        let shown = pools_shown(&state);
        let expect = [
            ("segment_alloc", "S"),
            ("alloc", "S"),
            ("segment_alloc", "L"),
            ("alloc", "L"),
            ("segment_alloc", "L"),
            ("oom", "S"),
            ("segment_free", "S"),
        ];
        let expect: Vec<(String, String)> = expect
            .iter()
            .map(|(a, p)| (a.to_string(), p.to_string()))
            .collect();
        assert_eq!(shown, expect);
    }

    #[test]
    fn trace_times_fit_their_column_however_long_the_process_runs() {
        assert_eq!(time_column(66.25), "66.250 s");
        assert_eq!(time_column(123.4567), "123.46 s");
        assert_eq!(time_column(4_321.06), "4321.1 s");
        assert_eq!(time_column(54_321.4), "54321 s");
        assert_eq!(time_column(200_000.0), "200000 s");
        assert!(time_column(1e7).ends_with(" h"), "{}", time_column(1e7));
        for secs in [0.0, 99.9999, 999.996, 9_999.96, 99_999.6, 1e9] {
            assert!(time_column(secs).chars().count() <= TIME_WIDTH, "{secs}");
        }
    }
}
