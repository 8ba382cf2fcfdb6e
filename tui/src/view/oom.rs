//! View 7, OOM: each OOM with its facts (request, device and allocator memory), the diagnosis,
//! the largest free block, the snapshot dump, the context, and what-if replays when computed.

use allocview_agent::state::is_not_written;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use super::{put, theme, wrap};
use crate::demo::DEMO_PROGRAM;
use crate::state::oom::MEMORY_SEPARATOR;
use crate::state::{OomReport, State, UiState};
use crate::units;

/// Microseconds per second.
const US_PER_S: i64 = 1_000_000;
/// Indent of the diagnosis's explanation lines.
const EXPLANATION_INDENT: &str = "   ";
/// Frames of an OOM's context shown on its line (tags and user frames, innermost first).
const OOM_CONTEXT_FRAMES: usize = 4;
/// Seconds per day.
const S_PER_DAY: i64 = 86_400;

/// `14:03:11.204` (UTC) from microseconds since the epoch.
pub fn clock(time_us: i64) -> String {
    let s = time_us.div_euclid(US_PER_S);
    let ms = time_us.rem_euclid(US_PER_S) / 1000;
    let day = s.rem_euclid(S_PER_DAY);
    format!(
        "{:02}:{:02}:{:02}.{ms:03}",
        day / 3600,
        day / 60 % 60,
        day % 60
    )
}

/// Heads the first what-if line.
const WHAT_IF_HEAD: &str = " what-if (replayed): ";
/// Heads the other what-if lines (as wide as [`WHAT_IF_HEAD`]).
const WHAT_IF_INDENT: &str = "                     ";
/// Before the rows a wrapped line of the card goes on in.
const CONTINUED_INDENT: &str = "   ";
/// Between a what-if's settings and its verdict.
const ARROW: &str = "→ ";

/// The lines of one OOM's box, for a box `width` cells wide; `in_file`: the OOM is one of the
/// file on screen (its snapshot is that file).
pub fn lines(o: &OomReport, width: usize, in_file: bool) -> Vec<Line<'static>> {
    let mut v = vec![Line::raw(format!(" {}", o.request_line()))];
    // The device's figures and the allocator's on two lines where one would be cut.
    let memory = o.memory_line();
    match memory.split_once(MEMORY_SEPARATOR) {
        Some((device, allocator)) if memory.chars().count() + 3 > width => {
            v.push(Line::raw(format!(" {device}")));
            v.push(Line::raw(format!(" {allocator}")));
        }
        _ => v.push(Line::raw(format!(" {memory}"))),
    }
    if o.event_lost {
        v.push(Line::styled(
            " (memory figures and snapshot from the resync after the lost event)",
            theme::dim(),
        ));
    }
    v.push(Line::from(vec![
        Span::raw(" diagnosis: "),
        Span::styled(o.diagnosis_label(), theme::alert()),
    ]));
    // Inside the box's two borders, after the indent.
    for w in wrap(
        &o.explanation,
        width.saturating_sub(2 + EXPLANATION_INDENT.len()),
    ) {
        v.push(Line::styled(
            format!("{EXPLANATION_INDENT}{w}"),
            Style::new().fg(theme::ALERT),
        ));
    }
    v.push(Line::raw(format!(
        " largest free block: {}",
        units::bytes(o.largest_free)
    )));
    match &o.dump_error {
        // Not a failure: the agent's limit on dumps, or another record has this moment's.
        Some(e) if is_not_written(e) => {
            push_wrapped(&mut v, &format!("dump {e}"), theme::dim(), width);
        }
        Some(e) => push_wrapped(&mut v, &format!("dump failed: {e}"), theme::alert(), width),
        None => {}
    }
    match (&o.dump_path, o.trace_index) {
        // An OOM of the file on screen: its snapshot is this file, at the OOM's event.
        (Some(_), Some(i)) if in_file => v.push(Line::styled(
            format!(" in this file at entry {} (Enter goes there)", i + 1),
            theme::dim(),
        )),
        (None, _) if o.dump_pending => {
            v.push(Line::styled(" snapshot: being written…", theme::dim()))
        }
        // The command on a line of its own: beside the path it was cut off at 120 columns.
        // Relative to the dashboard's folder where it lies there: what the user types here.
        (Some(p), _) => {
            let p = crate::output::shown_path(p);
            v.push(Line::from(vec![
                Span::raw(" snapshot: "),
                Span::styled(p.clone(), Style::new().fg(theme::ACCENT)),
            ]));
            v.push(Line::styled(
                format!("   open with: allocview open {p}"),
                theme::dim(),
            ));
        }
        (None, _) => v.push(Line::styled(" snapshot: none written", theme::dim())),
    }
    let (stack, _) = crate::state::context::user_stack(&o.frames);
    if !stack.is_empty() {
        let shown = &stack[..stack.len().min(OOM_CONTEXT_FRAMES)];
        push_wrapped(
            &mut v,
            &format!("context: {}", shown.join(" ← ")),
            Style::new(),
            width,
        );
    }
    // The what-ifs last: the longest part, and the one a short terminal can best leave below
    // the fold (PgDn), after the snapshot's path and the context.
    for (i, w) in o.what_if.iter().enumerate() {
        let head = if i == 0 { WHAT_IF_HEAD } else { WHAT_IF_INDENT };
        // Inside the box's two borders; a line too long goes on under its verdict.
        let room = width.saturating_sub(2 + head.chars().count());
        let (label, verdict) = w.split_once(ARROW).unwrap_or(("", w));
        let label = if label.is_empty() {
            String::new()
        } else {
            format!("{label}{ARROW}")
        };
        let indent = label.chars().count();
        for (j, piece) in wrap(verdict, room.saturating_sub(indent))
            .iter()
            .enumerate()
        {
            let (head, label) = if j == 0 {
                (head, label.clone())
            } else {
                (WHAT_IF_INDENT, " ".repeat(indent))
            };
            v.push(Line::raw(format!("{head}{label}{piece}")));
        }
    }
    v
}

/// Pushes `text` in `style`, wrapped inside a box `width` cells wide (its two borders, a
/// space before the text, [`CONTINUED_INDENT`] before the rows that go on): a dump's error or
/// an OOM's context, cut at the border at 80 columns before.
fn push_wrapped(v: &mut Vec<Line<'static>>, text: &str, style: Style, width: usize) {
    let room = width.saturating_sub(2 + CONTINUED_INDENT.len()).max(1);
    for (i, piece) in wrap(text, room).into_iter().enumerate() {
        let indent = if i == 0 { " " } else { CONTINUED_INDENT };
        v.push(Line::styled(format!("{indent}{piece}"), style));
    }
}

/// The OOM numbers between `prev` and `next` (exclusive) that the agent no longer keeps, as
/// `(first, last)`, if any: numbers count the OOMs of every device, so a gap alone may be
/// another device's OOMs.
fn forgotten_between(state: &State, prev: u64, next: u64) -> Option<(u64, u64)> {
    let forgotten = allocview_agent::state::forgotten_oom_indices(state.ooms_total)?;
    let from = (prev + 1).max(*forgotten.start());
    let to = (next - 1).min(*forgotten.end());
    (from <= to).then_some((from, to))
}

/// The selected OOM's box in `area` (the view's area): the lines a page scrolls (its visible
/// lines less one, kept for context) and the most lines it may scroll past, 0 when it fits.
pub fn scroll_range(area: Rect, state: &State, ui: &UiState) -> (usize, usize) {
    let Some(o) = state
        .ooms
        .get(ui.oom.min(state.ooms.len().saturating_sub(1)))
    else {
        return (1, 0);
    };
    let body = lines(o, area.width as usize, state.is_file()).len();
    let page = visible_lines(area).saturating_sub(1).max(1);
    (page, max_scroll(area, body))
}

/// Lines of a box as tall as `area` inside its borders.
fn visible_lines(area: Rect) -> usize {
    area.height.saturating_sub(2) as usize
}

/// The most lines a box of `body` lines scrolls past in `area` (0 when it fits).
fn max_scroll(area: Rect, body: usize) -> usize {
    body.saturating_sub(visible_lines(area))
}

/// Draws the OOM list, the selected one first.
pub fn render(area: Rect, buf: &mut Buffer, state: &State, ui: &UiState) {
    let in_file = state.is_file();
    if state.ooms.is_empty() {
        let block = Block::bordered().title(Span::styled(" OOM ", theme::title()));
        let inner = block.inner(area);
        block.render(area, buf);
        let (said, hint) = if in_file {
            (
                " No OOM in this file's trace.",
                " (allocview demo --scenario oom writes a file with some)",
            )
        } else if state.source.program.as_deref() == Some(DEMO_PROGRAM) {
            (
                " No OOM so far.",
                " (allocview demo --scenario oom drives a run into one)",
            )
        } else {
            (
                " No OOM so far.",
                " (each OOM of the process shows here as it happens: the request, a diagnosis, \
                 what-ifs and its dump)",
            )
        };
        put(buf, inner, 0, &Line::raw(said));
        put(buf, inner, 1, &Line::styled(hint, theme::dim()));
        return;
    }
    let selected = ui.oom.min(state.ooms.len() - 1);
    let mut y = area.y;
    for (i, o) in state.ooms.iter().enumerate().skip(selected) {
        if y >= area.bottom() {
            break;
        }
        if i > selected
            && let Some((from, to)) = forgotten_between(state, state.ooms[i - 1].number, o.number)
        {
            let gap = format!(
                " … OOMs #{from} to #{to} are not kept (the agent keeps the first {} and the latest {})",
                allocview_agent::state::OOM_KEEP_FIRST,
                allocview_agent::state::OOM_KEEP_LATEST,
            );
            put(buf, area, y - area.y, &Line::styled(gap, theme::dim()));
            y += 1;
            if y >= area.bottom() {
                break;
            }
        }
        let mut body = lines(o, area.width as usize, in_file);
        let h = (body.len() as u16 + 2).min(area.bottom() - y);
        // The selected box, first on screen, scrolls when it does not fit; others are cut.
        let mut more = None;
        if i == selected {
            // The selected box is drawn first, at the top of `area`.
            let skip = ui.oom_scroll.min(max_scroll(area, body.len()));
            body.drain(..skip);
            let below = body.len().saturating_sub(h.saturating_sub(2) as usize);
            if skip > 0 || below > 0 {
                more = Some(scroll_hint(skip, below));
            }
        }
        let rect = Rect::new(area.x, y, area.width, h);
        let mut title = format!(" OOM #{}", o.number);
        if let Some(t) = o.time_us {
            title.push_str(&format!("  {}", clock(t)));
        }
        title.push_str(&format!("  device {}  stream {} ", o.device, o.stream));
        let style = if i == selected {
            theme::alert()
        } else {
            Style::new().fg(theme::ALERT)
        };
        let block = Block::bordered()
            .border_style(Style::new().fg(theme::ALERT))
            .title(Span::styled(title, style))
            .title(
                Line::styled(format!(" {} of {} ", i + 1, state.ooms.len()), theme::dim())
                    .right_aligned(),
            );
        let block = match more {
            Some(hint) => block.title_bottom(Line::styled(hint, theme::dim()).right_aligned()),
            None => block,
        };
        let inner = block.inner(rect);
        block.render(rect, buf);
        for (r, l) in body.iter().enumerate() {
            put(buf, inner, r as u16, l);
        }
        y += h;
    }
}

/// The bottom border's note on a box that does not fit: lines above and below, and the keys.
fn scroll_hint(above: usize, below: usize) -> String {
    match (above, below) {
        (0, b) => format!(" ↓ {} more (PgDn) ", counted(b)),
        (a, 0) => format!(" ↑ {} above (PgUp) ", counted(a)),
        (a, b) => format!(" ↑ {a} above  ↓ {} more (PgUp PgDn) ", counted(b)),
    }
}

/// `1 line`, `5 lines`.
fn counted(n: usize) -> String {
    allocview_agent::summary::render::counted(n as u64, "line", "lines")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::View;
    use crate::view::testing::view_text;
    use allocview_agent::state::NOT_WRITTEN;

    #[test]
    fn an_empty_live_oom_view_points_at_the_demo_only_in_the_demo() {
        let mut state = State::default();
        state.source.program = Some("train.py".into());
        let t = view_text(View::Oom, &state, 120, 30);
        assert!(t.contains("No OOM so far"), "{t}");
        assert!(t.contains("shows here as it happens"), "{t}");
        assert!(!t.contains("allocview demo"), "{t}");
        state.source.program = Some(DEMO_PROGRAM.into());
        let t = view_text(View::Oom, &state, 120, 30);
        assert!(t.contains("allocview demo --scenario oom"), "{t}");
    }

    #[test]
    fn a_pending_dump_a_lost_event_and_forgotten_records_are_said() {
        let mut state = State::default();
        let lost = OomReport {
            event_lost: true,
            requested: 0,
            rounded: 0,
            device_free: None,
            dump_pending: true,
            ..OomReport::example(61)
        };
        state.ooms = vec![OomReport::example(16), lost];
        state.ooms_total = 300;
        let draw = |state: &State| view_text(View::Oom, state, 120, 30);
        let t = draw(&state);
        assert!(
            t.contains(
                "OOMs #17 to #60 are not kept (the agent keeps the first 16 and the latest 240)"
            ),
            "{t}"
        );
        assert!(
            t.contains("request not known: the OOM's event was dropped"),
            "{t}"
        );
        assert!(
            t.contains("memory figures and snapshot from the resync after"),
            "{t}"
        );
        assert!(t.contains("snapshot: being written"), "{t}");
        assert!(t.contains("snapshot: none written"), "{t}");
        assert!(t.contains("diagnosis: NOT KNOWN"), "{t}");
        // With 100 OOMs in all, none is forgotten: #17 to #60 were another device's.
        state.ooms_total = 100;
        let t = draw(&state);
        assert!(!t.contains("not kept"), "{t}");
    }

    #[test]
    fn a_long_what_if_goes_on_under_its_verdict() {
        let long = "expandable_segments:True   → fits; 1 other OOM, first at entry 12, peak \
                    reserved 900 MiB";
        let state = State {
            ooms: vec![OomReport {
                what_if: vec![
                    long.into(),
                    "max_split_size_mb:128      → still OOM here".into(),
                ],
                ..OomReport::example(1)
            }],
            ..State::default()
        };
        let lines: Vec<String> = lines(&state.ooms[0], 80, false)
            .iter()
            .map(|l| l.to_string())
            .collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with(WHAT_IF_HEAD))
            .unwrap();
        // Every line fits inside the box's borders, and the verdict goes on in its column.
        assert!(lines.iter().all(|l| l.chars().count() <= 78), "{lines:#?}");
        let column = WHAT_IF_HEAD.len() + "expandable_segments:True   → ".chars().count();
        let next = lines
            .iter()
            .position(|l| l.contains("max_split_size_mb"))
            .unwrap();
        assert!(next > at + 1, "{lines:#?}");
        let mut verdict = lines[at].chars().skip(column).collect::<String>();
        for l in &lines[at + 1..next] {
            assert!(l.starts_with(&" ".repeat(column)), "{l:?}");
            verdict.push(' ');
            verdict.push_str(l.trim_start());
        }
        assert_eq!(
            verdict,
            "fits; 1 other OOM, first at entry 12, peak reserved 900 MiB"
        );
        assert_eq!(
            lines[next],
            format!("{WHAT_IF_INDENT}max_split_size_mb:128      → still OOM here")
        );
        // Wide enough, a line stays whole.
        let wide: Vec<String> = super::lines(&state.ooms[0], 160, false)
            .iter()
            .map(|l| l.to_string())
            .collect();
        assert!(wide.contains(&format!("{WHAT_IF_HEAD}{long}")), "{wide:#?}");
    }

    #[test]
    fn a_dump_in_the_current_folder_is_shown_relative_to_it_so_its_command_fits_80_columns() {
        let cwd = std::env::current_dir().unwrap();
        let inside = cwd.join("allocview-dumps").join("oom-0001-pid42.pickle");
        let o = OomReport {
            dump_path: Some(inside.display().to_string()),
            ..OomReport::example(1)
        };
        let lines: Vec<String> = lines(&o, 80, false).iter().map(|l| l.to_string()).collect();
        assert!(
            lines.contains(&" snapshot: allocview-dumps/oom-0001-pid42.pickle".to_string())
                && lines.contains(
                    &"   open with: allocview open allocview-dumps/oom-0001-pid42.pickle"
                        .to_string()
                ),
            "{lines:#?}"
        );
        // Elsewhere, the path as the agent gave it.
        let o = OomReport {
            dump_path: Some("/elsewhere/oom-0001-pid42.pickle".into()),
            ..OomReport::example(1)
        };
        let elsewhere: Vec<String> = super::lines(&o, 80, false)
            .iter()
            .map(|l| l.to_string())
            .collect();
        assert!(
            elsewhere.contains(&" snapshot: /elsewhere/oom-0001-pid42.pickle".to_string()),
            "{elsewhere:#?}"
        );
    }

    #[test]
    fn the_snapshot_and_context_come_before_the_what_ifs_which_a_short_terminal_cuts_first() {
        let o = OomReport {
            what_if: vec![
                "expandable_segments:True   → fits; no OOM in the trace".into(),
                "smallest device            → no OOM in the trace from ~17.0 GiB".into(),
            ],
            dump_path: Some("allocview-dumps/oom-0001-pid42.pickle".into()),
            ..OomReport::example(1)
        };
        let lines: Vec<String> = lines(&o, 80, false).iter().map(|l| l.to_string()).collect();
        let at = |prefix: &str| lines.iter().position(|l| l.starts_with(prefix));
        let snapshot = at(" snapshot: ").expect("a snapshot line");
        let what_if = at(WHAT_IF_HEAD).expect("a what-if line");
        assert!(snapshot < what_if, "{lines:#?}");
        if let Some(context) = at(" context: ") {
            assert!(context < what_if, "{lines:#?}");
        }
        assert!(
            lines[what_if..]
                .iter()
                .any(|l| l.contains("smallest device")),
            "{lines:#?}"
        );
    }

    #[test]
    fn a_files_oom_points_into_the_file_and_a_file_without_one_says_so() {
        let mut state = State {
            mode: crate::state::Mode::File {
                name: "run.pickle".into(),
                event: 3,
                total: 9,
            },
            ..State::default()
        };
        let draw = |state: &State| view_text(View::Oom, state, 120, 20);
        let t = draw(&state);
        assert!(t.contains("No OOM in this file's trace."), "{t}");
        state.ooms = vec![OomReport {
            dump_path: Some("run.pickle".into()),
            trace_index: Some(6),
            ..OomReport::example(1)
        }];
        let t = draw(&state);
        assert!(
            t.contains("in this file at entry 7 (Enter goes there)"),
            "{t}"
        );
        assert!(!t.contains("open with"), "{t}");
    }

    #[test]
    fn a_live_ooms_open_command_is_whole_at_120_columns() {
        let path = "/var/tmp/embed-tour/allocview-dumps/oom-0001-pid31683.pickle";
        let state = State {
            ooms: vec![OomReport {
                dump_path: Some(path.into()),
                ..OomReport::example(1)
            }],
            ..State::default()
        };
        let t = view_text(View::Oom, &state, 120, 30);
        assert!(t.contains(&format!("snapshot: {path}")), "{t}");
        assert!(
            t.contains(&format!("open with: allocview open {path}")),
            "{t}"
        );
    }

    #[test]
    fn the_explanation_wraps_inside_the_boxs_borders() {
        let o = OomReport {
            explanation: "fragmentation: 6.27 GiB is reserved but free, more than the 590 MiB \
                          asked for, yet the largest free block is 558 MiB and 6.27 GiB is \
                          stranded in split segments; expandable_segments:True would let the \
                          free space be used"
                .into(),
            requested: 590 << 20,
            rounded: 590 << 20,
            device_free: Some(396 << 20),
            allocated: 9 << 30,
            largest_free: 558 << 20,
            diagnosis: allocview_agent::diagnosis::DiagnosisKind::Fragmentation,
            ..OomReport::example(1)
        };
        for width in [40, 61, 100, 158] {
            let inner = width - 2;
            let explanation: Vec<String> = lines(&o, width, false)
                .iter()
                .map(|l| l.to_string())
                .filter(|l| l.starts_with(EXPLANATION_INDENT))
                .collect();
            assert!(explanation.len() > 1, "{width}: {explanation:?}");
            for l in &explanation {
                assert!(l.chars().count() <= inner, "{width}: {l:?}");
            }
            let words: Vec<&str> = explanation
                .iter()
                .flat_map(|l| l.split_whitespace())
                .collect();
            assert_eq!(words.join(" "), o.explanation, "{width}");
        }
    }

    #[test]
    fn a_dump_left_out_by_the_agents_limit_is_not_called_a_failure() {
        let not_written = format!("{NOT_WRITTEN}this agent writes at most 4 OOM dumps");
        let state = State {
            ooms: vec![
                OomReport {
                    dump_error: Some(not_written),
                    ..OomReport::example(5)
                },
                OomReport {
                    dump_error: Some("cannot write /ro/oom-0006.pickle: read-only".into()),
                    ..OomReport::example(6)
                },
            ],
            ..State::default()
        };
        let t = view_text(View::Oom, &state, 120, 40);
        assert!(
            t.contains("dump not written: this agent writes at most 4 OOM dumps"),
            "{t}"
        );
        assert_eq!(t.matches("dump failed").count(), 1, "{t}");
        assert!(t.contains("dump failed: cannot write /ro/"), "{t}");
    }

    #[test]
    fn clock_reads_utc_time_of_day() {
        assert_eq!(clock(1_700_000_000_123_456), "22:13:20.123");
    }
}
