//! The header on every view: mode (`● live`, `○ paused`, `◌ reconnecting (3)`, `◌ no updates
//! 12s`, or the file and event), process, device, update rate (while updates arrive), dropped
//! events and resyncs (red when not zero), and the tab line.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};

use super::{put, theme};
use crate::state::{Mode, State, UiState, View};
use crate::units;

/// Cells between two tabs.
pub const TAB_GAP: u16 = 2;

/// `1 Overview`.
pub fn tab_label(v: View) -> String {
    format!("{} {}", v.index() + 1, v.title())
}

/// The mode words.
pub fn mode_span(mode: &Mode) -> Span<'static> {
    mode_span_within(mode, usize::MAX)
}

/// `name` in at most `max` cells: whole when it fits, else its start and end around a `…`.
fn shorten(name: &str, max: usize) -> String {
    let chars: Vec<char> = name.chars().collect();
    if chars.len() <= max {
        return name.to_string();
    }
    // Two thirds for the end, where dumps differ (`oom-0004-pid32418.pickle`).
    let keep = max.saturating_sub(1);
    let head = keep / 3;
    let tail = keep - head;
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len() - tail..]);
    out
}

/// Cells a file name is never shortened below.
const MIN_FILE_NAME: usize = 12;

/// [`mode_span`] with a file's name shortened to at most `max_name` cells.
fn mode_span_within(mode: &Mode, max_name: usize) -> Span<'static> {
    match mode {
        Mode::Live => Span::styled("● live", Style::new().fg(theme::ALLOCATED)),
        Mode::Paused => Span::styled("○ paused", Style::new().fg(theme::PENDING)),
        Mode::Reconnecting(n) => Span::styled(
            format!("◌ reconnecting ({n})"),
            Style::new().fg(theme::ALERT),
        ),
        Mode::Stalled(secs) => Span::styled(
            format!("◌ no updates {}", units::axis_time(*secs as f64)),
            Style::new().fg(theme::ALERT),
        ),
        Mode::File { name, event, total } => Span::styled(
            format!(
                "file {}  event {}/{}",
                shorten(name, max_name.max(MIN_FILE_NAME)),
                units::count(*event as u64),
                units::count(*total as u64)
            ),
            Style::new().fg(theme::ACCENT),
        ),
    }
}

/// Draws the two header lines.
pub fn render(area: Rect, buf: &mut Buffer, state: &State, ui: &UiState) {
    let s = &state.source;
    let mut spans = vec![
        Span::styled(" allocview", theme::title()),
        Span::raw("  "),
        mode_span(&state.mode),
    ];
    // Optional parts in display order, with the order in which narrow terminals drop them
    // (program name first, then rate, then pid, then device): the drop counts always stay.
    // The pid outlasts the rate: it tells which process is watched (a restarted service has
    // another), where the rate is the agent's steady tick.
    let mut optional: Vec<(u8, Span<'static>)> = Vec::new();
    if !state.is_file() {
        if let Some(pid) = s.pid {
            optional.push((2, Span::raw(format!("  pid {pid}"))));
        }
        if let Some(p) = &s.program {
            let gap = if s.pid.is_some() { " " } else { "  " };
            optional.push((0, Span::raw(format!("{gap}{p}"))));
        }
    }
    let mut dev = format!("  dev {}", s.device);
    match (&s.device_name, s.total_memory) {
        (Some(n), Some(t)) => dev.push_str(&format!(" ({n} {})", units::bytes(t))),
        (Some(n), None) => dev.push_str(&format!(" ({n})")),
        (None, Some(t)) => dev.push_str(&format!(" ({})", units::bytes(t))),
        (None, None) => {}
    }
    if state.is_host_only() {
        // A process watched for its host heap only: no device to name.
        dev = "  host heap".to_string();
    }
    optional.push((3, Span::raw(dev)));
    // The rate is that of updates arriving: said only while they do.
    if let Some(hz) = s.rate_hz.filter(|_| state.mode == Mode::Live) {
        optional.push((1, Span::raw(format!("  {hz:.0} Hz"))));
    }
    // A file's drop counts are those its recorder wrote: shown when there were any (a
    // PyTorch file has none to show); a live source always shows them.
    let drops = if state.is_file() && s.dropped == 0 && s.resyncs == 0 {
        Vec::new()
    } else {
        vec![
            Span::raw("  dropped "),
            Span::styled(units::count(s.dropped), theme::alert_if(s.dropped > 0)),
            Span::raw("  resync "),
            Span::styled(units::count(s.resyncs), theme::alert_if(s.resyncs > 0)),
        ]
    };
    let help = " ? help ";
    let width = area.width as usize;
    let len = |v: &[Span<'_>]| v.iter().map(|s| s.width()).sum::<usize>();
    // A file name too long for the line is shortened so that the event and `? help` stay.
    if let Mode::File { name, .. } = &state.mode {
        let over = (len(&spans) + len(&drops) + help.len()).saturating_sub(width);
        if over > 0 {
            let max_name = name.chars().count().saturating_sub(over);
            spans[2] = mode_span_within(&state.mode, max_name);
        }
    }
    let fixed = len(&spans) + len(&drops) + help.len();
    let mut optional_width: usize = optional.iter().map(|(_, s)| s.width()).sum();
    for prio in 0..=3 {
        if fixed + optional_width <= width {
            break;
        }
        optional.retain(|(p, s)| {
            if *p == prio {
                optional_width -= s.width();
                false
            } else {
                true
            }
        });
    }
    spans.extend(optional.into_iter().map(|(_, s)| s));
    spans.extend(drops);
    let used = len(&spans);
    if used + help.len() <= width {
        spans.push(Span::raw(" ".repeat(width - used - help.len())));
        spans.push(Span::styled(help, theme::dim()));
    }
    put(buf, area, 0, &Line::from(spans));

    let mut tabs = vec![Span::raw(" ")];
    for v in View::ALL {
        let label = tab_label(v);
        let style = if v == ui.view {
            theme::selected().add_modifier(Modifier::BOLD)
        } else if v == View::Oom && !state.ooms.is_empty() {
            // Bold and underlined as well as red: visible without colours too.
            theme::alert().add_modifier(Modifier::UNDERLINED)
        } else {
            theme::dim()
        };
        tabs.push(Span::styled(label, style));
        tabs.push(Span::raw(" ".repeat(TAB_GAP as usize)));
    }
    put(buf, area, 1, &Line::from(tabs));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Source;
    use crate::view::testing::{buffer, rows};

    fn state() -> State {
        State {
            source: Source {
                pid: Some(4242),
                program: Some("train.py".into()),
                device_name: Some("H100".into()),
                total_memory: Some(80 << 30),
                rate_hz: Some(10.0),
                dropped: 3,
                ..Source::default()
            },
            ..State::default()
        }
    }

    #[test]
    fn the_header_names_mode_process_device_and_drops() {
        let mut buf = buffer(100, 2);
        render(buf.area, &mut buf, &state(), &UiState::default());
        let r = rows(&buf);
        assert_eq!(
            r[0].trim_end(),
            " allocview  ● live  pid 4242 train.py  dev 0 (H100 80.0 GiB)  10 Hz  dropped 3  resync 0     ? help"
        );
        assert!(r[1].starts_with(" 1 Overview  2 Segments  3 Pools"));
        // The non-zero drop count is red.
        let x = r[0][..r[0].find("dropped 3").unwrap()].chars().count() as u16 + 8;
        assert_eq!(buf[(x, 0)].fg, theme::ALERT);
    }

    #[test]
    fn narrow_headers_keep_the_drop_counts() {
        let mut buf = buffer(50, 2);
        render(buf.area, &mut buf, &state(), &UiState::default());
        let r = rows(&buf);
        assert!(r[0].contains("dropped 3  resync 0"), "{}", r[0]);
        assert!(!r[0].contains("train.py"));
    }

    #[test]
    fn at_80_columns_a_live_header_keeps_the_pid_before_the_rate() {
        let mut s = state();
        s.source.program = Some("allocview demo".into());
        s.source.device_name = None;
        s.source.total_memory = Some(16 << 30);
        s.source.dropped = 0;
        let mut buf = buffer(80, 2);
        render(buf.area, &mut buf, &s, &UiState::default());
        let line = rows(&buf)[0].clone();
        assert_eq!(
            line.trim_end(),
            " allocview  ● live  pid 4242  dev 0 (16.0 GiB)  dropped 0  resync 0      ? help"
        );
    }

    #[test]
    fn the_rate_is_said_only_while_updates_arrive() {
        let mut s = state();
        for mode in [Mode::Paused, Mode::Reconnecting(2), Mode::Stalled(12)] {
            s.mode = mode.clone();
            let mut buf = buffer(120, 2);
            render(buf.area, &mut buf, &s, &UiState::default());
            let line = rows(&buf)[0].clone();
            assert!(!line.contains("Hz"), "{mode:?}: {line}");
        }
        s.mode = Mode::Stalled(75);
        let mut buf = buffer(120, 2);
        render(buf.area, &mut buf, &s, &UiState::default());
        assert!(
            rows(&buf)[0].contains("◌ no updates 1m 15s"),
            "{:?}",
            rows(&buf)[0]
        );
    }

    #[test]
    fn file_mode_shows_the_event() {
        let s = State {
            mode: Mode::File {
                name: "oom.pickle".into(),
                event: 12_034,
                total: 19_342,
            },
            ..State::default()
        };
        let mut buf = buffer(100, 2);
        render(buf.area, &mut buf, &s, &UiState::default());
        assert!(rows(&buf)[0].contains("file oom.pickle  event 12,034/19,342"));
    }

    fn file_state(name: &str, dropped: u64) -> State {
        State {
            mode: Mode::File {
                name: name.into(),
                event: 2_203,
                total: 2_203,
            },
            source: Source {
                dropped,
                ..Source::default()
            },
            ..State::default()
        }
    }

    #[test]
    fn at_80_columns_a_files_header_keeps_the_event_and_help_and_leaves_out_zero_drops() {
        let mut buf = buffer(80, 2);
        render(
            buf.area,
            &mut buf,
            &file_state("oom-0001-pid32418.pickle", 0),
            &UiState::default(),
        );
        let line = rows(&buf)[0].clone();
        assert!(
            line.contains("file oom-0001-pid32418.pickle  event 2,203/2,203"),
            "{line}"
        );
        assert!(line.trim_end().ends_with("? help"), "{line}");
        assert!(!line.contains("dropped"), "{line}");
    }

    #[test]
    fn a_long_file_name_is_shortened_in_the_middle_and_recorded_drops_stay() {
        let name = "a-very-long-directory-name-for-a-training-run-oom-0001-pid32418.pickle";
        let mut buf = buffer(80, 2);
        render(
            buf.area,
            &mut buf,
            &file_state(name, 5),
            &UiState::default(),
        );
        let line = rows(&buf)[0].clone();
        assert!(line.contains("event 2,203/2,203"), "{line}");
        assert!(line.contains("dropped 5  resync 0"), "{line}");
        assert!(line.trim_end().ends_with("? help"), "{line}");
        assert!(line.contains("file a-ve…418.pickle  event"), "{line}");
        assert!(!line.contains(name), "{line}");
    }
}
