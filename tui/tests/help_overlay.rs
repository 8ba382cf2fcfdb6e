//! The help overlay as a first-time user meets it: it explains the dashboard's words
//! (segment, block, pool, stream, reserved, ...) after the keys, and a terminal too short for
//! all of it (80x24, the smallest 74x18) says how much is hidden and scrolls it with ↑↓ PgUp
//! PgDn, where the rows below the box's bottom were cut without a word.

#[path = "support/screen.rs"]
#[allow(dead_code)]
mod screen;
use screen::{press, screen_of};
#[path = "support/builders.rs"]
mod support;

use allocview::input;
use allocview::view::help::{GLOSSARY, KEYS};
use ratatui::crossterm::event::KeyCode;

#[test]
fn a_short_terminal_scrolls_the_help_to_its_last_row_and_says_what_is_hidden() {
    for (w, h) in [(80, 24), (74, 18)] {
        let (mut app, _d) = support::file_app("/tmp/run.pickle", &support::traced_snapshot(2));
        press(&mut app, KeyCode::Char('?'));
        let top = screen_of(&mut app, w, h);
        assert!(top.contains(KEYS[0].1), "{w}x{h}:\n{top}");
        assert!(
            top.contains(" more (↑↓ PgDn)"),
            "the hidden rows are said:\n{top}"
        );
        // The last row (its description may wrap at this width: its first words).
        let (last_word, last_what) = GLOSSARY[GLOSSARY.len() - 1];
        let last_what: String = last_what.split(' ').take(3).collect::<Vec<_>>().join(" ");
        assert!(!top.contains(last_word), "{top}");

        // PgDn twice reaches the end (a page is more than these screens' rows) and stays.
        press(&mut app, KeyCode::PageDown);
        press(&mut app, KeyCode::PageDown);
        let end = screen_of(&mut app, w, h);
        assert!(
            end.contains(last_word) && end.contains(&last_what),
            "{w}x{h}:\n{end}"
        );
        assert!(!end.contains("(↑↓ PgDn)"), "nothing below:\n{end}");
        assert!(end.contains(" more "), "the rows above are said:\n{end}");
        // The help still closes, and opens at its top again.
        press(&mut app, KeyCode::Esc);
        assert!(!app.ui.help);
        press(&mut app, KeyCode::Char('?'));
        assert!(screen_of(&mut app, w, h).contains(KEYS[0].1));
        // ↑ from the top stays there; ↓ moves one row.
        press(&mut app, KeyCode::Up);
        assert_eq!(app.ui.help_scroll, 0);
        press(&mut app, KeyCode::Down);
        assert_eq!(app.ui.help_scroll, 1);
    }
}

#[test]
fn the_help_explains_each_word_in_full_where_there_is_room() {
    let (mut app, _d) = support::file_app("/tmp/run.pickle", &support::traced_snapshot(2));
    press(&mut app, KeyCode::Char('?'));
    let all = screen_of(&mut app, 120, 40);
    assert!(all.contains("What the words mean"), "{all}");
    for (word, what) in GLOSSARY {
        assert!(
            all.contains(word) && all.contains(what),
            "{word}: {what}\n{all}"
        );
    }
    assert!(!all.contains(" more "), "all of it fits:\n{all}");
    // Where it all fits, the moves do not scroll it.
    press(&mut app, KeyCode::PageDown);
    assert_eq!(app.ui.help_scroll, 0);
}

#[test]
fn a_click_closes_the_help_instead_of_choosing_what_it_hides() {
    let (mut app, _d) = support::file_app("/tmp/run.pickle", &support::traced_snapshot(2));
    // Where the "7 OOM" tab is, which the overlay covers.
    let tabs = screen_of(&mut app, 120, 36);
    let row = tabs.lines().nth(1).unwrap();
    let x = row[..row.find("7 OOM").unwrap()].chars().count() as u16;
    press(&mut app, KeyCode::Char('?'));
    let covered = screen_of(&mut app, 120, 36);
    assert!(
        !covered.lines().nth(1).unwrap().contains("7 OOM"),
        "{covered}"
    );
    app.apply(allocview::input::Action::Click { x, y: 1 })
        .unwrap();
    assert!(!app.ui.help);
    assert_eq!(app.ui.view, allocview::state::View::Overview);
    // The wheel scrolls the help while it is open (a short terminal).
    press(&mut app, KeyCode::Char('?'));
    screen_of(&mut app, 80, 24);
    let wheel = input::mouse(ratatui::crossterm::event::MouseEvent {
        kind: ratatui::crossterm::event::MouseEventKind::ScrollDown,
        column: 10,
        row: 10,
        modifiers: ratatui::crossterm::event::KeyModifiers::NONE,
    })
    .unwrap();
    app.apply(wheel).unwrap();
    assert_eq!(app.ui.help_scroll, 1);
}
